//! `helm template` of the chart for the tests of its optional parts (user roles, alerts).
//!
//! helm is found as `deploy.rs` finds it — `$RAYPIPE_HELM`, a `helm` on `PATH`, else the
//! version-keyed cache `<raypipe cache>/helm/<version>/helm`, built there from its Go module on
//! first use — so both share one cached binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

/// The helm release built into the cache (the same as `deploy.rs`'s).
pub const HELM_VERSION: &str = "v3.22.0";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `helm` binary, built on first use when none is installed.
pub fn binary() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        if let Some(path) = std::env::var_os("RAYPIPE_HELM") {
            return PathBuf::from(path);
        }
        if Command::new("helm")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return PathBuf::from("helm");
        }
        let dir = raypipe::devenv::binaries::cache_root()
            .join("helm")
            .join(HELM_VERSION);
        let binary = dir.join("helm");
        if binary.exists() {
            return binary;
        }
        eprintln!(
            "building helm {HELM_VERSION} into {} (once per machine) …",
            dir.display()
        );
        std::fs::create_dir_all(&dir).expect("create the helm cache directory");
        // `go install` moves the finished binary into GOBIN in one rename, so a concurrent
        // build of the same version by another test cannot leave a half-written file.
        let output = Command::new("go")
            .args([
                "install",
                "-trimpath",
                "-ldflags=-s",
                &format!("helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"),
            ])
            .env("GOBIN", &dir)
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0")
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap_or_else(|e| {
                panic!("helm is not installed and `go` cannot run ({e}); set RAYPIPE_HELM")
            });
        assert!(
            output.status.success() && binary.exists(),
            "building helm failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        binary
    })
}

/// `helm template RELEASE deploy/raypipe --namespace NAMESPACE --set VALUE…` as JSON documents.
pub fn template(release: &str, namespace: &str, values: &[&str]) -> Vec<Value> {
    let mut command = Command::new(binary());
    command
        .args(["template", release])
        .arg(repo().join("deploy/raypipe"))
        .args(["--namespace", namespace]);
    for value in values {
        command.args(["--set", value]);
    }
    let output = command.output().expect("run helm");
    assert!(
        output.status.success(),
        "helm template failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    raypipe::api::yaml::documents(&String::from_utf8_lossy(&output.stdout))
        .expect("helm renders YAML")
}

/// The rendered documents of `kind`.
pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}
