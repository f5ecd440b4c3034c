//! The RayJob controller's settings.

use std::time::Duration;

use crate::ray::DashboardLocator;

/// Operator-level settings (KubeRay's flags and environment switches, built by `config`).
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch only this namespace (`None`: all namespaces).
    pub namespace: Option<String>,
    /// RayJobs reconciled at once.
    pub concurrency: u16,
    /// Where a head Service's dashboard is dialled.
    pub locator: DashboardLocator,
    /// Timeouts of every dashboard call (kept short: a dead head must not stall the queue).
    pub dashboard_connect_timeout: Duration,
    pub dashboard_request_timeout: Duration,
    /// KubeRay's 3 s requeue while a RayJob is in flight.
    pub requeue: Duration,
    /// DNS domain written into `status.dashboardURL`.
    pub cluster_domain: String,
    /// KubeRay's feature gates (RayJobDeletionPolicy is read here).
    pub feature_gates: crate::validation::feature_gates::FeatureGates,
    /// How the RayJob's head Service is built (as the RayCluster controller builds the
    /// cluster's: KubeRay's `ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE`).
    pub build: crate::controllers::raycluster::builders::BuildOptions,
    /// `DELETE_RAYJOB_CR_AFTER_JOB_FINISHES`: shutdown deletes the RayJob instead of the cluster.
    pub delete_rayjob_after_finish: bool,
    /// `RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS`.
    pub status_check_timeout: Duration,
    /// `RAYJOB_DEPLOYMENT_STATUS_TRANSITION_GRACE_PERIOD_SECONDS`.
    pub transition_grace_period: Duration,
    /// How long after the submitter finished the Ray job may stay non-terminal.
    pub submitter_finished_timeout: Duration,
    /// Where reconciles are recorded.
    pub metrics: crate::admin::Metrics,
    /// Where the cache sync is reported (`/readyz`).
    pub readiness: crate::admin::Readiness,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: None,
            concurrency: 4,
            locator: DashboardLocator::in_cluster(),
            dashboard_connect_timeout: Duration::from_secs(2),
            dashboard_request_timeout: Duration::from_secs(5),
            requeue: Duration::from_secs(3),
            cluster_domain: crate::ray::DEFAULT_CLUSTER_DOMAIN.to_owned(),
            feature_gates: Default::default(),
            build: Default::default(),
            delete_rayjob_after_finish: false,
            status_check_timeout: Duration::from_secs(300),
            transition_grace_period: Duration::from_secs(300),
            submitter_finished_timeout: Duration::from_secs(30),
            metrics: crate::admin::Metrics::new(),
            readiness: crate::admin::Readiness::new(),
        }
    }
}
