//! The RayCluster status, computed from the spec, the Pods and the head Service as KubeRay
//! computes it: replica counts, desired resources, `state`, conditions, endpoints, head info.
//! Everything here is pure (the time is an input); the status stage of the reconcile, which
//! writes the computed status when it changed, is `status_write`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSpec, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::builders::ray_start::is_gpu_resource;
use crate::api::conditions::{self, FALSE, TRUE, condition, set_condition};
use crate::api::raycluster::{
    ClusterState, HeadInfo, RayCluster, RayClusterSpec, RayClusterStatus, WorkerGroupSpec,
    condition_reasons, condition_types,
};
use crate::kuberay::keys::labels;
use crate::kuberay::quantity::Amount;

pub use crate::controllers::frame::pass::StatusWrite;

/// How the reconcile that precedes the status went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Everything was applied.
    Clean,
    /// Progress that needs another pass (e.g. unhealthy Pods deleted, creations wait).
    Waiting(String),
    /// A failure; Pod create/delete failures carry their `ReplicaFailure` reason.
    Failed {
        replica_failure: Option<&'static str>,
        message: String,
    },
}

/// Everything the status is computed from.
pub struct StatusInputs<'a> {
    pub cluster: &'a RayCluster,
    /// The cluster's head and worker Pods, terminating ones included.
    pub pods: &'a [&'a Pod],
    pub head_service: Option<&'a Service>,
    pub outcome: &'a Outcome,
    /// The status to start from (the last one written).
    pub previous: Option<&'a RayClusterStatus>,
    pub now: Time,
}

/// Desired Pods of a group: replicas clamped to [min, max] (unset: min), times hosts; 0 when
/// the group is suspended.
pub fn desired_workers(group: &WorkerGroupSpec) -> i32 {
    if group.suspend == Some(true) {
        return 0;
    }
    let min = group.min_replicas.unwrap_or(0);
    let max = group.max_replicas.unwrap_or(i32::MAX);
    let replicas = match group.replicas {
        None => min,
        Some(r) if r < min => min,
        Some(r) if r > max => max,
        Some(r) => r,
    };
    replicas.saturating_mul(hosts(group))
}

/// `numOfHosts`, at least 1.
pub fn hosts(group: &WorkerGroupSpec) -> i32 {
    group.num_of_hosts.unwrap_or(1).max(1)
}

fn node_type(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::NODE_TYPE))
        .map(String::as_str)
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn ready_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
}

/// Running with a True Ready condition.
pub fn is_running_and_ready(pod: &Pod) -> bool {
    phase(pod) == Some("Running") && ready_condition(pod).is_some_and(|c| c.status == TRUE)
}

/// KubeRay's "all Pods running": at least one Pod, all Running, none with a Ready condition
/// other than True (a Pod without one counts as ready).
pub fn all_pods_running(pods: &[&Pod]) -> bool {
    !pods.is_empty()
        && pods.iter().all(|pod| {
            phase(pod) == Some("Running") && ready_condition(pod).is_none_or(|c| c.status == TRUE)
        })
}

/// Requests of a Pod template, with limits where a request is missing, summed over its
/// containers.
fn pod_resources(spec: Option<&PodSpec>) -> BTreeMap<String, Amount> {
    let mut total: BTreeMap<String, Amount> = BTreeMap::new();
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

/// Total resources of the head and `replicas * numOfHosts` workers of every group (replicas as
/// written, not clamped; suspended groups count nothing).
fn desired_resources(cluster: &RayCluster) -> BTreeMap<String, Amount> {
    let mut total = pod_resources(cluster.spec.head_group_spec.template.spec.as_ref());
    for group in cluster.spec.worker_group_specs.iter().flatten() {
        if group.suspend == Some(true) {
            continue;
        }
        let count = i64::from(group.replicas.unwrap_or(0)) * i64::from(hosts(group));
        for (name, amount) in pod_resources(group.template.spec.as_ref()) {
            let sum = total
                .get(&name)
                .copied()
                .unwrap_or_default()
                .plus(amount.times(count));
            total.insert(name, sum);
        }
    }
    total
}

/// The HeadPodReady condition from the head Pod's Ready condition.
fn head_pod_ready(
    head: Option<&Pod>,
    generation: Option<i64>,
    now: &Time,
) -> conditions::Condition {
    let Some(head) = head else {
        return condition(
            condition_types::HEAD_POD_READY,
            FALSE,
            condition_reasons::HEAD_POD_NOT_FOUND,
            "Head Pod not found",
            generation,
            now.clone(),
        );
    };
    let Some(ready) = ready_condition(head) else {
        return condition(
            condition_types::HEAD_POD_READY,
            FALSE,
            condition_reasons::UNKNOWN,
            "",
            generation,
            now.clone(),
        );
    };
    let mut reason = ready.reason.clone().unwrap_or_default();
    let mut message = ready.message.clone().unwrap_or_default();
    if ready.status == TRUE && reason.is_empty() {
        reason = condition_reasons::HEAD_POD_RUNNING_AND_READY.to_owned();
    }
    if reason == "ContainersNotReady" {
        // The first waiting or terminated container says more than "ContainersNotReady".
        let statuses = head
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        let detail = statuses.into_iter().flatten().find_map(|s| {
            let state = s.state.as_ref()?;
            if let Some(waiting) = &state.waiting {
                Some((
                    waiting.reason.clone(),
                    s.name.clone(),
                    waiting.message.clone(),
                ))
            } else {
                state
                    .terminated
                    .as_ref()
                    .map(|t| (t.reason.clone(), s.name.clone(), t.message.clone()))
            }
        });
        if let Some((detail_reason, container, detail_message)) = detail {
            if !message.is_empty() {
                message.push_str("; ");
            }
            message.push_str(&format!(
                "{container}: {}",
                detail_message.unwrap_or_default()
            ));
            reason = detail_reason.unwrap_or_default();
        }
    }
    if reason.is_empty() {
        reason = condition_reasons::UNKNOWN.to_owned();
    }
    condition(
        condition_types::HEAD_POD_READY,
        &ready.status,
        &reason,
        message,
        generation,
        now.clone(),
    )
}

pub(super) fn is_true(status: &RayClusterStatus, type_: &str) -> bool {
    conditions::find(&status.conditions, type_).is_some_and(|c| c.status == TRUE)
}

/// Head Service ports by name: the node port when there is one, else the target port.
fn endpoints(service: &Service) -> BTreeMap<String, String> {
    let mut endpoints = BTreeMap::new();
    for port in service.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
        let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) else {
            continue;
        };
        let value = match (&port.node_port, &port.target_port) {
            (Some(node_port), _) if *node_port != 0 => node_port.to_string(),
            (_, Some(IntOrString::Int(target))) if *target != 0 => target.to_string(),
            (_, Some(IntOrString::String(target))) if !target.is_empty() => target.clone(),
            _ => continue,
        };
        endpoints.insert(name.to_owned(), value);
    }
    endpoints
}

fn non_empty(value: Option<&String>) -> Option<String> {
    value.filter(|v| !v.is_empty()).cloned()
}

/// The new status. Pure: the time is an input.
pub fn compute_status(inputs: &StatusInputs<'_>) -> RayClusterStatus {
    let cluster = inputs.cluster;
    let generation = cluster.metadata.generation;
    let now = &inputs.now;
    let mut status = inputs.previous.cloned().unwrap_or_default();

    record_outcome(&mut status, inputs.outcome, generation, now);
    status.observed_generation = generation;
    let desired = set_replica_counts(&mut status, &cluster.spec, inputs.pods);
    set_desired_resources(&mut status, cluster);

    let previous_state = status.state;
    let all_running = all_pods_running(inputs.pods);
    if *inputs.outcome == Outcome::Clean
        && inputs.pods.len() == usize::try_from(desired).unwrap_or(0) + 1
        && all_running
    {
        status.state = Some(ClusterState::Ready);
        status.reason = None;
    }

    let head = inputs
        .pods
        .iter()
        .copied()
        .find(|p| node_type(p) == Some(labels::HEAD));
    set_condition(
        &mut status.conditions,
        head_pod_ready(head, generation, now),
    );
    set_lifecycle_conditions(&mut status, inputs, all_running);
    if cluster.spec.suspend == Some(true) && inputs.pods.is_empty() {
        status.state = Some(ClusterState::Suspended);
    }

    set_head_info(&mut status, head, inputs.head_service);

    if status.state != previous_state
        && let Some(state) = status.state
    {
        status
            .state_transition_times
            .get_or_insert_with(BTreeMap::new)
            .insert(state.as_str().to_owned(), now.clone());
    }
    status.last_update_time = Some(now.clone());
    status
}

/// The `ReplicaFailure` condition after the reconcile's outcome.
fn record_outcome(
    status: &mut RayClusterStatus,
    outcome: &Outcome,
    generation: Option<i64>,
    now: &Time,
) {
    match outcome {
        Outcome::Clean => status
            .conditions
            .retain(|c| c.type_ != condition_types::REPLICA_FAILURE),
        Outcome::Failed {
            replica_failure: Some(reason),
            message,
        } => set_condition(
            &mut status.conditions,
            condition(
                condition_types::REPLICA_FAILURE,
                TRUE,
                reason,
                message.clone(),
                generation,
                now.clone(),
            ),
        ),
        // Other problems leave the condition as it was, as in KubeRay.
        Outcome::Failed { .. } | Outcome::Waiting(_) => {}
    }
}

/// The worker replica counts: ready and available from the Pods, desired, min and max from
/// the spec. Returns the desired count.
fn set_replica_counts(status: &mut RayClusterStatus, spec: &RayClusterSpec, pods: &[&Pod]) -> i32 {
    let workers: Vec<&Pod> = pods
        .iter()
        .copied()
        .filter(|p| node_type(p) == Some(labels::WORKER))
        .collect();
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    status.ready_worker_replicas = Some(count(
        workers.iter().filter(|p| is_running_and_ready(p)).count(),
    ));
    status.available_worker_replicas = Some(count(
        workers
            .iter()
            .filter(|p| phase(p) == Some("Running"))
            .count(),
    ));
    let groups: Vec<&WorkerGroupSpec> = spec.worker_group_specs.iter().flatten().collect();
    let desired: i32 = groups
        .iter()
        .map(|g| desired_workers(g))
        .fold(0, i32::saturating_add);
    status.desired_worker_replicas = Some(desired);
    let active = groups.iter().filter(|g| g.suspend != Some(true));
    status.min_worker_replicas = Some(
        active
            .clone()
            .map(|g| g.min_replicas.unwrap_or(0).saturating_mul(hosts(g)))
            .fold(0, i32::saturating_add),
    );
    let max: i64 = active
        .map(|g| i64::from(g.max_replicas.unwrap_or(i32::MAX)) * i64::from(hosts(g)))
        .sum();
    status.max_worker_replicas = Some(i32::try_from(max).unwrap_or(i32::MAX));
    desired
}

/// The CPU, memory, GPU and TPU the spec asks for.
fn set_desired_resources(status: &mut RayClusterStatus, cluster: &RayCluster) {
    let resources = desired_resources(cluster);
    let get = |name: &str| resources.get(name).copied().unwrap_or_default();
    status.desired_cpu = Some(get("cpu").to_quantity());
    status.desired_memory = Some(get("memory").to_quantity());
    let gpus = resources
        .iter()
        .filter(|(name, amount)| is_gpu_resource(name) && !amount.is_zero())
        .fold(Amount::default(), |sum, (_, amount)| sum.plus(*amount));
    status.desired_gpu = Some(gpus.to_quantity());
    status.desired_tpu = Some(get("google.com/tpu").to_quantity());
}

/// The Provisioned, Suspending and Suspended conditions.
fn set_lifecycle_conditions(
    status: &mut RayClusterStatus,
    inputs: &StatusInputs<'_>,
    all_running: bool,
) {
    let generation = inputs.cluster.metadata.generation;
    let now = &inputs.now;
    let suspending = is_true(status, condition_types::RAY_CLUSTER_SUSPENDING);
    let suspended = is_true(status, condition_types::RAY_CLUSTER_SUSPENDED);
    let set =
        |status: &mut RayClusterStatus, type_: &str, value: &str, reason: &str, message: &str| {
            set_condition(
                &mut status.conditions,
                condition(type_, value, reason, message, generation, now.clone()),
            );
        };
    // Provisioned turns True once, when every Pod first runs and is ready; only a suspension
    // resets it.
    if !is_true(status, condition_types::RAY_CLUSTER_PROVISIONED) && !suspended {
        if all_running {
            set(
                status,
                condition_types::RAY_CLUSTER_PROVISIONED,
                TRUE,
                condition_reasons::ALL_POD_RUNNING_AND_READY_FIRST_TIME,
                "All Ray Pods are ready for the first time",
            );
        } else {
            set(
                status,
                condition_types::RAY_CLUSTER_PROVISIONED,
                FALSE,
                condition_reasons::RAY_CLUSTER_PODS_PROVISIONING,
                "RayCluster Pods are being provisioned for first time",
            );
        }
    }
    let wants_suspend = inputs.cluster.spec.suspend == Some(true);
    let suspending_type = condition_types::RAY_CLUSTER_SUSPENDING;
    let suspended_type = condition_types::RAY_CLUSTER_SUSPENDED;
    if suspending {
        if inputs.pods.is_empty() {
            set(
                status,
                condition_types::RAY_CLUSTER_PROVISIONED,
                FALSE,
                condition_reasons::RAY_CLUSTER_PODS_PROVISIONING,
                "RayCluster has been suspended",
            );
            set(status, suspending_type, FALSE, suspending_type, "");
            set(status, suspended_type, TRUE, suspended_type, "");
        }
    } else if suspended {
        // KubeRay resumes only on an explicit `suspend: false`; an unset field resumes too.
        if !wants_suspend {
            set(status, suspended_type, FALSE, suspended_type, "");
        }
    } else {
        set(status, suspended_type, FALSE, suspended_type, "");
        let value = if wants_suspend { TRUE } else { FALSE };
        set(status, suspending_type, value, suspending_type, "");
    }
}

/// The endpoints and the head's Pod and Service names and IPs.
fn set_head_info(
    status: &mut RayClusterStatus,
    head: Option<&Pod>,
    head_service: Option<&Service>,
) {
    if let Some(service) = head_service {
        status.endpoints = Some(endpoints(service)).filter(|e| !e.is_empty());
    }
    let head_status = head.and_then(|p| p.status.as_ref());
    let head_pod_ip = non_empty(head_status.and_then(|s| s.pod_ip.as_ref()));
    let service_ip = head_service.and_then(|s| {
        let cluster_ip = s.spec.as_ref().and_then(|spec| spec.cluster_ip.as_ref())?;
        // A headless Service has no IP of its own: the head Pod's stands in.
        if cluster_ip == "None" {
            head_pod_ip.clone()
        } else {
            non_empty(Some(cluster_ip))
        }
    });
    status.head = Some(HeadInfo {
        pod_ip: head_pod_ip,
        service_ip,
        pod_name: head.and_then(|p| non_empty(p.metadata.name.as_ref())),
        service_name: head_service.and_then(|s| non_empty(s.metadata.name.as_ref())),
    });
}

/// How long a change that only moves a cluster's provisioning along (Pod counts, the head
/// Pod's and Service's details, why the head Pod is not ready yet) may wait for the next one
/// before it is written: under load a new cluster's Pods turn ready seconds apart, and one write
/// when they all are says what a write per Pod would. A milestone (the head Pod turning ready,
/// the cluster provisioned, a failure, a state) is never held.
pub const PROGRESS_HOLD: Duration = Duration::from_secs(5);

/// How long a status this controller wrote may be missing from its cache before it is written
/// again (the watch usually shows it within milliseconds; a write in between would repeat it).
pub const CACHE_LAG_GRACE: Duration = Duration::from_secs(30);

/// What the status stage last wrote (or found written), and how long ago it wrote it.
#[derive(Clone, Copy, Debug)]
pub struct LastWritten<'a> {
    pub status: &'a RayClusterStatus,
    /// `None`: found in the cache, not written by this process.
    pub since_write: Option<Duration>,
}

/// Whether and when the computed status `new` is written. Pure: `cached` is what the cache
/// shows, `last` what this controller last wrote, `held_for` how long a progress-only change
/// has waited already.
pub fn plan_write(
    cached: Option<&RayClusterStatus>,
    last: Option<LastWritten<'_>>,
    held_for: Option<Duration>,
    new: &RayClusterStatus,
) -> StatusWrite {
    if !differs(cached, new) {
        return StatusWrite::Skip;
    }
    let Some(last) = last else {
        return StatusWrite::Now;
    };
    if !differs(Some(last.status), new) {
        // Written already; the cache has not caught up yet (or someone else changed it since,
        // which the next write after the grace mends).
        return match last.since_write {
            Some(age) if age < CACHE_LAG_GRACE => StatusWrite::Skip,
            _ => StatusWrite::Now,
        };
    }
    let waited = held_for.unwrap_or_default();
    if waited < PROGRESS_HOLD && only_progress(last.status, new) {
        return StatusWrite::Hold(PROGRESS_HOLD - waited);
    }
    StatusWrite::Now
}

/// Whether `new` differs from `old` only in how far a cluster that was never provisioned has
/// come: worker counts, head Pod and Service details, and the head Pod's not-ready reason.
fn only_progress(old: &RayClusterStatus, new: &RayClusterStatus) -> bool {
    if is_true(new, condition_types::RAY_CLUSTER_PROVISIONED) {
        return false;
    }
    let head_ready = |s: &RayClusterStatus| {
        conditions::find(&s.conditions, condition_types::HEAD_POD_READY).map(|c| c.status.clone())
    };
    if head_ready(old) != head_ready(new) {
        return false;
    }
    let others = |s: &RayClusterStatus| -> Vec<conditions::Condition> {
        s.conditions
            .iter()
            .filter(|c| c.type_ != condition_types::HEAD_POD_READY)
            .cloned()
            .collect()
    };
    if others(old) != others(new) {
        return false;
    }
    let mut rest = new.clone();
    rest.ready_worker_replicas = old.ready_worker_replicas;
    rest.available_worker_replicas = old.available_worker_replicas;
    rest.head = old.head.clone();
    rest.endpoints = old.endpoints.clone();
    rest.conditions = old.conditions.clone();
    rest.last_update_time = old.last_update_time.clone();
    rest == *old
}

/// Whether `new` says anything `old` does not (the update time aside).
pub fn differs(old: Option<&RayClusterStatus>, new: &RayClusterStatus) -> bool {
    let Some(old) = old else {
        return true;
    };
    let mut old = old.clone();
    old.last_update_time = new.last_update_time.clone();
    old != *new
}

/// How the Pods step ended when it did not fail.
pub(super) enum Progress {
    Done,
    Waiting(String),
}

#[cfg(test)]
mod tests;
