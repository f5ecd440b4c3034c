//! Flux's health check for ServePipelines (the `healthCheckExprs` entry of
//! `deploy/flux/kustomization.yaml`), evaluated as kustomize-controller evaluates it: with
//! google/cel-go in Flux's CEL environment (`tests/tools/flux-health`, built from the Go module
//! proxy once per machine and cached by the hash of its sources, like the Argo CD evaluator).

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
        let source = repo().join("tests/tools/flux-health");
        let mut hash = Sha256::new();
        for file in ["go.mod", "go.sum", "main.go"] {
            hash.update(std::fs::read(source.join(file)).expect("the evaluator's sources"));
        }
        let key = hex::encode(&hash.finalize()[..8]);
        let binary = raypipe::devenv::binaries::cache_root()
            .join("tools")
            .join(format!("flux-health-{key}"));
        if binary.exists() {
            return binary;
        }
        std::fs::create_dir_all(binary.parent().expect("a parent")).expect("the cache dir");
        let partial = binary.with_extension("partial");
        let started = std::time::Instant::now();
        let output = Command::new("go")
            .args(["build", "-trimpath", "-o"])
            .arg(&partial)
            .arg(".")
            .current_dir(&source)
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=readonly")
            .env("CGO_ENABLED", "0")
            .output()
            .expect("`go` runs (it builds the Flux health evaluator)");
        assert!(
            output.status.success(),
            "building the Flux health evaluator failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::rename(&partial, &binary).expect("install the evaluator");
        eprintln!(
            "built the Flux health evaluator in {:.1}s (once per machine)",
            started.elapsed().as_secs_f64()
        );
        binary
    })
}

/// The ServePipeline entry of the Kustomization's `healthCheckExprs`.
pub fn expressions() -> serde_json::Value {
    let path = repo().join("deploy/flux/kustomization.yaml");
    let text = std::fs::read_to_string(&path).expect("read the Flux Kustomization");
    let kustomization: serde_json::Value =
        serde_yaml::from_str(&text).expect("the Kustomization is YAML");
    kustomization["spec"]["healthCheckExprs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["apiVersion"] == "raypipe.dev/v1alpha1" && e["kind"] == "ServePipeline")
        .cloned()
        .expect("a healthCheckExprs entry for ServePipelines")
}

/// (status, message) of the health check on `object` (a ServePipeline as JSON): `Current`,
/// `InProgress`, `Failed`, or `Unknown` when an expression cannot be evaluated (Flux keeps
/// waiting then, as for `InProgress`).
pub fn health(object: &serde_json::Value) -> (String, String) {
    let exprs = expressions();
    let input = serde_json::json!({
        "current": exprs["current"],
        "inProgress": exprs["inProgress"],
        "failed": exprs["failed"],
        "object": object,
    });
    let mut child = Command::new(evaluator())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the evaluator starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.to_string().as_bytes())
        .expect("write the input");
    let output = child.wait_with_output().expect("the evaluator ends");
    assert!(
        output.status.success(),
        "the Flux health expressions failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("the evaluator answers JSON");
    (
        answer["status"].as_str().unwrap_or_default().to_owned(),
        answer["message"].as_str().unwrap_or_default().to_owned(),
    )
}

/// What Flux says where Argo CD says `argocd` (deploy/flux/README.md's table): both checks must
/// tell a GitOps tool the same thing.
pub fn flux_status_for(argocd: &str) -> &'static str {
    match argocd {
        "Healthy" | "Suspended" => "Current",
        "Progressing" => "InProgress",
        "Degraded" => "Failed",
        other => panic!("no Flux status for Argo CD's {other:?}"),
    }
}
