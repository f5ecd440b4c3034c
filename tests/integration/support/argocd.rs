//! Argo CD's health check for ServePipelines (`deploy/argocd/servepipeline-health.lua`),
//! evaluated as Argo CD evaluates it: gopher-lua (`tests/tools/argocd-health`, built from the
//! Go module proxy once per machine and cached by the hash of its sources).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The evaluator binary, built on first use.
fn evaluator() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let source = repo().join("tests/tools/argocd-health");
        let mut hash = Sha256::new();
        for file in ["go.mod", "go.sum", "main.go"] {
            hash.update(std::fs::read(source.join(file)).expect("the evaluator's sources"));
        }
        let key = hex::encode(&hash.finalize()[..8]);
        let binary = raypipe::devenv::binaries::cache_root()
            .join("tools")
            .join(format!("argocd-health-{key}"));
        if binary.exists() {
            return binary;
        }
        std::fs::create_dir_all(binary.parent().expect("a parent")).expect("the cache dir");
        let partial = binary.with_extension("partial");
        let output = Command::new("go")
            .args(["build", "-trimpath", "-o"])
            .arg(&partial)
            .arg(".")
            .current_dir(&source)
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=readonly")
            .env("CGO_ENABLED", "0")
            .output()
            .expect("`go` runs (it builds the Argo CD health evaluator)");
        assert!(
            output.status.success(),
            "building the Argo CD health evaluator failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::rename(&partial, &binary).expect("install the evaluator");
        binary
    })
}

/// (status, message) of the health check on `object` (a ServePipeline as JSON).
pub fn health(object: &serde_json::Value) -> (String, String) {
    let script = repo().join("deploy/argocd/servepipeline-health.lua");
    let mut child = Command::new(evaluator())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the evaluator starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(object.to_string().as_bytes())
        .expect("write the object");
    let output = child.wait_with_output().expect("the evaluator ends");
    assert!(
        output.status.success(),
        "the health script failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("the evaluator answers JSON");
    (
        answer["status"].as_str().unwrap_or_default().to_owned(),
        answer["message"].as_str().unwrap_or_default().to_owned(),
    )
}
