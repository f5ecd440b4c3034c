//! `ray.io/v1` RayCluster, field for field the API that KubeRay v1.7 serves.
//!
//! Fields keep KubeRay's JSON names and Go struct order (the order matters to the spec hash of
//! `reference/kuberay-spec.md` §0.5). Everything KubeRay marks optional is an `Option`, so an
//! object read and written back is unchanged; server-side defaults live in the CRD schema only.
//! The kind and its cluster-wide options are in `spec`, the head and worker groups in `groups`,
//! the observed state in `status`; this file is the module's public surface.

mod groups;
mod spec;
mod status;

#[cfg(test)]
mod tests;

pub use groups::{
    AutoscalerOptions, AutoscalerVersion, HeadGroupSpec, IngressOptions, IngressPathType,
    ScaleStrategy, UpscalingMode, WorkerGroupSpec,
};
pub use spec::{
    AuthMode, AuthOptions, CollectorOptions, GcsEmbeddedStorage, GcsFaultToleranceBackend,
    GcsFaultToleranceOptions, GcsStorageDeletionPolicy, HistoryServerOptions, MANAGED_BY_KUBERAY,
    MANAGED_BY_MULTIKUEUE, NetworkPolicyConfig, NetworkPolicyMode, NetworkPolicyRules, RayCluster,
    RayClusterSpec, RayClusterUpgradeStrategy, RayClusterUpgradeType, RedisCredential, TlsOptions,
    WorkerGroupNetworkPolicyRules,
};
pub use status::{ClusterState, HeadInfo, RayClusterStatus, condition_reasons, condition_types};
