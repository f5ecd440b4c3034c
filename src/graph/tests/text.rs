//! The YAML/JSON text form: names, defaults, oneofs, JSON values, strictness.

use std::path::Path;

use crate::graph::proto::{JoinMode, JsonValue, Op, node, predicate};
use crate::graph::{
    Format, GraphError, decode, encode, from_json, from_yaml, load, to_json, to_yaml,
};

const SMALL: &str = r#"
ingress: request
nodes:
  - name: request
    input:
  - name: m
    join: any
    on_error: ON_ERROR_SKIP
    model:
      import_path: samples.models:M
      init_args: [1, 2.5, "x", null, true, [1], {k: v}]
      deployment: {num_replicas: 2}
  - name: response
    output: {}
edges:
  - {source: request, target: m, when: {negate: {compare: {path: /request/x, op: eq, value: 1}}}}
  - {source: m, target: response, optional: true, if_missing: null}
"#;

#[test]
fn enums_accept_short_full_and_lower_case_names() {
    let graph = from_yaml(SMALL).unwrap();
    assert_eq!(graph.nodes[1].join, JoinMode::Any as i32);
    assert_eq!(graph.nodes[1].on_error, 1);
    let Some(predicate::P::Negate(inner)) = &graph.edges[0].when.as_ref().unwrap().p else {
        panic!()
    };
    let Some(predicate::P::Compare(compare)) = &inner.p else {
        panic!()
    };
    assert_eq!(compare.op, Op::Eq as i32);
}

#[test]
fn a_kind_key_without_value_still_sets_the_kind() {
    let graph = from_yaml(SMALL).unwrap();
    assert!(matches!(graph.nodes[0].kind, Some(node::Kind::Input(_))));
    // `if_missing: null` is the value null, not absent.
    assert_eq!(graph.edges[1].if_missing, Some(JsonValue::null()));
}

#[test]
fn json_values_keep_their_types() {
    let graph = from_yaml(SMALL).unwrap();
    let Some(node::Kind::Model(model)) = &graph.nodes[1].kind else {
        panic!()
    };
    let values: Vec<serde_json::Value> = model.init_args.iter().map(JsonValue::to_json).collect();
    assert_eq!(
        serde_json::Value::Array(values),
        serde_json::json!([1, 2.5, "x", null, true, [1], {"k": "v"}])
    );
    assert_eq!(model.init_args[0], JsonValue::int(1));
}

#[test]
fn written_form_is_short_and_reads_back() {
    let graph = from_yaml(SMALL).unwrap();
    let yaml = to_yaml(&graph).unwrap();
    assert!(yaml.contains("join: ANY"), "{yaml}");
    assert!(yaml.contains("on_error: SKIP"), "{yaml}");
    assert!(yaml.contains("negate:\n"), "{yaml}");
    assert!(
        !yaml.contains("timeout_ms"),
        "defaults are left out: {yaml}"
    );
    assert!(!yaml.contains('!'), "no YAML tags: {yaml}");
    assert_eq!(from_yaml(&yaml).unwrap(), graph);
    let json = to_json(&graph).unwrap();
    assert!(json.contains("\"op\": \"EQ\""), "{json}");
    assert_eq!(from_json(&json).unwrap(), graph);
    assert_eq!(decode(&encode(&graph).unwrap()).unwrap(), graph);
}

#[test]
fn unknown_keys_are_errors() {
    for (typo, expected) in [
        ("improt_path: x", "improt_path"),
        ("deployment: {num_replica: 2}", "num_replica"),
    ] {
        let yaml = SMALL.replace("init_args: [1, 2.5, \"x\", null, true, [1], {k: v}]", typo);
        let error = from_yaml(&yaml).unwrap_err().to_string();
        assert!(
            error.contains(expected) && error.contains("unknown field"),
            "{error}"
        );
    }
    let yaml = SMALL.replace("join: any", "jion: any");
    assert!(from_yaml(&yaml).unwrap_err().to_string().contains("jion"));
    let yaml = format!("{SMALL}\nextra: 1\n");
    assert!(from_yaml(&yaml).is_err());
}

#[test]
fn several_kinds_or_forms_are_errors() {
    let yaml = SMALL.replace("output: {}", "output: {}\n    model: {import_path: a.b:C}");
    let error = from_yaml(&yaml).unwrap_err().to_string();
    assert!(
        error.contains("several kinds") && error.contains("response"),
        "{error}"
    );
    let yaml = SMALL.replace(
        "{negate: {compare:",
        "{some: {path: /a, inner: {compare: {path: \"\", op: EXISTS}}}, negate: {compare:",
    );
    let error = from_yaml(&yaml).unwrap_err().to_string();
    assert!(error.contains("exactly one of"), "{error}");
}

#[test]
fn bad_enum_names_list_the_known_ones() {
    let yaml = SMALL.replace("join: any", "join: SOME");
    let error = from_yaml(&yaml).unwrap_err().to_string();
    assert!(error.contains("ALL, ANY"), "{error}");
}

#[test]
fn unknown_enum_numbers_survive_a_round_trip() {
    let mut graph = from_yaml(SMALL).unwrap();
    graph.nodes[1].join = 42;
    let yaml = to_yaml(&graph).unwrap();
    assert!(yaml.contains("join: 42"), "{yaml}");
    assert_eq!(from_yaml(&yaml).unwrap(), graph);
}

#[test]
fn formats_from_paths_and_content() {
    assert_eq!(Format::from_path(Path::new("g.pb")), Some(Format::Protobuf));
    assert_eq!(Format::from_path(Path::new("g.YML")), Some(Format::Yaml));
    assert_eq!(Format::from_path(Path::new("g.json")), Some(Format::Json));
    assert_eq!(Format::from_path(Path::new("graph")), None);
    let graph = from_yaml(SMALL).unwrap();
    assert_eq!(Format::sniff(&encode(&graph).unwrap()), Format::Protobuf);
    assert_eq!(Format::sniff(SMALL.as_bytes()), Format::Yaml);
    assert_eq!(Format::sniff(b"  {\"ingress\": \"x\"}"), Format::Json);
    assert_eq!(load(SMALL.as_bytes(), Format::Yaml).unwrap(), graph);
    assert!(matches!(
        load(&[0xff, 0xfe], Format::Yaml),
        Err(GraphError::NotUtf8(_))
    ));
}

#[test]
fn decode_errors_have_a_reason() {
    let error = decode(&[0x0a, 0xff]).unwrap_err();
    assert_eq!(error.reason(), "DecodeError");
    assert_eq!(from_yaml("nodes: 3").unwrap_err().reason(), "ParseError");
}

#[test]
fn digest_does_not_depend_on_the_text_form() {
    let from_text = crate::graph::validate(
        from_yaml(&crate::graph::tests::samples::read("sequence.yaml")).unwrap(),
    )
    .unwrap();
    let json = to_json(from_text.graph()).unwrap();
    let from_json_text = crate::graph::validate(from_json(&json).unwrap()).unwrap();
    assert_eq!(from_text.digest(), from_json_text.digest());
    assert_eq!(from_text.digest().len(), 64);
}
