//! The wiring view: what the graph runtime receives as the Serve application's `args`.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::ser::{SerializeSeq, Serializer};

use crate::graph::proto;
use crate::graph::proto::{JsonValue, ModelNode, Node, node};

use super::node::node_text;
use super::{enums, is_default};

/// A graph serialized for the runtime: the text form without deployment options, descriptions,
/// route prefix, runtime environment and executor options (those are rendered elsewhere in the
/// Serve config, and keeping them out of `args` keeps a scaling change from rebuilding the
/// whole application). Reading it back gives a graph without those fields.
pub struct WiringText<'a>(pub &'a proto::PipelineGraph);

#[derive(Serialize)]
struct GraphWiringRef<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    version: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    ingress: &'a str,
    nodes: NodesWiring<'a>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    edges: &'a [proto::Edge],
    #[serde(skip_serializing_if = "is_default")]
    deadline_ms: u32,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    forward_headers: &'a [String],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: &'a BTreeMap<String, String>,
}

struct NodesWiring<'a>(&'a [Node]);

impl Serialize for NodesWiring<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for node in self.0 {
            seq.serialize_element(&node_text(node, true, ModelWiring))?;
        }
        seq.end()
    }
}

/// A model node without its deployment options.
struct ModelWiring<'a>(&'a ModelNode);

#[derive(Serialize)]
struct ModelWiringRef<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    import_path: &'a str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    init_args: &'a [JsonValue],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    init_kwargs: &'a BTreeMap<String, JsonValue>,
    #[serde(skip_serializing_if = "str::is_empty")]
    method: &'a str,
    #[serde(skip_serializing_if = "is_default", with = "enums::call_style")]
    call_style: i32,
}

impl Serialize for ModelWiring<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let ModelNode {
            import_path,
            init_args,
            init_kwargs,
            method,
            call_style,
            deployment: _,
            fuse: _, // which nodes are fused travels as `args.fused_nodes`, decided by rendering
        } = self.0;
        ModelWiringRef {
            import_path,
            init_args,
            init_kwargs,
            method,
            call_style: *call_style,
        }
        .serialize(serializer)
    }
}

impl Serialize for WiringText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Destructured without `..`: a new graph field fails to compile here until someone
        // decides whether the runtime needs it.
        let proto::PipelineGraph {
            name,
            version,
            ingress,
            route_prefix: _,
            runtime_env: _,
            nodes,
            edges,
            deadline_ms,
            forward_headers,
            labels,
            executor: _,
            fuse: _, // see ModelNode's `fuse` above
        } = self.0;
        GraphWiringRef {
            name,
            version,
            ingress,
            nodes: NodesWiring(nodes),
            edges,
            deadline_ms: *deadline_ms,
            forward_headers,
            labels,
        }
        .serialize(serializer)
    }
}

/// Whether two graphs have the same wiring (equal apart from what [`WiringText`] leaves out).
pub fn same_wiring(a: &proto::PipelineGraph, b: &proto::PipelineGraph) -> bool {
    a.name == b.name
        && a.version == b.version
        && a.ingress == b.ingress
        && a.deadline_ms == b.deadline_ms
        && a.forward_headers == b.forward_headers
        && a.labels == b.labels
        && a.edges == b.edges
        && a.nodes.len() == b.nodes.len()
        && a.nodes
            .iter()
            .zip(&b.nodes)
            .all(|(x, y)| same_node_wiring(x, y))
}

fn same_node_wiring(a: &Node, b: &Node) -> bool {
    // Listed without `..`: a new Node field fails to compile here until it is compared.
    let Node {
        name: _,
        description: _,
        kind: _,
        join: _,
        on_error: _,
        fallback_value: _,
        timeout_ms: _,
        retry: _,
        shadow: _,
        input_template: _,
    } = a;
    let kinds_match = match (&a.kind, &b.kind) {
        (Some(node::Kind::Model(x)), Some(node::Kind::Model(y))) => {
            x.import_path == y.import_path
                && x.init_args == y.init_args
                && x.init_kwargs == y.init_kwargs
                && x.method == y.method
                && x.call_style == y.call_style
        }
        (x, y) => x == y,
    };
    kinds_match
        && a.name == b.name
        && a.join == b.join
        && a.on_error == b.on_error
        && a.fallback_value == b.fallback_value
        && a.timeout_ms == b.timeout_ms
        && a.retry == b.retry
        && a.shadow == b.shadow
        && a.input_template == b.input_template
}

/// A graph read back from its wiring text: drops what the wiring leaves out.
pub fn into_wiring(mut graph: proto::PipelineGraph) -> proto::PipelineGraph {
    graph.route_prefix.clear();
    graph.runtime_env = None;
    graph.executor = None;
    for node in &mut graph.nodes {
        node.description.clear();
        if let Some(node::Kind::Model(model)) = &mut node.kind {
            model.deployment = None;
        }
    }
    graph
}
