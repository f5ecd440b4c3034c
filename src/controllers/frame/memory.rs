//! Per-object memory a controller keeps between reconciles (last status written, failure
//! counts, what was already ensured), keyed by namespace/name and tied to the object's uid.
//!
//! Why the uid: a deleted and re-created object of the same name is a different object. Its
//! predecessor's memory (a backoff, a cached status, a known-good graph) must not leak into it,
//! even when the delete event was missed (watch restart, relist). Every access compares the uid
//! and starts from `T::default()` when it changed. Lost on restart, like all controller memory.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::{Resource, ResourceExt};

/// namespace/name of an object (namespace empty for cluster-scoped kinds).
pub type ObjectKey = (String, String);

/// The key of `object` in an [`ObjectMemory`].
pub fn key_of<K: Resource>(object: &K) -> ObjectKey {
    (object.namespace().unwrap_or_default(), object.name_any())
}

/// What a controller remembers per object; `T` is the controller's own memory struct.
/// The lock is never held across an await (every access is a closure).
pub struct ObjectMemory<T> {
    entries: Mutex<HashMap<ObjectKey, Entry<T>>>,
}

struct Entry<T> {
    uid: String,
    value: T,
}

impl<T> Default for ObjectMemory<T> {
    fn default() -> Self {
        ObjectMemory {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: Default> ObjectMemory<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` on the memory of `object`, creating it (or starting it afresh when the object's
    /// uid differs from the remembered one) first.
    pub fn with<K: Resource, R>(&self, object: &K, f: impl FnOnce(&mut T) -> R) -> R {
        let uid = object.uid().unwrap_or_default();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let entry = entries.entry(key_of(object)).or_insert_with(|| Entry {
            uid: uid.clone(),
            value: T::default(),
        });
        if entry.uid != uid {
            *entry = Entry {
                uid,
                value: T::default(),
            };
        }
        f(&mut entry.value)
    }

    /// Reads the memory of `object` without creating any: `None` when nothing is remembered
    /// of this object (or only of a predecessor with another uid).
    pub fn peek<K: Resource, R>(&self, object: &K, f: impl FnOnce(&T) -> R) -> Option<R> {
        let uid = object.uid().unwrap_or_default();
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(&key_of(object))
            .filter(|e| e.uid == uid)
            .map(|e| f(&e.value))
    }

    /// Drops what is remembered under `key` (the object was deleted).
    pub fn forget(&self, key: &ObjectKey) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// How many objects are remembered.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    pub(crate) fn object(name: &str, uid: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("team".into());
        cm.metadata.uid = Some(uid.into());
        cm
    }

    #[test]
    fn a_recreated_object_does_not_inherit_its_predecessors_memory() {
        let memory: ObjectMemory<Vec<&str>> = ObjectMemory::new();
        memory.with(&object("a", "uid-1"), |m| m.push("first life"));
        assert_eq!(
            memory.with(&object("a", "uid-1"), |m| m.clone()),
            ["first life"]
        );
        // Same name, new uid: a different object.
        assert_eq!(memory.peek(&object("a", "uid-2"), |m| m.len()), None);
        assert!(memory.with(&object("a", "uid-2"), |m| m.is_empty()));
        assert_eq!(memory.len(), 1);
        // Another name is independent.
        memory.with(&object("b", "uid-3"), |m| m.push("b"));
        assert_eq!(memory.peek(&object("b", "uid-3"), |m| m.len()), Some(1));
        memory.forget(&key_of(&object("b", "uid-3")));
        assert_eq!(memory.peek(&object("b", "uid-3"), |m| m.len()), None);
    }
}
