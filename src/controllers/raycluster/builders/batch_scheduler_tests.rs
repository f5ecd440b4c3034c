use serde_json::json;

use super::*;
use crate::controllers::raycluster::builders::test_cluster;

fn cluster(labels: serde_json::Value, autoscaling: bool) -> RayCluster {
    test_cluster(json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "c", "labels": labels, "annotations": {"note": "kept"}},
        "spec": {
            "enableInTreeAutoscaling": autoscaling,
            "headGroupSpec": {"template": {"spec": {"containers": [{
                "name": "ray-head", "image": "rayproject/ray",
                "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "2Gi"}}
            }]}}},
            "workerGroupSpecs": [{
                "groupName": "small", "replicas": 3, "minReplicas": 1, "maxReplicas": 5,
                "template": {"spec": {"containers": [{
                    "name": "ray-worker", "image": "rayproject/ray",
                    "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}
                }]}}
            }]
        }
    }))
}

#[test]
fn volcano_sizes_the_gang_by_desired_replicas_or_by_minimum_when_autoscaling() {
    let fixed = cluster(
        json!({VOLCANO_QUEUE_LABEL: "q", PRIORITY_CLASS_LABEL: "high"}),
        false,
    );
    let group = cluster_volcano_pod_group(&fixed)
        .expect("builds")
        .expect("a group");
    assert_eq!(group.metadata.name.as_deref(), Some("ray-c-pg"));
    assert_eq!(
        group.data["spec"],
        json!({"minMember": 4, "queue": "q", "priorityClassName": "high",
               "minResources": {"cpu": "2500m", "memory": "5Gi"}})
    );
    let owner = &group.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("RayCluster", Some(true))
    );
    assert_eq!(
        group.metadata.annotations.as_ref().expect("copied")["note"],
        "kept"
    );

    let scaling = cluster(json!({}), true);
    let group = cluster_volcano_pod_group(&scaling)
        .expect("builds")
        .expect("a group");
    assert_eq!(
        group.data["spec"],
        json!({"minMember": 2, "minResources": {"cpu": "1500m", "memory": "3Gi"}})
    );
}

#[test]
fn a_rayjobs_cluster_gets_no_volcano_group_but_points_at_the_jobs() {
    let job_cluster = cluster(
        json!({"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "job"}),
        false,
    );
    assert!(
        cluster_volcano_pod_group(&job_cluster)
            .expect("builds")
            .is_none()
    );
    assert_eq!(volcano_pod_group_name(&job_cluster.metadata), "ray-job-pg");
}

#[test]
fn a_malformed_tier_label_is_refused() {
    let c = cluster(
        json!({VOLCANO_NETWORK_TOPOLOGY_MODE_LABEL: "hard", VOLCANO_NETWORK_TOPOLOGY_TIER_LABEL: "x"}),
        false,
    );
    assert!(cluster_volcano_pod_group(&c).is_err());
    let c = cluster(
        json!({VOLCANO_NETWORK_TOPOLOGY_MODE_LABEL: "hard", VOLCANO_NETWORK_TOPOLOGY_TIER_LABEL: "2"}),
        false,
    );
    let group = cluster_volcano_pod_group(&c)
        .expect("builds")
        .expect("a group");
    assert_eq!(
        group.data["spec"]["networkTopology"],
        json!({"mode": "hard", "highestTierAllowed": 2})
    );
}

#[test]
fn scheduler_plugins_gangs_only_on_request() {
    assert!(
        scheduler_plugins_pod_group(&cluster(json!({}), false))
            .expect("builds")
            .is_none()
    );
    let gang = cluster(json!({GANG_SCHEDULING_LABEL: "true"}), true);
    let group = scheduler_plugins_pod_group(&gang)
        .expect("builds")
        .expect("a group");
    assert_eq!(group.metadata.name.as_deref(), Some("c"));
    // The desired replicas, even with the autoscaler on.
    assert_eq!(group.data["spec"]["minMember"], json!(4));
}

#[test]
fn yunikorn_task_groups_follow_kuberays_field_order() {
    let mut c = cluster(json!({}), false);
    if let Some(spec) = c.spec.head_group_spec.template.spec.as_mut() {
        spec.tolerations = Some(vec![Toleration {
            key: Some("gpu".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
    }
    assert_eq!(
        task_groups_json(&cluster_task_groups(&c.spec)),
        r#"[{"minResource":{"cpu":"1","memory":"2Gi"},"name":"headgroup","tolerations":[{"key":"gpu","operator":"Exists","effect":"NoSchedule"}],"minMember":1},{"minResource":{"cpu":"500m","memory":"1Gi"},"name":"small","minMember":1}]"#
    );
}
