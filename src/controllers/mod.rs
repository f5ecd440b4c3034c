//! One reconciler per kind; `run` starts the instances `config` planned (controllers read
//! their settings from their `Config`, never from the environment or the command line).

pub mod dashboard;
pub mod frame;
pub mod raycluster;
pub mod raycronjob;
pub mod rayjob;
pub mod rayservice;
pub mod servepipeline;

/// One controller instance to start, with its complete settings (built by `config`).
pub enum Instance {
    Servepipeline(servepipeline::Config),
    Raycluster(raycluster::Config),
    Rayservice(rayservice::Config),
    Rayjob(rayjob::Config),
    Raycronjob(raycronjob::Config),
}

impl Instance {
    /// The controller's name in logs and health reports.
    pub fn name(&self) -> &'static str {
        match self {
            Instance::Servepipeline(_) => "servepipeline",
            Instance::Raycluster(_) => "raycluster",
            Instance::Rayservice(_) => "rayservice",
            Instance::Rayjob(_) => "rayjob",
            Instance::Raycronjob(_) => "raycronjob",
        }
    }

    /// The namespace it watches (`None`: all).
    fn namespace(&self) -> Option<&str> {
        match self {
            Instance::Servepipeline(c) => c.namespace.as_deref(),
            Instance::Raycluster(c) => c.namespace.as_deref(),
            Instance::Rayservice(c) => c.namespace.as_deref(),
            Instance::Rayjob(c) => c.namespace.as_deref(),
            Instance::Raycronjob(c) => c.namespace.as_deref(),
        }
    }
}

/// Everything [`run`] starts: the instances, the CRDs they need, and where health is reported.
pub struct Plan {
    pub instances: Vec<Instance>,
    /// Names of the CRDs the instances read or write (checked before any starts).
    pub crds: Vec<String>,
    pub readiness: crate::admin::Readiness,
    /// The history recorder and the namespaces it watches (all when empty), when it runs.
    pub history: Option<(crate::history::recorder::RecorderConfig, Vec<String>)>,
}

/// Runs every instance of `plan` until `shutdown` completes. Dropping the returned future
/// aborts every controller task (a leader that lost its lease must stop at once).
pub async fn run(
    clients: impl Into<crate::k8s::Clients>,
    plan: Plan,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let clients: crate::k8s::Clients = clients.into();
    crate::api::check_named_crds_installed(&clients.api, &plan.crds).await?;
    plan.readiness.set_crds_present();
    let mut controllers: Vec<&str> = plan.instances.iter().map(Instance::name).collect();
    controllers.dedup();
    let mut namespaces: Vec<&str> = plan
        .instances
        .iter()
        .filter_map(Instance::namespace)
        .collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    tracing::info!(?controllers, ?namespaces, "raypipe controllers started");
    // Every controller stops on the same shutdown signal.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // A controller task that ends before `stop_tx` fires fails `/healthz`.
    let supervisor = frame::Supervisor::new(plan.readiness.clone(), stop_rx.clone());
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let mut tasks = Vec::new();
    for instance in plan.instances {
        let name = instance.name();
        let client = clients.clone();
        let task = match instance {
            Instance::Servepipeline(config) => {
                tokio::spawn(supervisor.watch(name, servepipeline::run(client, config, stopped())))
            }
            Instance::Raycluster(config) => {
                tokio::spawn(supervisor.watch(name, raycluster::run(client, config, stopped())))
            }
            Instance::Rayservice(config) => {
                tokio::spawn(supervisor.watch(name, rayservice::run(client, config, stopped())))
            }
            Instance::Rayjob(config) => {
                tokio::spawn(supervisor.watch(name, rayjob::run(client, config, stopped())))
            }
            Instance::Raycronjob(config) => {
                tokio::spawn(supervisor.watch(name, raycronjob::run(client, config, stopped())))
            }
        };
        tasks.push(task);
    }
    // The recorder only reads: it stops with the controllers and never fails them.
    let recorder = plan.history.map(|(config, namespaces)| {
        tokio::spawn(crate::history::recorder::run(
            clients.api.clone(),
            config,
            namespaces,
            stopped(),
        ))
    });
    let _abort_on_drop = AbortOnDrop(
        tasks
            .iter()
            .map(|t| t.abort_handle())
            .chain(recorder.as_ref().map(|t| t.abort_handle()))
            .collect(),
    );
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
        if let Some(recorder) = recorder {
            let _ = recorder.await;
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
