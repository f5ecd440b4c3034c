//! What the controller remembers per RayService between passes (last status written, Serve
//! pushes, deletion deadlines, applied Services, failures), reset when the UID changes.

use super::*;

pub(super) type Key = (String, String);

/// What a Serve config push left behind, per cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Pushed {
    pub(super) config_hash: String,
    /// The head's Ray session when it was pushed (a new session is a restarted head).
    pub(super) session: Option<String>,
}

#[derive(Default)]
pub(super) struct ServiceMemory {
    pub(super) uid: String,
    pub(super) last_status: Option<RayServiceStatus>,
    pub(super) pushed: HashMap<String, Pushed>,
    /// Clusters no longer active or pending, and when they may be deleted.
    pub(super) deletion_due: HashMap<String, Instant>,
    /// Services applied (name → hash of what was applied).
    pub(super) applied_services: HashMap<String, String>,
    pub(super) consecutive_failures: u32,
}

pub(super) fn key_of(service: &RayService) -> Key {
    (service.namespace().unwrap_or_default(), service.name_any())
}

impl Context {
    pub(super) fn with_memory<T>(
        &self,
        service: &RayService,
        f: impl FnOnce(&mut ServiceMemory) -> T,
    ) -> T {
        let mut memory = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        let uid = service.uid().unwrap_or_default();
        let entry = memory.entry(key_of(service)).or_default();
        if entry.uid != uid {
            *entry = ServiceMemory {
                uid,
                ..Default::default()
            };
        }
        f(entry)
    }

    pub(super) fn forget(&self, key: &Key) {
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}
