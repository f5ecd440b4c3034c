//! [`SourceError`]: every way a fetch can fail, with a stable reason code for conditions.
//!
//! Messages carry only redacted URLs and never the token; transport errors are reduced to
//! text here (rather than kept as `source`) so that no nested error can print a URL with its
//! query string.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::time::Duration;

use reqwest::StatusCode;

use super::budget::BudgetError;
use super::destination::DestinationRefused;

/// The codes [`SourceError::reason`] returns, for Kubernetes condition reasons.
pub mod reasons {
    pub const INVALID_URL: &str = "InvalidUrl";
    pub const INSECURE_URL: &str = "InsecureUrl";
    pub const TOO_MANY_REDIRECTS: &str = "TooManyRedirects";
    pub const INVALID_REDIRECT: &str = "InvalidRedirect";
    pub const INVALID_DIGEST: &str = "InvalidDigest";
    pub const INVALID_TOKEN: &str = "InvalidToken";
    pub const INVALID_CA_BUNDLE: &str = "InvalidCaBundle";
    pub const TLS_ERROR: &str = "TlsError";
    pub const UNAUTHORIZED: &str = "Unauthorized";
    pub const FORBIDDEN: &str = "Forbidden";
    pub const NOT_FOUND: &str = "NotFound";
    pub const HTTP_ERROR: &str = "HttpError";
    pub const RATE_LIMITED: &str = "RateLimited";
    pub const SERVER_ERROR: &str = "ServerError";
    pub const TIMEOUT: &str = "Timeout";
    pub const BODY_STALLED: &str = "BodyStalled";
    pub const CONNECTION_FAILED: &str = "ConnectionFailed";
    pub const TOO_LARGE: &str = "TooLarge";
    pub const DIGEST_MISMATCH: &str = "DigestMismatch";
    pub const DESTINATION_NOT_ALLOWED: &str = "DestinationNotAllowed";
    pub const MEMORY_BUDGET_EXHAUSTED: &str = "MemoryBudgetExhausted";
    // OCI sources (issue 21).
    pub const INVALID_REFERENCE: &str = "InvalidReference";
    pub const INVALID_CREDENTIALS: &str = "InvalidCredentials";
    pub const REGISTRY_UNAUTHORIZED: &str = "RegistryUnauthorized";
    pub const TOKEN_REJECTED: &str = "TokenRejected";
    pub const TOKEN_EXPIRED: &str = "TokenExpired";
    pub const INVALID_AUTH_CHALLENGE: &str = "InvalidAuthChallenge";
    pub const INVALID_TOKEN_RESPONSE: &str = "InvalidTokenResponse";
    pub const TAG_NOT_FOUND: &str = "TagNotFound";
    pub const MANIFEST_NOT_FOUND: &str = "ManifestNotFound";
    pub const INVALID_MANIFEST: &str = "InvalidManifest";
    pub const WRONG_MEDIA_TYPE: &str = "WrongMediaType";
    pub const INVALID_PUBLIC_KEY: &str = "InvalidPublicKey";
    pub const SIGNATURE_MISSING: &str = "SignatureMissing";
    pub const SIGNATURE_INVALID: &str = "SignatureInvalid";
    pub const CODE_LAYER_MISSING: &str = "CodeLayerMissing";
    pub const CODE_DIGEST_MISMATCH: &str = "CodeDigestMismatch";
    pub const CODE_TOO_LARGE: &str = "CodeTooLarge";
}

/// Which limit a [`SourceError::Timeout`] hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutPhase {
    /// The connect timeout, while opening the connection.
    Connect,
    /// The per-attempt timeout, before the last body byte arrived.
    Transfer,
    /// The ceiling on one fetch with all its attempts and waits
    /// ([`MAX_FETCH_TIMEOUT`](super::MAX_FETCH_TIMEOUT)).
    Total,
}

impl fmt::Display for TimeoutPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimeoutPhase::Connect => "connecting to",
            TimeoutPhase::Transfer => "downloading from",
            TimeoutPhase::Total => "in all (every attempt included) fetching from",
        })
    }
}

/// Why a graph could not be fetched. URLs in here are already redacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    #[error("source URL {url} is not usable: {problem}")]
    InvalidUrl { url: String, problem: String },

    #[error(
        "refusing plain-HTTP URL {url}: the token and the graph would cross the network \
         unencrypted; use https://, or set allowInsecureHttp: true if that is acceptable"
    )]
    InsecureUrl { url: String },

    #[error(
        "refusing the redirect from {from} to {to}: it would leave HTTPS; point source.url \
         at the final HTTPS address or fix the registry's redirect"
    )]
    InsecureRedirect { from: String, to: String },

    #[error("more than {limit} redirects starting at {url}: point source.url at the final address")]
    TooManyRedirects { url: String, limit: usize },

    #[error("the redirect from {url} cannot be followed: {detail}")]
    InvalidRedirect { url: String, detail: String },

    #[error(
        "source.sha256 {value:?} is not a sha256 digest: expected 64 hex digits, optionally \
         prefixed by sha256:"
    )]
    InvalidPinnedDigest { value: String },

    #[error(
        "the bearer token cannot be sent in an HTTP header (it holds a control or non-ASCII \
         character): check the value in the Secret named by bearerTokenSecretRef"
    )]
    InvalidToken,

    #[error(
        "the CA bundle is not usable: {problem}; it must hold one or more PEM CERTIFICATE \
         blocks (see caBundleSecretRef)"
    )]
    InvalidCaBundle { problem: String },

    #[error("cannot set up TLS for fetching: {detail}; provide a CA bundle (caBundleSecretRef)")]
    TlsSetup { detail: String },

    #[error(
        "TLS with {url} failed: {detail}; if the registry's certificate comes from a private \
         CA, put that CA in the Secret named by caBundleSecretRef"
    )]
    Tls { url: String, detail: String },

    #[error("{}", unauthorized_message(url, *token_sent))]
    Unauthorized { url: String, token_sent: bool },

    #[error(
        "the token may not read {url} (HTTP 403 Forbidden): grant it read access, or put a \
         token that has it in the Secret named by bearerTokenSecretRef"
    )]
    Forbidden { url: String },

    #[error("no graph at {url} (HTTP {status}): check source.url")]
    NotFound { url: String, status: StatusCode },

    #[error("unexpected HTTP {status} from {url}: check source.url and the registry")]
    UnexpectedStatus { url: String, status: StatusCode },

    #[error(
        "the registry at {url} is rate limiting (HTTP 429 Too Many Requests){}: a later fetch \
         may succeed; use a longer refreshInterval if this persists",
        attempts_note(*attempts)
    )]
    RateLimited { url: String, attempts: u32 },

    #[error(
        "the registry at {url} failed with HTTP {status}{}: a problem on the registry's side; \
         a later fetch may succeed",
        attempts_note(*attempts)
    )]
    ServerError {
        url: String,
        status: StatusCode,
        attempts: u32,
    },

    #[error(
        "timed out after {limit:?} {phase} {url}{}: check the registry and the network path, \
         or raise the timeout",
        attempts_note(*attempts)
    )]
    Timeout {
        url: String,
        phase: TimeoutPhase,
        limit: Duration,
        attempts: u32,
    },

    /// The registry answered and then sent nothing for the stall timeout: ended long before the
    /// fetch's `timeout`, so a path that hangs does not hold its fetch slots for all of it.
    /// Transient, but not retried within the fetch (its next reconcile tries again).
    #[error(
        "the download from {url} stalled: the registry answered, then sent no body byte for \
         {limit:?} ({received} bytes received); a later fetch may succeed: check the registry \
         if this persists"
    )]
    BodyStalled {
        url: String,
        limit: Duration,
        received: u64,
    },

    #[error(
        "cannot reach {url}: {detail}{}: check the host, the port and network policies",
        attempts_note(*attempts)
    )]
    ConnectionFailed {
        url: String,
        detail: String,
        attempts: u32,
    },

    #[error("{}", too_large_message(url, *limit, *declared))]
    TooLarge {
        url: String,
        limit: u64,
        /// The size the server announced (Content-Length), when it announced one.
        declared: Option<u64>,
    },

    #[error(
        "the graph at {url} has digest {actual} but source.sha256 pins {expected}: refusing \
         it; update the pin if this version is intended"
    )]
    DigestMismatch {
        url: String,
        expected: String,
        actual: String,
    },

    /// The same for every cause (a private address, a name that does not resolve, a redirect
    /// hop), so that it reveals nothing about what is reachable; nothing was sent to the host.
    #[error(
        "refusing to fetch from {host}: it is not an allowed destination. Graphs are fetched \
         only from public addresses; to fetch from a private or in-cluster registry, the \
         operator's administrator adds its network (CIDR) or exact host name to \
         --source-allowed-destinations (Helm value source.allowedDestinations)"
    )]
    DestinationNotAllowed { host: String },

    #[error(
        "the operator's memory budget for graphs in flight ({budget} bytes) had no room for \
         the {requested} bytes the graph at {url} may need: other graphs are being fetched or \
         decoded; a later fetch may succeed. If this persists, lower maxBytes or ask the \
         operator's administrator to raise --graph-memory-budget (Helm value \
         source.graphMemoryBudget)"
    )]
    MemoryBudgetExhausted {
        url: String,
        requested: u64,
        budget: u64,
    },

    /// Not retried: waiting cannot help.
    #[error(
        "the graph at {url} may need {requested} bytes, more than the operator's whole memory \
         budget for graphs in flight ({budget} bytes): lower maxBytes, or ask the operator's \
         administrator to raise --graph-memory-budget (Helm value source.graphMemoryBudget)"
    )]
    LargerThanMemoryBudget {
        url: String,
        requested: u64,
        budget: u64,
    },

    #[error("source.oci is not usable: {0}")]
    InvalidReference(#[from] crate::source::oci::ReferenceError),

    #[error("the registry credentials Secret is not usable: {problem}")]
    InvalidCredentials { problem: String },

    #[error("{}", registry_unauthorized_message(registry, *credentials_sent))]
    RegistryUnauthorized {
        registry: String,
        credentials_sent: bool,
    },

    #[error(
        "the registry {registry} rejected the token it was given (HTTP 401): the credentials \
         may lack pull access to the repository, or the token issuer and the registry disagree"
    )]
    TokenRejected { registry: String },

    #[error(
        "the registry {registry} rejected a token that had already expired when it was issued \
         (issued_at + expires_in lies in the past): check the clock of the token issuer"
    )]
    TokenExpired { registry: String },

    #[error(
        "the registry {registry} sent an authentication challenge raypipe cannot follow: {problem}"
    )]
    InvalidAuthChallenge { registry: String, problem: String },

    #[error("the token endpoint {realm} answered something that is not a token: {problem}")]
    InvalidTokenResponse { realm: String, problem: String },

    #[error("no tag {tag:?} in {repository} (HTTP 404): check source.oci, or push the graph first")]
    TagNotFound { repository: String, tag: String },

    #[error("no manifest {digest} in {repository} (HTTP 404): check the digest in source.oci")]
    ManifestNotFound { repository: String, digest: String },

    #[error("the manifest of {reference} is not a raypipe graph artifact: {problem}")]
    InvalidManifest { reference: String, problem: String },

    #[error(
        "the {what} of {reference} has digest {actual} but {expected} was expected: refusing \
         it (the registry or something on the way changed the content)"
    )]
    OciDigestMismatch {
        reference: String,
        what: &'static str,
        expected: String,
        actual: String,
    },

    #[error("{reference} is not a raypipe graph: {problem}")]
    WrongMediaType { reference: String, problem: String },

    #[error("the public key for source.verify is not usable: {problem}")]
    InvalidPublicKey { problem: String },

    #[error(
        "{reference} (manifest {digest}) has no cosign signature (neither a sigstore bundle \
         nor a simple signature, looked up through the referrers API, the referrers tag {tag} \
         and the tag {tag}.sig): sign it with the key source.verify names (`cosign sign \
         --key`), or remove source.verify"
    )]
    SignatureMissing {
        reference: String,
        digest: String,
        tag: String,
    },

    #[error("the signature of {reference} (manifest {digest}) is not valid: {problem}")]
    SignatureInvalid {
        reference: String,
        digest: String,
        problem: String,
    },

    #[error(
        "the manifest of {reference} names the code layer {digest}, which the registry does not \
         have (HTTP 404): push the artifact again with `raypipe dag push --code`"
    )]
    CodeLayerMissing { reference: String, digest: String },

    #[error(
        "the code layer of {reference} has digest {actual} but the manifest names {expected}: \
         refusing it (the registry's storage or something on the way changed the code)"
    )]
    CodeDigestMismatch {
        reference: String,
        expected: String,
        actual: String,
    },

    #[error(
        "the code layer of {reference} is {size} bytes, more than {limit} (source.maxCodeBytes)"
    )]
    CodeTooLarge {
        reference: String,
        size: u64,
        limit: u64,
    },
}

fn attempts_note(attempts: u32) -> String {
    if attempts > 1 {
        format!(" (after {attempts} attempts)")
    } else {
        String::new()
    }
}

fn unauthorized_message(url: &str, token_sent: bool) -> String {
    if token_sent {
        format!(
            "the registry rejected the bearer token for {url} (HTTP 401 Unauthorized): put a \
             current token in the Secret named by bearerTokenSecretRef"
        )
    } else {
        format!(
            "{url} requires authentication (HTTP 401 Unauthorized) and no token was sent: set \
             bearerTokenSecretRef"
        )
    }
}

fn registry_unauthorized_message(registry: &str, credentials_sent: bool) -> String {
    if credentials_sent {
        format!(
            "the registry {registry} refused the credentials (HTTP 401): check the username and \
             password (or identity token) in the Secret named by source.credentialsSecretRef, or \
             the Docker login `raypipe dag` used"
        )
    } else {
        format!(
            "the registry {registry} requires authentication (HTTP 401) and no credentials were \
             configured: set source.credentialsSecretRef"
        )
    }
}

fn too_large_message(url: &str, limit: u64, declared: Option<u64>) -> String {
    let size = match declared {
        Some(declared) => format!("it declares {declared} bytes"),
        None => format!("more than {limit} bytes arrived"),
    };
    format!(
        "the graph at {url} exceeds the limit of {limit} bytes ({size}): raise maxBytes if \
         this size is expected"
    )
}

impl SourceError {
    /// A stable CamelCase code for condition reasons; see [`reasons`].
    pub fn reason(&self) -> &'static str {
        match self {
            SourceError::InvalidUrl { .. } => reasons::INVALID_URL,
            SourceError::InsecureUrl { .. } | SourceError::InsecureRedirect { .. } => {
                reasons::INSECURE_URL
            }
            SourceError::TooManyRedirects { .. } => reasons::TOO_MANY_REDIRECTS,
            SourceError::InvalidRedirect { .. } => reasons::INVALID_REDIRECT,
            SourceError::InvalidPinnedDigest { .. } => reasons::INVALID_DIGEST,
            SourceError::InvalidToken => reasons::INVALID_TOKEN,
            SourceError::InvalidCaBundle { .. } => reasons::INVALID_CA_BUNDLE,
            SourceError::TlsSetup { .. } | SourceError::Tls { .. } => reasons::TLS_ERROR,
            SourceError::Unauthorized { .. } => reasons::UNAUTHORIZED,
            SourceError::Forbidden { .. } => reasons::FORBIDDEN,
            SourceError::NotFound { .. } => reasons::NOT_FOUND,
            SourceError::UnexpectedStatus { .. } => reasons::HTTP_ERROR,
            SourceError::RateLimited { .. } => reasons::RATE_LIMITED,
            SourceError::ServerError { .. } => reasons::SERVER_ERROR,
            SourceError::Timeout { .. } => reasons::TIMEOUT,
            SourceError::BodyStalled { .. } => reasons::BODY_STALLED,
            SourceError::ConnectionFailed { .. } => reasons::CONNECTION_FAILED,
            SourceError::TooLarge { .. } => reasons::TOO_LARGE,
            SourceError::DigestMismatch { .. } => reasons::DIGEST_MISMATCH,
            SourceError::DestinationNotAllowed { .. } => reasons::DESTINATION_NOT_ALLOWED,
            SourceError::MemoryBudgetExhausted { .. }
            | SourceError::LargerThanMemoryBudget { .. } => reasons::MEMORY_BUDGET_EXHAUSTED,
            SourceError::InvalidReference(_) => reasons::INVALID_REFERENCE,
            SourceError::InvalidCredentials { .. } => reasons::INVALID_CREDENTIALS,
            SourceError::RegistryUnauthorized { .. } => reasons::REGISTRY_UNAUTHORIZED,
            SourceError::TokenRejected { .. } => reasons::TOKEN_REJECTED,
            SourceError::TokenExpired { .. } => reasons::TOKEN_EXPIRED,
            SourceError::InvalidAuthChallenge { .. } => reasons::INVALID_AUTH_CHALLENGE,
            SourceError::InvalidTokenResponse { .. } => reasons::INVALID_TOKEN_RESPONSE,
            SourceError::TagNotFound { .. } => reasons::TAG_NOT_FOUND,
            SourceError::ManifestNotFound { .. } => reasons::MANIFEST_NOT_FOUND,
            SourceError::InvalidManifest { .. } => reasons::INVALID_MANIFEST,
            SourceError::OciDigestMismatch { .. } => reasons::DIGEST_MISMATCH,
            SourceError::WrongMediaType { .. } => reasons::WRONG_MEDIA_TYPE,
            SourceError::InvalidPublicKey { .. } => reasons::INVALID_PUBLIC_KEY,
            SourceError::SignatureMissing { .. } => reasons::SIGNATURE_MISSING,
            SourceError::SignatureInvalid { .. } => reasons::SIGNATURE_INVALID,
            SourceError::CodeLayerMissing { .. } => reasons::CODE_LAYER_MISSING,
            SourceError::CodeDigestMismatch { .. } => reasons::CODE_DIGEST_MISMATCH,
            SourceError::CodeTooLarge { .. } => reasons::CODE_TOO_LARGE,
        }
    }

    /// Whether the same request may succeed later unchanged (and so is retried).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            SourceError::RateLimited { .. }
                | SourceError::ServerError { .. }
                | SourceError::Timeout { .. }
                | SourceError::BodyStalled { .. }
                | SourceError::ConnectionFailed { .. }
                | SourceError::MemoryBudgetExhausted { .. }
        )
    }

    /// Whether a fetch tries again at once (with backoff) after this error. Not after a stalled
    /// body: a path that hangs would hold its fetch slots through every attempt, while the
    /// pipeline's next reconcile retries it from the back of its namespace's queue.
    pub(crate) fn is_retried_within_fetch(&self) -> bool {
        self.is_transient() && !matches!(self, SourceError::BodyStalled { .. })
    }

    /// Whether fixing credentials or permissions is what would help.
    pub fn is_authorization_problem(&self) -> bool {
        matches!(
            self,
            SourceError::Unauthorized { .. }
                | SourceError::Forbidden { .. }
                | SourceError::RegistryUnauthorized { .. }
                | SourceError::TokenRejected { .. }
                | SourceError::TokenExpired { .. }
                | SourceError::InvalidCredentials { .. }
        )
    }

    /// Records how many attempts ended in this error (for the message of transient errors).
    pub(crate) fn with_attempts(mut self, made: u32) -> Self {
        match &mut self {
            SourceError::RateLimited { attempts, .. }
            | SourceError::ServerError { attempts, .. }
            | SourceError::Timeout { attempts, .. }
            | SourceError::ConnectionFailed { attempts, .. } => *attempts = made,
            _ => {}
        }
        self
    }

    /// The error for a reservation the memory budget could not grant (`url` redacted): also
    /// for the controller, which grows the fetch's reservation before decoding.
    pub fn memory_budget(url: String, error: BudgetError) -> Self {
        match error {
            BudgetError::LargerThanBudget { requested, budget } => {
                SourceError::LargerThanMemoryBudget {
                    url,
                    requested,
                    budget,
                }
            }
            BudgetError::Exhausted {
                requested, budget, ..
            } => SourceError::MemoryBudgetExhausted {
                url,
                requested,
                budget,
            },
        }
    }

    /// The error for a final response status that is not a success.
    pub(crate) fn from_status(status: StatusCode, url: String, token_sent: bool) -> Self {
        match status {
            StatusCode::UNAUTHORIZED => SourceError::Unauthorized { url, token_sent },
            StatusCode::FORBIDDEN => SourceError::Forbidden { url },
            StatusCode::NOT_FOUND | StatusCode::GONE => SourceError::NotFound { url, status },
            StatusCode::TOO_MANY_REQUESTS => SourceError::RateLimited { url, attempts: 1 },
            status if status.is_server_error() => SourceError::ServerError {
                url,
                status,
                attempts: 1,
            },
            status => SourceError::UnexpectedStatus { url, status },
        }
    }

    /// The error for a failure below HTTP (connecting, TLS, redirects, reading the body).
    pub(crate) fn from_transport(
        error: &reqwest::Error,
        url: String,
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Self {
        if let Some(refused) = find_cause::<DestinationRefused>(error) {
            return SourceError::DestinationNotAllowed {
                host: refused.host.clone(),
            };
        }
        if let Some(refused) = find_cause::<RedirectRefused>(error) {
            return SourceError::InsecureRedirect {
                from: refused.from.clone(),
                to: refused.to.clone(),
            };
        }
        if let Some(exceeded) = find_cause::<RedirectLimitExceeded>(error) {
            return SourceError::TooManyRedirects {
                url,
                limit: exceeded.limit,
            };
        }
        if error.is_timeout() {
            let (phase, limit) = if error.is_connect() {
                (TimeoutPhase::Connect, connect_timeout)
            } else {
                (TimeoutPhase::Transfer, timeout)
            };
            return SourceError::Timeout {
                url,
                phase,
                limit,
                attempts: 1,
            };
        }
        if let Some(tls) = find_cause::<rustls::Error>(error) {
            return SourceError::Tls {
                url,
                detail: tls.to_string(),
            };
        }
        if error.is_redirect() {
            return SourceError::InvalidRedirect {
                url,
                detail: innermost_cause(error),
            };
        }
        if error.is_builder() {
            return SourceError::InvalidUrl {
                url,
                problem: innermost_cause(error),
            };
        }
        let detail = if error.is_body() || error.is_decode() {
            format!(
                "the connection broke while downloading ({})",
                innermost_cause(error)
            )
        } else {
            innermost_cause(error)
        };
        SourceError::ConnectionFailed {
            url,
            detail,
            attempts: 1,
        }
    }
}

/// Raised by the redirect policy for a redirect that would leave HTTPS.
#[derive(Debug)]
pub(crate) struct RedirectRefused {
    pub(crate) from: String,
    pub(crate) to: String,
}

impl fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redirect from {} to {} refused", self.from, self.to)
    }
}

impl StdError for RedirectRefused {}

/// Raised by the redirect policy past its limit.
#[derive(Debug)]
pub(crate) struct RedirectLimitExceeded {
    pub(crate) limit: usize,
}

impl fmt::Display for RedirectLimitExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "more than {} redirects", self.limit)
    }
}

impl StdError for RedirectLimitExceeded {}

/// The chain of causes, looking into `io::Error`s: their `source()` skips the error they
/// wrap (returning that error's source instead), and that wrapped error is where
/// tokio-rustls puts a `rustls::Error`, sometimes two `io::Error`s deep.
fn causes<'a>(
    error: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(error), |&error| {
        match error
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
        {
            Some(wrapped) => Some(wrapped as &(dyn StdError + 'static)),
            None => error.source(),
        }
    })
}

/// The first `T` in the chain of causes.
fn find_cause<'a, T: StdError + 'static>(error: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    causes(error).find_map(|cause| cause.downcast_ref::<T>())
}

/// The most specific message in the chain ("Connection refused (os error 111)"); the outer
/// ones are generic ("error sending request", "client error (Connect)").
fn innermost_cause(error: &(dyn StdError + 'static)) -> String {
    causes(error)
        .last()
        .map(ToString::to_string)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "https://registry.example/g.pb";

    #[test]
    fn statuses_map_to_reasons_and_retryability() {
        let cases = [
            (401, "Unauthorized", false),
            (403, "Forbidden", false),
            (404, "NotFound", false),
            (410, "NotFound", false),
            (400, "HttpError", false),
            (408, "HttpError", false),
            (429, "RateLimited", true),
            (500, "ServerError", true),
            (502, "ServerError", true),
            (503, "ServerError", true),
            (302, "HttpError", false),
        ];
        for (code, reason, transient) in cases {
            let status = StatusCode::from_u16(code).expect("valid status");
            let error = SourceError::from_status(status, URL.into(), true);
            assert_eq!(error.reason(), reason, "{code}");
            assert_eq!(error.is_transient(), transient, "{code}");
        }
    }

    #[test]
    fn authorization_problems_are_flagged() {
        for code in [401, 403] {
            let status = StatusCode::from_u16(code).expect("valid status");
            assert!(SourceError::from_status(status, URL.into(), true).is_authorization_problem());
        }
        let not_found = SourceError::from_status(StatusCode::NOT_FOUND, URL.into(), true);
        assert!(!not_found.is_authorization_problem());
    }

    #[test]
    fn unauthorized_message_says_whether_a_token_was_sent() {
        let rejected = SourceError::from_status(StatusCode::UNAUTHORIZED, URL.into(), true);
        assert!(rejected.to_string().contains("rejected the bearer token"));
        let missing = SourceError::from_status(StatusCode::UNAUTHORIZED, URL.into(), false);
        assert!(missing.to_string().contains("no token was sent"));
    }

    #[test]
    fn messages_name_url_status_and_next_step() {
        let error = SourceError::from_status(StatusCode::NOT_FOUND, URL.into(), true);
        assert_eq!(
            error.to_string(),
            "no graph at https://registry.example/g.pb (HTTP 404 Not Found): check source.url"
        );
        let too_large = SourceError::TooLarge {
            url: URL.into(),
            limit: 10,
            declared: None,
        };
        assert!(too_large.to_string().contains("more than 10 bytes arrived"));
        assert!(too_large.to_string().contains("raise maxBytes"));
    }

    #[test]
    fn budget_errors_are_transient_only_when_waiting_can_help() {
        let full = SourceError::memory_budget(
            URL.into(),
            BudgetError::Exhausted {
                requested: 2048,
                budget: 4096,
                waited: Duration::from_secs(1),
            },
        );
        assert_eq!(full.reason(), "MemoryBudgetExhausted");
        assert!(full.is_transient());
        assert!(full.to_string().contains("2048 bytes"), "{full}");
        let never = SourceError::memory_budget(
            URL.into(),
            BudgetError::LargerThanBudget {
                requested: 8192,
                budget: 4096,
            },
        );
        assert_eq!(never.reason(), "MemoryBudgetExhausted");
        assert!(!never.is_transient());
        assert!(never.to_string().contains("lower maxBytes"), "{never}");
    }

    #[test]
    fn attempts_appear_only_after_retries() {
        let once = SourceError::from_status(StatusCode::BAD_GATEWAY, URL.into(), true);
        assert!(!once.to_string().contains("attempts"));
        let thrice = once.with_attempts(3);
        assert!(thrice.to_string().contains("(after 3 attempts)"));
        assert_eq!(thrice.reason(), "ServerError");
        // Non-transient errors carry no attempt count and are left alone.
        let forbidden = SourceError::Forbidden { url: URL.into() };
        assert_eq!(forbidden.clone().with_attempts(5), forbidden);
    }

    #[test]
    fn wrapped_rustls_error_is_found_inside_nested_io_errors() {
        // The shape reqwest 0.13 produces for a rejected server certificate.
        let io_error = io::Error::other(io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        ));
        let found = find_cause::<rustls::Error>(&io_error);
        assert!(matches!(
            found,
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            ))
        ));
        assert!(find_cause::<RedirectRefused>(&io_error).is_none());
        assert_eq!(
            innermost_cause(&io_error),
            "invalid peer certificate: UnknownIssuer"
        );
    }

    #[test]
    fn innermost_cause_is_the_most_specific_message() {
        #[derive(Debug)]
        struct Outer(io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("error sending request")
            }
        }
        impl StdError for Outer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let error = Outer(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(innermost_cause(&error), "connection refused");
    }
}
