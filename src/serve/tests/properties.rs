//! Property tests of rendering over the graph module's random graphs: a valid random DAG
//! validates in topological order and renders the same config twice (which reads back from its
//! YAML); arbitrary and mutated graphs never panic validation or rendering. The strategies are
//! the graph tests' own (`graph::tests::properties`); these tests live here because `graph`
//! never imports `serve`.

use proptest::collection::vec;
use proptest::prelude::*;

use crate::graph::proto::node;
use crate::graph::tests::properties::{arbitrary_graph, assert_topological, valid_dag};
use crate::graph::{decode, validate};
use crate::serve::{NodeOverride, RenderOptions, ServeConfig, render};

proptest! {
    // No regression files: they would land outside this module's folders in a shared tree;
    // a failure prints its minimal input instead.
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_dags_validate_in_topological_order_and_render(graph in valid_dag()) {
        let expect_valid_options = graph.nodes.iter().all(|n| match &n.kind {
            Some(node::Kind::Model(m)) => m.deployment.is_none(),
            _ => true,
        });
        match validate(graph.clone()) {
            Ok(valid) => {
                assert_topological(&valid);
                let config = render(&valid, &RenderOptions::default()).expect("a valid graph renders with default options");
                let yaml = config.to_yaml();
                prop_assert_eq!(yaml.clone(), render(&valid, &RenderOptions::default()).unwrap().to_yaml());
                let back = ServeConfig::from_yaml(&yaml).expect("rendered YAML reads back");
                prop_assert_eq!(back, config);
                // Overrides never panic either.
                let mut opts = RenderOptions::default();
                opts.node_overrides.insert("m0".into(), NodeOverride { num_replicas: Some(2), max_ongoing_requests: Some(1) });
                let _ = render(&valid, &opts);
            }
            Err(errors) => {
                // Only deployment options are random enough to be wrong.
                prop_assert!(!expect_valid_options, "{}", errors);
                prop_assert!(errors.errors().iter().all(|e| e.reason() == "InvalidOptions"), "{}", errors);
            }
        }
    }

    #[test]
    fn arbitrary_graphs_never_panic(graph in arbitrary_graph()) {
        if let Ok(valid) = validate(graph.clone()) {
            assert_topological(&valid);
            let _ = render(&valid, &RenderOptions::default());
        }
        let _ = crate::graph::dot::to_dot(&graph);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_samples_never_panic_the_decoder(index in 0usize..3, flips in vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let name = ["sequence.pb", "ensemble.pb", "switch-canary.pb"][index];
        let mut bytes = std::fs::read(crate::graph::tests::samples::dir().join(name)).unwrap();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if let Ok(graph) = decode(&bytes)
            && let Ok(valid) = validate(graph) {
                let _ = render(&valid, &RenderOptions::default());
            }
    }
}
