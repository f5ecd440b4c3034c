//! `raypipe run`: the operator as deployed. The admin server (health, readiness, metrics) and
//! the webhook run on every replica; the controllers run only on the replica holding the
//! leader Lease (unless leader election is off). SIGTERM stops the controllers gracefully,
//! releases the Lease so another replica takes over at once, then stops the servers.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::watch;

use crate::admin::{self, Metrics, Readiness};
use crate::cli::RunArgs;
use crate::config::flags::WebhookArgs;
use crate::config::{ControllerKind, ControllerSettings};
use crate::leader::LeaderElector;
use crate::validation::feature_gates::FeatureGates;
use crate::webhook::{self, registration, tls};

/// How often a generated webhook certificate is checked for renewal.
const CERTIFICATE_CHECK_INTERVAL: Duration = Duration::from_secs(12 * 3600);
/// How often a certificate directory is re-read.
const CERTIFICATE_DIR_INTERVAL: Duration = Duration::from_secs(60);

/// Runs the operator with the client from `KUBECONFIG` or the in-cluster config, until SIGINT
/// or SIGTERM.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = kube::Config::infer()
        .await
        .context("reading the Kubernetes client configuration")?;
    let metrics = args.operator.admin.metrics();
    // KubeRay's --qps/--burst for what the operator reads and writes: a noisy reconcile storm
    // must not flood the API server. Events get a client and a limiter of their own, the same
    // size (as controller-runtime gives KubeRay's event recorder its own clientset), so they
    // never take the budget of the writes that make clusters.
    let rate = args.operator.client.rate();
    let build = |config: kube::Config| -> anyhow::Result<kube::Client> {
        // Inside the rate limiter: request latency is the API server's, not the limiter's wait.
        let builder = kube::client::ClientBuilder::try_from(config)
            .context("connecting to the Kubernetes API server")?
            .with_layer(&metrics.kube_client_layer());
        Ok(match rate {
            Some((requests, period)) => builder
                .with_layer(&tower::limit::RateLimitLayer::new(requests, period))
                .build(),
            None => builder.build(),
        })
    };
    let clients = crate::k8s::Clients {
        api: build(config.clone())?,
        events: build(config)?,
    };
    run_with_metrics(
        clients,
        metrics,
        args,
        crate::controllers::shutdown_signal(),
    )
    .await
}

/// Runs the operator on `client` until `shutdown` completes (or leadership is lost, or the
/// controllers fail: both end in an error so the process exits and is restarted).
pub async fn run_with_client(
    client: kube::Client,
    args: RunArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let metrics = args.operator.admin.metrics();
    run_with_metrics(client, metrics, args, shutdown).await
}

/// As [`run_with_client`], recording into `metrics` (the registry `client`'s request layer
/// records into).
pub async fn run_with_metrics(
    clients: impl Into<crate::k8s::Clients>,
    metrics: Metrics,
    args: RunArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let clients: crate::k8s::Clients = clients.into();
    let client = clients.api.clone();
    let readiness = Readiness::new();
    let operator = &args.operator;
    let operator_namespace = operator.scope.operator_namespace();

    // One stop signal for everything; the external shutdown feeds it.
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let forward_stop = stop_tx.clone();
    tokio::spawn(async move {
        shutdown.await;
        let _ = forward_stop.send(true);
    });

    let admin_listener = admin::bind(operator.admin.admin_address).await?;
    tracing::info!(address = %operator.admin.admin_address, "admin server listening (/healthz, /readyz, /metrics)");
    // The code layers the ServePipeline controller verifies are served from the admin port.
    let code_store = crate::pypackage::CodeStore::new(operator.source.code_memory_budget);
    let admin_task = tokio::spawn(admin::serve_with_code(
        admin_listener,
        metrics.clone(),
        readiness.clone(),
        Some(code_store.clone()),
        stopped(),
    ));

    let webhook_task = if operator.webhook.webhook {
        readiness.expect_webhook();
        Some(
            start_webhook(
                &client,
                &operator.webhook,
                &operator_namespace,
                operator.tuning.feature_gates.clone(),
                &metrics,
                &readiness,
                stopped(),
            )
            .await?,
        )
    } else {
        None
    };

    // Every replica checks the CRDs, so a standby is ready (and serves the webhook) too.
    crate::api::check_named_crds_installed(
        &client,
        &ControllerKind::needed_crds(&args.controllers.controllers),
    )
    .await?;
    readiness.set_crds_present();

    let history = if operator.tuning.record_history {
        // A store that cannot be built stops the start with its reason (before any controller).
        let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
        let store = crate::history::revisions::RevisionStore::from_env(&env)?;
        tracing::info!(
            backend = env
                .get("STORAGE_BACKEND")
                .map(String::as_str)
                .unwrap_or_default(),
            "recording pipeline history"
        );
        Some(crate::history::recorder::RecorderConfig {
            store,
            default_retention: crate::history::revisions::Retention {
                keep_revisions: operator.tuning.history_keep_revisions as usize,
                keep_days: operator.tuning.history_keep_days,
            },
        })
    } else {
        None
    };
    let settings = ControllerSettings {
        code_store,
        history,
        ..ControllerSettings::from_args(
            &args.controllers.controllers,
            operator,
            metrics.clone(),
            readiness.clone(),
        )
    };
    let console_task = match crate::console::config_from_args(
        &operator.console,
        settings
            .rayservice
            .as_ref()
            .map(|c| c.dashboard.clone())
            .or_else(|| settings.dashboard_locator().ok()),
        &operator.scope.namespaces,
    )? {
        Some(config) => {
            // Every replica serves the console: it only reads, so it needs no leadership.
            let client = client.clone();
            let stop = stopped();
            Some(tokio::spawn(async move {
                if let Err(e) = crate::console::serve(client, config, stop).await {
                    tracing::error!(error = %e, "console");
                }
            }))
        }
        None => None,
    };
    // A bad dashboard template fails the controllers' start, below, as it always did (the
    // servers are then stopped in order).
    let plan = settings.plan();
    tracing::info!(
        allowed_destinations = ?operator.source.source_allowed_destinations.allowed(),
        graph_memory_budget_bytes = operator.source.graph_memory_budget,
        "graph sources: public addresses and the allowed destinations only"
    );
    let result = if operator.leader.leader_election {
        let lease = operator.leader.lease_settings(&operator_namespace);
        let elector = LeaderElector::new(client.clone(), lease)?.with_metrics(metrics.clone());
        elector
            .run(stopped(), |stop| async move {
                crate::controllers::run(clients, plan?, stop.stopped()).await
            })
            .await
            .map_err(anyhow::Error::from)
    } else {
        metrics.set_leader(true);
        match plan {
            Ok(plan) => crate::controllers::run(clients, plan, stopped()).await,
            Err(e) => Err(e.into()),
        }
    };

    let _ = stop_tx.send(true);
    if let Ok(Err(e)) = admin_task.await {
        tracing::warn!(error = %e, "admin server");
    }
    if let Some(task) = console_task {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    if let Some(task) = webhook_task {
        // It stops on the same signal; in-flight reviews get a moment to finish.
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    result
}

/// Loads or generates the certificate, fills in the CA bundle, and starts serving.
async fn start_webhook(
    client: &kube::Client,
    args: &WebhookArgs,
    operator_namespace: &str,
    gates: FeatureGates,
    metrics: &Metrics,
    readiness: &Readiness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = webhook::bind(args.webhook_address).await?;
    let (resolver, keeper) = match &args.webhook_cert_dir {
        Some(dir) => {
            let bundle = tls::read_dir(dir)?;
            let resolver = tls::CertificateResolver::new(&bundle)?;
            let keeper = tokio::spawn(tls::watch_dir(
                dir.clone(),
                resolver.clone(),
                CERTIFICATE_DIR_INTERVAL,
            ));
            (resolver, keeper)
        }
        None => {
            let names = tls::service_dns_names(&args.webhook_service, operator_namespace);
            let secret = args.webhook_cert_secret.clone();
            let bundle = tls::from_secret(client, operator_namespace, &secret, &names, &[]).await?;
            if let Some(configuration) = &args.webhook_configuration {
                registration::inject_ca_bundle(client, configuration, &bundle.ca_pem).await?;
            }
            let resolver = tls::CertificateResolver::new(&bundle)?;
            let keeper = tokio::spawn(keep_generated_certificate(
                client.clone(),
                operator_namespace.to_owned(),
                secret,
                names,
                args.webhook_configuration.clone(),
                resolver.clone(),
                bundle,
            ));
            (resolver, keeper)
        }
    };
    let server = webhook::serve(listener, resolver, gates, metrics.clone(), shutdown);
    readiness.set_webhook_serving();
    tracing::info!(address = %args.webhook_address, "webhook server listening");
    Ok(tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "webhook server");
        }
        keeper.abort();
    }))
}

/// Renews the generated certificate before it expires (whichever replica gets there first
/// writes the Secret; the others pick it up) and keeps the CA bundle in step.
async fn keep_generated_certificate(
    client: kube::Client,
    namespace: String,
    secret: String,
    names: Vec<String>,
    configuration: Option<String>,
    resolver: Arc<tls::CertificateResolver>,
    mut current: tls::CertificateBundle,
) {
    loop {
        tokio::time::sleep(CERTIFICATE_CHECK_INTERVAL).await;
        let bundle = match tls::from_secret(&client, &namespace, &secret, &names, &[]).await {
            Ok(bundle) => bundle,
            Err(e) => {
                tracing::warn!(error = %e, "checking the webhook certificate");
                continue;
            }
        };
        if bundle == current {
            continue;
        }
        if let Some(configuration) = &configuration
            && let Err(e) =
                registration::inject_ca_bundle(&client, configuration, &bundle.ca_pem).await
        {
            tracing::warn!(error = %e, "updating the webhook CA bundle");
            continue;
        }
        match resolver.set(&bundle) {
            Ok(()) => current = bundle,
            Err(e) => tracing::warn!(error = %e, "the renewed webhook certificate is unusable"),
        }
    }
}
