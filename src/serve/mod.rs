//! The typed Ray Serve config and its rendering from a validated graph.
//!
//! One application per pipeline: `import_path` = the graph runtime's builder, `args` = the
//! graph's wiring (see [`RuntimeArgs`]), `deployments` = per-node options named by node plus the
//! executor (model nodes that fuse into the executor, see [`fuse`], get none), `runtime_env` =
//! the graph's environment plus the runtime package. What Ray would
//! only reject after accepting the config (route prefix shape, deployment names, autoscaling
//! numbers) is checked here or in graph validation, so a bad graph never reaches a cluster.

mod config;
pub mod fuse;
pub mod fuzzing;
mod render;
pub mod rollout;
pub mod shared;
mod starts;

#[cfg(test)]
mod tests;

pub use config::{
    Application, AutoscalingConfig, Deployment, HttpOptions, LoggingConfig, NumReplicas,
    ProxyLocation, RayActorOptions, RuntimeArgs, RuntimeEnvConfig, RuntimeGraph, ServeConfig,
};
pub use render::{
    DEFAULT_APPLICATION_NAME, DEFAULT_EXECUTOR_DEPLOYMENT, DEFAULT_RUNTIME_IMPORT_PATH,
    EXECUTOR_MAX_ONGOING_REQUESTS, NodeOverride, RUNTIME_ARGS_API_VERSION, RenderOptions, render,
};
pub use starts::rollout_starts;

/// Environment raypipe gives every Ray process that serves a pipeline (each Ray container of
/// a ServePipeline's cluster, and `raypipe dev`'s local head) unless the user sets the
/// variable. Each value is Serve's own default in its default mode, so none changes anything
/// there; together they make opting into Ray 2.60's throughput-optimised mode
/// (`RAY_SERVE_THROUGHPUT_OPTIMIZED=1`, an `env` entry) safe:
///
/// - the handle router stays on a loop of its own. Throughput mode moves it onto the
///   replica's loop, and then a node's bounded queue (`max_queued_requests`, which raypipe
///   renders by default) let requests wait past its bound: in the overload test
///   (runtime/tests/test_ray_serve.py: 40 requests at once at a node that admits 25, so 15
///   must get a 503 at once) only 3 to 14 were turned away in 12 of 15 runs with the router
///   on the replica's loop, and all 15 in each of 8 runs with the router on its own loop,
///   with gRPC between replicas or not (BENCHMARKS.md);
/// - direct ingress stays off: in Ray 2.60 it forces `proxy_location: HeadOnly` (all HTTP of a
///   cluster would enter through the head Pod, whatever the Serve config says);
/// - the 4 MiB cap the gRPC transport puts on a handle call's message on both ends (an
///   object-store call has none) is lifted to gRPC's own limit (2 GiB - 1, as Serve's proxy
///   has).
///
/// HAProxy mode (`RAY_SERVE_ENABLE_HA_PROXY`) stays off: in Ray 2.60 it binds its stats and
/// metrics ports on every interface with no host setting, and forces the replicas' HTTP host
/// to every interface too.
pub const SERVE_ENV_DEFAULTS: &[(&str, &str)] = &[
    ("RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP", "1"),
    ("RAY_SERVE_ENABLE_DIRECT_INGRESS", "0"),
    ("RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH", "2147483647"),
];

/// Why a valid graph could not be rendered with the given options.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RenderError {
    #[error("application name {name:?} {problem}")]
    InvalidApplicationName { name: String, problem: &'static str },
    #[error("route prefix {prefix:?} {problem}")]
    InvalidRoutePrefix {
        prefix: String,
        problem: &'static str,
    },
    #[error("runtime import path {path:?} {problem}")]
    InvalidRuntimeImportPath { path: String, problem: String },
    #[error(
        "runtime package {uri:?} is not a URI the cluster can fetch (https://..., s3://..., gs://...)"
    )]
    InvalidRuntimeModule { uri: String },
    #[error("executor deployment name {name:?} {problem}")]
    InvalidExecutorName { name: String, problem: &'static str },
    #[error("a model node is named {name:?}, the name of the executor deployment; rename the node")]
    ExecutorNameCollision { name: String },
    #[error("an override names node {name:?}, which is not in the graph")]
    UnknownOverrideNode { name: String },
    #[error(
        "an override names node {name:?}, which is not a model node (only models are deployments)"
    )]
    OverrideNotModel { name: String },
    #[error("override of node {node:?}: {field} {problem}")]
    InvalidOverride {
        node: String,
        field: &'static str,
        problem: String,
    },
    #[error("http_options.{field} {problem}")]
    InvalidHttpOption {
        field: &'static str,
        problem: String,
    },
    #[error(
        "http_options.request_timeout_s ({request_timeout_s} s) is shorter than the graph's deadline ({deadline_ms} ms); Serve would cut requests the graph still allows"
    )]
    RequestTimeoutBelowDeadline {
        request_timeout_s: f64,
        deadline_ms: u32,
    },
    #[error("the graph rendered no application")]
    NoApplication,
    #[error("laying out shared node applications: {0}")]
    Layout(String),
    #[error(
        "executor.user_config is set; with shared node applications the executor's user_config carries the graph's wiring"
    )]
    ExecutorUserConfig,
}

impl RenderError {
    /// Stable machine reason code.
    pub fn reason(&self) -> &'static str {
        match self {
            RenderError::InvalidApplicationName { .. } => "InvalidApplicationName",
            RenderError::InvalidRoutePrefix { .. } => "InvalidRoutePrefix",
            RenderError::InvalidRuntimeImportPath { .. }
            | RenderError::InvalidRuntimeModule { .. } => "InvalidRuntime",
            RenderError::InvalidExecutorName { .. } | RenderError::ExecutorNameCollision { .. } => {
                "InvalidExecutorName"
            }
            RenderError::UnknownOverrideNode { .. }
            | RenderError::OverrideNotModel { .. }
            | RenderError::InvalidOverride { .. } => "InvalidOverride",
            RenderError::InvalidHttpOption { .. }
            | RenderError::RequestTimeoutBelowDeadline { .. } => "InvalidHttpOptions",
            RenderError::NoApplication | RenderError::Layout(_) => "RenderFailed",
            RenderError::ExecutorUserConfig => "InvalidOptions",
        }
    }
}
