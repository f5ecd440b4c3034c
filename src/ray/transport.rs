//! Sending one request to a Ray dashboard and reading its answer: the shared connection pool
//! (per connect timeout and runtime), the token header, the size and time bounds, and the
//! mapping of reqwest's failures to [`DashboardError`]s that name the endpoint.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;

use super::client::{RayDashboardClient, TOKEN_HEADER};
use super::error::{DashboardError, body_excerpt};

/// Answers larger than this are refused; a Serve status with thousands of replicas is a few MB.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// One HTTP answer, whatever its status.
pub(super) struct Answer {
    pub(super) endpoint: String,
    pub(super) status: StatusCode,
    pub(super) body: Vec<u8>,
}

impl Answer {
    pub(super) fn into_success(self) -> Result<Answer, DashboardError> {
        if self.status.is_success() {
            Ok(self)
        } else {
            Err(DashboardError::Status {
                status: self.status,
                body: body_excerpt(&self.body),
                endpoint: self.endpoint,
            })
        }
    }

    pub(super) fn decode<T: DeserializeOwned>(&self) -> Result<T, DashboardError> {
        serde_json::from_slice(&self.body).map_err(|error| self.decode_error(error.to_string()))
    }

    /// Decodes the answer as `R` and picks the one field the caller needs, which must be there.
    pub(super) fn decode_field<R: DeserializeOwned, T>(
        &self,
        field: &str,
        pick: impl FnOnce(R) -> Option<T>,
    ) -> Result<T, DashboardError> {
        pick(self.decode()?).ok_or_else(|| self.decode_error(format!("no `{field}` field")))
    }

    pub(super) fn decode_error(&self, detail: String) -> DashboardError {
        DashboardError::Decode {
            endpoint: self.endpoint.clone(),
            detail,
            body: body_excerpt(&self.body),
        }
    }
}

impl RayDashboardClient {
    /// Sends one request and reads the whole answer, whatever its status.
    pub(super) async fn call(
        &self,
        method: Method,
        path: &[&str],
        query: Option<(&str, &str)>,
        json_body: Option<Vec<u8>>,
    ) -> Result<Answer, DashboardError> {
        let mut url = self.base.join(path);
        if let Some((key, value)) = query {
            url.query_pairs_mut().append_pair(key, value);
        }
        let endpoint = format!("{method} {url}");
        let mut request = self
            .http
            .request(method, url)
            .timeout(self.request_timeout)
            .header(ACCEPT, "application/json");
        if let Some(token) = &self.token {
            request = request.header(TOKEN_HEADER, token.header_value()?);
        }
        if let Some(body) = json_body {
            request = request.header(CONTENT_TYPE, "application/json").body(body);
        }
        let started = Instant::now();
        let mut response = request
            .send()
            .await
            .map_err(|e| self.transport_error(&endpoint, &e))?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.transport_error(&endpoint, &e))?
        {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(DashboardError::Transport {
                    endpoint,
                    detail: format!("the answer is larger than {MAX_RESPONSE_BYTES} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        tracing::debug!(
            %endpoint,
            status = status.as_u16(),
            bytes = body.len(),
            millis = started.elapsed().as_millis() as u64,
            "ray dashboard call"
        );
        Ok(Answer {
            endpoint,
            status,
            body,
        })
    }

    fn transport_error(&self, endpoint: &str, error: &reqwest::Error) -> DashboardError {
        let endpoint = endpoint.to_owned();
        if error.is_connect() {
            let detail = if error.is_timeout() {
                format!("no connection within {:?}", self.connect_timeout)
            } else {
                error_chain(error)
            };
            DashboardError::Unreachable { endpoint, detail }
        } else if error.is_timeout() {
            DashboardError::Timeout {
                endpoint,
                limit: self.request_timeout,
            }
        } else {
            DashboardError::Transport {
                endpoint,
                detail: error_chain(error),
            }
        }
    }
}

/// One reqwest client (one connection pool) per connect timeout and tokio runtime. A pooled
/// connection is driven by a task on the runtime that opened it; shared with another runtime
/// (each test has its own), a call fails with "dispatch task is gone" when the opener ends. A
/// program with one runtime has one pool per timeout.
pub(super) fn shared_http_client(
    connect_timeout: Duration,
) -> Result<reqwest::Client, DashboardError> {
    type Key = (Duration, Option<tokio::runtime::Id>);
    static CLIENTS: OnceLock<Mutex<HashMap<Key, reqwest::Client>>> = OnceLock::new();
    let key = (
        connect_timeout,
        tokio::runtime::Handle::try_current().ok().map(|h| h.id()),
    );
    let clients = CLIENTS.get_or_init(Default::default);
    // The map is never left half-updated, so a poisoned lock still holds a usable cache.
    let mut clients = clients.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(client) = clients.get(&key) {
        return Ok(client.clone());
    }
    // reqwest is built without a crypto provider of its own (https dashboards need one).
    crate::tls::install_crypto_provider();
    let client = reqwest::Client::builder()
        // Not a browser: Ray refuses non-GET calls from browsers (405) and redacts answers.
        .user_agent(concat!("raypipe/", env!("CARGO_PKG_VERSION")))
        .referer(false)
        .connect_timeout(connect_timeout)
        // Dashboards are reached directly (in-cluster DNS, or loopback in dev and tests); an
        // egress proxy from the environment must not get the calls or the token.
        .no_proxy()
        // Ray does not redirect; following one could hand the token to another host.
        .redirect(reqwest::redirect::Policy::none())
        // Well below aiohttp's keep-alive, so a pooled connection is not reused just as the
        // dashboard closes it.
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| DashboardError::ClientSetup {
            detail: error_chain(&e),
        })?;
    clients.insert(key, client.clone());
    Ok(client)
}

/// The error and its causes on one line, without repeating reqwest's copy of the URL (the
/// endpoint is reported separately).
fn error_chain(error: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    let top = if error.is_connect() {
        "connection failed"
    } else if error.is_body() || error.is_decode() {
        "reading the answer failed"
    } else if error.is_request() {
        "sending the request failed"
    } else {
        "HTTP error"
    };
    parts.push(top.to_owned());
    while let Some(current) = cause {
        let text = current.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        cause = current.source();
    }
    parts.join(": ")
}
