//! Spec predicates every Ray controller and validator asks of a RayCluster: which features it
//! turns on (autoscaling, GCS fault tolerance, token auth, recreate upgrades), which resource
//! created it, and the spec hash that decides whether its Pods are out of date.

use kube::ResourceExt;

use crate::api::raycluster::{
    AuthMode, AutoscalerVersion, GcsFaultToleranceBackend, RayCluster, RayClusterSpec,
    RayClusterUpgradeType,
};
use crate::kuberay::keys::{annotations, labels};

/// Which custom resource created the cluster (label `ray.io/originated-from-crd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Creator {
    RayCluster,
    RayJob,
    RayService,
}

impl Creator {
    pub fn of(cluster: &RayCluster) -> Creator {
        match cluster
            .labels()
            .get(labels::ORIGINATED_FROM_CRD)
            .map(String::as_str)
        {
            Some("RayJob") => Creator::RayJob,
            Some("RayService") => Creator::RayService,
            _ => Creator::RayCluster,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Creator::RayCluster => "RayCluster",
            Creator::RayJob => "RayJob",
            Creator::RayService => "RayService",
        }
    }
}

/// `enableInTreeAutoscaling: true`.
pub fn autoscaling_enabled(spec: &RayClusterSpec) -> bool {
    spec.enable_in_tree_autoscaling == Some(true)
}

/// `autoscalerOptions.version`, when set.
pub fn autoscaler_version(spec: &RayClusterSpec) -> Option<AutoscalerVersion> {
    spec.autoscaler_options.as_ref().and_then(|o| o.version)
}

/// GCS fault tolerance: the legacy annotation or `gcsFaultToleranceOptions`.
pub fn gcs_ft_enabled(cluster: &RayCluster) -> bool {
    cluster
        .annotations()
        .get(annotations::FT_ENABLED)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || cluster.spec.gcs_fault_tolerance_options.is_some()
}

/// GCS fault tolerance with the embedded RocksDB backend.
pub fn gcs_ft_embedded(spec: &RayClusterSpec) -> bool {
    spec.gcs_fault_tolerance_options
        .as_ref()
        .and_then(|o| o.backend)
        == Some(GcsFaultToleranceBackend::Rocksdb)
}

/// GCS fault tolerance backed by Redis (the default backend), which needs cleaning up.
pub fn gcs_ft_redis(cluster: &RayCluster) -> bool {
    gcs_ft_enabled(cluster) && !gcs_ft_embedded(&cluster.spec)
}

/// mTLS between Ray processes (`tlsOptions.enabled: true`; validation has checked the gate).
pub fn tls_enabled(spec: &RayClusterSpec) -> bool {
    spec.tls_options.as_ref().and_then(|t| t.enabled) == Some(true)
}

/// Ray token authentication (`authOptions.mode: token`).
pub fn auth_enabled(spec: &RayClusterSpec) -> bool {
    spec.auth_options.as_ref().and_then(|a| a.mode) == Some(AuthMode::Token)
}

/// Token checks delegated to the Kubernetes API server.
pub fn k8s_auth_enabled(spec: &RayClusterSpec) -> bool {
    spec.auth_options
        .as_ref()
        .and_then(|a| a.enable_k8s_token_auth)
        == Some(true)
}

/// `upgradeStrategy.type: Recreate`.
pub fn recreate_on_change(spec: &RayClusterSpec) -> bool {
    spec.upgrade_strategy.as_ref().and_then(|u| u.type_) == Some(RayClusterUpgradeType::Recreate)
}

/// `ray.io/overwrite-container-cmd: "true"` on the cluster.
pub fn overwrite_container_cmd(cluster: &RayCluster) -> bool {
    cluster
        .annotations()
        .get(annotations::OVERWRITE_CONTAINER_CMD)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The hash of the spec stored on the head Pod (`ray.io/upgrade-strategy-recreate-hash`):
/// everything except what the autoscaler or Kueue change at run time (replica counts,
/// `workersToDelete`, tolerations, scheduling gates) and the upgrade strategy itself.
/// A stable hash, not KubeRay's SHA-1 of Go's JSON: clusters are never shared with a running
/// KubeRay, so only stability matters.
pub fn spec_hash(spec: &RayClusterSpec) -> String {
    let mut spec = spec.clone();
    let clear_pod_scheduling = |template: &mut k8s_openapi::api::core::v1::PodTemplateSpec| {
        if let Some(pod) = template.spec.as_mut() {
            pod.tolerations = None;
            pod.scheduling_gates = None;
        }
    };
    clear_pod_scheduling(&mut spec.head_group_spec.template);
    for group in spec.worker_group_specs.iter_mut().flatten() {
        group.replicas = None;
        group.min_replicas = None;
        group.max_replicas = None;
        // `scaleStrategy: {}` and no scaleStrategy mean the same; the autoscaler adds it.
        group.scale_strategy = None;
        clear_pod_scheduling(&mut group.template);
    }
    spec.upgrade_strategy = None;
    crate::k8s::stable_hash(&spec)
}

/// `rayVersion` at least `major.minor.patch` (`v` prefix and suffixes ignored; unparsable is
/// older).
pub(crate) fn ray_version_at_least(version: &str, minimum: (u64, u64, u64)) -> bool {
    let version = version.trim().trim_start_matches('v');
    let numbers: Vec<u64> = version
        .split('.')
        .map_while(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect();
    if numbers.len() < 2 {
        return false;
    }
    let patch = numbers.get(2).copied().unwrap_or(0);
    (numbers[0], numbers[1], patch) >= minimum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::raycluster::{ScaleStrategy, WorkerGroupSpec};

    #[test]
    fn spec_hash_ignores_what_the_autoscaler_changes() {
        let spec = RayClusterSpec {
            worker_group_specs: Some(vec![WorkerGroupSpec {
                group_name: "g".into(),
                replicas: Some(1),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let base = spec_hash(&spec);
        assert_eq!(base.len(), 64);
        let mut scaled = spec.clone();
        let group = &mut scaled.worker_group_specs.as_mut().unwrap()[0];
        group.replicas = Some(5);
        group.max_replicas = Some(9);
        group.scale_strategy = Some(ScaleStrategy {
            workers_to_delete: Some(vec!["p".into()]),
        });
        assert_eq!(spec_hash(&scaled), base);
        let mut changed = spec.clone();
        changed.ray_version = Some("2.53.0".into());
        assert_ne!(spec_hash(&changed), base);
    }
}
