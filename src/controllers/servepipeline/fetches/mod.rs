//! Graph fetches run outside the reconcile workers. A reconcile that needs a fetch starts one
//! here and returns at once; the fetch waits for its turn, runs, and wakes the pipeline's
//! reconcile with the outcome. So a registry that sends headers and then nothing holds one
//! fetch slot of its own host and namespace, never a reconcile worker, and a healthy pipeline
//! elsewhere is fetched at once.
//!
//! Fairness: a fetch needs a slot of its namespace, of its registry host (`host:port`), and of
//! the operator as a whole, taken in that order (always the same order, so no two fetches wait
//! on each other). Each pool is FIFO. Idle fetches cost a socket and a few KiB each; what they
//! download is bounded by the source's memory budget, not by these slots.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::api::servepipeline::ServePipeline;

/// Fetches in flight at once, operator-wide.
pub const MAX_FETCHES: usize = 128;
/// Fetches in flight at once against one registry host.
pub const MAX_FETCHES_PER_HOST: usize = 4;
/// Fetches in flight at once for the pipelines of one namespace.
pub const MAX_FETCHES_PER_NAMESPACE: usize = 8;

/// What a reconcile learns from [`FetchQueue::poll`].
pub enum Poll<T> {
    /// A fetch for these inputs was started (or is still running): wait for the wake-up.
    Pending,
    /// The fetch for these inputs finished; its outcome, handed over once.
    Done(T),
}

enum Slot<T> {
    Running {
        inputs: String,
        id: u64,
        task: tokio::task::AbortHandle,
    },
    Done {
        inputs: String,
        outcome: T,
    },
}

/// Per-key fetches with fair, bounded concurrency; `T` is a fetch's outcome.
pub struct FetchQueue<T> {
    slots: Arc<Mutex<HashMap<ObjectRef<ServePipeline>, Slot<T>>>>,
    pools: Arc<Pools>,
    wake: mpsc::UnboundedSender<ObjectRef<ServePipeline>>,
    next_id: std::sync::atomic::AtomicU64,
}

struct Pools {
    all: Arc<Semaphore>,
    per_host: Mutex<HashMap<String, Arc<Semaphore>>>,
    per_namespace: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Pools {
    fn pool(
        map: &Mutex<HashMap<String, Arc<Semaphore>>>,
        key: &str,
        size: usize,
    ) -> Arc<Semaphore> {
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        // Drop pools nobody holds or waits on, so the map tracks live hosts only.
        if map.len() > 1024 {
            map.retain(|_, s| Arc::strong_count(s) > 1 || s.available_permits() < size);
        }
        map.entry(key.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(size)))
            .clone()
    }

    async fn acquire(&self, namespace: &str, host: &str) -> [OwnedSemaphorePermit; 3] {
        let namespace_pool = Self::pool(&self.per_namespace, namespace, MAX_FETCHES_PER_NAMESPACE);
        let host_pool = Self::pool(&self.per_host, host, MAX_FETCHES_PER_HOST);
        // The semaphores are never closed, so acquiring cannot fail.
        let namespace = namespace_pool.acquire_owned().await;
        let host = host_pool.acquire_owned().await;
        let all = self.all.clone().acquire_owned().await;
        match (namespace, host, all) {
            (Ok(a), Ok(b), Ok(c)) => [a, b, c],
            _ => unreachable!("fetch pools are never closed"),
        }
    }
}

impl<T: Send + 'static> FetchQueue<T> {
    /// A queue and the stream of pipelines to reconcile when their fetch finished (give it to
    /// `Controller::reconcile_on`).
    pub fn new() -> (Self, BoxStream<'static, ObjectRef<ServePipeline>>) {
        let (wake, woken) = mpsc::unbounded_channel();
        let queue = FetchQueue {
            slots: Arc::default(),
            pools: Arc::new(Pools {
                all: Arc::new(Semaphore::new(MAX_FETCHES)),
                per_host: Mutex::default(),
                per_namespace: Mutex::default(),
            }),
            wake,
            next_id: Default::default(),
        };
        let woken = futures::stream::unfold(woken, |mut rx| async move {
            rx.recv().await.map(|key| (key, rx))
        })
        .boxed();
        (queue, woken)
    }

    /// The outcome of the fetch for `key` with `inputs` (a hash of what decides the fetch), or
    /// `Pending` after making sure one runs: a fetch for other inputs is cancelled and replaced.
    pub fn poll<F>(
        &self,
        key: &ObjectRef<ServePipeline>,
        inputs: &str,
        host: &str,
        fetch: impl FnOnce() -> F,
    ) -> Poll<T>
    where
        F: Future<Output = T> + Send + 'static,
    {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        match slots.remove(key) {
            Some(Slot::Done {
                inputs: done_for,
                outcome,
            }) if done_for == inputs => return Poll::Done(outcome),
            Some(running @ Slot::Running { .. }) if matches!(&running, Slot::Running { inputs: i, .. } if i == inputs) =>
            {
                slots.insert(key.clone(), running);
                return Poll::Pending;
            }
            Some(Slot::Running { task, .. }) => task.abort(),
            Some(Slot::Done { .. }) | None => {}
        }
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let namespace = key.namespace.clone().unwrap_or_default();
        let job: BoxFuture<'static, T> = Box::pin(fetch());
        let (pools, done, wake, key_for_task, host, inputs_for_task) = (
            self.pools.clone(),
            self.slots.clone(),
            self.wake.clone(),
            key.clone(),
            host.to_owned(),
            inputs.to_owned(),
        );
        let task = tokio::spawn(async move {
            let permits = pools.acquire(&namespace, &host).await;
            let outcome = job.await;
            drop(permits);
            {
                let mut slots = done.lock().unwrap_or_else(|p| p.into_inner());
                // Only the fetch the slot still waits for may fill it.
                if matches!(slots.get(&key_for_task), Some(Slot::Running { id: running, .. }) if *running == id)
                {
                    slots.insert(
                        key_for_task.clone(),
                        Slot::Done {
                            inputs: inputs_for_task,
                            outcome,
                        },
                    );
                } else {
                    return;
                }
            }
            let _ = wake.send(key_for_task);
        });
        slots.insert(
            key.clone(),
            Slot::Running {
                inputs: inputs.to_owned(),
                id,
                task: task.abort_handle(),
            },
        );
        Poll::Pending
    }

    /// Forgets `key` (the pipeline is gone): a running fetch is cancelled.
    pub fn forget(&self, key: &ObjectRef<ServePipeline>) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Slot::Running { task, .. }) = slots.remove(key) {
            task.abort();
        }
    }

    /// Fetches started and not yet handed over (running or waiting for their reconcile).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// The pool key of a source URL: `host:port`, or the URL itself when it does not parse (such a
/// fetch fails at once anyway).
/// The registry host a source's fetches count against: `source.url`'s `host:port`, or the
/// registry of `source.oci`.
pub fn source_host(source: &crate::api::servepipeline::GraphSource) -> String {
    match &source.oci {
        Some(reference) => {
            let registry = reference.split('/').next().unwrap_or_default();
            crate::k8s::truncate(registry, 256)
        }
        None => host_of(&source.url),
    }
}

pub fn host_of(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| {
            let host = u.host_str()?.to_owned();
            Some(format!("{host}:{}", u.port_or_known_default().unwrap_or(0)))
        })
        .unwrap_or_else(|| crate::k8s::truncate(url, 256))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(namespace: &str, name: &str) -> ObjectRef<ServePipeline> {
        ObjectRef::new(name).within(namespace)
    }

    #[tokio::test]
    async fn a_finished_fetch_wakes_its_pipeline_and_is_handed_over_once() {
        let (queue, mut woken) = FetchQueue::<u32>::new();
        let k = key("team", "p");
        assert!(matches!(
            queue.poll(&k, "v1", "registry:443", || async { 7 }),
            Poll::Pending
        ));
        assert_eq!(woken.next().await, Some(k.clone()));
        assert!(matches!(
            queue.poll(&k, "v1", "registry:443", || async { 8 }),
            Poll::Done(7)
        ));
        // Handed over once: the next poll starts a new fetch.
        assert!(matches!(
            queue.poll(&k, "v1", "registry:443", || async { 9 }),
            Poll::Pending
        ));
        assert_eq!(woken.next().await, Some(k.clone()));
        assert!(matches!(
            queue.poll(&k, "v1", "h", || async { 0 }),
            Poll::Done(9)
        ));
    }

    #[tokio::test]
    async fn new_inputs_cancel_the_running_fetch() {
        let (queue, mut woken) = FetchQueue::<&'static str>::new();
        let k = key("team", "p");
        let _ = queue.poll(&k, "old", "h:1", || async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            "old"
        });
        let _ = queue.poll(&k, "new", "h:1", || async { "new" });
        assert_eq!(woken.next().await, Some(k.clone()));
        assert!(matches!(
            queue.poll(&k, "new", "h:1", || async { "x" }),
            Poll::Done("new")
        ));
        // An outcome for other inputs is discarded, and a fetch for the current ones starts.
        let _ = queue.poll(&k, "a", "h:1", || async { "a" });
        assert_eq!(woken.next().await, Some(k.clone()));
        assert!(matches!(
            queue.poll(&k, "b", "h:1", || async { "b" }),
            Poll::Pending
        ));
        assert_eq!(woken.next().await, Some(k.clone()));
        assert!(matches!(
            queue.poll(&k, "b", "h:1", || async { "x" }),
            Poll::Done("b")
        ));
    }

    #[tokio::test]
    async fn hanging_registries_hold_their_own_slots_only() {
        let (queue, mut woken) = FetchQueue::<&'static str>::new();
        // 50 pipelines of one tenant hang on one slow registry.
        for i in 0..50 {
            let _ = queue.poll(&key("slow", &format!("p{i}")), "v", "slow:443", || async {
                futures::future::pending::<()>().await;
                "never"
            });
        }
        // 50 more, each in its own namespace on its own slow registry.
        for i in 0..50 {
            let _ = queue.poll(
                &key(&format!("ns{i}"), "p"),
                "v",
                &format!("slow{i}:443"),
                || async {
                    futures::future::pending::<()>().await;
                    "never"
                },
            );
        }
        let healthy = key("team", "healthy");
        let _ = queue.poll(&healthy, "v", "good:443", || async { "graph" });
        let first = tokio::time::timeout(Duration::from_secs(5), woken.next())
            .await
            .expect("the healthy fetch is not queued behind the hanging ones");
        assert_eq!(first, Some(healthy.clone()));
        assert!(matches!(
            queue.poll(&healthy, "v", "good:443", || async { "x" }),
            Poll::Done("graph")
        ));
        queue.forget(&key("slow", "p0"));
        assert_eq!(queue.len(), 99);
    }

    #[tokio::test]
    async fn one_host_gets_at_most_its_share_at_once() {
        let (queue, _woken) = FetchQueue::<()>::new();
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for i in 0..20 {
            let (running, peak) = (running.clone(), peak.clone());
            let _ = queue.poll(
                &key(&format!("ns{i}"), "p"),
                "v",
                "one:443",
                move || async move {
                    let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    peak.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                },
            );
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            peak.load(std::sync::atomic::Ordering::SeqCst),
            MAX_FETCHES_PER_HOST
        );
    }

    #[test]
    fn host_keys_include_the_port() {
        assert_eq!(host_of("https://r.example/g.pb"), "r.example:443");
        assert_eq!(host_of("http://127.0.0.1:8080/g"), "127.0.0.1:8080");
        assert_eq!(host_of("not a url"), "not a url");
    }
}
