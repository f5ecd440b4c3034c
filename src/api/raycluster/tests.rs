//! Round trips of the RayCluster samples and the shape of the RayCluster CRD.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResourceExt;
use serde_json::json;

use crate::api::raycluster::*;
use crate::api::test_support::*;

#[test]
fn every_raycluster_sample_round_trips_exactly() {
    let (kuberay, own) = assert_samples_round_trip::<RayCluster>("RayCluster");
    assert!(
        kuberay >= 4,
        "expected KubeRay's four RayCluster samples, found {kuberay}"
    );
    assert!(own >= 1);
}

#[test]
fn kuberay_samples_read_as_expected() {
    let docs = ray_objects(&kuberay_samples_dir(), "RayCluster");
    let autoscaler = docs
        .iter()
        .find(|(file, _)| file == "ray-cluster.autoscaler.yaml")
        .map(|(_, doc)| serde_json::from_value::<RayCluster>(doc.clone()).expect("RayCluster"))
        .expect("ray-cluster.autoscaler.yaml holds a RayCluster");
    let spec = &autoscaler.spec;
    assert_eq!(spec.enable_in_tree_autoscaling, Some(true));
    let options = spec.autoscaler_options.as_ref().expect("autoscalerOptions");
    assert_eq!(options.upscaling_mode, Some(UpscalingMode::Default));
    assert_eq!(options.idle_timeout_seconds, Some(60));
    assert_eq!(
        options.env,
        Some(vec![]),
        "an empty list stays an empty list"
    );
    let workers = spec.worker_group_specs.as_ref().expect("worker groups");
    assert_eq!(workers[0].group_name, "small-group");
    assert_eq!(
        (workers[0].replicas, workers[0].max_replicas),
        (Some(0), Some(10))
    );
    assert_eq!(workers[0].ray_start_params, Some(BTreeMap::new()));
    let volumes = spec
        .head_group_spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref());
    let mode = volumes
        .and_then(|v| v[0].config_map.as_ref())
        .and_then(|c| c.default_mode);
    assert_eq!(
        mode,
        Some(0o777),
        "YAML 1.1 octal file mode, as Kubernetes reads it"
    );
}

#[test]
fn status_written_by_kuberay_round_trips() {
    let status = json!({
        "state": "ready",
        "reason": "",
        "desiredCPU": "2",
        "desiredMemory": "6Gi",
        "desiredGPU": "0",
        "desiredTPU": "0",
        "lastUpdateTime": "2026-01-02T03:04:05Z",
        "stateTransitionTimes": {"ready": "2026-01-02T03:04:05Z"},
        "endpoints": {"client": "10001", "dashboard": "8265", "gcs-server": "6379", "metrics": "8080"},
        "head": {"podIP": "10.0.0.7", "serviceIP": "10.96.0.12", "podName": "c-head-x7k2p", "serviceName": "c-head-svc"},
        "conditions": [{
            "type": "HeadPodReady", "status": "True", "reason": "HeadPodRunningAndReady", "message": "",
            "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 1
        }],
        "readyWorkerReplicas": 1,
        "availableWorkerReplicas": 1,
        "desiredWorkerReplicas": 1,
        "minWorkerReplicas": 1,
        "maxWorkerReplicas": 5,
        "observedGeneration": 1
    });
    let typed: RayClusterStatus = assert_round_trip("RayCluster status", &status);
    assert_eq!(typed.state, Some(ClusterState::Ready));
    assert_eq!(typed.desired_cpu, Some(Quantity("2".into())));
    assert_eq!(
        typed.head.and_then(|h| h.pod_ip).as_deref(),
        Some("10.0.0.7")
    );
}

#[test]
fn enums_use_kuberays_strings() {
    let values = json!([
        RayClusterUpgradeType::Recreate,
        RayClusterUpgradeType::None,
        AuthMode::Token,
        GcsFaultToleranceBackend::Rocksdb,
        GcsStorageDeletionPolicy::DeleteWithCluster,
        NetworkPolicyMode::DenyAllEgress,
        IngressPathType::ImplementationSpecific,
        UpscalingMode::Conservative,
        AutoscalerVersion::V2,
        ClusterState::Suspended,
    ]);
    assert_eq!(
        values,
        json!([
            "Recreate",
            "None",
            "token",
            "rocksdb",
            "DeleteWithCluster",
            "DenyAllEgress",
            "ImplementationSpecific",
            "Conservative",
            "v2",
            "suspended"
        ])
    );
    for state in [
        ClusterState::Ready,
        ClusterState::Failed,
        ClusterState::Suspended,
    ] {
        assert_eq!(json!(state), json!(state.as_str()));
    }
}

#[test]
fn crd_matches_kuberay() {
    let crd = RayCluster::crd();
    assert_crd_shape(
        &crd,
        "rayclusters",
        &[
            (
                "desired workers",
                "integer",
                ".status.desiredWorkerReplicas",
                0,
            ),
            (
                "available workers",
                "integer",
                ".status.availableWorkerReplicas",
                0,
            ),
            ("cpus", "string", ".status.desiredCPU", 0),
            ("memory", "string", ".status.desiredMemory", 0),
            ("gpus", "string", ".status.desiredGPU", 0),
            ("tpus", "string", ".status.desiredTPU", 1),
            ("status", "string", ".status.state", 0),
            ("age", "date", ".metadata.creationTimestamp", 0),
            ("head pod IP", "string", ".status.head.podIP", 1),
            ("head service IP", "string", ".status.head.serviceIP", 1),
        ],
    );
    assert_installable_size(&crd);
    let schema = schema_json(&crd);
    assert_structural(&schema, "");
    assert!(!schema.to_string().contains("$ref"));
}

#[test]
fn crd_schema_has_kuberays_defaults_enums_and_rules() {
    let schema = schema_json(&RayCluster::crd());
    let spec = schema_at(&schema, "spec");
    assert_eq!(spec["required"], json!(["headGroupSpec"]));
    let group = schema_at(spec, "workerGroupSpecs.[]");
    for (field, default) in [
        ("replicas", 0),
        ("minReplicas", 0),
        ("maxReplicas", 2147483647),
        ("numOfHosts", 1),
        ("priority", 0),
    ] {
        assert_eq!(
            group["properties"][field]["default"],
            json!(default),
            "{field}"
        );
    }
    assert_eq!(group["required"], json!(["groupName", "template"]));
    assert_eq!(
        schema_at(spec, "networkPolicy.mode")["default"],
        json!("DenyAll")
    );
    assert_eq!(
        schema_at(spec, "autoscalerOptions.upscalingMode")["enum"],
        json!(["Default", "Aggressive", "Conservative"])
    );
    assert_eq!(
        schema_at(spec, "upgradeStrategy.type")["enum"],
        json!(["Recreate", "None"])
    );
    assert_eq!(
        schema_at(spec, "authOptions.mode")["enum"],
        json!(["disabled", "token"])
    );
    let backend = schema_at(spec, "gcsFaultToleranceOptions.backend");
    assert_eq!(backend["enum"], json!(["redis", "rocksdb"]));
    assert_eq!(
        backend["x-kubernetes-validations"][0]["rule"],
        "self == oldSelf"
    );
    let managed_by = schema_at(spec, "managedBy");
    assert_eq!(managed_by["type"], "string");
    assert_eq!(
        managed_by["x-kubernetes-validations"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    let conditions = schema_at(&schema, "status.conditions");
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
    let worker_groups = schema_at(spec, "networkPolicy.workerGroups");
    assert_eq!(
        worker_groups["x-kubernetes-list-map-keys"],
        json!(["groupName"])
    );
    assert_eq!(
        schema_at(spec, "headGroupSpec.template.metadata")["properties"]
            .as_object()
            .map(|p| p.keys().cloned().collect::<Vec<_>>()),
        Some(
            ["annotations", "finalizers", "labels", "name", "namespace"]
                .map(String::from)
                .to_vec()
        )
    );
    assert!(schema_at(&schema, "status.desiredCPU")["x-kubernetes-int-or-string"] == json!(true));
    let template = schema_at(spec, "headGroupSpec.template").to_string();
    assert!(
        !template.contains("\"description\""),
        "embedded Kubernetes types keep no descriptions"
    );
}

#[test]
fn embedded_services_read_and_write_back_unchanged() {
    let container = json!({"name": "ray-head", "image": "rayproject/ray:2.52.0"});
    for service in [
        json!({"spec": {"type": "LoadBalancer"}}),
        json!({"metadata": {"name": "custom-head", "labels": {"a": "b"}}, "spec": {"ports": [{"name": "dashboard", "port": 8265}]}}),
    ] {
        let head = json!({"headService": service, "template": {"spec": {"containers": [container.clone()]}}});
        let typed: HeadGroupSpec = assert_round_trip("headGroupSpec", &head);
        assert!(typed.head_service.is_some());
    }
    let schema = schema_json(&RayCluster::crd());
    let head_service = schema_at(&schema, "spec.headGroupSpec.headService");
    assert!(
        head_service.get("required").is_none(),
        "an embedded Service needs no metadata"
    );
}
