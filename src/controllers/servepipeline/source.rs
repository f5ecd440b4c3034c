//! The source stage of a ServePipeline: its Secrets (token, registry credentials, CA bundle,
//! signature key), the conditional fetch of `source.url` or pull of `source.oci`, and the
//! decode → validate of the graph, run outside the reconcile workers (see `fetches`).
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
use crate::api::servepipeline::{OciSourceStatus, ServePipeline, condition_types};
use crate::source::oci::{
    OciOutcome, OciReference, OciRequest, RegistryCredentials, VerificationKey,
};
use crate::source::{BearerToken, FetchOutcome, FetchRequest, FetchedBytes, SourceError};

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
        version_of(
            source
                .credentials_secret_ref
                .as_ref()
                .map(|r| r.name.as_str()),
        ),
        version_of(
            source
                .verify
                .as_ref()
                .and_then(|v| v.public_key_secret_ref.as_ref())
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

/// A graph downloaded and not yet decoded.
struct Downloaded {
    bytes: FetchedBytes,
    digest: String,
    etag: Option<String>,
    size: u64,
    oci: Option<OciSourceStatus>,
}

type DownloadResult = Result<Option<Downloaded>, (Problem, bool)>;

/// Fetches `source.url`; `Ok(None)` when unchanged.
async fn download_url(
    pipeline: &ServePipeline,
    ctx: &Context,
    current: Option<&GoodGraph>,
) -> DownloadResult {
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
    let ca = optional_secret(ctx, &namespace, source.ca_bundle_secret_ref.as_ref()).await?;
    let timeout = crate::validation::servepipeline::source_timing(source).timeout;
    let request = FetchRequest {
        bearer_token: token.as_ref(),
        previous_etag: current.and_then(|g| g.applied.etag.as_deref()),
        previous_digest: current.map(|g| g.applied.digest.as_str()),
        pinned_sha256: source.sha256.as_deref(),
        max_bytes: max_bytes(source),
        timeout,
        ca_bundle_pem: ca.as_deref(),
        allow_insecure_http: source.allow_insecure_http.unwrap_or(false),
        ..FetchRequest::new(&source.url)
    };
    let started = Instant::now();
    let outcome = ctx.fetcher.fetch(&request).await;
    record_fetch(&ctx.config.metrics, &outcome, started.elapsed());
    match outcome.map_err(|e| (source_problem(&e), e.is_transient()))? {
        FetchOutcome::NotModified { .. } | FetchOutcome::Unchanged { .. } => Ok(None),
        FetchOutcome::Fetched {
            bytes,
            digest,
            etag,
            size,
        } => Ok(Some(Downloaded {
            bytes,
            digest,
            etag,
            size,
            oci: None,
        })),
    }
}

/// Pulls `source.oci`; `Ok(None)` when the tag (or digest) still names the applied manifest.
async fn download_oci(
    pipeline: &ServePipeline,
    ctx: &Context,
    current: Option<&GoodGraph>,
    reference: &str,
) -> DownloadResult {
    let namespace = pipeline.namespace().unwrap_or_default();
    let source = &pipeline.spec.source;
    let permanent = |e: SourceError| (source_problem(&e), false);
    let reference: OciReference = reference
        .parse()
        .map_err(|e: crate::source::oci::ReferenceError| permanent(e.into()))?;
    let credentials = match &source.credentials_secret_ref {
        Some(r) => {
            let raw = secret_value(&ctx.client, &namespace, &r.name, &r.key)
                .await
                .map_err(|p| (p, false))?;
            if r.key == DOCKER_CONFIG_KEY {
                RegistryCredentials::from_docker_config(&raw, reference.registry())
                    .map_err(|e| permanent(SourceError::InvalidCredentials { problem: e.0 }))?
            } else {
                RegistryCredentials::Token(BearerToken::new(String::from_utf8_lossy(&raw)))
            }
        }
        None => RegistryCredentials::Anonymous,
    };
    let key_ref = source
        .verify
        .as_ref()
        .and_then(|v| v.public_key_secret_ref.as_ref());
    let key = match optional_secret(ctx, &namespace, key_ref).await? {
        Some(pem) => Some(VerificationKey::from_pem(&pem).map_err(permanent)?),
        None => None,
    };
    let ca = optional_secret(ctx, &namespace, source.ca_bundle_secret_ref.as_ref()).await?;
    // The applied manifest digest is the change signal (content-addressed, so the same
    // digest is the same graph whatever reference it came from; the pull checks the
    // signature of an unchanged manifest again when source.verify asks for one).
    let previous_manifest_digest = current
        .and_then(|g| g.applied.oci.as_ref())
        .and_then(|oci| oci.manifest_digest.parse().ok());
    let request = OciRequest {
        previous_manifest_digest,
        verify: key.as_ref(),
        max_bytes: max_bytes(source),
        timeout: crate::validation::servepipeline::source_timing(source).timeout,
        ca_bundle_pem: ca.as_deref(),
        allow_insecure_http: source.allow_insecure_http.unwrap_or(false),
        ..OciRequest::new(&reference, &credentials)
    };
    let started = Instant::now();
    let outcome = ctx.fetcher.pull_oci(&request).await;
    record_pull(&ctx.config.metrics, &outcome, started.elapsed());
    match outcome.map_err(|e| (source_problem(&e), e.is_transient()))? {
        OciOutcome::Unchanged { .. } => Ok(None),
        OciOutcome::Fetched {
            bytes,
            manifest_digest,
            graph_digest,
            size,
        } => Ok(Some(Downloaded {
            bytes,
            digest: graph_digest.to_string(),
            etag: None,
            size,
            oci: Some(OciSourceStatus {
                tag: reference.tag().map(str::to_owned),
                manifest_digest: manifest_digest.to_string(),
                graph_digest: graph_digest.to_string(),
            }),
        })),
    }
}

/// The key of a `kubernetes.io/dockerconfigjson` Secret; any other key holds a token.
const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";

async fn optional_secret(
    ctx: &Context,
    namespace: &str,
    selector: Option<&crate::api::servepipeline::SecretKeySelector>,
) -> Result<Option<Vec<u8>>, (Problem, bool)> {
    match selector {
        Some(r) => secret_value(&ctx.client, namespace, &r.name, &r.key)
            .await
            .map(Some)
            .map_err(|p| (p, false)),
        None => Ok(None),
    }
}

fn max_bytes(source: &crate::api::servepipeline::GraphSource) -> u64 {
    source
        .max_bytes
        .and_then(|m| u64::try_from(m).ok())
        .unwrap_or(crate::source::DEFAULT_MAX_BYTES)
}

async fn fetch_and_validate_inner(
    pipeline: &ServePipeline,
    ctx: &Context,
    current: Option<&GoodGraph>,
) -> FetchResult {
    let downloaded = match &pipeline.spec.source.oci {
        Some(reference) => download_oci(pipeline, ctx, current, reference).await?,
        None => download_url(pipeline, ctx, current).await?,
    };
    match downloaded {
        None => Ok(None),
        Some(Downloaded {
            bytes,
            digest,
            etag,
            size,
            oci,
        }) => {
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
                let url = match &pipeline.spec.source.oci {
                    Some(reference) => crate::k8s::truncate(reference, 256),
                    None => reqwest::Url::parse(&pipeline.spec.source.url)
                        .map(|u| crate::source::redact_url(&u))
                        .unwrap_or_default(),
                };
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
                oci,
            };
            Ok(Some(GoodGraph {
                graph: Arc::new(validated),
                applied,
            }))
        }
    }
}

fn record_pull(
    metrics: &crate::admin::Metrics,
    outcome: &Result<OciOutcome, SourceError>,
    took: Duration,
) {
    use crate::admin::FetchOutcome as Outcome;
    match outcome {
        Ok(OciOutcome::Fetched { .. }) => metrics.graph_fetched(Outcome::Fetched, took),
        Ok(OciOutcome::Unchanged { .. }) => metrics.graph_fetched(Outcome::Unchanged, took),
        Err(e) => metrics.graph_fetch_failed(e.reason(), took),
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
