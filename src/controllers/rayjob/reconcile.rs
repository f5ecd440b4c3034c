//! The stages of one RayJob pass, as the frame runs them (`controllers::frame::pass`): observe
//! (the RayJob read fresh) → validate → act (one state-machine step, the stage of
//! `status.jobDeploymentStatus`) → status → finish. The Initializing and Waiting steps live
//! here; Running is in `submit`, teardown, cleanup and finalization in `deletion`, writes to the
//! API server in `apply`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::info;

use super::apply::{ensure_cluster, ensure_submitter, set_finalizers, submit_to_batch_scheduler};
use super::config::Config;
use super::context::Context;
use super::deletion::FINALIZER;
use super::deletion::{finalize, finished, tear_down};
use super::error::{Error, kube_err};
use super::status::status_write;
use super::submit::{dashboard_url_of, running};
use super::transitions::check_deadlines;
use super::{build, transitions};
use crate::api::raycluster::ClusterState;
use crate::api::rayjob::{
    JobDeploymentStatus, JobFailedReason, JobSubmissionMode, RayJob, RayJobStatus,
};
use crate::controllers::frame::pass::{Acted, Flow, Stages, StatusWrite};
use crate::controllers::frame::run::{Frame, Framed};
use crate::validation::problem::Problem;
use crate::validation::rayjob::RayJobValues;
use crate::validation::validated::{Validated, for_controller};

impl crate::controllers::frame::ReportPanic<RayJob> for Context {
    fn report_panic(
        &self,
        object: Arc<RayJob>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        crate::controllers::frame::panic_event(&self.recorder, object, message)
    }
}

impl Framed<RayJob> for Context {
    fn frame(&self) -> &Frame<RayJob> {
        &self.frame
    }
}

/// What a RayJob pass reads: the RayJob fresh from the API server (see the module header of
/// `rayjob`), and its status as found there.
pub struct Seen {
    job: RayJob,
    before: RayJobStatus,
}

impl Seen {
    /// The status the pass starts from: as found, with the counters the CRD defaults set, so
    /// an unchanged status compares equal.
    fn start_status(&self) -> RayJobStatus {
        let mut status = self.before.clone();
        status.succeeded.get_or_insert(0);
        status.failed.get_or_insert(0);
        status
    }
}

impl Stages<RayJob> for Context {
    type Observed = Seen;
    type Valid = Validated<RayJob>;
    type Status = RayJobStatus;
    /// The step's action, and whether the deployment status moved.
    type Applied = (Action, bool);
    type Error = Error;
    const FIELD_MANAGER: &'static str = crate::k8s::field_managers::RAYJOB;

    fn kube(&self) -> (&kube::Client, &crate::k8s::EventRecorder) {
        (&self.client, &self.recorder)
    }

    async fn observe(self: &Arc<Self>, job: Arc<RayJob>) -> Result<Flow<RayJob, Seen>, Error> {
        let api: Api<RayJob> =
            Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default());
        let Some(job) = api
            .get_opt(&job.name_any())
            .await
            .map_err(kube_err("reading the RayJob"))?
        else {
            return Ok(Flow::Done(Action::await_change()));
        };
        if crate::kuberay::spec::managed_elsewhere(job.spec.managed_by.as_deref()) {
            // Another controller (e.g. Kueue MultiKueue) owns this RayJob.
            return Ok(Flow::Done(Action::await_change()));
        }
        if job.meta().deletion_timestamp.is_some() {
            return Ok(Flow::Deleting(Arc::new(job)));
        }
        let before = job.status.clone().unwrap_or_default();
        Ok(Flow::Go(Seen { job, before }))
    }

    fn object(seen: &Seen) -> &RayJob {
        &seen.job
    }

    async fn finalize(&self, job: Arc<RayJob>) -> Result<Action, Error> {
        finalize(&job, self).await
    }

    fn validate(&self, seen: &Seen) -> Result<Validated<RayJob>, Problem> {
        for_controller(&seen.job, &self.config.feature_gates)
    }

    /// A refused RayJob's status says `ValidationFailed`.
    fn refused(&self, seen: &Seen, problem: &Problem) -> Result<Option<RayJobStatus>, Error> {
        let mut status = seen.start_status();
        status.job_deployment_status = Some(JobDeploymentStatus::ValidationFailed);
        status.reason = Some(JobFailedReason::ValidationFailed);
        status.message = Some(problem.message.clone());
        Ok(Some(status))
    }

    /// One step of the state machine; a finished RayJob only has its cleanup rules applied (its
    /// status is not written).
    async fn act(
        self: &Arc<Self>,
        seen: &Seen,
        valid: Validated<RayJob>,
    ) -> Acted<RayJobStatus, (Action, bool), Error> {
        let (job, before) = (&seen.job, &seen.before);
        let mut status = seen.start_status();
        let now = now();
        let started_in = status.job_deployment_status;
        if matches!(
            started_in,
            Some(JobDeploymentStatus::Complete | JobDeploymentStatus::Failed)
        ) {
            return Acted {
                status: None,
                result: finished(job, self, &status, &now).await.map(|a| (a, false)),
            };
        }
        let action = match step(job, &valid, self, &mut status, &now).await {
            Ok(action) => action,
            Err(e) => return Acted::failed(e),
        };
        if started_in.is_some_and(|s| !s.is_terminal()) {
            transitions::finish_pass(&job.spec, before, &mut status, &now);
        }
        let moved = status.job_deployment_status != before.job_deployment_status;
        if moved {
            info!(
                from = ?before.job_deployment_status,
                to = ?status.job_deployment_status,
                reason = ?status.reason,
                "RayJob deployment status changed"
            );
        }
        Acted {
            status: Some(status),
            result: Ok((action, moved)),
        }
    }

    fn plan_write(&self, seen: &Seen, status: &RayJobStatus) -> StatusWrite {
        status_write(&seen.before, status)
    }

    /// A transition written is followed at once by the next step (KubeRay requeues immediately
    /// too).
    async fn finish(
        &self,
        _: &Seen,
        applied: Result<(Action, bool), Error>,
        write: StatusWrite,
    ) -> Result<Action, Error> {
        let (action, moved) = applied?;
        Ok(if moved && write == StatusWrite::Now {
            Action::requeue(Duration::from_millis(100))
        } else {
            action
        })
    }
}

pub(super) fn now() -> Time {
    crate::k8s::now()
}

/// One step of the state machine from a status that is not final (`Complete` and `Failed` are
/// `finished`'s).
async fn step(
    job: &RayJob,
    valid: &RayJobValues,
    ctx: &Context,
    status: &mut RayJobStatus,
    now: &Time,
) -> Result<Action, Error> {
    Ok(match status.job_deployment_status {
        None => start(job, valid, ctx, status, now).await?,
        // A fixed spec brings a refused RayJob back (KubeRay leaves it stuck).
        Some(JobDeploymentStatus::ValidationFailed) => {
            *status = RayJobStatus {
                succeeded: status.succeeded,
                failed: status.failed,
                ..Default::default()
            };
            Action::requeue(Duration::ZERO)
        }
        Some(JobDeploymentStatus::Initializing) => {
            initializing(job, valid, ctx, status, now).await?
        }
        Some(JobDeploymentStatus::Waiting) => waiting(job, status, now, &ctx.config),
        Some(JobDeploymentStatus::Running) => running(job, valid, ctx, status, now).await?,
        Some(s @ (JobDeploymentStatus::Suspending | JobDeploymentStatus::Retrying)) => {
            tear_down(job, ctx, status, s).await?
        }
        Some(JobDeploymentStatus::Suspended) => {
            if job.spec.suspend == Some(true) {
                Action::await_change()
            } else {
                status.job_deployment_status = None;
                status.job_status = None;
                Action::requeue(Duration::ZERO)
            }
        }
        // Final: `finished` handles them before a step is taken.
        Some(JobDeploymentStatus::Complete | JobDeploymentStatus::Failed) => Action::await_change(),
    })
}

/// New: finalizer, job id and cluster name, then Initializing.
pub(super) async fn start(
    job: &RayJob,
    values: &RayJobValues,
    ctx: &Context,
    status: &mut RayJobStatus,
    now: &Time,
) -> Result<Action, Error> {
    if !job.finalizers().iter().any(|f| f == FINALIZER) {
        let mut finalizers = job.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        set_finalizers(job, ctx, finalizers).await?;
    }
    let mode = values.mode;
    if status.job_id.is_none() {
        status.job_id = match job.spec.job_id.clone().filter(|id| !id.is_empty()) {
            Some(id) => Some(id),
            None if mode == JobSubmissionMode::InteractiveMode => None,
            None => Some(build::generated_name(job, &crate::k8s::random_suffix())),
        };
    }
    if status.ray_cluster_name.is_none() {
        status.ray_cluster_name = Some(match &values.selected_cluster {
            Some(name) => name.clone(),
            None => build::generated_name(job, &crate::k8s::random_suffix()),
        });
    }
    status.job_status = None;
    status.job_deployment_status = Some(JobDeploymentStatus::Initializing);
    status.start_time = Some(now.clone());
    Ok(Action::requeue(ctx.config.requeue))
}

pub(super) async fn initializing(
    job: &RayJob,
    values: &RayJobValues,
    ctx: &Context,
    status: &mut RayJobStatus,
    now: &Time,
) -> Result<Action, Error> {
    if job.spec.suspend == Some(true) {
        status.job_deployment_status = Some(JobDeploymentStatus::Suspending);
        return Ok(Action::requeue(ctx.config.requeue));
    }
    if check_deadlines(job, status, now, true) {
        return Ok(Action::requeue(ctx.config.requeue));
    }
    submit_to_batch_scheduler(job, values, ctx).await?;
    let cluster = ensure_cluster(job, values, ctx, status).await?;
    status.ray_cluster_status = cluster.status.clone();
    if status.dashboard_url.is_none() {
        let ready = cluster.status.as_ref().and_then(|s| s.state) == Some(ClusterState::Ready);
        if !ready {
            return Ok(Action::requeue(ctx.config.requeue));
        }
        status.dashboard_url = Some(dashboard_url_of(job, ctx, &cluster).await?);
    }
    match values.mode {
        JobSubmissionMode::InteractiveMode => {
            status.job_deployment_status = Some(JobDeploymentStatus::Waiting);
        }
        JobSubmissionMode::K8sJobMode => {
            ensure_submitter(job, values, ctx, status, &cluster).await?;
            status.job_deployment_status = Some(JobDeploymentStatus::Running);
        }
        JobSubmissionMode::HttpMode | JobSubmissionMode::SidecarMode => {
            status.job_deployment_status = Some(JobDeploymentStatus::Running);
        }
    }
    Ok(Action::requeue(ctx.config.requeue))
}

pub(super) fn waiting(
    job: &RayJob,
    status: &mut RayJobStatus,
    now: &Time,
    config: &Config,
) -> Action {
    if check_deadlines(job, status, now, true) {
        return Action::requeue(config.requeue);
    }
    if let Some(id) = job.spec.job_id.clone().filter(|id| !id.is_empty()) {
        status.job_id = Some(id);
        status.job_deployment_status = Some(JobDeploymentStatus::Running);
    }
    Action::requeue(config.requeue)
}
