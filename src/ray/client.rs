//! The Ray dashboard HTTP client: the [`DashboardClient`] trait controllers program against, and
//! [`RayDashboardClient`], its reqwest implementation.
//!
//! Timeouts are short on purpose (2 s to connect, 10 s per call by default): a reconcile that
//! talks to a dead head must fail fast and retry later, not hang. Errors name the endpoint and
//! quote Ray's answer (see [`DashboardError`]).
//!
//! This file holds the trait, the client's state and its construction; each API's calls live
//! with that API's types (`serve.rs`, `jobs.rs`), and sending a request and reading its answer
//! (connection pool, token header, size and time bounds, error mapping) in `transport.rs`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use reqwest::header::HeaderValue;
use serde::{Deserialize, Serialize};

use super::error::DashboardError;
use super::jobs::{JobDetails, JobSubmitRequest};
use super::lenient;
use super::locate::DashboardUrl;
use super::serve::ServeInstanceDetails;
use super::transport::shared_http_client;

pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The header the token travels in. Ray reads `Authorization` first and this one when that is
/// absent; this one also survives proxies that consume `Authorization` themselves (the API
/// server's Service proxy), which is why KubeRay uses it too.
pub const TOKEN_HEADER: &str = "x-ray-authorization";

/// A Ray auth token (clusters started with `RAY_AUTH_MODE=token`). Never printed: `Debug`
/// shows `<redacted>` and there is no `Display`.
#[derive(Clone)]
pub struct BearerToken(Arc<str>);

impl BearerToken {
    /// Surrounding whitespace is dropped (token files and Secret values often end in a newline).
    pub fn new(token: impl Into<String>) -> Result<BearerToken, DashboardError> {
        let token = token.into();
        let token = token.trim();
        // Visible ASCII only: HTTP would carry other bytes, but no Ray token contains them.
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(DashboardError::InvalidToken);
        }
        Ok(BearerToken(Arc::from(token)))
    }

    /// The raw token, for handing to a process that needs it (e.g. `RAY_AUTH_TOKEN`).
    pub fn expose_secret(&self) -> &str {
        &self.0
    }

    pub(super) fn header_value(&self) -> Result<HeaderValue, DashboardError> {
        let mut value = HeaderValue::from_str(&format!("Bearer {}", self.0))
            .map_err(|_| DashboardError::InvalidToken)?;
        // Keeps the value out of hyper's and reqwest's debug output.
        value.set_sensitive(true);
        Ok(value)
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

#[derive(Clone, Debug)]
pub struct DashboardClientOptions {
    /// Limit for opening the TCP connection.
    pub connect_timeout: Duration,
    /// Limit for a whole call, connection to last body byte. The first Serve PUT on a head
    /// starts Serve and takes ~5 s on an idle 2-core machine; a timeout there is harmless,
    /// the PUT is idempotent and the next reconcile repeats it.
    pub request_timeout: Duration,
    pub bearer_token: Option<BearerToken>,
}

impl Default for DashboardClientOptions {
    fn default() -> Self {
        DashboardClientOptions {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            bearer_token: None,
        }
    }
}

/// `GET /api/version`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RayVersion {
    /// Jobs REST API revision ("4" has DELETE for jobs).
    #[serde(deserialize_with = "lenient::option")]
    pub version: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub ray_version: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub ray_commit: Option<String>,
    /// Changes whenever the head restarts (without GCS fault tolerance, Serve state is gone).
    #[serde(deserialize_with = "lenient::option")]
    pub session_name: Option<String>,
}

/// The future every [`DashboardClient`] method returns.
pub type DashboardFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, DashboardError>> + Send + 'a>>;

/// What controllers need from a Ray dashboard. Object-safe (`Arc<dyn DashboardClient>`), so a
/// test can hand a controller a fake.
pub trait DashboardClient: Send + Sync {
    /// The dashboard this client talks to.
    fn dashboard_url(&self) -> &DashboardUrl;

    /// `GET /api/version`.
    fn get_version(&self) -> DashboardFuture<'_, RayVersion>;

    /// `GET /api/serve/applications/?api_type=declarative`: applications deployed through the
    /// declarative API (what PUT manages), with their deployments and replicas.
    fn get_serve_applications(&self) -> DashboardFuture<'_, ServeInstanceDetails>;

    /// `PUT /api/serve/applications/`: the whole declarative config (a JSON object, see
    /// [`serve_config_yaml_to_json`](super::serve_config_yaml_to_json)). Asynchronous on Ray's
    /// side: poll [`get_serve_applications`](Self::get_serve_applications). Applications
    /// missing from `config` that were deployed declaratively are deleted.
    fn put_serve_applications<'a>(
        &'a self,
        config: &'a serde_json::Value,
    ) -> DashboardFuture<'a, ()>;

    /// `DELETE /api/serve/applications/`: shuts Serve down (every application, the controller
    /// and the proxies).
    fn delete_serve_applications(&self) -> DashboardFuture<'_, ()>;

    /// `POST /api/jobs/`; returns the submission id.
    fn submit_job<'a>(&'a self, request: &'a JobSubmitRequest) -> DashboardFuture<'a, String>;

    /// `GET /api/jobs/{id}`; an unknown id is an error with [`DashboardError::is_not_found`].
    fn get_job<'a>(&'a self, job_id: &'a str) -> DashboardFuture<'a, JobDetails>;

    /// `GET /api/jobs/`.
    fn list_jobs(&self) -> DashboardFuture<'_, Vec<JobDetails>>;

    /// `GET /api/jobs/{id}/logs`: the whole driver log so far.
    fn get_job_logs<'a>(&'a self, job_id: &'a str) -> DashboardFuture<'a, String>;

    /// `POST /api/jobs/{id}/stop`: `true` if a stop signal was sent, `false` if the job had
    /// already ended. Stopping is asynchronous: poll until `STOPPED`.
    fn stop_job<'a>(&'a self, job_id: &'a str) -> DashboardFuture<'a, bool>;

    /// `DELETE /api/jobs/{id}`: only for jobs in a terminal state (Ray answers 500 otherwise).
    fn delete_job<'a>(&'a self, job_id: &'a str) -> DashboardFuture<'a, bool>;
}

/// The reqwest-based [`DashboardClient`]. Cheap to clone; clients made on one runtime with the
/// same connect timeout share one connection pool.
#[derive(Clone)]
pub struct RayDashboardClient {
    pub(super) http: reqwest::Client,
    pub(super) base: DashboardUrl,
    pub(super) token: Option<BearerToken>,
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
}

impl fmt::Debug for RayDashboardClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RayDashboardClient")
            .field("base", &self.base.as_str())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl RayDashboardClient {
    pub fn new(
        base: DashboardUrl,
        options: DashboardClientOptions,
    ) -> Result<RayDashboardClient, DashboardError> {
        Ok(RayDashboardClient {
            http: shared_http_client(options.connect_timeout)?,
            base,
            token: options.bearer_token,
            connect_timeout: options.connect_timeout,
            request_timeout: options.request_timeout,
        })
    }

    /// A client with the default timeouts and no token.
    pub fn from_url(url: &str) -> Result<RayDashboardClient, DashboardError> {
        RayDashboardClient::new(DashboardUrl::parse(url)?, DashboardClientOptions::default())
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    pub async fn get_version(&self) -> Result<RayVersion, DashboardError> {
        self.call(Method::GET, &["api", "version"], None, None)
            .await?
            .into_success()?
            .decode()
    }

    /// A JSON document below the base URL (e.g. a Serve route when the base is a Serve proxy),
    /// read with the same limits and error reporting as the dashboard's own endpoints.
    pub async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &[&str],
        query: Option<(&str, &str)>,
    ) -> Result<T, DashboardError> {
        self.call(Method::GET, path, query, None)
            .await?
            .into_success()?
            .decode()
    }
}

impl DashboardClient for RayDashboardClient {
    fn dashboard_url(&self) -> &DashboardUrl {
        &self.base
    }

    fn get_version(&self) -> DashboardFuture<'_, RayVersion> {
        Box::pin(RayDashboardClient::get_version(self))
    }

    fn get_serve_applications(&self) -> DashboardFuture<'_, ServeInstanceDetails> {
        Box::pin(RayDashboardClient::get_serve_applications(self))
    }

    fn put_serve_applications<'a>(
        &'a self,
        config: &'a serde_json::Value,
    ) -> DashboardFuture<'a, ()> {
        Box::pin(RayDashboardClient::put_serve_applications(self, config))
    }

    fn delete_serve_applications(&self) -> DashboardFuture<'_, ()> {
        Box::pin(RayDashboardClient::delete_serve_applications(self))
    }

    fn submit_job<'a>(&'a self, request: &'a JobSubmitRequest) -> DashboardFuture<'a, String> {
        Box::pin(RayDashboardClient::submit_job(self, request))
    }

    fn get_job<'a>(&'a self, job_id: &'a str) -> DashboardFuture<'a, JobDetails> {
        Box::pin(RayDashboardClient::get_job(self, job_id))
    }

    fn list_jobs(&self) -> DashboardFuture<'_, Vec<JobDetails>> {
        Box::pin(RayDashboardClient::list_jobs(self))
    }

    fn get_job_logs<'a>(&'a self, job_id: &'a str) -> DashboardFuture<'a, String> {
        Box::pin(RayDashboardClient::get_job_logs(self, job_id))
    }

    fn stop_job<'a>(&'a self, job_id: &'a str) -> DashboardFuture<'a, bool> {
        Box::pin(RayDashboardClient::stop_job(self, job_id))
    }

    fn delete_job<'a>(&'a self, job_id: &'a str) -> DashboardFuture<'a, bool> {
        Box::pin(RayDashboardClient::delete_job(self, job_id))
    }
}

#[cfg(test)]
mod tests;
