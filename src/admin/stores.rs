//! The controllers' caches as seen by scrape-time collectors: a controller registers its
//! reflector store for as long as it runs, and a collector reads every registered store when
//! `/metrics` is scraped. Nothing is copied or kept per object: deleted objects leave the
//! metrics when they leave the cache.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::{Lookup, Store};

/// The stores registered for one kind (several controller instances may run, one per
/// watched namespace).
pub(crate) struct StoreSet<K: Lookup + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    next_id: AtomicU64,
    stores: Mutex<BTreeMap<u64, Store<K>>>,
}

impl<K: Lookup + Clone + 'static> Default for StoreSet<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn default() -> Self {
        StoreSet {
            next_id: AtomicU64::new(0),
            stores: Mutex::new(BTreeMap::new()),
        }
    }
}

impl<K> StoreSet<K>
where
    K: Lookup + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    /// Reads `store` at every scrape until the returned registration is dropped.
    pub(crate) fn register(self: &Arc<Self>, store: Store<K>) -> StoreRegistration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, store);
        let set = Arc::downgrade(self);
        StoreRegistration {
            unregister: Some(Box::new(move || {
                if let Some(set) = set.upgrade() {
                    set.lock().remove(&id);
                }
            })),
        }
    }

    /// Every object of every registered store, as the caches hold them now.
    pub(crate) fn objects(&self) -> Vec<Arc<K>> {
        self.lock().values().flat_map(Store::state).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Store<K>>> {
        self.stores.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Keeps a store visible to the collectors; dropping it (the controller stopped) removes it.
/// A registration made while the collector is off does nothing.
pub struct StoreRegistration {
    unregister: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl StoreRegistration {
    /// A registration that reads nothing (its collector is not enabled).
    pub(crate) fn none() -> StoreRegistration {
        StoreRegistration { unregister: None }
    }
}

impl std::fmt::Debug for StoreRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreRegistration")
    }
}

impl Drop for StoreRegistration {
    fn drop(&mut self) {
        if let Some(unregister) = self.unregister.take() {
            unregister();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::watcher;

    fn config_map(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("ns".into());
        cm
    }

    #[test]
    fn registered_stores_are_read_until_their_registration_is_dropped() {
        let set = Arc::new(StoreSet::<ConfigMap>::default());
        let (first, mut first_writer) = kube::runtime::reflector::store();
        let (second, mut second_writer) = kube::runtime::reflector::store();
        first_writer.apply_watcher_event(&watcher::Event::Apply(config_map("a")));
        second_writer.apply_watcher_event(&watcher::Event::Apply(config_map("b")));
        let kept = set.register(first);
        let dropped = set.register(second);
        let mut names: Vec<String> = set
            .objects()
            .iter()
            .filter_map(|cm| cm.metadata.name.clone())
            .collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
        drop(dropped);
        assert_eq!(set.objects().len(), 1);
        drop(kept);
        assert!(set.objects().is_empty());
        drop(StoreRegistration::none());
    }
}
