//! KubeRay's controller-side rules for the alpha fields, once their gate is on: network
//! policies (rules that match the mode, group names usable in object names), mTLS (the
//! operator's TLS variables and mount left to the operator) and the embedded RocksDB GCS
//! store (no Redis fields, its volume and variables left to the operator).

use k8s_openapi::api::core::v1::Container;

use crate::api::raycluster::{NetworkPolicyMode, RayCluster};
use crate::kuberay::keys::{env as env_names, volumes};
use crate::kuberay::spec::tls_enabled;
use crate::validation::k8s_names::is_dns1123_label;

const TLS_ENV: [&str; 4] = [
    env_names::RAY_USE_TLS,
    env_names::RAY_TLS_SERVER_CERT,
    env_names::RAY_TLS_SERVER_KEY,
    env_names::RAY_TLS_CA_CERT,
];

fn has_rules<T>(rules: &Option<Vec<T>>) -> bool {
    rules.as_ref().is_some_and(|r| !r.is_empty())
}

/// Rules must restrict what the mode restricts; group entries must name existing groups.
pub(super) fn validate_network_policy(cluster: &RayCluster) -> Result<(), String> {
    let Some(policy) = &cluster.spec.network_policy else {
        return Ok(());
    };
    let mode = policy.mode.unwrap_or(NetworkPolicyMode::DenyAll);
    let check = |what: &str, ingress: bool, egress: bool| -> Result<(), String> {
        if mode == NetworkPolicyMode::DenyAllEgress && ingress {
            return Err(format!(
                "networkPolicy.{what}.ingressRules cannot be set with mode DenyAllEgress (ingress is not restricted)"
            ));
        }
        if mode == NetworkPolicyMode::DenyAllIngress && egress {
            return Err(format!(
                "networkPolicy.{what}.egressRules cannot be set with mode DenyAllIngress (egress is not restricted)"
            ));
        }
        Ok(())
    };
    for (what, rules) in [("head", &policy.head), ("worker", &policy.worker)] {
        if let Some(rules) = rules {
            check(
                what,
                has_rules(&rules.ingress_rules),
                has_rules(&rules.egress_rules),
            )?;
        }
    }
    let groups: Vec<&str> = cluster
        .spec
        .worker_group_specs
        .iter()
        .flatten()
        .map(|g| g.group_name.as_str())
        .collect();
    // Group names become part of NetworkPolicy names.
    if let Some(bad) = groups.iter().find(|g| !is_dns1123_label(g)) {
        return Err(format!(
            "worker group name {bad:?} must be a DNS-1123 label when networkPolicy is set (it is part of the NetworkPolicy name)"
        ));
    }
    for entry in policy.worker_groups.iter().flatten() {
        check(
            &format!("workerGroups[{:?}]", entry.group_name),
            has_rules(&entry.ingress_rules),
            has_rules(&entry.egress_rules),
        )?;
        if !groups.contains(&entry.group_name.as_str()) {
            return Err(format!(
                "networkPolicy.workerGroups[{:?}] does not match any group name in workerGroupSpecs",
                entry.group_name
            ));
        }
    }
    Ok(())
}

fn first_container(template: &k8s_openapi::api::core::v1::PodTemplateSpec) -> Option<&Container> {
    template.spec.as_ref().and_then(|s| s.containers.first())
}

fn check_tls_free(container: &Container, location: &str) -> Result<(), String> {
    if let Some(name) = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .find(|n| TLS_ENV.contains(n))
    {
        return Err(format!(
            "cannot set {name} in {location} when tlsOptions is set: the operator manages TLS"
        ));
    }
    if container
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.name == volumes::RAY_TLS || m.mount_path == volumes::RAY_TLS_PATH)
    {
        return Err(format!(
            "cannot mount a volume named {:?} or at {} in {location} when tlsOptions is set: the operator manages TLS",
            volumes::RAY_TLS,
            volumes::RAY_TLS_PATH
        ));
    }
    Ok(())
}

/// With TLS on, the TLS variables and the `ray-tls` mount are the operator's.
pub(super) fn validate_tls(cluster: &RayCluster) -> Result<(), String> {
    let spec = &cluster.spec;
    if !tls_enabled(spec) {
        return Ok(());
    }
    if let Some(head) = first_container(&spec.head_group_spec.template) {
        check_tls_free(head, "the head Pod")?;
    }
    for group in spec.worker_group_specs.iter().flatten() {
        if let Some(worker) = first_container(&group.template) {
            check_tls_free(worker, &format!("worker group {:?}", group.group_name))?;
        }
    }
    if let Some(options) = &spec.autoscaler_options {
        let autoscaler = Container {
            env: options.env.clone(),
            volume_mounts: options.volume_mounts.clone(),
            ..Default::default()
        };
        check_tls_free(&autoscaler, "autoscalerOptions")?;
    }
    Ok(())
}

/// The RocksDB backend: no Redis fields; the store's volume, mount and variables are the
/// operator's; an existing claim excludes the fields that would make a new one.
pub(super) fn validate_embedded_storage(cluster: &RayCluster) -> Result<(), String> {
    let Some(options) = &cluster.spec.gcs_fault_tolerance_options else {
        return Ok(());
    };
    let redis_fields = [
        ("redisAddress", options.redis_address.is_some()),
        ("redisUsername", options.redis_username.is_some()),
        ("redisPassword", options.redis_password.is_some()),
        (
            "externalStorageNamespace",
            options
                .external_storage_namespace
                .as_deref()
                .is_some_and(|n| !n.is_empty()),
        ),
    ];
    if let Some((field, _)) = redis_fields.iter().find(|(_, set)| *set) {
        return Err(format!(
            "cannot set gcsFaultToleranceOptions.{field} when backend is 'rocksdb'"
        ));
    }
    if let Some(storage) = &options.storage
        && storage.claim_name.as_deref().is_some_and(|c| !c.is_empty())
        && (storage.size.is_some()
            || storage.storage_class_name.is_some()
            || storage.access_modes.as_ref().is_some_and(|m| !m.is_empty()))
    {
        return Err("gcsFaultToleranceOptions.storage.claimName excludes size, storageClassName and accessModes".into());
    }
    let template = &cluster.spec.head_group_spec.template;
    if let Some(head) = first_container(template) {
        let envs = head.env.as_deref().unwrap_or_default();
        if envs.iter().any(|e| {
            e.name == env_names::RAY_GCS_STORAGE || e.name == env_names::RAY_GCS_STORAGE_PATH
        }) {
            return Err(format!(
                "cannot set {} or {} on the head with the embedded GCS backend: the operator sets them",
                env_names::RAY_GCS_STORAGE,
                env_names::RAY_GCS_STORAGE_PATH
            ));
        }
        if head
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == volumes::GCS_STORAGE || m.mount_path == volumes::GCS_STORAGE_PATH)
        {
            return Err(format!(
                "cannot mount a volume named {:?} or at {} on the head with the embedded GCS backend: the operator mounts it",
                volumes::GCS_STORAGE,
                volumes::GCS_STORAGE_PATH
            ));
        }
    }
    if template
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.name == volumes::GCS_STORAGE))
    {
        return Err(format!(
            "cannot add a volume named {:?} to the head with the embedded GCS backend: the operator adds it",
            volumes::GCS_STORAGE
        ));
    }
    Ok(())
}
