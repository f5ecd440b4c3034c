//! One test per validation error (at least), written as the YAML a person would write. The
//! tests follow the stages of `graph/validate/`: graph fields and nodes (`nodes`), edges and
//! routing nodes (`edges`), cycles and reachability (`structure`), scopes and joins (`joins`);
//! this file holds the shared builders and the tests of the whole (limits, all problems at once,
//! stable reasons, order, bounded summaries).

mod edges;
mod joins;
mod nodes;
mod structure;

use crate::graph::{Limits, ValidationError, from_yaml, validate, validate_with};

/// A graph with the ingress `request`, the output `response`, the given extra nodes and edges
/// (YAML flow-style list items, one per line).
pub(super) fn graph(nodes: &[&str], edges: &[&str]) -> String {
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

pub(super) fn model(name: &str) -> String {
    format!("{{name: {name}, model: {{import_path: \"samples.models:M\"}}}}")
}

pub(super) fn problems_of(yaml: &str) -> Vec<ValidationError> {
    let parsed =
        from_yaml(yaml).unwrap_or_else(|e| panic!("test YAML does not parse: {e}\n{yaml}"));
    match validate(parsed) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.into_iter().collect(),
    }
}

/// Asserts that some problem has this reason and a message containing every fragment.
#[track_caller]
pub(super) fn assert_problem(yaml: &str, reason: &str, fragments: &[&str]) -> Vec<ValidationError> {
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
pub(super) fn assert_valid(yaml: &str) {
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

pub(super) fn simple() -> String {
    graph(
        &[&model("m")],
        &[
            "{source: request, target: m}",
            "{source: m, target: response}",
        ],
    )
}

pub(super) fn split(edges_out: &[&str]) -> String {
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

pub(super) fn switch(node: &str, edges_out: &[&str]) -> String {
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

pub(super) const CASE: &str = "when: {compare: {path: /request/tier, op: EQ, value: gold}}";

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
