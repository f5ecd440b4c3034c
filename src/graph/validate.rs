//! Graph validation: every check that can be made before touching a cluster, all problems
//! collected in one pass (not just the first), each naming its node or edge.
//!
//! Cost is O(N + E) apart from a heap in the topological sort (O(E log N)), the per-predicate
//! ancestor checks (a backward search bounded by the topological position of the root) and the
//! exclusive-join check (dominators on the DAG in one pass, then a walk over the branch edges
//! dominating each join input: O(E x switch nesting depth)).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use petgraph::graph::{DiGraph, NodeIndex};

use super::errors::{EdgeEnd, EdgeRef, Location, ValidationError, ValidationErrors};
use super::options;
use super::pointer;
use super::predicate;
use super::proto::{
    CallStyle, EdgeMode, JoinMode, JsonValue, NoMatch, Node, OnError, PipelineGraph, RetryOn,
    json_value, node,
};

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

    // -- graph-level fields --------------------------------------------------------------------

    fn check_graph_fields(&mut self) {
        let graph = self.graph;
        if !graph.name.is_empty() && !is_dns_label(&graph.name) {
            self.push(ValidationError::InvalidGraphName {
                name: graph.name.clone(),
            });
        }
        if graph.version.len() > MAX_VERSION_LEN {
            self.push(ValidationError::InvalidVersion {
                version: graph.version.chars().take(32).collect::<String>() + "...",
                problem: "is longer than 128 characters",
            });
        } else if graph.version.chars().any(char::is_control) {
            self.push(ValidationError::InvalidVersion {
                version: graph.version.clone(),
                problem: "contains control characters",
            });
        }
        if !graph.route_prefix.is_empty()
            && let Err(problem) = check_route_prefix(&graph.route_prefix)
        {
            self.push(ValidationError::InvalidRoutePrefix {
                prefix: graph.route_prefix.clone(),
                problem,
            });
        }
        if let Some(env) = &graph.runtime_env {
            for problem in options::runtime_env_problems(env) {
                self.push(ValidationError::InvalidRuntimeEnv {
                    location: Location::Graph,
                    problem,
                });
            }
        }
        if graph.deadline_ms > MAX_DEADLINE_MS {
            self.push(ValidationError::DeadlineTooLong {
                deadline_ms: graph.deadline_ms,
                limit: MAX_DEADLINE_MS,
            });
        }
        if graph.forward_headers.len() > MAX_HEADERS {
            self.push(ValidationError::LimitExceeded {
                what: "forward_headers",
                count: graph.forward_headers.len(),
                limit: MAX_HEADERS,
            });
        }
        for header in &graph.forward_headers {
            if header.is_empty() || !header.bytes().all(is_http_token_byte) {
                self.push(ValidationError::InvalidOption {
                    location: Location::Graph,
                    field: "forward_headers".into(),
                    problem: format!("has {header:?}, which is not an HTTP header name"),
                });
            }
        }
        if graph.labels.len() > MAX_HEADERS {
            self.push(ValidationError::LimitExceeded {
                what: "labels",
                count: graph.labels.len(),
                limit: MAX_HEADERS,
            });
        }
        if let Some(executor) = &graph.executor {
            let mut found = Vec::new();
            options::check_deployment(executor, &mut found);
            for (field, problem) in found {
                self.push(option_error(Location::Executor, field, problem));
            }
        }
    }

    // -- nodes -----------------------------------------------------------------------------------

    fn index_nodes(&mut self) {
        let graph = self.graph;
        for (index, node) in graph.nodes.iter().enumerate() {
            if let Err(problem) = check_node_name(&node.name) {
                self.push(ValidationError::InvalidNodeName {
                    index,
                    name: node.name.clone(),
                    problem,
                });
            }
            match self.names.get(node.name.as_str()) {
                Some(&first) => {
                    self.duplicate[index] = true;
                    self.errors.push(ValidationError::DuplicateNode {
                        name: node.name.clone(),
                        index,
                        first_index: first as usize,
                    });
                }
                None => {
                    self.names.insert(node.name.as_str(), index as u32);
                }
            }
        }
    }

    fn check_nodes(&mut self) {
        let graph = self.graph;
        let deadline = effective_deadline(graph);
        for node in &graph.nodes {
            let name = &node.name;
            let location = || Location::Node(name.clone());
            let Some(kind) = &node.kind else {
                self.push(ValidationError::MissingKind { node: name.clone() });
                continue;
            };
            self.check_enum::<JoinMode>(location, "join", node.join);
            self.check_enum::<OnError>(location, "on_error", node.on_error);

            // Settings that mean nothing for this kind of node are mistakes worth reporting.
            let kind_name = kind_article(&node.kind);
            let ineffective = |field: &'static str| ValidationError::IneffectiveSetting {
                node: name.clone(),
                kind: kind_name,
                field,
            };
            let is_input = matches!(kind, node::Kind::Input(_));
            let is_output = matches!(kind, node::Kind::Output(_));
            let is_model = matches!(kind, node::Kind::Model(_));
            let mut found = Vec::new();
            if is_input && node.join != JoinMode::All as i32 {
                found.push(ineffective("join"));
            }
            if (is_input || is_output) && node.on_error != OnError::Fail as i32 {
                found.push(ineffective("on_error"));
            }
            if (is_input || is_output) && node.fallback_value.is_some() {
                found.push(ineffective("fallback_value"));
            }
            if !is_model && node.timeout_ms != 0 {
                found.push(ineffective("timeout_ms"));
            }
            if !is_model && node.retry.is_some() {
                found.push(ineffective("retry"));
            }
            if !is_model && node.shadow.is_some() {
                found.push(ineffective("shadow"));
            }
            if is_input && node.input_template.is_some() {
                found.push(ineffective("input_template"));
            }
            self.errors.extend(found);

            if !is_input && !is_output {
                let fallback = node.on_error == OnError::Fallback as i32;
                match (fallback, node.fallback_value.is_some()) {
                    (true, false) => {
                        self.push(ValidationError::FallbackWithoutValue { node: name.clone() })
                    }
                    (false, true) => {
                        self.push(ValidationError::FallbackValueUnused { node: name.clone() })
                    }
                    _ => {}
                }
            }
            if let Some(value) = &node.fallback_value {
                self.check_finite(location, || "fallback_value".into(), value);
            }
            if let Some(value) = &node.input_template {
                self.check_finite(location, || "input_template".into(), value);
            }
            if is_model && node.timeout_ms > deadline {
                self.push(ValidationError::TimeoutOverDeadline {
                    node: name.clone(),
                    timeout_ms: node.timeout_ms,
                    deadline_ms: deadline,
                });
            }
            if let (true, Some(shadow)) = (is_model, &node.shadow)
                && let Some(percent) = shadow.sample_percent
                && !(1..=100).contains(&percent)
            {
                self.push(ValidationError::InvalidShadowSample {
                    node: name.clone(),
                    percent,
                });
            }
            if let (true, Some(retry)) = (is_model, &node.retry) {
                self.check_retry(name, retry);
            }

            match kind {
                node::Kind::Model(model) => self.check_model(name, node, model),
                node::Kind::Switch(switch) => {
                    self.check_enum::<NoMatch>(location, "switch.on_no_match", switch.on_no_match)
                }
                node::Kind::Split(split) => {
                    if let Err(problem) = pointer::check(&split.sticky_key) {
                        self.push(ValidationError::InvalidPointer {
                            location: location(),
                            field: "split.sticky_key",
                            pointer: split.sticky_key.clone(),
                            problem,
                        });
                    }
                }
                node::Kind::Input(_) | node::Kind::Output(_) => {}
            }
        }
    }

    fn check_model(&mut self, name: &str, node: &Node, model: &super::proto::ModelNode) {
        if let Err(problem) = options::check_import_path(&model.import_path) {
            self.push(ValidationError::InvalidImportPath {
                node: name.to_string(),
                path: model.import_path.clone(),
                problem,
            });
        }
        let location = || Location::Node(name.to_string());
        self.check_enum::<CallStyle>(location, "model.call_style", model.call_style);
        if !model.method.is_empty() && !options::is_python_identifier(&model.method) {
            self.push(option_error(
                Location::Node(name.to_string()),
                "model.method".into(),
                format!("{:?} is not a Python method name", model.method),
            ));
        }
        for (i, arg) in model.init_args.iter().enumerate() {
            self.check_finite(location, || format!("model.init_args[{i}]"), arg);
        }
        for (key, arg) in &model.init_kwargs {
            if !options::is_python_identifier(key) {
                self.push(option_error(
                    Location::Node(name.to_string()),
                    "model.init_kwargs".into(),
                    format!("has the key {key:?}, which is not a Python identifier"),
                ));
            }
            self.check_finite(location, || format!("model.init_kwargs.{key}"), arg);
        }
        if model.call_style == CallStyle::Kwargs as i32
            && let Some(template) = &node.input_template
        {
            let keys_ok = match &template.kind {
                Some(json_value::Kind::ObjectValue(object)) => object
                    .fields
                    .keys()
                    .all(|k| options::is_python_identifier(k)),
                _ => false,
            };
            if !keys_ok {
                self.push(option_error(
                        Location::Node(name.to_string()),
                        "input_template".into(),
                        "must be an object whose keys are Python identifiers, because the node is called with keyword arguments".into(),
                    ));
            }
        }
        if let Some(deployment) = &model.deployment {
            let mut found = Vec::new();
            options::check_deployment(deployment, &mut found);
            // `found` stays empty (no allocation) for valid options.
            for (field, problem) in found {
                self.push(option_error(
                    Location::Node(name.to_string()),
                    format!("deployment.{field}"),
                    problem,
                ));
            }
        }
    }

    fn check_retry(&mut self, name: &str, retry: &super::proto::Retry) {
        let node = name.to_string();
        if retry.attempts > MAX_RETRY_ATTEMPTS {
            self.push(ValidationError::InvalidRetry {
                node: node.clone(),
                problem: format!(
                    "attempts is {}, more than the limit of {MAX_RETRY_ATTEMPTS}",
                    retry.attempts
                ),
            });
        }
        let initial = if retry.initial_backoff_ms == 0 {
            50
        } else {
            retry.initial_backoff_ms
        };
        let max = if retry.max_backoff_ms == 0 {
            2000
        } else {
            retry.max_backoff_ms
        };
        if max < initial {
            self.push(ValidationError::InvalidRetry {
                node: node.clone(),
                problem: format!(
                    "max_backoff_ms ({max}) is less than initial_backoff_ms ({initial})"
                ),
            });
        }
        for &class in &retry.retry_on {
            match RetryOn::try_from(class) {
                Ok(RetryOn::Unspecified) => self.push(ValidationError::InvalidRetry {
                    node: node.clone(),
                    problem: "retry_on lists UNSPECIFIED; name UNAVAILABLE, BACKPRESSURE, TIMEOUT or APP_ERROR".into(),
                }),
                Ok(_) => {}
                Err(_) => self.push(ValidationError::UnknownEnumValue {
                    location: Location::Node(node.clone()),
                    field: "retry.retry_on",
                    value: class,
                }),
            }
        }
        if retry.attempts > 1 && retry.retry_on.is_empty() {
            self.push(ValidationError::InvalidRetry {
                node,
                problem: format!(
                    "allows {} attempts but retry_on is empty, so no failure would be retried; list the failure classes to retry",
                    retry.attempts
                ),
            });
        }
    }

    /// Lazy location (and field): the happy path of a 100,000-node graph allocates nothing.
    fn check_enum<E: TryFrom<i32>>(
        &mut self,
        location: impl FnOnce() -> Location,
        field: &'static str,
        value: i32,
    ) {
        if E::try_from(value).is_err() {
            self.push(ValidationError::UnknownEnumValue {
                location: location(),
                field,
                value,
            });
        }
    }

    fn check_finite(
        &mut self,
        location: impl FnOnce() -> Location,
        field: impl FnOnce() -> String,
        value: &JsonValue,
    ) {
        if !json_value_is_finite(value) {
            self.push(ValidationError::InvalidValue {
                location: location(),
                field: field(),
            });
        }
    }

    fn find_ingress_and_output(&mut self) {
        let graph = self.graph;
        let inputs: Vec<u32> = (0..graph.nodes.len() as u32)
            .filter(|&i| matches!(self.node_kind(i), Some(node::Kind::Input(_))))
            .collect();
        if graph.ingress.is_empty() {
            let candidate = (inputs.len() == 1).then(|| self.node_name(inputs[0]).to_string());
            self.push(ValidationError::IngressUnset { candidate });
        } else {
            match self.names.get(graph.ingress.as_str()).copied() {
                None => self.push(ValidationError::IngressUnknown {
                    name: graph.ingress.clone(),
                }),
                Some(index) => match self.node_kind(index) {
                    Some(node::Kind::Input(_)) => self.ingress = index,
                    other => self.push(ValidationError::IngressNotInput {
                        name: graph.ingress.clone(),
                        kind: kind_article(other),
                    }),
                },
            }
        }
        for &input in &inputs {
            let is_ingress = self.node_name(input) == graph.ingress;
            if !is_ingress && !graph.ingress.is_empty() {
                self.push(ValidationError::ExtraInput {
                    node: self.node_name(input).to_string(),
                    ingress: graph.ingress.clone(),
                });
            }
        }
        for index in 0..graph.nodes.len() as u32 {
            if !matches!(self.node_kind(index), Some(node::Kind::Output(_))) {
                continue;
            }
            if self.output == NONE {
                self.output = index;
            } else {
                self.push(ValidationError::ExtraOutput {
                    node: self.node_name(index).to_string(),
                    first: self.node_name(self.output).to_string(),
                });
            }
        }
        if self.output == NONE {
            self.push(ValidationError::MissingOutput);
        }
    }

    // -- edges -----------------------------------------------------------------------------------

    fn resolve_edges(&mut self) {
        let graph = self.graph;
        let n = graph.nodes.len();
        for (index, edge) in graph.edges.iter().enumerate() {
            let source = self.names.get(edge.source.as_str()).copied();
            let target = self.names.get(edge.target.as_str()).copied();
            for (end, name, found) in [
                (EdgeEnd::Source, &edge.source, source),
                (EdgeEnd::Target, &edge.target, target),
            ] {
                if found.is_none() {
                    let edge = self.edge_ref(index);
                    self.push(ValidationError::UnknownNode {
                        edge,
                        end,
                        name: name.clone(),
                    });
                }
            }
            self.links.push(match (source, target) {
                (Some(source), Some(target)) => Some(Link { source, target }),
                _ => None,
            });
        }
        // Parallel edges: grouped by source, a target seen twice is a duplicate (the first
        // declared edge stays). A stamp per target instead of a hash set of pairs.
        let links = std::mem::take(&mut self.links);
        let resolved = || {
            links
                .iter()
                .enumerate()
                .filter_map(|(i, l)| l.map(|l| (l, i as u32)))
        };
        let all_out = Adjacency::build(n, resolved().map(|(l, e)| (l.source, e)));
        let mut last_source = vec![NONE; n];
        let mut last_edge = vec![0u32; n];
        let mut is_duplicate = vec![false; graph.edges.len()];
        let mut duplicates = Vec::new();
        for source in 0..n as u32 {
            for &edge in all_out.of(source) {
                let target = links[edge as usize].map_or(0, |l| l.target as usize);
                if last_source[target] == source {
                    is_duplicate[edge as usize] = true;
                    duplicates.push((edge as usize, last_edge[target] as usize));
                } else {
                    last_source[target] = source;
                    last_edge[target] = edge;
                }
            }
        }
        duplicates.sort_unstable();
        for (index, first_index) in duplicates {
            let edge = self.edge_ref(index);
            self.push(ValidationError::DuplicateEdge { edge, first_index });
        }
        let structural = || resolved().filter(|(_, e)| !is_duplicate[*e as usize]);
        self.out_edges = Adjacency::build(n, structural().map(|(l, e)| (l.source, e)));
        self.in_edges = Adjacency::build(n, structural().map(|(l, e)| (l.target, e)));
        self.links = links;
    }

    fn check_edges(&mut self) {
        let graph = self.graph;
        for (index, edge) in graph.edges.iter().enumerate() {
            let edge_ref = || self.edge_ref(index);
            let mut found = Vec::new();
            let invalid = |field: &'static str, problem: &str| ValidationError::InvalidEdgeField {
                edge: edge_ref(),
                field,
                problem: problem.to_string(),
            };
            if EdgeMode::try_from(edge.mode).is_err() {
                found.push(ValidationError::UnknownEnumValue {
                    location: Location::Edge(edge_ref()),
                    field: "mode",
                    value: edge.mode,
                });
            }
            let order_edge = edge.mode == EdgeMode::Order as i32;
            if order_edge {
                if !edge.select.is_empty() {
                    found.push(invalid("select", "is set on an ORDER edge, which carries no data; remove it or make the edge DATA"));
                }
                if edge.tensors.is_some() {
                    found.push(invalid("tensors", "is set on an ORDER edge, which carries no data; remove it or make the edge DATA"));
                }
                if !edge.into.is_empty() {
                    found.push(invalid("into", "is set on an ORDER edge, which carries no data; remove it or make the edge DATA"));
                }
            }
            if !edge.select.is_empty() && edge.tensors.is_some() {
                found.push(invalid(
                    "tensors",
                    "and `select` are both set; choose one way to pick the value",
                ));
            }
            if let Some(tensors) = &edge.tensors {
                if tensors.names.is_empty() || tensors.names.iter().any(String::is_empty) {
                    found.push(invalid(
                        "tensors.names",
                        "must list at least one tensor, each with a non-empty name",
                    ));
                }
                if !edge.into.is_empty() {
                    found.push(invalid("into", "is set together with `tensors`, which always append to the target's `inputs`; remove it"));
                }
            }
            if edge.if_missing.is_some() && !edge.optional {
                found.push(invalid("if_missing", "is set but the edge is not `optional`, so it is never used; add `optional: true` or remove it"));
            }
            for (field, value) in [("select", &edge.select), ("into", &edge.into)] {
                if let Err(problem) = pointer::check(value) {
                    found.push(ValidationError::InvalidPointer {
                        location: Location::Edge(edge_ref()),
                        field,
                        pointer: value.clone(),
                        problem,
                    });
                }
            }
            if let Some(value) = &edge.if_missing
                && !json_value_is_finite(value)
            {
                found.push(ValidationError::InvalidValue {
                    location: Location::Edge(edge_ref()),
                    field: "if_missing".into(),
                });
            }
            if let Some(when) = &edge.when {
                let (problems, _) = predicate::check(when);
                for problem in problems {
                    found.push(ValidationError::InvalidPredicate {
                        edge: edge_ref(),
                        at: problem.at,
                        problem: problem.message,
                    });
                }
            }
            if let Some(link) = self.links[index] {
                let source_kind = self.node_kind(link.source);
                let source_name = self.node_name(link.source).to_string();
                if matches!(self.node_kind(link.target), Some(node::Kind::Input(_))) {
                    found.push(ValidationError::EdgeIntoIngress { edge: edge_ref() });
                }
                if matches!(source_kind, Some(node::Kind::Output(_))) {
                    found.push(ValidationError::EdgeFromOutput { edge: edge_ref() });
                }
                let from_split = matches!(source_kind, Some(node::Kind::Split(_)));
                let from_switch = matches!(source_kind, Some(node::Kind::Switch(_)));
                if edge.weight.is_some() && !from_split {
                    found.push(ValidationError::WeightOutsideSplit {
                        edge: edge_ref(),
                        source_node: source_name.clone(),
                    });
                }
                if edge.order != 0 && !from_switch {
                    found.push(ValidationError::OrderOutsideSwitch {
                        edge: edge_ref(),
                        source_node: source_name.clone(),
                    });
                }
                if from_split && edge.when.is_some() {
                    found.push(ValidationError::GuardOnSplit {
                        edge: edge_ref(),
                        split: source_name.clone(),
                    });
                }
                if from_split && edge.weight.is_none() {
                    found.push(ValidationError::SplitWeightMissing {
                        edge: edge_ref(),
                        split: source_name,
                    });
                }
            }
            self.errors.extend(found);
        }
    }

    /// Switch cases and defaults, split weights: checked on the structural out-edges.
    fn check_routing_nodes(&mut self) {
        let graph = self.graph;
        for (index, node) in graph.nodes.iter().enumerate() {
            let out = self.out_edges.of(index as u32);
            match &node.kind {
                Some(node::Kind::Switch(switch)) => {
                    let defaults: Vec<usize> = out
                        .iter()
                        .map(|&e| e as usize)
                        .filter(|&e| graph.edges[e].when.is_none())
                        .collect();
                    if defaults.len() == out.len() {
                        self.push(ValidationError::SwitchWithoutCases {
                            node: node.name.clone(),
                        });
                    }
                    if defaults.len() > 1 {
                        self.push(ValidationError::SwitchMultipleDefaults {
                            node: node.name.clone(),
                            edges: defaults,
                        });
                    } else if defaults.is_empty()
                        && switch.on_no_match == NoMatch::Unspecified as i32
                    {
                        self.push(ValidationError::SwitchWithoutDefault {
                            node: node.name.clone(),
                        });
                    }
                }
                Some(node::Kind::Split(_)) => {
                    let weights: Vec<u32> = out
                        .iter()
                        .filter_map(|&e| graph.edges[e as usize].weight)
                        .collect();
                    // Missing weights are reported per edge; the sum only when all are given.
                    let all_given = weights.len() == out.len();
                    if all_given && weights.iter().map(|&w| u64::from(w)).sum::<u64>() == 0 {
                        self.push(ValidationError::SplitWeightsZero {
                            node: node.name.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
    }

    // -- structure -------------------------------------------------------------------------------

    fn build_dag(&self) -> DiGraph<(), u32> {
        let mut dag = DiGraph::with_capacity(self.graph.nodes.len(), self.graph.edges.len());
        for _ in 0..self.graph.nodes.len() {
            dag.add_node(());
        }
        // Which edges take part in the structure, marked once: asking `in_edges` per edge
        // would cost O(in-degree) each, quadratic for a node with many in-edges.
        let mut structural = vec![false; self.links.len()];
        for &edge in &self.in_edges.list {
            structural[edge as usize] = true;
        }
        for (index, link) in self.links.iter().enumerate() {
            if let Some(link) = link
                && structural[index]
            {
                dag.add_edge(
                    NodeIndex::new(link.source as usize),
                    NodeIndex::new(link.target as usize),
                    index as u32,
                );
            }
        }
        dag
    }

    /// Kahn's algorithm with the smallest declaration index first among ready nodes.
    fn topological_order(&self) -> Result<Vec<u32>, ()> {
        let n = self.graph.nodes.len();
        let mut indegree: Vec<u32> = (0..n as u32)
            .map(|i| self.in_edges.of(i).len() as u32)
            .collect();
        let mut ready: BinaryHeap<Reverse<u32>> = (0..n as u32)
            .filter(|&i| indegree[i as usize] == 0)
            .map(Reverse)
            .collect();
        let mut order = Vec::with_capacity(n);
        while let Some(Reverse(node)) = ready.pop() {
            order.push(node);
            for &edge in self.out_edges.of(node) {
                let target = self.target_of(edge);
                indegree[target as usize] -= 1;
                if indegree[target as usize] == 0 {
                    ready.push(Reverse(target));
                }
            }
        }
        if order.len() == n { Ok(order) } else { Err(()) }
    }

    fn target_of(&self, edge: u32) -> u32 {
        self.links[edge as usize].map_or(NONE, |l| l.target)
    }

    fn source_of(&self, edge: u32) -> u32 {
        self.links[edge as usize].map_or(NONE, |l| l.source)
    }

    /// One error per strongly connected component, naming one concrete cycle through its first
    /// declared node. Iterative ([`super::scc`]): a long cycle must not exhaust the stack.
    fn report_cycles(&mut self) {
        let components =
            super::scc::strongly_connected_components(self.graph.nodes.len(), |v, i| {
                self.out_edges.of(v).get(i).map(|&e| self.target_of(e))
            });
        // One component id per node (not a mark array per component: that would cost
        // O(N) for each of up to N/2 components).
        let mut component_of = vec![NONE; self.graph.nodes.len()];
        let mut cycles = Vec::new();
        for (id, component) in components.iter().enumerate() {
            let self_loop = component.len() == 1
                && self
                    .out_edges
                    .of(component[0])
                    .iter()
                    .any(|&e| self.target_of(e) == component[0]);
            if component.len() < 2 && !self_loop {
                continue;
            }
            for &node in component {
                component_of[node as usize] = id as u32;
            }
            let Some(&start) = component.iter().min() else {
                continue;
            };
            cycles.push(self.cycle_through(start, id as u32, &component_of));
        }
        cycles.sort();
        for cycle in cycles {
            let nodes = cycle
                .iter()
                .map(|&i| self.node_name(i).to_string())
                .collect();
            self.push(ValidationError::Cycle { nodes });
        }
    }

    /// Shortest cycle from `start` back to itself inside one component (breadth-first).
    fn cycle_through(&self, start: u32, component: u32, component_of: &[u32]) -> Vec<u32> {
        let mut parent: HashMap<u32, u32> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        while let Some(node) = queue.pop_front() {
            for &edge in self.out_edges.of(node) {
                let next = self.target_of(edge);
                if next == start {
                    let mut path = vec![node];
                    let mut at = node;
                    while at != start {
                        match parent.get(&at) {
                            Some(&up) => at = up,
                            None => break,
                        }
                        path.push(at);
                    }
                    path.reverse();
                    path.push(start);
                    return path;
                }
                if component_of[next as usize] == component
                    && next != start
                    && !parent.contains_key(&next)
                {
                    parent.insert(next, node);
                    queue.push_back(next);
                }
            }
        }
        vec![start, start]
    }

    /// Marks nodes reachable from the ingress; reports the others. `None` without an ingress.
    fn check_reachability(&mut self) -> Option<Vec<bool>> {
        if self.ingress == NONE {
            return None;
        }
        let n = self.graph.nodes.len();
        let mut reachable = vec![false; n];
        reachable[self.ingress as usize] = true;
        let mut stack = vec![self.ingress];
        while let Some(node) = stack.pop() {
            for &edge in self.out_edges.of(node) {
                let target = self.target_of(edge);
                if !reachable[target as usize] {
                    reachable[target as usize] = true;
                    stack.push(target);
                }
            }
        }
        let ingress = self.node_name(self.ingress).to_string();
        for index in 0..n as u32 {
            // A second input node is already reported as such.
            let is_input = matches!(self.node_kind(index), Some(node::Kind::Input(_)));
            if !reachable[index as usize] && !is_input && !self.duplicate[index as usize] {
                self.push(ValidationError::Unreachable {
                    node: self.node_name(index).to_string(),
                    ingress: ingress.clone(),
                });
            }
        }
        Some(reachable)
    }

    /// Checks that need a DAG and an ingress: shadow branches, dead ends, predicate scopes and
    /// joins that could never run.
    fn check_acyclic_structure(&mut self, order: &[u32], reachable: &[bool]) {
        let graph = self.graph;
        let n = graph.nodes.len();
        // Shadow: marked nodes, and nodes fed only by shadow nodes.
        let mut shadow = vec![false; n];
        for &node in order {
            let i = node as usize;
            let marked = graph.nodes[i].shadow.is_some()
                && matches!(graph.nodes[i].kind, Some(node::Kind::Model(_)));
            let fed_only_by_shadow = !self.in_edges.of(node).is_empty()
                && self
                    .in_edges
                    .of(node)
                    .iter()
                    .all(|&e| shadow[self.source_of(e) as usize]);
            shadow[i] = marked || (node != self.ingress && fed_only_by_shadow);
        }
        for (index, link) in self.links.iter().enumerate() {
            if let Some(link) = link
                && shadow[link.source as usize]
                && !shadow[link.target as usize]
            {
                let edge = self.edge_ref(index);
                self.errors.push(ValidationError::ShadowLeak {
                    edge,
                    node: self.node_name(link.target).to_string(),
                });
            }
        }
        if self.output != NONE {
            let mut reaches_output = vec![false; n];
            reaches_output[self.output as usize] = true;
            for &node in order.iter().rev() {
                let i = node as usize;
                if self
                    .out_edges
                    .of(node)
                    .iter()
                    .any(|&e| reaches_output[self.target_of(e) as usize])
                {
                    reaches_output[i] = true;
                }
            }
            let output = self.node_name(self.output).to_string();
            for &node in order {
                let i = node as usize;
                if reachable[i] && !reaches_output[i] && !shadow[i] {
                    self.push(ValidationError::DeadEnd {
                        node: self.node_name(node).to_string(),
                        output: output.clone(),
                    });
                }
            }
        }
        self.check_scopes(order);
        self.check_exclusive_joins(order, reachable);
    }

    /// Predicate paths and sticky keys may only read the ingress and finished ancestors.
    fn check_scopes(&mut self, order: &[u32]) {
        let graph = self.graph;
        let mut position = vec![0u32; graph.nodes.len()];
        for (pos, &node) in order.iter().enumerate() {
            position[node as usize] = pos as u32;
        }
        let mut search = AncestorSearch::new(graph.nodes.len());
        let mut found = Vec::new();
        for (index, edge) in graph.edges.iter().enumerate() {
            let (Some(when), Some(link)) = (&edge.when, self.links[index]) else {
                continue;
            };
            let (_, scoped) = predicate::check(when);
            for path in scoped {
                let Some(root) = pointer::first_segment(path.path) else {
                    continue;
                };
                if !self.in_scope(&root, link.source, &position, &mut search) {
                    found.push(ValidationError::PredicateScope {
                        location: Location::Edge(self.edge_ref(index)),
                        field: if path.at.is_empty() {
                            "when".into()
                        } else {
                            format!("when.{}", path.at)
                        },
                        root: root.into_owned(),
                        node: self.node_name(link.source).to_string(),
                    });
                }
            }
        }
        for (index, node) in graph.nodes.iter().enumerate() {
            let Some(node::Kind::Split(split)) = &node.kind else {
                continue;
            };
            if pointer::check(&split.sticky_key).is_err() {
                continue;
            }
            if let Some(root) = pointer::first_segment(&split.sticky_key)
                && !self.in_scope(&root, index as u32, &position, &mut search)
            {
                found.push(ValidationError::PredicateScope {
                    location: Location::Node(node.name.clone()),
                    field: "split.sticky_key".into(),
                    root: root.into_owned(),
                    node: node.name.clone(),
                });
            }
        }
        self.errors.extend(found);
    }

    fn in_scope(
        &self,
        root: &str,
        node: u32,
        position: &[u32],
        search: &mut AncestorSearch,
    ) -> bool {
        match self.names.get(root).copied() {
            None => false,
            Some(r) if r == self.ingress || r == node => true,
            Some(r) => search.is_ancestor(r, node, position, &self.in_edges, &self.links),
        }
    }

    /// A join-ALL node whose required in-edges lie on different branches of one switch or
    /// split can never run (KServe/Seldon users met this as hanging requests). Found with the
    /// dominator tree of the graph in which every edge is also a vertex: a branch edge
    /// dominating an in-edge means that in-edge is live only when that branch is chosen.
    fn check_exclusive_joins(&mut self, order: &[u32], reachable: &[bool]) {
        let graph = self.graph;
        let has_router = graph
            .nodes
            .iter()
            .any(|n| matches!(n.kind, Some(node::Kind::Switch(_) | node::Kind::Split(_))));
        if !has_router || self.ingress == NONE {
            return;
        }
        let n = graph.nodes.len();
        let total = n + graph.edges.len();
        // Vertex v < n is node v; vertex n + e is edge e.
        let mut idom = vec![NONE; total];
        let mut rank = vec![0u32; total];
        // Nearest dominating branch-edge vertex (itself included), or NONE.
        let mut nearest_branch = vec![NONE; total];
        let is_router = |node: u32| {
            matches!(
                graph.nodes[node as usize].kind,
                Some(node::Kind::Switch(_) | node::Kind::Split(_))
            )
        };
        let ingress = self.ingress;
        idom[ingress as usize] = ingress;
        let mut next_rank = 1u32;
        // Both walks below climb the dominator tree, which a crafted graph can make long for
        // many nodes (a long chain with edges from each of its nodes into one join): a work
        // budget keeps the check linear, and a graph that exceeds it is refused by name.
        let budget = JOIN_CHECK_STEPS_PER_ITEM.saturating_mul(total as u64);
        let mut steps = 0u64;
        let intersect = |mut a: u32, mut b: u32, idom: &[u32], rank: &[u32], steps: &mut u64| {
            while a != b {
                while rank[a as usize] > rank[b as usize] {
                    a = idom[a as usize];
                    *steps += 1;
                }
                while rank[b as usize] > rank[a as usize] {
                    b = idom[b as usize];
                    *steps += 1;
                }
            }
            a
        };
        for &node in order {
            if node == ingress || !reachable[node as usize] {
                continue;
            }
            let mut dominator = NONE;
            for &edge in self.in_edges.of(node) {
                let source = self.source_of(edge);
                if !reachable[source as usize] {
                    continue;
                }
                let vertex = n as u32 + edge;
                idom[vertex as usize] = source;
                rank[vertex as usize] = next_rank;
                next_rank += 1;
                nearest_branch[vertex as usize] = if is_router(source) {
                    vertex
                } else {
                    nearest_branch[source as usize]
                };
                dominator = if dominator == NONE {
                    vertex
                } else {
                    intersect(dominator, vertex, &idom, &rank, &mut steps)
                };
                if steps > budget {
                    self.push(ValidationError::TooComplex {
                        check: "joins across switch and split branches",
                    });
                    return;
                }
            }
            if dominator == NONE {
                continue;
            }
            idom[node as usize] = dominator;
            rank[node as usize] = next_rank;
            next_rank += 1;
            nearest_branch[node as usize] = nearest_branch[dominator as usize];
        }

        let mut found = Vec::new();
        let mut chosen: HashMap<u32, (u32, u32)> = HashMap::new();
        let mut required: Vec<u32> = Vec::new();
        for &node in order {
            let target = &graph.nodes[node as usize];
            if !reachable[node as usize] || target.join != JoinMode::All as i32 {
                continue;
            }
            if self.in_edges.of(node).len() < 2 {
                continue;
            }
            required.clear();
            required.extend(self.in_edges.of(node).iter().copied().filter(|&e| {
                !graph.edges[e as usize].optional && reachable[self.source_of(e) as usize]
            }));
            if required.len() < 2 {
                continue;
            }
            chosen.clear();
            'edges: for &edge in &required {
                let mut branch = nearest_branch[n + edge as usize];
                while branch != NONE {
                    steps += 1;
                    if steps > budget {
                        self.errors.extend(found);
                        self.push(ValidationError::TooComplex {
                            check: "joins across switch and split branches",
                        });
                        return;
                    }
                    let router = idom[branch as usize];
                    match chosen.get(&router) {
                        Some(&(vertex, _)) if vertex == branch => break,
                        Some(&(_, other_edge)) => {
                            found.push(ValidationError::ExclusiveJoin {
                                node: target.name.clone(),
                                first: self.edge_ref(other_edge as usize),
                                second: self.edge_ref(edge as usize),
                                branch: self.node_name(router).to_string(),
                                branch_kind: if matches!(
                                    self.node_kind(router),
                                    Some(node::Kind::Split(_))
                                ) {
                                    "split"
                                } else {
                                    "switch"
                                },
                            });
                            break 'edges;
                        }
                        None => {
                            chosen.insert(router, (branch, edge));
                        }
                    }
                    branch = nearest_branch[router as usize];
                }
            }
        }
        self.errors.extend(found);
    }

    /// How in-edges build each node's input: no two writes at overlapping pointers into a
    /// join-ALL node, and keyword-argument names for KWARGS models.
    fn check_inputs_assembly(&mut self) {
        let graph = self.graph;
        let mut found = Vec::new();
        // Reused buffers: no allocation per node.
        let mut data_edges: Vec<u32> = Vec::new();
        let mut writes: Vec<(&str, u32)> = Vec::new();
        for (index, node) in graph.nodes.iter().enumerate() {
            let is_kwargs_model = matches!(&node.kind, Some(node::Kind::Model(m)) if m.call_style == CallStyle::Kwargs as i32);
            let in_edges = self.in_edges.of(index as u32);
            if in_edges.len() < 2 && !is_kwargs_model {
                continue;
            }
            data_edges.clear();
            data_edges.extend(
                in_edges
                    .iter()
                    .copied()
                    .filter(|&e| graph.edges[e as usize].mode == EdgeMode::Data as i32),
            );
            if let Some(node::Kind::Model(model)) = &node.kind
                && model.call_style == CallStyle::Kwargs as i32
            {
                for &e in &data_edges {
                    let into = &graph.edges[e as usize].into;
                    if pointer::check(into).is_err() {
                        continue;
                    }
                    if let Some(key) = pointer::first_segment(into)
                        && !options::is_python_identifier(&key)
                    {
                        found.push(ValidationError::KwargsKey {
                            edge: self.edge_ref(e as usize),
                            node: node.name.clone(),
                            key: key.into_owned(),
                        });
                    }
                }
            }
            if node.join != JoinMode::All as i32 || data_edges.len() < 2 {
                continue;
            }
            // Tensor edges all append to `/inputs`; they conflict only with other writers.
            writes.clear();
            let mut tensors_edge = None;
            for &e in &data_edges {
                let edge = &graph.edges[e as usize];
                if pointer::check(&edge.into).is_err() {
                    continue;
                }
                if edge.tensors.is_some() {
                    tensors_edge.get_or_insert(e);
                } else {
                    writes.push((edge.into.as_str(), e));
                }
            }
            if let Some(e) = tensors_edge {
                writes.push(("/inputs", e));
            }
            // Sorted by segments, any overlapping pair has an overlapping neighbour.
            writes.sort_by(|a, b| {
                pointer::segments(a.0)
                    .cmp(pointer::segments(b.0))
                    .then(a.1.cmp(&b.1))
            });
            for pair in writes.windows(2) {
                let ((first_into, first), (second_into, second)) = (pair[0], pair[1]);
                if pointer::overlaps(first_into, second_into) {
                    let (first, second, first_into, second_into) = if first < second {
                        (first, second, first_into, second_into)
                    } else {
                        (second, first, second_into, first_into)
                    };
                    found.push(ValidationError::IntoConflict {
                        node: node.name.clone(),
                        first: self.edge_ref(first as usize),
                        second: self.edge_ref(second as usize),
                        first_into: first_into.to_string(),
                        second_into: second_into.to_string(),
                    });
                }
            }
        }
        self.errors.extend(found);
    }
}

/// Edges per node in compressed form (one offsets array, one list): no allocation per node.
#[derive(Default)]
struct Adjacency {
    start: Vec<u32>,
    list: Vec<u32>,
}

impl Adjacency {
    /// From (node, edge) pairs; each node's edges keep the order of the pairs.
    fn build(n: usize, pairs: impl Iterator<Item = (u32, u32)> + Clone) -> Self {
        let mut start = vec![0u32; n + 1];
        for (node, _) in pairs.clone() {
            start[node as usize + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut next = start.clone();
        let mut list = vec![0u32; start[n] as usize];
        for (node, edge) in pairs {
            list[next[node as usize] as usize] = edge;
            next[node as usize] += 1;
        }
        Adjacency { start, list }
    }

    fn of(&self, node: u32) -> &[u32] {
        let node = node as usize;
        match (self.start.get(node), self.start.get(node + 1)) {
            (Some(&from), Some(&to)) => &self.list[from as usize..to as usize],
            _ => &[],
        }
    }
}

/// Backward search from a node for a candidate ancestor, pruned by topological position (a
/// node placed before the candidate cannot have it as an ancestor). Visit marks are stamped
/// with a generation, so repeated queries allocate nothing.
struct AncestorSearch {
    stamp: Vec<u32>,
    generation: u32,
    stack: Vec<u32>,
}

impl AncestorSearch {
    fn new(n: usize) -> Self {
        AncestorSearch {
            stamp: vec![0; n],
            generation: 0,
            stack: Vec::new(),
        }
    }

    fn is_ancestor(
        &mut self,
        candidate: u32,
        node: u32,
        position: &[u32],
        in_edges: &Adjacency,
        links: &[Option<Link>],
    ) -> bool {
        if position[candidate as usize] >= position[node as usize] {
            return false;
        }
        self.generation += 1;
        self.stack.clear();
        self.stack.push(node);
        while let Some(current) = self.stack.pop() {
            for &edge in in_edges.of(current) {
                let Some(link) = links[edge as usize] else {
                    continue;
                };
                let source = link.source;
                if source == candidate {
                    return true;
                }
                let s = source as usize;
                if self.stamp[s] != self.generation && position[s] > position[candidate as usize] {
                    self.stamp[s] = self.generation;
                    self.stack.push(source);
                }
            }
        }
        false
    }
}

fn option_error(location: Location, field: String, problem: String) -> ValidationError {
    ValidationError::InvalidOption {
        location,
        field,
        problem,
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
