//! Pure builders for everything a RayCluster owns: Pods, Services, autoscaler RBAC, Ingress,
//! the auth Secret, the Redis cleanup Job, and the gated NetworkPolicies, cert-manager objects
//! and embedded GCS PVC. No client, no clock, no environment: the same
//! inputs always give the same objects, so applying twice changes nothing.

pub mod batch_scheduler;
pub mod cleanup_job;
mod error;
pub mod gcs_storage;
pub mod mtls;
pub mod network_policy;
pub mod objects;
pub mod pod;
pub mod ray_start;
pub mod service;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar};

pub use error::BuildError;

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
    /// Gate `RayClusterHistoryServer`: the collector sidecar, its volume and Ray's event export.
    pub history_server: bool,
    /// `--batch-scheduler`: the scheduler whose name, labels and annotations the Pods get.
    pub batch_scheduler: Option<batch_scheduler::BatchScheduler>,
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
            history_server: false,
            batch_scheduler: None,
        }
    }
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
pub(crate) fn test_cluster(value: serde_json::Value) -> crate::api::raycluster::RayCluster {
    let mut cluster: crate::api::raycluster::RayCluster =
        serde_json::from_value(value).expect("a RayCluster");
    cluster.metadata.namespace = Some("ns".into());
    cluster.metadata.uid = Some("uid-1".into());
    cluster
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_command_options() {
        assert_eq!(shell_command(false, ""), ["/bin/bash", "-c", "--"]);
        assert_eq!(shell_command(true, ""), ["/bin/bash", "-cl", "--"]);
        assert_eq!(shell_command(true, "e"), ["/bin/bash", "-cel", "--"]);
    }
}
