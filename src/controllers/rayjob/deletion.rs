//! Taking a RayJob's children down: Suspending and Retrying (cluster and submitter go, then the
//! status is reset), the cleanup of a finished RayJob (TTL and deletion rules, §3.5), and the
//! finalizer of a deleted one (its Ray job is stopped first).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use super::apply::{
    controlled_by_job, delete_cluster, set_finalizers, suspend_workers, uid_precondition,
};
use super::context::Context;
use super::error::{Error, kube_err};
use super::submit::dashboard;
use super::transitions::{Cleanup, ClusterView};
use super::{build, reasons, transitions};
use crate::api::rayjob::{
    DeletionPolicyType, JobDeploymentStatus, JobStatus, JobSubmissionMode, RayJob, RayJobStatus,
};

/// The finalizer that lets a deleted RayJob stop its Ray job first.
pub const FINALIZER: &str = "ray.io/rayjob-finalizer";

/// A deleted RayJob stops its Ray job (best effort) and lets go of its finalizer; the cluster
/// and submitter go with it through owner references.
pub(super) async fn finalize(job: &RayJob, ctx: &Context) -> Result<Action, Error> {
    if !job.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let status = job.status.clone().unwrap_or_default();
    if !status.job_status.is_some_and(JobStatus::is_terminal)
        && let (Some(_), Some(job_id)) = (&status.dashboard_url, &status.job_id)
    {
        match dashboard(job, ctx, &status, None).await {
            Ok(client) => match client.stop_job(job_id).await {
                Ok(_) => info!(job_id, "stopped the Ray job of the deleted RayJob"),
                Err(e) => warn!(error = %e, "stopping the Ray job failed; going on"),
            },
            Err(e) => warn!(error = %e, "no dashboard to stop the Ray job; going on"),
        }
    }
    let rest: Vec<String> = job
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    set_finalizers(job, ctx, rest).await?;
    Ok(Action::await_change())
}

/// Suspending and Retrying: the cluster and submitter go, then the status is reset.
pub(super) async fn tear_down(
    job: &RayJob,
    ctx: &Context,
    status: &mut RayJobStatus,
    from: JobDeploymentStatus,
) -> Result<Action, Error> {
    let mut gone = true;
    let background = DeleteParams::background();
    if build::selected_cluster(job).is_none()
        && let Some(name) = status.ray_cluster_name.clone().filter(|n| !n.is_empty())
    {
        let api = ctx.clusters(job);
        // Someone else's RayCluster of that name is not ours to delete.
        if let Some(cluster) = api
            .get_opt(&name)
            .await
            .map_err(kube_err("reading the RayCluster"))?
            .filter(|c| controlled_by_job(c.meta(), job))
        {
            gone = false;
            if cluster.meta().deletion_timestamp.is_none() {
                delete_cluster(job, ctx, &cluster).await?;
            }
        }
    }
    if build::mode(job) == JobSubmissionMode::K8sJobMode {
        let api = ctx.submitters(job);
        if let Some(submitter) = api
            .get_opt(&job.name_any())
            .await
            .map_err(kube_err("reading the submitter Job"))?
            .filter(|j| controlled_by_job(j.meta(), job))
        {
            gone = false;
            if submitter.meta().deletion_timestamp.is_none() {
                let background = DeleteParams {
                    preconditions: Some(uid_precondition(submitter.meta())),
                    ..background.clone()
                };
                match api.delete(&job.name_any(), &background).await {
                    Ok(_) => {
                        ctx.event(
                            job,
                            EventType::Normal,
                            reasons::DELETED_SUBMITTER,
                            "DeleteRayJobSubmitter",
                            format!("Deleted submitter Job {}", job.name_any()),
                        )
                        .await;
                    }
                    Err(e) => {
                        ctx.event(
                            job,
                            EventType::Warning,
                            reasons::FAILED_TO_DELETE_SUBMITTER,
                            "DeleteRayJobSubmitter",
                            format!("Failed to delete submitter Job {}: {e}", job.name_any()),
                        )
                        .await;
                        return Err(kube_err("deleting the submitter Job")(e).into());
                    }
                }
            }
        }
    }
    if !gone {
        return Ok(Action::requeue(ctx.config.requeue));
    }
    // The gang's resources go back to the queue before the job is marked suspended.
    super::apply::release_batch_scheduler(job, ctx, status.ray_cluster_name.as_deref()).await?;
    status.ray_cluster_status = None;
    status.ray_cluster_name = None;
    status.dashboard_url = None;
    status.job_id = None;
    status.message = None;
    status.reason = None;
    status.ray_job_info = None;
    status.job_status_check_failure_start_time = None;
    status.job_status = None;
    status.job_deployment_status = match from {
        JobDeploymentStatus::Suspending => Some(JobDeploymentStatus::Suspended),
        _ => None,
    };
    Ok(Action::requeue(Duration::ZERO))
}

/// Complete / Failed: run the cleanup that is due (§3.5), or wait for it.
pub(super) async fn finished(
    job: &RayJob,
    ctx: &Context,
    status: &RayJobStatus,
    now: &Time,
) -> Result<Action, Error> {
    // As in KubeRay, a failed release is reported (an Event) and the cleanup goes on.
    if let Err(e) =
        super::apply::release_batch_scheduler(job, ctx, status.ray_cluster_name.as_deref()).await
    {
        tracing::warn!(error = %e, "releasing the batch scheduler's resources");
    }
    let rules = transitions::rules(
        &job.spec,
        status,
        ctx.config
            .feature_gates
            .enabled(crate::validation::feature_gates::gates::RAY_JOB_DELETION_POLICY),
        ctx.config.delete_rayjob_after_finish,
    );
    if rules.is_empty() {
        return Ok(Action::await_change());
    }
    let name = status.ray_cluster_name.clone().unwrap_or_default();
    let cluster = if name.is_empty() {
        None
    } else {
        ctx.clusters(job)
            .get_opt(&name)
            .await
            .map_err(kube_err("reading the RayCluster"))?
            .filter(|c| c.meta().deletion_timestamp.is_none())
            // A cluster of that name that is not the job's is neither cleaned up nor suspended.
            .filter(|c| controlled_by_job(c.meta(), job))
    };
    let view = ClusterView {
        exists: cluster.is_some(),
        workers_suspended: cluster.as_ref().is_some_and(|c| {
            c.spec
                .worker_group_specs
                .iter()
                .flatten()
                .all(|g| g.suspend == Some(true))
        }),
    };
    match transitions::next_cleanup(&rules, status.end_time.as_ref(), now, view) {
        Cleanup::Done => Ok(Action::await_change()),
        Cleanup::Wait(after) => Ok(Action::requeue(after)),
        Cleanup::Run(policy) => {
            info!(?policy, "running the RayJob's cleanup");
            match policy {
                DeletionPolicyType::DeleteCluster => {
                    if let Some(cluster) = &cluster {
                        delete_cluster(job, ctx, cluster).await?
                    }
                }
                DeletionPolicyType::DeleteWorkers => {
                    suspend_workers(job, ctx, cluster.as_ref()).await?
                }
                DeletionPolicyType::DeleteSelf => {
                    match ctx
                        .jobs(job)
                        .delete(&job.name_any(), &DeleteParams::background())
                        .await
                    {
                        Ok(_) => {}
                        Err(kube::Error::Api(e)) if e.code == 404 => {}
                        Err(e) => return Err(kube_err("deleting the RayJob")(e).into()),
                    }
                    return Ok(Action::await_change());
                }
                DeletionPolicyType::DeleteNone => {}
            }
            Ok(Action::requeue(ctx.config.requeue))
        }
    }
}
