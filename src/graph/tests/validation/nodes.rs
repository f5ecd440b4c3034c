//! Validation of the graph-level fields and of each node: names, kinds, options, retries,
//! values, the ingress and the output.

use super::*;

#[test]
fn invalid_graph_name() {
    let yaml = simple().replace("name: test", "name: Bad_Name");
    assert_problem(&yaml, "InvalidName", &["Bad_Name", "DNS-1123"]);
}

#[test]
fn invalid_version() {
    let yaml = format!("{}version: \"v\\t1\"\n", simple());
    assert_problem(&yaml, "InvalidVersion", &["control characters"]);
    let yaml = format!("{}version: \"{}\"\n", simple(), "v".repeat(200));
    assert_problem(&yaml, "InvalidVersion", &["longer than 128"]);
}

#[test]
fn invalid_node_name() {
    let yaml = graph(
        &[&model("\"bad/name\"")],
        &[
            "{source: request, target: \"bad/name\"}",
            "{source: \"bad/name\", target: response}",
        ],
    );
    assert_problem(
        &yaml,
        "InvalidName",
        &["nodes[2]", "bad/name", "characters other than"],
    );
    let yaml = graph(
        &[&model("\"-x\"")],
        &[
            "{source: request, target: \"-x\"}",
            "{source: \"-x\", target: response}",
        ],
    );
    assert_problem(
        &yaml,
        "InvalidName",
        &["does not start with a letter or digit"],
    );
}

#[test]
fn duplicate_node() {
    let yaml = graph(
        &[&model("m"), &model("m")],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
        ],
    );
    assert_problem(&yaml, "DuplicateNode", &["\"m\"", "nodes[2]", "nodes[3]"]);
}

#[test]
fn node_without_kind() {
    let yaml = graph(
        &["{name: m}"],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
        ],
    );
    assert_problem(&yaml, "InvalidNode", &["\"m\" has no kind"]);
}

#[test]
fn ineffective_settings() {
    let yaml = graph(
        &[&model("m")],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
        ],
    )
    .replace(
        "{name: response, output: {}}",
        "{name: response, output: {}, timeout_ms: 5}",
    )
    .replace(
        "{name: request, input: {}}",
        "{name: request, input: {}, join: ANY}",
    );
    assert_problem(
        &yaml,
        "InvalidNode",
        &["\"response\" is an output node", "`timeout_ms`"],
    );
    assert_problem(
        &yaml,
        "InvalidNode",
        &["\"request\" is an input node", "`join`"],
    );
}

#[test]
fn fallback_without_value_and_value_without_fallback() {
    let yaml = graph(
        &[
            "{name: a, on_error: FALLBACK, model: {import_path: \"samples.models:M\"}}",
            "{name: b, fallback_value: 1, model: {import_path: \"samples.models:M\"}}",
        ],
        &[
            "{source: request, target: a}",
            "{source: a, target: b}",
            "{source: b, target: response}",
        ],
    );
    assert_problem(&yaml, "InvalidNode", &["\"a\"", "no fallback_value"]);
    assert_problem(&yaml, "InvalidNode", &["\"b\"", "on_error is not FALLBACK"]);
    // `fallback_value: null` is a value (null), not an absent one.
    let yaml = graph(
        &[
            "{name: a, on_error: FALLBACK, fallback_value: null, model: {import_path: \"samples.models:M\"}}",
        ],
        &[
            "{source: request, target: a}",
            "{source: a, target: response}",
        ],
    );
    assert_valid(&yaml);
}

#[test]
fn shadow_sample_out_of_range() {
    let yaml = graph(
        &[
            &model("m"),
            "{name: s, shadow: {sample_percent: 0}, model: {import_path: \"samples.models:M\"}}",
        ],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
            "{source: request, target: s}",
        ],
    );
    assert_problem(&yaml, "InvalidNode", &["\"s\"", "sample_percent 0"]);
}

#[test]
fn ingress_problems() {
    let yaml = simple().replace("ingress: request\n", "");
    assert_problem(
        &yaml,
        "MissingIngress",
        &["no ingress", "probably \"request\""],
    );
    let yaml = simple().replace("ingress: request", "ingress: nowhere");
    assert_problem(&yaml, "MissingIngress", &["\"nowhere\" is not a node"]);
    let yaml = simple().replace("ingress: request", "ingress: m");
    assert_problem(&yaml, "MissingIngress", &["\"m\" is a model node"]);
    let yaml = graph(
        &[&model("m"), "{name: second, input: {}}"],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
            "{source: second, target: m}",
        ],
    );
    assert_problem(
        &yaml,
        "DuplicateIngress",
        &["\"second\" is a second input node"],
    );
}

#[test]
fn output_problems() {
    let yaml = simple()
        .replace("  - {name: response, output: {}}\n", "")
        .replace("{source: m, target: response}", "{source: m, target: m2}")
        .replace("edges:", &format!("  - {}\nedges:", model("m2")));
    assert_problem(&yaml, "MissingOutput", &["no output node"]);
    let yaml = graph(
        &[&model("m"), "{name: out2, output: {}}"],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
            "{source: m, target: out2}",
        ],
    );
    assert_problem(
        &yaml,
        "DuplicateOutput",
        &["\"out2\" is a second output node", "\"response\""],
    );
}

#[test]
fn invalid_import_path() {
    let yaml = simple().replace("samples.models:M", "samples.models:M:N");
    assert_problem(
        &yaml,
        "InvalidImportPath",
        &["node \"m\"", "more than one ':'"],
    );
    let yaml = simple().replace("samples.models:M", "Preprocess");
    assert_problem(&yaml, "InvalidImportPath", &["names no module"]);
}

fn with_deployment(deployment: &str) -> String {
    graph(
        &[&format!(
            "{{name: m, model: {{import_path: \"samples.models:M\", deployment: {deployment}}}}}"
        )],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
        ],
    )
}

#[test]
fn invalid_deployment_options() {
    let cases: &[(&str, &[&str])] = &[
        (
            "{num_replicas: -1}",
            &["deployment.num_replicas", "at least 1"],
        ),
        (
            "{num_replicas: 2, autoscaling_config: {}}",
            &["together with autoscaling_config"],
        ),
        (
            "{autoscaling_config: {min_replicas: 5, max_replicas: 2}}",
            &["min_replicas", "(5) is greater than max_replicas (2)"],
        ),
        (
            "{autoscaling_config: {min_replicas: 150}}",
            &["(150) is greater than max_replicas (100)"],
        ),
        (
            "{autoscaling_config: {min_replicas: 1, max_replicas: 3, initial_replicas: 9}}",
            &["initial_replicas", "outside"],
        ),
        (
            "{autoscaling_config: {target_ongoing_requests: 10}}",
            &["above max_ongoing_requests (5)"],
        ),
        (
            "{autoscaling_config: {target_ongoing_requests: 0}}",
            &["target_ongoing_requests", "greater than 0"],
        ),
        (
            "{autoscaling_config: {aggregation_function: median}}",
            &["aggregation_function"],
        ),
        (
            "{max_ongoing_requests: 0}",
            &["max_ongoing_requests", "at least 1"],
        ),
        ("{max_queued_requests: 0}", &["max_queued_requests", "-1"]),
        (
            "{health_check_period_s: 0}",
            &["health_check_period_s", "greater than 0"],
        ),
        (
            "{graceful_shutdown_timeout_s: -1}",
            &["graceful_shutdown_timeout_s", "0 or more"],
        ),
        ("{max_replicas_per_node: 101}", &["max_replicas_per_node"]),
        (
            "{ray_actor_options: {num_gpus: 1.5}}",
            &["num_gpus", "whole number"],
        ),
        (
            "{ray_actor_options: {num_cpus: -0.5}}",
            &["num_cpus", "less than 0"],
        ),
        (
            "{ray_actor_options: {memory: 1.5}}",
            &["memory", "whole number of bytes"],
        ),
        (
            "{ray_actor_options: {resources: {GPU: 1}}}",
            &["resources", "num_gpus"],
        ),
        ("{logging_config: {log_level: verbose}}", &["log_level"]),
        ("{user_config: {x: .nan}}", &["user_config", "not finite"]),
    ];
    for (deployment, fragments) in cases {
        let mut all = vec!["node \"m\""];
        all.extend_from_slice(fragments);
        assert_problem(&with_deployment(deployment), "InvalidOptions", &all);
    }
    assert_valid(&with_deployment(
        "{autoscaling_config: {min_replicas: 0, max_replicas: 8, target_ongoing_requests: 4}, max_ongoing_requests: 8, ray_actor_options: {num_cpus: 0.5, num_gpus: 0.25}}",
    ));
}

#[test]
fn invalid_executor_options_and_header() {
    let yaml = format!(
        "{}executor: {{num_replicas: 0}}\nforward_headers: [\"bad header\"]\n",
        simple()
    );
    assert_problem(&yaml, "InvalidOptions", &["executor: num_replicas"]);
    assert_problem(&yaml, "InvalidOptions", &["forward_headers", "bad header"]);
}

#[test]
fn invalid_model_fields() {
    let yaml = simple().replace("import_path: \"samples.models:M\"", "import_path: \"samples.models:M\", method: \"not a method\", init_kwargs: {\"not-ident\": 1}");
    assert_problem(&yaml, "InvalidOptions", &["model.method"]);
    assert_problem(&yaml, "InvalidOptions", &["model.init_kwargs", "not-ident"]);
}

#[test]
fn timeouts() {
    let yaml = format!(
        "{}deadline_ms: 1000\n",
        simple().replace("{name: m, model:", "{name: m, timeout_ms: 2000, model:")
    );
    assert_problem(
        &yaml,
        "InvalidTimeout",
        &["\"m\" has timeout_ms 2000", "deadline of 1000 ms"],
    );
    let yaml = format!("{}deadline_ms: 4000000\n", simple());
    assert_problem(&yaml, "InvalidTimeout", &["deadline_ms 4000000"]);
}

#[test]
fn invalid_retry() {
    let yaml = simple().replace(
        "{name: m, model:",
        "{name: m, retry: {attempts: 3, initial_backoff_ms: 500, max_backoff_ms: 100}, model:",
    );
    assert_problem(&yaml, "InvalidRetry", &["\"m\"", "retry_on is empty"]);
    assert_problem(
        &yaml,
        "InvalidRetry",
        &["max_backoff_ms (100) is less than initial_backoff_ms (500)"],
    );
    let yaml = simple().replace(
        "{name: m, model:",
        "{name: m, retry: {attempts: 11, retry_on: [TIMEOUT]}, model:",
    );
    assert_problem(&yaml, "InvalidRetry", &["more than the limit of 10"]);
}

#[test]
fn invalid_route_prefix() {
    for (prefix, fragment) in [
        ("noslash", "start with '/'"),
        ("/a/", "end with '/'"),
        ("/{x}", "'{'"),
    ] {
        let yaml = format!("{}route_prefix: \"{prefix}\"\n", simple());
        assert_problem(&yaml, "InvalidRoutePrefix", &[fragment]);
    }
}

#[test]
fn invalid_runtime_env() {
    let yaml = format!(
        "{}runtime_env: {{working_dir: ./code, py_modules: [\"/opt/mod.zip\"], env_vars: {{\"A=B\": x}}}}\n",
        simple()
    );
    assert_problem(
        &yaml,
        "InvalidRuntimeEnv",
        &["graph", "working_dir \"./code\""],
    );
    assert_problem(
        &yaml,
        "InvalidRuntimeEnv",
        &["py_modules entry \"/opt/mod.zip\""],
    );
    assert_problem(&yaml, "InvalidRuntimeEnv", &["env_vars"]);
}

#[test]
fn invalid_value() {
    let yaml = simple().replace(
        "import_path: \"samples.models:M\"",
        "import_path: \"samples.models:M\", init_args: [1, .inf]",
    );
    assert_problem(&yaml, "InvalidValue", &["node \"m\"", "model.init_args[1]"]);
}

#[test]
fn unknown_enum_value() {
    let yaml = simple().replace("{name: m, model:", "{name: m, join: 7, model:");
    assert_problem(&yaml, "UnknownEnumValue", &["node \"m\"", "join", "7"]);
}

#[test]
fn fuse_true_that_cannot_be_honoured_is_refused() {
    let fused = |model: &str| {
        graph(
            &[&format!("{{name: m, model: {model}}}")],
            &[
                "{source: request, target: m}",
                "{source: m, target: response}",
            ],
        )
    };
    assert_problem(
        &fused("{import_path: \"samples.models:M\", fuse: true, deployment: {num_replicas: 2}}"),
        "InvalidOptions",
        &["node \"m\"", "model.fuse", "deployment options"],
    );
    assert_problem(
        &format!(
            "fuse: false\n{}",
            fused("{import_path: \"samples.models:M\", fuse: true}")
        ),
        "InvalidOptions",
        &["model.fuse", "graph turns fusion off"],
    );
    // `fuse: true` with nothing against it, and `fuse: false` with options, are fine.
    assert_valid(&fused("{import_path: \"samples.models:M\", fuse: true}"));
    assert_valid(&fused(
        "{import_path: \"samples.models:M\", fuse: false, deployment: {num_replicas: 2}}",
    ));
    // Empty options are no options.
    assert_valid(&fused(
        "{import_path: \"samples.models:M\", fuse: true, deployment: {}}",
    ));
}
