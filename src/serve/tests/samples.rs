//! The sample graphs in samples/graphs each render to one Serve application (the list and the
//! readers are the graph tests' own, `graph::tests::samples`).

use crate::graph::tests::samples::{read, yaml_samples};
use crate::graph::{from_yaml, validate};
use crate::serve::{RenderOptions, render};

#[test]
fn every_sample_is_valid_and_renders() {
    for name in yaml_samples() {
        let graph = from_yaml(&read(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let valid = validate(graph).unwrap_or_else(|e| panic!("{name}: {e}"));
        let config =
            render(&valid, &RenderOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(config.applications.len(), 1, "{name}");
    }
}
