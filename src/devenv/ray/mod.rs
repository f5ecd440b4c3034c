//! Real Ray heads on 127.0.0.1 for tests and `raypipe dev`.
//!
//! Ray comes from PyPI: a pinned `ray[serve]` in a virtualenv cached outside the repository
//! (`<raypipe cache>/ray/venv-<version>`, filled once by the embedded `provision-ray.sh`; the
//! embedded `add-storage-clients.sh` adds the pinned boto3 Ray's `s3://` downloader imports).
//! Each [`RayHead`] gets its own ports, its own short temp dir and an environment that keeps
//! every Ray process on loopback; it is stopped by the process ids it started, never with
//! `ray stop` (which stops every Ray on the machine). A head may bring extra worker nodes
//! (more `ray start` processes on the same machine joining its GCS), for Serve configs that
//! spread replicas over nodes (`max_replicas_per_node`).
//!
//! This file holds the virtualenv provisioning and the head's types; the stages live in
//! `head` (start, wait until ready, worker nodes, inspect, stop), `command` (each node's
//! command line and environment), `ports` (picking loopback ports and worker port ranges)
//! and `processes` (the run directory and finding, identifying and killing a head's
//! processes by `/proc`).

mod command;
mod head;
pub mod ports;
mod processes;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once, PoisonError};
use std::time::Duration;

use crate::devenv::DevEnvError;
use crate::devenv::binaries::cache_root;
use crate::devenv::process::ManagedProcess;

use crate::ray::{BearerToken, DashboardUrl};

use ports::{RayHeadPorts, RayWorkerNodePorts};

/// The `ray[serve]` version tests and `raypipe dev` run by default: the newest the support
/// matrix claims (the one the reference notes were verified against).
pub const RAY_VERSION: &str = "2.60.0";

/// The oldest `ray[serve]` the support matrix claims: what raypipe's samples run
/// (`rayproject/ray:2.52.0`). The runtime's tests and the dashboard client's tests run on it too.
pub const RAY_VERSION_OLDEST: &str = "2.52.0";

/// A pinned Ray release with a venv of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RayRelease {
    pub version: &'static str,
    /// pip constraints for dependencies whose later releases broke this Ray (its own
    /// requirements leave them open), so the venv resembles the release's image.
    pub constraints: &'static [&'static str],
}

/// Every Ray release a venv can be provisioned for.
pub const RAY_RELEASES: &[RayRelease] = &[
    RayRelease {
        version: RAY_VERSION,
        constraints: &[],
    },
    RayRelease {
        version: RAY_VERSION_OLDEST,
        // protobuf 7 removed `FieldDescriptor.label`, which Serve 2.52 reads when it deploys an
        // application (AttributeError on every deploy); Ray 2.52 asks only for >=3.20.3.
        constraints: &["protobuf<7"],
    },
];

/// The `pytest` the venv also gets, for the graph runtime's tests (`runtime/tests`).
pub const PYTEST_VERSION: &str = "9.2.0";

/// The `ruff` (lint and format check) the venv also gets, for the graph runtime
/// (`runtime/pyproject.toml`; `.ci/run` runs it).
pub const RUFF_VERSION: &str = "0.17.5";

/// The `mypy` the venv also gets, for the graph runtime; beside Ray, so it reads Ray's own
/// annotations.
pub const MYPY_VERSION: &str = "2.4.1";

/// The test tools every venv gets, as its marker names them.
fn test_tools() -> String {
    format!("pytest=={PYTEST_VERSION} ruff=={RUFF_VERSION} mypy=={MYPY_VERSION}")
}

/// The `boto3` every venv also gets: Ray's own downloader imports it (with smart_open, which
/// `ray[serve]` brings) to fetch `s3://` URIs in a runtime_env (`working_dir`, `py_modules`).
/// Added in place by [`ADD_STORAGE_CLIENTS_SCRIPT`] under a marker of its own
/// ([`STORAGE_CLIENTS_MARKER`]), so a venv otherwise up to date is not rebuilt for it.
pub const BOTO3_VERSION: &str = "1.44.8";

/// The provisioning script, embedded so it works from any directory.
pub const PROVISION_RAY_SCRIPT: &str = include_str!("provision-ray.sh");

/// Adds [`BOTO3_VERSION`] to a provisioned venv (embedded like [`PROVISION_RAY_SCRIPT`]).
pub const ADD_STORAGE_CLIENTS_SCRIPT: &str = include_str!("add-storage-clients.sh");

/// The file in a venv naming the storage clients it holds (`boto3==V`).
const STORAGE_CLIENTS_MARKER: &str = ".raypipe-storage-clients";

/// Path of a `ray` executable to use instead of the cached virtualenv of [`RAY_VERSION`]
/// (other versions always come from their own cached venv).
pub const RAY_BIN_ENV: &str = "RAYPIPE_RAY_BIN";

/// Only loopback, for every listener and every advertised address.
const LOOPBACK: &str = "127.0.0.1";

/// The virtualenv `provision-ray.sh` fills for [`RAY_VERSION`].
pub fn venv_dir() -> PathBuf {
    venv_dir_for(RAY_VERSION)
}

/// The virtualenv of one Ray version: `<raypipe cache>/ray/venv-<version>`.
pub fn venv_dir_for(version: &str) -> PathBuf {
    cache_root().join("ray").join(format!("venv-{version}"))
}

/// The release entry of `version`, if raypipe pins it.
pub fn ray_release(version: &str) -> Option<RayRelease> {
    RAY_RELEASES.iter().copied().find(|r| r.version == version)
}

/// The `ray` executable of [`RAY_VERSION`]: `$RAYPIPE_RAY_BIN`, else the cached virtualenv,
/// provisioned on first use (blocking; about a minute cold, instant when warm).
pub fn locate_ray() -> Result<PathBuf, DevEnvError> {
    locate_ray_version(RAY_VERSION)
}

/// The `ray` executable of one of [`RAY_RELEASES`], from its cached virtualenv (provisioned on
/// first use); `$RAYPIPE_RAY_BIN` stands in for [`RAY_VERSION`] only.
pub fn locate_ray_version(version: &str) -> Result<PathBuf, DevEnvError> {
    let release = ray_release(version).ok_or_else(|| {
        DevEnvError::Provision(format!(
            "Ray {version} is not one of the pinned releases {:?}",
            RAY_RELEASES.iter().map(|r| r.version).collect::<Vec<_>>()
        ))
    })?;
    if version == RAY_VERSION
        && let Some(bin) = std::env::var_os(RAY_BIN_ENV)
    {
        let bin = PathBuf::from(bin);
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(DevEnvError::Provision(format!(
                "{RAY_BIN_ENV}={} is not a file",
                bin.display()
            )))
        };
    }
    let venv = venv_dir_for(version);
    let ray = venv.join("bin").join("ray");
    let marker = std::fs::read_to_string(venv.join(".raypipe-provisioned")).unwrap_or_default();
    // `bin/python` is a symlink to the interpreter the venv was made with: gone means rebuild.
    let interpreter_present = venv.join("bin").join("python").exists();
    if !(ray.is_file() && interpreter_present && marker_matches(&marker, &release)) {
        provision_ray(&release, &venv)?;
    }
    if !ray.is_file() {
        return Err(DevEnvError::Provision(format!(
            "{} is missing after provisioning",
            ray.display()
        )));
    }
    let storage = std::fs::read_to_string(venv.join(STORAGE_CLIENTS_MARKER)).unwrap_or_default();
    if !storage_clients_match(&storage) {
        add_storage_clients(&venv)?;
    }
    Ok(ray)
}

/// Whether a venv's storage-clients marker names the pinned [`BOTO3_VERSION`].
fn storage_clients_match(marker: &str) -> bool {
    marker.trim_end() == format!("boto3=={BOTO3_VERSION}")
}

/// Runs the embedded [`ADD_STORAGE_CLIENTS_SCRIPT`] on `venv` (seconds: one wheel set).
pub fn add_storage_clients(venv: &Path) -> Result<(), DevEnvError> {
    eprintln!(
        "raypipe: adding boto3=={BOTO3_VERSION} (Ray's s3:// downloader) from PyPI to {}",
        venv.display()
    );
    crate::devenv::binaries::run_embedded_script(
        "add-storage-clients.sh",
        ADD_STORAGE_CLIENTS_SCRIPT,
        venv,
        &[("BOTO3_VERSION", BOTO3_VERSION)],
    )
}

/// Whether a venv's marker (`ray[serve]==V pytest==P ruff==R mypy==M python=X[ constraints=a,b]`,
/// written by the script) names this release, its constraints and the pinned test tools.
fn marker_matches(marker: &str, release: &RayRelease) -> bool {
    let marker = marker.trim_end();
    let prefix = format!("ray[serve]=={} {} ", release.version, test_tools());
    let constraints_ok = if release.constraints.is_empty() {
        !marker.contains(" constraints=")
    } else {
        marker.ends_with(&format!(" constraints={}", release.constraints.join(",")))
    };
    marker.starts_with(&prefix) && constraints_ok
}

/// Runs the embedded provisioning script for `release` into `venv`, its progress going to
/// stderr.
pub fn provision_ray(release: &RayRelease, venv: &Path) -> Result<(), DevEnvError> {
    eprintln!(
        "raypipe: installing ray[serve]=={} and {} from PyPI into {} — the first time takes about a minute, later runs reuse it",
        release.version,
        test_tools(),
        venv.display()
    );
    let constraints = release.constraints.join(" ");
    crate::devenv::binaries::run_embedded_script(
        "provision-ray.sh",
        PROVISION_RAY_SCRIPT,
        venv,
        &[
            ("RAY_VERSION", release.version),
            ("PYTEST_VERSION", PYTEST_VERSION),
            ("RUFF_VERSION", RUFF_VERSION),
            ("MYPY_VERSION", MYPY_VERSION),
            ("RAY_CONSTRAINTS", &constraints),
        ],
    )
}

#[derive(Clone, Debug)]
pub struct RayHeadOptions {
    /// Directories put on `PYTHONPATH` of every Ray process, so Serve configs and jobs can
    /// import local test code by import path (Serve refuses local `working_dir` paths).
    pub python_path: Vec<PathBuf>,
    /// More environment for every Ray process; wins over what the head sets (so put import
    /// paths in `python_path`, not in a `PYTHONPATH` here).
    pub env: Vec<(String, String)>,
    /// Logical CPUs the head offers; `None` lets Ray count the machine's.
    pub num_cpus: Option<u32>,
    pub object_store_memory_bytes: u64,
    /// Start the head with token authentication (`RAY_AUTH_MODE=token`) and this token.
    pub auth_token: Option<BearerToken>,
    /// Until the dashboard answers for Serve and Jobs (provisioning not included), and again
    /// until the extra worker nodes have joined.
    pub startup_timeout: Duration,
    /// Which pinned Ray release the head runs (one of [`RAY_RELEASES`]).
    pub ray_version: &'static str,
    /// Extra Ray worker nodes on this machine (each its own `ray start --address=…` with its
    /// own loopback ports), started once the head is ready.
    pub worker_nodes: u32,
    /// Logical CPUs each worker node offers; `None` lets Ray count the machine's.
    pub worker_node_num_cpus: Option<u32>,
    /// Custom Ray resources the head offers (`ray start --resources`).
    pub resources: BTreeMap<String, f64>,
    /// `(host directory, path)`: the head runs in a private mount namespace (`unshare`) where
    /// each host directory is bind-mounted at its path, so job entrypoints find files where a
    /// Pod would have them mounted (e.g. a ConfigMap at `/home/ray/samples`). A path that does
    /// not exist on the host gets its mount point on an empty tmpfs laid over its nearest
    /// existing ancestor, inside that namespace only. The host is never changed.
    pub private_mounts: Vec<(PathBuf, PathBuf)>,
    /// Credentials for every Ray process (e.g. the `AWS_*` settings Ray's `s3://` downloader
    /// reads in each node's runtime-env agent): through the environment the node inherits,
    /// never a command line.
    pub credential_env: CredentialEnv,
}

/// Environment variables whose values are credentials. `Debug` names the variables only.
#[derive(Clone, Default)]
pub struct CredentialEnv(Vec<(String, String)>);

impl CredentialEnv {
    pub fn new(vars: Vec<(String, String)>) -> CredentialEnv {
        CredentialEnv(vars)
    }

    /// The variables and their values, for a process's environment.
    pub(crate) fn pairs(&self) -> Vec<(&str, &str)> {
        self.0
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect()
    }
}

impl std::fmt::Debug for CredentialEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(name, _)| (name, "<redacted>")))
            .finish()
    }
}

impl Default for RayHeadOptions {
    fn default() -> Self {
        RayHeadOptions {
            python_path: Vec::new(),
            env: Vec::new(),
            num_cpus: None,
            // Ray's default is 30 % of RAM; tests move almost nothing through the object store.
            object_store_memory_bytes: 200 * 1000 * 1000,
            auth_token: None,
            ray_version: RAY_VERSION,
            startup_timeout: Duration::from_secs(120),
            worker_nodes: 0,
            worker_node_num_cpus: None,
            resources: BTreeMap::new(),
            private_mounts: Vec::new(),
            credential_env: CredentialEnv::default(),
        }
    }
}

/// One extra worker node of a head: `ray start --address=<gcs> --block` and what it spawned.
struct WorkerNode {
    process: ManagedProcess,
    root_pid: u32,
    ports: RayWorkerNodePorts,
}

/// A running Ray head. Dropping it (or [`RayHead::stop`]) stops every process it started.
pub struct RayHead {
    dir: PathBuf,
    dashboard_url: DashboardUrl,
    ports: RayHeadPorts,
    auth_token: Option<BearerToken>,
    process: Mutex<Option<ManagedProcess>>,
    root_pid: u32,
    /// Extra worker nodes, stopped before the head.
    workers: Mutex<Vec<WorkerNode>>,
    keep_dir: bool,
    ray_version: &'static str,
}

impl std::fmt::Debug for RayHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RayHead")
            .field("dir", &self.dir)
            .field("dashboard_url", &self.dashboard_url)
            .field("ports", &self.ports)
            .field("root_pid", &self.root_pid)
            .field("ray_version", &self.ray_version)
            .field("auth_token", &self.auth_token)
            .finish()
    }
}

impl Drop for RayHead {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Stops `head` when the process exits normally. For heads kept in statics, which are never
/// dropped: a test binary's shared head would otherwise outlive the run (parts of Ray survive
/// the parent-death signal that ends `ray start`).
pub fn stop_at_exit(head: &'static RayHead) {
    static REGISTER: Once = Once::new();
    HEADS_TO_STOP_AT_EXIT
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(head);
    REGISTER.call_once(|| {
        // SAFETY: registers a plain function; it only signals processes and removes files.
        unsafe {
            libc::atexit(stop_heads_at_exit);
        }
    });
}

static HEADS_TO_STOP_AT_EXIT: Mutex<Vec<&'static RayHead>> = Mutex::new(Vec::new());

extern "C" fn stop_heads_at_exit() {
    let heads: Vec<&'static RayHead> = std::mem::take(
        &mut *HEADS_TO_STOP_AT_EXIT
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    for head in heads {
        head.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_venv_is_reused_only_for_its_own_release_constraints_and_test_tools() {
        let newest = ray_release(RAY_VERSION).expect("the default is pinned");
        let oldest = ray_release(RAY_VERSION_OLDEST).expect("the oldest is pinned");
        let tools = test_tools();
        let plain = format!("ray[serve]=={RAY_VERSION} {tools} python=3.11.7\n");
        assert!(marker_matches(&plain, &newest));
        assert!(!marker_matches(&plain, &oldest));
        let constrained = format!(
            "ray[serve]=={RAY_VERSION_OLDEST} {tools} python=3.11.7 constraints=protobuf<7\n"
        );
        assert!(marker_matches(&constrained, &oldest));
        // The same Ray built before its constraints were known is rebuilt.
        let unconstrained = format!("ray[serve]=={RAY_VERSION_OLDEST} {tools} python=3.11.7\n");
        assert!(!marker_matches(&unconstrained, &oldest));
        let old_pytest = format!("ray[serve]=={RAY_VERSION} pytest=8.0.0 python=3.11.7\n");
        assert!(!marker_matches(&old_pytest, &newest));
        // A venv from before the lint tools gets them (in place, by the script).
        let no_lints =
            format!("ray[serve]=={RAY_VERSION} pytest=={PYTEST_VERSION} python=3.11.7\n");
        assert!(!marker_matches(&no_lints, &newest));
        assert_ne!(venv_dir_for(RAY_VERSION), venv_dir_for(RAY_VERSION_OLDEST));
        assert!(ray_release("2.40.0").is_none());
    }

    /// `.ci/run` provisions the venv with the script's own defaults (no Rust build needed), so
    /// they must be the pins above.
    #[test]
    fn the_script_defaults_are_the_pinned_versions() {
        for (name, pinned) in [
            ("RAY_VERSION", RAY_VERSION),
            ("PYTEST_VERSION", PYTEST_VERSION),
            ("RUFF_VERSION", RUFF_VERSION),
            ("MYPY_VERSION", MYPY_VERSION),
        ] {
            let default = format!("{name}=${{{name}:-{pinned}}}");
            assert!(
                PROVISION_RAY_SCRIPT.lines().any(|line| line == default),
                "provision-ray.sh should default {name} to {pinned} (`{default}`)"
            );
        }
    }

    #[test]
    fn credentials_are_never_shown_by_debug() {
        let env = CredentialEnv::new(vec![(
            "AWS_SECRET_ACCESS_KEY".to_owned(),
            "not-for-logs".to_owned(),
        )]);
        let shown = format!(
            "{:?}",
            RayHeadOptions {
                credential_env: env.clone(),
                ..Default::default()
            }
        );
        assert!(shown.contains("AWS_SECRET_ACCESS_KEY") && !shown.contains("not-for-logs"));
        assert_eq!(env.pairs(), [("AWS_SECRET_ACCESS_KEY", "not-for-logs")]);
    }

    #[test]
    fn the_storage_clients_are_added_again_only_when_their_pin_changes() {
        assert!(storage_clients_match(&format!("boto3=={BOTO3_VERSION}\n")));
        assert!(!storage_clients_match(""));
        assert!(!storage_clients_match("boto3==1.0.0\n"));
    }
}
