//! Helpers shared by the tests of the `ray.io/v1` kinds: sample loading, exact round trips,
//! and CRD inspection.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// KubeRay's sample objects (see [`crate::api::yaml::kuberay_samples_dir`]).
pub fn kuberay_samples_dir() -> PathBuf {
    crate::api::yaml::kuberay_samples_dir()
}

/// The project's own samples (`samples/`).
pub fn own_samples_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/samples"))
}

/// Every document of a YAML file, as JSON values (empty documents skipped).
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    crate::api::yaml::documents(&text)
        .unwrap_or_else(|e| panic!("{}: invalid YAML: {e}", path.display()))
}

/// `(file name, document)` for every `ray.io/v1` object of `kind` in the `*.yaml` files of `dir`.
pub fn ray_objects(dir: &Path, kind: &str) -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let name = file
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        for doc in yaml_documents(&file) {
            if doc["apiVersion"] == "ray.io/v1" && doc["kind"] == kind {
                found.push((name.clone(), doc));
            }
        }
    }
    found
}

/// The first place where two JSON values differ, as a JSON pointer with both sides.
pub fn first_difference(expected: &Value, actual: &Value, path: &str) -> Option<String> {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for key in e.keys().chain(a.keys()) {
                let child = format!("{path}/{key}");
                match (e.get(key), a.get(key)) {
                    (Some(ev), Some(av)) => {
                        if let Some(diff) = first_difference(ev, av, &child) {
                            return Some(diff);
                        }
                    }
                    (Some(ev), None) => return Some(format!("{child}: lost {ev}")),
                    (None, Some(av)) => return Some(format!("{child}: added {av}")),
                    (None, None) => {}
                }
            }
            None
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => e
            .iter()
            .zip(a)
            .enumerate()
            .find_map(|(i, (ev, av))| first_difference(ev, av, &format!("{path}/{i}"))),
        // JSON has one number type: `1` and `1.0` are the same value (a float field holding
        // a whole number serializes as `1.0`).
        (Value::Number(e), Value::Number(a)) if e.as_f64() == a.as_f64() => None,
        _ if expected == actual => None,
        _ => Some(format!("{path}: expected {expected}, got {actual}")),
    }
}

/// Deserializes `doc` as `K` and serializes it back; the result must equal `doc` exactly.
pub fn assert_round_trip<K: DeserializeOwned + Serialize>(origin: &str, doc: &Value) -> K {
    let typed: K = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{origin}: does not deserialize: {e}"));
    let back = serde_json::to_value(&typed)
        .unwrap_or_else(|e| panic!("{origin}: does not serialize: {e}"));
    if let Some(diff) = first_difference(doc, &back, "") {
        panic!("{origin}: the round trip changed the object at {diff}");
    }
    typed
}

/// KubeRay's name rules (webhook and controller): a DNS-1035 label no longer than the
/// kind's limit, which leaves room for the suffixes of generated names.
pub fn assert_valid_kuberay_name(kind: &str, name: &str) {
    let limit = match kind {
        "RayCluster" => 53,
        "RayJob" | "RayService" => 47,
        "RayCronJob" => 36,
        other => panic!("unknown kind {other}"),
    };
    assert!(
        name.len() <= limit,
        "{kind} name {name:?} is longer than {limit}"
    );
    let bytes = name.as_bytes();
    let dns_1035 = bytes.first().is_some_and(u8::is_ascii_lowercase)
        && bytes
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    assert!(dns_1035, "{kind} name {name:?} is not a DNS-1035 label");
}

/// Round-trips every `kind` object of KubeRay's samples and of `samples/`; returns how many
/// came from each. Each directory must hold at least one object of the kind.
pub fn assert_samples_round_trip<K: DeserializeOwned + Serialize>(kind: &str) -> (usize, usize) {
    let mut counts = Vec::new();
    for dir in [kuberay_samples_dir(), own_samples_dir()] {
        let objects = ray_objects(&dir, kind);
        assert!(
            !objects.is_empty(),
            "no ray.io/v1 {kind} in {}",
            dir.display()
        );
        for (file, doc) in &objects {
            let name = doc["metadata"]["name"].as_str().unwrap_or_default();
            let origin = format!("{}/{file} ({kind} {name})", dir.display());
            assert_valid_kuberay_name(kind, name);
            assert_round_trip::<K>(&origin, doc);
        }
        counts.push(objects.len());
    }
    (counts[0], counts[1])
}

/// The single version of a CRD.
pub fn only_version(crd: &CustomResourceDefinition) -> &CustomResourceDefinitionVersion {
    assert_eq!(crd.spec.versions.len(), 1, "one version per CRD");
    &crd.spec.versions[0]
}

/// Checks names, scope, category, subresources (status, no scale, as KubeRay) and printer
/// columns `(name, type, jsonPath, priority)`.
pub fn assert_crd_shape(
    crd: &CustomResourceDefinition,
    plural: &str,
    columns: &[(&str, &str, &str, i32)],
) {
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some(format!("{plural}.ray.io").as_str())
    );
    assert_eq!(crd.spec.group, "ray.io");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.plural, plural);
    assert_eq!(crd.spec.names.categories, Some(vec!["all".to_owned()]));
    assert_eq!(
        crd.spec.names.short_names, None,
        "KubeRay defines no short names"
    );
    let version = only_version(crd);
    assert_eq!(version.name, "v1");
    assert!(version.served && version.storage);
    let subresources = version.subresources.as_ref().expect("subresources");
    assert!(
        subresources.status.is_some(),
        "{plural}: status subresource"
    );
    assert!(
        subresources.scale.is_none(),
        "{plural}: KubeRay has no scale subresource"
    );
    let actual: Vec<(String, String, String, i32)> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| {
            (
                c.name.clone(),
                c.type_.clone(),
                c.json_path.clone(),
                c.priority.unwrap_or(0),
            )
        })
        .collect();
    let expected: Vec<(String, String, String, i32)> = columns
        .iter()
        .map(|(n, t, p, prio)| ((*n).to_owned(), (*t).to_owned(), (*p).to_owned(), *prio))
        .collect();
    assert_eq!(actual, expected, "{plural}: printer columns");
}

/// The CRD's OpenAPI schema as JSON.
pub fn schema_json(crd: &CustomResourceDefinition) -> Value {
    let schema = only_version(crd)
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref());
    serde_json::to_value(schema.expect("openAPIV3Schema")).expect("schema serializes")
}

/// The schema node at `path` (property names separated by `.`; `[]` steps into array items,
/// `{}` into map values).
pub fn schema_at<'a>(schema: &'a Value, path: &str) -> &'a Value {
    let mut node = schema;
    for step in path.split('.') {
        node = match step {
            "[]" => &node["items"],
            "{}" => &node["additionalProperties"],
            name => &node["properties"][name],
        };
        assert!(!node.is_null(), "no schema at {path} (step {step})");
    }
    node
}

/// Checks the schema is structural as the API server requires: no `$ref`, no
/// `oneOf`/`anyOf`/`allOf`/`not`, every node typed (or int-or-string / preserve-unknown), no
/// `additionalProperties` beside `properties`, and list-map keys that exist and are required
/// or defaulted.
pub fn assert_structural(node: &Value, path: &str) {
    let Value::Object(map) = node else {
        panic!("{path}: schema is not an object: {node}");
    };
    for forbidden in [
        "$ref",
        "oneOf",
        "anyOf",
        "allOf",
        "not",
        "definitions",
        "$defs",
        "const",
    ] {
        assert!(!map.contains_key(forbidden), "{path}: has {forbidden}");
    }
    let typed = map.contains_key("type")
        || map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    assert!(typed, "{path}: no type");
    if let Some(Value::Object(properties)) = map.get("properties") {
        assert!(
            !map.contains_key("additionalProperties"),
            "{path}: properties and additionalProperties"
        );
        for (name, child) in properties {
            assert_structural(child, &format!("{path}.{name}"));
        }
    }
    if let Some(items) = map.get("items") {
        assert_structural(items, &format!("{path}[]"));
        if map.get("x-kubernetes-list-type") == Some(&Value::String("map".into())) {
            let keys = map["x-kubernetes-list-map-keys"]
                .as_array()
                .expect("list-map keys");
            let required = items["required"].as_array().cloned().unwrap_or_default();
            for key in keys {
                let key_schema = &items["properties"][key.as_str().expect("key name")];
                assert!(
                    !key_schema.is_null(),
                    "{path}: list-map key {key} is not a property"
                );
                assert!(
                    required.contains(key) || key_schema.get("default").is_some(),
                    "{path}: list-map key {key} is neither required nor defaulted"
                );
            }
        }
    }
    if let Some(additional) = map.get("additionalProperties")
        && additional.is_object()
    {
        assert_structural(additional, &format!("{path}{{}}"));
    }
}

/// Size of the CRD as JSON; etcd refuses objects much above 1.5 MiB.
pub fn assert_installable_size(crd: &CustomResourceDefinition) {
    let bytes = serde_json::to_vec(crd).expect("CRD serializes").len();
    assert!(
        bytes < 1_000_000,
        "{:?} is {bytes} bytes as JSON",
        crd.metadata.name
    );
}

/// Merges `patch` into `doc`: objects key by key, anything else replaced.
pub fn json_merge(doc: &mut Value, patch: Value) {
    match (doc, patch) {
        (Value::Object(doc), Value::Object(patch)) => {
            for (key, value) in patch {
                json_merge(doc.entry(key).or_insert(Value::Null), value);
            }
        }
        (doc, patch) => *doc = patch,
    }
}

/// A small valid RayJob `ns/rj` (uid set, label `team: a`) with `extra` merged in.
pub fn rayjob(extra: Value) -> crate::api::rayjob::RayJob {
    let mut doc = serde_json::json!({
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": "rj", "namespace": "ns", "uid": "u-1", "labels": {"team": "a"}},
        "spec": {
            "entrypoint": " python -c 'print(1)' ",
            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.52.0",
                 "ports": [{"name": "dashboard", "containerPort": 8266}]}]}}}}
        }
    });
    json_merge(&mut doc, extra);
    serde_json::from_value(doc).expect("a RayJob")
}
