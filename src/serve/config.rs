//! The typed Ray Serve config (`ServeDeploySchema` -> applications -> deployments), as Ray 2.60
//! names it. Closed structs: Ray silently drops keys it does not know, so nothing here can emit
//! one, and reading refuses unknown keys. Optional fields are left out when unset, so Ray keeps
//! the values from code (and restores them when an override is later removed).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::graph::proto::{JsonObject, PipelineGraph};
use crate::graph::serde_support::wiring::{WiringText, into_wiring, same_wiring};

/// The whole Serve config: the body of `PUT /api/serve/applications/` and, as YAML, a
/// RayService's `spec.serveConfigV2`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// Where Serve runs HTTP proxies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_location: Option<ProxyLocation>,
    /// HTTP proxy options (honoured only when Serve first starts on a cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_options: Option<HttpOptions>,
    /// The applications; raypipe renders exactly one per pipeline.
    pub applications: Vec<Application>,
}

impl ServeConfig {
    /// YAML for `RayService.spec.serveConfigV2`. Deterministic: the same graph and options give
    /// byte-identical text.
    pub fn to_yaml(&self) -> String {
        match serde_yaml::to_string(self) {
            Ok(text) => text,
            // Unreachable for these types (string keys, no custom failing serializers); a YAML
            // comment keeps the failure visible instead of panicking in a controller.
            Err(e) => format!("# raypipe could not serialize the Serve config: {e}\n"),
        }
    }

    /// JSON for the dashboard's REST API (which does not accept YAML).
    pub fn to_json(&self) -> String {
        match serde_json::to_string(self) {
            Ok(text) => text,
            Err(e) => format!("{{\"error\": {:?}}}", e.to_string()),
        }
    }

    /// Reads a config written by [`ServeConfig::to_yaml`] (unknown keys are refused).
    pub fn from_yaml(text: &str) -> Result<Self, serde_yaml::Error> {
        serde_yaml::from_str(text)
    }
}

/// `proxy_location`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProxyLocation {
    Disabled,
    HeadOnly,
    EveryNode,
}

/// `http_options` (the fields raypipe sets).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// End-to-end HTTP timeout; at least the graph deadline, so Serve's 408 is only a backstop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_alive_timeout_s: Option<u32>,
}

/// One Serve application (`ServeApplicationSchema`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Application {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_prefix: Option<String>,
    /// The graph runtime's application builder.
    pub import_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_env: Option<RuntimeEnvConfig>,
    /// What the builder receives: the graph's wiring.
    pub args: RuntimeArgs,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deployments: Vec<Deployment>,
}

/// The application's `args`: what the graph runtime's builder reads.
///
/// Contract with the Python runtime (`api_version` "raypipe.v1"):
/// - `graph` is the pipeline in the text form documented in pipeline.proto, without what the
///   runtime does not need: deployment options (rendered under `deployments`, so changing them
///   updates deployments in place instead of changing `args`, which would rebuild the whole
///   application), the runtime environment, the route prefix and the executor's options;
/// - every MODEL node not listed in `fused_nodes` becomes a deployment named exactly after the
///   node (`Deployment.name`); the listed ones (sorted by name, see `serve::fuse`) run
///   in-process inside the executor's replicas and have no deployment (absent = none fused);
/// - the deployment that executes the graph per request (the ingress) is named
///   `executor_deployment`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeArgs {
    pub api_version: String,
    pub executor_deployment: String,
    pub graph: RuntimeGraph,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fused_nodes: Vec<String>,
}

/// The graph in `args`: shared with the validated graph (rendering copies nothing) and written
/// as its wiring only (see [`WiringText`]). Equality compares wiring.
#[derive(Debug, Clone)]
pub struct RuntimeGraph(Arc<PipelineGraph>);

impl RuntimeGraph {
    /// Wraps a shared graph.
    pub fn new(graph: Arc<PipelineGraph>) -> Self {
        RuntimeGraph(graph)
    }

    /// The whole graph (the wiring is what gets written).
    pub fn graph(&self) -> &PipelineGraph {
        &self.0
    }
}

impl PartialEq for RuntimeGraph {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || same_wiring(&self.0, &other.0)
    }
}

impl Serialize for RuntimeGraph {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WiringText(&self.0).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RuntimeGraph {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(RuntimeGraph(Arc::new(into_wiring(
            PipelineGraph::deserialize(deserializer)?,
        ))))
    }
}

/// `runtime_env` (the keys raypipe renders).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeEnvConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub py_modules: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pip: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env_vars: BTreeMap<String, String>,
}

impl RuntimeEnvConfig {
    /// True when nothing is set (then the key is left out).
    pub fn is_empty(&self) -> bool {
        self == &RuntimeEnvConfig::default()
    }
}

/// One deployment's overrides (`DeploymentSchema`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deployment {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_replicas: Option<NumReplicas>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ongoing_requests: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued_requests: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_config: Option<JsonObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling_config: Option<AutoscalingConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_shutdown_wait_loop_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_shutdown_timeout_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_period_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_timeout_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_actor_options: Option<RayActorOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas_per_node: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logging_config: Option<LoggingConfig>,
}

/// `num_replicas`: a count, or `"auto"` (autoscaling with Serve's defaults, overlaid by
/// `autoscaling_config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumReplicas {
    Count(u32),
    Auto,
}

impl Serialize for NumReplicas {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            NumReplicas::Count(n) => serializer.serialize_u32(*n),
            NumReplicas::Auto => serializer.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for NumReplicas {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u32),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Count(n) => Ok(NumReplicas::Count(n)),
            Raw::Text(text) if text == "auto" => Ok(NumReplicas::Auto),
            Raw::Text(text) => Err(serde::de::Error::custom(format_args!(
                "num_replicas must be a count or \"auto\", not {text:?}"
            ))),
        }
    }
}

/// `autoscaling_config`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscalingConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_replicas: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ongoing_requests: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upscale_delay_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downscale_delay_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downscale_to_zero_delay_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upscaling_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downscaling_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub look_back_period_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregation_function: Option<String>,
}

/// `ray_actor_options`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RayActorOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_gpus: Option<f64>,
    /// Bytes (validated whole, so written as an integer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_env: Option<RuntimeEnvConfig>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub label_selector: BTreeMap<String, String>,
}

/// `logging_config`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_access_log: Option<bool>,
}
