//! What KubeRay's RayCluster controller refuses to reconcile, checked before anything is built:
//! KubeRay's first problem in KubeRay's order and words (it reports one, so this does too). A
//! refused cluster gets a Warning Event and no writes. The full admission rule set, which
//! collects every problem, is the parent module.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Container;
use kube::ResourceExt;

use crate::api::conditions;
use crate::api::raycluster::{
    AutoscalerVersion, GcsFaultToleranceBackend, RayCluster, condition_types,
};
use crate::kuberay::keys::{annotations, env as env_names, reasons};
use crate::kuberay::spec::{
    Creator, auth_enabled, autoscaler_version, autoscaling_enabled, gcs_ft_enabled,
    k8s_auth_enabled, ray_version_at_least,
};
use crate::validation::feature_gates::{FeatureGates, gates};
use crate::validation::k8s_names::{first_name_problem, is_label_key, is_label_value};
use crate::validation::pod::{env_value, has_env};
use crate::validation::problem::Problem;

mod gated;
use gated::{validate_embedded_storage, validate_network_policy, validate_tls};

/// KubeRay's limit: `<name>-serve-svc` must stay a valid Service name.
pub const MAX_NAME_LENGTH: usize = super::MAX_RAYCLUSTER_NAME;

fn needs_gate(field: &str, gate: &str) -> String {
    format!("{field} needs the {gate} feature gate")
}

fn spec_error(message: String) -> Problem {
    Problem::new("spec", reasons::INVALID_SPEC, message)
}

/// The first problem KubeRay would report, in KubeRay's order.
/// A gated field is refused exactly when the admission rules refuse it for the same gates.
pub fn validate(cluster: &RayCluster, feature_gates: &FeatureGates) -> Result<(), Problem> {
    validate_metadata(cluster)?;
    validate_spec(cluster, feature_gates).map_err(spec_error)?;
    validate_status(cluster)
}

/// Name length and DNS-1035 syntax.
fn validate_metadata(cluster: &RayCluster) -> Result<(), Problem> {
    let problem = first_name_problem(
        "RayCluster",
        &cluster.name_any(),
        MAX_NAME_LENGTH,
        " (lower-case letters, digits and '-', starting with a letter)",
    );
    match problem {
        Some(message) => Err(Problem::new(
            "metadata.name",
            reasons::INVALID_METADATA,
            message,
        )),
        None => Ok(()),
    }
}

/// Suspending and Suspended never hold together; if they do, the status was edited by hand.
fn validate_status(cluster: &RayCluster) -> Result<(), Problem> {
    let status = cluster
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let is_true =
        |t: &str| conditions::find(status, t).is_some_and(|c| c.status == conditions::TRUE);
    if is_true(condition_types::RAY_CLUSTER_SUSPENDING)
        && is_true(condition_types::RAY_CLUSTER_SUSPENDED)
    {
        return Err(Problem::new(
            "status.conditions",
            reasons::INVALID_STATUS,
            "the RayClusterSuspending and RayClusterSuspended conditions are both True",
        ));
    }
    Ok(())
}

fn enables_autoscaler_v2(container: &Container) -> bool {
    env_value(Some(container), env_names::RAY_ENABLE_AUTOSCALER_V2)
        .is_some_and(|v| v == "1" || v == "true")
}

fn validate_group(
    group: &str,
    params: Option<&std::collections::BTreeMap<String, String>>,
    resources: Option<&std::collections::BTreeMap<String, String>>,
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<(), String> {
    let param = |k: &str| params.and_then(|p| p.get(k)).is_some_and(|v| !v.is_empty());
    let sets_resources = ["num-cpus", "num-gpus", "memory", "resources"]
        .iter()
        .any(|k| param(k));
    if sets_resources && resources.is_some_and(|r| !r.is_empty()) {
        return Err(format!(
            "{group} group sets Ray resources both in rayStartParams and in resources; use only one"
        ));
    }
    if params.is_some_and(|p| p.contains_key("labels")) {
        return Err(format!(
            "rayStartParams['labels'] is not supported for the {group} group; use the labels field"
        ));
    }
    for (key, value) in labels.into_iter().flatten() {
        if !is_label_key(key) {
            return Err(format!("{group} group: {key:?} is not a valid label key"));
        }
        if !is_label_value(value) {
            return Err(format!(
                "{group} group: {value:?} (label {key}) is not a valid label value"
            ));
        }
    }
    Ok(())
}

fn validate_spec(cluster: &RayCluster, feature_gates: &FeatureGates) -> Result<(), String> {
    let spec = &cluster.spec;
    let cluster_annotations = cluster.annotations();
    let head = spec
        .head_group_spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .ok_or("headGroupSpec.template has no container")?;
    let head_params = spec.head_group_spec.ray_start_params.as_ref();
    validate_group(
        "head",
        head_params,
        spec.head_group_spec.resources.as_ref(),
        spec.head_group_spec.labels.as_ref(),
    )?;

    let autoscaling = autoscaling_enabled(spec);
    let v2 = autoscaler_version(spec) == Some(AutoscalerVersion::V2);
    let mut group_names = BTreeSet::new();
    for group in spec.worker_group_specs.iter().flatten() {
        let name = &group.group_name;
        if !group_names.insert(name.as_str()) {
            return Err(format!("worker group name {name:?} is used more than once"));
        }
        if group
            .template
            .spec
            .as_ref()
            .is_none_or(|s| s.containers.is_empty())
        {
            return Err(format!("worker group {name} has no container"));
        }
        if !autoscaling && (group.min_replicas.is_none() || group.max_replicas.is_none()) {
            return Err(format!(
                "worker group {name} must set minReplicas and maxReplicas when autoscaling is off"
            ));
        }
        let (min, max) = (group.min_replicas, group.max_replicas);
        if min.is_some_and(|m| m < 0) || max.is_some_and(|m| m < 0) {
            return Err(format!(
                "worker group {name} has a negative minReplicas or maxReplicas"
            ));
        }
        if let (Some(min), Some(max)) = (min, max)
            && min > max
        {
            return Err(format!(
                "worker group {name} has minReplicas {min} greater than maxReplicas {max}"
            ));
        }
        validate_group(
            name,
            group.ray_start_params.as_ref(),
            group.resources.as_ref(),
            group.labels.as_ref(),
        )?;
        if let Some(idle) = group.idle_timeout_seconds {
            if idle < 0 {
                return Err(format!(
                    "worker group {name}: idleTimeoutSeconds must not be negative"
                ));
            }
            if !v2 && !enables_autoscaler_v2(head) {
                return Err(format!(
                    "worker group {name}: idleTimeoutSeconds needs autoscaler v2 (autoscalerOptions.version: v2)"
                ));
            }
        }
        if let Some(priority) = group.priority.filter(|p| *p != 0) {
            if !ray_version_at_least(spec.ray_version.as_deref().unwrap_or_default(), (2, 56, 0)) {
                return Err(format!(
                    "worker group {name}: priority needs rayVersion 2.56.0 or later"
                ));
            }
            if !v2 && !enables_autoscaler_v2(head) {
                return Err(format!(
                    "worker group {name}: priority {priority} needs autoscaler v2"
                ));
            }
        }
    }

    let ft_options = spec.gcs_fault_tolerance_options.as_ref();
    if cluster_annotations
        .get(annotations::FT_ENABLED)
        .is_some_and(|v| !v.is_empty())
        && ft_options.is_some()
    {
        return Err(format!(
            "both the {} annotation and gcsFaultToleranceOptions are set; use only gcsFaultToleranceOptions",
            annotations::FT_ENABLED
        ));
    }
    if !gcs_ft_enabled(cluster) && has_env(Some(head), env_names::RAY_REDIS_ADDRESS) {
        return Err(format!(
            "{} is set on the head, which needs GCS fault tolerance: set gcsFaultToleranceOptions",
            env_names::RAY_REDIS_ADDRESS
        ));
    }
    if let Some(options) = ft_options {
        if head_params
            .and_then(|p| p.get("redis-password"))
            .is_some_and(|v| !v.is_empty())
        {
            return Err("rayStartParams 'redis-password' cannot be used with gcsFaultToleranceOptions; use redisPassword".into());
        }
        for name in [env_names::REDIS_PASSWORD, env_names::RAY_REDIS_ADDRESS] {
            if has_env(Some(head), name) {
                return Err(format!(
                    "the head cannot set {name} with gcsFaultToleranceOptions; use redisPassword / redisAddress"
                ));
            }
        }
        if cluster_annotations
            .get(annotations::EXTERNAL_STORAGE_NAMESPACE)
            .is_some_and(|v| !v.is_empty())
        {
            return Err(format!(
                "the {} annotation cannot be used with gcsFaultToleranceOptions; use externalStorageNamespace",
                annotations::EXTERNAL_STORAGE_NAMESPACE
            ));
        }
        match options.backend {
            Some(GcsFaultToleranceBackend::Rocksdb) => {
                if !feature_gates.enabled(gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE) {
                    return Err(needs_gate(
                        "gcsFaultToleranceOptions.backend 'rocksdb'",
                        gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE,
                    ));
                }
                validate_embedded_storage(cluster)?;
            }
            _ if options.storage.is_some() => {
                return Err(
                    "gcsFaultToleranceOptions.storage is only for the 'rocksdb' backend".into(),
                );
            }
            _ => {}
        }
    }
    if head_params
        .and_then(|p| p.get("redis-username"))
        .is_some_and(|v| !v.is_empty())
        || has_env(Some(head), env_names::REDIS_USERNAME)
    {
        return Err("a Redis username cannot come from rayStartParams or REDIS_USERNAME; use gcsFaultToleranceOptions.redisUsername".into());
    }

    if !autoscaling && enables_autoscaler_v2(head) {
        return Err(format!(
            "{} cannot enable autoscaler v2 while enableInTreeAutoscaling is false",
            env_names::RAY_ENABLE_AUTOSCALER_V2
        ));
    }
    if !feature_gates.enabled(gates::RAY_JOB_DELETION_POLICY)
        && let Some(group) = spec
            .worker_group_specs
            .iter()
            .flatten()
            .find(|g| g.suspend == Some(true))
    {
        return Err(format!(
            "worker group {} can be suspended only with the {} feature gate",
            group.group_name,
            gates::RAY_JOB_DELETION_POLICY
        ));
    }
    if autoscaling {
        if let Some(group) = spec
            .worker_group_specs
            .iter()
            .flatten()
            .find(|g| g.suspend == Some(true))
        {
            return Err(format!(
                "worker group {} cannot be suspended while the autoscaler is on",
                group.group_name
            ));
        }
        if autoscaler_version(spec).is_some()
            && has_env(Some(head), env_names::RAY_ENABLE_AUTOSCALER_V2)
        {
            return Err(format!(
                "both autoscalerOptions.version and the head env {} are set; use only the former",
                env_names::RAY_ENABLE_AUTOSCALER_V2
            ));
        }
    }
    if v2 && autoscaling {
        let never_or_unset =
            |policy: Option<&String>| policy.is_none_or(|p| p.is_empty() || p == "Never");
        if !never_or_unset(
            spec.head_group_spec
                .template
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_ref()),
        ) {
            return Err("autoscaler v2 needs the head's restartPolicy to be Never or unset".into());
        }
        for group in spec.worker_group_specs.iter().flatten() {
            if !never_or_unset(
                group
                    .template
                    .spec
                    .as_ref()
                    .and_then(|s| s.restart_policy.as_ref()),
            ) {
                return Err(format!(
                    "autoscaler v2 needs the restartPolicy of worker group {} to be Never or unset",
                    group.group_name
                ));
            }
        }
    }
    if let Some(options) = &spec.autoscaler_options {
        if options.idle_timeout_seconds.is_some_and(|s| s < 0) {
            return Err("autoscalerOptions.idleTimeoutSeconds must not be negative".into());
        }
        if options
            .env
            .iter()
            .flatten()
            .any(|e| e.name == env_names::KUBERAY_GEN_AUTOSCALER_START_CMD)
        {
            return Err(format!(
                "autoscalerOptions.env must not set {}: the operator sets it",
                env_names::KUBERAY_GEN_AUTOSCALER_START_CMD
            ));
        }
    }

    if spec.history_server_options.is_some()
        && !feature_gates.enabled(gates::RAY_CLUSTER_HISTORY_SERVER)
    {
        return Err(needs_gate(
            "historyServerOptions",
            gates::RAY_CLUSTER_HISTORY_SERVER,
        ));
    }
    let version = spec.ray_version.as_deref().unwrap_or_default();
    if auth_enabled(spec) {
        if !ray_version_at_least(version, (2, 52, 0)) {
            return Err(format!(
                "authOptions.mode 'token' needs rayVersion 2.52.0 or later (got {version:?})"
            ));
        }
        if k8s_auth_enabled(spec) {
            if !ray_version_at_least(version, (2, 55, 0)) {
                return Err(format!(
                    "authOptions.enableK8sTokenAuth needs rayVersion 2.55.0 or later (got {version:?})"
                ));
            }
            if spec
                .auth_options
                .as_ref()
                .and_then(|a| a.secret_name.as_deref())
                .is_some_and(|n| !n.is_empty())
            {
                return Err(
                    "authOptions.enableK8sTokenAuth excludes authOptions.secretName".into(),
                );
            }
        }
    } else if k8s_auth_enabled(spec) {
        return Err("authOptions.enableK8sTokenAuth needs authOptions.mode 'token'".into());
    }
    if spec.network_policy.is_some() {
        if !feature_gates.enabled(gates::RAY_CLUSTER_NETWORK_POLICY) {
            return Err(needs_gate(
                "networkPolicy",
                gates::RAY_CLUSTER_NETWORK_POLICY,
            ));
        }
        validate_network_policy(cluster)?;
    }
    if spec.tls_options.is_some() {
        if !feature_gates.enabled(gates::RAY_CLUSTER_MTLS) {
            return Err(needs_gate("tlsOptions", gates::RAY_CLUSTER_MTLS));
        }
        validate_tls(cluster)?;
    }

    if spec
        .upgrade_strategy
        .as_ref()
        .and_then(|u| u.type_)
        .is_some()
        && Creator::of(cluster) != Creator::RayCluster
    {
        return Err(format!(
            "upgradeStrategy cannot be set on a RayCluster created by a {}",
            Creator::of(cluster).as_str()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

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
