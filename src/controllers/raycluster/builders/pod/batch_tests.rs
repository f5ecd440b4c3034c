//! `--batch-scheduler`: the Pods and PodGroups raypipe builds against what KubeRay v1.7's own
//! batch scheduler plugins make of the same clusters (`tests/fixtures/kuberay-pods/batch-*.json`,
//! printed by `tests/tools/kuberay-pods -batch-scheduler NAME`).

use kube::ResourceExt;
use serde_json::{Value, json};

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

/// A RayJob from our input YAML, as the API server would store it (namespace, uid, the
/// numOfHosts default in its cluster spec).
fn rayjob_from(input: &str) -> crate::api::rayjob::RayJob {
    let path = fixtures().join(input);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut job: crate::api::rayjob::RayJob = serde_yaml::from_str(&text).expect("a RayJob");
    job.metadata.namespace = Some("default".into());
    job.metadata.uid = Some("uid-job".into());
    for group in job
        .spec
        .ray_cluster_spec
        .as_mut()
        .and_then(|s| s.worker_group_specs.as_mut())
        .into_iter()
        .flatten()
    {
        group.num_of_hosts.get_or_insert(1);
    }
    job
}

/// A RayJob's batch scheduling against KubeRay's (`golden`): the job's PodGroup, its
/// RayCluster's labels and annotations, the submitter Pod template's scheduler metadata
/// (K8sJobMode), and the Pods of that cluster.
fn assert_rayjob_like_kuberay(input: &str, scheduler: BatchScheduler, golden: &str) {
    use crate::controllers::rayjob::build;
    let job = rayjob_from(input);
    let kuberay = read_json(&fixtures().join(golden));
    let mut problems = crate::validation::problem::Problems::new("", "");
    let values = crate::validation::rayjob::rayjob_spec(
        &job.spec,
        "spec",
        job.annotations(),
        &Default::default(),
        &mut problems,
    )
    .expect("the RayJob's values");

    let theirs: Vec<Value> = kuberay["podGroups"]
        .as_array()
        .expect("the golden lists PodGroups")
        .iter()
        .map(comparable)
        .collect();
    let ours: Vec<Value> = match scheduler {
        BatchScheduler::Volcano => {
            let group = build::volcano_pod_group(&job, values.mode).expect("the PodGroup builds");
            vec![comparable(&serde_json::to_value(group).expect("JSON"))]
        }
        _ => Vec::new(),
    };
    assert_eq!(ours, theirs, "{golden}: the RayJob's PodGroups");

    let cluster_name = kuberay["rayClusterMetadata"]["name"]
        .as_str()
        .expect("the cluster's name");
    let mut cluster = build::ray_cluster(&job, &values, cluster_name, "job-id").expect("builds");
    build::add_scheduler_metadata_to_cluster(&job, values.mode, scheduler, &mut cluster);
    assert_eq!(
        json!(cluster.metadata.labels),
        kuberay["rayClusterMetadata"]["labels"],
        "{golden}: the RayCluster's labels"
    );
    assert_eq!(
        json!(cluster.metadata.annotations),
        kuberay["rayClusterMetadata"]["annotations"],
        "{golden}: the RayCluster's annotations"
    );

    if values.mode == crate::api::rayjob::JobSubmissionMode::K8sJobMode {
        let mut submitter =
            build::submitter_job(&job, &values, &cluster, "head:8265", "job-id").expect("builds");
        build::add_scheduler_metadata_to_submitter(&job, scheduler, &mut submitter);
        let template = serde_json::to_value(submitter.spec.expect("spec").template).expect("JSON");
        let theirs = &kuberay["submitterTemplate"];
        assert_eq!(
            template["spec"]["schedulerName"], theirs["spec"]["schedulerName"],
            "{golden}: the submitter's scheduler"
        );
        assert_eq!(
            template["metadata"]["annotations"], theirs["metadata"]["annotations"],
            "{golden}: the submitter's annotations"
        );
        // KubeRay adds the origin labels when it makes the Job, after the scheduler's.
        let mut labels = template["metadata"]["labels"].clone();
        if let Some(map) = labels.as_object_mut() {
            for origin in [
                crate::kuberay::keys::labels::ORIGINATED_FROM_CR_NAME,
                crate::kuberay::keys::labels::ORIGINATED_FROM_CRD,
                crate::kuberay::keys::labels::CREATED_BY,
            ] {
                map.remove(origin);
            }
        }
        assert_eq!(
            labels, theirs["metadata"]["labels"],
            "{golden}: the submitter's labels"
        );
    }

    // The cluster's own Pods, as the RayCluster controller builds them for it (the tool adds
    // no SidecarMode submitter container to the head, so those are compared in K8sJobMode).
    if values.mode == crate::api::rayjob::JobSubmissionMode::SidecarMode {
        return;
    }
    cluster.metadata.uid = Some("uid-1".into());
    let options = BuildOptions {
        batch_scheduler: Some(scheduler),
        ..BuildOptions::default()
    };
    assert_pods_like_kuberay(&cluster, &fixtures().join(golden), &options);
}

#[test]
fn a_k8s_job_mode_rayjob_under_volcano_is_kuberays() {
    assert_rayjob_like_kuberay(
        "batch-rayjob-k8sjob.input.yaml",
        BatchScheduler::Volcano,
        "batch-rayjob-k8sjob-volcano.json",
    );
}

#[test]
fn a_sidecar_mode_rayjob_under_volcano_is_kuberays() {
    assert_rayjob_like_kuberay(
        "batch-rayjob-sidecar.input.yaml",
        BatchScheduler::Volcano,
        "batch-rayjob-sidecar-volcano.json",
    );
}

#[test]
fn a_k8s_job_mode_rayjob_under_yunikorn_is_kuberays() {
    assert_rayjob_like_kuberay(
        "batch-rayjob-k8sjob.input.yaml",
        BatchScheduler::YuniKorn,
        "batch-rayjob-k8sjob-yunikorn.json",
    );
}

#[test]
fn kai_refuses_a_k8s_job_mode_rayjob_as_kuberay_does() {
    let kuberay = read_json(&fixtures().join("batch-rayjob-k8sjob-kai-scheduler.json"));
    let refusal = kuberay["rayJobError"].as_str().expect("KubeRay refuses");
    assert!(refusal.starts_with("KAI-Scheduler does not support RayJob with K8sJobMode"));
}

#[test]
fn a_finished_rayjobs_volcano_group_keeps_only_what_its_cluster_holds() {
    use crate::controllers::rayjob::build;
    let job = rayjob_from("batch-rayjob-k8sjob.input.yaml");
    let gone = build::released_volcano_pod_group(&job, None).expect("builds");
    assert_eq!(
        gone.data["spec"],
        json!({"queue": "batch", "priorityClassName": "low-priority", "minResources": {}})
    );
    let spec = job.spec.ray_cluster_spec.clone().expect("a cluster spec");
    let cluster = RayCluster::new("nightly-abcde", spec);
    let kept = build::released_volcano_pod_group(&job, Some(&cluster)).expect("builds");
    // The cluster's gang, without the submitter.
    assert_eq!(kept.data["spec"]["minMember"], json!(3));
    assert_eq!(
        kept.data["spec"]["minResources"],
        json!({"cpu": "3", "memory": "4Gi"})
    );
    assert_eq!(kept.metadata.name.as_deref(), Some("ray-nightly-pg"));
}
