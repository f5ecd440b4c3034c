//! One HTTP exchange with a registry or its token realm: the fetcher's shared client (with
//! its destination guard and redirect policy), per-request timeouts within the pull's
//! deadline, transport errors mapped to [`SourceError`], and small bodies read within a cap
//! and the operator's memory budget.

use bytes::Bytes;
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use reqwest::{Client, Method, Response, Url};

use crate::source::budget::MemoryBudget;
use crate::source::destination::DestinationPolicy;
use crate::source::error::SourceError;
use crate::source::fetcher::read_capped_body;
use crate::source::redact::redact_url;
use std::time::Duration;

use super::auth::check_destination;

/// What every request of one pull shares.
pub struct Transport<'a> {
    pub client: Client,
    /// `host[:port]` of the registry.
    pub registry: &'a str,
    pub allow_insecure_http: bool,
    pub destinations: &'a DestinationPolicy,
    pub budget: &'a MemoryBudget,
    pub connect_timeout: Duration,
    /// Longest one request may take, until its last body byte.
    pub timeout: Duration,
    /// Longest a body may go without a byte.
    pub stall_timeout: Duration,
    /// When the whole pull must be over.
    pub deadline: tokio::time::Instant,
}

/// How one pull or push talks to its registry: the TLS and timeout settings of the request.
pub struct Connection<'a> {
    pub registry: &'a str,
    pub ca_bundle_pem: Option<&'a [u8]>,
    pub allow_insecure_http: bool,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    pub stall_timeout: Duration,
    pub deadline: tokio::time::Instant,
}

impl crate::source::fetcher::Fetcher {
    /// The transport of one pull or push, on the fetcher's shared clients, destination policy
    /// and memory budget.
    pub(in crate::source) fn oci_transport<'a>(
        &'a self,
        c: Connection<'a>,
    ) -> Result<Transport<'a>, SourceError> {
        Ok(Transport {
            client: self.client(c.ca_bundle_pem, c.allow_insecure_http, c.connect_timeout)?,
            registry: c.registry,
            allow_insecure_http: c.allow_insecure_http,
            destinations: self.destinations(),
            budget: self.memory_budget(),
            connect_timeout: c.connect_timeout,
            timeout: c.timeout,
            stall_timeout: c.stall_timeout,
            deadline: c.deadline,
        })
    }
}

impl Transport<'_> {
    /// `https://<registry>/v2/<path>` (`http` when insecure HTTP is allowed).
    pub fn api_url(&self, path: &str) -> Result<Url, SourceError> {
        let scheme = if self.allow_insecure_http {
            "http"
        } else {
            "https"
        };
        let text = format!("{scheme}://{}/v2/{path}", self.registry);
        let url = Url::parse(&text).map_err(|error| SourceError::InvalidUrl {
            url: text.clone(),
            problem: error.to_string(),
        })?;
        check_destination(&url, self.destinations)?;
        Ok(url)
    }

    /// Time left for one request: the per-request limit within the pull's deadline.
    pub fn request_timeout(&self) -> Duration {
        self.timeout.min(
            self.deadline
                .saturating_duration_since(tokio::time::Instant::now()),
        )
    }

    pub fn transport_error(&self, error: &reqwest::Error, url: &Url) -> SourceError {
        SourceError::from_transport(
            error,
            redact_url(url),
            self.connect_timeout,
            self.request_timeout(),
        )
    }

    /// Sends one request; the status is the caller's to judge.
    pub async fn send(
        &self,
        method: Method,
        url: &Url,
        headers: &[(HeaderName, HeaderValue)],
        authorization: Option<&HeaderValue>,
    ) -> Result<Response, SourceError> {
        self.send_body(method, url, headers, authorization, None)
            .await
    }

    /// [`Transport::send`] with a request body (the push side's uploads).
    pub async fn send_body(
        &self,
        method: Method,
        url: &Url,
        headers: &[(HeaderName, HeaderValue)],
        authorization: Option<&HeaderValue>,
        body: Option<Bytes>,
    ) -> Result<Response, SourceError> {
        let mut builder = self
            .client
            .request(method, url.clone())
            .timeout(self.request_timeout());
        if let Some(body) = body {
            builder = builder.body(body);
        }
        for (name, value) in headers {
            builder = builder.header(name, value.clone());
        }
        if let Some(authorization) = authorization {
            builder = builder.header(AUTHORIZATION, authorization.clone());
        }
        builder
            .send()
            .await
            .map_err(|error| self.transport_error(&error, url))
    }
}

/// Reads a body of at most `limit` bytes (a manifest, a token response), reserving it from
/// the memory budget while it is read.
pub async fn read_small_body(
    transport: &Transport<'_>,
    response: Response,
    limit: u64,
    shown_url: &str,
) -> Result<Bytes, SourceError> {
    let url = response.url().clone();
    if let Some(declared) = response.content_length()
        && declared > limit
    {
        return Err(SourceError::TooLarge {
            url: shown_url.to_owned(),
            limit,
            declared: Some(declared),
        });
    }
    let wait = transport
        .deadline
        .saturating_duration_since(tokio::time::Instant::now());
    let _reservation = transport
        .budget
        .reserve(limit, wait)
        .await
        .map_err(|error| SourceError::memory_budget(shown_url.to_owned(), error))?;
    let (bytes, _, _) =
        read_capped_body(response, limit, limit, transport.stall_timeout, shown_url)
            .await
            .map_err(|error| {
                error.map_transport(|error| transport.transport_error(&error, &url))
            })?;
    Ok(bytes)
}
