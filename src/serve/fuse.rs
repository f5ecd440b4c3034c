//! Fusion planning: which model nodes run in-process inside the executor's replicas instead of
//! as Serve deployments of their own.
//!
//! The executor calls every model node itself (nodes never call each other), so fusing a node
//! replaces one Serve handle hop (a few milliseconds of CPU in caller and callee) by a plain
//! call in the executor's replica, with the same per-node timeout, retries, error naming,
//! fallback, shadow sampling and metrics (the runtime's engine sees only a different caller).
//! A chain of fused nodes is then one replica: the executor's.
//!
//! A node fuses exactly when nothing a deployment of its own would give is asked for: the
//! graph-wide `fuse` is not false, the node's `fuse` is not false, it declares no deployment
//! options at all (`graph::options::may_fuse`) and the operator overrides nothing of it
//! (`RenderOptions::node_overrides`, e.g. a ServePipeline's deploymentOverrides). A node with
//! resources of its own therefore always stays a deployment, and fusion never changes the set
//! of nodes that run: every model node is either fused or a deployment, never both or neither.
//!
//! Pure and deterministic; works on any decoded graph (so `raypipe dag dot` can draw a graph
//! that does not validate).

use std::collections::{BTreeMap, BTreeSet};

use crate::graph::options::may_fuse;
use crate::graph::proto::{PipelineGraph, node};

/// Why a model node stays a deployment of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeptReason {
    /// The graph's `fuse: false`.
    GraphSwitchOff,
    /// The node's own `model.fuse: false`.
    NodeSwitchOff,
    /// The node declares deployment options (resources, replicas, limits, `user_config`, ...).
    DeploymentOptions,
    /// The operator overrides the node's deployment (replicas, concurrency).
    OperatorOverride,
}

impl KeptReason {
    /// Words for `raypipe dag render`'s comment and the DOT tooltip.
    pub fn describe(self) -> &'static str {
        match self {
            KeptReason::GraphSwitchOff => "fusion is off for the graph (fuse: false)",
            KeptReason::NodeSwitchOff => "the node turns fusion off (model.fuse: false)",
            KeptReason::DeploymentOptions => "it has deployment options of its own",
            KeptReason::OperatorOverride => "the operator overrides its deployment",
        }
    }
}

/// Which model nodes are fused and why the others are not. Both keyed by node name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FusionPlan {
    /// Nodes that run in-process inside the executor's replicas.
    pub fused: BTreeSet<String>,
    /// Nodes that are deployments of their own, with the first reason that keeps them one.
    pub kept: BTreeMap<String, KeptReason>,
}

impl FusionPlan {
    /// Whether `name` is fused.
    pub fn is_fused(&self, name: &str) -> bool {
        self.fused.contains(name)
    }
}

/// The fusion plan of `graph` when the operator overrides the nodes in `overridden`.
pub fn plan<'a>(
    graph: &PipelineGraph,
    overridden: impl IntoIterator<Item = &'a String>,
) -> FusionPlan {
    let overridden: BTreeSet<&str> = overridden.into_iter().map(String::as_str).collect();
    let graph_on = graph.fuse != Some(false);
    let mut out = FusionPlan::default();
    for node in &graph.nodes {
        let Some(node::Kind::Model(model)) = &node.kind else {
            continue;
        };
        // In an invalid graph with duplicate names, the first declaration decides.
        if out.fused.contains(&node.name) || out.kept.contains_key(&node.name) {
            continue;
        }
        let reason = if !graph_on {
            Some(KeptReason::GraphSwitchOff)
        } else if model.fuse == Some(false) {
            Some(KeptReason::NodeSwitchOff)
        } else if !may_fuse(model) {
            Some(KeptReason::DeploymentOptions)
        } else if overridden.contains(node.name.as_str()) {
            Some(KeptReason::OperatorOverride)
        } else {
            None
        };
        match reason {
            Some(reason) => {
                out.kept.insert(node.name.clone(), reason);
            }
            None => {
                out.fused.insert(node.name.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::proto::{DeploymentOptions, ModelNode, Node, RayActorOptions};

    fn model(name: &str, deployment: Option<DeploymentOptions>, fuse: Option<bool>) -> Node {
        Node {
            name: name.into(),
            kind: Some(node::Kind::Model(ModelNode {
                import_path: "m:M".into(),
                deployment: deployment.map(Box::new),
                fuse,
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn graph(nodes: Vec<Node>) -> PipelineGraph {
        PipelineGraph {
            nodes,
            ..Default::default()
        }
    }

    #[test]
    fn nodes_without_deployment_options_fuse_and_the_rest_say_why_not() {
        let gpu = DeploymentOptions {
            ray_actor_options: Some(RayActorOptions {
                num_gpus: Some(1.0),
                ..Default::default()
            }),
            ..Default::default()
        };
        let limits = DeploymentOptions {
            max_ongoing_requests: Some(8),
            ..Default::default()
        };
        let g = graph(vec![
            model("plain", None, None),
            model(
                "empty_options",
                Some(DeploymentOptions::default()),
                Some(true),
            ),
            model("gpu", Some(gpu), Some(true)),
            model("limited", Some(limits), None),
            model("opted_out", None, Some(false)),
            model("overridden", None, None),
            Node {
                name: "request".into(),
                kind: Some(node::Kind::Input(Default::default())),
                ..Default::default()
            },
        ]);
        let p = plan(&g, &["overridden".to_string()]);
        assert_eq!(
            p.fused.iter().map(String::as_str).collect::<Vec<_>>(),
            ["empty_options", "plain"]
        );
        assert_eq!(p.kept["gpu"], KeptReason::DeploymentOptions);
        assert_eq!(p.kept["limited"], KeptReason::DeploymentOptions);
        assert_eq!(p.kept["opted_out"], KeptReason::NodeSwitchOff);
        assert_eq!(p.kept["overridden"], KeptReason::OperatorOverride);
        assert!(!p.kept.contains_key("request") && !p.is_fused("request"));
    }

    #[test]
    fn the_graph_switch_keeps_every_node_a_deployment() {
        let mut g = graph(vec![model("a", None, None), model("b", None, Some(true))]);
        g.fuse = Some(false);
        let p = plan(&g, &[]);
        assert!(p.fused.is_empty());
        assert_eq!(
            p.kept.values().collect::<Vec<_>>(),
            [&KeptReason::GraphSwitchOff; 2]
        );
        g.fuse = Some(true);
        assert_eq!(plan(&g, &[]).fused.len(), 2);
    }

    #[test]
    fn the_first_of_duplicate_names_decides() {
        let g = graph(vec![model("a", None, None), model("a", None, Some(false))]);
        let p = plan(&g, &[]);
        assert!(p.is_fused("a") && p.kept.is_empty());
    }
}
