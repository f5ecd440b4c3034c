//! Any bytes: protobuf decode, validation, rendering and the text forms must never panic (nor
//! hang, nor blow the stack). Inputs that are UTF-8 also go through the YAML and JSON readers.

#![no_main]

use libfuzzer_sys::fuzz_target;
use raypipe::graph::{self, proto::PipelineGraph};
use raypipe::serve::{RenderOptions, render};

fn exercise(graph: PipelineGraph) {
    let _ = graph::dot::to_dot(&graph);
    if let Ok(valid) = graph::validate(graph) {
        let _ = valid.digest();
        if let Ok(config) = render(&valid, &RenderOptions::default()) {
            let _ = config.to_yaml();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(graph) = graph::decode(data) {
        // What the decoder accepted re-encodes to bytes that decode to the same graph (compared
        // as encodings: NaN != NaN would make a value comparison lie).
        let bytes = graph::encode(&graph);
        let again = graph::decode(&bytes).expect("a re-encoded graph decodes");
        assert_eq!(graph::encode(&again), bytes);
        let _ = graph::to_yaml(&graph);
        exercise(graph);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(graph) = graph::from_yaml(text) {
            exercise(graph);
        }
        if let Ok(graph) = graph::from_json(text) {
            exercise(graph);
        }
    }
});
