//! The routing and graph-level half of the graph diff (`diff.rs`): how edges, weights,
//! predicates, joins, outputs and graph options changed, in words.

use super::*;

pub(super) fn enum_name<E: TextEnum>(value: i32) -> String {
    short_name::<E>(value).map_or_else(|| value.to_string(), str::to_string)
}

pub(super) fn output_names(graph: &PipelineGraph) -> Vec<&str> {
    graph
        .nodes
        .iter()
        .filter(|n| matches!(n.kind, Some(node::Kind::Output(_))))
        .map(|n| n.name.as_str())
        .collect()
}

/// Edges keyed by (source, target, n-th edge between them), in declaration order.
pub(super) type EdgeKey<'a> = (&'a str, &'a str, usize);

pub(super) fn keyed_edges(graph: &PipelineGraph) -> Vec<(EdgeKey<'_>, &Edge)> {
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
pub(super) fn weight_totals(graph: &PipelineGraph) -> HashMap<&str, u64> {
    let mut totals: HashMap<&str, u64> = HashMap::new();
    for edge in &graph.edges {
        if let Some(weight) = edge.weight {
            *totals.entry(edge.source.as_str()).or_default() += u64::from(weight);
        }
    }
    totals
}

pub(super) fn describe_weight(weight: Option<u32>, total: u64) -> String {
    match weight {
        None => "none".to_string(),
        Some(w) if total > 0 => format!("{w} ({:.0}%)", 100.0 * f64::from(w) / total as f64),
        Some(w) => w.to_string(),
    }
}

pub(super) fn describe_when(when: Option<&proto::Predicate>) -> String {
    match when {
        Some(predicate) => format!("`{}`", capped(&Text(predicate), MAX_PROBLEM_BYTES)),
        None => "none".to_string(),
    }
}

pub(super) fn edge_name((source, target, _): EdgeKey<'_>) -> String {
    format!("edge {source} -> {target}")
}

/// What an added or removed edge routes by, in brackets (empty when it is a plain edge).
pub(super) fn edge_routing(edge: &Edge, total: u64) -> String {
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

pub(super) fn routing_changes(old: &PipelineGraph, new: &PipelineGraph) -> Vec<String> {
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
pub(super) fn node_routing_changes(
    old: &PipelineGraph,
    new: &PipelineGraph,
    lines: &mut Vec<String>,
) {
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

pub(super) fn edge_changes(old: &PipelineGraph, new: &PipelineGraph, lines: &mut Vec<String>) {
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
pub(super) fn kept_in_order<'a>(
    edges: &[(EdgeKey<'a>, &Edge)],
    other: &HashMap<EdgeKey<'_>, &Edge>,
) -> Vec<EdgeKey<'a>> {
    edges
        .iter()
        .map(|(key, _)| *key)
        .filter(|key| other.contains_key(key))
        .collect()
}

pub(super) fn compare_edge(
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

pub(super) fn graph_changes(old: &PipelineGraph, new: &PipelineGraph) -> Vec<String> {
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

pub(super) fn describe_fuse(fuse: Option<bool>) -> &'static str {
    match fuse {
        None => "default (on)",
        Some(true) => "on",
        Some(false) => "off",
    }
}

pub(super) fn describe_deadline(deadline_ms: u32) -> String {
    if deadline_ms == 0 {
        format!("default ({DEFAULT_DEADLINE_MS})")
    } else {
        deadline_ms.to_string()
    }
}

/// Names of the nodes of `graph` that `other` has too, in `graph`'s order.
pub(super) fn node_order<'a>(graph: &'a PipelineGraph, other: &PipelineGraph) -> Vec<&'a str> {
    let names = nodes_by_name(other);
    graph
        .nodes
        .iter()
        .map(|n| n.name.as_str())
        .filter(|name| names.contains_key(name))
        .collect()
}
