//! KubeRay's feature gates: the names, KubeRay's defaults and the `Name=true,Other=false`
//! syntax. They live here, below `config`, because the validation rules consult them; `config`
//! parses the flag into this type and hands it to the webhook and the controllers.

use std::collections::BTreeMap;

/// KubeRay's feature gates (names and defaults as in KubeRay), consulted by the validation
/// rules and the controllers.
pub mod gates {
    pub const RAY_CLUSTER_STATUS_CONDITIONS: &str = "RayClusterStatusConditions";
    pub const RAY_JOB_DELETION_POLICY: &str = "RayJobDeletionPolicy";
    pub const RAY_MULTI_HOST_INDEXING: &str = "RayMultiHostIndexing";
    pub const RAY_SERVICE_INCREMENTAL_UPGRADE: &str = "RayServiceIncrementalUpgrade";
    pub const RAY_CRON_JOB: &str = "RayCronJob";
    pub const SIDECAR_SUBMITTER_RESTART: &str = "SidecarSubmitterRestart";
    pub const RAY_CLUSTER_NETWORK_POLICY: &str = "RayClusterNetworkPolicy";
    pub const GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE: &str = "GCSFaultToleranceEmbeddedStorage";
    pub const RAY_CLUSTER_MTLS: &str = "RayClusterMTLS";
    pub const RAY_CLUSTER_HISTORY_SERVER: &str = "RayClusterHistoryServer";
    pub const KUBERNETES_WAS: &str = "KubernetesWAS";

    /// Every gate with its default.
    pub const DEFAULTS: [(&str, bool); 11] = [
        (RAY_CLUSTER_STATUS_CONDITIONS, true),
        (RAY_JOB_DELETION_POLICY, true),
        (RAY_MULTI_HOST_INDEXING, true),
        (RAY_SERVICE_INCREMENTAL_UPGRADE, true),
        (RAY_CRON_JOB, false),
        (SIDECAR_SUBMITTER_RESTART, false),
        (RAY_CLUSTER_NETWORK_POLICY, false),
        (GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE, false),
        (RAY_CLUSTER_MTLS, false),
        (RAY_CLUSTER_HISTORY_SERVER, false),
        (KUBERNETES_WAS, false),
    ];
}

/// Which optional features are on: `Name=true,Other=false` (unknown names are refused, so a
/// typo never silently leaves a feature off).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    enabled: BTreeMap<&'static str, bool>,
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            enabled: gates::DEFAULTS.into_iter().collect(),
        }
    }
}

impl FeatureGates {
    pub fn enabled(&self, gate: &str) -> bool {
        self.enabled.get(gate).copied().unwrap_or(false)
    }

    /// The defaults with `text`'s settings applied.
    pub fn parse(text: &str) -> Result<FeatureGates, String> {
        let mut gates = FeatureGates::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?}: expected Name=true or Name=false"))?;
            let value: bool = value
                .trim()
                .parse()
                .map_err(|_| format!("{item:?}: the value must be true or false"))?;
            let known = gates::DEFAULTS
                .iter()
                .map(|(n, _)| *n)
                .find(|n| *n == name.trim())
                .ok_or_else(|| {
                    let names: Vec<&str> = gates::DEFAULTS.iter().map(|(n, _)| *n).collect();
                    format!("unknown feature gate {name:?}; known: {}", names.join(", "))
                })?;
            gates.enabled.insert(known, value);
        }
        Ok(gates)
    }

    /// Sets one gate (tests, embedding).
    pub fn with(mut self, gate: &'static str, enabled: bool) -> FeatureGates {
        self.enabled.insert(gate, enabled);
        self
    }
}

impl std::str::FromStr for FeatureGates {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FeatureGates::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_gates_start_at_kuberays_defaults_and_refuse_unknown_names() {
        let defaults = FeatureGates::default();
        assert!(defaults.enabled(gates::RAY_JOB_DELETION_POLICY));
        assert!(!defaults.enabled(gates::RAY_CLUSTER_NETWORK_POLICY));
        let parsed =
            FeatureGates::parse("RayClusterNetworkPolicy=true, RayJobDeletionPolicy=false")
                .expect("parses");
        assert!(parsed.enabled(gates::RAY_CLUSTER_NETWORK_POLICY));
        assert!(!parsed.enabled(gates::RAY_JOB_DELETION_POLICY));
        assert_eq!(FeatureGates::parse("").expect("empty is fine"), defaults);
        assert!(FeatureGates::parse("RayClusterNetworkPolcy=true").is_err());
        assert!(FeatureGates::parse("RayCronJob=yes").is_err());
    }
}
