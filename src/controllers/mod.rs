//! One reconciler per kind; `run` starts the enabled ones.

pub mod dashboard;
pub mod frame;
pub mod raycluster;
pub mod raycronjob;
pub mod rayjob;
pub mod rayservice;
pub mod servepipeline;

use crate::cli::ControllerKind;
use crate::config::ControllerSettings;

/// Runs the given controllers on `client`, on all namespaces, until `shutdown` completes
/// (`raypipe dev`; `raypipe run` adds leader election, admin and webhook servers around
/// [`run_with_settings`]).
pub async fn run_with_client(
    client: kube::Client,
    controllers: &[crate::cli::ControllerKind],
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    run_with_settings(client, &ControllerSettings::new(controllers), shutdown).await
}

/// Runs the controllers of `settings` until `shutdown` completes: one instance per watched
/// namespace (or one for all). Dropping the returned future aborts every controller task (a
/// leader that lost its lease must stop at once).
pub async fn run_with_settings(
    client: kube::Client,
    settings: &ControllerSettings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let controllers = &settings.controllers;
    check_crds(&client, controllers).await?;
    settings.readiness.set_crds_present();
    tracing::info!(?controllers, namespaces = ?settings.namespaces, "raypipe controllers started");
    // Every controller stops on the same shutdown signal.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // A controller task that ends before `stop_tx` fires fails `/healthz`.
    let supervisor = frame::Supervisor::new(settings.readiness.clone(), stop_rx.clone());
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let mut tasks = Vec::new();
    for kind in controllers {
        match kind {
            ControllerKind::Servepipeline => {
                for namespace in settings.scopes() {
                    tasks.push(tokio::spawn(supervisor.watch(
                        "servepipeline",
                        servepipeline::run(
                            client.clone(),
                            servepipeline::Config {
                                namespace,
                                runtime_import_path: settings.runtime_import_path.clone(),
                                runtime_py_modules: settings.runtime_py_modules.clone(),
                                concurrency: settings.concurrency,
                                metrics: settings.metrics.clone(),
                                readiness: settings.readiness.clone(),
                                fetcher: settings.fetcher.clone(),
                            },
                            stopped(),
                        ),
                    )))
                }
            }
            ControllerKind::Raycluster => {
                for namespace in settings.scopes() {
                    tasks.push(tokio::spawn(supervisor.watch(
                        "raycluster",
                        raycluster::run(
                            client.clone(),
                            {
                                let mut config = raycluster::Config {
                                    namespace,
                                    concurrency: settings.concurrency,
                                    metrics: settings.metrics.clone(),
                                    ..raycluster::Config::from_env()
                                };
                                settings.configuration.apply_to(&mut config.build);
                                config
                            },
                            stopped(),
                        ),
                    )))
                }
            }
            ControllerKind::Rayservice => {
                let base = match &settings.rayservice {
                    Some(config) => config.clone(),
                    None => rayservice_config(settings)?,
                };
                for namespace in settings.scopes() {
                    tasks.push(tokio::spawn(supervisor.watch(
                        "rayservice",
                        rayservice::run(
                            client.clone(),
                            rayservice::Config {
                                namespace,
                                concurrency: settings.concurrency,
                                metrics: settings.metrics.clone(),
                                ..base.clone()
                            },
                            stopped(),
                        ),
                    )))
                }
            }
            ControllerKind::Rayjob => {
                let locator = settings.dashboard_locator()?;
                for namespace in settings.scopes() {
                    tasks.push(tokio::spawn(
                        supervisor.watch(
                            "rayjob",
                            rayjob::run(
                                client.clone(),
                                rayjob::Config {
                                    namespace,
                                    concurrency: settings.concurrency,
                                    locator: locator.clone(),
                                    deletion_policy: settings
                                        .feature_gates
                                        .enabled(crate::validation::feature_gates::gates::RAY_JOB_DELETION_POLICY),
                                    ..rayjob::Config::from_env()
                                },
                                stopped(),
                            ),
                        ),
                    ))
                }
            }
            ControllerKind::Raycronjob => {
                for namespace in settings.scopes() {
                    tasks.push(tokio::spawn(supervisor.watch(
                        "raycronjob",
                        raycronjob::run(
                            client.clone(),
                            raycronjob::Config {
                                namespace,
                                concurrency: settings.concurrency,
                                ..raycronjob::Config::default()
                            },
                            stopped(),
                        ),
                    )))
                }
            }
        }
    }
    let _abort_on_drop = AbortOnDrop(tasks.iter().map(|t| t.abort_handle()).collect());
    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    // In-flight reconciles finish, but a stop must not wait on them for long (a graph download
    // may be retrying for a minute): past the drain time the rest is aborted, well inside a
    // Pod's default 30 s termination grace period.
    let drain = async {
        for task in &mut tasks {
            let _ = task.await;
        }
    };
    if tokio::time::timeout(SHUTDOWN_DRAIN, drain).await.is_err() {
        tracing::warn!(
            seconds = SHUTDOWN_DRAIN.as_secs(),
            "controllers did not stop in time; aborting them"
        );
    }
    Ok(())
}

/// The RayService controller's settings from the operator's flags and environment.
fn rayservice_config(settings: &ControllerSettings) -> anyhow::Result<rayservice::Config> {
    Ok(rayservice::Config {
        dashboard: settings.dashboard_locator()?,
        runtime_env_mirrors: settings.runtime_env_mirrors.clone(),
        feature_gates: settings.feature_gates.clone(),
        ..rayservice::Config::from_env()?
    })
}

/// Fails with a clear message when a CRD that one of `controllers` needs is missing.
pub async fn check_crds(
    client: &kube::Client,
    controllers: &[ControllerKind],
) -> anyhow::Result<()> {
    let mut needed: Vec<String> = controllers
        .iter()
        .flat_map(|c| c.crd_names())
        .map(|n| (*n).to_owned())
        .collect();
    needed.sort();
    needed.dedup();
    crate::api::check_named_crds_installed(client, &needed).await
}

/// How long a stop waits for in-flight reconciles before aborting them.
const SHUTDOWN_DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Aborts the controller tasks when dropped; after a normal shutdown they have ended already.
struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM. The handlers are installed when this is called,
/// not when the future is first polled, so a signal arriving in between is not lost (and does
/// not kill the process with its default action). Call it inside a Tokio runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let interrupt = signal(SignalKind::interrupt());
        let terminate = signal(SignalKind::terminate());
        async move {
            match (interrupt, terminate) {
                (Ok(mut interrupt), Ok(mut terminate)) => {
                    tokio::select! {
                        _ = interrupt.recv() => {},
                        _ = terminate.recv() => {},
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
