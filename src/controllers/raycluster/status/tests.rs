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
