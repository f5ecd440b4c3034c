//! Real Ray heads on 127.0.0.1 for tests and `raypipe dev`.
//!
//! Ray comes from PyPI: a pinned `ray[serve]` in a virtualenv cached outside the repository
//! (`<raypipe cache>/ray/venv-<version>`, filled once by the embedded `provision-ray.sh`).
//! Each [`RayHead`] gets its own ports, its own short temp dir and an environment that keeps
//! every Ray process on loopback; it is stopped by the process ids it started, never with
//! `ray stop` (which stops every Ray on the machine). A head may bring extra worker nodes
//! (more `ray start` processes on the same machine joining its GCS), for Serve configs that
//! spread replicas over nodes (`max_replicas_per_node`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

use crate::devenv::DevEnvError;
use crate::devenv::binaries::cache_root;
use crate::devenv::process::ManagedProcess;

use crate::ray::{BearerToken, DashboardClientOptions, DashboardUrl, RayDashboardClient};

/// The `ray[serve]` version tests run (the one the reference notes were verified against).
pub const RAY_VERSION: &str = "2.60.0";

/// The `pytest` the venv also gets, for the graph runtime's tests (`runtime/tests`).
pub const PYTEST_VERSION: &str = "9.2.0";

/// The provisioning script, embedded so it works from any directory.
pub const PROVISION_RAY_SCRIPT: &str = include_str!("ray/provision-ray.sh");

/// Loaded by every Python process of a head: moves the gRPC servers Ray Serve opens on every
/// interface (no setting for that in Ray 2.60) to 127.0.0.1.
const LOOPBACK_SITECUSTOMIZE: &str = include_str!("ray/sitecustomize.py");

/// `ray start` for extra worker nodes: joins a cluster on 127.0.0.1 (see the script).
const RAY_JOIN_SCRIPT: &str = include_str!("ray/ray-join.py");

/// Path of a `ray` executable to use instead of the cached virtualenv.
pub const RAY_BIN_ENV: &str = "RAYPIPE_RAY_BIN";

const INHERITED_RAY_VARIABLES_TO_DROP: [&str; 4] = [
    "RAY_ADDRESS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
];

/// Ports reserved for Ray's worker processes (one per worker; a test head runs a few dozen).
const WORKER_PORT_COUNT: u16 = 100;

/// Only loopback, for every listener and every advertised address.
const LOOPBACK: &str = "127.0.0.1";

/// Unix socket paths (`<temp dir>/session_<date>_<pid>/sockets/plasma_store`) must stay under
/// 108 bytes, so the temp dir must be short.
const MAX_TEMP_ROOT_LEN: usize = 40;

/// The virtualenv `provision-ray.sh` fills for [`RAY_VERSION`].
pub fn venv_dir() -> PathBuf {
    cache_root().join("ray").join(format!("venv-{RAY_VERSION}"))
}

/// The `ray` executable: `$RAYPIPE_RAY_BIN`, else the cached virtualenv, provisioned on first
/// use (blocking; about a minute cold, instant when warm).
pub fn locate_ray() -> Result<PathBuf, DevEnvError> {
    if let Some(bin) = std::env::var_os(RAY_BIN_ENV) {
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
    let venv = venv_dir();
    let ray = venv.join("bin").join("ray");
    let marker = std::fs::read_to_string(venv.join(".raypipe-provisioned")).unwrap_or_default();
    // `bin/python` is a symlink to the interpreter the venv was made with: gone means rebuild.
    let interpreter_present = venv.join("bin").join("python").exists();
    if ray.is_file()
        && interpreter_present
        && marker.starts_with(&format!(
            "ray[serve]=={RAY_VERSION} pytest=={PYTEST_VERSION} "
        ))
    {
        return Ok(ray);
    }
    provision_ray(&venv)?;
    if ray.is_file() {
        Ok(ray)
    } else {
        Err(DevEnvError::Provision(format!(
            "{} is missing after provisioning",
            ray.display()
        )))
    }
}

/// Runs the embedded provisioning script for `venv`, its progress going to stderr.
pub fn provision_ray(venv: &Path) -> Result<(), DevEnvError> {
    eprintln!(
        "raypipe: installing ray[serve]=={RAY_VERSION} and pytest=={PYTEST_VERSION} from PyPI into {} — the first time takes about a minute, later runs reuse it",
        venv.display()
    );
    crate::devenv::binaries::run_embedded_script(
        "provision-ray.sh",
        PROVISION_RAY_SCRIPT,
        venv,
        &[
            ("RAY_VERSION", RAY_VERSION),
            ("PYTEST_VERSION", PYTEST_VERSION),
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
            startup_timeout: Duration::from_secs(120),
            worker_nodes: 0,
            worker_node_num_cpus: None,
            resources: BTreeMap::new(),
            private_mounts: Vec::new(),
        }
    }
}

/// Every port a head listens on (all on 127.0.0.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RayHeadPorts {
    pub gcs: u16,
    pub dashboard: u16,
    pub dashboard_agent_http: u16,
    pub dashboard_agent_grpc: u16,
    pub runtime_env_agent: u16,
    pub metrics_export: u16,
    pub client_server: u16,
    pub node_manager: u16,
    pub object_manager: u16,
    /// Serve binds it when the first config naming it is deployed (see
    /// [`RayHead::bind_serve_to_loopback`]).
    pub serve_http: u16,
    pub min_worker: u16,
    pub max_worker: u16,
}

impl RayHeadPorts {
    /// The listener ports (the worker range left out).
    pub fn listeners(&self) -> Vec<u16> {
        vec![
            self.gcs,
            self.dashboard,
            self.dashboard_agent_http,
            self.dashboard_agent_grpc,
            self.runtime_env_agent,
            self.metrics_export,
            self.client_server,
            self.node_manager,
            self.object_manager,
            self.serve_http,
        ]
    }
}

/// Every port an extra worker node listens on (all on 127.0.0.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RayWorkerNodePorts {
    pub node_manager: u16,
    pub object_manager: u16,
    pub dashboard_agent_http: u16,
    pub dashboard_agent_grpc: u16,
    pub runtime_env_agent: u16,
    pub metrics_export: u16,
    pub min_worker: u16,
    pub max_worker: u16,
}

impl RayWorkerNodePorts {
    /// The listener ports (the worker range left out).
    pub fn listeners(&self) -> Vec<u16> {
        vec![
            self.node_manager,
            self.object_manager,
            self.dashboard_agent_http,
            self.dashboard_agent_grpc,
            self.runtime_env_agent,
            self.metrics_export,
        ]
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
}

impl std::fmt::Debug for RayHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RayHead")
            .field("dir", &self.dir)
            .field("dashboard_url", &self.dashboard_url)
            .field("ports", &self.ports)
            .field("root_pid", &self.root_pid)
            .field("auth_token", &self.auth_token)
            .finish()
    }
}

impl RayHead {
    /// Provisions Ray if needed, starts `ray start --head --block` and waits until the
    /// dashboard serves the Serve and Jobs APIs.
    pub async fn start(options: RayHeadOptions) -> Result<RayHead, DevEnvError> {
        let started = Instant::now();
        let ray = tokio::task::spawn_blocking(locate_ray)
            .await
            .map_err(|e| DevEnvError::Provision(e.to_string()))??;
        let dir = run_dir()?;
        let ports = pick_ports()?;
        let dashboard_url = DashboardUrl::parse(&format!("http://{LOOPBACK}:{}", ports.dashboard))
            .map_err(|e| DevEnvError::Spawn("ray".into(), e.to_string()))?;

        let env = node_environment(&ray, &dir, &options)?;
        let args = env_command(&env, &ray, ray_start_args(&ports, &dir, &options));

        let log = dir.join("head.log");
        let (program, args) = if options.private_mounts.is_empty() {
            (PathBuf::from("/usr/bin/env"), args)
        } else {
            private_mount_command(&options.private_mounts, args)?
        };
        let process = ManagedProcess::start("ray-head", &program, &args, &log)?;
        let root_pid = process.pid();
        write_private(&dir.join("ray-start.pid"), &root_pid.to_string())?;
        let head = RayHead {
            dir,
            dashboard_url,
            ports,
            auth_token: options.auth_token.clone(),
            process: Mutex::new(Some(process)),
            root_pid,
            workers: Mutex::new(Vec::new()),
            keep_dir: std::env::var_os("RAYPIPE_TESTENV_KEEP").is_some(),
        };
        // On failure `head` is dropped here, which stops whatever did start.
        head.wait_ready(options.startup_timeout).await?;
        if options.worker_nodes > 0 {
            head.start_worker_nodes(&ray, &env, &options)?;
            head.wait_for_nodes(1 + options.worker_nodes as usize, options.startup_timeout)
                .await?;
        }
        tracing::info!(
            dashboard = %head.dashboard_url,
            dir = %head.dir.display(),
            seconds = started.elapsed().as_secs_f64(),
            "ray head ready"
        );
        Ok(head)
    }

    pub fn dashboard_url(&self) -> &DashboardUrl {
        &self.dashboard_url
    }

    /// Serve's HTTP proxy, once a config from [`RayHead::bind_serve_to_loopback`] is deployed.
    pub fn serve_url(&self) -> String {
        format!("http://{LOOPBACK}:{}", self.ports.serve_http)
    }

    pub fn ports(&self) -> RayHeadPorts {
        self.ports
    }

    /// `127.0.0.1:<gcs port>`, for `ray.init(address=…)` or worker nodes.
    pub fn gcs_address(&self) -> String {
        format!("{LOOPBACK}:{}", self.ports.gcs)
    }

    /// A dashboard client for this head (with its token, if it has one).
    pub fn client(
        &self,
        request_timeout: Duration,
    ) -> Result<RayDashboardClient, crate::ray::DashboardError> {
        RayDashboardClient::new(
            self.dashboard_url.clone(),
            DashboardClientOptions {
                request_timeout,
                bearer_token: self.auth_token.clone(),
                ..Default::default()
            },
        )
    }

    /// Sets `http_options` of a Serve config to this head's loopback port. Serve's own default
    /// is 0.0.0.0:8000, which leaves loopback and collides with any other head; and Serve
    /// takes the HTTP options only from the config that first starts it.
    pub fn bind_serve_to_loopback(&self, config: &mut serde_json::Value) {
        if let Some(object) = config.as_object_mut() {
            object.insert(
                "http_options".into(),
                serde_json::json!({"host": LOOPBACK, "port": self.ports.serve_http}),
            );
        }
    }

    /// The head's directory: `head.log` (output of `ray start`) and Ray's `session_*` dirs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Ray's own logs (raylet, GCS, dashboard, Serve, job drivers).
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("session_latest").join("logs")
    }

    /// Pid of `ray start --block`, the root of every process of this head.
    pub fn root_pid(&self) -> u32 {
        self.root_pid
    }

    /// The live processes of this head: `ray start` and everything it spawned, and the same
    /// for each extra worker node.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: BTreeSet<u32> = own_processes(self.root_pid)
            .into_iter()
            .map(|p| p.pid)
            .collect();
        for root in self.worker_node_root_pids() {
            pids.extend(own_processes(root).into_iter().map(|p| p.pid));
        }
        pids.into_iter().collect()
    }

    /// Pids of the extra worker nodes' `ray start --block` processes (empty once stopped).
    pub fn worker_node_root_pids(&self) -> Vec<u32> {
        self.workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|w| w.root_pid)
            .collect()
    }

    /// The ports of each extra worker node.
    pub fn worker_node_ports(&self) -> Vec<RayWorkerNodePorts> {
        self.workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|w| w.ports)
            .collect()
    }

    /// The pid of the process running Serve's controller actor (its title is
    /// `ray::ServeController…`), if Serve runs one.
    pub fn serve_controller_pid(&self) -> Option<u32> {
        self.serve_controller().map(|p| p.pid)
    }

    fn serve_controller(&self) -> Option<ProcessIdentity> {
        own_processes(self.root_pid).into_iter().find(|p| {
            std::fs::read(format!("/proc/{}/cmdline", p.pid))
                .is_ok_and(|cmdline| cmdline.starts_with(b"ray::ServeController"))
        })
    }

    /// Fault injection: SIGKILLs the Serve controller's process, as a crash would; Ray
    /// restarts the actor, which recovers its applications from the GCS. A signal to a pid of
    /// this head rather than `ray.kill` from a driver: no extra Ray client joins the cluster.
    /// Returns the killed pid, `None` when Serve runs no controller.
    pub fn kill_serve_controller(&self) -> Option<u32> {
        let controller = self.serve_controller()?;
        let pid = libc::pid_t::try_from(controller.pid).ok()?;
        if !is_alive(&controller) {
            return None;
        }
        // SAFETY: signalling a process of this head, checked by start time just above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        Some(controller.pid)
    }

    /// Every TCP address a process of this head listens on (to check that all are loopback).
    pub fn listening_addresses(&self) -> Vec<std::net::SocketAddr> {
        let mut socket_inodes: BTreeSet<u64> = BTreeSet::new();
        for pid in self.pids() {
            let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                let target = std::fs::read_link(fd.path()).unwrap_or_default();
                let inode = target
                    .to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
                    .and_then(|t| t.parse::<u64>().ok());
                socket_inodes.extend(inode);
            }
        }
        ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .flat_map(|table| listening_sockets(table))
            .filter(|(_, inode)| socket_inodes.contains(inode))
            .map(|(address, _)| address)
            .collect()
    }

    /// Stops every process of this head, by pid: SIGTERM to `ray start` (Ray then stops what
    /// it started), then SIGKILL for anything of the head still alive (orphaned agents,
    /// workers in their own process groups). Idempotent.
    pub fn stop(&self) {
        // Worker nodes first: a node whose GCS went away first lingers, retrying.
        let workers: Vec<WorkerNode> =
            std::mem::take(&mut *self.workers.lock().unwrap_or_else(PoisonError::into_inner));
        for worker in workers {
            stop_node(worker.process, worker.root_pid, &self.dir);
        }
        let process = self
            .process
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(process) = process else {
            return;
        };
        stop_node(process, self.root_pid, &self.dir);
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    async fn wait_ready(&self, timeout: Duration) -> Result<(), DevEnvError> {
        let deadline = Instant::now() + timeout;
        let client = self
            .client(Duration::from_secs(5))
            .map_err(|e| DevEnvError::Spawn("ray".into(), e.to_string()))?;
        loop {
            self.check_running()?;
            // The Serve module of the dashboard starts lazily; the Jobs API needs the agent.
            let ready = async {
                client.get_version().await?;
                client.get_serve_applications().await?;
                client.list_jobs().await
            };
            let last_error = match ready.await {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                let log = self.dir.join("head.log");
                return Err(DevEnvError::Timeout(
                    timeout,
                    format!(
                        "the Ray dashboard at {} ({last_error}); last lines of {}:\n{}",
                        self.dashboard_url,
                        log.display(),
                        crate::devenv::process::log_tail(&log, 30)
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Starts `options.worker_nodes` worker nodes joining this head's GCS, each with its own
    /// loopback ports, the head's environment and temp dir.
    fn start_worker_nodes(
        &self,
        ray: &Path,
        env: &BTreeMap<String, String>,
        options: &RayHeadOptions,
    ) -> Result<(), DevEnvError> {
        let join_script = self.dir.join("python").join("ray-join.py");
        write_private(&join_script, RAY_JOIN_SCRIPT)?;
        let python = ray.with_file_name("python");
        let mut taken = self.ports.listeners();
        let mut worker_ranges = vec![(self.ports.min_worker, self.ports.max_worker)];
        for index in 0..options.worker_nodes {
            let ports = pick_worker_node_ports(&taken, &worker_ranges)?;
            taken.extend(ports.listeners());
            worker_ranges.push((ports.min_worker, ports.max_worker));
            // `ray start` itself refuses to join a cluster on loopback: ray-join.py is
            // `ray start` with that check off (see there), run by the venv's Python.
            let mut ray_args = vec![join_script.display().to_string()];
            ray_args.extend(worker_node_start_args(
                &self.gcs_address(),
                &ports,
                &self.dir,
                options,
            ));
            let args = env_command(env, &python, ray_args);
            let log = self.dir.join(format!("worker-{index}.log"));
            let process = ManagedProcess::start(
                &format!("ray-worker-{index}"),
                Path::new("/usr/bin/env"),
                &args,
                &log,
            )?;
            let root_pid = process.pid();
            write_private(
                &self.dir.join(format!("ray-worker-{index}.pid")),
                &root_pid.to_string(),
            )?;
            self.workers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(WorkerNode {
                    process,
                    root_pid,
                    ports,
                });
        }
        Ok(())
    }

    /// Waits until the head's state API lists `count` alive nodes.
    async fn wait_for_nodes(&self, count: usize, timeout: Duration) -> Result<(), DevEnvError> {
        let deadline = Instant::now() + timeout;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| DevEnvError::Spawn("ray".into(), e.to_string()))?;
        let url = format!("{}/api/v0/nodes?limit=100", self.dashboard_url);
        loop {
            self.check_running()?;
            let mut request = http.get(&url);
            if let Some(token) = &self.auth_token {
                request = request.bearer_auth(token.expose_secret());
            }
            let alive = match request.send().await {
                Ok(response) => response
                    .bytes()
                    .await
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .map(|body| alive_nodes(&body))
                    .unwrap_or(0),
                Err(_) => 0,
            };
            if alive >= count {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = self.dir.join("worker-0.log");
                return Err(DevEnvError::Timeout(
                    timeout,
                    format!(
                        "{count} alive Ray nodes at {url} (saw {alive}); last lines of {}:\n{}",
                        log.display(),
                        crate::devenv::process::log_tail(&log, 30)
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn check_running(&self) -> Result<(), DevEnvError> {
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        for worker in workers.iter_mut() {
            if let Some(status) = worker.process.exited() {
                return Err(DevEnvError::Exited {
                    name: "ray start --address (worker node)".into(),
                    status,
                    log: worker.process.log_tail(40),
                });
            }
        }
        drop(workers);
        let mut guard = self.process.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(process) = guard.as_mut()
            && let Some(status) = process.exited()
        {
            return Err(DevEnvError::Exited {
                name: "ray start --head".into(),
                status,
                log: process.log_tail(40),
            });
        }
        Ok(())
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

/// The environment of every Ray process of a head and its worker nodes.
fn node_environment(
    ray: &Path,
    dir: &Path,
    options: &RayHeadOptions,
) -> Result<BTreeMap<String, String>, DevEnvError> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    // Without it Ray swaps 127.0.0.1 for the host's interface address (§8 of the notes).
    env.insert("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER".into(), "0".into());
    // A SIGTERM'd node would otherwise drain for up to 30 s before stopping.
    env.insert("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S".into(), "0".into());
    env.insert("RAY_USAGE_STATS_ENABLED".into(), "0".into());
    // Job entrypoints run `python`: make it the one that has Ray.
    let bin_dir = ray.parent().map(Path::to_path_buf).unwrap_or_default();
    let path = std::env::var("PATH").unwrap_or_default();
    env.insert("PATH".into(), format!("{}:{path}", bin_dir.display()));
    let site_dir = dir.join("python");
    std::fs::create_dir_all(&site_dir)
        .map_err(|e| DevEnvError::Io(format!("create {}", site_dir.display()), e))?;
    write_private(&site_dir.join("sitecustomize.py"), LOOPBACK_SITECUSTOMIZE)?;
    let python_path: Vec<String> = std::iter::once(&site_dir)
        .chain(&options.python_path)
        .map(|p| p.display().to_string())
        .collect();
    env.insert("PYTHONPATH".into(), python_path.join(":"));
    if let Some(token) = &options.auth_token {
        // Through a file, so the token is on no command line.
        let token_file = dir.join("auth-token");
        write_private(&token_file, token.expose_secret())?;
        env.insert("RAY_AUTH_MODE".into(), "token".into());
        env.insert(
            "RAY_AUTH_TOKEN_PATH".into(),
            token_file.display().to_string(),
        );
    } else {
        // Ray turns token authentication on by itself when it finds a token in
        // `~/.ray/auth_token` (anything on the machine may have generated one): say no.
        env.insert("RAY_AUTH_MODE".into(), "disabled".into());
    }
    env.extend(options.env.iter().cloned());
    Ok(env)
}

/// `/usr/bin/env` arguments that run `ray ARGS…` with exactly `env` on top of ours. `env` sets
/// the variables and execs `ray` (same pid): ManagedProcess inherits ours. Ray settings of
/// the calling environment (an address to join, a token mode) must not leak into a head that
/// is meant to stand alone.
fn env_command(env: &BTreeMap<String, String>, ray: &Path, ray_args: Vec<String>) -> Vec<String> {
    let mut args: Vec<String> = INHERITED_RAY_VARIABLES_TO_DROP
        .iter()
        .flat_map(|name| ["-u".to_owned(), (*name).to_owned()])
        .collect();
    args.extend(env.iter().map(|(key, value)| format!("{key}={value}")));
    args.push(ray.display().to_string());
    args.extend(ray_args);
    args
}

/// Stops one node (the head or a worker node) by pid: SIGTERM to its `ray start` (Ray then
/// stops what it started), then SIGKILL for anything of it still alive (orphaned agents,
/// workers in their own process groups).
fn stop_node(mut process: ManagedProcess, root_pid: u32, dir: &Path) {
    // Listed before the root goes: orphans are re-parented and lose the link to it.
    let mut leftovers: BTreeSet<ProcessIdentity> = own_processes(root_pid).into_iter().collect();
    process.stop(Duration::from_secs(15));
    leftovers.extend(ray_processes_in_group(root_pid, dir));
    kill_and_wait(&leftovers, Duration::from_secs(5));
}

/// How many nodes a state API answer (`/api/v0/nodes`) lists as ALIVE.
fn alive_nodes(body: &serde_json::Value) -> usize {
    body.pointer("/data/result/result")
        .and_then(|r| r.as_array())
        .map_or(0, |nodes| {
            nodes
                .iter()
                .filter(|n| n.get("state").and_then(|s| s.as_str()) == Some("ALIVE"))
                .count()
        })
}

/// `ray start` for a worker node joining `gcs_address`, everything on loopback.
fn worker_node_start_args(
    gcs_address: &str,
    ports: &RayWorkerNodePorts,
    dir: &Path,
    options: &RayHeadOptions,
) -> Vec<String> {
    let mut args: Vec<String> = vec!["start".into(), format!("--address={gcs_address}")];
    args.extend(node_args(ports, dir, options, options.worker_node_num_cpus));
    args
}

fn ray_start_args(ports: &RayHeadPorts, dir: &Path, options: &RayHeadOptions) -> Vec<String> {
    let node_ports = RayWorkerNodePorts {
        node_manager: ports.node_manager,
        object_manager: ports.object_manager,
        dashboard_agent_http: ports.dashboard_agent_http,
        dashboard_agent_grpc: ports.dashboard_agent_grpc,
        runtime_env_agent: ports.runtime_env_agent,
        metrics_export: ports.metrics_export,
        min_worker: ports.min_worker,
        max_worker: ports.max_worker,
    };
    let mut args: Vec<String> = vec!["start".into(), "--head".into()];
    args.extend(node_args(&node_ports, dir, options, options.num_cpus));
    args.extend([
        format!("--port={}", ports.gcs),
        "--include-dashboard=true".into(),
        format!("--dashboard-host={LOOPBACK}"),
        format!("--dashboard-port={}", ports.dashboard),
        format!("--ray-client-server-port={}", ports.client_server),
    ]);
    if !options.resources.is_empty() {
        let resources = serde_json::to_string(&options.resources).unwrap_or_default();
        args.push(format!("--resources={resources}"));
    }
    args
}

/// `unshare --mount` running a shell that sets up `mounts` privately, then execs
/// `/usr/bin/env args…` (same pid, so the process handling is unchanged).
fn private_mount_command(
    mounts: &[(PathBuf, PathBuf)],
    args: Vec<String>,
) -> Result<(PathBuf, Vec<String>), DevEnvError> {
    let quote = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', "'\\''"));
    let mut script = String::from("set -e; ");
    for (source, target) in mounts {
        if !target.is_absolute() || !source.is_dir() {
            return Err(DevEnvError::Spawn(
                "ray-head".into(),
                format!(
                    "private mount {} at {}: the source must be a directory and the target absolute",
                    source.display(),
                    target.display()
                ),
            ));
        }
        if !target.exists() {
            let ancestor = target
                .ancestors()
                .find(|a| a.exists())
                .unwrap_or(Path::new("/"));
            script.push_str(&format!(
                "mount -t tmpfs raypipe-test {a}; mkdir -p {t}; ",
                a = quote(ancestor),
                t = quote(target)
            ));
        }
        script.push_str(&format!(
            "mount --bind {s} {t}; ",
            s = quote(source),
            t = quote(target)
        ));
    }
    script.push_str("exec /usr/bin/env \"$@\"");
    let mut full = vec![
        "--mount".to_owned(),
        "--propagation".to_owned(),
        "private".to_owned(),
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        script,
        "ray-head".to_owned(),
    ];
    full.extend(args);
    Ok((PathBuf::from("/usr/bin/unshare"), full))
}

/// The flags every node (head or worker) gets: its own loopback ports, blocking (so the process
/// is the node's root and its stop handler cleans up), the run directory, quiet logs.
fn node_args(
    ports: &RayWorkerNodePorts,
    dir: &Path,
    options: &RayHeadOptions,
    num_cpus: Option<u32>,
) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--block".into(),
        format!("--node-ip-address={LOOPBACK}"),
        format!(
            "--dashboard-agent-listen-port={}",
            ports.dashboard_agent_http
        ),
        format!("--dashboard-agent-grpc-port={}", ports.dashboard_agent_grpc),
        format!("--runtime-env-agent-port={}", ports.runtime_env_agent),
        format!("--metrics-export-port={}", ports.metrics_export),
        format!("--node-manager-port={}", ports.node_manager),
        format!("--object-manager-port={}", ports.object_manager),
        format!("--min-worker-port={}", ports.min_worker),
        format!("--max-worker-port={}", ports.max_worker),
        format!("--temp-dir={}", dir.display()),
        format!(
            "--object-store-memory={}",
            options.object_store_memory_bytes
        ),
        "--disable-usage-stats".into(),
        "--log-style=record".into(),
        "--log-color=false".into(),
    ];
    if let Some(cpus) = num_cpus {
        args.push(format!("--num-cpus={cpus}"));
    }
    args
}

fn write_private(path: &Path, contents: &str) -> Result<(), DevEnvError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(contents.as_bytes()))
        .map_err(|e| DevEnvError::Io(format!("write {}", path.display()), e))
}

/// A short temp root: `$TMPDIR` when short enough for Ray's socket paths, else `/tmp`.
fn temp_root() -> PathBuf {
    let tmp = std::env::temp_dir();
    if tmp.as_os_str().len() <= MAX_TEMP_ROOT_LEN {
        tmp
    } else {
        PathBuf::from("/tmp")
    }
}

/// A fresh `rp-ray-<our pid>-<n>` directory, after cleaning up after heads whose test process
/// died without stopping them.
fn run_dir() -> Result<PathBuf, DevEnvError> {
    super::fresh_run_dir(&temp_root(), "rp-ray-", clean_up_abandoned_head)
}

/// Kills what is left of a head whose owner is gone (see [`ray_processes_in_group`]), then
/// removes its directory.
fn clean_up_abandoned_head(dir: &Path) {
    // `ray-start.pid` (the head) and `ray-worker-<n>.pid` (its worker nodes).
    let roots: Vec<u32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.starts_with("ray-") && name.ends_with(".pid")
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .filter_map(|pid| pid.trim().parse::<u32>().ok())
        .collect();
    for root in roots {
        let abandoned: BTreeSet<ProcessIdentity> =
            ray_processes_in_group(root, dir).into_iter().collect();
        kill_and_wait(&abandoned, Duration::from_secs(5));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `(address, socket inode)` of each listening socket in a `/proc/net/tcp{,6}` table.
fn listening_sockets(table: &str) -> Vec<(std::net::SocketAddr, u64)> {
    const LISTEN: &str = "0A";
    let text = std::fs::read_to_string(table).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(3) != Some(&LISTEN) {
                return None;
            }
            let (host, port) = fields.get(1)?.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            let inode = fields.get(9)?.parse().ok()?;
            Some((std::net::SocketAddr::new(parse_proc_ip(host)?, port), inode))
        })
        .collect()
}

/// The kernel prints addresses as 32-bit words in host (little-endian) byte order.
fn parse_proc_ip(hex: &str) -> Option<std::net::IpAddr> {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect::<Option<_>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    match bytes.len() {
        4 => Some(std::net::IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(std::net::IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// A process, identified so that a recycled pid is never mistaken for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ProcessIdentity {
    pid: u32,
    start_time: u64,
}

#[derive(Clone, Copy, Debug)]
struct ProcessInfo {
    pid: u32,
    ppid: u32,
    pgrp: u32,
    start_time: u64,
    zombie: bool,
}

impl ProcessInfo {
    fn identity(&self) -> ProcessIdentity {
        ProcessIdentity {
            pid: self.pid,
            start_time: self.start_time,
        }
    }
}

fn process_info(pid: u32) -> Option<ProcessInfo> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `comm` (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 3 (state), 4 (ppid), 5 (pgrp) and 22 (starttime) of proc(5), counted from 3.
    Some(ProcessInfo {
        pid,
        zombie: *fields.first()? == "Z",
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

fn all_processes() -> Vec<ProcessInfo> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(process_info)
        .collect()
}

/// `root`, its descendants, and the members of its process group (Ray's agents keep the group
/// after being orphaned; its workers have their own groups but are the raylet's children).
/// Only meaningful while `root` runs: afterwards its pid may be recycled.
fn own_processes(root: u32) -> Vec<ProcessIdentity> {
    let processes = all_processes();
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for p in &processes {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut own: BTreeSet<u32> = processes
        .iter()
        .filter(|p| p.pgrp == root)
        .map(|p| p.pid)
        .collect();
    own.insert(root);
    let mut frontier: Vec<u32> = own.iter().copied().collect();
    while let Some(pid) = frontier.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if own.insert(child) {
                frontier.push(child);
            }
        }
    }
    processes
        .iter()
        .filter(|p| own.contains(&p.pid) && !p.zombie)
        .map(ProcessInfo::identity)
        .collect()
}

/// Ray processes left in the process group of a `ray start` that has ended: group members
/// with a `ray::…` title or the head's directory on their command line. (The group id stays
/// reserved while members exist, but checking that they are Ray's costs little.)
fn ray_processes_in_group(root: u32, dir: &Path) -> Vec<ProcessIdentity> {
    let dir_text = dir.display().to_string();
    all_processes()
        .into_iter()
        .filter(|p| p.pgrp == root && !p.zombie)
        .filter(|p| {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.pid)).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            cmdline.starts_with("ray::") || cmdline.contains(&dir_text)
        })
        .map(|p| p.identity())
        .collect()
}

fn is_alive(process: &ProcessIdentity) -> bool {
    process_info(process.pid)
        .is_some_and(|info| info.start_time == process.start_time && !info.zombie)
}

/// SIGKILL for each process still alive (same pid *and* start time), then waits up to `grace`
/// for them to disappear.
fn kill_and_wait(processes: &BTreeSet<ProcessIdentity>, grace: Duration) {
    for process in processes.iter().filter(|p| is_alive(p)) {
        let Ok(pid) = libc::pid_t::try_from(process.pid) else {
            continue;
        };
        // SAFETY: signalling a process this head started, checked by start time just above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    let deadline = Instant::now() + grace;
    while processes.iter().any(is_alive) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Free loopback ports for every listener, and a worker port range that none of them (nor
/// anything the kernel hands out later) falls into.
fn pick_ports() -> Result<RayHeadPorts, DevEnvError> {
    let (min_worker, max_worker) = pick_worker_port_range(&[])?;
    let ports = free_ports(10, &[], (min_worker, max_worker))?;
    Ok(RayHeadPorts {
        gcs: ports[0],
        dashboard: ports[1],
        dashboard_agent_http: ports[2],
        dashboard_agent_grpc: ports[3],
        runtime_env_agent: ports[4],
        metrics_export: ports[5],
        client_server: ports[6],
        node_manager: ports[7],
        object_manager: ports[8],
        serve_http: ports[9],
        min_worker,
        max_worker,
    })
}

/// Ports for a worker node: none in `taken` (ports of the head and earlier nodes, some of
/// them not bound yet, like Serve's) nor in any of `worker_ranges`, and a worker range of its
/// own.
fn pick_worker_node_ports(
    taken: &[u16],
    worker_ranges: &[(u16, u16)],
) -> Result<RayWorkerNodePorts, DevEnvError> {
    let (min_worker, max_worker) = pick_worker_port_range(worker_ranges)?;
    let mut ranges = worker_ranges.to_vec();
    ranges.push((min_worker, max_worker));
    let ports = free_ports(6, taken, (min_worker, max_worker))?;
    let ports: Vec<u16> = ports
        .into_iter()
        .filter(|p| !ranges.iter().any(|(lo, hi)| (lo..=hi).contains(&p)))
        .collect();
    if ports.len() < 6 {
        // Ports outside this node's range that fell into another node's: rare, try again.
        return pick_worker_node_ports(taken, worker_ranges);
    }
    Ok(RayWorkerNodePorts {
        node_manager: ports[0],
        object_manager: ports[1],
        dashboard_agent_http: ports[2],
        dashboard_agent_grpc: ports[3],
        runtime_env_agent: ports[4],
        metrics_export: ports[5],
        min_worker,
        max_worker,
    })
}

/// `count` distinct free loopback ports, none in `taken` nor in `worker_range`.
fn free_ports(
    count: usize,
    taken: &[u16],
    (min_worker, max_worker): (u16, u16),
) -> Result<Vec<u16>, DevEnvError> {
    // Listeners stay open until all ports are chosen, so the kernel hands out distinct ones.
    let mut held: Vec<TcpListener> = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < count {
        let listener = TcpListener::bind((LOOPBACK, 0))
            .map_err(|e| DevEnvError::Io("bind 127.0.0.1:0".into(), e))?;
        let port = listener
            .local_addr()
            .map_err(|e| DevEnvError::Io("local_addr".into(), e))?
            .port();
        held.push(listener);
        if !(min_worker..=max_worker).contains(&port) && !taken.contains(&port) {
            ports.push(port);
        }
    }
    Ok(ports)
}

/// The kernel's ephemeral port range (`bind(0)` ports and outgoing connections).
fn ephemeral_port_range() -> (u16, u16) {
    let text =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut bounds = text
        .split_whitespace()
        .filter_map(|n| n.parse::<u16>().ok());
    match (bounds.next(), bounds.next()) {
        (Some(low), Some(high)) if low <= high => (low, high),
        _ => (32768, 60999),
    }
}

/// A block of [`WORKER_PORT_COUNT`] ports outside the ephemeral range that are free now and
/// overlap none of `avoid`. The start depends on our pid and a counter, so heads of parallel
/// test processes differ.
fn pick_worker_port_range(avoid: &[(u16, u16)]) -> Result<(u16, u16), DevEnvError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let (ephemeral_low, ephemeral_high) = ephemeral_port_range();
    let below = (
        20_000u32,
        u32::from(ephemeral_low).saturating_sub(u32::from(WORKER_PORT_COUNT)),
    );
    let above = (
        u32::from(ephemeral_high) + 1,
        65_535 - u32::from(WORKER_PORT_COUNT),
    );
    let (low, high) = if below.1 > below.0 { below } else { above };
    if high <= low {
        return Err(DevEnvError::Spawn(
            "ray".into(),
            "no room for worker ports outside the ephemeral port range".into(),
        ));
    }
    let blocks = (high - low) / u32::from(WORKER_PORT_COUNT);
    let seed = std::process::id().wrapping_mul(7919);
    for _ in 0..64 {
        let attempt = COUNTER.fetch_add(1, Ordering::Relaxed);
        let block = seed.wrapping_add(attempt.wrapping_mul(31)) % blocks.max(1);
        let start = low + block * u32::from(WORKER_PORT_COUNT);
        let (Ok(first), Ok(last)) = (
            u16::try_from(start),
            u16::try_from(start + u32::from(WORKER_PORT_COUNT) - 1),
        ) else {
            continue;
        };
        let overlaps = avoid.iter().any(|&(lo, hi)| first <= hi && lo <= last);
        if !overlaps && (first..=last).all(|port| TcpListener::bind((LOOPBACK, port)).is_ok()) {
            return Ok((first, last));
        }
    }
    Err(DevEnvError::Spawn(
        "ray".into(),
        format!("no free block of {WORKER_PORT_COUNT} worker ports found"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_outside_the_worker_range() {
        let ports = pick_ports().expect("ports");
        let listeners = ports.listeners();
        let distinct: BTreeSet<u16> = listeners.iter().copied().collect();
        assert_eq!(distinct.len(), listeners.len(), "{ports:?}");
        assert_eq!(ports.max_worker - ports.min_worker + 1, WORKER_PORT_COUNT);
        assert!(
            listeners
                .iter()
                .all(|p| !(ports.min_worker..=ports.max_worker).contains(p)),
            "{ports:?}"
        );
    }

    #[test]
    fn the_head_command_line_stays_on_loopback() {
        let ports = pick_ports().expect("ports");
        let args = ray_start_args(
            &ports,
            Path::new("/tmp/rp-ray-1-0"),
            &RayHeadOptions::default(),
        )
        .join(" ");
        assert!(args.starts_with("start --head --block "), "{args}");
        assert!(args.contains("--node-ip-address=127.0.0.1"));
        assert!(args.contains("--dashboard-host=127.0.0.1"));
        assert!(args.contains(&format!("--dashboard-port={}", ports.dashboard)));
        assert!(args.contains("--temp-dir=/tmp/rp-ray-1-0"));
    }

    #[test]
    fn worker_node_ports_avoid_the_head_and_stay_on_loopback() {
        let head = pick_ports().expect("ports");
        let node = pick_worker_node_ports(&head.listeners(), &[(head.min_worker, head.max_worker)])
            .expect("worker node ports");
        let listeners = node.listeners();
        let distinct: BTreeSet<u16> = listeners.iter().copied().collect();
        assert_eq!(distinct.len(), listeners.len(), "{node:?}");
        for port in &listeners {
            assert!(!head.listeners().contains(port), "{node:?} vs {head:?}");
            assert!(!(head.min_worker..=head.max_worker).contains(port));
            assert!(!(node.min_worker..=node.max_worker).contains(port));
        }
        assert!(node.max_worker < head.min_worker || head.max_worker < node.min_worker);
        let args = worker_node_start_args(
            "127.0.0.1:6379",
            &node,
            Path::new("/tmp/rp-ray-1-0"),
            &RayHeadOptions {
                worker_node_num_cpus: Some(2),
                ..Default::default()
            },
        )
        .join(" ");
        assert!(
            args.starts_with("start --address=127.0.0.1:6379 --block --node-ip-address=127.0.0.1 "),
            "{args}"
        );
        assert!(!args.contains("--head"), "{args}");
        assert!(args.contains(&format!("--node-manager-port={}", node.node_manager)));
        assert!(args.contains(&format!(
            "--runtime-env-agent-port={}",
            node.runtime_env_agent
        )));
        assert!(args.contains("--num-cpus=2"));
    }

    #[test]
    fn alive_nodes_are_counted_from_the_state_api() {
        let body = serde_json::json!({"data": {"result": {"result": [
            {"node_id": "a", "state": "ALIVE"},
            {"node_id": "b", "state": "DEAD"},
            {"node_id": "c", "state": "ALIVE"}
        ]}}});
        assert_eq!(alive_nodes(&body), 2);
        assert_eq!(alive_nodes(&serde_json::json!({})), 0);
    }

    #[test]
    fn own_processes_include_the_root_and_its_descendants() {
        let own = own_processes(std::process::id());
        assert!(own.iter().any(|p| p.pid == std::process::id()));
        let me = process_info(std::process::id()).expect("this process");
        assert!(is_alive(&me.identity()));
        assert!(!is_alive(&ProcessIdentity {
            pid: me.pid,
            start_time: me.start_time + 1
        }));
    }

    #[test]
    fn proc_net_addresses_are_decoded() {
        assert_eq!(
            parse_proc_ip("0100007F"),
            Some("127.0.0.1".parse().expect("ip"))
        );
        assert_eq!(
            parse_proc_ip("00000000"),
            Some("0.0.0.0".parse().expect("ip"))
        );
        assert_eq!(
            parse_proc_ip("0000000000000000FFFF00000100007F"),
            Some("::ffff:127.0.0.1".parse().expect("ip"))
        );
        assert_eq!(
            parse_proc_ip("00000000000000000000000001000000"),
            Some("::1".parse().expect("ip"))
        );
        let listener = TcpListener::bind((LOOPBACK, 0)).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert!(
            listening_sockets("/proc/net/tcp")
                .iter()
                .any(|(a, _)| a.port() == port && a.ip().is_loopback())
        );
    }

    #[test]
    fn the_temp_root_is_short_enough_for_unix_sockets() {
        assert!(temp_root().as_os_str().len() <= MAX_TEMP_ROOT_LEN);
    }
}
