//! Shared node applications (docs/design/shared-nodes.md): one rendered graph version split
//! into a version application (the executor and the fused nodes, on the pipeline's route) and
//! one application per model node, named by a hash of what a replica of it is built from.
//!
//! Why: Serve restarts every deployment of an application when its `args` change, and other
//! applications keep their replicas (runtime/tests/test_serve_semantics_ray.py). So a node
//! application's `args` hold exactly what defines the node; the graph's wiring and the map from
//! node to node application travel in the executor's `user_config`, which Serve applies to
//! running replicas. A wiring-only change restarts nothing, a changed node restarts only its
//! own application, and two graph versions with the same node share its replicas.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Deployment, RenderError, ServeConfig};
use crate::graph::diff::{RolloutStarts, Starts};

/// The node application's builder in the graph runtime.
pub const NODE_IMPORT_PATH: &str = "raypipe_runtime.node_app:build";
/// Version of a node application's `args`.
pub const NODE_ARGS_API_VERSION: &str = "raypipe.node.v1";
/// `args.wiring` of a version application whose graph arrives in the executor's `user_config`.
pub const WIRING_IN_USER_CONFIG: &str = "user_config";
/// The key under which the executor's `user_config` carries raypipe's wiring.
pub const WIRING_KEY: &str = "raypipe";
/// Hex digits of the content key in a node application's name: `<base>--n<key>` stays within
/// Serve's 63 characters for every base a canary allows (`rollout::MAX_BASE_NAME`).
pub const NODE_KEY_DIGITS: usize = 11;

/// Deployment options Serve applies only by restarting the replica's actor: part of the key.
/// Everything else in a `deployments` entry (replicas, autoscaling, concurrency and queue
/// limits, `user_config`, health checks, logging) Serve applies in place, as
/// `graph::diff` classifies them.
const RESTART_OPTIONS: &[&str] = &["ray_actor_options", "max_replicas_per_node"];

/// Model fields that only the executor uses (how it calls the node), so not part of the key.
const CALLER_FIELDS: &[&str] = &["method", "call_style", "deployment", "fuse"];

/// How a pipeline's model nodes are laid out in Serve.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeLayout {
    /// Each model node is an application of its own, keyed by its content and shared by every
    /// graph version that uses it; the wiring is applied in place.
    #[default]
    Shared,
    /// Every node is a deployment of its graph version's application (raypipe 0.x's layout):
    /// any change to a version restarts all of its replicas.
    Inline,
}

/// One graph version laid out with shared nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedLayout {
    /// The version application (rendered name and route): the executor and the fused nodes.
    pub version: Value,
    /// Node applications by name, each with one deployment named after its node.
    pub nodes: BTreeMap<String, Value>,
}

/// A node application's name: `<base>--n<first NODE_KEY_DIGITS hex digits of its key>`.
pub fn node_application_name(base: &str, key: &str) -> String {
    let short: String = key.chars().take(NODE_KEY_DIGITS).collect();
    format!("{base}--n{short}")
}

/// The content key of a node application: SHA-256 (hex) over the canonical JSON of its import
/// path, runtime env, `args` and the restart-class options of its deployment.
pub fn node_key(application: &Value) -> String {
    let deployment = &application["deployments"][0];
    let restart: serde_json::Map<String, Value> = RESTART_OPTIONS
        .iter()
        .filter_map(|k| Some(((*k).to_owned(), deployment.get(*k)?.clone())))
        .collect();
    let keyed = json!({
        "import_path": application["import_path"],
        "runtime_env": application.get("runtime_env").cloned().unwrap_or(Value::Null),
        "args": application["args"],
        "restart": restart,
    });
    hex::encode(Sha256::digest(canonical_json(&keyed)))
}

/// JSON with object keys sorted at every level, whatever order the map keeps.
fn canonical_json(value: &Value) -> Vec<u8> {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let ordered: BTreeMap<&String, Value> =
                    map.iter().map(|(k, v)| (k, sorted(v))).collect();
                Value::Object(ordered.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_vec(&sorted(value)).unwrap_or_default()
}

/// Splits the single application of a rendered config into its shared layout. `base` names the
/// node applications (the pipeline's application base).
pub fn split(rendered: &ServeConfig, base: &str) -> Result<SharedLayout, RenderError> {
    let application = rendered
        .applications
        .first()
        .ok_or(RenderError::NoApplication)?;
    let mut version =
        serde_json::to_value(application).map_err(|e| RenderError::Layout(e.to_string()))?;
    let args = version["args"].take();
    let executor = args["executor_deployment"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let graph = &args["graph"];
    let fused: Vec<Value> = args["fused_nodes"].as_array().cloned().unwrap_or_default();
    let node_json = |name: &str| {
        graph["nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|n| n["name"].as_str() == Some(name)))
    };
    let runtime_env = version.get("runtime_env").cloned();
    let deployments = version["deployments"].take();
    let mut nodes = BTreeMap::new();
    let mut node_map = serde_json::Map::new();
    let mut executor_deployment = None;
    for deployment in deployments.as_array().into_iter().flatten() {
        let name = deployment["name"].as_str().unwrap_or_default();
        if name == executor {
            executor_deployment = Some(deployment.clone());
            continue;
        }
        let model = node_json(name)
            .and_then(|n| n["model"].as_object())
            .ok_or_else(|| RenderError::Layout(format!("deployment {name:?} is no model node")))?;
        let definition: serde_json::Map<String, Value> = model
            .iter()
            .filter(|(k, _)| !CALLER_FIELDS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut node_app = json!({
            "name": "",
            "route_prefix": null,
            "import_path": NODE_IMPORT_PATH,
            "args": {"api_version": NODE_ARGS_API_VERSION, "node": name, "model": definition},
            "deployments": [deployment],
        });
        if let Some(env) = &runtime_env {
            node_app["runtime_env"] = env.clone();
        }
        let app_name = node_application_name(base, &node_key(&node_app));
        node_app["name"] = Value::String(app_name.clone());
        node_map.insert(name.to_owned(), Value::String(app_name.clone()));
        nodes.insert(app_name, node_app);
    }
    let mut executor_deployment = executor_deployment
        .ok_or_else(|| RenderError::Layout(format!("no executor deployment {executor:?}")))?;
    if executor_deployment.get("user_config").is_some() {
        return Err(RenderError::ExecutorUserConfig);
    }
    let fused_definitions: Vec<Value> = fused
        .iter()
        .filter_map(|name| node_json(name.as_str()?).cloned())
        .collect();
    executor_deployment["user_config"] = json!({
        WIRING_KEY: {
            "graph": graph,
            "fused_nodes": fused,
            "node_applications": node_map,
        }
    });
    version["args"] = json!({
        "api_version": args["api_version"],
        "executor_deployment": executor,
        "wiring": WIRING_IN_USER_CONFIG,
        "fused": fused_definitions,
    });
    version["deployments"] = json!([executor_deployment]);
    Ok(SharedLayout { version, nodes })
}

impl SharedLayout {
    /// The applications: the version application first, then the node applications by name.
    pub fn applications(&self) -> Vec<Value> {
        std::iter::once(self.version.clone())
            .chain(self.nodes.values().cloned())
            .collect()
    }
}

/// A rendered config laid out with shared nodes, as the dashboard's REST body: the rendered
/// top-level options with the version and node applications.
pub fn config_json(rendered: &ServeConfig, base: &str) -> Result<Value, RenderError> {
    let layout = split(rendered, base)?;
    Ok(super::rollout::compose(
        super::rollout::rendered_options(rendered),
        layout.applications(),
    ))
}

/// What a rollout from `old` (absent: nothing runs yet) to `new` starts with shared nodes:
/// the replicas of every node application whose key is new; with Immediate also the
/// executor's when its application's `args` (the fused nodes) or `runtime_env` change, with
/// Canary always (the canary's version application is new). `None` when either side cannot
/// be laid out.
pub fn layout_starts(old: Option<&ServeConfig>, new: &ServeConfig) -> Option<RolloutStarts> {
    let base = "starts";
    let new = split(new, base).ok()?;
    let old = match old {
        Some(old) => Some(split(old, base).ok()?),
        None => None,
    };
    let mut nodes = Starts::default();
    for (name, app) in &new.nodes {
        if old.as_ref().is_none_or(|o| !o.nodes.contains_key(name)) {
            nodes.add(starts_of(&app["deployments"][0]));
        }
    }
    let executor = starts_of(&new.version["deployments"][0]);
    let executor_restarts = old.as_ref().is_none_or(|o| {
        o.version["args"] != new.version["args"]
            || o.version["runtime_env"] != new.version["runtime_env"]
    });
    let mut starts = RolloutStarts {
        immediate: nodes,
        canary: nodes,
    };
    starts.canary.add(executor);
    if executor_restarts {
        starts.immediate.add(executor);
    }
    Some(starts)
}

fn starts_of(deployment: &Value) -> Starts {
    serde_json::from_value::<Deployment>(deployment.clone())
        .map(|d| super::starts::replicas_started(&d))
        .unwrap_or(Starts {
            replicas: 1,
            gpus: 0.0,
        })
}

/// The node applications a version application's executor names (node → application), read
/// back from a config (empty for a version application that is not laid out shared).
pub fn node_map(version: &Value) -> BTreeMap<String, String> {
    let executor = version["args"]["executor_deployment"].as_str();
    version["deployments"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["name"].as_str() == executor)
        .filter_map(|d| d["user_config"][WIRING_KEY]["node_applications"].as_object())
        .flatten()
        .filter_map(|(node, app)| Some((node.clone(), app.as_str()?.to_owned())))
        .collect()
}

/// Whether an application is a shared node application.
pub fn is_node_application(application: &Value) -> bool {
    application["import_path"].as_str() == Some(NODE_IMPORT_PATH)
}
