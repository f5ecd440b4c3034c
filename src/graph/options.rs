//! Checks of what Ray would otherwise only reject at deploy time (or silently misapply):
//! deployment options, resources, runtime environments, import paths.

use super::proto::{
    AutoscalingConfig, DeploymentOptions, LoggingConfig, ModelNode, PipelineGraph, RayActorOptions,
    RuntimeEnv, node,
};
use super::validate::json_value_is_finite;

/// Serve's defaults that interact with the checks below.
pub const SERVE_DEFAULT_MAX_ONGOING_REQUESTS: i32 = 5;
/// Defaults of `num_replicas: auto`.
pub const AUTO_MIN_REPLICAS: i32 = 1;
pub const AUTO_MAX_REPLICAS: i32 = 100;
pub const AUTO_TARGET_ONGOING_REQUESTS: f64 = 2.0;

/// Whether a model node, by what the graph says of it alone, may run fused (in-process in the
/// executor's replicas): its `fuse` is not false and it declares no deployment options. Every
/// deployment option (replicas, autoscaling, concurrency and queue limits, `user_config`,
/// health checks, resources, accelerators, its own runtime environment, placement, logging)
/// only means something for a deployment of its own, so declaring any keeps the node one.
/// Operator overrides and the graph-wide switch are applied on top (`serve::fuse`).
pub fn may_fuse(model: &ModelNode) -> bool {
    model.fuse != Some(false)
        && model
            .deployment
            .as_deref()
            .is_none_or(|options| *options == DeploymentOptions::default())
}

/// The names of the model nodes the graph lets fuse (declaration order): none when the
/// graph-wide `fuse` is false, else those [`may_fuse`] allows.
pub fn fusable_nodes(graph: &PipelineGraph) -> impl Iterator<Item = &str> {
    let on = graph.fuse != Some(false);
    graph
        .nodes
        .iter()
        .filter(move |node| {
            on && matches!(&node.kind, Some(node::Kind::Model(model)) if may_fuse(model))
        })
        .map(|node| node.name.as_str())
}

/// Longest import path accepted.
const MAX_IMPORT_PATH_LEN: usize = 512;

/// Python keywords: not usable as identifiers in import paths or keyword arguments.
const PYTHON_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// An ASCII Python identifier that is not a keyword.
pub fn is_python_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    let Some(first) = bytes.next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || first == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !PYTHON_KEYWORDS.contains(&name)
}

fn is_dotted_identifiers(text: &str) -> bool {
    !text.is_empty() && text.split('.').all(is_python_identifier)
}

/// `package.module:Class` or `package.module.Class` (Ray's two accepted shapes).
pub fn check_import_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("is empty".into());
    }
    if path.len() > MAX_IMPORT_PATH_LEN {
        return Err(format!("is longer than {MAX_IMPORT_PATH_LEN} characters"));
    }
    match path.split_once(':') {
        Some((module, attribute)) => {
            if attribute.contains(':') {
                return Err("has more than one ':'".into());
            }
            if !is_dotted_identifiers(module) {
                return Err(format!(
                    "has the module {module:?}, which is not a dotted Python name"
                ));
            }
            if !is_dotted_identifiers(attribute) {
                return Err(format!(
                    "has the attribute {attribute:?}, which is not a Python name"
                ));
            }
        }
        None => {
            if !path.contains('.') {
                return Err("names no module (no ':' and no '.')".into());
            }
            if !is_dotted_identifiers(path) {
                return Err("is not a dotted Python name".into());
            }
        }
    }
    Ok(())
}

/// A URI Ray can fetch: `scheme://rest`, never a bare path (the cluster cannot read the
/// operator's disk).
pub fn is_remote_uri(uri: &str) -> bool {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return false;
    };
    let mut scheme_bytes = scheme.bytes();
    scheme_bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && scheme_bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'.' | b'-'))
        && !rest.is_empty()
        && !uri.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Problems of a runtime environment, as sentences.
pub fn runtime_env_problems(env: &RuntimeEnv) -> Vec<String> {
    let mut problems = Vec::new();
    if !env.working_dir.is_empty() && !is_remote_uri(&env.working_dir) {
        problems.push(format!(
            "working_dir {:?} is not a URI; give a zip the cluster can fetch (https://..., s3://..., gs://...) or local:// for a directory on every node",
            env.working_dir
        ));
    }
    for module in &env.py_modules {
        if !is_remote_uri(module) {
            problems.push(format!(
                "py_modules entry {module:?} is not a URI; give a zip or wheel the cluster can fetch (https://..., s3://..., gs://...)"
            ));
        }
    }
    for requirement in &env.pip {
        if requirement.trim().is_empty() || requirement.contains(['\n', '\r']) {
            problems.push(format!(
                "pip entry {requirement:?} is not a requirement line"
            ));
        }
    }
    for name in env.env_vars.keys() {
        if name.is_empty() || name.contains(['=', '\0']) {
            problems.push(format!(
                "env_vars has the name {name:?}; names are non-empty and contain no '='"
            ));
        }
    }
    problems
}

/// Ray's rule for resource quantities: at least 0, a fraction no finer than 0.0001, and whole
/// when 1 or more for unit-instance resources (GPUs, where a fraction of a second card cannot
/// be granted).
fn resource_problem(quantity: f64, whole_above_one: bool) -> Option<String> {
    if !quantity.is_finite() {
        return Some(format!("is {quantity}, not a finite number"));
    }
    if quantity < 0.0 {
        return Some(format!("is {quantity}, less than 0"));
    }
    if quantity > 0.0 && quantity < 0.0001 {
        return Some(format!(
            "is {quantity}, finer than Ray's precision of 0.0001"
        ));
    }
    if whole_above_one && quantity >= 1.0 && quantity.fract() != 0.0 {
        return Some(format!(
            "is {quantity}; a fraction is allowed below 1 (a share of one card), above 1 it must be a whole number"
        ));
    }
    None
}

type Found = Vec<(String, String)>;

fn push(found: &mut Found, field: &str, problem: impl Into<String>) {
    found.push((field.to_string(), problem.into()));
}

// Field names are built only when there is a problem: valid options allocate nothing.
fn check_positive(found: &mut Found, field: impl FnOnce() -> String, value: Option<f64>) {
    if let Some(v) = value
        && (!v.is_finite() || v <= 0.0)
    {
        push(
            found,
            &field(),
            format!("is {v}; it must be greater than 0"),
        );
    }
}

fn check_non_negative(found: &mut Found, field: impl FnOnce() -> String, value: Option<f64>) {
    if let Some(v) = value
        && (!v.is_finite() || v < 0.0)
    {
        push(found, &field(), format!("is {v}; it must be 0 or more"));
    }
}

/// Checks one node's (or the executor's) deployment options; appends (field, problem) pairs.
pub fn check_deployment(options: &DeploymentOptions, found: &mut Found) {
    if let Some(n) = options.num_replicas {
        if n < 1 {
            push(
                found,
                "num_replicas",
                format!(
                    "is {n}; it must be at least 1 (use autoscaling_config with min_replicas: 0 to scale to zero)"
                ),
            );
        }
        if options.autoscaling_config.is_some() {
            push(
                found,
                "num_replicas",
                "is set together with autoscaling_config; keep one (autoscaling decides the count)",
            );
        }
    }
    if let Some(n) = options.max_ongoing_requests
        && n < 1
    {
        push(
            found,
            "max_ongoing_requests",
            format!("is {n}; it must be at least 1"),
        );
    }
    if let Some(n) = options.max_queued_requests
        && n != -1
        && n < 1
    {
        push(
            found,
            "max_queued_requests",
            format!("is {n}; use -1 (unbounded) or at least 1"),
        );
    }
    if let Some(config) = &options.user_config
        && !config.fields.values().all(json_value_is_finite)
    {
        push(
            found,
            "user_config",
            "contains a number that is not finite (NaN or infinity)",
        );
    }
    check_positive(
        found,
        || "health_check_period_s".into(),
        options.health_check_period_s,
    );
    check_positive(
        found,
        || "health_check_timeout_s".into(),
        options.health_check_timeout_s,
    );
    check_non_negative(
        found,
        || "graceful_shutdown_wait_loop_s".into(),
        options.graceful_shutdown_wait_loop_s,
    );
    check_non_negative(
        found,
        || "graceful_shutdown_timeout_s".into(),
        options.graceful_shutdown_timeout_s,
    );
    if let Some(n) = options.max_replicas_per_node
        && !(1..=100).contains(&n)
    {
        push(
            found,
            "max_replicas_per_node",
            format!("is {n}; use 1 to 100"),
        );
    }
    if let Some(autoscaling) = &options.autoscaling_config {
        check_autoscaling(autoscaling, options.max_ongoing_requests, found);
    }
    if let Some(actor) = &options.ray_actor_options {
        check_actor(actor, found);
    }
    if let Some(logging) = &options.logging_config {
        check_logging(logging, found);
    }
}

fn check_autoscaling(config: &AutoscalingConfig, max_ongoing: Option<i32>, found: &mut Found) {
    let field = |name: &str| format!("autoscaling_config.{name}");
    if let Some(min) = config.min_replicas
        && min < 0
    {
        push(
            found,
            &field("min_replicas"),
            format!("is {min}; it must be 0 or more"),
        );
    }
    if let Some(max) = config.max_replicas
        && max < 1
    {
        push(
            found,
            &field("max_replicas"),
            format!("is {max}; it must be at least 1"),
        );
    }
    // `num_replicas: auto` fills unset bounds with 1 and 100; compare what Ray will use.
    let min = config.min_replicas.unwrap_or(AUTO_MIN_REPLICAS);
    let max = config.max_replicas.unwrap_or(AUTO_MAX_REPLICAS);
    if min > max {
        push(
            found,
            &field("min_replicas"),
            format!(
                "({min}) is greater than max_replicas ({max}); set min_replicas <= max_replicas"
            ),
        );
    }
    if let Some(initial) = config.initial_replicas
        && (initial < min || initial > max)
    {
        push(
            found,
            &field("initial_replicas"),
            format!("({initial}) is outside min_replicas..max_replicas ({min}..{max})"),
        );
    }
    check_positive(
        found,
        || field("target_ongoing_requests"),
        config.target_ongoing_requests,
    );
    check_non_negative(found, || field("upscale_delay_s"), config.upscale_delay_s);
    check_non_negative(
        found,
        || field("downscale_delay_s"),
        config.downscale_delay_s,
    );
    check_non_negative(
        found,
        || field("downscale_to_zero_delay_s"),
        config.downscale_to_zero_delay_s,
    );
    check_positive(found, || field("upscaling_factor"), config.upscaling_factor);
    check_positive(
        found,
        || field("downscaling_factor"),
        config.downscaling_factor,
    );
    check_positive(
        found,
        || field("look_back_period_s"),
        config.look_back_period_s,
    );
    if !config.aggregation_function.is_empty()
        && !["mean", "max", "min"]
            .contains(&config.aggregation_function.to_ascii_lowercase().as_str())
    {
        push(
            found,
            &field("aggregation_function"),
            format!("is {:?}; use mean, max or min", config.aggregation_function),
        );
    }
    let target = config
        .target_ongoing_requests
        .unwrap_or(AUTO_TARGET_ONGOING_REQUESTS);
    let cap = max_ongoing.unwrap_or(SERVE_DEFAULT_MAX_ONGOING_REQUESTS);
    if target.is_finite() && f64::from(cap) < target {
        push(
            found,
            &field("target_ongoing_requests"),
            format!(
                "({target}) is above max_ongoing_requests ({cap}), so replicas never reach the target and autoscaling never scales up; raise max_ongoing_requests"
            ),
        );
    }
}

fn check_actor(actor: &RayActorOptions, found: &mut Found) {
    let field = |name: &str| format!("ray_actor_options.{name}");
    if let Some(cpus) = actor.num_cpus
        && let Some(problem) = resource_problem(cpus, false)
    {
        push(found, &field("num_cpus"), problem);
    }
    if let Some(gpus) = actor.num_gpus
        && let Some(problem) = resource_problem(gpus, true)
    {
        push(found, &field("num_gpus"), problem);
    }
    if let Some(memory) = actor.memory
        && (!memory.is_finite() || memory < 0.0 || memory.fract() != 0.0)
    {
        push(
            found,
            &field("memory"),
            format!("is {memory}; give a whole number of bytes, 0 or more"),
        );
    }
    for (name, quantity) in &actor.resources {
        if matches!(
            name.as_str(),
            "CPU" | "GPU" | "memory" | "object_store_memory"
        ) || name.is_empty()
        {
            push(
                found,
                &field("resources"),
                format!(
                    "has {name:?}; use num_cpus, num_gpus and memory for the built-in resources"
                ),
            );
        } else if let Some(problem) = resource_problem(*quantity, false) {
            push(found, &field(&format!("resources.{name}")), problem);
        }
    }
    if let Some(env) = &actor.runtime_env {
        for problem in runtime_env_problems(env) {
            push(found, &field("runtime_env"), problem);
        }
    }
    for key in actor.label_selector.keys() {
        if key.is_empty() {
            push(found, &field("label_selector"), "has an empty label name");
        }
    }
}

fn check_logging(logging: &LoggingConfig, found: &mut Found) {
    if !logging.encoding.is_empty() && !["TEXT", "JSON"].contains(&logging.encoding.as_str()) {
        push(
            found,
            "logging_config.encoding",
            format!("is {:?}; use TEXT or JSON", logging.encoding),
        );
    }
    const LEVELS: &[&str] = &[
        "CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG", "NOTSET",
    ];
    if !logging.log_level.is_empty() && !LEVELS.contains(&logging.log_level.as_str()) {
        push(
            found,
            "logging_config.log_level",
            format!(
                "is {:?}; use one of {}",
                logging.log_level,
                LEVELS.join(", ")
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_paths() {
        assert!(check_import_path("samples.models:Preprocess").is_ok());
        assert!(check_import_path("samples.models.Preprocess").is_ok());
        assert!(check_import_path("pkg:factory.build").is_ok());
        for bad in [
            "",
            "Preprocess",
            "a:b:c",
            ":X",
            "x:",
            "samples.class:X",
            "1pkg:X",
            "pkg.:X",
            "a b:C",
        ] {
            assert!(check_import_path(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn uris() {
        assert!(is_remote_uri("https://example.test/x.zip"));
        assert!(is_remote_uri("s3://bucket/x.zip"));
        assert!(is_remote_uri("local://opt/code"));
        for bad in [
            "/opt/code",
            "code.zip",
            "://x",
            "https://",
            "https://a b/x.zip",
            "1s://x",
        ] {
            assert!(!is_remote_uri(bad), "{bad:?} accepted");
        }
    }

    #[test]
    fn gpu_fractions() {
        assert_eq!(resource_problem(0.5, true), None);
        assert_eq!(resource_problem(2.0, true), None);
        assert!(resource_problem(1.5, true).is_some());
        assert_eq!(resource_problem(1.5, false), None);
        assert!(resource_problem(0.00001, false).is_some());
        assert!(resource_problem(-1.0, false).is_some());
    }
}
