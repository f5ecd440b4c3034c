//! The real Go command-line tools the OCI interoperability tests run: cosign and oras. Each
//! is `$RAYPIPE_<TOOL>` when set, else the version-keyed cache
//! (`<raypipe cache>/<tool>/<version>/<tool>`), else built there from its Go module with the
//! ordinary `go` client (`GOTOOLCHAIN=local CGO_ENABLED=0`), once per machine — as the
//! deploy tests do for helm and `devenv` for the control plane and the registry.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

pub const COSIGN_VERSION: &str = "v3.1.3";
pub const ORAS_VERSION: &str = "v1.3.6";

/// cosign, which writes sigstore bundles (OCI 1.1 referrers) by default since v3.
pub fn cosign() -> &'static Path {
    static COSIGN: OnceLock<PathBuf> = OnceLock::new();
    COSIGN.get_or_init(|| {
        go_tool(
            "cosign",
            "RAYPIPE_COSIGN",
            COSIGN_VERSION,
            "github.com/sigstore/cosign/v3/cmd/cosign",
        )
    })
}

/// oras, the CNCF OCI artifact client.
pub fn oras() -> &'static Path {
    static ORAS: OnceLock<PathBuf> = OnceLock::new();
    ORAS.get_or_init(|| {
        go_tool(
            "oras",
            "RAYPIPE_ORAS",
            ORAS_VERSION,
            "oras.land/oras/cmd/oras",
        )
    })
}

fn go_tool(name: &str, env: &str, version: &str, module: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    let dir = raypipe::devenv::binaries::cache_root()
        .join(name)
        .join(version);
    let binary = dir.join(name);
    if binary.is_file() {
        return binary;
    }
    std::fs::create_dir_all(&dir).expect("create the tool's cache directory");
    // Built into a directory of its own and renamed into place, so a concurrent run never
    // finds half a binary.
    let staging = tempfile::tempdir_in(&dir).expect("a staging directory");
    eprintln!(
        "building {name} {version} into {} (once per machine) …",
        dir.display()
    );
    let started = Instant::now();
    let output = Command::new("go")
        .args(["install", "-trimpath", "-ldflags=-s -w"])
        .arg(format!("{module}@{version}"))
        .env("GOBIN", staging.path())
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0")
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap_or_else(|e| panic!("{name} is not cached and `go` cannot run ({e}); set {env}"));
    assert!(
        output.status.success(),
        "building {name} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::rename(staging.path().join(name), &binary).expect("move the tool into the cache");
    eprintln!("built {name} {version} in {}s", started.elapsed().as_secs());
    binary
}
