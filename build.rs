//! Compiles `proto/**/*.proto` with prost-build. The .proto files are parsed by protox (pure
//! Rust), so building raypipe needs no `protoc` on the machine.

use std::path::{Path, PathBuf};

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut protos = Vec::new();
    collect_protos(Path::new("proto"), &mut protos)?;
    protos.sort();
    let descriptors = protox::compile(&protos, ["proto"])?;
    prost_build::Config::new()
        // serde derives let `raypipe dag` read and write graphs as YAML/JSON with proto field names.
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .type_attribute(".", "#[serde(rename_all = \"snake_case\", default)]")
        .compile_fds(descriptors)?;
    Ok(())
}
