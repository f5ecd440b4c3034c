//! The RayJob controller, compatible with KubeRay (§3): get → validate → build (pure, in
//! `build`) → apply (RayCluster, submitter Job) → status, driven by
//! `status.jobDeploymentStatus`:
//!
//! ```text
//! "" ──▶ Initializing ──▶ Running ──▶ Complete | Failed ──▶ cleanup (TTL, deletion rules)
//!            │  ╰─(Interactive)─▶ Waiting ─╯     │
//!            ╰──── suspend ──▶ Suspending ──▶ Suspended ──(resume)──▶ ""
//!                         Failed with retries left ──▶ Retrying ──▶ ""
//! ```
//!
//! Dashboard calls have short timeouts and hold no lock; a dead or slow dashboard costs one
//! reconcile slot for a few seconds and requeues only its own RayJob. Each reconcile starts
//! from a fresh GET of the RayJob, so a status written in the previous pass is never read
//! stale from the cache (a stale read could count a retry twice).
//!
//! A RayCluster or submitter Job of the name the RayJob would create, made by someone else, is
//! reported (`RayClusterConflict`, `JobConflict`) and never used, suspended or deleted; a
//! cluster chosen by `clusterSelector` is the user's and is used as it is.

pub mod build;
pub mod transitions;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tracing::{Instrument, debug, info, warn};

use crate::api::RayCluster;
use crate::api::raycluster::{ClusterState, MANAGED_BY_KUBERAY};
use crate::api::rayjob::{
    DeletionPolicyType, JobDeploymentStatus, JobFailedReason, JobStatus, JobSubmissionMode, RayJob,
    RayJobStatus, RayJobStatusInfo,
};
use crate::k8s::field_managers;
use crate::kuberay::keys::labels;
use crate::kuberay::names;
use crate::kuberay::spec::auth_enabled;
use crate::ray::{
    DashboardClientOptions, DashboardError, DashboardLocator, HeadService, RayDashboardClient,
};
use transitions::{Cleanup, ClusterView};

/// The finalizer that lets a deleted RayJob stop its Ray job first.
pub const FINALIZER: &str = "ray.io/rayjob-finalizer";

/// KubeRay's Event reasons for RayJobs.
pub mod reasons {
    pub use crate::validation::rayjob::reasons::*;
    pub const CREATED_RAY_CLUSTER: &str = "CreatedRayCluster";
    pub const DELETED_RAY_CLUSTER: &str = "DeletedRayCluster";
    pub const UPDATED_RAY_CLUSTER: &str = "UpdatedRayCluster";
    pub const FAILED_TO_CREATE_RAY_CLUSTER: &str = "FailedToCreateRayCluster";
    pub const FAILED_TO_DELETE_RAY_CLUSTER: &str = "FailedToDeleteRayCluster";
    pub const FAILED_TO_UPDATE_RAY_CLUSTER: &str = "FailedToUpdateRayCluster";
    pub const RAY_CLUSTER_NOT_FOUND: &str = "RayClusterNotFound";
    pub const CREATED_SUBMITTER: &str = "CreatedRayJobSubmitter";
    pub const DELETED_SUBMITTER: &str = "DeletedRayJobSubmitter";
    pub const FAILED_TO_CREATE_SUBMITTER: &str = "FailedToCreateRayJobSubmitter";
    pub const FAILED_TO_DELETE_SUBMITTER: &str = "FailedToDeleteRayJobSubmitter";
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(transparent)]
    K8s(#[from] crate::k8s::K8sError),
    /// The RayJob cannot be built into objects (caught by validation first, normally).
    #[error("{0}")]
    Invalid(String),
    #[error("RayCluster {0} selected by clusterSelector does not exist")]
    ClusterNotFound(String),
    #[error(transparent)]
    Dashboard(#[from] DashboardError),
    /// A bug: the reconcile panicked; contained to this object (see `controllers::frame`).
    #[error(transparent)]
    Panicked(#[from] crate::controllers::frame::Panicked),
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube {
        action,
        source: Box::new(source),
    }
}

/// Operator-level settings (KubeRay's flags and environment switches, built by `config`).
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch only this namespace (`None`: all namespaces).
    pub namespace: Option<String>,
    /// RayJobs reconciled at once.
    pub concurrency: u16,
    /// Where a head Service's dashboard is dialled.
    pub locator: DashboardLocator,
    /// Timeouts of every dashboard call (kept short: a dead head must not stall the queue).
    pub dashboard_connect_timeout: Duration,
    pub dashboard_request_timeout: Duration,
    /// KubeRay's 3 s requeue while a RayJob is in flight.
    pub requeue: Duration,
    /// DNS domain written into `status.dashboardURL`.
    pub cluster_domain: String,
    /// Feature gate RayJobDeletionPolicy.
    pub deletion_policy: bool,
    /// `DELETE_RAYJOB_CR_AFTER_JOB_FINISHES`: shutdown deletes the RayJob instead of the cluster.
    pub delete_rayjob_after_finish: bool,
    /// `RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS`.
    pub status_check_timeout: Duration,
    /// `RAYJOB_DEPLOYMENT_STATUS_TRANSITION_GRACE_PERIOD_SECONDS`.
    pub transition_grace_period: Duration,
    /// How long after the submitter finished the Ray job may stay non-terminal.
    pub submitter_finished_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: None,
            concurrency: 4,
            locator: DashboardLocator::in_cluster(),
            dashboard_connect_timeout: Duration::from_secs(2),
            dashboard_request_timeout: Duration::from_secs(5),
            requeue: Duration::from_secs(3),
            cluster_domain: crate::ray::DEFAULT_CLUSTER_DOMAIN.to_owned(),
            deletion_policy: true,
            delete_rayjob_after_finish: false,
            status_check_timeout: Duration::from_secs(300),
            transition_grace_period: Duration::from_secs(300),
            submitter_finished_timeout: Duration::from_secs(30),
        }
    }
}

pub struct Context {
    client: kube::Client,
    config: Config,
    recorder: Recorder,
    /// Consecutive failures per RayJob, for the per-object backoff. Never held across an await.
    failures: Mutex<HashMap<(String, String), u32>>,
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    client: kube::Client,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let namespace = config.namespace.clone();
    let jobs: Api<RayJob> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let clusters: Api<RayCluster> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let submitters: Api<Job> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let concurrency = config.concurrency.max(1);
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(client.clone(), "rayjob-controller"),
        client,
        config,
        failures: Mutex::new(HashMap::new()),
    });

    // Label-scoped: only what RayJobs created is watched.
    let origin = format!(
        "{}={}",
        labels::ORIGINATED_FROM_CRD,
        build::ORIGINATED_FROM_RAYJOB
    );
    let cluster_events = watcher(clusters, watcher::Config::default().labels(&origin))
        .backoff(crate::k8s::watch_backoff())
        .touched_objects();
    let submitter_events = watcher(submitters, watcher::Config::default().labels(&origin))
        .backoff(crate::k8s::watch_backoff())
        .touched_objects();
    let (store, writer) = reflector::store();
    let job_events = watcher(jobs, watcher::Config::default())
        .backoff(crate::k8s::watch_backoff())
        .modify(|job: &mut RayJob| job.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(crate::k8s::spec_or_metadata_changed, Default::default());

    Controller::for_stream(job_events, store)
        .trigger_backoff(crate::k8s::watch_backoff())
        .owns_stream(cluster_events)
        .owns_stream(submitter_events)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            crate::controllers::frame::contain("rayjob", reconcile),
            crate::controllers::frame::contain_policy("rayjob", error_policy),
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "rayjob reconcile loop");
            }
        })
        .await;
}

fn key(job: &RayJob) -> (String, String) {
    (job.namespace().unwrap_or_default(), job.name_any())
}

impl crate::controllers::frame::ReportPanic<RayJob> for Context {
    fn report_panic(
        &self,
        object: Arc<RayJob>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        crate::controllers::frame::panic_event(&self.recorder, object, message)
    }
}

fn error_policy(job: Arc<RayJob>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = {
        let mut map = ctx.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(key(&job)).or_default();
        *n = n.saturating_add(1);
        *n
    };
    // 3 s, 6 s, 12 s … up to 5 minutes, for this RayJob only.
    let backoff = (ctx.config.requeue * 2u32.saturating_pow(failures.saturating_sub(1).min(7)))
        .min(Duration::from_secs(300));
    warn!(
        namespace = %job.namespace().unwrap_or_default(),
        name = %job.name_any(),
        error = %error,
        retry_in = ?backoff,
        "RayJob reconcile failed"
    );
    Action::requeue(backoff)
}

async fn reconcile(job: Arc<RayJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "reconcile",
        kind = "RayJob",
        namespace = %job.namespace().unwrap_or_default(),
        name = %job.name_any()
    );
    async move {
        let api: Api<RayJob> =
            Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
        let Some(fresh) = api
            .get_opt(&job.name_any())
            .await
            .map_err(kube_err("reading the RayJob"))?
        else {
            ctx.failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key(&job));
            return Ok(Action::await_change());
        };
        let action = reconcile_job(&fresh, &ctx).await?;
        ctx.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key(&job));
        Ok(action)
    }
    .instrument(span)
    .await
}

impl Context {
    fn jobs(&self, job: &RayJob) -> Api<RayJob> {
        Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default())
    }
    fn clusters(&self, job: &RayJob) -> Api<RayCluster> {
        Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default())
    }
    fn submitters(&self, job: &RayJob) -> Api<Job> {
        Api::namespaced(self.client.clone(), &job.namespace().unwrap_or_default())
    }

    async fn event(
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

fn now() -> Time {
    crate::k8s::now()
}

/// The whole state machine for one RayJob read fresh from the API server.
async fn reconcile_job(job: &RayJob, ctx: &Context) -> Result<Action, Error> {
    if job
        .spec
        .managed_by
        .as_deref()
        .is_some_and(|m| m != MANAGED_BY_KUBERAY)
    {
        // Another controller (e.g. Kueue MultiKueue) owns this RayJob.
        return Ok(Action::await_change());
    }
    if job.meta().deletion_timestamp.is_some() {
        return finalize(job, ctx).await;
    }
    let before = job.status.clone().unwrap_or_default();
    let mut status = before.clone();
    // The CRD defaults these; keeping them set means an unchanged status compares equal.
    status.succeeded.get_or_insert(0);
    status.failed.get_or_insert(0);

    if let Err(invalid) =
        crate::validation::rayjob::controller::validate(job, ctx.config.deletion_policy)
    {
        warn!(reason = invalid.reason, message = %invalid.message, "RayJob refused");
        ctx.event(
            job,
            EventType::Warning,
            invalid.reason,
            "Validate",
            invalid.message.clone(),
        )
        .await;
        status.job_deployment_status = Some(JobDeploymentStatus::ValidationFailed);
        status.reason = Some(JobFailedReason::ValidationFailed);
        status.message = Some(invalid.message);
        write_status(job, ctx, &before, &status).await?;
        return Ok(Action::await_change());
    }

    let now = now();
    let started_in = status.job_deployment_status;
    let action = match started_in {
        None => start(job, ctx, &mut status, &now).await?,
        // A fixed spec brings a refused RayJob back (KubeRay leaves it stuck).
        Some(JobDeploymentStatus::ValidationFailed) => {
            status = RayJobStatus {
                succeeded: status.succeeded,
                failed: status.failed,
                ..Default::default()
            };
            Action::requeue(Duration::ZERO)
        }
        Some(JobDeploymentStatus::Initializing) => {
            initializing(job, ctx, &mut status, &now).await?
        }
        Some(JobDeploymentStatus::Waiting) => waiting(job, &mut status, &now, &ctx.config),
        Some(JobDeploymentStatus::Running) => running(job, ctx, &mut status, &now).await?,
        Some(s @ (JobDeploymentStatus::Suspending | JobDeploymentStatus::Retrying)) => {
            tear_down(job, ctx, &mut status, s).await?
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
        Some(JobDeploymentStatus::Complete | JobDeploymentStatus::Failed) => {
            return finished(job, ctx, &status, &now).await;
        }
    };
    if started_in.is_some_and(|s| !s.is_terminal()) {
        transitions::finish_pass(&job.spec, &before, &mut status, &now);
    }
    if status.job_deployment_status != before.job_deployment_status {
        info!(
            from = ?before.job_deployment_status,
            to = ?status.job_deployment_status,
            reason = ?status.reason,
            "RayJob deployment status changed"
        );
    }
    let changed = write_status(job, ctx, &before, &status).await?;
    // A transition is followed at once by the next step (KubeRay requeues immediately too).
    Ok(
        if changed && status.job_deployment_status != before.job_deployment_status {
            Action::requeue(Duration::from_millis(100))
        } else {
            action
        },
    )
}

/// Writes the status when it differs from what was read (server-side apply of the status).
/// Returns whether it wrote.
async fn write_status(
    job: &RayJob,
    ctx: &Context,
    before: &RayJobStatus,
    status: &RayJobStatus,
) -> Result<bool, Error> {
    if before == status {
        return Ok(false);
    }
    let patch = serde_json::json!({
        "apiVersion": RayJob::api_version(&()),
        "kind": RayJob::kind(&()),
        "status": status,
    });
    ctx.jobs(job)
        .patch_status(
            &job.name_any(),
            &PatchParams::apply(field_managers::RAYJOB).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(kube_err("writing the RayJob status"))?;
    Ok(true)
}

async fn set_finalizers(job: &RayJob, ctx: &Context, finalizers: Vec<String>) -> Result<(), Error> {
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

/// A deleted RayJob stops its Ray job (best effort) and lets go of its finalizer; the cluster
/// and submitter go with it through owner references.
async fn finalize(job: &RayJob, ctx: &Context) -> Result<Action, Error> {
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

/// New: finalizer, job id and cluster name, then Initializing.
async fn start(
    job: &RayJob,
    ctx: &Context,
    status: &mut RayJobStatus,
    now: &Time,
) -> Result<Action, Error> {
    if !job.finalizers().iter().any(|f| f == FINALIZER) {
        let mut finalizers = job.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        set_finalizers(job, ctx, finalizers).await?;
    }
    let mode = build::mode(job);
    if status.job_id.is_none() {
        status.job_id = match job.spec.job_id.clone().filter(|id| !id.is_empty()) {
            Some(id) => Some(id),
            None if mode == JobSubmissionMode::InteractiveMode => None,
            None => Some(build::generated_name(job, &crate::k8s::random_suffix())),
        };
    }
    if status.ray_cluster_name.is_none() {
        status.ray_cluster_name = Some(match build::selected_cluster(job) {
            Some(name) => name.to_owned(),
            None => build::generated_name(job, &crate::k8s::random_suffix()),
        });
    }
    status.job_status = None;
    status.job_deployment_status = Some(JobDeploymentStatus::Initializing);
    status.start_time = Some(now.clone());
    Ok(Action::requeue(ctx.config.requeue))
}

/// Deadline checks shared by Initializing, Waiting and Running; true when the job failed.
fn check_deadlines(job: &RayJob, status: &mut RayJobStatus, now: &Time, pre_running: bool) -> bool {
    if let Some(seconds) = job.spec.active_deadline_seconds
        && transitions::passed(status.start_time.as_ref(), seconds.into(), now)
    {
        let message = transitions::active_deadline_message(status, seconds);
        transitions::fail(status, JobFailedReason::DeadlineExceeded, message);
        return true;
    }
    if pre_running
        && let Some(seconds) = job.spec.pre_running_deadline_seconds
        && transitions::passed(status.start_time.as_ref(), seconds.into(), now)
    {
        transitions::fail(
            status,
            JobFailedReason::PreRunningDeadlineExceeded,
            format!(
                "The RayJob did not reach Running within preRunningDeadlineSeconds ({seconds})."
            ),
        );
        return true;
    }
    false
}

fn cluster_name(status: &RayJobStatus) -> Result<String, Error> {
    status
        .ray_cluster_name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Error::Invalid("status.rayClusterName is empty".into()))
}

/// The RayJob's cluster: the selected one (must exist) or the one it creates.
async fn ensure_cluster(
    job: &RayJob,
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
        if build::selected_cluster(job).is_none()
            && let Err(conflict) =
                crate::k8s::check_controlled_by(&cluster, &job.uid().unwrap_or_default())
        {
            return Err(report_conflict(job, ctx, conflict).await);
        }
        return Ok(cluster);
    }
    if build::selected_cluster(job).is_some() {
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
    let desired = build::ray_cluster(job, &name, status.job_id.as_deref().unwrap_or_default())?;
    match crate::k8s::create_owned(&api, &desired, field_managers::RAYJOB).await {
        Ok(crate::k8s::Created::AlreadyOurs(found)) => Ok(found),
        Err(e) if e.is_not_owned() => Err(report_conflict(job, ctx, e).await),
        Ok(crate::k8s::Created::New(created)) => {
            ctx.event(
                job,
                EventType::Normal,
                reasons::CREATED_RAY_CLUSTER,
                "CreateRayCluster",
                format!(
                    "Created RayCluster {}/{name}",
                    job.namespace().unwrap_or_default()
                ),
            )
            .await;
            Ok(created)
        }
        Err(e) => {
            ctx.event(
                job,
                EventType::Warning,
                reasons::FAILED_TO_CREATE_RAY_CLUSTER,
                "CreateRayCluster",
                format!("Failed to create RayCluster {name}: {e}"),
            )
            .await;
            Err(e.into())
        }
    }
}

/// A Warning event naming an object of a child's name that the RayJob does not control; the
/// object is left as it is and the error keeps the RayJob from going on with it.
async fn report_conflict(job: &RayJob, ctx: &Context, conflict: crate::k8s::K8sError) -> Error {
    ctx.event(
        job,
        EventType::Warning,
        conflict.conflict_reason().unwrap_or("ObjectConflict"),
        "CreateRayJobChild",
        conflict.to_string(),
    )
    .await;
    Error::K8s(conflict)
}

/// `host:port` of the cluster's dashboard from its head Service (port named `dashboard`).
async fn dashboard_url_of(
    job: &RayJob,
    ctx: &Context,
    cluster: &RayCluster,
) -> Result<String, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let service_name = names::head_service_name(&cluster.name_any(), &cluster.spec);
    let service = Api::<Service>::namespaced(ctx.client.clone(), &namespace)
        .get(&service_name)
        .await
        .map_err(kube_err(format!("reading head Service {service_name}")))?;
    let has_port = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .is_some_and(|ps| {
            ps.iter()
                .any(|p| p.name.as_deref() == Some(crate::ray::DASHBOARD_PORT_NAME))
        });
    if !has_port {
        return Err(Error::Invalid(format!(
            "head Service {service_name} has no port named dashboard"
        )));
    }
    let head = HeadService::from_service(&service)?;
    let _ = job;
    Ok(build::dashboard_url(
        &head.name,
        &head.namespace,
        &ctx.config.cluster_domain,
        head.dashboard_port,
    ))
}

/// A dashboard client for the URL in `status.dashboardURL`, located through the configured
/// locator (in cluster: the same DNS name; in tests: a Ray head on 127.0.0.1), with the
/// cluster's auth token when it uses token authentication.
async fn dashboard(
    job: &RayJob,
    ctx: &Context,
    status: &RayJobStatus,
    cluster: Option<&RayCluster>,
) -> Result<RayDashboardClient, Error> {
    let url = status.dashboard_url.clone().unwrap_or_default();
    let (host, port) = url
        .rsplit_once(':')
        .ok_or_else(|| Error::Invalid(format!("status.dashboardURL {url:?} has no port")))?;
    let port: u16 = port
        .parse()
        .map_err(|_| Error::Invalid(format!("status.dashboardURL {url:?} has no valid port")))?;
    let mut parts = host.split('.');
    let service = parts.next().unwrap_or_default();
    let namespace = parts
        .next()
        .map(str::to_owned)
        .unwrap_or_else(|| job.namespace().unwrap_or_default());
    let located = ctx
        .config
        .locator
        .locate(&HeadService::new(namespace, service, port))?;
    let mut options = DashboardClientOptions {
        connect_timeout: ctx.config.dashboard_connect_timeout,
        request_timeout: ctx.config.dashboard_request_timeout,
        bearer_token: None,
    };
    if let Some(cluster) = cluster
        && auth_enabled(&cluster.spec)
    {
        let secret_name = cluster
            .spec
            .auth_options
            .as_ref()
            .and_then(|a| a.secret_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| names::auth_secret_name(&cluster.name_any()));
        let secret =
            Api::<Secret>::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default())
                .get(&secret_name)
                .await
                .map_err(kube_err(format!("reading auth Secret {secret_name}")))?;
        let token = secret
            .data
            .as_ref()
            .and_then(|d| d.get("auth_token"))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| Error::Invalid(format!("Secret {secret_name} has no auth_token key")))?;
        options.bearer_token = Some(crate::ray::BearerToken::new(token)?);
    }
    Ok(RayDashboardClient::new(located, options)?)
}

async fn initializing(
    job: &RayJob,
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
    let cluster = ensure_cluster(job, ctx, status).await?;
    status.ray_cluster_status = cluster.status.clone();
    if status.dashboard_url.is_none() {
        let ready = cluster.status.as_ref().and_then(|s| s.state) == Some(ClusterState::Ready);
        if !ready {
            return Ok(Action::requeue(ctx.config.requeue));
        }
        status.dashboard_url = Some(dashboard_url_of(job, ctx, &cluster).await?);
    }
    match build::mode(job) {
        JobSubmissionMode::InteractiveMode => {
            status.job_deployment_status = Some(JobDeploymentStatus::Waiting);
        }
        JobSubmissionMode::K8sJobMode => {
            ensure_submitter(job, ctx, status, &cluster).await?;
            status.job_deployment_status = Some(JobDeploymentStatus::Running);
        }
        JobSubmissionMode::HttpMode | JobSubmissionMode::SidecarMode => {
            status.job_deployment_status = Some(JobDeploymentStatus::Running);
        }
    }
    Ok(Action::requeue(ctx.config.requeue))
}

async fn ensure_submitter(
    job: &RayJob,
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
    let desired = build::submitter_job(
        job,
        cluster,
        status.dashboard_url.as_deref().unwrap_or_default(),
        status.job_id.as_deref().unwrap_or_default(),
    )?;
    match crate::k8s::create_owned(&api, &desired, field_managers::RAYJOB).await {
        Ok(crate::k8s::Created::AlreadyOurs(_)) => Ok(()),
        Err(e) if e.is_not_owned() => Err(report_conflict(job, ctx, e).await),
        Ok(crate::k8s::Created::New(_)) => {
            ctx.event(
                job,
                EventType::Normal,
                reasons::CREATED_SUBMITTER,
                "CreateRayJobSubmitter",
                format!(
                    "Created Kubernetes Job {}/{}",
                    job.namespace().unwrap_or_default(),
                    job.name_any()
                ),
            )
            .await;
            Ok(())
        }
        Err(e) => {
            ctx.event(
                job,
                EventType::Warning,
                reasons::FAILED_TO_CREATE_SUBMITTER,
                "CreateRayJobSubmitter",
                format!("Failed to create the submitter Job: {e}"),
            )
            .await;
            Err(e.into())
        }
    }
}

fn waiting(job: &RayJob, status: &mut RayJobStatus, now: &Time, config: &Config) -> Action {
    if check_deadlines(job, status, now, true) {
        return Action::requeue(config.requeue);
    }
    if let Some(id) = job.spec.job_id.clone().filter(|id| !id.is_empty()) {
        status.job_id = Some(id);
        status.job_deployment_status = Some(JobDeploymentStatus::Running);
    }
    Action::requeue(config.requeue)
}

/// What the submitter (Job or head sidecar) says.
#[derive(Default)]
struct Submitter {
    finished_at: Option<Time>,
    /// Set when it failed: a message for the status.
    failed: Option<String>,
}

async fn submitter_state(
    job: &RayJob,
    ctx: &Context,
    cluster: &RayCluster,
) -> Result<Option<Submitter>, Error> {
    match build::mode(job) {
        JobSubmissionMode::K8sJobMode => {
            let Some(submitter) = ctx
                .submitters(job)
                .get_opt(&job.name_any())
                .await
                .map_err(kube_err("reading the submitter Job"))?
            else {
                return Ok(Some(Submitter::default()));
            };
            let conditions = submitter
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default();
            let mut state = Submitter::default();
            for c in conditions.iter().filter(|c| c.status == "True") {
                match c.type_.as_str() {
                    "Failed" => {
                        state.finished_at = c.last_transition_time.clone();
                        state.failed = Some(format!(
                            "Job submission has failed. Reason: {}. Message: {}",
                            c.reason.clone().unwrap_or_default(),
                            c.message.clone().unwrap_or_default()
                        ));
                    }
                    "Complete" => state.finished_at = c.last_transition_time.clone(),
                    _ => {}
                }
            }
            Ok(Some(state))
        }
        JobSubmissionMode::SidecarMode => {
            let selector = format!(
                "{}={},{}={}",
                labels::CLUSTER,
                cluster.name_any(),
                labels::NODE_TYPE,
                labels::HEAD
            );
            let pods =
                Api::<Pod>::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default())
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(kube_err("listing the head Pod"))?;
            let Some(head) = pods.items.into_iter().next() else {
                return Ok(None);
            };
            let mut state = Submitter::default();
            let terminated = head
                .status
                .and_then(|s| s.container_statuses)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.name == build::SUBMITTER_CONTAINER)
                .and_then(|c| c.state)
                .and_then(|s| s.terminated);
            if let Some(t) = terminated {
                state.finished_at = t.finished_at;
                if t.exit_code != 0 {
                    state.failed = Some(format!(
                        "Ray head pod container {} terminated with exit code {}",
                        build::SUBMITTER_CONTAINER,
                        t.exit_code
                    ));
                }
            }
            Ok(Some(state))
        }
        _ => Ok(Some(Submitter::default())),
    }
}

async fn running(
    job: &RayJob,
    ctx: &Context,
    status: &mut RayJobStatus,
    now: &Time,
) -> Result<Action, Error> {
    let requeue = Action::requeue(ctx.config.requeue);
    if job.spec.suspend == Some(true) {
        status.job_deployment_status = Some(JobDeploymentStatus::Suspending);
        return Ok(requeue);
    }
    if check_deadlines(job, status, now, false) {
        return Ok(requeue);
    }
    if status.job_status.is_some_and(JobStatus::is_terminal)
        && transitions::passed(
            status
                .ray_job_info
                .as_ref()
                .and_then(|i| i.end_time.as_ref()),
            ctx.config.transition_grace_period.as_secs() as i64,
            now,
        )
    {
        let failed = status.job_status == Some(JobStatus::Failed);
        status.job_deployment_status = Some(if failed {
            JobDeploymentStatus::Failed
        } else {
            JobDeploymentStatus::Complete
        });
        status.reason = Some(JobFailedReason::JobDeploymentStatusTransitionGracePeriodExceeded);
        status.message = Some("The RayJob stayed Running long after its Ray job ended.".into());
        return Ok(requeue);
    }
    if transitions::passed(
        status.job_status_check_failure_start_time.as_ref(),
        ctx.config.status_check_timeout.as_secs() as i64,
        now,
    ) {
        transitions::fail(
            status,
            JobFailedReason::JobStatusCheckTimeoutExceeded,
            "The Ray job status could not be read from the dashboard for too long.",
        );
        return Ok(requeue);
    }

    // The cluster comes back if it vanished (selected clusters must exist).
    let cluster = ensure_cluster(job, ctx, status).await?;
    status.ray_cluster_status = cluster.status.clone();

    let mode = build::mode(job);
    let Some(submitter) = submitter_state(job, ctx, &cluster).await? else {
        transitions::fail(
            status,
            JobFailedReason::AppFailed,
            "Ray head pod not found.",
        );
        return Ok(requeue);
    };
    if let Some(message) = submitter.failed {
        let reason = if status.job_status == Some(JobStatus::Failed) {
            JobFailedReason::AppFailed
        } else {
            JobFailedReason::SubmissionFailed
        };
        transitions::fail(status, reason, message);
        return Ok(requeue);
    }
    let submitter_done = matches!(
        mode,
        JobSubmissionMode::HttpMode | JobSubmissionMode::InteractiveMode
    ) || submitter.finished_at.is_some();
    if let Some(finished) = &submitter.finished_at
        && transitions::passed(
            Some(finished),
            ctx.config.submitter_finished_timeout.as_secs() as i64,
            now,
        )
        && !status.job_status.is_some_and(JobStatus::is_terminal)
    {
        status.job_status = Some(JobStatus::Failed);
        transitions::fail(
            status,
            JobFailedReason::JobDeploymentStatusTransitionGracePeriodExceeded,
            "The submitter finished over 30 seconds ago but the Ray job is not finished.",
        );
        return Ok(requeue);
    }

    let Some(job_id) = status.job_id.clone() else {
        return Ok(requeue);
    };
    let client = dashboard(job, ctx, status, Some(&cluster)).await?;
    match client.get_job(&job_id).await {
        Ok(details) => {
            status.job_status_check_failure_start_time = None;
            let ray_status = details.status.as_ref().and_then(|s| {
                serde_json::from_value::<JobStatus>(serde_json::to_value(s).ok()?).ok()
            });
            status.job_status = ray_status;
            status.message = details.message.clone();
            status.ray_job_info = Some(RayJobStatusInfo {
                start_time: details.start_time.and_then(transitions::from_millis),
                end_time: details.end_time.and_then(transitions::from_millis),
            });
            if let Some(s) = ray_status.filter(|s| s.is_terminal())
                && submitter_done
            {
                if s == JobStatus::Failed {
                    status.job_deployment_status = Some(JobDeploymentStatus::Failed);
                    status.reason = Some(JobFailedReason::AppFailed);
                } else {
                    status.job_deployment_status = Some(JobDeploymentStatus::Complete);
                }
            }
        }
        Err(e) if e.is_not_found() => match mode {
            JobSubmissionMode::HttpMode => {
                let request = build::submit_request(job, &job_id)?;
                match client.submit_job(&request).await {
                    Ok(id) => info!(job_id = %id, "submitted the Ray job"),
                    Err(DashboardError::JobAlreadyExists { .. }) => {}
                    Err(e) => {
                        warn!(error = %e, "submitting the Ray job failed");
                        status
                            .job_status_check_failure_start_time
                            .get_or_insert_with(|| now.clone());
                    }
                }
            }
            _ if submitter.finished_at.is_some() => {
                transitions::fail(
                    status,
                    JobFailedReason::AppFailed,
                    "Submitter completed but Ray job not found in RayCluster.",
                );
            }
            _ => {}
        },
        Err(e) => {
            warn!(error = %e, "reading the Ray job status failed");
            status
                .job_status_check_failure_start_time
                .get_or_insert_with(|| now.clone());
        }
    }
    Ok(requeue)
}

/// Suspending and Retrying: the cluster and submitter go, then the status is reset.
async fn tear_down(
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
                        return Err(kube_err("deleting the submitter Job")(e));
                    }
                }
            }
        }
    }
    if !gone {
        return Ok(Action::requeue(ctx.config.requeue));
    }
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

/// Whether the RayJob is the controller of the object `meta` describes.
fn controlled_by_job(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    job: &RayJob,
) -> bool {
    crate::k8s::is_controlled_by(meta, &job.uid().unwrap_or_default())
}

/// Deletes only the object that was read (a same-named one made since is not touched).
fn uid_precondition(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Preconditions {
    Preconditions {
        uid: meta.uid.clone(),
        resource_version: None,
    }
}

/// Deletes the job's own `cluster` (the caller checked that the job controls it).
async fn delete_cluster(job: &RayJob, ctx: &Context, cluster: &RayCluster) -> Result<(), Error> {
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
            Err(kube_err(format!("deleting RayCluster {name}"))(e))
        }
    }
}

/// Complete / Failed: run the cleanup that is due (§3.5), or wait for it.
async fn finished(
    job: &RayJob,
    ctx: &Context,
    status: &RayJobStatus,
    now: &Time,
) -> Result<Action, Error> {
    let rules = transitions::rules(
        &job.spec,
        status,
        ctx.config.deletion_policy,
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
                        Err(e) => return Err(kube_err("deleting the RayJob")(e)),
                    }
                    return Ok(Action::await_change());
                }
                DeletionPolicyType::DeleteNone => {}
            }
            Ok(Action::requeue(ctx.config.requeue))
        }
    }
}

/// DeleteWorkers: every worker group of the cluster is suspended.
async fn suspend_workers(
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
            Err(kube_err(format!(
                "suspending the workers of RayCluster {name}"
            ))(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_writes_do_not_look_relevant() {
        let mut job = build::tests::job(serde_json::json!({"metadata": {"generation": 1}}));
        let before = crate::k8s::spec_or_metadata_changed(&job);
        job.status = Some(RayJobStatus {
            job_deployment_status: Some(JobDeploymentStatus::Running),
            ..Default::default()
        });
        assert_eq!(crate::k8s::spec_or_metadata_changed(&job), before);
        job.spec.suspend = Some(true);
        job.metadata.generation = Some(2);
        assert_ne!(crate::k8s::spec_or_metadata_changed(&job), before);
    }

    #[test]
    fn config_defaults_follow_kuberay() {
        let config = Config::default();
        assert_eq!(config.requeue, Duration::from_secs(3));
        assert_eq!(config.status_check_timeout, Duration::from_secs(300));
        assert_eq!(config.transition_grace_period, Duration::from_secs(300));
        assert!(config.deletion_policy && !config.delete_rayjob_after_finish);
        assert!(config.dashboard_request_timeout <= Duration::from_secs(5));
    }
}
