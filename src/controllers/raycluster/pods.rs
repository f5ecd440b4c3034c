//! The Pods of a RayCluster: suspension, Recreate upgrades, the head, then each worker group
//! as `scaling` plans it. Every create and delete is recorded as an expectation first seen in
//! the cache before the group is touched again.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use tracing::{debug, info, warn};

use super::builders::pod::WorkerReplica;
use super::context::Context;
use super::error::Error;
use super::expectations::key_of;
use super::expectations::{Action as ScaleAction, Group};
use super::scaling::DeleteReason;
use super::status::Progress;
use super::{builders, scaling};
use crate::api::conditions;
use crate::api::raycluster::{
    RayCluster, RayClusterStatus, WorkerGroupSpec, condition_reasons, condition_types,
};
use crate::kuberay::keys::{annotations, labels, reasons};

pub(super) use crate::k8s::random_suffix;

pub(super) fn node_type_of(pod: &Pod) -> Option<&str> {
    pod.labels().get(labels::NODE_TYPE).map(String::as_str)
}

fn condition_true(status: Option<&RayClusterStatus>, type_: &str) -> bool {
    status
        .and_then(|s| conditions::find(&s.conditions, type_))
        .is_some_and(|c| c.status == conditions::TRUE)
}

/// Deletes every Pod of the cluster (or of one group) that `selector` matches and the cluster
/// owns. Not a DeleteCollection: anyone can put our labels on a Pod, and a label selector
/// cannot ask for the owner, so the Pods are listed from the API server (the cache may not
/// show a Pod created moments ago yet), filtered by owner and deleted one by one, each only
/// if it is still the one listed.
pub(super) async fn delete_pod_collection(
    cluster: &RayCluster,
    ctx: &Context,
    selector: &str,
) -> Result<(), kube::Error> {
    let api: Api<Pod> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let listed = api.list(&ListParams::default().labels(selector)).await?;
    let uid = cluster.uid().unwrap_or_default();
    for pod in listed
        .items
        .iter()
        .filter(|p| p.owner_references().iter().any(|o| o.uid == uid))
    {
        delete_pod(ctx, pod).await?;
    }
    Ok(())
}

/// Deletes one Pod, only if it is still the one seen (UID precondition). Gone already is fine.
async fn delete_pod(ctx: &Context, pod: &Pod) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
    let params = DeleteParams {
        preconditions: pod.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&pod.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn create_pod(ctx: &Context, pod: &Pod) -> Result<Pod, kube::Error> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
    api.create(&PostParams::default(), pod).await
}

/// Suspension, Recreate upgrades, the head Pod, then each worker group.
pub(super) async fn reconcile_pods(
    cluster: &RayCluster,
    ctx: &Context,
    status: Option<&RayClusterStatus>,
) -> Result<Progress, Error> {
    let (_, name) = key_of(cluster);
    let all_pods = all_pods_selector(&name);

    if condition_true(status, condition_types::RAY_CLUSTER_SUSPENDING) {
        return delete_pods_for_suspension(cluster, ctx, &all_pods).await;
    }
    if condition_true(status, condition_types::RAY_CLUSTER_SUSPENDED)
        || cluster.spec.suspend == Some(true)
    {
        // Suspended, or about to be: the status moves to Suspending first.
        return Ok(Progress::Done);
    }

    let pods = ctx.cluster_pods(cluster);
    let spec_hash = crate::kuberay::spec::spec_hash(&cluster.spec);
    let heads: Vec<&Pod> = pods
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| node_type_of(p) == Some(labels::HEAD))
        .collect();

    if crate::kuberay::spec::recreate_on_change(&cluster.spec)
        && let Some(head) = heads.first()
        && let Some(progress) =
            recreate_on_spec_change(cluster, ctx, head, &spec_hash, &all_pods).await?
    {
        return Ok(progress);
    }
    if let Some(progress) = reconcile_head(cluster, ctx, status, &heads, &spec_hash).await? {
        return Ok(progress);
    }

    // The autoscaler alone removes Pods, unless random deletion is switched on.
    let scale_down_allowed =
        !crate::kuberay::spec::autoscaling_enabled(&cluster.spec) || ctx.config.random_pod_delete;
    for group in cluster.spec.worker_group_specs.iter().flatten() {
        if let Some(progress) =
            reconcile_worker_group(cluster, ctx, group, &pods, scale_down_allowed).await?
        {
            return Ok(progress);
        }
    }
    Ok(Progress::Done)
}

/// Every head and worker Pod of the cluster called `name`.
fn all_pods_selector(name: &str) -> String {
    format!(
        "{}={name},{} in ({},{})",
        labels::CLUSTER,
        labels::NODE_TYPE,
        labels::HEAD,
        labels::WORKER
    )
}

/// The Suspending stage: every Pod goes, and the expectations with them.
async fn delete_pods_for_suspension(
    cluster: &RayCluster,
    ctx: &Context,
    all_pods: &str,
) -> Result<Progress, Error> {
    let key = key_of(cluster);
    let (namespace, name) = key.clone();
    if let Err(e) = delete_pod_collection(cluster, ctx, all_pods).await {
        ctx.event(
            cluster,
            EventType::Warning,
            reasons::FAILED_TO_DELETE_POD_COLLECTION,
            "Delete",
            format!(
                "Failed deleting Pods of RayCluster {namespace}/{name} for its suspension: {e}"
            ),
        )
        .await;
        return Err(Error::replica(
            condition_reasons::FAILED_DELETE_ALL_PODS,
            "deleting all Pods",
            e,
        ));
    }
    ctx.expectations.forget(&key);
    if !ctx.cluster_pods(cluster).is_empty() {
        ctx.event(
            cluster,
            EventType::Normal,
            reasons::DELETED_POD,
            "Delete",
            format!("Deleted Pods for RayCluster {namespace}/{name} due to suspension"),
        )
        .await;
    }
    Ok(Progress::Done)
}

/// Under the Recreate upgrade strategy: adopts Pods another operator version hashed, or
/// deletes every Pod when the spec changed. `Some` ends this pass.
async fn recreate_on_spec_change(
    cluster: &RayCluster,
    ctx: &Context,
    head: &Pod,
    spec_hash: &str,
    all_pods: &str,
) -> Result<Option<Progress>, Error> {
    let key = key_of(cluster);
    let (namespace, name) = key.clone();
    let check = crate::kuberay::spec::recreate_check(head.annotations(), spec_hash);
    if check == crate::kuberay::spec::RecreateCheck::Adopt {
        // KubeRay (or another raypipe version) hashed the spec its own way: adopt the
        // Pods under raypipe's hash of the current spec instead of recreating them.
        info!(pod = %head.name_any(), "adopting Pods another operator version made");
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = serde_json::json!({"metadata": {"annotations": {
            annotations::RECREATE_HASH: spec_hash,
            annotations::KUBERAY_VERSION: crate::kuberay::keys::OPERATOR_VERSION,
        }}});
        if let Err(e) = api
            .patch(
                &head.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            warn!(error = %e, "updating the head Pod's hash after an operator upgrade failed");
        }
    } else if check == crate::kuberay::spec::RecreateCheck::Recreate {
        info!("spec changed under the Recreate upgrade strategy; deleting all Pods");
        if let Err(e) = delete_pod_collection(cluster, ctx, all_pods).await {
            ctx.event(cluster, EventType::Warning, reasons::FAILED_TO_DELETE_POD_COLLECTION, "Delete", format!("Failed deleting Pods of RayCluster {namespace}/{name} for the Recreate upgrade: {e}"))
                .await;
            return Err(Error::replica(
                condition_reasons::FAILED_DELETE_ALL_PODS,
                "deleting all Pods",
                e,
            ));
        }
        ctx.expectations.forget(&key);
        ctx.event(cluster, EventType::Normal, reasons::DELETED_POD, "Delete", format!("Deleted all Pods for RayCluster {namespace}/{name} due to spec change with Recreate upgradeStrategy"))
            .await;
        return Ok(Some(Progress::Done));
    }
    Ok(None)
}

/// The head Pod, once the cache shows earlier head changes: creates a missing one, replaces
/// an unhealthy one, refuses several. `Some` ends this pass.
async fn reconcile_head(
    cluster: &RayCluster,
    ctx: &Context,
    status: Option<&RayClusterStatus>,
    heads: &[&Pod],
    spec_hash: &str,
) -> Result<Option<Progress>, Error> {
    let key = key_of(cluster);
    let in_cache = |pod: &str| ctx.pod_in_cache(&key.0, pod);
    if !ctx
        .expectations
        .is_satisfied(&key, &Group::Head, Instant::now(), in_cache)
    {
        return Ok(None);
    }
    match heads {
        [] => {
            let provisioned = condition_true(status, condition_types::RAY_CLUSTER_PROVISIONED);
            let no_restart = cluster
                .annotations()
                .get(annotations::DISABLE_PROVISIONED_HEAD_RESTART)
                .is_some_and(|v| v == "true");
            if !(provisioned && no_restart) {
                if let Some(why) = super::isolation::wait_for_mtls(cluster, ctx).await? {
                    return Ok(Some(Progress::Waiting(why)));
                }
                create_head_pod(cluster, ctx, spec_hash).await?;
            }
            Ok(None)
        }
        [head] => match scaling::unhealthy_reason(head) {
            Some(reason) => replace_unhealthy_head(cluster, ctx, head, reason)
                .await
                .map(Some),
            None => Ok(None),
        },
        many => {
            let found: Vec<String> = many.iter().map(|p| p.name_any()).collect();
            Err(Error::Conflict(format!(
                "{} head Pods found ({}); a RayCluster has one, delete the extra ones",
                found.len(),
                found.join(", ")
            )))
        }
    }
}

/// Deletes the unhealthy head Pod and expects its deletion; the next pass creates a new one.
async fn replace_unhealthy_head(
    cluster: &RayCluster,
    ctx: &Context,
    head: &Pod,
    reason: String,
) -> Result<Progress, Error> {
    let key = key_of(cluster);
    let namespace = &key.0;
    if let Err(e) = delete_pod(ctx, head).await {
        ctx.event(
            cluster,
            EventType::Warning,
            reasons::FAILED_TO_DELETE_HEAD_POD,
            "Delete",
            format!(
                "Failed deleting head Pod {namespace}/{}: {reason}: {e}",
                head.name_any()
            ),
        )
        .await;
        return Err(Error::replica(
            condition_reasons::FAILED_DELETE_HEAD_POD,
            format!("deleting head Pod {}", head.name_any()),
            e,
        ));
    }
    ctx.expectations.record(
        &key,
        Group::Head,
        &head.name_any(),
        ScaleAction::Delete,
        Instant::now(),
    );
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::DELETED_HEAD_POD,
        "Delete",
        format!("Deleted head Pod {namespace}/{}: {reason}", head.name_any()),
    )
    .await;
    Ok(Progress::Waiting(reason))
}

/// One worker group, once the cache shows its earlier changes: plans it, then deletes and
/// creates Pods as planned. `Some` ends this pass.
async fn reconcile_worker_group(
    cluster: &RayCluster,
    ctx: &Context,
    group: &WorkerGroupSpec,
    pods: &[Arc<Pod>],
    scale_down_allowed: bool,
) -> Result<Option<Progress>, Error> {
    let key = key_of(cluster);
    let in_cache = |pod: &str| ctx.pod_in_cache(&key.0, pod);
    let group_key = Group::Worker(group.group_name.clone());
    if !ctx
        .expectations
        .is_satisfied(&key, &group_key, Instant::now(), in_cache)
    {
        debug!(group = %group.group_name, "waiting for the cache to show earlier changes");
        return Ok(None);
    }
    let group_pods: Vec<&Pod> = pods
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| {
            node_type_of(p) == Some(labels::WORKER)
                && p.labels().get(labels::GROUP) == Some(&group.group_name)
        })
        .collect();
    let plan = scaling::plan_group(group, &group_pods, scale_down_allowed, &mut random_suffix);

    if plan.delete_all {
        if !group_pods.is_empty() {
            delete_suspended_group(cluster, ctx, &group.group_name).await?;
        }
        return Ok(None);
    }
    if let Some(problem) = plan.error {
        return Err(Error::Conflict(problem));
    }
    for (pod_name, reason) in &plan.delete {
        let Some(pod) = group_pods.iter().find(|p| p.name_any() == *pod_name) else {
            continue;
        };
        delete_worker(cluster, ctx, &group_key, pod, reason).await?;
    }
    if let Some(wait) = plan.wait {
        return Ok(Some(Progress::Waiting(wait)));
    }
    if !plan.create.is_empty()
        && let Some(why) = super::isolation::wait_for_mtls(cluster, ctx).await?
    {
        return Ok(Some(Progress::Waiting(why)));
    }
    create_workers(cluster, ctx, group, &plan.create).await?;
    Ok(None)
}

/// Deletes every Pod of a suspended worker group.
async fn delete_suspended_group(
    cluster: &RayCluster,
    ctx: &Context,
    group_name: &str,
) -> Result<(), Error> {
    let (namespace, name) = key_of(cluster);
    let selector = format!(
        "{}={name},{}={},{}={}",
        labels::CLUSTER,
        labels::GROUP,
        group_name,
        labels::NODE_TYPE,
        labels::WORKER
    );
    if let Err(e) = delete_pod_collection(cluster, ctx, &selector).await {
        ctx.event(
            cluster,
            EventType::Warning,
            reasons::FAILED_TO_DELETE_WORKER_POD_COLLECTION,
            "Delete",
            format!("Failed deleting worker Pods of suspended group {group_name}: {e}"),
        )
        .await;
        return Err(Error::replica(
            condition_reasons::FAILED_DELETE_WORKER_POD,
            "deleting a suspended group's Pods",
            e,
        ));
    }
    ctx.event(cluster, EventType::Normal, reasons::DELETED_WORKER_POD, "Delete", format!("Deleted all Pods of suspended worker group {group_name} in RayCluster {namespace}/{name}"))
        .await;
    Ok(())
}

/// Creates the planned worker Pods, stopping at the first failure, and reports those created.
async fn create_workers(
    cluster: &RayCluster,
    ctx: &Context,
    group: &WorkerGroupSpec,
    replicas: &[WorkerReplica],
) -> Result<(), Error> {
    // One Event per group and pass, naming every Pod: the event recorder keys a series by
    // reason, not note, so one Event per Pod would cost a create plus a patch per further
    // Pod and keep only the first Pod's name.
    let mut created = Vec::with_capacity(replicas.len());
    let mut outcome = Ok(());
    for replica in replicas {
        match create_worker_pod(cluster, ctx, group, replica).await {
            Ok(pod_name) => created.push(pod_name),
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    report_created_workers(cluster, ctx, &group.group_name, &created).await;
    outcome
}

/// The `CreatedWorkerPod` Event of one pass over a group (none when nothing was created).
async fn report_created_workers(
    cluster: &RayCluster,
    ctx: &Context,
    group_name: &str,
    created: &[String],
) {
    let (namespace, _) = key_of(cluster);
    let note = match created {
        [] => return,
        [one] => format!("Created worker Pod {namespace}/{one}"),
        many => format!(
            "Created {} worker Pods of group {group_name}: {}",
            many.len(),
            many.iter()
                .map(|pod| format!("{namespace}/{pod}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::CREATED_WORKER_POD,
        "Create",
        note,
    )
    .await;
}

async fn create_head_pod(
    cluster: &RayCluster,
    ctx: &Context,
    spec_hash: &str,
) -> Result<(), Error> {
    let (namespace, name) = key_of(cluster);
    let pod = builders::pod::head_pod(cluster, &ctx.config.build, spec_hash)?;
    match create_pod(ctx, &pod).await {
        Ok(created) => {
            let created_name = created.name_any();
            ctx.expectations.record(
                &(namespace.clone(), name),
                Group::Head,
                &created_name,
                ScaleAction::Create,
                Instant::now(),
            );
            ctx.event(
                cluster,
                EventType::Normal,
                reasons::CREATED_HEAD_POD,
                "Create",
                format!("Created head Pod {namespace}/{created_name}"),
            )
            .await;
            Ok(())
        }
        Err(e) => {
            ctx.event(
                cluster,
                EventType::Warning,
                reasons::FAILED_TO_CREATE_HEAD_POD,
                "Create",
                format!("Failed to create head Pod for {namespace}/{name}: {e}"),
            )
            .await;
            Err(Error::replica(
                condition_reasons::FAILED_CREATE_HEAD_POD,
                "creating the head Pod",
                e,
            ))
        }
    }
}

async fn create_worker_pod(
    cluster: &RayCluster,
    ctx: &Context,
    group: &crate::api::raycluster::WorkerGroupSpec,
    replica: &WorkerReplica,
) -> Result<String, Error> {
    let (namespace, name) = key_of(cluster);
    let pod = builders::pod::worker_pod(cluster, group, replica, &ctx.config.build)?;
    match create_pod(ctx, &pod).await {
        Ok(created) => {
            let created_name = created.name_any();
            ctx.expectations.record(
                &(namespace.clone(), name),
                Group::Worker(group.group_name.clone()),
                &created_name,
                ScaleAction::Create,
                Instant::now(),
            );
            Ok(created_name)
        }
        Err(e) => {
            ctx.event(
                cluster,
                EventType::Warning,
                reasons::FAILED_TO_CREATE_WORKER_POD,
                "Create",
                format!("Failed to create worker Pod for the cluster {namespace}/{name}: {e}"),
            )
            .await;
            Err(Error::replica(
                condition_reasons::FAILED_CREATE_WORKER_POD,
                format!("creating a worker Pod of group {}", group.group_name),
                e,
            ))
        }
    }
}

async fn delete_worker(
    cluster: &RayCluster,
    ctx: &Context,
    group: &Group,
    pod: &Pod,
    reason: &DeleteReason,
) -> Result<(), Error> {
    let (namespace, _) = key_of(cluster);
    let pod_name = pod.name_any();
    if let Err(e) = delete_pod(ctx, pod).await {
        ctx.event(
            cluster,
            EventType::Warning,
            reasons::FAILED_TO_DELETE_WORKER_POD,
            "Delete",
            format!(
                "Failed deleting worker Pod {namespace}/{pod_name} ({}): {e}",
                reason.describe()
            ),
        )
        .await;
        return Err(Error::replica(
            condition_reasons::FAILED_DELETE_WORKER_POD,
            format!("deleting worker Pod {pod_name}"),
            e,
        ));
    }
    ctx.expectations.record(
        &key_of(cluster),
        group.clone(),
        &pod_name,
        ScaleAction::Delete,
        Instant::now(),
    );
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::DELETED_WORKER_POD,
        "Delete",
        format!(
            "Deleted worker Pod {namespace}/{pod_name}: {}",
            reason.describe()
        ),
    )
    .await;
    Ok(())
}
