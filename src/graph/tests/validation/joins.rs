//! Validation of scopes and joins: exclusive joins after routing, input assembly (`into`,
//! kwargs), and what a predicate may read.

use super::*;

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
