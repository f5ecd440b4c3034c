//! Drawings of a graph without Graphviz: a standalone SVG (for the dashboard and browsers) and
//! a plain-text view for terminals (`raypipe dag draw`). Like [`super::dot`], works on any
//! decoded graph, valid or not, and says the same things (labels and kinds come from there).
//!
//! Graph input is untrusted: the layout is O((V + E) log V) whatever the shape (cycles are
//! broken by ignoring the back edges of one depth-first search, edges to unknown nodes get a
//! placeholder), nothing recurses, and every name is escaped (XML in SVG, control and bidi
//! characters in text).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use super::dot::{EdgeLabels, kind_of};
use super::proto::{Edge, EdgeMode, JoinMode, Node, PipelineGraph, node};

/// What to show on top of the graph itself. `NodeMarks::default()` marks nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeMarks {
    /// Title line of the drawing (e.g. "demo v2 sha256:abcd…"); `None` = the graph's name and
    /// version, when it has them.
    pub title: Option<String>,
    /// Status per node name (e.g. Ray Serve's "HEALTHY", "UNHEALTHY", "DEPLOYING"): shown as a
    /// second line and colouring the node (see [`Tone::of`]).
    pub status: BTreeMap<String, String>,
}

impl NodeMarks {
    /// Marks with this title.
    pub fn titled(title: impl Into<String>) -> Self {
        NodeMarks {
            title: Some(title.into()),
            ..Default::default()
        }
    }

    /// Adds (or replaces) a node's status.
    pub fn with_status(mut self, node: impl Into<String>, status: impl Into<String>) -> Self {
        self.status.insert(node.into(), status.into());
        self
    }
}

/// How a status colours its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// Running as it should (green).
    Good,
    /// Failed or unhealthy (red).
    Bad,
    /// On its way (amber).
    Busy,
    /// Anything else (grey).
    Neutral,
}

impl Tone {
    /// The tone of a Ray Serve deployment or application status (case-insensitive).
    pub fn of(status: &str) -> Tone {
        match status.trim().to_ascii_uppercase().as_str() {
            "HEALTHY" | "RUNNING" | "READY" => Tone::Good,
            "UNHEALTHY" | "DEPLOY_FAILED" | "FAILED" | "ERROR" => Tone::Bad,
            "DEPLOYING" | "UPDATING" | "UPSCALING" | "DOWNSCALING" | "RECOVERING" | "STARTING"
            | "NOT_STARTED" | "PENDING" => Tone::Busy,
            _ => Tone::Neutral,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Layout

/// One box of the drawing: a declared node (the first of its name) or a placeholder for a name
/// an edge uses but no node declares.
struct Item<'a> {
    name: &'a str,
    node: Option<&'a Node>,
    /// How many nodes declare this name (more than one is an error worth showing).
    declared: usize,
}

/// One edge with its ends resolved.
struct Link<'a> {
    edge: &'a Edge,
    from: usize,
    to: usize,
    /// Ignored by the layering: closes a cycle (or loops on its node); drawn as a back edge.
    back: bool,
}

/// Nodes in layers (longest path from the sources), ordered within each layer.
struct Layout<'a> {
    items: Vec<Item<'a>>,
    links: Vec<Link<'a>>,
    layer_of: Vec<usize>,
    layers: Vec<Vec<usize>>,
    /// Out-links of each item, in edge declaration order.
    out: Vec<Vec<usize>>,
}

const UNSEEN: u8 = 0;
const OPEN: u8 = 1;
const DONE: u8 = 2;

fn layout<'a>(graph: &'a PipelineGraph) -> Layout<'a> {
    let mut items: Vec<Item<'a>> = Vec::with_capacity(graph.nodes.len());
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(graph.nodes.len());
    for node in &graph.nodes {
        match index.get(node.name.as_str()) {
            Some(&i) => items[i].declared += 1,
            None => {
                index.insert(node.name.as_str(), items.len());
                items.push(Item {
                    name: &node.name,
                    node: Some(node),
                    declared: 1,
                });
            }
        }
    }
    let mut links = Vec::with_capacity(graph.edges.len());
    for edge in &graph.edges {
        let mut end = |name: &'a str| -> usize {
            *index.entry(name).or_insert_with(|| {
                items.push(Item {
                    name,
                    node: None,
                    declared: 0,
                });
                items.len() - 1
            })
        };
        let from = end(&edge.source);
        let to = end(&edge.target);
        links.push(Link {
            edge,
            from,
            to,
            back: from == to,
        });
    }
    let n = items.len();

    // Rank by name: every order below depends on names only, never on declaration order.
    let mut by_name: Vec<usize> = (0..n).collect();
    by_name.sort_unstable_by(|&a, &b| items[a].name.cmp(items[b].name));
    let mut rank = vec![0usize; n];
    for (r, &i) in by_name.iter().enumerate() {
        rank[i] = r;
    }

    let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut in_degree = vec![0usize; n];
    for (l, link) in links.iter().enumerate() {
        out[link.from].push(l);
        if !link.back {
            in_degree[link.to] += 1;
        }
    }
    // The search visits successors by name, so which edges close cycles does not depend on
    // the order of the edges either.
    let mut visit: Vec<Vec<usize>> = out.clone();
    for list in &mut visit {
        list.sort_by_key(|&l| (rank[links[l].to], l));
    }

    // Roots: the ingress, then the sources, then whatever only cycles reach.
    let mut roots: Vec<usize> = Vec::with_capacity(2 * n + 1);
    roots.extend(index.get(graph.ingress.as_str()).copied());
    roots.extend(by_name.iter().copied().filter(|&i| in_degree[i] == 0));
    roots.extend(by_name.iter().copied());

    // Iterative depth-first search (input decides the depth): back edges close cycles.
    let mut state = vec![UNSEEN; n];
    let mut finished: Vec<usize> = Vec::with_capacity(n);
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for root in roots {
        if state[root] != UNSEEN {
            continue;
        }
        state[root] = OPEN;
        stack.push((root, 0));
        while let Some(&mut (v, ref mut next)) = stack.last_mut() {
            if let Some(&l) = visit[v].get(*next) {
                *next += 1;
                let w = links[l].to;
                match state[w] {
                    UNSEEN => {
                        state[w] = OPEN;
                        stack.push((w, 0));
                    }
                    OPEN => links[l].back = true,
                    _ => {}
                }
            } else {
                state[v] = DONE;
                finished.push(v);
                stack.pop();
            }
        }
    }

    // Longest path over the remaining acyclic edges, in reverse finishing order (topological).
    let mut layer_of = vec![0usize; n];
    for &v in finished.iter().rev() {
        for &l in &out[v] {
            let link = &links[l];
            if !link.back {
                layer_of[link.to] = layer_of[link.to].max(layer_of[v] + 1);
            }
        }
    }
    let depth = layer_of.iter().max().map_or(0, |d| d + 1);
    let mut layers: Vec<Vec<usize>> = vec![Vec::new(); depth];
    for &i in &by_name {
        layers[layer_of[i]].push(i);
    }

    // One barycenter sweep: a node sits near the mean position of its predecessors (as a
    // fraction of their layers), ties by name. Layer 0 by name, the ingress first.
    let ingress = index.get(graph.ingress.as_str()).copied();
    if let Some(first) = layers.first_mut() {
        first.sort_by_key(|&i| (Some(i) != ingress, rank[i]));
    }
    let mut sum = vec![0f64; n];
    let mut count = vec![0u32; n];
    for (k, layer) in layers.iter_mut().enumerate() {
        if k > 0 {
            layer.sort_by(|&a, &b| {
                let mean = |i: usize| sum[i] / f64::from(count[i].max(1));
                mean(a).total_cmp(&mean(b)).then(rank[a].cmp(&rank[b]))
            });
        }
        let len = layer.len() as f64;
        for (position, &v) in layer.iter().enumerate() {
            let fraction = (position as f64 + 0.5) / len;
            for &l in &out[v] {
                let link = &links[l];
                if !link.back {
                    sum[link.to] += fraction;
                    count[link.to] += 1;
                }
            }
        }
    }

    Layout {
        items,
        links,
        layer_of,
        layers,
        out,
    }
}

/// The drawing's title: the marks', else the graph's name and version.
fn title_of(graph: &PipelineGraph, marks: &NodeMarks) -> Option<String> {
    if let Some(title) = &marks.title {
        return Some(title.clone());
    }
    let title = format!("{} {}", graph.name, graph.version);
    let title = title.trim();
    (!title.is_empty()).then(|| title.to_string())
}

/// What a box says under its name: kind, join, shadow, problems.
fn details(item: &Item<'_>, ingress: &str) -> Vec<String> {
    let Some(node) = item.node else {
        return vec!["unknown node".to_string()];
    };
    let (_, kind) = kind_of(node);
    // A model without an import path (invalid, but drawn) still says what it is.
    let mut lines = vec![if kind.is_empty() {
        "model".to_string()
    } else {
        kind
    }];
    let is_input = matches!(node.kind, Some(node::Kind::Input(_)));
    if item.name == ingress && !is_input {
        lines.push("ingress".to_string());
    }
    if node.join == JoinMode::Any as i32 {
        lines.push("join: ANY".to_string());
    }
    if let Some(shadow) = &node.shadow {
        lines.push(format!("shadow {}%", shadow.sample_percent.unwrap_or(100)));
    }
    if item.declared > 1 {
        lines.push(format!("declared {} times", item.declared));
    }
    lines
}

/// Words for what the SVG shows by line style and colour, so the text view says it too.
fn edge_words(link: &Link<'_>, labels: &EdgeLabels<'_>) -> Vec<String> {
    let mut words = labels.parts(link.edge);
    if link.edge.mode == EdgeMode::Order as i32 {
        words.push("order".to_string());
    }
    if link.edge.optional {
        words.push("optional".to_string());
    }
    if labels.is_dangling(link.edge) {
        words.push("unknown node".to_string());
    }
    if link.back {
        words.push("cycle".to_string());
    }
    words
}

/// At most `max` characters, with an ellipsis when cut.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some(_) => {
            let end = text
                .char_indices()
                .nth(max.saturating_sub(1))
                .map_or(text.len(), |(i, _)| i);
            format!("{}…", &text[..end])
        }
    }
}

// ---------------------------------------------------------------------------------------------
// SVG

/// Appends text escaped for XML content and attribute values (and HTML's: the console's pages
/// use it too). Characters XML 1.0 forbids even escaped (most C0 controls, U+FFFE, U+FFFF) and
/// other controls become spaces.
pub fn push_xml(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\u{fffe}' | '\u{ffff}' => out.push(' '),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
}

// Geometry, in pixels. Widths are estimated from character counts (monospace font).
const CHAR_W: f64 = 7.3;
const LABEL_CHAR_W: f64 = 6.1;
const LINE_H: f64 = 15.0;
const LABEL_LINE_H: f64 = 12.0;
const PAD: f64 = 9.0;
const MARGIN: f64 = 20.0;
const ROW_GAP: f64 = 22.0;
const MIN_COLUMN_GAP: f64 = 56.0;
const TITLE_H: f64 = 30.0;
/// Longest name or detail line shown in a box (the full text is in its tooltip).
const MAX_BOX_CHARS: usize = 48;
/// Longest edge label line shown.
const MAX_LABEL_CHARS: usize = 40;

struct Colours {
    fill: &'static str,
    stroke: &'static str,
    text: &'static str,
}

fn colours(tone: Option<Tone>) -> Colours {
    match tone {
        None => Colours {
            fill: "#ffffff",
            stroke: "#3c4043",
            text: "#202124",
        },
        Some(Tone::Good) => Colours {
            fill: "#e6f4ea",
            stroke: "#1e8e3e",
            text: "#0d652d",
        },
        Some(Tone::Bad) => Colours {
            fill: "#fce8e6",
            stroke: "#d93025",
            text: "#a50e0e",
        },
        Some(Tone::Busy) => Colours {
            fill: "#fef7e0",
            stroke: "#f29900",
            text: "#8a5300",
        },
        Some(Tone::Neutral) => Colours {
            fill: "#f1f3f4",
            stroke: "#5f6368",
            text: "#202124",
        },
    }
}

const EDGE: &str = "#5f6368";
const RED: &str = "#d93025";
const GREY: &str = "#b0b4b8";

struct Rect {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
    lines: Vec<String>,
}

/// A point of the cubic from `a` to `b` whose control points sit halfway along x at each end's
/// height, at horizontal position `x` (found by bisection; the curve is monotone in x).
fn on_curve(a: (f64, f64), b: (f64, f64), x: f64) -> (f64, f64) {
    let span = b.0 - a.0;
    if span.abs() < 1e-9 {
        return ((a.0 + b.0) / 2.0, (a.1 + b.1) / 2.0);
    }
    let target = ((x - a.0) / span).clamp(0.0, 1.0);
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..24 {
        let t = (lo + hi) / 2.0;
        if 1.5 * t * (1.0 - t) + t * t * t < target {
            lo = t;
        } else {
            hi = t;
        }
    }
    let t = (lo + hi) / 2.0;
    let s = 3.0 * t * t - 2.0 * t * t * t;
    (a.0 + span * target, a.1 + (b.1 - a.1) * s)
}

/// The graph as a standalone SVG document: layers left to right, one rounded box per node
/// (`<g class="node" data-node="NAME">` with a `<title>`), edges with arrowheads and the labels
/// of [`super::dot`]; ORDER edges dashed, optional edges dotted, shadow nodes grey, edges to
/// unknown nodes red (to a dashed placeholder, `<g class="missing" data-missing="NAME">`).
pub fn to_svg(graph: &PipelineGraph, marks: &NodeMarks) -> String {
    let layout = layout(graph);
    let labels = EdgeLabels::new(graph);
    let n = layout.items.len();
    let title = title_of(graph, marks);
    let top = MARGIN + if title.is_some() { TITLE_H } else { 0.0 };

    // Box sizes.
    let mut boxes: Vec<Rect> = Vec::with_capacity(n);
    for item in &layout.items {
        let mut lines = vec![clip(item.name, MAX_BOX_CHARS)];
        lines.extend(
            details(item, &graph.ingress)
                .iter()
                .map(|d| clip(d, MAX_BOX_CHARS)),
        );
        if let Some(status) = marks.status.get(item.name) {
            lines.push(clip(status, MAX_BOX_CHARS));
        }
        let chars = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
        boxes.push(Rect {
            x: 0.0,
            y: 0.0,
            w: (chars as f64 * CHAR_W + 2.0 * PAD).max(72.0),
            h: lines.len() as f64 * LINE_H + 2.0 * PAD - 3.0,
            lines,
        });
    }

    // Edge labels, and the room they need in the gap after their source's column.
    let words: Vec<Vec<String>> = layout
        .links
        .iter()
        .map(|link| {
            labels
                .parts(link.edge)
                .iter()
                .map(|p| clip(p, MAX_LABEL_CHARS))
                .collect()
        })
        .collect();
    let columns = layout.layers.len();
    let mut gap = vec![MIN_COLUMN_GAP; columns];
    for (link, lines) in layout.links.iter().zip(&words) {
        let chars = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
        let k = layout.layer_of[link.from];
        gap[k] = gap[k].max(chars as f64 * LABEL_CHAR_W + 24.0);
    }

    // Columns left to right, each centred vertically.
    let heights: Vec<f64> = layout
        .layers
        .iter()
        .map(|layer| {
            layer.iter().map(|&i| boxes[i].h).sum::<f64>()
                + ROW_GAP * layer.len().saturating_sub(1) as f64
        })
        .collect();
    let tallest = heights.iter().copied().fold(0.0, f64::max);
    let mut x = MARGIN;
    let mut column_right = vec![0.0; columns];
    for (k, layer) in layout.layers.iter().enumerate() {
        let width = layer.iter().map(|&i| boxes[i].w).fold(0.0, f64::max);
        column_right[k] = x + width;
        let mut y = top + (tallest - heights[k]) / 2.0;
        for &i in layer {
            boxes[i].x = x + (width - boxes[i].w) / 2.0;
            boxes[i].y = y;
            y += boxes[i].h + ROW_GAP;
        }
        x += width + gap[k];
    }
    let mut width = (x - gap.last().copied().unwrap_or(0.0) + MARGIN).max(2.0 * MARGIN);
    if let Some(title) = &title {
        width = width.max(2.0 * MARGIN + clip(title, 120).chars().count() as f64 * CHAR_W);
    }
    let mut height = top + tallest + MARGIN;

    // Edges first, so boxes paint over them.
    let mut edges = String::new();
    for (link, lines) in layout.links.iter().zip(&words) {
        let (from, to) = (&boxes[link.from], &boxes[link.to]);
        let dangling = labels.is_dangling(link.edge);
        let shadowed = [link.from, link.to]
            .iter()
            .any(|&i| layout.items[i].node.is_some_and(|n| n.shadow.is_some()));
        let (colour, marker) = if dangling {
            (RED, "raypipe-arrow-red")
        } else if shadowed {
            (GREY, "raypipe-arrow-grey")
        } else {
            (EDGE, "raypipe-arrow")
        };
        let order = link.edge.mode == EdgeMode::Order as i32;
        let dash = match (order, link.edge.optional) {
            (true, true) => " stroke-dasharray=\"7 3 2 3\"",
            (true, false) => " stroke-dasharray=\"7 4\"",
            (false, true) => " stroke-dasharray=\"2 3\"",
            (false, false) => "",
        };
        let (path, label_at) = if link.from == link.to {
            // A loop on the box's right side.
            let (rx, cy) = (from.x + from.w, from.y + from.h / 2.0);
            (
                format!(
                    "M{:.1},{:.1} C{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
                    rx,
                    cy - 6.0,
                    rx + 36.0,
                    cy - 34.0,
                    rx + 36.0,
                    cy + 34.0,
                    rx + 2.0,
                    cy + 6.0
                ),
                (rx + 30.0, cy - 24.0),
            )
        } else if link.back {
            // Back under both boxes.
            let (a, b) = (
                (from.x + from.w / 2.0, from.y + from.h),
                (to.x + to.w / 2.0, to.y + to.h + 2.0),
            );
            let low = a.1.max(b.1) + 36.0;
            height = height.max(low + MARGIN);
            (
                format!(
                    "M{:.1},{:.1} C{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
                    a.0, a.1, a.0, low, b.0, low, b.0, b.1
                ),
                ((a.0 + b.0) / 2.0, low - 6.0),
            )
        } else {
            let a = (from.x + from.w, from.y + from.h / 2.0);
            let b = (to.x - 2.0, to.y + to.h / 2.0);
            let half = (b.0 - a.0) / 2.0;
            // The label sits in the gap right after the source's column.
            let k = layout.layer_of[link.from];
            let label_x = column_right[k] + gap[k] / 2.0;
            (
                format!(
                    "M{:.1},{:.1} C{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}",
                    a.0,
                    a.1,
                    a.0 + half,
                    a.1,
                    b.0 - half,
                    b.1,
                    b.0,
                    b.1
                ),
                on_curve(a, b, label_x),
            )
        };
        edges.push_str("<g class=\"edge\" data-source=\"");
        push_xml(&mut edges, &link.edge.source);
        edges.push_str("\" data-target=\"");
        push_xml(&mut edges, &link.edge.target);
        edges.push_str("\"><title>");
        push_xml(&mut edges, &link.edge.source);
        edges.push_str(" → ");
        push_xml(&mut edges, &link.edge.target);
        for word in edge_words(link, &labels) {
            edges.push('\n');
            push_xml(&mut edges, &word);
        }
        let _ = write!(
            edges,
            "</title><path d=\"{path}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.3\"{dash} marker-end=\"url(#{marker})\"/>"
        );
        if !lines.is_empty() {
            let first = label_at.1 - (lines.len() as f64 - 1.0) * LABEL_LINE_H / 2.0 + 3.5;
            let _ = write!(
                edges,
                "<text x=\"{:.1}\" y=\"{first:.1}\" text-anchor=\"middle\" font-size=\"10\" fill=\"{}\" stroke=\"#ffffff\" stroke-width=\"3\" paint-order=\"stroke\">",
                label_at.0,
                if dangling { RED } else { "#3c4043" }
            );
            for (i, line) in lines.iter().enumerate() {
                let _ = write!(
                    edges,
                    "<tspan x=\"{:.1}\" dy=\"{}\">",
                    label_at.0,
                    if i == 0 { 0.0 } else { LABEL_LINE_H }
                );
                push_xml(&mut edges, line);
                edges.push_str("</tspan>");
            }
            edges.push_str("</text>");
        }
        edges.push_str("</g>\n");
    }

    let mut out = String::with_capacity(edges.len() + 400 * n + 1024);
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"ui-monospace, SFMono-Regular, Menlo, Consolas, monospace\" font-size=\"12\">"
    );
    if let Some(title) = &title {
        out.push_str("<title>");
        push_xml(&mut out, title);
        out.push_str("</title>\n");
    }
    out.push_str("<defs>\n");
    for (id, colour) in [
        ("raypipe-arrow", EDGE),
        ("raypipe-arrow-red", RED),
        ("raypipe-arrow-grey", GREY),
    ] {
        let _ = writeln!(
            out,
            "<marker id=\"{id}\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"{colour}\"/></marker>"
        );
    }
    out.push_str("</defs>\n");
    out.push_str("<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
    if let Some(title) = &title {
        let _ = write!(
            out,
            "<text class=\"title\" x=\"{MARGIN}\" y=\"{:.1}\" font-size=\"14\" font-weight=\"bold\" fill=\"#202124\">",
            MARGIN + 12.0
        );
        push_xml(&mut out, &clip(title, 120));
        out.push_str("</text>\n");
    }
    out.push_str("<g class=\"edges\">\n");
    out.push_str(&edges);
    out.push_str("</g>\n<g class=\"nodes\">\n");
    for layer in &layout.layers {
        for &i in layer {
            draw_box(&mut out, &layout.items[i], &boxes[i], graph, marks);
        }
    }
    out.push_str("</g>\n</svg>\n");
    out
}

fn draw_box(out: &mut String, item: &Item<'_>, b: &Rect, graph: &PipelineGraph, marks: &NodeMarks) {
    let status = marks.status.get(item.name);
    let tone = status.map(|s| Tone::of(s));
    let mut c = colours(tone);
    let mut dash = "";
    let mut stroke_width = 1.3;
    match item.node {
        None => {
            c.stroke = RED;
            c.text = RED;
            dash = " stroke-dasharray=\"5 3\"";
        }
        Some(node) => {
            if node.shadow.is_some() {
                c.stroke = GREY;
                dash = " stroke-dasharray=\"5 3\"";
                if tone.is_none() {
                    c.text = "#80868b";
                }
            } else if node.kind.is_none() || item.declared > 1 {
                c.stroke = RED;
            }
            if matches!(
                node.kind,
                Some(node::Kind::Input(_) | node::Kind::Output(_))
            ) || item.name == graph.ingress
            {
                stroke_width = 2.2;
            }
        }
    }
    if item.node.is_some() {
        out.push_str("<g class=\"node\" data-node=\"");
    } else {
        out.push_str("<g class=\"missing\" data-missing=\"");
    }
    push_xml(out, item.name);
    out.push('"');
    if let Some(status) = status {
        out.push_str(" data-status=\"");
        push_xml(out, status);
        out.push('"');
    }
    out.push_str("><title>");
    push_xml(out, item.name);
    for line in details(item, &graph.ingress) {
        out.push('\n');
        push_xml(out, &line);
    }
    if let Some(status) = status {
        out.push('\n');
        push_xml(out, status);
    }
    if let Some(description) = item.node.map(|n| n.description.as_str())
        && !description.is_empty()
    {
        out.push('\n');
        push_xml(out, description);
    }
    let _ = write!(
        out,
        "</title><rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" rx=\"7\" fill=\"{}\" stroke=\"{}\" stroke-width=\"{stroke_width}\"{dash}/>",
        b.x, b.y, b.w, b.h, c.fill, c.stroke
    );
    let last = b.lines.len().saturating_sub(1);
    for (i, line) in b.lines.iter().enumerate() {
        let y = b.y + PAD + 11.0 + i as f64 * LINE_H;
        let style = if i == 0 {
            " font-weight=\"bold\""
        } else if i == last && status.is_some() {
            " font-size=\"11\" font-weight=\"bold\""
        } else {
            " font-size=\"11\""
        };
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{y:.1}\" text-anchor=\"middle\" fill=\"{}\"{style}>",
            b.x + b.w / 2.0,
            c.text
        );
        push_xml(out, line);
        out.push_str("</text>");
    }
    out.push_str("</g>\n");
}

// ---------------------------------------------------------------------------------------------
// Text

/// Appends text safe to print on a terminal: control characters (escape sequences) and bidi
/// overrides are written as `\u{..}` escapes.
fn push_plain(out: &mut String, text: &str) {
    for c in text.chars() {
        if c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
}

fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    push_plain(&mut out, text);
    out
}

/// Columns of a terminal the text view fits (names longer than that are printed whole).
const COLUMNS: usize = 80;
/// Longest edge label printed (wrapped over lines).
const MAX_TEXT_LABEL: usize = 240;

/// The graph for a terminal, without colour codes: per layer its nodes (`[layer] name (kind)
/// [STATUS]`), under each node its out-edges with arrows and labels (guards, weights,
/// selection; and in words what the SVG shows by style: order, optional, unknown node, cycle).
pub fn to_text(graph: &PipelineGraph, marks: &NodeMarks) -> String {
    let layout = layout(graph);
    let labels = EdgeLabels::new(graph);
    let mut out = String::new();
    if let Some(title) = title_of(graph, marks) {
        push_plain(&mut out, &title);
        out.push('\n');
    }
    for (k, layer) in layout.layers.iter().enumerate() {
        for &i in layer {
            let item = &layout.items[i];
            let _ = write!(out, "[{k}] ");
            push_plain(&mut out, item.name);
            let details = details(item, &graph.ingress);
            out.push_str(" (");
            push_plain(&mut out, &details.join(", "));
            out.push(')');
            if let Some(status) = marks.status.get(item.name) {
                out.push_str(" [");
                push_plain(&mut out, status);
                out.push(']');
            }
            out.push('\n');
            let count = layout.out[i].len();
            for (position, &l) in layout.out[i].iter().enumerate() {
                let link = &layout.links[l];
                let last = position + 1 == count;
                let head = if last {
                    "      └─▶ "
                } else {
                    "      ├─▶ "
                };
                let more = if last { "          " } else { "      │   " };
                let target = plain(&link.edge.target);
                let words = plain(&clip(&edge_words(link, &labels).join("; "), MAX_TEXT_LABEL));
                out.push_str(head);
                out.push_str(&target);
                if words.is_empty() {
                    out.push('\n');
                } else if head.chars().count() + target.chars().count() + words.chars().count() + 4
                    <= COLUMNS
                {
                    let _ = writeln!(out, "  ({words})");
                } else {
                    // Too long for one line: the label goes under, wrapped.
                    out.push('\n');
                    let room = COLUMNS - more.chars().count() - 2;
                    let chars: Vec<char> = format!("({words})").chars().collect();
                    for chunk in chars.chunks(room) {
                        out.push_str(more);
                        out.push_str("  ");
                        out.extend(chunk);
                        out.push('\n');
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "draw_tests.rs"]
mod tests;
