//! Fetching a model graph: HTTPS, bearer token, digest, ETag, limits, retries.
//!
//! [`Fetcher::fetch`] downloads the graph named by a [`FetchRequest`] and reports a
//! [`FetchOutcome`] or a [`SourceError`] whose [`SourceError::reason`] is a stable code for
//! Kubernetes conditions. Secrets stay out of every message: the token prints as `<redacted>`
//! and URLs are shown without userinfo, query string or fragment.

mod client;
mod digest;
mod error;
mod fetcher;
mod redact;
mod request;

pub use digest::{Sha256Digest, Sha256ParseError};
pub use error::{SourceError, TimeoutPhase, reasons};
pub use fetcher::{FetchOutcome, Fetcher, FetcherOptions};
pub use redact::redact_url;
pub use request::{
    BearerToken, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT, FetchRequest,
    RetryPolicy,
};
