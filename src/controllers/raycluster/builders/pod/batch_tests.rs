//! `--batch-scheduler`: the Pods and PodGroups raypipe builds against what KubeRay v1.7's own
//! batch scheduler plugins make of the same clusters (`tests/fixtures/kuberay-pods/batch-*.json`,
//! printed by `tests/tools/kuberay-pods -batch-scheduler NAME`).

use serde_json::Value;

use super::super::batch_scheduler::{self, BatchScheduler};
use super::kuberay_golden::{
    assert_pods_like_kuberay, cluster_from, fixtures, meaningful, read_json,
};
use super::*;

/// The PodGroups raypipe makes for `cluster` under `scheduler`, as JSON.
fn our_pod_groups(cluster: &RayCluster, scheduler: BatchScheduler) -> Vec<Value> {
    let group = match scheduler {
        BatchScheduler::Volcano => batch_scheduler::cluster_volcano_pod_group(cluster),
        BatchScheduler::SchedulerPlugins => batch_scheduler::scheduler_plugins_pod_group(cluster),
        BatchScheduler::YuniKorn | BatchScheduler::KaiScheduler => Ok(None),
    }
    .expect("the PodGroup builds");
    group
        .into_iter()
        .map(|g| serde_json::to_value(g).expect("JSON"))
        .collect()
}

/// A PodGroup as compared: no server-assigned fields, and the owner's uid blanked (KubeRay's
/// tool builds from a file, so its owner references have none).
fn comparable(group: &Value) -> Value {
    let mut group = meaningful(group).unwrap_or(Value::Null);
    if let Some(meta) = group["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
    }
    for owner in group["metadata"]["ownerReferences"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        owner["uid"] = Value::String(String::new());
    }
    group
}

/// Pods and PodGroups of the cluster in `input` under `scheduler` are KubeRay's in `golden`.
fn assert_like_kuberay(input: &str, scheduler: BatchScheduler, golden: &str) {
    let dir = fixtures();
    let cluster = cluster_from(&dir.join(input));
    let options = BuildOptions {
        batch_scheduler: Some(scheduler),
        ..BuildOptions::default()
    };
    assert_pods_like_kuberay(&cluster, &dir.join(golden), &options);

    let kuberay = read_json(&dir.join(golden));
    let theirs: Vec<Value> = kuberay["podGroups"]
        .as_array()
        .expect("the golden lists PodGroups")
        .iter()
        .map(comparable)
        .collect();
    let ours: Vec<Value> = our_pod_groups(&cluster, scheduler)
        .iter()
        .map(comparable)
        .collect();
    assert_eq!(
        serde_json::to_string_pretty(&ours).expect("JSON"),
        serde_json::to_string_pretty(&theirs).expect("JSON"),
        "{golden}: the PodGroups differ from KubeRay's"
    );
}

#[test]
fn volcano_pods_and_pod_group_are_kuberays() {
    assert_like_kuberay(
        "batch.input.yaml",
        BatchScheduler::Volcano,
        "batch-volcano.json",
    );
}

#[test]
fn volcano_with_autoscaling_and_network_topology_is_kuberays() {
    assert_like_kuberay(
        "batch-autoscaler.input.yaml",
        BatchScheduler::Volcano,
        "batch-volcano-autoscaler.json",
    );
}

#[test]
fn volcano_leaves_a_rayjobs_cluster_to_the_jobs_pod_group() {
    assert_like_kuberay(
        "batch-rayjob.input.yaml",
        BatchScheduler::Volcano,
        "batch-rayjob-volcano.json",
    );
}

#[test]
fn yunikorn_pods_are_kuberays() {
    assert_like_kuberay(
        "batch.input.yaml",
        BatchScheduler::YuniKorn,
        "batch-yunikorn.json",
    );
    assert_like_kuberay(
        "batch-rayjob.input.yaml",
        BatchScheduler::YuniKorn,
        "batch-rayjob-yunikorn.json",
    );
}

#[test]
fn kai_scheduler_pods_are_kuberays() {
    assert_like_kuberay(
        "batch.input.yaml",
        BatchScheduler::KaiScheduler,
        "batch-kai-scheduler.json",
    );
}

#[test]
fn scheduler_plugins_pods_and_pod_group_are_kuberays() {
    assert_like_kuberay(
        "batch.input.yaml",
        BatchScheduler::SchedulerPlugins,
        "batch-scheduler-plugins.json",
    );
}

#[test]
fn the_goldens_do_carry_the_schedulers_metadata() {
    // Guards the comparison itself: the fixtures must hold what is being compared.
    let volcano = read_json(&fixtures().join("batch-volcano.json"));
    assert_eq!(volcano["worker"]["spec"]["schedulerName"], "volcano");
    assert_eq!(
        volcano["worker"]["metadata"]["annotations"]["volcano.sh/task-spec"],
        "gpu"
    );
    assert_eq!(volcano["podGroups"].as_array().map(Vec::len), Some(1));
}
