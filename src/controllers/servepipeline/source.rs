//! The source stage of a ServePipeline: its Secrets (token, CA bundle), the conditional fetch
//! and the decode → validate of the graph, run outside the reconcile workers (see `fetches`).
//! Whatever fails here becomes a `Problem` and never reaches the RayService.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};

use super::build::{AppliedGraph, reasons};
use super::conditions::Problem;
use super::{Context, FetchResult, GoodGraph, MAX_LOGGED_MESSAGE, now};
use crate::api::servepipeline::{ServePipeline, condition_types};
use crate::source::{BearerToken, FetchOutcome, FetchRequest, SourceError};

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

/// Hash of the inputs that decide whether the source must be fetched again.
pub(super) fn source_inputs_hash(
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
pub(super) async fn fetch_and_validate(
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
