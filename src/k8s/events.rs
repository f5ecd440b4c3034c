//! Events, on a budget of their own.
//!
//! Every controller publishes Events through an [`EventRecorder`], built on a client of its
//! own ([`Clients::events`]): like client-go's event broadcaster (which KubeRay's
//! controller-runtime manager gives its own clientset), Events never spend the request budget
//! (`--qps`/`--burst`) that the operator's reads and writes of real objects need, so a burst of
//! cluster creations is paced by the API server, not by its own notes. Each involved object may
//! publish 25 Events at once and then one per 5 minutes (client-go's `EventSourceObjectSpamFilter`
//! defaults), so one object in a tight failure loop cannot flood the API server or the
//! operator's Event budget; kube's `Recorder` still folds repeats of one Event into a series.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder, Reporter};

/// Events one object may publish at once.
pub const SPAM_BURST: f64 = 25.0;
/// How often one more becomes available afterwards.
pub const SPAM_REFILL: Duration = Duration::from_secs(300);
/// Objects whose budget is remembered; past this, the least recently seen are forgotten (the
/// cost of forgetting is only a fresh burst for that object, as in client-go's LRU of 4096).
const MAX_TRACKED_OBJECTS: usize = 4096;

/// The operator's two clients: `api` for what it reads and writes (rate-limited by
/// `--qps`/`--burst`), `events` for Events (a limiter of its own). One client serves both
/// where no separate budget is wanted (tests, `raypipe dev`).
#[derive(Clone)]
pub struct Clients {
    pub api: kube::Client,
    pub events: kube::Client,
}

impl From<kube::Client> for Clients {
    fn from(client: kube::Client) -> Clients {
        Clients {
            api: client.clone(),
            events: client,
        }
    }
}

/// A token bucket per involved object.
#[derive(Debug)]
struct SpamFilter {
    buckets: HashMap<String, (f64, Instant)>,
}

impl SpamFilter {
    fn new() -> SpamFilter {
        SpamFilter {
            buckets: HashMap::new(),
        }
    }

    /// Whether `key` may publish one more Event at `now` (and if so, it is spent).
    fn allow(&mut self, key: &str, now: Instant) -> bool {
        if !self.buckets.contains_key(key) && self.buckets.len() >= MAX_TRACKED_OBJECTS {
            let oldest = self
                .buckets
                .iter()
                .min_by_key(|(_, (_, seen))| *seen)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.buckets.remove(&oldest);
            }
        }
        let (tokens, last) = self
            .buckets
            .entry(key.to_owned())
            .or_insert((SPAM_BURST, now));
        let refilled =
            now.saturating_duration_since(*last).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        *tokens = (*tokens + refilled).min(SPAM_BURST);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// kube's [`Recorder`] behind a per-object spam filter.
#[derive(Clone)]
pub struct EventRecorder {
    recorder: Recorder,
    filter: Arc<Mutex<SpamFilter>>,
}

impl EventRecorder {
    /// A recorder for `controller`, publishing with `client` (the events client).
    pub fn new(client: kube::Client, controller: &str) -> EventRecorder {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        };
        EventRecorder {
            recorder: Recorder::new(client, reporter),
            filter: Arc::new(Mutex::new(SpamFilter::new())),
        }
    }

    /// Publishes `event` about `object` unless the object spent its budget (then the Event is
    /// dropped, as client-go drops it, and logged at debug level).
    pub async fn publish(
        &self,
        event: &Event,
        object: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = object.uid.clone().unwrap_or_else(|| {
            format!(
                "{}/{}/{}",
                object.kind.as_deref().unwrap_or_default(),
                object.namespace.as_deref().unwrap_or_default(),
                object.name.as_deref().unwrap_or_default()
            )
        });
        let allowed = self
            .filter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allow(&key, Instant::now());
        if !allowed {
            tracing::debug!(
                reason = %event.reason,
                object = object.name.as_deref().unwrap_or_default(),
                "event dropped: this object published too many (25, then one per 5 minutes)"
            );
            return Ok(());
        }
        self.recorder.publish(event, object).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_gets_a_burst_then_one_event_per_refill_period() {
        let mut filter = SpamFilter::new();
        let start = Instant::now();
        let allowed = (0..40).filter(|_| filter.allow("a", start)).count();
        assert_eq!(allowed, 25);
        assert!(!filter.allow("a", start + SPAM_REFILL / 2));
        assert!(filter.allow("a", start + SPAM_REFILL));
        assert!(!filter.allow("a", start + SPAM_REFILL));
        // Another object has a budget of its own.
        assert!(filter.allow("b", start));
    }

    #[test]
    fn a_quiet_object_refills_up_to_the_burst_only() {
        let mut filter = SpamFilter::new();
        let start = Instant::now();
        assert!(filter.allow("a", start));
        let later = start + SPAM_REFILL * 1000;
        let allowed = (0..40).filter(|_| filter.allow("a", later)).count();
        assert_eq!(allowed, 25);
    }

    #[test]
    fn the_filter_remembers_a_bounded_number_of_objects() {
        let mut filter = SpamFilter::new();
        let start = Instant::now();
        for i in 0..(MAX_TRACKED_OBJECTS + 100) {
            assert!(filter.allow(&format!("o{i}"), start + Duration::from_millis(i as u64)));
        }
        assert_eq!(filter.buckets.len(), MAX_TRACKED_OBJECTS);
        // The oldest were forgotten; the newest kept their spent token.
        assert!(!filter.buckets.contains_key("o0"));
        assert!(
            filter
                .buckets
                .contains_key(&format!("o{}", MAX_TRACKED_OBJECTS + 99))
        );
    }
}
