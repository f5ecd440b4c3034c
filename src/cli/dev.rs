//! `raypipe dev`: one command for a local playground. Starts a real control plane on 127.0.0.1
//! (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok with one fake Node),
//! installs the CRDs, runs the controllers in-process and prints how to reach it. Ctrl-C stops
//! everything it started.

use std::path::PathBuf;

use crate::cli::ControllerKind;
use crate::testenv::{ControlPlane, ControlPlaneOptions};

#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// Where to write the admin kubeconfig (default: `<cache>/dev/kubeconfig`, a stable path
    /// across restarts).
    #[arg(long, env = "RAYPIPE_DEV_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Controllers to run in-process (comma separated).
    #[arg(
        long,
        env = "RAYPIPE_CONTROLLERS",
        value_delimiter = ',',
        default_value = "servepipeline,raycluster,rayservice,rayjob,raycronjob"
    )]
    pub controllers: Vec<ControllerKind>,
    /// Start only etcd and kube-apiserver (no controller-manager, scheduler or kwok).
    #[arg(long)]
    pub minimal: bool,
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let options = if args.minimal {
        ControlPlaneOptions::default()
    } else {
        ControlPlaneOptions::full()
    };
    let started = std::time::Instant::now();
    eprintln!("raypipe dev: starting a local control plane on 127.0.0.1 …");
    let plane = ControlPlane::start(options).await?;
    let kubeconfig = args.kubeconfig.unwrap_or_else(|| {
        crate::testenv::binaries::cache_root()
            .join("dev")
            .join("kubeconfig")
    });
    if let Some(parent) = kubeconfig.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(&plane.kubeconfig, &kubeconfig)?;
    let kubectl = plane
        .binaries
        .kubectl
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "kubectl".to_owned());
    let pids: Vec<String> = plane
        .pids()
        .iter()
        .map(|(n, p)| format!("{n}={p}"))
        .collect();
    println!(
        "raypipe dev: ready in {:.1}s (API server {}; processes {})\n\n  export KUBECONFIG={}\n  alias kubectl={}\n  kubectl get crds\n  kubectl apply --server-side -f samples/\n  kubectl get servepipelines,rayservices,rayclusters,pods -A\n\nPress Ctrl-C to stop everything.",
        started.elapsed().as_secs_f64(),
        plane.api_url,
        pids.join(" "),
        kubeconfig.display(),
        kubectl,
    );
    let client = plane.client().await?;
    let result = crate::controllers::run_with_client(
        client,
        &args.controllers,
        crate::controllers::shutdown_signal(),
    )
    .await;
    eprintln!("raypipe dev: stopping the control plane …");
    drop(plane);
    let _ = std::fs::remove_file(&kubeconfig);
    eprintln!("raypipe dev: stopped");
    result
}
