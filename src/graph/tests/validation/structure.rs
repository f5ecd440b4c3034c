//! Validation of the graph's structure: cycles, unreachable nodes, dead ends, shadow branches.

use super::*;

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
