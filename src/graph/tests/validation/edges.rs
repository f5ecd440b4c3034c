//! Validation of edges (endpoints, duplicates, fields) and of the routing nodes (split, switch)
//! with their predicates and pointers.

use super::*;

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
