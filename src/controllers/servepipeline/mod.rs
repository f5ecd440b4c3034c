//! The ServePipeline controller: token → fetch (conditional) → decode → validate → render →
//! RayService (server-side apply, owned) → status. Bad input never touches what runs: on any
//! fetch, validation or render failure the existing RayService is left exactly as it was.
//!
//! Layout: this file holds the settings, the error, the per-pipeline memory and `run` (watches);
//! `reconcile` reads the stages in order: `source` (Secrets, fetch, graph validation), `build`
//! (pure: RayService, Serve config, status), `apply`, `status` (write and Events).

mod apply;
pub mod build;
mod canary;
pub mod conditions;
mod fetches;
mod reconcile;
mod rollout;
mod source;
mod stats;
mod status;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Resource, ResourceExt};
use tracing::warn;

use crate::api::rayservice::RayService;
use crate::api::servepipeline::ServePipeline;
use crate::controllers::frame::memory::ObjectMemory;
use crate::controllers::frame::policy::{ReconcileError, Retry};
use crate::controllers::frame::run::{self, Frame};
use crate::graph::ValidatedGraph;
use crate::k8s::{LABEL_MANAGED_BY, MANAGED_BY, field_managers};
use crate::source::Fetcher;
use build::{AppliedGraph, reasons};
use conditions::Problem;
use fetches::FetchQueue;
pub use fetches::FetchSlots;

/// What one fetch ends in: a new valid graph, `None` when unchanged, or a problem (and whether
/// it is transient).
type FetchResult = Result<Option<GoodGraph>, (Problem, bool)>;

/// Longest message from untrusted input (registry, graph, spec) that reaches a log line; the
/// conditions keep at most 2 KiB too.
const MAX_LOGGED_MESSAGE: usize = 2048;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Apply(#[from] crate::k8s::K8sError),
    #[error("writing the status of {name}: {source}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A problem with the pipeline's input (source, graph, spec); already in its status.
    #[error("{reason}: {message}")]
    Input {
        reason: String,
        message: String,
        transient: bool,
    },
    /// A bug: the reconcile panicked; contained to this object (see `controllers::frame`).
    #[error(transparent)]
    Panicked(#[from] crate::controllers::frame::Panicked),
}

impl ReconcileError for Error {
    fn category(&self) -> &'static str {
        match self {
            Error::Read { .. } => "read",
            Error::Apply(_) => "apply",
            Error::Status { .. } => "status",
            Error::Input { .. } => "input",
            Error::Panicked(_) => "panic",
        }
    }

    /// Transient failures are retried with backoff (capped by the refresh interval, the
    /// frame's retry ceiling); others wait for a change (or the refresh).
    fn is_transient(&self) -> bool {
        match self {
            Error::Input { transient, .. } => *transient,
            _ => true,
        }
    }

    /// Nothing but a new spec fixes an invalid spec.
    fn requeue_hint(&self) -> Option<Retry> {
        matches!(self, Error::Input { reason, .. } if reason == reasons::INVALID_SPEC)
            .then_some(Retry::OnChange)
    }
}

/// Operator-wide settings for rendering pipelines.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Watch only this namespace (`None`: all namespaces).
    pub namespace: Option<String>,
    /// Import path of the graph runtime's application builder, and the `py_modules` URIs that
    /// deliver it; `None` keeps the renderer's defaults.
    pub runtime_import_path: Option<String>,
    pub runtime_py_modules: Vec<String>,
    /// Reconciliations run at once (0: no limit).
    pub concurrency: u16,
    pub metrics: crate::admin::Metrics,
    /// Told when the caches have synced.
    pub readiness: crate::admin::Readiness,
    /// Fetches the graphs; share one across instances (its memory budget is operator-wide).
    pub fetcher: Fetcher,
    /// The fetch slots (per namespace, per registry host, operator-wide); share one across
    /// instances so the bounds are operator-wide.
    pub fetch_slots: FetchSlots,
    /// Where a RayService's Serve proxy is (`<name>-serve-svc`, port 8000), for the canary
    /// routers' counters; `None`: its DNS name in `cluster.local`.
    pub serve: Option<crate::ray::DashboardLocator>,
    /// How often a rollout in progress is looked at (default 2 s).
    pub rollout_poll: Option<Duration>,
    /// The code layers served to Ray (shared with the package server), and the package
    /// server's base URL as Ray nodes reach it; `None`: code layers are refused.
    pub code_store: crate::pypackage::CodeStore,
    pub code_base_url: Option<String>,
}

impl Config {
    fn serve_locator(&self) -> crate::ray::DashboardLocator {
        self.serve
            .clone()
            .unwrap_or_else(crate::ray::DashboardLocator::in_cluster)
    }

    fn rollout_poll(&self) -> Duration {
        self.rollout_poll.unwrap_or(Duration::from_secs(2))
    }
}

/// The controller's name in metrics.
const METRICS_NAME: &str = "servepipeline";

/// What the controller remembers about one pipeline between reconciles. Lost on restart, which
/// costs one unconditional download per pipeline.
#[derive(Clone)]
struct PipelineState {
    /// Hash of everything that decides what to fetch: spec.source and the Secrets' versions.
    source_inputs: String,
    last_checked: Instant,
    good: Option<GoodGraph>,
    /// With a canary policy: the graph of the stable version, while it is in memory.
    stable: Option<GoodGraph>,
    /// The last problem an Event was published for, so a persisting failure is announced once.
    announced_problem: Option<(String, String)>,
    /// The latest fetch's problem (and whether it is transient), shown while the next fetch runs.
    last_problem: Option<(Problem, bool)>,
}

#[derive(Clone)]
struct GoodGraph {
    graph: Arc<ValidatedGraph>,
    applied: AppliedGraph,
}

pub struct Context {
    client: kube::Client,
    fetcher: Fetcher,
    recorder: crate::k8s::EventRecorder,
    config: Config,
    secrets: Store<PartialObjectMeta<Secret>>,
    /// Per pipeline, reset when its uid changes (see `frame::memory`).
    state: ObjectMemory<Option<PipelineState>>,
    /// Per pipeline, the last ended rollout counted in the rollouts metric.
    counted_rollout: ObjectMemory<Option<String>>,
    frame: Frame<ServePipeline>,
    /// Fetches in flight, outside the reconcile workers.
    fetches: FetchQueue<FetchResult>,
    /// The canary routers' counters, read outside the reconcile workers.
    stats: stats::StatsReaders,
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    clients: impl Into<crate::k8s::Clients>,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let crate::k8s::Clients {
        api: client,
        events,
    } = clients.into();
    let pipelines: Api<ServePipeline> =
        crate::k8s::scoped_api(&client, config.namespace.as_deref());
    let rayservices: Api<RayService> = crate::k8s::scoped_api(&client, config.namespace.as_deref());
    let secrets: Api<PartialObjectMeta<Secret>> = match config.namespace.as_deref() {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };

    // Only the metadata of Secrets is watched: enough to see a rotation, without caching values.
    let (secret_store, secret_writer) = reflector::store();
    let secret_events = watcher(secrets, watcher::Config::default())
        .backoff(crate::k8s::watch_backoff())
        .reflect(secret_writer)
        .touched_objects();

    // Our own status writes do not change the generation: filtering on it avoids a hot loop.
    let (pipeline_store, pipeline_writer) = reflector::store();
    let pipeline_stream = watcher(pipelines, watcher::Config::default())
        .backoff(crate::k8s::watch_backoff())
        .reflect(pipeline_writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let frame = Frame::new(METRICS_NAME, &config.metrics).with_retry_ceiling(refresh_interval);
    let queue = frame.queue().clone();
    let pipeline_stream = {
        let queue = queue.clone();
        pipeline_stream.inspect(move |p| {
            if let Ok(p) = p {
                queue.changed(p.namespace(), p.name_any());
            }
        })
    };
    let rayservice_events = {
        let queue = queue.clone();
        watcher(
            rayservices,
            watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}")),
        )
        .backoff(crate::k8s::watch_backoff())
        .touched_objects()
        .inspect(move |rs| {
            if let Ok(rs) = rs {
                queue.owner_changed(rs.meta(), "ServePipeline");
            }
        })
    };
    let secret_queue = queue.clone();
    let store_for_secrets = pipeline_store.clone();
    frame.track_ready(&config.readiness, pipeline_store.clone());
    frame.track_ready(&config.readiness, secret_store.clone());
    let _phases = config.metrics.observe_pipelines(pipeline_store.clone());
    let controller_config =
        kube::runtime::controller::Config::default().concurrency(config.concurrency);

    let (fetches, fetched) = FetchQueue::new(config.fetch_slots.clone());
    let ctx = Arc::new(Context {
        client: client.clone(),
        fetcher: config.fetcher.clone(),
        recorder: crate::k8s::recorder(events.clone(), field_managers::SERVEPIPELINE),
        config,
        secrets: secret_store,
        state: ObjectMemory::new(),
        counted_rollout: ObjectMemory::new(),
        frame,
        fetches,
        stats: Default::default(),
    });

    let controller = Controller::for_stream(pipeline_stream, pipeline_store)
        .trigger_backoff(crate::k8s::watch_backoff())
        .with_config(controller_config)
        .owns_stream(rayservice_events)
        // A finished fetch brings its pipeline back.
        .reconcile_on(fetched)
        .watches_stream(secret_events, move |secret: PartialObjectMeta<Secret>| {
            let ns = secret.namespace();
            let name = secret.name_any();
            store_for_secrets
                .state()
                .into_iter()
                .filter(|p| p.namespace() == ns && references_secret(p, &name))
                .map(|p| {
                    secret_queue.changed(p.namespace(), p.name_any());
                    ObjectRef::from_obj(&*p)
                })
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown);
    crate::controllers::frame::run::drive(controller, reconcile::reconcile, ctx).await;
}

fn references_secret(pipeline: &ServePipeline, secret: &str) -> bool {
    let source = &pipeline.spec.source;
    source
        .bearer_token_secret_ref
        .as_ref()
        .is_some_and(|r| r.name == secret)
        || source
            .ca_bundle_secret_ref
            .as_ref()
            .is_some_and(|r| r.name == secret)
}

impl run::Framed<ServePipeline> for Context {
    fn frame(&self) -> &Frame<ServePipeline> {
        &self.frame
    }
}

impl crate::controllers::frame::ReportPanic<ServePipeline> for Context {
    /// A Warning Event, and `Ready` False with reason `ReconcilePanicked` in the pipeline's
    /// status (the RayService it owns is left as it is).
    fn report_panic(
        &self,
        pipeline: Arc<ServePipeline>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        let event = crate::controllers::frame::panic_event(
            &self.recorder,
            pipeline.clone(),
            message.clone(),
        );
        let client = self.client.clone();
        let applied = self
            .state
            .peek(&*pipeline, |s| {
                s.as_ref()
                    .and_then(|s| s.good.as_ref().map(|g| g.applied.clone()))
            })
            .flatten();
        Box::pin(async move {
            event.await;
            let status = conditions::panic_status(&pipeline, applied.as_ref(), &message, now());
            if let Err(e) = status::write(&client, &pipeline, &status).await {
                warn!(error = %e, "recording a panic in the status failed");
            }
        })
    }
}

/// The validated refresh interval (at least a second; `None` when unset or invalid).
fn refresh_interval(pipeline: &ServePipeline) -> Option<Duration> {
    crate::validation::servepipeline::source_timing(&pipeline.spec.source).refresh_interval
}

fn now() -> Time {
    crate::k8s::now()
}
