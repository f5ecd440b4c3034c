//! KubeRay's operator configuration file (`--config`, `config.ray.io/v1alpha1`
//! `Configuration`): raypipe reads only the fields KubeRay takes from nowhere else (Pod
//! defaults and sidecars); every other setting is a flag, so the file refuses the rest.

use std::collections::BTreeMap;

/// The fields of KubeRay's operator `Configuration` file that only that file sets.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OperatorConfiguration {
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    /// Added to every Ray container where a variable of that name is absent.
    #[serde(default)]
    pub default_container_envs: Vec<k8s_openapi::api::core::v1::EnvVar>,
    /// Added to every Ray Pod where the key is absent.
    #[serde(default)]
    pub default_pod_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub default_pod_annotations: BTreeMap<String, String>,
    /// Appended to every head / worker Pod.
    #[serde(default)]
    pub head_sidecar_containers: Vec<k8s_openapi::api::core::v1::Container>,
    #[serde(default)]
    pub worker_sidecar_containers: Vec<k8s_openapi::api::core::v1::Container>,
}

impl OperatorConfiguration {
    /// Parses the file's YAML; unknown fields are refused with their name (set those with
    /// flags), and so is a kind other than `Configuration`.
    pub fn parse(yaml: &str) -> Result<Self, String> {
        let parsed: OperatorConfiguration = serde_yaml::from_str(yaml).map_err(|e| {
            format!("{e} (raypipe reads defaultContainerEnvs, defaultPodLabels, defaultPodAnnotations, headSidecarContainers and workerSidecarContainers from this file; set everything else with flags)")
        })?;
        if let Some(kind) = parsed.kind.as_deref()
            && kind != "Configuration"
        {
            return Err(format!("kind {kind:?}: expected Configuration"));
        }
        Ok(parsed)
    }

    /// Applies these defaults to the RayCluster controller's Pod builder.
    pub fn apply_to(&self, build: &mut crate::controllers::raycluster::builders::BuildOptions) {
        build.default_container_envs = self.default_container_envs.clone();
        build.default_pod_labels = self.default_pod_labels.clone();
        build.default_pod_annotations = self.default_pod_annotations.clone();
        build.head_sidecar_containers = self.head_sidecar_containers.clone();
        build.worker_sidecar_containers = self.worker_sidecar_containers.clone();
    }
}

pub(super) fn operator_configuration_file(path: &str) -> Result<OperatorConfiguration, String> {
    // A configuration is a few KiB; refuse anything that is not.
    const MAX_CONFIGURATION_BYTES: u64 = 1 << 20;
    let size = std::fs::metadata(path)
        .map_err(|e| format!("reading {path}: {e}"))?
        .len();
    if size > MAX_CONFIGURATION_BYTES {
        return Err(format!(
            "{path} has {size} bytes; a configuration has at most 1 MiB"
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
    OperatorConfiguration::parse(&text).map_err(|e| format!("{path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_kuberay_configuration_file_sets_the_pod_defaults_and_nothing_else() {
        let parsed = OperatorConfiguration::parse(
            "apiVersion: config.ray.io/v1alpha1\nkind: Configuration\n\
             defaultContainerEnvs:\n- name: HTTPS_PROXY\n  value: http://proxy:3128\n\
             defaultPodLabels: {team: ml}\n\
             headSidecarContainers:\n- name: fluentbit\n  image: fluent/fluent-bit:3\n",
        )
        .expect("a valid configuration");
        assert_eq!(parsed.default_container_envs[0].name, "HTTPS_PROXY");
        assert_eq!(parsed.default_pod_labels["team"], "ml");
        let mut build = crate::controllers::raycluster::builders::BuildOptions::default();
        parsed.apply_to(&mut build);
        assert_eq!(build.head_sidecar_containers[0].name, "fluentbit");
        assert!(build.worker_sidecar_containers.is_empty());

        let unknown = OperatorConfiguration::parse("metricsAddr: :8080\n").unwrap_err();
        assert!(
            unknown.contains("metricsAddr") && unknown.contains("flags"),
            "{unknown}"
        );
        let kind = OperatorConfiguration::parse("kind: RayCluster\n").unwrap_err();
        assert!(kind.contains("expected Configuration"), "{kind}");
        let missing = operator_configuration_file("/nonexistent/raypipe.yaml").unwrap_err();
        assert!(missing.contains("/nonexistent/raypipe.yaml"), "{missing}");
    }
}
