//! The one model registry for tests, benchmarks and `raypipe dev`: HTTP or HTTPS on a loopback
//! address, bearer-token auth (or open, no token), strong ETags (the content's sha256) with
//! If-None-Match, replaceable content and token, request counters and a log of every request.
//! Per-path routes script the faults the source tests need (statuses, redirects, slow or
//! endless bodies, retries that succeed late). Paths under `/v2/` are an OCI registry
//! ([`super::oci`]), so one server serves both `source.url` and `source.oci`: there the token
//! is also accepted as a Basic password (what `docker login`-style clients send).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{StreamExt as _, stream};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use sha2::{Digest, Sha256};

/// What the registry answers on one path.
#[derive(Clone)]
pub enum Route {
    /// 200 with the bytes, their sha256 as a strong ETag and a protobuf content type; 304 when
    /// `If-None-Match` names the ETag. What [`Registry::put`] stores.
    Object(Bytes),
    /// 200 with the body (and ETag); 304 when `If-None-Match` names the ETag.
    Graph {
        body: Bytes,
        etag: Option<String>,
        /// Sent as a stream, so without Content-Length.
        chunked: bool,
    },
    /// Always this status.
    Status(u16),
    /// 500 for the first `failures` requests, then the graph.
    FailingThenGraph { failures: usize, body: Bytes },
    /// 302 to `location`.
    Redirect { location: String },
    /// Answers with `body` only after `delay`.
    SlowHeaders { delay: Duration, body: Bytes },
    /// Sends `len` bytes, one every `interval`.
    TrickleBody { len: usize, interval: Duration },
    /// Streams `total` bytes without Content-Length, counting what it produced.
    HugeChunked { chunk: usize, total: usize },
    /// Declares this Content-Length, sends a few bytes, then nothing.
    DeclaredLength(u64),
    /// 200 with its headers (declaring `declared` bytes), then not one byte of the body: a
    /// registry path that hangs after answering.
    StalledBody { declared: u64 },
    /// 401 with a bearer challenge naming `realm` as the token endpoint (what a registry with
    /// token auth answers before it is given a token).
    BearerChallenge { realm: String },
}

/// One request as the registry saw it.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// The URL path without its leading `/`.
    pub path: String,
    pub authorization: Option<String>,
    pub if_none_match: Option<String>,
}

#[derive(Default)]
struct Inner {
    /// The token every request must carry; `None` for an open registry.
    token: Option<String>,
    routes: HashMap<String, Route>,
    seen: Vec<SeenRequest>,
    not_modified: u64,
    unauthorized: u64,
    /// Bytes streamed by [`Route::HugeChunked`] routes.
    produced_bytes: u64,
    /// What was pushed to the OCI paths.
    oci: super::oci::OciStore,
}

/// A running registry; it runs until the runtime it was started on ends.
#[derive(Clone)]
pub struct Registry {
    pub addr: SocketAddr,
    scheme: &'static str,
    inner: Arc<Mutex<Inner>>,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Routes and the request log are keyed by the path without its leading `/`, so callers may
/// write either form.
fn route_key(path: &str) -> &str {
    path.strip_prefix('/').unwrap_or(path)
}

fn lock(inner: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    inner.lock().expect("registry lock")
}

/// Whether `authorization` carries `token`: as a bearer token, or (OCI paths) as the password
/// of Basic credentials.
fn carries_token(authorization: Option<&str>, token: &str, oci: bool) -> bool {
    use base64::Engine as _;
    let Some(authorization) = authorization else {
        return false;
    };
    if authorization.strip_prefix("Bearer ") == Some(token) {
        return true;
    }
    oci && authorization
        .strip_prefix("Basic ")
        .and_then(|encoded| {
            base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .ok()
        })
        .and_then(|decoded| String::from_utf8(decoded).ok())
        .is_some_and(|decoded| {
            decoded
                .split_once(':')
                .is_some_and(|(_, password)| password == token)
        })
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header_text = |name| {
        headers
            .get(name)
            .and_then(|value: &HeaderValue| value.to_str().ok())
            .map(str::to_owned)
    };
    let seen = SeenRequest {
        path: route_key(uri.path()).to_owned(),
        authorization: header_text(header::AUTHORIZATION),
        if_none_match: header_text(header::IF_NONE_MATCH),
    };
    let (route, earlier_requests) = {
        let mut inner = lock(&inner);
        inner.seen.push(seen.clone());
        let oci = super::oci::is_oci_path(&seen.path);
        if let Some(token) = &inner.token
            && !carries_token(seen.authorization.as_deref(), token, oci)
        {
            inner.unauthorized += 1;
            if oci {
                return super::oci::unauthorized();
            }
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "missing or wrong bearer token",
            )
                .into_response();
        }
        // A scripted route wins over the OCI store: how tests serve a corrupted blob.
        if oci && !inner.routes.contains_key(&seen.path) {
            return inner
                .oci
                .handle(&method, &seen.path, uri.query(), &headers, body);
        }
        let earlier = inner.seen.iter().filter(|s| s.path == seen.path).count() - 1;
        (inner.routes.get(&seen.path).cloned(), earlier)
    };
    let if_none_match = seen.if_none_match.as_deref();
    let response = match route {
        None => (StatusCode::NOT_FOUND, "no such graph").into_response(),
        Some(Route::Object(body)) => {
            let etag = format!("\"{}\"", sha256_hex(&body));
            let mut response = graph_response(body, Some(&etag), false, if_none_match);
            if response.status() == StatusCode::OK {
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/x-protobuf"),
                );
            }
            response
        }
        Some(Route::Graph {
            body,
            etag,
            chunked,
        }) => graph_response(body, etag.as_deref(), chunked, if_none_match),
        Some(Route::Status(code)) => StatusCode::from_u16(code)
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            .into_response(),
        Some(Route::FailingThenGraph { failures, body }) => {
            if earlier_requests < failures {
                StatusCode::INTERNAL_SERVER_ERROR.into_response()
            } else {
                graph_response(body, None, false, None)
            }
        }
        Some(Route::Redirect { location }) => {
            (StatusCode::FOUND, [(header::LOCATION, location)]).into_response()
        }
        Some(Route::SlowHeaders { delay, body }) => {
            tokio::time::sleep(delay).await;
            body.into_response()
        }
        Some(Route::TrickleBody { len, interval }) => {
            let bytes = stream::unfold(0, move |sent| async move {
                if sent == len {
                    return None;
                }
                tokio::time::sleep(interval).await;
                Some((Ok::<_, std::io::Error>(Bytes::from_static(b"x")), sent + 1))
            });
            Body::from_stream(bytes).into_response()
        }
        Some(Route::HugeChunked { chunk, total }) => {
            let counter = inner.clone();
            let bytes = stream::unfold(0, move |sent| {
                let inner = counter.clone();
                async move {
                    if sent >= total {
                        return None;
                    }
                    lock(&inner).produced_bytes += chunk as u64;
                    let data = Bytes::from(vec![b'z'; chunk]);
                    Some((Ok::<_, std::io::Error>(data), sent + chunk))
                }
            });
            Body::from_stream(bytes).into_response()
        }
        Some(Route::DeclaredLength(declared)) => declared_length_response(declared),
        Some(Route::BearerChallenge { realm }) => {
            let challenge = format!("Bearer realm=\"{realm}\",service=\"raypipe-dev\"");
            match HeaderValue::from_str(&challenge) {
                Ok(challenge) => (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, challenge)],
                )
                    .into_response(),
                Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            }
        }
        Some(Route::StalledBody { declared }) => {
            let mut response =
                Body::from_stream(stream::pending::<Result<Bytes, std::io::Error>>())
                    .into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(declared));
            response
        }
    };
    if response.status() == StatusCode::NOT_MODIFIED {
        lock(&inner).not_modified += 1;
    }
    response
}

fn declared_length_response(declared: u64) -> Response {
    let first = stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"abc"))]);
    let body = Body::from_stream(first.chain(stream::pending()));
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(declared));
    response
}

fn graph_response(
    body: Bytes,
    etag: Option<&str>,
    chunked: bool,
    if_none_match: Option<&str>,
) -> Response {
    let etag = etag.and_then(|etag| HeaderValue::from_str(etag).ok());
    if let Some(etag) = &etag
        && if_none_match == etag.to_str().ok()
    {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag.clone())]).into_response();
    }
    let mut response = if chunked {
        let chunks: Vec<Result<Bytes, std::io::Error>> = body
            .chunks(7)
            .map(|piece| Ok(Bytes::copy_from_slice(piece)))
            .collect();
        Body::from_stream(stream::iter(chunks)).into_response()
    } else {
        body.into_response()
    };
    if let Some(etag) = etag {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}

impl Registry {
    /// Starts a registry on 127.0.0.1 (an ephemeral port) that accepts `token`.
    pub async fn start(token: &str) -> Registry {
        Registry::start_on(0, token).await.expect("bind 127.0.0.1")
    }

    /// Starts a registry on `127.0.0.1:port` (0: ephemeral) that accepts `token`.
    pub async fn start_on(port: u16, token: &str) -> std::io::Result<Registry> {
        Registry::bind("127.0.0.1", port, Some(token), None).await
    }

    /// Plain HTTP on `ip` (a 127.0.0.0/8 address), ephemeral port; `None`: an open registry.
    pub async fn http(ip: &str, token: Option<&str>) -> Registry {
        Registry::bind(ip, 0, token, None)
            .await
            .expect("bind loopback")
    }

    /// HTTPS with `tls` on `ip` (a 127.0.0.0/8 address), ephemeral port; `None`: open.
    pub async fn https(ip: &str, token: Option<&str>, tls: Arc<rustls::ServerConfig>) -> Registry {
        Registry::bind(ip, 0, token, Some(tls))
            .await
            .expect("bind loopback")
    }

    /// Binds `ip:port` and serves, over TLS when `tls` is given. Tests stay on the loopback, so
    /// any other address is refused.
    pub async fn bind(
        ip: &str,
        port: u16,
        token: Option<&str>,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<Registry> {
        if !ip.starts_with("127.") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("the registry serves on the loopback only, not {ip}"),
            ));
        }
        let inner = Arc::new(Mutex::new(Inner {
            token: token.map(str::to_owned),
            ..Default::default()
        }));
        // Graph blobs pushed to the OCI paths may be as large as a graph may be.
        let app = axum::Router::new()
            .fallback(handle)
            .layer(DefaultBodyLimit::max(
                crate::graph::MAX_GRAPH_BYTES + 1024 * 1024,
            ))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind((ip, port)).await?;
        let addr = listener.local_addr()?;
        let scheme =
            match tls {
                None => {
                    tokio::spawn(async move {
                        let _ = axum::serve(listener, app).await;
                    });
                    "http"
                }
                Some(tls) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                    tokio::spawn(async move {
                        loop {
                            let Ok((tcp, _)) = listener.accept().await else {
                                continue;
                            };
                            let acceptor = acceptor.clone();
                            let app = app.clone();
                            tokio::spawn(async move {
                                // Fails when the client rejects our certificate: some tests want that.
                                let Ok(tls) = acceptor.accept(tcp).await else {
                                    return;
                                };
                                let _ = hyper_util::server::conn::auto::Builder::new(
                                    TokioExecutor::new(),
                                )
                                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                                .await;
                            });
                        }
                    });
                    "https"
                }
            };
        Ok(Registry {
            addr,
            scheme,
            inner,
        })
    }

    /// `http(s)://IP:PORT/<path>`; `path` may start with `/`.
    pub fn url(&self, path: &str) -> String {
        format!("{}://{}/{}", self.scheme, self.addr, route_key(path))
    }

    /// Serves `bytes` on `path` as a [`Route::Object`].
    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        self.route(path, Route::Object(Bytes::from(bytes)));
    }

    /// Answers requests for `path` as `route` says, replacing what was there.
    pub fn route(&self, path: &str, route: Route) -> &Self {
        lock(&self.inner)
            .routes
            .insert(route_key(path).to_owned(), route);
        self
    }

    /// Stores `graph` (protobuf) as a graph artifact under `repository:tag` of the OCI side,
    /// as `raypipe dag push` would; returns the manifest digest.
    pub fn push_graph(
        &self,
        repository: &str,
        tag: &str,
        graph: Vec<u8>,
        name: &str,
        version: &str,
    ) -> Result<String, crate::source::oci::push::PushError> {
        let artifact = crate::source::oci::push::GraphArtifact::new(graph, name, version)?;
        lock(&self.inner)
            .oci
            .put_artifact(repository, tag, &artifact);
        Ok(artifact.manifest_digest.to_string())
    }

    pub fn set_token(&self, token: &str) {
        lock(&self.inner).token = Some(token.to_owned());
    }

    /// (all requests, 304 answers, 401 answers).
    pub fn counts(&self) -> (u64, u64, u64) {
        let inner = lock(&self.inner);
        (
            inner.seen.len() as u64,
            inner.not_modified,
            inner.unauthorized,
        )
    }

    /// Every request seen for `path` (with or without its leading `/`), oldest first.
    pub fn requests(&self, path: &str) -> Vec<SeenRequest> {
        let key = route_key(path);
        lock(&self.inner)
            .seen
            .iter()
            .filter(|seen| seen.path == key)
            .cloned()
            .collect()
    }

    /// How many requests the registry has seen, on any path.
    pub fn all_requests(&self) -> usize {
        lock(&self.inner).seen.len()
    }

    /// Bytes streamed so far by [`Route::HugeChunked`] routes.
    pub fn produced_bytes(&self) -> u64 {
        lock(&self.inner).produced_bytes
    }
}
