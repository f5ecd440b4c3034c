//! Head and worker Pods, as KubeRay builds them from the group templates: labels, annotations,
//! the generated `ray start` command, environment, ports, probes, volumes, the worker init
//! container and the autoscaler sidecar.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction,
    HTTPGetAction, Pod, PodSpec, Probe, ProjectedVolumeSource, ResourceRequirements,
    SecretKeySelector, ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::ray_start;
use super::{BuildError, BuildOptions, env, field_env, has_env, shell_command};
use crate::api::raycluster::{
    AuthOptions, AutoscalerOptions, AutoscalerVersion, RayCluster, WorkerGroupSpec,
};
use crate::kuberay::keys::{self, annotations, env as env_names, labels, ports};
use crate::kuberay::names::{self, NodeType};
use crate::kuberay::spec::{
    Creator, auth_enabled, autoscaler_version, autoscaling_enabled, gcs_ft_embedded,
    gcs_ft_enabled, overwrite_container_cmd, ray_version_at_least,
};

/// The Ray container is always the first container of a Ray Pod.
pub const RAY_CONTAINER: usize = 0;
pub const AUTOSCALER_CONTAINER_NAME: &str = "autoscaler";
pub const WAIT_GCS_READY_CONTAINER_NAME: &str = "wait-gcs-ready";
const SHARED_MEMORY_VOLUME: &str = "shared-mem";
const SHARED_MEMORY_PATH: &str = "/dev/shm";
const RAY_LOGS_VOLUME: &str = "ray-logs";
const RAY_LOGS_PATH: &str = "/tmp/ray";
const RAY_TOKEN_VOLUME: &str = "ray-token";
const RAY_TOKEN_PATH: &str = "/var/run/secrets/ray.io/serviceaccount";
const AUTH_TOKEN_SECRET_KEY: &str = "auth_token";
/// Ray versions from this one serve a single HTTP health endpoint for probes.
const UNIFIED_HEALTH_CHECK_VERSION: (u64, u64, u64) = (2, 53, 0);

/// Where a worker Pod sits in its group: replica index, and for multi-host groups the
/// replica's name and the host's index within it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerReplica {
    pub replica_name: Option<String>,
    pub replica_index: u32,
    pub host_index: u32,
}

/// What every Pod of a cluster shares.
struct ClusterFacts<'a> {
    cluster: &'a RayCluster,
    name: String,
    namespace: String,
    head_fqdn: String,
    head_port: String,
    creator: Creator,
    autoscaling: bool,
}

impl<'a> ClusterFacts<'a> {
    fn new(cluster: &'a RayCluster, options: &BuildOptions) -> Self {
        let name = cluster.name_any();
        let namespace = cluster.namespace().unwrap_or_default();
        let head_params = cluster
            .spec
            .head_group_spec
            .ray_start_params
            .clone()
            .unwrap_or_default();
        ClusterFacts {
            head_fqdn: names::head_fqdn(&name, &namespace, &cluster.spec, &options.cluster_domain),
            head_port: ray_start::head_port(&head_params),
            creator: Creator::of(cluster),
            autoscaling: autoscaling_enabled(&cluster.spec),
            cluster,
            name,
            namespace,
        }
    }
}

/// The head Pod. `spec_hash` goes into `ray.io/upgrade-strategy-recreate-hash`.
pub fn head_pod(
    cluster: &RayCluster,
    options: &BuildOptions,
    spec_hash: &str,
) -> Result<Pod, BuildError> {
    let facts = ClusterFacts::new(cluster, options);
    let head = &cluster.spec.head_group_spec;
    let (mut meta, mut spec) = split_template(&head.template, "headGroupSpec.template")?;

    let pod_name = names::head_pod_name(&facts.name, options.deterministic_head_pod_name);
    if options.deterministic_head_pod_name {
        meta.name = Some(pod_name);
    } else {
        meta.generate_name = Some(pod_name);
    }
    meta.namespace = Some(facts.namespace.clone());

    let mut params = head.ray_start_params.clone().unwrap_or_default();
    ray_start::apply_group_resources(&mut params, &head.resources.clone().unwrap_or_default());
    let group_labels = head.labels.clone().unwrap_or_default();
    ray_start::apply_group_labels(&mut params, &group_labels);
    meta.labels = Some(pod_labels(
        NodeType::Head,
        &facts.name,
        labels::HEAD_GROUP,
        merged(meta.labels.take(), &group_labels),
    ));
    ray_start::set_missing_params(&mut params, NodeType::Head, &facts.head_port, "");

    let mut pod_annotations = meta.annotations.take().unwrap_or_default();
    if overwrite_container_cmd(cluster) {
        pod_annotations.insert(annotations::OVERWRITE_CONTAINER_CMD.into(), "true".into());
    }

    if facts.autoscaling {
        // The autoscaler sidecar replaces Ray's own monitor process.
        params.insert("no-monitor".into(), "true".into());
        spec.service_account_name = Some(names::autoscaler_service_account_name(
            &facts.name,
            &cluster.spec,
        ));
        let image = spec.containers[RAY_CONTAINER]
            .image
            .clone()
            .unwrap_or_default();
        let mut autoscaler = autoscaler_container(image, options.login_shell);
        if auth_enabled(&cluster.spec) {
            set_token_auth_env(
                &facts.name,
                &mut autoscaler,
                cluster.spec.auth_options.as_ref(),
            );
        }
        if let Some(overrides) = &cluster.spec.autoscaler_options {
            merge_autoscaler_overrides(&mut autoscaler, overrides);
        }
        spec.containers.push(autoscaler);
        match autoscaler_version(&cluster.spec) {
            Some(AutoscalerVersion::V2) => {
                push_env(
                    &mut spec.containers[RAY_CONTAINER],
                    env(env_names::RAY_ENABLE_AUTOSCALER_V2, "true"),
                );
                spec.restart_policy = Some("Never".into());
            }
            Some(AutoscalerVersion::V1) => {
                push_env(
                    &mut spec.containers[RAY_CONTAINER],
                    env(env_names::RAY_ENABLE_AUTOSCALER_V2, "false"),
                );
            }
            None => {}
        }
    }

    configure_gcs_fault_tolerance(
        cluster,
        NodeType::Head,
        &mut pod_annotations,
        &mut spec.containers[RAY_CONTAINER],
        &mut params,
    );
    ensure_metrics_port(&mut spec.containers[RAY_CONTAINER]);
    if auth_enabled(&cluster.spec) {
        configure_token_auth(&facts.name, &mut spec, cluster.spec.auth_options.as_ref());
    }

    spec.containers
        .extend(options.head_sidecar_containers.iter().cloned());
    add_defaults(&mut pod_annotations, &options.default_pod_annotations);
    let mut pod_labels = meta.labels.take().unwrap_or_default();
    add_defaults(&mut pod_labels, &options.default_pod_labels);
    meta.labels = Some(pod_labels);
    meta.annotations = Some(pod_annotations);

    let mut pod = finish_pod(&facts, meta, spec, NodeType::Head, params, options)?;
    let pod_annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    pod_annotations.insert(annotations::RECREATE_HASH.into(), spec_hash.to_owned());
    pod_annotations.insert(
        annotations::KUBERAY_VERSION.into(),
        keys::OPERATOR_VERSION.into(),
    );
    Ok(pod)
}

/// A worker Pod of `group` at position `replica`.
pub fn worker_pod(
    cluster: &RayCluster,
    group: &WorkerGroupSpec,
    replica: &WorkerReplica,
    options: &BuildOptions,
) -> Result<Pod, BuildError> {
    let facts = ClusterFacts::new(cluster, options);
    let what = format!("worker group {}", group.group_name);
    let (mut meta, mut spec) = split_template(&group.template, &what)?;
    meta.generate_name = Some(names::worker_pod_generate_name(
        &facts.name,
        &group.group_name,
    ));
    meta.namespace = Some(facts.namespace.clone());

    if options.init_container_injection {
        let wait = wait_gcs_ready_container(
            &spec.containers[RAY_CONTAINER],
            &facts.head_fqdn,
            &facts.head_port,
            options.login_shell,
        );
        spec.init_containers.get_or_insert_with(Vec::new).push(wait);
    }
    // Several Pods come from one template: only generateName may name them.
    meta.name = None;

    let mut params = group.ray_start_params.clone().unwrap_or_default();
    ray_start::apply_group_resources(&mut params, &group.resources.clone().unwrap_or_default());
    let group_labels = group.labels.clone().unwrap_or_default();
    ray_start::apply_group_labels(&mut params, &group_labels);
    let mut worker_labels = pod_labels(
        NodeType::Worker,
        &facts.name,
        &group.group_name,
        merged(meta.labels.take(), &group_labels),
    );
    worker_labels.insert(
        labels::REPLICA_INDEX.into(),
        replica.replica_index.to_string(),
    );
    if group.num_of_hosts.unwrap_or(1) > 1 {
        worker_labels.insert(
            labels::REPLICA_NAME.into(),
            replica.replica_name.clone().unwrap_or_default(),
        );
        worker_labels.insert(labels::HOST_INDEX.into(), replica.host_index.to_string());
    }
    ray_start::set_missing_params(
        &mut params,
        NodeType::Worker,
        &facts.head_port,
        &facts.head_fqdn,
    );

    let mut pod_annotations = meta.annotations.take().unwrap_or_default();
    if overwrite_container_cmd(cluster) {
        pod_annotations.insert(annotations::OVERWRITE_CONTAINER_CMD.into(), "true".into());
    }
    configure_gcs_fault_tolerance(
        cluster,
        NodeType::Worker,
        &mut pod_annotations,
        &mut spec.containers[RAY_CONTAINER],
        &mut params,
    );
    ensure_metrics_port(&mut spec.containers[RAY_CONTAINER]);
    if facts.autoscaling && autoscaler_version(&cluster.spec) == Some(AutoscalerVersion::V2) {
        spec.restart_policy = Some("Never".into());
    }
    if auth_enabled(&cluster.spec) {
        configure_token_auth(&facts.name, &mut spec, cluster.spec.auth_options.as_ref());
    }

    spec.containers
        .extend(options.worker_sidecar_containers.iter().cloned());
    add_defaults(&mut pod_annotations, &options.default_pod_annotations);
    add_defaults(&mut worker_labels, &options.default_pod_labels);
    meta.labels = Some(worker_labels);
    meta.annotations = Some(pod_annotations);

    finish_pod(&facts, meta, spec, NodeType::Worker, params, options)
}

/// The template's metadata and spec; the spec must have a container.
fn split_template(
    template: &k8s_openapi::api::core::v1::PodTemplateSpec,
    what: &str,
) -> Result<(ObjectMeta, PodSpec), BuildError> {
    let meta = template.metadata.clone().unwrap_or_default();
    let spec = template
        .spec
        .clone()
        .filter(|s| !s.containers.is_empty())
        .ok_or_else(|| BuildError::NoContainer(what.to_owned()))?;
    Ok((meta, spec))
}

/// Template labels with the group's `labels` on top.
fn merged(
    template_labels: Option<BTreeMap<String, String>>,
    group_labels: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut all = template_labels.unwrap_or_default();
    all.extend(group_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    all
}

/// The operator's labels with the user's on top, except the three that identify the Pod.
pub fn pod_labels(
    node_type: NodeType,
    cluster: &str,
    group: &str,
    user: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut all = BTreeMap::from([
        (labels::IS_RAY_NODE.to_owned(), labels::YES.to_owned()),
        (labels::CLUSTER.to_owned(), cluster.to_owned()),
        (labels::NODE_TYPE.to_owned(), node_type.as_str().to_owned()),
        (labels::GROUP.to_owned(), group.to_owned()),
        (
            labels::IDENTIFIER.to_owned(),
            names::identifier(cluster, node_type),
        ),
        (
            labels::APP_NAME.to_owned(),
            labels::APP_NAME_VALUE.to_owned(),
        ),
        (
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        ),
    ]);
    for (key, value) in user {
        if key == labels::NODE_TYPE || key == labels::GROUP || key == labels::CLUSTER {
            continue;
        }
        all.insert(key, value);
    }
    all
}

fn add_defaults(target: &mut BTreeMap<String, String>, defaults: &BTreeMap<String, String>) {
    for (key, value) in defaults {
        target.entry(key.clone()).or_insert_with(|| value.clone());
    }
}

fn push_env(container: &mut Container, var: EnvVar) {
    container.env.get_or_insert_with(Vec::new).push(var);
}

fn push_env_if_absent(container: &mut Container, var: EnvVar) {
    if !has_env(container.env.as_deref().unwrap_or_default(), &var.name) {
        push_env(container, var);
    }
}

/// GCS fault tolerance: the `ray.io/ft-enabled` annotation on the head; the reconnect timeout
/// on workers; the Redis address, credentials and storage namespace on the head.
fn configure_gcs_fault_tolerance(
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
        // The embedded RocksDB backend needs a feature gate raypipe does not offer; validation
        // refuses such clusters before any Pod is built.
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

fn configure_redis(
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

fn credential_env(name: &str, credential: &crate::api::raycluster::RedisCredential) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: credential.value.clone().filter(|v| !v.is_empty()),
        value_from: credential.value_from.clone(),
    }
}

/// Adds the `metrics` port (8080) when the Ray container has none of that name.
fn ensure_metrics_port(container: &mut Container) {
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
fn configure_token_auth(cluster: &str, spec: &mut PodSpec, auth: Option<&AuthOptions>) {
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

fn set_token_auth_env(cluster: &str, container: &mut Container, auth: Option<&AuthOptions>) {
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

pub(super) fn fixed_resources(cpu: &str, memory: &str) -> ResourceRequirements {
    let list = BTreeMap::from([
        ("cpu".to_owned(), Quantity(cpu.to_owned())),
        ("memory".to_owned(), Quantity(memory.to_owned())),
    ]);
    ResourceRequirements {
        limits: Some(list.clone()),
        requests: Some(list),
        ..Default::default()
    }
}

/// The autoscaler command; also exported as `KUBERAY_GEN_AUTOSCALER_START_CMD` so custom args
/// can run it.
pub const AUTOSCALER_START_COMMAND: &str = "ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) --cluster-namespace $(RAY_CLUSTER_NAMESPACE)";

fn autoscaler_container(image: String, login_shell: bool) -> Container {
    let cluster_label = format!("metadata.labels['{}']", labels::CLUSTER);
    Container {
        name: AUTOSCALER_CONTAINER_NAME.into(),
        image: Some(image),
        image_pull_policy: Some("IfNotPresent".into()),
        env: Some(vec![
            field_env(env_names::RAY_CLUSTER_NAME, &cluster_label),
            field_env(env_names::RAY_CLUSTER_NAMESPACE, "metadata.namespace"),
            field_env("RAY_HEAD_POD_NAME", "metadata.name"),
            env("KUBERAY_CRD_VER", "v1"),
            env(
                env_names::KUBERAY_GEN_AUTOSCALER_START_CMD,
                AUTOSCALER_START_COMMAND,
            ),
        ]),
        command: Some(shell_command(login_shell, "")),
        args: Some(vec![AUTOSCALER_START_COMMAND.into()]),
        resources: Some(fixed_resources("500m", "512Mi")),
        ..Default::default()
    }
}

fn merge_autoscaler_overrides(container: &mut Container, options: &AutoscalerOptions) {
    if let Some(resources) = &options.resources {
        container.resources = Some(resources.clone());
    }
    if let Some(image) = &options.image {
        container.image = Some(image.clone());
    }
    if let Some(policy) = &options.image_pull_policy {
        container.image_pull_policy = Some(policy.clone());
    }
    if let Some(extra) = options.env.as_ref().filter(|e| !e.is_empty()) {
        container
            .env
            .get_or_insert_with(Vec::new)
            .extend(extra.iter().cloned());
    }
    if let Some(extra) = options.env_from.as_ref().filter(|e| !e.is_empty()) {
        container
            .env_from
            .get_or_insert_with(Vec::new)
            .extend(extra.iter().cloned());
    }
    if let Some(extra) = options.volume_mounts.as_ref().filter(|e| !e.is_empty()) {
        container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .extend(extra.iter().cloned());
    }
    if let Some(context) = &options.security_context {
        container.security_context = Some(context.clone());
    }
    if let Some(command) = options.command.as_ref().filter(|c| !c.is_empty()) {
        container.command = Some(command.clone());
    }
    if let Some(args) = options.args.as_ref().filter(|a| !a.is_empty()) {
        container.args = Some(args.clone());
    }
}

/// The init container that holds a worker until the head's GCS answers `ray health-check`.
/// It shares the Ray container's image, security context, environment and mounts (TLS settings
/// may live there).
fn wait_gcs_ready_container(
    ray: &Container,
    head_fqdn: &str,
    head_port: &str,
    login_shell: bool,
) -> Container {
    let address = format!("{head_fqdn}:{head_port}");
    // Quiet for two minutes (the head is usually still starting), then show the check's output.
    let script = format!(
        r#"
SECONDS=0
while true; do
  if (( SECONDS <= 120 )); then
    if ray health-check --address {address} > /dev/null 2>&1; then
      echo "GCS is ready."
      break
    fi
    echo "$SECONDS seconds elapsed: waiting for the GCS at {address}."
  else
    if ray health-check --address {address}; then
      echo "GCS is ready; errors printed above can be ignored."
      break
    fi
    echo "$SECONDS seconds elapsed: still waiting for the GCS at {address}. Troubleshooting: https://docs.ray.io/en/master/cluster/kubernetes/troubleshooting.html"
  fi
  sleep 5
done
"#
    );
    Container {
        name: WAIT_GCS_READY_CONTAINER_NAME.into(),
        image: ray.image.clone(),
        image_pull_policy: ray.image_pull_policy.clone(),
        command: Some(shell_command(login_shell, "")),
        args: Some(vec![script]),
        security_context: ray.security_context.clone(),
        env: ray.env.clone(),
        volume_mounts: ray.volume_mounts.clone(),
        // Fixed and small: a ResourceQuota needs init containers to declare resources, and the
        // Ray container's GPUs must not be requested twice.
        resources: Some(fixed_resources("200m", "256Mi")),
        ..Default::default()
    }
}

/// The common end of head and worker Pods: volumes, the command, environment and probes.
fn finish_pod(
    facts: &ClusterFacts<'_>,
    mut meta: ObjectMeta,
    mut spec: PodSpec,
    node_type: NodeType,
    mut params: BTreeMap<String, String>,
    options: &BuildOptions,
) -> Result<Pod, BuildError> {
    if facts.creator == Creator::RayService {
        // Workers always serve; the RayService controller flips the head's label when its
        // proxy is healthy.
        let serve = if node_type == NodeType::Head {
            "false"
        } else {
            "true"
        };
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(labels::SERVE.into(), serve.into());
    }

    if !params.contains_key("plasma-directory") {
        add_empty_dir(
            &mut spec,
            RAY_CONTAINER,
            SHARED_MEMORY_VOLUME,
            SHARED_MEMORY_PATH,
            true,
        );
    }
    if node_type == NodeType::Head && facts.autoscaling {
        // The autoscaler writes event logs the head's dashboard reads.
        add_empty_dir(
            &mut spec,
            RAY_CONTAINER,
            RAY_LOGS_VOLUME,
            RAY_LOGS_PATH,
            false,
        );
        if let Some(index) = spec
            .containers
            .iter()
            .position(|c| c.name == AUTOSCALER_CONTAINER_NAME)
        {
            add_empty_dir(&mut spec, index, RAY_LOGS_VOLUME, RAY_LOGS_PATH, false);
        }
    }

    let ray = &spec.containers[RAY_CONTAINER];
    let user_command: String = ray
        .command
        .iter()
        .flatten()
        .chain(ray.args.iter().flatten())
        .map(|part| format!(" {part} "))
        .collect();
    ray_start::apply_container_resources(&mut params, ray.resources.as_ref());
    let start_command = ray_start::ray_start_command(node_type, &params);
    let overwrite = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::OVERWRITE_CONTAINER_CMD))
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if !overwrite && !user_command.contains("ray start") {
        let generated = format!(
            "ulimit -n ${{{}:-65536}}; {start_command}",
            env_names::RAY_START_ULIMIT_OPEN_FILES
        );
        // `ray start --block` never returns: the user's command must run first.
        let args = if user_command.is_empty() {
            generated
        } else {
            format!("{user_command} && {generated}")
        };
        let ray = &mut spec.containers[RAY_CONTAINER];
        ray.command = Some(shell_command(options.login_shell, ""));
        ray.args = Some(vec![args]);
    }

    let ray_ip = names::ray_ip_from_fqdn(&facts.head_fqdn).to_owned();
    for init in spec.init_containers.iter_mut().flatten() {
        push_env(init, env(env_names::FQ_RAY_IP, facts.head_fqdn.clone()));
        push_env(init, env(env_names::RAY_IP, ray_ip.clone()));
    }
    set_ray_container_env(
        &mut spec.containers[RAY_CONTAINER],
        facts,
        node_type,
        &start_command,
        options,
    );
    if options.probes_injection {
        inject_probes(
            &mut spec.containers[RAY_CONTAINER],
            node_type,
            facts.creator,
            &params,
            facts
                .cluster
                .spec
                .ray_version
                .as_deref()
                .unwrap_or_default(),
        );
    }

    meta.owner_references = Some(vec![crate::k8s::controller_owner_ref(facts.cluster)?]);
    Ok(Pod {
        metadata: meta,
        spec: Some(spec),
        status: None,
    })
}

/// Mounts an emptyDir at `path` in container `index` unless something is mounted there
/// already; a memory-backed one is sized like the container's memory limit (else request).
fn add_empty_dir(spec: &mut PodSpec, index: usize, volume: &str, path: &str, in_memory: bool) {
    let container = &mut spec.containers[index];
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    if mounts.iter().any(|m| m.mount_path == path) {
        return;
    }
    mounts.push(VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        ..Default::default()
    });
    let size_limit = in_memory
        .then(|| {
            let resources = container.resources.as_ref()?;
            let find = |list: Option<&BTreeMap<String, Quantity>>| list?.get("memory").cloned();
            find(resources.limits.as_ref()).or_else(|| find(resources.requests.as_ref()))
        })
        .flatten();
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    if !volumes.iter().any(|v| v.name == volume) {
        volumes.push(Volume {
            name: volume.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: in_memory.then(|| "Memory".to_owned()),
                size_limit,
            }),
            ..Default::default()
        });
    }
}

/// The environment KubeRay gives the Ray container, in KubeRay's order.
fn set_ray_container_env(
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

/// A health check through the dashboard agent or dashboard.
fn wget_check(timeout_seconds: i32, port: i32, path: &str) -> String {
    format!(
        "wget --tries 1 -T {timeout_seconds} -q -O- http://localhost:{port}/{path} | grep success"
    )
}

/// Liveness and readiness probes where the user set none: HTTP `/api/healthz` on the dashboard
/// agent for Ray >= 2.53, else `wget` checks of the raylet (and the GCS on the head).
fn inject_probes(
    container: &mut Container,
    node_type: NodeType,
    creator: Creator,
    params: &BTreeMap<String, String>,
    ray_version: &str,
) {
    let port_param = |key: &str, default: i32| {
        params
            .get(key)
            .and_then(|v| v.parse::<i32>().ok())
            .unwrap_or(default)
    };
    let agent_port = port_param("dashboard-agent-listen-port", ports::DASHBOARD_AGENT);
    let dashboard_port = port_param("dashboard-port", ports::DASHBOARD);
    let http = ray_version_at_least(ray_version, UNIFIED_HEALTH_CHECK_VERSION);
    let mut checks = vec![wget_check(2, agent_port, "api/local_raylet_healthz")];
    if node_type == NodeType::Head {
        checks.push(wget_check(10, dashboard_port, "api/gcs_healthz"));
    }
    let exec = |checks: &[String]| ExecAction {
        command: Some(vec!["bash".into(), "-c".into(), checks.join(" && ")]),
    };
    let http_get = HTTPGetAction {
        path: Some("/api/healthz".into()),
        port: IntOrString::Int(agent_port),
        ..Default::default()
    };
    let timeout = if node_type == NodeType::Head { 5 } else { 2 };
    let probe = |initial_delay: i32, failure_threshold: i32| {
        let mut probe = Probe {
            initial_delay_seconds: Some(initial_delay),
            timeout_seconds: Some(timeout),
            period_seconds: Some(5),
            success_threshold: Some(1),
            failure_threshold: Some(failure_threshold),
            ..Default::default()
        };
        if http {
            probe.http_get = Some(http_get.clone());
        } else {
            probe.exec = Some(exec(&checks));
        }
        probe
    };
    if container.liveness_probe.is_none() {
        container.liveness_probe = Some(probe(30, 120));
    }
    if container.readiness_probe.is_none() {
        let mut readiness = probe(10, 10);
        if creator == Creator::RayService && node_type == NodeType::Worker {
            // A serving worker leaves the serve Service as soon as its proxy fails once.
            let serve_port = container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(ports::SERVE_NAME))
                .map_or(ports::SERVE, |p| p.container_port);
            let mut with_proxy = checks.clone();
            with_proxy.push(wget_check(10, serve_port, "-/healthz"));
            readiness.failure_threshold = Some(1);
            readiness.http_get = None;
            readiness.exec = Some(exec(&with_proxy));
        }
        container.readiness_probe = Some(readiness);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    use crate::controllers::raycluster::builders::test_cluster as cluster;

    fn sample() -> RayCluster {
        cluster(json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "raycluster-kuberay"},
            "spec": {
                "rayVersion": "2.52.0",
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
                    "name": "ray-head", "image": "rayproject/ray:2.52.0",
                    "resources": {"limits": {"cpu": "1", "memory": "5Gi"}, "requests": {"cpu": "1", "memory": "5Gi"}},
                    "ports": [{"containerPort": 6379, "name": "gcs-server"}, {"containerPort": 8265, "name": "dashboard"}, {"containerPort": 10001, "name": "client"}]
                }]}}},
                "workerGroupSpecs": [{"groupName": "workergroup", "replicas": 1, "minReplicas": 1, "maxReplicas": 5, "rayStartParams": {},
                    "template": {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.52.0",
                        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}}]}}}]
            }
        }))
    }

    fn env_of(container: &Container) -> Vec<(String, Value)> {
        container
            .env
            .iter()
            .flatten()
            .map(|e| {
                let v = match (&e.value, &e.value_from) {
                    (Some(v), _) => json!(v),
                    (None, Some(from)) => serde_json::to_value(from).expect("json"),
                    (None, None) => Value::Null,
                };
                (e.name.clone(), v)
            })
            .collect()
    }

    fn names_of(container: &Container) -> Vec<String> {
        env_of(container).into_iter().map(|(n, _)| n).collect()
    }

    #[test]
    fn head_pod_of_the_kuberay_sample() {
        let pod = head_pod(&sample(), &BuildOptions::default(), "hash").expect("builds");
        let meta = &pod.metadata;
        assert_eq!(
            meta.generate_name.as_deref(),
            Some("raycluster-kuberay-head-")
        );
        assert_eq!(meta.name, None);
        assert_eq!(meta.namespace.as_deref(), Some("ns"));
        let labels = meta.labels.clone().unwrap_or_default();
        assert_eq!(
            serde_json::to_value(&labels).expect("json"),
            json!({
                "app.kubernetes.io/created-by": "kuberay-operator",
                "app.kubernetes.io/name": "kuberay",
                "ray.io/cluster": "raycluster-kuberay",
                "ray.io/group": "headgroup",
                "ray.io/identifier": "raycluster-kuberay-head",
                "ray.io/is-ray-node": "yes",
                "ray.io/node-type": "head"
            })
        );
        let annotations = meta.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get("ray.io/ft-enabled").map(String::as_str),
            Some("false")
        );
        assert_eq!(
            annotations
                .get("ray.io/upgrade-strategy-recreate-hash")
                .map(String::as_str),
            Some("hash")
        );
        assert_eq!(
            annotations
                .get("ray.io/kuberay-version")
                .map(String::as_str),
            Some(keys::OPERATOR_VERSION)
        );
        let owner = &meta.owner_references.as_ref().expect("owned")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("RayCluster", "uid-1", Some(true))
        );

        let spec = pod.spec.expect("spec");
        let ray = &spec.containers[0];
        assert_eq!(
            ray.command.as_deref(),
            Some(&["/bin/bash".to_owned(), "-c".into(), "--".into()][..])
        );
        let expected_start = "ray start --head  --block  --dashboard-agent-listen-port=52365  --dashboard-host=0.0.0.0  --memory=5368709120  --metrics-export-port=8080  --num-cpus=1 ";
        assert_eq!(
            ray.args.as_deref(),
            Some(
                &[format!(
                    "ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {expected_start}"
                )][..]
            )
        );
        let ports: Vec<_> = ray
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap_or_default(), p.container_port))
            .collect();
        assert_eq!(
            ports,
            [
                ("gcs-server".to_owned(), 6379),
                ("dashboard".into(), 8265),
                ("client".into(), 10001),
                ("metrics".into(), 8080)
            ]
        );
        assert_eq!(
            env_of(ray),
            vec![
                (
                    "RAY_CLUSTER_NAME".to_owned(),
                    json!({"fieldRef": {"fieldPath": "metadata.labels['ray.io/cluster']"}})
                ),
                (
                    "RAY_CLUSTER_NAMESPACE".into(),
                    json!({"fieldRef": {"fieldPath": "metadata.namespace"}})
                ),
                (
                    "RAY_CLOUD_INSTANCE_ID".into(),
                    json!({"fieldRef": {"fieldPath": "metadata.name"}})
                ),
                (
                    "RAY_NODE_TYPE_NAME".into(),
                    json!({"fieldRef": {"fieldPath": "metadata.labels['ray.io/group']"}})
                ),
                ("KUBERAY_GEN_RAY_START_CMD".into(), json!(expected_start)),
                ("RAY_PORT".into(), json!("6379")),
                ("RAY_ADDRESS".into(), json!("127.0.0.1:6379")),
                ("RAY_USAGE_STATS_KUBERAY_IN_USE".into(), json!("1")),
                (
                    "RAY_USAGE_STATS_EXTRA_TAGS".into(),
                    json!(format!(
                        "kuberay_version={};kuberay_crd=RayCluster",
                        keys::OPERATOR_VERSION
                    ))
                ),
                ("RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE".into(), json!("1")),
            ]
        );
        let liveness = ray.liveness_probe.as_ref().expect("liveness");
        assert_eq!(
            serde_json::to_value(liveness).expect("json"),
            json!({
                "exec": {"command": ["bash", "-c", "wget --tries 1 -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep success && wget --tries 1 -T 10 -q -O- http://localhost:8265/api/gcs_healthz | grep success"]},
                "initialDelaySeconds": 30, "timeoutSeconds": 5, "periodSeconds": 5, "successThreshold": 1, "failureThreshold": 120
            })
        );
        let readiness = ray.readiness_probe.as_ref().expect("readiness");
        assert_eq!(
            (
                readiness.initial_delay_seconds,
                readiness.failure_threshold,
                readiness.timeout_seconds
            ),
            (Some(10), Some(10), Some(5))
        );
        assert_eq!(
            serde_json::to_value(&spec.volumes).expect("json"),
            json!([{"name": "shared-mem", "emptyDir": {"medium": "Memory", "sizeLimit": "5Gi"}}])
        );
        assert_eq!(
            ray.volume_mounts.as_ref().map(|m| m[0].mount_path.as_str()),
            Some("/dev/shm")
        );
        assert!(
            spec.init_containers.is_none(),
            "no init container on the head"
        );
    }

    #[test]
    fn worker_pod_of_the_kuberay_sample() {
        let cluster = sample();
        let group = &cluster.spec.worker_group_specs.as_ref().expect("groups")[0];
        let replica = WorkerReplica {
            replica_index: 3,
            ..Default::default()
        };
        let pod = worker_pod(&cluster, group, &replica, &BuildOptions::default()).expect("builds");
        assert_eq!(
            pod.metadata.generate_name.as_deref(),
            Some("raycluster-kuberay-workergroup-worker-")
        );
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("ray.io/node-type").map(String::as_str),
            Some("worker")
        );
        assert_eq!(
            labels.get("ray.io/group").map(String::as_str),
            Some("workergroup")
        );
        assert_eq!(
            labels.get("ray.io/identifier").map(String::as_str),
            Some("raycluster-kuberay-worker")
        );
        assert_eq!(
            labels
                .get("ray.io/worker-group-replica-index")
                .map(String::as_str),
            Some("3")
        );
        assert!(!labels.contains_key("ray.io/worker-group-replica-name"));
        assert!(
            !pod.metadata
                .annotations
                .clone()
                .unwrap_or_default()
                .contains_key("ray.io/ft-enabled")
        );

        let spec = pod.spec.expect("spec");
        let fqdn = "raycluster-kuberay-head-svc.ns.svc.cluster.local";
        let expected_start = format!(
            "ray start  --address={fqdn}:6379  --block  --dashboard-agent-listen-port=52365  --memory=1073741824  --metrics-export-port=8080  --num-cpus=1 "
        );
        let ray = &spec.containers[0];
        assert_eq!(
            ray.args.as_deref(),
            Some(
                &[format!(
                    "ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {expected_start}"
                )][..]
            )
        );
        assert_eq!(
            names_of(ray),
            [
                "FQ_RAY_IP",
                "RAY_IP",
                "RAY_CLUSTER_NAME",
                "RAY_CLUSTER_NAMESPACE",
                "RAY_CLOUD_INSTANCE_ID",
                "RAY_NODE_TYPE_NAME",
                "KUBERAY_GEN_RAY_START_CMD",
                "RAY_PORT",
                "RAY_ADDRESS",
                "RAY_USAGE_STATS_KUBERAY_IN_USE",
                "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE"
            ]
        );
        let env = env_of(ray);
        assert!(env.contains(&("RAY_IP".into(), json!("raycluster-kuberay-head-svc"))));
        assert!(env.contains(&("RAY_ADDRESS".into(), json!(format!("{fqdn}:6379")))));
        let probe = ray.readiness_probe.as_ref().expect("readiness");
        assert_eq!(probe.timeout_seconds, Some(2));
        assert_eq!(
            probe.exec.as_ref().and_then(|e| e.command.clone()),
            Some(vec!["bash".into(), "-c".into(), "wget --tries 1 -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep success".into()])
        );
        let init = &spec.init_containers.as_ref().expect("init")[0];
        assert_eq!(init.name, "wait-gcs-ready");
        assert_eq!(init.image.as_deref(), Some("rayproject/ray:2.52.0"));
        assert!(
            init.args.as_ref().expect("args")[0]
                .contains(&format!("ray health-check --address {fqdn}:6379"))
        );
        assert_eq!(names_of(init), ["FQ_RAY_IP", "RAY_IP"]);
        assert_eq!(
            init.resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("cpu"))
                .map(|q| q.0.as_str()),
            Some("200m")
        );
    }

    #[test]
    fn user_command_runs_before_ray_start_unless_it_starts_ray_itself() {
        let mut cluster = sample();
        let head = cluster
            .spec
            .head_group_spec
            .template
            .spec
            .as_mut()
            .expect("spec");
        head.containers[0].command = Some(vec!["echo".into(), "hello".into()]);
        let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
        let args = pod.spec.expect("spec").containers[0]
            .args
            .clone()
            .expect("args");
        assert!(
            args[0].starts_with(" echo  hello  && ulimit -n"),
            "{}",
            args[0]
        );

        let head = cluster
            .spec
            .head_group_spec
            .template
            .spec
            .as_mut()
            .expect("spec");
        head.containers[0].command = Some(vec!["ray start --head --block".into()]);
        let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
        let ray = &pod.spec.expect("spec").containers[0];
        assert_eq!(ray.command, Some(vec!["ray start --head --block".into()]));
        assert_eq!(ray.args, None);
        assert!(names_of(ray).contains(&"KUBERAY_GEN_RAY_START_CMD".into()));
    }

    #[test]
    fn overwrite_annotation_keeps_the_user_command() {
        let mut cluster = sample();
        cluster.metadata.annotations = Some(BTreeMap::from([(
            annotations::OVERWRITE_CONTAINER_CMD.into(),
            "True".into(),
        )]));
        let head = cluster
            .spec
            .head_group_spec
            .template
            .spec
            .as_mut()
            .expect("spec");
        head.containers[0].args = Some(vec!["$KUBERAY_GEN_RAY_START_CMD".into()]);
        let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
        assert_eq!(
            pod.metadata
                .annotations
                .expect("annotations")
                .get(annotations::OVERWRITE_CONTAINER_CMD)
                .map(String::as_str),
            Some("true")
        );
        let ray = &pod.spec.expect("spec").containers[0];
        assert_eq!(ray.args, Some(vec!["$KUBERAY_GEN_RAY_START_CMD".into()]));
        assert_eq!(ray.command, None);
    }

    #[test]
    fn labels_cannot_override_identity_but_can_override_the_rest() {
        let user = BTreeMap::from([
            ("ray.io/cluster".to_owned(), "other".to_owned()),
            ("ray.io/node-type".to_owned(), "worker".to_owned()),
            ("ray.io/group".to_owned(), "x".to_owned()),
            ("app.kubernetes.io/name".to_owned(), "mine".to_owned()),
            ("team".to_owned(), "a".to_owned()),
        ]);
        let labels = pod_labels(NodeType::Head, "c", "headgroup", user);
        assert_eq!(labels["ray.io/cluster"], "c");
        assert_eq!(labels["ray.io/node-type"], "head");
        assert_eq!(labels["ray.io/group"], "headgroup");
        assert_eq!(labels["app.kubernetes.io/name"], "mine");
        assert_eq!(labels["team"], "a");
    }

    #[test]
    fn autoscaler_sidecar_and_v2_settings() {
        let mut cluster = sample();
        cluster.spec.enable_in_tree_autoscaling = Some(true);
        cluster.spec.autoscaler_options = Some(AutoscalerOptions {
            version: Some(AutoscalerVersion::V2),
            env: Some(vec![env("AUTOSCALER_UPDATE_INTERVAL_S", "10")]),
            command: Some(vec!["/bin/bash".into(), "-lc".into(), "--".into()]),
            ..Default::default()
        });
        let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
        let spec = pod.spec.expect("spec");
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("raycluster-kuberay")
        );
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let ray = &spec.containers[0];
        assert!(ray.args.as_ref().expect("args")[0].contains(" --no-monitor "));
        assert_eq!(names_of(ray)[0], "RAY_enable_autoscaler_v2");
        let autoscaler = &spec.containers[1];
        assert_eq!(autoscaler.name, "autoscaler");
        assert_eq!(autoscaler.image.as_deref(), Some("rayproject/ray:2.52.0"));
        assert_eq!(
            autoscaler.command.as_deref(),
            Some(&["/bin/bash".to_owned(), "-lc".into(), "--".into()][..])
        );
        assert_eq!(
            autoscaler.args.as_deref(),
            Some(&[AUTOSCALER_START_COMMAND.to_owned()][..])
        );
        assert_eq!(
            names_of(autoscaler),
            [
                "RAY_CLUSTER_NAME",
                "RAY_CLUSTER_NAMESPACE",
                "RAY_HEAD_POD_NAME",
                "KUBERAY_CRD_VER",
                "KUBERAY_GEN_AUTOSCALER_START_CMD",
                "AUTOSCALER_UPDATE_INTERVAL_S"
            ]
        );
        // Both containers share the log directory.
        for c in &spec.containers {
            assert!(
                c.volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.mount_path == "/tmp/ray" && m.name == "ray-logs"),
                "{}",
                c.name
            );
        }
        let group = &cluster.spec.worker_group_specs.as_ref().expect("groups")[0];
        let worker = worker_pod(
            &cluster,
            group,
            &WorkerReplica::default(),
            &BuildOptions::default(),
        )
        .expect("builds");
        assert_eq!(
            worker.spec.expect("spec").restart_policy.as_deref(),
            Some("Never")
        );
    }

    #[test]
    fn redis_fault_tolerance_wiring() {
        let mut cluster = sample();
        cluster.spec.gcs_fault_tolerance_options = Some(serde_json::from_value(json!({
            "redisAddress": "redis:6379",
            "redisUsername": {"value": "default"},
            "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "redis", "key": "password"}}}
        })).expect("options"));
        let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
        let annotations = pod.metadata.annotations.clone().expect("annotations");
        assert_eq!(annotations["ray.io/ft-enabled"], "true");
        assert_eq!(annotations["ray.io/external-storage-namespace"], "uid-1");
        let ray = &pod.spec.expect("spec").containers[0];
        let env = env_of(ray);
        assert_eq!(
            env[0],
            ("RAY_external_storage_namespace".into(), json!("uid-1"))
        );
        assert_eq!(env[1], ("RAY_REDIS_ADDRESS".into(), json!("redis:6379")));
        assert_eq!(env[2], ("REDIS_USERNAME".into(), json!("default")));
        assert_eq!(
            env[3],
            (
                "REDIS_PASSWORD".into(),
                json!({"secretKeyRef": {"name": "redis", "key": "password"}})
            )
        );
        let args = &ray.args.as_ref().expect("args")[0];
        assert!(
            args.contains(" --redis-password=$REDIS_PASSWORD  --redis-username=$REDIS_USERNAME "),
            "{args}"
        );

        let group = &cluster.spec.worker_group_specs.as_ref().expect("groups")[0];
        let worker = worker_pod(
            &cluster,
            group,
            &WorkerReplica::default(),
            &BuildOptions::default(),
        )
        .expect("builds");
        let worker_env = names_of(&worker.spec.expect("spec").containers[0]);
        assert_eq!(worker_env[0], "RAY_gcs_rpc_server_reconnect_timeout_s");
        assert!(!worker_env.contains(&"RAY_REDIS_ADDRESS".to_owned()));
    }

    #[test]
    fn token_auth_env_on_ray_autoscaler_and_init_containers() {
        let mut cluster = sample();
        cluster.spec.enable_in_tree_autoscaling = Some(true);
        cluster.spec.auth_options =
            Some(serde_json::from_value(json!({"mode": "token"})).expect("auth"));
        let token = json!({"secretKeyRef": {"name": "raycluster-kuberay", "key": "auth_token"}});
        let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
        for container in &pod.spec.expect("spec").containers {
            let env = env_of(container);
            assert!(
                env.contains(&("RAY_AUTH_MODE".into(), json!("token"))),
                "{}",
                container.name
            );
            assert!(
                env.contains(&("RAY_AUTH_TOKEN".into(), token.clone())),
                "{}",
                container.name
            );
        }
        let group = &cluster.spec.worker_group_specs.as_ref().expect("groups")[0];
        let worker = worker_pod(
            &cluster,
            group,
            &WorkerReplica::default(),
            &BuildOptions::default(),
        )
        .expect("builds");
        let init = &worker.spec.expect("spec").init_containers.expect("init")[0];
        assert_eq!(
            names_of(init),
            ["RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "FQ_RAY_IP", "RAY_IP"]
        );
    }

    #[test]
    fn multi_host_labels_and_group_resources() {
        let mut cluster = sample();
        let group = &mut cluster.spec.worker_group_specs.as_mut().expect("groups")[0];
        group.num_of_hosts = Some(2);
        group.resources = Some(BTreeMap::from([
            ("CPU".into(), "1".into()),
            ("batch_slot".into(), "4".into()),
        ]));
        group.labels = Some(BTreeMap::from([("example.com/role".into(), "cpu".into())]));
        let group = group.clone();
        let replica = WorkerReplica {
            replica_name: Some("workergroup-abcde".into()),
            replica_index: 1,
            host_index: 1,
        };
        let pod = worker_pod(&cluster, &group, &replica, &BuildOptions::default()).expect("builds");
        let labels = pod.metadata.labels.expect("labels");
        assert_eq!(
            labels["ray.io/worker-group-replica-name"],
            "workergroup-abcde"
        );
        assert_eq!(labels["ray.io/worker-group-replica-index"], "1");
        assert_eq!(labels["ray.io/replica-host-index"], "1");
        assert_eq!(labels["example.com/role"], "cpu");
        let args = &pod.spec.expect("spec").containers[0]
            .args
            .clone()
            .expect("args")[0];
        assert!(args.contains(" --labels=example.com/role=cpu "), "{args}");
        assert!(
            args.contains(" --resources='{\"batch_slot\":4}' "),
            "{args}"
        );
        assert!(args.contains(" --num-cpus=1 "), "{args}");
    }

    #[test]
    fn http_probes_from_ray_2_53_and_rayservice_worker_readiness() {
        let mut cluster = sample();
        cluster.spec.ray_version = Some("2.53.0".into());
        let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
        let probe = pod.spec.expect("spec").containers[0]
            .liveness_probe
            .clone()
            .expect("probe");
        assert_eq!(
            probe.http_get.as_ref().and_then(|h| h.path.as_deref()),
            Some("/api/healthz")
        );
        assert_eq!(
            probe.http_get.map(|h| h.port),
            Some(IntOrString::Int(52365))
        );

        cluster.metadata.labels = Some(BTreeMap::from([(
            "ray.io/originated-from-crd".into(),
            "RayService".into(),
        )]));
        let group = cluster.spec.worker_group_specs.as_ref().expect("groups")[0].clone();
        let worker = worker_pod(
            &cluster,
            &group,
            &WorkerReplica::default(),
            &BuildOptions::default(),
        )
        .expect("builds");
        assert_eq!(
            worker.metadata.labels.expect("labels")["ray.io/serve"],
            "true"
        );
        let ray = &worker.spec.expect("spec").containers[0];
        let readiness = ray.readiness_probe.as_ref().expect("readiness");
        assert_eq!(readiness.failure_threshold, Some(1));
        let command = readiness
            .exec
            .as_ref()
            .and_then(|e| e.command.clone())
            .expect("exec");
        assert!(
            command[2].ends_with(
                "&& wget --tries 1 -T 10 -q -O- http://localhost:8000/-/healthz | grep success"
            ),
            "{}",
            command[2]
        );
        assert!(names_of(ray).contains(&"RAY_SERVE_KV_TIMEOUT_S".into()));
        assert!(ray_version_at_least("v2.60", (2, 53, 0)));
        assert!(!ray_version_at_least("nightly", (2, 53, 0)));
        assert!(!ray_version_at_least("2.52.9", (2, 53, 0)));
    }

    #[test]
    fn user_probes_and_shm_mounts_are_kept() {
        let mut cluster = sample();
        let head = cluster
            .spec
            .head_group_spec
            .template
            .spec
            .as_mut()
            .expect("spec");
        head.containers[0].readiness_probe = Some(Probe {
            period_seconds: Some(99),
            ..Default::default()
        });
        head.containers[0].volume_mounts = Some(vec![VolumeMount {
            name: "mine".into(),
            mount_path: "/dev/shm".into(),
            ..Default::default()
        }]);
        let options = BuildOptions {
            probes_injection: true,
            ..Default::default()
        };
        let pod = head_pod(&cluster, &options, "h").expect("builds");
        let spec = pod.spec.expect("spec");
        assert_eq!(
            spec.containers[0]
                .readiness_probe
                .as_ref()
                .and_then(|p| p.period_seconds),
            Some(99)
        );
        assert!(spec.containers[0].liveness_probe.is_some());
        assert!(
            spec.volumes.is_none(),
            "no shared-mem volume when /dev/shm is mounted"
        );

        let off = BuildOptions {
            probes_injection: false,
            init_container_injection: false,
            ..Default::default()
        };
        let group = cluster.spec.worker_group_specs.as_ref().expect("groups")[0].clone();
        let worker = worker_pod(&cluster, &group, &WorkerReplica::default(), &off).expect("builds");
        let spec = worker.spec.expect("spec");
        assert!(spec.init_containers.is_none());
        assert!(spec.containers[0].liveness_probe.is_none());
    }

    #[test]
    fn deterministic_head_name_and_operator_defaults() {
        let options = BuildOptions {
            deterministic_head_pod_name: true,
            default_pod_labels: BTreeMap::from([
                ("ray.io/cluster".into(), "x".into()),
                ("team".into(), "t".into()),
            ]),
            default_container_envs: vec![env("EXTRA", "1")],
            ..Default::default()
        };
        let pod = head_pod(&sample(), &options, "h").expect("builds");
        assert_eq!(
            pod.metadata.name.as_deref(),
            Some("raycluster-kuberay-head")
        );
        assert_eq!(pod.metadata.generate_name, None);
        let labels = pod.metadata.labels.expect("labels");
        assert_eq!(
            labels["ray.io/cluster"], "raycluster-kuberay",
            "defaults never replace"
        );
        assert_eq!(labels["team"], "t");
        assert_eq!(names_of(&pod.spec.expect("spec").containers[0])[0], "EXTRA");
    }
}
