//! The RayCronJob controller (KubeRay §5, plus batch/v1 CronJob's concurrency policy and history
//! limits as opt-in extensions): get → validate → observe its RayJobs → decide (pure, in
//! [`build::plan`]) → create / delete RayJobs (`apply`) → status (`status`); the stages are read
//! in order in `reconcile`. This file holds the settings, the error, the validation and `run`.
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
mod reconcile;
pub mod schedule;
mod status;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::validation::cron::Schedule;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use crate::api::raycronjob::RayCronJob;
use crate::api::rayjob::RayJob;
use crate::controllers::frame::policy::{Backoff, ReconcileError};
use crate::controllers::frame::run::{self, Frame};

/// Label naming the RayCronJob a RayJob was created by.
pub const CRONJOB_NAME_LABEL: &str = "ray.io/cronjob-name";
/// Annotation with the tick a RayJob was created for (RFC 3339, UTC).
pub const SCHEDULED_TIMESTAMP_ANNOTATION: &str = "ray.io/cronjob-scheduled-timestamp";
/// KubeRay's limit on RayCronJob names (the RayJob name adds a suffix).
pub const MAX_NAME_LENGTH: usize = crate::validation::raycronjob::MAX_RAYCRONJOB_NAME;

pub mod reasons {
    pub const INVALID_SPEC: &str = "InvalidRayCronJobSpec";
    pub const SUSPENDED: &str = "SuspendedRayCronJob";
    /// raypipe's own (batch/v1 CronJob's reasons).
    pub const CREATED_RAY_JOB: &str = "SuccessfulCreate";
    pub const DELETED_RAY_JOB: &str = "SuccessfulDelete";
    pub const JOB_ALREADY_ACTIVE: &str = "JobAlreadyActive";
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
    /// A bug: the reconcile panicked; contained to this object (see `controllers::frame`).
    #[error(transparent)]
    Panicked(#[from] crate::controllers::frame::Panicked),
}

impl ReconcileError for Error {
    fn category(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::K8s(_) => "apply",
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

/// Where "now" comes from, and how long a wait for a future instant really takes.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Timestamp;
    /// Real time to sleep until `at`.
    fn sleep_until(&self, at: Timestamp) -> Duration {
        Duration::try_from(at.duration_since(self.now())).unwrap_or_default()
    }
}

/// The wall clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that starts at `origin` and runs `speed` times faster than real time (tests: at 60×
/// a minute schedule ticks every second).
#[derive(Debug)]
pub struct FastClock {
    origin: Timestamp,
    started: std::time::Instant,
    speed: u32,
}

impl FastClock {
    pub fn new(origin: Timestamp, speed: u32) -> FastClock {
        FastClock {
            origin,
            started: std::time::Instant::now(),
            speed: speed.max(1),
        }
    }
}

impl Clock for FastClock {
    fn now(&self) -> Timestamp {
        let elapsed = self.started.elapsed() * self.speed;
        self.origin
            .checked_add(SignedDuration::try_from(elapsed).unwrap_or(SignedDuration::MAX))
            .unwrap_or(self.origin)
    }
    fn sleep_until(&self, at: Timestamp) -> Duration {
        Duration::try_from(at.duration_since(self.now())).unwrap_or_default() / self.speed
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub namespace: Option<String>,
    pub concurrency: u16,
    pub clock: Arc<dyn Clock>,
    /// The zone of schedules without `timeZone` (KubeRay: the operator's local zone).
    pub default_time_zone: TimeZone,
    /// Where reconciles are recorded.
    pub metrics: crate::admin::Metrics,
    /// Where the cache sync is reported (`/readyz`).
    pub readiness: crate::admin::Readiness,
    /// The gates the job template is checked under (the controller runs only with RayCronJob).
    pub feature_gates: crate::validation::feature_gates::FeatureGates,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: None,
            concurrency: 4,
            clock: Arc::new(SystemClock),
            default_time_zone: TimeZone::system(),
            metrics: crate::admin::Metrics::new(),
            readiness: crate::admin::Readiness::new(),
            feature_gates: Default::default(),
        }
    }
}

struct Context {
    client: kube::Client,
    config: Config,
    recorder: crate::k8s::EventRecorder,
    frame: Frame<RayCronJob>,
}

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
    let crate::k8s::Clients {
        api: client,
        events,
    } = clients.into();
    let (crons, jobs): (Api<RayCronJob>, Api<RayJob>) = match config.namespace.as_deref() {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let concurrency = config.concurrency.max(1);
    // Failures back off from KubeRay's 5 s retry.
    let frame = Frame::new("raycronjob", &config.metrics)
        .with_backoff(Backoff::starting_at(Duration::from_secs(5)));
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(events.clone(), "raycronjob-controller"),
        client,
        config,
        frame,
    });
    let (store, writer) = reflector::store();
    let cron_events = watcher(crons, watcher::Config::default())
        .backoff(crate::k8s::watch_backoff())
        .modify(|c: &mut RayCronJob| c.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(reconcile_relevant, Default::default());
    // RayJobs finishing free a Forbid slot and feed the history: watch the ones we created.
    let job_events = watcher(jobs, watcher::Config::default().labels(CRONJOB_NAME_LABEL))
        .backoff(crate::k8s::watch_backoff())
        .touched_objects();
    ctx.frame.track_ready(&ctx.config.readiness, store.clone());
    let controller = Controller::for_stream(cron_events, store)
        .trigger_backoff(crate::k8s::watch_backoff())
        .owns_stream(job_events)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown);
    crate::controllers::frame::run::drive(controller, reconcile::reconcile, ctx).await;
}

impl run::Framed<RayCronJob> for Context {
    fn frame(&self) -> &Frame<RayCronJob> {
        &self.frame
    }
}

impl crate::controllers::frame::ReportPanic<RayCronJob> for Context {
    fn report_panic(
        &self,
        object: Arc<RayCronJob>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        crate::controllers::frame::panic_event(&self.recorder, object, message)
    }
}

/// The problem KubeRay would report (§6.2), if any.
pub fn validate(
    cron: &RayCronJob,
    feature_gates: &crate::validation::feature_gates::FeatureGates,
) -> Result<(Schedule, TimeZone), String> {
    crate::validation::validated::for_controller(cron, feature_gates)
        .map(|valid| {
            let values = valid.into_values();
            (values.schedule, values.zone)
        })
        .map_err(|p| p.message)
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
