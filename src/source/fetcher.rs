//! [`Fetcher`]: one conditional, size-capped, digest-checked download with retries.
//!
//! Nothing a registry declares sizes an allocation: the body buffer starts small and grows as
//! bytes arrive, within `maxBytes` (itself clamped to [`MAX_MAX_BYTES`]) and within what was
//! reserved from the operator's [`MemoryBudget`] before the body was read.

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{AUTHORIZATION, ETAG, HeaderValue, IF_NONE_MATCH};
use reqwest::{Client, Response, StatusCode, Url};
use sha2::{Digest, Sha256};
use tracing::{Instrument, debug, info, info_span, warn};

use super::budget::{BudgetError, DEFAULT_GRAPH_MEMORY_BUDGET, MemoryBudget, MemoryReservation};
use super::client::ClientCache;
use super::destination::{DestinationPolicy, check_literal_host};
use super::digest::Sha256Digest;
use super::error::{SourceError, TimeoutPhase};
use super::oci::TokenCache;
use super::redact::{redact_unparsed_url, redact_url};
use super::request::{FetchRequest, MAX_FETCH_TIMEOUT, RetryPolicy};

/// The body buffer's first allocation, whatever the registry declares; it doubles from there
/// as bytes actually arrive.
const INITIAL_BODY_CAPACITY: u64 = 64 * 1024;

/// A downloaded graph and its share of the operator's graph memory budget, which stays
/// reserved until this is dropped: keep it through decoding and validation, and grow the
/// reservation first ([`FetchedBytes::reserve_total`]) since decoding costs a multiple of the
/// wire size. Dereferences to the bytes.
pub struct FetchedBytes {
    bytes: Bytes,
    reservation: Option<MemoryReservation>,
}

impl FetchedBytes {
    /// Bytes that hold no reservation (tests, callers outside the operator).
    pub fn unbudgeted(bytes: impl Into<Bytes>) -> Self {
        Self {
            bytes: bytes.into(),
            reservation: None,
        }
    }

    /// Bytes read within `reservation` (an OCI blob).
    pub(in crate::source) fn budgeted(bytes: Bytes, reservation: MemoryReservation) -> Self {
        Self {
            bytes,
            reservation: Some(reservation),
        }
    }

    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The budget held for these bytes (`None` when unbudgeted).
    pub fn reservation(&self) -> Option<&MemoryReservation> {
        self.reservation.as_ref()
    }

    /// Grows the reservation to `total_bytes` (wire size and what decoding them will cost),
    /// waiting up to `wait`; a no-op when unbudgeted.
    pub async fn reserve_total(
        &mut self,
        total_bytes: u64,
        wait: Duration,
    ) -> Result<(), BudgetError> {
        match &mut self.reservation {
            Some(reservation) => reservation.grow_to(total_bytes, wait).await,
            None => Ok(()),
        }
    }

    pub fn into_parts(self) -> (Bytes, Option<MemoryReservation>) {
        (self.bytes, self.reservation)
    }
}

impl Deref for FetchedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl AsRef<[u8]> for FetchedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Equal when the bytes are; the reservation does not take part.
impl PartialEq for FetchedBytes {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for FetchedBytes {}

impl PartialEq<[u8]> for FetchedBytes {
    fn eq(&self, other: &[u8]) -> bool {
        self.bytes[..] == *other
    }
}

impl PartialEq<&[u8]> for FetchedBytes {
    fn eq(&self, other: &&[u8]) -> bool {
        self.bytes[..] == **other
    }
}

impl fmt::Debug for FetchedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FetchedBytes")
            .field("len", &self.bytes.len())
            .field(
                "reserved",
                &self.reservation.as_ref().map(MemoryReservation::bytes),
            )
            .finish()
    }
}

/// What a successful fetch found.
#[derive(PartialEq, Eq)]
pub enum FetchOutcome {
    /// The registry answered 304 to `If-None-Match`: the applied graph is current.
    NotModified {
        /// The ETag to send next time (the 304's own, else the one sent).
        etag: Option<String>,
    },
    /// A full download whose digest equals the previous one: nothing to apply. `etag` may
    /// differ from the previous one; storing it lets the next fetch end in a 304.
    Unchanged {
        digest: String,
        etag: Option<String>,
        size: u64,
    },
    /// New content.
    Fetched {
        bytes: FetchedBytes,
        /// `sha256:<hex>` of `bytes`.
        digest: String,
        etag: Option<String>,
        size: u64,
    },
}

// Hand-written so that logging an outcome never dumps megabytes of graph.
impl fmt::Debug for FetchOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchOutcome::NotModified { etag } => {
                f.debug_struct("NotModified").field("etag", etag).finish()
            }
            FetchOutcome::Unchanged { digest, etag, size } => f
                .debug_struct("Unchanged")
                .field("digest", digest)
                .field("etag", etag)
                .field("size", size)
                .finish(),
            FetchOutcome::Fetched {
                digest, etag, size, ..
            } => f
                .debug_struct("Fetched")
                .field("digest", digest)
                .field("etag", etag)
                .field("size", size)
                .finish_non_exhaustive(),
        }
    }
}

/// Process-wide settings of a [`Fetcher`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetcherOptions {
    /// Use `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` from the environment (clusters behind an
    /// egress proxy need this; tests turn it off so nothing leaves the loopback).
    pub honor_proxy_environment: bool,
    /// Where fetches may connect besides public addresses (`--source-allowed-destinations`).
    pub allowed_destinations: DestinationPolicy,
    /// Bytes all graphs in flight may occupy together (`--graph-memory-budget`).
    pub graph_memory_budget: u64,
    /// Longest one fetch may take, all attempts included; at most [`MAX_FETCH_TIMEOUT`]
    /// (only tests lower it).
    pub max_fetch_duration: Duration,
}

impl Default for FetcherOptions {
    fn default() -> Self {
        Self {
            honor_proxy_environment: true,
            allowed_destinations: DestinationPolicy::public_only(),
            graph_memory_budget: DEFAULT_GRAPH_MEMORY_BUDGET,
            max_fetch_duration: MAX_FETCH_TIMEOUT,
        }
    }
}

/// Downloads graphs. Create one per process and share it (clones share everything): it keeps
/// one HTTP client (and so one connection pool) per distinct CA bundle / HTTP policy / connect
/// timeout, and the one memory budget for graphs in flight.
#[derive(Clone)]
pub struct Fetcher {
    shared: Arc<Shared>,
}

struct Shared {
    clients: ClientCache,
    destinations: Arc<DestinationPolicy>,
    budget: MemoryBudget,
    max_fetch_duration: Duration,
    /// Registry tokens of OCI sources, shared by every pull.
    oci_tokens: TokenCache,
}

impl Default for Fetcher {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fetcher")
            .field("allowed_destinations", &self.shared.destinations.allowed())
            .field("budget", &self.shared.budget)
            .finish_non_exhaustive()
    }
}

/// What one attempt needs besides the request; prepared once before the retries.
struct Prepared<'r> {
    request: &'r FetchRequest<'r>,
    client: Client,
    url: Url,
    shown_url: String,
    authorization: Option<HeaderValue>,
    if_none_match: Option<HeaderValue>,
    pinned: Option<Sha256Digest>,
    previous: Option<Sha256Digest>,
    budget: &'r MemoryBudget,
    /// When the whole fetch must be over.
    deadline: tokio::time::Instant,
}

impl Fetcher {
    pub fn new() -> Self {
        Self::with_options(FetcherOptions::default())
    }

    pub fn with_options(options: FetcherOptions) -> Self {
        let destinations = Arc::new(options.allowed_destinations);
        Self {
            shared: Arc::new(Shared {
                clients: ClientCache::new(options.honor_proxy_environment, destinations.clone()),
                destinations,
                budget: MemoryBudget::new(options.graph_memory_budget),
                max_fetch_duration: options.max_fetch_duration.min(MAX_FETCH_TIMEOUT),
                oci_tokens: TokenCache::default(),
            }),
        }
    }

    /// The budget every fetch reserves its body from.
    pub fn memory_budget(&self) -> &MemoryBudget {
        &self.shared.budget
    }

    /// The client for this configuration (for OCI pulls, which make several requests).
    pub(in crate::source) fn client(
        &self,
        ca_bundle_pem: Option<&[u8]>,
        allow_insecure_http: bool,
        connect_timeout: Duration,
    ) -> Result<Client, SourceError> {
        self.shared.clients.client(
            ca_bundle_pem,
            allow_insecure_http,
            connect_timeout.min(MAX_FETCH_TIMEOUT),
        )
    }

    pub(in crate::source) fn destinations(&self) -> &DestinationPolicy {
        &self.shared.destinations
    }

    pub(in crate::source) fn max_fetch_duration(&self) -> Duration {
        self.shared.max_fetch_duration
    }

    pub(in crate::source) fn oci_tokens(&self) -> &TokenCache {
        &self.shared.oci_tokens
    }

    /// Downloads `request.url`. Transient failures are retried per `request.retry`; the
    /// error returned is the last one.
    pub async fn fetch(&self, request: &FetchRequest<'_>) -> Result<FetchOutcome, SourceError> {
        let shown_url = redact_unparsed_url(request.url);
        let span = info_span!("source_fetch", url = %shown_url);
        async {
            let result = self.fetch_with_retries(request).await;
            if let Err(error) = &result {
                warn!(reason = error.reason(), error = %error, "graph fetch failed");
            }
            result
        }
        .instrument(span)
        .await
    }

    /// Every attempt, backoff wait and budget wait fits before one deadline, at most
    /// `max_fetch_duration` (≤ [`MAX_FETCH_TIMEOUT`]) after the start.
    async fn fetch_with_retries(
        &self,
        request: &FetchRequest<'_>,
    ) -> Result<FetchOutcome, SourceError> {
        let limit = self.shared.max_fetch_duration;
        let deadline = tokio::time::Instant::now() + limit;
        let prepared = self.prepare(request, deadline)?;
        let prepared = &prepared;
        with_retries(
            &request.retry,
            limit,
            deadline,
            &prepared.shown_url,
            |attempt| attempt_once(prepared, attempt),
        )
        .await
    }

    /// Everything that can be checked before the network: URL, destination of an IP-literal
    /// host, pin, token, CA bundle.
    fn prepare<'r>(
        &'r self,
        request: &'r FetchRequest<'r>,
        deadline: tokio::time::Instant,
    ) -> Result<Prepared<'r>, SourceError> {
        let url = checked_url(request.url, request.allow_insecure_http)?;
        check_literal_host(&url, &self.shared.destinations)
            .map_err(|refused| SourceError::DestinationNotAllowed { host: refused.host })?;
        let shown_url = redact_url(&url);
        let pinned = request
            .pinned_sha256
            .map(|pin| {
                Sha256Digest::from_str(pin).map_err(|_| SourceError::InvalidPinnedDigest {
                    value: pin.to_owned(),
                })
            })
            .transpose()?;
        // A previous digest that does not parse only costs the "unchanged" shortcut.
        let previous = request
            .previous_digest
            .and_then(|digest| Sha256Digest::from_str(digest).ok());
        let authorization = request
            .bearer_token
            .map(|token| token.authorization_header())
            .transpose()?;
        let if_none_match = conditional_etag(request.previous_etag, pinned, previous);
        let client = self.shared.clients.client(
            request.ca_bundle_pem,
            request.allow_insecure_http,
            request.connect_timeout.min(MAX_FETCH_TIMEOUT),
        )?;
        if url.scheme() == "http" && authorization.is_some() {
            warn!("sending the bearer token over plain HTTP (allowInsecureHttp is set)");
        }
        Ok(Prepared {
            request,
            client,
            url,
            shown_url,
            authorization,
            if_none_match,
            pinned,
            previous,
            budget: &self.shared.budget,
            deadline,
        })
    }
}

/// Runs `attempt` (given its number, from 1) until it succeeds, fails for good, or the
/// retry policy or `deadline` (`limit` after the start) ends it; transient errors are retried
/// with backoff. The error returned is the last one, with the number of attempts made.
pub(in crate::source) async fn with_retries<T, F, Fut>(
    retry: &RetryPolicy,
    limit: Duration,
    deadline: tokio::time::Instant,
    shown_url: &str,
    attempt: F,
) -> Result<T, SourceError>
where
    F: Fn(u32) -> Fut,
    Fut: Future<Output = Result<T, SourceError>>,
{
    let max_attempts = retry.max_attempts.max(1);
    let attempts_made = AtomicU32::new(0);
    let attempts_made = &attempts_made;
    let attempt = &attempt;
    let mut backoff = retry.backoff();
    backoff.max_elapsed_time = Some(retry.max_elapsed.min(limit));
    let retries = backoff::future::retry_notify(
        backoff,
        move || async move {
            let number = attempts_made.fetch_add(1, Ordering::Relaxed) + 1;
            match attempt(number).await {
                Ok(outcome) => Ok(outcome),
                Err(error) if error.is_retried_within_fetch() && number < max_attempts => {
                    Err(backoff::Error::transient(error))
                }
                Err(error) => Err(backoff::Error::permanent(error)),
            }
        },
        |error: SourceError, wait: Duration| {
            warn!(
                reason = error.reason(),
                error = %error,
                retry_in_ms = millis(wait),
                "transient failure; retrying"
            );
        },
    );
    let result = match tokio::time::timeout_at(deadline, retries).await {
        Ok(result) => result,
        Err(_) => Err(SourceError::Timeout {
            url: shown_url.to_owned(),
            phase: TimeoutPhase::Total,
            limit,
            attempts: 1,
        }),
    };
    result.map_err(|error| error.with_attempts(attempts_made.load(Ordering::Relaxed)))
}

async fn attempt_once(prepared: &Prepared<'_>, attempt: u32) -> Result<FetchOutcome, SourceError> {
    let request = prepared.request;
    let started = Instant::now();
    let max_bytes = request.effective_max_bytes();
    // No attempt outlives the fetch's deadline.
    let timeout = request.effective_timeout().min(
        prepared
            .deadline
            .saturating_duration_since(tokio::time::Instant::now()),
    );
    let transport_error = |error: reqwest::Error| {
        SourceError::from_transport(
            &error,
            prepared.shown_url.clone(),
            request.connect_timeout,
            timeout,
        )
    };
    let mut builder = prepared.client.get(prepared.url.clone()).timeout(timeout);
    if let Some(authorization) = &prepared.authorization {
        builder = builder.header(AUTHORIZATION, authorization.clone());
    }
    if let Some(etag) = &prepared.if_none_match {
        builder = builder.header(IF_NONE_MATCH, etag.clone());
    }
    debug!(
        attempt,
        conditional = prepared.if_none_match.is_some(),
        "requesting graph"
    );
    let response = builder.send().await.map_err(transport_error)?;
    let status = response.status();
    // After redirects, the response comes from somewhere else; name that place in errors.
    let answered_by = redact_url(response.url());
    let etag = response_etag(&response);
    debug!(
        attempt,
        status = status.as_u16(),
        answered_by = %answered_by,
        elapsed_ms = millis(started.elapsed()),
        "response received"
    );

    if status == StatusCode::NOT_MODIFIED && prepared.if_none_match.is_some() {
        info!(
            status = status.as_u16(),
            duration_ms = millis(started.elapsed()),
            "graph not modified"
        );
        let etag = etag.or_else(|| request.previous_etag.map(str::to_owned));
        return Ok(FetchOutcome::NotModified { etag });
    }
    if status != StatusCode::OK {
        return Err(SourceError::from_status(
            status,
            answered_by,
            prepared.authorization.is_some(),
        ));
    }
    let declared = response.content_length();
    if let Some(declared) = declared
        && declared > max_bytes
    {
        return Err(SourceError::TooLarge {
            url: answered_by,
            limit: max_bytes,
            declared: Some(declared),
        });
    }

    // All the body may occupy is reserved in one piece before reading it (hyper never yields
    // more than a declared Content-Length), so fetches wait for each other whole rather than
    // each holding part of the budget while waiting for the rest.
    let most = declared.map_or(max_bytes, |declared| declared.min(max_bytes));
    let wait = prepared
        .deadline
        .saturating_duration_since(tokio::time::Instant::now());
    let mut reservation = prepared
        .budget
        .reserve(most, wait)
        .await
        .map_err(|error| SourceError::memory_budget(answered_by.clone(), error))?;
    let (bytes, digest, capacity) = read_capped_body(
        response,
        max_bytes,
        most,
        request.stall_timeout,
        &answered_by,
    )
    .await
    .map_err(|error| error.map_transport(transport_error))?;
    reservation.shrink_to(capacity);
    let size = bytes.len() as u64;
    if let Some(pinned) = prepared.pinned
        && pinned != digest
    {
        return Err(SourceError::DigestMismatch {
            url: answered_by,
            expected: pinned.to_string(),
            actual: digest.to_string(),
        });
    }
    let unchanged = prepared.previous == Some(digest);
    info!(
        status = status.as_u16(),
        bytes = size,
        digest = %digest,
        unchanged,
        duration_ms = millis(started.elapsed()),
        "graph downloaded"
    );
    let digest = digest.to_string();
    Ok(if unchanged {
        FetchOutcome::Unchanged { digest, etag, size }
    } else {
        FetchOutcome::Fetched {
            bytes: FetchedBytes {
                bytes,
                reservation: Some(reservation),
            },
            digest,
            etag,
            size,
        }
    })
}

pub(in crate::source) enum BodyError {
    Transport(reqwest::Error),
    Rejected(SourceError),
}

impl BodyError {
    pub(in crate::source) fn map_transport(
        self,
        map: impl FnOnce(reqwest::Error) -> SourceError,
    ) -> SourceError {
        match self {
            BodyError::Transport(error) => map(error),
            BodyError::Rejected(error) => error,
        }
    }
}

/// Reads the body chunk by chunk, hashing as it goes and stopping as soon as it passes
/// `max_bytes`, so an oversized or endless body never sits in memory, and as soon as no byte
/// arrived for `stall` ([`SourceError::BodyStalled`]). The buffer starts at
/// [`INITIAL_BODY_CAPACITY`] and doubles as bytes arrive, never past `reserved`; returns the
/// body, its digest and the buffer's capacity (what it occupies). Every body a fetch reads
/// (graph, OCI manifest, blob, token and signature documents) comes through here.
pub(in crate::source) async fn read_capped_body(
    mut response: Response,
    max_bytes: u64,
    reserved: u64,
    stall: Duration,
    shown_url: &str,
) -> Result<(Bytes, Sha256Digest, u64), BodyError> {
    let mut body: Vec<u8> = Vec::with_capacity(to_usize(reserved.min(INITIAL_BODY_CAPACITY)));
    let mut hasher = Sha256::new();
    loop {
        let next = tokio::time::timeout(stall, response.chunk())
            .await
            .map_err(|_| {
                BodyError::Rejected(SourceError::BodyStalled {
                    url: shown_url.to_owned(),
                    limit: stall,
                    received: body.len() as u64,
                })
            })?
            .map_err(BodyError::Transport)?;
        let Some(chunk) = next else {
            break;
        };
        let received = (body.len() as u64).saturating_add(chunk.len() as u64);
        if received > max_bytes {
            return Err(BodyError::Rejected(SourceError::TooLarge {
                url: shown_url.to_owned(),
                limit: max_bytes,
                declared: None,
            }));
        }
        let capacity = body.capacity() as u64;
        if received > capacity {
            // Doubling keeps the copying linear; `reserve_exact` keeps the buffer within the
            // reservation (hyper enforces a declared length, so `received <= reserved`).
            let grown = capacity.saturating_mul(2).min(reserved).max(received);
            body.reserve_exact(to_usize(grown).saturating_sub(body.len()));
        }
        hasher.update(&chunk);
        body.extend_from_slice(&chunk);
    }
    let capacity = body.capacity() as u64;
    Ok((
        Bytes::from(body),
        Sha256Digest::from_hasher(hasher),
        capacity,
    ))
}

fn to_usize(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// Parses the URL and applies the scheme and credential rules.
fn checked_url(text: &str, allow_insecure_http: bool) -> Result<Url, SourceError> {
    let url = Url::parse(text).map_err(|error| SourceError::InvalidUrl {
        url: redact_unparsed_url(text),
        problem: error.to_string(),
    })?;
    let invalid = |problem: &str| SourceError::InvalidUrl {
        url: redact_url(&url),
        problem: problem.to_owned(),
    };
    match url.scheme() {
        "https" => {}
        "http" if allow_insecure_http => {}
        "http" => {
            return Err(SourceError::InsecureUrl {
                url: redact_url(&url),
            });
        }
        _ => {
            return Err(invalid(
                "only https:// (or http:// when allowed) is supported",
            ));
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("it has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        // reqwest would turn them into a Basic Authorization header next to the bearer one.
        return Err(invalid(
            "it embeds credentials (user:password@); put the token in the Secret named by \
             bearerTokenSecretRef instead",
        ));
    }
    Ok(url)
}

/// The `If-None-Match` value to send, if any. With a pin, a 304 is only trustworthy when the
/// graph applied now is known to match the pin; otherwise the body is needed to check it.
fn conditional_etag(
    previous_etag: Option<&str>,
    pinned: Option<Sha256Digest>,
    previous_digest: Option<Sha256Digest>,
) -> Option<HeaderValue> {
    let etag = previous_etag?.trim();
    if etag.is_empty() {
        return None;
    }
    if let Some(pinned) = pinned
        && previous_digest != Some(pinned)
    {
        return None;
    }
    // An ETag that cannot be a header value (it came from status, so should not happen)
    // only costs the conditional request.
    HeaderValue::from_str(etag).ok()
}

fn response_etag(response: &Response) -> Option<String> {
    response
        .headers()
        .get(ETAG)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

pub(in crate::source) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(text: &str) -> Sha256Digest {
        Sha256Digest::of(text.as_bytes())
    }

    #[test]
    fn https_is_accepted_and_http_only_when_allowed() {
        assert!(checked_url("https://h/g.pb", false).is_ok());
        assert!(checked_url("http://h/g.pb", true).is_ok());
        let refused = checked_url("http://h/g.pb?sig=s3cret", false).expect_err("insecure");
        assert_eq!(refused.reason(), "InsecureUrl");
        assert!(refused.to_string().contains("http://h/g.pb"));
        assert!(!refused.to_string().contains("s3cret"));
    }

    #[test]
    fn other_schemes_garbage_and_credentials_are_invalid() {
        for text in [
            "ftp://h/g.pb",
            "file:///etc/passwd",
            "not a url",
            "https://",
            "https://alice:pw-s3cret@h/g.pb",
            "https://alice@h/g.pb",
        ] {
            let error = checked_url(text, true).expect_err(text);
            assert_eq!(error.reason(), "InvalidUrl", "{text}");
            let message = format!("{error} {error:?}");
            assert!(!message.contains("s3cret"), "{message}");
            assert!(!message.contains("alice"), "{message}");
        }
    }

    #[test]
    fn etag_is_sent_when_known_and_not_contradicted_by_a_pin() {
        let sent = |etag, pinned, previous| {
            conditional_etag(etag, pinned, previous).map(|v| v.to_str().unwrap_or("").to_owned())
        };
        assert_eq!(sent(Some("\"v1\""), None, None), Some("\"v1\"".to_owned()));
        assert_eq!(sent(None, None, None), None);
        assert_eq!(sent(Some("  "), None, None), None);
        // Pin equal to what is applied: a 304 means the pinned graph is still there.
        assert_eq!(
            sent(Some("\"v1\""), Some(digest("a")), Some(digest("a"))),
            Some("\"v1\"".to_owned())
        );
        // Pin changed, or applied digest unknown: the body is needed to verify the pin.
        assert_eq!(
            sent(Some("\"v1\""), Some(digest("b")), Some(digest("a"))),
            None
        );
        assert_eq!(sent(Some("\"v1\""), Some(digest("b")), None), None);
        // Not a valid header value.
        assert_eq!(sent(Some("\"v1\nx\""), None, None), None);
    }

    #[test]
    fn outcome_debug_does_not_dump_the_body() {
        let outcome = FetchOutcome::Fetched {
            bytes: FetchedBytes::unbudgeted(vec![b'x'; 10_000]),
            digest: "sha256:00".into(),
            etag: None,
            size: 10_000,
        };
        let debug = format!("{outcome:?}");
        assert!(debug.len() < 200, "{debug}");
        assert!(debug.contains("size: 10000"));
    }

    fn streamed(chunks: impl futures::Stream<Item = &'static [u8]> + Send + 'static) -> Response {
        use futures::StreamExt as _;
        let body = reqwest::Body::wrap_stream(
            chunks.map(|chunk| Ok::<_, std::io::Error>(Bytes::from_static(chunk))),
        );
        Response::from(http::Response::new(body))
    }

    /// Issue 29: a body that stops arriving ends after the stall timeout with its own reason
    /// (what arrived counted, nothing secret in it), long before any total timeout, and is not
    /// retried within the fetch.
    #[tokio::test]
    async fn a_body_that_stops_arriving_ends_after_the_stall_timeout() {
        use futures::StreamExt as _;
        let stall = Duration::from_millis(300);
        let url = "https://registry.example/g.pb";
        let hangs = futures::stream::iter([&b"abc"[..]]).chain(futures::stream::pending());
        let started = Instant::now();
        let Err(BodyError::Rejected(error)) =
            read_capped_body(streamed(hangs), 1024, 1024, stall, url).await
        else {
            panic!("a stalled body must end in an error");
        };
        let took = started.elapsed();
        assert!(took >= stall && took < Duration::from_secs(10), "{took:?}");
        assert_eq!(
            error,
            SourceError::BodyStalled {
                url: url.to_owned(),
                limit: stall,
                received: 3,
            }
        );
        assert_eq!(error.reason(), "BodyStalled");
        assert!(error.is_transient());
        assert!(!error.is_retried_within_fetch());
        let message = error.to_string();
        assert!(
            message.contains(url) && message.contains("300ms") && message.contains("3 bytes"),
            "{message}"
        );
    }

    /// The bound is on each gap, not on the whole body: a slow body that keeps arriving is
    /// read whole.
    #[tokio::test]
    async fn a_slow_body_that_keeps_arriving_is_read_whole() {
        use futures::StreamExt as _;
        let slow = futures::stream::iter(0..6).then(|_| async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            &b"ab"[..]
        });
        let read = read_capped_body(
            streamed(slow),
            1024,
            1024,
            Duration::from_millis(300),
            "https://registry.example/g.pb",
        )
        .await;
        let Ok((bytes, digest, _)) = read else {
            panic!("a body that keeps arriving is read");
        };
        assert_eq!(&bytes[..], b"abababababab");
        assert_eq!(digest, Sha256Digest::of(b"abababababab"));
    }

    #[test]
    fn fetch_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let fetcher = Fetcher::with_options(FetcherOptions {
            honor_proxy_environment: false,
            ..FetcherOptions::default()
        });
        let request = FetchRequest::new("https://127.0.0.1:1/never-polled");
        let future = fetcher.fetch(&request);
        assert_send(&future);
    }
}
