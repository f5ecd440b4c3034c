//! Graph validation: every check that can be made before touching a cluster, all problems
//! collected in one pass (not just the first), each naming its node or edge.
//!
//! Cost is O(N + E) apart from a heap in the topological sort (O(E log N)), the per-predicate
//! ancestor checks (a backward search bounded by the topological position of the root) and the
//! exclusive-join check (dominators on the DAG in one pass, then a walk over the branch edges
//! dominating each join input: O(E x switch nesting depth)).
//!
//! This file holds the entry points, the validated graph and the checker's state; the checks
//! run in stage order from [`nodes`] (graph fields, nodes), [`edges`] (edges, routing nodes),
//! [`structure`] (DAG, order, cycles, reachability) and [`joins`] (scopes, exclusive joins,
//! input assembly).

mod edges;
mod joins;
mod nodes;
mod structure;

use std::collections::HashMap;
use std::sync::Arc;

use petgraph::graph::DiGraph;

use self::structure::Adjacency;
use super::errors::{EdgeRef, ValidationError, ValidationErrors};
use super::proto::{JsonValue, Node, PipelineGraph, json_value, node};

/// Default end-to-end deadline when `deadline_ms` is 0.
pub const DEFAULT_DEADLINE_MS: u32 = 30_000;
/// Longest deadline accepted.
pub const MAX_DEADLINE_MS: u32 = 3_600_000;
/// Longest node name (a DNS label's length, and a comfortable Serve deployment name).
pub const MAX_NAME_LEN: usize = 63;
/// Longest graph version string.
pub const MAX_VERSION_LEN: usize = 128;
/// Most `forward_headers` and most `labels`.
pub const MAX_HEADERS: usize = 64;
/// Most retry attempts of one node.
pub const MAX_RETRY_ATTEMPTS: u32 = 10;
/// Work allowed to the exclusive-join check per node and edge (tree climbing steps): far more
/// than any real routing nests, and linear in the graph however it is crafted.
const JOIN_CHECK_STEPS_PER_ITEM: u64 = 64;

/// Size limits checked before anything else, so a huge graph costs little to refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most nodes.
    pub max_nodes: usize,
    /// Most edges.
    pub max_edges: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_nodes: 100_000,
            max_edges: 500_000,
        }
    }
}

/// A graph that passed validation, with its DAG and a deterministic topological order.
#[derive(Debug, Clone)]
pub struct ValidatedGraph {
    // Shared, so rendering hands the graph to the Serve config without copying it.
    graph: Arc<PipelineGraph>,
    dag: DiGraph<(), u32>,
    topological: Vec<u32>,
    ingress: u32,
    output: u32,
}

impl ValidatedGraph {
    /// The graph as decoded.
    pub fn graph(&self) -> &PipelineGraph {
        &self.graph
    }

    /// The graph, shared (cheap to clone; what `serve::render` puts in the config's `args`).
    pub fn shared_graph(&self) -> Arc<PipelineGraph> {
        Arc::clone(&self.graph)
    }

    /// Gives the graph back (copied only if a rendered config still shares it).
    pub fn into_graph(self) -> PipelineGraph {
        Arc::try_unwrap(self.graph).unwrap_or_else(|shared| (*shared).clone())
    }

    /// The DAG: node `i` is `graph().nodes[i]`; each edge's weight is its index in
    /// `graph().edges`.
    pub fn dag(&self) -> &DiGraph<(), u32> {
        &self.dag
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.graph.nodes.len()
    }

    /// Number of edges.
    pub fn edge_count(&self) -> usize {
        self.graph.edges.len()
    }

    /// Name of the ingress (input) node.
    pub fn ingress(&self) -> &str {
        &self.graph.nodes[self.ingress as usize].name
    }

    /// Name of the output node.
    pub fn output(&self) -> &str {
        &self.graph.nodes[self.output as usize].name
    }

    /// The graph's version string (may be empty).
    pub fn version(&self) -> &str {
        &self.graph.version
    }

    /// The graph's name (may be empty).
    pub fn name(&self) -> &str {
        &self.graph.name
    }

    /// The end-to-end deadline in effect (the default when the graph leaves it at 0).
    pub fn deadline_ms(&self) -> u32 {
        effective_deadline(&self.graph)
    }

    /// Node indices in topological order; ties are broken by declaration order, so the order
    /// is the same on every run and on every machine.
    pub fn topological_indices(&self) -> &[u32] {
        &self.topological
    }

    /// Nodes in topological order.
    pub fn topological_order(&self) -> impl Iterator<Item = &Node> {
        self.topological
            .iter()
            .map(|&i| &self.graph.nodes[i as usize])
    }

    /// The node with this name.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.graph.nodes.iter().find(|n| n.name == name)
    }

    /// The model nodes (Serve deployments), in declaration order.
    pub fn model_nodes(&self) -> impl Iterator<Item = &Node> {
        self.graph
            .nodes
            .iter()
            .filter(|n| matches!(n.kind, Some(node::Kind::Model(_))))
    }

    /// Hex sha256 of the canonical protobuf encoding (maps sorted, fields in number order):
    /// equal graphs have equal digests whatever their source format.
    pub fn digest(&self) -> String {
        // A validated graph passed the nesting check, so prost's encoder is safe on it.
        super::digest(&prost::Message::encode_to_vec(&*self.graph))
    }
}

pub(crate) fn effective_deadline(graph: &PipelineGraph) -> u32 {
    if graph.deadline_ms == 0 {
        DEFAULT_DEADLINE_MS
    } else {
        graph.deadline_ms
    }
}

/// Validates a graph with the default limits.
pub fn validate(graph: PipelineGraph) -> Result<ValidatedGraph, ValidationErrors> {
    validate_with(graph, &Limits::default())
}

/// Validates a graph with explicit limits.
pub fn validate_with(
    graph: PipelineGraph,
    limits: &Limits,
) -> Result<ValidatedGraph, ValidationErrors> {
    let mut errors = Vec::new();
    if graph.nodes.len() > limits.max_nodes {
        errors.push(ValidationError::LimitExceeded {
            what: "nodes",
            count: graph.nodes.len(),
            limit: limits.max_nodes,
        });
    }
    if graph.edges.len() > limits.max_edges {
        errors.push(ValidationError::LimitExceeded {
            what: "edges",
            count: graph.edges.len(),
            limit: limits.max_edges,
        });
    }
    if errors.is_empty()
        && let Err(at) = super::depth::check(&graph, super::MAX_NESTING_DEPTH)
    {
        // Checked before any recursive walk (JSON values, predicates) meets the graph.
        errors.push(ValidationError::TooDeep {
            at,
            limit: super::MAX_NESTING_DEPTH,
        });
    }
    if !errors.is_empty() {
        // Nothing else is checked: refusing an oversized graph must stay cheap.
        return Err(ValidationErrors::new(errors));
    }
    let structure = Checker::new(&graph, &mut errors).run();
    match structure {
        Some((dag, topological, ingress, output)) if errors.is_empty() => Ok(ValidatedGraph {
            graph: Arc::new(graph),
            dag,
            topological,
            ingress,
            output,
        }),
        _ => Err(ValidationErrors::new(errors)),
    }
}

/// Whether every number in a JSON value is finite.
pub(crate) fn json_value_is_finite(value: &JsonValue) -> bool {
    match &value.kind {
        Some(json_value::Kind::NumberValue(n)) => n.is_finite(),
        Some(json_value::Kind::ListValue(list)) => list.values.iter().all(json_value_is_finite),
        Some(json_value::Kind::ObjectValue(object)) => {
            object.fields.values().all(json_value_is_finite)
        }
        _ => true,
    }
}

/// What kind of node, for messages ("a model node").
pub(crate) fn kind_article(kind: &Option<node::Kind>) -> &'static str {
    match kind {
        None => "a kindless",
        Some(node::Kind::Input(_)) => "an input",
        Some(node::Kind::Model(_)) => "a model",
        Some(node::Kind::Switch(_)) => "a switch",
        Some(node::Kind::Split(_)) => "a split",
        Some(node::Kind::Output(_)) => "an output",
    }
}

const NONE: u32 = u32::MAX;

/// A resolved edge: indices of its endpoints.
#[derive(Clone, Copy)]
struct Link {
    source: u32,
    target: u32,
}

struct Checker<'g, 'e> {
    graph: &'g PipelineGraph,
    errors: &'e mut Vec<ValidationError>,
    names: HashMap<&'g str, u32>,
    /// Nodes whose name was declared before: reported once as duplicates, kept out of the
    /// structure checks (which follow the first declaration).
    duplicate: Vec<bool>,
    /// Resolved endpoints per edge; `None` for edges naming unknown nodes.
    links: Vec<Option<Link>>,
    /// Edges that take part in the structure (resolved, not duplicates), per node.
    out_edges: Adjacency,
    in_edges: Adjacency,
    ingress: u32,
    output: u32,
}

type Structure = (DiGraph<(), u32>, Vec<u32>, u32, u32);

impl<'g, 'e> Checker<'g, 'e> {
    fn new(graph: &'g PipelineGraph, errors: &'e mut Vec<ValidationError>) -> Self {
        let n = graph.nodes.len();
        Checker {
            graph,
            errors,
            names: HashMap::with_capacity(n),
            duplicate: vec![false; n],
            links: Vec::with_capacity(graph.edges.len()),
            out_edges: Adjacency::default(),
            in_edges: Adjacency::default(),
            ingress: NONE,
            output: NONE,
        }
    }

    fn push(&mut self, error: ValidationError) {
        self.errors.push(error);
    }

    fn node_name(&self, index: u32) -> &'g str {
        &self.graph.nodes[index as usize].name
    }

    fn edge_ref(&self, index: usize) -> EdgeRef {
        let edge = &self.graph.edges[index];
        EdgeRef {
            index,
            source: edge.source.clone(),
            target: edge.target.clone(),
        }
    }

    fn node_kind(&self, index: u32) -> &'g Option<node::Kind> {
        &self.graph.nodes[index as usize].kind
    }

    fn run(mut self) -> Option<Structure> {
        self.check_graph_fields();
        self.index_nodes();
        self.check_nodes();
        self.find_ingress_and_output();
        self.resolve_edges();
        self.check_edges();
        self.check_routing_nodes();

        let dag = self.build_dag();
        let topological = self.topological_order();
        let reachable = self.check_reachability();
        match topological {
            Ok(order) => {
                if let Some(reachable) = &reachable {
                    self.check_acyclic_structure(&order, reachable);
                }
                self.check_inputs_assembly();
                if self.ingress == NONE || self.output == NONE {
                    return None;
                }
                Some((dag, order, self.ingress, self.output))
            }
            Err(()) => {
                self.report_cycles();
                None
            }
        }
    }
}

/// DNS-1123 label.
pub(crate) fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// Node names: Serve deployment names (no '#'), safe as JSON Pointer segments (no '/' or '~')
/// and as DOT and metric label values.
pub(crate) fn check_node_name(name: &str) -> Result<(), &'static str> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Err("is empty");
    }
    if bytes.len() > MAX_NAME_LEN {
        return Err("is longer than 63 characters");
    }
    if !bytes[0].is_ascii_alphanumeric() {
        return Err("does not start with a letter or digit");
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return Err("contains characters other than letters, digits, '_', '.' and '-'");
    }
    Ok(())
}

/// Ray's rules for an application's route prefix (checked by Ray only at deploy time).
pub fn check_route_prefix(prefix: &str) -> Result<(), &'static str> {
    if !prefix.starts_with('/') {
        return Err("must start with '/'");
    }
    if prefix.len() > 1 && prefix.ends_with('/') {
        return Err("must not end with '/' (only \"/\" itself may)");
    }
    if prefix.contains(['{', '}']) {
        return Err("must not contain '{' or '}'");
    }
    if prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain spaces or control characters");
    }
    Ok(())
}

fn is_http_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
