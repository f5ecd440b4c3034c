//! Graph fetches run outside the reconcile workers. A reconcile that needs a fetch starts one
//! here and returns at once; the fetch waits for its turn, runs, and wakes the pipeline's
//! reconcile with the outcome. So a registry that sends headers and then nothing holds fetch
//! slots, never a reconcile worker, and for at most the stall timeout of `source` (15 s
//! without a byte), not the fetch's whole `timeout`.
//!
//! Slots: a fetch takes one of its namespace (FIFO), one of its registry host (`host:port`,
//! shared fairly between namespaces, see [`fair`]), and one of the operator (FIFO), always in
//! that order, so no two fetches wait on each other. The pools are operator-wide
//! ([`FetchSlots`]: one for every controller instance, whatever `--namespaces` says), and the
//! pools a tenant can fill are acquired first: a fetch waiting for its host holds only a slot
//! of its own namespace. Idle fetches cost a socket and a few KiB each; what they download is
//! bounded by the source's memory budget, not by these slots.

mod fair;

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
/// Fetches in flight at once against one registry host, shared fairly between namespaces; a
/// namespace holding none of them always gets one (see [`fair`]).
pub const MAX_FETCHES_PER_HOST: usize = 4;
/// Fetches in flight at once for the pipelines of one namespace.
pub const MAX_FETCHES_PER_NAMESPACE: usize = 8;
/// Idle namespace pools kept before the unused ones are dropped.
const MAX_IDLE_NAMESPACE_POOLS: usize = 1024;

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
    pools: FetchSlots,
    wake: mpsc::UnboundedSender<ObjectRef<ServePipeline>>,
    next_id: std::sync::atomic::AtomicU64,
}

/// The operator's fetch slots: per namespace, per registry host and operator-wide. Clones share
/// them; give every ServePipeline controller instance the same one.
#[derive(Clone)]
pub struct FetchSlots(Arc<Pools>);

struct Pools {
    all: Arc<Semaphore>,
    per_host: Arc<fair::HostSlots>,
    per_namespace: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// What a running fetch holds; dropping it frees all three. (The semaphores are never closed,
/// so their permits are never `None`.)
struct Permits {
    _namespace: Option<OwnedSemaphorePermit>,
    _host: fair::HostSlot,
    _all: Option<OwnedSemaphorePermit>,
}

impl Default for FetchSlots {
    fn default() -> Self {
        Self(Arc::new(Pools {
            all: Arc::new(Semaphore::new(MAX_FETCHES)),
            per_host: Arc::new(fair::HostSlots::new(MAX_FETCHES_PER_HOST)),
            per_namespace: Mutex::default(),
        }))
    }
}

impl std::fmt::Debug for FetchSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchSlots")
            .field("free", &self.0.all.available_permits())
            .finish_non_exhaustive()
    }
}

impl FetchSlots {
    fn namespace_pool(&self, namespace: &str) -> Arc<Semaphore> {
        let mut map = self
            .0
            .per_namespace
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Drop pools nobody holds or waits on (a waiter holds a clone of the Arc), so the map
        // tracks live namespaces only.
        if map.len() > MAX_IDLE_NAMESPACE_POOLS {
            map.retain(|_, s| {
                Arc::strong_count(s) > 1 || s.available_permits() < MAX_FETCHES_PER_NAMESPACE
            });
        }
        map.entry(namespace.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_FETCHES_PER_NAMESPACE)))
            .clone()
    }

    /// Waits for a slot of `namespace`, of `host` and of the operator, in that order.
    async fn acquire(&self, namespace: &str, host: &str) -> Permits {
        let namespace_permit = self.namespace_pool(namespace).acquire_owned().await.ok();
        let host_slot = self.0.per_host.acquire(host, namespace).await;
        let all = self.0.all.clone().acquire_owned().await.ok();
        Permits {
            _namespace: namespace_permit,
            _host: host_slot,
            _all: all,
        }
    }
}

impl<T: Send + 'static> FetchQueue<T> {
    /// A queue on `pools` and the stream of pipelines to reconcile when their fetch finished
    /// (give it to `Controller::reconcile_on`).
    pub fn new(pools: FetchSlots) -> (Self, BoxStream<'static, ObjectRef<ServePipeline>>) {
        let (wake, woken) = mpsc::unbounded_channel();
        let queue = FetchQueue {
            slots: Arc::default(),
            pools,
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
    use std::sync::Arc;
    use std::time::Duration;

    use futures::StreamExt;
    use kube::runtime::reflector::ObjectRef;

    use super::{FetchQueue, FetchSlots, MAX_FETCHES_PER_HOST, Poll, host_of};
    use crate::api::servepipeline::ServePipeline;

    fn key(namespace: &str, name: &str) -> ObjectRef<ServePipeline> {
        ObjectRef::new(name).within(namespace)
    }

    #[tokio::test]
    async fn a_finished_fetch_wakes_its_pipeline_and_is_handed_over_once() {
        let (queue, mut woken) = FetchQueue::<u32>::new(FetchSlots::default());
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
        let (queue, mut woken) = FetchQueue::<&'static str>::new(FetchSlots::default());
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
        let (queue, mut woken) = FetchQueue::<&'static str>::new(FetchSlots::default());
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

    /// Runs `count` fetches of 20 ms on `queues` (round-robin), the i-th in `namespace(i)`, all
    /// against `host`; returns the most that ran at once.
    async fn peak_concurrency(
        queues: &[&FetchQueue<()>],
        count: usize,
        host: &str,
        namespace: impl Fn(usize) -> String,
    ) -> usize {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        for i in 0..count {
            let (running, peak) = (running.clone(), peak.clone());
            let _ = queues[i % queues.len()].poll(
                &key(&namespace(i), &format!("p{i}")),
                "v",
                host,
                move || async move {
                    let now = running.fetch_add(1, SeqCst) + 1;
                    peak.fetch_max(now, SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    running.fetch_sub(1, SeqCst);
                },
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(running.load(SeqCst), 0, "every fetch ran");
        peak.load(SeqCst)
    }

    #[tokio::test]
    async fn one_namespace_gets_at_most_the_hosts_slots_at_once() {
        let (queue, _woken) = FetchQueue::<()>::new(FetchSlots::default());
        let peak = peak_concurrency(&[&queue], 20, "one:443", |_| "team".to_owned()).await;
        assert_eq!(peak, MAX_FETCHES_PER_HOST);
    }

    /// Each namespace's first fetch to a host starts at once, whatever the others hold.
    #[tokio::test]
    async fn every_namespace_gets_a_slot_of_a_shared_host_at_once() {
        let (queue, _woken) = FetchQueue::<()>::new(FetchSlots::default());
        let peak = peak_concurrency(&[&queue], 20, "one:443", |i| format!("ns{i}")).await;
        assert_eq!(peak, 20);
    }

    /// Controller instances (one per watched namespace) share one set of pools: the bounds are
    /// operator-wide, not per instance.
    #[tokio::test]
    async fn queues_on_one_set_of_slots_share_its_bounds() {
        let slots = FetchSlots::default();
        let (first, _a) = FetchQueue::<()>::new(slots.clone());
        let (second, _b) = FetchQueue::<()>::new(slots);
        let peak = peak_concurrency(&[&first, &second], 20, "one:443", |_| "team".into()).await;
        assert_eq!(peak, MAX_FETCHES_PER_HOST);
    }

    /// Issue 29: four fetches of one namespace hang on a host with every slot (and 46 more wait);
    /// a fetch of another namespace from the same host finishes at once.
    #[tokio::test]
    async fn a_namespace_hanging_on_a_shared_host_does_not_delay_another() {
        let (queue, mut woken) = FetchQueue::<&'static str>::new(FetchSlots::default());
        for i in 0..50 {
            let _ = queue.poll(
                &key("greedy", &format!("p{i}")),
                "v",
                "harbor:443",
                || async {
                    futures::future::pending::<()>().await;
                    "never"
                },
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let healthy = key("team", "healthy");
        let _ = queue.poll(&healthy, "v", "harbor:443", || async { "graph" });
        let first = tokio::time::timeout(Duration::from_secs(5), woken.next())
            .await
            .expect("the healthy fetch is not queued behind another namespace's");
        assert_eq!(first, Some(healthy));
    }

    #[test]
    fn host_keys_include_the_port() {
        assert_eq!(host_of("https://r.example/g.pb"), "r.example:443");
        assert_eq!(host_of("http://127.0.0.1:8080/g"), "127.0.0.1:8080");
        assert_eq!(host_of("not a url"), "not a url");
    }
}
