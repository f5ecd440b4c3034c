//! Compiles `proto/**/*.proto` with prost-build. The .proto files are parsed by protox (pure
//! Rust), so building raypipe needs no `protoc` on the machine.
//!
//! The generated types also get serde derives so graphs can be read and written as YAML/JSON
//! (and handed to the Python runtime as JSON). The attributes are chosen per message and per
//! field from the descriptors, so a new .proto field gets the right serde treatment without
//! touching this file:
//! - messages: `default` + `deny_unknown_fields` (a typo in a graph is an error, never ignored);
//! - fields at their default value are not written;
//! - enum fields are written as their short name (`ANY`, not `1`);
//! - oneofs are written as one snake_case key;
//! - a JSON value field written as `null` is set (to null), not absent;
//! - a few types have hand-written serde in `src/graph/serde_support.rs` (JSON values, Node).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Messages whose serde impls are written by hand: natural JSON values; oneofs as one plain key
/// (`model: {...}`, `compare: {...}`) in YAML as in JSON, where serde_yaml would otherwise use
/// YAML tags (`!compare`) for enums, while unknown keys stay errors.
const HAND_WRITTEN_SERDE: &[&str] = &["JsonValue", "JsonList", "JsonObject", "Node", "Predicate"];
/// Messages that are a thin wrapper around their only field in text form.
const TRANSPARENT: &[&str] = &["PredicateList"];

const TYPE_ENUM: i32 = 14;
const LABEL_REPEATED: i32 = 3;

fn collect_protos(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_protos(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

/// `JoinMode` -> `join_mode`: the module in `crate::graph::serde_support::enums` for that enum.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Writes `runtime_files.rs`: the graph runtime's Python files (`runtime/raypipe_runtime`),
/// embedded so the operator can serve them to Ray as a zip (`src/pypackage.rs`).
fn embed_runtime() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new("runtime/raypipe_runtime");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "py"));
    files.sort();
    let mut out = String::from("&[\n");
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("file name")?;
        // Relative to the crate's own directory when it is compiled, not an absolute path
        // fixed here: a target directory shared by two checkouts may reuse this output.
        out.push_str(&format!(
            "    ({name:?}, include_bytes!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/{}/{name}\")) as &[u8]),\n",
            dir.display()
        ));
    }
    out.push(']');
    let target = PathBuf::from(std::env::var("OUT_DIR")?).join("runtime_files.rs");
    std::fs::write(target, out)?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    embed_runtime()?;
    println!("cargo:rerun-if-changed=proto");
    let mut protos = Vec::new();
    collect_protos(Path::new("proto"), &mut protos)?;
    protos.sort();
    let descriptors = protox::compile(&protos, ["proto"])?;

    let mut config = prost_build::Config::new();
    // Sorted maps: deterministic protobuf encoding (stable digests) and deterministic YAML.
    config.btree_map(["."]);
    // Large optional parts live on the heap, so a node or an edge that does not set them stays
    // small (a 100,000-node graph moves far fewer bytes while decoding).
    config.boxed(".raypipe.v1.ModelNode.deployment");
    config.boxed(".raypipe.v1.Edge.when");
    config.boxed(".raypipe.v1.Edge.tensors");

    for file in &descriptors.file {
        let package = file.package.clone().unwrap_or_default();
        let enums: BTreeSet<String> = file
            .enum_type
            .iter()
            .map(|e| format!(".{package}.{}", e.name.clone().unwrap_or_default()))
            .collect();
        for message in &file.message_type {
            let name = message.name.clone().unwrap_or_default();
            if HAND_WRITTEN_SERDE.contains(&name.as_str()) {
                continue;
            }
            let path = format!(".{package}.{name}");
            let transparent = TRANSPARENT.contains(&name.as_str());
            // message_attribute (not type_attribute): it does not leak onto the oneof enums,
            // which prost-build would otherwise match by path prefix.
            config.message_attribute(&path, "#[derive(serde::Serialize, serde::Deserialize)]");
            config.message_attribute(
                &path,
                if transparent {
                    "#[serde(transparent)]"
                } else {
                    "#[serde(default, deny_unknown_fields)]"
                },
            );
            for (index, oneof) in message.oneof_decl.iter().enumerate() {
                let synthetic = message.field.iter().any(|f| {
                    f.oneof_index == Some(index as i32) && f.proto3_optional == Some(true)
                });
                if synthetic {
                    continue;
                }
                let oneof_path = format!("{path}.{}", oneof.name.clone().unwrap_or_default());
                config.enum_attribute(
                    &oneof_path,
                    "#[derive(serde::Serialize, serde::Deserialize)]\n#[serde(rename_all = \"snake_case\")]",
                );
            }
            for field in &message.field {
                let in_real_oneof =
                    field.oneof_index.is_some() && field.proto3_optional != Some(true);
                if in_real_oneof {
                    continue;
                }
                let field_path = format!("{path}.{}", field.name.clone().unwrap_or_default());
                if field.r#type == Some(TYPE_ENUM) {
                    let type_name = field.type_name.clone().unwrap_or_default();
                    if !enums.contains(&type_name) {
                        return Err(format!(
                            "enum {type_name} of {field_path} is not in package {package}"
                        )
                        .into());
                    }
                    let short = type_name.rsplit('.').next().unwrap_or_default();
                    let module = snake_case(short);
                    let with = if field.label == Some(LABEL_REPEATED) {
                        format!("crate::graph::serde_support::enums::{module}::list")
                    } else {
                        format!("crate::graph::serde_support::enums::{module}")
                    };
                    config.field_attribute(&field_path, format!("#[serde(with = \"{with}\")]"));
                }
                let json_value = format!(".{package}.JsonValue");
                let singular = field.label != Some(LABEL_REPEATED);
                if singular && field.type_name.as_deref() == Some(json_value.as_str()) {
                    // `if_missing: null` means "write null", not "unset".
                    config.field_attribute(
                        &field_path,
                        "#[serde(deserialize_with = \"crate::graph::serde_support::present_json\")]",
                    );
                }
                if !transparent {
                    config.field_attribute(
                        &field_path,
                        "#[serde(skip_serializing_if = \"crate::graph::serde_support::is_default\")]",
                    );
                }
            }
        }
    }
    config.compile_fds(descriptors)?;
    Ok(())
}
