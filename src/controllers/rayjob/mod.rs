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

mod apply;
pub mod build;
mod deletion;
mod reconcile;
mod status;
mod submit;
pub mod transitions;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};

use crate::api::RayCluster;
use crate::api::rayjob::RayJob;
use crate::controllers::frame::policy::Backoff;
use crate::controllers::frame::run::Frame;
use crate::kuberay::keys::labels;
use crate::ray::{DashboardError, DashboardLocator};

/// The finalizer that lets a deleted RayJob stop its Ray job first.
pub const FINALIZER: &str = "ray.io/rayjob-finalizer";

/// KubeRay's Event reasons for RayJobs.
pub mod reasons {
    pub use crate::validation::rayjob::reasons::{INVALID_METADATA, INVALID_SPEC, INVALID_STATUS};
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
    pub use crate::kuberay::keys::reasons::{CREATED_SERVICE, FAILED_TO_CREATE_SERVICE};
    pub const UPDATED_SERVICE: &str = "UpdatedService";
    pub const FAILED_TO_UPDATE_SERVICE: &str = "FailedToUpdateService";
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

impl crate::controllers::frame::policy::ReconcileError for Error {
    /// The `category` label of the reconcile error metric. Every error is retried with backoff.
    fn category(&self) -> &'static str {
        match self {
            Error::Kube { .. } | Error::K8s(_) => "apply",
            Error::Invalid(_) => "build",
            Error::ClusterNotFound(_) => "cluster",
            Error::Dashboard(_) => "dashboard",
            Error::Panicked(_) => "panic",
        }
    }
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
    /// KubeRay's feature gates (RayJobDeletionPolicy is read here).
    pub feature_gates: crate::validation::feature_gates::FeatureGates,
    /// How the RayJob's head Service is built (as the RayCluster controller builds the
    /// cluster's: KubeRay's `ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE`).
    pub build: crate::controllers::raycluster::builders::BuildOptions,
    /// `DELETE_RAYJOB_CR_AFTER_JOB_FINISHES`: shutdown deletes the RayJob instead of the cluster.
    pub delete_rayjob_after_finish: bool,
    /// `RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS`.
    pub status_check_timeout: Duration,
    /// `RAYJOB_DEPLOYMENT_STATUS_TRANSITION_GRACE_PERIOD_SECONDS`.
    pub transition_grace_period: Duration,
    /// How long after the submitter finished the Ray job may stay non-terminal.
    pub submitter_finished_timeout: Duration,
    /// Where reconciles are recorded.
    pub metrics: crate::admin::Metrics,
    /// Where the cache sync is reported (`/readyz`).
    pub readiness: crate::admin::Readiness,
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
            feature_gates: Default::default(),
            build: Default::default(),
            delete_rayjob_after_finish: false,
            status_check_timeout: Duration::from_secs(300),
            transition_grace_period: Duration::from_secs(300),
            submitter_finished_timeout: Duration::from_secs(30),
            metrics: crate::admin::Metrics::new(),
            readiness: crate::admin::Readiness::new(),
        }
    }
}

pub struct Context {
    client: kube::Client,
    config: Config,
    recorder: crate::k8s::EventRecorder,
    /// Span, metrics and the per-object backoff (3 s, 6 s, 12 s … up to 5 minutes by default).
    frame: Frame<RayJob>,
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    clients: impl Into<crate::k8s::Clients>,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let crate::k8s::Clients {
        api: client,
        events,
    } = clients.into();
    let namespace = config.namespace.clone();
    let jobs: Api<RayJob> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let clusters: Api<RayCluster> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let submitters: Api<Job> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let services: Api<Service> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let concurrency = config.concurrency.max(1);
    let frame =
        Frame::new("rayjob", &config.metrics).with_backoff(Backoff::starting_at(config.requeue));
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(events.clone(), "rayjob-controller"),
        client,
        config,
        frame,
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
    // A deleted or edited head Service is put back.
    let service_events = watcher(services, watcher::Config::default().labels(&origin))
        .backoff(crate::k8s::watch_backoff())
        .touched_objects();
    let (store, writer) = reflector::store();
    let job_events = watcher(jobs, watcher::Config::default())
        .backoff(crate::k8s::watch_backoff())
        .modify(|job: &mut RayJob| job.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(crate::k8s::spec_or_metadata_changed, Default::default());

    ctx.frame.track_ready(&ctx.config.readiness, store.clone());
    let _kuberay = ctx.config.metrics.observe_rayjobs(store.clone());
    let controller = Controller::for_stream(job_events, store)
        .trigger_backoff(crate::k8s::watch_backoff())
        .owns_stream(cluster_events)
        .owns_stream(submitter_events)
        .owns_stream(service_events)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown);
    crate::controllers::frame::run::drive(controller, reconcile::reconcile, ctx).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::rayjob::{JobDeploymentStatus, RayJobStatus};

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
        assert!(
            config
                .feature_gates
                .enabled(crate::validation::feature_gates::gates::RAY_JOB_DELETION_POLICY)
                && !config.delete_rayjob_after_finish
        );
        assert!(config.dashboard_request_timeout <= Duration::from_secs(5));
    }
}
