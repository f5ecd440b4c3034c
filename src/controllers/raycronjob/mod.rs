//! The RayCronJob controller (KubeRay §5, plus batch/v1 CronJob's concurrency policy and history
//! limits as opt-in extensions): get → validate → observe its RayJobs → decide (pure, in
//! [`build::plan`]) → create / delete RayJobs (`apply`) → status (`status`); the stages are read
//! in order in `reconcile` (with the validation). This file holds `run`; the settings and the
//! clock are in `config`, the error in `error`, what a reconcile shares in `context`.
//!
//! Decisions taken where KubeRay is quirky:
//! - Missed ticks: KubeRay creates every missed tick, one per pass, so an operator that was down
//!   for an hour starts sixty RayJobs (each with its own RayCluster) in a burst. Here only the
//!   most recent missed tick runs, as batch/v1 CronJob does.
//! - `CRON_TZ=`/`TZ=` in `schedule` are refused (KubeRay and batch/v1 CronJob both do); the
//!   zone comes from `timeZone`, else the operator's local zone.
//! - The clock is injected ([`Clock`]), so tests run a minute-schedule in about a second.

mod apply;
pub mod build;
mod config;
mod context;
mod error;
pub mod reasons;
mod reconcile;
pub mod schedule;
mod status;

pub use build::{CRONJOB_NAME_LABEL, SCHEDULED_TIMESTAMP_ANNOTATION};
pub use config::{Clock, Config, FastClock, SystemClock};
pub use error::Error;
pub use reconcile::validate;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use kube::Resource;

use crate::api::raycronjob::RayCronJob;
use crate::api::rayjob::RayJob;
use crate::controllers::frame::policy::Backoff;
use crate::controllers::frame::run::Frame;
use crate::controllers::frame::watch::{Child, Watches};

use context::Context;

/// KubeRay's limit on RayCronJob names (the RayJob name adds a suffix).
pub const MAX_NAME_LENGTH: usize = crate::validation::raycronjob::MAX_RAYCRONJOB_NAME;

fn reconcile_relevant(cron: &RayCronJob) -> Option<u64> {
    let meta = cron.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    Some(hasher.finish())
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    clients: impl Into<crate::k8s::Clients>,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let clients: crate::k8s::Clients = clients.into();
    // Failures back off from KubeRay's 5 s retry.
    let frame = Frame::new("raycronjob", &config.metrics)
        .with_backoff(Backoff::starting_at(Duration::from_secs(5)));
    let mut watches = Watches::new(&frame, &clients.api, &config.namespace, &config.readiness);
    watches
        .relevant_when(reconcile_relevant)
        .concurrency(config.concurrency)
        // RayJobs finishing free a Forbid slot and feed the history: watch the ones we created.
        .owns(Child::<RayJob>::labelled(CRONJOB_NAME_LABEL));
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(clients.events, "raycronjob-controller"),
        client: clients.api,
        config,
        frame,
    });
    watches.run(ctx, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::build::tests::{cron, ts};
    use super::*;
    use serde_json::json;

    #[test]
    fn validation_follows_kuberay() {
        assert!(validate(&cron(json!({})), &Default::default()).is_ok());
        for (patch, needle) in [
            (
                json!({"spec": {"schedule": "CRON_TZ=UTC * * * * *"}}),
                "timeZone",
            ),
            (json!({"spec": {"schedule": "61 * * * *"}}), "cron"),
            (json!({"spec": {"timeZone": "Mars/Base"}}), "time zone"),
            (
                json!({"metadata": {"name": "a-very-long-raycronjob-name-over-36-chars", "namespace": "ns"}}),
                "longer",
            ),
            (
                json!({"spec": {"jobTemplate": {"entrypoint": "x"}}}),
                "rayClusterSpec",
            ),
        ] {
            let message =
                validate(&cron(patch.clone()), &Default::default()).expect_err(&patch.to_string());
            assert!(message.contains(needle), "{patch}: {message}");
        }
        let (_, zone) = validate(
            &cron(json!({"spec": {"timeZone": "Asia/Tokyo"}})),
            &Default::default(),
        )
        .expect("valid");
        assert_eq!(zone.iana_name(), Some("Asia/Tokyo"));
    }

    #[test]
    fn fast_clock_runs_faster() {
        let clock = FastClock::new(ts("2026-01-01T00:00:00Z"), 60);
        let wait = clock.sleep_until(ts("2026-01-01T00:01:00Z"));
        assert!(
            wait <= Duration::from_secs(1) && wait > Duration::from_millis(900),
            "{wait:?}"
        );
    }
}
