//! The head group and the worker groups of a RayCluster: their Pod templates, Services,
//! ingress, scaling, and the autoscaler options.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvFromSource, EnvVar, PodTemplateSpec, ResourceRequirements, SecurityContext, Service,
    VolumeMount,
};
use k8s_openapi::api::networking::v1::IngressTLS;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::schema::{embedded_service, enum_schema, k8s_object_schema, k8s_schema};

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
