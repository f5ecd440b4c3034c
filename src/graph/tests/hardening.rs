//! Hostile input (issue 14): long cycles and chains on a worker-sized stack, one nesting limit
//! for every form, bounded parsing, counts and memory checked on the wire before decoding,
//! capped messages. Each test here failed (or aborted, or ran for minutes) before the fix.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;

use super::properties::{json_value, predicate_strategy};
use super::wire_bytes::{self, push_len};
use crate::graph::proto::{
    Compare, DeploymentOptions, Edge, InputNode, JsonObject, JsonValue, ModelNode, Node, Op,
    OutputNode, PipelineGraph, Predicate, node, predicate,
};
use crate::graph::{
    GraphError, Limits, MAX_DECODED_BYTES, MAX_GRAPH_BYTES, MAX_MESSAGE_BYTES, MAX_NESTING_DEPTH,
    MAX_PROBLEM_BYTES, ValidationError, decode, encode, from_json, from_yaml, precheck, to_json,
    to_yaml, validate,
};

/// Runs `test` on a thread with a tokio worker's stack (2 MiB): recursion over input would
/// overflow it and abort the whole test process.
fn on_worker_stack<T: Send + 'static>(test: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(test)
        .expect("spawn a test thread")
        .join()
        .expect("the test thread finished")
}

fn model(name: String) -> Node {
    Node {
        name,
        kind: Some(node::Kind::Model(ModelNode {
            import_path: "pkg.models:Model".into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn edge(source: &str, target: &str) -> Edge {
    Edge {
        source: source.into(),
        target: target.into(),
        into: format!("/{source}"),
        ..Default::default()
    }
}

/// in -> m0 -> m1 -> ... -> m(n-1) -> out, and, if `cycle`, m(n-1) -> m0.
fn chain(n: usize, cycle: bool) -> PipelineGraph {
    let mut nodes = vec![Node {
        name: "in".into(),
        kind: Some(node::Kind::Input(InputNode {})),
        ..Default::default()
    }];
    nodes.extend((0..n).map(|i| model(format!("m{i}"))));
    nodes.push(Node {
        name: "out".into(),
        kind: Some(node::Kind::Output(OutputNode {})),
        ..Default::default()
    });
    let mut edges = vec![edge("in", "m0")];
    edges.extend((1..n).map(|i| edge(&format!("m{}", i - 1), &format!("m{i}"))));
    edges.push(edge(&format!("m{}", n - 1), "out"));
    if cycle {
        edges.push(edge(&format!("m{}", n - 1), "m0"));
    }
    PipelineGraph {
        ingress: "in".into(),
        nodes,
        edges,
        ..Default::default()
    }
}

#[test]
fn a_100000_node_cycle_is_a_named_error_on_a_worker_stack() {
    let (reason, message) = on_worker_stack(|| {
        let bytes = prost::Message::encode_to_vec(&chain(99_998, true));
        let errors = validate(decode(&bytes).expect("decodes")).expect_err("a cycle");
        let cycle = errors
            .errors()
            .iter()
            .find_map(|e| match e {
                ValidationError::Cycle { nodes } => Some(nodes.len()),
                _ => None,
            })
            .expect("a Cycle error");
        // The whole cycle, back to its start.
        assert_eq!(cycle, 99_999);
        (errors.reason(), errors.to_string())
    });
    assert_eq!(reason, "CycleDetected");
    assert!(
        message.len() <= MAX_MESSAGE_BYTES,
        "{} bytes",
        message.len()
    );
    assert!(message.contains("99999 in all"), "{message}");
}

#[test]
fn a_100000_node_chain_validates_on_a_worker_stack() {
    let nodes = on_worker_stack(|| {
        let graph = chain(99_998, false);
        let valid = validate(graph).expect("a chain within the limits is valid");
        let _ = valid.digest();
        valid.node_count()
    });
    assert_eq!(nodes, 100_000);
}

#[test]
fn many_small_cycles_cost_linear_time() {
    // 49,000 two-node cycles: one mark array per component made this quadratic.
    let mut graph = chain(2, false);
    for i in 0..49_000 {
        let (a, b) = (format!("a{i}"), format!("b{i}"));
        graph.nodes.push(model(a.clone()));
        graph.nodes.push(model(b.clone()));
        graph.edges.push(edge(&a, &b));
        graph.edges.push(edge(&b, &a));
    }
    let start = Instant::now();
    let errors = validate(graph).expect_err("cycles");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let cycles = errors
        .errors()
        .iter()
        .filter(|e| matches!(e, ValidationError::Cycle { .. }))
        .count();
    assert_eq!(cycles, 49_000);
    assert!(errors.to_string().len() <= MAX_MESSAGE_BYTES);
}

#[test]
fn a_node_with_100000_in_edges_validates_in_linear_time() {
    // `build_dag` looked each edge up in its target's in-edge list: quadratic here.
    let n = 99_000;
    let mut graph = chain(1, false);
    for i in 0..n {
        graph.nodes.push(model(format!("x{i}")));
        graph.edges.push(edge("in", &format!("x{i}")));
        graph.edges.push(edge(&format!("x{i}"), "out"));
    }
    let start = Instant::now();
    validate(graph).expect("valid");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn joins_below_a_long_switch_branch_are_checked_in_bounded_time() {
    // in -> sw -> m0 -> m1 -> ... (a switch case), every chain node also feeding the output:
    // the dominator search climbed the whole chain for each edge into the output.
    let n = 99_000;
    let mut graph = chain(n, false);
    graph.nodes.push(Node {
        name: "sw".into(),
        kind: Some(node::Kind::Switch(crate::graph::proto::SwitchNode {
            on_no_match: crate::graph::proto::NoMatch::Skip as i32,
        })),
        ..Default::default()
    });
    graph.edges[0] = edge("in", "sw");
    let mut case = edge("sw", "m0");
    case.when = Some(Box::new(Predicate {
        p: Some(predicate::P::Compare(Compare {
            path: "/in".into(),
            op: Op::Exists as i32,
            value: None,
        })),
    }));
    graph.edges.push(case);
    graph
        .edges
        .extend((0..n - 1).map(|i| edge(&format!("m{i}"), "out")));
    let start = Instant::now();
    let result = on_worker_stack(move || validate(graph).map(|_| ()));
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    if let Err(errors) = result {
        assert!(errors.to_string().len() <= MAX_MESSAGE_BYTES);
    }
}

// -- one nesting limit ----------------------------------------------------------------------------

/// A graph whose node `m0` has `depth` nested lists as its `input_template`.
fn nested_template(depth: usize) -> PipelineGraph {
    let mut value = JsonValue::int(1);
    for _ in 0..depth {
        value = JsonValue::list(vec![value]);
    }
    let mut graph = chain(1, false);
    graph.nodes[1].input_template = Some(value);
    graph
}

#[test]
fn every_form_accepts_the_same_nesting() {
    // Node 2, JsonValue 3, then two levels (JsonList, JsonValue) per list.
    let deepest = (MAX_NESTING_DEPTH - 3) / 2;
    for depth in [0, 1, deepest - 1, deepest, deepest + 1, 40, 50, 60] {
        let graph = nested_template(depth);
        let fits = depth <= deepest;
        let json = serde_json::to_string(&graph).expect("to JSON");
        let yaml = serde_yaml::to_string(&graph).expect("to YAML");
        let protobuf = prost::Message::encode_to_vec(&graph);
        let results = [
            ("JSON", from_json(&json).map(|_| ())),
            ("YAML", from_yaml(&yaml).map(|_| ())),
            ("protobuf", decode(&protobuf).map(|_| ())),
            ("encode", encode(&graph).map(|_| ())),
        ];
        for (form, result) in results {
            match result {
                Ok(()) => assert!(fits, "{form} accepted {depth} nested lists"),
                Err(GraphError::TooDeep { at, limit }) => {
                    assert!(!fits, "{form} refused {depth} nested lists");
                    assert!(limit >= MAX_NESTING_DEPTH, "{form}: {limit}");
                    assert!(
                        at.contains("nodes[1].input_template") || at.contains("text at line"),
                        "{form}: {at}"
                    );
                }
                Err(other) => panic!("{form} at depth {depth}: {other}"),
            }
        }
        let validated = validate(graph);
        assert_eq!(validated.is_ok(), fits, "validate at depth {depth}");
        if let Err(errors) = validated {
            assert_eq!(errors.reason(), "NestingTooDeep");
        }
    }
}

/// The wire form of `nested_template(depth)`, written directly: building the nested structure
/// (and dropping it) would itself recurse `depth` times.
fn nested_template_bytes(depth: usize) -> Vec<u8> {
    wire_bytes::nested_template_bytes("m0", depth)
}

#[test]
fn protobuf_deeper_than_prost_decodes_is_refused_by_name() {
    assert_eq!(
        nested_template_bytes(3),
        prost::Message::encode_to_vec(&PipelineGraph {
            nodes: vec![Node {
                name: "m0".into(),
                input_template: Some(
                    nested_template(3).nodes[1]
                        .input_template
                        .clone()
                        .expect("set")
                ),
                ..Default::default()
            }],
            ..Default::default()
        })
    );
    for depth in [31, 48, 200, 10_000] {
        let bytes = nested_template_bytes(depth);
        let refused = on_worker_stack(move || decode(&bytes).map(|_| ()));
        match refused {
            Err(GraphError::TooDeep { at, .. }) => {
                assert!(at.starts_with("nodes[0].input_template"), "{at}")
            }
            other => panic!("{depth}: {other:?}"),
        }
    }
    assert!(decode(&nested_template_bytes(30)).is_ok());
}

fn deep_value(shape: &[bool], leaf: JsonValue) -> JsonValue {
    shape.iter().fold(leaf, |value, &list| {
        if list {
            JsonValue::list(vec![value])
        } else {
            JsonValue::object(BTreeMap::from([("k".to_string(), value)]))
        }
    })
}

/// A graph carrying `value` in every place a JSON value or predicate can nest.
fn graph_with(value: JsonValue, when: Predicate) -> PipelineGraph {
    let mut graph = chain(1, false);
    if let Some(node::Kind::Model(model)) = &mut graph.nodes[1].kind {
        model.init_args = vec![value.clone()];
        model.init_kwargs = BTreeMap::from([("arg".to_string(), value.clone())]);
        model.deployment = Some(Box::new(DeploymentOptions {
            user_config: Some(JsonObject {
                fields: BTreeMap::from([("c".to_string(), value.clone())]),
            }),
            ..Default::default()
        }));
    }
    graph.nodes[1].fallback_value = Some(value.clone());
    graph.edges[0].if_missing = Some(value);
    graph.edges[1].when = Some(Box::new(when));
    graph
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever YAML or JSON accepts encodes, and decodes back equal; what they refuse for
    /// nesting, protobuf refuses too.
    #[test]
    fn text_and_protobuf_agree(
        shape in vec(any::<bool>(), 0..45),
        leaf in json_value(),
        predicate_depth in 0usize..40,
        inner in predicate_strategy(),
    ) {
        let mut when = inner;
        for _ in 0..predicate_depth {
            when = Predicate { p: Some(predicate::P::Negate(Box::new(when))) };
        }
        let graph = graph_with(deep_value(&shape, leaf), when);
        let protobuf = prost::Message::encode_to_vec(&graph);
        let decoded = decode(&protobuf);
        for text in [to_json(&graph).ok(), to_yaml(&graph).ok()].into_iter().flatten() {
            let parsed = if text.trim_start().starts_with('{') { from_json(&text) } else { from_yaml(&text) };
            match (&parsed, &decoded) {
                (Ok(parsed), Ok(_)) => {
                    // (Compared with the text's own graph: floats read from text may differ
                    // from the original in the last bit.)
                    let bytes = encode(parsed).expect("what text accepts encodes");
                    prop_assert_eq!(&crate::graph::decode(&bytes).expect("and decodes"), parsed);
                }
                (Err(GraphError::TooDeep { .. }), Err(GraphError::TooDeep { .. })) => {
                    prop_assert!(encode(&graph).is_err());
                }
                (parsed, decoded) => prop_assert!(false, "text: {:?}, protobuf: {:?}", parsed.as_ref().err(), decoded.as_ref().err()),
            }
        }
    }

    /// The wire scan counts nesting exactly as the decoded graph nests, and every node and edge.
    #[test]
    fn the_wire_scan_matches_the_decoded_graph(graph in super::properties::arbitrary_graph()) {
        let bytes = prost::Message::encode_to_vec(&graph);
        let summary = precheck(&bytes, &Limits::default()).expect("small graphs pass");
        prop_assert_eq!(summary.nodes, graph.nodes.len());
        prop_assert_eq!(summary.edges, graph.edges.len());
        prop_assert_eq!(
            Some(summary.depth),
            crate::graph::depth::check(&graph, usize::MAX).ok()
        );
    }
}

// -- bounded parsing --------------------------------------------------------------------------------

fn refused_quickly(
    label: &str,
    read: impl FnOnce() -> Result<PipelineGraph, GraphError>,
) -> GraphError {
    let start = Instant::now();
    let error = read().expect_err(label);
    assert!(
        // Generous for a debug build on a shared machine; the unbounded cases took minutes or
        // gigabytes.
        start.elapsed() < Duration::from_secs(10),
        "{label}: {:?}",
        start.elapsed()
    );
    error
}

#[test]
fn deep_text_is_refused_before_parsing() {
    const LEVELS: usize = 100_000;
    let flow_maps = format!("nodes: {}1{}", "{a: ".repeat(LEVELS), "}".repeat(LEVELS));
    let flow_lists = format!("{}{}", "[".repeat(LEVELS), "]".repeat(LEVELS));
    let json = format!(
        "{{\"nodes\": {}{}}}",
        "[".repeat(LEVELS),
        "]".repeat(LEVELS)
    );
    for (label, error) in [
        (
            "YAML flow maps",
            refused_quickly("maps", || from_yaml(&flow_maps)),
        ),
        (
            "YAML flow lists",
            refused_quickly("lists", || from_yaml(&flow_lists)),
        ),
        ("JSON", refused_quickly("json", || from_json(&json))),
    ] {
        assert!(
            matches!(error, GraphError::TooDeep { .. }),
            "{label}: {error}"
        );
        assert_eq!(error.reason(), "NestingTooDeep");
    }
}

#[test]
fn quotes_comments_and_block_scalars_cannot_hide_nesting() {
    const LEVELS: usize = 5_000;
    // Each would hide a ']' from a scanner that misreads quoting, while the '[' before it nests.
    let disguises = [
        "[ ']' ",
        "[ \"]\" ",
        "[ \"\\\"]\" ",
        "[ ''']' ",
        "[ !!str ']' ",
        "[ &a ']' ",
        "[{\"k\":\"]\"}, ",
        "[ a\n'x ']' ",
        "[ it's, ']' ",
    ];
    for disguise in disguises {
        let text = format!("key: {}", disguise.repeat(LEVELS));
        let error = refused_quickly(disguise, || from_yaml(&text));
        match error {
            GraphError::TooDeep { .. } => {}
            // Then YAML itself does not nest this deep (serde_yaml stops at 128 levels).
            other => {
                let text = format!("key: {}", disguise.repeat(300));
                let parsed = serde_yaml::from_str::<serde_yaml::Value>(&text);
                assert!(
                    !parsed
                        .as_ref()
                        .is_err_and(|e| e.to_string().contains("recursion")),
                    "{disguise:?}: the scan passed what YAML nests deeper than 128: {other}"
                );
            }
        }
    }
    // A block scalar's brackets are text, not nesting.
    let block = format!("name: g\nversion: |\n  {}\n", "[".repeat(1000));
    assert!(!matches!(
        from_yaml(&block),
        Err(GraphError::TooDeep { .. })
    ));
}

#[test]
fn text_larger_than_a_graph_may_be_is_refused() {
    let text = " ".repeat(MAX_GRAPH_BYTES + 1);
    let error = refused_quickly("large", || from_yaml(&text));
    assert!(matches!(error, GraphError::TooLarge { .. }), "{error}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// JSON text is YAML too: whatever strings it holds, the YAML scan finds its nesting.
    #[test]
    fn the_yaml_scan_never_undercounts_json(
        shape in vec(any::<bool>(), 1..30),
        strings in vec("[\\[\\]{}'\":,# a\\\\-]{0,6}", 1..6),
    ) {
        let leaf = JsonValue::list(strings.into_iter().map(JsonValue::string).collect());
        let value = deep_value(&shape, leaf);
        let text = serde_json::to_string(&value.to_json()).expect("JSON");
        let depth = shape.len() + 1;
        prop_assert!(crate::graph::textscan::check_yaml(&text, depth - 1).is_err(), "{}", text);
        prop_assert!(crate::graph::textscan::check_json(&text, depth - 1).is_err());
        prop_assert!(crate::graph::textscan::check_json(&text, depth).is_ok());
    }
}

// -- limits on the wire ---------------------------------------------------------------------------

#[test]
fn node_and_edge_limits_are_counted_before_decoding() {
    // 16 MiB of empty node entries (tag 6, length 0): 2.3 GB once decoded.
    let nodes = [0x32u8, 0x00].repeat(8 << 20);
    let error = refused_quickly("nodes", || decode(&nodes));
    assert!(
        matches!(error, GraphError::TooMany { what: "nodes", .. }),
        "{error}"
    );
    assert_eq!(error.reason(), "LimitExceeded");
    let edges = [0x3au8, 0x00].repeat(600_000);
    let error = refused_quickly("edges", || decode(&edges));
    assert!(
        matches!(error, GraphError::TooMany { what: "edges", .. }),
        "{error}"
    );
}

#[test]
fn memory_is_bounded_on_the_wire_before_decoding() {
    // One model node whose init_args holds 30 million empty values: 2 bytes each on the wire,
    // 40 in memory (and twice that while the list grows).
    let args = [0x12u8, 0x00].repeat(30 << 20 >> 1);
    let mut node = vec![0x5au8]; // Node.model (field 11)
    push_len(&mut node, &args);
    let mut graph = vec![0x32u8]; // PipelineGraph.nodes
    push_len(&mut graph, &node);
    let error = refused_quickly("values", || decode(&graph));
    assert!(matches!(error, GraphError::TooCostly { .. }), "{error}");
    assert_eq!(error.reason(), "GraphTooLarge");
    let large = vec![0u8; MAX_GRAPH_BYTES + 1];
    assert!(matches!(decode(&large), Err(GraphError::TooLarge { .. })));
}

/// A valid graph at the node and edge limits: a chain of models, each also joined to the next
/// few, until the edge limit.
pub(super) fn largest_valid_graph() -> PipelineGraph {
    let limits = Limits::default();
    let n = limits.max_nodes - 2;
    let mut graph = chain(n, false);
    'extra: for step in [2, 3, 4, 5, 6] {
        for i in 0..n - step {
            if graph.edges.len() == limits.max_edges {
                break 'extra;
            }
            graph
                .edges
                .push(edge(&format!("m{i}"), &format!("m{}", i + step)));
        }
    }
    graph
}

#[test]
fn the_largest_graph_within_the_limits_fits_the_memory_bound() {
    let limits = Limits::default();
    let graph = largest_valid_graph();
    assert_eq!(graph.nodes.len(), limits.max_nodes);
    assert_eq!(graph.edges.len(), limits.max_edges);
    let bytes = prost::Message::encode_to_vec(&graph);
    let summary = precheck(&bytes, &limits).expect("within the limits");
    assert!(summary.decoded_bytes <= MAX_DECODED_BYTES);
    eprintln!(
        "largest valid graph: {} bytes on the wire, at most {} bytes decoded",
        bytes.len(),
        summary.decoded_bytes
    );
    validate(decode(&bytes).expect("decodes")).expect("valid");
}

#[test]
fn malformed_wire_data_is_refused_without_panic() {
    for bytes in [
        &[0x32, 0x05, 0x00][..],
        &[
            0x32, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ][..],
        &[0x33][..],
        &[0x00, 0x00][..],
        &[0x80][..],
    ] {
        assert!(decode(bytes).is_err(), "{bytes:?}");
    }
}

// -- capped messages ------------------------------------------------------------------------------

#[test]
fn messages_about_huge_graphs_stay_within_the_cap() {
    // 60,000 duplicate nodes made a 6.4 MB message.
    let mut graph = chain(1, false);
    graph
        .nodes
        .extend((0..60_000).map(|_| model("m0".to_string())));
    let errors = validate(graph).expect_err("duplicates");
    assert!(errors.len() >= 60_000);
    let message = errors.to_string();
    assert!(
        message.len() <= MAX_MESSAGE_BYTES,
        "{} bytes",
        message.len()
    );
    assert!(message.contains("more"), "{message}");
    assert!(errors.summary(usize::MAX).len() <= MAX_MESSAGE_BYTES);
    // Every problem stays available.
    assert_eq!(
        errors
            .errors()
            .iter()
            .filter(|e| e.reason() == "DuplicateNode")
            .count(),
        60_000
    );

    // A megabyte-long name is cut, on a character boundary.
    let mut graph = chain(1, false);
    graph.nodes[1].name = "é".repeat(500_000);
    let errors = validate(graph).expect_err("a bad name");
    let message = errors.to_string();
    assert!(
        message.len() <= MAX_MESSAGE_BYTES,
        "{} bytes",
        message.len()
    );
    for error in errors.errors() {
        assert!(crate::graph::capped(error, MAX_PROBLEM_BYTES).len() <= MAX_PROBLEM_BYTES);
    }
}

#[test]
fn compare_predicates_nest_within_the_limit() {
    // A guard with a literal as deep as the limit allows still passes every form.
    let when = Predicate {
        p: Some(predicate::P::Compare(Compare {
            path: "/in".into(),
            op: Op::Eq as i32,
            value: Some(JsonValue::int(1)),
        })),
    };
    let graph = graph_with(JsonValue::int(1), when);
    let bytes = encode(&graph).expect("encodes");
    assert_eq!(decode(&bytes).expect("decodes"), graph);
}
