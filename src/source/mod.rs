//! Fetching a model graph: HTTPS, bearer token, digest, ETag, limits, retries.
//!
//! [`Fetcher::fetch`] downloads the graph named by a [`FetchRequest`] and reports a
//! [`FetchOutcome`] or a [`SourceError`] whose [`SourceError::reason`] is a stable code for
//! Kubernetes conditions. Secrets stay out of every message: the token prints as `<redacted>`
//! and URLs are shown without userinfo, query string or fragment.
//!
//! Registries are untrusted (issue 14): a fetch connects only to destinations the operator's
//! [`DestinationPolicy`] admits, checked on the resolved address of every hop; a body never
//! costs more than [`MAX_MAX_BYTES`] and is reserved from the operator-wide [`MemoryBudget`]
//! before it is read; one fetch never takes longer than [`MAX_FETCH_TIMEOUT`], and a body that
//! stops arriving ends it after [`DEFAULT_STALL_TIMEOUT`] without a byte.

mod budget;
mod client;
mod destination;
mod digest;
mod error;
mod fetcher;
pub mod oci;
mod redact;
mod request;

pub use budget::{BudgetError, DEFAULT_GRAPH_MEMORY_BUDGET, MemoryBudget, MemoryReservation};
pub use destination::{
    AllowedDestination, DestinationParseError, DestinationPolicy, IpNetwork, is_public,
};
pub use digest::{Sha256Digest, Sha256ParseError};
pub use error::{SourceError, TimeoutPhase, reasons};
pub use fetcher::{FetchOutcome, FetchedBytes, Fetcher, FetcherOptions};
pub use redact::redact_url;
pub use request::{
    BearerToken, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BYTES, DEFAULT_MAX_CODE_BYTES,
    DEFAULT_STALL_TIMEOUT, DEFAULT_TIMEOUT, FetchRequest, MAX_FETCH_TIMEOUT, MAX_MAX_BYTES,
    MAX_MAX_CODE_BYTES, RetryPolicy,
};
