//! The Ray dashboard HTTP client: the [`DashboardClient`] trait controllers program against, and
//! [`RayDashboardClient`], its reqwest implementation.
//!
//! Timeouts are short on purpose (2 s to connect, 10 s per call by default): a reconcile that
//! talks to a dead head must fail fast and retry later, not hang. Errors name the endpoint and
//! quote Ray's answer (see [`DashboardError`]).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::{DashboardError, JOB_EXISTS_MARKER, body_excerpt};
use super::jobs::{
    JobDeleteResponse, JobDetails, JobLogsResponse, JobStopResponse, JobSubmitRequest,
    JobSubmitResponse,
};
use super::lenient;
use super::locate::DashboardUrl;
use super::serve::ServeInstanceDetails;

pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers larger than this are refused; a Serve status with thousands of replicas is a few MB.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

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

    fn header_value(&self) -> Result<HeaderValue, DashboardError> {
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
    http: reqwest::Client,
    base: DashboardUrl,
    token: Option<BearerToken>,
    connect_timeout: Duration,
    request_timeout: Duration,
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

/// One HTTP answer, whatever its status.
struct Answer {
    endpoint: String,
    status: StatusCode,
    body: Vec<u8>,
}

impl Answer {
    fn into_success(self) -> Result<Answer, DashboardError> {
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

    fn decode<T: DeserializeOwned>(&self) -> Result<T, DashboardError> {
        serde_json::from_slice(&self.body).map_err(|error| self.decode_error(error.to_string()))
    }

    /// Decodes the answer as `R` and picks the one field the caller needs, which must be there.
    fn decode_field<R: DeserializeOwned, T>(
        &self,
        field: &str,
        pick: impl FnOnce(R) -> Option<T>,
    ) -> Result<T, DashboardError> {
        pick(self.decode()?).ok_or_else(|| self.decode_error(format!("no `{field}` field")))
    }

    fn decode_error(&self, detail: String) -> DashboardError {
        DashboardError::Decode {
            endpoint: self.endpoint.clone(),
            detail,
            body: body_excerpt(&self.body),
        }
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

    pub async fn get_serve_applications(&self) -> Result<ServeInstanceDetails, DashboardError> {
        // The trailing slash matters: without it Ray answers 404.
        self.call(
            Method::GET,
            &["api", "serve", "applications", ""],
            Some(("api_type", "declarative")),
            None,
        )
        .await?
        .into_success()?
        .decode()
    }

    pub async fn put_serve_applications(
        &self,
        config: &serde_json::Value,
    ) -> Result<(), DashboardError> {
        if !config.is_object() {
            return Err(DashboardError::InvalidServeConfig {
                problem: "the config must be a JSON object with `applications`".to_owned(),
            });
        }
        let body = serde_json::to_vec(config).map_err(|e| DashboardError::InvalidServeConfig {
            problem: e.to_string(),
        })?;
        self.call(
            Method::PUT,
            &["api", "serve", "applications", ""],
            None,
            Some(body),
        )
        .await?
        .into_success()?;
        Ok(())
    }

    pub async fn delete_serve_applications(&self) -> Result<(), DashboardError> {
        self.call(
            Method::DELETE,
            &["api", "serve", "applications", ""],
            None,
            None,
        )
        .await?
        .into_success()?;
        Ok(())
    }

    pub async fn submit_job(&self, request: &JobSubmitRequest) -> Result<String, DashboardError> {
        if request.entrypoint.trim().is_empty() {
            return Err(DashboardError::InvalidRequest {
                problem: "a job needs a non-empty entrypoint".to_owned(),
            });
        }
        if let Some(id) = &request.submission_id {
            check_job_id(id)?;
        }
        let body = serde_json::to_vec(request).map_err(|e| DashboardError::InvalidRequest {
            problem: e.to_string(),
        })?;
        let answer = self
            .call(Method::POST, &["api", "jobs", ""], None, Some(body))
            .await?;
        // Ray reports a taken submission id as a 500 with a traceback; recognise it so a
        // controller retrying its own submission can treat it as done.
        if answer.status == StatusCode::INTERNAL_SERVER_ERROR
            && String::from_utf8_lossy(&answer.body).contains(JOB_EXISTS_MARKER)
        {
            return Err(DashboardError::JobAlreadyExists {
                endpoint: answer.endpoint,
                submission_id: request.submission_id.clone().unwrap_or_default(),
            });
        }
        answer
            .into_success()?
            .decode_field("submission_id", |response: JobSubmitResponse| {
                response.submission_id.or(response.job_id)
            })
    }

    pub async fn get_job(&self, job_id: &str) -> Result<JobDetails, DashboardError> {
        check_job_id(job_id)?;
        self.call(Method::GET, &["api", "jobs", job_id], None, None)
            .await?
            .into_success()?
            .decode()
    }

    pub async fn list_jobs(&self) -> Result<Vec<JobDetails>, DashboardError> {
        let answer = self
            .call(Method::GET, &["api", "jobs", ""], None, None)
            .await?
            .into_success()?;
        let items: Vec<serde_json::Value> = answer.decode()?;
        // One odd entry (a driver job of another shape) must not hide the others.
        Ok(items
            .into_iter()
            .filter_map(|item| serde_json::from_value(item).ok())
            .collect())
    }

    pub async fn get_job_logs(&self, job_id: &str) -> Result<String, DashboardError> {
        check_job_id(job_id)?;
        self.call(Method::GET, &["api", "jobs", job_id, "logs"], None, None)
            .await?
            .into_success()?
            .decode_field("logs", |response: JobLogsResponse| response.logs)
    }

    pub async fn stop_job(&self, job_id: &str) -> Result<bool, DashboardError> {
        check_job_id(job_id)?;
        self.call(Method::POST, &["api", "jobs", job_id, "stop"], None, None)
            .await?
            .into_success()?
            .decode_field("stopped", |response: JobStopResponse| response.stopped)
    }

    pub async fn delete_job(&self, job_id: &str) -> Result<bool, DashboardError> {
        check_job_id(job_id)?;
        self.call(Method::DELETE, &["api", "jobs", job_id], None, None)
            .await?
            .into_success()?
            .decode_field("deleted", |response: JobDeleteResponse| response.deleted)
    }

    /// Sends one request and reads the whole answer, whatever its status.
    async fn call(
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

/// An empty id would turn `GET /api/jobs/{id}` into the list endpoint.
fn check_job_id(job_id: &str) -> Result<(), DashboardError> {
    if job_id.trim().is_empty() {
        return Err(DashboardError::InvalidRequest {
            problem: "the job id is empty".to_owned(),
        });
    }
    Ok(())
}

/// One reqwest client (one connection pool) per connect timeout and tokio runtime. A pooled
/// connection is driven by a task on the runtime that opened it; shared with another runtime
/// (each test has its own), a call fails with "dispatch task is gone" when the opener ends. A
/// program with one runtime has one pool per timeout.
fn shared_http_client(connect_timeout: Duration) -> Result<reqwest::Client, DashboardError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_never_show_in_debug_output() {
        let token = BearerToken::new(" s3cr3t-token\n").expect("valid");
        assert_eq!(token.expose_secret(), "s3cr3t-token");
        assert!(!format!("{token:?}").contains("s3cr3t"));
        let options = DashboardClientOptions {
            bearer_token: Some(token),
            ..Default::default()
        };
        assert!(!format!("{options:?}").contains("s3cr3t"));
        let base = DashboardUrl::parse("http://127.0.0.1:8265").expect("valid");
        let client = RayDashboardClient::new(base, options).expect("client");
        let shown = format!("{client:?}");
        assert!(
            !shown.contains("s3cr3t") && shown.contains("<redacted>"),
            "{shown}"
        );
    }

    #[test]
    fn tokens_that_cannot_be_a_header_are_refused() {
        assert_eq!(
            BearerToken::new("  ").expect_err("empty"),
            DashboardError::InvalidToken
        );
        assert_eq!(
            BearerToken::new("a\nb").expect_err("newline inside"),
            DashboardError::InvalidToken
        );
        assert_eq!(
            BearerToken::new("tökén").expect_err("non-ASCII"),
            DashboardError::InvalidToken
        );
    }

    /// A one-shot HTTP server on loopback: answers each connection with the next canned
    /// `(status, body)` (or never answers, for `None`), and hands back the raw requests.
    struct FakeDashboard {
        url: String,
        requests: tokio::sync::mpsc::UnboundedReceiver<String>,
    }

    async fn fake_dashboard(answers: Vec<Option<(u16, &'static str)>>) -> FakeDashboard {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (sender, requests) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            for answer in answers {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                // Headers, then as many body bytes as Content-Length announces.
                loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    raw.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&raw).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().to_owned())
                            })
                            .and_then(|v| v.parse::<usize>().ok())
                            .unwrap_or(0);
                        if raw.len() >= end + 4 + length {
                            break;
                        }
                    }
                    if n == 0 {
                        break;
                    }
                }
                let _ = sender.send(String::from_utf8_lossy(&raw).into_owned());
                match answer {
                    Some((status, body)) => {
                        let response = format!(
                            "HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = stream.write_all(response.as_bytes()).await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(30)).await,
                }
            }
        });
        FakeDashboard { url, requests }
    }

    /// A keep-alive HTTP server on its own thread (outliving any test runtime) answering every
    /// request with a version document after `delay`; returns its URL.
    fn keep_alive_dashboard(delay: Duration) -> String {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                    let mut stream = stream;
                    loop {
                        let mut length = 0usize;
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if let Some(v) =
                                line.to_ascii_lowercase().strip_prefix("content-length:")
                            {
                                length = v.trim().parse().unwrap_or(0);
                            }
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let mut body = vec![0u8; length];
                        if reader.read_exact(&mut body).is_err() {
                            return;
                        }
                        std::thread::sleep(delay);
                        let body = r#"{"version": "4", "ray_version": "2.52.0"}"#;
                        let response = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if stream.write_all(response.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        url
    }

    #[test]
    fn a_runtime_never_gets_a_connection_that_lives_on_another() {
        // Each #[tokio::test] (and each embedding program's runtime) has its own runtime, and a
        // pooled connection is driven by a task of the runtime that opened it. Were it handed to
        // another runtime, the call would fail ("dispatch task is gone") when the opener ends.
        let url = keep_alive_dashboard(Duration::from_millis(400));
        let (ready, idle) = std::sync::mpsc::channel();
        let opener_url = url.clone();
        let opener = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let client = client_for(&opener_url, None, Duration::from_secs(5));
                let version = client.get_version().await;
                assert!(version.is_ok(), "{version:?}");
                // The connection is back in the pool, ready; this runtime ends 200 ms later.
                tokio::time::sleep(Duration::from_millis(50)).await;
                ready.send(()).expect("send");
                tokio::time::sleep(Duration::from_millis(200)).await;
            });
        });
        idle.recv().expect("the opener's call is done");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // Answered after 400 ms: the opener's runtime is gone by then.
        let version = runtime.block_on(async {
            client_for(&url, None, Duration::from_secs(5))
                .get_version()
                .await
        });
        opener.join().expect("the opener ran");
        assert!(version.is_ok(), "{version:?}");
    }

    fn client_for(url: &str, token: Option<&str>, request_timeout: Duration) -> RayDashboardClient {
        RayDashboardClient::new(
            DashboardUrl::parse(url).expect("url"),
            DashboardClientOptions {
                request_timeout,
                bearer_token: token.map(|t| BearerToken::new(t).expect("token")),
                ..Default::default()
            },
        )
        .expect("client")
    }

    #[tokio::test]
    async fn sends_the_token_and_no_browser_headers() {
        let mut fake = fake_dashboard(vec![Some((
            200,
            r#"{"version": "4", "ray_version": "2.60.0"}"#,
        ))])
        .await;
        let client = client_for(
            &format!("{}/proxy/path", fake.url),
            Some("tok-123"),
            DEFAULT_REQUEST_TIMEOUT,
        );
        let version = client.get_version().await.expect("version");
        assert_eq!(version.ray_version.as_deref(), Some("2.60.0"));
        let request = fake
            .requests
            .recv()
            .await
            .expect("a request")
            .to_ascii_lowercase();
        assert!(
            request.starts_with("get /proxy/path/api/version http/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains("\r\nx-ray-authorization: bearer tok-123\r\n"),
            "{request}"
        );
        assert!(request.contains("\r\nuser-agent: raypipe/"), "{request}");
        for browser_header in ["origin:", "referer:", "sec-fetch-", "mozilla"] {
            assert!(
                !request.contains(browser_header),
                "{browser_header} in {request}"
            );
        }
    }

    #[tokio::test]
    async fn serve_put_sends_json_and_reports_ray_validation_errors_verbatim() {
        const PYDANTIC: &str = "1 validation error for ServeDeploySchema\napplications.0.import_path\n  Value error, Got invalid import path \"nocolon\".";
        let mut fake = fake_dashboard(vec![Some((400, PYDANTIC))]).await;
        let client = client_for(&fake.url, None, DEFAULT_REQUEST_TIMEOUT);
        let config = serde_json::json!({"applications": [{"import_path": "nocolon"}]});
        let error = client
            .put_serve_applications(&config)
            .await
            .expect_err("400");
        let request = fake.requests.recv().await.expect("a request");
        assert!(
            request.starts_with("PUT /api/serve/applications/ HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request
                .to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{request}"
        );
        assert!(
            request.ends_with(r#"{"applications":[{"import_path":"nocolon"}]}"#),
            "{request}"
        );
        assert!(
            !request.to_ascii_lowercase().contains("x-ray-authorization"),
            "{request}"
        );
        match &error {
            DashboardError::Status {
                endpoint,
                status,
                body,
            } => {
                assert_eq!(
                    endpoint,
                    &format!("PUT {}/api/serve/applications/", fake.url)
                );
                assert_eq!(*status, StatusCode::BAD_REQUEST);
                assert_eq!(body, PYDANTIC);
            }
            other => panic!("unexpected {other:?}"),
        }
        let message = error.to_string();
        assert!(
            message.contains("HTTP 400 Bad Request") && message.contains("invalid import path"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn a_taken_submission_id_and_an_unknown_job_are_recognised() {
        let traceback = "Traceback (most recent call last):\n  ...\nValueError: Job with submission_id rp-1 already exists. Please use a different submission_id.";
        let mut fake = fake_dashboard(vec![
            Some((500, traceback)),
            Some((404, "Job rp-2 does not exist")),
        ])
        .await;
        let client = client_for(&fake.url, None, DEFAULT_REQUEST_TIMEOUT);
        let taken = client
            .submit_job(&JobSubmitRequest::new("python -c 'print(1)'").with_submission_id("rp-1"))
            .await
            .expect_err("taken");
        assert!(
            matches!(&taken, DashboardError::JobAlreadyExists { submission_id, .. } if submission_id == "rp-1"),
            "{taken:?}"
        );
        let missing = client.get_job("rp-2").await.expect_err("unknown job");
        assert!(missing.is_not_found(), "{missing:?}");
        assert!(
            missing.to_string().contains("Job rp-2 does not exist"),
            "{missing}"
        );
        assert!(
            fake.requests
                .recv()
                .await
                .expect("submit")
                .starts_with("POST /api/jobs/ HTTP/1.1")
        );
        assert!(
            fake.requests
                .recv()
                .await
                .expect("get")
                .starts_with("GET /api/jobs/rp-2 HTTP/1.1")
        );
    }

    #[tokio::test]
    async fn a_silent_dashboard_times_out_quickly() {
        let fake = fake_dashboard(vec![None]).await;
        let client = client_for(&fake.url, None, Duration::from_millis(300));
        let started = Instant::now();
        let error = client.get_serve_applications().await.expect_err("timeout");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(error, DashboardError::Timeout { .. }), "{error:?}");
        assert!(error.is_unreachable());
        assert!(
            error
                .to_string()
                .contains("/api/serve/applications/?api_type=declarative"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let client = client_for(
            &format!("http://127.0.0.1:{port}"),
            None,
            DEFAULT_REQUEST_TIMEOUT,
        );
        let error = client.list_jobs().await.expect_err("nothing listens");
        assert!(
            matches!(error, DashboardError::Unreachable { .. }),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .contains(&format!("GET http://127.0.0.1:{port}/api/jobs/")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn answers_that_are_not_the_expected_json_are_decode_errors() {
        let fake = fake_dashboard(vec![
            Some((200, "<html>proxy login</html>")),
            Some((200, r#"{"stopped_": true}"#)),
        ])
        .await;
        let client = client_for(&fake.url, None, DEFAULT_REQUEST_TIMEOUT);
        let error = client.get_serve_applications().await.expect_err("html");
        assert!(
            matches!(&error, DashboardError::Decode { body, .. } if body.contains("proxy login")),
            "{error:?}"
        );
        let error = client.stop_job("x").await.expect_err("no `stopped`");
        assert!(error.to_string().contains("no `stopped` field"), "{error}");
        let empty_id = client.get_job_logs(" ").await.expect_err("empty id");
        assert!(
            matches!(empty_id, DashboardError::InvalidRequest { .. }),
            "{empty_id:?}"
        );
    }
}
