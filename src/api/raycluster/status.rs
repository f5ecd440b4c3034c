//! The observed state of a RayCluster: its status, state, head info, and the condition types
//! and reasons the operator sets, with KubeRay's names.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::schema::{enum_schema, k8s_schema};

/// Overall state of a cluster (`status.state`, deprecated in favour of conditions).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ClusterState {
    /// Every Pod ran and was ready once (sticky).
    Ready,
    /// Kept for compatibility; never set.
    Failed,
    /// Every Pod was deleted because of `spec.suspend`.
    Suspended,
}

impl ClusterState {
    /// The JSON string, as used for `stateTransitionTimes` keys.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterState::Ready => "ready",
            ClusterState::Failed => "failed",
            ClusterState::Suspended => "suspended",
        }
    }
}

/// Observed state of a RayCluster.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayClusterStatus {
    /// Deprecated: use conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<ClusterState>")]
    pub state: Option<ClusterState>,
    /// Sum of the CPUs of all desired Pods.
    #[serde(
        default,
        rename = "desiredCPU",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "k8s_schema::<Quantity>")]
    pub desired_cpu: Option<Quantity>,
    #[serde(
        default,
        rename = "desiredMemory",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "k8s_schema::<Quantity>")]
    pub desired_memory: Option<Quantity>,
    #[serde(
        default,
        rename = "desiredGPU",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "k8s_schema::<Quantity>")]
    pub desired_gpu: Option<Quantity>,
    #[serde(
        default,
        rename = "desiredTPU",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "k8s_schema::<Quantity>")]
    pub desired_tpu: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// Time of the last transition into each `state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_transition_times: Option<BTreeMap<String, Time>>,
    /// Head Service ports by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<HeadInfo>,
    /// Why the cluster is in its `state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `HeadPodReady`, `RayClusterProvisioned`, `ReplicaFailure`, `RayClusterSuspending`,
    /// `RayClusterSuspended`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::api::servepipeline::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Worker Pods that are Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_worker_replicas: Option<i32>,
    /// Worker Pods that are Running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_worker_replicas: Option<i32>,
    /// Sum of `replicas * numOfHosts` over worker groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_worker_replicas: Option<i32>,
    /// Sum of `minReplicas * numOfHosts` over worker groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_worker_replicas: Option<i32>,
    /// Sum of `maxReplicas * numOfHosts` over worker groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_worker_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The head Pod and Service as observed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeadInfo {
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    #[serde(default, rename = "serviceIP", skip_serializing_if = "Option::is_none")]
    pub service_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
}

/// RayCluster condition types.
pub mod condition_types {
    pub const HEAD_POD_READY: &str = "HeadPodReady";
    pub const RAY_CLUSTER_PROVISIONED: &str = "RayClusterProvisioned";
    pub const REPLICA_FAILURE: &str = "ReplicaFailure";
    pub const RAY_CLUSTER_SUSPENDING: &str = "RayClusterSuspending";
    pub const RAY_CLUSTER_SUSPENDED: &str = "RayClusterSuspended";
}

/// RayCluster condition reasons set by the operator itself.
pub mod condition_reasons {
    pub const ALL_POD_RUNNING_AND_READY_FIRST_TIME: &str = "AllPodRunningAndReadyFirstTime";
    pub const RAY_CLUSTER_PODS_PROVISIONING: &str = "RayClusterPodsProvisioning";
    pub const HEAD_POD_NOT_FOUND: &str = "HeadPodNotFound";
    pub const HEAD_POD_RUNNING_AND_READY: &str = "HeadPodRunningAndReady";
    pub const UNKNOWN: &str = "Unknown";
    pub const FAILED_CREATE_HEAD_POD: &str = "FailedCreateHeadPod";
    pub const FAILED_DELETE_HEAD_POD: &str = "FailedDeleteHeadPod";
    pub const FAILED_CREATE_WORKER_POD: &str = "FailedCreateWorkerPod";
    pub const FAILED_DELETE_WORKER_POD: &str = "FailedDeleteWorkerPod";
    pub const FAILED_DELETE_ALL_PODS: &str = "FailedDeleteAllPods";
}
