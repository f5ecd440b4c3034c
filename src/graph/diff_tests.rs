//! Unit tests of the graph diff (`diff.rs`), kept beside it so the module reads as code.

use super::*;
use crate::graph::proto::{AutoscalingConfig, JsonObject, JsonValue, RayActorOptions, Retry};

const SAMPLE: &str = include_str!("../../samples/graphs/switch-canary.yaml");

fn sample() -> PipelineGraph {
    crate::graph::from_yaml(SAMPLE).unwrap()
}

#[test]
fn the_plan_lines_for_a_status_are_bounded() {
    let old = sample();
    let mut new = sample();
    new.version = "changed".into();
    for node in &mut new.nodes {
        node.description = format!("{} changed", node.name);
    }
    let d = diff(&old, &new);
    let all = d.lines(usize::MAX);
    assert!(all.len() > 3, "{all:?}");
    assert_eq!(all[0], d.summary());
    let capped = d.lines(3);
    assert_eq!(capped.len(), 3);
    assert_eq!(capped[2], format!("… and {} more", all.len() - 2));
    assert_eq!(diff(&old, &old).lines(5), vec![diff(&old, &old).summary()]);
}

fn node_mut<'a>(graph: &'a mut PipelineGraph, name: &str) -> &'a mut Node {
    graph.nodes.iter_mut().find(|n| n.name == name).unwrap()
}

fn model_mut<'a>(graph: &'a mut PipelineGraph, name: &str) -> &'a mut ModelNode {
    match &mut node_mut(graph, name).kind {
        Some(node::Kind::Model(model)) => model,
        _ => panic!("{name} is not a model"),
    }
}

fn deployment_mut<'a>(graph: &'a mut PipelineGraph, name: &str) -> &'a mut DeploymentOptions {
    model_mut(graph, name)
        .deployment
        .get_or_insert_with(Default::default)
}

fn edge_mut<'a>(graph: &'a mut PipelineGraph, source: &str, target: &str) -> &'a mut Edge {
    graph
        .edges
        .iter_mut()
        .find(|e| e.source == source && e.target == target)
        .unwrap()
}

fn line_of(diff: &GraphDiff, name: &str) -> NodeDiff {
    diff.nodes.iter().find(|n| n.node == name).unwrap().clone()
}

fn string(text: &str) -> JsonValue {
    JsonValue {
        kind: Some(proto::json_value::Kind::StringValue(text.to_string())),
    }
}

/// Only `name` differs, with that change and those fields; the others are unchanged.
fn assert_only(diff: &GraphDiff, name: &str, change: Change, fields: &[&str]) {
    for line in &diff.nodes {
        if line.node == name {
            assert_eq!(
                (line.change, &line.fields[..]),
                (
                    change,
                    &fields.iter().map(|f| f.to_string()).collect::<Vec<_>>()[..]
                ),
                "{diff}"
            );
        } else {
            assert_eq!(line.change, Change::Unchanged, "{diff}");
        }
    }
}

#[test]
fn equal_graphs_have_no_changes() {
    let diff = diff(&sample(), &sample());
    assert!(diff.is_empty());
    assert!(!diff.restarts_all_replicas);
    assert_eq!(diff.nodes.len(), 8);
    assert!(diff.nodes.windows(2).all(|w| w[0].node < w[1].node));
    assert_eq!(diff.to_string(), "no changes\n");
    assert_eq!(
        diff.summary(),
        "8 unchanged, 0 in place, 0 restarted, 0 added, 0 removed, 0 routing changes, 0 graph changes"
    );
}

#[test]
fn deployment_options_serve_applies_live_are_in_place_and_keep_the_wiring() {
    let old = sample();
    let mut new = sample();
    let options = deployment_mut(&mut new, "stable");
    options.autoscaling_config = Some(AutoscalingConfig {
        max_replicas: Some(4),
        ..Default::default()
    });
    options.max_ongoing_requests = Some(8);
    options.max_queued_requests = Some(20);
    options.user_config = Some(JsonObject {
        fields: [("threshold".to_string(), string("0.7"))].into(),
    });
    options.health_check_period_s = Some(5.0);
    deployment_mut(&mut new, "premium").num_replicas = Some(3);
    let diff = diff(&old, &new);
    let stable = line_of(&diff, "stable");
    assert_eq!(stable.change, Change::InPlace);
    assert_eq!(
        stable.fields,
        [
            "model.deployment.autoscaling_config",
            "model.deployment.health_check_period_s",
            "model.deployment.max_ongoing_requests",
            "model.deployment.max_queued_requests",
            "model.deployment.user_config",
        ]
    );
    let premium = line_of(&diff, "premium");
    assert_eq!(
        (premium.change, premium.fields.as_slice()),
        (
            Change::InPlace,
            ["model.deployment.num_replicas".to_string()].as_slice()
        )
    );
    assert!(diff.routing.is_empty() && diff.graph.is_empty(), "{diff}");
    // The renderer keeps deployment options out of `args` (same wiring), so Serve sees
    // the same code version: nothing restarts (tests/integration/graph_diff.rs shows it on
    // Ray).
    assert!(!diff.restarts_all_replicas, "{diff}");
}

#[test]
fn executor_read_fields_are_in_place_but_change_args() {
    let old = sample();
    let mut new = sample();
    let candidate = node_mut(&mut new, "candidate");
    candidate.timeout_ms = 500;
    candidate.retry = Some(Retry {
        attempts: 2,
        retry_on: vec![proto::RetryOn::Timeout as i32],
        ..Default::default()
    });
    candidate.fallback_value = Some(string("sorry"));
    model_mut(&mut new, "candidate").method = "predict".to_string();
    let diff = diff(&old, &new);
    assert_only(
        &diff,
        "candidate",
        Change::InPlace,
        &["fallback_value", "model.method", "retry", "timeout_ms"],
    );
    assert!(diff.restarts_all_replicas, "{diff}");
    assert!(
        diff.to_string().contains("note: the graph wiring"),
        "{diff}"
    );
}

#[test]
fn code_constructor_and_actor_changes_restart_the_node() {
    let mut new = sample();
    model_mut(&mut new, "premium").import_path = "samples.models:Premium".to_string();
    deployment_mut(&mut new, "premium").num_replicas = Some(2);
    model_mut(&mut new, "stable")
        .init_kwargs
        .insert("label".to_string(), string("stable-2"));
    deployment_mut(&mut new, "audit").ray_actor_options = Some(RayActorOptions {
        num_cpus: Some(0.5),
        ..Default::default()
    });
    let diff = diff(&sample(), &new);
    // One restart-class field makes the node restarted; every changed field is named.
    assert_eq!(
        line_of(&diff, "premium").fields,
        ["model.deployment.num_replicas", "model.import_path"]
    );
    for (name, field) in [
        ("premium", "model.import_path"),
        ("stable", "model.init_kwargs"),
        ("audit", "model.deployment.ray_actor_options"),
    ] {
        let line = line_of(&diff, name);
        assert_eq!(line.change, Change::Restarted, "{diff}");
        assert!(line.fields.iter().any(|f| f == field), "{diff}");
    }
    assert_eq!(diff.count(Change::Unchanged), 5);
}

#[test]
fn added_removed_and_retyped_nodes() {
    let mut new = sample();
    new.nodes.retain(|n| n.name != "audit");
    new.edges.retain(|e| e.target != "audit");
    let mut audit2 = sample()
        .nodes
        .into_iter()
        .find(|n| n.name == "audit")
        .unwrap();
    audit2.name = "audit2".to_string();
    new.nodes.push(audit2);
    new.edges.push(Edge {
        source: "request".to_string(),
        target: "audit2".to_string(),
        ..Default::default()
    });
    node_mut(&mut new, "canary").kind = Some(node::Kind::Switch(SwitchNode::default()));
    let diff = diff(&sample(), &new);
    assert_eq!(line_of(&diff, "audit").change, Change::Removed);
    assert_eq!(line_of(&diff, "audit").kind, NodeKind::Model);
    assert_eq!(line_of(&diff, "audit2").change, Change::Added);
    let canary = line_of(&diff, "canary");
    assert_eq!(
        (canary.change, canary.kind, canary.fields.as_slice()),
        (
            Change::Restarted,
            NodeKind::Switch,
            ["split".to_string(), "switch".to_string()].as_slice()
        )
    );
    assert!(
        diff.routing
            .contains(&"edge request -> audit removed".to_string()),
        "{diff}"
    );
    assert!(
        diff.routing
            .contains(&"edge request -> audit2 added".to_string()),
        "{diff}"
    );
    assert!(
        diff.summary()
            .starts_with("6 unchanged, 0 in place, 1 restarted, 1 added, 1 removed, "),
        "{}",
        diff.summary()
    );
}

#[test]
fn routing_changes_are_described() {
    let old = sample();
    let mut new = sample();
    edge_mut(&mut new, "canary", "stable").weight = Some(50);
    edge_mut(&mut new, "canary", "candidate").weight = Some(50);
    if let Some(proto::predicate::P::Compare(compare)) = &mut edge_mut(&mut new, "tier", "premium")
        .when
        .as_mut()
        .unwrap()
        .p
    {
        compare.value = Some(string("platinum"));
    }
    edge_mut(&mut new, "request", "audit").optional = true;
    node_mut(&mut new, "response").join = JoinMode::All as i32;
    if let Some(node::Kind::Split(split)) = &mut node_mut(&mut new, "canary").kind {
        split.sticky_key.clear();
    }
    node_mut(&mut new, "tier").kind = Some(node::Kind::Switch(SwitchNode {
        on_no_match: NoMatch::Error as i32,
    }));
    let premium_case = edge_mut(&mut new, "tier", "premium").when.clone();
    new.edges.push(Edge {
        source: "tier".to_string(),
        target: "stable".to_string(),
        when: premium_case,
        ..Default::default()
    });
    new.edges.swap(0, 1);
    let diff = diff(&old, &new);
    let expected = [
        "join of response: ANY -> ALL",
        "split canary: sticky_key \"/request/user_id\" -> \"\"",
        "switch tier: on_no_match UNSPECIFIED -> ERROR",
        "edge tier -> premium: when `/request/tier == \"gold\"` -> `/request/tier == \"platinum\"`",
        "edge canary -> stable: weight 90 (90%) -> 50 (50%)",
        "edge canary -> candidate: weight 10 (10%) -> 50 (50%)",
        "edge request -> audit: optional false -> true",
        "edge tier -> stable added (when `/request/tier == \"platinum\"`)",
        "edge declaration order changed",
    ];
    for line in expected {
        assert!(
            diff.routing.iter().any(|l| l == line),
            "{line:?} missing:\n{diff}"
        );
    }
    assert_eq!(diff.routing.len(), expected.len(), "{diff}");
    // Routing settings of a node are its own fields too (the executor reads them).
    for (name, field) in [
        ("canary", "split.sticky_key"),
        ("response", "join"),
        ("tier", "switch.on_no_match"),
    ] {
        let line = line_of(&diff, name);
        assert_eq!(
            (line.change, line.fields.as_slice()),
            (Change::InPlace, [field.to_string()].as_slice())
        );
    }
    assert_eq!(diff.count(Change::Unchanged), 5);
}

#[test]
fn ingress_and_output_changes_are_routing() {
    let mut new = sample();
    new.ingress = "entry".to_string();
    node_mut(&mut new, "request").name = "entry".to_string();
    node_mut(&mut new, "response").name = "answer".to_string();
    for edge in &mut new.edges {
        for end in [&mut edge.source, &mut edge.target] {
            match end.as_str() {
                "request" => *end = "entry".to_string(),
                "response" => *end = "answer".to_string(),
                _ => {}
            }
        }
    }
    let diff = diff(&sample(), &new);
    assert!(
        diff.routing
            .contains(&"ingress: \"request\" -> \"entry\"".to_string()),
        "{diff}"
    );
    assert!(
        diff.routing
            .contains(&"output: response -> answer".to_string()),
        "{diff}"
    );
    assert!(
        diff.routing
            .contains(&"edge entry -> tier added".to_string()),
        "{diff}"
    );
}

#[test]
fn graph_level_changes_are_described_without_values_of_maps() {
    let old = sample();
    let mut new = sample();
    new.name = "switch-canary-2".to_string();
    new.version = "2".to_string();
    new.deadline_ms = 0;
    new.route_prefix = "/v2".to_string();
    new.forward_headers = vec!["x-request-id".to_string()];
    new.labels.insert("team".to_string(), "fraud".to_string());
    new.runtime_env = Some(RuntimeEnv {
        env_vars: [("API_TOKEN".to_string(), "s3cr3t-value".to_string())].into(),
        ..Default::default()
    });
    let executor = new.executor.get_or_insert_with(Default::default);
    executor.num_replicas = Some(2);
    executor.ray_actor_options = None;
    new.nodes.swap(1, 2);
    let diff = diff(&old, &new);
    let expected = [
        "name: \"switch-canary\" -> \"switch-canary-2\"",
        "version: \"1\" -> \"2\"",
        "route_prefix: \"/classify\" -> \"/v2\"",
        "deadline_ms: 10000 -> default (30000)",
        "forward_headers: [] -> [x-request-id]",
        "labels: added team",
        "runtime_env: env_vars (added API_TOKEN) changed (every replica restarts)",
        "executor.num_replicas changed (in place)",
        "executor.ray_actor_options changed (restarts the executor's replicas)",
        "node declaration order changed",
    ];
    assert_eq!(diff.graph, expected, "{diff}");
    assert!(diff.routing.is_empty(), "{diff}");
    assert!(diff.restarts_all_replicas);
    assert!(diff.count(Change::Unchanged) == 8);
    let json = serde_json::to_string(&diff).unwrap();
    assert!(!json.contains("s3cr3t") && !diff.to_string().contains("s3cr3t"));
}

#[test]
fn plan_prints_as_a_table_and_serializes_in_camel_case() {
    let mut new = sample();
    deployment_mut(&mut new, "stable").num_replicas = Some(2);
    edge_mut(&mut new, "canary", "candidate").weight = Some(30);
    let diff = diff(&sample(), &new);
    let text = diff.to_string();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(
            "7 unchanged, 1 in place, 0 restarted, 0 added, 0 removed, 1 routing change, 0 graph changes"
        )
    );
    assert_eq!(lines.next(), Some(""));
    assert_eq!(lines.next(), Some("NODE       KIND    CHANGE     FIELDS"));
    assert!(
        text.contains("\nstable     model   in place   model.deployment.num_replicas\n"),
        "{text}"
    );
    assert!(
        text.contains("\naudit      model   unchanged  -\n"),
        "{text}"
    );
    assert!(
        text.contains("\n\nrouting:\n  edge canary -> candidate: weight 10 (10%) -> 30 (25%)\n\n"),
        "{text}"
    );
    let json = serde_json::to_value(&diff).unwrap();
    assert_eq!(json["restartsAllReplicas"], true);
    assert!(
        json.get("starts").is_none(),
        "counted only on a rendering: {json}"
    );
    let stable = json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == "stable")
        .unwrap();
    assert_eq!(
        *stable,
        serde_json::json!({"node": "stable", "kind": "model", "change": "inPlace", "fields": ["model.deployment.num_replicas"]})
    );
    let back: GraphDiff = serde_json::from_value(json).unwrap();
    assert_eq!(back, diff);
}

#[test]
fn long_lines_are_capped() {
    let mut new = sample();
    let long = "x".repeat(5000);
    new.version = long.clone();
    if let Some(proto::predicate::P::Compare(compare)) = &mut edge_mut(&mut new, "tier", "premium")
        .when
        .as_mut()
        .unwrap()
        .p
    {
        compare.value = Some(string(&long));
    }
    let diff = diff(&sample(), &new);
    let lines: Vec<&String> = diff.graph.iter().chain(&diff.routing).collect();
    assert_eq!(lines.len(), 2, "{diff}");
    for line in lines {
        assert!(line.len() <= MAX_LINE_BYTES && line.contains('…'), "{line}");
    }
}

/// Field names of a message in `pipeline.proto`: (plain fields, oneof members).
fn proto_fields(message: &str) -> (Vec<String>, Vec<String>) {
    let text = include_str!("../../proto/raypipe/v1/pipeline.proto");
    let opening = format!("message {message} {{");
    let start = text
        .lines()
        .position(|l| l.trim_start().starts_with(&opening))
        .unwrap_or_else(|| panic!("message {message} not found"));
    let (mut plain, mut oneof) = (Vec::new(), Vec::new());
    let mut depth = 0;
    for line in text.lines().skip(start) {
        let code = line.split("//").next().unwrap_or("").trim();
        if code.ends_with("{}") {
            break; // an empty message on one line
        } else if code.ends_with('{') {
            depth += 1;
        } else if code == "}" {
            depth -= 1;
            if depth == 0 {
                break;
            }
        } else if let Some((declaration, _number)) = code.split_once('=') {
            let name = declaration.split_whitespace().last().unwrap().to_string();
            if depth > 1 {
                oneof.push(name)
            } else {
                plain.push(name)
            }
        }
    }
    (plain, oneof)
}

fn sorted(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut names: Vec<String> = names.into_iter().collect();
    names.sort();
    names
}

/// A new field in the model node's messages (Node, ModelNode, DeploymentOptions, the
/// routing kinds) fails this test until `compare_node` classifies it: a node with every
/// field changed must name every field of the .proto file.
#[test]
fn every_node_field_of_the_proto_is_classified() {
    let (node_fields, kinds) = proto_fields("Node");
    assert_eq!(kinds, ["input", "model", "switch", "split", "output"]);
    let (model_fields, _) = proto_fields("ModelNode");
    let (deployment_fields, _) = proto_fields("DeploymentOptions");
    let mut expected: Vec<String> = node_fields.into_iter().filter(|f| f != "name").collect();
    expected.extend(
        model_fields
            .iter()
            .filter(|f| *f != "deployment")
            .map(|f| format!("model.{f}")),
    );
    expected.extend(
        deployment_fields
            .iter()
            .map(|f| format!("model.deployment.{f}")),
    );

    let base = Node {
        name: "m".to_string(),
        kind: Some(node::Kind::Model(ModelNode::default())),
        ..Default::default()
    };
    let some_object = JsonObject {
        fields: [("k".to_string(), string("v"))].into(),
    };
    // Every field set (no `..Default::default()`: a new field must be set here too).
    let everything = Node {
        name: "m".to_string(),
        description: "d".to_string(),
        kind: Some(node::Kind::Model(ModelNode {
            import_path: "a.b:C".to_string(),
            init_args: vec![string("x")],
            init_kwargs: [("k".to_string(), string("v"))].into(),
            method: "predict".to_string(),
            call_style: proto::CallStyle::Kwargs as i32,
            deployment: Some(Box::new(DeploymentOptions {
                num_replicas: Some(2),
                autoscaling_config: Some(AutoscalingConfig::default()),
                max_ongoing_requests: Some(3),
                max_queued_requests: Some(4),
                user_config: Some(some_object),
                health_check_period_s: Some(1.0),
                health_check_timeout_s: Some(1.0),
                graceful_shutdown_wait_loop_s: Some(1.0),
                graceful_shutdown_timeout_s: Some(1.0),
                ray_actor_options: Some(RayActorOptions::default()),
                max_replicas_per_node: Some(1),
                logging_config: Some(proto::LoggingConfig::default()),
            })),
            fuse: Some(false),
        })),
        join: JoinMode::Any as i32,
        on_error: proto::OnError::Skip as i32,
        fallback_value: Some(string("f")),
        timeout_ms: 1,
        retry: Some(Retry::default()),
        shadow: Some(proto::Shadow::default()),
        input_template: Some(string("t")),
    };
    let mut changes = FieldChanges::default();
    compare_node(&base, &everything, &mut changes);
    assert_eq!(changes.into_fields(), sorted(expected));

    // The routing kinds' own fields, and a change of kind.
    for (message, kind, prefix) in [
        (
            "SwitchNode",
            node::Kind::Switch(SwitchNode { on_no_match: 1 }),
            "switch",
        ),
        (
            "SplitNode",
            node::Kind::Split(SplitNode {
                sticky_key: "/k".to_string(),
            }),
            "split",
        ),
    ] {
        let (fields, _) = proto_fields(message);
        let plain = match &kind {
            node::Kind::Switch(_) => node::Kind::Switch(SwitchNode::default()),
            _ => node::Kind::Split(SplitNode::default()),
        };
        let mut changes = FieldChanges::default();
        compare_kind(Some(&plain), Some(&kind), &mut changes);
        assert_eq!(
            changes.into_fields(),
            sorted(fields.iter().map(|f| format!("{prefix}.{f}")))
        );
    }
    for message in ["InputNode", "OutputNode"] {
        assert_eq!(
            proto_fields(message),
            (vec![], vec![]),
            "{message} has fields now"
        );
    }
}

/// Likewise for edges: every Edge field but the two ends has its own routing line.
#[test]
fn every_edge_field_of_the_proto_is_described() {
    let (fields, _) = proto_fields("Edge");
    let plain = Edge {
        source: "a".to_string(),
        target: "b".to_string(),
        ..Default::default()
    };
    let everything = Edge {
        source: "a".to_string(),
        target: "b".to_string(),
        mode: EdgeMode::Order as i32,
        select: "/x".to_string(),
        tensors: Some(Box::default()),
        into: "/y".to_string(),
        optional: true,
        if_missing: Some(string("m")),
        when: Some(Box::default()),
        weight: Some(1),
        order: 1,
    };
    let mut lines = Vec::new();
    compare_edge(("a", "b", 0), &plain, &everything, (0, 1), &mut lines);
    let described: Vec<String> = fields
        .into_iter()
        .filter(|f| f != "source" && f != "target")
        .collect();
    assert_eq!(lines.len(), described.len(), "{lines:?}");
    for (line, field) in lines.iter().zip(&described) {
        assert!(
            line.starts_with(&format!("edge a -> b: {field} ")),
            "{line}"
        );
    }
}

#[test]
fn a_code_change_restarts_every_replica_and_names_the_nodes_whose_module_changed() {
    let graph = sample();
    let files = |pairs: &[(&str, &str)]| CodeFiles {
        digest: Some(format!("sha256:{}", pairs.len())),
        files: pairs
            .iter()
            .map(|(n, h)| ((*n).to_owned(), (*h).to_owned()))
            .collect(),
    };
    let old = files(&[("samples/__init__.py", "a"), ("samples/models.py", "b")]);
    let same = diff(&graph, &graph).with_code(&old, &old, &graph);
    assert!(same.code.is_none() && same.is_empty(), "no change: {same}");
    let new = CodeFiles {
        digest: Some("sha256:other".into()),
        ..files(&[
            ("samples/__init__.py", "a"),
            ("samples/models.py", "changed"),
            ("samples/extra.py", "new"),
        ])
    };
    let d = diff(&graph, &graph).with_code(&old, &new, &graph);
    assert!(d.restarts_all_replicas);
    let code = d.code.clone().expect("a code change");
    assert_eq!(code.files, vec!["+samples/extra.py", "~samples/models.py"]);
    // Every model node of the sample imports samples.models.
    let models: Vec<&NodeDiff> = d
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Model)
        .collect();
    assert!(!models.is_empty());
    for node in models {
        assert_eq!(node.change, Change::Restarted, "{node:?}");
        assert!(node.fields.contains(&"code".to_owned()), "{node:?}");
        assert!(code.nodes.contains(&node.node));
    }
    let text = d.to_string();
    assert!(
        text.contains("code: sha256:2 → sha256:other (2 files changed"),
        "{text}"
    );
    assert!(d.lines(20).iter().any(|l| l.starts_with("code: ")));
    // A file no node imports restarts the replicas all the same, naming no node.
    let unrelated = CodeFiles {
        digest: Some("sha256:third".into()),
        ..files(&[
            ("samples/__init__.py", "a"),
            ("samples/models.py", "b"),
            ("samples/extra.py", "x"),
        ])
    };
    let d = diff(&graph, &graph).with_code(&old, &unrelated, &graph);
    assert!(d.restarts_all_replicas && d.code.as_ref().unwrap().nodes.is_empty());
    assert_eq!(
        module_files("a.b:C"),
        ["a/__init__.py", "a/b.py", "a/b/__init__.py"]
    );
}
