//! Deletion: the GCS fault-tolerance cleanup Job and finalizer, owned children, clusters of
//! another manager, recreate upgrades, Pods the API server refuses.

use super::*;

#[tokio::test]
async fn gcs_ft_cleanup_job_runs_on_delete_then_the_finalizer_goes() {
    let f = fixture("rc-gcsft").await;
    let names = f
        .apply_file(&support::kuberay_samples_dir().join("ray-cluster.external-redis.yaml"))
        .await;
    let name = names[0].clone();
    let ready = f.wait_ready(&name).await;
    assert!(
        ready
            .finalizers()
            .contains(&"ray.io/gcs-ft-redis-cleanup-finalizer".to_owned())
    );
    let uid = ready.uid().expect("uid");

    f.clusters()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    let jobs = f.api::<Job>();
    let job = eventually(WAIT, "the Redis cleanup Job", || {
        let jobs = jobs.clone();
        async move {
            jobs.get_opt("raycluster-external-redis-redis-cleanup")
                .await
                .expect("get Job")
        }
    })
    .await;
    assert_eq!(job.labels()["ray.io/node-type"], "redis-cleanup");
    let template = job.spec.clone().expect("spec").template;
    let container = &template.spec.expect("pod").containers[0];
    let env: Vec<&str> = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert!(
        env.contains(&"RAY_REDIS_ADDRESS") && env.contains(&"REDIS_PASSWORD"),
        "{env:?}"
    );
    assert_eq!(
        container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "RAY_external_storage_namespace")
            .and_then(|e| e.value.clone()),
        Some(uid)
    );
    f.wait_event("CreatedRedisCleanupJob").await;
    // kube-controller-manager runs the Job, kwok completes its Pod, the finalizer goes.
    eventually(WAIT, "the RayCluster to be gone", || async {
        f.clusters()
            .get_opt(&name)
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        f.events("ForceDeletedStuckCluster").await.is_empty(),
        "the cleanup finished in time"
    );
}

#[tokio::test]
async fn gcs_ft_deletion_never_hangs_on_a_stuck_head_pod() {
    let f = fixture("rc-stuck").await;
    let mut doc = small_cluster(
        "stuck",
        0,
        json!({"gcsFaultToleranceOptions": {"redisAddress": "127.0.0.1:1"}}),
    );
    doc["metadata"]["annotations"] = json!({"ray.io/gcs-ft-deletion-timeout": "4"});
    let name = f.create_cluster(doc).await;
    f.wait_ready(&name).await;
    let head = f.ray_pods(&name).await.into_iter().next().expect("head");
    // A finalizer nobody removes: the head Pod stays Terminating.
    f.pods()
        .patch(
            &head.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": ["raypipe.dev/test-hold"]}})),
        )
        .await
        .expect("hold the head");

    f.clusters()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    let event = f.wait_event("ForceDeletedStuckCluster").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    eventually(WAIT, "the RayCluster to be gone", || async {
        f.clusters()
            .get_opt(&name)
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    f.pods()
        .patch(
            &head.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release the head");
}

#[tokio::test]
async fn deleting_a_cluster_removes_what_it_owned() {
    let f = fixture("rc-gc").await;
    let mut doc = small_cluster("owned", 1, json!({}));
    doc["metadata"]["annotations"] = json!({"ray.io/enable-serve-service": "true"});
    doc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"] = json!([{"name": "serve", "containerPort": 8000}, {"name": "dashboard", "containerPort": 8265}]);
    let name = f.create_cluster(doc).await;
    f.wait_ready(&name).await;
    let serve = f
        .services()
        .get("owned-serve-svc")
        .await
        .expect("serve Service");
    assert_eq!(serve.labels()["ray.io/serve"], "owned-serve");
    assert_eq!(
        serve.spec.and_then(|s| s.selector).expect("selector"),
        BTreeMap::from([("ray.io/cluster".to_owned(), name.clone())])
    );

    f.clusters()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    eventually(WAIT, "Pods and Services garbage-collected", || async {
        let pods = f.ray_pods(&name).await;
        let services = f
            .services()
            .list(&ListParams::default())
            .await
            .expect("list")
            .items;
        (pods.is_empty() && services.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn clusters_of_another_manager_are_left_alone_and_recreate_replaces_every_pod() {
    let f = fixture("rc-misc").await;
    let mut kueue = small_cluster("kueue", 1, json!({}));
    kueue["spec"]["managedBy"] = json!("kueue.x-k8s.io/multikueue");
    let kueue = f.create_cluster(kueue).await;

    let name = f
        .create_cluster(small_cluster(
            "recreate",
            1,
            json!({"upgradeStrategy": {"type": "Recreate"}}),
        ))
        .await;
    f.wait_ready(&name).await;
    let before: Vec<String> = f
        .ray_pods(&name)
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    f.patch_spec(&name, json!({"rayVersion": "2.52.1"})).await;
    eventually(WAIT, "all Pods recreated", || async {
        let pods = f.ray_pods(&name).await;
        let fresh = pods.len() == 2
            && pods.iter().all(|p| {
                p.metadata.deletion_timestamp.is_none() && !before.contains(&p.name_any())
            });
        fresh.then_some(())
    })
    .await;

    assert!(
        f.ray_pods(&kueue).await.is_empty(),
        "managedBy another controller: untouched"
    );
    assert!(f.cluster(&kueue).await.status.is_none());
}

#[tokio::test]
async fn a_pod_the_api_server_refuses_sets_replica_failure_until_it_can_be_created() {
    let f = fixture("rc-quota").await;
    f.apply(&json!({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "one-pod"},
        "spec": {"hard": {"pods": "1"}}
    }))
    .await;
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> = f.api();
    eventually(WAIT, "the quota to be counted", || {
        let quotas = quotas.clone();
        async move {
            let quota = quotas.get("one-pod").await.expect("get quota");
            quota.status.and_then(|s| s.hard).map(|_| ())
        }
    })
    .await;

    let name = f.create_cluster(small_cluster("quota", 1, json!({}))).await;
    let failing = f
        .wait_cluster(&name, "ReplicaFailure", |c| {
            condition(c, "ReplicaFailure") == ("True".into(), "FailedCreateWorkerPod".into())
        })
        .await;
    assert_ne!(
        failing.status.as_ref().and_then(|s| s.state),
        Some(ClusterState::Ready)
    );
    f.wait_event("FailedToCreateWorkerPod").await;

    quotas
        .delete("one-pod", &DeleteParams::default())
        .await
        .expect("delete quota");
    let ready = f.wait_ready(&name).await;
    let conditions = ready.status.map(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions::find(&conditions, "ReplicaFailure").is_none(),
        "removed after a clean pass"
    );
}
