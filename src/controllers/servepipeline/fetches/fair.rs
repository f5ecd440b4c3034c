//! The fetch slots of registry hosts, shared fairly between namespaces (issue 29).
//!
//! One registry (a company's one Harbor) serves many tenants. With one FIFO pool per host, four
//! pipelines of one namespace whose registry path hung held every slot of that host for their
//! whole timeout, and every other namespace waited behind them (116 s measured). Here each host
//! keeps a FIFO queue per namespace, and its slots go to namespaces, not to fetches in arrival
//! order:
//!
//! - **A floor of one:** a namespace that holds no slot of a host gets one at once, however many
//!   fetches of other namespaces hold or wait for it. Slots are never taken back (cancelling a
//!   download another namespace started wastes it, and a slow download is not a wrong one), so
//!   without the floor a namespace that came first and filled the host with fetches that hang
//!   would still keep every later namespace waiting for its fetches to end.
//! - **Fair share above the floor:** a namespace gets a further slot only while fewer than
//!   `capacity` are held, and a freed slot goes to the waiting namespace that holds the fewest
//!   (ties in round-robin order). So with N namespaces waiting on one host each gets about
//!   1/N of its slots, and a namespace that is alone may use them all.
//! - **FIFO within a namespace:** its fetches to a host start in the order they asked.
//!
//! So a host sees at most `capacity` fetches plus one for each further namespace fetching from
//! it (and that only until fetches above the floor end); the operator-wide pool bounds the sum. Memory: a host's entry, and a
//! namespace's entry within it, live only while a fetch holds or waits for a slot there, and go
//! with the last one; hosts and namespaces are untrusted input, and the maps hold what is in
//! flight (at most one fetch per pipeline), not every name ever seen. Host keys are capped.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Longest host key kept (a URL's host is untrusted and may be long).
const MAX_KEY_BYTES: usize = 256;

/// The slots of every registry host, `capacity` each, shared fairly between namespaces.
pub struct HostSlots {
    capacity: usize,
    hosts: Mutex<HashMap<String, Host>>,
    next_id: AtomicU64,
}

/// One host: the slots held and the namespaces holding or waiting.
#[derive(Default)]
struct Host {
    held: usize,
    tenants: HashMap<String, Tenant>,
    /// The namespaces with waiters, in the order they are served (round-robin).
    turns: VecDeque<String>,
}

/// One namespace at one host.
#[derive(Default)]
struct Tenant {
    held: usize,
    /// FIFO.
    waiting: VecDeque<Waiter>,
}

struct Waiter {
    id: u64,
    grant: oneshot::Sender<()>,
}

/// A slot of a host, held until dropped; dropping it while it still waits leaves the queue.
pub struct HostSlot {
    slots: Arc<HostSlots>,
    host: String,
    namespace: String,
    id: u64,
    granted: oneshot::Receiver<()>,
}

impl HostSlots {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            hosts: Mutex::default(),
            next_id: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Host>> {
        // Every update leaves the maps consistent, so a poisoned lock still holds usable state.
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a slot of `host` for a fetch of `namespace`.
    pub async fn acquire(self: &Arc<Self>, host: &str, namespace: &str) -> HostSlot {
        let host = crate::k8s::truncate(host, MAX_KEY_BYTES);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (grant, granted) = oneshot::channel();
        {
            let mut hosts = self.lock();
            let entry = hosts.entry(host.clone()).or_default();
            let tenant = entry.tenants.entry(namespace.to_owned()).or_default();
            if tenant.waiting.is_empty() {
                entry.turns.push_back(namespace.to_owned());
            }
            tenant.waiting.push_back(Waiter { id, grant });
            entry.dispatch(self.capacity);
        }
        let mut slot = HostSlot {
            slots: self.clone(),
            host,
            namespace: namespace.to_owned(),
            id,
            granted,
        };
        // A waiter leaves its queue only by a grant or by `slot`'s drop, so while `slot` lives
        // this ends with the grant (its sender is never dropped unsent).
        let _ = (&mut slot.granted).await;
        slot
    }

    /// Slots of `host` held now (tests).
    #[cfg(test)]
    pub fn held(&self, host: &str) -> usize {
        self.lock().get(host).map_or(0, |h| h.held)
    }

    /// Slots of `host` held by `namespace` now (tests).
    #[cfg(test)]
    pub fn held_by(&self, host: &str, namespace: &str) -> usize {
        self.lock()
            .get(host)
            .and_then(|h| h.tenants.get(namespace))
            .map_or(0, |t| t.held)
    }

    /// Hosts and (host, namespace) entries kept now (tests: they must not outlive their fetches).
    #[cfg(test)]
    pub fn entries(&self) -> (usize, usize) {
        let hosts = self.lock();
        (
            hosts.len(),
            hosts.values().map(|h| h.tenants.len()).sum::<usize>(),
        )
    }
}

impl Host {
    /// Grants slots while the policy allows: first to a namespace holding none (in turn order),
    /// then, below capacity, to the waiting namespace holding the fewest.
    fn dispatch(&mut self, capacity: usize) {
        loop {
            let mut pick: Option<(usize, usize)> = None;
            for (position, namespace) in self.turns.iter().enumerate() {
                let held = self.tenants.get(namespace).map_or(0, |t| t.held);
                if pick.is_none_or(|(_, fewest)| held < fewest) {
                    pick = Some((position, held));
                }
            }
            let position = match pick {
                Some((position, 0)) => position,
                Some((position, _)) if self.held < capacity => position,
                _ => return,
            };
            let Some(namespace) = self.turns.remove(position) else {
                return;
            };
            let Some(tenant) = self.tenants.get_mut(&namespace) else {
                continue;
            };
            if let Some(waiter) = tenant.waiting.pop_front() {
                // Fails only if the waiter is gone, which its drop prevents (it leaves the
                // queue first); then nothing was granted.
                if waiter.grant.send(()).is_ok() {
                    tenant.held += 1;
                    self.held += 1;
                }
            }
            if !tenant.waiting.is_empty() {
                // Round-robin: its next fetch waits for the other namespaces' turns.
                self.turns.push_back(namespace);
            }
        }
    }

    /// Removes waiter `id` of `namespace`; false when it is not queued (it was granted).
    fn leave_queue(&mut self, namespace: &str, id: u64) -> bool {
        let Some(tenant) = self.tenants.get_mut(namespace) else {
            return false;
        };
        let Some(position) = tenant.waiting.iter().position(|w| w.id == id) else {
            return false;
        };
        tenant.waiting.remove(position);
        if tenant.waiting.is_empty() {
            self.turns.retain(|n| n != namespace);
        }
        true
    }

    fn release(&mut self, namespace: &str) {
        if let Some(tenant) = self.tenants.get_mut(namespace) {
            tenant.held = tenant.held.saturating_sub(1);
        }
        self.held = self.held.saturating_sub(1);
    }

    /// Drops the entry of `namespace` once it holds and waits for nothing.
    fn forget_idle(&mut self, namespace: &str) {
        if self
            .tenants
            .get(namespace)
            .is_some_and(|t| t.held == 0 && t.waiting.is_empty())
        {
            self.tenants.remove(namespace);
        }
    }
}

impl Drop for HostSlot {
    fn drop(&mut self) {
        let capacity = self.slots.capacity;
        let mut hosts = self.slots.lock();
        let Some(host) = hosts.get_mut(&self.host) else {
            return;
        };
        // Still queued: leave it (nothing was held). Otherwise it was granted, whether or not
        // the grant was awaited: give the slot back to the next in line.
        if !host.leave_queue(&self.namespace, self.id) {
            host.release(&self.namespace);
            host.dispatch(capacity);
        }
        host.forget_idle(&self.namespace);
        if host.held == 0 && host.tenants.is_empty() {
            hosts.remove(&self.host);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::{HostSlot, HostSlots};

    /// Starts a fetch of `namespace` waiting for a slot of `host`; the handle ends with the slot.
    fn ask(
        slots: &Arc<HostSlots>,
        host: &str,
        namespace: &str,
    ) -> tokio::task::JoinHandle<HostSlot> {
        let (slots, host, namespace) = (slots.clone(), host.to_owned(), namespace.to_owned());
        tokio::spawn(async move { slots.acquire(&host, &namespace).await })
    }

    /// Lets spawned tasks run until nothing changes (tests run on one thread).
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    async fn granted(task: tokio::task::JoinHandle<HostSlot>) -> HostSlot {
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("granted")
            .expect("the task ran")
    }

    #[tokio::test]
    async fn a_namespace_alone_uses_every_slot_and_no_more() {
        let slots = Arc::new(HostSlots::new(4));
        let tasks: Vec<_> = (0..6).map(|_| ask(&slots, "h:443", "a")).collect();
        settle().await;
        assert_eq!(slots.held("h:443"), 4);
        let finished = tasks.iter().filter(|t| t.is_finished()).count();
        assert_eq!(finished, 4, "two wait");
    }

    /// Issue 29: one namespace holds every slot with fetches that hang; another namespace's
    /// first fetch starts at once, its second waits for its fair share.
    #[tokio::test]
    async fn another_namespace_gets_its_first_slot_at_once() {
        let slots = Arc::new(HostSlots::new(4));
        let mut hanging = Vec::new();
        for _ in 0..4 {
            hanging.push(granted(ask(&slots, "h:443", "greedy")).await);
        }
        let waiting: Vec<_> = (0..10).map(|_| ask(&slots, "h:443", "greedy")).collect();
        settle().await;
        let first = granted(ask(&slots, "h:443", "other")).await;
        assert_eq!(slots.held("h:443"), 5);
        let second = ask(&slots, "h:443", "other");
        settle().await;
        assert!(!second.is_finished(), "above its floor, the host is full");
        // Two of greedy's slots free: the host is below capacity once, and the slot goes to
        // the namespace holding fewer, not to greedy's older waiters.
        drop(hanging.pop());
        drop(hanging.pop());
        let second = granted(second).await;
        assert_eq!(slots.held_by("h:443", "other"), 2);
        assert_eq!(slots.held_by("h:443", "greedy"), 2);
        assert_eq!(slots.held("h:443"), 4);
        drop((first, second, hanging));
        for task in waiting {
            drop(granted(task).await);
        }
        assert_eq!(slots.entries(), (0, 0));
    }

    /// Above the floor, a freed slot goes to the waiting namespace holding the fewest: with N
    /// namespaces always waiting, each ends up with 1/N of the host, whoever came first.
    #[tokio::test]
    async fn contended_slots_converge_to_equal_shares() {
        let slots = Arc::new(HostSlots::new(6));
        let mut held = VecDeque::new();
        // "a" came first and took every slot.
        for _ in 0..6 {
            held.push_back(granted(ask(&slots, "h:443", "a")).await);
        }
        let mut waiting = Vec::new();
        for namespace in ["a", "b", "c"] {
            for _ in 0..30 {
                waiting.push(ask(&slots, "h:443", namespace));
            }
        }
        settle().await;
        for _ in 0..40 {
            // The oldest fetch ends; whoever was granted its slot starts.
            drop(held.pop_front());
            settle().await;
            let (done, still): (Vec<_>, Vec<_>) =
                waiting.into_iter().partition(|task| task.is_finished());
            waiting = still;
            for task in done {
                held.push_back(task.await.expect("the task ran"));
            }
        }
        for namespace in ["a", "b", "c"] {
            assert_eq!(slots.held_by("h:443", namespace), 2, "{namespace}");
        }
        assert_eq!(slots.held("h:443"), 6);
    }

    /// A namespace's fetches to a host start in the order they asked, while other namespaces'
    /// fetches come and go.
    #[tokio::test]
    async fn fetches_of_a_namespace_start_in_the_order_they_asked() {
        let slots = Arc::new(HostSlots::new(2));
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..30 {
            for namespace in ["a", "b", "c"] {
                let (slots, order) = (slots.clone(), order.clone());
                tasks.push(tokio::spawn(async move {
                    let slot = slots.acquire("h:443", namespace).await;
                    order
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((namespace, i));
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    drop(slot);
                }));
                // Asked in this order.
                settle().await;
            }
        }
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("every fetch gets a slot")
                .expect("ran");
        }
        let order = order.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for namespace in ["a", "b", "c"] {
            let mine: Vec<_> = order
                .iter()
                .filter(|(n, _)| *n == namespace)
                .map(|(_, i)| *i)
                .collect();
            assert_eq!(mine, (0..30).collect::<Vec<_>>(), "FIFO in {namespace}");
        }
        assert_eq!(slots.entries(), (0, 0));
    }

    /// Fetches cancelled while waiting, or right after their grant, leave nothing behind, and
    /// thousands of hosts and namespaces leave no entries once their fetches are done.
    #[tokio::test]
    async fn cancelled_waiters_and_many_names_leave_no_entries() {
        let slots = Arc::new(HostSlots::new(1));
        let held = granted(ask(&slots, "h:443", "a")).await;
        let queued = ask(&slots, "h:443", "a");
        settle().await;
        queued.abort();
        settle().await;
        // Granted but never taken: the slot goes back when the task is cancelled.
        let next = ask(&slots, "h:443", "a");
        settle().await;
        drop(held);
        assert_eq!(slots.held("h:443"), 1, "granted to the waiter");
        next.abort();
        settle().await;
        assert_eq!(slots.held("h:443"), 0);
        assert_eq!(slots.entries(), (0, 0));

        for i in 0..5000 {
            let host = format!("registry-{i}.example:443");
            let slot = slots.acquire(&host, &format!("ns-{i}")).await;
            drop(slot);
        }
        let long = "x".repeat(100_000);
        drop(slots.acquire(&long, "ns").await);
        assert_eq!(slots.entries(), (0, 0));
    }

    /// Many fetches over a few hosts and namespaces, some cancelled at random points: every
    /// one that is not cancelled gets its slot (no lost wake-up), the bound holds throughout,
    /// and nothing is left behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn under_churn_every_fetch_is_served_within_the_bound() {
        let slots = Arc::new(HostSlots::new(3));
        let peak = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for i in 0..400u64 {
            let (slots, peak) = (slots.clone(), peak.clone());
            let host = format!("h{}:443", i % 3);
            let namespace = format!("ns{}", i % 5);
            let task = tokio::spawn(async move {
                let slot = slots.acquire(&host, &namespace).await;
                peak.fetch_max(slots.held(&host) as u64, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(200 * (i % 7))).await;
                drop(slot);
            });
            if i % 11 == 0 {
                task.abort();
            } else {
                tasks.push(task);
            }
        }
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .expect("no fetch waits forever")
                .expect("ran");
        }
        // At most `capacity` plus one for each further namespace (3 + 4 here).
        assert!(peak.load(Ordering::SeqCst) <= 7, "{peak:?}");
        settle().await;
        assert_eq!(slots.entries(), (0, 0));
    }
}
