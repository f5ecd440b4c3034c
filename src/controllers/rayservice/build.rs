//! Pure builders and decisions of the RayService controller: the RayCluster a RayService owns,
//! its head and serve Services, what a spec change means (nothing, an in-place update, a new
//! cluster), the Serve config actually pushed, and the status mapping of Serve's answer.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::api::conditions::TRUE;
use crate::api::raycluster::{
    ClusterState, RayCluster, RayClusterSpec, condition_types as cluster_conditions,
};
use crate::api::rayservice::{AppStatus, RayService, RayServiceUpgradeType, ServeDeploymentStatus};
use crate::controllers::raycluster::builders::{
    BuildError, BuildOptions, service as cluster_service,
};
use crate::kuberay::keys::{OPERATOR_VERSION, annotations, labels};
use crate::kuberay::kueue;
use crate::kuberay::names;
use crate::ray::ServeInstanceDetails;

/// `ray.io/hash-without-replicas-and-workers-to-delete`: the spec hash that decides between
/// keeping a cluster and replacing it.
pub const HASH_ANNOTATION: &str = "ray.io/hash-without-replicas-and-workers-to-delete";
/// `ray.io/num-worker-groups`: worker groups the cluster was built with; groups appended later
/// are added in place instead of replacing the cluster.
pub const NUM_WORKER_GROUPS_ANNOTATION: &str = "ray.io/num-worker-groups";
/// Not in KubeRay: the hash of the whole cluster spec, replica counts included. With the
/// autoscaler off, a changed replica count is applied in place (KubeRay ignores it).
pub const FULL_HASH_ANNOTATION: &str = "raypipe.dev/cluster-spec-hash";
/// `originated-from-crd` value.
pub const CREATOR: &str = "RayService";

/// The cluster spec a RayService asks for. The RayService's own `suspend` is separate: a
/// cluster's `suspend` is taken at creation only.
pub fn goal_spec(service: &RayService) -> RayClusterSpec {
    service.spec.ray_cluster_config.clone()
}

/// The hash that decides whether a cluster must be replaced: replica counts, scheduling
/// details the autoscaler or Kueue change, and `suspend` do not count.
pub fn replacement_hash(spec: &RayClusterSpec) -> String {
    let mut spec = spec.clone();
    spec.suspend = None;
    crate::kuberay::spec::spec_hash(&spec)
}

/// The hash of the whole spec (replica counts included; `suspend` and Kueue's admission marks
/// not).
pub fn full_hash(spec: &RayClusterSpec) -> String {
    let mut spec = crate::kuberay::spec::without_declared_defaults(kueue::without_admission_marks(
        spec.clone(),
    ));
    spec.suspend = None;
    crate::k8s::stable_hash(&spec)
}

fn worker_group_count(spec: &RayClusterSpec) -> usize {
    spec.worker_group_specs.as_ref().map_or(0, Vec::len)
}

/// The goal hash computed as if only the first `groups` worker groups existed.
fn replacement_hash_first_groups(spec: &RayClusterSpec, groups: usize) -> String {
    let mut spec = spec.clone();
    if let Some(list) = spec.worker_group_specs.as_mut() {
        list.truncate(groups);
    }
    replacement_hash(&spec)
}

fn annotation<'a>(cluster: &'a RayCluster, key: &str) -> Option<&'a str> {
    cluster.annotations().get(key).map(String::as_str)
}

/// What the goal spec means for an existing cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterChange {
    /// The cluster already is what the RayService asks for.
    None,
    /// Changes that the running cluster takes without a restart: worker groups appended, a
    /// replica count with the autoscaler off, a different operator version's bookkeeping.
    InPlace,
    /// Anything else: a new cluster (or nothing, when the upgrade strategy is `None`).
    Replace,
}

/// Classifies the goal against `cluster`. `check_version`: an operator version different from
/// the one that built the cluster also asks for an in-place rebuild (the active cluster
/// outside an upgrade, as KubeRay does, so an operator upgrade never replaces clusters).
pub fn classify(cluster: &RayCluster, goal: &RayClusterSpec, check_version: bool) -> ClusterChange {
    let goal_hash = replacement_hash(goal);
    let cluster_hash = annotation(cluster, HASH_ANNOTATION).unwrap_or_default();
    if cluster_hash != goal_hash {
        let built_groups =
            annotation(cluster, NUM_WORKER_GROUPS_ANNOTATION).and_then(|n| n.parse::<usize>().ok());
        return match built_groups {
            Some(n)
                if n < worker_group_count(goal)
                    && replacement_hash_first_groups(goal, n) == cluster_hash =>
            {
                ClusterChange::InPlace
            }
            _ => ClusterChange::Replace,
        };
    }
    if check_version && annotation(cluster, annotations::KUBERAY_VERSION) != Some(OPERATOR_VERSION)
    {
        return ClusterChange::InPlace;
    }
    if !crate::kuberay::spec::autoscaling_enabled(goal)
        && annotation(cluster, FULL_HASH_ANNOTATION).is_some_and(|h| h != full_hash(goal))
    {
        return ClusterChange::InPlace;
    }
    ClusterChange::None
}

/// Whether each cluster of `service` is admitted by Kueue on its own
/// ([`kueue::CLUSTER_QUEUE_ANNOTATION`]).
pub fn admitted_per_cluster(service: &RayService) -> bool {
    !kueue::cluster_queue_labels(service.annotations()).is_empty()
}

/// Whether Kueue admits `service` as a whole (its `kueue.x-k8s.io/queue-name` label, Kueue's
/// `ray.io/rayservice` integration): then `rayClusterConfig.suspend` is Kueue's gate and
/// follows to the serving cluster both ways.
pub fn admitted_as_a_whole(service: &RayService) -> bool {
    kueue::queue_name(service.labels()).is_some() && !admitted_per_cluster(service)
}

/// Whether the upgrade to `goal` was given up for want of quota (see `admission`).
pub fn given_up(service: &RayService, goal: &RayClusterSpec) -> bool {
    service
        .annotations()
        .get(kueue::ABANDONED_SPEC_ANNOTATION)
        .is_some_and(|hash| *hash == replacement_hash(goal))
}

/// [`classify`] under per-cluster admission: a cluster was admitted for its shape, so any change
/// of it (replica counts and appended groups included) is a new cluster with an admission of
/// its own, and nothing is rewritten in place (that would also drop what Kueue set on the
/// admitted cluster: node selectors and tolerations of its flavor).
pub fn classify_admitted(cluster: &RayCluster, goal: &RayClusterSpec) -> ClusterChange {
    match classify(cluster, goal, false) {
        ClusterChange::None => ClusterChange::None,
        ClusterChange::InPlace | ClusterChange::Replace => ClusterChange::Replace,
    }
}

/// Whether a spec change may start a new cluster: `upgradeStrategy.type` decides; unset means
/// the operator default (`ENABLE_ZERO_DOWNTIME`, on unless set to false).
pub fn zero_downtime(service: &RayService, operator_default: bool) -> bool {
    match service
        .spec
        .upgrade_strategy
        .as_ref()
        .and_then(|s| s.type_.as_ref())
    {
        Some(RayServiceUpgradeType::None) => false,
        Some(_) => true,
        None => operator_default,
    }
}

/// The RayCluster a RayService owns, named `name`. `existing_suspend`: an in-place update
/// keeps the cluster's own `suspend` as it is. Under per-cluster admission
/// ([`kueue::CLUSTER_QUEUE_ANNOTATION`]) the cluster carries the queue labels and is created
/// suspended.
pub fn cluster(
    service: &RayService,
    name: &str,
    existing_suspend: Option<Option<bool>>,
) -> Result<RayCluster, BuildError> {
    let goal = goal_spec(service);
    let mut labels_map = service.labels().clone();
    labels_map.insert(
        labels::ORIGINATED_FROM_CR_NAME.to_owned(),
        service.name_any(),
    );
    labels_map.insert(labels::ORIGINATED_FROM_CRD.to_owned(), CREATOR.to_owned());
    let queued = kueue::cluster_queue_labels(service.annotations());
    let admitted_per_cluster = !queued.is_empty();
    labels_map.extend(queued);
    let mut annotations_map = service.annotations().clone();
    // kubectl's copy of the RayService is not the cluster's.
    annotations_map.remove("kubectl.kubernetes.io/last-applied-configuration");
    annotations_map.insert(HASH_ANNOTATION.to_owned(), replacement_hash(&goal));
    annotations_map.insert(FULL_HASH_ANNOTATION.to_owned(), full_hash(&goal));
    annotations_map.insert(
        NUM_WORKER_GROUPS_ANNOTATION.to_owned(),
        worker_group_count(&goal).to_string(),
    );
    annotations_map.insert(
        annotations::KUBERAY_VERSION.to_owned(),
        OPERATOR_VERSION.to_owned(),
    );
    let mut spec = goal;
    match existing_suspend {
        Some(suspend) => spec.suspend = suspend,
        // Admitted per cluster: created suspended, so not one Pod starts before Kueue admits it
        // (its webhook does the same; this holds where the webhook is not in the path).
        None if admitted_per_cluster => spec.suspend = Some(true),
        None => {}
    }
    // Every Pod template keeps a `metadata` object of ours. Kueue writes its pod-set labels and
    // node selectors into the RayService's templates on admission and takes them out again;
    // when an apply then drops the last template label we owned, server-side apply leaves
    // `template.metadata: null`, which the CRD refuses, and the cluster could no longer be
    // updated (not even suspended on preemption).
    for template in std::iter::once(&mut spec.head_group_spec.template).chain(
        spec.worker_group_specs
            .iter_mut()
            .flatten()
            .map(|group| &mut group.template),
    ) {
        template.metadata.get_or_insert_with(ObjectMeta::default);
    }
    let mut cluster = RayCluster::new(name, spec);
    cluster.metadata = ObjectMeta {
        name: Some(name.to_owned()),
        namespace: service.namespace(),
        labels: Some(labels_map),
        annotations: Some(annotations_map),
        owner_references: Some(vec![crate::k8s::controller_owner_ref(service)?]),
        ..Default::default()
    };
    Ok(cluster)
}

/// `<service>-<5 random characters>`.
pub fn new_cluster_name(service: &RayService) -> String {
    format!("{}-{}", service.name_any(), crate::k8s::random_suffix())
}

/// The name of the RayService's serve Service: `spec.serveService.metadata.name` or
/// `<service>-serve-svc`.
pub fn serve_service_name(service: &RayService) -> String {
    service
        .spec
        .serve_service
        .as_ref()
        .and_then(|s| s.metadata.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| names::serve_service_name(&service.name_any()))
}

/// `<service>-head-svc`.
pub fn head_service_name(service: &RayService) -> String {
    names::owner_head_service_name(&service.name_any())
}

fn service_labels(service: &RayService) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::ORIGINATED_FROM_CR_NAME.to_owned(),
            service.name_any(),
        ),
        (labels::ORIGINATED_FROM_CRD.to_owned(), CREATOR.to_owned()),
    ])
}

/// The RayService's head Service: the target cluster's head Service under the RayService's
/// name; its selector names the target cluster.
pub fn head_service(
    service: &RayService,
    target: &RayCluster,
    options: &BuildOptions,
) -> Result<Service, BuildError> {
    cluster_service::owner_head_service(service, CREATOR, target, options)
}

/// The RayService's serve Service: selects the target cluster's Pods that serve
/// (`ray.io/serve=true`). Ports: the head container's `serve`/`serve-*` ports (a user port of
/// the same name wins), else the user's own.
pub fn serve_service(service: &RayService, target: &RayCluster) -> Result<Service, BuildError> {
    let user = service.spec.serve_service.clone().unwrap_or_default();
    let user_ports = user
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    let auto_ports: Vec<ServicePort> = cluster_service::head_ports(target)
        .into_iter()
        .filter(|(name, _)| cluster_service::is_serve_port(name))
        .map(|(name, port)| {
            user_ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .cloned()
                .unwrap_or(ServicePort {
                    name: Some(name),
                    port,
                    ..Default::default()
                })
        })
        .collect();
    let ports = if auto_ports.is_empty() {
        user_ports
    } else {
        auto_ports
    };
    if ports.is_empty() {
        return Err(BuildError::NoServePort);
    }
    let mut svc_labels = user.metadata.labels.clone().unwrap_or_default();
    svc_labels.extend(service_labels(service));
    svc_labels.insert(
        labels::SERVE.to_owned(),
        names::serve_service_label(&service.name_any()),
    );
    let mut spec = user.spec.unwrap_or_default();
    spec.selector = Some(BTreeMap::from([
        (labels::CLUSTER.to_owned(), target.name_any()),
        (labels::SERVE.to_owned(), "true".to_owned()),
    ]));
    spec.ports = Some(ports);
    if spec.type_.is_none() {
        spec.type_ = service
            .spec
            .ray_cluster_config
            .head_group_spec
            .service_type
            .clone();
    }
    // A ClusterIP is the API server's to assign; the user's copy of an old one is not ours.
    spec.cluster_ip = None;
    spec.cluster_ips = None;
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(serve_service_name(service)),
            namespace: service.namespace(),
            labels: Some(svc_labels),
            annotations: user.metadata.annotations,
            owner_references: Some(vec![crate::k8s::controller_owner_ref(service)?]),
            ..Default::default()
        },
        spec: Some(ServiceSpec { ..spec }),
        status: None,
    })
}

/// The cluster a Service selects (`ray.io/cluster` of its selector).
pub fn selected_cluster(service: &Service) -> Option<&str> {
    service
        .spec
        .as_ref()?
        .selector
        .as_ref()?
        .get(labels::CLUSTER)
        .map(String::as_str)
}

/// Where Serve's HTTP proxy must listen (`http_options.host`/`port`), when the operator
/// decides it (a Ray head on 127.0.0.1 in `raypipe dev` and tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpBinding {
    pub host: String,
    pub port: u16,
}

/// The JSON body pushed to Serve: `serveConfigV2` parsed, `http_options` bound where the
/// operator must decide it, and `runtime_env` URIs rewritten through the configured mirrors.
pub fn serve_config_json(
    serve_config_v2: &str,
    binding: Option<&HttpBinding>,
    mirrors: &[(String, String)],
) -> Result<serde_json::Value, crate::ray::DashboardError> {
    let mut config = crate::ray::serve_config_yaml_to_json(serve_config_v2)?;
    if let Some(binding) = binding
        && let Some(object) = config.as_object_mut()
    {
        let http = object
            .entry("http_options")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(http) = http.as_object_mut() {
            http.insert("host".into(), binding.host.clone().into());
            http.insert("port".into(), binding.port.into());
        }
    }
    if !mirrors.is_empty()
        && let Some(apps) = config
            .get_mut("applications")
            .and_then(|a| a.as_array_mut())
    {
        for app in apps {
            if let Some(env) = app.get_mut("runtime_env") {
                rewrite_runtime_env_uris(env, mirrors);
            }
        }
    }
    Ok(config)
}

/// The application names a Serve config deploys (`default` for an unnamed one), sorted.
pub fn application_names(config: &serde_json::Value) -> std::collections::BTreeSet<String> {
    config
        .get("applications")
        .and_then(|a| a.as_array())
        .into_iter()
        .flatten()
        .map(|app| {
            app.get("name")
                .and_then(|n| n.as_str())
                .filter(|n| !n.is_empty())
                .unwrap_or("default")
                .to_owned()
        })
        .collect()
}

/// Rewrites `working_dir` and `py_modules` URIs that start with a mirrored prefix.
fn rewrite_runtime_env_uris(env: &mut serde_json::Value, mirrors: &[(String, String)]) {
    let rewrite = |uri: &mut serde_json::Value| {
        if let Some(text) = uri.as_str()
            && let Some((from, to)) = mirrors.iter().find(|(from, _)| text.starts_with(from))
        {
            *uri = format!("{to}{}", &text[from.len()..]).into();
        }
    };
    if let Some(dir) = env.get_mut("working_dir") {
        rewrite(dir);
    }
    if let Some(modules) = env.get_mut("py_modules").and_then(|m| m.as_array_mut()) {
        modules.iter_mut().for_each(rewrite);
    }
}

/// Serve's answer as status: application name (`""` is `default`) → status, message and
/// deployment statuses, messages verbatim.
pub fn application_statuses(details: &ServeInstanceDetails) -> BTreeMap<String, AppStatus> {
    details
        .applications
        .iter()
        .map(|(name, app)| {
            let name = if name.is_empty() { "default" } else { name };
            let deployments: BTreeMap<String, ServeDeploymentStatus> = app
                .deployments
                .iter()
                .map(|(d, dep)| {
                    (
                        d.clone(),
                        ServeDeploymentStatus {
                            status: dep.status.as_ref().map(|s| s.as_str().to_owned()),
                            message: dep.message.clone().filter(|m| !m.is_empty()),
                        },
                    )
                })
                .collect();
            (
                name.to_owned(),
                AppStatus {
                    status: app.status.as_ref().map(|s| s.as_str().to_owned()),
                    message: app.message.clone().filter(|m| !m.is_empty()),
                    serve_deployment_statuses: (!deployments.is_empty()).then_some(deployments),
                },
            )
        })
        .collect()
}

/// A one-line account of why the applications are not all RUNNING (for conditions).
pub fn not_running_summary(apps: &BTreeMap<String, AppStatus>) -> Option<String> {
    if apps.is_empty() {
        return Some("Serve reports no applications yet".to_owned());
    }
    let mut parts = Vec::new();
    for (name, app) in apps {
        let status = app.status.as_deref().unwrap_or("UNKNOWN");
        if status == crate::api::rayservice::app_statuses::RUNNING {
            continue;
        }
        let mut part = format!("application {name} is {status}");
        if let Some(message) = app.message.as_deref() {
            part.push_str(": ");
            part.push_str(first_line(message));
        } else if let Some((dep, d)) = app
            .serve_deployment_statuses
            .iter()
            .flatten()
            .find(|(_, d)| d.message.is_some())
        {
            part.push_str(&format!(
                " (deployment {dep}: {})",
                first_line(d.message.as_deref().unwrap_or_default())
            ));
        }
        parts.push(part);
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The last non-empty line: a Python traceback ends with the exception.
fn first_line(message: &str) -> &str {
    message
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or(message)
}

/// Whether any Serve proxy reports HEALTHY (the head's, when proxies run on the head only).
pub fn proxy_healthy(details: &ServeInstanceDetails) -> bool {
    details
        .proxies
        .values()
        .any(|p| p.status == Some(crate::ray::ProxyStatus::Healthy))
}

/// The `kind/name` of `obj` for messages.
pub fn describe<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{} {}",
        K::kind(&()),
        obj.meta().name.as_deref().unwrap_or("")
    )
}

/// Whether the head Pod of `cluster` is ready; what is missing, in words, when not.
pub fn head_ready(cluster: &RayCluster) -> Result<(), String> {
    let status = cluster.status.as_ref();
    let condition = status.and_then(|s| {
        crate::api::conditions::find(&s.conditions, cluster_conditions::HEAD_POD_READY)
    });
    match condition {
        Some(c) if c.status == TRUE => Ok(()),
        _ if status.and_then(|s| s.state) == Some(ClusterState::Ready) => Ok(()),
        Some(c) => Err(format!(
            "the head Pod of RayCluster {} is not ready ({}: {})",
            cluster.name_any(),
            c.reason,
            c.message
        )),
        None => Err(format!(
            "the head Pod of RayCluster {} is not ready yet",
            cluster.name_any()
        )),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    /// A RayService `ns/svc` (uid `u-1`) of `spec`.
    pub(in crate::controllers::rayservice) fn service(spec: serde_json::Value) -> RayService {
        let mut service: RayService = serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "svc", "namespace": "ns", "uid": "u-1"},
            "spec": spec
        }))
        .unwrap();
        service.metadata.uid = Some("u-1".into());
        service
    }

    /// A RayService spec: `groups` worker groups of `replicas`, all on `image`.
    pub(in crate::controllers::rayservice) fn spec(
        image: &str,
        replicas: i32,
        groups: usize,
    ) -> serde_json::Value {
        let group = |i: usize| {
            json!({"groupName": format!("g{i}"), "replicas": replicas, "minReplicas": 0,
                "maxReplicas": 10, "rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-worker", "image": image}]}}})
        };
        json!({
            "serveConfigV2": "applications: []",
            "rayClusterConfig": {
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                    {"name": "ray-head", "image": image}]}}},
                "workerGroupSpecs": (0..groups).map(group).collect::<Vec<_>>()
            }
        })
    }

    #[test]
    fn replica_counts_never_replace_a_cluster_but_images_do() {
        let built = cluster(&service(spec("ray:1", 1, 1)), "svc-abcde", None).unwrap();
        let same = service(spec("ray:1", 1, 1));
        assert_eq!(
            classify(&built, &goal_spec(&same), true),
            ClusterChange::None
        );
        // Autoscaler off: a new replica count is applied in place.
        let scaled = service(spec("ray:1", 3, 1));
        assert_eq!(
            classify(&built, &goal_spec(&scaled), false),
            ClusterChange::InPlace
        );
        let new_image = service(spec("ray:2", 1, 1));
        assert_eq!(
            classify(&built, &goal_spec(&new_image), false),
            ClusterChange::Replace
        );
        // A worker group appended: in place.
        let more_groups = service(spec("ray:1", 1, 2));
        assert_eq!(
            classify(&built, &goal_spec(&more_groups), false),
            ClusterChange::InPlace
        );
    }

    #[test]
    fn admitted_per_cluster_a_cluster_is_queued_suspended_and_never_rewritten() {
        let mut queued = service(spec("ray:1", 1, 1));
        queued.annotations_mut().extend([
            (
                kueue::CLUSTER_QUEUE_ANNOTATION.to_owned(),
                "team-a".to_owned(),
            ),
            (
                kueue::CLUSTER_PRIORITY_ANNOTATION.to_owned(),
                "serving".to_owned(),
            ),
        ]);
        assert!(admitted_per_cluster(&queued) && !admitted_as_a_whole(&queued));
        let built = cluster(&queued, "svc-abcde", None).unwrap();
        assert_eq!(built.labels()[kueue::QUEUE_NAME_LABEL], "team-a");
        assert_eq!(built.labels()[kueue::PRIORITY_CLASS_LABEL], "serving");
        assert_eq!(
            built.spec.suspend,
            Some(true),
            "created suspended, for Kueue to admit"
        );
        // An in-place update keeps what Kueue set.
        let kept = cluster(&queued, "svc-abcde", Some(Some(false))).unwrap();
        assert_eq!(kept.spec.suspend, Some(false));
        // A replica change is a new shape: a new cluster with an admission of its own.
        let scaled = goal_spec(&service(spec("ray:1", 3, 1)));
        assert_eq!(classify(&built, &scaled, false), ClusterChange::InPlace);
        assert_eq!(classify_admitted(&built, &scaled), ClusterChange::Replace);
        assert_eq!(
            classify_admitted(&built, &goal_spec(&queued)),
            ClusterChange::None
        );
        // Without the annotation nothing of this applies.
        let plain = cluster(&service(spec("ray:1", 1, 1)), "svc-abcde", None).unwrap();
        assert!(!plain.labels().contains_key(kueue::QUEUE_NAME_LABEL));
        assert_eq!(plain.spec.suspend, None);
    }

    #[test]
    fn every_pod_template_of_a_built_cluster_has_a_metadata_object() {
        let built = cluster(&service(spec("ray:1", 1, 1)), "svc-abcde", None).unwrap();
        let json = serde_json::to_value(&built).unwrap();
        assert!(
            json["spec"]["headGroupSpec"]["template"]["metadata"].is_object(),
            "{json}"
        );
        for group in json["spec"]["workerGroupSpecs"].as_array().unwrap() {
            assert!(group["template"]["metadata"].is_object(), "{group}");
        }
    }

    #[test]
    fn a_queue_label_on_the_rayservice_makes_kueue_admit_it_as_a_whole() {
        let mut whole = service(spec("ray:1", 1, 1));
        whole
            .labels_mut()
            .insert(kueue::QUEUE_NAME_LABEL.to_owned(), "team-a".to_owned());
        assert!(admitted_as_a_whole(&whole) && !admitted_per_cluster(&whole));
        // KubeRay copies the RayService's labels to its clusters.
        let built = cluster(&whole, "svc-abcde", None).unwrap();
        assert_eq!(built.labels()[kueue::QUEUE_NAME_LABEL], "team-a");
    }

    #[test]
    fn another_operator_version_updates_the_active_cluster_in_place() {
        let mut built = cluster(&service(spec("ray:1", 1, 1)), "svc-abcde", None).unwrap();
        built
            .annotations_mut()
            .insert(annotations::KUBERAY_VERSION.into(), "v1.4.0".into());
        let goal = goal_spec(&service(spec("ray:1", 1, 1)));
        assert_eq!(classify(&built, &goal, true), ClusterChange::InPlace);
        assert_eq!(classify(&built, &goal, false), ClusterChange::None);
    }

    #[test]
    fn the_cluster_carries_the_bookkeeping_and_the_owner() {
        let built = cluster(&service(spec("ray:1", 1, 2)), "svc-abcde", Some(Some(true))).unwrap();
        let annotations = built.annotations();
        assert_eq!(annotations[NUM_WORKER_GROUPS_ANNOTATION], "2");
        assert!(annotations.contains_key(HASH_ANNOTATION));
        assert_eq!(built.labels()[labels::ORIGINATED_FROM_CRD], "RayService");
        assert_eq!(built.labels()[labels::ORIGINATED_FROM_CR_NAME], "svc");
        assert_eq!(
            built.spec.suspend,
            Some(true),
            "an update keeps the cluster's suspend"
        );
        let owner = &built.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("RayService", Some(true))
        );
    }

    #[test]
    fn the_pushed_config_gets_the_binding_and_the_mirrors_only() {
        let yaml = "applications:\n  - name: a\n    import_path: m:app\n    runtime_env:\n      working_dir: https://github.com/o/r/archive/x.zip\n      py_modules: [https://github.com/o/r/archive/y.zip, s3://b/z.zip]\n  - import_path: n:app\n";
        let binding = HttpBinding {
            host: "127.0.0.1".into(),
            port: 8123,
        };
        let mirrors = vec![(
            "https://github.com/o/r/archive/".to_owned(),
            "http://127.0.0.1:9/m/".to_owned(),
        )];
        let config = serve_config_json(yaml, Some(&binding), &mirrors).unwrap();
        assert_eq!(
            config["http_options"],
            json!({"host": "127.0.0.1", "port": 8123})
        );
        let env = &config["applications"][0]["runtime_env"];
        assert_eq!(env["working_dir"], "http://127.0.0.1:9/m/x.zip");
        assert_eq!(
            env["py_modules"],
            json!(["http://127.0.0.1:9/m/y.zip", "s3://b/z.zip"])
        );
        assert_eq!(
            application_names(&config).into_iter().collect::<Vec<_>>(),
            vec!["a".to_owned(), "default".to_owned()]
        );
        let plain = serve_config_json(yaml, None, &[]).unwrap();
        assert!(plain.get("http_options").is_none());
        assert_eq!(
            plain["applications"][0]["runtime_env"]["working_dir"],
            "https://github.com/o/r/archive/x.zip"
        );
    }

    #[test]
    fn serve_statuses_are_copied_verbatim_and_summarised() {
        let details: ServeInstanceDetails = serde_json::from_value(json!({
            "applications": {
                "": {"status": "RUNNING", "deployments": {"D": {"status": "HEALTHY"}}},
                "b": {"status": "DEPLOY_FAILED", "message": "Traceback...\nImportError: no m"}
            }
        }))
        .unwrap();
        let apps = application_statuses(&details);
        assert_eq!(apps["default"].status.as_deref(), Some("RUNNING"));
        assert_eq!(
            apps["b"].message.as_deref(),
            Some("Traceback...\nImportError: no m")
        );
        assert_eq!(
            not_running_summary(&apps).as_deref(),
            Some("application b is DEPLOY_FAILED: ImportError: no m")
        );
    }
}
