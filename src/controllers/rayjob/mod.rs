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

use crate::api::RayCluster;
use crate::controllers::frame::policy::Backoff;
use crate::controllers::frame::run::Frame;
use crate::controllers::frame::watch::{Child, Watches};
use crate::kuberay::keys::labels;

/// Runs the controller until `shutdown` completes.
pub async fn run(
    clients: impl Into<crate::k8s::Clients>,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let clients: crate::k8s::Clients = clients.into();
    let frame =
        Frame::new("rayjob", &config.metrics).with_backoff(Backoff::starting_at(config.requeue));
    let mut watches = Watches::new(&frame, &clients.api, &config.namespace, &config.readiness);
    // Label-scoped: only what RayJobs created is watched. A deleted or edited head Service is
    // put back.
    let origin = format!(
        "{}={}",
        labels::ORIGINATED_FROM_CRD,
        build::ORIGINATED_FROM_RAYJOB
    );
    watches
        .concurrency(config.concurrency)
        .owns(Child::<RayCluster>::labelled(&origin))
        .owns(Child::<Job>::labelled(&origin))
        .owns(Child::<Service>::labelled(&origin));
    let _kuberay = config.metrics.observe_rayjobs(watches.store());
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(clients.events, "rayjob-controller"),
        client: clients.api,
        config,
        frame,
    });
    watches.run(ctx, shutdown).await;
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
