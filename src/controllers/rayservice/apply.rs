//! The RayService's writes to its children: RayClusters (create-only for a new one, in-place
//! update, delayed deletion of the ones no longer active or pending), the head and serve
//! Services (the traffic switch), the Gateway API objects of an incremental upgrade, and the
//! EndpointSlice count. Objects come from `build`;
//! a child of our name that the RayService does not control is reported and left alone.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, PropagationPolicy};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::info;

use super::context::Context;
use super::error::{Error, KubeFailure};
use super::observed::Observed;
use super::upgrade::{Built, Candidate, Desired, IncrementalPlan};
use super::{build, gateway, incremental, reasons, status};
use crate::api::conditions::FALSE;
use crate::api::raycluster::RayCluster;
use crate::api::rayservice::{
    RayService, RayServiceClusterStatus, RayServiceStatus, condition_types,
};
use crate::controllers::frame::children::{ChildEvents, ChildWriter, Mode};
use crate::k8s::field_managers;

/// How the cluster writes of a pass ended.
pub(super) enum ClustersApplied {
    /// The pending cluster was created: the pass ends and comes back shortly.
    PendingCreated,
    /// Someone else's RayCluster blocks the first cluster: the Ready condition says so, and
    /// the pass fails with this error after its status is written.
    Blocked(Error),
    /// Clusters are as desired; `dangling_left` old ones still wait for deletion.
    Applied { dangling_left: usize },
}

/// Writes the desired clusters in order: clusters no longer active or pending go after the
/// deletion delay, then the pending cluster is created, else in-place updates are applied.
/// A first cluster blocked by someone else's RayCluster is named in the Ready condition.
pub(super) async fn clusters(
    service: &RayService,
    ctx: &Context,
    desired: &mut Desired,
    status: &mut RayServiceStatus,
    generation: Option<i64>,
    now: &Time,
) -> Result<ClustersApplied, Error> {
    let dangling_left =
        delete_clusters(service, ctx, &desired.dangling, desired.deletion_delay).await;
    if let Some((name, built)) = desired.create.take() {
        if let Err(e) = create_cluster(service, ctx, &name, built).await {
            // A first cluster blocked by someone else's RayCluster: say so where people look.
            if let Error::Apply(k) = &e
                && let Some(reason) = k.conflict_reason()
                && desired.active.is_none()
            {
                status::set(
                    status,
                    condition_types::READY,
                    FALSE,
                    reason,
                    &k.to_string(),
                    generation,
                    now.clone(),
                );
                return Ok(ClustersApplied::Blocked(e));
            }
            return Err(e);
        }
        return Ok(ClustersApplied::PendingCreated);
    }
    for (cluster, built) in std::mem::take(&mut desired.update_in_place) {
        if crate::controllers::rayservice::build::admitted_as_a_whole(service)
            && let Ok(goal) = &built
            && goal.spec.suspend.unwrap_or(false) != cluster.spec.suspend.unwrap_or(false)
        {
            follow_suspend(service, ctx, &cluster, goal.spec.suspend.unwrap_or(false)).await?;
        }
        update_cluster(service, ctx, &cluster, built).await?;
    }
    Ok(ClustersApplied::Applied { dangling_left })
}

/// Creates the RayCluster `name` (create-only: a RayCluster of that name someone else made is
/// reported as a conflict and left alone; one we made earlier is fine).
async fn create_cluster(
    service: &RayService,
    ctx: &Context,
    name: &str,
    built: Built<RayCluster>,
) -> Result<(), Error> {
    let cluster = built?;
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    let events = ChildEvents::new("CreateRayCluster")
        .written(
            reasons::CREATED_RAY_CLUSTER,
            format!("created RayCluster {name}"),
        )
        .failed(
            reasons::FAILED_TO_CREATE_RAY_CLUSTER,
            format!("creating RayCluster {name} failed"),
        )
        .conflict_reason();
    let written = writer(service, ctx)
        .write(&api, &cluster, Mode::Create, events)
        .await?;
    // Not new: an earlier pass made it and the cache has not shown its event yet.
    if written.is_new() {
        info!(cluster = %name, "created the RayCluster");
    }
    Ok(())
}

/// Kueue's gate reaches the cluster on its own: `spec.suspend` alone, patched before the
/// whole in-place apply, so a preemption stops the cluster even when that apply is refused
/// (Kueue writes into and takes back from the templates the apply carries).
async fn follow_suspend(
    service: &RayService,
    ctx: &Context,
    cluster: &RayCluster,
    suspend: bool,
) -> Result<(), Error> {
    let name = cluster.name_any();
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    let patch = serde_json::json!({"spec": {"suspend": suspend}});
    api.patch(
        &name,
        &kube::api::PatchParams {
            field_manager: Some(field_managers::RAYSERVICE.to_owned()),
            ..Default::default()
        },
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .map_err(|e| {
        Error::Kube(crate::controllers::frame::failure::KubeFailure::new(
            format!("setting suspend of RayCluster {name}"),
            e,
        ))
    })?;
    info!(cluster = %name, suspend, "the cluster follows Kueue's admission");
    Ok(())
}

async fn update_cluster(
    service: &RayService,
    ctx: &Context,
    cluster: &RayCluster,
    built: Built<RayCluster>,
) -> Result<(), Error> {
    let name = cluster.name_any();
    let desired = built?;
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    let events = ChildEvents::new("UpdateRayCluster")
        .written(
            reasons::UPDATED_RAY_CLUSTER,
            format!("updated RayCluster {name} in place"),
        )
        .failed(
            reasons::FAILED_TO_UPDATE_RAY_CLUSTER,
            format!("updating RayCluster {name} failed"),
        );
    let mode = Mode::Apply {
        existing: Some(cluster.meta()),
    };
    writer(service, ctx)
        .write(&api, &desired, mode, events)
        .await?;
    info!(cluster = %name, "updated the RayCluster in place");
    Ok(())
}

/// Writes the RayService's children, with their Events on it.
fn writer<'a>(service: &'a RayService, ctx: &'a Context) -> ChildWriter<'a, RayService> {
    ChildWriter::new(&ctx.recorder, service, field_managers::RAYSERVICE)
}

/// Deletes `clusters` once each has been dangling for `delay`; returns how many remain.
pub(super) async fn delete_clusters(
    service: &RayService,
    ctx: &Context,
    clusters: &[Arc<RayCluster>],
    delay: Duration,
) -> usize {
    let names: BTreeSet<String> = clusters.iter().map(|c| c.name_any()).collect();
    let due: Vec<String> = ctx.with_memory(service, |m| {
        m.deletion_due.retain(|name, _| names.contains(name));
        let now = Instant::now();
        names
            .iter()
            .filter(|name| {
                let at = *m
                    .deletion_due
                    .entry((*name).clone())
                    .or_insert_with(|| now + delay);
                at <= now
            })
            .cloned()
            .collect()
    });
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    for name in &due {
        if clusters
            .iter()
            .any(|c| &c.name_any() == name && c.meta().deletion_timestamp.is_some())
        {
            continue;
        }
        // Only the cluster that was seen as ours: a same-named one made since is not touched.
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: clusters.iter().find(|c| &c.name_any() == name).map(|c| {
                kube::api::Preconditions {
                    uid: c.uid(),
                    resource_version: None,
                }
            }),
            ..Default::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                info!(cluster = %name, "deleted a RayCluster that no longer serves");
                ctx.with_memory(service, |m| m.pushed.remove(name));
                ctx.event(
                    service,
                    EventType::Normal,
                    reasons::DELETED_RAY_CLUSTER,
                    "DeleteRayCluster",
                    format!("deleted RayCluster {name}"),
                )
                .await;
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                ctx.event(
                    service,
                    EventType::Warning,
                    reasons::FAILED_TO_DELETE_RAY_CLUSTER,
                    "DeleteRayCluster",
                    format!("deleting RayCluster {name} failed: {e}"),
                )
                .await;
            }
        }
    }
    clusters.len()
}

/// Points the head and serve Services at the `target` cluster (creating them on first use).
pub(super) async fn apply_services(
    service: &RayService,
    ctx: &Context,
    target: &mut Candidate,
) -> Result<(), Error> {
    // `None`: they were applied earlier in this pass.
    let Some(built) = target.services.take() else {
        return Ok(());
    };
    let desired = built?;
    let target = &*target.cluster;
    let namespace = service.namespace().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    for svc in desired {
        let name = svc.name_any();
        let hash = crate::k8s::stable_hash(&svc);
        let cached = ctx.cached_service(&namespace, &name);
        let unchanged = cached
            .as_ref()
            .is_some_and(|c| build::selected_cluster(c) == Some(target.name_any().as_str()))
            && ctx.with_memory(service, |m| m.applied_services.get(&name) == Some(&hash));
        if unchanged {
            continue;
        }
        let (reason, verb) = match &cached {
            None => (reasons::CREATED_SERVICE, "created"),
            Some(_) => (reasons::UPDATED_SERVICE, "updated"),
        };
        let mut events = ChildEvents::new("ApplyService")
            .failed(
                reasons::FAILED_TO_CREATE_SERVICE,
                format!("applying Service {name} failed"),
            )
            .conflict_reason();
        // Only a Service that now selects another cluster is news.
        let moved = cached
            .as_ref()
            .and_then(|c| build::selected_cluster(c).map(str::to_owned))
            != Some(target.name_any());
        if moved {
            events = events.written(
                reason,
                format!(
                    "{verb} Service {name}; it selects RayCluster {}",
                    target.name_any()
                ),
            );
        }
        // A cached Service of that name we do not control is refused without a request.
        let existing = cached.as_ref().map(|c| c.meta());
        let mode = Mode::Apply { existing };
        writer(service, ctx).write(&api, &svc, mode, events).await?;
        ctx.with_memory(service, |m| m.applied_services.insert(name, hash));
    }
    Ok(())
}

/// Distinct ready Pods behind the serve Services (from their EndpointSlices).
pub(super) async fn count_serve_endpoints(
    ctx: &Context,
    namespace: &str,
    services: &[String],
) -> Result<i32, Error> {
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), namespace);
    let names = services.join(",");
    let slices = api
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name in ({names})")))
        .await
        .map_err(|e| {
            KubeFailure::new(
                format!("listing the EndpointSlices of Service(s) {names}"),
                e,
            )
        })?;
    let pods: BTreeSet<String> = slices
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
        .filter_map(|e| e.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
        .filter_map(|r| r.uid.clone().or_else(|| r.name.clone()))
        .collect();
    Ok(i32::try_from(pods.len()).unwrap_or(i32::MAX))
}

/// The Gateway API side of an incremental upgrade, after Serve: records the capacities Serve
/// took, writes the Gateway (unless a shared one is named), the per-cluster serve Services and
/// the HTTPRoute with this pass's weights, and records the weights as the traffic each cluster
/// gets.
pub(super) async fn gateway_objects(
    service: &RayService,
    ctx: &Context,
    plan: &IncrementalPlan,
    desired: &Desired,
    observed: &Observed,
    status: &mut RayServiceStatus,
    now: &Time,
) -> Result<(), Error> {
    record_serve_capacities(status, observed);
    let (parent, shared) = gateway::parent(service);
    if !shared {
        let desired_gateway = gateway::gateway(service, &plan.options.gateway_class_name)?;
        apply_gateway_object(
            service,
            ctx,
            &desired_gateway,
            plan.gateway.as_ref(),
            |a, b| a.spec == b.spec,
            [
                reasons::CREATED_GATEWAY,
                reasons::UPDATED_GATEWAY,
                reasons::FAILED_TO_CREATE_GATEWAY,
                reasons::FAILED_TO_UPDATE_GATEWAY,
            ],
        )
        .await?;
    }
    create_cluster_serve_services(service, ctx, desired).await?;

    // KubeRay makes the route once there is an active cluster.
    let Some(active) = desired.active_cluster() else {
        return Ok(());
    };
    let pending = desired.pending_cluster().filter(|_| plan.upgrading);
    let (active_weight, pending_weight) =
        route_weights(plan, observed, status, pending.is_some(), now);
    let mut backends = vec![gateway::Backend {
        cluster: active.name_any(),
        port: gateway::serve_port(active),
        weight: active_weight,
    }];
    if let Some(pending) = pending {
        backends.push(gateway::Backend {
            cluster: pending.name_any(),
            port: gateway::serve_port(pending),
            weight: pending_weight,
        });
    }
    let route = gateway::http_route(service, parent, &backends)?;
    apply_gateway_object(
        service,
        ctx,
        &route,
        plan.route.as_ref(),
        |a, b| a.spec == b.spec,
        [
            reasons::CREATED_HTTP_ROUTE,
            reasons::UPDATED_HTTP_ROUTE,
            reasons::FAILED_TO_CREATE_HTTP_ROUTE,
            reasons::FAILED_TO_UPDATE_HTTP_ROUTE,
        ],
    )
    .await?;
    record_traffic(status, active_weight, pending.map(|_| pending_weight), now);
    Ok(())
}

/// The target capacities Serve took, into the cluster statuses that exist.
fn record_serve_capacities(status: &mut RayServiceStatus, observed: &Observed) {
    for (obs, slot) in [
        (&observed.active, &mut status.active_service_status),
        (&observed.pending, &mut status.pending_service_status),
    ] {
        if let (Some(capacity), Some(slot)) = (obs.as_ref().and_then(|o| o.target_capacity), slot) {
            slot.target_capacity = Some(capacity);
        }
    }
}

/// Creates the per-cluster serve Service of the active and pending clusters when the cache
/// has none (an existing one is left as it is).
async fn create_cluster_serve_services(
    service: &RayService,
    ctx: &Context,
    desired: &Desired,
) -> Result<(), Error> {
    let namespace = service.namespace().unwrap_or_default();
    for cluster in [desired.active_cluster(), desired.pending_cluster()]
        .into_iter()
        .flatten()
    {
        let svc = gateway::cluster_serve_service(service, cluster)?;
        if ctx.cached_service(&namespace, &svc.name_any()).is_some() {
            continue;
        }
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
        let name = svc.name_any();
        let events = ChildEvents::new("ApplyService")
            .written(
                reasons::CREATED_SERVICE,
                format!(
                    "created Service {name}; it selects RayCluster {}",
                    cluster.name_any()
                ),
            )
            .failed(
                reasons::FAILED_TO_CREATE_SERVICE,
                format!("creating Service {name} failed"),
            )
            .conflict_reason();
        writer(service, ctx)
            .write(&api, &svc, Mode::Create, events)
            .await?;
    }
    Ok(())
}

/// This pass's (active, pending) route weights: the next step of the migration while a
/// pending cluster is being upgraded to, else everything the active cluster has. Pure.
fn route_weights(
    plan: &IncrementalPlan,
    observed: &Observed,
    status: &RayServiceStatus,
    upgrading: bool,
    now: &Time,
) -> (i32, i32) {
    let empty = RayServiceClusterStatus::default();
    let active_status = status.active_service_status.as_ref().unwrap_or(&empty);
    let pending_status = status.pending_service_status.as_ref().unwrap_or(&empty);
    let split = incremental::Split::of(active_status, pending_status);
    if !upgrading {
        return (split.active_traffic, 0);
    }
    let last = if plan.rolling_back {
        active_status.last_traffic_migrated_time.as_ref()
    } else {
        pending_status.last_traffic_migrated_time.as_ref()
    };
    let pending_ready = observed.pending.as_ref().is_some_and(|o| o.ready);
    incremental::next_weights(
        split,
        &plan.options,
        plan.rolling_back,
        pending_ready,
        last,
        now,
    )
}

/// The route carries these weights now: they are the traffic each cluster gets (the pending
/// cluster's only while it is routed to). Pure.
fn record_traffic(
    status: &mut RayServiceStatus,
    active_weight: i32,
    pending_weight: Option<i32>,
    now: &Time,
) {
    let record = |slot: &mut Option<RayServiceClusterStatus>, weight: i32| {
        let slot = slot.get_or_insert_with(Default::default);
        if slot.traffic_routed_percent != Some(weight) {
            slot.traffic_routed_percent = Some(weight);
            slot.last_traffic_migrated_time = Some(now.clone());
        }
    };
    record(&mut status.active_service_status, active_weight);
    if let Some(weight) = pending_weight {
        record(&mut status.pending_service_status, weight);
    }
}

/// Creates or updates one Gateway API object of the RayService (someone else's of that name
/// is reported and left alone); Events as KubeRay names them (created, updated, failed).
async fn apply_gateway_object<K>(
    service: &RayService,
    ctx: &Context,
    desired: &K,
    existing: Option<&K>,
    same: impl Fn(&K, &K) -> bool,
    [created, updated, failed_create, failed_update]: [&str; 4],
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let kind = K::kind(&()).into_owned();
    let name = desired.name_any();
    if let Some(existing) = existing
        && gateway::is_ours(existing.meta(), service)
        && same(existing, desired)
    {
        return Ok(());
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    let (reason, verb, failed, failing) = match existing {
        None => (created, "created", failed_create, "creating"),
        Some(_) => (updated, "updated", failed_update, "updating"),
    };
    let events = ChildEvents::new("Apply")
        .written(reason, format!("{verb} {kind} {name}"))
        .failed(failed, format!("{failing} {kind} {name} failed"))
        .conflict_reason_as(format!("applying {kind} {name} failed"));
    let mode = Mode::Apply {
        existing: existing.map(|e| e.meta()),
    };
    writer(service, ctx)
        .write(&api, desired, mode, events)
        .await?;
    info!(%kind, %name, "{verb} the {kind}");
    Ok(())
}
