//! Finding the control-plane binaries, following the ecosystem's order: explicit paths, then
//! `KUBEBUILDER_ASSETS` (what setup-envtest fills), then raypipe's version-keyed cache, and only
//! then a build from the Go modules by the embedded `provision.sh`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::TestEnvError;

/// The provisioning script, embedded so `raypipe dev` works from any directory.
pub const PROVISION_SCRIPT: &str = include_str!("provision.sh");

/// Versions the script builds; part of the cache key.
pub const KUBE_VERSION: &str = "1.36.3";
pub const ETCD_VERSION: &str = "3.6.16";
pub const KWOK_VERSION: &str = "0.8.0";

/// Paths of the binaries one control plane runs.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: Option<PathBuf>,
    pub kube_scheduler: Option<PathBuf>,
    pub kubectl: Option<PathBuf>,
    pub kwok: Option<PathBuf>,
    /// Directory of kwok Stage configs (node initialise/heartbeat, pod ready/complete/delete).
    pub kwok_stages: Option<PathBuf>,
}

/// raypipe's cache root: `$RAYPIPE_CACHE_DIR`, else `$XDG_CACHE_HOME/raypipe`, else `~/.cache/raypipe`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("RAYPIPE_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("raypipe");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("raypipe")
}

/// The version-keyed directory `provision.sh` fills.
pub fn cache_dir() -> PathBuf {
    cache_root().join("k8s").join(format!(
        "v{KUBE_VERSION}-etcd{ETCD_VERSION}-kwok{KWOK_VERSION}"
    ))
}

fn optional(dir: &Path, name: &str) -> Option<PathBuf> {
    let p = dir.join(name);
    p.is_file().then_some(p)
}

fn from_dir(dir: &Path) -> Option<Binaries> {
    let etcd = optional(dir, "etcd")?;
    let kube_apiserver = optional(dir, "kube-apiserver")?;
    let stages = dir.join("kwok-stages");
    Some(Binaries {
        etcd,
        kube_apiserver,
        kube_controller_manager: optional(dir, "kube-controller-manager"),
        kube_scheduler: optional(dir, "kube-scheduler"),
        kubectl: optional(dir, "kubectl"),
        kwok: optional(dir, "kwok"),
        kwok_stages: stages.is_dir().then_some(stages),
    })
}

impl Binaries {
    /// Looks the binaries up; `need_full` asks for controller-manager, scheduler and kwok too.
    /// Falls back to building them (printing progress) when nothing suitable is found.
    pub fn locate(need_full: bool) -> Result<Binaries, TestEnvError> {
        let complete = |b: &Binaries| {
            !need_full
                || (b.kube_controller_manager.is_some()
                    && b.kube_scheduler.is_some()
                    && b.kwok.is_some()
                    && b.kwok_stages.is_some())
        };
        // 1. Explicit paths (the names envtest uses), then a raypipe-specific directory.
        if let (Some(api), Some(etcd)) = (
            std::env::var_os("TEST_ASSET_KUBE_APISERVER"),
            std::env::var_os("TEST_ASSET_ETCD"),
        ) {
            let b = Binaries {
                etcd: etcd.into(),
                kube_apiserver: api.into(),
                kube_controller_manager: std::env::var_os("TEST_ASSET_KUBE_CONTROLLER_MANAGER")
                    .map(Into::into),
                kube_scheduler: std::env::var_os("TEST_ASSET_KUBE_SCHEDULER").map(Into::into),
                kubectl: std::env::var_os("TEST_ASSET_KUBECTL").map(Into::into),
                kwok: std::env::var_os("TEST_ASSET_KWOK").map(Into::into),
                kwok_stages: std::env::var_os("TEST_ASSET_KWOK_STAGES").map(Into::into),
            };
            if complete(&b) {
                return Ok(b);
            }
        }
        for var in ["RAYPIPE_K8S_BIN_DIR", "KUBEBUILDER_ASSETS"] {
            if let Some(dir) = std::env::var_os(var)
                && let Some(b) = from_dir(Path::new(&dir))
                && complete(&b)
            {
                return Ok(b);
            }
        }
        // 2. The version-keyed cache; `provision.sh` is idempotent and cheap when it is warm,
        //    and it re-checks versions, so always run it there.
        let dir = cache_dir();
        if let Some(b) = from_dir(&dir)
            && complete(&b)
            && b.kwok_stages.is_some()
        {
            return Ok(b);
        }
        provision(&dir)?;
        from_dir(&dir).filter(complete).ok_or_else(|| {
            TestEnvError::Provision(format!(
                "{} is incomplete after provisioning",
                dir.display()
            ))
        })
    }
}

/// Runs the embedded provisioning script into `dir`, streaming its progress to stderr.
pub fn provision(dir: &Path) -> Result<(), TestEnvError> {
    eprintln!(
        "raypipe: building the Kubernetes control plane (v{KUBE_VERSION}, etcd v{ETCD_VERSION}, kwok v{KWOK_VERSION}) into {} — the first time takes ~10-30 minutes, later runs reuse it",
        dir.display()
    );
    run_embedded_script(
        "provision.sh",
        PROVISION_SCRIPT,
        dir,
        &[
            ("KUBE_VERSION", KUBE_VERSION),
            ("ETCD_VERSION", ETCD_VERSION),
            ("KWOK_VERSION", KWOK_VERSION),
        ],
    )
}

/// Runs a script embedded in the binary with `bash -c`, with `target` as its one argument and
/// raypipe's cache root in `RAYPIPE_CACHE_DIR`; its progress goes to stderr.
pub fn run_embedded_script(
    name: &str,
    script: &str,
    target: &Path,
    env: &[(&str, &str)],
) -> Result<(), TestEnvError> {
    let status = Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg(name)
        .arg(target)
        .envs(env.iter().copied())
        .env("RAYPIPE_CACHE_DIR", cache_root())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| TestEnvError::Provision(format!("cannot run bash: {e}")))?;
    if !status.success() {
        return Err(TestEnvError::Provision(format!(
            "{name} failed ({status}); see its output above"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod script_tests {
    use super::*;

    #[test]
    fn embedded_scripts_get_their_argument_environment_and_exit_status() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = r#"test -d "$1" && [ -n "$RAYPIPE_CACHE_DIR" ] && [ "$GREETING" = hello ]"#;
        run_embedded_script("check.sh", script, dir.path(), &[("GREETING", "hello")])
            .expect("the script succeeds");
        let err = run_embedded_script("check.sh", script, dir.path(), &[("GREETING", "bye")])
            .expect_err("the script fails");
        assert!(err.to_string().contains("check.sh failed"), "{err}");
    }
}
