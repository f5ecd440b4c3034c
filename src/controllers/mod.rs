//! One reconciler per kind; `run` starts the enabled ones.

use crate::cli::RunArgs;

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
    shutdown.await;
    tracing::info!("shutting down");
    Ok(())
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
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
