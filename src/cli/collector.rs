//! `raypipe collector`: the history collector sidecar (see `history::collector`). It reads the
//! variables KubeRay's operator gives its collector container, so the same Pod wiring runs
//! either image; the storage settings (`STORAGE_BACKEND`, `S3_*`, `GCS_BUCKET`, `AZURE_*`,
//! `OSS_*`, raypipe's `RAYPIPE_HISTORY_LOCAL_DIR`) come from the environment.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::history::collector::{CollectorConfig, Counters, run};
use crate::history::layout::{ClusterIdentity, is_safe_part};
use crate::history::sink::Sink;
use crate::history::spool::SpoolConfig;
use crate::history::store;
use crate::validation::duration::parse_duration;

#[derive(Debug, Clone, clap::Args)]
pub struct CollectorArgs {
    /// The RayCluster whose Pod this is.
    #[arg(long, env = "RAY_CLUSTER_NAME")]
    pub cluster_name: String,
    #[arg(long, env = "RAY_CLUSTER_NAMESPACE", default_value = "default")]
    pub cluster_namespace: String,
    /// `RayJob` or `RayService` when one made the cluster (with --owner-name).
    #[arg(long, env = "OWNER_KIND", requires = "owner_name")]
    pub owner_kind: Option<String>,
    #[arg(long, env = "OWNER_NAME", requires = "owner_kind")]
    pub owner_name: Option<String>,
    /// The port Ray's dashboard agent posts events to (`http://localhost:<port>/v1/events`).
    #[arg(long, env = "EVENTS_PORT", default_value_t = 8084)]
    pub events_port: u16,
    /// The address to listen on; a sidecar shares the Pod's network, so any.
    #[arg(
        long,
        env = "RAYPIPE_COLLECTOR_BIND_ADDRESS",
        default_value = "0.0.0.0"
    )]
    pub bind_address: IpAddr,
    /// Prefix of every key in the bucket.
    #[arg(long, env = "STORAGE_ROOT_DIR", default_value = "")]
    pub storage_root_dir: String,
    /// Where events are spooled before upload.
    #[arg(
        long,
        env = "RAY_COLLECTOR_EVENT_DATA_DIR",
        default_value = "/tmp/ray/event-data"
    )]
    pub event_data_dir: PathBuf,
    /// An event file is closed for upload this long after it was opened (Go duration).
    #[arg(long, env = "RAY_COLLECTOR_EVENT_ROTATION_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub event_rotation_interval: Duration,
    #[arg(
        long,
        env = "RAY_COLLECTOR_EVENT_MAX_FILE_SIZE_MB",
        default_value_t = 100
    )]
    pub event_max_file_size_mb: u64,
    /// New events are refused (Ray keeps and resends them) while this much waits on disk.
    #[arg(long, env = "RAY_COLLECTOR_EVENT_MAX_DISK_MB", default_value_t = 200)]
    pub event_max_disk_mb: u64,
    /// Ray's temp root, whose `session_*/logs` are shipped.
    #[arg(long, env = "RAY_TMP_ROOT", default_value = "/tmp/ray")]
    pub ray_tmp_root: PathBuf,
    /// How often changed session logs are shipped while Ray runs (Go duration).
    #[arg(long, env = "PUSH_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub push_interval: Duration,
    /// How long shutdown may spend on the last uploads (Go duration).
    #[arg(long, env = "RAYPIPE_COLLECTOR_DRAIN_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
}

impl CollectorArgs {
    fn identity(&self) -> anyhow::Result<ClusterIdentity> {
        for (what, value) in [
            ("RAY_CLUSTER_NAME", Some(&self.cluster_name)),
            ("RAY_CLUSTER_NAMESPACE", Some(&self.cluster_namespace)),
            ("OWNER_NAME", self.owner_name.as_ref()),
        ] {
            if let Some(value) = value
                && !is_safe_part(value)
            {
                anyhow::bail!("{what} {value:?} is not a Kubernetes name");
            }
        }
        let owner = match (&self.owner_kind, &self.owner_name) {
            (Some(kind), Some(name)) => {
                if !matches!(kind.to_lowercase().as_str(), "rayjob" | "rayservice") {
                    anyhow::bail!("OWNER_KIND {kind:?} is neither RayJob nor RayService");
                }
                Some((kind.clone(), name.clone()))
            }
            _ => None,
        };
        Ok(ClusterIdentity {
            namespace: self.cluster_namespace.clone(),
            cluster: self.cluster_name.clone(),
            owner,
        })
    }
}

pub async fn run_collector(args: CollectorArgs) -> anyhow::Result<()> {
    let identity = args.identity()?;
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let store = store::from_env(&env).context("the history store")?;
    let sink = Sink::new(store, &args.storage_root_dir);
    let config = CollectorConfig {
        identity,
        listen: SocketAddr::new(args.bind_address, args.events_port),
        spool: SpoolConfig {
            dir: args.event_data_dir.clone(),
            rotate_after: args.event_rotation_interval,
            max_file_bytes: args.event_max_file_size_mb.saturating_mul(1 << 20),
            max_disk_bytes: args.event_max_disk_mb.saturating_mul(1 << 20),
        },
        ray_tmp_root: args.ray_tmp_root.clone(),
        log_interval: args.push_interval,
        drain_timeout: args.drain_timeout,
        fallback_node: fallback_node(),
    };
    run(
        config,
        sink,
        Arc::new(Counters::default()),
        crate::controllers::shutdown_signal(),
    )
    .await?;
    Ok(())
}

/// The node name used until Ray's events name the node: the Pod's IP, as KubeRay's operator
/// passes it.
fn fallback_node() -> String {
    std::env::var("POD_IP")
        .ok()
        .filter(|ip| !ip.is_empty())
        .map(|ip| format!("pod-{}", ip.replace(['.', ':'], "-")))
        .unwrap_or_else(|| "unknown-node".to_owned())
}
