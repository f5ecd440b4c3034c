//! What to fetch and how: [`FetchRequest`], its secret token and its retry policy.

use std::fmt;
use std::time::Duration;

use backoff::ExponentialBackoff;
use backoff::backoff::Backoff;
use reqwest::header::HeaderValue;

use super::error::SourceError;
use super::redact::redact_unparsed_url;

/// Largest graph accepted unless the request says otherwise: 16 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// Largest graph accepted whatever the request says (`maxBytes` is clamped to it): 64 MiB.
/// For the CRD's and the webhook's bound on `maxBytes`.
pub const MAX_MAX_BYTES: u64 = crate::graph::MAX_GRAPH_BYTES as u64;
/// Default largest code layer of a graph artifact (`source.maxCodeBytes`).
pub const DEFAULT_MAX_CODE_BYTES: u64 = 64 * 1024 * 1024;
/// The most `source.maxCodeBytes` may say (the push side's ceiling too).
pub const MAX_MAX_CODE_BYTES: u64 = 1024 * 1024 * 1024;
/// Longest one fetch may take whatever the request says, every attempt, backoff and wait for
/// the memory budget included: `timeout` is clamped to it, and so is the whole fetch. For the
/// CRD's and the webhook's bound on `timeout`.
pub const MAX_FETCH_TIMEOUT: Duration = Duration::from_secs(120);
/// Time allowed to open the TCP connection (and finish TLS) to the registry.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for one attempt, from connecting until the last body byte.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a response body may go without a byte before the fetch ends with `BodyStalled`
/// (issue 29): a registry that answers and then sends nothing would otherwise hold its fetch
/// slots for the whole `timeout` (up to 2 m). 15 s is far longer than a working registry or CDN
/// pauses between two reads, even while TCP resends a lost segment several times with doubling
/// waits, and an eighth of the longest `timeout`. Not a spec field: no working registry needs
/// more, and less would only trade a retry for a little less waiting.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(15);

/// A bearer token. Its `Debug` and `Display` print `<redacted>`, so it can sit in structs
/// that are logged; only [`BearerToken::expose_secret`] reveals it.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl BearerToken {
    /// Surrounding whitespace is dropped: Secrets made with `echo token | kubectl …` end in a
    /// newline, which would otherwise make the header invalid.
    pub fn new(token: impl Into<String>) -> Self {
        let token = token.into();
        let trimmed = token.trim();
        if trimmed.len() == token.len() {
            Self(token)
        } else {
            Self(trimmed.to_owned())
        }
    }

    pub fn expose_secret(&self) -> &str {
        &self.0
    }

    /// `Bearer <token>`, marked sensitive so hyper never logs it or indexes it in HPACK.
    pub(crate) fn authorization_header(&self) -> Result<HeaderValue, SourceError> {
        let mut value = HeaderValue::try_from(format!("Bearer {}", self.0))
            .map_err(|_| SourceError::InvalidToken)?;
        value.set_sensitive(true);
        Ok(value)
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Retries of transient failures (5xx, 429, timeouts, refused or reset connections) with
/// exponential backoff and jitter; nothing else is retried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 disables retries.
    pub max_attempts: u32,
    /// No new attempt starts once this much time has passed since the first one.
    pub max_elapsed: Duration,
    /// Wait before the first retry; each later wait doubles, up to `max_interval`.
    pub initial_interval: Duration,
    pub max_interval: Duration,
}

impl RetryPolicy {
    /// One attempt, no retry.
    pub const NONE: RetryPolicy = RetryPolicy {
        max_attempts: 1,
        max_elapsed: Duration::ZERO,
        initial_interval: Duration::ZERO,
        max_interval: Duration::ZERO,
    };

    pub(crate) fn backoff(&self) -> ExponentialBackoff {
        let mut backoff = ExponentialBackoff {
            current_interval: self.initial_interval,
            initial_interval: self.initial_interval,
            // Jitter keeps many pipelines that share one registry from retrying in lockstep.
            randomization_factor: 0.3,
            multiplier: 2.0,
            max_interval: self.max_interval,
            max_elapsed_time: Some(self.max_elapsed),
            ..ExponentialBackoff::default()
        };
        backoff.reset();
        backoff
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            max_elapsed: Duration::from_secs(60),
            initial_interval: Duration::from_millis(500),
            max_interval: Duration::from_secs(8),
        }
    }
}

/// One download of a graph. Build with [`FetchRequest::new`] and struct update syntax:
/// `FetchRequest { bearer_token: Some(&token), ..FetchRequest::new(url) }`.
#[derive(Clone)]
pub struct FetchRequest<'a> {
    /// `https://…` (or `http://…` with `allow_insecure_http`). It must not embed userinfo.
    pub url: &'a str,
    /// Sent as `Authorization: Bearer <token>`, never to another host after a redirect.
    pub bearer_token: Option<&'a BearerToken>,
    /// ETag of the graph applied now; sent as `If-None-Match` so an unchanged graph costs a 304.
    pub previous_etag: Option<&'a str>,
    /// Digest of the graph applied now (`sha256:<hex>` or hex): equal bytes give
    /// [`FetchOutcome::Unchanged`](super::FetchOutcome::Unchanged).
    pub previous_digest: Option<&'a str>,
    /// Pin (`sha256:<hex>` or hex): any other content is refused.
    pub pinned_sha256: Option<&'a str>,
    /// Largest body accepted, enforced while downloading; at most [`MAX_MAX_BYTES`].
    pub max_bytes: u64,
    pub connect_timeout: Duration,
    /// Limit for one attempt, from connecting until the last body byte; at most
    /// [`MAX_FETCH_TIMEOUT`], which also bounds the whole fetch.
    pub timeout: Duration,
    /// Longest the body may go without a byte ([`DEFAULT_STALL_TIMEOUT`]).
    pub stall_timeout: Duration,
    /// PEM CA certificates trusted in addition to the system's roots.
    pub ca_bundle_pem: Option<&'a [u8]>,
    /// Permits `http://` (the token then crosses the network unencrypted).
    pub allow_insecure_http: bool,
    pub retry: RetryPolicy,
}

impl<'a> FetchRequest<'a> {
    /// A request for `url` with the defaults: no token, 16 MiB, 5 s connect, 30 s per
    /// attempt, 15 s without a body byte, HTTPS only, [`RetryPolicy::default`].
    pub fn new(url: &'a str) -> Self {
        Self {
            url,
            bearer_token: None,
            previous_etag: None,
            previous_digest: None,
            pinned_sha256: None,
            max_bytes: DEFAULT_MAX_BYTES,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            ca_bundle_pem: None,
            allow_insecure_http: false,
            retry: RetryPolicy::default(),
        }
    }
}

impl FetchRequest<'_> {
    /// `max_bytes` within the hard ceiling.
    pub fn effective_max_bytes(&self) -> u64 {
        self.max_bytes.min(MAX_MAX_BYTES)
    }

    /// `timeout` within the hard ceiling.
    pub fn effective_timeout(&self) -> Duration {
        self.timeout.min(MAX_FETCH_TIMEOUT)
    }
}

// Hand-written so the URL is redacted and the CA bundle is not dumped byte by byte.
impl fmt::Debug for FetchRequest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FetchRequest")
            .field("url", &redact_unparsed_url(self.url))
            .field("bearer_token", &self.bearer_token)
            .field("previous_etag", &self.previous_etag)
            .field("previous_digest", &self.previous_digest)
            .field("pinned_sha256", &self.pinned_sha256)
            .field("max_bytes", &self.max_bytes)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("stall_timeout", &self.stall_timeout)
            .field("ca_bundle_pem_len", &self.ca_bundle_pem.map(<[u8]>::len))
            .field("allow_insecure_http", &self.allow_insecure_http)
            .field("retry", &self.retry)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "tok-3f9a-very-secret";

    #[test]
    fn token_is_redacted_in_debug_and_display() {
        let token = BearerToken::new(TOKEN);
        assert_eq!(format!("{token:?}"), "<redacted>");
        assert_eq!(format!("{token}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(&token)), "Some(<redacted>)");
        assert_eq!(token.expose_secret(), TOKEN);
    }

    #[test]
    fn request_debug_hides_token_and_url_credentials() {
        let token = BearerToken::new(TOKEN);
        let request = FetchRequest {
            bearer_token: Some(&token),
            ca_bundle_pem: Some(b"-----BEGIN CERTIFICATE-----"),
            ..FetchRequest::new("https://user:pw@h/g.pb?sig=querysecret")
        };
        let debug = format!("{request:?} {request:#?}");
        for secret in [TOKEN, "pw", "querysecret"] {
            assert!(!debug.contains(secret), "{secret} leaked: {debug}");
        }
        assert!(debug.contains("https://h/g.pb"));
    }

    #[test]
    fn token_whitespace_from_secret_files_is_trimmed() {
        assert_eq!(BearerToken::new(" abc\n").expose_secret(), "abc");
        assert_eq!(BearerToken::new("abc").expose_secret(), "abc");
    }

    #[test]
    fn authorization_header_is_bearer_and_sensitive() {
        let header = BearerToken::new(TOKEN)
            .authorization_header()
            .expect("valid token");
        assert_eq!(
            header.to_str().ok(),
            Some(format!("Bearer {TOKEN}").as_str())
        );
        assert!(header.is_sensitive());
        assert!(!format!("{header:?}").contains(TOKEN));
    }

    #[test]
    fn token_with_a_control_character_is_refused_without_echoing_it() {
        let error = BearerToken::new("ab\ncd-secret")
            .authorization_header()
            .expect_err("newline is not allowed in a header");
        assert_eq!(error.reason(), "InvalidToken");
        assert!(!format!("{error} {error:?}").contains("secret"));
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let request = FetchRequest::new("https://h/g");
        assert_eq!(request.max_bytes, 16 * 1024 * 1024);
        assert_eq!(request.connect_timeout, Duration::from_secs(5));
        assert_eq!(request.timeout, Duration::from_secs(30));
        assert_eq!(request.stall_timeout, Duration::from_secs(15));
        assert!(!request.allow_insecure_http);
        assert!(request.retry.max_attempts > 1);
    }

    #[test]
    fn size_and_time_are_clamped_to_the_hard_ceilings() {
        let huge = FetchRequest {
            max_bytes: u64::MAX,
            timeout: Duration::MAX,
            ..FetchRequest::new("https://h/g")
        };
        assert_eq!(huge.effective_max_bytes(), 64 * 1024 * 1024);
        assert_eq!(huge.effective_timeout(), Duration::from_secs(120));
        let small = FetchRequest {
            max_bytes: 10,
            timeout: Duration::from_millis(5),
            ..FetchRequest::new("https://h/g")
        };
        assert_eq!(small.effective_max_bytes(), 10);
        assert_eq!(small.effective_timeout(), Duration::from_millis(5));
    }

    #[test]
    fn backoff_intervals_grow_and_stay_capped() {
        let policy = RetryPolicy {
            max_attempts: 10,
            max_elapsed: Duration::from_secs(3600),
            initial_interval: Duration::from_millis(100),
            max_interval: Duration::from_millis(400),
        };
        let mut backoff = policy.backoff();
        let waits: Vec<Duration> = (0..6).filter_map(|_| backoff.next_backoff()).collect();
        assert_eq!(waits.len(), 6);
        // 30% jitter around 100 ms, then capped at 400 ms (plus jitter).
        assert!(waits[0] >= Duration::from_millis(70) && waits[0] <= Duration::from_millis(130));
        assert!(waits.iter().all(|w| *w <= Duration::from_millis(520)));
        assert!(waits[5] >= Duration::from_millis(280));
    }
}
