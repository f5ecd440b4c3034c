//! KubeRay's rules for a RayCluster spec, one book for its webhook and its controller, also
//! applied to the cluster spec inside a RayJob, RayService and ServePipeline. The rules run in
//! the order KubeRay's controller checks them; each carries the webhook's words (led by the
//! field path) and KubeRay's, and a rule only one of them applies is tagged so
//! ([`Problems::judged`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use kube::ResourceExt;

use super::feature_gates::{FeatureGates, gates};
use super::k8s_names::{check_name_kuberay, is_dns1123_label, is_label_key, is_label_value};
use super::pod::{
    containers, env_value, has_env, ray_container, restart_policy_never_or_unset, truthy,
    version_at_least,
};
use super::problem::{Problem, Problems};
use super::validated::{RuleBook, Validated};
use crate::api::RayCluster;
use crate::api::conditions;
use crate::api::raycluster::{
    AuthMode, AutoscalerVersion, GcsFaultToleranceBackend, NetworkPolicyMode, RayClusterSpec,
    condition_types,
};
use crate::kuberay::keys::annotations::{
    EXTERNAL_STORAGE_NAMESPACE as ANNOTATION_EXTERNAL_STORAGE_NAMESPACE,
    FT_ENABLED as ANNOTATION_FT_ENABLED,
};
use crate::kuberay::keys::collector;
use crate::kuberay::keys::env::{
    KUBERAY_GEN_AUTOSCALER_START_CMD as ENV_GEN_AUTOSCALER_START_CMD,
    RAY_ENABLE_AUTOSCALER_V2 as ENV_AUTOSCALER_V2, RAY_REDIS_ADDRESS as ENV_REDIS_ADDRESS,
    REDIS_PASSWORD as ENV_REDIS_PASSWORD, REDIS_USERNAME as ENV_REDIS_USERNAME,
};
use crate::kuberay::keys::env::{
    RAY_GCS_STORAGE, RAY_GCS_STORAGE_PATH, RAY_TLS_CA_CERT, RAY_TLS_SERVER_CERT,
    RAY_TLS_SERVER_KEY, RAY_USE_TLS,
};
use crate::kuberay::keys::labels::ORIGINATED_FROM_CRD as LABEL_ORIGINATED_FROM_CRD;
use crate::kuberay::keys::reasons;
use crate::kuberay::keys::volumes;
use crate::kuberay::spec::{ray_version_at_least, tls_enabled};

/// Longest RayCluster name KubeRay accepts (it derives child names by appending suffixes).
pub const MAX_RAYCLUSTER_NAME: usize = 53;
const TLS_ENV_VARS: [&str; 4] = [
    RAY_USE_TLS,
    RAY_TLS_SERVER_CERT,
    RAY_TLS_SERVER_KEY,
    RAY_TLS_CA_CERT,
];
/// `ray start` options that `resources` replaces.
const RESOURCE_START_PARAMS: [&str; 4] = ["num-cpus", "num-gpus", "memory", "resources"];

/// Where a cluster spec sits and who creates the cluster from it.
pub struct ClusterContext<'a> {
    /// Field path of the spec, e.g. `spec` or `spec.rayClusterConfig`.
    pub path: &'a str,
    /// `Some("RayJob")` / `Some("RayService")` when the cluster is made by that kind.
    pub created_by: Option<&'a str>,
    /// Annotations that reach the cluster (the object's own).
    pub annotations: &'a BTreeMap<String, String>,
}

/// KubeRay's controller reads `"1"` or `"true"` here, exactly.
fn enables_autoscaler_v2(container: Option<&Container>) -> bool {
    env_value(container, ENV_AUTOSCALER_V2).is_some_and(|v| v == "1" || v == "true")
}

fn needs_gate(field: &str, gate: &str) -> String {
    format!("{field} needs the {gate} feature gate")
}

/// An alpha field of the spec at `p`: both judges refuse it while `gate` is off.
fn require_gate(
    p: &str,
    field: &str,
    gate: &str,
    feature_gates: &FeatureGates,
    problems: &mut Problems,
) {
    if !feature_gates.enabled(gate) {
        problems.both(
            needs_gate(&format!("{p}.{field}"), gate),
            needs_gate(field, gate),
        );
    }
}

/// KubeRay's controller treats an empty value as unset.
fn set_non_empty(map: Option<&BTreeMap<String, String>>, key: &str) -> bool {
    map.and_then(|m| m.get(key)).is_some_and(|v| !v.is_empty())
}

/// KubeRay's rules for a RayCluster spec.
pub fn raycluster_spec(
    spec: &RayClusterSpec,
    context: &ClusterContext<'_>,
    feature_gates: &FeatureGates,
    problems: &mut Problems,
) {
    let p = context.path;
    // KubeRay's RayJob controller checks an embedded spec as a cluster of its own, without the
    // RayJob's labels or annotations; only the RayCluster's own spec sits at `spec`.
    let own = p == "spec";
    let no_annotations = BTreeMap::new();
    let kuberay_annotations = if own {
        context.annotations
    } else {
        &no_annotations
    };
    let head = &spec.head_group_spec;
    let head_container = ray_container(&head.template);
    let workers = spec.worker_group_specs.as_deref().unwrap_or_default();
    let autoscaling = spec.enable_in_tree_autoscaling.unwrap_or(false);
    let autoscaler = spec.autoscaler_options.as_ref();
    let version_set = autoscaler.and_then(|a| a.version);
    let v2_env = env_value(head_container, ENV_AUTOSCALER_V2);
    let autoscaler_v2 =
        autoscaling && (version_set == Some(AutoscalerVersion::V2) || v2_env.is_some_and(truthy));
    // The controller's view: the version field alone, or the head's variable.
    let kuberay_v2 = version_set == Some(AutoscalerVersion::V2);
    let ray_version = spec.ray_version.as_deref();
    let kuberay_version = ray_version.unwrap_or_default();

    if containers(&head.template).is_empty() {
        problems.both(
            format!(
                "{p}.headGroupSpec.template.spec.containers: the head Pod needs at least one container"
            ),
            "headGroupSpec.template has no container",
        );
    }
    check_group(
        &format!("{p}.headGroupSpec"),
        "head",
        head.resources.as_ref(),
        head.labels.as_ref(),
        head.ray_start_params.as_ref(),
        problems,
    );

    let mut seen = BTreeSet::new();
    for (i, group) in workers.iter().enumerate() {
        let gp = format!("{p}.workerGroupSpecs[{i}]");
        let name = &group.group_name;
        if !seen.insert(name.as_str()) {
            problems.both(
                format!(
                    "{gp}.groupName: duplicate worker group name {name:?}; group names must be unique"
                ),
                format!("worker group name {name:?} is used more than once"),
            );
        }
        if containers(&group.template).is_empty() {
            problems.both(
                format!(
                    "{gp}.template.spec.containers: worker group {name:?} needs at least one container"
                ),
                format!("worker group {name} has no container"),
            );
        }
        // The API server defaults these (0 and 2147483647); KubeRay's controller still refuses
        // them unset when it must scale by them.
        if !autoscaling && (group.min_replicas.is_none() || group.max_replicas.is_none()) {
            problems.controller_only(
                &gp,
                format!(
                    "worker group {name} must set minReplicas and maxReplicas when autoscaling is off"
                ),
            );
        }
        let min = group.min_replicas.unwrap_or(0);
        let max = group.max_replicas.unwrap_or(i32::MAX);
        let mut negative = Vec::new();
        if !autoscaling && min < 0 {
            negative.push(format!("{gp}.minReplicas must not be negative"));
        }
        if !autoscaling && max < 0 {
            negative.push(format!("{gp}.maxReplicas must not be negative"));
        }
        problems.judged_all(
            &gp,
            negative,
            (min < 0 || group.max_replicas.is_some_and(|m| m < 0))
                .then(|| format!("worker group {name} has a negative minReplicas or maxReplicas")),
        );
        problems.judged(
            &gp,
            (!autoscaling && min > max)
                .then(|| format!("{gp}: minReplicas ({min}) must not exceed maxReplicas ({max})")),
            match (group.min_replicas, group.max_replicas) {
                (Some(min), Some(max)) if min > max => Some(format!(
                    "worker group {name} has minReplicas {min} greater than maxReplicas {max}"
                )),
                _ => None,
            },
        );
        check_group(
            &gp,
            name,
            group.resources.as_ref(),
            group.labels.as_ref(),
            group.ray_start_params.as_ref(),
            problems,
        );
        if let Some(idle) = group.idle_timeout_seconds {
            if idle < 0 {
                problems.both(
                    format!("{gp}.idleTimeoutSeconds must not be negative"),
                    format!("worker group {name}: idleTimeoutSeconds must not be negative"),
                );
            }
            problems.judged(
                &gp,
                (!autoscaler_v2).then(|| format!(
                    "{gp}.idleTimeoutSeconds needs autoscaler v2 (enableInTreeAutoscaling with autoscalerOptions.version: v2)"
                )),
                (!kuberay_v2 && !enables_autoscaler_v2(head_container)).then(|| format!(
                    "worker group {name}: idleTimeoutSeconds needs autoscaler v2 (autoscalerOptions.version: v2)"
                )),
            );
        }
        if let Some(priority) = group.priority.filter(|prio| *prio != 0) {
            let kuberay = if !ray_version_at_least(kuberay_version, (2, 56, 0)) {
                Some(format!(
                    "worker group {name}: priority needs rayVersion 2.56.0 or later"
                ))
            } else if !kuberay_v2 && !enables_autoscaler_v2(head_container) {
                Some(format!(
                    "worker group {name}: priority {priority} needs autoscaler v2"
                ))
            } else {
                None
            };
            problems.judged(
                &gp,
                (!(autoscaler_v2 && version_at_least(ray_version, (2, 56, 0)))).then(|| {
                    format!("{gp}.priority needs autoscaler v2 and rayVersion 2.56.0 or later")
                }),
                kuberay,
            );
        }
    }

    // GCS fault tolerance.
    let annotations = context.annotations;
    let ft_annotation = annotations.get(ANNOTATION_FT_ENABLED);
    let head_params = head.ray_start_params.as_ref();
    let ft_options = spec.gcs_fault_tolerance_options.as_ref();
    let annotation_field = format!("metadata.annotations[{ANNOTATION_FT_ENABLED}]");
    problems.judged(
        &annotation_field,
        (ft_options.is_some() && ft_annotation.is_some()).then(|| format!(
            "{annotation_field} cannot be used with {p}.gcsFaultToleranceOptions"
        )),
        (ft_options.is_some() && set_non_empty(Some(kuberay_annotations), ANNOTATION_FT_ENABLED))
            .then(|| format!(
                "both the {ANNOTATION_FT_ENABLED} annotation and gcsFaultToleranceOptions are set; use only gcsFaultToleranceOptions"
            )),
    );
    let kuberay_ft = ft_options.is_some()
        || kuberay_annotations
            .get(ANNOTATION_FT_ENABLED)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let redis_address = has_env(head_container, ENV_REDIS_ADDRESS);
    problems.judged(
        &format!("{p}.headGroupSpec"),
        (ft_options.is_none() && redis_address && !ft_annotation.is_some_and(|v| truthy(v)))
            .then(|| format!(
                "{p}.headGroupSpec: the head's {ENV_REDIS_ADDRESS} variable needs GCS fault tolerance (gcsFaultToleranceOptions)"
            )),
        (!kuberay_ft && redis_address).then(|| format!(
            "{ENV_REDIS_ADDRESS} is set on the head, which needs GCS fault tolerance: set gcsFaultToleranceOptions"
        )),
    );
    if let Some(ft) = ft_options {
        problems.judged(
            &format!("{p}.headGroupSpec.rayStartParams"),
            head_params.is_some_and(|m| m.contains_key("redis-password")).then(|| format!(
                "{p}.headGroupSpec.rayStartParams: redis-password cannot be used with gcsFaultToleranceOptions; use gcsFaultToleranceOptions.redisPassword"
            )),
            set_non_empty(head_params, "redis-password").then(|| {
                "rayStartParams 'redis-password' cannot be used with gcsFaultToleranceOptions; use redisPassword".to_owned()
            }),
        );
        for env in [ENV_REDIS_PASSWORD, ENV_REDIS_ADDRESS] {
            if has_env(head_container, env) {
                problems.both(
                    format!(
                        "{p}.headGroupSpec: the head's {env} variable cannot be used with gcsFaultToleranceOptions; use its fields"
                    ),
                    format!(
                        "the head cannot set {env} with gcsFaultToleranceOptions; use redisPassword / redisAddress"
                    ),
                );
            }
        }
        let namespace_field =
            format!("metadata.annotations[{ANNOTATION_EXTERNAL_STORAGE_NAMESPACE}]");
        problems.judged(
            &namespace_field,
            annotations.contains_key(ANNOTATION_EXTERNAL_STORAGE_NAMESPACE).then(|| format!(
                "{namespace_field} cannot be used with gcsFaultToleranceOptions; use gcsFaultToleranceOptions.externalStorageNamespace"
            )),
            set_non_empty(Some(kuberay_annotations), ANNOTATION_EXTERNAL_STORAGE_NAMESPACE).then(|| format!(
                "the {ANNOTATION_EXTERNAL_STORAGE_NAMESPACE} annotation cannot be used with gcsFaultToleranceOptions; use externalStorageNamespace"
            )),
        );
        match ft.backend.unwrap_or(GcsFaultToleranceBackend::Redis) {
            GcsFaultToleranceBackend::Rocksdb => {
                check_rocksdb(p, spec, feature_gates, problems);
            }
            GcsFaultToleranceBackend::Redis => {
                if ft.storage.is_some() {
                    problems.both(
                        format!(
                            "{p}.gcsFaultToleranceOptions.storage applies only to the rocksdb backend"
                        ),
                        "gcsFaultToleranceOptions.storage is only for the 'rocksdb' backend",
                    );
                }
            }
        }
    }
    problems.judged(
        &format!("{p}.headGroupSpec"),
        (head_params.is_some_and(|m| m.contains_key("redis-username"))
            || has_env(head_container, ENV_REDIS_USERNAME))
        .then(|| format!(
            "{p}.headGroupSpec: set the Redis user name with gcsFaultToleranceOptions.redisUsername, not rayStartParams or {ENV_REDIS_USERNAME}"
        )),
        (set_non_empty(head_params, "redis-username") || has_env(head_container, ENV_REDIS_USERNAME))
            .then(|| "a Redis username cannot come from rayStartParams or REDIS_USERNAME; use gcsFaultToleranceOptions.redisUsername".to_owned()),
    );

    // Autoscaler.
    problems.judged(
        &format!("{p}.headGroupSpec"),
        (!autoscaling && v2_env.is_some_and(truthy)).then(|| format!(
            "{p}.headGroupSpec: {ENV_AUTOSCALER_V2} is set but enableInTreeAutoscaling is off"
        )),
        (!autoscaling && enables_autoscaler_v2(head_container)).then(|| format!(
            "{ENV_AUTOSCALER_V2} cannot enable autoscaler v2 while enableInTreeAutoscaling is false"
        )),
    );
    let suspended: Vec<(usize, &str)> = workers
        .iter()
        .enumerate()
        .filter(|(_, g)| g.suspend == Some(true))
        .map(|(i, g)| (i, g.group_name.as_str()))
        .collect();
    if !feature_gates.enabled(gates::RAY_JOB_DELETION_POLICY) {
        problems.judged_all(
            &format!("{p}.workerGroupSpecs"),
            suspended
                .iter()
                .map(|(i, _)| {
                    format!(
                        "{p}.workerGroupSpecs[{i}].suspend needs the {} feature gate",
                        gates::RAY_JOB_DELETION_POLICY
                    )
                })
                .collect(),
            suspended.first().map(|(_, name)| {
                format!(
                    "worker group {name} can be suspended only with the {} feature gate",
                    gates::RAY_JOB_DELETION_POLICY
                )
            }),
        );
    }
    if autoscaling {
        problems.judged_all(
            &format!("{p}.workerGroupSpecs"),
            suspended
                .iter()
                .map(|(i, _)| {
                    format!(
                        "{p}.workerGroupSpecs[{i}].suspend cannot be used with enableInTreeAutoscaling"
                    )
                })
                .collect(),
            suspended.first().map(|(_, name)| {
                format!("worker group {name} cannot be suspended while the autoscaler is on")
            }),
        );
        problems.judged(
            &format!("{p}.autoscalerOptions.version"),
            (version_set.is_some() && v2_env.is_some()).then(|| format!(
                "{p}.autoscalerOptions.version and the head's {ENV_AUTOSCALER_V2} variable cannot both be set; use autoscalerOptions.version"
            )),
            (version_set.is_some() && has_env(head_container, ENV_AUTOSCALER_V2)).then(|| format!(
                "both autoscalerOptions.version and the head env {ENV_AUTOSCALER_V2} are set; use only the former"
            )),
        );
    }
    // KubeRay's controller allows an empty policy; the webhook asks for Never or nothing.
    let kuberay_restart_ok = |template: &PodTemplateSpec| {
        template
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            .is_none_or(|policy| policy.is_empty() || policy == "Never")
    };
    let kuberay_restart_rule = kuberay_v2 && autoscaling;
    problems.judged(
        &format!("{p}.headGroupSpec.template.spec.restartPolicy"),
        (autoscaler_v2 && !restart_policy_never_or_unset(&head.template)).then(|| format!(
            "{p}.headGroupSpec.template.spec.restartPolicy must be Never or unset with autoscaler v2"
        )),
        (kuberay_restart_rule && !kuberay_restart_ok(&head.template)).then(|| {
            "autoscaler v2 needs the head's restartPolicy to be Never or unset".to_owned()
        }),
    );
    for (i, group) in workers.iter().enumerate() {
        let gp = format!("{p}.workerGroupSpecs[{i}]");
        problems.judged(
            &format!("{gp}.template.spec.restartPolicy"),
            (autoscaler_v2 && !restart_policy_never_or_unset(&group.template)).then(|| {
                format!(
                    "{gp}.template.spec.restartPolicy must be Never or unset with autoscaler v2"
                )
            }),
            (kuberay_restart_rule && !kuberay_restart_ok(&group.template)).then(|| {
                format!(
                    "autoscaler v2 needs the restartPolicy of worker group {} to be Never or unset",
                    group.group_name
                )
            }),
        );
    }
    if let Some(options) = autoscaler {
        if options.idle_timeout_seconds.is_some_and(|s| s < 0) {
            problems.both(
                format!("{p}.autoscalerOptions.idleTimeoutSeconds must not be negative"),
                "autoscalerOptions.idleTimeoutSeconds must not be negative",
            );
        }
        if options
            .env
            .iter()
            .flatten()
            .any(|e| e.name == ENV_GEN_AUTOSCALER_START_CMD)
        {
            problems.both(
                format!("{p}.autoscalerOptions.env must not set {ENV_GEN_AUTOSCALER_START_CMD}"),
                format!(
                    "autoscalerOptions.env must not set {ENV_GEN_AUTOSCALER_START_CMD}: the operator sets it"
                ),
            );
        }
    }

    // Alpha features behind gates.
    if spec.history_server_options.is_some() {
        check_history_server(p, spec, feature_gates, problems);
    }
    check_auth(p, spec, problems);
    if spec.network_policy.is_some() {
        check_network_policy(p, spec, feature_gates, problems);
    }
    if let Some(tls) = &spec.tls_options {
        require_gate(
            p,
            "tlsOptions",
            gates::RAY_CLUSTER_MTLS,
            feature_gates,
            problems,
        );
        check_tls(p, spec, tls.enabled == Some(true), problems);
    }

    let strategy_set = spec
        .upgrade_strategy
        .as_ref()
        .is_some_and(|u| u.type_.is_some());
    if strategy_set && let Some(creator) = context.created_by {
        problems.judged(
            &format!("{p}.upgradeStrategy"),
            Some(format!(
                "{p}.upgradeStrategy is not allowed on a RayCluster created by a {creator}; the {creator} decides how its cluster is replaced"
            )),
            own.then(|| format!(
                "upgradeStrategy cannot be set on a RayCluster created by a {creator}"
            )),
        );
    }
}

/// A group's Ray resources and labels (`group` is `head` or the worker group's name).
fn check_group(
    path: &str,
    group: &str,
    resources: Option<&BTreeMap<String, String>>,
    labels: Option<&BTreeMap<String, String>>,
    params: Option<&BTreeMap<String, String>>,
    problems: &mut Problems,
) {
    let has_resources = resources.is_some_and(|r| !r.is_empty());
    let twice: Vec<String> = RESOURCE_START_PARAMS
        .iter()
        .filter(|key| has_resources && params.is_some_and(|m| m.contains_key(**key)))
        .map(|key| {
            format!(
                "{path}: resources and rayStartParams {key:?} cannot both be set; use resources"
            )
        })
        .collect();
    let kuberay_twice = has_resources
        && RESOURCE_START_PARAMS
            .iter()
            .any(|key| set_non_empty(params, key));
    problems.judged_all(
        path,
        twice,
        kuberay_twice.then(|| {
            format!(
                "{group} group sets Ray resources both in rayStartParams and in resources; use only one"
            )
        }),
    );
    if params.is_some_and(|m| m.contains_key("labels")) {
        problems.both(
            format!("{path}.rayStartParams: \"labels\" is not allowed; use the group's labels field"),
            format!(
                "rayStartParams['labels'] is not supported for the {group} group; use the labels field"
            ),
        );
    }
    for (key, value) in labels.into_iter().flatten() {
        if !is_label_key(key) {
            problems.both(
                format!("{path}.labels: {key:?} is not a valid label key"),
                format!("{group} group: {key:?} is not a valid label key"),
            );
        }
        if !is_label_value(value) {
            problems.both(
                format!("{path}.labels[{key}]: {value:?} is not a valid label value"),
                format!("{group} group: {value:?} (label {key}) is not a valid label value"),
            );
        }
    }
}

fn check_auth(p: &str, spec: &RayClusterSpec, problems: &mut Problems) {
    let Some(auth) = &spec.auth_options else {
        return;
    };
    let field = format!("{p}.authOptions");
    let version = spec.ray_version.as_deref();
    let kuberay_version = version.unwrap_or_default();
    let token = auth.mode == Some(AuthMode::Token);
    let k8s = auth.enable_k8s_token_auth == Some(true);
    problems.judged(
        &field,
        (token && !version_at_least(version, (2, 52, 0)))
            .then(|| format!("{p}.authOptions.mode token needs rayVersion 2.52.0 or later")),
        (token && !ray_version_at_least(kuberay_version, (2, 52, 0))).then(|| {
            format!(
                "authOptions.mode 'token' needs rayVersion 2.52.0 or later (got {kuberay_version:?})"
            )
        }),
    );
    if k8s && !token {
        problems.both(
            format!("{p}.authOptions.enableK8sTokenAuth needs mode token"),
            "authOptions.enableK8sTokenAuth needs authOptions.mode 'token'",
        );
    }
    problems.judged(
        &field,
        (k8s && !version_at_least(version, (2, 55, 0))).then(|| {
            format!("{p}.authOptions.enableK8sTokenAuth needs rayVersion 2.55.0 or later")
        }),
        (k8s && token && !ray_version_at_least(kuberay_version, (2, 55, 0))).then(|| {
            format!(
                "authOptions.enableK8sTokenAuth needs rayVersion 2.55.0 or later (got {kuberay_version:?})"
            )
        }),
    );
    problems.judged(
        &field,
        (k8s && auth.secret_name.is_some())
            .then(|| format!("{p}.authOptions.secretName cannot be used with enableK8sTokenAuth")),
        (k8s && token && auth.secret_name.as_deref().is_some_and(|n| !n.is_empty()))
            .then(|| "authOptions.enableK8sTokenAuth excludes authOptions.secretName".to_owned()),
    );
}

fn has_rules<T>(rules: &Option<Vec<T>>) -> bool {
    rules.as_ref().is_some_and(|r| !r.is_empty())
}

fn check_network_policy(
    p: &str,
    spec: &RayClusterSpec,
    feature_gates: &FeatureGates,
    problems: &mut Problems,
) {
    let Some(policy) = &spec.network_policy else {
        return;
    };
    require_gate(
        p,
        "networkPolicy",
        gates::RAY_CLUSTER_NETWORK_POLICY,
        feature_gates,
        problems,
    );
    let mode = policy.mode.unwrap_or(NetworkPolicyMode::DenyAll);
    // Rules must restrict what the mode restricts.
    let check_mode = |problems: &mut Problems,
                      path: &str,
                      what: &str,
                      ingress: bool,
                      egress: bool| {
        if mode == NetworkPolicyMode::DenyAllEgress && ingress {
            problems.both(
                format!(
                    "{path}.ingressRules: mode DenyAllEgress leaves ingress open; ingress rules have no effect"
                ),
                format!(
                    "networkPolicy.{what}.ingressRules cannot be set with mode DenyAllEgress (ingress is not restricted)"
                ),
            );
        }
        if mode == NetworkPolicyMode::DenyAllIngress && egress {
            problems.both(
                format!(
                    "{path}.egressRules: mode DenyAllIngress leaves egress open; egress rules have no effect"
                ),
                format!(
                    "networkPolicy.{what}.egressRules cannot be set with mode DenyAllIngress (egress is not restricted)"
                ),
            );
        }
    };
    for (what, rules) in [("head", &policy.head), ("worker", &policy.worker)] {
        if let Some(rules) = rules {
            check_mode(
                problems,
                &format!("{p}.networkPolicy.{what}"),
                what,
                has_rules(&rules.ingress_rules),
                has_rules(&rules.egress_rules),
            );
        }
    }
    let workers = spec.worker_group_specs.as_deref().unwrap_or_default();
    // KubeRay's controller: every group name becomes part of a NetworkPolicy name.
    if let Some(bad) = workers
        .iter()
        .map(|g| g.group_name.as_str())
        .find(|g| !is_dns1123_label(g))
    {
        problems.controller_only(
            &format!("{p}.workerGroupSpecs"),
            format!(
                "worker group name {bad:?} must be a DNS-1123 label when networkPolicy is set (it is part of the NetworkPolicy name)"
            ),
        );
    }
    for (i, entry) in policy.worker_groups.iter().flatten().enumerate() {
        let path = format!("{p}.networkPolicy.workerGroups[{i}]");
        let name = &entry.group_name;
        if !is_dns1123_label(name) {
            problems.webhook_only(format!(
                "{path}.groupName: {name:?} is not a DNS-1123 label"
            ));
        }
        check_mode(
            problems,
            &path,
            &format!("workerGroups[{name:?}]"),
            has_rules(&entry.ingress_rules),
            has_rules(&entry.egress_rules),
        );
        if !workers.iter().any(|w| &w.group_name == name) {
            problems.both(
                format!("{path}.groupName: there is no worker group {name:?}"),
                format!(
                    "networkPolicy.workerGroups[{name:?}] does not match any group name in workerGroupSpecs"
                ),
            );
        }
    }
}

/// The operator's TLS variables and mount, where a container set them (webhook: every
/// container; KubeRay's controller: the first, with the exact mount path).
fn tls_findings(
    path: &str,
    location: &str,
    template: &PodTemplateSpec,
) -> [(Vec<String>, Option<String>); 2] {
    let mut env = Vec::new();
    let mut mounts = Vec::new();
    for container in containers(template) {
        for var in container.env.iter().flatten() {
            if TLS_ENV_VARS.contains(&var.name.as_str()) {
                env.push(format!(
                    "{path}: {} is set by the operator when tlsOptions.enabled is true",
                    var.name
                ));
            }
        }
        if container.volume_mounts.iter().flatten().any(|m| {
            m.name == volumes::RAY_TLS
                || m.mount_path.trim_end_matches('/') == volumes::RAY_TLS_PATH
        }) {
            mounts.push(format!(
                "{path}: the ray-tls volume and /etc/ray/tls are reserved when tlsOptions.enabled is true"
            ));
        }
    }
    let (kuberay_env, kuberay_mount) = match ray_container(template) {
        Some(first) => kuberay_tls(first, location),
        None => (None, None),
    };
    [(env, kuberay_env), (mounts, kuberay_mount)]
}

fn kuberay_tls(container: &Container, location: &str) -> (Option<String>, Option<String>) {
    let env = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .find(|n| TLS_ENV_VARS.contains(n))
        .map(|name| {
            format!(
                "cannot set {name} in {location} when tlsOptions is set: the operator manages TLS"
            )
        });
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.name == volumes::RAY_TLS || m.mount_path == volumes::RAY_TLS_PATH)
        .then(|| {
            format!(
                "cannot mount a volume named {:?} or at {} in {location} when tlsOptions is set: the operator manages TLS",
                volumes::RAY_TLS,
                volumes::RAY_TLS_PATH
            )
        });
    (env, mount)
}

fn check_tls(p: &str, spec: &RayClusterSpec, enabled: bool, problems: &mut Problems) {
    if !enabled || !tls_enabled(spec) {
        return;
    }
    let head = &spec.head_group_spec.template;
    let templates = std::iter::once((
        format!("{p}.headGroupSpec"),
        "the head Pod".to_owned(),
        head,
    ))
    .chain(
        spec.worker_group_specs
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, w)| {
                (
                    format!("{p}.workerGroupSpecs[{i}]"),
                    format!("worker group {:?}", w.group_name),
                    &w.template,
                )
            }),
    );
    for (path, location, template) in templates {
        for (webhook, kuberay) in tls_findings(&path, &location, template) {
            problems.judged_all(&path, webhook, kuberay);
        }
    }
    if let Some(options) = &spec.autoscaler_options {
        let autoscaler = Container {
            env: options.env.clone(),
            volume_mounts: options.volume_mounts.clone(),
            ..Default::default()
        };
        let (env, mount) = kuberay_tls(&autoscaler, "autoscalerOptions");
        for message in env.into_iter().chain(mount) {
            problems.controller_only(&format!("{p}.autoscalerOptions"), message);
        }
    }
}

/// The history-server collector, with KubeRay's rules and words: the gate, an image, none of
/// the variables the operator sets, a literal `STORAGE_BACKEND` and what that backend needs
/// (an unknown backend is the collector's to refuse), and no template container of the
/// collector's name.
fn check_history_server(
    p: &str,
    spec: &RayClusterSpec,
    feature_gates: &FeatureGates,
    problems: &mut Problems,
) {
    require_gate(
        p,
        "historyServerOptions",
        gates::RAY_CLUSTER_HISTORY_SERVER,
        feature_gates,
        problems,
    );
    let fp = format!("{p}.historyServerOptions.collectorOptions");
    let Some(options) = spec
        .history_server_options
        .as_ref()
        .and_then(|h| h.collector_options.as_ref())
    else {
        problems.both(
            format!("{fp} is required"),
            "historyServerOptions.collectorOptions must be set",
        );
        return;
    };
    if options.image.as_deref().is_none_or(str::is_empty) {
        problems.both(
            format!("{fp}.image is required"),
            "historyServerOptions.collectorOptions.image must be set",
        );
    }
    // KubeRay reads the variables by name, the last of a repeated name winning.
    let envs: BTreeMap<&str, &k8s_openapi::api::core::v1::EnvVar> = options
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e))
        .collect();
    for name in collector::MANAGED_ENV {
        if envs.contains_key(name) {
            problems.both(
                format!("{fp}.env must not set {name}: the operator sets it in the collector"),
                format!(
                    "historyServerOptions.collectorOptions.env must not contain {name}: it is \
                     managed by KubeRay and injected automatically into the collector container"
                ),
            );
        }
    }
    let literal = |name: &str| {
        envs.get(name)
            .and_then(|e| e.value.as_deref())
            .unwrap_or_default()
    };
    let has_value = |name: &str| {
        envs.get(name).is_some_and(|e| {
            e.value.as_deref().is_some_and(|v| !v.is_empty()) || e.value_from.is_some()
        })
    };
    let backend = literal(collector::STORAGE_BACKEND);
    let mut missing =
        |webhook: String, kuberay: String| problems.both(format!("{fp}.env {webhook}"), kuberay);
    if backend.is_empty() {
        missing(
            format!(
                "must set {} with a literal value",
                collector::STORAGE_BACKEND
            ),
            format!(
                "{} environment variable must be set with a literal string value in \
                 historyServerOptions.collectorOptions.env",
                collector::STORAGE_BACKEND
            ),
        );
    }
    let needs = |name: &str, backend: &str| {
        (
            format!("must set {name} for the {backend} backend"),
            format!(
                "{name} environment variable must be set when {} is {backend}",
                collector::STORAGE_BACKEND
            ),
        )
    };
    let required: &[&str] = match backend.to_uppercase().as_str() {
        "GCS" => &[collector::GCS_BUCKET],
        "S3" => &[collector::S3_REGION],
        "ALIYUNOSS" => &[
            collector::OSS_BUCKET,
            collector::OSS_ENDPOINT,
            collector::OSS_REGION,
        ],
        _ => &[],
    };
    // KubeRay names the backend as written in its messages.
    let backend_word = backend.to_uppercase();
    for name in required {
        if !has_value(name) {
            let (webhook, kuberay) = needs(name, &backend_word);
            missing(webhook, kuberay);
        }
    }
    if backend_word == "AZUREBLOB" {
        let mode = envs
            .get(collector::AZURE_STORAGE_AUTH_MODE)
            .and_then(|e| e.value.as_deref())
            .filter(|v| !v.is_empty())
            .map(|v| v.trim().to_lowercase())
            .unwrap_or_default();
        let (connection, url) = (
            collector::AZURE_STORAGE_CONNECTION_STRING,
            collector::AZURE_STORAGE_ACCOUNT_URL,
        );
        let with_mode = |name: &str| {
            (
                format!("must set {name} for the AZUREBLOB backend in auth mode {mode}"),
                format!(
                    "{name} environment variable must be set when {} is AZUREBLOB and {} is {mode}",
                    collector::STORAGE_BACKEND,
                    collector::AZURE_STORAGE_AUTH_MODE
                ),
            )
        };
        match mode.as_str() {
            "connection_string" if !has_value(connection) => {
                let (webhook, kuberay) = with_mode(connection);
                missing(webhook, kuberay);
            }
            "workload_identity" | "default" if !has_value(url) => {
                let (webhook, kuberay) = with_mode(url);
                missing(webhook, kuberay);
            }
            "connection_string" | "workload_identity" | "default" => {}
            _ if !has_value(connection) && !has_value(url) => missing(
                format!("must set {connection} or {url} for the AZUREBLOB backend"),
                format!(
                    "either {connection} or {url} environment variable must be set when {} is \
                     AZUREBLOB",
                    collector::STORAGE_BACKEND
                ),
            ),
            _ => {}
        }
    }
    let head = &spec.head_group_spec.template;
    if containers(head)
        .iter()
        .any(|c| c.name == collector::CONTAINER_NAME)
    {
        problems.both(
            format!(
                "{p}.headGroupSpec.template must not have a container named {}: the operator \
                 adds the collector",
                collector::CONTAINER_NAME
            ),
            format!(
                "head pod template must not define a container with name '{}' when history \
                 server collector options are enabled",
                collector::CONTAINER_NAME
            ),
        );
    }
    for (i, group) in spec.worker_group_specs.iter().flatten().enumerate() {
        if containers(&group.template)
            .iter()
            .any(|c| c.name == collector::CONTAINER_NAME)
        {
            problems.both(
                format!(
                    "{p}.workerGroupSpecs[{i}].template must not have a container named {}: the \
                     operator adds the collector",
                    collector::CONTAINER_NAME
                ),
                format!(
                    "worker group {} pod template must not define a container with name '{}' \
                     when history server collector options are enabled",
                    group.group_name,
                    collector::CONTAINER_NAME
                ),
            );
        }
    }
}

/// The RocksDB backend: no Redis fields; the store's volume, mount and variables are the
/// operator's; an existing claim excludes the fields that would make a new one.
fn check_rocksdb(
    p: &str,
    spec: &RayClusterSpec,
    feature_gates: &FeatureGates,
    problems: &mut Problems,
) {
    let Some(ft) = &spec.gcs_fault_tolerance_options else {
        return;
    };
    let fp = format!("{p}.gcsFaultToleranceOptions");
    if !feature_gates.enabled(gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE) {
        problems.both(
            format!(
                "{fp}.backend rocksdb needs the {} feature gate",
                gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE
            ),
            needs_gate(
                "gcsFaultToleranceOptions.backend 'rocksdb'",
                gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE,
            ),
        );
    }
    let kuberay_redis_field = [
        ("redisAddress", ft.redis_address.is_some()),
        ("redisUsername", ft.redis_username.is_some()),
        ("redisPassword", ft.redis_password.is_some()),
        (
            "externalStorageNamespace",
            ft.external_storage_namespace
                .as_deref()
                .is_some_and(|n| !n.is_empty()),
        ),
    ]
    .into_iter()
    .find(|(_, set)| *set);
    problems.judged(
        &fp,
        (ft.redis_address.is_some() || ft.redis_password.is_some() || ft.redis_username.is_some())
            .then(|| format!(
                "{fp}: redisAddress, redisUsername and redisPassword apply only to the redis backend"
            )),
        kuberay_redis_field.map(|(field, _)| {
            format!("cannot set gcsFaultToleranceOptions.{field} when backend is 'rocksdb'")
        }),
    );
    if let Some(storage) = &ft.storage {
        let claim = storage.claim_name.is_some();
        problems.judged(
            &format!("{fp}.storage"),
            (claim
                && (storage.size.is_some()
                    || storage.storage_class_name.is_some()
                    || storage.access_modes.is_some()))
            .then(|| format!(
                "{fp}.storage: claimName uses an existing claim and excludes size, storageClassName and accessModes"
            )),
            (storage.claim_name.as_deref().is_some_and(|c| !c.is_empty())
                && (storage.size.is_some()
                    || storage.storage_class_name.is_some()
                    || storage.access_modes.as_ref().is_some_and(|m| !m.is_empty())))
            .then(|| "gcsFaultToleranceOptions.storage.claimName excludes size, storageClassName and accessModes".to_owned()),
        );
    }
    let head = &spec.head_group_spec.template;
    let first = ray_container(head);
    let hp = format!("{p}.headGroupSpec");
    let storage_env: Vec<String> = containers(head)
        .iter()
        .filter(|c| {
            c.env
                .iter()
                .flatten()
                .any(|e| e.name.starts_with("RAY_gcs_storage"))
        })
        .map(|_| {
            format!(
                "{hp}: RAY_gcs_storage* variables are set by the operator with the rocksdb backend"
            )
        })
        .collect();
    let kuberay_env = first
        .and_then(|c| c.env.as_ref())
        .is_some_and(|envs| {
            envs.iter()
                .any(|e| e.name == RAY_GCS_STORAGE || e.name == RAY_GCS_STORAGE_PATH)
        })
        .then(|| format!(
            "cannot set {RAY_GCS_STORAGE} or {RAY_GCS_STORAGE_PATH} on the head with the embedded GCS backend: the operator sets them"
        ));
    problems.judged_all(&hp, storage_env, kuberay_env);
    let storage_mounts: Vec<String> = containers(head)
        .iter()
        .filter(|c| {
            c.volume_mounts.iter().flatten().any(|m| {
                m.name == volumes::GCS_STORAGE
                    || m.mount_path.trim_end_matches('/') == volumes::GCS_STORAGE_PATH
            })
        })
        .map(|_| {
            format!(
                "{hp}: the gcs-storage volume and /data/gcs are reserved for the rocksdb backend"
            )
        })
        .collect();
    let kuberay_mount = first
        .is_some_and(|c| {
            c.volume_mounts.iter().flatten().any(|m| {
                m.name == volumes::GCS_STORAGE || m.mount_path == volumes::GCS_STORAGE_PATH
            })
        })
        .then(|| format!(
            "cannot mount a volume named {:?} or at {} on the head with the embedded GCS backend: the operator mounts it",
            volumes::GCS_STORAGE,
            volumes::GCS_STORAGE_PATH
        ));
    problems.judged_all(&hp, storage_mounts, kuberay_mount);
    if head
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.name == volumes::GCS_STORAGE))
    {
        problems.both(
            format!("{hp}: the volume name gcs-storage is reserved for the rocksdb backend"),
            format!(
                "cannot add a volume named {:?} to the head with the embedded GCS backend: the operator adds it",
                volumes::GCS_STORAGE
            ),
        );
    }
}

/// Suspending and Suspended never hold together; if they do, the status was edited by hand
/// (KubeRay's controller only: the webhook does not judge a status).
fn check_status(cluster: &RayCluster, problems: &mut Problems) {
    let found = cluster
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let is_true =
        |t: &str| conditions::find(found, t).is_some_and(|c| c.status == conditions::TRUE);
    if is_true(condition_types::RAY_CLUSTER_SUSPENDING)
        && is_true(condition_types::RAY_CLUSTER_SUSPENDED)
    {
        problems.controller_problem(Problem::new(
            "status.conditions",
            reasons::INVALID_STATUS,
            "the RayClusterSuspending and RayClusterSuspended conditions are both True",
        ));
    }
}

impl RuleBook for RayCluster {
    /// Nothing in a RayCluster spec is parsed beyond its typed fields.
    type Values = ();
    const SPEC_REASON: &'static str = reasons::INVALID_SPEC;

    fn check(&self, feature_gates: &FeatureGates) -> (Problems, Option<()>) {
        let mut problems = Problems::new(reasons::INVALID_SPEC, reasons::INVALID_METADATA);
        check_name_kuberay(
            "RayCluster",
            &self.name_any(),
            MAX_RAYCLUSTER_NAME,
            " (lower-case letters, digits and '-', starting with a letter)",
            &mut problems,
        );
        let created_by = self
            .labels()
            .get(LABEL_ORIGINATED_FROM_CRD)
            .map(String::as_str)
            .filter(|c| *c == "RayJob" || *c == "RayService");
        raycluster_spec(
            &self.spec,
            &ClusterContext {
                path: "spec",
                created_by,
                annotations: self.annotations(),
            },
            feature_gates,
            &mut problems,
        );
        check_status(self, &mut problems);
        (problems, Some(()))
    }
}

/// A RayCluster: name, spec, then (for the controller) status.
pub fn validate(
    cluster: &RayCluster,
    feature_gates: &FeatureGates,
) -> Result<Validated<RayCluster>, Problems> {
    super::validated::validate(cluster, feature_gates)
}

/// KubeRay's controller judging the one book: its first problem, in its words.
#[cfg(test)]
mod controller_tests {
    use super::*;
    use serde_json::{Value, json};

    fn validate(cluster: &RayCluster, feature_gates: &FeatureGates) -> Result<(), Problem> {
        crate::validation::validated::for_controller(cluster, feature_gates).map(|_| ())
    }

    fn validate_default(cluster: &RayCluster) -> Result<(), Problem> {
        validate(cluster, &FeatureGates::default())
    }

    fn test_cluster(value: Value) -> RayCluster {
        serde_json::from_value(value).expect("a RayCluster")
    }

    fn base(spec_extra: Value) -> Value {
        let mut value = json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c"},
            "spec": {
                "rayVersion": "2.52.0",
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "h", "image": "i"}]}}},
                "workerGroupSpecs": [{"groupName": "g", "minReplicas": 0, "maxReplicas": 3,
                    "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}}]
            }
        });
        for (k, v) in spec_extra.as_object().cloned().unwrap_or_default() {
            value["spec"][k] = v;
        }
        value
    }

    fn message(value: Value) -> String {
        validate_default(&test_cluster(value))
            .expect_err("invalid")
            .message
    }

    #[test]
    fn the_samples_shapes_are_valid() {
        assert_eq!(validate_default(&test_cluster(base(json!({})))), Ok(()));
        let autoscaled = base(
            json!({"enableInTreeAutoscaling": true, "autoscalerOptions": {"version": "v2"},
            "authOptions": {"mode": "token", "secretName": "s"}}),
        );
        assert_eq!(validate_default(&test_cluster(autoscaled)), Ok(()));
    }

    #[test]
    fn metadata_rules() {
        let mut long = base(json!({}));
        long["metadata"]["name"] = json!("a".repeat(54));
        let problem = validate_default(&test_cluster(long)).expect_err("too long");
        assert_eq!(problem.reason, reasons::INVALID_METADATA);
        let mut bad = base(json!({}));
        bad["metadata"]["name"] = json!("1cluster");
        assert_eq!(
            validate_default(&test_cluster(bad))
                .expect_err("digit")
                .reason,
            reasons::INVALID_METADATA
        );
    }

    #[test]
    fn group_rules() {
        let mut dup = base(json!({}));
        let group = dup["spec"]["workerGroupSpecs"][0].clone();
        dup["spec"]["workerGroupSpecs"] = json!([group.clone(), group]);
        assert!(message(dup).contains("more than once"));

        let mut inverted = base(json!({}));
        inverted["spec"]["workerGroupSpecs"][0]["minReplicas"] = json!(5);
        assert!(message(inverted).contains("greater than maxReplicas"));

        let mut both = base(json!({}));
        both["spec"]["workerGroupSpecs"][0]["resources"] = json!({"CPU": "1"});
        both["spec"]["workerGroupSpecs"][0]["rayStartParams"] = json!({"num-cpus": "1"});
        assert!(message(both).contains("both in rayStartParams and in resources"));

        let mut labels = base(json!({}));
        labels["spec"]["headGroupSpec"]["rayStartParams"] = json!({"labels": "a=b"});
        assert!(message(labels).contains("labels field"));

        let mut bad_label = base(json!({}));
        bad_label["spec"]["headGroupSpec"]["labels"] = json!({"ok/key": "bad value"});
        assert!(message(bad_label).contains("not a valid label value"));

        let mut idle = base(json!({}));
        idle["spec"]["workerGroupSpecs"][0]["idleTimeoutSeconds"] = json!(30);
        assert!(message(idle).contains("autoscaler v2"));
    }

    #[test]
    fn fault_tolerance_rules() {
        let mut both = base(json!({"gcsFaultToleranceOptions": {"redisAddress": "r:6379"}}));
        both["metadata"]["annotations"] = json!({"ray.io/ft-enabled": "true"});
        assert!(message(both).contains("use only gcsFaultToleranceOptions"));
        let rocksdb = base(json!({"gcsFaultToleranceOptions": {"backend": "rocksdb"}}));
        assert!(message(rocksdb).contains("feature gate"));
        let mut password = base(json!({"gcsFaultToleranceOptions": {"redisAddress": "r:6379"}}));
        password["spec"]["headGroupSpec"]["rayStartParams"] = json!({"redis-password": "x"});
        assert!(message(password).contains("redisPassword"));
        let mut address = base(json!({}));
        address["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"] =
            json!([{"name": "RAY_REDIS_ADDRESS", "value": "r"}]);
        assert!(message(address).contains("GCS fault tolerance"));
    }

    #[test]
    fn autoscaler_auth_and_gated_features() {
        let mut restart =
            base(json!({"enableInTreeAutoscaling": true, "autoscalerOptions": {"version": "v2"}}));
        restart["spec"]["workerGroupSpecs"][0]["template"]["spec"]["restartPolicy"] =
            json!("Always");
        assert!(message(restart).contains("restartPolicy"));
        let mut suspended = base(json!({"enableInTreeAutoscaling": true}));
        suspended["spec"]["workerGroupSpecs"][0]["suspend"] = json!(true);
        assert!(message(suspended).contains("cannot be suspended"));
        let old_auth = base(json!({"rayVersion": "2.51.0", "authOptions": {"mode": "token"}}));
        assert!(message(old_auth).contains("2.52.0"));
        let k8s_auth = base(json!({"authOptions": {"enableK8sTokenAuth": true}}));
        assert!(message(k8s_auth).contains("mode 'token'"));
        assert!(message(base(json!({"networkPolicy": {}}))).contains("RayClusterNetworkPolicy"));
        assert!(message(base(json!({"tlsOptions": {"enabled": true}}))).contains("RayClusterMTLS"));
        let mut by_rayjob = base(json!({"upgradeStrategy": {"type": "Recreate"}}));
        by_rayjob["metadata"]["labels"] = json!({"ray.io/originated-from-crd": "RayJob"});
        assert!(message(by_rayjob).contains("RayJob"));
    }

    #[test]
    fn gated_fields_follow_kuberays_rules_once_their_gate_is_on() {
        let on = FeatureGates::default()
            .with(gates::RAY_CLUSTER_NETWORK_POLICY, true)
            .with(gates::RAY_CLUSTER_MTLS, true)
            .with(gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE, true);
        let gated = |value: Value| validate(&test_cluster(value), &on);
        let all = base(json!({
            "networkPolicy": {"mode": "DenyAll", "workerGroups": [{"groupName": "g"}]},
            "tlsOptions": {"enabled": true},
            "gcsFaultToleranceOptions": {"backend": "rocksdb", "storage": {"size": "2Gi"}}
        }));
        assert_eq!(gated(all.clone()), Ok(()));
        assert!(
            validate(&test_cluster(all), &FeatureGates::default()).is_err(),
            "gates are off by default"
        );
        let message = |value: Value| gated(value).expect_err("invalid").message;
        assert!(
            message(base(json!({"networkPolicy": {"mode": "DenyAllEgress",
                "head": {"ingressRules": [{}]}}})))
            .contains("DenyAllEgress")
        );
        assert!(
            message(base(
                json!({"networkPolicy": {"workerGroups": [{"groupName": "other"}]}})
            ))
            .contains("does not match")
        );
        let mut bad_group = base(json!({"networkPolicy": {}}));
        bad_group["spec"]["workerGroupSpecs"][0]["groupName"] = json!("Big_Group");
        assert!(message(bad_group).contains("DNS-1123"));
        let mut tls_env = base(json!({"tlsOptions": {"enabled": true}}));
        tls_env["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"] =
            json!([{"name": "RAY_USE_TLS", "value": "1"}]);
        assert!(message(tls_env).contains("RAY_USE_TLS"));
        let redis = base(
            json!({"gcsFaultToleranceOptions": {"backend": "rocksdb", "redisAddress": "r:6379"}}),
        );
        assert!(message(redis).contains("redisAddress"));
        let claim = base(json!({"gcsFaultToleranceOptions": {"backend": "rocksdb",
            "storage": {"claimName": "c", "size": "1Gi"}}}));
        assert!(message(claim).contains("claimName"));
        let mut mount = base(json!({"gcsFaultToleranceOptions": {"backend": "rocksdb"}}));
        mount["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "x", "mountPath": "/data/gcs"}]);
        assert!(message(mount).contains("/data/gcs"));
    }

    #[test]
    fn suspending_and_suspended_together_is_an_invalid_status() {
        let mut value = base(json!({}));
        value["status"] = json!({"conditions": [
            {"type": "RayClusterSuspending", "status": "True", "reason": "RayClusterSuspending", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "RayClusterSuspended", "status": "True", "reason": "RayClusterSuspended", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ]});
        assert_eq!(
            validate_default(&test_cluster(value))
                .expect_err("invalid")
                .reason,
            reasons::INVALID_STATUS
        );
    }
}
