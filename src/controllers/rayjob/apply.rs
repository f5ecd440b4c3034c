//! The RayJob's writes to its children: the RayCluster it creates (or the selected one it
//! uses), its head Service, the submitter Job, its finalizer, worker suspension and cluster
//! deletion. Objects
//! are built in `build` (pure); here they are created, patched or deleted, with KubeRay's
//! Events. An object of a child's name that the RayJob does not control is reported and left
//! alone.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::context::Context;
use super::error::{Error, kube_err};
use super::{build, reasons};
use crate::api::RayCluster;
use crate::api::rayjob::{JobSubmissionMode, RayJob, RayJobStatus};
use crate::controllers::frame::children::{ChildEvents, ChildWriter, Mode};
use crate::controllers::raycluster::batch::{PodGroupError, PodGroupWrite, write_pod_group};
use crate::controllers::raycluster::builders::batch_scheduler::BatchScheduler;
use crate::k8s::field_managers;
use crate::kuberay::keys::labels;
use crate::validation::rayjob::RayJobValues;

/// The RayJob's API handles (in its namespace) and its Events.
impl Context {
    pub(super) fn jobs(&self, job: &RayJob) -> Api<RayJob> {
        Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default())
    }
    pub(super) fn clusters(&self, job: &RayJob) -> Api<RayCluster> {
        Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default())
    }
    pub(super) fn submitters(&self, job: &RayJob) -> Api<Job> {
        Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default())
    }

    pub(super) async fn event(
        &self,
        job: &RayJob,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        crate::k8s::publish_event(&self.recorder, job, type_, reason, action, note).await;
    }
}

/// Writes the RayJob's children, with their Events on it.
fn writer<'a>(job: &'a RayJob, ctx: &'a Context) -> ChildWriter<'a, RayJob> {
    ChildWriter::new(&ctx.recorder, job, field_managers::RAYJOB)
}

/// The action of the Warning that names someone else's object of a child's name.
const CONFLICT_ACTION: &str = "CreateRayJobChild";

pub(super) async fn set_finalizers(
    job: &RayJob,
    ctx: &Context,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": job.resource_version()}
    });
    ctx.jobs(job)
        .patch(
            &job.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(kube_err("updating the RayJob finalizers"))?;
    Ok(())
}

pub(super) fn cluster_name(status: &RayJobStatus) -> Result<String, Error> {
    status
        .ray_cluster_name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Error::Invalid("status.rayClusterName is empty".into()))
}

/// KubeRay's `DoBatchSchedulingOnSubmission` for a RayJob, on every Initializing pass:
/// Volcano's PodGroup for the job (cluster and submitter); KAI refuses K8sJobMode (its
/// submitter would start outside the gang). YuniKorn needs nothing here; scheduler-plugins
/// gangs the RayJob's cluster through the RayCluster controller (KubeRay v1.7 instead fails
/// every RayJob there, which raypipe does not copy).
pub(super) async fn submit_to_batch_scheduler(
    job: &RayJob,
    values: &RayJobValues,
    ctx: &Context,
) -> Result<(), Error> {
    let Some(scheduler) = ctx.config.build.batch_scheduler else {
        return Ok(());
    };
    let refused = match scheduler {
        BatchScheduler::Volcano => match build::volcano_pod_group(job, values.mode) {
            Ok(desired) => {
                match write_pod_group(&ctx.client, scheduler, &desired, true, field_managers::RAYJOB)
                    .await
                {
                    Ok(_) => return Ok(()),
                    Err(PodGroupError::Kube(failure)) => return Err(failure.into()),
                    Err(PodGroupError::CrdMissing(message)) => message,
                }
            }
            Err(e) => e.to_string(),
        },
        BatchScheduler::KaiScheduler if values.mode == JobSubmissionMode::K8sJobMode => {
            "KAI-Scheduler does not support RayJob with K8sJobMode: the submitter pod is created after RayCluster is ready, preventing proper gang scheduling".to_owned()
        }
        _ => return Ok(()),
    };
    ctx.event(
        job,
        EventType::Warning,
        reasons::BATCH_SCHEDULING_FAILED,
        "Create",
        refused.clone(),
    )
    .await;
    // Retried with backoff, as KubeRay requeues the RayJob with the error.
    Err(Error::Invalid(refused))
}

/// KubeRay's `CleanupOnCompletion`: once a RayJob finished or was suspended, Volcano's
/// PodGroup is shrunk to what its cluster still holds. Not for a selected cluster.
pub(super) async fn release_batch_scheduler(
    job: &RayJob,
    ctx: &Context,
    cluster_name: Option<&str>,
) -> Result<(), Error> {
    if ctx.config.build.batch_scheduler != Some(BatchScheduler::Volcano)
        || build::selected_cluster(job).is_some()
    {
        return Ok(());
    }
    let Some(name) = cluster_name.filter(|n| !n.is_empty()) else {
        return Ok(());
    };
    let cluster = ctx
        .clusters(job)
        .get_opt(name)
        .await
        .map_err(kube_err("reading the RayCluster"))?
        .filter(|c| c.meta().deletion_timestamp.is_none());
    let desired = build::released_volcano_pod_group(job, cluster.as_ref())?;
    let key = format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any());
    let failed = match write_pod_group(
        &ctx.client,
        BatchScheduler::Volcano,
        &desired,
        true,
        field_managers::RAYJOB,
    )
    .await
    {
        Ok(PodGroupWrite::Unchanged) => return Ok(()),
        Ok(_) => {
            ctx.event(
                job,
                EventType::Normal,
                reasons::BATCH_SCHEDULER_CLEANED_UP,
                "Cleanup",
                format!("Cleaned up batch scheduler resources for RayJob {key}"),
            )
            .await;
            return Ok(());
        }
        Err(PodGroupError::Kube(failure)) => Error::from(failure),
        Err(PodGroupError::CrdMissing(message)) => Error::Invalid(message),
    };
    ctx.event(
        job,
        EventType::Warning,
        reasons::FAILED_TO_CLEANUP_BATCH_SCHEDULER,
        "Cleanup",
        format!("Failed to cleanup batch scheduler resources for RayJob {key}: {failed}"),
    )
    .await;
    Err(failed)
}

/// The RayJob's cluster: the selected one (must exist) or the one it creates.
pub(super) async fn ensure_cluster(
    job: &RayJob,
    values: &RayJobValues,
    ctx: &Context,
    status: &RayJobStatus,
) -> Result<RayCluster, Error> {
    let name = cluster_name(status)?;
    let api = ctx.clusters(job);
    if let Some(cluster) = api
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("reading RayCluster {name}")))?
    {
        // A selected cluster is the user's to share; one the job makes must be the job's.
        if values.selected_cluster.is_none()
            && let Err(conflict) =
                crate::k8s::check_controlled_by(&cluster, &job.uid().unwrap_or_default())
        {
            return Err(report_conflict(job, ctx, conflict).await);
        }
        return Ok(cluster);
    }
    if values.selected_cluster.is_some() {
        ctx.event(
            job,
            EventType::Warning,
            reasons::RAY_CLUSTER_NOT_FOUND,
            "GetRayCluster",
            format!("RayCluster {name} selected by clusterSelector was not found"),
        )
        .await;
        return Err(Error::ClusterNotFound(name));
    }
    let mut desired = build::ray_cluster(
        job,
        values,
        &name,
        status.job_id.as_deref().unwrap_or_default(),
    )?;
    if let Some(scheduler) = ctx.config.build.batch_scheduler {
        build::add_scheduler_metadata_to_cluster(job, values.mode, scheduler, &mut desired);
    }
    let namespace = job.namespace().unwrap_or_default();
    let events = ChildEvents::new("CreateRayCluster")
        .written(
            reasons::CREATED_RAY_CLUSTER,
            format!("Created RayCluster {namespace}/{name}"),
        )
        .failed(
            reasons::FAILED_TO_CREATE_RAY_CLUSTER,
            format!("Failed to create RayCluster {name}"),
        )
        .conflict_report(CONFLICT_ACTION);
    let written = writer(job, ctx)
        .write(&api, &desired, Mode::Create, events)
        .await?;
    Ok(written.into_object())
}

/// A Warning event naming an object of a child's name that the RayJob does not control; the
/// object is left as it is and the error keeps the RayJob from going on with it.
pub(super) async fn report_conflict(
    job: &RayJob,
    ctx: &Context,
    conflict: crate::k8s::K8sError,
) -> Error {
    ctx.event(
        job,
        EventType::Warning,
        conflict.conflict_reason().unwrap_or("ObjectConflict"),
        CONFLICT_ACTION,
        conflict.to_string(),
    )
    .await;
    Error::K8s(conflict)
}

/// The RayJob's head Service `<rayjob>-head-svc` (KubeRay's, made while Running): created for
/// a cluster the RayJob made (none for a selected cluster) and re-pointed only when the RayJob
/// moved to another cluster (after a retry), by server-side apply, which keeps its clusterIP.
/// A Service of that name the RayJob does not control is reported and left alone (KubeRay
/// would take it over).
pub(super) async fn ensure_head_service(
    job: &RayJob,
    ctx: &Context,
    cluster: &RayCluster,
) -> Result<(), Error> {
    if build::selected_cluster(job).is_some() {
        return Ok(());
    }
    let desired = build::head_service(job, cluster, &ctx.config.build)?;
    let name = desired.name_any();
    let api: Api<Service> =
        Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    let found = api
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("reading Service {name}")))?;
    let selects = |s: &Service| {
        s.spec
            .as_ref()
            .and_then(|spec| spec.selector.as_ref())
            .and_then(|selector| selector.get(labels::CLUSTER))
            .cloned()
    };
    if let Some(found) = &found
        && controlled_by_job(found.meta(), job)
        && selects(found) == Some(cluster.name_any())
    {
        return Ok(());
    }
    let (reason, failed_reason, verb) = match &found {
        None => (
            reasons::CREATED_SERVICE,
            reasons::FAILED_TO_CREATE_SERVICE,
            "Created",
        ),
        Some(_) => (
            reasons::UPDATED_SERVICE,
            reasons::FAILED_TO_UPDATE_SERVICE,
            "Updated",
        ),
    };
    let namespace = job.namespace().unwrap_or_default();
    let events = ChildEvents::new("ApplyService")
        .written(
            reason,
            format!(
                "{verb} the service {namespace}/{name}; it selects RayCluster {}",
                cluster.name_any()
            ),
        )
        .failed(
            failed_reason,
            format!("Failed to apply the service {namespace}/{name}"),
        )
        .conflict_report(CONFLICT_ACTION);
    let mode = Mode::Apply {
        existing: found.as_ref().map(|f| f.meta()),
    };
    writer(job, ctx).write(&api, &desired, mode, events).await?;
    Ok(())
}

pub(super) async fn ensure_submitter(
    job: &RayJob,
    values: &RayJobValues,
    ctx: &Context,
    status: &RayJobStatus,
    cluster: &RayCluster,
) -> Result<(), Error> {
    let api = ctx.submitters(job);
    if let Some(found) = api
        .get_opt(&job.name_any())
        .await
        .map_err(kube_err("reading the submitter Job"))?
    {
        return match crate::k8s::check_controlled_by(&found, &job.uid().unwrap_or_default()) {
            Ok(()) => Ok(()),
            Err(conflict) => Err(report_conflict(job, ctx, conflict).await),
        };
    }
    let mut desired = build::submitter_job(
        job,
        values,
        cluster,
        status.dashboard_url.as_deref().unwrap_or_default(),
        status.job_id.as_deref().unwrap_or_default(),
    )?;
    if let Some(scheduler) = ctx.config.build.batch_scheduler {
        build::add_scheduler_metadata_to_submitter(job, scheduler, &mut desired);
    }
    let events = ChildEvents::new("CreateRayJobSubmitter")
        .written(
            reasons::CREATED_SUBMITTER,
            format!(
                "Created Kubernetes Job {}/{}",
                job.namespace().unwrap_or_default(),
                job.name_any()
            ),
        )
        .failed(
            reasons::FAILED_TO_CREATE_SUBMITTER,
            "Failed to create the submitter Job".to_owned(),
        )
        .conflict_report(CONFLICT_ACTION);
    writer(job, ctx)
        .write(&api, &desired, Mode::Create, events)
        .await?;
    Ok(())
}

/// Whether the RayJob is the controller of the object `meta` describes.
pub(super) fn controlled_by_job(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    job: &RayJob,
) -> bool {
    crate::k8s::is_controlled_by(meta, &job.uid().unwrap_or_default())
}

/// Deletes only the object that was read (a same-named one made since is not touched).
pub(super) fn uid_precondition(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Preconditions {
    Preconditions {
        uid: meta.uid.clone(),
        resource_version: None,
    }
}

/// Deletes the job's own `cluster` (the caller checked that the job controls it).
pub(super) async fn delete_cluster(
    job: &RayJob,
    ctx: &Context,
    cluster: &RayCluster,
) -> Result<(), Error> {
    let name = cluster.name_any();
    let params = DeleteParams {
        preconditions: Some(uid_precondition(cluster.meta())),
        ..DeleteParams::background()
    };
    match ctx.clusters(job).delete(&name, &params).await {
        Ok(_) => {
            ctx.event(
                job,
                EventType::Normal,
                reasons::DELETED_RAY_CLUSTER,
                "DeleteRayCluster",
                format!(
                    "Deleted RayCluster {}/{name}",
                    job.namespace().unwrap_or_default()
                ),
            )
            .await;
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => {
            ctx.event(
                job,
                EventType::Warning,
                reasons::FAILED_TO_DELETE_RAY_CLUSTER,
                "DeleteRayCluster",
                format!("Failed to delete RayCluster {name}: {e}"),
            )
            .await;
            Err(kube_err(format!("deleting RayCluster {name}"))(e).into())
        }
    }
}

/// DeleteWorkers: every worker group of the cluster is suspended.
pub(super) async fn suspend_workers(
    job: &RayJob,
    ctx: &Context,
    cluster: Option<&RayCluster>,
) -> Result<(), Error> {
    let Some(cluster) = cluster else {
        return Ok(());
    };
    let groups: Vec<serde_json::Value> = cluster
        .spec
        .worker_group_specs
        .iter()
        .flatten()
        .map(|g| {
            let mut v = serde_json::to_value(g).unwrap_or_default();
            v["suspend"] = serde_json::Value::Bool(true);
            v
        })
        .collect();
    // A JSON merge patch replaces the list as a whole; the resourceVersion guards it.
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": cluster.resource_version()},
        "spec": {"workerGroupSpecs": groups}
    });
    let name = cluster.name_any();
    match ctx
        .clusters(job)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            ctx.event(
                job,
                EventType::Normal,
                reasons::UPDATED_RAY_CLUSTER,
                "UpdateRayCluster",
                format!("Suspended the worker groups of RayCluster {name}"),
            )
            .await;
            Ok(())
        }
        Err(e) => {
            ctx.event(
                job,
                EventType::Warning,
                reasons::FAILED_TO_UPDATE_RAY_CLUSTER,
                "UpdateRayCluster",
                format!("Failed to suspend the worker groups of RayCluster {name}: {e}"),
            )
            .await;
            Err(kube_err(format!("suspending the workers of RayCluster {name}"))(e).into())
        }
    }
}
