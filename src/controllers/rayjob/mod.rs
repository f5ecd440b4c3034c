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
mod config;
mod context;
mod deletion;
mod error;
pub mod reasons;
mod reconcile;
mod status;
mod submit;
pub mod transitions;

pub use config::Config;
pub use deletion::FINALIZER;
pub use error::Error;

use context::Context;

use std::sync::Arc;

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
    use std::time::Duration;

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
