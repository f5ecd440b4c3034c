//! `ray.io/v1` RayService, field for field the API that KubeRay v1.7 serves: Ray Serve
//! applications on a RayCluster, upgraded without downtime by switching to a new cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::raycluster::{RayClusterSpec, RayClusterStatus};
use super::schema::{embedded_service, enum_schema, k8s_object_schema, managed_by_schema};

/// raypipe's annotation (not in KubeRay's API): an existing Gateway, `name` or
/// `namespace/name`, the HTTPRoute of `NewClusterWithIncrementalUpgrade` attaches to instead
/// of a Gateway made for the RayService (for platforms that forbid a Gateway per service).
pub const SHARED_GATEWAY_ANNOTATION: &str = "raypipe.dev/gateway";

/// Ray Serve applications and the RayCluster that serves them.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "ray.io",
    version = "v1",
    kind = "RayService",
    doc = "Ray Serve applications on a RayCluster (KubeRay ray.io/v1 API).",
    namespaced,
    status = "RayServiceStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "all",
    printcolumn = r#"{"name":"service status","type":"string","jsonPath":".status.serviceStatus"}"#,
    printcolumn = r#"{"name":"num serve endpoints","type":"string","jsonPath":".status.numServeEndpoints"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RayServiceSpec {
    /// Seconds before a replaced RayCluster is deleted (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ray_cluster_deletion_delay_seconds: Option<i32>,
    /// Deprecated; ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_unhealthy_second_threshold: Option<i32>,
    /// Deprecated; ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_unhealthy_second_threshold: Option<i32>,
    /// Base of the Serve Service, which selects the Pods that run a Serve proxy.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "embedded_service"
    )]
    #[schemars(schema_with = "k8s_object_schema::<Service>")]
    pub serve_service: Option<Service>,
    /// How a changed cluster spec is rolled out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_strategy: Option<RayServiceUpgradeStrategy>,
    /// Who reconciles this object: `ray.io/kuberay-operator` (also when unset) or
    /// `kueue.x-k8s.io/multikueue`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "managed_by_schema")]
    pub managed_by: Option<String>,
    /// Ray Serve multi-application config, as a YAML string.
    #[serde(
        default,
        rename = "serveConfigV2",
        skip_serializing_if = "Option::is_none"
    )]
    pub serve_config_v2: Option<String>,
    /// Spec of the RayCluster(s) the service runs on.
    pub ray_cluster_config: RayClusterSpec,
    /// Keeps the head Pod out of the Serve Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_head_pod_from_serve_svc: Option<bool>,
    /// While true, every cluster and Service of the RayService is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
}

/// `spec.upgradeStrategy` of a RayService.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayServiceUpgradeStrategy {
    /// `NewCluster` (when unset), `NewClusterWithIncrementalUpgrade` or `None`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<RayServiceUpgradeType>")]
    pub type_: Option<RayServiceUpgradeType>,
    /// Traffic migration of `NewClusterWithIncrementalUpgrade`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_upgrade_options: Option<ClusterUpgradeOptions>,
}

/// How a RayService rolls out a changed cluster spec.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum RayServiceUpgradeType {
    /// Create a new cluster and switch all traffic once it serves.
    NewCluster,
    /// Move traffic to a new cluster step by step through Gateway API.
    NewClusterWithIncrementalUpgrade,
    /// Never create a new cluster for a spec change.
    None,
}

/// Steps of `NewClusterWithIncrementalUpgrade`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterUpgradeOptions {
    /// Capacity, in percent, the new cluster grows by per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 100))]
    pub max_surge_percent: Option<i32>,
    /// Traffic, in percent, moved per step; at most maxSurgePercent.
    pub step_size_percent: i32,
    /// Seconds between steps.
    pub interval_seconds: i32,
    /// GatewayClass of the Gateway that splits the traffic.
    pub gateway_class_name: String,
}

/// Observed state of a RayService.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayServiceStatus {
    /// `Ready`, `UpgradeInProgress`, `RollbackInProgress`, `Suspending`, `Suspended`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::api::servepipeline::conditions_schema")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// Deprecated: `Running` when the Ready condition is true, else unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<ServiceStatus>")]
    pub service_status: Option<ServiceStatus>,
    /// The cluster serving traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_service_status: Option<RayServiceClusterStatus>,
    /// The cluster being prepared to take over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_service_status: Option<RayServiceClusterStatus>,
    /// Ray Pods selected by the Serve Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_serve_endpoints: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// `status.serviceStatus`; not being ready is written as no value.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum ServiceStatus {
    Running,
}

/// Status of one of the RayService's clusters (KubeRay's Go type `RayServiceStatus`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayServiceClusterStatus {
    /// Serve applications by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_statuses: Option<BTreeMap<String, AppStatus>>,
    /// Serve `target_capacity`, in percent, during an incremental upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_capacity: Option<i32>,
    /// Traffic, in percent, routed to this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_routed_percent: Option<i32>,
    /// When trafficRoutedPercent last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_traffic_migrated_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_cluster_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_cluster_status: Option<RayClusterStatus>,
}

/// Status of one Serve application, as Ray reports it (see [`app_statuses`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AppStatus {
    /// Serve deployments by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_deployment_statuses: Option<BTreeMap<String, ServeDeploymentStatus>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Status of one Serve deployment, as Ray reports it (see [`deployment_statuses`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServeDeploymentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Serve application statuses (strings, because Ray owns the set).
pub mod app_statuses {
    pub const NOT_STARTED: &str = "NOT_STARTED";
    pub const DEPLOYING: &str = "DEPLOYING";
    pub const RUNNING: &str = "RUNNING";
    pub const DEPLOY_FAILED: &str = "DEPLOY_FAILED";
    pub const DELETING: &str = "DELETING";
    pub const UNHEALTHY: &str = "UNHEALTHY";
}

/// Serve deployment statuses (strings, because Ray owns the set).
pub mod deployment_statuses {
    pub const UPDATING: &str = "UPDATING";
    pub const HEALTHY: &str = "HEALTHY";
    pub const UNHEALTHY: &str = "UNHEALTHY";
}

/// RayService condition types.
pub mod condition_types {
    pub const READY: &str = "Ready";
    pub const UPGRADE_IN_PROGRESS: &str = "UpgradeInProgress";
    pub const ROLLBACK_IN_PROGRESS: &str = "RollbackInProgress";
    pub const SUSPENDING: &str = "Suspending";
    pub const SUSPENDED: &str = "Suspended";
}

/// RayService condition reasons.
pub mod condition_reasons {
    pub const INITIALIZING: &str = "Initializing";
    pub const INITIALIZING_TIMEOUT: &str = "InitializingTimeout";
    pub const ZERO_SERVE_ENDPOINTS: &str = "ZeroServeEndpoints";
    pub const NON_ZERO_SERVE_ENDPOINTS: &str = "NonZeroServeEndpoints";
    pub const BOTH_ACTIVE_PENDING_CLUSTERS_EXIST: &str = "BothActivePendingClustersExist";
    pub const NO_PENDING_CLUSTER: &str = "NoPendingCluster";
    pub const NO_ACTIVE_CLUSTER: &str = "NoActiveCluster";
    pub const VALIDATION_FAILED: &str = "ValidationFailed";
    pub const DESIRED_CLUSTER_SPEC_CHANGED: &str = "DesiredClusterSpecChanged";
    pub const SUSPEND_REQUESTED: &str = "SuspendRequested";
    pub const SUSPEND_IN_PROGRESS: &str = "SuspendInProgress";
    pub const SUSPEND_COMPLETE: &str = "SuspendComplete";
    pub const RAY_SERVICE_RESUMED: &str = "RayServiceResumed";
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;
    use serde_json::json;

    use super::*;
    use crate::api::test_support::*;

    #[test]
    fn every_rayservice_sample_round_trips_exactly() {
        let (kuberay, own) = assert_samples_round_trip::<RayService>("RayService");
        assert!(
            kuberay >= 2,
            "expected KubeRay's two RayService samples, found {kuberay}"
        );
        assert!(own >= 1);
    }

    #[test]
    fn kuberay_sample_reads_as_expected() {
        let (_, doc) = ray_objects(&kuberay_samples_dir(), "RayService")
            .into_iter()
            .find(|(file, _)| file == "ray-service.high-availability.yaml")
            .expect("ray-service.high-availability.yaml holds a RayService");
        let service: RayService = serde_json::from_value(doc).expect("RayService");
        assert!(
            service
                .spec
                .serve_config_v2
                .as_deref()
                .is_some_and(|c| c.contains("fruit_app"))
        );
        let ft = service
            .spec
            .ray_cluster_config
            .gcs_fault_tolerance_options
            .expect("GCS FT options");
        assert_eq!(ft.redis_address.as_deref(), Some("redis:6379"));
        let secret = ft
            .redis_password
            .and_then(|p| p.value_from)
            .and_then(|v| v.secret_key_ref);
        assert_eq!(
            secret.map(|s| (s.name, s.key)),
            Some(("redis-password-secret".into(), "password".into()))
        );
    }

    #[test]
    fn upgrade_strategy_keeps_its_json_shape() {
        let strategy = json!({
            "type": "NewClusterWithIncrementalUpgrade",
            "clusterUpgradeOptions": {"maxSurgePercent": 40, "stepSizePercent": 20, "intervalSeconds": 30, "gatewayClassName": "istio"}
        });
        let typed: RayServiceUpgradeStrategy = assert_round_trip("upgradeStrategy", &strategy);
        assert_eq!(
            typed.type_,
            Some(RayServiceUpgradeType::NewClusterWithIncrementalUpgrade)
        );
        for (value, text) in [
            (RayServiceUpgradeType::NewCluster, "NewCluster"),
            (RayServiceUpgradeType::None, "None"),
        ] {
            assert_eq!(
                json!(RayServiceUpgradeStrategy {
                    type_: Some(value),
                    cluster_upgrade_options: None
                }),
                json!({"type": text})
            );
        }
    }

    #[test]
    fn status_written_by_kuberay_round_trips() {
        let cluster = json!({
            "rayClusterName": "rayservice-sample-7xk2m",
            "applicationStatuses": {
                "fruit_app": {
                    "status": "RUNNING",
                    "serveDeploymentStatuses": {"FruitMarket": {"status": "HEALTHY"}, "MangoStand": {"status": "UPSCALING", "message": "a status newer Rays report"}}
                }
            },
            "targetCapacity": 100,
            "trafficRoutedPercent": 100,
            "lastTrafficMigratedTime": "2026-01-02T03:04:05Z",
            "rayClusterStatus": {"state": "ready", "desiredCPU": "3"}
        });
        let status = json!({
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints", "message": "",
                "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 1
            }],
            "lastUpdateTime": "2026-01-02T03:04:05Z",
            "serviceStatus": "Running",
            "activeServiceStatus": cluster,
            "pendingServiceStatus": {},
            "numServeEndpoints": 2,
            "observedGeneration": 1
        });
        let typed: RayServiceStatus = assert_round_trip("RayService status", &status);
        assert_eq!(typed.service_status, Some(ServiceStatus::Running));
        let apps = typed
            .active_service_status
            .and_then(|s| s.application_statuses)
            .expect("applications");
        assert_eq!(
            apps["fruit_app"].status.as_deref(),
            Some(app_statuses::RUNNING)
        );
    }

    #[test]
    fn crd_matches_kuberay() {
        let crd = RayService::crd();
        assert_crd_shape(
            &crd,
            "rayservices",
            &[
                ("service status", "string", ".status.serviceStatus", 0),
                (
                    "num serve endpoints",
                    "string",
                    ".status.numServeEndpoints",
                    0,
                ),
            ],
        );
        assert_installable_size(&crd);
        let schema = schema_json(&crd);
        assert_structural(&schema, "");
        let spec = schema_at(&schema, "spec");
        assert_eq!(spec["required"], json!(["rayClusterConfig"]));
        assert_eq!(
            schema_at(spec, "rayClusterDeletionDelaySeconds")["minimum"],
            0.0
        );
        assert_eq!(
            schema_at(spec, "managedBy")["x-kubernetes-validations"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        let options = schema_at(spec, "upgradeStrategy.clusterUpgradeOptions");
        assert_eq!(schema_at(options, "maxSurgePercent")["default"], 100);
        assert_eq!(
            options["required"],
            json!(["gatewayClassName", "intervalSeconds", "stepSizePercent"])
        );
        assert_eq!(
            schema_at(spec, "upgradeStrategy.type")["enum"],
            json!(["NewCluster", "NewClusterWithIncrementalUpgrade", "None"])
        );
        assert_eq!(
            schema_at(&schema, "status.conditions")["x-kubernetes-list-type"],
            "map"
        );
        assert!(schema_at(&schema, "status.activeServiceStatus.applicationStatuses.{}.serveDeploymentStatuses.{}.status")["enum"].is_null());
    }
}
