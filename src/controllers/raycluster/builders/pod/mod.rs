//! Head and worker Pods, as KubeRay builds them from the group templates: labels, annotations,
//! the generated `ray start` command, environment, ports, probes, volumes, the worker init
//! container and the autoscaler sidecar. This file assembles the Pods (labels, template
//! merge, volumes); `env_vars`, `probes` and `sidecars` add their parts; `tests` checks them.

#[cfg(test)]
mod batch_tests;
pub mod env_vars;
mod history;
#[cfg(test)]
mod history_tests;
#[cfg(test)]
mod kuberay_golden;
mod probes;
pub(super) mod sidecars;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Pod, PodSpec, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::ray_start;
use super::{BuildError, BuildOptions, env, shell_command};
use crate::api::raycluster::{AutoscalerVersion, RayCluster, WorkerGroupSpec};
use crate::kuberay::keys::{self, annotations, env as env_names, labels};
use crate::kuberay::names::{self, NodeType};
use crate::kuberay::spec::{
    Creator, auth_enabled, autoscaler_version, autoscaling_enabled, overwrite_container_cmd,
    tls_enabled,
};
use env_vars::{
    configure_gcs_fault_tolerance, configure_token_auth, ensure_metrics_port, push_env,
    set_ray_container_env, set_token_auth_env,
};
use probes::inject_probes;
use sidecars::{autoscaler_container, merge_autoscaler_overrides, wait_gcs_ready_container};

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
    super::gcs_storage::configure_head(cluster, &mut spec, RAY_CONTAINER);
    ensure_metrics_port(&mut spec.containers[RAY_CONTAINER]);
    if auth_enabled(&cluster.spec) {
        configure_token_auth(&facts.name, &mut spec, cluster.spec.auth_options.as_ref());
    }
    if tls_enabled(&cluster.spec) {
        for container in spec.containers.iter_mut() {
            if container.name == AUTOSCALER_CONTAINER_NAME {
                super::mtls::set_container_tls(container);
            }
        }
        super::mtls::configure_pod(&facts.name, NodeType::Head, &mut spec, RAY_CONTAINER);
    }
    add_collector(&facts, NodeType::Head, &mut spec, options);

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
    // Last, as KubeRay calls the scheduler on the finished Pod.
    if let Some(scheduler) = options.batch_scheduler {
        super::batch_scheduler::add_pod_metadata(scheduler, cluster, &mut pod, labels::HEAD_GROUP);
    }
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
    if tls_enabled(&cluster.spec) {
        super::mtls::configure_pod(&facts.name, NodeType::Worker, &mut spec, RAY_CONTAINER);
    }
    add_collector(&facts, NodeType::Worker, &mut spec, options);

    spec.containers
        .extend(options.worker_sidecar_containers.iter().cloned());
    add_defaults(&mut pod_annotations, &options.default_pod_annotations);
    add_defaults(&mut worker_labels, &options.default_pod_labels);
    meta.labels = Some(worker_labels);
    meta.annotations = Some(pod_annotations);

    let mut pod = finish_pod(&facts, meta, spec, NodeType::Worker, params, options)?;
    if let Some(scheduler) = options.batch_scheduler {
        super::batch_scheduler::add_pod_metadata(scheduler, cluster, &mut pod, &group.group_name);
    }
    Ok(pod)
}

/// The history-server collector after the operator's own containers (and before the config
/// file's sidecars), with the cluster's token where auth is on: it reads the dashboard.
fn add_collector(
    facts: &ClusterFacts<'_>,
    node_type: NodeType,
    spec: &mut PodSpec,
    options: &BuildOptions,
) {
    let Some(collector_options) =
        history::collector_options(facts).filter(|_| options.history_server)
    else {
        return;
    };
    let mut collector = history::collector_container(facts, collector_options, node_type);
    if auth_enabled(&facts.cluster.spec) {
        set_token_auth_env(
            &facts.name,
            &mut collector,
            facts.cluster.spec.auth_options.as_ref(),
        );
    }
    spec.containers.push(collector);
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
        let autoscaler = spec
            .containers
            .iter()
            .position(|c| c.name == AUTOSCALER_CONTAINER_NAME);
        share_ray_logs(&mut spec, autoscaler);
    }
    let collector = history::collector_index(&spec).filter(|_| options.history_server);
    if collector.is_some() {
        // The collector ships the session logs Ray writes under /tmp/ray.
        share_ray_logs(&mut spec, collector);
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
    if collector.is_some() {
        history::set_event_export_env(&mut spec);
    }
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

/// Ray's `/tmp/ray` on an emptyDir, mounted in the Ray container and in the sidecar at
/// `sidecar` (when there is one).
fn share_ray_logs(spec: &mut PodSpec, sidecar: Option<usize>) {
    add_empty_dir(spec, RAY_CONTAINER, RAY_LOGS_VOLUME, RAY_LOGS_PATH, false);
    if let Some(index) = sidecar {
        add_empty_dir(spec, index, RAY_LOGS_VOLUME, RAY_LOGS_PATH, false);
    }
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
