//! The one entry point that the fuzz harnesses drive: the cargo-fuzz target
//! (`fuzz/fuzz_targets/decode_validate.rs`, nightly) and the stable proptest harness that runs
//! a bounded number of cases in `cargo test --lib` (`tests/fuzz.rs` in this module).
//!
//! It lives in `serve`, not `graph`, because it follows a graph all the way to a rendered
//! Serve config, and `graph` sits below `serve` (it must never import it).
//!
//! Any bytes go through protobuf decode, validation, DOT and rendering; UTF-8 input also
//! through the YAML and JSON readers. Asserts what must hold for every input: no panic, what
//! decodes re-encodes to bytes that decode the same, and every message built from the input
//! stays within the caps.

use super::{RenderOptions, render};
use crate::graph::proto::PipelineGraph;
use crate::graph::{
    GraphError, MAX_MESSAGE_BYTES, decode, dot, encode, from_json, from_yaml, to_json, to_yaml,
    validate,
};

/// Runs one input through every reader and what follows; panics if an invariant breaks.
pub fn exercise(data: &[u8]) {
    match decode(data) {
        Ok(graph) => {
            let bytes = encode(&graph).expect("what decode accepts encodes");
            let again = decode(&bytes).expect("a re-encoded graph decodes");
            // Compared as encodings: NaN != NaN would make a value comparison lie.
            assert_eq!(encode(&again).expect("encodes again"), bytes);
            let _ = to_yaml(&graph);
            let _ = to_json(&graph);
            follow(graph);
        }
        Err(error) => check_message(&error),
    }
    if let Ok(text) = std::str::from_utf8(data) {
        for parsed in [from_yaml(text), from_json(text)] {
            match parsed {
                Ok(graph) => {
                    // What a text form accepts, protobuf carries: only size and counts may
                    // refuse it (checked by `encode`), never nesting.
                    match encode(&graph) {
                        Ok(bytes) => {
                            decode(&bytes).expect("what encode wrote decodes");
                        }
                        Err(
                            GraphError::TooMany { .. }
                            | GraphError::TooLarge { .. }
                            | GraphError::TooCostly { .. },
                        ) => {}
                        Err(other) => panic!("a graph read from text does not encode: {other}"),
                    }
                    follow(graph);
                }
                Err(error) => check_message(&error),
            }
        }
    }
}

fn check_message(error: &GraphError) {
    if let GraphError::Invalid(errors) = error {
        let message = errors.to_string();
        assert!(
            message.len() <= MAX_MESSAGE_BYTES,
            "a {}-byte message",
            message.len()
        );
    }
}

fn follow(graph: PipelineGraph) {
    let _ = dot::to_dot(&graph);
    match validate(graph) {
        Ok(valid) => {
            let _ = valid.digest();
            if let Ok(config) = render(&valid, &RenderOptions::default()) {
                let _ = config.to_yaml();
            }
        }
        Err(errors) => check_message(&GraphError::Invalid(errors)),
    }
}
