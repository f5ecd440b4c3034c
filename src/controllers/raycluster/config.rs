//! The RayCluster controller's settings, and its requeue times.

use std::time::Duration;

use super::builders::BuildOptions;

/// KubeRay's short requeue: after a status change or a step that needs another pass.
pub(super) const SHORT_REQUEUE: Duration = Duration::from_secs(2);
/// While the head Pod of a deleted GCS-FT cluster terminates.
pub(super) const HEAD_TERMINATION_REQUEUE: Duration = Duration::from_secs(10);
/// How long a reconcile waits for the Pod and Service caches after start-up.
pub(super) const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// Operator-level settings (KubeRay's flags and environment switches, built by `config`).
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch only this namespace (`None`: all namespaces).
    pub namespace: Option<String>,
    /// Clusters reconciled at once.
    pub concurrency: u16,
    /// Periodic re-check of a settled cluster (`RAYCLUSTER_DEFAULT_REQUEUE_SECONDS_ENV`).
    pub requeue_after: Duration,
    pub build: BuildOptions,
    /// `ENABLE_RANDOM_POD_DELETE`: scale down surplus Pods even with the autoscaler on.
    pub random_pod_delete: bool,
    /// `ENABLE_GCS_FT_REDIS_CLEANUP`: the Redis cleanup Job and its finalizer.
    pub gcs_ft_redis_cleanup: bool,
    /// How long a deleted GCS-FT cluster may wait for its cleanup before the finalizer is
    /// removed anyway (annotation `ray.io/gcs-ft-deletion-timeout` overrides it per cluster).
    pub gcs_ft_deletion_timeout: Duration,
    /// KubeRay's feature gates: the alpha fields (network policies, mTLS, embedded GCS
    /// storage) are refused unless theirs is on.
    pub feature_gates: crate::validation::feature_gates::FeatureGates,
    /// Where reconciles and provisioning times are recorded.
    pub metrics: crate::admin::Metrics,
    /// Where the cache sync is reported (`/readyz`).
    pub readiness: crate::admin::Readiness,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: None,
            concurrency: 16,
            requeue_after: Duration::from_secs(300),
            build: BuildOptions::default(),
            random_pod_delete: false,
            gcs_ft_redis_cleanup: true,
            gcs_ft_deletion_timeout: Duration::from_secs(300),
            feature_gates: Default::default(),
            metrics: crate::admin::Metrics::new(),
            readiness: crate::admin::Readiness::new(),
        }
    }
}
