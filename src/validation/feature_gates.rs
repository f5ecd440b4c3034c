//! KubeRay's feature gates: the names, KubeRay's defaults, the `Name=true,Other=false` syntax
//! and [`SUPPORT`], the one table of what raypipe does with each gate and where it is read.
//! They live here, below `config`, because the validation rules consult them; `config` parses
//! the flag into this type (refusing a setting raypipe does not implement, naming the gate) and
//! hands it to the webhook and the controllers, which read the same gates through the same
//! rules (`tests::webhook_and_controllers_refuse_the_same_gated_objects` keeps them agreeing).

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

/// What raypipe does with a gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Both settings behave as in KubeRay; `read_by` says where the gate is read.
    Both { read_by: &'static str },
    /// Only KubeRay's default is implemented; the other setting is refused at start-up with
    /// `why`.
    DefaultOnly { why: &'static str },
}

/// Every gate, what raypipe does with it and where: the one table (docs quote it).
pub const SUPPORT: [(&str, Support); 11] = [
    (
        gates::RAY_CLUSTER_STATUS_CONDITIONS,
        Support::DefaultOnly {
            why: "raypipe always keeps the RayCluster conditions; its suspension, readiness and \
                  RayService checks are built on them",
        },
    ),
    (
        gates::RAY_JOB_DELETION_POLICY,
        Support::Both {
            read_by: "validation (RayJob deletionStrategy, worker group suspend; webhook and \
                      controllers) and the RayJob controller's cleanup rules",
        },
    ),
    (
        gates::RAY_MULTI_HOST_INDEXING,
        Support::DefaultOnly {
            why: "raypipe always creates and deletes multi-host workers as whole, indexed \
                  replicas (ray.io/worker-group-replica-name, ray.io/replica-host-index)",
        },
    ),
    (
        gates::RAY_SERVICE_INCREMENTAL_UPGRADE,
        Support::Both {
            read_by: "validation (RayService upgradeStrategy) and the RayService controller",
        },
    ),
    (
        gates::RAY_CRON_JOB,
        Support::Both {
            read_by: "config (the RayCronJob controller runs only with it, as in KubeRay) and \
                      validation (the webhook refuses RayCronJobs while it is off)",
        },
    ),
    (
        gates::SIDECAR_SUBMITTER_RESTART,
        Support::DefaultOnly {
            why: "raypipe's SidecarMode submitter is not restarted: a failed submitter fails \
                  the RayJob (per-container restart rules need Kubernetes 1.35)",
        },
    ),
    (
        gates::RAY_CLUSTER_NETWORK_POLICY,
        Support::Both {
            read_by: "validation (RayCluster networkPolicy) and the RayCluster controller",
        },
    ),
    (
        gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE,
        Support::Both {
            read_by: "validation (gcsFaultToleranceOptions.backend rocksdb) and the RayCluster \
                      controller",
        },
    ),
    (
        gates::RAY_CLUSTER_MTLS,
        Support::Both {
            read_by: "validation (RayCluster tlsOptions) and the RayCluster controller",
        },
    ),
    (
        gates::RAY_CLUSTER_HISTORY_SERVER,
        Support::Both {
            read_by: "validation (RayCluster historyServerOptions) and the RayCluster \
                      controller's Pods (the collector sidecar and Ray's event export)",
        },
    ),
    (
        gates::KUBERNETES_WAS,
        Support::DefaultOnly {
            why: "raypipe has no Kubernetes workload-aware scheduling integration",
        },
    ),
];

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

    /// Refuses every gate set to a value raypipe does not implement (see [`SUPPORT`]), naming
    /// the gate and why.
    pub fn check_supported(&self) -> Result<(), String> {
        let refused: Vec<String> = SUPPORT
            .iter()
            .filter_map(|(gate, support)| match support {
                Support::DefaultOnly { why } if self.enabled(gate) != default_of(gate) => {
                    Some(format!(
                        "feature gate {gate}={} is not supported: {why}",
                        self.enabled(gate)
                    ))
                }
                _ => None,
            })
            .collect();
        if refused.is_empty() {
            Ok(())
        } else {
            Err(refused.join("; "))
        }
    }

    /// Sets one gate (tests, embedding).
    pub fn with(mut self, gate: &'static str, enabled: bool) -> FeatureGates {
        self.enabled.insert(gate, enabled);
        self
    }
}

/// KubeRay's default of `gate` (false for a name that is not a gate).
fn default_of(gate: &str) -> bool {
    gates::DEFAULTS
        .iter()
        .any(|(name, default)| *name == gate && *default)
}

/// The operator's `--feature-gates`: parsed, then checked against [`SUPPORT`], so a setting
/// raypipe does not implement stops the start with a message naming the gate.
impl std::str::FromStr for FeatureGates {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let gates = FeatureGates::parse(s)?;
        gates.check_supported()?;
        Ok(gates)
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

/// The webhook (every problem) and the controllers (KubeRay's first problem; the RayCronJob
/// controller's absence) refuse the same objects under the same gates, for every gate and every
/// setting raypipe accepts.
#[cfg(test)]
mod agreement {
    use serde_json::{Value, json};

    use super::*;
    use crate::api::RayCluster;
    use crate::api::raycronjob::RayCronJob;
    use crate::api::rayjob::RayJob;
    use crate::api::rayservice::RayService;
    use crate::validation::validated::{for_controller, for_webhook};

    fn cluster_spec(extra: Value) -> Value {
        let mut spec = json!({
            "rayVersion": "2.52.0",
            "headGroupSpec": {"rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}},
            "workerGroupSpecs": [{"groupName": "g", "replicas": 1, "minReplicas": 0, "maxReplicas": 3,
                "rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.52.0"}]}}}]
        });
        crate::api::test_support::json_merge(&mut spec, extra);
        spec
    }

    /// RayCluster specs that use one gated field each, with the gate they need.
    fn gated_cluster_specs() -> Vec<(&'static str, Value)> {
        vec![
            (
                gates::RAY_CLUSTER_NETWORK_POLICY,
                cluster_spec(json!({"networkPolicy": {"mode": "DenyAll"}})),
            ),
            (
                gates::RAY_CLUSTER_MTLS,
                cluster_spec(json!({"tlsOptions": {"enabled": true}})),
            ),
            (
                gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE,
                cluster_spec(json!({"gcsFaultToleranceOptions": {"backend": "rocksdb"}})),
            ),
            (
                gates::RAY_CLUSTER_HISTORY_SERVER,
                cluster_spec(json!({"historyServerOptions": {
                    "collectorOptions": {"image": "collector:1"}}})),
            ),
            (gates::RAY_JOB_DELETION_POLICY, {
                let mut spec = cluster_spec(json!({}));
                spec["workerGroupSpecs"][0]["suspend"] = json!(true);
                spec
            }),
        ]
    }

    /// One verdict per judge: `(webhook refuses, controller refuses, webhook messages)`.
    struct Verdict {
        webhook: Vec<String>,
        controller: Option<String>,
    }

    fn cluster(spec: &Value) -> RayCluster {
        serde_json::from_value(json!({"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "c", "namespace": "ns"}, "spec": spec}))
        .expect("a RayCluster")
    }

    fn job(spec: Value) -> RayJob {
        serde_json::from_value(json!({"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": "j", "namespace": "ns"}, "spec": spec}))
        .expect("a RayJob")
    }

    fn service(spec: Value) -> RayService {
        serde_json::from_value(json!({"apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "s", "namespace": "ns"}, "spec": spec}))
        .expect("a RayService")
    }

    fn cron(job_spec: Value) -> RayCronJob {
        serde_json::from_value(json!({"apiVersion": "ray.io/v1", "kind": "RayCronJob",
            "metadata": {"name": "cj", "namespace": "ns"},
            "spec": {"schedule": "*/5 * * * *", "jobTemplate": job_spec}}))
        .expect("a RayCronJob")
    }

    fn messages(problems: Vec<crate::validation::problem::Problem>) -> Vec<String> {
        problems.into_iter().map(|p| p.message).collect()
    }

    /// Every object kind that carries `spec` (a RayCluster spec), judged by both sides.
    fn verdicts(spec: &Value, feature_gates: &FeatureGates) -> Vec<(&'static str, Verdict)> {
        let c = cluster(spec);
        let job_spec = json!({"entrypoint": "python -c 'print(1)'", "rayClusterSpec": spec});
        let j = job(job_spec.clone());
        let mut service_spec = json!({"rayClusterConfig": spec});
        service_spec["rayClusterConfig"]["enableInTreeAutoscaling"] = json!(true);
        let s = service(service_spec);
        let cj = cron(job_spec);
        let service_problems = messages(for_webhook(&s, feature_gates));
        vec![
            (
                "RayCluster",
                Verdict {
                    webhook: messages(for_webhook(&c, feature_gates)),
                    controller: for_controller(&c, feature_gates).err().map(|p| p.message),
                },
            ),
            (
                "RayJob",
                Verdict {
                    webhook: messages(for_webhook(&j, feature_gates)),
                    controller: for_controller(&j, feature_gates).err().map(|p| p.message),
                },
            ),
            (
                "RayService",
                Verdict {
                    // The RayService controller runs the admission rules themselves.
                    controller: service_problems.first().cloned(),
                    webhook: service_problems,
                },
            ),
            (
                "RayCronJob",
                Verdict {
                    webhook: messages(for_webhook(&cj, feature_gates)),
                    controller: if feature_gates.enabled(gates::RAY_CRON_JOB) {
                        for_controller(&cj, feature_gates).err().map(|p| p.message)
                    } else {
                        Some("no RayCronJob controller runs".to_owned())
                    },
                },
            ),
        ]
    }

    /// Every gate setting raypipe starts with: each gate at each value it supports.
    fn accepted_settings() -> Vec<(&'static str, bool, FeatureGates)> {
        let mut settings = Vec::new();
        for (gate, support) in SUPPORT {
            let values: &[bool] = match support {
                Support::Both { .. } => &[false, true],
                Support::DefaultOnly { .. } => {
                    if default_of(gate) {
                        &[true]
                    } else {
                        &[false]
                    }
                }
            };
            for value in values {
                let gates = FeatureGates::default()
                    .with(gate, *value)
                    .with(gates::RAY_CRON_JOB, true);
                let gates = if gate == gates::RAY_CRON_JOB {
                    gates.with(gate, *value)
                } else {
                    gates
                };
                assert!(gates.check_supported().is_ok(), "{gate}={value}");
                settings.push((gate, *value, gates));
            }
        }
        settings
    }

    #[test]
    fn every_gate_is_in_the_table_once() {
        let table: Vec<&str> = SUPPORT.iter().map(|(g, _)| *g).collect();
        let known: Vec<&str> = gates::DEFAULTS.iter().map(|(g, _)| *g).collect();
        assert_eq!(table, known);
    }

    #[test]
    fn webhook_and_controllers_refuse_the_same_gated_objects() {
        for (gate, value, feature_gates) in accepted_settings() {
            let mut specs = gated_cluster_specs();
            specs.push(("none", cluster_spec(json!({}))));
            for (needs, spec) in &specs {
                for (kind, verdict) in verdicts(spec, &feature_gates) {
                    let context = format!(
                        "{kind} using {needs} with {gate}={value}: webhook {:?}, controller {:?}",
                        verdict.webhook, verdict.controller
                    );
                    assert_eq!(
                        verdict.webhook.is_empty(),
                        verdict.controller.is_none(),
                        "{context}"
                    );
                    // Off, the gate is named by both (RayJobDeletionPolicy guards more than one
                    // field; RayCronJob's controller is simply absent).
                    if *needs != "none" && !feature_gates.enabled(needs) {
                        assert!(
                            verdict.webhook.iter().any(|m| m.contains(needs)),
                            "{context}"
                        );
                        if kind != "RayCronJob" || feature_gates.enabled(gates::RAY_CRON_JOB) {
                            let controller = verdict.controller.clone().unwrap_or_default();
                            assert!(controller.contains(needs), "{context}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn job_level_gates_agree_too() {
        let deletion = json!({"entrypoint": "python -c 'print(1)'", "rayClusterSpec": cluster_spec(json!({})),
            "deletionStrategy": {"onSuccess": {"policy": "DeleteCluster"},
                                 "onFailure": {"policy": "DeleteCluster"}}});
        let incremental = json!({"rayClusterConfig": cluster_spec(json!({"enableInTreeAutoscaling": true})),
            "upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade",
                "clusterUpgradeOptions": {"maxSurgePercent": 50, "stepSizePercent": 10,
                    "intervalSeconds": 5, "gatewayClassName": "istio"}}});
        for (gate, value, feature_gates) in accepted_settings() {
            let j = job(deletion.clone());
            let webhook = messages(for_webhook(&j, &feature_gates));
            let controller = for_controller(&j, &feature_gates).err();
            assert_eq!(
                webhook.is_empty(),
                controller.is_none(),
                "deletionStrategy with {gate}={value}: {webhook:?} / {controller:?}"
            );
            assert_eq!(
                webhook.is_empty(),
                feature_gates.enabled(gates::RAY_JOB_DELETION_POLICY),
                "{webhook:?}"
            );
            let problems = for_webhook(&service(incremental.clone()), &feature_gates);
            assert_eq!(
                problems.is_empty(),
                feature_gates.enabled(gates::RAY_SERVICE_INCREMENTAL_UPGRADE),
                "incremental upgrade with {gate}={value}: {problems:?}"
            );
        }
    }

    #[test]
    fn unsupported_settings_stop_the_start_naming_the_gate() {
        for (gate, support) in SUPPORT {
            let flipped = format!("{gate}={}", !default_of(gate));
            let parsed = flipped.parse::<FeatureGates>();
            match support {
                Support::Both { .. } => assert!(parsed.is_ok(), "{flipped}: {parsed:?}"),
                Support::DefaultOnly { .. } => {
                    let message = parsed.expect_err(&flipped);
                    assert!(message.contains(&flipped), "{message}");
                }
            }
            // The syntax-only parse (tests, embedding) still takes it.
            assert!(FeatureGates::parse(&flipped).is_ok());
        }
        assert!("".parse::<FeatureGates>().is_ok());
    }
}
