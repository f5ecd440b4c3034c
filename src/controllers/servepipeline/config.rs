//! The ServePipeline controller's operator-wide settings.

use std::time::Duration;

use super::fetches::FetchSlots;
use crate::source::Fetcher;

/// Operator-wide settings for rendering pipelines.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Watch only this namespace (`None`: all namespaces).
    pub namespace: Option<String>,
    /// Import path of the graph runtime's application builder, and the `py_modules` URIs that
    /// deliver it; `None` keeps the renderer's defaults.
    pub runtime_import_path: Option<String>,
    pub runtime_py_modules: Vec<String>,
    /// Reconciliations run at once (0: no limit).
    pub concurrency: u16,
    pub metrics: crate::admin::Metrics,
    /// Told when the caches have synced.
    pub readiness: crate::admin::Readiness,
    /// Fetches the graphs; share one across instances (its memory budget is operator-wide).
    pub fetcher: Fetcher,
    /// The fetch slots (per namespace, per registry host, operator-wide); share one across
    /// instances so the bounds are operator-wide.
    pub fetch_slots: FetchSlots,
    /// Where a RayService's Serve proxy is (`<name>-serve-svc`, port 8000), for the canary
    /// routers' counters; `None`: its DNS name in `cluster.local`.
    pub serve: Option<crate::ray::DashboardLocator>,
    /// How often a rollout in progress is looked at (default 2 s).
    pub rollout_poll: Option<Duration>,
    /// The code layers served to Ray (shared with the package server), and the package
    /// server's base URL as Ray nodes reach it; `None`: code layers are refused.
    pub code_store: crate::pypackage::CodeStore,
    pub code_base_url: Option<String>,
    /// How model nodes are laid out in Serve (default: shared node applications).
    pub node_layout: crate::serve::shared::NodeLayout,
}

impl Config {
    pub(super) fn serve_locator(&self) -> crate::ray::DashboardLocator {
        self.serve
            .clone()
            .unwrap_or_else(crate::ray::DashboardLocator::in_cluster)
    }

    pub(super) fn rollout_poll(&self) -> Duration {
        self.rollout_poll.unwrap_or(Duration::from_secs(2))
    }
}
