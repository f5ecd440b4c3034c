//! Taking over KubeRay's clusters: a `Recreate` cluster whose Pods carry KubeRay's
//! `ray.io/kuberay-version` and `ray.io/upgrade-strategy-recreate-hash` (a hash raypipe cannot
//! reproduce) is adopted without a restart; a real spec change afterwards still recreates.

use super::*;

fn head_of(pods: &[Pod]) -> Pod {
    pods.iter()
        .find(|p| label(p, "ray.io/node-type") == "head")
        .cloned()
        .expect("a head Pod")
}

fn uids(pods: &[Pod]) -> Vec<String> {
    let mut uids: Vec<String> = pods.iter().filter_map(|p| p.uid()).collect();
    uids.sort();
    uids
}

#[tokio::test]
async fn kuberays_recreate_pods_are_adopted_without_a_restart() {
    let f = fixture("rc-takeover").await;
    let name = f
        .create_cluster(small_cluster(
            "taken",
            1,
            json!({"upgradeStrategy": {"type": "Recreate"}}),
        ))
        .await;
    f.wait_ready(&name).await;
    let pods = f.ray_pods(&name).await;
    assert_eq!(pods.len(), 2);
    let before = uids(&pods);

    // The head Pod as KubeRay v1.7.0 leaves it: its version and its base32 SHA-1 hash.
    let head = head_of(&pods);
    f.pods()
        .patch(
            &head.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "ray.io/kuberay-version": "v1.7.0",
                "ray.io/upgrade-strategy-recreate-hash": "E5N3V0GJ6O1JQ8D9O0K9N1Q3K2C1S8HQ",
            }}})),
        )
        .await
        .expect("patch the head Pod");

    let cluster = f.cluster(&name).await;
    let ours = spec_hash(&cluster.spec);
    let adopted = eventually(
        WAIT,
        "the head Pod adopted under raypipe's hash",
        || async {
            let head = head_of(&f.ray_pods(&name).await);
            let annotations = head.annotations();
            (annotations.get("ray.io/upgrade-strategy-recreate-hash") == Some(&ours))
                .then_some(head)
        },
    )
    .await;
    assert_eq!(
        adopted.annotations()["ray.io/kuberay-version"],
        raypipe::kuberay::keys::OPERATOR_VERSION
    );
    // Another pass (maxReplicas is not part of the hash) finds nothing to recreate.
    f.patch_group(&name, 0, json!({"maxReplicas": 4})).await;
    eventually(WAIT, "the cluster seen with maxReplicas 4", || async {
        let cluster = f.cluster(&name).await;
        let observed = cluster.status.as_ref().and_then(|s| s.observed_generation);
        (observed == cluster.metadata.generation).then_some(())
    })
    .await;
    f.wait_ready(&name).await;
    assert_eq!(
        uids(&f.ray_pods(&name).await),
        before,
        "no Pod was restarted"
    );
    assert!(
        f.events("DeletedPod").await.is_empty(),
        "no Recreate deletion"
    );

    // A real spec change after the takeover still recreates every Pod.
    f.patch_spec(&name, json!({"rayVersion": "2.52.1"})).await;
    eventually(WAIT, "all Pods recreated", || async {
        let pods = f.ray_pods(&name).await;
        let fresh = pods.len() == 2
            && pods.iter().all(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && !before.contains(&p.uid().unwrap_or_default())
            });
        fresh.then_some(())
    })
    .await;
}
