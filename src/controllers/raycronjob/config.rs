//! The RayCronJob controller's settings, and the clock it reads "now" from.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

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
