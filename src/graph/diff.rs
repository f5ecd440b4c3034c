//! The plan of a graph change (`raypipe dag diff OLD NEW`, and the plan a rollout shows): per
//! node, whether a new graph version leaves it alone, updates it in place, restarts its
//! replicas, adds or removes it; the routing and graph-level changes in words; and whether the
//! change reaches every replica through the Serve application's `args`.
//!
//! Pure and deterministic (nodes sorted by name). Every proto field is classified explicitly:
//! the comparisons destructure each message without `..`, so a new field fails to compile here
//! until it is classified, and a unit test checks the classification against the .proto file.
//!
//! What "in place" means follows Ray Serve 2.60 (`serve/_private/config.py`, `version.py`):
//! options Serve applies to running replicas (LightWeight, NeedsReconfigure and
//! NeedsActorReconfigure options) and fields only raypipe's executor reads are in place; the
//! user class, its constructor arguments, `ray_actor_options` and `max_replicas_per_node` need
//! new replicas. Serve also hashes the application's `args` and `runtime_env` into every
//! deployment's code version, so a change of the wiring the renderer puts in `args`
//! ([`same_wiring`]) restarts every replica whatever the per-node class says:
//! [`GraphDiff::restarts_all_replicas`] tells.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::options;
use super::predicate::Text;
use super::proto::{
    self, DeploymentOptions, Edge, EdgeMode, InputNode, JoinMode, ModelNode, NoMatch, Node,
    OutputNode, PipelineGraph, RuntimeEnv, SplitNode, SwitchNode, node,
};
use super::serde_support::wiring::same_wiring;
use super::serde_support::{TextEnum, short_name};
use super::{DEFAULT_DEADLINE_MS, MAX_PROBLEM_BYTES, capped};

/// What a new graph version does to one node.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Change {
    /// Nothing about the node changed.
    Unchanged,
    /// Applied to the running replicas (or only the executor reads what changed).
    InPlace,
    /// The node needs new replicas (new code, constructor arguments or actor options).
    Restarted,
    /// Only in the new graph.
    Added,
    /// Only in the old graph.
    Removed,
}

impl Change {
    fn label(self) -> &'static str {
        match self {
            Change::Unchanged => "unchanged",
            Change::InPlace => "in place",
            Change::Restarted => "restarted",
            Change::Added => "added",
            Change::Removed => "removed",
        }
    }
}

/// A node's kind (the `kind` oneof of `Node`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NodeKind {
    Input,
    Model,
    Switch,
    Split,
    Output,
    /// No kind set (only in a graph that was not validated).
    Unset,
}

impl NodeKind {
    fn of(kind: Option<&node::Kind>) -> NodeKind {
        match kind {
            Some(node::Kind::Input(_)) => NodeKind::Input,
            Some(node::Kind::Model(_)) => NodeKind::Model,
            Some(node::Kind::Switch(_)) => NodeKind::Switch,
            Some(node::Kind::Split(_)) => NodeKind::Split,
            Some(node::Kind::Output(_)) => NodeKind::Output,
            None => NodeKind::Unset,
        }
    }

    /// The proto field (oneof member) of this kind.
    fn field(self) -> &'static str {
        match self {
            NodeKind::Input => "input",
            NodeKind::Model => "model",
            NodeKind::Switch => "switch",
            NodeKind::Split => "split",
            NodeKind::Output => "output",
            NodeKind::Unset => "kind",
        }
    }
}

/// One node's line of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDiff {
    /// The node's name (nodes of the two graphs are matched by name).
    pub node: String,
    /// Its kind in the new graph (in the old one when removed).
    pub kind: NodeKind,
    pub change: Change,
    /// The changed proto fields, as paths from the node (`timeout_ms`,
    /// `model.deployment.num_replicas`), sorted. Empty for unchanged, added and removed nodes.
    pub fields: Vec<String>,
}

/// What a new graph version changes, node by node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GraphDiff {
    /// Every node of either graph, sorted by name.
    pub nodes: Vec<NodeDiff>,
    /// Edge and routing changes in words (edges added or removed, guards, weights, join modes,
    /// ingress and output).
    pub routing: Vec<String>,
    /// Graph-level changes in words (name, version, deadline, route prefix, executor options,
    /// forward_headers, runtime_env, labels).
    pub graph: Vec<String>,
    /// The wiring the renderer hands the runtime as the Serve application's `args`, or the
    /// application's runtime_env, changed. Ray Serve hashes both into every deployment's code
    /// version, so every replica of the application restarts, `unchanged` and `inPlace` nodes
    /// included.
    pub restarts_all_replicas: bool,
}

impl GraphDiff {
    /// True when the graphs differ in nothing the plan describes.
    pub fn is_empty(&self) -> bool {
        self.routing.is_empty()
            && self.graph.is_empty()
            && self.nodes.iter().all(|n| n.change == Change::Unchanged)
    }

    /// The plan as at most `max` short lines (for a status): the summary, each node that
    /// changes with its fields, then the routing and graph changes; what does not fit is
    /// counted in a last line.
    pub fn lines(&self, max: usize) -> Vec<String> {
        let mut all = vec![self.summary()];
        all.extend(
            self.nodes
                .iter()
                .filter(|n| n.change != Change::Unchanged)
                .map(|n| {
                    if n.fields.is_empty() {
                        format!("{}: {}", n.node, n.change.label())
                    } else {
                        format!("{}: {} ({})", n.node, n.change.label(), n.fields.join(", "))
                    }
                }),
        );
        all.extend(self.routing.iter().cloned());
        all.extend(self.graph.iter().cloned());
        if all.len() > max {
            let hidden = all.len() - max.saturating_sub(1);
            all.truncate(max.saturating_sub(1));
            all.push(format!("… and {hidden} more"));
        }
        all
    }

    /// How many nodes have the given change.
    pub fn count(&self, change: Change) -> usize {
        self.nodes.iter().filter(|n| n.change == change).count()
    }

    /// One line, e.g. "2 unchanged, 1 in place, 1 restarted, 1 added, 0 removed, 2 routing
    /// changes, 1 graph change".
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = [
            Change::Unchanged,
            Change::InPlace,
            Change::Restarted,
            Change::Added,
            Change::Removed,
        ]
        .into_iter()
        .map(|change| format!("{} {}", self.count(change), change.label()))
        .collect();
        parts.push(plural(self.routing.len(), "routing change"));
        parts.push(plural(self.graph.len(), "graph change"));
        parts.join(", ")
    }
}

fn plural(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

impl fmt::Display for GraphDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return writeln!(f, "no changes");
        }
        writeln!(f, "{}", self.summary())?;
        writeln!(f)?;
        let rows: Vec<[String; 4]> = self
            .nodes
            .iter()
            .map(|n| {
                let fields = if n.fields.is_empty() {
                    "-".to_string()
                } else {
                    n.fields.join(", ")
                };
                [
                    n.node.clone(),
                    n.kind.field().to_string(),
                    n.change.label().to_string(),
                    fields,
                ]
            })
            .collect();
        let header = ["NODE", "KIND", "CHANGE", "FIELDS"].map(str::to_string);
        let mut widths = [0usize; 3];
        for row in std::iter::once(&header).chain(&rows) {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        for row in std::iter::once(&header).chain(&rows) {
            let [node, kind, change, fields] = row;
            let line = format!(
                "{node:w0$}  {kind:w1$}  {change:w2$}  {fields}",
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
            );
            writeln!(f, "{}", line.trim_end())?;
        }
        for (title, lines) in [("routing", &self.routing), ("graph", &self.graph)] {
            if !lines.is_empty() {
                writeln!(f, "\n{title}:")?;
                for line in lines {
                    writeln!(f, "  {line}")?;
                }
            }
        }
        if self.restarts_all_replicas {
            writeln!(
                f,
                "\nnote: the graph wiring in the Serve application's args (or its runtime_env) \
                 changes, and Ray Serve restarts every replica of the application when they do, \
                 unchanged and in-place nodes included"
            )?;
        }
        Ok(())
    }
}

/// The plan of going from `old` to `new`. Works on any decoded graphs; nodes are matched by
/// name (in an unvalidated graph with duplicate names, the first of each name counts).
pub fn diff(old: &PipelineGraph, new: &PipelineGraph) -> GraphDiff {
    GraphDiff {
        nodes: node_diffs(old, new),
        routing: capped_lines(routing_changes(old, new)),
        graph: capped_lines(graph_changes(old, new)),
        // Which nodes are fused is in `args` too (`fused_nodes`).
        restarts_all_replicas: !same_wiring(old, new)
            || old.runtime_env != new.runtime_env
            || !options::fusable_nodes(old).eq(options::fusable_nodes(new)),
    }
}

/// Longest routing or graph line (bytes). The lines quote text from the graphs (predicate
/// literals, pointers, header names), which only validation bounds, and the plan is printed and
/// may be stored in a status.
pub const MAX_LINE_BYTES: usize = 2 * MAX_PROBLEM_BYTES;

fn capped_lines(lines: Vec<String>) -> Vec<String> {
    lines
        .into_iter()
        .map(|line| {
            if line.len() > MAX_LINE_BYTES {
                capped(&line, MAX_LINE_BYTES)
            } else {
                line
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Nodes

/// What changing one field does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Effect {
    /// Applied to running replicas, or read only by the executor.
    InPlace,
    /// Needs new replicas.
    Restart,
}

/// Changed fields with their effects, as paths from the message being compared.
#[derive(Default)]
struct FieldChanges {
    changed: Vec<(String, Effect)>,
}

impl FieldChanges {
    fn field<T: PartialEq + ?Sized>(&mut self, path: &str, old: &T, new: &T, effect: Effect) {
        if old != new {
            self.changed.push((path.to_string(), effect));
        }
    }

    fn change(&self) -> Change {
        match self.changed.iter().map(|(_, effect)| *effect).max() {
            None => Change::Unchanged,
            Some(Effect::InPlace) => Change::InPlace,
            Some(Effect::Restart) => Change::Restarted,
        }
    }

    fn into_fields(self) -> Vec<String> {
        let mut fields: Vec<String> = self.changed.into_iter().map(|(path, _)| path).collect();
        fields.sort_unstable();
        fields.dedup();
        fields
    }
}

fn nodes_by_name(graph: &PipelineGraph) -> BTreeMap<&str, &Node> {
    let mut nodes = BTreeMap::new();
    for node in &graph.nodes {
        nodes.entry(node.name.as_str()).or_insert(node);
    }
    nodes
}

fn node_diffs(old: &PipelineGraph, new: &PipelineGraph) -> Vec<NodeDiff> {
    let old_nodes = nodes_by_name(old);
    let new_nodes = nodes_by_name(new);
    let names: BTreeSet<&str> = old_nodes.keys().chain(new_nodes.keys()).copied().collect();
    names
        .into_iter()
        .map(|name| {
            let (kind, change, fields) = match (old_nodes.get(name), new_nodes.get(name)) {
                (Some(a), Some(b)) => {
                    let mut changes = FieldChanges::default();
                    compare_node(a, b, &mut changes);
                    (b.kind.as_ref(), changes.change(), changes.into_fields())
                }
                (None, Some(b)) => (b.kind.as_ref(), Change::Added, Vec::new()),
                (Some(a), None) => (a.kind.as_ref(), Change::Removed, Vec::new()),
                (None, None) => (None, Change::Unchanged, Vec::new()),
            };
            NodeDiff {
                node: name.to_string(),
                kind: NodeKind::of(kind),
                change,
                fields,
            }
        })
        .collect()
}

fn compare_node(old: &Node, new: &Node, out: &mut FieldChanges) {
    use Effect::InPlace;
    // Listed without `..`: a new Node field fails to compile here until it is classified.
    let Node {
        name: _, // the key nodes are matched by
        description,
        kind,
        join,
        on_error,
        fallback_value,
        timeout_ms,
        retry,
        shadow,
        input_template,
    } = old;
    // For people only (DOT tooltips); nothing that runs reads it.
    out.field("description", description, &new.description, InPlace);
    // Read only by the executor, per request: how the node's input is assembled, when it runs,
    // how long an attempt may take, what a failure does, which share of requests a shadow
    // branch sees. The node's replicas never see them.
    out.field("join", join, &new.join, InPlace);
    out.field("on_error", on_error, &new.on_error, InPlace);
    out.field(
        "fallback_value",
        fallback_value,
        &new.fallback_value,
        InPlace,
    );
    out.field("timeout_ms", timeout_ms, &new.timeout_ms, InPlace);
    out.field("retry", retry, &new.retry, InPlace);
    out.field("shadow", shadow, &new.shadow, InPlace);
    out.field(
        "input_template",
        input_template,
        &new.input_template,
        InPlace,
    );
    compare_kind(kind.as_ref(), new.kind.as_ref(), out);
}

fn compare_kind(old: Option<&node::Kind>, new: Option<&node::Kind>, out: &mut FieldChanges) {
    use Effect::InPlace;
    use node::Kind;
    match (old, new) {
        (Some(Kind::Model(a)), Some(Kind::Model(b))) => compare_model(a, b, out),
        (Some(Kind::Switch(a)), Some(Kind::Switch(b))) => {
            let SwitchNode { on_no_match } = a;
            // Read by the executor when no case holds.
            out.field("switch.on_no_match", on_no_match, &b.on_no_match, InPlace);
        }
        (Some(Kind::Split(a)), Some(Kind::Split(b))) => {
            let SplitNode { sticky_key } = a;
            // Read by the executor when it picks a branch.
            out.field("split.sticky_key", sticky_key, &b.sticky_key, InPlace);
        }
        (Some(Kind::Input(a)), Some(Kind::Input(_))) => {
            let InputNode {} = a;
        }
        (Some(Kind::Output(a)), Some(Kind::Output(_))) => {
            let OutputNode {} = a;
        }
        (None, None) => {}
        // Another kind of node under the same name: a model deployment appears or goes (or is
        // replaced), which is never an update of running replicas.
        (a, b) => {
            for kind in [a, b] {
                out.changed
                    .push((NodeKind::of(kind).field().to_string(), Effect::Restart));
            }
        }
    }
}

fn compare_model(old: &ModelNode, new: &ModelNode, out: &mut FieldChanges) {
    use Effect::{InPlace, Restart};
    let ModelNode {
        import_path,
        init_args,
        init_kwargs,
        method,
        call_style,
        deployment,
        fuse,
    } = old;
    // The class and its constructor arguments: only a new replica runs them.
    out.field("model.import_path", import_path, &new.import_path, Restart);
    out.field("model.init_args", init_args, &new.init_args, Restart);
    out.field("model.init_kwargs", init_kwargs, &new.init_kwargs, Restart);
    // Chosen by the executor per call (`handle.options(method_name=...)`) and how it passes the
    // input: the replica's object stays the same.
    out.field("model.method", method, &new.method, InPlace);
    out.field("model.call_style", call_style, &new.call_style, InPlace);
    compare_deployment(
        "model.deployment.",
        deployment.as_deref(),
        new.deployment.as_deref(),
        out,
    );
    // Whether the node runs fused (inside the executor) or as its own deployment: either way
    // a deployment appears or goes, which no running replica can absorb.
    // Adding the first deployment option to a fusable node unfuses it too.
    out.field(
        "model.fuse",
        &(fuse, options::may_fuse(old)),
        &(&new.fuse, options::may_fuse(new)),
        Restart,
    );
}

/// Deployment options, as Ray Serve 2.60 applies them (`DeploymentConfig` update types and
/// `DeploymentVersion.requires_actor_restart`). Unset options compare as empty ones.
fn compare_deployment(
    prefix: &str,
    old: Option<&DeploymentOptions>,
    new: Option<&DeploymentOptions>,
    out: &mut FieldChanges,
) {
    use Effect::{InPlace, Restart};
    let unset = DeploymentOptions::default();
    let (old, new) = (old.unwrap_or(&unset), new.unwrap_or(&unset));
    let DeploymentOptions {
        num_replicas,
        autoscaling_config,
        max_ongoing_requests,
        max_queued_requests,
        user_config,
        health_check_period_s,
        health_check_timeout_s,
        graceful_shutdown_wait_loop_s,
        graceful_shutdown_timeout_s,
        ray_actor_options,
        max_replicas_per_node,
        logging_config,
    } = old;
    let mut field = |name: &str, changed: bool, effect: Effect| {
        if changed {
            out.changed.push((format!("{prefix}{name}"), effect));
        }
    };
    // LightWeight: Serve only sets a new target.
    field("num_replicas", *num_replicas != new.num_replicas, InPlace);
    field(
        "max_queued_requests",
        *max_queued_requests != new.max_queued_requests,
        InPlace,
    );
    // NeedsActorReconfigure: pushed to running replicas (`reconfigure(user_config)`).
    field(
        "autoscaling_config",
        *autoscaling_config != new.autoscaling_config,
        InPlace,
    );
    field(
        "max_ongoing_requests",
        *max_ongoing_requests != new.max_ongoing_requests,
        InPlace,
    );
    field("user_config", *user_config != new.user_config, InPlace);
    field(
        "graceful_shutdown_wait_loop_s",
        *graceful_shutdown_wait_loop_s != new.graceful_shutdown_wait_loop_s,
        InPlace,
    );
    field(
        "logging_config",
        *logging_config != new.logging_config,
        InPlace,
    );
    // NeedsReconfigure: the controller's view of the replicas changes, the actors do not.
    field(
        "health_check_period_s",
        *health_check_period_s != new.health_check_period_s,
        InPlace,
    );
    field(
        "health_check_timeout_s",
        *health_check_timeout_s != new.health_check_timeout_s,
        InPlace,
    );
    field(
        "graceful_shutdown_timeout_s",
        *graceful_shutdown_timeout_s != new.graceful_shutdown_timeout_s,
        InPlace,
    );
    // Part of how the actor is created and placed (requires_actor_restart): new replicas.
    field(
        "ray_actor_options",
        *ray_actor_options != new.ray_actor_options,
        Restart,
    );
    field(
        "max_replicas_per_node",
        *max_replicas_per_node != new.max_replicas_per_node,
        Restart,
    );
}

// ---------------------------------------------------------------------------------------------
// Routing

fn enum_name<E: TextEnum>(value: i32) -> String {
    short_name::<E>(value).map_or_else(|| value.to_string(), str::to_string)
}

fn output_names(graph: &PipelineGraph) -> Vec<&str> {
    graph
        .nodes
        .iter()
        .filter(|n| matches!(n.kind, Some(node::Kind::Output(_))))
        .map(|n| n.name.as_str())
        .collect()
}

/// Edges keyed by (source, target, n-th edge between them), in declaration order.
type EdgeKey<'a> = (&'a str, &'a str, usize);

fn keyed_edges(graph: &PipelineGraph) -> Vec<(EdgeKey<'_>, &Edge)> {
    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    graph
        .edges
        .iter()
        .map(|edge| {
            let count = seen
                .entry((edge.source.as_str(), edge.target.as_str()))
                .or_default();
            let key = (edge.source.as_str(), edge.target.as_str(), *count);
            *count += 1;
            (key, edge)
        })
        .collect()
}

/// Sum of split weights per source node.
fn weight_totals(graph: &PipelineGraph) -> HashMap<&str, u64> {
    let mut totals: HashMap<&str, u64> = HashMap::new();
    for edge in &graph.edges {
        if let Some(weight) = edge.weight {
            *totals.entry(edge.source.as_str()).or_default() += u64::from(weight);
        }
    }
    totals
}

fn describe_weight(weight: Option<u32>, total: u64) -> String {
    match weight {
        None => "none".to_string(),
        Some(w) if total > 0 => format!("{w} ({:.0}%)", 100.0 * f64::from(w) / total as f64),
        Some(w) => w.to_string(),
    }
}

fn describe_when(when: Option<&proto::Predicate>) -> String {
    match when {
        Some(predicate) => format!("`{}`", capped(&Text(predicate), MAX_PROBLEM_BYTES)),
        None => "none".to_string(),
    }
}

fn edge_name((source, target, _): EdgeKey<'_>) -> String {
    format!("edge {source} -> {target}")
}

/// What an added or removed edge routes by, in brackets (empty when it is a plain edge).
fn edge_routing(edge: &Edge, total: u64) -> String {
    let mut parts = Vec::new();
    if let Some(when) = &edge.when {
        parts.push(format!("when {}", describe_when(Some(when))));
    }
    if edge.weight.is_some() {
        parts.push(format!("weight {}", describe_weight(edge.weight, total)));
    }
    if edge.mode == EdgeMode::Order as i32 {
        parts.push("order only".to_string());
    }
    if edge.optional {
        parts.push("optional".to_string());
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

fn routing_changes(old: &PipelineGraph, new: &PipelineGraph) -> Vec<String> {
    let mut lines = Vec::new();
    if old.ingress != new.ingress {
        lines.push(format!("ingress: {:?} -> {:?}", old.ingress, new.ingress));
    }
    let (old_outputs, new_outputs) = (output_names(old), output_names(new));
    if old_outputs != new_outputs {
        lines.push(format!(
            "output: {} -> {}",
            old_outputs.join(", "),
            new_outputs.join(", ")
        ));
    }
    node_routing_changes(old, new, &mut lines);
    edge_changes(old, new, &mut lines);
    lines
}

/// Join modes, switch and split settings of nodes in both graphs.
fn node_routing_changes(old: &PipelineGraph, new: &PipelineGraph, lines: &mut Vec<String>) {
    let new_nodes = nodes_by_name(new);
    for (name, a) in nodes_by_name(old) {
        let Some(b) = new_nodes.get(name) else {
            continue;
        };
        if a.join != b.join {
            lines.push(format!(
                "join of {name}: {} -> {}",
                enum_name::<JoinMode>(a.join),
                enum_name::<JoinMode>(b.join)
            ));
        }
        match (&a.kind, &b.kind) {
            (Some(node::Kind::Switch(x)), Some(node::Kind::Switch(y)))
                if x.on_no_match != y.on_no_match =>
            {
                lines.push(format!(
                    "switch {name}: on_no_match {} -> {}",
                    enum_name::<NoMatch>(x.on_no_match),
                    enum_name::<NoMatch>(y.on_no_match)
                ));
            }
            (Some(node::Kind::Split(x)), Some(node::Kind::Split(y)))
                if x.sticky_key != y.sticky_key =>
            {
                lines.push(format!(
                    "split {name}: sticky_key {:?} -> {:?}",
                    x.sticky_key, y.sticky_key
                ));
            }
            _ => {}
        }
    }
}

fn edge_changes(old: &PipelineGraph, new: &PipelineGraph, lines: &mut Vec<String>) {
    let (old_edges, new_edges) = (keyed_edges(old), keyed_edges(new));
    let (old_totals, new_totals) = (weight_totals(old), weight_totals(new));
    let total = |totals: &HashMap<&str, u64>, edge: &Edge| {
        totals.get(edge.source.as_str()).copied().unwrap_or(0)
    };
    let old_by_key: HashMap<EdgeKey<'_>, &Edge> = old_edges.iter().copied().collect();
    let new_by_key: HashMap<EdgeKey<'_>, &Edge> = new_edges.iter().copied().collect();

    for &(key, edge) in &old_edges {
        if !new_by_key.contains_key(&key) {
            lines.push(format!(
                "{} removed{}",
                edge_name(key),
                edge_routing(edge, total(&old_totals, edge))
            ));
        }
    }
    for &(key, b) in &new_edges {
        match old_by_key.get(&key) {
            None => lines.push(format!(
                "{} added{}",
                edge_name(key),
                edge_routing(b, total(&new_totals, b))
            )),
            Some(a) => compare_edge(
                key,
                a,
                b,
                (total(&old_totals, a), total(&new_totals, b)),
                lines,
            ),
        }
    }

    // Declaration order is the order a node's input is assembled in and breaks ties between
    // switch cases, so a reordering of kept edges is a change too.
    if kept_in_order(&old_edges, &new_by_key) != kept_in_order(&new_edges, &old_by_key) {
        lines.push("edge declaration order changed".to_string());
    }
}

/// Keys of `edges` that `other` has too, in declaration order.
fn kept_in_order<'a>(
    edges: &[(EdgeKey<'a>, &Edge)],
    other: &HashMap<EdgeKey<'_>, &Edge>,
) -> Vec<EdgeKey<'a>> {
    edges
        .iter()
        .map(|(key, _)| *key)
        .filter(|key| other.contains_key(key))
        .collect()
}

fn compare_edge(
    key: EdgeKey<'_>,
    old: &Edge,
    new: &Edge,
    (old_total, new_total): (u64, u64),
    lines: &mut Vec<String>,
) {
    // Listed without `..`: a new Edge field fails to compile here until it is described.
    let Edge {
        source: _, // source and target are the key
        target: _,
        mode,
        select,
        tensors,
        into,
        optional,
        if_missing,
        when,
        weight,
        order,
    } = old;
    let name = edge_name(key);
    let mut line = |text: String| lines.push(format!("{name}: {text}"));
    if *mode != new.mode {
        line(format!(
            "mode {} -> {}",
            enum_name::<EdgeMode>(*mode),
            enum_name::<EdgeMode>(new.mode)
        ));
    }
    if *select != new.select {
        line(format!("select {select:?} -> {:?}", new.select));
    }
    if *tensors != new.tensors {
        line("tensors changed".to_string());
    }
    if *into != new.into {
        line(format!("into {into:?} -> {:?}", new.into));
    }
    if *optional != new.optional {
        line(format!("optional {optional} -> {}", new.optional));
    }
    if *if_missing != new.if_missing {
        line("if_missing changed".to_string());
    }
    if *when != new.when {
        line(format!(
            "when {} -> {}",
            describe_when(when.as_deref()),
            describe_when(new.when.as_deref())
        ));
    }
    // A weight's share moves when a sibling's weight changes; only the edge whose own weight
    // changed is listed, with both shares.
    if *weight != new.weight {
        line(format!(
            "weight {} -> {}",
            describe_weight(*weight, old_total),
            describe_weight(new.weight, new_total)
        ));
    }
    if *order != new.order {
        line(format!("order {order} -> {}", new.order));
    }
}

// ---------------------------------------------------------------------------------------------
// Graph level

fn graph_changes(old: &PipelineGraph, new: &PipelineGraph) -> Vec<String> {
    // Listed without `..`: a new PipelineGraph field fails to compile here until it is
    // described.
    let PipelineGraph {
        name,
        version,
        ingress: _, // routing
        route_prefix,
        runtime_env,
        nodes: _, // per node, and their order below
        edges: _, // routing
        deadline_ms,
        forward_headers,
        labels,
        executor,
        fuse,
    } = old;
    let mut lines = Vec::new();
    if *fuse != new.fuse {
        // Nodes move between the executor and deployments of their own: new replicas.
        lines.push(format!(
            "fuse: {} -> {} (fusable nodes move between the executor and deployments of their own)",
            describe_fuse(*fuse),
            describe_fuse(new.fuse)
        ));
    }
    if *name != new.name {
        // The default Serve application name: where it names the application, Serve deploys a
        // new application and deletes the old one.
        lines.push(format!("name: {name:?} -> {:?}", new.name));
    }
    if *version != new.version {
        lines.push(format!("version: {version:?} -> {:?}", new.version));
    }
    if *route_prefix != new.route_prefix {
        lines.push(format!(
            "route_prefix: {route_prefix:?} -> {:?}",
            new.route_prefix
        ));
    }
    if *deadline_ms != new.deadline_ms {
        lines.push(format!(
            "deadline_ms: {} -> {}",
            describe_deadline(*deadline_ms),
            describe_deadline(new.deadline_ms)
        ));
    }
    if *forward_headers != new.forward_headers {
        lines.push(format!(
            "forward_headers: [{}] -> [{}]",
            forward_headers.join(", "),
            new.forward_headers.join(", ")
        ));
    }
    if *labels != new.labels {
        lines.push(format!("labels: {}", map_key_changes(labels, &new.labels)));
    }
    if let Some(line) = runtime_env_change(runtime_env.as_ref(), new.runtime_env.as_ref()) {
        lines.push(line);
    }
    let mut executor_changes = FieldChanges::default();
    compare_deployment(
        "executor.",
        executor.as_ref(),
        new.executor.as_ref(),
        &mut executor_changes,
    );
    for (field, effect) in executor_changes.changed {
        lines.push(match effect {
            Effect::InPlace => format!("{field} changed (in place)"),
            Effect::Restart => format!("{field} changed (restarts the executor's replicas)"),
        });
    }
    if node_order(old, new) != node_order(new, old) {
        // The order breaks ties in the topological order.
        lines.push("node declaration order changed".to_string());
    }
    lines
}

fn describe_fuse(fuse: Option<bool>) -> &'static str {
    match fuse {
        None => "default (on)",
        Some(true) => "on",
        Some(false) => "off",
    }
}

fn describe_deadline(deadline_ms: u32) -> String {
    if deadline_ms == 0 {
        format!("default ({DEFAULT_DEADLINE_MS})")
    } else {
        deadline_ms.to_string()
    }
}

/// Names of the nodes of `graph` that `other` has too, in `graph`'s order.
fn node_order<'a>(graph: &'a PipelineGraph, other: &PipelineGraph) -> Vec<&'a str> {
    let names = nodes_by_name(other);
    graph
        .nodes
        .iter()
        .map(|n| n.name.as_str())
        .filter(|name| names.contains_key(name))
        .collect()
}

/// Which keys of a map were added, removed or changed. Keys only: values may be anything from
/// an environment variable's secret to a team's name, and the plan is printed and stored.
fn map_key_changes(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> String {
    let mut parts = Vec::new();
    let keys = |filter: &dyn Fn(&String) -> bool, map: &BTreeMap<String, String>| {
        map.keys()
            .filter(|k| filter(k))
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (word, list) in [
        ("added", keys(&|k| !old.contains_key(k), new)),
        ("removed", keys(&|k| !new.contains_key(k), old)),
        (
            "changed",
            keys(&|k| new.get(k).is_some_and(|v| old.get(k) != Some(v)), old),
        ),
    ] {
        if !list.is_empty() {
            parts.push(format!("{word} {list}"));
        }
    }
    parts.join("; ")
}

fn runtime_env_change(old: Option<&RuntimeEnv>, new: Option<&RuntimeEnv>) -> Option<String> {
    let unset = RuntimeEnv::default();
    let (old, new) = (old.unwrap_or(&unset), new.unwrap_or(&unset));
    let RuntimeEnv {
        working_dir,
        py_modules,
        pip,
        env_vars,
    } = old;
    let mut parts = Vec::new();
    if *working_dir != new.working_dir {
        parts.push("working_dir".to_string());
    }
    if *py_modules != new.py_modules {
        parts.push("py_modules".to_string());
    }
    if *pip != new.pip {
        parts.push("pip".to_string());
    }
    if *env_vars != new.env_vars {
        parts.push(format!(
            "env_vars ({})",
            map_key_changes(env_vars, &new.env_vars)
        ));
    }
    (!parts.is_empty()).then(|| {
        format!(
            "runtime_env: {} changed (every replica restarts)",
            parts.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::proto::{AutoscalingConfig, JsonObject, JsonValue, RayActorOptions, Retry};

    const SAMPLE: &str = include_str!("../../samples/graphs/switch-canary.yaml");

    fn sample() -> PipelineGraph {
        crate::graph::from_yaml(SAMPLE).unwrap()
    }

    #[test]
    fn the_plan_lines_for_a_status_are_bounded() {
        let old = sample();
        let mut new = sample();
        new.version = "changed".into();
        for node in &mut new.nodes {
            node.description = format!("{} changed", node.name);
        }
        let d = diff(&old, &new);
        let all = d.lines(usize::MAX);
        assert!(all.len() > 3, "{all:?}");
        assert_eq!(all[0], d.summary());
        let capped = d.lines(3);
        assert_eq!(capped.len(), 3);
        assert_eq!(capped[2], format!("… and {} more", all.len() - 2));
        assert_eq!(diff(&old, &old).lines(5), vec![diff(&old, &old).summary()]);
    }

    fn node_mut<'a>(graph: &'a mut PipelineGraph, name: &str) -> &'a mut Node {
        graph.nodes.iter_mut().find(|n| n.name == name).unwrap()
    }

    fn model_mut<'a>(graph: &'a mut PipelineGraph, name: &str) -> &'a mut ModelNode {
        match &mut node_mut(graph, name).kind {
            Some(node::Kind::Model(model)) => model,
            _ => panic!("{name} is not a model"),
        }
    }

    fn deployment_mut<'a>(graph: &'a mut PipelineGraph, name: &str) -> &'a mut DeploymentOptions {
        model_mut(graph, name)
            .deployment
            .get_or_insert_with(Default::default)
    }

    fn edge_mut<'a>(graph: &'a mut PipelineGraph, source: &str, target: &str) -> &'a mut Edge {
        graph
            .edges
            .iter_mut()
            .find(|e| e.source == source && e.target == target)
            .unwrap()
    }

    fn line_of(diff: &GraphDiff, name: &str) -> NodeDiff {
        diff.nodes.iter().find(|n| n.node == name).unwrap().clone()
    }

    fn string(text: &str) -> JsonValue {
        JsonValue {
            kind: Some(proto::json_value::Kind::StringValue(text.to_string())),
        }
    }

    /// Only `name` differs, with that change and those fields; the others are unchanged.
    fn assert_only(diff: &GraphDiff, name: &str, change: Change, fields: &[&str]) {
        for line in &diff.nodes {
            if line.node == name {
                assert_eq!(
                    (line.change, &line.fields[..]),
                    (
                        change,
                        &fields.iter().map(|f| f.to_string()).collect::<Vec<_>>()[..]
                    ),
                    "{diff}"
                );
            } else {
                assert_eq!(line.change, Change::Unchanged, "{diff}");
            }
        }
    }

    #[test]
    fn equal_graphs_have_no_changes() {
        let diff = diff(&sample(), &sample());
        assert!(diff.is_empty());
        assert!(!diff.restarts_all_replicas);
        assert_eq!(diff.nodes.len(), 8);
        assert!(diff.nodes.windows(2).all(|w| w[0].node < w[1].node));
        assert_eq!(diff.to_string(), "no changes\n");
        assert_eq!(
            diff.summary(),
            "8 unchanged, 0 in place, 0 restarted, 0 added, 0 removed, 0 routing changes, 0 graph changes"
        );
    }

    #[test]
    fn deployment_options_serve_applies_live_are_in_place_and_keep_the_wiring() {
        let old = sample();
        let mut new = sample();
        let options = deployment_mut(&mut new, "stable");
        options.autoscaling_config = Some(AutoscalingConfig {
            max_replicas: Some(4),
            ..Default::default()
        });
        options.max_ongoing_requests = Some(8);
        options.max_queued_requests = Some(20);
        options.user_config = Some(JsonObject {
            fields: [("threshold".to_string(), string("0.7"))].into(),
        });
        options.health_check_period_s = Some(5.0);
        deployment_mut(&mut new, "premium").num_replicas = Some(3);
        let diff = diff(&old, &new);
        let stable = line_of(&diff, "stable");
        assert_eq!(stable.change, Change::InPlace);
        assert_eq!(
            stable.fields,
            [
                "model.deployment.autoscaling_config",
                "model.deployment.health_check_period_s",
                "model.deployment.max_ongoing_requests",
                "model.deployment.max_queued_requests",
                "model.deployment.user_config",
            ]
        );
        let premium = line_of(&diff, "premium");
        assert_eq!(
            (premium.change, premium.fields.as_slice()),
            (
                Change::InPlace,
                ["model.deployment.num_replicas".to_string()].as_slice()
            )
        );
        assert!(diff.routing.is_empty() && diff.graph.is_empty(), "{diff}");
        // The renderer keeps deployment options out of `args` (same wiring), so Serve sees
        // the same code version: nothing restarts (tests/integration/graph_diff.rs shows it on
        // Ray).
        assert!(!diff.restarts_all_replicas, "{diff}");
    }

    #[test]
    fn executor_read_fields_are_in_place_but_change_args() {
        let old = sample();
        let mut new = sample();
        let candidate = node_mut(&mut new, "candidate");
        candidate.timeout_ms = 500;
        candidate.retry = Some(Retry {
            attempts: 2,
            retry_on: vec![proto::RetryOn::Timeout as i32],
            ..Default::default()
        });
        candidate.fallback_value = Some(string("sorry"));
        model_mut(&mut new, "candidate").method = "predict".to_string();
        let diff = diff(&old, &new);
        assert_only(
            &diff,
            "candidate",
            Change::InPlace,
            &["fallback_value", "model.method", "retry", "timeout_ms"],
        );
        assert!(diff.restarts_all_replicas, "{diff}");
        assert!(
            diff.to_string().contains("note: the graph wiring"),
            "{diff}"
        );
    }

    #[test]
    fn code_constructor_and_actor_changes_restart_the_node() {
        let mut new = sample();
        model_mut(&mut new, "premium").import_path = "samples.models:Premium".to_string();
        deployment_mut(&mut new, "premium").num_replicas = Some(2);
        model_mut(&mut new, "stable")
            .init_kwargs
            .insert("label".to_string(), string("stable-2"));
        deployment_mut(&mut new, "audit").ray_actor_options = Some(RayActorOptions {
            num_cpus: Some(0.5),
            ..Default::default()
        });
        let diff = diff(&sample(), &new);
        // One restart-class field makes the node restarted; every changed field is named.
        assert_eq!(
            line_of(&diff, "premium").fields,
            ["model.deployment.num_replicas", "model.import_path"]
        );
        for (name, field) in [
            ("premium", "model.import_path"),
            ("stable", "model.init_kwargs"),
            ("audit", "model.deployment.ray_actor_options"),
        ] {
            let line = line_of(&diff, name);
            assert_eq!(line.change, Change::Restarted, "{diff}");
            assert!(line.fields.iter().any(|f| f == field), "{diff}");
        }
        assert_eq!(diff.count(Change::Unchanged), 5);
    }

    #[test]
    fn added_removed_and_retyped_nodes() {
        let mut new = sample();
        new.nodes.retain(|n| n.name != "audit");
        new.edges.retain(|e| e.target != "audit");
        let mut audit2 = sample()
            .nodes
            .into_iter()
            .find(|n| n.name == "audit")
            .unwrap();
        audit2.name = "audit2".to_string();
        new.nodes.push(audit2);
        new.edges.push(Edge {
            source: "request".to_string(),
            target: "audit2".to_string(),
            ..Default::default()
        });
        node_mut(&mut new, "canary").kind = Some(node::Kind::Switch(SwitchNode::default()));
        let diff = diff(&sample(), &new);
        assert_eq!(line_of(&diff, "audit").change, Change::Removed);
        assert_eq!(line_of(&diff, "audit").kind, NodeKind::Model);
        assert_eq!(line_of(&diff, "audit2").change, Change::Added);
        let canary = line_of(&diff, "canary");
        assert_eq!(
            (canary.change, canary.kind, canary.fields.as_slice()),
            (
                Change::Restarted,
                NodeKind::Switch,
                ["split".to_string(), "switch".to_string()].as_slice()
            )
        );
        assert!(
            diff.routing
                .contains(&"edge request -> audit removed".to_string()),
            "{diff}"
        );
        assert!(
            diff.routing
                .contains(&"edge request -> audit2 added".to_string()),
            "{diff}"
        );
        assert!(
            diff.summary()
                .starts_with("6 unchanged, 0 in place, 1 restarted, 1 added, 1 removed, "),
            "{}",
            diff.summary()
        );
    }

    #[test]
    fn routing_changes_are_described() {
        let old = sample();
        let mut new = sample();
        edge_mut(&mut new, "canary", "stable").weight = Some(50);
        edge_mut(&mut new, "canary", "candidate").weight = Some(50);
        if let Some(proto::predicate::P::Compare(compare)) =
            &mut edge_mut(&mut new, "tier", "premium")
                .when
                .as_mut()
                .unwrap()
                .p
        {
            compare.value = Some(string("platinum"));
        }
        edge_mut(&mut new, "request", "audit").optional = true;
        node_mut(&mut new, "response").join = JoinMode::All as i32;
        if let Some(node::Kind::Split(split)) = &mut node_mut(&mut new, "canary").kind {
            split.sticky_key.clear();
        }
        node_mut(&mut new, "tier").kind = Some(node::Kind::Switch(SwitchNode {
            on_no_match: NoMatch::Error as i32,
        }));
        let premium_case = edge_mut(&mut new, "tier", "premium").when.clone();
        new.edges.push(Edge {
            source: "tier".to_string(),
            target: "stable".to_string(),
            when: premium_case,
            ..Default::default()
        });
        new.edges.swap(0, 1);
        let diff = diff(&old, &new);
        let expected = [
            "join of response: ANY -> ALL",
            "split canary: sticky_key \"/request/user_id\" -> \"\"",
            "switch tier: on_no_match UNSPECIFIED -> ERROR",
            "edge tier -> premium: when `/request/tier == \"gold\"` -> `/request/tier == \"platinum\"`",
            "edge canary -> stable: weight 90 (90%) -> 50 (50%)",
            "edge canary -> candidate: weight 10 (10%) -> 50 (50%)",
            "edge request -> audit: optional false -> true",
            "edge tier -> stable added (when `/request/tier == \"platinum\"`)",
            "edge declaration order changed",
        ];
        for line in expected {
            assert!(
                diff.routing.iter().any(|l| l == line),
                "{line:?} missing:\n{diff}"
            );
        }
        assert_eq!(diff.routing.len(), expected.len(), "{diff}");
        // Routing settings of a node are its own fields too (the executor reads them).
        for (name, field) in [
            ("canary", "split.sticky_key"),
            ("response", "join"),
            ("tier", "switch.on_no_match"),
        ] {
            let line = line_of(&diff, name);
            assert_eq!(
                (line.change, line.fields.as_slice()),
                (Change::InPlace, [field.to_string()].as_slice())
            );
        }
        assert_eq!(diff.count(Change::Unchanged), 5);
    }

    #[test]
    fn ingress_and_output_changes_are_routing() {
        let mut new = sample();
        new.ingress = "entry".to_string();
        node_mut(&mut new, "request").name = "entry".to_string();
        node_mut(&mut new, "response").name = "answer".to_string();
        for edge in &mut new.edges {
            for end in [&mut edge.source, &mut edge.target] {
                match end.as_str() {
                    "request" => *end = "entry".to_string(),
                    "response" => *end = "answer".to_string(),
                    _ => {}
                }
            }
        }
        let diff = diff(&sample(), &new);
        assert!(
            diff.routing
                .contains(&"ingress: \"request\" -> \"entry\"".to_string()),
            "{diff}"
        );
        assert!(
            diff.routing
                .contains(&"output: response -> answer".to_string()),
            "{diff}"
        );
        assert!(
            diff.routing
                .contains(&"edge entry -> tier added".to_string()),
            "{diff}"
        );
    }

    #[test]
    fn graph_level_changes_are_described_without_values_of_maps() {
        let old = sample();
        let mut new = sample();
        new.name = "switch-canary-2".to_string();
        new.version = "2".to_string();
        new.deadline_ms = 0;
        new.route_prefix = "/v2".to_string();
        new.forward_headers = vec!["x-request-id".to_string()];
        new.labels.insert("team".to_string(), "fraud".to_string());
        new.runtime_env = Some(RuntimeEnv {
            env_vars: [("API_TOKEN".to_string(), "s3cr3t-value".to_string())].into(),
            ..Default::default()
        });
        let executor = new.executor.get_or_insert_with(Default::default);
        executor.num_replicas = Some(2);
        executor.ray_actor_options = None;
        new.nodes.swap(1, 2);
        let diff = diff(&old, &new);
        let expected = [
            "name: \"switch-canary\" -> \"switch-canary-2\"",
            "version: \"1\" -> \"2\"",
            "route_prefix: \"/classify\" -> \"/v2\"",
            "deadline_ms: 10000 -> default (30000)",
            "forward_headers: [] -> [x-request-id]",
            "labels: added team",
            "runtime_env: env_vars (added API_TOKEN) changed (every replica restarts)",
            "executor.num_replicas changed (in place)",
            "executor.ray_actor_options changed (restarts the executor's replicas)",
            "node declaration order changed",
        ];
        assert_eq!(diff.graph, expected, "{diff}");
        assert!(diff.routing.is_empty(), "{diff}");
        assert!(diff.restarts_all_replicas);
        assert!(diff.count(Change::Unchanged) == 8);
        let json = serde_json::to_string(&diff).unwrap();
        assert!(!json.contains("s3cr3t") && !diff.to_string().contains("s3cr3t"));
    }

    #[test]
    fn plan_prints_as_a_table_and_serializes_in_camel_case() {
        let mut new = sample();
        deployment_mut(&mut new, "stable").num_replicas = Some(2);
        edge_mut(&mut new, "canary", "candidate").weight = Some(30);
        let diff = diff(&sample(), &new);
        let text = diff.to_string();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(
                "7 unchanged, 1 in place, 0 restarted, 0 added, 0 removed, 1 routing change, 0 graph changes"
            )
        );
        assert_eq!(lines.next(), Some(""));
        assert_eq!(lines.next(), Some("NODE       KIND    CHANGE     FIELDS"));
        assert!(
            text.contains("\nstable     model   in place   model.deployment.num_replicas\n"),
            "{text}"
        );
        assert!(
            text.contains("\naudit      model   unchanged  -\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "\n\nrouting:\n  edge canary -> candidate: weight 10 (10%) -> 30 (25%)\n\n"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&diff).unwrap();
        assert_eq!(json["restartsAllReplicas"], true);
        let stable = json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node"] == "stable")
            .unwrap();
        assert_eq!(
            *stable,
            serde_json::json!({"node": "stable", "kind": "model", "change": "inPlace", "fields": ["model.deployment.num_replicas"]})
        );
        let back: GraphDiff = serde_json::from_value(json).unwrap();
        assert_eq!(back, diff);
    }

    #[test]
    fn long_lines_are_capped() {
        let mut new = sample();
        let long = "x".repeat(5000);
        new.version = long.clone();
        if let Some(proto::predicate::P::Compare(compare)) =
            &mut edge_mut(&mut new, "tier", "premium")
                .when
                .as_mut()
                .unwrap()
                .p
        {
            compare.value = Some(string(&long));
        }
        let diff = diff(&sample(), &new);
        let lines: Vec<&String> = diff.graph.iter().chain(&diff.routing).collect();
        assert_eq!(lines.len(), 2, "{diff}");
        for line in lines {
            assert!(line.len() <= MAX_LINE_BYTES && line.contains('…'), "{line}");
        }
    }

    /// Field names of a message in `pipeline.proto`: (plain fields, oneof members).
    fn proto_fields(message: &str) -> (Vec<String>, Vec<String>) {
        let text = include_str!("../../proto/raypipe/v1/pipeline.proto");
        let opening = format!("message {message} {{");
        let start = text
            .lines()
            .position(|l| l.trim_start().starts_with(&opening))
            .unwrap_or_else(|| panic!("message {message} not found"));
        let (mut plain, mut oneof) = (Vec::new(), Vec::new());
        let mut depth = 0;
        for line in text.lines().skip(start) {
            let code = line.split("//").next().unwrap_or("").trim();
            if code.ends_with("{}") {
                break; // an empty message on one line
            } else if code.ends_with('{') {
                depth += 1;
            } else if code == "}" {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            } else if let Some((declaration, _number)) = code.split_once('=') {
                let name = declaration.split_whitespace().last().unwrap().to_string();
                if depth > 1 {
                    oneof.push(name)
                } else {
                    plain.push(name)
                }
            }
        }
        (plain, oneof)
    }

    fn sorted(names: impl IntoIterator<Item = String>) -> Vec<String> {
        let mut names: Vec<String> = names.into_iter().collect();
        names.sort();
        names
    }

    /// A new field in the model node's messages (Node, ModelNode, DeploymentOptions, the
    /// routing kinds) fails this test until `compare_node` classifies it: a node with every
    /// field changed must name every field of the .proto file.
    #[test]
    fn every_node_field_of_the_proto_is_classified() {
        let (node_fields, kinds) = proto_fields("Node");
        assert_eq!(kinds, ["input", "model", "switch", "split", "output"]);
        let (model_fields, _) = proto_fields("ModelNode");
        let (deployment_fields, _) = proto_fields("DeploymentOptions");
        let mut expected: Vec<String> = node_fields.into_iter().filter(|f| f != "name").collect();
        expected.extend(
            model_fields
                .iter()
                .filter(|f| *f != "deployment")
                .map(|f| format!("model.{f}")),
        );
        expected.extend(
            deployment_fields
                .iter()
                .map(|f| format!("model.deployment.{f}")),
        );

        let base = Node {
            name: "m".to_string(),
            kind: Some(node::Kind::Model(ModelNode::default())),
            ..Default::default()
        };
        let some_object = JsonObject {
            fields: [("k".to_string(), string("v"))].into(),
        };
        // Every field set (no `..Default::default()`: a new field must be set here too).
        let everything = Node {
            name: "m".to_string(),
            description: "d".to_string(),
            kind: Some(node::Kind::Model(ModelNode {
                import_path: "a.b:C".to_string(),
                init_args: vec![string("x")],
                init_kwargs: [("k".to_string(), string("v"))].into(),
                method: "predict".to_string(),
                call_style: proto::CallStyle::Kwargs as i32,
                deployment: Some(Box::new(DeploymentOptions {
                    num_replicas: Some(2),
                    autoscaling_config: Some(AutoscalingConfig::default()),
                    max_ongoing_requests: Some(3),
                    max_queued_requests: Some(4),
                    user_config: Some(some_object),
                    health_check_period_s: Some(1.0),
                    health_check_timeout_s: Some(1.0),
                    graceful_shutdown_wait_loop_s: Some(1.0),
                    graceful_shutdown_timeout_s: Some(1.0),
                    ray_actor_options: Some(RayActorOptions::default()),
                    max_replicas_per_node: Some(1),
                    logging_config: Some(proto::LoggingConfig::default()),
                })),
                fuse: Some(false),
            })),
            join: JoinMode::Any as i32,
            on_error: proto::OnError::Skip as i32,
            fallback_value: Some(string("f")),
            timeout_ms: 1,
            retry: Some(Retry::default()),
            shadow: Some(proto::Shadow::default()),
            input_template: Some(string("t")),
        };
        let mut changes = FieldChanges::default();
        compare_node(&base, &everything, &mut changes);
        assert_eq!(changes.into_fields(), sorted(expected));

        // The routing kinds' own fields, and a change of kind.
        for (message, kind, prefix) in [
            (
                "SwitchNode",
                node::Kind::Switch(SwitchNode { on_no_match: 1 }),
                "switch",
            ),
            (
                "SplitNode",
                node::Kind::Split(SplitNode {
                    sticky_key: "/k".to_string(),
                }),
                "split",
            ),
        ] {
            let (fields, _) = proto_fields(message);
            let plain = match &kind {
                node::Kind::Switch(_) => node::Kind::Switch(SwitchNode::default()),
                _ => node::Kind::Split(SplitNode::default()),
            };
            let mut changes = FieldChanges::default();
            compare_kind(Some(&plain), Some(&kind), &mut changes);
            assert_eq!(
                changes.into_fields(),
                sorted(fields.iter().map(|f| format!("{prefix}.{f}")))
            );
        }
        for message in ["InputNode", "OutputNode"] {
            assert_eq!(
                proto_fields(message),
                (vec![], vec![]),
                "{message} has fields now"
            );
        }
    }

    /// Likewise for edges: every Edge field but the two ends has its own routing line.
    #[test]
    fn every_edge_field_of_the_proto_is_described() {
        let (fields, _) = proto_fields("Edge");
        let plain = Edge {
            source: "a".to_string(),
            target: "b".to_string(),
            ..Default::default()
        };
        let everything = Edge {
            source: "a".to_string(),
            target: "b".to_string(),
            mode: EdgeMode::Order as i32,
            select: "/x".to_string(),
            tensors: Some(Box::default()),
            into: "/y".to_string(),
            optional: true,
            if_missing: Some(string("m")),
            when: Some(Box::default()),
            weight: Some(1),
            order: 1,
        };
        let mut lines = Vec::new();
        compare_edge(("a", "b", 0), &plain, &everything, (0, 1), &mut lines);
        let described: Vec<String> = fields
            .into_iter()
            .filter(|f| f != "source" && f != "target")
            .collect();
        assert_eq!(lines.len(), described.len(), "{lines:?}");
        for (line, field) in lines.iter().zip(&described) {
            assert!(
                line.starts_with(&format!("edge a -> b: {field} ")),
                "{line}"
            );
        }
    }
}
