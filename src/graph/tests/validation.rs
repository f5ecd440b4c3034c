//! One test per validation error (at least), written as the YAML a person would write.

use crate::graph::{Limits, ValidationError, from_yaml, validate, validate_with};

/// A graph with the ingress `request`, the output `response`, the given extra nodes and edges
/// (YAML flow-style list items, one per line).
fn graph(nodes: &[&str], edges: &[&str]) -> String {
    let mut text = String::from(
        "name: test\ningress: request\nnodes:\n  - {name: request, input: {}}\n  - {name: response, output: {}}\n",
    );
    for node in nodes {
        text.push_str(&format!("  - {node}\n"));
    }
    text.push_str("edges:\n");
    for edge in edges {
        text.push_str(&format!("  - {edge}\n"));
    }
    text
}

fn model(name: &str) -> String {
    format!("{{name: {name}, model: {{import_path: \"samples.models:M\"}}}}")
}

fn problems_of(yaml: &str) -> Vec<ValidationError> {
    let parsed =
        from_yaml(yaml).unwrap_or_else(|e| panic!("test YAML does not parse: {e}\n{yaml}"));
    match validate(parsed) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.into_iter().collect(),
    }
}

/// Asserts that some problem has this reason and a message containing every fragment.
#[track_caller]
fn assert_problem(yaml: &str, reason: &str, fragments: &[&str]) -> Vec<ValidationError> {
    let problems = problems_of(yaml);
    let found = problems
        .iter()
        .any(|p| p.reason() == reason && fragments.iter().all(|f| p.to_string().contains(f)));
    assert!(
        found,
        "expected [{reason}] containing {fragments:?}, got:\n{}",
        problems
            .iter()
            .map(|p| format!("  [{}] {p}", p.reason()))
            .collect::<Vec<_>>()
            .join("\n")
    );
    problems
}

#[track_caller]
fn assert_valid(yaml: &str) {
    let problems = problems_of(yaml);
    assert!(
        problems.is_empty(),
        "expected a valid graph, got:\n{}",
        problems
            .iter()
            .map(|p| format!("  [{}] {p}", p.reason()))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn simple() -> String {
    graph(
        &[&model("m")],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
        ],
    )
}

#[test]
fn the_base_graph_is_valid() {
    assert_valid(&simple());
}

#[test]
fn limit_on_nodes_and_edges() {
    let parsed = from_yaml(&simple()).unwrap();
    let errors = validate_with(
        parsed,
        &Limits {
            max_nodes: 2,
            max_edges: 1,
        },
    )
    .unwrap_err();
    let reasons: Vec<&str> = errors.errors().iter().map(|e| e.reason()).collect();
    assert_eq!(reasons, vec!["LimitExceeded", "LimitExceeded"]);
    assert!(
        errors
            .to_string()
            .contains("3 nodes, more than the limit of 2"),
        "{errors}"
    );
}

#[test]
fn limit_on_headers_and_labels() {
    let headers: Vec<String> = (0..65).map(|i| format!("x-h{i}")).collect();
    let labels: Vec<String> = (0..65).map(|i| format!("l{i}: v")).collect();
    let yaml = format!(
        "{}forward_headers: [{}]\nlabels: {{{}}}\n",
        simple(),
        headers.join(", "),
        labels.join(", ")
    );
    assert_problem(&yaml, "LimitExceeded", &["forward_headers"]);
    assert_problem(&yaml, "LimitExceeded", &["labels"]);
}

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
fn edge_to_unknown_node() {
    let yaml = graph(
        &[&model("m")],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
            "{source: m, target: ghost}",
        ],
    );
    assert_problem(
        &yaml,
        "UnknownNode",
        &["edge #2", "target \"ghost\" is not a node"],
    );
}

#[test]
fn duplicate_edge() {
    let yaml = graph(
        &[&model("m")],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
            "{source: request, target: m}",
        ],
    );
    assert_problem(&yaml, "DuplicateEdge", &["edge #2", "repeats edge #0"]);
}

#[test]
fn edge_into_ingress_and_out_of_output() {
    let yaml = graph(
        &[&model("m")],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
            "{source: response, target: request}",
        ],
    );
    let problems = assert_problem(&yaml, "InvalidEdge", &["edge #2", "leads into the ingress"]);
    assert!(
        problems
            .iter()
            .any(|p| p.to_string().contains("leaves the output node"))
    );
}

#[test]
fn invalid_edge_fields() {
    let yaml = graph(
        &[&model("m")],
        &[
            "{source: request, target: m, mode: ORDER, select: /x}",
            "{source: m, target: response, if_missing: 0}",
        ],
    );
    assert_problem(&yaml, "InvalidEdge", &["edge #0", "`select`", "ORDER edge"]);
    assert_problem(
        &yaml,
        "InvalidEdge",
        &["edge #1", "`if_missing`", "not `optional`"],
    );
    let yaml = graph(
        &[&model("m")],
        &[
            "{source: request, target: m, select: /a, tensors: {names: [x]}}",
            "{source: m, target: response}",
        ],
    );
    assert_problem(&yaml, "InvalidEdge", &["`tensors`", "both set"]);
}

#[test]
fn weight_outside_split_and_order_outside_switch() {
    let yaml = graph(
        &[&model("m")],
        &[
            "{source: request, target: m, weight: 3}",
            "{source: m, target: response, order: 2}",
        ],
    );
    assert_problem(
        &yaml,
        "InvalidRouting",
        &["edge #0", "`weight`", "\"request\" is not one"],
    );
    assert_problem(
        &yaml,
        "InvalidRouting",
        &["edge #1", "`order`", "\"m\" is not one"],
    );
}

fn split(edges_out: &[&str]) -> String {
    let mut edges = vec![
        "{source: request, target: s}",
        "{source: a, target: response}",
        "{source: b, target: response}",
    ];
    edges.extend_from_slice(edges_out);
    graph(&["{name: s, split: {}}", &model("a"), &model("b")], &edges).replace(
        "{name: response, output: {}}",
        "{name: response, output: {}, join: ANY}",
    )
}

#[test]
fn split_rules() {
    assert_valid(&split(&[
        "{source: s, target: a, weight: 1}",
        "{source: s, target: b, weight: 0}",
    ]));
    let yaml = split(&[
        "{source: s, target: a, weight: 1, when: {compare: {path: /request/x, op: EXISTS}}}",
        "{source: s, target: b}",
    ]);
    assert_problem(
        &yaml,
        "InvalidRouting",
        &["leaves split \"s\" and has a `when` guard"],
    );
    assert_problem(
        &yaml,
        "InvalidRouting",
        &["leaves split \"s\" without a `weight`"],
    );
    let yaml = split(&[
        "{source: s, target: a, weight: 0}",
        "{source: s, target: b, weight: 0}",
    ]);
    assert_problem(
        &yaml,
        "InvalidRouting",
        &["split \"s\" has weights that add up to 0"],
    );
}

fn switch(node: &str, edges_out: &[&str]) -> String {
    let mut edges = vec![
        "{source: request, target: s}",
        "{source: a, target: response}",
        "{source: b, target: response}",
    ];
    edges.extend_from_slice(edges_out);
    graph(&[node, &model("a"), &model("b")], &edges).replace(
        "{name: response, output: {}}",
        "{name: response, output: {}, join: ANY}",
    )
}

const CASE: &str = "when: {compare: {path: /request/tier, op: EQ, value: gold}}";

#[test]
fn switch_rules() {
    assert_valid(&switch(
        "{name: s, switch: {}}",
        &[
            &format!("{{source: s, target: a, {CASE}}}"),
            "{source: s, target: b}",
        ],
    ));
    assert_valid(&switch(
        "{name: s, switch: {on_no_match: SKIP}}",
        &[
            &format!("{{source: s, target: a, {CASE}}}"),
            &format!("{{source: s, target: b, order: 1, {CASE}}}"),
        ],
    ));
    let yaml = switch(
        "{name: s, switch: {}}",
        &["{source: s, target: a}", "{source: s, target: b}"],
    );
    assert_problem(&yaml, "InvalidRouting", &["switch \"s\" has no case"]);
    assert_problem(
        &yaml,
        "InvalidRouting",
        &["switch \"s\" has several default edges", "#3", "#4"],
    );
    let yaml = switch(
        "{name: s, switch: {}}",
        &[
            &format!("{{source: s, target: a, {CASE}}}"),
            &format!("{{source: s, target: b, {CASE}}}"),
        ],
    );
    assert_problem(
        &yaml,
        "InvalidRouting",
        &["switch \"s\" has no default edge", "on_no_match"],
    );
}

#[test]
fn cycle_names_its_nodes() {
    let yaml = graph(
        &[&model("a"), &model("b"), &model("c")],
        &[
            "{source: request, target: a}",
            "{source: a, target: b}",
            "{source: b, target: c}",
            "{source: c, target: a}",
            "{source: c, target: response}",
        ],
    );
    assert_problem(&yaml, "CycleDetected", &["cycle: a -> b -> c -> a"]);
    let yaml = graph(
        &[&model("a")],
        &[
            "{source: request, target: a}",
            "{source: a, target: a}",
            "{source: a, target: response}",
        ],
    );
    assert_problem(&yaml, "CycleDetected", &["cycle: a -> a"]);
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
fn unreachable_node() {
    let yaml = graph(
        &[&model("m"), &model("island")],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
            "{source: island, target: response}",
        ],
    );
    assert_problem(
        &yaml,
        "Unreachable",
        &["\"island\" cannot be reached from the ingress \"request\""],
    );
}

#[test]
fn dead_end_unless_shadow() {
    let yaml = graph(
        &[&model("m"), &model("sink")],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
            "{source: m, target: sink}",
        ],
    );
    assert_problem(
        &yaml,
        "DeadEnd",
        &["\"sink\" never leads to the output \"response\""],
    );
    let yaml = graph(
        &[
            &model("m"),
            "{name: sink, shadow: {}, model: {import_path: \"samples.models:M\"}}",
            &model("after"),
        ],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
            "{source: m, target: sink}",
            "{source: sink, target: after}",
        ],
    );
    assert_valid(&yaml);
}

#[test]
fn shadow_leak() {
    let yaml = graph(
        &[
            &model("m"),
            "{name: sh, shadow: {}, model: {import_path: \"samples.models:M\"}}",
        ],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
            "{source: request, target: sh}",
            "{source: sh, target: m}",
        ],
    );
    assert_problem(
        &yaml,
        "InvalidRouting",
        &["edge #3", "shadow branch", "\"m\""],
    );
}

#[test]
fn exclusive_join_after_switch() {
    let edges = [
        "{source: request, target: s}",
        &format!("{{source: s, target: a, {CASE}}}"),
        "{source: s, target: b}",
        "{source: a, target: j, into: /a}",
        "{source: b, target: j, into: /b}",
        "{source: j, target: response}",
    ];
    let nodes = [
        "{name: s, switch: {}}",
        &model("a"),
        &model("b"),
        &model("j"),
    ];
    let yaml = graph(&nodes, &edges);
    assert_problem(
        &yaml,
        "InvalidRouting",
        &[
            "\"j\" joins (ALL) edges #3 and #4",
            "switch \"s\"",
            "join: ANY",
        ],
    );
    // Fixed by join ANY, or by making one edge optional.
    assert_valid(&yaml.replace("{name: j, model:", "{name: j, join: ANY, model:"));
    assert_valid(&yaml.replace(
        "{source: b, target: j, into: /b}",
        "{source: b, target: j, into: /b, optional: true}",
    ));
}

#[test]
fn exclusive_join_nested_and_direct() {
    // The join reads the split's branch edge directly and a node deep in the other branch.
    let yaml = graph(
        &[
            "{name: s, split: {}}",
            &model("a"),
            &model("b"),
            &model("c"),
            &model("j"),
        ],
        &[
            "{source: request, target: s}",
            "{source: s, target: j, weight: 1, into: /direct}",
            "{source: s, target: a, weight: 1}",
            "{source: a, target: b}",
            "{source: b, target: c}",
            "{source: c, target: j, into: /deep}",
            "{source: j, target: response}",
        ],
    );
    assert_problem(
        &yaml,
        "InvalidRouting",
        &["\"j\" joins (ALL)", "split \"s\""],
    );
}

#[test]
fn joins_that_can_run_are_accepted() {
    // A diamond without routing, and a join after the switch's branches merged again.
    let diamond = graph(
        &[&model("a"), &model("b"), &model("j")],
        &[
            "{source: request, target: a}",
            "{source: request, target: b}",
            "{source: a, target: j, into: /a}",
            "{source: b, target: j, into: /b}",
            "{source: j, target: response}",
        ],
    );
    assert_valid(&diamond);
    let merged = graph(
        &[
            "{name: s, switch: {}}",
            &model("a"),
            &model("b"),
            "{name: m, join: ANY, model: {import_path: \"samples.models:M\"}}",
            &model("x"),
            &model("j"),
        ],
        &[
            "{source: request, target: s}",
            &format!("{{source: s, target: a, {CASE}}}"),
            "{source: s, target: b}",
            "{source: a, target: m}",
            "{source: b, target: m}",
            "{source: m, target: j, into: /m}",
            "{source: request, target: x}",
            "{source: x, target: j, into: /x}",
            "{source: j, target: response}",
        ],
    );
    assert_valid(&merged);
}

#[test]
fn into_conflicts() {
    let yaml = graph(
        &[&model("a"), &model("b"), &model("j")],
        &[
            "{source: request, target: a}",
            "{source: request, target: b}",
            "{source: a, target: j, into: /x}",
            "{source: b, target: j, into: /x/y}",
            "{source: j, target: response}",
        ],
    );
    assert_problem(
        &yaml,
        "InvalidRouting",
        &["edge #2", "edge #3", "\"/x\"", "\"/x/y\"", "overlapping"],
    );
    let yaml = graph(
        &[&model("a"), &model("b"), &model("j")],
        &[
            "{source: request, target: a}",
            "{source: request, target: b}",
            "{source: a, target: j}",
            "{source: b, target: j}",
            "{source: j, target: response}",
        ],
    );
    assert_problem(
        &yaml,
        "InvalidRouting",
        &["overlapping parts of node \"j\""],
    );
}

#[test]
fn kwargs_keys() {
    let yaml = graph(
        &[
            &model("a"),
            "{name: k, model: {import_path: \"samples.models:M\", call_style: KWARGS}}",
        ],
        &[
            "{source: request, target: a}",
            "{source: a, target: k, into: /1x}",
            "{source: request, target: k, into: /ok}",
            "{source: k, target: response}",
        ],
    );
    assert_problem(
        &yaml,
        "InvalidEdge",
        &["edge #1", "keyword arguments", "\"1x\""],
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
fn invalid_pointer() {
    let yaml = graph(
        &[&model("m")],
        &[
            "{source: request, target: m, select: x}",
            "{source: m, target: response, into: \"/a~2\"}",
        ],
    );
    assert_problem(&yaml, "InvalidPointer", &["edge #0", "`select` \"x\""]);
    assert_problem(&yaml, "InvalidPointer", &["edge #1", "`into`", "'~'"]);
    let yaml = split(&[
        "{source: s, target: a, weight: 1}",
        "{source: s, target: b, weight: 1}",
    ])
    .replace("split: {}", "split: {sticky_key: user}");
    assert_problem(&yaml, "InvalidPointer", &["node \"s\"", "split.sticky_key"]);
}

#[test]
fn invalid_predicate() {
    let yaml = switch(
        "{name: s, switch: {}}",
        &[
            "{source: s, target: a, when: {all_of: [{compare: {path: /request/x, op: GT, value: true}}, {compare: {path: /request/y, op: EXISTS, value: 1}}]}}",
            "{source: s, target: b}",
        ],
    );
    assert_problem(
        &yaml,
        "InvalidPredicate",
        &[
            "edge #3",
            "when.all_of[0].compare.value",
            "numbers or strings",
        ],
    );
    assert_problem(
        &yaml,
        "InvalidPredicate",
        &["when.all_of[1].compare.value", "takes no value"],
    );
    let yaml = switch(
        "{name: s, switch: {}}",
        &[
            "{source: s, target: a, when: {compare: {path: /request/x}}}",
            "{source: s, target: b}",
        ],
    );
    assert_problem(&yaml, "InvalidPredicate", &["compare.op", "not set"]);
}

#[test]
fn predicate_scope() {
    // `b` runs after the switch on another branch: the case cannot read it.
    let yaml = switch(
        "{name: s, switch: {}}",
        &[
            "{source: s, target: a, when: {compare: {path: /b/score, op: GT, value: 1}}}",
            "{source: s, target: b}",
        ],
    );
    assert_problem(
        &yaml,
        "PredicateScope",
        &["edge #3", "reads \"b\"", "ancestor of \"s\""],
    );
    let yaml = switch(
        "{name: s, switch: {}}",
        &[
            "{source: s, target: a, when: {compare: {path: /nobody/x, op: EXISTS}}}",
            "{source: s, target: b}",
        ],
    );
    assert_problem(&yaml, "PredicateScope", &["reads \"nobody\""]);
    // Reading the request, the source itself and an ancestor is fine.
    let yaml = graph(
        &[&model("pre"), "{name: s, switch: {}}", &model("a"), &model("b")],
        &[
            "{source: request, target: pre}",
            "{source: pre, target: s}",
            "{source: s, target: a, when: {all_of: [{compare: {path: /pre/score, op: GT, value: 1}}, {compare: {path: /s/x, op: EXISTS}}, {compare: {path: /request/x, op: TRUTHY}}]}}",
            "{source: s, target: b}",
            "{source: a, target: response}",
            "{source: b, target: response}",
        ],
    )
    .replace("{name: response, output: {}}", "{name: response, output: {}, join: ANY}");
    assert_valid(&yaml);
    let yaml = split(&[
        "{source: s, target: a, weight: 1}",
        "{source: s, target: b, weight: 1}",
    ])
    .replace("split: {}", "split: {sticky_key: /a/user}");
    assert_problem(
        &yaml,
        "PredicateScope",
        &["split.sticky_key", "reads \"a\""],
    );
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
fn every_problem_is_reported_at_once() {
    let yaml = graph(
        &[
            &model("m"),
            &model("m"),
            "{name: x}",
            "{name: bad, model: {import_path: nope}}",
        ],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
            "{source: m, target: ghost}",
        ],
    )
    .replace("name: test", "name: Bad");
    let problems = problems_of(&yaml);
    let reasons: Vec<&str> = problems.iter().map(|p| p.reason()).collect();
    for expected in [
        "InvalidName",
        "DuplicateNode",
        "InvalidNode",
        "InvalidImportPath",
        "UnknownNode",
    ] {
        assert!(
            reasons.contains(&expected),
            "{expected} missing from {reasons:?}"
        );
    }
}

#[test]
fn reasons_are_stable_camel_case() {
    let yaml = graph(
        &[
            &model("m"),
            &model("m"),
            "{name: x}",
            "{name: bad, model: {import_path: nope}}",
        ],
        &["{source: request, target: m}", "{source: m, target: ghost}"],
    );
    for problem in problems_of(&yaml) {
        let reason = problem.reason();
        assert!(
            reason
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_uppercase()),
            "{reason}"
        );
        assert!(
            reason.chars().all(|c| c.is_ascii_alphanumeric()),
            "{reason}"
        );
    }
}

#[test]
fn topological_order_breaks_ties_by_declaration() {
    let yaml = graph(
        &[&model("z"), &model("b"), &model("a"), &model("j")],
        &[
            "{source: request, target: a}",
            "{source: request, target: z}",
            "{source: request, target: b}",
            "{source: a, target: j, into: /a}",
            "{source: z, target: j, into: /z}",
            "{source: b, target: j, into: /b}",
            "{source: j, target: response}",
        ],
    );
    let valid = validate(from_yaml(&yaml).unwrap()).unwrap();
    let order: Vec<&str> = valid.topological_order().map(|n| n.name.as_str()).collect();
    assert_eq!(order, ["request", "z", "b", "a", "j", "response"]);
    assert_eq!(valid.node_count(), 6);
    assert_eq!(valid.edge_count(), 7);
    assert_eq!(valid.ingress(), "request");
    assert_eq!(valid.output(), "response");
    assert_eq!(valid.dag().edge_count(), 7);
}

#[test]
fn summary_is_bounded() {
    let yaml = graph(
        &[&model("m"), &model("m"), &model("m")],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
        ],
    );
    let errors = validate(from_yaml(&yaml).unwrap()).unwrap_err();
    // Only the duplicates: the copies are not also reported as unreachable.
    assert_eq!(errors.len(), 2, "{errors}");
    assert_eq!(errors.reason(), "DuplicateNode");
    let summary = errors.summary(1);
    assert!(
        summary.contains("[DuplicateNode]") && summary.contains("and 1 more"),
        "{summary}"
    );
}
