//! KubeRay's rules for a RayCluster spec (its admission webhook plus the checks its controller
//! makes before acting), also applied to the cluster spec inside a RayJob, RayService and
//! ServePipeline. Collects every problem. The RayCluster controller's own pre-reconcile check,
//! which reports KubeRay's first problem in KubeRay's words, is [`controller`].

pub mod controller;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::ResourceExt;

use super::feature_gates::{FeatureGates, gates};
use super::k8s_names::{check_name, is_dns1123_label, is_label_key, is_label_value};
use super::pod::{
    containers, env_value, has_env, ray_container, restart_policy_never_or_unset, truthy,
    version_at_least,
};
use super::problem::{Problem, Problems};
use crate::api::RayCluster;
use crate::api::raycluster::{
    AuthMode, AutoscalerVersion, GcsFaultToleranceBackend, NetworkPolicyMode, RayClusterSpec,
};
use crate::kuberay::keys::annotations::{
    EXTERNAL_STORAGE_NAMESPACE as ANNOTATION_EXTERNAL_STORAGE_NAMESPACE,
    FT_ENABLED as ANNOTATION_FT_ENABLED,
};
use crate::kuberay::keys::env::{
    KUBERAY_GEN_AUTOSCALER_START_CMD as ENV_GEN_AUTOSCALER_START_CMD,
    RAY_ENABLE_AUTOSCALER_V2 as ENV_AUTOSCALER_V2, RAY_REDIS_ADDRESS as ENV_REDIS_ADDRESS,
    REDIS_PASSWORD as ENV_REDIS_PASSWORD, REDIS_USERNAME as ENV_REDIS_USERNAME,
};
use crate::kuberay::keys::labels::ORIGINATED_FROM_CRD as LABEL_ORIGINATED_FROM_CRD;
use crate::kuberay::keys::reasons;

/// Longest RayCluster name KubeRay accepts (it derives child names by appending suffixes).
pub const MAX_RAYCLUSTER_NAME: usize = 53;
const TLS_ENV_VARS: [&str; 4] = [
    "RAY_USE_TLS",
    "RAY_TLS_SERVER_CERT",
    "RAY_TLS_SERVER_KEY",
    "RAY_TLS_CA_CERT",
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

/// KubeRay's rules for a RayCluster spec.
pub fn raycluster_spec(
    spec: &RayClusterSpec,
    context: &ClusterContext<'_>,
    feature_gates: &FeatureGates,
    problems: &mut Problems,
) {
    let p = context.path;
    let head = &spec.head_group_spec;
    let head_container = ray_container(&head.template);
    let workers = spec.worker_group_specs.as_deref().unwrap_or_default();
    let autoscaling = spec.enable_in_tree_autoscaling.unwrap_or(false);
    let autoscaler = spec.autoscaler_options.as_ref();
    let v2_env = env_value(head_container, ENV_AUTOSCALER_V2);
    let autoscaler_v2 = autoscaling
        && (autoscaler.and_then(|a| a.version) == Some(AutoscalerVersion::V2)
            || v2_env.is_some_and(truthy));

    if containers(&head.template).is_empty() {
        problems.push(format!(
            "{p}.headGroupSpec.template.spec.containers: the head Pod needs at least one container"
        ));
    }

    let mut seen = BTreeSet::new();
    for (i, group) in workers.iter().enumerate() {
        let gp = format!("{p}.workerGroupSpecs[{i}]");
        if !seen.insert(group.group_name.as_str()) {
            problems.push(format!(
                "{gp}.groupName: duplicate worker group name {:?}; group names must be unique",
                group.group_name
            ));
        }
        if containers(&group.template).is_empty() {
            problems.push(format!(
                "{gp}.template.spec.containers: worker group {:?} needs at least one container",
                group.group_name
            ));
        }
        // The API server defaults these (0 and 2147483647); unset only outside it.
        let min = group.min_replicas.unwrap_or(0);
        let max = group.max_replicas.unwrap_or(i32::MAX);
        if !autoscaling {
            if min < 0 {
                problems.push(format!("{gp}.minReplicas must not be negative"));
            }
            if max < 0 {
                problems.push(format!("{gp}.maxReplicas must not be negative"));
            }
            if min > max {
                problems.push(format!(
                    "{gp}: minReplicas ({min}) must not exceed maxReplicas ({max})"
                ));
            }
        }
        if let Some(idle) = group.idle_timeout_seconds {
            if idle < 0 {
                problems.push(format!("{gp}.idleTimeoutSeconds must not be negative"));
            }
            if !autoscaler_v2 {
                problems.push(format!(
                    "{gp}.idleTimeoutSeconds needs autoscaler v2 (enableInTreeAutoscaling with autoscalerOptions.version: v2)"
                ));
            }
        }
        if group.priority.is_some_and(|prio| prio != 0)
            && !(autoscaler_v2 && version_at_least(spec.ray_version.as_deref(), (2, 56, 0)))
        {
            problems.push(format!(
                "{gp}.priority needs autoscaler v2 and rayVersion 2.56.0 or later"
            ));
        }
        if group.suspend == Some(true) {
            if !feature_gates.enabled(gates::RAY_JOB_DELETION_POLICY) {
                problems.push(format!(
                    "{gp}.suspend needs the {} feature gate",
                    gates::RAY_JOB_DELETION_POLICY
                ));
            }
            if autoscaling {
                problems.push(format!(
                    "{gp}.suspend cannot be used with enableInTreeAutoscaling"
                ));
            }
        }
        if autoscaler_v2 && !restart_policy_never_or_unset(&group.template) {
            problems.push(format!(
                "{gp}.template.spec.restartPolicy must be Never or unset with autoscaler v2"
            ));
        }
        check_group_resources(
            &gp,
            group.resources.as_ref(),
            group.labels.as_ref(),
            group.ray_start_params.as_ref(),
            problems,
        );
    }
    check_group_resources(
        &format!("{p}.headGroupSpec"),
        head.resources.as_ref(),
        head.labels.as_ref(),
        head.ray_start_params.as_ref(),
        problems,
    );

    // Autoscaler.
    if !autoscaling && v2_env.is_some_and(truthy) {
        problems.push(format!(
            "{p}.headGroupSpec: {ENV_AUTOSCALER_V2} is set but enableInTreeAutoscaling is off"
        ));
    }
    if autoscaling && autoscaler.and_then(|a| a.version).is_some() && v2_env.is_some() {
        problems.push(format!(
            "{p}.autoscalerOptions.version and the head's {ENV_AUTOSCALER_V2} variable cannot both be set; use autoscalerOptions.version"
        ));
    }
    if autoscaler_v2 && !restart_policy_never_or_unset(&head.template) {
        problems.push(format!(
            "{p}.headGroupSpec.template.spec.restartPolicy must be Never or unset with autoscaler v2"
        ));
    }
    if let Some(options) = autoscaler {
        if options.idle_timeout_seconds.is_some_and(|s| s < 0) {
            problems.push(format!(
                "{p}.autoscalerOptions.idleTimeoutSeconds must not be negative"
            ));
        }
        if options
            .env
            .iter()
            .flatten()
            .any(|e| e.name == ENV_GEN_AUTOSCALER_START_CMD)
        {
            problems.push(format!(
                "{p}.autoscalerOptions.env must not set {ENV_GEN_AUTOSCALER_START_CMD}"
            ));
        }
    }

    // GCS fault tolerance.
    let annotations = context.annotations;
    let ft_annotation = annotations.get(ANNOTATION_FT_ENABLED);
    let head_params = head.ray_start_params.as_ref();
    if let Some(ft) = &spec.gcs_fault_tolerance_options {
        if ft_annotation.is_some() {
            problems.push(format!(
                "metadata.annotations[{ANNOTATION_FT_ENABLED}] cannot be used with {p}.gcsFaultToleranceOptions"
            ));
        }
        if head_params.is_some_and(|m| m.contains_key("redis-password")) {
            problems.push(format!(
                "{p}.headGroupSpec.rayStartParams: redis-password cannot be used with gcsFaultToleranceOptions; use gcsFaultToleranceOptions.redisPassword"
            ));
        }
        for env in [ENV_REDIS_PASSWORD, ENV_REDIS_ADDRESS] {
            if has_env(head_container, env) {
                problems.push(format!(
                    "{p}.headGroupSpec: the head's {env} variable cannot be used with gcsFaultToleranceOptions; use its fields"
                ));
            }
        }
        if annotations.contains_key(ANNOTATION_EXTERNAL_STORAGE_NAMESPACE) {
            problems.push(format!(
                "metadata.annotations[{ANNOTATION_EXTERNAL_STORAGE_NAMESPACE}] cannot be used with gcsFaultToleranceOptions; use gcsFaultToleranceOptions.externalStorageNamespace"
            ));
        }
        match ft.backend.unwrap_or(GcsFaultToleranceBackend::Redis) {
            GcsFaultToleranceBackend::Rocksdb => {
                check_rocksdb(p, spec, feature_gates, problems);
            }
            GcsFaultToleranceBackend::Redis => {
                if ft.storage.is_some() {
                    problems.push(format!(
                        "{p}.gcsFaultToleranceOptions.storage applies only to the rocksdb backend"
                    ));
                }
            }
        }
    } else if has_env(head_container, ENV_REDIS_ADDRESS)
        && !ft_annotation.is_some_and(|v| truthy(v))
    {
        problems.push(format!(
            "{p}.headGroupSpec: the head's {ENV_REDIS_ADDRESS} variable needs GCS fault tolerance (gcsFaultToleranceOptions)"
        ));
    }
    if head_params.is_some_and(|m| m.contains_key("redis-username"))
        || has_env(head_container, ENV_REDIS_USERNAME)
    {
        problems.push(format!(
            "{p}.headGroupSpec: set the Redis user name with gcsFaultToleranceOptions.redisUsername, not rayStartParams or {ENV_REDIS_USERNAME}"
        ));
    }

    // Alpha features behind gates.
    if let Some(history) = &spec.history_server_options {
        if !feature_gates.enabled(gates::RAY_CLUSTER_HISTORY_SERVER) {
            problems.push(format!(
                "{p}.historyServerOptions needs the {} feature gate",
                gates::RAY_CLUSTER_HISTORY_SERVER
            ));
        }
        match &history.collector_options {
            None => problems.push(format!(
                "{p}.historyServerOptions.collectorOptions is required"
            )),
            Some(c) if c.image.as_deref().is_none_or(str::is_empty) => problems.push(format!(
                "{p}.historyServerOptions.collectorOptions.image is required"
            )),
            Some(_) => {}
        }
    }
    if let Some(policy) = &spec.network_policy {
        if !feature_gates.enabled(gates::RAY_CLUSTER_NETWORK_POLICY) {
            problems.push(format!(
                "{p}.networkPolicy needs the {} feature gate",
                gates::RAY_CLUSTER_NETWORK_POLICY
            ));
        }
        let mode = policy.mode.unwrap_or(NetworkPolicyMode::DenyAll);
        let mut rule_sets = vec![
            (
                format!("{p}.networkPolicy.head"),
                policy
                    .head
                    .as_ref()
                    .map(|r| (&r.ingress_rules, &r.egress_rules)),
            ),
            (
                format!("{p}.networkPolicy.worker"),
                policy
                    .worker
                    .as_ref()
                    .map(|r| (&r.ingress_rules, &r.egress_rules)),
            ),
        ];
        for (i, group) in policy.worker_groups.iter().flatten().enumerate() {
            let path = format!("{p}.networkPolicy.workerGroups[{i}]");
            if !is_dns1123_label(&group.group_name) {
                problems.push(format!(
                    "{path}.groupName: {:?} is not a DNS-1123 label",
                    group.group_name
                ));
            }
            if !workers.iter().any(|w| w.group_name == group.group_name) {
                problems.push(format!(
                    "{path}.groupName: there is no worker group {:?}",
                    group.group_name
                ));
            }
            rule_sets.push((path, Some((&group.ingress_rules, &group.egress_rules))));
        }
        for (path, rules) in rule_sets {
            let Some((ingress, egress)) = rules else {
                continue;
            };
            if mode == NetworkPolicyMode::DenyAllEgress
                && ingress.as_ref().is_some_and(|r| !r.is_empty())
            {
                problems.push(format!(
                    "{path}.ingressRules: mode DenyAllEgress leaves ingress open; ingress rules have no effect"
                ));
            }
            if mode == NetworkPolicyMode::DenyAllIngress
                && egress.as_ref().is_some_and(|r| !r.is_empty())
            {
                problems.push(format!(
                    "{path}.egressRules: mode DenyAllIngress leaves egress open; egress rules have no effect"
                ));
            }
        }
    }
    if let Some(tls) = &spec.tls_options {
        if !feature_gates.enabled(gates::RAY_CLUSTER_MTLS) {
            problems.push(format!(
                "{p}.tlsOptions needs the {} feature gate",
                gates::RAY_CLUSTER_MTLS
            ));
        }
        if tls.enabled == Some(true) {
            let templates = std::iter::once((format!("{p}.headGroupSpec"), &head.template)).chain(
                workers
                    .iter()
                    .enumerate()
                    .map(|(i, w)| (format!("{p}.workerGroupSpecs[{i}]"), &w.template)),
            );
            for (path, template) in templates {
                check_tls_free(&path, template, problems);
            }
        }
    }

    // Authentication.
    if let Some(auth) = &spec.auth_options {
        let token = auth.mode == Some(AuthMode::Token);
        if token && !version_at_least(spec.ray_version.as_deref(), (2, 52, 0)) {
            problems.push(format!(
                "{p}.authOptions.mode token needs rayVersion 2.52.0 or later"
            ));
        }
        if auth.enable_k8s_token_auth == Some(true) {
            if !token {
                problems.push(format!(
                    "{p}.authOptions.enableK8sTokenAuth needs mode token"
                ));
            }
            if !version_at_least(spec.ray_version.as_deref(), (2, 55, 0)) {
                problems.push(format!(
                    "{p}.authOptions.enableK8sTokenAuth needs rayVersion 2.55.0 or later"
                ));
            }
            if auth.secret_name.is_some() {
                problems.push(format!(
                    "{p}.authOptions.secretName cannot be used with enableK8sTokenAuth"
                ));
            }
        }
    }

    if spec
        .upgrade_strategy
        .as_ref()
        .is_some_and(|u| u.type_.is_some())
        && let Some(creator) = context.created_by
    {
        problems.push(format!(
            "{p}.upgradeStrategy is not allowed on a RayCluster created by a {creator}; the {creator} decides how its cluster is replaced"
        ));
    }
}

fn check_group_resources(
    path: &str,
    resources: Option<&BTreeMap<String, String>>,
    labels: Option<&BTreeMap<String, String>>,
    params: Option<&BTreeMap<String, String>>,
    problems: &mut Problems,
) {
    if let Some(params) = params {
        if resources.is_some_and(|r| !r.is_empty()) {
            for key in RESOURCE_START_PARAMS {
                if params.contains_key(key) {
                    problems.push(format!(
                        "{path}: resources and rayStartParams {key:?} cannot both be set; use resources"
                    ));
                }
            }
        }
        if params.contains_key("labels") {
            problems.push(format!(
                "{path}.rayStartParams: \"labels\" is not allowed; use the group's labels field"
            ));
        }
    }
    for (key, value) in labels.into_iter().flatten() {
        if !is_label_key(key) {
            problems.push(format!("{path}.labels: {key:?} is not a valid label key"));
        }
        if !is_label_value(value) {
            problems.push(format!(
                "{path}.labels[{key}]: {value:?} is not a valid label value"
            ));
        }
    }
}

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
        problems.push(format!(
            "{fp}.backend rocksdb needs the {} feature gate",
            gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE
        ));
    }
    if ft.redis_address.is_some() || ft.redis_password.is_some() || ft.redis_username.is_some() {
        problems.push(format!(
            "{fp}: redisAddress, redisUsername and redisPassword apply only to the redis backend"
        ));
    }
    if let Some(storage) = &ft.storage
        && storage.claim_name.is_some()
        && (storage.size.is_some()
            || storage.storage_class_name.is_some()
            || storage.access_modes.is_some())
    {
        problems.push(format!(
            "{fp}.storage: claimName uses an existing claim and excludes size, storageClassName and accessModes"
        ));
    }
    let head = &spec.head_group_spec.template;
    for container in containers(head) {
        if container
            .env
            .iter()
            .flatten()
            .any(|e| e.name.starts_with("RAY_gcs_storage"))
        {
            problems.push(format!(
                "{p}.headGroupSpec: RAY_gcs_storage* variables are set by the operator with the rocksdb backend"
            ));
        }
        if container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "gcs-storage" || m.mount_path.trim_end_matches('/') == "/data/gcs")
        {
            problems.push(format!(
                "{p}.headGroupSpec: the gcs-storage volume and /data/gcs are reserved for the rocksdb backend"
            ));
        }
    }
    if head
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.name == "gcs-storage"))
    {
        problems.push(format!(
            "{p}.headGroupSpec: the volume name gcs-storage is reserved for the rocksdb backend"
        ));
    }
}

fn check_tls_free(path: &str, template: &PodTemplateSpec, problems: &mut Problems) {
    for container in containers(template) {
        for env in container.env.iter().flatten() {
            if TLS_ENV_VARS.contains(&env.name.as_str()) {
                problems.push(format!(
                    "{path}: {} is set by the operator when tlsOptions.enabled is true",
                    env.name
                ));
            }
        }
        if container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "ray-tls" || m.mount_path.trim_end_matches('/') == "/etc/ray/tls")
        {
            problems.push(format!(
                "{path}: the ray-tls volume and /etc/ray/tls are reserved when tlsOptions.enabled is true"
            ));
        }
    }
}

/// A RayCluster: name, then spec.
pub fn validate(cluster: &RayCluster, feature_gates: &FeatureGates) -> Vec<Problem> {
    let mut problems = Problems::new(reasons::INVALID_SPEC, reasons::INVALID_METADATA);
    check_name(
        "RayCluster",
        &cluster.name_any(),
        MAX_RAYCLUSTER_NAME,
        &mut problems,
    );
    let created_by = cluster
        .labels()
        .get(LABEL_ORIGINATED_FROM_CRD)
        .map(String::as_str)
        .filter(|c| *c == "RayJob" || *c == "RayService");
    raycluster_spec(
        &cluster.spec,
        &ClusterContext {
            path: "spec",
            created_by,
            annotations: cluster.annotations(),
        },
        feature_gates,
        &mut problems,
    );
    problems.into_vec()
}
