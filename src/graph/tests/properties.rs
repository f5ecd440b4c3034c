//! Property tests: random DAGs, random (often invalid) graphs, random predicates and random
//! bytes. Validation, evaluation and decoding never panic; every encoding round-trips. The
//! strategies are shared with `serve::tests::properties`, which renders the same random graphs
//! (and checks their topological order) from above, since `graph` never imports `serve`.

use std::collections::BTreeMap;

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;

use crate::graph::predicate::{check, evaluate};
use crate::graph::proto::{
    self, AutoscalingConfig, Compare, DeploymentOptions, Edge, InputNode, JsonValue, ModelNode,
    Node, OutputNode, PipelineGraph, Predicate, PredicateList, Quantified, RayActorOptions,
    SplitNode, SwitchNode, node, predicate,
};
use crate::graph::{GraphError, decode, encode, from_json, from_yaml, to_json, to_yaml, validate};

pub(crate) fn json_value() -> impl Strategy<Value = JsonValue> {
    let leaf = prop_oneof![
        Just(JsonValue::null()),
        any::<bool>().prop_map(JsonValue::boolean),
        any::<i64>().prop_map(JsonValue::int),
        (-1e12f64..1e12).prop_map(JsonValue::number),
        "[a-z0-9 éß]{0,8}".prop_map(JsonValue::string),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(JsonValue::list),
            btree_map("[a-z]{1,4}", inner, 0..4).prop_map(JsonValue::object),
        ]
    })
}

fn pointer() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        vec("[a-z0-9~/]{0,3}", 1..4).prop_map(|segments| {
            segments
                .iter()
                .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
                .collect()
        }),
        "[a-z/~0-9]{0,6}",
    ]
}

pub(crate) fn predicate_strategy() -> impl Strategy<Value = Predicate> {
    let compare =
        (pointer(), 0i32..15, proptest::option::of(json_value())).prop_map(|(path, op, value)| {
            Predicate {
                p: Some(predicate::P::Compare(Compare { path, op, value })),
            }
        });
    let leaf = prop_oneof![compare, Just(Predicate { p: None })];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(|items| Predicate {
                p: Some(predicate::P::AllOf(PredicateList { items }))
            }),
            vec(inner.clone(), 0..4).prop_map(|items| Predicate {
                p: Some(predicate::P::AnyOf(PredicateList { items }))
            }),
            inner.clone().prop_map(|p| Predicate {
                p: Some(predicate::P::Negate(Box::new(p)))
            }),
            (pointer(), proptest::option::of(inner.clone())).prop_map(|(path, inner)| Predicate {
                p: Some(predicate::P::Some(Box::new(Quantified {
                    path,
                    inner: inner.map(Box::new)
                }))),
            }),
            (pointer(), proptest::option::of(inner)).prop_map(|(path, inner)| Predicate {
                p: Some(predicate::P::Every(Box::new(Quantified {
                    path,
                    inner: inner.map(Box::new)
                }))),
            }),
        ]
    })
}

fn deployment_options() -> impl Strategy<Value = Option<DeploymentOptions>> {
    proptest::option::of(
        (
            proptest::option::of(-2i32..5),
            proptest::option::of((
                proptest::option::of(-1i32..4),
                proptest::option::of(-1i32..8),
                proptest::option::of(0.0f64..6.0),
            )),
            proptest::option::of(-1i32..20),
            proptest::option::of(0.0f64..3.0),
        )
            .prop_map(
                |(num_replicas, autoscaling, max_ongoing, cpus)| DeploymentOptions {
                    num_replicas,
                    autoscaling_config: autoscaling.map(|(min, max, target)| AutoscalingConfig {
                        min_replicas: min,
                        max_replicas: max,
                        target_ongoing_requests: target,
                        ..Default::default()
                    }),
                    max_ongoing_requests: max_ongoing,
                    ray_actor_options: cpus.map(|c| RayActorOptions {
                        num_cpus: Some(c),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ),
    )
}

fn model_node(name: String, deployment: Option<DeploymentOptions>) -> Node {
    Node {
        name,
        kind: Some(node::Kind::Model(ModelNode {
            import_path: "samples.models:M".into(),
            deployment: deployment.map(Box::new),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A valid DAG: `n` models ranked 0..n, random forward edges, declared in a shuffled order;
/// roots fed by the request, sinks feeding the response; each edge writes under its source's
/// name so joins never conflict.
pub(crate) fn valid_dag() -> impl Strategy<Value = PipelineGraph> {
    (1usize..40)
        .prop_flat_map(|n| {
            (
                Just(n),
                vec((0..n, 0..n), 0..n * 3),
                Just((0..n + 2).collect::<Vec<usize>>()).prop_shuffle(),
                vec(deployment_options(), n),
            )
        })
        .prop_map(|(n, pairs, order, options)| {
            let name = |i: usize| format!("m{i}");
            let mut links: Vec<(usize, usize)> = pairs
                .into_iter()
                .filter(|(a, b)| a < b)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            links.sort();
            let mut has_in = vec![false; n];
            let mut has_out = vec![false; n];
            for &(a, b) in &links {
                has_out[a] = true;
                has_in[b] = true;
            }
            let mut edges: Vec<Edge> = Vec::new();
            for (i, _) in has_in.iter().enumerate().filter(|(_, fed)| !**fed) {
                edges.push(Edge {
                    source: "request".into(),
                    target: name(i),
                    into: "/request".into(),
                    ..Default::default()
                });
            }
            for &(a, b) in &links {
                edges.push(Edge {
                    source: name(a),
                    target: name(b),
                    into: format!("/{}", name(a)),
                    ..Default::default()
                });
            }
            for (i, _) in has_out.iter().enumerate().filter(|(_, feeds)| !**feeds) {
                edges.push(Edge {
                    source: name(i),
                    target: "response".into(),
                    into: format!("/{}", name(i)),
                    ..Default::default()
                });
            }
            let mut all_nodes: Vec<Node> = options
                .into_iter()
                .enumerate()
                .map(|(i, o)| model_node(name(i), o))
                .collect();
            all_nodes.push(Node {
                name: "request".into(),
                kind: Some(node::Kind::Input(InputNode {})),
                ..Default::default()
            });
            all_nodes.push(Node {
                name: "response".into(),
                kind: Some(node::Kind::Output(OutputNode {})),
                ..Default::default()
            });
            let nodes = order.into_iter().map(|i| all_nodes[i].clone()).collect();
            PipelineGraph {
                name: "random".into(),
                ingress: "request".into(),
                nodes,
                edges,
                ..Default::default()
            }
        })
}

/// Anything: duplicate names, unknown endpoints, cycles, any node kind, guards, weights.
pub(crate) fn arbitrary_graph() -> impl Strategy<Value = PipelineGraph> {
    let names = "[a-f]";
    let node = (names, 0u8..6, deployment_options(), 0i32..3).prop_map(
        |(name, kind, deployment, join)| {
            let kind = match kind {
                0 => None,
                1 => Some(node::Kind::Input(InputNode {})),
                2 => Some(node::Kind::Model(ModelNode {
                    import_path: "samples.models:M".into(),
                    deployment: deployment.map(Box::new),
                    ..Default::default()
                })),
                3 => Some(node::Kind::Switch(SwitchNode { on_no_match: 1 })),
                4 => Some(node::Kind::Split(SplitNode::default())),
                _ => Some(node::Kind::Output(OutputNode {})),
            };
            Node {
                name,
                kind,
                join,
                ..Default::default()
            }
        },
    );
    let edge = (
        names,
        names,
        proptest::option::of(predicate_strategy()),
        proptest::option::of(0u32..3),
        any::<bool>(),
        pointer(),
    )
        .prop_map(|(source, target, when, weight, optional, into)| Edge {
            source,
            target,
            when: when.map(Box::new),
            weight,
            optional,
            into,
            ..Default::default()
        });
    (vec(node, 0..8), vec(edge, 0..14), names).prop_map(|(nodes, edges, ingress)| PipelineGraph {
        ingress,
        nodes,
        edges,
        ..Default::default()
    })
}

pub(crate) fn assert_topological(valid: &crate::graph::ValidatedGraph) {
    let graph = valid.graph();
    let mut position: BTreeMap<&str, usize> = BTreeMap::new();
    for (pos, node) in valid.topological_order().enumerate() {
        position.insert(node.name.as_str(), pos);
    }
    assert_eq!(position.len(), graph.nodes.len());
    for edge in &graph.edges {
        assert!(
            position[edge.source.as_str()] < position[edge.target.as_str()],
            "{} -> {}",
            edge.source,
            edge.target
        );
    }
}

/// serde_json (without its `float_roundtrip` feature) may read a float back one ulp off; YAML
/// and protobuf round-trips are compared exactly.
fn same_up_to_float_parsing<T: serde::Serialize>(a: &T, b: &T) -> bool {
    fn close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
        use serde_json::Value;
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y))
                    if x.is_finite() && y.is_finite() && (x.fract() != 0.0 || y.fract() != 0.0) =>
                {
                    (x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs())
                }
                _ => x == y,
            },
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| close(p, q))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
            }
            _ => a == b,
        }
    }
    match (serde_json::to_value(a), serde_json::to_value(b)) {
        (Ok(x), Ok(y)) => close(&x, &y),
        _ => false,
    }
}

fn scope() -> serde_json::Value {
    serde_json::json!({
        "request": {"a": [1, 2.5, "x", null, {"b": true}], "s": "héllo", "n": 3},
        "m0": {"items": [{"k": 1}, {"k": "2"}], "x/y": 1, "t~": []},
        "": 0
    })
}

proptest! {
    // No regression files: they would land outside this module's folders in a shared tree;
    // a failure prints its minimal input instead.
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn encodings_round_trip(graph in prop_oneof![valid_dag(), arbitrary_graph()]) {
        prop_assert_eq!(decode(&encode(&graph).unwrap()).unwrap(), graph.clone());
        prop_assert_eq!(from_yaml(&to_yaml(&graph).unwrap()).unwrap(), graph.clone());
        let from_text = from_json(&to_json(&graph).unwrap()).unwrap();
        prop_assert!(same_up_to_float_parsing(&from_text, &graph), "{:?}", from_text);
    }

    #[test]
    fn predicates_never_panic_and_round_trip(predicate in predicate_strategy()) {
        let _ = check(&predicate);
        let _ = evaluate(&predicate, &scope());
        let _ = crate::graph::predicate::Text(&predicate).to_string();
        let json = serde_json::to_string(&predicate).unwrap();
        let back: Predicate = serde_json::from_str(&json).unwrap();
        prop_assert!(same_up_to_float_parsing(&back, &predicate), "{:?}", back);
        let yaml = serde_yaml::to_string(&predicate).unwrap();
        let back: Predicate = serde_yaml::from_str(&yaml).unwrap();
        prop_assert_eq!(back, predicate);
    }

    #[test]
    fn negation_is_complement(predicate in predicate_strategy()) {
        let negated = Predicate { p: Some(predicate::P::Negate(Box::new(predicate.clone()))) };
        prop_assert_eq!(evaluate(&negated, &scope()), !evaluate(&predicate, &scope()));
    }

    #[test]
    fn json_values_round_trip(value in json_value()) {
        prop_assert_eq!(JsonValue::from(&value.to_json()), value.clone());
        let text = serde_json::to_string(&value).unwrap();
        let back = serde_json::from_str::<JsonValue>(&text).unwrap();
        prop_assert!(same_up_to_float_parsing(&back, &value), "{:?}", back);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_the_decoder(bytes in vec(any::<u8>(), 0..512)) {
        if let Ok(graph) = decode(&bytes) {
            let _ = validate(graph);
        }
        let _ = crate::graph::decode_and_validate(&bytes);
    }

}

#[test]
fn deeply_nested_values_are_refused_not_overflowed() {
    // Refused by name: by `encode` before prost's recursive encoder runs, and by `decode` from
    // the wire (prost's own recursion limit, 100, is never reached).
    let mut value = JsonValue::int(1);
    for _ in 0..200 {
        value = JsonValue::list(vec![value]);
    }
    let graph = PipelineGraph {
        nodes: vec![Node {
            name: "m".into(),
            fallback_value: Some(value),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(matches!(encode(&graph), Err(GraphError::TooDeep { .. })));
    let bytes = prost::Message::encode_to_vec(&graph);
    assert!(matches!(decode(&bytes), Err(GraphError::TooDeep { .. })));
    let _ = proto::Node::default();
}
