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

/// Replicas a rollout starts, and the GPUs they ask for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Starts {
    pub replicas: u32,
    /// `ray_actor_options.num_gpus` times the replicas (GPUs may be shared: 0.25 each).
    pub gpus: f64,
}

impl Starts {
    pub fn add(&mut self, other: Starts) {
        self.replicas = self.replicas.saturating_add(other.replicas);
        self.gpus += other.gpus;
    }
}

impl fmt::Display for Starts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let replicas = plural(self.replicas as usize, "replica");
        if self.gpus == 1.0 {
            write!(f, "{replicas} (1 GPU)")
        } else if self.gpus > 0.0 {
            write!(f, "{replicas} ({} GPUs)", self.gpus)
        } else {
            write!(f, "{replicas}")
        }
    }
}

/// What rolling the new version out starts, per strategy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStarts {
    /// `Immediate`: the replicas of the nodes that restart or are added; every replica of the
    /// application (executor included) when [`GraphDiff::restarts_all_replicas`].
    pub immediate: Starts,
    /// `Canary`: the canary is a Serve application of its own, so every replica of the new
    /// version (executor and every node that is not fused).
    pub canary: Starts,
}

/// What a new graph version changes, node by node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// The replicas (and GPUs) a rollout of the new version starts, per strategy, counted on
    /// the new version's rendered Serve config (`serve::rollout_starts`); absent until counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts: Option<RolloutStarts>,
    /// The code layer changed (`raypipe dag diff --old-code/--new-code`); absent when no code
    /// was compared or it did not change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<CodeDiff>,
    /// Counted for shared node applications (the operator's default layout): the wiring is
    /// applied in place, and only a new environment (`runtime_env`, code layer) restarts
    /// every replica.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_nodes: bool,
}

/// Most changed code files listed.
pub const MAX_CODE_FILES: usize = 50;

/// A change of the graph's code layer. A new code layer is a new `runtime_env`, so Serve
/// restarts every replica of the application; `nodes` names the model nodes whose own module
/// changed (their imports are not followed).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CodeDiff {
    /// `sha256:<hex>` of each side's code layer; absent on a side without code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_digest: Option<String>,
    /// Files added (`+`), removed (`-`) or changed (`~`), by path below the layer's top
    /// directory, sorted; at most [`MAX_CODE_FILES`].
    pub files: Vec<String>,
    /// Changed files not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_files: usize,
    /// Model nodes whose own module is among the changed files.
    pub nodes: Vec<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One side's code: its layer digest and each file's content hash, by path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodeFiles {
    pub digest: Option<String>,
    pub files: BTreeMap<String, String>,
}

impl GraphDiff {
    /// Adds the change of the code layer from `old` to `new` (nothing when equal). `graph` is
    /// the new graph, whose model nodes' import paths say which modules they are.
    pub fn with_code(mut self, old: &CodeFiles, new: &CodeFiles, graph: &PipelineGraph) -> Self {
        if old.digest == new.digest && old.files == new.files {
            return self;
        }
        let names: BTreeSet<&String> = old.files.keys().chain(new.files.keys()).collect();
        let changed: Vec<(char, &String)> = names
            .into_iter()
            .filter_map(|name| match (old.files.get(name), new.files.get(name)) {
                (None, Some(_)) => Some(('+', name)),
                (Some(_), None) => Some(('-', name)),
                (Some(a), Some(b)) if a != b => Some(('~', name)),
                _ => None,
            })
            .collect();
        let touched: BTreeSet<&str> = changed.iter().map(|(_, name)| name.as_str()).collect();
        let mut nodes = Vec::new();
        for node in &graph.nodes {
            let Some(node::Kind::Model(model)) = &node.kind else {
                continue;
            };
            if module_files(&model.import_path)
                .iter()
                .any(|file| touched.contains(file.as_str()))
            {
                nodes.push(node.name.clone());
            }
        }
        nodes.sort();
        for line in &mut self.nodes {
            if nodes.contains(&line.node)
                && matches!(
                    line.change,
                    Change::Unchanged | Change::InPlace | Change::Restarted
                )
            {
                line.change = Change::Restarted;
                line.fields.push("code".to_owned());
                line.fields.sort();
                line.fields.dedup();
            }
        }
        self.restarts_all_replicas = true;
        self.code = Some(CodeDiff {
            old_digest: old.digest.clone(),
            new_digest: new.digest.clone(),
            more_files: changed.len().saturating_sub(MAX_CODE_FILES),
            files: changed
                .iter()
                .take(MAX_CODE_FILES)
                .map(|(mark, name)| format!("{mark}{}", capped(name, 256)))
                .collect(),
            nodes,
        });
        self
    }

    /// One line on the code change, when there is one.
    fn code_line(&self) -> Option<String> {
        let code = self.code.as_ref()?;
        let side = |d: &Option<String>| d.clone().unwrap_or_else(|| "no code".to_owned());
        let more = if code.more_files > 0 {
            format!(" and {} more", code.more_files)
        } else {
            String::new()
        };
        Some(format!(
            "code: {} → {} ({} files changed: {}{more})",
            side(&code.old_digest),
            side(&code.new_digest),
            code.files.len() + code.more_files,
            code.files.join(" "),
        ))
    }
    /// True when the graphs differ in nothing the plan describes.
    pub fn is_empty(&self) -> bool {
        self.code.is_none()
            && self.routing.is_empty()
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
        all.extend(self.code_line());
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
        if let Some(starts) = &self.starts {
            writeln!(
                f,
                "starts: {} with strategy Immediate, {} with Canary",
                starts.immediate, starts.canary
            )?;
        }
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
        if let Some(line) = self.code_line() {
            writeln!(f, "\n{line}")?;
            if let Some(code) = &self.code
                && !code.nodes.is_empty()
            {
                writeln!(
                    f,
                    "  nodes whose own module changed: {}",
                    code.nodes.join(", ")
                )?;
            }
        }
        if self.restarts_all_replicas && self.shared_nodes {
            writeln!(
                f,
                "\nnote: the environment (runtime_env or code layer) changes; it is part of every \
                 node application's key, so Ray Serve restarts every replica"
            )?;
        } else if self.restarts_all_replicas {
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

impl GraphDiff {
    /// The plan as shared node applications deploy it: a wiring change restarts nothing; only
    /// a new environment (or code layer, when compared) restarts every replica.
    pub fn with_shared_nodes(mut self, old: &PipelineGraph, new: &PipelineGraph) -> Self {
        self.shared_nodes = true;
        self.restarts_all_replicas = old.runtime_env != new.runtime_env || self.code.is_some();
        self
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
        starts: None,
        code: None,
        shared_nodes: false,
    }
}

/// The files that define the module of `import_path` (`team.models:Classifier`): its own
/// `team/models.py` or `team/models/__init__.py`, and each enclosing package's
/// `__init__.py` (imported first).
fn module_files(import_path: &str) -> Vec<String> {
    let module = match import_path.split_once(':') {
        Some((module, _)) => module,
        None => import_path
            .rsplit_once('.')
            .map_or("", |(module, _)| module),
    };
    let parts: Vec<&str> = module.split('.').filter(|p| !p.is_empty()).collect();
    let mut files = Vec::new();
    for depth in 1..parts.len() {
        files.push(format!("{}/__init__.py", parts[..depth].join("/")));
    }
    if !parts.is_empty() {
        let path = parts.join("/");
        files.push(format!("{path}.py"));
        files.push(format!("{path}/__init__.py"));
    }
    files
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

#[path = "diff_routing.rs"]
mod routing;
use routing::*;

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
#[path = "diff_tests.rs"]
mod tests;
