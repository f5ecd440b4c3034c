//! The RayCluster kind and its spec: the cluster-wide options (TLS, upgrade strategy,
//! authentication, GCS fault tolerance, history server, network policy), in KubeRay's Go struct
//! order (the order matters to the spec hash of `reference/kuberay-spec.md` §0.5).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ResourceRequirements};
use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyIngressRule};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::schema::{enum_schema, k8s_schema, managed_by_schema};

use super::groups::{AutoscalerOptions, HeadGroupSpec, WorkerGroupSpec};
use super::status::RayClusterStatus;

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
