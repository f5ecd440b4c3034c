//! The canary routers' counters, read outside the reconcile workers.
//!
//! A pipeline mid-rollout gets a reader of its own: a task that reads
//! `GET <route>/-/raypipe/rollout?generation=…` through the pipeline's Serve proxy every
//! [`READ_INTERVAL`] and keeps the latest answer. A reconcile takes that latest reading and never
//! waits on the network, so a Serve proxy that accepts connections and never answers costs its
//! own reader's time, not a reconcile worker (before, each canary reconcile could hold one for
//! the client's whole timeout). The counters are cumulative per generation, so a reading a
//! moment old only lags, it never misleads; a reading of another generation is not handed out.
//! A reader nobody asked for in [`IDLE_AFTER`] ends by itself (the rollout ended, the pipeline
//! went), and one per pipeline bounds them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;
use serde_json::Value;

use crate::api::servepipeline::ServePipeline;
use crate::serve::rollout::RouterStats;

/// How often a reader asks the routers.
pub const READ_INTERVAL: Duration = Duration::from_secs(2);
/// A reader ends when no reconcile asked for its readings this long.
pub const IDLE_AFTER: Duration = Duration::from_secs(120);

/// Where a pipeline's counters are read: the Serve proxy's base URL, the path under it, and the
/// rollout generation the reading must belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub base_url: String,
    pub path: Vec<String>,
    pub generation: String,
}

struct Reader {
    target: Target,
    latest: Arc<Mutex<Option<RouterStats>>>,
    asked: Arc<Mutex<Instant>>,
    task: tokio::task::AbortHandle,
}

/// One reader per pipeline mid-rollout.
#[derive(Default)]
pub struct StatsReaders {
    readers: Mutex<HashMap<ObjectRef<ServePipeline>, Reader>>,
}

impl StatsReaders {
    /// The latest reading of `target`'s generation for `key`, without waiting: starts a reader
    /// (or moves it to a new target) and answers what it read so far, if anything.
    pub fn latest(&self, key: &ObjectRef<ServePipeline>, target: Target) -> Option<RouterStats> {
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(reader) = readers.get(key)
            && reader.target == target
            && !reader.task.is_finished()
        {
            *reader.asked.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
            return reader
                .latest
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .filter(|s| s.generation.as_deref() == Some(target.generation.as_str()));
        }
        if let Some(old) = readers.remove(key) {
            old.task.abort();
        }
        let latest = Arc::new(Mutex::new(None));
        let asked = Arc::new(Mutex::new(Instant::now()));
        let task = tokio::spawn(read_until_idle(
            target.clone(),
            latest.clone(),
            asked.clone(),
        ))
        .abort_handle();
        readers.insert(
            key.clone(),
            Reader {
                target,
                latest,
                asked,
                task,
            },
        );
        None
    }

    /// Ends `key`'s reader (its rollout ended, or the pipeline is going).
    pub fn stop(&self, key: &ObjectRef<ServePipeline>) {
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(reader) = readers.remove(key) {
            reader.task.abort();
        }
        // Readers that ended by themselves leave their entries: sweep them here.
        readers.retain(|_, r| !r.task.is_finished());
    }

    #[cfg(test)]
    fn running(&self) -> usize {
        self.readers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|r| !r.task.is_finished())
            .count()
    }
}

impl Drop for StatsReaders {
    fn drop(&mut self) {
        for reader in self
            .readers
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            reader.task.abort();
        }
    }
}

/// Reads `target` every [`READ_INTERVAL`] (each read bounded by the dashboard client's own
/// timeout) until nobody asked for [`IDLE_AFTER`].
async fn read_until_idle(
    target: Target,
    latest: Arc<Mutex<Option<RouterStats>>>,
    asked: Arc<Mutex<Instant>>,
) {
    let Ok(client) = crate::ray::RayDashboardClient::from_url(&target.base_url) else {
        return;
    };
    let path: Vec<&str> = target.path.iter().map(String::as_str).collect();
    loop {
        if asked.lock().unwrap_or_else(|p| p.into_inner()).elapsed() > IDLE_AFTER {
            return;
        }
        match client
            .get_json::<Value>(&path, Some(("generation", target.generation.as_str())))
            .await
        {
            Ok(value) => {
                if let Ok(stats) = serde_json::from_value::<RouterStats>(value) {
                    *latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats);
                }
            }
            Err(e) => tracing::debug!(error = %e, "reading the rollout routers' counters failed"),
        }
        tokio::time::sleep(READ_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use kube::runtime::reflector::ObjectRef;

    use super::{StatsReaders, Target};
    use crate::api::servepipeline::ServePipeline;

    fn key(name: &str) -> ObjectRef<ServePipeline> {
        ObjectRef::new(name).within("ns")
    }

    /// A Serve proxy that accepts connections and never answers: asking for a reading still
    /// answers at once, and the reader keeps trying in the background.
    #[tokio::test]
    async fn asking_never_waits_on_a_proxy_that_does_not_answer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let readers = StatsReaders::default();
        let target = Target {
            base_url: format!("http://{address}"),
            path: vec![
                "demo".into(),
                "-".into(),
                "raypipe".into(),
                "rollout".into(),
            ],
            generation: "g1".into(),
        };
        for _ in 0..3 {
            let started = Instant::now();
            assert!(readers.latest(&key("a"), target.clone()).is_none());
            assert!(started.elapsed() < Duration::from_millis(50));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(readers.running(), 1, "one reader per pipeline");
        readers.stop(&key("a"));
        assert_eq!(readers.running(), 0);
        held.abort();
    }

    /// A reader serves readings of its own generation only, and moves with the target.
    #[tokio::test]
    async fn readings_are_handed_out_for_their_generation_only() {
        use axum::routing::get;
        let app = axum::Router::new().route(
            "/demo/-/raypipe/rollout",
            get(|q: axum::extract::RawQuery| async move {
                let generation = q
                    .0
                    .unwrap_or_default()
                    .trim_start_matches("generation=")
                    .to_owned();
                let body = serde_json::json!({
                    "generation": generation,
                    "routers": {"r1": {"generation": generation, "age_s": 0.5}},
                    "bounds_ms": [10.0],
                    "canary": {"requests": 3, "errors": 0, "retried": 0, "sum_ms": 9.0, "buckets": [3, 0]},
                    "stable": {"requests": 7, "errors": 0, "retried": 0, "sum_ms": 21.0, "buckets": [7, 0]}
                });
                ([("content-type", "application/json")], body.to_string())
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let readers = StatsReaders::default();
        let target = |generation: &str| Target {
            base_url: format!("http://{address}"),
            path: vec![
                "demo".into(),
                "-".into(),
                "raypipe".into(),
                "rollout".into(),
            ],
            generation: generation.into(),
        };
        let mut reading = None;
        for _ in 0..50 {
            reading = readers.latest(&key("a"), target("g1"));
            if reading.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let reading = reading.expect("a reading within a few seconds");
        assert_eq!(reading.generation.as_deref(), Some("g1"));
        assert_eq!((reading.canary.requests, reading.stable.requests), (3, 7));
        assert!(
            readers.latest(&key("a"), target("g2")).is_none(),
            "a new generation starts from nothing"
        );
        server.abort();
    }
}
