//! The ServePipeline controller: token → fetch (conditional) → decode → validate → render →
//! RayService (server-side apply, owned) → status. Bad input never touches what runs: on any
//! fetch, validation or render failure the existing RayService is left exactly as it was.

pub mod build;
mod fetches;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Resource, ResourceExt};
use tracing::{Instrument, info, warn};

use crate::api::rayservice::RayService;
use crate::api::servepipeline::{ServePipeline, condition_types};
use crate::graph::ValidatedGraph;
use crate::k8s::{LABEL_MANAGED_BY, MANAGED_BY, field_managers};
use crate::serve::RenderOptions;
use crate::source::{BearerToken, FetchOutcome, FetchRequest, Fetcher, SourceError};
use build::{AppliedGraph, Problem, StatusInputs, reasons};
use fetches::{FetchQueue, Poll};

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

impl Error {
    /// A fixed name for the `raypipe_reconcile_errors_total` metric.
    fn category(&self) -> &'static str {
        match self {
            Error::Read { .. } => "read",
            Error::Apply(_) => "apply",
            Error::Status { .. } => "status",
            Error::Input { .. } => "input",
            Error::Panicked(_) => "panic",
        }
    }

    /// Transient failures are retried with backoff; others wait for a change (or the refresh).
    fn is_transient(&self) -> bool {
        match self {
            Error::Input { transient, .. } => *transient,
            _ => true,
        }
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
    consecutive_failures: u32,
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
    recorder: Recorder,
    config: Config,
    secrets: Store<PartialObjectMeta<Secret>>,
    state: Mutex<HashMap<ObjectRef<ServePipeline>, PipelineState>>,
    queue: crate::admin::metrics::ReconcileQueue,
    /// Fetches in flight, outside the reconcile workers.
    fetches: FetchQueue<FetchResult>,
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    client: kube::Client,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
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
    let queue = config.metrics.queue(METRICS_NAME);
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
    config
        .readiness
        .track_store(METRICS_NAME, pipeline_store.clone());
    config
        .readiness
        .track_store(METRICS_NAME, secret_store.clone());
    let _phases = config.metrics.observe_pipelines(pipeline_store.clone());
    let controller_config =
        kube::runtime::controller::Config::default().concurrency(config.concurrency);

    let (fetches, fetched) = FetchQueue::new();
    let ctx = Arc::new(Context {
        client: client.clone(),
        fetcher: config.fetcher.clone(),
        recorder: crate::k8s::recorder(client.clone(), field_managers::SERVEPIPELINE),
        config,
        secrets: secret_store,
        state: Mutex::new(HashMap::new()),
        queue,
        fetches,
    });

    Controller::for_stream(pipeline_stream, pipeline_store)
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
        .graceful_shutdown_on(shutdown)
        .run(
            crate::controllers::frame::contain("servepipeline", reconcile),
            crate::controllers::frame::contain_policy("servepipeline", error_policy),
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "servepipeline reconcile loop");
            }
        })
        .await;
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
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ObjectRef::from_obj(&*pipeline))
            .and_then(|s| s.good.as_ref().map(|g| g.applied.clone()));
        Box::pin(async move {
            event.await;
            let status = build::panic_status(&pipeline, applied.as_ref(), &message, now());
            if let Err(e) = write_status(&client, &pipeline, &status).await {
                warn!(error = %e, "recording a panic in the status failed");
            }
        })
    }
}

fn error_policy(pipeline: Arc<ServePipeline>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = ObjectRef::from_obj(&*pipeline);
    let failures = {
        let mut state = ctx.state.lock().unwrap_or_else(|p| p.into_inner());
        state.get_mut(&key).map(|s| {
            s.consecutive_failures += 1;
            s.consecutive_failures
        })
    }
    .unwrap_or(1);
    let refresh = refresh_interval(&pipeline);
    if matches!(error, Error::Input { reason, .. } if reason == reasons::INVALID_SPEC) {
        // Nothing but a new spec can fix it.
        return Action::await_change();
    }
    if error.is_transient() {
        // 2 s, 4 s, 8 s … capped at 5 minutes (and at the refresh interval, when shorter).
        let backoff = crate::k8s::failure_backoff(failures);
        Action::requeue(refresh.map_or(backoff, |r| backoff.min(r.max(Duration::from_secs(1)))))
    } else {
        refresh.map_or_else(Action::await_change, Action::requeue)
    }
}

/// The validated refresh interval (at least a second; `None` when unset or invalid).
fn refresh_interval(pipeline: &ServePipeline) -> Option<Duration> {
    crate::validation::servepipeline::source_timing(&pipeline.spec.source).refresh_interval
}

fn now() -> Time {
    crate::k8s::now()
}

/// Reads `key` of Secret `name` in `namespace`.
async fn secret_value(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<Vec<u8>, Problem> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = api.get_opt(name).await.map_err(|e| Problem {
        condition: condition_types::SOURCE_READY,
        reason: reasons::SECRET_NOT_FOUND.to_owned(),
        message: format!("reading Secret {name}: {e}"),
    })?;
    let secret = secret.ok_or_else(|| Problem {
        condition: condition_types::SOURCE_READY,
        reason: reasons::SECRET_NOT_FOUND.to_owned(),
        message: format!("Secret {name} does not exist in namespace {namespace}"),
    })?;
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.0.clone())
        .ok_or_else(|| Problem {
            condition: condition_types::SOURCE_READY,
            reason: reasons::SECRET_KEY_MISSING.to_owned(),
            message: format!("Secret {name} has no key {key:?}"),
        })
}

fn source_problem(e: &SourceError) -> Problem {
    Problem {
        condition: condition_types::SOURCE_READY,
        reason: e.reason().to_owned(),
        message: crate::k8s::truncate(&e.to_string(), MAX_LOGGED_MESSAGE),
    }
}

async fn reconcile(pipeline: Arc<ServePipeline>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "reconcile",
        kind = "ServePipeline",
        namespace = %pipeline.namespace().unwrap_or_default(),
        name = %pipeline.name_any()
    );
    ctx.queue
        .started(pipeline.namespace(), &pipeline.name_any());
    let timer = ctx.config.metrics.reconcile_started(METRICS_NAME);
    let result = reconcile_inner(pipeline, ctx.clone())
        .instrument(span)
        .await;
    timer.finish(result.as_ref().err().map(Error::category));
    result
}

async fn reconcile_inner(pipeline: Arc<ServePipeline>, ctx: Arc<Context>) -> Result<Action, Error> {
    if pipeline.meta().deletion_timestamp.is_some() {
        // The RayService goes with its owner (garbage collection); a fetch is no longer wanted.
        ctx.fetches.forget(&ObjectRef::from_obj(&*pipeline));
        return Ok(Action::await_change());
    }
    let namespace = pipeline.namespace().unwrap_or_default();
    let key = ObjectRef::from_obj(&*pipeline);
    let rs_api: Api<RayService> = Api::namespaced(ctx.client.clone(), &namespace);
    let rs_name = build::rayservice_name(&pipeline);
    let existing = rs_api
        .get_opt(&rs_name)
        .await
        .map_err(|source| Error::Read {
            what: format!("RayService {namespace}/{rs_name}"),
            source,
        })?;

    // validate
    let mut problem: Option<Problem> = None;
    let mut transient = false;
    let problems = crate::validation::servepipeline::validate_spec(&pipeline);
    if !problems.is_empty() {
        problem = Some(Problem {
            condition: condition_types::READY,
            reason: reasons::INVALID_SPEC.to_owned(),
            message: crate::k8s::truncate(
                &crate::validation::problem::join(&problems),
                MAX_LOGGED_MESSAGE,
            ),
        });
    }

    let previous_state = ctx
        .state
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .cloned();
    let mut good = previous_state.as_ref().and_then(|s| s.good.clone());
    let source_inputs = source_inputs_hash(&pipeline, &ctx.secrets);
    let due = match &previous_state {
        None => true,
        Some(s) => {
            s.source_inputs != source_inputs
                || s.good.is_none()
                || refresh_interval(&pipeline).is_some_and(|r| s.last_checked.elapsed() >= r)
                // retry after a failure when the requeue brings us back
                || s.consecutive_failures > 0
        }
    };
    let mut checked = false;

    let mut fetching = false;
    if problem.is_none() && due {
        let host = fetches::host_of(&pipeline.spec.source.url);
        let poll = ctx.fetches.poll(&key, &source_inputs, &host, || {
            fetch_and_validate(pipeline.clone(), ctx.clone(), good.clone())
        });
        match poll {
            Poll::Done(outcome) => {
                checked = true;
                match outcome {
                    Ok(Some(new_good)) => good = Some(new_good),
                    Ok(None) => {}
                    Err((p, is_transient)) => {
                        transient = is_transient;
                        problem = Some(p);
                    }
                }
            }
            Poll::Pending => {
                // The fetch wakes this pipeline when it ends; until then the latest outcome
                // stands (nothing to apply, and the status says what it said).
                fetching = true;
                if let Some((p, is_transient)) =
                    previous_state.as_ref().and_then(|s| s.last_problem.clone())
                {
                    transient = is_transient;
                    problem = Some(p);
                }
            }
        }
    }

    // A RayService of that name the pipeline does not control is someone else's: it is neither
    // written nor read as ours. Retried with backoff: the owner may delete or rename it.
    let mut rayservice = existing.clone();
    if let Some(rs) = &existing
        && let Err(conflict) =
            crate::k8s::check_controlled_by(rs, &pipeline.uid().unwrap_or_default())
    {
        rayservice = None;
        transient = true;
        problem = problem.or(Some(Problem {
            condition: condition_types::READY,
            reason: reasons::RAYSERVICE_CONFLICT.to_owned(),
            message: conflict.to_string(),
        }));
    }

    // build + apply
    let mut newly_applied = false;
    if problem.is_none()
        && let Some(g) = &good
    {
        let render_started = std::time::Instant::now();
        match render(&pipeline, &ctx.config, &g.graph) {
            Ok(yaml) => {
                let desired = build::desired_rayservice(&pipeline, &yaml, &g.applied.digest)?;
                let rendered = render_started.elapsed();
                let up_to_date = existing
                    .as_ref()
                    .is_some_and(|e| build::is_up_to_date(e, &desired));
                if !up_to_date {
                    let apply_started = std::time::Instant::now();
                    let known = existing.as_ref().map(|rs| rs.meta());
                    match crate::k8s::apply_owned(
                        &rs_api,
                        &desired,
                        known,
                        field_managers::SERVEPIPELINE,
                    )
                    .await
                    {
                        Ok(applied) => {
                            let metrics = &ctx.config.metrics;
                            metrics.pipeline_update_stage("render", rendered);
                            metrics.pipeline_update_stage("apply", apply_started.elapsed());
                            newly_applied = true;
                            rayservice = Some(applied);
                        }
                        Err(e) => {
                            transient = true;
                            let reason = if e.is_not_owned() {
                                rayservice = None;
                                reasons::RAYSERVICE_CONFLICT
                            } else {
                                reasons::APPLY_FAILED
                            };
                            problem = Some(Problem {
                                condition: condition_types::READY,
                                reason: reason.to_owned(),
                                message: e.to_string(),
                            });
                        }
                    }
                }
            }
            Err(message) => {
                problem = Some(Problem {
                    condition: condition_types::GRAPH_VALID,
                    reason: reasons::RENDER_FAILED.to_owned(),
                    message,
                });
            }
        }
    }

    // status
    let applied = good.as_ref().map(|g| &g.applied);
    let status = build::compute_status(&StatusInputs {
        pipeline: &pipeline,
        applied,
        problem: problem.as_ref(),
        rayservice: rayservice.as_ref(),
        now: now(),
    });
    if pipeline.status.as_ref() != Some(&status) {
        write_status(&ctx.client, &pipeline, &status).await?;
    }

    // events, once per transition
    let announced = previous_state
        .as_ref()
        .and_then(|s| s.announced_problem.clone());
    let current = problem
        .as_ref()
        .map(|p| (p.reason.clone(), p.message.clone()));
    if newly_applied && let Some(g) = &good {
        info!(digest = %g.applied.digest, "applied graph");
        crate::k8s::publish_event(
            &ctx.recorder,
            &*pipeline,
            EventType::Normal,
            "GraphApplied",
            "Apply",
            format!(
                "RayService {rs_name} now carries graph {} ({}, {} nodes)",
                g.applied.version.as_deref().unwrap_or("unversioned"),
                g.applied.digest,
                g.applied.nodes
            ),
        )
        .await;
    }
    if current != announced
        && let Some(p) = &problem
    {
        let message = crate::k8s::truncate(&p.message, MAX_LOGGED_MESSAGE);
        warn!(reason = %p.reason, %message, "pipeline problem");
        crate::k8s::publish_event(
            &ctx.recorder,
            &*pipeline,
            EventType::Warning,
            &p.reason,
            "Reconcile",
            p.message.clone(),
        )
        .await;
    }

    {
        let mut state = ctx.state.lock().unwrap_or_else(|p| p.into_inner());
        let entry = state.entry(key).or_insert_with(|| PipelineState {
            source_inputs: source_inputs.clone(),
            last_checked: Instant::now(),
            good: None,
            consecutive_failures: 0,
            announced_problem: None,
            last_problem: None,
        });
        entry.source_inputs = source_inputs;
        if checked {
            entry.last_checked = Instant::now();
        }
        entry.good = good;
        entry.announced_problem = current;
        if !fetching {
            entry.last_problem = problem.clone().map(|p| (p, transient));
            if problem.is_none() {
                entry.consecutive_failures = 0;
            }
        }
    }

    if fetching {
        // The fetch's end reconciles this pipeline again; no failure is counted meanwhile.
        return Ok(Action::await_change());
    }
    match problem {
        Some(p) => Err(Error::Input {
            reason: p.reason,
            message: p.message,
            transient,
        }),
        None => Ok(refresh_interval(&pipeline).map_or_else(Action::await_change, Action::requeue)),
    }
}

/// Server-side applies the pipeline's status.
async fn write_status(
    client: &kube::Client,
    pipeline: &ServePipeline,
    status: &crate::api::servepipeline::ServePipelineStatus,
) -> Result<(), Error> {
    let api: Api<ServePipeline> =
        Api::namespaced(client.clone(), &pipeline.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": ServePipeline::api_version(&()),
        "kind": ServePipeline::kind(&()),
        "status": status,
    });
    api.patch_status(
        &pipeline.name_any(),
        &PatchParams::apply(field_managers::SERVEPIPELINE).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
    .map_err(|source| Error::Status {
        name: pipeline.name_any(),
        source,
    })
}

/// Hash of the inputs that decide whether the source must be fetched again.
fn source_inputs_hash(
    pipeline: &ServePipeline,
    secrets: &Store<PartialObjectMeta<Secret>>,
) -> String {
    let namespace = pipeline.namespace().unwrap_or_default();
    let version_of = |name: Option<&str>| {
        name.and_then(|n| secrets.get(&ObjectRef::new(n).within(&namespace)))
            .and_then(|s| s.resource_version())
    };
    let source = &pipeline.spec.source;
    crate::k8s::stable_hash(&(
        source,
        version_of(
            source
                .bearer_token_secret_ref
                .as_ref()
                .map(|r| r.name.as_str()),
        ),
        version_of(
            source
                .ca_bundle_secret_ref
                .as_ref()
                .map(|r| r.name.as_str()),
        ),
    ))
}

/// Fetches the graph; `Ok(None)` when it is unchanged, `Ok(Some)` for a new valid graph, and
/// `Err((problem, transient))` for anything that must not reach the RayService.
async fn fetch_and_validate(
    pipeline: Arc<ServePipeline>,
    ctx: Arc<Context>,
    current: Option<GoodGraph>,
) -> FetchResult {
    let started = Instant::now();
    let result = fetch_and_validate_inner(&pipeline, &ctx, current.as_ref()).await;
    if let Ok(Some(_)) = &result {
        ctx.config
            .metrics
            .pipeline_update_stage("fetch_validate", started.elapsed());
    }
    result
}

async fn fetch_and_validate_inner(
    pipeline: &ServePipeline,
    ctx: &Context,
    current: Option<&GoodGraph>,
) -> FetchResult {
    let namespace = pipeline.namespace().unwrap_or_default();
    let source = &pipeline.spec.source;
    let token = match &source.bearer_token_secret_ref {
        Some(r) => {
            let raw = secret_value(&ctx.client, &namespace, &r.name, &r.key)
                .await
                .map_err(|p| (p, false))?;
            // Secrets written with `echo` end in a newline that is not part of the token.
            let text = String::from_utf8_lossy(&raw).trim().to_owned();
            Some(BearerToken::new(text))
        }
        None => None,
    };
    let ca = match &source.ca_bundle_secret_ref {
        Some(r) => Some(
            secret_value(&ctx.client, &namespace, &r.name, &r.key)
                .await
                .map_err(|p| (p, false))?,
        ),
        None => None,
    };
    let timeout = crate::validation::servepipeline::source_timing(source).timeout;
    let request = FetchRequest {
        bearer_token: token.as_ref(),
        previous_etag: current.and_then(|g| g.applied.etag.as_deref()),
        previous_digest: current.map(|g| g.applied.digest.as_str()),
        pinned_sha256: source.sha256.as_deref(),
        max_bytes: source
            .max_bytes
            .and_then(|m| u64::try_from(m).ok())
            .unwrap_or(crate::source::DEFAULT_MAX_BYTES),
        timeout,
        ca_bundle_pem: ca.as_deref(),
        allow_insecure_http: source.allow_insecure_http.unwrap_or(false),
        ..FetchRequest::new(&source.url)
    };
    let started = Instant::now();
    let outcome = ctx.fetcher.fetch(&request).await;
    record_fetch(&ctx.config.metrics, &outcome, started.elapsed());
    let outcome = outcome.map_err(|e| (source_problem(&e), e.is_transient()))?;
    match outcome {
        FetchOutcome::NotModified { .. } | FetchOutcome::Unchanged { .. } => Ok(None),
        FetchOutcome::Fetched {
            bytes,
            digest,
            etag,
            size,
        } => {
            let graph_problem = |reason: &str, message: String| {
                (
                    Problem {
                        condition: condition_types::GRAPH_VALID,
                        reason: reason.to_owned(),
                        message: crate::k8s::truncate(&message, MAX_LOGGED_MESSAGE),
                    },
                    false,
                )
            };
            // A linear scan of the wire format first: counts, nesting and what decoding will
            // cost, before anything is allocated for it (off the async workers: up to 64 MiB).
            let scanned = tokio::task::spawn_blocking(move || {
                let summary = crate::graph::precheck(&bytes, &crate::graph::Limits::default());
                (bytes, summary)
            })
            .await;
            let (mut bytes, summary) = match scanned {
                Ok((bytes, Ok(summary))) => (bytes, summary),
                Ok((_, Err(e))) => {
                    return Err(graph_problem(e.reason(), format!("graph {digest}: {e}")));
                }
                Err(_) => {
                    return Err(graph_problem(
                        "ValidationPanicked",
                        format!("graph {digest}: scanning the graph failed (a raypipe bug)"),
                    ));
                }
            };
            // Hold what decoding will cost from the operator's graph memory budget until the
            // graph is validated, so concurrent large graphs wait for each other instead of
            // adding up past the operator's memory limit.
            if let Err(e) = bytes
                .reserve_total(
                    size.saturating_add(summary.decoded_bytes as u64),
                    crate::validation::servepipeline::source_timing(&pipeline.spec.source).timeout,
                )
                .await
            {
                let url = reqwest::Url::parse(&pipeline.spec.source.url)
                    .map(|u| crate::source::redact_url(&u))
                    .unwrap_or_default();
                let error = SourceError::memory_budget(url, e);
                return Err((source_problem(&error), error.is_transient()));
            }
            // Decoding and validating a large graph is CPU work of up to a few seconds:
            // off the async workers, so the controllers' watches and other fetches keep going.
            let decode_digest = digest.clone();
            let checked = tokio::task::spawn_blocking(move || {
                // `bytes` (and its reservation) lives until the graph is validated.
                let decoded = crate::graph::decode(&bytes)
                    .map_err(|e| (e.reason(), format!("graph {decode_digest}: {e}")))?;
                crate::graph::validate(decoded).map_err(|errors| {
                    (
                        errors.reason(),
                        format!("graph {decode_digest} is invalid: {errors}"),
                    )
                })
            })
            .await;
            let validated = match checked {
                Ok(Ok(validated)) => validated,
                Ok(Err((reason, message))) => return Err(graph_problem(reason, message)),
                Err(join) => {
                    let message = if join.is_panic() {
                        "validating the graph panicked (a raypipe bug)".to_owned()
                    } else {
                        "validating the graph was cancelled".to_owned()
                    };
                    return Err(graph_problem(
                        "ValidationPanicked",
                        format!("graph {digest}: {message}"),
                    ));
                }
            };
            let applied = AppliedGraph {
                digest,
                etag,
                size,
                fetched_at: now(),
                nodes: validated.node_count(),
                edges: validated.edge_count(),
                ingress: validated.ingress().to_owned(),
                version: Some(validated.version().to_owned()).filter(|v| !v.is_empty()),
            };
            Ok(Some(GoodGraph {
                graph: Arc::new(validated),
                applied,
            }))
        }
    }
}

fn record_fetch(
    metrics: &crate::admin::Metrics,
    outcome: &Result<FetchOutcome, SourceError>,
    took: Duration,
) {
    use crate::admin::FetchOutcome as Outcome;
    match outcome {
        Ok(FetchOutcome::Fetched { .. }) => metrics.graph_fetched(Outcome::Fetched, took),
        Ok(FetchOutcome::NotModified { .. }) => metrics.graph_fetched(Outcome::NotModified, took),
        Ok(FetchOutcome::Unchanged { .. }) => metrics.graph_fetched(Outcome::Unchanged, took),
        Err(e) => metrics.graph_fetch_failed(e.reason(), took),
    }
}

/// Renders the Serve config YAML for a pipeline's graph.
fn render(
    pipeline: &ServePipeline,
    config: &Config,
    graph: &ValidatedGraph,
) -> Result<String, String> {
    let options = render_options(pipeline, config);
    crate::serve::render(graph, &options)
        .map(|c| c.to_yaml())
        .map_err(|e| e.to_string())
}

fn render_options(pipeline: &ServePipeline, config: &Config) -> RenderOptions {
    let serve = pipeline.spec.serve.clone().unwrap_or_default();
    let mut options = RenderOptions {
        application_name: Some(
            serve
                .application_name
                .clone()
                .unwrap_or_else(|| pipeline.name_any()),
        ),
        route_prefix: serve.route_prefix.clone(),
        request_timeout_s: serve.request_timeout_s,
        keep_alive_timeout_s: serve.keep_alive_timeout_s,
        ..RenderOptions::default()
    };
    if let Some(import_path) = &config.runtime_import_path {
        options.runtime_import_path = import_path.clone();
    }
    if !config.runtime_py_modules.is_empty() {
        options.runtime_py_modules = config.runtime_py_modules.clone();
    }
    for (node, o) in &serve.deployment_overrides {
        options.node_overrides.insert(
            node.clone(),
            crate::serve::NodeOverride {
                num_replicas: o.num_replicas,
                max_ongoing_requests: o.max_ongoing_requests,
            },
        );
    }
    options
}
