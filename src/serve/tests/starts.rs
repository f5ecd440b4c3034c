//! What a rollout starts, counted on the rendered config (`serve::rollout_starts`).

use crate::graph::diff::{GraphDiff, Starts, diff};
use crate::graph::proto::{AutoscalingConfig, DeploymentOptions, PipelineGraph, node};
use crate::graph::{from_yaml, validate};
use crate::serve::*;

const SAMPLE: &str = include_str!("../../../samples/graphs/switch-canary.yaml");

fn sample() -> PipelineGraph {
    from_yaml(SAMPLE).unwrap()
}

fn options<'a>(graph: &'a mut PipelineGraph, name: &str) -> &'a mut DeploymentOptions {
    let node = graph.nodes.iter_mut().find(|n| n.name == name).unwrap();
    match &mut node.kind {
        Some(node::Kind::Model(model)) => model.deployment.get_or_insert_with(Default::default),
        _ => panic!("{name} is not a model"),
    }
}

/// The plan from `old` to `new`, its starts counted on `new` rendered with `opts`.
fn planned(old: &PipelineGraph, new: &PipelineGraph, opts: &RenderOptions) -> GraphDiff {
    let mut plan = diff(old, new);
    let rendered = render(&validate(new.clone()).unwrap(), opts).unwrap();
    plan.starts = Some(rollout_starts(&plan, &rendered));
    plan
}

fn total(replicas: u32, gpus: f64) -> Starts {
    Starts { replicas, gpus }
}

#[test]
fn a_rollout_starts_the_replicas_and_gpus_of_what_restarts() {
    let defaults = RenderOptions::default();
    // The sample: the executor and four model nodes with options of their own, one replica each.
    let unchanged = planned(&sample(), &sample(), &defaults).starts.unwrap();
    assert_eq!(unchanged.immediate, Starts::default());
    assert_eq!(unchanged.canary, total(5, 0.0));

    // One node gets half a GPU each (new replicas) and a second replica (in place): an
    // Immediate rollout starts that node's two replicas only, a canary every replica.
    let mut new = sample();
    let stable = options(&mut new, "stable");
    stable.num_replicas = Some(2);
    stable
        .ray_actor_options
        .get_or_insert_with(Default::default)
        .num_gpus = Some(0.5);
    let one_node = planned(&sample(), &new, &defaults);
    assert!(!one_node.restarts_all_replicas, "{one_node}");
    let starts = one_node.starts.unwrap();
    assert_eq!(starts.immediate, total(2, 1.0));
    assert_eq!(starts.canary, total(6, 1.0));
    assert!(
        one_node.to_string().contains(
            "starts: 2 replicas (1 GPU) with strategy Immediate, 6 replicas (1 GPU) with Canary"
        ),
        "{one_node}"
    );

    // A wiring change restarts the whole application: both strategies start everything.
    let mut rewired = new.clone();
    rewired.deadline_ms += 1;
    let all = planned(&sample(), &rewired, &defaults);
    assert!(all.restarts_all_replicas);
    let starts = all.starts.unwrap();
    assert_eq!(starts.immediate, starts.canary);

    // A pipeline's node override pins the count the rendering deploys.
    let mut pinned = RenderOptions::default();
    pinned.node_overrides.insert(
        "stable".into(),
        NodeOverride {
            num_replicas: Some(3),
            max_ongoing_requests: None,
        },
    );
    let starts = planned(&sample(), &new, &pinned).starts.unwrap();
    assert_eq!(starts.immediate, total(3, 1.5));

    // Autoscaling starts at initial_replicas, else min_replicas, else Serve's 1.
    for (min, initial, replicas) in [(Some(2), Some(3), 3), (Some(0), None, 0), (None, None, 1)] {
        let mut scaled = sample();
        options(&mut scaled, "premium").autoscaling_config = Some(AutoscalingConfig {
            min_replicas: min,
            initial_replicas: initial,
            max_replicas: Some(4),
            ..Default::default()
        });
        let starts = planned(&sample(), &scaled, &defaults).starts.unwrap();
        assert_eq!(starts.canary.replicas, 4 + replicas, "{min:?} {initial:?}");
    }

    // A node without options of its own runs fused in the executor: no replicas of its own.
    let mut fused = sample();
    let audit = fused.nodes.iter_mut().find(|n| n.name == "audit").unwrap();
    if let Some(node::Kind::Model(model)) = &mut audit.kind {
        model.deployment = None;
    }
    let starts = planned(&fused, &fused, &defaults).starts.unwrap();
    assert_eq!(starts.canary, total(4, 0.0));
}
