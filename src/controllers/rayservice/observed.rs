//! What a pass observed of its clusters' Serve and of where traffic goes: plain data, read by
//! the Serve stage, the upgrade decisions and the status.

/// What one pass learnt from a cluster's Serve.
#[derive(Default)]
pub(super) struct ServeObservation {
    /// `None`: Serve was not read (head not ready, dashboard unreachable).
    pub(super) apps: Option<std::collections::BTreeMap<String, crate::api::rayservice::AppStatus>>,
    /// Every application RUNNING.
    pub(super) ready: bool,
    pub(super) head_proxy_healthy: bool,
    /// What is being waited for, or what went wrong, in words.
    pub(super) waiting_for: Option<String>,
    /// The Serve `target_capacity` the cluster has from the operator (incremental upgrade).
    pub(super) target_capacity: Option<i32>,
    /// When the cluster runs this config: its dashboard and the applications to watch for
    /// (`serve_watch`).
    pub(super) watch: Option<(
        crate::ray::RayDashboardClient,
        std::collections::BTreeSet<String>,
    )>,
}

/// What the Serve stage learnt from the active and the pending cluster (`None`: not read),
/// with where traffic goes.
pub(super) struct Observed {
    pub(super) active: Option<ServeObservation>,
    pub(super) pending: Option<ServeObservation>,
    pub(super) traffic: Traffic,
}

/// Where the serve Service points, and whether a new cluster must be prepared.
pub(super) struct Traffic {
    pub(super) routed_to: Option<String>,
    pub(super) needs_new_cluster: bool,
}
