//! The RayService controller's settings, and its requeue times.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::raycluster::builders::BuildOptions;
use crate::ray::{DashboardClientOptions, DashboardLocator, DashboardUrl};

use super::build::HttpBinding;

/// KubeRay's requeue while anything is in motion.
pub(super) const SHORT_REQUEUE: Duration = Duration::from_secs(2);
/// KubeRay's default `rayClusterDeletionDelaySeconds`.
pub(super) const DEFAULT_DELETION_DELAY: Duration = Duration::from_secs(60);

/// Tells, for a dashboard, where Serve's HTTP proxy must listen (out-of-cluster runs).
pub type HttpBindingFor = Arc<dyn Fn(&DashboardUrl) -> Option<HttpBinding> + Send + Sync>;

#[derive(Clone)]
pub struct Config {
    /// Watch only this namespace (`None`: all namespaces).
    pub namespace: Option<String>,
    /// RayServices reconciled at once.
    pub concurrency: u16,
    /// Where each cluster's dashboard is.
    pub dashboard: DashboardLocator,
    /// Dashboard timeouts (short: a dead head must not hold a reconcile).
    pub dashboard_options: DashboardClientOptions,
    /// `http_options` forced onto pushed Serve configs (a Ray head on 127.0.0.1); `None`
    /// pushes the user's config as it is.
    pub http_binding: Option<HttpBindingFor>,
    /// `runtime_env` URI prefix rewrites (`from`, `to`), for clusters that fetch packages from a
    /// mirror instead of the Internet.
    pub runtime_env_mirrors: Vec<(String, String)>,
    /// `ENABLE_ZERO_DOWNTIME`: a cluster spec change starts a new cluster unless the
    /// RayService's upgrade strategy says otherwise.
    pub zero_downtime: bool,
    /// How often a settled RayService's Serve applications are re-read.
    pub steady_poll: Duration,
    pub build: BuildOptions,
    /// Where reconciles and upgrade durations are recorded.
    pub metrics: crate::admin::Metrics,
    /// Where the cache sync is reported (`/readyz`).
    pub readiness: crate::admin::Readiness,
    /// The operator's feature gates, which the validation rules consult.
    pub feature_gates: crate::validation::feature_gates::FeatureGates,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: None,
            concurrency: 16,
            dashboard: DashboardLocator::in_cluster(),
            dashboard_options: DashboardClientOptions::default(),
            http_binding: None,
            runtime_env_mirrors: Vec::new(),
            zero_downtime: true,
            steady_poll: Duration::from_secs(10),
            build: BuildOptions::default(),
            metrics: crate::admin::Metrics::new(),
            readiness: crate::admin::Readiness::new(),
            feature_gates: crate::validation::feature_gates::FeatureGates::default(),
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("namespace", &self.namespace)
            .field("concurrency", &self.concurrency)
            .field("http_binding", &self.http_binding.is_some())
            .field("runtime_env_mirrors", &self.runtime_env_mirrors)
            .field("zero_downtime", &self.zero_downtime)
            .finish_non_exhaustive()
    }
}
