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
/// Whether `spec.managedBy` names another controller (e.g. Kueue's MultiKueue), which then
/// reconciles the object instead of raypipe.
pub fn managed_elsewhere(managed_by: Option<&str>) -> bool {
    managed_by.is_some_and(|m| m != crate::api::raycluster::MANAGED_BY_KUBERAY)
}

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

/// `spec` with the port protocol `TCP`, which the CRDs declare as the default (since issue 34),
/// read as unset: a hash of a spec stored before the default and of the same spec read after it
/// are equal, so an operator upgrade replaces no cluster and restarts no Pod.
pub fn without_declared_defaults(mut spec: RayClusterSpec) -> RayClusterSpec {
    let clear = |template: &mut k8s_openapi::api::core::v1::PodTemplateSpec| {
        let Some(pod) = template.spec.as_mut() else {
            return;
        };
        let containers = pod
            .containers
            .iter_mut()
            .chain(pod.init_containers.iter_mut().flatten());
        for port in containers.flat_map(|c| c.ports.iter_mut().flatten()) {
            if port.protocol.as_deref() == Some("TCP") {
                port.protocol = None;
            }
        }
    };
    clear(&mut spec.head_group_spec.template);
    for group in spec.worker_group_specs.iter_mut().flatten() {
        clear(&mut group.template);
    }
    spec
}

/// The hash of the spec stored on the head Pod (`ray.io/upgrade-strategy-recreate-hash`):
/// everything except what the autoscaler or Kueue change at run time (replica counts,
/// `workersToDelete`, tolerations, scheduling gates, Kueue's template labels and annotations)
/// and the upgrade strategy itself.
/// A stable hash, not KubeRay's SHA-1 of Go's JSON: clusters are never shared with a running
/// KubeRay, so only stability matters.
pub fn spec_hash(spec: &RayClusterSpec) -> String {
    let mut spec = without_declared_defaults(super::kueue::without_admission_marks(spec.clone()));
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

/// What the Recreate upgrade strategy does with the Pods, judged from the head Pod's
/// `ray.io/kuberay-version` and `ray.io/upgrade-strategy-recreate-hash` annotations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecreateCheck {
    /// The Pods were made by another operator (KubeRay, or another raypipe version), whose hash
    /// raypipe cannot reproduce: record raypipe's hash of the current spec, restart nothing.
    Adopt,
    /// raypipe's own hash differs from the spec's: the spec changed, recreate every Pod.
    Recreate,
    /// Nothing to do.
    Keep,
}

/// raypipe's spec hash: 64 lower-case hex digits (KubeRay writes 32 base32 digits, 0-9A-V).
fn is_raypipe_hash(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Adopt when another operator wrote the annotations (a different version, or no version and a
/// hash in another format): taking over KubeRay's clusters never restarts them. Recreate only
/// when raypipe's own hash of an earlier spec differs from `spec_hash`.
pub fn recreate_check(
    head_annotations: &std::collections::BTreeMap<String, String>,
    spec_hash: &str,
) -> RecreateCheck {
    let get = |key: &str| {
        head_annotations
            .get(key)
            .map(String::as_str)
            .unwrap_or_default()
    };
    let version = get(crate::kuberay::keys::annotations::KUBERAY_VERSION);
    let hash = get(crate::kuberay::keys::annotations::RECREATE_HASH);
    let foreign_version = !version.is_empty() && version != crate::kuberay::keys::OPERATOR_VERSION;
    let foreign_hash = !hash.is_empty() && !is_raypipe_hash(hash);
    if foreign_version || foreign_hash {
        RecreateCheck::Adopt
    } else if !hash.is_empty() && hash != spec_hash {
        RecreateCheck::Recreate
    } else {
        RecreateCheck::Keep
    }
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
    use crate::api::raycluster::{MANAGED_BY_MULTIKUEUE, ScaleStrategy, WorkerGroupSpec};

    #[test]
    fn only_another_controllers_name_hands_the_object_over() {
        assert!(!managed_elsewhere(None));
        assert!(!managed_elsewhere(Some(
            crate::api::raycluster::MANAGED_BY_KUBERAY
        )));
        assert!(managed_elsewhere(Some(MANAGED_BY_MULTIKUEUE)));
    }

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
        // The CRDs' declared default reads as unset: no hash moves with it.
        let mut defaulted = spec.clone();
        defaulted.head_group_spec.template.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![Default::default()],
            ..Default::default()
        });
        let ports = defaulted
            .head_group_spec
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .ports
            .get_or_insert_with(Vec::new);
        ports.push(k8s_openapi::api::core::v1::ContainerPort {
            container_port: 8265,
            ..Default::default()
        });
        let bare = spec_hash(&defaulted);
        let ports = defaulted
            .head_group_spec
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .ports
            .as_mut()
            .unwrap();
        ports[0].protocol = Some("TCP".into());
        assert_eq!(spec_hash(&defaulted), bare);
    }

    #[test]
    fn kuberays_pods_are_adopted_and_only_raypipes_own_hash_recreates() {
        let annotations = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let version = crate::kuberay::keys::annotations::KUBERAY_VERSION;
        let hash = crate::kuberay::keys::annotations::RECREATE_HASH;
        let ours = crate::kuberay::keys::OPERATOR_VERSION;
        let current = "a".repeat(64);
        let earlier = "b".repeat(64);
        // KubeRay v1.7.0's annotations: base32 "hex" SHA-1 and its version.
        let kuberay = "E5N3V0GJ6O1JQ8D9O0K9N1Q3K2C1S8HQ";
        for (pairs, want) in [
            (
                vec![(version, "v1.7.0"), (hash, kuberay)],
                RecreateCheck::Adopt,
            ),
            // A KubeRay hash without the version annotation is still KubeRay's.
            (vec![(hash, kuberay)], RecreateCheck::Adopt),
            // Another raypipe version hashes differently too.
            (
                vec![(version, "raypipe-v0.0.1"), (hash, earlier.as_str())],
                RecreateCheck::Adopt,
            ),
            (
                vec![(version, ours), (hash, earlier.as_str())],
                RecreateCheck::Recreate,
            ),
            (
                vec![(version, ours), (hash, current.as_str())],
                RecreateCheck::Keep,
            ),
            (vec![], RecreateCheck::Keep),
        ] {
            assert_eq!(
                recreate_check(&annotations(&pairs), &current),
                want,
                "{pairs:?}"
            );
        }
    }
}
