//! The command line and environment of each Ray node of a head (the head itself and its
//! extra worker nodes): every listener and advertised address on loopback, Ray settings of
//! the calling environment dropped, and the optional private mount namespace.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::ports::{RayHeadPorts, RayWorkerNodePorts};
use super::{LOOPBACK, RayHeadOptions};
use crate::devenv::DevEnvError;

/// Loaded by every Python process of a head: moves the gRPC servers Ray Serve opens on every
/// interface (no setting for that in Ray 2.60) to 127.0.0.1.
const LOOPBACK_SITECUSTOMIZE: &str = include_str!("sitecustomize.py");

const INHERITED_RAY_VARIABLES_TO_DROP: [&str; 4] = [
    "RAY_ADDRESS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
];

/// The environment of every Ray process of a head and its worker nodes.
pub(super) fn node_environment(
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
    // The Serve settings a ServePipeline's cluster gets, so local runs behave as deployed
    // ones; a value in the calling environment or the options wins.
    for (name, value) in crate::serve::SERVE_ENV_DEFAULTS {
        if std::env::var_os(name).is_none() {
            env.insert((*name).into(), (*value).into());
        }
    }
    env.extend(options.env.iter().cloned());
    Ok(env)
}

/// `/usr/bin/env` arguments that run `ray ARGS…` with exactly `env` on top of ours. `env` sets
/// the variables and execs `ray` (same pid): ManagedProcess inherits ours. Ray settings of
/// the calling environment (an address to join, a token mode) must not leak into a head that
/// is meant to stand alone.
pub(super) fn env_command(
    env: &BTreeMap<String, String>,
    ray: &Path,
    ray_args: Vec<String>,
) -> Vec<String> {
    let mut args: Vec<String> = INHERITED_RAY_VARIABLES_TO_DROP
        .iter()
        .flat_map(|name| ["-u".to_owned(), (*name).to_owned()])
        .collect();
    args.extend(env.iter().map(|(key, value)| format!("{key}={value}")));
    args.push(ray.display().to_string());
    args.extend(ray_args);
    args
}

/// `ray start` for a worker node joining `gcs_address`, everything on loopback.
pub(super) fn worker_node_start_args(
    gcs_address: &str,
    ports: &RayWorkerNodePorts,
    dir: &Path,
    options: &RayHeadOptions,
) -> Vec<String> {
    let mut args: Vec<String> = vec!["start".into(), format!("--address={gcs_address}")];
    args.extend(node_args(ports, dir, options, options.worker_node_num_cpus));
    args
}

pub(super) fn ray_start_args(
    ports: &RayHeadPorts,
    dir: &Path,
    options: &RayHeadOptions,
) -> Vec<String> {
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
pub(super) fn private_mount_command(
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
pub(super) fn node_args(
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

pub(super) fn write_private(path: &Path, contents: &str) -> Result<(), DevEnvError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devenv::ray::ports::{pick_ports, pick_worker_node_ports};
    use std::collections::BTreeSet;

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
}
