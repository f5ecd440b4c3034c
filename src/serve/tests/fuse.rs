//! Property tests of fusion planning and its rendering over the graph module's random DAGs,
//! with random per-node and graph-wide `fuse` switches and operator overrides: fusion never
//! changes the set of nodes that run (each model node is fused or a deployment, never both or
//! neither), never fuses a node with resources or other deployment options of its own, an
//! overridden node or one whose switch is off, and the rendered config says exactly that.

use std::collections::BTreeSet;

use proptest::collection::vec;
use proptest::prelude::*;

use crate::graph::proto::{DeploymentOptions, node};
use crate::graph::tests::properties::valid_dag;
use crate::graph::validate;
use crate::serve::fuse::{KeptReason, plan};
use crate::serve::{DEFAULT_EXECUTOR_DEPLOYMENT, NodeOverride, RenderOptions, render};

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn fusion_keeps_every_node_and_never_fuses_one_with_resources(
        mut graph in valid_dag(),
        node_switches in vec(proptest::option::of(any::<bool>()), 16),
        graph_switch in proptest::option::of(any::<bool>()),
        overridden_mask in vec(any::<bool>(), 16),
    ) {
        graph.fuse = graph_switch;
        let mut models = Vec::new();
        for (i, n) in graph.nodes.iter_mut().enumerate() {
            if let Some(node::Kind::Model(model)) = &mut n.kind {
                model.fuse = node_switches[i % node_switches.len()];
                models.push(n.name.clone());
            }
        }
        let overridden: Vec<String> = models.iter().enumerate()
            .filter(|(i, _)| overridden_mask[i % overridden_mask.len()])
            .map(|(_, name)| name.clone())
            .collect();

        let p = plan(&graph, &overridden);
        let kept: BTreeSet<String> = p.kept.keys().cloned().collect();
        prop_assert!(p.fused.is_disjoint(&kept));
        let all: BTreeSet<String> = models.iter().cloned().collect();
        prop_assert_eq!(p.fused.union(&kept).cloned().collect::<BTreeSet<_>>(), all.clone());
        for n in &graph.nodes {
            let Some(node::Kind::Model(model)) = &n.kind else { continue };
            if !p.is_fused(&n.name) {
                continue;
            }
            let own = model.deployment.as_deref().is_some_and(|d| *d != DeploymentOptions::default());
            prop_assert!(!own, "{} has deployment options of its own but was fused", n.name);
            prop_assert!(model.fuse != Some(false) && graph.fuse != Some(false));
            prop_assert!(!overridden.contains(&n.name));
        }
        if graph.fuse == Some(false) {
            prop_assert!(p.kept.values().all(|r| *r == KeptReason::GraphSwitchOff));
        }

        // Rendered: a deployment per kept node plus the executor; the fused ones in args.
        let Ok(valid) = validate(graph.clone()) else { return Ok(()) };
        let mut opts = RenderOptions::default();
        for name in &overridden {
            opts.node_overrides.insert(name.clone(), NodeOverride { num_replicas: Some(2), max_ongoing_requests: None });
        }
        let Ok(config) = render(&valid, &opts) else { return Ok(()) };
        let app = &config.applications[0];
        let deployed: BTreeSet<String> = app.deployments.iter().map(|d| d.name.clone())
            .filter(|name| name != DEFAULT_EXECUTOR_DEPLOYMENT).collect();
        prop_assert_eq!(&deployed, &kept);
        prop_assert_eq!(app.args.fused_nodes.iter().cloned().collect::<BTreeSet<_>>(), p.fused.clone());
        let mut sorted = app.args.fused_nodes.clone();
        sorted.sort();
        prop_assert_eq!(&sorted, &app.args.fused_nodes);
        prop_assert_eq!(deployed.union(&p.fused).cloned().collect::<BTreeSet<_>>(), all);
    }
}
