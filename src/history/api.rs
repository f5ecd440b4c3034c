//! The history HTTP API (`raypipe history serve`): read-only JSON over what the bucket holds,
//! pipeline revisions ([`super::revisions`]) and Ray cluster sessions ([`super::read`]), for
//! people and tools that have no credentials for the bucket itself.
//!
//! Kubernetes decides who may read what: every request carries a bearer token, which the API
//! server reviews (TokenReview); the reviewed user then needs `get` on `servepipelines`
//! (`raypipe.dev`) in a namespace to read its pipelines' history, and `get` on `rayclusters`
//! (`ray.io`) to read its clusters' sessions (SubjectAccessReview). Both answers are cached for
//! a few seconds under a SHA-256 of the token (never the token), so a page of calls costs one
//! review. The token is never logged, echoed or stored.
//!
//! The request handling is split into pure parts (the route and the permission it needs,
//! bearer parsing, path decoding, the cache), unit-tested below, and the calls that do I/O.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

pub use crate::k8s::review::{
    Caller, Permission, REVIEW_TTL, TokenKey, TtlCache, access_review, bearer_token, caller_of,
    token_key,
};
use crate::k8s::review::{ReviewError, Reviewer};

use super::layout::is_safe_part;
use super::read::{Reader, SessionEntry};
use super::revisions::{
    PipelineIndex, RevisionStore, RevisionSummary, ServedSpan, serving_at, valid_id,
};
use super::sink::Sink;
use crate::tls::{CertificateFiles, CertificateResolver, TlsError, TlsListener, server_config};

/// Namespaces reviewed at once when listing pipelines.
const PARALLEL_REVIEWS: usize = 8;
/// Longest log path accepted (a listing's names are far shorter).
const MAX_LOG_PATH: usize = 1024;
/// How often the certificate files are re-read: a kubelet takes about as long to project a
/// renewed Secret, and an unchanged file costs two small reads.
pub const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("listening for the history API on {address}: {source}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving the history API: {0}")]
    Serve(#[source] std::io::Error),
    #[error("the history API's TLS certificate: {0}")]
    Tls(#[from] TlsError),
    /// No usable bearer token, or Kubernetes did not accept it. The text never holds the token.
    #[error("{0}")]
    Unauthenticated(&'static str),
    #[error("{user} may not {verb} {resource} in namespace {namespace}")]
    Forbidden {
        user: String,
        verb: &'static str,
        resource: String,
        namespace: String,
    },
    /// Kubernetes could not be asked (down, timed out, or the server's own account lacks the
    /// right to create reviews); the details are logged, not answered.
    #[error("Kubernetes could not review the request; try again later")]
    ReviewUnavailable,
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("only GET is served")]
    MethodNotAllowed,
    /// The bucket failed (object_store's messages name keys and settings, never secrets).
    #[error("the history store: {0}")]
    Store(String),
    #[error("encoding the answer: {0}")]
    Encode(String),
}

impl From<ReviewError> for ApiError {
    fn from(error: ReviewError) -> ApiError {
        match error {
            ReviewError::Unauthenticated(why) => ApiError::Unauthenticated(why),
            ReviewError::Unavailable => ApiError::ReviewUnavailable,
        }
    }
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::ReviewUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Store(_) => StatusCode::BAD_GATEWAY,
            ApiError::Bind { .. } | ApiError::Serve(_) | ApiError::Tls(_) | ApiError::Encode(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = json_body(
            self.status(),
            serde_json::json!({"error": self.to_string()}).to_string(),
        );
        let headers = response.headers_mut();
        match self {
            ApiError::Unauthenticated(_) => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::MethodNotAllowed => {
                headers.insert(header::ALLOW, HeaderValue::from_static("GET"));
            }
            _ => {}
        }
        response
    }
}

fn json_body(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn json_answer<T: Serialize>(value: &T) -> Result<Response, ApiError> {
    let body = serde_json::to_string(value).map_err(|e| ApiError::Encode(e.to_string()))?;
    Ok(json_body(StatusCode::OK, body))
}

/// Everything the API server runs with.
pub struct ApiConfig {
    pub listen: SocketAddr,
    pub sink: Sink,
    /// Audiences the tokens must be meant for (TokenReview `audiences`); empty: the API
    /// server's own.
    pub audiences: Vec<String>,
    /// Serve HTTPS only, with this certificate; `None`: plain HTTP (tokens cross in the clear).
    pub tls: Option<ApiTls>,
}

/// The API's serving certificate: files re-read every `reload_every` and swapped when they
/// change, so a renewed Secret is served without a restart.
#[derive(Clone, Debug)]
pub struct ApiTls {
    pub files: CertificateFiles,
    pub reload_every: Duration,
}

impl ApiTls {
    /// `cert` and `key`, re-read every [`TLS_RELOAD_INTERVAL`].
    pub fn new(cert: PathBuf, key: PathBuf) -> ApiTls {
        ApiTls {
            files: CertificateFiles { cert, key },
            reload_every: TLS_RELOAD_INTERVAL,
        }
    }
}

/// One endpoint, with its path parameters decoded and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Every pipeline with a history that the caller may read (checked per namespace).
    Pipelines,
    Pipeline {
        namespace: String,
        name: String,
    },
    Revision {
        namespace: String,
        name: String,
        id: String,
    },
    Serving {
        namespace: String,
        name: String,
    },
    Clusters {
        namespace: String,
    },
    Events {
        namespace: String,
        cluster: String,
        session: String,
    },
    LogFiles {
        namespace: String,
        cluster: String,
        session: String,
    },
    Log {
        namespace: String,
        cluster: String,
        session: String,
        file: String,
    },
}

impl Route {
    /// The one permission the route needs; `None` for the pipeline list, which is filtered by
    /// a review per namespace instead.
    pub fn permission(&self) -> Option<Permission> {
        match self {
            Route::Pipelines => None,
            Route::Pipeline { namespace, .. }
            | Route::Revision { namespace, .. }
            | Route::Serving { namespace, .. } => Some(Permission::pipelines(namespace)),
            Route::Clusters { namespace }
            | Route::Events { namespace, .. }
            | Route::LogFiles { namespace, .. }
            | Route::Log { namespace, .. } => Some(Permission::clusters(namespace)),
        }
    }
}

/// `%XX` escapes decoded (a `+` stays a `+`, so an RFC 3339 offset survives); `None` for a bad
/// escape or text that is not UTF-8.
pub fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = tail.get(..2)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            rest = tail.get(2..)?;
        } else {
            out.push(first);
            rest = tail;
        }
    }
    String::from_utf8(out).ok()
}

/// A decoded name segment (namespace, pipeline, cluster, session) that can only name one key
/// part: no `/`, no `..`.
fn name(raw: &str, what: &str) -> Result<String, ApiError> {
    percent_decode(raw)
        .filter(|decoded| is_safe_part(decoded))
        .ok_or_else(|| ApiError::BadRequest(format!("that is not a valid {what} name")))
}

/// A log file as the listing names it (`<node>/<path>`), decoded; any `.`, `..` or empty part
/// is refused, so a path can never climb out of the session's logs.
pub fn log_path(raw: &[&str]) -> Result<String, ApiError> {
    let refused = || {
        ApiError::BadRequest(
            "a log path is <node>/<path> without `.`, `..` or empty parts".to_owned(),
        )
    };
    let decoded = percent_decode(&raw.join("/")).ok_or_else(refused)?;
    let fine = decoded.len() <= MAX_LOG_PATH
        && decoded.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && !part.chars().any(|c| c == '\\' || c.is_control())
        });
    if fine { Ok(decoded) } else { Err(refused()) }
}

/// The endpoint `path` names (the URI's raw path, still percent-encoded).
pub fn route(path: &str) -> Result<Route, ApiError> {
    let no_such = || ApiError::NotFound("no such endpoint".to_owned());
    let rest = path.strip_prefix("/api/v1/").ok_or_else(no_such)?;
    let parts: Vec<&str> = rest.split('/').collect();
    let route = match parts.as_slice() {
        ["pipelines"] => Route::Pipelines,
        ["namespaces", ns, "pipelines", pipeline] => Route::Pipeline {
            namespace: name(ns, "namespace")?,
            name: name(pipeline, "pipeline")?,
        },
        ["namespaces", ns, "pipelines", pipeline, "revisions", id] => {
            let id = percent_decode(id)
                .filter(|id| valid_id(id))
                .ok_or_else(|| {
                    ApiError::BadRequest("a revision id is <seq>-<digest prefix>".to_owned())
                })?;
            Route::Revision {
                namespace: name(ns, "namespace")?,
                name: name(pipeline, "pipeline")?,
                id,
            }
        }
        ["namespaces", ns, "pipelines", pipeline, "serving"] => Route::Serving {
            namespace: name(ns, "namespace")?,
            name: name(pipeline, "pipeline")?,
        },
        ["namespaces", ns, "clusters"] => Route::Clusters {
            namespace: name(ns, "namespace")?,
        },
        [
            "namespaces",
            ns,
            "clusters",
            cluster,
            "sessions",
            session,
            tail @ ..,
        ] => {
            let (namespace, cluster, session) = (
                name(ns, "namespace")?,
                name(cluster, "cluster")?,
                name(session, "session")?,
            );
            match tail {
                ["events"] => Route::Events {
                    namespace,
                    cluster,
                    session,
                },
                ["logs"] => Route::LogFiles {
                    namespace,
                    cluster,
                    session,
                },
                ["logs", file @ ..] => Route::Log {
                    namespace,
                    cluster,
                    session,
                    file: log_path(file)?,
                },
                _ => return Err(no_such()),
            }
        }
        _ => return Err(no_such()),
    };
    Ok(route)
}

/// The value of `key` in a raw query string, decoded.
pub fn query_value(query: Option<&str>, key: &str) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then(|| percent_decode(v)).flatten()
    })
}

/// One pipeline the list names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PipelineRef {
    pub namespace: String,
    pub name: String,
}

/// What served a pipeline at one time (`/serving`, `raypipe history serving`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServingAnswer {
    pub namespace: String,
    pub name: String,
    pub at: String,
    /// Newest revision first; empty when nothing served then.
    pub serving: Vec<ServingRevision>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServingRevision {
    pub role: String,
    pub span: ServedSpan,
    pub revision: RevisionSummary,
}

/// [`serving_at`] as an answer.
pub fn serving_answer(index: &PipelineIndex, at: &jiff::Timestamp) -> ServingAnswer {
    ServingAnswer {
        namespace: index.namespace.clone(),
        name: index.name.clone(),
        at: at.to_string(),
        serving: serving_at(index, at)
            .into_iter()
            .map(|(revision, span)| ServingRevision {
                role: span.role.clone(),
                span: span.clone(),
                revision: revision.clone(),
            })
            .collect(),
    }
}

/// `at` as RFC 3339; now when left out.
pub fn parse_at(at: Option<&str>) -> Result<jiff::Timestamp, ApiError> {
    match at {
        None => Ok(jiff::Timestamp::now()),
        Some(text) => text.trim().parse().map_err(|_| {
            ApiError::BadRequest(
                "`at` must be an RFC 3339 time, such as 2026-12-01T14:02:00Z".to_owned(),
            )
        }),
    }
}

struct Shared {
    reviewer: Reviewer,
    revisions: RevisionStore,
    reader: Reader,
}

impl Shared {
    async fn authorize(
        &self,
        caller: &Caller,
        key: TokenKey,
        permission: &Permission,
    ) -> Result<(), ApiError> {
        if self.reviewer.allowed(caller, key, permission).await? {
            Ok(())
        } else {
            Err(ApiError::Forbidden {
                user: caller.username.clone(),
                verb: permission.verb,
                resource: format!("{}.{}", permission.resource, permission.group),
                namespace: permission.namespace.clone(),
            })
        }
    }

    /// The session `namespace/cluster/session` the bucket lists.
    async fn session(
        &self,
        namespace: &str,
        cluster: &str,
        session: &str,
    ) -> Result<SessionEntry, ApiError> {
        self.reader
            .sessions()
            .await
            .map_err(|e| ApiError::Store(e.to_string()))?
            .into_iter()
            .find(|s| s.namespace == namespace && s.cluster == cluster && s.session == session)
            .ok_or_else(|| {
                ApiError::NotFound(format!(
                    "no session {session} of cluster {namespace}/{cluster} in the history"
                ))
            })
    }

    async fn index(&self, namespace: &str, name: &str) -> Result<PipelineIndex, ApiError> {
        self.revisions
            .index(namespace, name)
            .await
            .map_err(|e| ApiError::Store(e.to_string()))?
            .ok_or_else(|| ApiError::NotFound(format!("no history of pipeline {namespace}/{name}")))
    }
}

/// Binds `config.listen` and serves the API there (see [`serve_on`]).
pub async fn serve(
    client: kube::Client,
    config: ApiConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ApiError::Bind {
            address: config.listen,
            source,
        })?;
    serve_on(listener, client, config, shutdown).await
}

/// Serves the API on `listener` (its address wins over `config.listen`) until `shutdown`
/// resolves; requests in flight then finish. With `config.tls`, only HTTPS: a connection that
/// fails its handshake (plain HTTP, say) is dropped.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    client: kube::Client,
    config: ApiConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    let address = listener.local_addr().map_err(ApiError::Serve)?;
    let shared = Arc::new(Shared {
        reviewer: Reviewer::new(client, config.audiences),
        revisions: RevisionStore::new(config.sink.clone()),
        reader: Reader::new(config.sink),
    });
    let app = Router::new()
        .route("/healthz", axum::routing::get(health))
        .fallback(answer)
        .with_state(shared);
    let Some(tls) = config.tls else {
        tracing::info!(%address, "history API listening (plain HTTP)");
        return axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(ApiError::Serve);
    };
    // Read up front, so a missing or broken certificate fails start-up rather than handshakes.
    let resolver = CertificateResolver::new(&tls.files.read()?)?;
    let listener =
        TlsListener::new(listener, server_config(resolver.clone())?).map_err(ApiError::Serve)?;
    tracing::info!(%address, cert = %tls.files.cert.display(), "history API listening (HTTPS)");
    let server = std::future::IntoFuture::into_future(
        axum::serve(listener, app).with_graceful_shutdown(shutdown),
    );
    // The watch never ends; polled here, it stops with the server (or when this is dropped).
    tokio::select! {
        served = server => served.map_err(ApiError::Serve),
        () = tls.files.watch(resolver, tls.reload_every) => Ok(()),
    }
}

async fn health() -> &'static str {
    "ok"
}

async fn answer(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    match handle(&shared, &method, &uri, &headers).await {
        Ok(response) => response,
        Err(error) => {
            // The server's own failures are worth an operator's eye; a caller's are not.
            if error.status().is_server_error() {
                tracing::warn!(path = uri.path(), status = %error.status(), error = %error, "history API request failed");
            } else {
                tracing::debug!(path = uri.path(), status = %error.status(), error = %error, "history API request refused");
            }
            error.into_response()
        }
    }
}

/// Authenticate, route, authorise, answer: in that order, so a caller without a valid token
/// learns nothing, not even which paths exist.
async fn handle(
    shared: &Shared,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    if method != Method::GET {
        return Err(ApiError::MethodNotAllowed);
    }
    let token = bearer_token(headers)?;
    let key = token_key(token);
    let caller = shared.reviewer.authenticate(token, key).await?;
    let route = route(uri.path())?;
    if let Some(permission) = route.permission() {
        shared.authorize(&caller, key, &permission).await?;
    }
    tracing::debug!(user = %caller.username, path = uri.path(), "history API request");
    let store_failed = |e: &dyn std::fmt::Display| ApiError::Store(e.to_string());
    match route {
        Route::Pipelines => {
            let pipelines = shared
                .revisions
                .pipelines()
                .await
                .map_err(|e| store_failed(&e))?;
            let namespaces: BTreeSet<&str> = pipelines.iter().map(|(ns, _)| ns.as_str()).collect();
            let permissions: Vec<Permission> =
                namespaces.into_iter().map(Permission::pipelines).collect();
            let mut readable = BTreeSet::new();
            // A few reviews at a time: a bucket of many namespaces must not flood the API server.
            for batch in permissions.chunks(PARALLEL_REVIEWS) {
                let answers = futures::future::join_all(
                    batch
                        .iter()
                        .map(|p| shared.reviewer.allowed(&caller, key, p)),
                )
                .await;
                for (permission, allowed) in batch.iter().zip(answers) {
                    if allowed? {
                        readable.insert(permission.namespace.clone());
                    }
                }
            }
            let visible: Vec<PipelineRef> = pipelines
                .into_iter()
                .filter(|(ns, _)| readable.contains(ns))
                .map(|(namespace, name)| PipelineRef { namespace, name })
                .collect();
            json_answer(&serde_json::json!({ "pipelines": visible }))
        }
        Route::Pipeline { namespace, name } => json_answer(&shared.index(&namespace, &name).await?),
        Route::Revision {
            namespace,
            name,
            id,
        } => {
            let record = shared
                .revisions
                .revision(&namespace, &name, &id)
                .await
                .map_err(|e| store_failed(&e))?
                .ok_or_else(|| {
                    ApiError::NotFound(format!(
                        "no revision {id} of pipeline {namespace}/{name} in the history"
                    ))
                })?;
            json_answer(&record)
        }
        Route::Serving { namespace, name } => {
            let at = parse_at(query_value(uri.query(), "at").as_deref())?;
            let index = shared.index(&namespace, &name).await?;
            json_answer(&serving_answer(&index, &at))
        }
        Route::Clusters { namespace } => {
            let sessions: Vec<SessionEntry> = shared
                .reader
                .sessions()
                .await
                .map_err(|e| store_failed(&e))?
                .into_iter()
                .filter(|s| s.namespace == namespace)
                .collect();
            json_answer(&serde_json::json!({ "sessions": sessions }))
        }
        Route::Events {
            namespace,
            cluster,
            session,
        } => {
            let entry = shared.session(&namespace, &cluster, &session).await?;
            let events = shared
                .reader
                .timeline(&entry)
                .await
                .map_err(|e| store_failed(&e))?;
            json_answer(&serde_json::json!({ "events": events }))
        }
        Route::LogFiles {
            namespace,
            cluster,
            session,
        } => {
            let entry = shared.session(&namespace, &cluster, &session).await?;
            let files = shared
                .reader
                .log_files(&entry)
                .await
                .map_err(|e| store_failed(&e))?;
            json_answer(&serde_json::json!({ "files": files }))
        }
        Route::Log {
            namespace,
            cluster,
            session,
            file,
        } => {
            let entry = shared.session(&namespace, &cluster, &session).await?;
            // Only a file the listing names is read: nothing else of the bucket is reachable.
            let files = shared
                .reader
                .log_files(&entry)
                .await
                .map_err(|e| store_failed(&e))?;
            if !files.contains(&file) {
                return Err(ApiError::NotFound(format!(
                    "no log file {file} in session {session}"
                )));
            }
            let text = shared
                .reader
                .log(&entry, &file)
                .await
                .map_err(|e| store_failed(&e))?;
            Ok((
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                text,
            )
                .into_response())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_needs_get_on_its_kind_in_its_namespace() {
        let pipeline = |path: &str| route(path).map(|r| r.permission());
        assert_eq!(route("/api/v1/pipelines").ok(), Some(Route::Pipelines));
        assert_eq!(pipeline("/api/v1/pipelines").ok(), Some(None));
        for path in [
            "/api/v1/namespaces/ml/pipelines/demo",
            "/api/v1/namespaces/ml/pipelines/demo/revisions/000001-abcdef012345",
            "/api/v1/namespaces/ml/pipelines/demo/serving",
        ] {
            assert_eq!(
                pipeline(path).ok(),
                Some(Some(Permission::pipelines("ml"))),
                "{path}"
            );
        }
        for path in [
            "/api/v1/namespaces/ml/clusters",
            "/api/v1/namespaces/ml/clusters/c1/sessions/session_1/events",
            "/api/v1/namespaces/ml/clusters/c1/sessions/session_1/logs",
            "/api/v1/namespaces/ml/clusters/c1/sessions/session_1/logs/node/raylet.out",
        ] {
            assert_eq!(
                pipeline(path).ok(),
                Some(Some(Permission::clusters("ml"))),
                "{path}"
            );
        }
        let clusters = Permission::clusters("ml");
        assert_eq!(
            (clusters.verb, clusters.group, clusters.resource),
            ("get", "ray.io", "rayclusters")
        );
        let pipelines = Permission::pipelines("ml");
        assert_eq!(
            (pipelines.verb, pipelines.group, pipelines.resource),
            ("get", "raypipe.dev", "servepipelines")
        );
    }

    #[test]
    fn routes_decode_their_parameters() {
        assert_eq!(
            route(
                "/api/v1/namespaces/ml/clusters/c1/sessions/session_2026/logs/abc/worker%2D1.log"
            )
            .ok(),
            Some(Route::Log {
                namespace: "ml".into(),
                cluster: "c1".into(),
                session: "session_2026".into(),
                file: "abc/worker-1.log".into(),
            })
        );
        assert_eq!(
            route("/api/v1/namespaces/ml/pipelines/demo/revisions/000007-0123456789ab").ok(),
            Some(Route::Revision {
                namespace: "ml".into(),
                name: "demo".into(),
                id: "000007-0123456789ab".into(),
            })
        );
    }

    #[test]
    fn paths_that_climb_or_name_nothing_are_refused() {
        let status = |path: &str| route(path).err().map(|e| e.status());
        for path in [
            "/api/v1/namespaces/ml/clusters/c1/sessions/s/logs/../../x",
            "/api/v1/namespaces/ml/clusters/c1/sessions/s/logs/node/%2E%2E/x",
            "/api/v1/namespaces/ml/clusters/c1/sessions/s/logs/node/..%2F..%2Fsecret",
            "/api/v1/namespaces/ml/clusters/c1/sessions/s/logs/node//x",
            "/api/v1/namespaces/ml/clusters/c1/sessions/s/logs/node/./x",
            "/api/v1/namespaces/ml/clusters/c1/sessions/s/logs/node/a%5Cb",
            "/api/v1/namespaces/ml/clusters/c1/sessions/s/logs/node/%zz",
            "/api/v1/namespaces/%2E%2E/pipelines/demo",
            "/api/v1/namespaces/ml/pipelines/a%2Fb",
            "/api/v1/namespaces/ml/pipelines/demo/revisions/..",
            "/api/v1/namespaces/ml/pipelines/demo/revisions/1-a%2F..",
        ] {
            assert_eq!(status(path), Some(StatusCode::BAD_REQUEST), "{path}");
        }
        for path in [
            "/",
            "/api/v1",
            "/api/v1/",
            "/api/v2/pipelines",
            "/api/v1/pipelines/extra",
            "/api/v1/namespaces/ml",
            "/api/v1/namespaces/ml/pipelines/demo/revisions",
            "/api/v1/namespaces/ml/clusters/c1",
            "/api/v1/namespaces/ml/clusters/c1/sessions/s/other",
        ] {
            assert_eq!(status(path), Some(StatusCode::NOT_FOUND), "{path}");
        }
    }

    #[test]
    fn percent_escapes_decode_and_bad_ones_fail() {
        assert_eq!(percent_decode("a%20b%2Fc").as_deref(), Some("a b/c"));
        assert_eq!(
            percent_decode("2026-12-01T14:02:00+02:00").as_deref(),
            Some("2026-12-01T14:02:00+02:00")
        );
        for bad in ["%", "%2", "%+1", "%zz", "%ff"] {
            assert_eq!(percent_decode(bad), None, "{bad}");
        }
        assert_eq!(
            query_value(Some("x=1&at=2026-12-01T14%3A02%3A00Z"), "at").as_deref(),
            Some("2026-12-01T14:02:00Z")
        );
        assert_eq!(query_value(Some("x=1"), "at"), None);
        assert_eq!(query_value(None, "at"), None);
    }

    #[test]
    fn forbidden_names_the_permission() {
        let error = ApiError::Forbidden {
            user: "alice".into(),
            verb: "get",
            resource: "servepipelines.raypipe.dev".into(),
            namespace: "ml".into(),
        };
        assert_eq!(error.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            error.to_string(),
            "alice may not get servepipelines.raypipe.dev in namespace ml"
        );
    }

    #[test]
    fn serving_answers_pair_each_revision_with_its_span() {
        let span = ServedSpan {
            role: "stable".into(),
            from: "2026-12-01T10:00:00Z".into(),
            until: None,
        };
        let index = PipelineIndex {
            namespace: "ml".into(),
            name: "demo".into(),
            revisions: vec![RevisionSummary {
                id: "000001-ab".into(),
                seq: 1,
                served: vec![span.clone()],
                ..RevisionSummary::default()
            }],
            ..PipelineIndex::default()
        };
        let at = parse_at(Some("2026-12-01T12:00:00+02:00")).ok();
        let Some(at) = at else {
            panic!("an RFC 3339 time parses")
        };
        let answer = serving_answer(&index, &at);
        assert_eq!(answer.at, "2026-12-01T10:00:00Z");
        assert_eq!(answer.serving.len(), 1);
        assert_eq!(answer.serving[0].span, span);
        assert_eq!(answer.serving[0].revision.id, "000001-ab");
        let before = parse_at(Some("2026-12-01T09:00:00Z")).ok();
        assert!(before.is_some_and(|t| serving_answer(&index, &t).serving.is_empty()));
        assert_eq!(
            parse_at(Some("yesterday")).err().map(|e| e.status()),
            Some(StatusCode::BAD_REQUEST)
        );
    }
}
