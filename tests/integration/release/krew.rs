//! The plugin's krew package (`deploy/krew/package.sh`): archives krew can install, a manifest
//! whose checksums match them, the same bytes on a second run, and a binary that is the plugin
//! under the name krew gives it.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn package(out: &Path, binary: &Path) {
    let status = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/krew/package.sh"))
        .arg(out)
        .arg("https://releases.example/raypipe/v0/")
        .arg(format!("{}:amd64", binary.display()))
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .status()
        .expect("package.sh runs");
    assert!(status.success());
}

fn sha256_of(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn the_krew_package_installs_the_binary_as_the_plugin_and_is_reproducible() {
    let binary = Path::new(env!("CARGO_BIN_EXE_raypipe"));
    let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    package(first.path(), binary);
    package(second.path(), binary);
    let manifest: Value = serde_yaml::from_str(
        &std::fs::read_to_string(first.path().join("raypipe.yaml")).expect("the manifest"),
    )
    .expect("the manifest is YAML");
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "raypipe");
    assert_eq!(
        manifest["spec"]["version"],
        format!("v{}", env!("CARGO_PKG_VERSION"))
    );
    let platform = &manifest["spec"]["platforms"][0];
    assert_eq!(platform["bin"], "kubectl-raypipe");
    assert_eq!(platform["selector"]["matchLabels"]["arch"], "amd64");
    let name = format!(
        "kubectl-raypipe_{}_linux_amd64.tar.gz",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        platform["uri"],
        format!("https://releases.example/raypipe/v0/{name}")
    );
    let archive = first.path().join(&name);
    assert_eq!(
        platform["sha256"],
        sha256_of(&archive),
        "the manifest's checksum"
    );
    assert_eq!(
        sha256_of(&archive),
        sha256_of(&second.path().join(&name)),
        "the same binary gives the same archive"
    );
    // Unpacked as krew does, the binary answers as `kubectl raypipe`.
    let unpacked = tempfile::tempdir().unwrap();
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(unpacked.path())
        .status()
        .unwrap();
    assert!(status.success());
    let help = Command::new(unpacked.path().join("kubectl-raypipe"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success(), "{help:?}");
    assert!(text.contains("Usage: kubectl raypipe"), "{text}");
    for verb in ["get", "graph", "rollout"] {
        assert!(text.contains(verb), "{verb} in {text}");
    }
}
