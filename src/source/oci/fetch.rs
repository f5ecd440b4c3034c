//! [`Fetcher::pull_oci`]: one pull of a graph artifact — tag → manifest digest, manifest,
//! signature (when asked), graph blob — with both digests checked.
//!
//! A tag is resolved with `HEAD` on the manifest (cheap for registries that count pulls):
//! when its `Docker-Content-Digest` equals the manifest digest applied now, the pull ends
//! there ([`OciOutcome::Unchanged`]; with `verify`, after the signature is checked again, so
//! a key added since is enforced on the running version too). Otherwise the manifest is read (at most
//! [`MAX_MANIFEST_BYTES`]) and its sha256 must equal the digest asked for (a digest
//! reference) or announced (a tag); the graph blob is then read within `maxBytes` and the
//! operator's memory budget exactly like a `source.url` body, and its sha256 must equal the
//! layer's descriptor. A signature, when `source.verify` asks for one, is checked before the
//! blob is downloaded, so nothing unsigned is ever applied.
//!
//! A code layer (issue 31), when the manifest has one, is read the same way after the graph:
//! its declared size within `max_code_bytes` before anything is requested, its bytes within
//! the memory budget, its sha256 against the manifest's descriptor. A code layer the registry
//! lacks, one whose bytes are not the manifest's, and one too large each have their own reason.

use std::fmt;
use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use tracing::{Instrument, info, info_span, warn};

use crate::source::digest::Sha256Digest;
use crate::source::error::SourceError;
use crate::source::fetcher::{FetchedBytes, Fetcher, millis, read_capped_body, with_retries};
use crate::source::redact::redact_url;
use crate::source::request::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BYTES, DEFAULT_MAX_CODE_BYTES, DEFAULT_STALL_TIMEOUT,
    DEFAULT_TIMEOUT, MAX_MAX_BYTES, MAX_MAX_CODE_BYTES, RetryPolicy,
};

use super::auth::{RegistryCredentials, Session};
use super::manifest::{
    ANNOTATION_CODE_MODULES, Descriptor, MANIFEST_ACCEPT, MAX_MANIFEST_BYTES, Manifest,
    ManifestError,
};
use super::reference::OciReference;
use super::transport::{Connection, read_small_body};
use super::verify::{VerificationKey, verify_signature};

const DOCKER_CONTENT_DIGEST: HeaderName = HeaderName::from_static("docker-content-digest");

/// One pull. Build with [`OciRequest::new`] and struct update syntax.
#[derive(Clone)]
pub struct OciRequest<'a> {
    pub reference: &'a OciReference,
    pub credentials: &'a RegistryCredentials,
    /// The manifest digest applied now: a tag still pointing at it gives
    /// [`OciOutcome::Unchanged`] after one `HEAD`.
    pub previous_manifest_digest: Option<Sha256Digest>,
    /// When set, a valid cosign signature by this key over the manifest digest is required.
    pub verify: Option<&'a VerificationKey>,
    /// Largest graph blob accepted; at most [`MAX_MAX_BYTES`].
    pub max_bytes: u64,
    /// Largest code layer accepted; at most [`MAX_MAX_CODE_BYTES`].
    pub max_code_bytes: u64,
    pub connect_timeout: Duration,
    /// Limit for one request; the whole pull is bounded by the fetcher's ceiling.
    pub timeout: Duration,
    /// Longest any body of the pull (manifest, blob, token, signature) may go without a byte.
    pub stall_timeout: Duration,
    pub ca_bundle_pem: Option<&'a [u8]>,
    /// Talk plain HTTP to the registry and its realm (credentials then cross unencrypted).
    pub allow_insecure_http: bool,
    pub retry: RetryPolicy,
}

impl<'a> OciRequest<'a> {
    pub fn new(reference: &'a OciReference, credentials: &'a RegistryCredentials) -> Self {
        Self {
            reference,
            credentials,
            previous_manifest_digest: None,
            verify: None,
            max_bytes: DEFAULT_MAX_BYTES,
            max_code_bytes: DEFAULT_MAX_CODE_BYTES,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            ca_bundle_pem: None,
            allow_insecure_http: false,
            retry: RetryPolicy::default(),
        }
    }
}

impl fmt::Debug for OciRequest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OciRequest")
            .field("reference", &self.reference)
            .field("credentials", &self.credentials)
            .field("previous_manifest_digest", &self.previous_manifest_digest)
            .field("verify", &self.verify.is_some())
            .field("max_bytes", &self.max_bytes)
            .field("allow_insecure_http", &self.allow_insecure_http)
            .finish_non_exhaustive()
    }
}

/// The code layer of a pulled artifact: checked against its descriptor's digest and size,
/// not yet as an archive (`pypackage::code::check` does that).
#[derive(PartialEq, Eq)]
pub struct FetchedCode {
    pub bytes: FetchedBytes,
    pub digest: Sha256Digest,
    pub size: u64,
    /// The modules its annotation lists (for people; the archive itself decides).
    pub modules: Vec<String>,
}

impl fmt::Debug for FetchedCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FetchedCode")
            .field("digest", &self.digest)
            .field("size", &self.size)
            .field("modules", &self.modules)
            .finish_non_exhaustive()
    }
}

/// What a pull found.
#[derive(PartialEq, Eq)]
pub enum OciOutcome {
    /// The tag still names the manifest applied now.
    Unchanged { manifest_digest: Sha256Digest },
    /// A (new) graph.
    Fetched {
        bytes: FetchedBytes,
        manifest_digest: Sha256Digest,
        graph_digest: Sha256Digest,
        size: u64,
        /// The code layer, when the artifact has one.
        code: Option<Box<FetchedCode>>,
    },
}

impl fmt::Debug for OciOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OciOutcome::Unchanged { manifest_digest } => f
                .debug_struct("Unchanged")
                .field("manifest_digest", manifest_digest)
                .finish(),
            OciOutcome::Fetched {
                manifest_digest,
                graph_digest,
                size,
                code,
                ..
            } => f
                .debug_struct("Fetched")
                .field("manifest_digest", manifest_digest)
                .field("graph_digest", graph_digest)
                .field("size", size)
                .field("code", code)
                .finish_non_exhaustive(),
        }
    }
}

impl Fetcher {
    /// Pulls the graph `request.reference` names. Transient failures are retried per
    /// `request.retry` within the fetcher's ceiling on one fetch.
    pub async fn pull_oci(&self, request: &OciRequest<'_>) -> Result<OciOutcome, SourceError> {
        let shown = request.reference.to_string();
        let span = info_span!("source_pull_oci", reference = %shown);
        async {
            let limit = self.max_fetch_duration();
            let deadline = tokio::time::Instant::now() + limit;
            let transport = self.oci_transport(Connection {
                registry: request.reference.registry(),
                ca_bundle_pem: request.ca_bundle_pem,
                allow_insecure_http: request.allow_insecure_http,
                connect_timeout: request.connect_timeout,
                timeout: request.timeout.min(limit),
                stall_timeout: request.stall_timeout,
                deadline,
            })?;
            let session = Session::new(
                &transport,
                request.credentials,
                self.oci_tokens(),
                format!("repository:{}:pull", request.reference.repository()),
            );
            let session = &session;
            let result = with_retries(&request.retry, limit, deadline, &shown, |_| {
                pull_once(session, request)
            })
            .await;
            if let Err(error) = &result {
                warn!(reason = error.reason(), error = %error, "graph pull failed");
            }
            result
        }
        .instrument(span)
        .await
    }
}

async fn pull_once(
    session: &Session<'_>,
    request: &OciRequest<'_>,
) -> Result<OciOutcome, SourceError> {
    let started = Instant::now();
    let reference = request.reference;
    let (manifest_digest, manifest_bytes) = match reference.digest() {
        Some(digest) => (digest, None),
        None => match resolve_tag(session, reference).await? {
            Some(digest) => (digest, None),
            // The registry announced no digest: the manifest's own bytes decide.
            None => {
                let (bytes, digest) = get_manifest(session, reference, None).await?;
                (digest, Some(bytes))
            }
        },
    };
    if request.previous_manifest_digest == Some(manifest_digest) {
        // A key added or changed since the graph was applied must judge it too.
        if let Some(key) = request.verify {
            verify_signature(session, reference, manifest_digest, None, key).await?;
        }
        info!(manifest_digest = %manifest_digest, "graph manifest unchanged");
        return Ok(OciOutcome::Unchanged { manifest_digest });
    }
    let manifest_bytes = match manifest_bytes {
        Some(bytes) => bytes,
        None => {
            get_manifest(session, reference, Some(manifest_digest))
                .await?
                .0
        }
    };
    finish(session, request, manifest_digest, &manifest_bytes, started).await
}

/// Checks the manifest, the signature, and fetches the graph blob.
async fn finish(
    session: &Session<'_>,
    request: &OciRequest<'_>,
    manifest_digest: Sha256Digest,
    manifest_bytes: &[u8],
    started: Instant,
) -> Result<OciOutcome, SourceError> {
    let reference = request.reference;
    let manifest =
        Manifest::parse(manifest_bytes).map_err(|error| manifest_error(reference, error))?;
    let (layer, graph_digest) = manifest
        .graph_layer()
        .map_err(|error| manifest_error(reference, error))?;
    let max_bytes = request.max_bytes.min(MAX_MAX_BYTES);
    let code_layer = manifest
        .code_layer()
        .map_err(|error| manifest_error(reference, error))?;
    let max_code_bytes = request.max_code_bytes.min(MAX_MAX_CODE_BYTES);
    if let Some((layer, _)) = code_layer
        && layer.size > max_code_bytes
    {
        return Err(SourceError::CodeTooLarge {
            reference: reference.to_string(),
            size: layer.size,
            limit: max_code_bytes,
        });
    }
    if let Some(key) = request.verify {
        verify_signature(
            session,
            reference,
            manifest_digest,
            Some(manifest_bytes),
            key,
        )
        .await?;
    }
    if layer.size > max_bytes {
        return Err(SourceError::TooLarge {
            url: redact_url(&blob_url(session, reference, graph_digest)?),
            limit: max_bytes,
            declared: Some(layer.size),
        });
    }
    let Some((graph, digest, size)) =
        read_layer_blob(session, reference, layer, graph_digest).await?
    else {
        return Err(SourceError::from_status(
            StatusCode::NOT_FOUND,
            redact_url(&blob_url(session, reference, graph_digest)?),
            true,
        ));
    };
    if digest != graph_digest {
        return Err(SourceError::OciDigestMismatch {
            reference: reference.to_string(),
            what: "graph layer",
            expected: graph_digest.to_string(),
            actual: digest.to_string(),
        });
    }
    let code = match code_layer {
        Some((layer, digest)) => Some(Box::new(
            fetch_code(session, reference, layer, digest).await?,
        )),
        None => None,
    };
    info!(
        manifest_digest = %manifest_digest,
        graph_digest = %graph_digest,
        bytes = size,
        code_digest = code.as_ref().map(|c| c.digest.to_string()),
        code_bytes = code.as_ref().map(|c| c.size),
        verified = request.verify.is_some(),
        duration_ms = millis(started.elapsed()),
        "graph pulled"
    );
    Ok(OciOutcome::Fetched {
        bytes: graph,
        manifest_digest,
        graph_digest,
        size,
        code,
    })
}

/// Reads the code layer `layer` (its size already checked against the request's limit)
/// within the memory budget; its sha256 must be `digest`.
async fn fetch_code(
    session: &Session<'_>,
    reference: &OciReference,
    layer: &Descriptor,
    digest: Sha256Digest,
) -> Result<FetchedCode, SourceError> {
    let Some((bytes, actual, size)) = read_layer_blob(session, reference, layer, digest).await?
    else {
        return Err(SourceError::CodeLayerMissing {
            reference: reference.to_string(),
            digest: digest.to_string(),
        });
    };
    if actual != digest {
        return Err(SourceError::CodeDigestMismatch {
            reference: reference.to_string(),
            expected: digest.to_string(),
            actual: actual.to_string(),
        });
    }
    let modules = layer
        .annotations
        .get(ANNOTATION_CODE_MODULES)
        .map(|list| {
            list.split(',')
                .filter(|m| !m.is_empty())
                .take(64)
                .map(|m| m.chars().take(128).collect())
                .collect()
        })
        .unwrap_or_default();
    Ok(FetchedCode {
        size,
        bytes,
        digest,
        modules,
    })
}

fn blob_url(
    session: &Session<'_>,
    reference: &OciReference,
    digest: Sha256Digest,
) -> Result<reqwest::Url, SourceError> {
    session
        .transport
        .api_url(&format!("{}/blobs/{digest}", reference.repository()))
}

/// Reads the blob `digest` of `layer` within the descriptor's size (what the digest covers:
/// never more) and the memory budget; `None` when the registry has no such blob. Returns the
/// bytes, their sha256 (the caller compares it with the layer's, naming which layer) and size.
async fn read_layer_blob(
    session: &Session<'_>,
    reference: &OciReference,
    layer: &Descriptor,
    digest: Sha256Digest,
) -> Result<Option<(FetchedBytes, Sha256Digest, u64)>, SourceError> {
    let url = blob_url(session, reference, digest)?;
    let shown = redact_url(&url);
    let response = session.send(Method::GET, &url, &[]).await?;
    if response.status() == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if response.status() != StatusCode::OK {
        return Err(SourceError::from_status(
            response.status(),
            redact_url(response.url()),
            true,
        ));
    }
    let limit = layer.size;
    if let Some(declared) = response.content_length()
        && declared > limit
    {
        return Err(SourceError::TooLarge {
            url: shown,
            limit,
            declared: Some(declared),
        });
    }
    let transport = session.transport;
    let wait = transport
        .deadline
        .saturating_duration_since(tokio::time::Instant::now());
    let mut reservation = transport
        .budget
        .reserve(limit, wait)
        .await
        .map_err(|error| SourceError::memory_budget(shown.clone(), error))?;
    let answered_by = response.url().clone();
    let (bytes, actual, capacity) =
        read_capped_body(response, limit, limit, transport.stall_timeout, &shown)
            .await
            .map_err(|error| {
                error.map_transport(|error| transport.transport_error(&error, &answered_by))
            })?;
    reservation.shrink_to(capacity);
    let size = bytes.len() as u64;
    Ok(Some((
        FetchedBytes::budgeted(bytes, reservation),
        actual,
        size,
    )))
}

fn manifest_error(reference: &OciReference, error: ManifestError) -> SourceError {
    match error {
        ManifestError::Invalid(problem) => SourceError::InvalidManifest {
            reference: reference.to_string(),
            problem,
        },
        ManifestError::WrongMediaType(problem) => SourceError::WrongMediaType {
            reference: reference.to_string(),
            problem,
        },
    }
}

fn accept_manifests() -> [(HeaderName, HeaderValue); 1] {
    [(ACCEPT, HeaderValue::from_static(MANIFEST_ACCEPT))]
}

/// The digest a tag names now (`HEAD`); `None` when the registry does not say.
async fn resolve_tag(
    session: &Session<'_>,
    reference: &OciReference,
) -> Result<Option<Sha256Digest>, SourceError> {
    let url = manifest_url(session, reference, &reference.manifest_reference())?;
    let response = session
        .send(Method::HEAD, &url, &accept_manifests())
        .await?;
    let status = response.status();
    if status == StatusCode::NOT_FOUND {
        return Err(not_found(reference, None));
    }
    if status != StatusCode::OK {
        return Err(SourceError::from_status(status, redact_url(&url), true));
    }
    Ok(response
        .headers()
        .get(DOCKER_CONTENT_DIGEST)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.strip_prefix(Sha256Digest::PREFIX))
        .and_then(|hex| hex.parse().ok()))
}

/// The manifest's bytes and their digest; with `expected`, it is fetched by that digest and
/// must have it.
pub(super) async fn get_manifest(
    session: &Session<'_>,
    reference: &OciReference,
    expected: Option<Sha256Digest>,
) -> Result<(bytes::Bytes, Sha256Digest), SourceError> {
    let name = match expected {
        Some(digest) => digest.to_string(),
        None => reference.manifest_reference(),
    };
    let url = manifest_url(session, reference, &name)?;
    let bytes = get_document(
        session,
        &url,
        &accept_manifests(),
        MAX_MANIFEST_BYTES,
        &[StatusCode::NOT_FOUND],
    )
    .await?
    .ok_or_else(|| not_found(reference, expected))?;
    let actual = Sha256Digest::of(&bytes);
    if let Some(expected) = expected
        && actual != expected
    {
        return Err(SourceError::OciDigestMismatch {
            reference: reference.to_string(),
            what: "manifest",
            expected: expected.to_string(),
            actual: actual.to_string(),
        });
    }
    tracing::debug!(bytes = bytes.len(), "manifest read");
    Ok((bytes, actual))
}

/// GETs a small document (manifest, index) of at most `limit` bytes; `None` when the
/// registry answers one of the `absent` statuses.
pub(crate) async fn get_document(
    session: &Session<'_>,
    url: &reqwest::Url,
    headers: &[(HeaderName, HeaderValue)],
    limit: u64,
    absent: &[StatusCode],
) -> Result<Option<bytes::Bytes>, SourceError> {
    let response = session.send(Method::GET, url, headers).await?;
    let status = response.status();
    if absent.contains(&status) {
        return Ok(None);
    }
    if status != StatusCode::OK {
        return Err(SourceError::from_status(status, redact_url(url), true));
    }
    read_small_body(session.transport, response, limit, &redact_url(url))
        .await
        .map(Some)
}

fn manifest_url(
    session: &Session<'_>,
    reference: &OciReference,
    name: &str,
) -> Result<reqwest::Url, SourceError> {
    session
        .transport
        .api_url(&format!("{}/manifests/{name}", reference.repository()))
}

fn not_found(reference: &OciReference, digest: Option<Sha256Digest>) -> SourceError {
    match (digest.or(reference.digest()), reference.tag()) {
        (None, Some(tag)) => SourceError::TagNotFound {
            repository: format!("{}/{}", reference.registry(), reference.repository()),
            tag: tag.to_owned(),
        },
        (digest, _) => SourceError::ManifestNotFound {
            repository: format!("{}/{}", reference.registry(), reference.repository()),
            digest: digest.map(|digest| digest.to_string()).unwrap_or_default(),
        },
    }
}
