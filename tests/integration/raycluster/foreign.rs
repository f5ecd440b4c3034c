//! Foreign objects (issue 14): a Service or Pod of a child's name or labels made by someone
//! else is reported and never adopted, written or deleted.

use super::*;

/// What "left exactly as it was" means for an object someone else owns.
fn untouched_parts<K: Resource + serde::Serialize>(object: &K) -> Value {
    let mut value = serde_json::to_value(object).expect("json");
    // The status is the API server's (a Pod's phase moves on its own); the rest is the owner's.
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
    }
    value
}

/// Issue 14, class 6: a Service of the head Service's name made by someone else is reported
/// (ServiceConflict in ReplicaFailure and a Warning event) and never written; a Service that
/// merely copies the head Service's labels is not taken for the head Service. Once the
/// foreign Service is gone the cluster makes its own.
#[tokio::test]
async fn a_foreign_service_of_a_childs_name_is_reported_and_never_taken_over() {
    let f = fixture("rc-foreign-svc").await;
    let services = f.services();
    for (name, labels) in [
        ("squat-head-svc", json!({"team": "other"})),
        (
            "lookalike",
            json!({"ray.io/cluster": "squat", "ray.io/node-type": "head", "team": "other"}),
        ),
    ] {
        let service: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "labels": labels, "annotations": {"owner": "other team"}},
            "spec": {"selector": {"app": "other"}, "ports": [{"name": "http", "port": 80}]}
        }))
        .expect("a Service");
        services
            .patch(
                name,
                &PatchParams::apply("other-team"),
                &Patch::Apply(&service),
            )
            .await
            .expect("the other team applies its Service");
    }
    let before_squat = untouched_parts(&services.get("squat-head-svc").await.expect("get"));
    let before_lookalike = untouched_parts(&services.get("lookalike").await.expect("get"));

    let name = f.create_cluster(small_cluster("squat", 0, json!({}))).await;
    let cluster = f
        .wait_cluster(&name, "ReplicaFailure ServiceConflict", |c| {
            condition(c, "ReplicaFailure") == ("True".into(), "ServiceConflict".into())
        })
        .await;
    let message = cluster
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, "ReplicaFailure"))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains("squat-head-svc"), "{message}");
    let event = f.wait_event("ServiceConflict").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        untouched_parts(&services.get("squat-head-svc").await.expect("get")),
        before_squat,
        "the foreign Service was modified"
    );

    services
        .delete("squat-head-svc", &DeleteParams::default())
        .await
        .expect("the other team deletes its Service");
    let ours = eventually(WAIT, "the cluster's own head Service", || {
        let services = services.clone();
        async move {
            services
                .get_opt("squat-head-svc")
                .await
                .expect("get")
                .filter(|s| !s.owner_references().is_empty())
        }
    })
    .await;
    assert_eq!(ours.owner_references()[0].kind, "RayCluster");
    assert_eq!(ours.owner_references()[0].controller, Some(true));
    assert_eq!(
        untouched_parts(&services.get("lookalike").await.expect("get")),
        before_lookalike,
        "the look-alike Service was modified"
    );
}

/// Issue 14, class 6: a Pod someone else made with the cluster's labels is neither counted as
/// the cluster's nor deleted when the cluster deletes all its Pods (suspension).
#[tokio::test]
async fn a_foreign_pod_with_the_clusters_labels_is_neither_adopted_nor_deleted() {
    let f = fixture("rc-foreign-pod").await;
    let name = f.create_cluster(small_cluster("host", 1, json!({}))).await;
    f.wait_ready(&name).await;
    let impostor: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "impostor", "labels": {
            "ray.io/cluster": name, "ray.io/node-type": "worker", "ray.io/group": "workers"}},
        "spec": {"containers": [{"name": "c", "image": "example/other:1"}]}
    }))
    .expect("a Pod");
    f.pods()
        .patch(
            "impostor",
            &PatchParams::apply("other-team"),
            &Patch::Apply(&impostor),
        )
        .await
        .expect("the other team creates its Pod");
    // The scheduler and kwok bind and run it (nodeName, status): only what we could have
    // changed is compared.
    let ours_to_keep = |p: &Pod| {
        json!({
            "uid": p.metadata.uid, "labels": p.metadata.labels,
            "annotations": p.metadata.annotations, "ownerReferences": p.metadata.owner_references,
            "containers": p.spec.as_ref().map(|s| &s.containers),
        })
    };
    let before = ours_to_keep(&f.pods().get("impostor").await.expect("get"));
    let owned = |pods: Vec<Pod>| -> Vec<Pod> {
        pods.into_iter()
            .filter(|p| !p.owner_references().is_empty())
            .collect()
    };

    f.patch_spec(&name, json!({"suspend": true})).await;
    f.wait_cluster(&name, "Suspended", |c| {
        condition(c, "RayClusterSuspended").0 == "True"
    })
    .await;
    assert!(owned(f.ray_pods(&name).await).is_empty());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = f
        .pods()
        .get_opt("impostor")
        .await
        .expect("get")
        .expect("the foreign Pod survives the suspension");
    assert!(after.metadata.deletion_timestamp.is_none());
    assert_eq!(ours_to_keep(&after), before, "the foreign Pod was modified");
}
