//! Unit tests of the SVG and text drawings (`draw.rs`).

use proptest::prelude::*;

use super::*;
use crate::graph::proto::{InputNode, ModelNode, OutputNode, Shadow, SplitNode, SwitchNode};

fn named(name: &str, kind: node::Kind) -> Node {
    Node {
        name: name.to_string(),
        kind: Some(kind),
        ..Default::default()
    }
}

fn model(name: &str) -> Node {
    named(
        name,
        node::Kind::Model(ModelNode {
            import_path: "samples.models:M".into(),
            ..Default::default()
        }),
    )
}

fn edge(source: &str, target: &str) -> Edge {
    Edge {
        source: source.to_string(),
        target: target.to_string(),
        ..Default::default()
    }
}

fn graph(nodes: Vec<Node>, edges: Vec<Edge>) -> PipelineGraph {
    PipelineGraph {
        name: "demo".into(),
        version: "v2".into(),
        ingress: "request".into(),
        nodes,
        edges,
        ..Default::default()
    }
}

/// request -> a, b -> response, and a long edge request -> response.
fn diamond() -> PipelineGraph {
    graph(
        vec![
            named("response", node::Kind::Output(OutputNode {})),
            model("b"),
            model("a"),
            named("request", node::Kind::Input(InputNode {})),
        ],
        vec![
            edge("request", "b"),
            edge("request", "a"),
            edge("a", "response"),
            edge("b", "response"),
            Edge {
                mode: EdgeMode::Order as i32,
                ..edge("request", "response")
            },
        ],
    )
}

fn sample(name: &str) -> PipelineGraph {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples/graphs")
        .join(name);
    crate::graph::from_yaml(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn layer_names(graph: &PipelineGraph) -> Vec<Vec<String>> {
    let layout = layout(graph);
    layout
        .layers
        .iter()
        .map(|l| {
            l.iter()
                .map(|&i| layout.items[i].name.to_string())
                .collect()
        })
        .collect()
}

/// A small well-formedness check: balanced tags, quoted attributes without `<`, only the five
/// predefined entities and character references, no text outside the root element.
fn assert_well_formed(xml: &str) {
    fn check_text(text: &str, context: &str) {
        assert!(!text.contains('<'), "raw < in {context}: {text:?}");
        let mut rest = text;
        while let Some(at) = rest.find('&') {
            rest = &rest[at + 1..];
            let end = rest
                .find(';')
                .unwrap_or_else(|| panic!("unterminated entity in {context}"));
            let entity = &rest[..end];
            let ok = matches!(entity, "amp" | "lt" | "gt" | "quot" | "apos")
                || entity
                    .strip_prefix('#')
                    .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
            assert!(ok, "bad entity &{entity}; in {context}");
            rest = &rest[end + 1..];
        }
        for c in text.chars() {
            assert!(
                matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{fffe}' && c != '\u{ffff}'),
                "character {c:?} not allowed in XML ({context})"
            );
        }
    }
    let mut stack: Vec<&str> = Vec::new();
    let mut rest = xml;
    let mut roots = 0;
    loop {
        let Some(open) = rest.find('<') else {
            assert!(
                rest.trim().is_empty() || !stack.is_empty(),
                "text after root"
            );
            check_text(rest, "text");
            break;
        };
        let text = &rest[..open];
        if stack.is_empty() {
            assert!(text.trim().is_empty(), "text outside the root: {text:?}");
        }
        check_text(text, "text");
        rest = &rest[open + 1..];
        let close = rest.find('>').expect("unterminated tag");
        let tag = &rest[..close];
        rest = &rest[close + 1..];
        if tag.starts_with('?') || tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop(), Some(name.trim()), "mismatched </{name}>");
            continue;
        }
        let self_closing = tag.ends_with('/');
        let tag = tag.trim_end_matches('/');
        let name_end = tag.find(char::is_whitespace).unwrap_or(tag.len());
        let name = &tag[..name_end];
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "bad tag name {name:?}"
        );
        // Attributes: name="value" pairs, names unique.
        let mut attrs = tag[name_end..].trim_start();
        let mut seen = std::collections::BTreeSet::new();
        while !attrs.is_empty() {
            let eq = attrs.find('=').expect("attribute without value");
            let attr = &attrs[..eq];
            assert!(
                !attr.is_empty()
                    && attr
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':'),
                "bad attribute name {attr:?}"
            );
            assert!(seen.insert(attr), "duplicate attribute {attr}");
            let value = attrs[eq + 1..]
                .strip_prefix('"')
                .expect("unquoted attribute");
            let end = value.find('"').expect("unterminated attribute");
            check_text(&value[..end], "attribute");
            attrs = value[end + 1..].trim_start();
        }
        if stack.is_empty() {
            roots += 1;
        }
        if !self_closing {
            stack.push(name);
        }
    }
    assert!(stack.is_empty(), "unclosed {stack:?}");
    assert_eq!(roots, 1, "one root element");
}

fn xml(text: &str) -> String {
    let mut out = String::new();
    push_xml(&mut out, text);
    out
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn the_well_formedness_check_catches_broken_xml() {
    for bad in [
        "<svg><g></svg>",
        "<svg a=\"<\"/>",
        "<svg>a & b</svg>",
        "<svg a=b/>",
        "<svg/><svg/>",
        "<svg>\u{1}</svg>",
    ] {
        assert!(
            std::panic::catch_unwind(|| assert_well_formed(bad)).is_err(),
            "{bad}"
        );
    }
    assert_well_formed("<svg a=\"&amp;&#39;\"><g><title>x &lt; y</title></g></svg>\n");
}

#[test]
fn a_diamond_is_layered_by_longest_path() {
    assert_eq!(
        layer_names(&diamond()),
        [vec!["request"], vec!["a", "b"], vec!["response"]]
    );
    let text = to_text(&diamond(), &NodeMarks::default());
    assert_eq!(
        text,
        "demo v2\n\
         [0] request (ingress)\n\
         \x20     ├─▶ b\n\
         \x20     ├─▶ a\n\
         \x20     └─▶ response  (order)\n\
         [1] a (samples.models:M)\n\
         \x20     └─▶ response\n\
         [1] b (samples.models:M)\n\
         \x20     └─▶ response\n\
         [2] response (output)\n"
    );
}

#[test]
fn a_longer_branch_pushes_the_join_down() {
    // request -> a -> b -> c -> response, request -> response: response is in layer 4.
    let g = graph(
        vec![
            named("request", node::Kind::Input(InputNode {})),
            model("a"),
            model("b"),
            model("c"),
            named("response", node::Kind::Output(OutputNode {})),
        ],
        vec![
            edge("request", "response"),
            edge("request", "a"),
            edge("a", "b"),
            edge("b", "c"),
            edge("c", "response"),
        ],
    );
    let layers = layer_names(&g);
    assert_eq!(layers.len(), 5);
    assert_eq!(layers[4], ["response"]);
}

#[test]
fn every_node_and_edge_of_a_sample_appears() {
    let g = sample("switch-canary.yaml");
    let svg = to_svg(&g, &NodeMarks::default());
    assert_well_formed(&svg);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\""));
    assert!(svg.contains(" viewBox=\"0 0 "));
    assert_eq!(count(&svg, "class=\"node\""), g.nodes.len());
    for n in &g.nodes {
        assert_eq!(
            count(&svg, &format!("data-node=\"{}\"", n.name)),
            1,
            "{}",
            n.name
        );
    }
    assert_eq!(count(&svg, "class=\"edge\""), g.edges.len());
    assert_eq!(count(&svg, "marker-end="), g.edges.len());
    for e in &g.edges {
        assert!(
            svg.contains(&format!(
                "data-source=\"{}\" data-target=\"{}\"",
                e.source, e.target
            )),
            "{} -> {}",
            e.source,
            e.target
        );
    }
    // The labels dot shows.
    assert!(
        svg.contains("when /request/tier == &quot;gold&quot;"),
        "{svg}"
    );
    assert!(svg.contains(">90 (90%)<") && svg.contains(">default<"));
    // The shadow node is grey and dashed.
    let audit = svg.split("data-node=\"audit\"").nth(1).unwrap();
    let audit = audit.split("</g>").next().unwrap();
    assert!(
        audit.contains(GREY) && audit.contains("stroke-dasharray"),
        "{audit}"
    );

    let text = to_text(&g, &NodeMarks::default());
    for n in &g.nodes {
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with('[') && l.contains(&format!("] {} (", n.name)))
                .count(),
            1,
            "{}\n{text}",
            n.name
        );
    }
    assert_eq!(count(&text, "─▶ "), g.edges.len());
    assert!(text.contains("when /request/tier == \"gold\""), "{text}");
    assert!(text.contains("[0] request (ingress)"), "{text}");
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "too wide: {line}");
    }
}

#[test]
fn every_sample_draws() {
    for name in ["sequence.yaml", "ensemble.yaml", "switch-canary.yaml"] {
        let g = sample(name);
        let svg = to_svg(&g, &NodeMarks::default());
        assert_well_formed(&svg);
        let text = to_text(&g, &NodeMarks::default());
        assert_eq!(count(&text, "─▶ "), g.edges.len(), "{name}");
    }
}

#[test]
fn ordered_optional_and_dangling_edges_are_styled() {
    let mut g = diamond();
    g.edges[0].optional = true;
    g.edges.push(edge("a", "ghost"));
    let svg = to_svg(&g, &NodeMarks::default());
    assert_well_formed(&svg);
    let style_of = |source: &str, target: &str| {
        let key = format!("data-source=\"{source}\" data-target=\"{target}\"");
        let rest = svg.split(&key).nth(1).unwrap();
        rest.split("</g>").next().unwrap().to_string()
    };
    assert!(style_of("request", "response").contains("stroke-dasharray=\"7 4\""));
    assert!(style_of("request", "b").contains("stroke-dasharray=\"2 3\""));
    assert!(!style_of("request", "a").contains("stroke-dasharray"));
    let ghost = style_of("a", "ghost");
    assert!(
        ghost.contains(RED) && ghost.contains("raypipe-arrow-red"),
        "{ghost}"
    );
    assert!(svg.contains("class=\"missing\" data-missing=\"ghost\""));
    assert!(!svg.contains("data-node=\"ghost\""));
    let text = to_text(&g, &NodeMarks::default());
    assert!(text.contains("─▶ ghost  (unknown node)"), "{text}");
    assert!(text.contains("─▶ b  (optional)"), "{text}");
    assert!(text.contains("] ghost (unknown node)"), "{text}");
}

#[test]
fn hostile_names_are_escaped() {
    let hostile = "<script>alert(\"x\")</script>";
    let mut g = graph(
        vec![
            named("request", node::Kind::Input(InputNode {})),
            model(hostile),
            model("a&b'c"),
            Node {
                description: "</title><script>".into(),
                ..model("\u{1b}[31mred\u{202e}")
            },
        ],
        vec![
            Edge {
                select: "/<x>&\"".into(),
                ..edge("request", hostile)
            },
            edge(hostile, "a&b'c"),
            edge("a&b'c", "\u{1b}[31mred\u{202e}"),
            edge("a&b'c", "</g>\u{0}"),
        ],
    );
    g.name = "<svg onload=\"x\">".into();
    let marks = NodeMarks::titled("t <&> \"q\"").with_status(hostile, "<b>UNHEALTHY</b>");
    let svg = to_svg(&g, &marks);
    assert_well_formed(&svg);
    assert!(!svg.contains("<script"), "{svg}");
    assert!(svg.contains("data-node=\"&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;\""));
    assert!(svg.contains("data-node=\"a&amp;b&#39;c\""));
    assert!(svg.contains("select /&lt;x&gt;&amp;&quot;"));
    assert!(svg.contains("t &lt;&amp;&gt; &quot;q&quot;"));
    assert!(!svg.contains('\u{1b}') && !svg.contains('\u{0}'));

    let text = to_text(&g, &marks);
    assert!(text.starts_with("t <&> \"q\"\n"), "{text}");
    assert!(text.contains(&format!("] {hostile} (")), "{text}");
    assert!(text.contains("[<b>UNHEALTHY</b>]"), "{text}");
    // No escape sequences or bidi overrides reach the terminal.
    assert!(!text.contains('\u{1b}') && !text.contains('\u{202e}') && !text.contains('\u{0}'));
    assert!(text.contains("\\u{1b}[31mred\\u{202e}"), "{text}");
}

#[test]
fn cycles_and_dangling_edges_do_not_hang_or_panic() {
    let g = graph(
        vec![
            named("request", node::Kind::Input(InputNode {})),
            model("a"),
            model("b"),
            model("c"),
            model("d"),
            model("a"),
            Node {
                name: "nokind".into(),
                ..Default::default()
            },
        ],
        vec![
            edge("request", "a"),
            edge("a", "b"),
            edge("b", "c"),
            edge("c", "a"),
            edge("d", "d"),
            edge("b", "ghost"),
            edge("phantom", "request"),
            edge("nokind", "c"),
            edge("", ""),
        ],
    );
    for g in [g.clone(), PipelineGraph::default()] {
        let svg = to_svg(&g, &NodeMarks::default());
        assert_well_formed(&svg);
        let _ = to_text(&g, &NodeMarks::default());
    }
    let svg = to_svg(&g, &NodeMarks::default());
    // Duplicates are drawn once, and said.
    assert_eq!(count(&svg, "data-node=\"a\""), 1);
    assert!(svg.contains("declared 2 times"));
    assert_eq!(count(&svg, "class=\"edge\""), g.edges.len());
    let text = to_text(&g, &NodeMarks::default());
    assert_eq!(count(&text, "─▶ "), g.edges.len(), "{text}");
    assert!(
        text.contains("(cycle)") || text.contains("; cycle)"),
        "{text}"
    );
    assert!(text.contains("─▶ d  (cycle)"), "{text}");
}

#[test]
fn large_graphs_and_long_cycles_are_drawn_without_recursion() {
    // A 10,000-node chain closed into a cycle, with skip edges: the search is iterative.
    let n = 10_000;
    let mut nodes = vec![named("request", node::Kind::Input(InputNode {}))];
    let mut edges = vec![edge("request", "m0")];
    for i in 0..n {
        nodes.push(model(&format!("m{i}")));
        edges.push(edge(&format!("m{i}"), &format!("m{}", (i + 1) % n)));
        if i % 7 == 0 {
            edges.push(edge(&format!("m{i}"), &format!("m{}", (i + 13) % n)));
        }
    }
    let g = graph(nodes, edges);
    let text = to_text(&g, &NodeMarks::default());
    assert_eq!(count(&text, "─▶ "), g.edges.len());
    let svg = to_svg(&g, &NodeMarks::default());
    assert_eq!(count(&svg, "class=\"node\""), n + 1);
    // Every edge the layering keeps goes down at least one layer; few edges are dropped.
    let layout = layout(&g);
    let back = layout.links.iter().filter(|l| l.back).count();
    assert!((1..20).contains(&back), "{back}");
    for link in layout.links.iter().filter(|l| !l.back) {
        assert!(layout.layer_of[link.to] > layout.layer_of[link.from]);
    }
}

#[test]
fn a_wide_layer_is_drawn() {
    // 10,000 models side by side between the ingress and the output.
    let n = 10_000;
    let mut nodes = vec![
        named("request", node::Kind::Input(InputNode {})),
        named("response", node::Kind::Output(OutputNode {})),
    ];
    let mut edges = Vec::new();
    for i in 0..n {
        nodes.push(model(&format!("m{i}")));
        edges.push(Edge {
            into: format!("/m{i}"),
            ..edge("request", &format!("m{i}"))
        });
        edges.push(edge(&format!("m{i}"), "response"));
    }
    let g = graph(nodes, edges);
    assert_eq!(
        layout(&g).layers.iter().map(Vec::len).collect::<Vec<_>>(),
        [1, n, 1]
    );
    let svg = to_svg(&g, &NodeMarks::default());
    assert_eq!(count(&svg, "class=\"edge\""), 2 * n);
    let text = to_text(&g, &NodeMarks::default());
    assert_eq!(count(&text, "─▶ "), 2 * n);
}

#[test]
fn output_does_not_depend_on_node_order() {
    let g = sample("switch-canary.yaml");
    let marks = NodeMarks::titled("switch-canary 1 sha256:abcd").with_status("tier", "HEALTHY");
    let (svg, text) = (to_svg(&g, &marks), to_text(&g, &marks));
    assert_eq!(svg, to_svg(&g, &marks));
    assert_eq!(text, to_text(&g, &marks));
    let mut reversed = g.clone();
    reversed.nodes.reverse();
    assert_eq!(svg, to_svg(&reversed, &marks));
    assert_eq!(text, to_text(&reversed, &marks));
    let mut rotated = g.clone();
    rotated.nodes.rotate_left(3);
    assert_eq!(svg, to_svg(&rotated, &marks));
    assert_eq!(text, to_text(&rotated, &marks));
}

#[test]
fn status_colours_the_node_and_is_shown() {
    let g = diamond();
    let marks = NodeMarks::titled("demo v2 sha256:abcd")
        .with_status("a", "HEALTHY")
        .with_status("b", "UNHEALTHY")
        .with_status("response", "DEPLOYING")
        .with_status("request", "SOMETHING");
    let svg = to_svg(&g, &marks);
    assert_well_formed(&svg);
    let node = |name: &str| {
        let rest = svg.split(&format!("data-node=\"{name}\"")).nth(1).unwrap();
        rest.split("</g>").next().unwrap().to_string()
    };
    assert!(node("a").contains(colours(Some(Tone::Good)).fill));
    assert!(node("a").contains(">HEALTHY</text>"));
    assert!(node("a").starts_with(" data-status=\"HEALTHY\""));
    assert!(node("b").contains(colours(Some(Tone::Bad)).fill));
    assert!(node("response").contains(colours(Some(Tone::Busy)).fill));
    assert!(node("request").contains(colours(Some(Tone::Neutral)).fill));
    assert!(svg.contains(">demo v2 sha256:abcd</text>"));
    let text = to_text(&g, &marks);
    assert!(text.starts_with("demo v2 sha256:abcd\n"));
    assert!(
        text.contains("[1] a (samples.models:M) [HEALTHY]\n"),
        "{text}"
    );
    assert!(
        text.contains("[1] b (samples.models:M) [UNHEALTHY]\n"),
        "{text}"
    );
    // Without marks nothing is coloured.
    let plain = to_svg(&g, &NodeMarks::default());
    assert!(!plain.contains("data-status"));
    assert!(!plain.contains(colours(Some(Tone::Good)).fill));
}

#[test]
fn tones_follow_ray_serve_statuses() {
    assert_eq!(Tone::of("HEALTHY"), Tone::Good);
    assert_eq!(Tone::of("running"), Tone::Good);
    assert_eq!(Tone::of("UNHEALTHY"), Tone::Bad);
    assert_eq!(Tone::of("DEPLOY_FAILED"), Tone::Bad);
    assert_eq!(Tone::of("DEPLOYING"), Tone::Busy);
    assert_eq!(Tone::of("UPSCALING"), Tone::Busy);
    assert_eq!(Tone::of(""), Tone::Neutral);
}

#[test]
fn long_labels_wrap_within_80_columns() {
    let mut g = diamond();
    g.edges[2].select = format!("/{}", "very_long_field/".repeat(20));
    g.edges[3].into = "/x".into();
    let text = to_text(&g, &NodeMarks::default());
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "too wide: {line}\n{text}");
    }
    assert!(text.contains("select /very_long_field"), "{text}");
    assert!(text.contains("─▶ response  (into /x)"), "{text}");
    let svg = to_svg(&g, &NodeMarks::default());
    assert_well_formed(&svg);
    assert!(svg.contains('…'));
}

#[test]
fn kinds_and_routing_are_described() {
    let g = graph(
        vec![
            named("request", node::Kind::Input(InputNode {})),
            named("route", node::Kind::Switch(SwitchNode { on_no_match: 1 })),
            named(
                "canary",
                node::Kind::Split(SplitNode {
                    sticky_key: "/request/user".into(),
                }),
            ),
            Node {
                shadow: Some(Shadow {
                    sample_percent: Some(10),
                }),
                ..model("audit")
            },
            Node {
                join: JoinMode::Any as i32,
                ..named("response", node::Kind::Output(OutputNode {}))
            },
        ],
        vec![
            edge("request", "route"),
            edge("route", "canary"),
            edge("request", "audit"),
            Edge {
                weight: Some(3),
                ..edge("canary", "response")
            },
            Edge {
                weight: Some(1),
                ..edge("canary", "response")
            },
        ],
    );
    let text = to_text(&g, &NodeMarks::default());
    assert!(
        text.contains("] audit (samples.models:M, shadow 10%)"),
        "{text}"
    );
    assert!(text.contains("] response (output, join: ANY)"), "{text}");
    assert!(
        text.contains("] canary (split, sticky /request/user)"),
        "{text}"
    );
    assert!(text.contains("─▶ canary  (default)"), "{text}");
    assert!(
        text.contains("(3 (75%))") && text.contains("(1 (25%))"),
        "{text}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_graphs_draw_every_node_once(g in crate::graph::tests::properties::arbitrary_graph()) {
        let svg = to_svg(&g, &NodeMarks::default());
        assert_well_formed(&svg);
        let names: std::collections::BTreeSet<&str> =
            g.nodes.iter().map(|n| n.name.as_str()).collect();
        prop_assert_eq!(count(&svg, "class=\"node\""), names.len());
        for name in &names {
            prop_assert_eq!(count(&svg, &format!("data-node=\"{}\"", xml(name))), 1);
        }
        prop_assert_eq!(count(&svg, "class=\"edge\""), g.edges.len());
        let text = to_text(&g, &NodeMarks::default());
        prop_assert_eq!(count(&text, "─▶ "), g.edges.len());
        let mut reversed = g.clone();
        reversed.nodes.reverse();
        // Names decide the layout; only which duplicate is drawn may change.
        if names.len() == g.nodes.len() {
            prop_assert_eq!(&svg, &to_svg(&reversed, &NodeMarks::default()));
            prop_assert_eq!(&text, &to_text(&reversed, &NodeMarks::default()));
        }
    }
}
