//! Shared node applications: which changes give a node a new key (a restart), which travel in
//! place, and that the layout names every node it splits off.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::graph::proto::node;
use crate::graph::tests::samples::{read, yaml_samples};
use crate::graph::{from_yaml, validate};
use crate::serve::rollout::MAX_BASE_NAME;
use crate::serve::shared::{SharedLayout, WIRING_KEY, is_node_application, node_map, split};
use crate::serve::{RenderError, RenderOptions, render};

fn layout_of(yaml: &str) -> Result<SharedLayout, RenderError> {
    let valid = validate(from_yaml(yaml).expect("yaml")).expect("valid");
    let rendered = render(&valid, &RenderOptions::default()).expect("renders");
    split(&rendered, "pipe")
}

fn edited(yaml: &str, edit: impl FnOnce(&mut crate::graph::proto::PipelineGraph)) -> String {
    let mut graph = from_yaml(yaml).expect("yaml");
    edit(&mut graph);
    crate::graph::to_yaml(&graph).expect("to yaml")
}

fn model_of<'a>(
    graph: &'a mut crate::graph::proto::PipelineGraph,
    name: &str,
) -> &'a mut crate::graph::proto::ModelNode {
    let node = graph
        .nodes
        .iter_mut()
        .find(|n| n.name == name)
        .expect("node");
    match &mut node.kind {
        Some(node::Kind::Model(model)) => model,
        _ => panic!("{name} is no model"),
    }
}

fn names(layout: &SharedLayout) -> BTreeSet<String> {
    layout.nodes.keys().cloned().collect()
}

#[test]
fn every_sample_splits_into_an_executor_and_its_node_applications() {
    for name in yaml_samples() {
        let layout = layout_of(&read(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let deployments = layout.version["deployments"].as_array().expect("list");
        assert_eq!(deployments.len(), 1, "{name}: only the executor stays");
        let wiring = &deployments[0]["user_config"][WIRING_KEY];
        assert!(wiring["graph"]["nodes"].is_array(), "{name}");
        assert_eq!(layout.version["args"]["wiring"], "user_config", "{name}");
        assert!(layout.version["args"].get("graph").is_none(), "{name}");
        let map = node_map(&layout.version);
        assert_eq!(
            map.values().cloned().collect::<BTreeSet<_>>(),
            names(&layout),
            "{name}: the executor names exactly the node applications"
        );
        for (node, app) in &map {
            let application = &layout.nodes[app];
            assert!(is_node_application(application), "{name}");
            assert!(application["route_prefix"].is_null(), "{name}");
            assert_eq!(application["deployments"][0]["name"], node.as_str());
            assert_eq!(application["args"]["node"], node.as_str());
            assert!(app.starts_with("pipe--n") && app.len() == 7 + 11, "{app}");
        }
    }
}

#[test]
fn a_changed_init_argument_gives_exactly_that_node_a_new_application() {
    let v1 = layout_of(&read("ensemble.yaml")).expect("v1");
    let v2 = layout_of(&read("ensemble-v2.yaml")).expect("v2");
    let (m1, m2) = (node_map(&v1.version), node_map(&v2.version));
    let changed: Vec<&String> = m1.keys().filter(|n| m1[*n] != m2[*n]).collect();
    assert_eq!(changed, vec!["model_b"]);
    // The executor's args do not change: it is reconfigured, not restarted.
    assert_eq!(v1.version["args"], v2.version["args"]);
}

#[test]
fn wiring_and_in_place_options_keep_every_node_application() {
    let base = read("ensemble.yaml");
    let before = layout_of(&base).expect("before");
    let wiring = edited(&base, |g| {
        g.version = "9".into();
        let a = g.nodes.iter_mut().find(|n| n.name == "model_a").unwrap();
        a.timeout_ms = 1234;
        model_of(g, "model_a").method = "predict".into();
    });
    let after = layout_of(&wiring).expect("wiring");
    assert_eq!(before.nodes, after.nodes);
    assert_eq!(before.version["args"], after.version["args"]);
    assert_ne!(
        before.version["deployments"][0]["user_config"],
        after.version["deployments"][0]["user_config"]
    );

    let in_place = edited(&base, |g| {
        let options = model_of(g, "model_a").deployment.as_mut().unwrap();
        options.max_ongoing_requests = Some(30);
    });
    let after = layout_of(&in_place).expect("in place");
    assert_eq!(names(&before), names(&after), "same keys");
    let app = &node_map(&after.version)["model_a"];
    assert_eq!(
        after.nodes[app]["deployments"][0]["max_ongoing_requests"],
        30
    );
}

#[test]
fn restart_options_and_the_environment_are_part_of_the_key() {
    let base = read("ensemble.yaml");
    let before = layout_of(&base).expect("before");
    let cpus = edited(&base, |g| {
        let options = model_of(g, "preprocess").deployment.as_mut().unwrap();
        options.ray_actor_options.as_mut().unwrap().num_cpus = Some(0.2);
    });
    let after = layout_of(&cpus).expect("cpus");
    let (m1, m2) = (node_map(&before.version), node_map(&after.version));
    assert_ne!(m1["preprocess"], m2["preprocess"]);
    assert_eq!(m1["model_a"], m2["model_a"]);

    // A new runtime package (or code layer) changes every node's environment: all restart.
    let valid = validate(from_yaml(&base).unwrap()).unwrap();
    let options = RenderOptions {
        runtime_py_modules: vec!["https://example.invalid/raypipe_runtime-2.zip".into()],
        ..RenderOptions::default()
    };
    let moved = split(&render(&valid, &options).unwrap(), "pipe").unwrap();
    assert!(names(&moved).is_disjoint(&names(&before)));
}

#[test]
fn the_executor_keeps_its_user_config_for_the_wiring() {
    let yaml = edited(&read("ensemble.yaml"), |g| {
        let executor = g.executor.get_or_insert_with(Default::default);
        executor.user_config = Some(Default::default());
    });
    assert_eq!(layout_of(&yaml), Err(RenderError::ExecutorUserConfig));
}

#[test]
fn node_application_names_fit_serve_for_the_longest_base() {
    let valid = validate(from_yaml(&read("ensemble.yaml")).unwrap()).unwrap();
    let rendered = render(&valid, &RenderOptions::default()).unwrap();
    let base = "b".repeat(MAX_BASE_NAME);
    let layout = split(&rendered, &base).unwrap();
    assert!(layout.nodes.keys().all(|n| n.len() <= 63));
    // Fused nodes stay with the executor, as definitions in its args (one keyed unit).
    let fused = layout.version["args"]["fused"].as_array().unwrap();
    assert!(fused.iter().all(|n| n["name"].is_string()));
    assert!(
        layout
            .version
            .get("route_prefix")
            .and_then(Value::as_str)
            .is_some()
    );
}
