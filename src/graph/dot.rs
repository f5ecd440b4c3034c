//! Graphviz DOT for a graph, so a person can look at a pipeline (`raypipe dag dot`). Works on
//! any decoded graph, valid or not: drawing a broken graph is how one finds what is wrong.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use super::predicate::Text;
use super::proto::{Edge, EdgeMode, JoinMode, Node, PipelineGraph, node};

/// Escapes text for a double-quoted DOT string.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A node's Graphviz shape and a short description of its kind (shared with `draw`).
pub(crate) fn kind_of(node: &Node) -> (&'static str, String) {
    match &node.kind {
        None => ("octagon", "no kind".to_string()),
        Some(node::Kind::Input(_)) => ("cds", "ingress".to_string()),
        Some(node::Kind::Output(_)) => ("doubleoctagon", "output".to_string()),
        Some(node::Kind::Model(model)) => ("box", model.import_path.clone()),
        Some(node::Kind::Switch(_)) => ("diamond", "switch".to_string()),
        Some(node::Kind::Split(split)) if split.sticky_key.is_empty() => {
            ("trapezium", "split".to_string())
        }
        Some(node::Kind::Split(split)) => {
            ("trapezium", format!("split, sticky {}", split.sticky_key))
        }
    }
}

/// What edge labels say (guards, switch defaults, split weights as shares, data selection),
/// and which edges touch a node that does not exist; shared with `draw` so both drawings
/// agree.
pub(crate) struct EdgeLabels<'a> {
    known: HashMap<&'a str, &'a node::Kind>,
    split_totals: HashMap<&'a str, u64>,
}

impl<'a> EdgeLabels<'a> {
    pub(crate) fn new(graph: &'a PipelineGraph) -> Self {
        let mut known: HashMap<&str, &node::Kind> = HashMap::new();
        for node in &graph.nodes {
            if let Some(kind) = &node.kind {
                known.insert(node.name.as_str(), kind);
            }
        }
        // Split weights as shares of their split's total.
        let mut split_totals: HashMap<&str, u64> = HashMap::new();
        for edge in &graph.edges {
            if let Some(weight) = edge.weight {
                *split_totals.entry(edge.source.as_str()).or_default() += u64::from(weight);
            }
        }
        EdgeLabels {
            known,
            split_totals,
        }
    }

    /// An end of the edge names no node with a kind (drawn red).
    pub(crate) fn is_dangling(&self, edge: &Edge) -> bool {
        !self.known.contains_key(edge.source.as_str())
            || !self.known.contains_key(edge.target.as_str())
    }

    /// The label lines of an edge (none for a plain DATA edge).
    pub(crate) fn parts(&self, edge: &Edge) -> Vec<String> {
        let mut parts = Vec::new();
        if let Some(when) = &edge.when {
            parts.push(format!("when {}", Text(when)));
        }
        let from_switch = matches!(
            self.known.get(edge.source.as_str()),
            Some(node::Kind::Switch(_))
        );
        if from_switch && edge.when.is_none() {
            parts.push("default".to_string());
        }
        if let Some(weight) = edge.weight {
            let total = self
                .split_totals
                .get(edge.source.as_str())
                .copied()
                .unwrap_or(0);
            if total > 0 {
                parts.push(format!(
                    "{weight} ({:.0}%)",
                    100.0 * f64::from(weight) / total as f64
                ));
            } else {
                parts.push(format!("weight {weight}"));
            }
        }
        if !edge.select.is_empty() {
            parts.push(format!("select {}", edge.select));
        }
        if let Some(tensors) = &edge.tensors {
            parts.push(format!("tensors {}", tensors.names.join(",")));
        }
        if !edge.into.is_empty() {
            parts.push(format!("into {}", edge.into));
        }
        parts
    }
}

/// The graph as a DOT digraph (left to right, shapes by node kind, edge labels for guards,
/// weights and data selection; ORDER edges dashed, optional edges dotted, shadow nodes grey,
/// edges to unknown nodes red).
pub fn to_dot(graph: &PipelineGraph) -> String {
    to_dot_fused(graph, None)
}

/// Which model nodes run in-process inside one host deployment (the executor), drawn inside
/// a cluster labelled with the host's name.
pub struct FusedInto<'a> {
    pub host: &'a str,
    pub nodes: &'a BTreeSet<String>,
}

/// [`to_dot`], with the fused nodes (when any) drawn inside their host's cluster.
pub fn to_dot_fused(graph: &PipelineGraph, fused: Option<FusedInto<'_>>) -> String {
    let mut out = String::new();
    let title = if graph.name.is_empty() {
        "pipeline"
    } else {
        graph.name.as_str()
    };
    let _ = writeln!(out, "digraph {} {{", quote(title));
    let _ = writeln!(out, "  rankdir=LR;");
    let _ = writeln!(out, "  node [fontname=\"Helvetica\", fontsize=11];");
    let _ = writeln!(out, "  edge [fontname=\"Helvetica\", fontsize=9];");
    if !graph.version.is_empty() {
        let _ = writeln!(
            out,
            "  label={}; labelloc=t;",
            quote(&format!("{title} {}", graph.version))
        );
    }

    let labels = EdgeLabels::new(graph);
    for node in &graph.nodes {
        let (shape, detail) = kind_of(node);
        let mut label = format!("{}\n{detail}", node.name);
        if node.join == JoinMode::Any as i32 {
            label.push_str("\njoin: ANY");
        }
        let mut attributes = format!("shape={shape}, label={}", quote(&label));
        if !node.description.is_empty() {
            let _ = write!(attributes, ", tooltip={}", quote(&node.description));
        }
        if node.shadow.is_some() {
            attributes.push_str(", style=dashed, color=gray50, fontcolor=gray40");
        } else if node.kind.is_none() {
            attributes.push_str(", color=red");
        }
        let _ = writeln!(out, "  {} [{attributes}];", quote(&node.name));
    }

    if let Some(FusedInto { host, nodes }) = fused.filter(|f| !f.nodes.is_empty()) {
        // Node statements above keep their attributes; naming a node inside a cluster
        // subgraph is what places it there.
        let _ = writeln!(out, "  subgraph \"cluster_fused\" {{");
        let _ = writeln!(
            out,
            "    label={}; style=\"rounded,dashed\"; color=steelblue; fontcolor=steelblue;",
            quote(&format!(
                "{host} (fused: in-process in each of its replicas)"
            ))
        );
        for name in nodes {
            let _ = writeln!(out, "    {};", quote(name));
        }
        let _ = writeln!(out, "  }}");
    }

    for edge in &graph.edges {
        let parts = labels.parts(edge);
        let mut attributes = Vec::new();
        if !parts.is_empty() {
            attributes.push(format!("label={}", quote(&parts.join("\n"))));
        }
        let mut styles = Vec::new();
        if edge.mode == EdgeMode::Order as i32 {
            styles.push("dashed");
        }
        if edge.optional {
            styles.push("dotted");
        }
        if !styles.is_empty() {
            attributes.push(format!("style={}", quote(&styles.join(","))));
        }
        if labels.is_dangling(edge) {
            attributes.push("color=red".to_string());
        }
        let attributes = if attributes.is_empty() {
            String::new()
        } else {
            format!(" [{}]", attributes.join(", "))
        };
        let _ = writeln!(
            out,
            "  {} -> {}{attributes};",
            quote(&edge.source),
            quote(&edge.target)
        );
    }
    out.push_str("}\n");
    out
}
