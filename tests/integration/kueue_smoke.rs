//! The Kueue harness works end to end: a real Kueue suspends a queued RayCluster at create,
//! admits it within quota, holds a second one back while the quota is used, and admits that one
//! once the first is gone. No raypipe controller runs: this is Kueue alone, the baseline the
//! Kueue scenario tests build on.

use std::time::Duration;

use kube::api::{DeleteParams, PostParams};

use crate::support::eventually;
use crate::support::kueue::{self, condition, condition_is};

const WAIT: Duration = Duration::from_secs(60);

/// `spec.suspend` of RayCluster `name`, once it reads as `wanted`.
async fn suspend_becomes(client: &kube::Client, ns: &str, name: &str, wanted: bool) {
    let clusters = kueue::ray_clusters(client, ns);
    eventually(WAIT, &format!("RayCluster {name} suspend={wanted}"), || {
        let clusters = clusters.clone();
        async move {
            let cluster = clusters.get(name).await.ok()?;
            (cluster.data["spec"]["suspend"].as_bool() == Some(wanted)).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn a_labelled_raycluster_is_suspended_then_admitted_by_a_real_kueue() {
    let client = kueue::client().await;
    let ns = crate::support::namespace(&client, "kueue-smoke").await;
    kueue::queue(
        &client,
        &ns,
        "smoke",
        "kueue-smoke",
        &[("cpu", "2"), ("memory", "4Gi")],
    )
    .await;
    let clusters = kueue::ray_clusters(&client, &ns);

    // Head and one worker at 1 CPU / 1Gi each: exactly the queue's CPU quota.
    let first = clusters
        .create(
            &PostParams::default(),
            &kueue::ray_cluster("first", "smoke", "1", "1Gi"),
        )
        .await
        .expect("create the first RayCluster");
    assert_eq!(
        first.data["spec"]["suspend"], true,
        "Kueue's webhook suspends a queued RayCluster at create"
    );
    let admitted = kueue::workload_where(&client, &ns, "RayCluster", "first", "admitted", |w| {
        condition_is(w, "Admitted", "True")
    })
    .await;
    eprintln!(
        "first admitted: QuotaReserved {:?}, Admitted {:?}",
        condition(&admitted, "QuotaReserved"),
        condition(&admitted, "Admitted")
    );
    suspend_becomes(&client, &ns, "first", false).await;

    let second = clusters
        .create(
            &PostParams::default(),
            &kueue::ray_cluster("second", "smoke", "1", "1Gi"),
        )
        .await
        .expect("create the second RayCluster");
    assert_eq!(second.data["spec"]["suspend"], true);
    let pending =
        kueue::workload_where(&client, &ns, "RayCluster", "second", "without quota", |w| {
            condition_is(w, "QuotaReserved", "False")
        })
        .await;
    let reserved = condition(&pending, "QuotaReserved").expect("the condition just seen");
    eprintln!(
        "second waits: QuotaReserved=False reason={} message={}",
        reserved["reason"], reserved["message"]
    );
    assert!(!condition_is(&pending, "Admitted", "True"), "{pending:#}");
    let second = clusters.get("second").await.expect("the second RayCluster");
    assert_eq!(
        second.data["spec"]["suspend"], true,
        "a RayCluster without quota stays suspended"
    );

    clusters
        .delete("first", &DeleteParams::default())
        .await
        .expect("delete the first RayCluster");
    let admitted = kueue::workload_where(&client, &ns, "RayCluster", "second", "admitted", |w| {
        condition_is(w, "Admitted", "True")
    })
    .await;
    eprintln!(
        "second admitted after the first was deleted: {:?}",
        condition(&admitted, "Admitted")
    );
    suspend_becomes(&client, &ns, "second", false).await;
}
