//! Batch schedulers (`--batch-scheduler`), as KubeRay v1.7 integrates them: the scheduler
//! name, labels and annotations each one puts on a cluster's Pods (and on a RayJob's
//! RayCluster and submitter), and the PodGroups Volcano and scheduler-plugins gang-schedule
//! with. Pure: the same cluster always gives the same metadata and PodGroups.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Serialize;
use serde_json::{Value, json};

use super::error::BuildError;
use crate::api::raycluster::{RayCluster, RayClusterSpec};
use crate::kuberay::keys::labels;
use crate::kuberay::quantity::Amount;

/// Label on a RayCluster or RayJob naming the PriorityClass Volcano's PodGroup gets.
pub const PRIORITY_CLASS_LABEL: &str = "ray.io/priority-class-name";
/// Label whose presence (any value) asks YuniKorn and scheduler-plugins for gang scheduling.
pub const GANG_SCHEDULING_LABEL: &str = "ray.io/gang-scheduling-enabled";
/// The task group of a RayJob's submitter Pod.
pub const SUBMITTER_GROUP: &str = "submittergroup";

pub const VOLCANO_QUEUE_LABEL: &str = "volcano.sh/queue-name";
pub const VOLCANO_NETWORK_TOPOLOGY_MODE_LABEL: &str = "volcano.sh/network-topology-mode";
pub const VOLCANO_NETWORK_TOPOLOGY_TIER_LABEL: &str =
    "volcano.sh/network-topology-highest-tier-allowed";
const VOLCANO_GROUP_NAME_ANNOTATION: &str = "scheduling.k8s.io/group-name";
const VOLCANO_TASK_SPEC_ANNOTATION: &str = "volcano.sh/task-spec";

pub const YUNIKORN_APP_ID_LABEL: &str = "yunikorn.apache.org/app-id";
pub const YUNIKORN_QUEUE_LABEL: &str = "yunikorn.apache.org/queue";
const YUNIKORN_POD_APP_ID_LABEL: &str = "applicationId";
const YUNIKORN_POD_QUEUE_LABEL: &str = "queue";
pub const YUNIKORN_TASK_GROUPS_ANNOTATION: &str = "yunikorn.apache.org/task-groups";
const YUNIKORN_TASK_GROUP_NAME_ANNOTATION: &str = "yunikorn.apache.org/task-group-name";

pub const KAI_QUEUE_LABEL: &str = "kai.scheduler/queue";

const SCHEDULER_PLUGINS_POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";

/// The schedulers KubeRay v1.7 integrates, by their `--batch-scheduler` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum BatchScheduler {
    #[value(name = "volcano")]
    Volcano,
    #[value(name = "yunikorn")]
    YuniKorn,
    #[value(name = "kai-scheduler")]
    KaiScheduler,
    #[value(name = "scheduler-plugins")]
    SchedulerPlugins,
}

impl BatchScheduler {
    /// The `--batch-scheduler` value.
    pub fn flag_name(self) -> &'static str {
        match self {
            BatchScheduler::Volcano => "volcano",
            BatchScheduler::YuniKorn => "yunikorn",
            BatchScheduler::KaiScheduler => "kai-scheduler",
            BatchScheduler::SchedulerPlugins => "scheduler-plugins",
        }
    }

    /// The Pods' `schedulerName`: scheduler-plugins runs as a second scheduler of its own name.
    pub fn pod_scheduler_name(self) -> &'static str {
        match self {
            BatchScheduler::SchedulerPlugins => "scheduler-plugins-scheduler",
            other => other.flag_name(),
        }
    }

    /// The PodGroup kind this scheduler needs created for a RayCluster, if any.
    pub fn pod_group_resource(self) -> Option<ApiResource> {
        let gvk = match self {
            BatchScheduler::Volcano => {
                GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup")
            }
            BatchScheduler::SchedulerPlugins => {
                GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup")
            }
            BatchScheduler::YuniKorn | BatchScheduler::KaiScheduler => return None,
        };
        Some(ApiResource::from_gvk(&gvk))
    }
}

/// Where the metadata goes: a Pod (or Pod template) gets the scheduler name too; a RayJob's
/// RayCluster only labels and annotations.
pub struct Child<'a> {
    pub meta: &'a mut ObjectMeta,
    pub pod_spec: Option<&'a mut PodSpec>,
}

/// What the parent (a RayCluster, or a RayJob for its RayCluster and submitter) offers the
/// scheduler: its metadata, and the task groups YuniKorn would compute from its spec.
pub struct Parent<'a> {
    pub meta: &'a ObjectMeta,
    pub task_groups: &'a dyn Fn() -> String,
}

/// KubeRay's `AddMetadataToChildResource`: the labels, annotations and scheduler name a
/// child of `parent` gets; `group` is the child's task group (`headgroup`, a worker group's
/// name, `submittergroup`, or empty for a RayJob's RayCluster).
pub fn add_child_metadata(
    scheduler: BatchScheduler,
    parent: &Parent<'_>,
    child: Child<'_>,
    group: &str,
) {
    let parent_labels = parent.meta.labels.clone().unwrap_or_default();
    let Child { meta, pod_spec } = child;
    let copy_label = |meta: &mut ObjectMeta, from: &str, to: &str| {
        // An empty parent value is not copied, but the child still gets a label map.
        let child_labels = meta.labels.get_or_insert_with(BTreeMap::new);
        if let Some(value) = parent_labels.get(from).filter(|v| !v.is_empty()) {
            child_labels.insert(to.to_owned(), value.clone());
        }
    };
    match scheduler {
        BatchScheduler::Volcano => {
            copy_label(meta, VOLCANO_QUEUE_LABEL, VOLCANO_QUEUE_LABEL);
            copy_label(meta, PRIORITY_CLASS_LABEL, PRIORITY_CLASS_LABEL);
            let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
            annotations.insert(
                VOLCANO_GROUP_NAME_ANNOTATION.into(),
                volcano_pod_group_name(parent.meta),
            );
            annotations.insert(VOLCANO_TASK_SPEC_ANNOTATION.into(), group.to_owned());
        }
        BatchScheduler::YuniKorn => {
            copy_label(meta, YUNIKORN_APP_ID_LABEL, YUNIKORN_POD_APP_ID_LABEL);
            copy_label(meta, YUNIKORN_QUEUE_LABEL, YUNIKORN_POD_QUEUE_LABEL);
            if gang_scheduling(parent.meta) {
                // The parent's own task groups win (a RayJob's RayCluster carries the job's).
                let task_groups = parent
                    .meta
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(YUNIKORN_TASK_GROUPS_ANNOTATION))
                    .filter(|v| !v.is_empty())
                    .cloned()
                    .unwrap_or_else(|| (parent.task_groups)());
                let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
                annotations.insert(YUNIKORN_TASK_GROUPS_ANNOTATION.into(), task_groups);
                if !group.is_empty() {
                    annotations.insert(YUNIKORN_TASK_GROUP_NAME_ANNOTATION.into(), group.into());
                }
            }
        }
        BatchScheduler::KaiScheduler => {
            // Without a queue the Pods stay pending under KAI; that is the user's to fix.
            if let Some(queue) = parent_labels.get(KAI_QUEUE_LABEL).filter(|q| !q.is_empty()) {
                meta.labels
                    .get_or_insert_with(BTreeMap::new)
                    .insert(KAI_QUEUE_LABEL.into(), queue.clone());
            }
        }
        BatchScheduler::SchedulerPlugins => {
            if gang_scheduling(parent.meta) {
                meta.labels.get_or_insert_with(BTreeMap::new).insert(
                    SCHEDULER_PLUGINS_POD_GROUP_LABEL.into(),
                    parent.meta.name.clone().unwrap_or_default(),
                );
            }
        }
    }
    if let Some(spec) = pod_spec {
        spec.scheduler_name = Some(scheduler.pod_scheduler_name().to_owned());
    }
}

/// Adds the scheduler's metadata to a Pod of `cluster` in task group `group`.
pub fn add_pod_metadata(
    scheduler: BatchScheduler,
    cluster: &RayCluster,
    pod: &mut k8s_openapi::api::core::v1::Pod,
    group: &str,
) {
    let task_groups = || task_groups_json(&cluster_task_groups(&cluster.spec));
    let parent = Parent {
        meta: &cluster.metadata,
        task_groups: &task_groups,
    };
    let child = Child {
        meta: &mut pod.metadata,
        pod_spec: pod.spec.as_mut(),
    };
    add_child_metadata(scheduler, &parent, child, group);
}

fn gang_scheduling(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .is_some_and(|l| l.contains_key(GANG_SCHEDULING_LABEL))
}

/// Volcano's PodGroup name: `ray-<name>-pg`, where a RayJob's RayCluster uses the job's name
/// (the job's PodGroup holds the cluster and the submitter).
pub fn volcano_pod_group_name(owner: &ObjectMeta) -> String {
    let owner_labels = owner.labels.clone().unwrap_or_default();
    let from_job = owner_labels
        .get(labels::ORIGINATED_FROM_CRD)
        .map(String::as_str)
        == Some("RayJob");
    let name = owner_labels
        .get(labels::ORIGINATED_FROM_CR_NAME)
        .filter(|n| from_job && !n.is_empty())
        .cloned()
        .unwrap_or_else(|| owner.name.clone().unwrap_or_default());
    format!("ray-{name}-pg")
}

/// Whether this cluster was made by a RayJob, whose controller owns the Volcano PodGroup.
pub fn made_by_rayjob(cluster: &RayCluster) -> bool {
    cluster
        .labels()
        .get(labels::ORIGINATED_FROM_CRD)
        .map(String::as_str)
        == Some("RayJob")
}

/// Resources summed by name.
pub type Resources = BTreeMap<String, Amount>;

/// Requests of a Pod spec's containers (limits where a request is missing), summed.
pub fn pod_resources(spec: Option<&PodSpec>) -> Resources {
    let mut total = Resources::new();
    for container in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
        let resources = container.resources.as_ref();
        let mut merged = resources
            .and_then(|r| r.requests.clone())
            .unwrap_or_default();
        for (name, quantity) in resources.and_then(|r| r.limits.clone()).unwrap_or_default() {
            merged.entry(name).or_insert(quantity);
        }
        for (name, quantity) in merged {
            if let Some(amount) = Amount::of(&quantity) {
                let sum = total.get(&name).copied().unwrap_or_default().plus(amount);
                total.insert(name, sum);
            }
        }
    }
    total
}

/// Adds `count` times `more` into `total`.
pub fn add_resources(total: &mut Resources, more: &Resources, count: i64) {
    for (name, amount) in more {
        let sum = total
            .get(name)
            .copied()
            .unwrap_or_default()
            .plus(amount.times(count));
        total.insert(name.clone(), sum);
    }
}

/// The gang's size and resources, as Volcano sizes it: with autoscaling the head and every
/// group's `minReplicas`, otherwise the head and the desired replicas (suspended groups count
/// nothing either way).
pub fn gang_size(spec: &RayClusterSpec) -> (i32, Resources) {
    let autoscaling = crate::kuberay::spec::autoscaling_enabled(spec);
    let mut members = 1i32;
    let mut total = pod_resources(spec.head_group_spec.template.spec.as_ref());
    for group in spec.worker_group_specs.iter().flatten() {
        if group.suspend == Some(true) {
            continue;
        }
        let hosts = group.num_of_hosts.unwrap_or(1);
        if autoscaling {
            members = members.saturating_add(group.min_replicas.unwrap_or(0).saturating_mul(hosts));
        } else {
            members = members.saturating_add(
                crate::controllers::raycluster::status::desired_workers(group),
            );
        }
        let replicas = if autoscaling {
            group.min_replicas.unwrap_or(0)
        } else {
            group.replicas.unwrap_or(0)
        };
        add_resources(
            &mut total,
            &pod_resources(group.template.spec.as_ref()),
            i64::from(replicas) * i64::from(hosts),
        );
    }
    (members, total)
}

/// The gang's size and resources as scheduler-plugins sizes it: the head and the desired
/// replicas, whatever the autoscaler does.
fn desired_gang(spec: &RayClusterSpec) -> (i32, Resources) {
    let mut members = 1i32;
    let mut total = pod_resources(spec.head_group_spec.template.spec.as_ref());
    for group in spec.worker_group_specs.iter().flatten() {
        members = members.saturating_add(crate::controllers::raycluster::status::desired_workers(
            group,
        ));
        if group.suspend == Some(true) {
            continue;
        }
        add_resources(
            &mut total,
            &pod_resources(group.template.spec.as_ref()),
            i64::from(group.replicas.unwrap_or(0)) * i64::from(group.num_of_hosts.unwrap_or(1)),
        );
    }
    (members, total)
}

fn resources_json(resources: &Resources) -> Value {
    Value::Object(
        resources
            .iter()
            .map(|(name, amount)| (name.clone(), Value::String(amount.canonical())))
            .collect(),
    )
}

/// Volcano's PodGroup `ray-<owner>-pg` for a cluster or a RayJob (`owner` its controller
/// reference): the gang's size and resources, the owner's queue, priority class and network
/// topology labels, and its annotations. A malformed tier label is an error, as in KubeRay.
pub fn volcano_pod_group(
    owner_meta: &ObjectMeta,
    owner: OwnerReference,
    members: i32,
    resources: &Resources,
) -> Result<DynamicObject, BuildError> {
    let resource = BatchScheduler::Volcano
        .pod_group_resource()
        .ok_or_else(|| BuildError::BatchScheduler("no Volcano PodGroup kind".into()))?;
    let name = volcano_pod_group_name(owner_meta);
    let owner_labels = owner_meta.labels.clone().unwrap_or_default();
    let mut spec = serde_json::Map::new();
    if members != 0 {
        spec.insert("minMember".into(), json!(members));
    }
    if let Some(queue) = owner_labels
        .get(VOLCANO_QUEUE_LABEL)
        .filter(|q| !q.is_empty())
    {
        spec.insert("queue".into(), json!(queue));
    }
    if let Some(class) = owner_labels
        .get(PRIORITY_CLASS_LABEL)
        .filter(|c| !c.is_empty())
    {
        spec.insert("priorityClassName".into(), json!(class));
    }
    spec.insert("minResources".into(), resources_json(resources));
    if let Some(mode) = owner_labels.get(VOLCANO_NETWORK_TOPOLOGY_MODE_LABEL) {
        let mut topology = serde_json::Map::new();
        if !mode.is_empty() {
            topology.insert("mode".into(), json!(mode));
        }
        if let Some(tier) = owner_labels.get(VOLCANO_NETWORK_TOPOLOGY_TIER_LABEL) {
            let tier: i64 = tier.parse().map_err(|e| {
                BuildError::BatchScheduler(format!(
                    "failed to convert {VOLCANO_NETWORK_TOPOLOGY_TIER_LABEL} label to int: {e} for podgroup {name} in namespace {}",
                    owner_meta.namespace.clone().unwrap_or_default()
                ))
            })?;
            topology.insert("highestTierAllowed".into(), json!(tier));
        }
        spec.insert("networkTopology".into(), Value::Object(topology));
    }
    let mut group = DynamicObject::new(&name, &resource);
    group.metadata.namespace = owner_meta.namespace.clone();
    group.metadata.owner_references = Some(vec![owner]);
    // KubeRay copies the owner's annotations onto the PodGroup.
    group.metadata.annotations = Some(owner_meta.annotations.clone().unwrap_or_default());
    group.data = json!({"spec": Value::Object(spec), "status": {"phase": "Pending"}});
    Ok(group)
}

/// Volcano's PodGroup for a RayCluster the operator made itself (not a RayJob's).
pub fn cluster_volcano_pod_group(
    cluster: &RayCluster,
) -> Result<Option<DynamicObject>, BuildError> {
    if made_by_rayjob(cluster) {
        return Ok(None);
    }
    let (members, resources) = gang_size(&cluster.spec);
    let owner = crate::k8s::controller_owner_ref(cluster)?;
    volcano_pod_group(&cluster.metadata, owner, members, &resources).map(Some)
}

/// scheduler-plugins' PodGroup, named after the cluster, for a cluster that asks for gang
/// scheduling. Its owner reference is a plain one (not a controller), as KubeRay writes it.
pub fn scheduler_plugins_pod_group(
    cluster: &RayCluster,
) -> Result<Option<DynamicObject>, BuildError> {
    if !gang_scheduling(&cluster.metadata) {
        return Ok(None);
    }
    let resource = BatchScheduler::SchedulerPlugins
        .pod_group_resource()
        .ok_or_else(|| BuildError::BatchScheduler("no scheduler-plugins PodGroup kind".into()))?;
    let (members, resources) = desired_gang(&cluster.spec);
    let owner = OwnerReference {
        api_version: "ray.io/v1".into(),
        kind: "RayCluster".into(),
        name: cluster.name_any(),
        uid: cluster.uid().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    };
    let mut group = DynamicObject::new(&cluster.name_any(), &resource);
    group.metadata.namespace = cluster.namespace();
    group.metadata.owner_references = Some(vec![owner]);
    let mut spec = serde_json::Map::new();
    if members != 0 {
        spec.insert("minMember".into(), json!(members));
    }
    if !resources.is_empty() {
        spec.insert("minResources".into(), resources_json(&resources));
    }
    group.data = json!({"spec": Value::Object(spec)});
    Ok(Some(group))
}

/// One YuniKorn task group: a set of Pods with the same placement, and how many must fit.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskGroup {
    pub name: String,
    pub min_member: i32,
    pub min_resource: Resources,
    pub spec: Option<PodSpec>,
}

/// The head's and every worker group's task group (`minReplicas × numOfHosts` members).
pub fn cluster_task_groups(spec: &RayClusterSpec) -> Vec<TaskGroup> {
    let head = spec.head_group_spec.template.spec.as_ref();
    let mut groups = vec![TaskGroup {
        name: labels::HEAD_GROUP.to_owned(),
        min_member: 1,
        min_resource: pod_resources(head),
        spec: head.cloned(),
    }];
    for group in spec.worker_group_specs.iter().flatten() {
        let template = group.template.spec.as_ref();
        groups.push(TaskGroup {
            name: group.group_name.clone(),
            min_member: group
                .min_replicas
                .unwrap_or(0)
                .saturating_mul(group.num_of_hosts.unwrap_or(1)),
            min_resource: pod_resources(template),
            spec: template.cloned(),
        });
    }
    groups
}

/// A RayJob's task groups: its cluster's, then the submitter's (one member).
pub fn job_task_groups(cluster: &RayClusterSpec, submitter: Option<&PodSpec>) -> Vec<TaskGroup> {
    let mut groups = cluster_task_groups(cluster);
    groups.push(TaskGroup {
        name: SUBMITTER_GROUP.to_owned(),
        min_member: 1,
        min_resource: pod_resources(submitter),
        spec: submitter.cloned(),
    });
    groups
}

/// A toleration with its fields in Go's order (key, operator, value, effect, seconds), as
/// KubeRay marshals it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OrderedToleration<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    operator: Option<&'a String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    effect: Option<&'a String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    toleration_seconds: Option<i64>,
}

impl<'a> From<&'a Toleration> for OrderedToleration<'a> {
    fn from(t: &'a Toleration) -> Self {
        let some = |s: &'a Option<String>| s.as_ref().filter(|v| !v.is_empty());
        OrderedToleration {
            key: some(&t.key),
            operator: some(&t.operator),
            value: some(&t.value),
            effect: some(&t.effect),
            toleration_seconds: t.toleration_seconds,
        }
    }
}

/// The `yunikorn.apache.org/task-groups` annotation: a JSON list with each group's fields in
/// the order KubeRay writes them (minResource, nodeSelector, affinity, name, tolerations,
/// minMember), so the annotation is byte for byte KubeRay's (an `affinity` in Go's field
/// order too).
pub fn task_groups_json(groups: &[TaskGroup]) -> String {
    let mut out = String::from("[");
    for (i, group) in groups.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let mut fields: Vec<(&str, String)> = vec![(
            "minResource",
            resources_json(&group.min_resource).to_string(),
        )];
        let spec = group.spec.as_ref();
        if let Some(selector) = spec
            .and_then(|s| s.node_selector.as_ref())
            .filter(|s| !s.is_empty())
        {
            fields.push(("nodeSelector", json!(selector).to_string()));
        }
        if let Some(affinity) = spec.and_then(|s| s.affinity.as_ref()) {
            fields.push(("affinity", go_ordered(&json!(affinity))));
        }
        fields.push(("name", json!(group.name).to_string()));
        if let Some(tolerations) = spec
            .and_then(|s| s.tolerations.as_ref())
            .filter(|t| !t.is_empty())
        {
            let ordered: Vec<OrderedToleration<'_>> = tolerations.iter().map(Into::into).collect();
            fields.push((
                "tolerations",
                serde_json::to_string(&ordered).unwrap_or_else(|_| "[]".into()),
            ));
        }
        fields.push(("minMember", group.min_member.to_string()));
        out.push('{');
        let body: Vec<String> = fields
            .into_iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        out.push_str(&body.join(","));
        out.push('}');
    }
    out.push(']');
    out
}

/// The fields of the Affinity types in the order their Go structs declare them (which is how
/// KubeRay's `json.Marshal` writes them); names shared between types keep one order, and
/// `matchLabels`/`matchFields` never meet.
const GO_AFFINITY_FIELD_ORDER: &[&str] = &[
    "nodeAffinity",
    "podAffinity",
    "podAntiAffinity",
    "requiredDuringSchedulingIgnoredDuringExecution",
    "preferredDuringSchedulingIgnoredDuringExecution",
    "nodeSelectorTerms",
    "weight",
    "preference",
    "podAffinityTerm",
    "labelSelector",
    "namespaces",
    "topologyKey",
    "namespaceSelector",
    "matchLabelKeys",
    "mismatchLabelKeys",
    "matchLabels",
    "matchExpressions",
    "matchFields",
    "key",
    "operator",
    "values",
];

/// `value` as compact JSON with object keys in Go's field order (unknown keys, such as label
/// names in `matchLabels`, sorted after them, as Go sorts map keys).
fn go_ordered(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let rank = |k: &str| {
                GO_AFFINITY_FIELD_ORDER
                    .iter()
                    .position(|f| *f == k)
                    .unwrap_or(GO_AFFINITY_FIELD_ORDER.len())
            };
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| rank(a).cmp(&rank(b)).then(a.cmp(b)));
            let body: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", json!(k), go_ordered(&map[k])))
                .collect();
            format!("{{{}}}", body.join(","))
        }
        Value::Array(items) => {
            let body: Vec<String> = items.iter().map(go_ordered).collect();
            format!("[{}]", body.join(","))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
#[path = "batch_scheduler_tests.rs"]
mod tests;
