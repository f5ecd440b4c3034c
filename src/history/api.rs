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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::hash::Hash;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::layout::is_safe_part;
use super::read::{Reader, SessionEntry};
use super::revisions::{
    PipelineIndex, RevisionStore, RevisionSummary, ServedSpan, serving_at, valid_id,
};
use super::sink::Sink;
use crate::tls::{CertificateFiles, CertificateResolver, TlsError, TlsListener, server_config};

/// How long a review's answer is reused: short, so a revoked token or a removed RoleBinding
/// stops working within seconds, yet long enough that a page of calls costs one review.
pub const REVIEW_TTL: Duration = Duration::from_secs(10);
/// Cached answers kept at most (per cache): a flood of distinct tokens cannot grow memory.
const CACHE_CAPACITY: usize = 10_000;
/// How long one TokenReview or SubjectAccessReview may take before the request fails.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
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

/// A permission one request needs: `verb` on `group`/`resource` in `namespace`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Permission {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    pub namespace: String,
}

impl Permission {
    /// Reading a namespace's pipeline history.
    pub fn pipelines(namespace: &str) -> Permission {
        Permission {
            verb: "get",
            group: "raypipe.dev",
            resource: "servepipelines",
            namespace: namespace.to_owned(),
        }
    }

    /// Reading a namespace's Ray cluster sessions.
    pub fn clusters(namespace: &str) -> Permission {
        Permission {
            verb: "get",
            group: "ray.io",
            resource: "rayclusters",
            namespace: namespace.to_owned(),
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

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or(ApiError::Unauthenticated(
            "send a Kubernetes bearer token: Authorization: Bearer <token>",
        ))?;
    let text = value
        .to_str()
        .map_err(|_| ApiError::Unauthenticated("the Authorization header is not a bearer token"))?;
    let (scheme, token) = text
        .trim()
        .split_once(' ')
        .ok_or(ApiError::Unauthenticated(
            "the Authorization header is not a bearer token",
        ))?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(ApiError::Unauthenticated(
            "the Authorization header is not a bearer token",
        ));
    }
    Ok(token)
}

/// What the cache keys a token by: its SHA-256, so no token is kept in memory past its request.
pub type TokenKey = [u8; 32];

pub fn token_key(token: &str) -> TokenKey {
    Sha256::digest(token.as_bytes()).into()
}

/// Answers kept for `ttl`, at most `capacity` of them. Time is passed in, so it is tested
/// without waiting.
pub struct TtlCache<K, V> {
    ttl: Duration,
    capacity: usize,
    entries: HashMap<K, (Instant, V)>,
}

impl<K: Hash + Eq, V: Clone> TtlCache<K, V> {
    pub fn new(ttl: Duration, capacity: usize) -> TtlCache<K, V> {
        TtlCache {
            ttl,
            capacity: capacity.max(1),
            entries: HashMap::new(),
        }
    }

    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(at, _)| now.saturating_duration_since(*at) < self.ttl)
            .map(|(_, value)| value.clone())
    }

    pub fn insert(&mut self, key: K, value: V, now: Instant) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            let ttl = self.ttl;
            self.entries
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            // Still full of fresh answers (a flood of distinct tokens): start over rather than
            // grow; the cost is a few repeated reviews.
            if self.entries.len() >= self.capacity {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (now, value));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Who a token belongs to, as the TokenReview said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub username: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a TokenReview's status means: the caller, or why not.
pub fn caller_of(review: &TokenReview) -> Option<Caller> {
    let status = review.status.as_ref()?;
    if status.authenticated != Some(true) {
        return None;
    }
    let user = status.user.as_ref()?;
    let username = user.username.clone().filter(|u| !u.is_empty())?;
    Some(Caller {
        username,
        uid: user.uid.clone(),
        groups: user.groups.clone().unwrap_or_default(),
        extra: user.extra.clone().unwrap_or_default(),
    })
}

/// The SubjectAccessReview that asks whether `caller` has `permission`.
pub fn access_review(caller: &Caller, permission: &Permission) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(caller.username.clone()),
            uid: caller.uid.clone(),
            groups: Some(caller.groups.clone()),
            extra: Some(caller.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(permission.verb.to_owned()),
                group: Some(permission.group.to_owned()),
                resource: Some(permission.resource.to_owned()),
                namespace: Some(permission.namespace.clone()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
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
    client: kube::Client,
    audiences: Vec<String>,
    revisions: RevisionStore,
    reader: Reader,
    /// Token → the caller (`None`: Kubernetes refused the token).
    identities: Mutex<TtlCache<TokenKey, Option<Caller>>>,
    /// (token, permission) → allowed.
    decisions: Mutex<TtlCache<(TokenKey, Permission), bool>>,
}

/// A cache lock that a panicking holder poisoned is still a valid cache.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    async fn authenticate(&self, token: &str, key: TokenKey) -> Result<Caller, ApiError> {
        let cached = lock(&self.identities).get(&key, Instant::now());
        let caller = match cached {
            Some(caller) => caller,
            None => {
                let review = TokenReview {
                    spec: TokenReviewSpec {
                        token: token.to_owned(),
                        audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
                    },
                    ..TokenReview::default()
                };
                let api: Api<TokenReview> = Api::all(self.client.clone());
                let answer = tokio::time::timeout(
                    REVIEW_TIMEOUT,
                    api.create(&PostParams::default(), &review),
                )
                .await;
                let reviewed = match answer {
                    Ok(Ok(reviewed)) => reviewed,
                    Ok(Err(e)) => {
                        // kube's error holds the API server's status message, not the request.
                        tracing::warn!(error = %e, "TokenReview failed");
                        return Err(ApiError::ReviewUnavailable);
                    }
                    Err(_) => {
                        tracing::warn!("TokenReview timed out");
                        return Err(ApiError::ReviewUnavailable);
                    }
                };
                let caller = caller_of(&reviewed);
                lock(&self.identities).insert(key, caller.clone(), Instant::now());
                caller
            }
        };
        caller.ok_or(ApiError::Unauthenticated(
            "Kubernetes did not accept the bearer token",
        ))
    }

    async fn allowed(
        &self,
        caller: &Caller,
        key: TokenKey,
        permission: &Permission,
    ) -> Result<bool, ApiError> {
        let cache_key = (key, permission.clone());
        if let Some(allowed) = lock(&self.decisions).get(&cache_key, Instant::now()) {
            return Ok(allowed);
        }
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = tokio::time::timeout(
            REVIEW_TIMEOUT,
            api.create(&PostParams::default(), &access_review(caller, permission)),
        )
        .await;
        let allowed = match answer {
            Ok(Ok(reviewed)) => reviewed.status.is_some_and(|s| s.allowed),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "SubjectAccessReview failed");
                return Err(ApiError::ReviewUnavailable);
            }
            Err(_) => {
                tracing::warn!("SubjectAccessReview timed out");
                return Err(ApiError::ReviewUnavailable);
            }
        };
        lock(&self.decisions).insert(cache_key, allowed, Instant::now());
        Ok(allowed)
    }

    async fn authorize(
        &self,
        caller: &Caller,
        key: TokenKey,
        permission: &Permission,
    ) -> Result<(), ApiError> {
        if self.allowed(caller, key, permission).await? {
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
        client,
        audiences: config.audiences,
        revisions: RevisionStore::new(config.sink.clone()),
        reader: Reader::new(config.sink),
        identities: Mutex::new(TtlCache::new(REVIEW_TTL, CACHE_CAPACITY)),
        decisions: Mutex::new(TtlCache::new(REVIEW_TTL, CACHE_CAPACITY)),
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
    let caller = shared.authenticate(token, key).await?;
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
                    batch.iter().map(|p| shared.allowed(&caller, key, p)),
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
    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};

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
    fn only_bearer_tokens_are_taken_and_errors_never_hold_them() {
        let headers = |value: &str| {
            let mut headers = HeaderMap::new();
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(header::AUTHORIZATION, value);
            }
            headers
        };
        assert_eq!(bearer_token(&headers("Bearer s3cr3t")).ok(), Some("s3cr3t"));
        assert_eq!(
            bearer_token(&headers("bearer  s3cr3t ")).ok(),
            Some("s3cr3t")
        );
        for bad in ["", "Basic s3cr3t", "Bearer", "Bearer   ", "s3cr3t"] {
            let error = bearer_token(&headers(bad)).err();
            let error = error.unwrap_or_else(|| panic!("{bad:?} was taken"));
            assert_eq!(error.status(), StatusCode::UNAUTHORIZED);
            assert!(!error.to_string().contains("s3cr3t"), "{error}");
        }
        let response = ApiError::Unauthenticated("no").into_response();
        assert_eq!(
            response.headers().get(header::WWW_AUTHENTICATE),
            Some(&HeaderValue::from_static("Bearer"))
        );
    }

    #[test]
    fn token_keys_are_digests_not_tokens() {
        let key = token_key("s3cr3t");
        assert_eq!(key, token_key("s3cr3t"));
        assert_ne!(key, token_key("s3cr3u"));
        assert!(!hex::encode(key).contains(&hex::encode("s3cr3t")));
    }

    #[test]
    fn cached_answers_expire_and_the_cache_stays_bounded() {
        let start = Instant::now();
        let mut cache: TtlCache<u32, bool> = TtlCache::new(Duration::from_secs(10), 3);
        cache.insert(1, true, start);
        assert_eq!(cache.get(&1, start + Duration::from_secs(9)), Some(true));
        assert_eq!(cache.get(&1, start + Duration::from_secs(10)), None);
        assert_eq!(cache.get(&2, start), None);
        cache.insert(2, false, start);
        cache.insert(3, true, start + Duration::from_secs(5));
        // Full: the expired answers (1 and 2) make room for a fourth.
        cache.insert(4, true, start + Duration::from_secs(12));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&3, start + Duration::from_secs(12)), Some(true));
        // Full of fresh answers: start over rather than grow.
        cache.insert(5, true, start + Duration::from_secs(12));
        cache.insert(6, true, start + Duration::from_secs(12));
        assert!(cache.len() <= 3, "{}", cache.len());
        assert_eq!(cache.get(&6, start + Duration::from_secs(12)), Some(true));
        // Replacing an entry never evicts.
        cache.insert(6, false, start + Duration::from_secs(13));
        assert_eq!(cache.get(&6, start + Duration::from_secs(13)), Some(false));
    }

    #[test]
    fn a_review_names_the_caller_only_when_authenticated() {
        let review = |authenticated: Option<bool>, username: Option<&str>| TokenReview {
            status: Some(TokenReviewStatus {
                authenticated,
                user: Some(UserInfo {
                    username: username.map(str::to_owned),
                    uid: Some("u-1".into()),
                    groups: Some(vec!["system:serviceaccounts".into()]),
                    extra: Some(BTreeMap::from([("k".into(), vec!["v".into()])])),
                }),
                ..TokenReviewStatus::default()
            }),
            ..TokenReview::default()
        };
        let caller = caller_of(&review(Some(true), Some("system:serviceaccount:a:reader")));
        assert_eq!(
            caller.as_ref().map(|c| c.username.as_str()),
            Some("system:serviceaccount:a:reader")
        );
        assert_eq!(caller_of(&review(Some(false), Some("x"))), None);
        assert_eq!(caller_of(&review(None, Some("x"))), None);
        assert_eq!(caller_of(&review(Some(true), None)), None);
        assert_eq!(caller_of(&TokenReview::default()), None);

        let Some(caller) = caller else {
            panic!("authenticated")
        };
        let sar = access_review(&caller, &Permission::pipelines("tenant-a"));
        let attributes = sar.spec.resource_attributes.unwrap_or_default();
        assert_eq!(
            sar.spec.user.as_deref(),
            Some("system:serviceaccount:a:reader")
        );
        assert_eq!(sar.spec.uid.as_deref(), Some("u-1"));
        assert_eq!(
            sar.spec.groups,
            Some(vec!["system:serviceaccounts".to_owned()])
        );
        assert_eq!(sar.spec.extra.map(|e| e.len()), Some(1));
        assert_eq!(attributes.verb.as_deref(), Some("get"));
        assert_eq!(attributes.group.as_deref(), Some("raypipe.dev"));
        assert_eq!(attributes.resource.as_deref(), Some("servepipelines"));
        assert_eq!(attributes.namespace.as_deref(), Some("tenant-a"));
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
