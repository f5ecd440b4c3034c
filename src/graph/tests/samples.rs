//! The sample graphs in samples/graphs: valid, and their .pb files are exactly the
//! encoding of their YAML (regenerate with `raypipe dag encode X.yaml -o X.pb`).
//! That each one renders is checked in `serve::tests::samples`.

use std::path::PathBuf;

use crate::graph::{decode, encode, from_yaml, validate};

pub(crate) fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/graphs")
}

pub(crate) fn read(name: &str) -> String {
    std::fs::read_to_string(dir().join(name))
        .unwrap_or_else(|e| panic!("cannot read sample {name}: {e}"))
}

pub(crate) fn yaml_samples() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    names.sort();
    names
}

#[test]
fn the_required_samples_exist() {
    let names = yaml_samples();
    for required in ["sequence.yaml", "ensemble.yaml", "switch-canary.yaml"] {
        assert!(
            names.iter().any(|n| n == required),
            "{required} missing from {names:?}"
        );
    }
}

#[test]
fn every_protobuf_sample_is_the_encoding_of_its_yaml() {
    for name in yaml_samples() {
        let graph = from_yaml(&read(&name)).unwrap();
        let pb_path = dir().join(name.replace(".yaml", ".pb"));
        let bytes =
            std::fs::read(&pb_path).unwrap_or_else(|e| panic!("{}: {e}", pb_path.display()));
        assert!(
            bytes == encode(&graph).unwrap(),
            "{} is stale; regenerate it with `raypipe dag encode samples/graphs/{name} -o {}`",
            pb_path.display(),
            pb_path.display()
        );
        assert_eq!(decode(&bytes).unwrap(), graph);
    }
}

#[test]
fn samples_use_user_import_paths_from_the_samples_package() {
    for name in yaml_samples() {
        let valid = validate(from_yaml(&read(&name)).unwrap()).unwrap();
        for node in valid.model_nodes() {
            let Some(crate::graph::proto::node::Kind::Model(model)) = &node.kind else {
                unreachable!()
            };
            // The digits sample's models are a team's own code, pushed as its code layer.
            let package = if name.starts_with("digits") {
                "digits_models.models:"
            } else {
                "samples.models:"
            };
            assert!(
                model.import_path.starts_with(package),
                "{name}: {}",
                model.import_path
            );
        }
    }
}
