//! Rendering a validated graph into one Serve application.

use std::collections::BTreeMap;

use super::RenderError;
use super::config::{
    Application, AutoscalingConfig, Deployment, HttpOptions, LoggingConfig, NumReplicas,
    ProxyLocation, RayActorOptions, RuntimeArgs, RuntimeEnvConfig, RuntimeGraph, ServeConfig,
};
use super::fuse;
use crate::graph::options::{
    AUTO_TARGET_ONGOING_REQUESTS, SERVE_DEFAULT_MAX_ONGOING_REQUESTS, check_import_path,
    is_remote_uri,
};
use crate::graph::proto::{self, ModelNode, Node, node};
use crate::graph::{ValidatedGraph, check_route_prefix};

/// Import path of the graph runtime's application builder.
pub const DEFAULT_RUNTIME_IMPORT_PATH: &str = "raypipe_runtime.app:build";
/// Name of the deployment that executes the graph (the application's ingress).
pub const DEFAULT_EXECUTOR_DEPLOYMENT: &str = "raypipe-executor";
/// Version of the `args` contract between raypipe and its runtime.
pub const RUNTIME_ARGS_API_VERSION: &str = "raypipe.v1";
/// Application name when neither the options nor the graph give one.
pub const DEFAULT_APPLICATION_NAME: &str = "default";
/// A model node's default `max_queued_requests`, per request one of its replicas takes at once
/// (`max_ongoing_requests`). Serve queues at each caller (here: each executor replica) what no
/// replica can take yet, and by default without bound, so overload turned into seconds of
/// latency. Four times a replica's concurrency absorbs a burst, yet a queued call starts within
/// about four service times of one replica (sooner with more replicas); beyond that the node
/// rejects at once and the runtime answers 503 BACKPRESSURE naming it, with `Retry-After`.
/// The graph's own `max_queued_requests` wins (-1 keeps Serve's unbounded queue).
pub const DEFAULT_QUEUED_PER_ONGOING_REQUEST: u32 = 4;

/// Everything besides the graph that shapes the Serve config.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderOptions {
    /// Serve application name; default: the graph's name, else "default".
    pub application_name: Option<String>,
    /// Route prefix; default: the graph's, else "/".
    pub route_prefix: Option<String>,
    /// The graph runtime's builder.
    pub runtime_import_path: String,
    /// URIs of the runtime's package(s), appended to the application's `py_modules`.
    pub runtime_py_modules: Vec<String>,
    /// URIs of the graph version's own code (the code layer of its artifact, served by the
    /// operator), added to the graph application's `py_modules` before the runtime's. Not
    /// given to a canary's router, whose `runtime_env` must never change.
    pub code_py_modules: Vec<String>,
    /// Deployment name of the executor (must not be a model node's name).
    pub executor_deployment: String,
    /// `http_options.request_timeout_s`; must be at least the graph's deadline.
    pub request_timeout_s: Option<f64>,
    /// `http_options.keep_alive_timeout_s`.
    pub keep_alive_timeout_s: Option<i32>,
    /// `http_options.host` (e.g. 127.0.0.1 for a local Ray).
    pub http_host: Option<String>,
    /// `http_options.port`.
    pub http_port: Option<u16>,
    /// `proxy_location`.
    pub proxy_location: Option<ProxyLocation>,
    /// Per-node overrides by node name (model nodes only).
    pub node_overrides: BTreeMap<String, NodeOverride>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            application_name: None,
            route_prefix: None,
            runtime_import_path: DEFAULT_RUNTIME_IMPORT_PATH.to_string(),
            runtime_py_modules: Vec::new(),
            code_py_modules: Vec::new(),
            executor_deployment: DEFAULT_EXECUTOR_DEPLOYMENT.to_string(),
            request_timeout_s: None,
            keep_alive_timeout_s: None,
            http_host: None,
            http_port: None,
            proxy_location: None,
            node_overrides: BTreeMap::new(),
        }
    }
}

/// What an operator may override per node, whatever the graph says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeOverride {
    /// Pins the replica count (autoscaling of that node is then off).
    pub num_replicas: Option<i32>,
    /// Per-replica cap on in-flight requests.
    pub max_ongoing_requests: Option<i32>,
}

/// Renders a validated graph as a Serve config with one application. Pure and deterministic.
pub fn render(graph: &ValidatedGraph, opts: &RenderOptions) -> Result<ServeConfig, RenderError> {
    let pipeline = graph.graph();

    let name = opts
        .application_name
        .clone()
        .or_else(|| (!pipeline.name.is_empty()).then(|| pipeline.name.clone()))
        .unwrap_or_else(|| DEFAULT_APPLICATION_NAME.to_string());
    check_serve_name(&name).map_err(|problem| RenderError::InvalidApplicationName {
        name: name.clone(),
        problem,
    })?;

    let route_prefix = opts
        .route_prefix
        .clone()
        .or_else(|| (!pipeline.route_prefix.is_empty()).then(|| pipeline.route_prefix.clone()))
        .unwrap_or_else(|| "/".to_string());
    check_route_prefix(&route_prefix).map_err(|problem| RenderError::InvalidRoutePrefix {
        prefix: route_prefix.clone(),
        problem,
    })?;

    check_import_path(&opts.runtime_import_path).map_err(|problem| {
        RenderError::InvalidRuntimeImportPath {
            path: opts.runtime_import_path.clone(),
            problem,
        }
    })?;
    if let Some(uri) = opts
        .runtime_py_modules
        .iter()
        .chain(&opts.code_py_modules)
        .find(|uri| !is_remote_uri(uri))
    {
        return Err(RenderError::InvalidRuntimeModule { uri: uri.clone() });
    }

    check_serve_name(&opts.executor_deployment).map_err(|problem| {
        RenderError::InvalidExecutorName {
            name: opts.executor_deployment.clone(),
            problem,
        }
    })?;
    if graph
        .model_nodes()
        .any(|n| n.name == opts.executor_deployment)
    {
        return Err(RenderError::ExecutorNameCollision {
            name: opts.executor_deployment.clone(),
        });
    }

    let http_options = http_options(opts, graph.deadline_ms())?;

    for (node_name, override_) in &opts.node_overrides {
        check_override(graph, node_name, override_)?;
    }

    // Fused nodes run inside the executor: no deployment of their own.
    let fusion = fuse::plan(pipeline, opts.node_overrides.keys());

    // Sorted by name. The (small) references are sorted, not the (large) deployments.
    let mut models: Vec<(&Node, &ModelNode)> = graph
        .model_nodes()
        .filter(|node| !fusion.is_fused(&node.name))
        .filter_map(|node| match &node.kind {
            Some(node::Kind::Model(model)) => Some((node, model)),
            _ => None,
        })
        .collect();
    models.sort_unstable_by(|a, b| a.0.name.cmp(&b.0.name));
    let executor_at = models.partition_point(|(node, _)| node.name < opts.executor_deployment);
    let mut deployments: Vec<Deployment> = Vec::with_capacity(models.len() + 1);
    for (position, (node, model)) in models.iter().enumerate() {
        if position == executor_at {
            deployments.push(executor_deployment(opts, pipeline));
        }
        deployments.push(model_deployment(
            node,
            model,
            opts.node_overrides.get(&node.name),
        ));
    }
    if executor_at == models.len() {
        deployments.push(executor_deployment(opts, pipeline));
    }

    let runtime_env = application_runtime_env(
        pipeline.runtime_env.as_ref(),
        opts.code_py_modules.iter().chain(&opts.runtime_py_modules),
    );
    if let Some(application_env) = &runtime_env {
        keep_application_modules(&mut deployments, &application_env.py_modules);
    }
    let application = Application {
        name,
        route_prefix: Some(route_prefix),
        import_path: opts.runtime_import_path.clone(),
        runtime_env,
        args: RuntimeArgs {
            api_version: RUNTIME_ARGS_API_VERSION.to_string(),
            executor_deployment: opts.executor_deployment.clone(),
            graph: RuntimeGraph::new(graph.shared_graph()),
            fused_nodes: fusion.fused.into_iter().collect(),
        },
        deployments,
    };
    Ok(ServeConfig {
        proxy_location: opts.proxy_location,
        http_options,
        applications: vec![application],
    })
}

/// The executor's concurrency when the graph sets none: the graph runtime's own default
/// (`EXECUTOR_MAX_ONGOING_REQUESTS` in `runtime/raypipe_runtime/app.py`; a unit test keeps the
/// two equal). The executor mostly waits on its nodes, so it takes many requests at once.
pub const EXECUTOR_MAX_ONGOING_REQUESTS: u32 = 100;

/// The executor (the application's ingress, which also runs the fused nodes) gets the same
/// bounded queue by default as a model node: requests the proxy cannot hand to a replica are
/// turned away with Serve's 503 instead of queueing without limit at the proxy, which is what
/// overload of a fused pipeline did. Its concurrency is written out, so the queue's size
/// follows from what the config says. `graph.executor.max_queued_requests` wins (-1: unbounded).
fn executor_deployment(opts: &RenderOptions, graph: &proto::PipelineGraph) -> Deployment {
    let mut deployment =
        deployment_from_options(opts.executor_deployment.clone(), graph.executor.as_ref());
    deployment
        .max_ongoing_requests
        .get_or_insert(EXECUTOR_MAX_ONGOING_REQUESTS);
    if deployment.max_queued_requests.is_none() {
        deployment.max_queued_requests =
            Some(default_max_queued_requests(deployment.max_ongoing_requests));
    }
    deployment
}

/// Names Serve and Kubernetes status both handle well: 1 to 63 of [A-Za-z0-9_.-], no '#'.
fn check_serve_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.len() > 63 {
        return Err("is longer than 63 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return Err("contains characters other than letters, digits, '_', '.' and '-'");
    }
    Ok(())
}

fn http_options(
    opts: &RenderOptions,
    deadline_ms: u32,
) -> Result<Option<HttpOptions>, RenderError> {
    if let Some(timeout) = opts.request_timeout_s {
        if !timeout.is_finite() || timeout <= 0.0 {
            return Err(RenderError::InvalidHttpOption {
                field: "request_timeout_s",
                problem: format!("is {timeout}; it must be greater than 0"),
            });
        }
        if timeout * 1000.0 < f64::from(deadline_ms) {
            return Err(RenderError::RequestTimeoutBelowDeadline {
                request_timeout_s: timeout,
                deadline_ms,
            });
        }
    }
    let keep_alive = match opts.keep_alive_timeout_s {
        None => None,
        Some(k) if k > 0 => Some(k as u32),
        Some(k) => {
            return Err(RenderError::InvalidHttpOption {
                field: "keep_alive_timeout_s",
                problem: format!("is {k}; it must be greater than 0"),
            });
        }
    };
    if opts.http_port == Some(0) {
        return Err(RenderError::InvalidHttpOption {
            field: "port",
            problem: "is 0".into(),
        });
    }
    if let Some(host) = &opts.http_host
        && (host.is_empty() || host.chars().any(char::is_whitespace))
    {
        return Err(RenderError::InvalidHttpOption {
            field: "host",
            problem: format!("is {host:?}, not a host"),
        });
    }
    let options = HttpOptions {
        host: opts.http_host.clone(),
        port: opts.http_port,
        request_timeout_s: opts.request_timeout_s,
        keep_alive_timeout_s: keep_alive,
    };
    Ok((options != HttpOptions::default()).then_some(options))
}

fn check_override(
    graph: &ValidatedGraph,
    node_name: &str,
    override_: &NodeOverride,
) -> Result<(), RenderError> {
    let node = graph
        .node(node_name)
        .ok_or_else(|| RenderError::UnknownOverrideNode {
            name: node_name.to_string(),
        })?;
    let Some(node::Kind::Model(model)) = &node.kind else {
        return Err(RenderError::OverrideNotModel {
            name: node_name.to_string(),
        });
    };
    let invalid = |field: &'static str, problem: String| RenderError::InvalidOverride {
        node: node_name.to_string(),
        field,
        problem,
    };
    if let Some(n) = override_.num_replicas
        && n < 1
    {
        return Err(invalid(
            "num_replicas",
            format!("is {n}; it must be at least 1"),
        ));
    }
    if let Some(n) = override_.max_ongoing_requests {
        if n < 1 {
            return Err(invalid(
                "max_ongoing_requests",
                format!("is {n}; it must be at least 1"),
            ));
        }
        // Only matters while the node still autoscales (a pinned count turns autoscaling off).
        let autoscaling = model
            .deployment
            .as_ref()
            .and_then(|d| d.autoscaling_config.as_ref());
        if let (Some(autoscaling), None) = (autoscaling, override_.num_replicas) {
            let target = autoscaling
                .target_ongoing_requests
                .unwrap_or(AUTO_TARGET_ONGOING_REQUESTS);
            if f64::from(n) < target {
                return Err(invalid(
                    "max_ongoing_requests",
                    format!(
                        "({n}) is below the node's autoscaling target_ongoing_requests ({target}), so it would never scale up"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn model_deployment(
    node: &Node,
    model: &ModelNode,
    override_: Option<&NodeOverride>,
) -> Deployment {
    let mut deployment = deployment_from_options(node.name.clone(), model.deployment.as_deref());
    if let Some(override_) = override_ {
        if let Some(n) = override_.num_replicas {
            deployment.num_replicas = Some(NumReplicas::Count(positive(n)));
            deployment.autoscaling_config = None;
        }
        if let Some(n) = override_.max_ongoing_requests {
            deployment.max_ongoing_requests = Some(positive(n));
        }
    }
    if deployment.max_queued_requests.is_none() {
        deployment.max_queued_requests =
            Some(default_max_queued_requests(deployment.max_ongoing_requests));
    }
    deployment
}

/// The bounded queue a model node gets when its graph sets none (see
/// [`DEFAULT_QUEUED_PER_ONGOING_REQUEST`]); Serve's own default concurrency when unset.
fn default_max_queued_requests(max_ongoing_requests: Option<u32>) -> i32 {
    let ongoing = max_ongoing_requests.unwrap_or(SERVE_DEFAULT_MAX_ONGOING_REQUESTS.unsigned_abs());
    i32::try_from(ongoing.saturating_mul(DEFAULT_QUEUED_PER_ONGOING_REQUEST)).unwrap_or(i32::MAX)
}

/// Validated counts are positive; the clamp only keeps the conversion total.
fn positive(n: i32) -> u32 {
    n.max(1) as u32
}

fn non_negative(n: i32) -> u32 {
    n.max(0) as u32
}

fn deployment_from_options(name: String, options: Option<&proto::DeploymentOptions>) -> Deployment {
    let Some(options) = options else {
        return Deployment {
            name,
            ..Deployment::default()
        };
    };
    let num_replicas = match (&options.autoscaling_config, options.num_replicas) {
        (Some(_), _) => Some(NumReplicas::Auto),
        (None, Some(n)) => Some(NumReplicas::Count(positive(n))),
        (None, None) => None,
    };
    Deployment {
        name,
        num_replicas,
        max_ongoing_requests: options.max_ongoing_requests.map(positive),
        max_queued_requests: options.max_queued_requests,
        user_config: options.user_config.clone(),
        autoscaling_config: options
            .autoscaling_config
            .as_ref()
            .map(|a| AutoscalingConfig {
                min_replicas: a.min_replicas.map(non_negative),
                max_replicas: a.max_replicas.map(positive),
                initial_replicas: a.initial_replicas.map(non_negative),
                target_ongoing_requests: a.target_ongoing_requests,
                upscale_delay_s: a.upscale_delay_s,
                downscale_delay_s: a.downscale_delay_s,
                downscale_to_zero_delay_s: a.downscale_to_zero_delay_s,
                upscaling_factor: a.upscaling_factor,
                downscaling_factor: a.downscaling_factor,
                look_back_period_s: a.look_back_period_s,
                aggregation_function: non_empty(&a.aggregation_function),
            }),
        graceful_shutdown_wait_loop_s: options.graceful_shutdown_wait_loop_s,
        graceful_shutdown_timeout_s: options.graceful_shutdown_timeout_s,
        health_check_period_s: options.health_check_period_s,
        health_check_timeout_s: options.health_check_timeout_s,
        ray_actor_options: options.ray_actor_options.as_ref().map(|a| RayActorOptions {
            num_cpus: a.num_cpus,
            num_gpus: a.num_gpus,
            memory: a.memory.map(|m| m.max(0.0) as u64),
            resources: a.resources.clone(),
            accelerator_type: non_empty(&a.accelerator_type),
            runtime_env: a
                .runtime_env
                .as_ref()
                .map(runtime_env)
                .filter(|env| !env.is_empty()),
            label_selector: a.label_selector.clone(),
        }),
        max_replicas_per_node: options.max_replicas_per_node.map(positive),
        logging_config: options.logging_config.as_ref().map(|l| LoggingConfig {
            encoding: non_empty(&l.encoding),
            log_level: non_empty(&l.log_level),
            enable_access_log: l.enable_access_log,
        }),
    }
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

fn runtime_env(env: &proto::RuntimeEnv) -> RuntimeEnvConfig {
    RuntimeEnvConfig {
        working_dir: non_empty(&env.working_dir),
        py_modules: env.py_modules.clone(),
        pip: env.pip.clone(),
        env_vars: env.env_vars.clone(),
    }
}

/// Serve merges a deployment's own `runtime_env` over its application's key by key
/// (`override_runtime_envs_except_env_vars`: only `env_vars` are combined), so a node (or the
/// executor) that names `py_modules` of its own would lose the application's: the graph's
/// modules, the version's code layer and the runtime's package, and its class could no longer
/// be imported. A deployment's own modules therefore come first and the application's follow,
/// without duplicates: a node's `py_modules` adds to the graph's.
fn keep_application_modules(deployments: &mut [Deployment], application_modules: &[String]) {
    let own_envs = deployments
        .iter_mut()
        .filter_map(|d| d.ray_actor_options.as_mut()?.runtime_env.as_mut())
        .filter(|env| !env.py_modules.is_empty());
    for env in own_envs {
        for module in application_modules {
            if !env.py_modules.contains(module) {
                env.py_modules.push(module.clone());
            }
        }
    }
}

/// The graph's environment plus its code and the runtime's package(s), without duplicates,
/// graph's first.
fn application_runtime_env<'a>(
    env: Option<&proto::RuntimeEnv>,
    runtime_modules: impl IntoIterator<Item = &'a String>,
) -> Option<RuntimeEnvConfig> {
    let mut merged = env.map(runtime_env).unwrap_or_default();
    for module in runtime_modules {
        if !merged.py_modules.contains(module) {
            merged.py_modules.push(module.clone());
        }
    }
    (!merged.is_empty()).then_some(merged)
}
