//! What the controller remembers per RayService between passes (last status written, Serve
//! pushes, deletion deadlines, applied Services), kept in the frame's per-object memory, so it
//! starts afresh when the UID changes. Failure counts are the frame's.

use super::*;
use crate::controllers::frame::memory::ObjectKey;

/// What a Serve config push left behind, per cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Pushed {
    pub(super) config_hash: String,
    /// The head's Ray session when it was pushed (a new session is a restarted head).
    pub(super) session: Option<String>,
}

#[derive(Default)]
pub(super) struct ServiceMemory {
    pub(super) last_status: Option<RayServiceStatus>,
    pub(super) pushed: HashMap<String, Pushed>,
    /// Clusters no longer active or pending, and when they may be deleted.
    pub(super) deletion_due: HashMap<String, Instant>,
    /// Services applied (name → hash of what was applied).
    pub(super) applied_services: HashMap<String, String>,
}

impl Context {
    pub(super) fn with_memory<T>(
        &self,
        service: &RayService,
        f: impl FnOnce(&mut ServiceMemory) -> T,
    ) -> T {
        self.memory.with(service, f)
    }

    /// A deleted RayService: its memory and its failure count go.
    pub(super) fn forget(&self, key: &ObjectKey) {
        self.memory.forget(key);
        self.frame.forget(key);
    }
}
