//! `ray.io/v1` RayCluster, field for field the API that KubeRay v1.7 serves.
//!
//! Fields keep KubeRay's JSON names and Go struct order (the order matters to the spec hash of
//! `reference/kuberay-spec.md` §0.5). Everything KubeRay marks optional is an `Option`, so an
//! object read and written back is unchanged; server-side defaults live in the CRD schema only.
//! This file also holds the schema helpers shared by the other `ray.io/v1` kinds.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvFromSource, EnvVar, EnvVarSource, PodTemplateSpec, ResourceRequirements, SecurityContext,
    Service, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    IngressTLS, NetworkPolicyEgressRule, NetworkPolicyIngressRule,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `managedBy` value for objects reconciled by the KubeRay-compatible controllers (also the
/// meaning of an unset `managedBy`).
pub const MANAGED_BY_KUBERAY: &str = "ray.io/kuberay-operator";
/// `managedBy` value for objects delegated to Kueue MultiKueue.
pub const MANAGED_BY_MULTIKUEUE: &str = "kueue.x-k8s.io/multikueue";

/// A Ray cluster: one head Pod and any number of worker groups.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "ray.io",
    version = "v1",
    kind = "RayCluster",
    doc = "A Ray cluster (KubeRay ray.io/v1 API).",
    namespaced,
    status = "RayClusterStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "all",
    printcolumn = r#"{"name":"desired workers","type":"integer","jsonPath":".status.desiredWorkerReplicas"}"#,
    printcolumn = r#"{"name":"available workers","type":"integer","jsonPath":".status.availableWorkerReplicas"}"#,
    printcolumn = r#"{"name":"cpus","type":"string","jsonPath":".status.desiredCPU"}"#,
    printcolumn = r#"{"name":"memory","type":"string","jsonPath":".status.desiredMemory"}"#,
    printcolumn = r#"{"name":"gpus","type":"string","jsonPath":".status.desiredGPU"}"#,
    printcolumn = r#"{"name":"tpus","type":"string","priority":1,"jsonPath":".status.desiredTPU"}"#,
    printcolumn = r#"{"name":"status","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"head pod IP","type":"string","priority":1,"jsonPath":".status.head.podIP"}"#,
    printcolumn = r#"{"name":"head service IP","type":"string","priority":1,"jsonPath":".status.head.serviceIP"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RayClusterSpec {
    /// What happens to running Pods when the spec changes (user-created clusters only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_strategy: Option<RayClusterUpgradeStrategy>,
    /// Ray token authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_options: Option<AuthOptions>,
    /// While true, every Pod of the cluster is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// Who reconciles this object: `ray.io/kuberay-operator` (also when unset) or
    /// `kueue.x-k8s.io/multikueue`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "managed_by_schema")]
    pub managed_by: Option<String>,
    /// Overrides for the Ray autoscaler sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaler_options: Option<AutoscalerOptions>,
    /// Annotations added to the head Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_service_annotations: Option<BTreeMap<String, String>>,
    /// Adds the Ray autoscaler as a sidecar of the head Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_in_tree_autoscaling: Option<bool>,
    /// GCS fault tolerance: external Redis or embedded RocksDB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcs_fault_tolerance_options: Option<GcsFaultToleranceOptions>,
    /// Ray history server collector (alpha, behind a feature gate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_server_options: Option<HistoryServerOptions>,
    /// NetworkPolicies isolating the cluster's Pods (alpha, behind a feature gate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicyConfig>,
    /// mTLS between Ray Pods through cert-manager (alpha, behind a feature gate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_options: Option<TlsOptions>,
    /// The head Pod.
    pub head_group_spec: HeadGroupSpec,
    /// Ray version of the images (e.g. `2.52.0`); selects probe style and feature support.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_group_specs: Option<Vec<WorkerGroupSpec>>,
}

/// `spec.tlsOptions`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TlsOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `spec.upgradeStrategy` of a RayCluster.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayClusterUpgradeStrategy {
    /// `Recreate` or `None` (the default: changes apply only to new Pods).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<RayClusterUpgradeType>")]
    pub type_: Option<RayClusterUpgradeType>,
}

/// How a RayCluster's Pods follow a spec change.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum RayClusterUpgradeType {
    /// Delete every Pod and create them again from the new spec.
    Recreate,
    /// Leave running Pods alone; only new Pods use the new spec.
    None,
}

/// `spec.authOptions`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthOptions {
    /// Delegates token checks to the Kubernetes API server (Ray >= 2.55).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_k8s_token_auth: Option<bool>,
    /// Secret with the token under key `auth_token`; unset: the operator makes one per cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// `disabled` or `token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<AuthMode>")]
    pub mode: Option<AuthMode>,
}

/// Ray authentication mode.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    Disabled,
    Token,
}

/// `spec.gcsFaultToleranceOptions`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GcsFaultToleranceOptions {
    /// `redis` (when unset) or `rocksdb`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self == oldSelf", "message": "gcsFaultToleranceOptions.backend is immutable"}
    ]))]
    #[schemars(schema_with = "enum_schema::<GcsFaultToleranceBackend>")]
    pub backend: Option<GcsFaultToleranceBackend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_username: Option<RedisCredential>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_password: Option<RedisCredential>,
    /// Key namespace in Redis (default: the RayCluster's UID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_storage_namespace: Option<String>,
    /// `host:port` or `redis://` URI of the Redis backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_address: Option<String>,
    /// Volume of the `rocksdb` backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<GcsEmbeddedStorage>,
}

/// Where GCS fault tolerance keeps its state.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GcsFaultToleranceBackend {
    /// An external Redis.
    Redis,
    /// RocksDB on a volume of the head Pod.
    Rocksdb,
}

/// The PersistentVolumeClaim of the `rocksdb` backend.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GcsEmbeddedStorage {
    /// An existing claim to use as is; excludes size, storageClassName and accessModes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Size of the claim the operator creates (default `1Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<Quantity>")]
    pub size: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// Default `[ReadWriteOnce]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_modes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
    /// `DeleteWithCluster` (default) or `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<GcsStorageDeletionPolicy>")]
    pub deletion_policy: Option<GcsStorageDeletionPolicy>,
}

/// What happens to the operator-made GCS claim when its RayCluster is deleted.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum GcsStorageDeletionPolicy {
    DeleteWithCluster,
    Retain,
}

/// A Redis username or password, literal or from a Secret.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RedisCredential {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<EnvVarSource>")]
    pub value_from: Option<EnvVarSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// `spec.historyServerOptions`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HistoryServerOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collector_options: Option<CollectorOptions>,
}

/// The history server collector sidecar.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CollectorOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<ResourceRequirements>")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<Vec<EnvVar>>")]
    pub env: Option<Vec<EnvVar>>,
}

/// `spec.networkPolicy`. Intra-cluster traffic is always allowed; DNS egress is not added.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicyConfig {
    /// `DenyAll` (default), `DenyAllIngress` or `DenyAllEgress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "DenyAll"))]
    #[schemars(schema_with = "enum_schema::<NetworkPolicyMode>")]
    pub mode: Option<NetworkPolicyMode>,
    /// Rules appended to the head Pod's policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<NetworkPolicyRules>,
    /// Rules appended to every worker group's policy without an entry in `workerGroups`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<NetworkPolicyRules>,
    /// Per worker group rules, replacing `worker` for that group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["groupName"]))]
    pub worker_groups: Option<Vec<WorkerGroupNetworkPolicyRules>>,
}

/// Which traffic the NetworkPolicies deny.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum NetworkPolicyMode {
    DenyAll,
    DenyAllIngress,
    DenyAllEgress,
}

/// Extra rules of one NetworkPolicy.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicyRules {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<Vec<NetworkPolicyIngressRule>>")]
    pub ingress_rules: Option<Vec<NetworkPolicyIngressRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<Vec<NetworkPolicyEgressRule>>")]
    pub egress_rules: Option<Vec<NetworkPolicyEgressRule>>,
}

/// Extra NetworkPolicy rules of one worker group.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerGroupNetworkPolicyRules {
    /// A `workerGroupSpecs[].groupName`.
    pub group_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<Vec<NetworkPolicyIngressRule>>")]
    pub ingress_rules: Option<Vec<NetworkPolicyIngressRule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<Vec<NetworkPolicyEgressRule>>")]
    pub egress_rules: Option<Vec<NetworkPolicyEgressRule>>,
}

/// The head Pod and its Service.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeadGroupSpec {
    #[schemars(schema_with = "k8s_object_schema::<PodTemplateSpec>")]
    pub template: PodTemplateSpec,
    /// Base of the head Service the operator creates.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "embedded_service"
    )]
    #[schemars(schema_with = "k8s_object_schema::<Service>")]
    pub head_service: Option<Service>,
    /// Creates an Ingress for the head Service's dashboard port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_ingress: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_options: Option<IngressOptions>,
    /// Ray resources of the head (`CPU`, `GPU`, custom names); override rayStartParams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<BTreeMap<String, String>>,
    /// Ray node labels of the head, also set on its Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// `ray start` options, without the leading `--`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_start_params: Option<BTreeMap<String, String>>,
    /// Type of the head Service (default `ClusterIP`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_type: Option<String>,
}

/// Path match of the head Ingress rule.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum IngressPathType {
    Exact,
    Prefix,
    ImplementationSpecific,
}

/// The Ingress made with `enableIngress`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IngressOptions {
    /// Host of the rule (unset: any host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Default `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Default `Prefix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<IngressPathType>")]
    pub path_type: Option<IngressPathType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<Vec<IngressTLS>>")]
    pub tls: Option<Vec<IngressTLS>>,
}

/// A group of identical worker Pods.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerGroupSpec {
    /// Deletes the group's Pods; set only by RayJob's `DeleteWorkers` deletion policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// Unique within the cluster.
    pub group_name: String,
    /// Desired number of replicas (each `numOfHosts` Pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub min_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 2147483647))]
    pub max_replicas: Option<i32>,
    /// Seconds before autoscaler v2 removes an idle worker of this group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<i32>,
    /// Scale-up preference of autoscaler v2 among groups (higher first; Ray >= 2.56).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub priority: Option<i32>,
    /// Ray resources of each worker (`CPU`, `GPU`, custom names); override rayStartParams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<BTreeMap<String, String>>,
    /// Ray node labels of each worker, also set on its Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// `ray start` options, without the leading `--`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_start_params: Option<BTreeMap<String, String>>,
    #[schemars(schema_with = "k8s_object_schema::<PodTemplateSpec>")]
    pub template: PodTemplateSpec,
    /// Which Pods to delete when scaling down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_strategy: Option<ScaleStrategy>,
    /// Pods per replica (multi-host, e.g. TPU slices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 1))]
    pub num_of_hosts: Option<i32>,
}

/// `scaleStrategy` of a worker group.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScaleStrategy {
    /// Names of the worker Pods to delete first (written by the autoscaler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers_to_delete: Option<Vec<String>>,
}

/// `spec.autoscalerOptions`: the autoscaler sidecar and its settings.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalerOptions {
    /// Default: 500m CPU and 512Mi memory, requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<ResourceRequirements>")]
    pub resources: Option<ResourceRequirements>,
    /// Default: the head's Ray image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<SecurityContext>")]
    pub security_context: Option<SecurityContext>,
    /// Seconds before an idle worker is removed (autoscaler default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<i32>,
    /// `Default`, `Aggressive` (same as Default) or `Conservative`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<UpscalingMode>")]
    pub upscaling_mode: Option<UpscalingMode>,
    /// Unset: v2 from Ray 2.47.0 on, v1 before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<AutoscalerVersion>")]
    pub version: Option<AutoscalerVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<Vec<EnvVar>>")]
    pub env: Option<Vec<EnvVar>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<Vec<EnvFromSource>>")]
    pub env_from: Option<Vec<EnvFromSource>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_schema::<Vec<VolumeMount>>")]
    pub volume_mounts: Option<Vec<VolumeMount>>,
    /// Replaces the autoscaler container's command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Replaces the autoscaler container's args.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
}

/// How fast the autoscaler adds workers.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum UpscalingMode {
    /// No rate limit.
    Default,
    /// Same as `Default`.
    Aggressive,
    /// Pending workers at most the size of the cluster.
    Conservative,
}

/// Ray autoscaler generation.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum AutoscalerVersion {
    V1,
    V2,
}

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

// ---- schema helpers shared by the ray.io/v1 kinds ------------------------------------------

/// Schema of a string enum field: `{type: string, enum: [...]}` in declaration order, without the
/// `nullable` and `null` member schemars adds for an `Option`, as in KubeRay's CRDs.
pub(crate) fn enum_schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    let schema = generator.subschema_for::<T>();
    let mut values = Vec::new();
    collect_enum_values(schema.as_value(), &mut values);
    json_schema!({"type": "string", "enum": values})
}

/// The non-null values of an enum schema, whether listed in `enum` or as documented variants in
/// `oneOf` (`const` or single-value `enum`).
fn collect_enum_values(schema: &Value, values: &mut Vec<Value>) {
    if let Some(Value::Array(members)) = schema.get("enum") {
        values.extend(members.iter().filter(|v| !v.is_null()).cloned());
    }
    if let Some(value) = schema.get("const").filter(|v| !v.is_null()) {
        values.push(value.clone());
    }
    for keyword in ["oneOf", "anyOf"] {
        if let Some(Value::Array(variants)) = schema.get(keyword) {
            variants.iter().for_each(|v| collect_enum_values(v, values));
        }
    }
}

/// `managedBy`: a string that cannot change and must name KubeRay or MultiKueue (KubeRay's CEL
/// rules, without `nullable` so the rules see a plain string).
pub(crate) fn managed_by_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "the managedBy field is immutable"},
            {
                "rule": "self in ['ray.io/kuberay-operator', 'kueue.x-k8s.io/multikueue']",
                "message": "the managedBy field value must be either 'ray.io/kuberay-operator' or 'kueue.x-k8s.io/multikueue'"
            }
        ]
    })
}

/// Schema of an embedded Kubernetes type without its upstream descriptions: a PodTemplateSpec
/// alone carries hundreds of kilobytes of them, and several are embedded per CRD.
pub(crate) fn k8s_schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<T>();
    if let Some(map) = schema.as_object_mut() {
        strip_object_descriptions(map);
    }
    schema
}

/// [`k8s_schema`] for an embedded object (PodTemplateSpec, Service) whose `metadata` keeps only
/// what an embedded object may set, as in KubeRay's CRDs (the API server drops or, under strict
/// field validation, refuses other metadata fields).
pub(crate) fn k8s_object_schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = k8s_schema::<T>(generator);
    // k8s-openapi requires `metadata` of top-level kinds such as Service; embedded, it is optional.
    if let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|name| name != "metadata");
        if required.is_empty() {
            schema.remove("required");
        }
    }
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut)
        && properties.contains_key("metadata")
    {
        let string_map =
            serde_json::json!({"type": "object", "additionalProperties": {"type": "string"}});
        properties.insert(
            "metadata".into(),
            serde_json::json!({
                "type": "object",
                "properties": {
                    "annotations": string_map,
                    "finalizers": {"type": "array", "items": {"type": "string"}},
                    "labels": string_map,
                    "name": {"type": "string"},
                    "namespace": {"type": "string"},
                }
            }),
        );
    }
    schema
}

/// Serde of an embedded Service (`headService`, `serveService`). k8s-openapi writes `apiVersion`,
/// `kind` and `metadata` on every Service; embedded ones carry none of them unless given, so they
/// are left out (an empty `metadata` included) to write back exactly what was read.
pub(crate) mod embedded_service {
    use k8s_openapi::api::core::v1::Service;
    use serde::ser::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub fn serialize<S: Serializer>(
        service: &Option<Service>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let Some(service) = service else {
            return serializer.serialize_none();
        };
        let mut value = serde_json::to_value(service).map_err(S::Error::custom)?;
        if let Some(fields) = value.as_object_mut() {
            fields.remove("apiVersion");
            fields.remove("kind");
            if fields
                .get("metadata")
                .and_then(Value::as_object)
                .is_some_and(|m| m.is_empty())
            {
                fields.remove("metadata");
            }
        }
        value.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Service>, D::Error> {
        Option::<Service>::deserialize(deserializer)
    }
}

/// Removes `description` from a schema and all its subschemas (never a property named so).
fn strip_descriptions(schema: &mut Value) {
    match schema {
        Value::Object(map) => strip_object_descriptions(map),
        Value::Array(items) => items.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

fn strip_object_descriptions(schema: &mut serde_json::Map<String, Value>) {
    if schema.get("description").is_some_and(Value::is_string) {
        schema.remove("description");
    }
    for (keyword, child) in schema.iter_mut() {
        match keyword.as_str() {
            // Maps from property names to subschemas.
            "properties" | "patternProperties" => {
                if let Value::Object(properties) = child {
                    properties.values_mut().for_each(strip_descriptions);
                }
            }
            // Values, not schemas.
            "default" | "enum" | "const" | "example" | "examples" | "required" => {}
            _ => strip_descriptions(child),
        }
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Helpers shared by the tests of the `ray.io/v1` kinds: sample loading, exact round trips,
    //! and CRD inspection.

    use std::path::{Path, PathBuf};

    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinition, CustomResourceDefinitionVersion,
    };
    use serde::Serialize;
    use serde::de::DeserializeOwned;
    use serde_json::Value;

    /// KubeRay's sample objects (see [`crate::api::yaml::kuberay_samples_dir`]).
    pub fn kuberay_samples_dir() -> PathBuf {
        crate::api::yaml::kuberay_samples_dir()
    }

    /// The project's own samples (`samples/`).
    pub fn own_samples_dir() -> PathBuf {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/samples"))
    }

    /// Every document of a YAML file, as JSON values (empty documents skipped).
    pub fn yaml_documents(path: &Path) -> Vec<Value> {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        crate::api::yaml::documents(&text)
            .unwrap_or_else(|e| panic!("{}: invalid YAML: {e}", path.display()))
    }

    /// `(file name, document)` for every `ray.io/v1` object of `kind` in the `*.yaml` files of `dir`.
    pub fn ray_objects(dir: &Path, kind: &str) -> Vec<(String, Value)> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|entry| entry.expect("directory entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        files.sort();
        let mut found = Vec::new();
        for file in files {
            let name = file
                .file_name()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            for doc in yaml_documents(&file) {
                if doc["apiVersion"] == "ray.io/v1" && doc["kind"] == kind {
                    found.push((name.clone(), doc));
                }
            }
        }
        found
    }

    /// The first place where two JSON values differ, as a JSON pointer with both sides.
    pub fn first_difference(expected: &Value, actual: &Value, path: &str) -> Option<String> {
        match (expected, actual) {
            (Value::Object(e), Value::Object(a)) => {
                for key in e.keys().chain(a.keys()) {
                    let child = format!("{path}/{key}");
                    match (e.get(key), a.get(key)) {
                        (Some(ev), Some(av)) => {
                            if let Some(diff) = first_difference(ev, av, &child) {
                                return Some(diff);
                            }
                        }
                        (Some(ev), None) => return Some(format!("{child}: lost {ev}")),
                        (None, Some(av)) => return Some(format!("{child}: added {av}")),
                        (None, None) => {}
                    }
                }
                None
            }
            (Value::Array(e), Value::Array(a)) if e.len() == a.len() => e
                .iter()
                .zip(a)
                .enumerate()
                .find_map(|(i, (ev, av))| first_difference(ev, av, &format!("{path}/{i}"))),
            // JSON has one number type: `1` and `1.0` are the same value (a float field holding
            // a whole number serializes as `1.0`).
            (Value::Number(e), Value::Number(a)) if e.as_f64() == a.as_f64() => None,
            _ if expected == actual => None,
            _ => Some(format!("{path}: expected {expected}, got {actual}")),
        }
    }

    /// Deserializes `doc` as `K` and serializes it back; the result must equal `doc` exactly.
    pub fn assert_round_trip<K: DeserializeOwned + Serialize>(origin: &str, doc: &Value) -> K {
        let typed: K = serde_json::from_value(doc.clone())
            .unwrap_or_else(|e| panic!("{origin}: does not deserialize: {e}"));
        let back = serde_json::to_value(&typed)
            .unwrap_or_else(|e| panic!("{origin}: does not serialize: {e}"));
        if let Some(diff) = first_difference(doc, &back, "") {
            panic!("{origin}: the round trip changed the object at {diff}");
        }
        typed
    }

    /// KubeRay's name rules (webhook and controller): a DNS-1035 label no longer than the
    /// kind's limit, which leaves room for the suffixes of generated names.
    pub fn assert_valid_kuberay_name(kind: &str, name: &str) {
        let limit = match kind {
            "RayCluster" => 53,
            "RayJob" | "RayService" => 47,
            "RayCronJob" => 36,
            other => panic!("unknown kind {other}"),
        };
        assert!(
            name.len() <= limit,
            "{kind} name {name:?} is longer than {limit}"
        );
        let bytes = name.as_bytes();
        let dns_1035 = bytes.first().is_some_and(u8::is_ascii_lowercase)
            && bytes
                .last()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
        assert!(dns_1035, "{kind} name {name:?} is not a DNS-1035 label");
    }

    /// Round-trips every `kind` object of KubeRay's samples and of `samples/`; returns how many
    /// came from each. Each directory must hold at least one object of the kind.
    pub fn assert_samples_round_trip<K: DeserializeOwned + Serialize>(
        kind: &str,
    ) -> (usize, usize) {
        let mut counts = Vec::new();
        for dir in [kuberay_samples_dir(), own_samples_dir()] {
            let objects = ray_objects(&dir, kind);
            assert!(
                !objects.is_empty(),
                "no ray.io/v1 {kind} in {}",
                dir.display()
            );
            for (file, doc) in &objects {
                let name = doc["metadata"]["name"].as_str().unwrap_or_default();
                let origin = format!("{}/{file} ({kind} {name})", dir.display());
                assert_valid_kuberay_name(kind, name);
                assert_round_trip::<K>(&origin, doc);
            }
            counts.push(objects.len());
        }
        (counts[0], counts[1])
    }

    /// The single version of a CRD.
    pub fn only_version(crd: &CustomResourceDefinition) -> &CustomResourceDefinitionVersion {
        assert_eq!(crd.spec.versions.len(), 1, "one version per CRD");
        &crd.spec.versions[0]
    }

    /// Checks names, scope, category, subresources (status, no scale, as KubeRay) and printer
    /// columns `(name, type, jsonPath, priority)`.
    pub fn assert_crd_shape(
        crd: &CustomResourceDefinition,
        plural: &str,
        columns: &[(&str, &str, &str, i32)],
    ) {
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.ray.io").as_str())
        );
        assert_eq!(crd.spec.group, "ray.io");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.plural, plural);
        assert_eq!(crd.spec.names.categories, Some(vec!["all".to_owned()]));
        assert_eq!(
            crd.spec.names.short_names, None,
            "KubeRay defines no short names"
        );
        let version = only_version(crd);
        assert_eq!(version.name, "v1");
        assert!(version.served && version.storage);
        let subresources = version.subresources.as_ref().expect("subresources");
        assert!(
            subresources.status.is_some(),
            "{plural}: status subresource"
        );
        assert!(
            subresources.scale.is_none(),
            "{plural}: KubeRay has no scale subresource"
        );
        let actual: Vec<(String, String, String, i32)> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| {
                (
                    c.name.clone(),
                    c.type_.clone(),
                    c.json_path.clone(),
                    c.priority.unwrap_or(0),
                )
            })
            .collect();
        let expected: Vec<(String, String, String, i32)> = columns
            .iter()
            .map(|(n, t, p, prio)| ((*n).to_owned(), (*t).to_owned(), (*p).to_owned(), *prio))
            .collect();
        assert_eq!(actual, expected, "{plural}: printer columns");
    }

    /// The CRD's OpenAPI schema as JSON.
    pub fn schema_json(crd: &CustomResourceDefinition) -> Value {
        let schema = only_version(crd)
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref());
        serde_json::to_value(schema.expect("openAPIV3Schema")).expect("schema serializes")
    }

    /// The schema node at `path` (property names separated by `.`; `[]` steps into array items,
    /// `{}` into map values).
    pub fn schema_at<'a>(schema: &'a Value, path: &str) -> &'a Value {
        let mut node = schema;
        for step in path.split('.') {
            node = match step {
                "[]" => &node["items"],
                "{}" => &node["additionalProperties"],
                name => &node["properties"][name],
            };
            assert!(!node.is_null(), "no schema at {path} (step {step})");
        }
        node
    }

    /// Checks the schema is structural as the API server requires: no `$ref`, no
    /// `oneOf`/`anyOf`/`allOf`/`not`, every node typed (or int-or-string / preserve-unknown), no
    /// `additionalProperties` beside `properties`, and list-map keys that exist and are required
    /// or defaulted.
    pub fn assert_structural(node: &Value, path: &str) {
        let Value::Object(map) = node else {
            panic!("{path}: schema is not an object: {node}");
        };
        for forbidden in [
            "$ref",
            "oneOf",
            "anyOf",
            "allOf",
            "not",
            "definitions",
            "$defs",
            "const",
        ] {
            assert!(!map.contains_key(forbidden), "{path}: has {forbidden}");
        }
        let typed = map.contains_key("type")
            || map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
            || map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        assert!(typed, "{path}: no type");
        if let Some(Value::Object(properties)) = map.get("properties") {
            assert!(
                !map.contains_key("additionalProperties"),
                "{path}: properties and additionalProperties"
            );
            for (name, child) in properties {
                assert_structural(child, &format!("{path}.{name}"));
            }
        }
        if let Some(items) = map.get("items") {
            assert_structural(items, &format!("{path}[]"));
            if map.get("x-kubernetes-list-type") == Some(&Value::String("map".into())) {
                let keys = map["x-kubernetes-list-map-keys"]
                    .as_array()
                    .expect("list-map keys");
                let required = items["required"].as_array().cloned().unwrap_or_default();
                for key in keys {
                    let key_schema = &items["properties"][key.as_str().expect("key name")];
                    assert!(
                        !key_schema.is_null(),
                        "{path}: list-map key {key} is not a property"
                    );
                    assert!(
                        required.contains(key) || key_schema.get("default").is_some(),
                        "{path}: list-map key {key} is neither required nor defaulted"
                    );
                }
            }
        }
        if let Some(additional) = map.get("additionalProperties")
            && additional.is_object()
        {
            assert_structural(additional, &format!("{path}{{}}"));
        }
    }

    /// Size of the CRD as JSON; etcd refuses objects much above 1.5 MiB.
    pub fn assert_installable_size(crd: &CustomResourceDefinition) {
        let bytes = serde_json::to_vec(crd).expect("CRD serializes").len();
        assert!(
            bytes < 1_000_000,
            "{:?} is {bytes} bytes as JSON",
            crd.metadata.name
        );
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;
    use serde_json::json;

    use super::test_support::*;
    use super::*;

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
        assert!(
            schema_at(&schema, "status.desiredCPU")["x-kubernetes-int-or-string"] == json!(true)
        );
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

    #[test]
    fn strip_descriptions_keeps_properties_named_description() {
        let mut schema = json!({
            "description": "gone",
            "type": "object",
            "properties": {"description": {"type": "string", "description": "gone too"}},
            "default": {"description": "a value, kept"}
        });
        strip_descriptions(&mut schema);
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {"description": {"type": "string"}},
                "default": {"description": "a value, kept"}
            })
        );
    }
}
