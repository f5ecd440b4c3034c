//! Command-line tools the release tests run, each found or provisioned once per machine into
//! raypipe's cache (`RAYPIPE_CACHE_DIR`, default `~/.cache/raypipe`), like the control-plane
//! binaries: `helm`, `oras`, `cosign`, `versitygw`, Kueue and the AppWrapper controller built
//! from their Go modules, `runc` from Debian's package.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

const HELM_VERSION: &str = "v3.22.0";
pub const ORAS_VERSION: &str = "v1.3.6";
pub const COSIGN_VERSION: &str = "v3.1.3";
pub const VERSITYGW_VERSION: &str = "v1.8.0";
/// The Kueue release the Kueue scenario tests run against (its CRDs, webhook manifests and
/// manager all come from this module version).
pub const KUEUE_VERSION: &str = "v0.17.0";
/// The AppWrapper controller the AppWrapper scenario tests run (the version Kueue
/// [`KUEUE_VERSION`] is built against; its CRD comes from the same module version).
pub const APPWRAPPER_VERSION: &str = "v1.2.0";
/// The AppWrapper module.
pub const APPWRAPPER_MODULE: &str = "github.com/project-codeflare/appwrapper";
/// The KubeRay release whose `kubectl ray` plugin the kubectl-ray tests run (see
/// [`kubectl_ray`]).
pub const KUBECTL_RAY_VERSION: &str = "v1.7.0";

/// One provisioning at a time in this process (two tests asking for the same tool build once).
fn provisioning() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// `$override`, else `name` on `PATH` when `probe` succeeds there, else the version-keyed cache
/// (`<raypipe cache>/<name>/<version>/<name>`), else `go install module@version` into it with the
/// ordinary `go` client (`GOTOOLCHAIN=local CGO_ENABLED=0`; the first run on a machine takes
/// minutes). Built into a directory of its own and renamed into place, so a concurrent test
/// binary never finds half a binary.
fn go_tool(name: &str, override_var: &str, probe: &[&str], module: &str, version: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(override_var) {
        return PathBuf::from(path);
    }
    if !probe.is_empty()
        && Command::new(name)
            .args(probe)
            .output()
            .is_ok_and(|o| o.status.success())
    {
        return PathBuf::from(name);
    }
    cached_go_build(name, override_var, version, |staging| {
        let output = Command::new("go")
            .args(["install", "-trimpath", "-ldflags=-s -w"])
            .arg(format!("{module}@{version}"))
            .env("GOBIN", staging)
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0")
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap_or_else(|e| {
                panic!("{name} is not cached and `go` cannot run ({e}); set {override_var}")
            });
        assert!(
            output.status.success(),
            "building {name} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        staging.join(name)
    })
}

/// A Go tool whose main package is `package` (relative to its module's root, e.g. `./cmd`):
/// `$override`, else the version-keyed cache (`<raypipe cache>/<name>/<version>/<name>`), else
/// built with `go build` in the module's own directory (`go mod download`, the module cache),
/// so with exactly the dependencies its `go.mod` pins, as `go install module@version` would.
/// For modules whose main package `go install` would name after its directory (`cmd`), and
/// which `go install` cannot resolve where the module proxy refuses their version list.
fn go_module_tool(
    name: &str,
    override_var: &str,
    module: &str,
    package: &str,
    version: &str,
) -> PathBuf {
    if let Some(path) = std::env::var_os(override_var) {
        return PathBuf::from(path);
    }
    cached_go_build(name, override_var, version, |staging| {
        let module_dir = go_module_dir(module, version).unwrap_or_else(|e| {
            panic!("{name} is not cached and its module is not at hand ({e}); set {override_var}")
        });
        let built = staging.join(name);
        let output = Command::new("go")
            .args(["build", "-trimpath", "-ldflags=-s -w", "-o"])
            .arg(&built)
            .arg(package)
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0")
            .env("GOFLAGS", "-mod=readonly -buildvcs=false")
            .current_dir(&module_dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("{name} is not cached and `go` cannot run ({e}); set {override_var}")
            });
        assert!(
            output.status.success(),
            "building {name} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        built
    })
}

/// The directory of Go module `module@version` in the module cache (`go mod download`: once
/// per machine, through the ordinary module proxy).
pub fn go_module_dir(module: &str, version: &str) -> Result<PathBuf, String> {
    let output = Command::new("go")
        .args(["mod", "download", "-json"])
        .arg(format!("{module}@{version}"))
        .env("GOTOOLCHAIN", "local")
        .current_dir(std::env::temp_dir())
        .output()
        .map_err(|e| format!("`go mod download` cannot run: {e}"))?;
    let info: serde_json::Value = serde_json::from_slice(&output.stdout).map_err(|e| {
        format!(
            "`go mod download -json` printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    match info["Dir"].as_str() {
        Some(dir) if output.status.success() => Ok(PathBuf::from(dir)),
        _ => Err(format!("downloading {module}@{version} failed: {info}")),
    }
}

/// `<raypipe cache>/<name>/<version>/<name>`, built there once by `build` (which gets a
/// staging directory and returns the binary it built in it) and renamed into place, so a
/// concurrent test binary never finds half a binary.
fn cached_go_build(
    name: &str,
    override_var: &str,
    version: &str,
    build: impl FnOnce(&Path) -> PathBuf,
) -> PathBuf {
    let _guard = provisioning();
    let dir = raypipe::devenv::binaries::cache_root()
        .join(name)
        .join(version);
    let binary = dir.join(name);
    if binary.is_file() {
        return binary;
    }
    std::fs::create_dir_all(&dir).expect("create the tool's cache directory");
    let staging = tempfile::tempdir_in(&dir).expect("a staging directory");
    eprintln!(
        "building {name} {version} into {} (once per machine) …",
        dir.display()
    );
    let started = std::time::Instant::now();
    let built = build(staging.path());
    std::fs::rename(&built, &binary)
        .unwrap_or_else(|e| panic!("move {name} into the cache ({e}); or set {override_var}"));
    eprintln!("built {name} {version} in {}s", started.elapsed().as_secs());
    binary
}

/// `helm` v3: `$RAYPIPE_HELM`, `helm` on `PATH`, or built from `helm.sh/helm/v3`.
pub fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        go_tool(
            "helm",
            "RAYPIPE_HELM",
            &["version"],
            "helm.sh/helm/v3/cmd/helm",
            HELM_VERSION,
        )
    })
}

/// `oras`: `$RAYPIPE_ORAS`, or built from `oras.land/oras` (its pinned version: the interop
/// tests depend on its flags).
pub fn oras() -> &'static Path {
    static ORAS: OnceLock<PathBuf> = OnceLock::new();
    ORAS.get_or_init(|| {
        go_tool(
            "oras",
            "RAYPIPE_ORAS",
            &[],
            "oras.land/oras/cmd/oras",
            ORAS_VERSION,
        )
    })
}

/// cosign, which writes sigstore bundles (OCI 1.1 referrers) by default since v3:
/// `$RAYPIPE_COSIGN`, or built from `github.com/sigstore/cosign/v3` (never a `cosign` on
/// `PATH`: the tests depend on its version's defaults).
pub fn cosign() -> &'static Path {
    static COSIGN: OnceLock<PathBuf> = OnceLock::new();
    COSIGN.get_or_init(|| {
        go_tool(
            "cosign",
            "RAYPIPE_COSIGN",
            &[],
            "github.com/sigstore/cosign/v3/cmd/cosign",
            COSIGN_VERSION,
        )
    })
}

/// Versity S3 Gateway, the S3-compatible server of the `s3://` code tests:
/// `$RAYPIPE_VERSITYGW`, or built from `github.com/versity/versitygw` (never one on `PATH`: the
/// tests depend on its flags).
pub fn versitygw() -> &'static Path {
    static VERSITYGW: OnceLock<PathBuf> = OnceLock::new();
    VERSITYGW.get_or_init(|| {
        go_tool(
            "versitygw",
            "RAYPIPE_VERSITYGW",
            &[],
            "github.com/versity/versitygw/cmd/versitygw",
            VERSITYGW_VERSION,
        )
    })
}

/// Kueue's manager: `$RAYPIPE_KUEUE`, or built from `sigs.k8s.io/kueue` (never one on `PATH`:
/// its CRDs and webhook manifests are read from the same module version, see `support::kueue`).
pub fn kueue() -> &'static Path {
    static KUEUE: OnceLock<PathBuf> = OnceLock::new();
    KUEUE.get_or_init(|| {
        go_tool(
            "kueue",
            "RAYPIPE_KUEUE",
            &[],
            "sigs.k8s.io/kueue/cmd/kueue",
            KUEUE_VERSION,
        )
    })
}

/// The AppWrapper controller (project-codeflare/appwrapper): `$RAYPIPE_APPWRAPPER`, or built
/// from its module's `./cmd` (never one on `PATH`: its CRD is read from the same module
/// version, see `support::kueue`).
pub fn appwrapper() -> &'static Path {
    static APPWRAPPER: OnceLock<PathBuf> = OnceLock::new();
    APPWRAPPER.get_or_init(|| {
        go_module_tool(
            "appwrapper",
            "RAYPIPE_APPWRAPPER",
            APPWRAPPER_MODULE,
            "./cmd",
            APPWRAPPER_VERSION,
        )
    })
}

/// KubeRay's `kubectl ray` plugin of [`KUBECTL_RAY_VERSION`]: `$RAYPIPE_KUBECTL_RAY`, else
/// `<raypipe cache>/kubectl-ray/<version>/kubectl-ray` when one was put there; `None` otherwise
/// (never one on `PATH`: the tests pin its output). Unlike the tools above it cannot be built
/// from a Go module: since KubeRay v1.4 the plugin is a package of KubeRay's root module
/// (`github.com/ray-project/kuberay`; no `kubectl-plugin` module of its own is tagged), whose
/// `replace … => ./ray-operator` makes `go install module@version` refuse it, and the module
/// proxy this project's machines reach serves none of those modules' versions.
pub fn kubectl_ray() -> Option<&'static Path> {
    static KUBECTL_RAY: OnceLock<Option<PathBuf>> = OnceLock::new();
    KUBECTL_RAY
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("RAYPIPE_KUBECTL_RAY") {
                return Some(PathBuf::from(path));
            }
            let cached = raypipe::devenv::binaries::cache_root()
                .join("kubectl-ray")
                .join(KUBECTL_RAY_VERSION)
                .join("kubectl-ray");
            cached.is_file().then_some(cached)
        })
        .as_deref()
}

/// `runc`: `$RAYPIPE_RUNC`, `runc` on `PATH`, or Debian's package (it needs only libseccomp,
/// which every Debian system has).
pub fn runc() -> &'static Path {
    static RUNC: OnceLock<PathBuf> = OnceLock::new();
    RUNC.get_or_init(|| {
        if let Some(path) = std::env::var_os("RAYPIPE_RUNC") {
            return PathBuf::from(path);
        }
        if Command::new("runc")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return PathBuf::from("runc");
        }
        debian_binary("runc", "usr/sbin/runc")
    })
}

/// `qemu-aarch64-static` from Debian's `qemu-user-static` (a static binary): runs the arm64
/// image's own loader and binary on this amd64 machine.
pub fn qemu_aarch64() -> &'static Path {
    static QEMU: OnceLock<PathBuf> = OnceLock::new();
    QEMU.get_or_init(|| debian_binary("qemu-user-static", "usr/bin/qemu-aarch64-static"))
}

/// `path` from Debian's `package`, fetched with `apt-get download` and unpacked into
/// `<raypipe cache>/<package>/` once per machine: nothing is installed on the machine.
fn debian_binary(package: &str, path: &str) -> PathBuf {
    let _guard = provisioning();
    let dir = raypipe::devenv::binaries::cache_root().join(package);
    let binary = dir.join(path);
    if binary.exists() {
        return binary;
    }
    let download = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new("apt-get")
        .args(["download", package])
        .current_dir(download.path())
        .output()
        .unwrap_or_else(|e| panic!("apt-get runs (Debian's {package} is fetched once): {e}"));
    assert!(
        output.status.success(),
        "apt-get download {package} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let deb = std::fs::read_dir(download.path())
        .expect("the download directory")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .unwrap_or_else(|| panic!("apt-get downloaded {package}'s .deb"));
    // Only the one file: Debian's qemu-user-static unpacks to ~380 MB otherwise.
    let unpacked =
        tempfile::tempdir_in(raypipe::devenv::binaries::cache_root()).expect("a staging directory");
    let status = Command::new("sh")
        .arg("-c")
        .arg("dpkg-deb --fsys-tarfile \"$1\" | tar -x -C \"$2\" \"./$3\"")
        .args(["sh"])
        .arg(&deb)
        .arg(unpacked.path())
        .arg(path)
        .status()
        .expect("dpkg-deb and tar run");
    assert!(status.success(), "unpacking {path} from {deb:?}");
    std::fs::create_dir_all(binary.parent().expect("a parent")).expect("the cache directory");
    std::fs::rename(unpacked.path().join(path), &binary).expect("move the binary into the cache");
    binary
}

/// Runs `command`, panicking with its output when it fails; returns its standard output.
pub fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?} did not start: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// scikit-learn for training the digits sample at push time (`samples/digits/train.py`), in a
/// virtualenv of its own: the Ray venv stays without it, since the served models need only
/// numpy (which Ray brings).
pub const SCIKIT_LEARN_VERSION: &str = "1.7.2";

/// A Python with scikit-learn: `RAYPIPE_SKLEARN_PYTHON`, else the cached venv
/// (`<raypipe cache>/sklearn/<version>/`), else one created there with `python3 -m venv` and pip
/// from PyPI (17 s cold here), staged and renamed into place.
pub fn sklearn_python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        if let Some(path) = std::env::var_os("RAYPIPE_SKLEARN_PYTHON") {
            return PathBuf::from(path);
        }
        let _guard = provisioning();
        let dir = raypipe::devenv::binaries::cache_root()
            .join("sklearn")
            .join(SCIKIT_LEARN_VERSION);
        let python = dir.join("venv/bin/python");
        if python.is_file() {
            return python;
        }
        std::fs::create_dir_all(&dir).expect("create the venv's cache directory");
        let staging = tempfile::tempdir_in(&dir).expect("a staging directory");
        // A venv's scripts name its own path: build it where it will live, under a staging name.
        let venv = staging.path().join("venv");
        eprintln!(
            "creating a scikit-learn venv in {} (once per machine) …",
            dir.display()
        );
        let started = std::time::Instant::now();
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv));
        run(Command::new("nice")
            .args(["-n", "10"])
            .arg(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("scikit-learn=={SCIKIT_LEARN_VERSION}")));
        // Moved as a whole; its scripts keep the staging path, `python` itself does not care.
        std::fs::rename(&venv, dir.join("venv")).expect("move the venv into the cache");
        eprintln!(
            "scikit-learn venv ready in {}s",
            started.elapsed().as_secs()
        );
        python
    })
}
