//! The shared predicate vectors in tests/vectors (the Python runtime runs the same files).

use serde::Deserialize;

use crate::graph::predicate::{check, evaluate};
use crate::graph::proto::Predicate;

fn read(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[derive(Deserialize)]
struct Vectors {
    scope: serde_json::Value,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    predicate: Predicate,
    expected: bool,
}

#[derive(Deserialize)]
struct InvalidVectors {
    cases: Vec<InvalidCase>,
}

#[derive(Deserialize)]
struct InvalidCase {
    name: String,
    predicate: Predicate,
    problems: Vec<String>,
}

#[test]
fn predicate_vectors_evaluate_as_expected() {
    let vectors: Vectors = serde_json::from_str(&read("predicates.json")).unwrap();
    assert!(vectors.cases.len() >= 80, "the vectors should stay broad");
    let mut failures = Vec::new();
    for case in &vectors.cases {
        let (problems, _) = check(&case.predicate);
        if !problems.is_empty() {
            failures.push(format!("{}: statically invalid: {problems:?}", case.name));
            continue;
        }
        let got = evaluate(&case.predicate, &vectors.scope);
        if got != case.expected {
            failures.push(format!(
                "{}: expected {}, got {got}",
                case.name, case.expected
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing vectors:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn invalid_predicate_vectors_are_refused_where_expected() {
    let vectors: InvalidVectors = serde_json::from_str(&read("predicates_invalid.json")).unwrap();
    let mut failures = Vec::new();
    for case in &vectors.cases {
        let (problems, _) = check(&case.predicate);
        let places: Vec<&str> = problems.iter().map(|p| p.at.as_str()).collect();
        if places != case.problems {
            failures.push(format!(
                "{}: expected problems at {:?}, got {problems:?}",
                case.name, case.problems
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn vectors_survive_the_protobuf_round_trip() {
    use prost::Message;
    let vectors: Vectors = serde_json::from_str(&read("predicates.json")).unwrap();
    for case in &vectors.cases {
        let decoded = Predicate::decode(case.predicate.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded, case.predicate, "{}", case.name);
        assert_eq!(
            evaluate(&decoded, &vectors.scope),
            case.expected,
            "{}",
            case.name
        );
    }
}
