//! Validation rules for the kinds the webhook admits: KubeRay's (its admission webhook plus
//! the checks its controllers make before acting, so a bad object is refused up front instead
//! of failing later in a status) and raypipe's own for ServePipeline. Pure functions: each
//! returns every problem found, as `field.path: what is wrong`, empty when the object is fine.
//! The Ray controllers can call the same functions for their in-controller validation.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};
use kube::ResourceExt;

use crate::api::raycluster::{
    AuthMode, AutoscalerVersion, GcsFaultToleranceBackend, NetworkPolicyMode, RayClusterSpec,
};
use crate::api::rayjob::{DeletionPolicyType, JobSubmissionMode, RayJobSpec};
use crate::api::rayservice::{RayServiceUpgradeStrategy, RayServiceUpgradeType};
use crate::api::{RayCluster, RayCronJob, RayJob, RayService, ServePipeline};
use crate::validation::feature_gates::{FeatureGates, gates};

/// Longest names KubeRay accepts (it derives child names by appending suffixes).
pub const MAX_RAYCLUSTER_NAME: usize = 53;
pub const MAX_RAYJOB_NAME: usize = 47;
pub const MAX_RAYSERVICE_NAME: usize = 47;
pub const MAX_RAYCRONJOB_NAME: usize = 36;
/// A Serve config larger than this cannot travel in one RayService: etcd refuses objects over
/// ~1.5 MiB, and the cluster spec and status need room too.
pub const MAX_SERVE_CONFIG_BYTES: usize = 1024 * 1024;

const ANNOTATION_FT_ENABLED: &str = "ray.io/ft-enabled";
const ANNOTATION_EXTERNAL_STORAGE_NAMESPACE: &str = "ray.io/external-storage-namespace";
pub(crate) const ANNOTATION_INITIALIZING_TIMEOUT: &str = "ray.io/initializing-timeout";
const LABEL_ORIGINATED_FROM_CRD: &str = "ray.io/originated-from-crd";
const LABEL_CLUSTER: &str = "ray.io/cluster";
const ENV_AUTOSCALER_V2: &str = "RAY_enable_autoscaler_v2";
const ENV_REDIS_ADDRESS: &str = "RAY_REDIS_ADDRESS";
const ENV_REDIS_PASSWORD: &str = "REDIS_PASSWORD";
const ENV_REDIS_USERNAME: &str = "REDIS_USERNAME";
const ENV_GEN_AUTOSCALER_START_CMD: &str = "KUBERAY_GEN_AUTOSCALER_START_CMD";
const TLS_ENV_VARS: [&str; 4] = [
    "RAY_USE_TLS",
    "RAY_TLS_SERVER_CERT",
    "RAY_TLS_SERVER_KEY",
    "RAY_TLS_CA_CERT",
];
/// `ray start` options that `resources` replaces.
const RESOURCE_START_PARAMS: [&str; 4] = ["num-cpus", "num-gpus", "memory", "resources"];

// ---------------------------------------------------------------------------------------------
// Syntax helpers (Kubernetes' own rules).

fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_qualified_name_part(s: &str) -> bool {
    let bytes = s.as_bytes();
    !s.is_empty()
        && s.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A label key: optional DNS subdomain prefix and `/`, then a name part.
fn is_label_key(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(s),
    }
}

fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

fn check_name(kind: &str, name: &str, max: usize, problems: &mut Vec<String>) {
    if name.len() > max {
        problems.push(format!(
            "metadata.name: {kind} names may have at most {max} characters (this one has {}), because child object names are derived from it",
            name.len()
        ));
    }
    if !is_dns1035_label(name) {
        problems.push(format!(
            "metadata.name: {name:?} is not a DNS-1035 label (lower-case letters, digits and '-', starting with a letter and ending with a letter or digit)"
        ));
    }
}

/// `major.minor.patch` of a Ray version such as `2.52.0` (a leading `v` and suffixes ignored).
fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let mut parts = text.trim().trim_start_matches('v').split('.');
    let mut next = || -> Option<u64> {
        let part = parts.next()?;
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let major = next()?;
    let minor = next().unwrap_or(0);
    let patch = next().unwrap_or(0);
    Some((major, minor, patch))
}

fn version_at_least(version: Option<&str>, minimum: (u64, u64, u64)) -> bool {
    version
        .and_then(parse_version)
        .is_some_and(|v| v >= minimum)
}

fn truthy(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true")
}

fn ray_container(template: &PodTemplateSpec) -> Option<&Container> {
    template.spec.as_ref().and_then(|s| s.containers.first())
}

fn containers(template: &PodTemplateSpec) -> &[Container] {
    template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
}

fn env_value<'a>(container: Option<&'a Container>, name: &str) -> Option<&'a str> {
    container?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)
        .map(|e| e.value.as_deref().unwrap_or_default())
}

fn has_env(container: Option<&Container>, name: &str) -> bool {
    env_value(container, name).is_some()
}

fn restart_policy_never_or_unset(template: &PodTemplateSpec) -> bool {
    template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .is_none_or(|p| p == "Never")
}

// ---------------------------------------------------------------------------------------------
// RayCluster (also the cluster spec inside RayJob, RayService and ServePipeline).

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
    problems: &mut Vec<String>,
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
    problems: &mut Vec<String>,
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
    problems: &mut Vec<String>,
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

fn check_tls_free(path: &str, template: &PodTemplateSpec, problems: &mut Vec<String>) {
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
pub fn raycluster(cluster: &RayCluster, feature_gates: &FeatureGates) -> Vec<String> {
    let mut problems = Vec::new();
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
    problems
}

// ---------------------------------------------------------------------------------------------
// RayJob.

/// KubeRay's rules for a RayJob spec (`path` is `spec`, or `spec.jobTemplate` in a RayCronJob).
pub fn rayjob_spec(
    spec: &RayJobSpec,
    path: &str,
    annotations: &BTreeMap<String, String>,
    feature_gates: &FeatureGates,
    problems: &mut Vec<String>,
) {
    let p = path;
    let shutdown = spec.shutdown_after_job_finishes.unwrap_or(false);
    let selector = spec.cluster_selector.as_ref().filter(|s| !s.is_empty());
    let mode = spec
        .submission_mode
        .unwrap_or(JobSubmissionMode::K8sJobMode);
    let cluster_spec = spec.ray_cluster_spec.as_ref();
    let autoscaling = cluster_spec.is_some_and(|c| c.enable_in_tree_autoscaling == Some(true));

    if spec.suspend == Some(true) && !shutdown {
        problems.push(format!(
            "{p}.suspend needs shutdownAfterJobFinishes: true (a suspended job's cluster is deleted)"
        ));
    }
    if let Some(ttl) = spec.ttl_seconds_after_finished {
        if ttl < 0 {
            problems.push(format!("{p}.ttlSecondsAfterFinished must not be negative"));
        } else if ttl > 0 && !shutdown {
            problems.push(format!(
                "{p}.ttlSecondsAfterFinished needs shutdownAfterJobFinishes: true"
            ));
        }
    }
    if cluster_spec.is_none() && selector.is_none() {
        problems.push(format!(
            "{p}: set rayClusterSpec (a new cluster) or clusterSelector (an existing one)"
        ));
    }
    if let Some(selector) = selector {
        if spec.suspend == Some(true) {
            problems.push(format!(
                "{p}.suspend cannot be used with clusterSelector (the cluster is not the job's)"
            ));
        }
        if selector.get(LABEL_CLUSTER).is_none_or(|v| v.is_empty()) {
            problems.push(format!(
                "{p}.clusterSelector needs a non-empty {LABEL_CLUSTER} entry"
            ));
        }
        if mode == JobSubmissionMode::SidecarMode {
            problems.push(format!(
                "{p}.clusterSelector cannot be used with submissionMode SidecarMode"
            ));
        }
        if spec.backoff_limit.is_some_and(|b| b != 0) {
            problems.push(format!(
                "{p}.backoffLimit must be 0 or unset with clusterSelector (retries need a new cluster)"
            ));
        }
    }
    if mode == JobSubmissionMode::InteractiveMode && spec.backoff_limit.is_some_and(|b| b != 0) {
        problems.push(format!(
            "{p}.backoffLimit must be 0 or unset in InteractiveMode"
        ));
    }
    if mode == JobSubmissionMode::SidecarMode {
        if spec.submitter_pod_template.is_some() {
            problems.push(format!(
                "{p}.submitterPodTemplate cannot be used in SidecarMode"
            ));
        }
        if spec.submitter_config.is_some() {
            problems.push(format!("{p}.submitterConfig cannot be used in SidecarMode"));
        }
        if cluster_spec.is_some_and(|c| !restart_policy_never_or_unset(&c.head_group_spec.template))
        {
            problems.push(format!(
                "{p}.rayClusterSpec.headGroupSpec.template.spec.restartPolicy must be Never or unset in SidecarMode"
            ));
        }
    }
    if cluster_spec
        .and_then(|c| c.auth_options.as_ref())
        .is_some_and(|a| a.enable_k8s_token_auth == Some(true))
    {
        problems.push(format!(
            "{p}.rayClusterSpec.authOptions.enableK8sTokenAuth is not supported for RayJob"
        ));
    }
    if let Some(yaml) = &spec.runtime_env_yaml
        && let Err(e) = serde_yaml::from_str::<serde_yaml::Value>(yaml)
    {
        problems.push(format!("{p}.runtimeEnvYAML is not valid YAML: {e}"));
    }
    if spec.active_deadline_seconds.is_some_and(|s| s <= 0) {
        problems.push(format!("{p}.activeDeadlineSeconds must be positive"));
    }
    if spec.pre_running_deadline_seconds.is_some_and(|s| s <= 0) {
        problems.push(format!("{p}.preRunningDeadlineSeconds must be positive"));
    }
    if spec.backoff_limit.is_some_and(|b| b < 0) {
        problems.push(format!("{p}.backoffLimit must not be negative"));
    }
    if let Some(strategy) = &spec.deletion_strategy {
        let dp = format!("{p}.deletionStrategy");
        if !feature_gates.enabled(gates::RAY_JOB_DELETION_POLICY) {
            problems.push(format!(
                "{dp} needs the {} feature gate",
                gates::RAY_JOB_DELETION_POLICY
            ));
        }
        let destructive_with_selector = |policy: DeletionPolicyType| {
            selector.is_some()
                && matches!(
                    policy,
                    DeletionPolicyType::DeleteCluster | DeletionPolicyType::DeleteWorkers
                )
        };
        if let Some(rules) = &strategy.deletion_rules {
            if shutdown {
                problems.push(format!(
                    "{dp}.deletionRules cannot be used with shutdownAfterJobFinishes; the rules decide what is deleted"
                ));
            }
            let mut pairs = BTreeSet::new();
            // Per condition: the delay of each policy, to check their order.
            let mut delays: BTreeMap<String, BTreeMap<DeletionPolicyType, i32>> = BTreeMap::new();
            for (i, rule) in rules.iter().enumerate() {
                let rp = format!("{dp}.deletionRules[{i}]");
                let ttl = rule.condition.ttl_seconds.unwrap_or(0);
                if ttl < 0 {
                    problems.push(format!("{rp}.condition.ttlSeconds must not be negative"));
                }
                if destructive_with_selector(rule.policy) {
                    problems.push(format!(
                        "{rp}.policy {:?} cannot be used with clusterSelector (the cluster is not the job's)",
                        rule.policy
                    ));
                }
                if rule.policy == DeletionPolicyType::DeleteWorkers && autoscaling {
                    problems.push(format!(
                        "{rp}.policy DeleteWorkers cannot be used with autoscaling (the autoscaler would bring them back)"
                    ));
                }
                let condition = format!(
                    "{:?}/{:?}",
                    rule.condition.job_status, rule.condition.job_deployment_status
                );
                if !pairs.insert((condition.clone(), rule.policy)) {
                    problems.push(format!(
                        "{rp}: another rule already has policy {:?} for the same condition",
                        rule.policy
                    ));
                }
                delays
                    .entry(condition)
                    .or_default()
                    .insert(rule.policy, ttl);
            }
            for by_policy in delays.values() {
                let ordered = [
                    DeletionPolicyType::DeleteWorkers,
                    DeletionPolicyType::DeleteCluster,
                    DeletionPolicyType::DeleteSelf,
                ];
                let present: Vec<(DeletionPolicyType, i32)> = ordered
                    .iter()
                    .filter_map(|policy| by_policy.get(policy).map(|ttl| (*policy, *ttl)))
                    .collect();
                for pair in present.windows(2) {
                    if pair[0].1 > pair[1].1 {
                        problems.push(format!(
                            "{dp}.deletionRules: {:?} (after {}s) must not come later than {:?} (after {}s) for the same condition",
                            pair[0].0, pair[0].1, pair[1].0, pair[1].1
                        ));
                    }
                }
            }
        } else {
            for (field, policy) in [
                ("onSuccess", &strategy.on_success),
                ("onFailure", &strategy.on_failure),
            ] {
                match policy.as_ref().and_then(|p| p.policy) {
                    None => problems.push(format!("{dp}.{field}.policy is required")),
                    Some(policy) => {
                        if destructive_with_selector(policy) {
                            problems.push(format!(
                                "{dp}.{field}.policy {policy:?} cannot be used with clusterSelector"
                            ));
                        }
                        if policy == DeletionPolicyType::DeleteWorkers && autoscaling {
                            problems.push(format!(
                                "{dp}.{field}.policy DeleteWorkers cannot be used with autoscaling"
                            ));
                        }
                        if policy == DeletionPolicyType::DeleteNone && shutdown {
                            problems.push(format!(
                                "{dp}.{field}.policy DeleteNone contradicts shutdownAfterJobFinishes: true"
                            ));
                        }
                    }
                }
            }
        }
    }
    if let Some(cluster) = cluster_spec {
        raycluster_spec(
            cluster,
            &ClusterContext {
                path: &format!("{p}.rayClusterSpec"),
                created_by: Some("RayJob"),
                annotations,
            },
            feature_gates,
            problems,
        );
    }
}

pub fn rayjob(job: &RayJob, feature_gates: &FeatureGates) -> Vec<String> {
    let mut problems = Vec::new();
    check_name("RayJob", &job.name_any(), MAX_RAYJOB_NAME, &mut problems);
    rayjob_spec(
        &job.spec,
        "spec",
        job.annotations(),
        feature_gates,
        &mut problems,
    );
    problems
}

// ---------------------------------------------------------------------------------------------
// RayService (and the RayService part of a ServePipeline).

fn upgrade_strategy(
    strategy: Option<&RayServiceUpgradeStrategy>,
    cluster: &RayClusterSpec,
    path: &str,
    feature_gates: &FeatureGates,
    problems: &mut Vec<String>,
) {
    let Some(strategy) = strategy else { return };
    if strategy.type_ != Some(RayServiceUpgradeType::NewClusterWithIncrementalUpgrade) {
        return;
    }
    let up = format!("{path}.upgradeStrategy");
    if !feature_gates.enabled(gates::RAY_SERVICE_INCREMENTAL_UPGRADE) {
        problems.push(format!(
            "{up}.type NewClusterWithIncrementalUpgrade needs the {} feature gate",
            gates::RAY_SERVICE_INCREMENTAL_UPGRADE
        ));
    }
    if cluster.enable_in_tree_autoscaling != Some(true) {
        problems.push(format!(
            "{up}.type NewClusterWithIncrementalUpgrade needs enableInTreeAutoscaling on the cluster"
        ));
    }
    let Some(options) = &strategy.cluster_upgrade_options else {
        problems.push(format!(
            "{up}.clusterUpgradeOptions is required for NewClusterWithIncrementalUpgrade"
        ));
        return;
    };
    let op = format!("{up}.clusterUpgradeOptions");
    let surge = options.max_surge_percent.unwrap_or(100);
    if !(0..=100).contains(&surge) {
        problems.push(format!("{op}.maxSurgePercent must be between 0 and 100"));
    }
    if options.step_size_percent < 0 || options.step_size_percent > surge {
        problems.push(format!(
            "{op}.stepSizePercent must be between 0 and maxSurgePercent ({surge})"
        ));
    }
    if options.interval_seconds <= 0 {
        problems.push(format!("{op}.intervalSeconds must be positive"));
    }
    if options.gateway_class_name.is_empty() {
        problems.push(format!("{op}.gatewayClassName must not be empty"));
    }
}

fn no_k8s_token_auth(cluster: &RayClusterSpec, path: &str, problems: &mut Vec<String>) {
    if cluster
        .auth_options
        .as_ref()
        .is_some_and(|a| a.enable_k8s_token_auth == Some(true))
    {
        problems.push(format!(
            "{path}.authOptions.enableK8sTokenAuth is not supported for RayService"
        ));
    }
}

fn no_head_service_name(cluster: &RayClusterSpec, path: &str, problems: &mut Vec<String>) {
    if cluster
        .head_group_spec
        .head_service
        .as_ref()
        .and_then(|s| s.metadata.name.as_deref())
        .is_some_and(|n| !n.is_empty())
    {
        problems.push(format!(
            "{path}.headGroupSpec.headService.metadata.name must be empty; the RayService names its head Service"
        ));
    }
}

pub fn rayservice(service: &RayService, feature_gates: &FeatureGates) -> Vec<String> {
    let mut problems = Vec::new();
    let spec = &service.spec;
    check_name(
        "RayService",
        &service.name_any(),
        MAX_RAYSERVICE_NAME,
        &mut problems,
    );
    if let Some(timeout) = service.annotations().get(ANNOTATION_INITIALIZING_TIMEOUT)
        && let Err(e) = crate::validation::duration::parse_seconds_or_duration(timeout)
    {
        problems.push(format!(
            "metadata.annotations[{ANNOTATION_INITIALIZING_TIMEOUT}]: {e}; write a positive duration (like 30m) or number of seconds"
        ));
    }
    let cluster_path = "spec.rayClusterConfig";
    no_k8s_token_auth(&spec.ray_cluster_config, cluster_path, &mut problems);
    no_head_service_name(&spec.ray_cluster_config, cluster_path, &mut problems);
    raycluster_spec(
        &spec.ray_cluster_config,
        &ClusterContext {
            path: cluster_path,
            created_by: Some("RayService"),
            annotations: service.annotations(),
        },
        feature_gates,
        &mut problems,
    );
    if spec
        .ray_cluster_deletion_delay_seconds
        .is_some_and(|s| s < 0)
    {
        problems.push("spec.rayClusterDeletionDelaySeconds must not be negative".to_owned());
    }
    upgrade_strategy(
        spec.upgrade_strategy.as_ref(),
        &spec.ray_cluster_config,
        "spec",
        feature_gates,
        &mut problems,
    );
    if let Some(config) = &spec.serve_config_v2
        && config.len() > MAX_SERVE_CONFIG_BYTES
    {
        problems.push(format!(
            "spec.serveConfigV2 has {} bytes; at most {MAX_SERVE_CONFIG_BYTES} fit in one object (split the pipeline into several)",
            config.len()
        ));
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// RayCronJob.

/// Checks one field of a five-field cron schedule (`*`, `*/n`, `a`, `a-b`, `a-b/n`, lists,
/// names for months and weekdays).
fn cron_field(field: &str, min: u32, max: u32, names: &[&str]) -> Result<(), String> {
    let value = |text: &str| -> Result<u32, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(text)) {
            return Ok(min + u32::try_from(i).unwrap_or(0));
        }
        let v: u32 = text
            .parse()
            .map_err(|_| format!("{text:?} is not a number"))?;
        if v < min || v > max {
            return Err(format!("{v} is outside {min}-{max}"));
        }
        Ok(v)
    };
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (part, None),
        };
        if let Some(step) = step {
            let s: u32 = step
                .parse()
                .map_err(|_| format!("step {step:?} is not a number"))?;
            if s == 0 {
                return Err("a step must be positive".to_owned());
            }
        }
        if range == "*" || range == "?" {
            continue;
        }
        match range.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (value(a)?, value(b)?);
                if a > b {
                    return Err(format!("range {a}-{b} runs backwards"));
                }
            }
            None => {
                value(range)?;
            }
        }
    }
    Ok(())
}

/// A standard cron schedule: five fields or a descriptor such as `@hourly`.
pub fn check_cron_schedule(schedule: &str) -> Result<(), String> {
    let schedule = schedule.trim();
    if let Some(descriptor) = schedule.strip_prefix('@') {
        if let Some(every) = descriptor.strip_prefix("every ") {
            return match crate::validation::parse_go_duration(every) {
                Ok(nanos) if nanos > 0 => Ok(()),
                Ok(_) => Err(format!("@every needs a positive duration, not {every:?}")),
                Err(e) => Err(format!("@every: {e}")),
            };
        }
        return match descriptor {
            "yearly" | "annually" | "monthly" | "weekly" | "daily" | "midnight" | "hourly" => {
                Ok(())
            }
            _ => Err(format!("unknown descriptor @{descriptor}")),
        };
    }
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected five fields (minute hour day-of-month month day-of-week), found {}",
            fields.len()
        ));
    }
    const MONTHS: [&str; 12] = [
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ];
    const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    let specs: [(&str, u32, u32, &[&str]); 5] = [
        ("minute", 0, 59, &[]),
        ("hour", 0, 23, &[]),
        ("day of month", 1, 31, &[]),
        ("month", 1, 12, &MONTHS),
        ("day of week", 0, 7, &DAYS),
    ];
    for (field, (name, min, max, names)) in fields.iter().zip(specs) {
        cron_field(field, min, max, names).map_err(|e| format!("{name} field {field:?}: {e}"))?;
    }
    Ok(())
}

/// An IANA zone name such as `Europe/Paris` or `UTC` (syntax only: the zone database of the
/// machine that runs the schedule decides whether it exists).
fn is_time_zone_name(zone: &str) -> bool {
    !zone.is_empty()
        && !zone.starts_with('/')
        && !zone
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
        && zone
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '+'))
}

pub fn raycronjob(cron: &RayCronJob, feature_gates: &FeatureGates) -> Vec<String> {
    let mut problems = Vec::new();
    let spec = &cron.spec;
    check_name(
        "RayCronJob",
        &cron.name_any(),
        MAX_RAYCRONJOB_NAME,
        &mut problems,
    );
    if spec.schedule.contains("TZ") {
        problems.push("spec.schedule must not contain TZ or CRON_TZ; use spec.timeZone".to_owned());
    } else if let Err(e) = check_cron_schedule(&spec.schedule) {
        problems.push(format!("spec.schedule {:?}: {e}", spec.schedule));
    }
    if let Some(zone) = &spec.time_zone
        && !is_time_zone_name(zone)
    {
        problems.push(format!(
            "spec.timeZone {zone:?} is not a time zone name like Europe/Paris or UTC"
        ));
    }
    rayjob_spec(
        &spec.job_template,
        "spec.jobTemplate",
        cron.annotations(),
        feature_gates,
        &mut problems,
    );
    problems
}

// ---------------------------------------------------------------------------------------------
// ServePipeline.

/// Our own rules (the controller's `validate_spec`: name length, plain http, durations) plus
/// the RayService rules its RayService would face, so a pipeline that could never run is
/// refused when it is written rather than after its graph was downloaded.
pub fn servepipeline(pipeline: &ServePipeline, feature_gates: &FeatureGates) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(found) = crate::validation::servepipeline::validate_spec(pipeline) {
        problems.extend(found);
    }
    let name = pipeline.name_any();
    if !is_dns1035_label(&name) {
        problems.push(format!(
            "metadata.name: {name:?} is not a DNS-1035 label; the RayService it owns takes this name"
        ));
    }
    let cluster = &pipeline.spec.ray_cluster_config;
    let cluster_path = "spec.rayClusterConfig";
    no_k8s_token_auth(cluster, cluster_path, &mut problems);
    no_head_service_name(cluster, cluster_path, &mut problems);
    raycluster_spec(
        cluster,
        &ClusterContext {
            path: cluster_path,
            created_by: Some("RayService"),
            annotations: pipeline.annotations(),
        },
        feature_gates,
        &mut problems,
    );
    upgrade_strategy(
        pipeline.spec.upgrade_strategy.as_ref(),
        cluster,
        "spec",
        feature_gates,
        &mut problems,
    );
    problems
}

#[cfg(test)]
mod tests;
