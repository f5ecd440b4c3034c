//! Validation errors: every problem found in a graph, each naming its node or edge, each with a
//! stable machine reason code (`reason()`), and a message a person can act on.
//!
//! Messages are built from untrusted text (node names, pointers, cycles of any length), so every
//! rendering is bounded: one problem renders to at most [`MAX_PROBLEM_BYTES`], a whole list to
//! at most [`MAX_MESSAGE_BYTES`] (the project's condition cap), and long lists inside one
//! problem (cycles, edge lists) show their first few items. The full list stays available
//! through [`ValidationErrors::errors`].

use std::fmt;

use super::pointer::PointerError;

/// An edge as named in messages: its position in `edges` and its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeRef {
    /// Index in `PipelineGraph.edges`.
    pub index: usize,
    /// `Edge.source` as written.
    pub source: String,
    /// `Edge.target` as written.
    pub target: String,
}

impl fmt::Display for EdgeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "edge #{} ({:?} -> {:?})",
            self.index, self.source, self.target
        )
    }
}

/// Where an option or value lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A graph-level field.
    Graph,
    /// A node.
    Node(String),
    /// An edge.
    Edge(EdgeRef),
    /// The executor's deployment options (`PipelineGraph.executor`).
    Executor,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Graph => f.write_str("graph"),
            Location::Node(name) => write!(f, "node {name:?}"),
            Location::Edge(edge) => edge.fmt(f),
            Location::Executor => f.write_str("executor"),
        }
    }
}

/// Which end of an edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeEnd {
    Source,
    Target,
}

impl fmt::Display for EdgeEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EdgeEnd::Source => "source",
            EdgeEnd::Target => "target",
        })
    }
}

/// Longest rendering of one problem (bytes); longer ones end in "…".
pub const MAX_PROBLEM_BYTES: usize = 300;
/// Longest rendering of a list of problems (bytes): the cap of a condition message.
pub const MAX_MESSAGE_BYTES: usize = 2048;
/// Items shown of a list inside one problem (a cycle's nodes, a switch's default edges).
const MAX_LISTED: usize = 8;

/// Shows the first items of a list, and how many there are when some are left out.
fn list_capped<T>(items: &[T], separator: &str, show: impl Fn(&T) -> String) -> String {
    let shown: Vec<String> = items.iter().take(MAX_LISTED).map(show).collect();
    let mut text = shown.join(separator);
    if items.len() > MAX_LISTED {
        text.push_str(&format!("{separator}... ({} in all)", items.len()));
    }
    text
}

fn list_edges(edges: &[usize]) -> String {
    list_capped(edges, ", ", |e| format!("#{e}"))
}

fn list_cycle(nodes: &[String]) -> String {
    list_capped(nodes, " -> ", |name| {
        bounded(MAX_PROBLEM_BYTES / MAX_LISTED, |w| {
            fmt::Write::write_str(w, name)
        })
    })
}

/// A `fmt::Write` that keeps at most `limit` bytes (cut on a char boundary) and drops the rest,
/// so rendering a huge value costs no more memory than the limit.
struct Bounded {
    text: String,
    limit: usize,
    truncated: bool,
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.truncated {
            return Ok(());
        }
        let room = self.limit.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
        } else {
            self.text.push_str(truncate_on_char_boundary(s, room));
            self.truncated = true;
        }
        Ok(())
    }
}

/// Renders with `write` into at most `limit` bytes; a cut rendering ends in "…" (within the
/// limit).
fn bounded(limit: usize, write: impl FnOnce(&mut Bounded) -> fmt::Result) -> String {
    const ELLIPSIS: &str = "…";
    let mut out = Bounded {
        text: String::new(),
        limit,
        truncated: false,
    };
    let _ = write(&mut out);
    if out.truncated {
        let keep = truncate_on_char_boundary(&out.text, limit.saturating_sub(ELLIPSIS.len())).len();
        out.text.truncate(keep);
        out.text.push_str(ELLIPSIS);
    }
    out.text
}

/// The longest prefix of `text` of at most `max` bytes that ends on a char boundary.
pub fn truncate_on_char_boundary(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Any displayable value rendered into at most `max` bytes (cut on a char boundary, ending in
/// "…"): for log lines and messages built from untrusted input.
pub fn capped(value: &dyn fmt::Display, max: usize) -> String {
    bounded(max, |w| fmt::Write::write_fmt(w, format_args!("{value}")))
}

/// One problem in a graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error("graph has {count} {what}, more than the limit of {limit}")]
    LimitExceeded {
        what: &'static str,
        count: usize,
        limit: usize,
    },

    #[error(
        "the graph is too intricate to check {check} within the work limit; nest fewer switches and splits above joins"
    )]
    TooComplex { check: &'static str },

    #[error("{at} nests deeper than {limit} levels (counted as protobuf nests messages)")]
    TooDeep { at: String, limit: usize },

    #[error(
        "graph name {name:?} is not a DNS-1123 label: use lower-case letters, digits and '-', at most 63 characters, starting and ending with a letter or digit"
    )]
    InvalidGraphName { name: String },

    #[error("graph version {version:?} {problem}")]
    InvalidVersion {
        version: String,
        problem: &'static str,
    },

    #[error(
        "nodes[{index}] has the name {name:?}, which {problem}; use 1 to 63 characters from [A-Za-z0-9_.-], starting with a letter or digit"
    )]
    InvalidNodeName {
        index: usize,
        name: String,
        problem: &'static str,
    },

    #[error(
        "node {name:?} is declared twice (nodes[{first_index}] and nodes[{index}]); node names must be unique"
    )]
    DuplicateNode {
        name: String,
        index: usize,
        first_index: usize,
    },

    #[error("node {node:?} has no kind; add one of `input`, `model`, `switch`, `split`, `output`")]
    MissingKind { node: String },

    #[error("node {node:?} is {kind} node, where `{field}` has no effect; remove it")]
    IneffectiveSetting {
        node: String,
        kind: &'static str,
        field: &'static str,
    },

    #[error(
        "node {node:?} has on_error FALLBACK but no fallback_value; set the value to answer with when it fails"
    )]
    FallbackWithoutValue { node: String },

    #[error(
        "node {node:?} sets fallback_value but on_error is not FALLBACK; set `on_error: FALLBACK` or remove the value"
    )]
    FallbackValueUnused { node: String },

    #[error(
        "node {node:?} has shadow.sample_percent {percent}; use 1 to 100 (or leave it unset for 100)"
    )]
    InvalidShadowSample { node: String, percent: u32 },

    #[error("{edge}: the {end} {name:?} is not a node")]
    UnknownNode {
        edge: EdgeRef,
        end: EdgeEnd,
        name: String,
    },

    #[error("{edge} repeats edge #{first_index}; two nodes are joined by at most one edge")]
    DuplicateEdge { edge: EdgeRef, first_index: usize },

    #[error("{edge} leads into the ingress; the ingress only receives the request")]
    EdgeIntoIngress { edge: EdgeRef },

    #[error("{edge} leaves the output node; the output is the end of the graph")]
    EdgeFromOutput { edge: EdgeRef },

    #[error("{edge}: `{field}` {problem}")]
    InvalidEdgeField {
        edge: EdgeRef,
        field: &'static str,
        problem: String,
    },

    #[error(
        "{edge}: `weight` is only for edges leaving a split node, and {source_node:?} is not one; remove it"
    )]
    WeightOutsideSplit { edge: EdgeRef, source_node: String },

    #[error(
        "{edge}: `order` only orders the cases of a switch node, and {source_node:?} is not one; remove it"
    )]
    OrderOutsideSwitch { edge: EdgeRef, source_node: String },

    #[error(
        "{edge} leaves split {split:?} and has a `when` guard; a split chooses by weight only (put a switch before it to route by content)"
    )]
    GuardOnSplit { edge: EdgeRef, split: String },

    #[error(
        "{edge} leaves split {split:?} without a `weight`; give every branch of a split a weight"
    )]
    SplitWeightMissing { edge: EdgeRef, split: String },

    #[error(
        "split {node:?} has weights that add up to 0; at least one branch needs a positive weight"
    )]
    SplitWeightsZero { node: String },

    #[error("switch {node:?} has no case: no edge leaving it has a `when` predicate")]
    SwitchWithoutCases { node: String },

    #[error("switch {node:?} has several default edges (without `when`): {}; keep one", list_edges(.edges))]
    SwitchMultipleDefaults { node: String, edges: Vec<usize> },

    #[error(
        "switch {node:?} has no default edge (one without `when`) and on_no_match is not set; add a default edge, or set `on_no_match: ERROR` or `SKIP`"
    )]
    SwitchWithoutDefault { node: String },

    #[error("cycle: {}; a pipeline must be acyclic (put loops inside a model)", list_cycle(.nodes))]
    Cycle { nodes: Vec<String> },

    #[error("the graph has no ingress; set `ingress` to the name of its input node{}", .candidate.as_ref().map(|c| format!(" (probably {c:?})")).unwrap_or_default())]
    IngressUnset { candidate: Option<String> },

    #[error("ingress {name:?} is not a node; set `ingress` to the name of the input node")]
    IngressUnknown { name: String },

    #[error("ingress {name:?} is {kind} node; the ingress must be the input node (`input: {{}}`)")]
    IngressNotInput { name: String, kind: &'static str },

    #[error(
        "node {node:?} is a second input node; a graph has exactly one, the ingress {ingress:?}"
    )]
    ExtraInput { node: String, ingress: String },

    #[error("the graph has no output node; add one (`output: {{}}`) and edges into it")]
    MissingOutput,

    #[error(
        "node {node:?} is a second output node (the first is {first:?}); a graph has exactly one"
    )]
    ExtraOutput { node: String, first: String },

    #[error(
        "node {node:?} cannot be reached from the ingress {ingress:?}; add an edge into it or remove it"
    )]
    Unreachable { node: String, ingress: String },

    #[error(
        "node {node:?} never leads to the output {output:?}, so its result would be thrown away; add an edge toward the output, mark it `shadow`, or remove it"
    )]
    DeadEnd { node: String, output: String },

    #[error(
        "{edge} leads from the shadow branch into {node:?}, which is not shadow; a shadow branch must never feed the response"
    )]
    ShadowLeak { edge: EdgeRef, node: String },

    #[error("node {node:?} joins (ALL) edges #{} and #{}, which lie on different branches of {branch_kind} {branch:?}: they are never live together, so the node could never run; use `join: ANY` or mark one edge `optional`", .first.index, .second.index)]
    ExclusiveJoin {
        node: String,
        first: EdgeRef,
        second: EdgeRef,
        branch: String,
        branch_kind: &'static str,
    },

    #[error(
        "{first} (into {first_into:?}) and {second} (into {second_into:?}) write overlapping parts of node {node:?}'s input; give them disjoint `into` pointers"
    )]
    IntoConflict {
        node: String,
        first: EdgeRef,
        second: EdgeRef,
        first_into: String,
        second_into: String,
    },

    #[error(
        "{edge}: node {node:?} is called with keyword arguments, so `into` must start with a Python identifier naming the argument, not {key:?}"
    )]
    KwargsKey {
        edge: EdgeRef,
        node: String,
        key: String,
    },

    #[error("node {node:?}: import_path {path:?} {problem}; write it as \"package.module:Class\"")]
    InvalidImportPath {
        node: String,
        path: String,
        problem: String,
    },

    #[error("{location}: {field} {problem}")]
    InvalidOption {
        location: Location,
        field: String,
        problem: String,
    },

    #[error("{location}: `{field}` {pointer:?} is not a JSON Pointer: {problem}")]
    InvalidPointer {
        location: Location,
        field: &'static str,
        pointer: String,
        problem: PointerError,
    },

    #[error("{edge}: when{}{} {problem}", if .at.is_empty() { "" } else { "." }, .at)]
    InvalidPredicate {
        edge: EdgeRef,
        at: String,
        problem: String,
    },

    #[error(
        "{location}: {field} reads {root:?}, which is neither the ingress nor a node computed before it (an ancestor of {node:?}); predicates may only read the request and finished ancestors"
    )]
    PredicateScope {
        location: Location,
        field: String,
        root: String,
        node: String,
    },

    #[error(
        "node {node:?} has timeout_ms {timeout_ms}, longer than the graph's deadline of {deadline_ms} ms; lower it or raise `deadline_ms`"
    )]
    TimeoutOverDeadline {
        node: String,
        timeout_ms: u32,
        deadline_ms: u32,
    },

    #[error("graph deadline_ms {deadline_ms} is longer than the limit of {limit} ms")]
    DeadlineTooLong { deadline_ms: u32, limit: u32 },

    #[error("node {node:?}: retry {problem}")]
    InvalidRetry { node: String, problem: String },

    #[error("route_prefix {prefix:?} {problem}")]
    InvalidRoutePrefix {
        prefix: String,
        problem: &'static str,
    },

    #[error("{location}: runtime_env {problem}")]
    InvalidRuntimeEnv { location: Location, problem: String },

    #[error(
        "{location}: {field} contains a number that is not finite (NaN or infinity), which JSON cannot carry"
    )]
    InvalidValue { location: Location, field: String },

    #[error(
        "{location}: {field} has the value {value}, which this version of raypipe does not know"
    )]
    UnknownEnumValue {
        location: Location,
        field: &'static str,
        value: i32,
    },
}

impl ValidationError {
    /// Stable machine reason code (CamelCase), e.g. for a Kubernetes condition's `reason`.
    pub fn reason(&self) -> &'static str {
        use ValidationError::*;
        match self {
            LimitExceeded { .. } => "LimitExceeded",
            TooDeep { .. } => "NestingTooDeep",
            TooComplex { .. } => "LimitExceeded",
            InvalidGraphName { .. } | InvalidNodeName { .. } => "InvalidName",
            InvalidVersion { .. } => "InvalidVersion",
            DuplicateNode { .. } => "DuplicateNode",
            MissingKind { .. }
            | IneffectiveSetting { .. }
            | FallbackWithoutValue { .. }
            | FallbackValueUnused { .. }
            | InvalidShadowSample { .. } => "InvalidNode",
            UnknownNode { .. } => "UnknownNode",
            DuplicateEdge { .. } => "DuplicateEdge",
            EdgeIntoIngress { .. }
            | EdgeFromOutput { .. }
            | InvalidEdgeField { .. }
            | KwargsKey { .. } => "InvalidEdge",
            WeightOutsideSplit { .. }
            | OrderOutsideSwitch { .. }
            | GuardOnSplit { .. }
            | SplitWeightMissing { .. }
            | SplitWeightsZero { .. }
            | SwitchWithoutCases { .. }
            | SwitchMultipleDefaults { .. }
            | SwitchWithoutDefault { .. }
            | ShadowLeak { .. }
            | ExclusiveJoin { .. }
            | IntoConflict { .. } => "InvalidRouting",
            Cycle { .. } => "CycleDetected",
            IngressUnset { .. } | IngressUnknown { .. } | IngressNotInput { .. } => {
                "MissingIngress"
            }
            ExtraInput { .. } => "DuplicateIngress",
            MissingOutput => "MissingOutput",
            ExtraOutput { .. } => "DuplicateOutput",
            Unreachable { .. } => "Unreachable",
            DeadEnd { .. } => "DeadEnd",
            InvalidImportPath { .. } => "InvalidImportPath",
            InvalidOption { .. } => "InvalidOptions",
            InvalidPointer { .. } => "InvalidPointer",
            InvalidPredicate { .. } => "InvalidPredicate",
            PredicateScope { .. } => "PredicateScope",
            TimeoutOverDeadline { .. } | DeadlineTooLong { .. } => "InvalidTimeout",
            InvalidRetry { .. } => "InvalidRetry",
            InvalidRoutePrefix { .. } => "InvalidRoutePrefix",
            InvalidRuntimeEnv { .. } => "InvalidRuntimeEnv",
            InvalidValue { .. } => "InvalidValue",
            UnknownEnumValue { .. } => "UnknownEnumValue",
        }
    }
}

/// Every problem found in a graph, in a deterministic order (graph fields, nodes, edges, then
/// structure). Never empty.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationErrors(Vec<ValidationError>);

impl ValidationErrors {
    pub(crate) fn new(errors: Vec<ValidationError>) -> Self {
        debug_assert!(!errors.is_empty());
        ValidationErrors(errors)
    }

    /// The problems.
    pub fn errors(&self) -> &[ValidationError] {
        &self.0
    }

    /// How many problems.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false (kept for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Reason code of the first problem (a condition's `reason`).
    pub fn reason(&self) -> &'static str {
        self.0.first().map_or("Invalid", ValidationError::reason)
    }

    /// The problems as one line each, at most `max` of them (plus "and N more"), each cut to
    /// [`MAX_PROBLEM_BYTES`] and all of it to [`MAX_MESSAGE_BYTES`]: for a condition message
    /// that must stay short.
    pub fn summary(&self, max: usize) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = self.write_capped(&mut text, max, "", "\n");
        text
    }

    /// Writes at most `max` problems (each capped, on its own line after `separator`), stopping
    /// early so the whole stays within [`MAX_MESSAGE_BYTES`], then "... and N more".
    fn write_capped(
        &self,
        out: &mut dyn fmt::Write,
        max: usize,
        header: &str,
        separator: &str,
    ) -> fmt::Result {
        // Room kept for the "and N more" line.
        const TAIL: usize = 40;
        out.write_str(header)?;
        let mut written = header.len();
        let mut shown = 0;
        for error in self.0.iter().take(max) {
            let line = bounded(MAX_PROBLEM_BYTES, |w| {
                fmt::Write::write_fmt(w, format_args!("[{}] {error}", error.reason()))
            });
            let sep = if shown == 0 && header.is_empty() {
                ""
            } else {
                separator
            };
            if written + sep.len() + line.len() + TAIL > MAX_MESSAGE_BYTES {
                break;
            }
            out.write_str(sep)?;
            out.write_str(&line)?;
            written += sep.len() + line.len();
            shown += 1;
        }
        if shown < self.0.len() {
            let sep = if shown == 0 && header.is_empty() {
                ""
            } else {
                separator
            };
            write!(out, "{sep}... and {} more", self.0.len() - shown)?;
        }
        Ok(())
    }
}

impl IntoIterator for ValidationErrors {
    type Item = ValidationError;
    type IntoIter = std::vec::IntoIter<ValidationError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        let header = format!("{n} problem{} in the graph:", if n == 1 { "" } else { "s" });
        self.write_capped(f, usize::MAX, &header, "\n  - ")
    }
}

impl std::error::Error for ValidationErrors {}
