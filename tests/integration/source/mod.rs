//! Source fetching against a real HTTP(S) server on 127.0.0.1.
//!
//! A small registry (axum; HTTPS through tokio-rustls + hyper-util with an rcgen CA) checks
//! the bearer token, serves configurable routes and records every request it sees. Every
//! address used is on 127.0.0.0/8. The registry, certificates and helpers live here; the tests
//! are in one sub-module per area (fetch, auth, limits, retries, urls, tls, logs, hardening,
//! operator).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{StreamExt as _, stream};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use raypipe::source::{
    BearerToken, DestinationPolicy, FetchOutcome, FetchRequest, FetchedBytes, Fetcher,
    FetcherOptions, MAX_MAX_BYTES, RetryPolicy, Sha256Digest, SourceError, TimeoutPhase,
};
use tokio::net::TcpListener;

mod auth;
mod fetch;
mod hardening;
mod limits;
mod logs;
mod operator;
mod retries;
mod tls;
mod urls;

const TOKEN: &str = "rp-test-token-7f3c9e1d";
/// Put in query strings and userinfo to check that URLs are redacted in messages.
const URL_SECRET: &str = "urlsecret-41d8cd98";
const GRAPH: &[u8] = b"\x0a\x05graph\x12\x03v42 protobuf bytes";

// ---------------------------------------------------------------------------------------
// The test registry.

#[derive(Clone)]
enum Route {
    /// 200 with the body (and ETag); 304 when `If-None-Match` names the ETag.
    Graph {
        body: Bytes,
        etag: Option<&'static str>,
        /// Sent as a stream, so without Content-Length.
        chunked: bool,
    },
    /// Always this status.
    Status(u16),
    /// 500 for the first `failures` requests, then the graph.
    FailingThenGraph { failures: usize, body: Bytes },
    /// 302 to `location`.
    Redirect { location: String },
    /// Answers only after this long.
    SlowHeaders(Duration),
    /// Sends `len` bytes, one every `interval`.
    TrickleBody { len: usize, interval: Duration },
    /// Streams `total` bytes without Content-Length, counting what it produced.
    HugeChunked { chunk: usize, total: usize },
    /// Declares this Content-Length, sends a few bytes, then nothing.
    DeclaredLength(u64),
}

#[derive(Debug, Clone)]
struct SeenRequest {
    path: String,
    authorization: Option<String>,
    if_none_match: Option<String>,
}

struct RegistryState {
    /// The token every request must carry; `None` for an open registry.
    required_token: Option<String>,
    routes: Mutex<HashMap<String, Route>>,
    seen: Mutex<Vec<SeenRequest>>,
    produced_bytes: Arc<AtomicU64>,
}

struct TestRegistry {
    scheme: &'static str,
    addr: SocketAddr,
    state: Arc<RegistryState>,
}

impl TestRegistry {
    async fn http(ip: &str, required_token: Option<&str>) -> Self {
        let (listener, state) = Self::bind(ip, required_token).await;
        let addr = listener.local_addr().expect("local addr");
        let app = router(state.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            scheme: "http",
            addr,
            state,
        }
    }

    async fn https(ip: &str, required_token: Option<&str>, pki: &TestPki) -> Self {
        let (listener, state) = Self::bind(ip, required_token).await;
        let addr = listener.local_addr().expect("local addr");
        let app = router(state.clone());
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let app = app.clone();
                tokio::spawn(async move {
                    // Fails when the client rejects our certificate: expected in some tests.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                        .await;
                });
            }
        });
        Self {
            scheme: "https",
            addr,
            state,
        }
    }

    async fn bind(ip: &str, required_token: Option<&str>) -> (TcpListener, Arc<RegistryState>) {
        assert!(ip.starts_with("127."), "tests stay on the loopback");
        let listener = TcpListener::bind((ip, 0)).await.expect("bind loopback");
        let state = Arc::new(RegistryState {
            required_token: required_token.map(str::to_owned),
            routes: Mutex::new(HashMap::new()),
            seen: Mutex::new(Vec::new()),
            produced_bytes: Arc::new(AtomicU64::new(0)),
        });
        (listener, state)
    }

    fn url(&self, path: &str) -> String {
        format!("{}://{}{}", self.scheme, self.addr, path)
    }

    fn route(&self, path: &str, route: Route) -> &Self {
        self.state
            .routes
            .lock()
            .expect("routes")
            .insert(path.to_owned(), route);
        self
    }

    fn requests(&self, path: &str) -> Vec<SeenRequest> {
        self.state
            .seen
            .lock()
            .expect("seen")
            .iter()
            .filter(|seen| seen.path == path)
            .cloned()
            .collect()
    }

    fn all_requests(&self) -> usize {
        self.state.seen.lock().expect("seen").len()
    }
}

fn router(state: Arc<RegistryState>) -> Router {
    Router::new().fallback(handle).with_state(state)
}

async fn handle(State(state): State<Arc<RegistryState>>, uri: Uri, headers: HeaderMap) -> Response {
    let header_text = |name| {
        headers
            .get(name)
            .and_then(|value: &HeaderValue| value.to_str().ok())
            .map(str::to_owned)
    };
    let seen = SeenRequest {
        path: uri.path().to_owned(),
        authorization: header_text(header::AUTHORIZATION),
        if_none_match: header_text(header::IF_NONE_MATCH),
    };
    let earlier_requests = {
        let mut all = state.seen.lock().expect("seen");
        all.push(seen.clone());
        all.iter().filter(|other| other.path == seen.path).count() - 1
    };
    if let Some(token) = &state.required_token
        && seen.authorization.as_deref() != Some(format!("Bearer {token}").as_str())
    {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
        )
            .into_response();
    }
    let route = state
        .routes
        .lock()
        .expect("routes")
        .get(&seen.path)
        .cloned();
    match route {
        None => StatusCode::NOT_FOUND.into_response(),
        Some(Route::Graph {
            body,
            etag,
            chunked,
        }) => graph_response(body, etag, chunked, seen.if_none_match.as_deref()),
        Some(Route::Status(code)) => StatusCode::from_u16(code).expect("status").into_response(),
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
        Some(Route::SlowHeaders(delay)) => {
            tokio::time::sleep(delay).await;
            Bytes::from_static(GRAPH).into_response()
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
            let produced = state.produced_bytes.clone();
            let bytes = stream::unfold(0, move |sent| {
                let produced = produced.clone();
                async move {
                    if sent >= total {
                        return None;
                    }
                    produced.fetch_add(chunk as u64, Ordering::Relaxed);
                    let data = Bytes::from(vec![b'z'; chunk]);
                    Some((Ok::<_, std::io::Error>(data), sent + chunk))
                }
            });
            Body::from_stream(bytes).into_response()
        }
        Some(Route::DeclaredLength(declared)) => declared_length_response(declared),
    }
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
    etag: Option<&'static str>,
    chunked: bool,
    if_none_match: Option<&str>,
) -> Response {
    if let Some(etag) = etag
        && if_none_match == Some(etag)
    {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
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
        response
            .headers_mut()
            .insert(header::ETAG, HeaderValue::from_static(etag));
    }
    response
}

// ---------------------------------------------------------------------------------------
// Certificates: a private CA and a server certificate for the loopback addresses.

struct TestPki {
    ca_pem: String,
    server_config: Arc<rustls::ServerConfig>,
}

impl TestPki {
    fn new() -> Self {
        raypipe::startup::init_crypto();
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "raypipe test CA");
        let ca_pem = ca_params.self_signed(&ca_key).expect("CA cert").pem();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);

        let server_key = rcgen::KeyPair::generate().expect("server key");
        let mut server_params = rcgen::CertificateParams::new(vec![
            "127.0.0.1".to_owned(),
            "127.0.0.2".to_owned(),
            "localhost".to_owned(),
        ])
        .expect("server params");
        server_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "raypipe test registry");
        let server_cert = server_params
            .signed_by(&server_key, &issuer)
            .expect("server cert");
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from(server_key.serialize_der());
        let server_config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![server_cert.der().clone()], key.into())
            .expect("server TLS config");
        Self {
            ca_pem,
            server_config: Arc::new(server_config),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Helpers.

fn fetcher() -> Fetcher {
    fetcher_with(DestinationPolicy::with_loopback())
}

fn fetcher_with(allowed_destinations: DestinationPolicy) -> Fetcher {
    raypipe::startup::init_crypto();
    // No proxy from the environment: every request must go straight to the loopback.
    Fetcher::with_options(FetcherOptions {
        honor_proxy_environment: false,
        allowed_destinations,
        ..FetcherOptions::default()
    })
}

fn fast_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        max_elapsed: Duration::from_secs(10),
        initial_interval: Duration::from_millis(5),
        max_interval: Duration::from_millis(20),
    }
}

fn token() -> BearerToken {
    BearerToken::new(TOKEN)
}

fn digest_of(bytes: &[u8]) -> String {
    Sha256Digest::of(bytes).to_string()
}

/// Neither the token nor URL credentials may appear in any rendering of an error.
fn assert_secret_free(error: &SourceError) {
    let renderings = [
        error.to_string(),
        format!("{error:?}"),
        format!("{error:#?}"),
    ];
    for text in renderings {
        assert!(!text.contains(TOKEN), "token leaked: {text}");
        assert!(!text.contains(URL_SECRET), "URL secret leaked: {text}");
        assert!(!text.contains("Bearer"), "authorization leaked: {text}");
    }
}

async fn fetch_error(fetcher: &Fetcher, request: &FetchRequest<'_>) -> SourceError {
    let error = fetcher
        .fetch(request)
        .await
        .expect_err("the fetch should fail");
    assert_secret_free(&error);
    error
}

/// The error of fetching `path` from `registry` with the test token over plain HTTP, with
/// `attempts` fast retries; checked to name no secret.
async fn failed_fetch(registry: &TestRegistry, path: &str, attempts: u32) -> SourceError {
    let token = token();
    let url = registry.url(path);
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(attempts),
        ..FetchRequest::new(&url)
    };
    fetch_error(&fetcher(), &request).await
}

async fn protected_http_registry() -> TestRegistry {
    TestRegistry::http("127.0.0.1", Some(TOKEN)).await
}

fn graph_route(etag: Option<&'static str>) -> Route {
    Route::Graph {
        body: Bytes::from_static(GRAPH),
        etag,
        chunked: false,
    }
}
