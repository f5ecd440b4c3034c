//! One reconciler per kind; `run` starts the enabled ones.

pub mod servepipeline;

use crate::cli::{ControllerKind, RunArgs};

/// Runs the enabled controllers until SIGINT/SIGTERM.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    run_with_client(client, &args.controllers, shutdown_signal()).await
}

/// Runs the given controllers on `client` until `shutdown` completes.
pub async fn run_with_client(
    client: kube::Client,
    controllers: &[crate::cli::ControllerKind],
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Fail early with a clear message when the CRDs are missing.
    crate::api::check_crds_installed(&client).await?;
    tracing::info!(?controllers, "raypipe controllers started");
    // Every controller stops on the same shutdown signal.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let mut tasks = Vec::new();
    for kind in controllers {
        match kind {
            ControllerKind::Servepipeline => tasks.push(tokio::spawn(servepipeline::run(
                client.clone(),
                servepipeline::Config::default(),
                stopped(),
            ))),
            other => {
                tracing::warn!(controller = ?other, "this controller is not built yet; skipping it")
            }
        }
    }
    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    for task in tasks {
        let _ = task.await;
    }
    Ok(())
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
