//! What to do with one worker group's Pods: delete the unhealthy ones, the ones named in
//! `workersToDelete`, create the missing, remove the surplus. Pure: the caller carries the plan
//! out and records expectations.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;

use super::builders::pod::{RAY_CONTAINER, WorkerReplica};
use super::status::{desired_workers, hosts, is_running_and_ready};
use crate::api::raycluster::WorkerGroupSpec;
use crate::kuberay::keys::labels;

/// Why a Pod is deleted (the Event message says it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    Unhealthy(String),
    /// Named in `scaleStrategy.workersToDelete` (or in the same multi-host replica as one).
    Requested,
    /// More Pods than desired, and the autoscaler does not decide.
    ScaleDown,
    /// A multi-host replica lost a host: the rest goes too.
    IncompleteReplica,
}

impl DeleteReason {
    pub fn describe(&self) -> String {
        match self {
            DeleteReason::Unhealthy(why) => why.clone(),
            DeleteReason::Requested => "named in scaleStrategy.workersToDelete".into(),
            DeleteReason::ScaleDown => "scaling down".into(),
            DeleteReason::IncompleteReplica => "its multi-host replica is incomplete".into(),
        }
    }
}

/// The plan for one group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupPlan {
    /// The group is suspended: delete all its Pods.
    pub delete_all: bool,
    pub delete: Vec<(String, DeleteReason)>,
    pub create: Vec<WorkerReplica>,
    /// Set when this pass must stop after its deletions and come back (KubeRay returns an
    /// error there): no creation happens before the deletions are seen.
    pub wait: Option<String>,
    /// A spec the group cannot follow.
    pub error: Option<String>,
}

fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Why a Pod must be replaced: it finished (Failed or Succeeded), or its Ray container
/// terminated in a Pod that never restarts containers. `None` for a healthy Pod.
pub fn unhealthy_reason(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let phase = status.phase.as_deref().unwrap_or_default();
    let name = pod_name(pod);
    if phase == "Failed" || phase == "Succeeded" {
        return Some(format!("Pod {name} is {phase}, a terminal phase"));
    }
    let ray_container = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.get(RAY_CONTAINER))
        .map(|c| c.name.as_str())?;
    // Container statuses are not in container order: find the Ray container by name.
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find(|s| s.name == ray_container)
        .and_then(|s| s.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    let never_restarts =
        pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
    if phase == "Running" && terminated.is_some() && never_restarts {
        return Some(format!(
            "the Ray container of Pod {name} terminated and restartPolicy Never keeps it down"
        ));
    }
    None
}

/// Scale-down order: Pods already going away, then those not running, then running but not
/// ready, then ready ones; the newest first within each.
fn scale_down_order<'a>(pods: &[&'a Pod]) -> Vec<&'a Pod> {
    let rank = |pod: &Pod| {
        if is_terminating(pod) {
            0
        } else if pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running") {
            1
        } else if !is_running_and_ready(pod) {
            2
        } else {
            3
        }
    };
    let mut ordered = pods.to_vec();
    ordered.sort_by(|a, b| {
        rank(a).cmp(&rank(b)).then_with(|| {
            let created = |p: &Pod| p.metadata.creation_timestamp.clone();
            created(b)
                .cmp(&created(a))
                .then_with(|| pod_name(b).cmp(pod_name(a)))
        })
    });
    ordered
}

fn replica_index(pod: &Pod) -> Option<u32> {
    label(pod, labels::REPLICA_INDEX).and_then(|v| v.parse().ok())
}

/// The lowest `count` indices not in `used`.
fn free_indices(used: &BTreeSet<u32>, count: usize) -> Vec<u32> {
    (0..).filter(|i| !used.contains(i)).take(count).collect()
}

/// Plans one group. `pods` are the group's Pods in the cache, terminating ones included;
/// `scale_down_allowed` is false when the autoscaler alone decides which Pods go;
/// `new_replica_suffix` names new multi-host replicas.
pub fn plan_group(
    group: &WorkerGroupSpec,
    pods: &[&Pod],
    scale_down_allowed: bool,
    new_replica_suffix: &mut dyn FnMut() -> String,
) -> GroupPlan {
    if group.suspend == Some(true) {
        return GroupPlan {
            delete_all: true,
            ..Default::default()
        };
    }
    if hosts(group) > 1 {
        return plan_multi_host(group, pods, scale_down_allowed, new_replica_suffix);
    }
    let mut plan = GroupPlan::default();

    for pod in pods {
        if let Some(reason) = unhealthy_reason(pod) {
            plan.delete
                .push((pod_name(pod).to_owned(), DeleteReason::Unhealthy(reason)));
        }
    }
    if !plan.delete.is_empty() {
        plan.wait = Some(format!(
            "deleted {} unhealthy worker Pods",
            plan.delete.len()
        ));
        return plan;
    }

    // Only Pods of this group are deleted by name; Pods already terminating need no call.
    let requested = workers_to_delete(group);
    let mut deleted = BTreeSet::new();
    for pod in pods {
        let name = pod_name(pod);
        if requested.contains(name) && !is_terminating(pod) {
            plan.delete.push((name.to_owned(), DeleteReason::Requested));
            deleted.insert(name);
        }
    }

    let remaining: Vec<&Pod> = pods
        .iter()
        .copied()
        .filter(|p| !deleted.contains(pod_name(p)))
        .collect();
    let desired = usize::try_from(desired_workers(group)).unwrap_or(0);
    if desired > remaining.len() {
        let used: BTreeSet<u32> = remaining.iter().filter_map(|p| replica_index(p)).collect();
        plan.create = free_indices(&used, desired - remaining.len())
            .into_iter()
            .map(|replica_index| WorkerReplica {
                replica_index,
                ..Default::default()
            })
            .collect();
    } else if desired < remaining.len() && scale_down_allowed {
        let surplus = remaining.len() - desired;
        for pod in scale_down_order(&remaining).into_iter().take(surplus) {
            plan.delete
                .push((pod_name(pod).to_owned(), DeleteReason::ScaleDown));
        }
    }
    plan
}

/// Multi-host groups scale by whole replicas (`numOfHosts` Pods that share a replica name).
fn plan_multi_host(
    group: &WorkerGroupSpec,
    pods: &[&Pod],
    scale_down_allowed: bool,
    new_replica_suffix: &mut dyn FnMut() -> String,
) -> GroupPlan {
    let mut plan = GroupPlan::default();
    let hosts = usize::try_from(hosts(group)).unwrap_or(1);
    let mut replicas: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for pod in pods {
        if let Some(replica) = label(pod, labels::REPLICA_NAME) {
            replicas.entry(replica).or_default().push(pod);
        }
    }
    let delete_replica = |plan: &mut GroupPlan, members: &[&Pod], reason: DeleteReason| {
        for pod in members {
            if !is_terminating(pod) {
                plan.delete.push((pod_name(pod).to_owned(), reason.clone()));
            }
        }
    };
    // Whole replicas go and the group waits for them before anything else happens.
    let delete_replicas =
        |mut plan: GroupPlan, names: &[&str], reason: DeleteReason, wait: String| {
            for name in names {
                delete_replica(&mut plan, &replicas[name], reason.clone());
            }
            plan.wait = Some(wait);
            plan
        };

    // A replica that lost a host cannot work: remove the rest and start over.
    let incomplete: Vec<&str> = replicas
        .iter()
        .filter(|(_, members)| members.len() < hosts)
        .map(|(name, _)| *name)
        .collect();
    if !incomplete.is_empty() {
        let wait = format!("deleted incomplete multi-host replicas {incomplete:?}");
        return delete_replicas(plan, &incomplete, DeleteReason::IncompleteReplica, wait);
    }

    let mut gone: BTreeSet<&str> = BTreeSet::new();
    for (name, members) in &replicas {
        if let Some(reason) = members.iter().find_map(|p| unhealthy_reason(p)) {
            delete_replica(&mut plan, members, DeleteReason::Unhealthy(reason));
            gone.insert(name);
        }
    }

    let requested = workers_to_delete(group);
    let requested_replicas: BTreeSet<&str> = replicas
        .iter()
        .filter(|(name, members)| {
            !gone.contains(*name)
                && members
                    .iter()
                    .any(|p| requested.contains(pod_name(p)) && !is_terminating(p))
        })
        .map(|(name, _)| *name)
        .collect();
    if !requested_replicas.is_empty() {
        let wait =
            format!("deleted multi-host replicas {requested_replicas:?} named in workersToDelete");
        let names: Vec<&str> = requested_replicas.into_iter().collect();
        return delete_replicas(plan, &names, DeleteReason::Requested, wait);
    }

    let desired_pods = usize::try_from(desired_workers(group)).unwrap_or(0);
    if desired_pods % hosts != 0 {
        plan.error = Some(format!(
            "desired worker Pods ({desired_pods}) of group {} are not a multiple of numOfHosts ({hosts})",
            group.group_name
        ));
        return plan;
    }
    let desired = desired_pods / hosts;
    let healthy: Vec<(&str, &Vec<&Pod>)> = replicas
        .iter()
        .filter(|(name, _)| !gone.contains(*name))
        .map(|(name, members)| (*name, members))
        .collect();
    if desired > healthy.len() {
        let used: BTreeSet<u32> = healthy
            .iter()
            .filter_map(|(_, members)| members.first().and_then(|p| replica_index(p)))
            .collect();
        for replica_index in free_indices(&used, desired - healthy.len()) {
            let replica_name = format!("{}-{}", group.group_name, new_replica_suffix());
            for host_index in 0..u32::try_from(hosts).unwrap_or(1) {
                plan.create.push(WorkerReplica {
                    replica_name: Some(replica_name.clone()),
                    replica_index,
                    host_index,
                });
            }
        }
    } else if desired < healthy.len() && scale_down_allowed {
        // Highest replica index first, so indices stay dense from 0.
        let mut ordered = healthy.clone();
        ordered.sort_by_key(|(name, members)| {
            (
                std::cmp::Reverse(members.first().and_then(|p| replica_index(p))),
                *name,
            )
        });
        for (_, members) in ordered.into_iter().take(healthy.len() - desired) {
            delete_replica(&mut plan, members, DeleteReason::ScaleDown);
        }
    }
    plan
}

/// The Pod names `scaleStrategy.workersToDelete` asks to delete.
fn workers_to_delete(group: &WorkerGroupSpec) -> BTreeSet<&str> {
    group
        .scale_strategy
        .as_ref()
        .and_then(|s| s.workers_to_delete.as_ref())
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(name: &str, extra_labels: Value, status: Value) -> Pod {
        let mut labels = json!({"ray.io/node-type": "worker", "ray.io/group": "g"});
        for (k, v) in extra_labels.as_object().cloned().unwrap_or_default() {
            labels[k] = v;
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "ray-worker"}], "restartPolicy": "Never"},
            "status": status
        }))
        .expect("a Pod")
    }

    fn ready(name: &str, index: u32) -> Pod {
        pod(
            name,
            json!({"ray.io/worker-group-replica-index": index.to_string()}),
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
        )
    }

    fn group(replicas: i32, workers_to_delete: &[&str]) -> WorkerGroupSpec {
        serde_json::from_value(json!({
            "groupName": "g", "replicas": replicas, "minReplicas": 0, "maxReplicas": 10,
            "scaleStrategy": {"workersToDelete": workers_to_delete},
            "template": {}
        }))
        .expect("a group")
    }

    fn plan(group: &WorkerGroupSpec, pods: &[Pod], scale_down: bool) -> GroupPlan {
        let refs: Vec<&Pod> = pods.iter().collect();
        let mut n = 0;
        plan_group(group, &refs, scale_down, &mut || {
            n += 1;
            format!("r{n:04}")
        })
    }

    fn deleted(plan: &GroupPlan) -> Vec<&str> {
        plan.delete.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn scale_up_uses_the_lowest_free_indices() {
        let pods = [ready("a", 0), ready("b", 2)];
        let plan = plan(&group(4, &[]), &pods, true);
        let indices: Vec<u32> = plan.create.iter().map(|r| r.replica_index).collect();
        assert_eq!(indices, [1, 3]);
        assert!(plan.delete.is_empty() && plan.wait.is_none());
    }

    #[test]
    fn workers_to_delete_removes_exactly_those_pods() {
        let pods = [ready("a", 0), ready("b", 1), ready("c", 2)];
        let plan = plan(&group(1, &["a", "c", "not-ours"]), &pods, true);
        assert_eq!(deleted(&plan), ["a", "c"]);
        assert!(
            plan.delete
                .iter()
                .all(|(_, r)| *r == DeleteReason::Requested)
        );
        assert!(plan.create.is_empty());
        // Without a lower replica count, the named Pods are replaced.
        let plan = super::tests::plan(&group(3, &["b"]), &pods, true);
        assert_eq!(deleted(&plan), ["b"]);
        assert_eq!(
            plan.create
                .iter()
                .map(|r| r.replica_index)
                .collect::<Vec<_>>(),
            [1]
        );
    }

    #[test]
    fn unhealthy_pods_are_replaced_first() {
        let failed = pod("f", json!({}), json!({"phase": "Failed"}));
        let crashed = pod(
            "x",
            json!({}),
            json!({"phase": "Running", "containerStatuses": [{"name": "ray-worker", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1}}}]}),
        );
        let pods = [ready("a", 0), failed, crashed];
        let plan = plan(&group(5, &["a"]), &pods, true);
        assert_eq!(deleted(&plan), ["f", "x"]);
        assert!(plan.create.is_empty(), "creation waits for the next pass");
        assert!(plan.wait.is_some());
    }

    #[test]
    fn scale_down_only_without_the_autoscaler_and_least_useful_first() {
        let pending = pod(
            "p",
            json!({"ray.io/worker-group-replica-index": "3"}),
            json!({"phase": "Pending"}),
        );
        let pods = [ready("a", 0), ready("b", 1), pending];
        let plan = plan(&group(1, &[]), &pods, true);
        assert_eq!(deleted(&plan), ["p", "b"]);
        let autoscaled = super::tests::plan(&group(1, &[]), &pods, false);
        assert!(
            autoscaled.delete.is_empty(),
            "the autoscaler picks the Pods"
        );
    }

    #[test]
    fn terminating_pods_count_until_gone() {
        let mut going = ready("t", 1);
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1).expect("time"),
            ));
        let pods = [ready("a", 0), going];
        let plan = plan(&group(2, &["t"]), &pods, true);
        assert!(plan.delete.is_empty() && plan.create.is_empty(), "{plan:?}");
    }

    #[test]
    fn suspended_group_deletes_everything() {
        let mut suspended = group(3, &[]);
        suspended.suspend = Some(true);
        assert!(plan(&suspended, &[ready("a", 0)], true).delete_all);
    }

    fn host(name: &str, replica: &str, index: u32, host: u32) -> Pod {
        pod(
            name,
            json!({"ray.io/worker-group-replica-name": replica, "ray.io/worker-group-replica-index": index.to_string(),
                   "ray.io/replica-host-index": host.to_string()}),
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
        )
    }

    fn multi(replicas: i32, workers_to_delete: &[&str]) -> WorkerGroupSpec {
        let mut g = group(replicas, workers_to_delete);
        g.num_of_hosts = Some(2);
        g
    }

    #[test]
    fn multi_host_creates_whole_replicas() {
        let pods = [host("a0", "g-aaaaa", 0, 0), host("a1", "g-aaaaa", 0, 1)];
        let plan = plan(&multi(2, &[]), &pods, true);
        assert_eq!(
            plan.create,
            [
                WorkerReplica {
                    replica_name: Some("g-r0001".into()),
                    replica_index: 1,
                    host_index: 0
                },
                WorkerReplica {
                    replica_name: Some("g-r0001".into()),
                    replica_index: 1,
                    host_index: 1
                },
            ]
        );
    }

    #[test]
    fn multi_host_deletes_incomplete_requested_and_surplus_replicas_whole() {
        let incomplete = [
            host("a0", "g-aaaaa", 0, 0),
            host("a1", "g-aaaaa", 0, 1),
            host("b0", "g-bbbbb", 1, 0),
        ];
        let plan1 = plan(&multi(2, &[]), &incomplete, true);
        assert_eq!(deleted(&plan1), ["b0"]);
        assert!(plan1.wait.is_some() && plan1.create.is_empty());

        let two = [
            host("a0", "g-aaaaa", 0, 0),
            host("a1", "g-aaaaa", 0, 1),
            host("b0", "g-bbbbb", 1, 0),
            host("b1", "g-bbbbb", 1, 1),
        ];
        let requested = plan(&multi(1, &["a1"]), &two, true);
        assert_eq!(deleted(&requested), ["a0", "a1"]);
        assert!(requested.wait.is_some());

        let surplus = plan(&multi(1, &[]), &two, true);
        assert_eq!(
            deleted(&surplus),
            ["b0", "b1"],
            "highest replica index first"
        );
        assert!(plan(&multi(1, &[]), &two, false).delete.is_empty());
    }
}
