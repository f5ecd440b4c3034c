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
use super::conditions::{MAX_LOGGED_MESSAGE, Problem};
use super::context::Context;
use super::fetches::{self, Poll};
use super::memory::{FetchResult, GoodGraph, PipelineState, Versions};
use crate::api::servepipeline::{OciSourceStatus, ServePipeline, condition_types};
use crate::source::oci::{
    FetchedCode, OciOutcome, OciReference, OciRequest, RegistryCredentials, VerificationKey,
};
use crate::source::{BearerToken, FetchOutcome, FetchRequest, FetchedBytes, SourceError};
use crate::validation::servepipeline::Validated;

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

/// The source lane's read side: the graph versions of `pipeline` in memory and the latest
/// fetch outcome. When the source is due (new inputs, no good graph yet, the refresh interval
/// passed, or a failure to retry) the lane gets a fetch, which runs outside the reconcile
/// workers and wakes the pipeline when it ends: the reconcile reads versions, never fetches.
/// A refused spec fetches nothing.
pub(super) fn versions(
    pipeline: &Arc<ServePipeline>,
    ctx: &Arc<Context>,
    spec: &Validated,
    previous: Option<&PipelineState>,
) -> Versions {
    let mut versions = Versions {
        newest: previous.and_then(|s| s.good.clone()),
        stable: previous.and_then(|s| s.stable.clone()),
        problem: None,
        fetching: false,
        checked: false,
        source_inputs: source_inputs_hash(pipeline, &ctx.secrets),
    };
    let due = match previous {
        None => true,
        Some(s) => {
            s.source_inputs != versions.source_inputs
                || s.good.is_none()
                || spec
                    .source
                    .refresh_interval
                    .is_some_and(|r| s.last_checked.elapsed() >= r)
                // retry after a failure when the requeue brings us back
                || ctx.frame.failures(pipeline) > 0
        }
    };
    if !spec.is_valid() || !due {
        return versions;
    }
    let key = ObjectRef::from_obj(&**pipeline);
    let host = fetches::source_host(&pipeline.spec.source);
    let timeout = spec.source.timeout;
    let current = versions.newest.clone();
    match ctx.fetches.poll(&key, &versions.source_inputs, &host, || {
        fetch_and_validate(pipeline.clone(), ctx.clone(), current, timeout)
    }) {
        Poll::Done(outcome) => {
            versions.checked = true;
            match outcome {
                Ok(Some(new)) => {
                    versions.newest = Some(keep_fetch_time(pipeline, versions.newest.as_ref(), new))
                }
                Ok(None) => {}
                Err(problem) => versions.problem = Some(problem),
            }
        }
        Poll::Pending => {
            // The fetch wakes this pipeline when it ends; until then the latest outcome
            // stands (nothing to apply, and the status says what it said).
            versions.fetching = true;
            versions.problem = previous.and_then(|s| s.last_problem.clone());
        }
    }
    versions
}

/// A graph fetched while none was in memory (the first fetch of a restarted operator) that
/// is the one the status describes keeps the time it was first fetched: a restart then
/// rewrites no status.
fn keep_fetch_time(
    pipeline: &ServePipeline,
    in_memory: Option<&GoodGraph>,
    mut fetched: GoodGraph,
) -> GoodGraph {
    if in_memory.is_none()
        && let Some(described) = pipeline
            .status
            .as_ref()
            .and_then(super::build::applied_from_status)
        && described.digest == fetched.applied.digest
        && described.etag == fetched.applied.etag
    {
        fetched.applied.fetched_at = described.fetched_at;
    }
    fetched
}

/// Fetches the graph; `Ok(None)` when it is unchanged, `Ok(Some)` for a new valid graph, and
/// `Err((problem, transient))` for anything that must not reach the RayService. `timeout`
/// bounds one fetch, retries included.
async fn fetch_and_validate(
    pipeline: Arc<ServePipeline>,
    ctx: Arc<Context>,
    current: Option<GoodGraph>,
    timeout: Duration,
) -> FetchResult {
    let started = Instant::now();
    let result = fetch_and_validate_inner(&pipeline, &ctx, current.as_ref(), timeout).await;
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

/// What `source.oci` needs to pull: the reference, credentials, signature key and CA bundle,
/// from the spec and its Secrets.
struct OciInputs {
    reference: OciReference,
    credentials: RegistryCredentials,
    key: Option<VerificationKey>,
    ca: Option<Vec<u8>>,
}

type DownloadResult = Result<Option<Downloaded>, (Problem, bool)>;

/// Fetches `source.url`; `Ok(None)` when unchanged.
async fn download_url(
    pipeline: &ServePipeline,
    ctx: &Context,
    current: Option<&GoodGraph>,
    timeout: Duration,
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

async fn oci_inputs(
    pipeline: &ServePipeline,
    ctx: &Context,
    reference: &str,
) -> Result<OciInputs, (Problem, bool)> {
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
    Ok(OciInputs {
        reference,
        credentials,
        key,
        ca,
    })
}

fn oci_request<'a>(
    source: &crate::api::servepipeline::GraphSource,
    inputs: &'a OciInputs,
    reference: &'a OciReference,
    timeout: Duration,
) -> OciRequest<'a> {
    OciRequest {
        verify: inputs.key.as_ref(),
        max_bytes: max_bytes(source),
        max_code_bytes: max_code_bytes(source),
        timeout,
        ca_bundle_pem: inputs.ca.as_deref(),
        allow_insecure_http: source.allow_insecure_http.unwrap_or(false),
        ..OciRequest::new(reference, &inputs.credentials)
    }
}

/// Pulls `source.oci`; `Ok(None)` when the tag (or digest) still names the applied manifest.
/// A code layer is checked, put in the operator's code store and registered for pulling
/// again (see [`CodeLoader`](crate::pypackage::store::CodeLoader)).
async fn download_oci(
    pipeline: &Arc<ServePipeline>,
    ctx: &Arc<Context>,
    current: Option<&GoodGraph>,
    reference: &str,
    timeout: Duration,
) -> DownloadResult {
    let inputs = oci_inputs(pipeline, ctx, reference).await?;
    // The applied manifest digest is the change signal (content-addressed, so the same
    // digest is the same graph whatever reference it came from; the pull checks the
    // signature of an unchanged manifest again when source.verify asks for one).
    let previous_manifest_digest = current
        .and_then(|g| g.applied.oci.as_ref())
        .and_then(|oci| oci.manifest_digest.parse().ok());
    let request = OciRequest {
        previous_manifest_digest,
        ..oci_request(&pipeline.spec.source, &inputs, &inputs.reference, timeout)
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
            code,
        } => {
            let code_digest = match code {
                Some(code) => {
                    let digest = code.digest.to_string();
                    accept_code(pipeline, ctx, manifest_digest, *code, timeout)?;
                    Some(digest)
                }
                None => None,
            };
            Ok(Some(Downloaded {
                bytes,
                // One digest names a version: with code, the manifest's, which pins both.
                digest: match code_digest {
                    Some(_) => manifest_digest.to_string(),
                    None => graph_digest.to_string(),
                },
                etag: None,
                size,
                oci: Some(OciSourceStatus {
                    tag: inputs.reference.tag().map(str::to_owned),
                    manifest_digest: manifest_digest.to_string(),
                    graph_digest: graph_digest.to_string(),
                    code_digest,
                }),
            }))
        }
    }
}

fn code_problem(reason: &str, message: String) -> (Problem, bool) {
    (
        Problem {
            condition: condition_types::SOURCE_READY,
            reason: reason.to_owned(),
            message: crate::k8s::truncate(&message, MAX_LOGGED_MESSAGE),
        },
        false,
    )
}

/// Checks a pulled code layer as an archive and against the operator's budget, puts it in the
/// code store and registers how to pull it again by this manifest digest.
fn accept_code(
    pipeline: &Arc<ServePipeline>,
    ctx: &Arc<Context>,
    manifest_digest: crate::source::Sha256Digest,
    code: FetchedCode,
    timeout: Duration,
) -> Result<(), (Problem, bool)> {
    let reference = pipeline.spec.source.oci.clone().unwrap_or_default();
    if ctx.config.code_base_url.is_none() {
        return Err(code_problem(
            reasons::CODE_NOT_SERVABLE,
            format!(
                "{} carries a code layer ({}), and this operator serves none: start it with \
                 --runtime-base-url (Helm: runtime.serveFromOperator)",
                crate::k8s::truncate(&reference, 256),
                code.digest
            ),
        ));
    }
    if let Err(e) = crate::pypackage::code::check(code.bytes.bytes()) {
        return Err(code_problem(
            reasons::INVALID_CODE_LAYER,
            format!(
                "the code layer {} of {}: {e}",
                code.digest,
                crate::k8s::truncate(&reference, 256)
            ),
        ));
    }
    let store = &ctx.config.code_store;
    let hex = code.digest.to_hex();
    store
        .insert(&hex, code.bytes.bytes().clone())
        .map_err(|e| code_problem(crate::source::reasons::CODE_TOO_LARGE, e.to_string()))?;
    store.register(
        &hex,
        Arc::new(PullAgain {
            pipeline: pipeline.clone(),
            ctx: Arc::downgrade(ctx),
            manifests: vec![manifest_digest],
            code: code.digest,
            timeout,
        }),
    );
    Ok(())
}

/// Pulls a code layer again by the manifest digests that may hold it (pinned, so immutable),
/// with the pipeline's credentials and signature key as they are now.
struct PullAgain {
    pipeline: Arc<ServePipeline>,
    ctx: std::sync::Weak<Context>,
    manifests: Vec<crate::source::Sha256Digest>,
    code: crate::source::Sha256Digest,
    /// The source's fetch timeout when the loader was registered.
    timeout: Duration,
}

impl crate::pypackage::store::CodeLoader for PullAgain {
    fn load(&self) -> futures::future::BoxFuture<'static, Result<bytes::Bytes, String>> {
        let pipeline = self.pipeline.clone();
        let ctx = self.ctx.clone();
        let manifests = self.manifests.clone();
        let expected = self.code;
        let timeout = self.timeout;
        Box::pin(async move {
            let ctx = ctx
                .upgrade()
                .ok_or_else(|| "the controller has stopped".to_owned())?;
            let reference = pipeline.spec.source.oci.clone().unwrap_or_default();
            let inputs = oci_inputs(&pipeline, &ctx, &reference)
                .await
                .map_err(|(p, _)| p.message)?;
            let mut last = format!("no manifest to pull code layer {expected} from");
            for manifest in manifests {
                let pinned = inputs.reference.with_digest(manifest);
                let request = oci_request(&pipeline.spec.source, &inputs, &pinned, timeout);
                match ctx.fetcher.pull_oci(&request).await {
                    Ok(OciOutcome::Fetched {
                        code: Some(code), ..
                    }) if code.digest == expected => {
                        tracing::info!(layer = %expected, manifest = %manifest, "code layer pulled again");
                        return Ok(code.bytes.bytes().clone());
                    }
                    Ok(_) => {
                        last = format!("manifest {manifest} does not hold code layer {expected}")
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            Err(last)
        })
    }
}

/// After a restart (or for versions carried over from the Serve config): the code layers the
/// pipeline's RayService names that the store does not know are registered for pulling again
/// by the manifest digests its status names, and pulled in the background, so a Ray replica
/// that starts later finds them. No network wait here.
pub(super) fn register_code_in_use(
    pipeline: &Arc<ServePipeline>,
    ctx: &Arc<Context>,
    rayservice: Option<&crate::api::rayservice::RayService>,
    timeout: Duration,
) {
    let Some(config) = rayservice.and_then(|rs| rs.spec.serve_config_v2.as_deref()) else {
        return;
    };
    if !config.contains("/code-") {
        return;
    }
    let store = &ctx.config.code_store;
    let unknown: Vec<String> = code_digests_in(config)
        .into_iter()
        .filter(|hex| !store.knows(hex))
        .collect();
    if unknown.is_empty() {
        return;
    }
    let manifests = manifest_candidates(pipeline.status.as_ref());
    for hex in unknown {
        let Ok(code) = format!("sha256:{hex}").parse() else {
            continue;
        };
        store.register(
            &hex,
            Arc::new(PullAgain {
                pipeline: pipeline.clone(),
                ctx: Arc::downgrade(ctx),
                manifests: manifests.clone(),
                code,
                timeout,
            }),
        );
        store.ensure(&hex);
    }
}

/// Every `code-<64 hex>.zip` a Serve config names.
pub(super) fn code_digests_in(config: &str) -> Vec<String> {
    let mut found: Vec<String> = config
        .match_indices("/code-")
        .filter_map(|(at, _)| {
            let rest = config.get(at + 1..at + 1 + "code-".len() + 64 + ".zip".len())?;
            crate::pypackage::store::digest_of_file_name(rest).map(str::to_owned)
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The manifest digests a status names (the applied source, the stable and canary versions):
/// the versions whose code a RayService may carry.
pub(super) fn manifest_candidates(
    status: Option<&crate::api::servepipeline::ServePipelineStatus>,
) -> Vec<crate::source::Sha256Digest> {
    let Some(status) = status else {
        return Vec::new();
    };
    let mut digests: Vec<&str> = Vec::new();
    if let Some(oci) = status.source.as_ref().and_then(|s| s.oci.as_ref()) {
        digests.push(&oci.manifest_digest);
    }
    if let Some(rollout) = &status.rollout {
        digests.extend(rollout.stable.as_ref().map(|v| v.digest.as_str()));
        digests.extend(rollout.canary.as_ref().map(|c| c.version.digest.as_str()));
    }
    let mut parsed: Vec<crate::source::Sha256Digest> =
        digests.into_iter().filter_map(|d| d.parse().ok()).collect();
    parsed.dedup();
    parsed
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

fn max_code_bytes(source: &crate::api::servepipeline::GraphSource) -> u64 {
    source
        .max_code_bytes
        .and_then(|m| u64::try_from(m).ok())
        .unwrap_or(crate::source::DEFAULT_MAX_CODE_BYTES)
}

fn max_bytes(source: &crate::api::servepipeline::GraphSource) -> u64 {
    source
        .max_bytes
        .and_then(|m| u64::try_from(m).ok())
        .unwrap_or(crate::source::DEFAULT_MAX_BYTES)
}

async fn fetch_and_validate_inner(
    pipeline: &Arc<ServePipeline>,
    ctx: &Arc<Context>,
    current: Option<&GoodGraph>,
    timeout: Duration,
) -> FetchResult {
    let downloaded = match &pipeline.spec.source.oci {
        Some(reference) => download_oci(pipeline, ctx, current, reference, timeout).await?,
        None => download_url(pipeline, ctx, current, timeout).await?,
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
                .reserve_total(size.saturating_add(summary.decoded_bytes as u64), timeout)
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
                fetched_at: crate::k8s::now(),
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

#[cfg(test)]
mod tests {
    use super::{code_digests_in, manifest_candidates};
    use crate::api::servepipeline::OciSourceStatus;

    #[test]
    fn code_layers_named_in_a_serve_config_are_found() {
        let a = "a".repeat(64);
        let b = "0123456789abcdef".repeat(4);
        let config = format!(
            "applications:\n- name: x\n  runtime_env:\n    py_modules:\n    - http://op:8080/packages/code-{a}.zip\n    - http://op:8080/packages/raypipe_runtime-0123456789abcdef.zip\n- name: y\n  runtime_env:\n    py_modules: [http://op:8080/packages/code-{b}.zip, http://op:8080/packages/code-{a}.zip, http://x/code-short.zip]\n"
        );
        let mut expected = vec![a, b];
        expected.sort();
        assert_eq!(code_digests_in(&config), expected);
        assert!(code_digests_in("no code here").is_empty());
    }

    #[test]
    fn the_manifests_a_status_names_are_the_candidates_for_pulling_code_again() {
        use crate::api::servepipeline::{
            CanaryStatus, RolloutStatus, ServePipelineStatus, SourceStatus, VersionStatus,
        };
        let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let version = |d: String| VersionStatus {
            digest: d,
            ..Default::default()
        };
        let status = ServePipelineStatus {
            source: Some(SourceStatus {
                oci: Some(OciSourceStatus {
                    manifest_digest: digest('a'),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            rollout: Some(RolloutStatus {
                stable: Some(version(digest('a'))),
                canary: Some(CanaryStatus {
                    version: version(digest('b')),
                    step: 1,
                    steps: 2,
                    weight: 20,
                    started_at: crate::k8s::now(),
                    step_started_at: crate::k8s::now(),
                    readings: None,
                    plan: Vec::new(),
                    paused_at: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let found: Vec<String> = manifest_candidates(Some(&status))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(found, vec![digest('a'), digest('b')]);
        assert!(manifest_candidates(None).is_empty());
    }
}
