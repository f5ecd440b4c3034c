//! Starting a [`RayHead`] (and its extra worker nodes), waiting until its dashboard serves
//! Serve and Jobs and its nodes have joined, inspecting its processes and ports, and stopping
//! it by the process ids it started.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::command::{
    env_command, node_environment, private_mount_command, ray_start_args, worker_node_start_args,
    write_private,
};
use super::ports::{RayWorkerNodePorts, pick_ports, pick_worker_node_ports};
use super::processes::{
    ProcessIdentity, is_alive, listening_sockets, own_processes, run_dir, stop_node,
};
use super::{LOOPBACK, RayHead, RayHeadOptions, RayHeadPorts, WorkerNode, locate_ray_version};
use crate::devenv::DevEnvError;
use crate::devenv::process::ManagedProcess;
use crate::ray::{DashboardClientOptions, DashboardUrl, RayDashboardClient};

/// `ray start` for extra worker nodes: joins a cluster on 127.0.0.1 (see the script).
const RAY_JOIN_SCRIPT: &str = include_str!("ray-join.py");

impl RayHead {
    /// Provisions Ray if needed, starts `ray start --head --block` and waits until the
    /// dashboard serves the Serve and Jobs APIs.
    pub async fn start(options: RayHeadOptions) -> Result<RayHead, DevEnvError> {
        let started = Instant::now();
        let ray_version = options.ray_version;
        let ray = tokio::task::spawn_blocking(move || locate_ray_version(ray_version))
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
        let process = ManagedProcess::start_with_env(
            "ray-head",
            &program,
            &args,
            &options.credential_env.pairs(),
            &log,
        )?;
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
            ray_version,
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

    /// The pinned Ray release this head runs (its venv's version).
    pub fn ray_version(&self) -> &'static str {
        self.ray_version
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
    /// workers in their own process groups), and removes its directory. Idempotent.
    pub fn stop(&self) {
        self.stop_processes();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Stops Ray as [`RayHead::stop`] does but keeps its directory (Ray's logs) until the head
    /// is dropped, as a Pod's `/tmp/ray` volume outlives the Ray container while its sidecars
    /// finish.
    pub fn stop_processes(&self) {
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
            let process = ManagedProcess::start_with_env(
                &format!("ray-worker-{index}"),
                Path::new("/usr/bin/env"),
                &args,
                &options.credential_env.pairs(),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
