//! Pure builders for everything a RayCluster owns: Pods, Services, autoscaler RBAC, Ingress,
//! the auth Secret and the Redis cleanup Job. No client, no clock, no environment: the same
//! inputs always give the same objects, so applying twice changes nothing.

pub mod cleanup_job;
pub mod names;
pub mod objects;
pub mod pod;
pub mod quantity;
pub mod ray_start;
pub mod service;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar};
use kube::ResourceExt;

use super::keys::{annotations, labels};
use crate::api::raycluster::{
    AuthMode, AutoscalerVersion, GcsFaultToleranceBackend, RayCluster, RayClusterSpec,
    RayClusterUpgradeType,
};
use crate::k8s::K8sError;

/// Operator-level settings the builders follow (KubeRay's environment switches and config file,
/// read once at start-up by whoever builds the controller's `Config`).
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// `CLUSTER_DOMAIN`: the DNS suffix of Service FQDNs.
    pub cluster_domain: String,
    /// `ENABLE_INIT_CONTAINER_INJECTION`: the `wait-gcs-ready` init container on workers.
    pub init_container_injection: bool,
    /// `ENABLE_PROBES_INJECTION`: liveness and readiness probes on the Ray container.
    pub probes_injection: bool,
    /// `ENABLE_LOGIN_SHELL`: `bash -cl` instead of `bash -c`.
    pub login_shell: bool,
    /// `ENABLE_DETERMINISTIC_HEAD_POD_NAME`: head Pod named `<cluster>-head`.
    pub deterministic_head_pod_name: bool,
    /// `ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE`: a ClusterIP head Service instead of a headless one.
    pub head_cluster_ip_service: bool,
    /// Config file `defaultContainerEnvs`: added to every Ray container where absent.
    pub default_container_envs: Vec<EnvVar>,
    /// Config file `defaultPodLabels` / `defaultPodAnnotations`: added where absent.
    pub default_pod_labels: BTreeMap<String, String>,
    pub default_pod_annotations: BTreeMap<String, String>,
    /// Config file `headSidecarContainers` / `workerSidecarContainers`.
    pub head_sidecar_containers: Vec<Container>,
    pub worker_sidecar_containers: Vec<Container>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            cluster_domain: "cluster.local".into(),
            init_container_injection: true,
            probes_injection: true,
            login_shell: false,
            deterministic_head_pod_name: false,
            head_cluster_ip_service: false,
            default_container_envs: Vec::new(),
            default_pod_labels: BTreeMap::new(),
            default_pod_annotations: BTreeMap::new(),
            head_sidecar_containers: Vec::new(),
            worker_sidecar_containers: Vec::new(),
        }
    }
}

/// Why an object could not be built from a cluster that passed validation.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0} has no container")]
    NoContainer(String),
    #[error(
        "the head container has no port named 'serve' or 'serve-*', so the serve Service cannot be made"
    )]
    NoServePort,
    #[error(transparent)]
    Owner(#[from] K8sError),
}

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

/// `/bin/bash -c --` (or `-cl` with a login shell; `extra` adds options such as `e`).
pub fn shell_command(login_shell: bool, extra: &str) -> Vec<String> {
    let mut options = format!("c{extra}");
    if login_shell {
        options.push('l');
    }
    vec!["/bin/bash".into(), format!("-{options}"), "--".into()]
}

/// Whether an env var of that name is set.
pub(crate) fn has_env(envs: &[EnvVar], name: &str) -> bool {
    envs.iter().any(|e| e.name == name)
}

/// A literal env var (an empty value is left out, as the API server stores it).
pub(crate) fn env(name: &str, value: impl Into<String>) -> EnvVar {
    let value = value.into();
    EnvVar {
        name: name.to_owned(),
        value: (!value.is_empty()).then_some(value),
        value_from: None,
    }
}

/// An env var from a field of the Pod.
pub(crate) fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
            field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                field_path: field_path.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// A RayCluster from JSON, as read from the API server (namespace and UID set).
#[cfg(test)]
pub(crate) fn test_cluster(value: serde_json::Value) -> RayCluster {
    let mut cluster: RayCluster = serde_json::from_value(value).expect("a RayCluster");
    cluster.metadata.namespace = Some("ns".into());
    cluster.metadata.uid = Some("uid-1".into());
    cluster
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

    #[test]
    fn shell_command_options() {
        assert_eq!(shell_command(false, ""), ["/bin/bash", "-c", "--"]);
        assert_eq!(shell_command(true, ""), ["/bin/bash", "-cl", "--"]);
        assert_eq!(shell_command(true, "e"), ["/bin/bash", "-cel", "--"]);
    }
}
