//! `kubectl raypipe session` and `logs`: the serving cluster's head reached through the API
//! server's port-forward (kube's own client; no `kubectl`, no `ray` CLI).
//!
//! Each local connection opens its own port-forward to the head Pod found at that moment, so a
//! session outlives a dropped stream and follows the pipeline to a new cluster after an upgrade.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;
use tokio::net::{TcpListener, TcpStream};

use super::graph::{node_applications, pipeline_and_rayservice, running_graph};
use super::{GlobalArgs, Output, Target, print_structured};
use crate::kuberay::keys::labels;

/// Ray's dashboard port and Serve's HTTP port in the head container (KubeRay's defaults).
pub const DASHBOARD_PORT: u16 = 8265;
pub const SERVE_PORT: u16 = 8000;

#[derive(Debug, Clone, clap::Args)]
pub struct SessionArgs {
    pub name: String,
    /// Local port of the Ray dashboard (0: any free port).
    #[arg(long, default_value_t = DASHBOARD_PORT)]
    pub dashboard_port: u16,
    /// Local port of Serve's HTTP proxy (0: any free port).
    #[arg(long, default_value_t = SERVE_PORT)]
    pub serve_port: u16,
    /// Local address to listen on (keep it on loopback: anyone who reaches it reaches Ray).
    #[arg(long, default_value = "127.0.0.1")]
    pub address: std::net::IpAddr,
}

#[derive(Debug, Clone, clap::Args)]
pub struct LogsArgs {
    pub name: String,
    /// Only this node's replicas (a graph node name; the executor's name for the executor).
    #[arg(long)]
    pub node: Option<String>,
    /// Which version: `stable`, `canary` or a digest.
    #[arg(long = "version", default_value = "stable")]
    pub which: String,
    /// Lines from the end of each replica's log.
    #[arg(long, default_value_t = 100)]
    pub tail: u32,
}

/// Where the pipeline's serving cluster runs: the head Pod of its RayService's active cluster.
async fn head_pod(target: &Target, pipeline: &str) -> anyhow::Result<Pod> {
    let (_, rs) = pipeline_and_rayservice(target, pipeline).await?;
    let cluster = rs
        .status
        .clone()
        .and_then(|s| s.active_service_status)
        .and_then(|s| s.ray_cluster_name)
        .with_context(|| format!("RayService {} has no serving cluster yet", rs.name_any()))?;
    let (client, namespace) = (&target.client, &target.namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!(
        "{}={cluster},{}={}",
        labels::CLUSTER,
        labels::NODE_TYPE,
        labels::HEAD
    );
    pods.list(&ListParams::default().labels(&selector))
        .await
        .context("listing the head Pod")?
        .items
        .into_iter()
        .find(|pod| {
            pod.metadata.deletion_timestamp.is_none()
                && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .with_context(|| format!("RayCluster {cluster} has no running head Pod"))
}

/// A local listener; a port in use is said plainly, with the way out.
async fn listen(
    address: std::net::IpAddr,
    port: u16,
    what: &str,
    flag: &str,
) -> anyhow::Result<TcpListener> {
    match TcpListener::bind(SocketAddr::new(address, port)).await {
        Ok(listener) => Ok(listener),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => anyhow::bail!(
            "port {port} on {address} is busy (another session, or a local Ray?): choose another with {flag} <port>, or {flag} 0 for any free port"
        ),
        Err(e) => Err(e).with_context(|| format!("listening for the {what} on {address}:{port}")),
    }
}

/// Forwards one local connection to `remote` on the head Pod found now.
async fn forward(
    client: kube::Client,
    namespace: String,
    pipeline: String,
    mut local: TcpStream,
    remote: u16,
) -> anyhow::Result<()> {
    let target = Target { client, namespace };
    let pod = head_pod(&target, &pipeline).await?;
    let pods: Api<Pod> = Api::namespaced(target.client, &target.namespace);
    let mut forwarder = pods
        .portforward(&pod.name_any(), &[remote])
        .await
        .with_context(|| format!("port-forward to {}:{remote}", pod.name_any()))?;
    let upstream = forwarder
        .take_stream(remote)
        .context("the port-forward has no stream")?;
    // A port-forward stream never reports its end (the WebSocket stays open): the connection
    // is over when the local side closes, or if the stream does end.
    let (mut local_read, mut local_write) = local.split();
    let (mut up_read, mut up_write) = tokio::io::split(upstream);
    tokio::select! {
        _ = tokio::io::copy(&mut local_read, &mut up_write) => {}
        _ = tokio::io::copy(&mut up_read, &mut local_write) => {}
    }
    forwarder.abort();
    Ok(())
}

/// Accepts connections on `listener` for ever, each forwarded on its own.
async fn serve_forward(
    listener: TcpListener,
    client: kube::Client,
    namespace: String,
    pipeline: String,
    remote: u16,
) {
    loop {
        let Ok((local, _)) = listener.accept().await else {
            continue;
        };
        let (client, namespace, pipeline) = (client.clone(), namespace.clone(), pipeline.clone());
        tokio::spawn(async move {
            if let Err(e) = forward(client, namespace, pipeline, local, remote).await {
                eprintln!(
                    "warning: a connection to port {remote} failed: {e:#}; the next one tries again"
                );
            }
        });
    }
}

/// One local port to forward to the head.
pub struct Forward {
    pub address: std::net::IpAddr,
    /// Local port (0: any free one).
    pub port: u16,
    /// The head's port.
    pub remote: u16,
    /// What it is and the flag that picks its local port, for errors.
    pub what: &'static str,
    pub flag: &'static str,
}

/// `forward`'s local port, forwarded to the head until the process ends; its address.
pub async fn forwarded(
    client: &kube::Client,
    namespace: &str,
    pipeline: &str,
    forward: Forward,
) -> anyhow::Result<SocketAddr> {
    let listener = listen(forward.address, forward.port, forward.what, forward.flag).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(serve_forward(
        listener,
        client.clone(),
        namespace.to_owned(),
        pipeline.to_owned(),
        forward.remote,
    ));
    Ok(bound)
}

pub async fn session(global: &GlobalArgs, args: SessionArgs) -> anyhow::Result<ExitCode> {
    let target = global.target().await?;
    // The head must exist now: a session to nothing is an error, not a silent wait.
    let pod = head_pod(&target, &args.name).await?;
    let dashboard = forwarded(
        &target.client,
        &target.namespace,
        &args.name,
        Forward {
            address: args.address,
            port: args.dashboard_port,
            remote: DASHBOARD_PORT,
            what: "Ray dashboard",
            flag: "--dashboard-port",
        },
    )
    .await?;
    let serve = forwarded(
        &target.client,
        &target.namespace,
        &args.name,
        Forward {
            address: args.address,
            port: args.serve_port,
            remote: SERVE_PORT,
            what: "Serve",
            flag: "--serve-port",
        },
    )
    .await?;
    match global.output {
        Output::Text => println!(
            "Ray dashboard: http://{dashboard}\nServe:         http://{serve}\n(head Pod {}; each connection follows the serving cluster; Ctrl-C ends the session)",
            pod.name_any()
        ),
        output => print_structured(
            output,
            &serde_json::json!({"dashboard": format!("http://{dashboard}"), "serve": format!("http://{serve}"), "headPod": pod.name_any()}),
        )?,
    }
    tokio::signal::ctrl_c().await.ok();
    Ok(ExitCode::SUCCESS)
}

/// One replica's log, as `logs` prints it with `--output json|yaml`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaLog {
    pub node: String,
    pub application: String,
    pub replica: String,
    pub state: String,
    pub lines: Vec<String>,
}

pub async fn logs(global: &GlobalArgs, args: LogsArgs) -> anyhow::Result<ExitCode> {
    let target = global.target().await?;
    let (pipeline, rayservice) = pipeline_and_rayservice(&target, &args.name).await?;
    let running = running_graph(&pipeline, &rayservice, &args.which)?;
    let mut wanted = node_applications(&rayservice, &running);
    if let Some(node) = &args.node {
        wanted.retain(|name, _| name == node);
        if wanted.is_empty() {
            anyhow::bail!(
                "{node:?} is not a node of {}'s graph {} (its nodes: {})",
                args.name,
                running.application,
                node_applications(&rayservice, &running)
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let dashboard = forwarded(
        &target.client,
        &target.namespace,
        &args.name,
        Forward {
            address: std::net::Ipv4Addr::LOCALHOST.into(),
            port: 0,
            remote: DASHBOARD_PORT,
            what: "Ray dashboard",
            flag: "--dashboard-port",
        },
    )
    .await?;
    let base = format!("http://{dashboard}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .context("an HTTP client")?;
    let details: serde_json::Value = serde_json::from_str(
        &http
            .get(format!("{base}/api/serve/applications/"))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .context("reading Serve's applications from the Ray dashboard")?
            .text()
            .await?,
    )
    .context("Serve's applications")?;
    let mut found = Vec::new();
    for (node, app) in &wanted {
        let replicas = details["applications"][app]["deployments"][node]["replicas"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for replica in replicas {
            let (Some(node_id), Some(path)) = (
                replica["node_id"].as_str(),
                replica["log_file_path"].as_str(),
            ) else {
                continue;
            };
            let url = reqwest::Url::parse_with_params(
                &format!("{base}/api/v0/logs/file"),
                &[
                    ("node_id", node_id),
                    ("filename", path.trim_start_matches('/')),
                    ("lines", &args.tail.to_string()),
                ],
            )?;
            let text = http
                .get(url)
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .with_context(|| format!("reading the log {path} of node {node}"))?
                .text()
                .await?;
            found.push(ReplicaLog {
                node: node.clone(),
                application: app.clone(),
                replica: replica["replica_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                state: replica["state"].as_str().unwrap_or_default().to_owned(),
                lines: text.lines().map(str::to_owned).collect(),
            });
        }
    }
    if found.is_empty() {
        anyhow::bail!(
            "Serve reports no replicas for {} of {} (yet)",
            args.node.as_deref().unwrap_or("any node"),
            args.name
        );
    }
    match global.output {
        Output::Text => {
            for log in &found {
                for line in &log.lines {
                    println!("[{} {}] {line}", log.node, log.replica);
                }
            }
        }
        output => print_structured(output, &serde_json::json!({"items": found}))?,
    }
    Ok(ExitCode::SUCCESS)
}
