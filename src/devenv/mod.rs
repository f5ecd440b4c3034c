//! The local development environment, for tests, benchmarks and `raypipe dev` (cargo feature
//! `dev`, in the default features; the released operator image builds without it):
//!
//! - [`control_plane`]: a real Kubernetes control plane on 127.0.0.1 (etcd, kube-apiserver,
//!   optionally kube-controller-manager, kube-scheduler and kwok), from binaries built once per
//!   machine ([`binaries`], `provision.sh`), with its own certificates ([`pki`]);
//! - [`ray`]: a pinned Ray in a cached virtualenv and local Ray heads on 127.0.0.1;
//! - [`registry`]: a token-protected HTTP model registry with ETags and request counters,
//!   which is also a minimal OCI registry ([`oci`]) for `raypipe dag push` and `source.oci`;
//! - [`distribution`]: the CNCF distribution registry (a real OCI registry) on 127.0.0.1;
//! - [`process`]: child processes in their own process group that die with their parent.
//!
//! Everything here is started by process id and stopped the same way; nothing listens beyond
//! the loopback.

pub mod binaries;
pub mod browser;
pub mod control_plane;
pub mod distribution;
pub mod oci;
pub mod oidc;
pub mod pki;
pub mod png;
pub mod process;
pub mod ray;
pub mod registry;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum DevEnvError {
    #[error("provisioning the control-plane binaries failed: {0}")]
    Provision(String),
    #[error("generating certificates failed: {0}")]
    Pki(String),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("cannot start {0}: {1}")]
    Spawn(String, String),
    #[error("{name} exited during start-up ({status}); last log lines:\n{log}")]
    Exited {
        name: String,
        status: String,
        log: String,
    },
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, String),
    #[error("Kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
}

pub(crate) fn free_port() -> Result<u16, DevEnvError> {
    let l = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| DevEnvError::Io("bind 127.0.0.1:0".into(), e))?;
    let port = l
        .local_addr()
        .map_err(|e| DevEnvError::Io("local_addr".into(), e))?
        .port();
    Ok(port)
}

/// 24 random bytes from the kernel, hex-encoded.
pub fn random_token() -> Result<String, DevEnvError> {
    use std::io::Read;
    let mut buf = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| DevEnvError::Io("read /dev/urandom".into(), e))?;
    Ok(hex::encode(buf))
}

pub(crate) fn write(path: &Path, contents: &str) -> Result<(), DevEnvError> {
    std::fs::write(path, contents)
        .map_err(|e| DevEnvError::Io(format!("write {}", path.display()), e))
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// A fresh directory `<root>/<prefix><our pid>-<n>`, after handing every `<prefix><pid>-…`
/// directory whose process no longer runs to `abandoned` (a killed test run cannot clean up
/// after itself).
fn fresh_run_dir(
    root: &Path,
    prefix: &str,
    abandoned: impl Fn(&Path),
) -> Result<PathBuf, DevEnvError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    std::fs::create_dir_all(root)
        .map_err(|e| DevEnvError::Io(format!("create {}", root.display()), e))?;
    if let Ok(entries) = std::fs::read_dir(root) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let owner = name
                .strip_prefix(prefix)
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok());
            if let Some(owner) = owner
                && !pid_alive(owner)
            {
                abandoned(&entry.path());
            }
        }
    }
    let dir = root.join(format!(
        "{prefix}{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| DevEnvError::Io(format!("create {}", dir.display()), e))?;
    Ok(dir)
}
