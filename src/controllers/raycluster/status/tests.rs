//! Tests of the pure RayCluster status computation (`compute_status` and its parts): counts,
//! resources, state, the conditions KubeRay sets and clears, endpoints and head info.

use super::*;
use crate::controllers::raycluster::builders::test_cluster;
use serde_json::{Value, json};

fn at(secs: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("time"))
}

fn cluster(extra: Value) -> RayCluster {
    let mut value = json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c", "generation": 3},
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "h", "image": "i",
                "resources": {"requests": {"cpu": "1", "memory": "5Gi"}}}]}}},
            "workerGroupSpecs": [{"groupName": "g", "replicas": 2, "minReplicas": 1, "maxReplicas": 5,
                "template": {"spec": {"containers": [{"name": "w", "image": "i",
                    "resources": {"limits": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"}}}]}}}]
        }
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        value["spec"][k] = v;
    }
    test_cluster(value)
}

fn pod(name: &str, node_type: &str, phase: &str, ready: Option<&str>) -> Pod {
    let mut status = json!({"phase": phase, "podIP": format!("10.0.0.{}", name.len())});
    if let Some(ready) = ready {
        status["conditions"] = json!([{"type": "Ready", "status": ready}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"ray.io/node-type": node_type}},
        "status": status
    }))
    .expect("a Pod")
}

fn headless_service() -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "c-head-svc"},
        "spec": {"clusterIP": "None", "ports": [
            {"name": "dashboard", "port": 8265, "targetPort": 8265},
            {"name": "gcs", "port": 6379, "targetPort": "gcs"},
            {"name": "client", "port": 10001, "nodePort": 30001, "targetPort": 10001},
            {"port": 1}
        ]}
    }))
    .expect("a Service")
}

fn compute(
    cluster: &RayCluster,
    pods: &[Pod],
    outcome: Outcome,
    previous: Option<&RayClusterStatus>,
) -> RayClusterStatus {
    let refs: Vec<&Pod> = pods.iter().collect();
    let service = headless_service();
    compute_status(&StatusInputs {
        cluster,
        pods: &refs,
        head_service: Some(&service),
        outcome: &outcome,
        previous,
        now: at(100),
    })
}

fn reason(status: &RayClusterStatus, type_: &str) -> (String, String) {
    let c = conditions::find(&status.conditions, type_).expect(type_);
    (c.status.clone(), c.reason.clone())
}

#[test]
fn a_running_cluster_becomes_ready_with_counts_resources_and_endpoints() {
    let c = cluster(json!({}));
    let pods = [
        pod("head", "head", "Running", Some("True")),
        pod("w1", "worker", "Running", Some("True")),
        pod("w2", "worker", "Running", Some("False")),
    ];
    let status = compute(&c, &pods, Outcome::Clean, None);
    assert_eq!(status.state, None, "a worker is not ready");
    assert_eq!(
        (
            status.ready_worker_replicas,
            status.available_worker_replicas
        ),
        (Some(1), Some(2))
    );
    assert_eq!(
        (
            status.desired_worker_replicas,
            status.min_worker_replicas,
            status.max_worker_replicas
        ),
        (Some(2), Some(1), Some(5))
    );
    assert_eq!(status.desired_cpu.as_ref().map(|q| q.0.as_str()), Some("2"));
    assert_eq!(
        status.desired_memory.as_ref().map(|q| q.0.as_str()),
        Some("7Gi")
    );
    assert_eq!(status.desired_gpu.as_ref().map(|q| q.0.as_str()), Some("2"));
    assert_eq!(status.desired_tpu.as_ref().map(|q| q.0.as_str()), Some("0"));
    assert_eq!(status.observed_generation, Some(3));
    assert_eq!(
        reason(&status, "HeadPodReady"),
        ("True".into(), "HeadPodRunningAndReady".into())
    );
    assert_eq!(
        reason(&status, "RayClusterProvisioned"),
        ("False".into(), "RayClusterPodsProvisioning".into())
    );
    assert_eq!(
        reason(&status, "RayClusterSuspended"),
        ("False".into(), "RayClusterSuspended".into())
    );
    assert_eq!(
        reason(&status, "RayClusterSuspending"),
        ("False".into(), "RayClusterSuspending".into())
    );
    assert_eq!(
        status.endpoints,
        Some(BTreeMap::from([
            ("client".into(), "30001".into()),
            ("dashboard".into(), "8265".into()),
            ("gcs".into(), "gcs".into())
        ]))
    );
    let head = status.head.clone().expect("head");
    assert_eq!(head.pod_name.as_deref(), Some("head"));
    assert_eq!(head.service_ip, head.pod_ip, "headless: the head Pod's IP");
    assert_eq!(head.service_name.as_deref(), Some("c-head-svc"));

    let all_ready = [
        pod("head", "head", "Running", Some("True")),
        pod("w1", "worker", "Running", Some("True")),
        pod("w2", "worker", "Running", Some("True")),
    ];
    let ready = compute(&c, &all_ready, Outcome::Clean, Some(&status));
    assert_eq!(ready.state, Some(ClusterState::Ready));
    assert_eq!(
        ready
            .state_transition_times
            .as_ref()
            .map(|t| t.contains_key("ready")),
        Some(true)
    );
    assert_eq!(
        reason(&ready, "RayClusterProvisioned"),
        ("True".into(), "AllPodRunningAndReadyFirstTime".into())
    );

    // Ready and Provisioned are sticky.
    let degraded = compute(&c, &pods, Outcome::Clean, Some(&ready));
    assert_eq!(degraded.state, Some(ClusterState::Ready));
    assert_eq!(reason(&degraded, "RayClusterProvisioned").0, "True");
}

#[test]
fn not_ready_while_pods_are_missing_or_the_reconcile_failed() {
    let c = cluster(json!({}));
    let two = [
        pod("head", "head", "Running", Some("True")),
        pod("w1", "worker", "Running", Some("True")),
    ];
    assert_eq!(compute(&c, &two, Outcome::Clean, None).state, None);
    let three = [
        pod("head", "head", "Running", Some("True")),
        pod("w1", "worker", "Running", Some("True")),
        pod("w2", "worker", "Running", Some("True")),
    ];
    let waiting = compute(&c, &three, Outcome::Waiting("w".into()), None);
    assert_eq!(waiting.state, None);
    assert_eq!(
        reason(&waiting, "RayClusterProvisioned").0,
        "True",
        "Provisioned ignores the count"
    );
}

#[test]
fn replica_failure_is_set_and_cleared() {
    let c = cluster(json!({}));
    let failed = compute(
        &c,
        &[],
        Outcome::Failed {
            replica_failure: Some("FailedCreateWorkerPod"),
            message: "quota".into(),
        },
        None,
    );
    assert_eq!(
        reason(&failed, "ReplicaFailure"),
        ("True".into(), "FailedCreateWorkerPod".into())
    );
    assert_eq!(
        reason(&failed, "HeadPodReady"),
        ("False".into(), "HeadPodNotFound".into())
    );
    let other = compute(
        &c,
        &[],
        Outcome::Failed {
            replica_failure: None,
            message: "x".into(),
        },
        Some(&failed),
    );
    assert!(conditions::find(&other.conditions, "ReplicaFailure").is_some());
    let clean = compute(&c, &[], Outcome::Clean, Some(&failed));
    assert!(conditions::find(&clean.conditions, "ReplicaFailure").is_none());
}

#[test]
fn suspend_and_resume_walk_the_conditions() {
    let running = cluster(json!({}));
    let pods = [pod("head", "head", "Running", Some("True"))];
    let start = compute(&running, &pods, Outcome::Clean, None);
    let suspend = cluster(json!({"suspend": true}));
    let suspending = compute(&suspend, &pods, Outcome::Clean, Some(&start));
    assert_eq!(reason(&suspending, "RayClusterSuspending").0, "True");
    let still = compute(&suspend, &pods, Outcome::Clean, Some(&suspending));
    assert_eq!(
        reason(&still, "RayClusterSuspending").0,
        "True",
        "until the Pods are gone"
    );
    let done = compute(&suspend, &[], Outcome::Clean, Some(&still));
    assert_eq!(reason(&done, "RayClusterSuspending").0, "False");
    assert_eq!(reason(&done, "RayClusterSuspended").0, "True");
    assert_eq!(
        reason(&done, "RayClusterProvisioned"),
        ("False".into(), "RayClusterPodsProvisioning".into())
    );
    assert_eq!(done.state, Some(ClusterState::Suspended));
    let resumed = compute(&running, &[], Outcome::Clean, Some(&done));
    assert_eq!(reason(&resumed, "RayClusterSuspended").0, "False");
    assert_eq!(reason(&resumed, "RayClusterSuspending").0, "False");
}

#[test]
fn head_pod_ready_explains_containers_not_ready() {
    let head: Pod = serde_json::from_value(json!({
        "metadata": {"name": "h", "labels": {"ray.io/node-type": "head"}},
        "status": {"phase": "Pending",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": "containers with unready status: [ray-head]"}],
            "containerStatuses": [{"name": "ray-head", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "back-off"}}}]}
    })).expect("a Pod");
    let condition = head_pod_ready(Some(&head), Some(1), &at(1));
    assert_eq!(condition.reason, "ImagePullBackOff");
    assert_eq!(
        condition.message,
        "containers with unready status: [ray-head]; ray-head: back-off"
    );
    let no_ready = pod("h", "head", "Pending", None);
    assert_eq!(
        head_pod_ready(Some(&no_ready), None, &at(1)).reason,
        "Unknown"
    );
}

#[test]
fn desired_workers_clamps_and_counts_hosts() {
    let group = |replicas: Option<i32>, hosts: i32, suspend: bool| WorkerGroupSpec {
        replicas,
        min_replicas: Some(1),
        max_replicas: Some(3),
        num_of_hosts: Some(hosts),
        suspend: Some(suspend),
        ..Default::default()
    };
    assert_eq!(desired_workers(&group(Some(9), 1, false)), 3);
    assert_eq!(desired_workers(&group(Some(0), 1, false)), 1);
    assert_eq!(desired_workers(&group(None, 2, false)), 2);
    assert_eq!(desired_workers(&group(Some(2), 4, false)), 8);
    assert_eq!(desired_workers(&group(Some(2), 4, true)), 0);
}

#[test]
fn differs_ignores_only_the_update_time() {
    let c = cluster(json!({}));
    let a = compute(&c, &[], Outcome::Clean, None);
    let mut b = a.clone();
    b.last_update_time = Some(at(5000));
    assert!(!differs(Some(&a), &b));
    b.ready_worker_replicas = Some(9);
    assert!(differs(Some(&a), &b));
    assert!(differs(None, &a));
}

/// A cluster of one head and two workers, as its Pods move from created to all ready.
fn provisioning_steps() -> (RayCluster, Vec<RayClusterStatus>) {
    let c = cluster(json!({}));
    let steps: [&[Pod]; 5] = [
        &[],
        &[
            pod("head", "head", "Pending", Some("False")),
            pod("w1", "worker", "Pending", Some("False")),
            pod("w2", "worker", "Pending", Some("False")),
        ],
        &[
            pod("head", "head", "Running", Some("True")),
            pod("w1", "worker", "Pending", Some("False")),
            pod("w2", "worker", "Pending", Some("False")),
        ],
        &[
            pod("head", "head", "Running", Some("True")),
            pod("w1", "worker", "Running", Some("True")),
            pod("w2", "worker", "Running", Some("False")),
        ],
        &[
            pod("head", "head", "Running", Some("True")),
            pod("w1", "worker", "Running", Some("True")),
            pod("w2", "worker", "Running", Some("True")),
        ],
    ];
    let mut statuses: Vec<RayClusterStatus> = Vec::new();
    for pods in steps {
        let next = compute(&c, pods, Outcome::Clean, statuses.last());
        statuses.push(next);
    }
    (c, statuses)
}

fn written(status: &RayClusterStatus, secs: u64) -> Option<LastWritten<'_>> {
    Some(LastWritten {
        status,
        since_write: Some(Duration::from_secs(secs)),
    })
}

#[test]
fn a_status_the_server_has_or_that_was_just_written_is_not_written_again() {
    let (_, s) = provisioning_steps();
    assert_eq!(plan_write(None, None, None, &s[0]), StatusWrite::Now);
    assert_eq!(
        plan_write(Some(&s[0]), None, None, &s[0]),
        StatusWrite::Skip
    );
    // Written a moment ago; the cache still shows nothing (or an older status).
    assert_eq!(
        plan_write(None, written(&s[0], 1), None, &s[0]),
        StatusWrite::Skip
    );
    assert_eq!(
        plan_write(Some(&s[0]), written(&s[1], 1), None, &s[1]),
        StatusWrite::Skip
    );
    // Still missing from the cache after the grace: written again.
    let late = CACHE_LAG_GRACE.as_secs() + 1;
    assert_eq!(
        plan_write(None, written(&s[0], late), None, &s[0]),
        StatusWrite::Now
    );
    // Found in the cache, never written by this process: a difference goes out.
    let found = Some(LastWritten {
        status: &s[2],
        since_write: None,
    });
    assert_eq!(plan_write(None, found, None, &s[2]), StatusWrite::Now);
}

#[test]
fn provisioning_progress_waits_for_the_next_milestone_but_not_for_long() {
    let (_, s) = provisioning_steps();
    // Pods appeared (Pending): counts, head details and the not-ready reason only.
    assert_eq!(
        plan_write(Some(&s[0]), written(&s[0], 0), None, &s[1]),
        StatusWrite::Hold(PROGRESS_HOLD)
    );
    let waited = Duration::from_secs(3);
    assert_eq!(
        plan_write(Some(&s[0]), written(&s[0], 3), Some(waited), &s[1]),
        StatusWrite::Hold(PROGRESS_HOLD - waited)
    );
    // Held long enough: written with whatever it says then.
    assert_eq!(
        plan_write(Some(&s[0]), written(&s[0], 9), Some(PROGRESS_HOLD), &s[1]),
        StatusWrite::Now
    );
    // The head Pod turning ready is a milestone (RayServices and users wait for it).
    assert_eq!(
        plan_write(Some(&s[1]), written(&s[1], 0), None, &s[2]),
        StatusWrite::Now
    );
    // One of two workers ready: progress.
    assert!(matches!(
        plan_write(Some(&s[2]), written(&s[2], 0), None, &s[3]),
        StatusWrite::Hold(_)
    ));
    // All ready: provisioned, state ready, written at once.
    assert_eq!(s[4].state, Some(ClusterState::Ready));
    assert_eq!(
        plan_write(Some(&s[2]), written(&s[2], 0), Some(waited), &s[4]),
        StatusWrite::Now
    );
}

#[test]
fn only_progress_is_held_never_a_failure_a_spec_change_or_a_provisioned_cluster() {
    let (c, s) = provisioning_steps();
    let pods = [
        pod("head", "head", "Pending", Some("False")),
        pod("w1", "worker", "Pending", Some("False")),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let failed = compute(
        &c,
        &pods,
        Outcome::Failed {
            replica_failure: Some("FailedCreateWorkerPod"),
            message: "quota".into(),
        },
        Some(&s[1]),
    );
    assert_eq!(
        plan_write(Some(&s[1]), written(&s[1], 0), None, &failed),
        StatusWrite::Now,
        "a ReplicaFailure goes out at once"
    );
    let mut scaled = c.clone();
    scaled.spec.worker_group_specs.as_mut().expect("groups")[0].replicas = Some(4);
    let resized = compute_status(&StatusInputs {
        cluster: &scaled,
        pods: &refs,
        head_service: None,
        outcome: &Outcome::Clean,
        previous: Some(&s[1]),
        now: at(100),
    });
    assert_eq!(
        plan_write(Some(&s[1]), written(&s[1], 0), None, &resized),
        StatusWrite::Now,
        "a new desired count is not progress"
    );
    // Once provisioned, a worker's readiness is written as it comes (as KubeRay does).
    let one_down = compute(
        &c,
        &[
            pod("head", "head", "Running", Some("True")),
            pod("w1", "worker", "Running", Some("True")),
            pod("w2", "worker", "Running", Some("False")),
        ],
        Outcome::Clean,
        Some(&s[4]),
    );
    assert_eq!(
        plan_write(Some(&s[4]), written(&s[4], 0), None, &one_down),
        StatusWrite::Now
    );
}
