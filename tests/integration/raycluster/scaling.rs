//! Scaling, replacing deleted or failed workers (a settled cluster writes nothing), suspend
//! and resume.

use super::*;

#[tokio::test]
async fn scaling_follows_replicas_and_workers_to_delete_removes_exactly_the_named_pods() {
    let f = fixture("rc-scale").await;
    let name = f.create_cluster(small_cluster("scale", 1, json!({}))).await;
    f.wait_ready(&name).await;

    f.patch_group(&name, 0, json!({"replicas": 3})).await;
    let workers = f.wait_workers(&name, 3).await;
    let mut indices: Vec<&str> = workers
        .iter()
        .map(|p| label(p, "ray.io/worker-group-replica-index"))
        .collect();
    indices.sort();
    assert_eq!(indices, ["0", "1", "2"]);
    f.wait_cluster(&name, "3 ready workers", |c| {
        c.status.as_ref().and_then(|s| s.ready_worker_replicas) == Some(3)
    })
    .await;

    // Above maxReplicas: clamped.
    f.patch_group(&name, 0, json!({"replicas": 9})).await;
    f.wait_workers(&name, 5).await;
    f.patch_group(&name, 0, json!({"replicas": 3})).await;
    let workers = f.wait_workers(&name, 3).await;

    let doomed: Vec<String> = workers[..2].iter().map(|p| p.name_any()).collect();
    let survivor = workers[2].name_any();
    f.patch_group(
        &name,
        0,
        json!({"replicas": 1, "scaleStrategy": {"workersToDelete": doomed}}),
    )
    .await;
    let left = f.wait_workers(&name, 1).await;
    assert_eq!(left[0].name_any(), survivor, "exactly the named Pods went");
    let cluster = f.cluster(&name).await;
    let group = &cluster.spec.worker_group_specs.expect("groups")[0];
    assert_eq!(
        group
            .scale_strategy
            .as_ref()
            .and_then(|s| s.workers_to_delete.as_ref())
            .map(Vec::len),
        Some(2),
        "workersToDelete belongs to the autoscaler: never cleared"
    );
    // The list stays; Pods of that name are gone, so nothing more happens.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(f.workers(&name).await.len(), 1);
    f.wait_event("DeletedWorkerPod").await;

    f.patch_group(
        &name,
        0,
        json!({"replicas": 0, "scaleStrategy": {"workersToDelete": []}}),
    )
    .await;
    f.wait_workers(&name, 0).await;
    f.wait_cluster(&name, "no desired workers", |c| {
        c.status.as_ref().and_then(|s| s.desired_worker_replicas) == Some(0)
    })
    .await;
}

#[tokio::test]
async fn a_deleted_or_failed_worker_is_replaced_and_a_settled_cluster_is_quiet() {
    let f = fixture("rc-replace").await;
    let name = f
        .create_cluster(small_cluster("replace", 2, json!({})))
        .await;
    f.wait_ready(&name).await;
    let before = f.wait_workers(&name, 2).await;

    // A settled cluster writes nothing: our status writes do not trigger further passes.
    let settled = f.cluster(&name).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let later = f.cluster(&name).await;
    assert_eq!(
        later.resource_version(),
        settled.resource_version(),
        "no status churn: {}\n---\n{}",
        serde_json::to_string_pretty(&settled).unwrap_or_default(),
        serde_json::to_string_pretty(&later).unwrap_or_default()
    );

    let victim = before[0].name_any();
    f.pods()
        .delete(&victim, &DeleteParams::default())
        .await
        .expect("delete worker");
    let after = eventually(WAIT, "a replacement worker", || async {
        let workers = f.workers(&name).await;
        (workers.len() == 2 && workers.iter().all(|p| p.name_any() != victim)).then_some(workers)
    })
    .await;
    assert!(after.iter().any(|p| p.name_any() == before[1].name_any()));

    // A Pod that failed for good is deleted and replaced.
    let failed = after[0].name_any();
    f.pods()
        .patch_status(
            &failed,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": "Failed"}})),
        )
        .await
        .expect("mark failed");
    eventually(WAIT, "the failed worker to be replaced", || async {
        let workers = f.workers(&name).await;
        (workers.len() == 2 && workers.iter().all(|p| p.name_any() != failed)).then_some(())
    })
    .await;
    f.wait_event("DeletedWorkerPod").await;

    // A lost head is created again; the head conditions follow it.
    let head = f
        .ray_pods(&name)
        .await
        .into_iter()
        .find(|p| label(p, "ray.io/node-type") == "head")
        .expect("head");
    f.pods()
        .delete(&head.name_any(), &DeleteParams::default())
        .await
        .expect("delete head");
    let old_head = head.name_any();
    let cluster = f
        .wait_cluster(&name, "a new ready head", |c| {
            let head = c.status.as_ref().and_then(|s| s.head.as_ref());
            let pod_name = head.and_then(|h| h.pod_name.as_deref());
            pod_name.is_some_and(|n| n != old_head) && condition(c, "HeadPodReady").0 == "True"
        })
        .await;
    assert_eq!(
        condition(&cluster, "RayClusterProvisioned").0,
        "True",
        "Provisioned stays True"
    );
}

#[tokio::test]
async fn suspend_deletes_every_pod_and_resume_brings_them_back() {
    let f = fixture("rc-suspend").await;
    let name = f.create_cluster(small_cluster("pause", 1, json!({}))).await;
    f.wait_ready(&name).await;

    f.patch_spec(&name, json!({"suspend": true})).await;
    let suspended = f
        .wait_cluster(&name, "Suspended", |c| {
            condition(c, "RayClusterSuspended").0 == "True"
        })
        .await;
    assert!(f.ray_pods(&name).await.is_empty());
    assert_eq!(
        suspended.status.as_ref().and_then(|s| s.state),
        Some(ClusterState::Suspended)
    );
    assert_eq!(condition(&suspended, "RayClusterSuspending").0, "False");
    assert_eq!(
        condition(&suspended, "RayClusterProvisioned"),
        ("False".into(), "RayClusterPodsProvisioning".into())
    );
    assert_eq!(
        condition(&suspended, "HeadPodReady"),
        ("False".into(), "HeadPodNotFound".into())
    );
    f.wait_event("DeletedPod").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        f.ray_pods(&name).await.is_empty(),
        "nothing comes back while suspended"
    );

    f.patch_spec(&name, json!({"suspend": false})).await;
    let resumed = f
        .wait_cluster(&name, "Provisioned again", |c| {
            condition(c, "RayClusterProvisioned").0 == "True"
        })
        .await;
    assert_eq!(condition(&resumed, "RayClusterSuspended").0, "False");
    f.wait_workers(&name, 1).await;
}
