//! The environment of the Ray container (cluster name, head address, ports, memory), and what
//! GCS fault tolerance (Redis address, credentials, storage namespace) and token
//! authentication add to the Pod. Set only where the template left a variable unset.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, PodSpec, ProjectedVolumeSource,
    SecretKeySelector, ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use kube::ResourceExt;

use super::super::{BuildOptions, env, field_env, has_env};
use super::{
    AUTH_TOKEN_SECRET_KEY, ClusterFacts, RAY_CONTAINER, RAY_TOKEN_PATH, RAY_TOKEN_VOLUME,
    WAIT_GCS_READY_CONTAINER_NAME,
};
use crate::api::raycluster::{AuthOptions, RayCluster};
use crate::kuberay::keys::{annotations, env as env_names, labels, ports};
use crate::kuberay::names::NodeType;
use crate::kuberay::spec::{Creator, gcs_ft_embedded, gcs_ft_enabled};
use crate::kuberay::{keys, names};

pub(super) fn push_env(container: &mut Container, var: EnvVar) {
    container.env.get_or_insert_with(Vec::new).push(var);
}

pub(super) fn push_env_if_absent(container: &mut Container, var: EnvVar) {
    if !has_env(container.env.as_deref().unwrap_or_default(), &var.name) {
        push_env(container, var);
    }
}

/// GCS fault tolerance: the `ray.io/ft-enabled` annotation on the head; the reconnect timeout
/// on workers; the Redis address, credentials and storage namespace on the head.
pub(super) fn configure_gcs_fault_tolerance(
    cluster: &RayCluster,
    node_type: NodeType,
    pod_annotations: &mut BTreeMap<String, String>,
    container: &mut Container,
    params: &mut BTreeMap<String, String>,
) {
    let enabled = gcs_ft_enabled(cluster);
    if node_type == NodeType::Head {
        pod_annotations.insert(annotations::FT_ENABLED.into(), enabled.to_string());
    }
    if !enabled {
        return;
    }
    match node_type {
        // Workers wait 600 s (Ray's default is 60) for a restarted GCS before giving up.
        NodeType::Worker => push_env_if_absent(
            container,
            env(env_names::RAY_GCS_RPC_SERVER_RECONNECT_TIMEOUT_S, "600"),
        ),
        // The embedded RocksDB backend's variables and volume come with its PVC (`gcs_storage`).
        NodeType::Head if gcs_ft_embedded(&cluster.spec) => {}
        NodeType::Head => configure_redis(cluster, pod_annotations, container, params),
    }
}

/// The Redis storage namespace: the option, else the legacy annotation, else the cluster UID.
pub fn external_storage_namespace(cluster: &RayCluster) -> String {
    let options = cluster.spec.gcs_fault_tolerance_options.as_ref();
    options
        .and_then(|o| o.external_storage_namespace.clone())
        .filter(|n| !n.is_empty())
        .or_else(|| {
            cluster
                .annotations()
                .get(annotations::EXTERNAL_STORAGE_NAMESPACE)
                .cloned()
        })
        .unwrap_or_else(|| cluster.uid().unwrap_or_default())
}

pub(super) fn configure_redis(
    cluster: &RayCluster,
    pod_annotations: &mut BTreeMap<String, String>,
    container: &mut Container,
    params: &mut BTreeMap<String, String>,
) {
    let storage_namespace = external_storage_namespace(cluster);
    pod_annotations.insert(
        annotations::EXTERNAL_STORAGE_NAMESPACE.into(),
        storage_namespace.clone(),
    );
    push_env_if_absent(
        container,
        env(env_names::RAY_EXTERNAL_STORAGE_NAMESPACE, storage_namespace),
    );
    match &cluster.spec.gcs_fault_tolerance_options {
        Some(options) => {
            push_env(
                container,
                env(
                    env_names::RAY_REDIS_ADDRESS,
                    options.redis_address.clone().unwrap_or_default(),
                ),
            );
            // The credentials reach `ray start` through the environment, never the command line.
            if let Some(username) = &options.redis_username {
                params.insert("redis-username".into(), "$REDIS_USERNAME".into());
                push_env(
                    container,
                    credential_env(env_names::REDIS_USERNAME, username),
                );
            }
            if let Some(password) = &options.redis_password {
                params.insert("redis-password".into(), "$REDIS_PASSWORD".into());
                push_env(
                    container,
                    credential_env(env_names::REDIS_PASSWORD, password),
                );
            }
        }
        None => {
            // Legacy annotation mode: the cleanup Job reads the password from the environment.
            if let Some(password) = params.get("redis-password").cloned() {
                push_env_if_absent(container, env(env_names::REDIS_PASSWORD, password));
            }
        }
    }
}

pub(super) fn credential_env(
    name: &str,
    credential: &crate::api::raycluster::RedisCredential,
) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: credential.value.clone().filter(|v| !v.is_empty()),
        value_from: credential.value_from.clone(),
    }
}

/// Adds the `metrics` port (8080) when the Ray container has none of that name.
pub(super) fn ensure_metrics_port(container: &mut Container) {
    let ports = container.ports.get_or_insert_with(Vec::new);
    if !ports
        .iter()
        .any(|p| p.name.as_deref() == Some(ports::METRICS_NAME))
    {
        ports.push(ContainerPort {
            name: Some(ports::METRICS_NAME.into()),
            container_port: ports::METRICS,
            ..Default::default()
        });
    }
}

/// Token auth on the Ray container and the `wait-gcs-ready` init container.
pub(super) fn configure_token_auth(cluster: &str, spec: &mut PodSpec, auth: Option<&AuthOptions>) {
    set_token_auth_env(cluster, &mut spec.containers[RAY_CONTAINER], auth);
    if auth.and_then(|a| a.enable_k8s_token_auth) == Some(true) {
        let volumes = spec.volumes.get_or_insert_with(Vec::new);
        if !volumes.iter().any(|v| v.name == RAY_TOKEN_VOLUME) {
            volumes.push(Volume {
                name: RAY_TOKEN_VOLUME.into(),
                projected: Some(ProjectedVolumeSource {
                    sources: Some(vec![VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            path: "token".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    for init in spec.init_containers.iter_mut().flatten() {
        if init.name == WAIT_GCS_READY_CONTAINER_NAME {
            set_token_auth_env(cluster, init, auth);
        }
    }
}

/// Token auth on one container: `RAY_AUTH_MODE=token` and the token from the cluster's Secret
/// by reference (or the Kubernetes token mount); also used for RayJob submitters.
pub fn set_token_auth_env(cluster: &str, container: &mut Container, auth: Option<&AuthOptions>) {
    push_env_if_absent(container, env(env_names::RAY_AUTH_MODE, "token"));
    if auth.and_then(|a| a.enable_k8s_token_auth) == Some(true) {
        push_env_if_absent(container, env(env_names::RAY_ENABLE_K8S_TOKEN_AUTH, "true"));
        let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
        if !mounts.iter().any(|m| m.name == RAY_TOKEN_VOLUME) {
            mounts.push(VolumeMount {
                name: RAY_TOKEN_VOLUME.into(),
                mount_path: RAY_TOKEN_PATH.into(),
                read_only: Some(true),
                ..Default::default()
            });
        }
        return;
    }
    let secret = auth
        .and_then(|a| a.secret_name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| names::auth_secret_name(cluster));
    push_env_if_absent(
        container,
        EnvVar {
            name: env_names::RAY_AUTH_TOKEN.into(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret,
                    key: AUTH_TOKEN_SECRET_KEY.into(),
                    optional: None,
                }),
                ..Default::default()
            }),
        },
    );
}

/// The environment KubeRay gives the Ray container, in KubeRay's order.
pub(super) fn set_ray_container_env(
    container: &mut Container,
    facts: &ClusterFacts<'_>,
    node_type: NodeType,
    start_command: &str,
    options: &BuildOptions,
) {
    for default in &options.default_container_envs {
        push_env_if_absent(container, default.clone());
    }
    let local_or_fqdn = match node_type {
        NodeType::Head => "127.0.0.1".to_owned(),
        NodeType::Worker => {
            push_env(
                container,
                env(env_names::FQ_RAY_IP, facts.head_fqdn.clone()),
            );
            push_env(
                container,
                env(env_names::RAY_IP, names::ray_ip_from_fqdn(&facts.head_fqdn)),
            );
            facts.head_fqdn.clone()
        }
    };
    push_env(
        container,
        field_env(
            env_names::RAY_CLUSTER_NAME,
            &format!("metadata.labels['{}']", labels::CLUSTER),
        ),
    );
    push_env(
        container,
        field_env(env_names::RAY_CLUSTER_NAMESPACE, "metadata.namespace"),
    );
    push_env(
        container,
        field_env(env_names::RAY_CLOUD_INSTANCE_ID, "metadata.name"),
    );
    push_env(
        container,
        field_env(
            env_names::RAY_NODE_TYPE_NAME,
            &format!("metadata.labels['{}']", labels::GROUP),
        ),
    );
    push_env(
        container,
        env(env_names::KUBERAY_GEN_RAY_START_CMD, start_command),
    );
    push_env_if_absent(container, env(env_names::RAY_PORT, facts.head_port.clone()));
    if facts.creator == Creator::RayService {
        // Faster failure detection for serving clusters.
        push_env_if_absent(
            container,
            env(env_names::RAY_TIMEOUT_MS_TASK_WAIT_FOR_DEATH_INFO, "0"),
        );
        push_env_if_absent(
            container,
            env(env_names::RAY_GCS_SERVER_REQUEST_TIMEOUT_SECONDS, "5"),
        );
        push_env_if_absent(container, env(env_names::RAY_SERVE_KV_TIMEOUT_S, "5"));
    }
    push_env_if_absent(
        container,
        env(
            env_names::RAY_ADDRESS,
            format!("{local_or_fqdn}:{}", facts.head_port),
        ),
    );
    push_env_if_absent(
        container,
        env(env_names::RAY_USAGE_STATS_KUBERAY_IN_USE, "1"),
    );
    if node_type == NodeType::Head {
        push_env(
            container,
            env(
                env_names::RAY_USAGE_STATS_EXTRA_TAGS,
                format!(
                    "kuberay_version={};kuberay_crd={}",
                    keys::OPERATOR_VERSION,
                    facts.creator.as_str()
                ),
            ),
        );
    }
    push_env_if_absent(
        container,
        env(env_names::RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE, "1"),
    );
}
