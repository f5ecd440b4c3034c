//! Source fetching against a real HTTP(S) server on 127.0.0.1.
//!
//! A small registry (axum; HTTPS through tokio-rustls + hyper-util with an rcgen CA) checks
//! the bearer token, serves configurable routes and records every request it sees. Every
//! address used is on 127.0.0.0/8.

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

// ---------------------------------------------------------------------------------------
// Success, conditional requests, digests.

#[tokio::test]
async fn fetches_graph_with_token_digest_etag_and_size() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(Some("\"v42\"")));
    let token = token();
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };

    let outcome = fetcher().fetch(&request).await.expect("fetch");

    assert_eq!(
        outcome,
        FetchOutcome::Fetched {
            bytes: FetchedBytes::unbudgeted(Bytes::from_static(GRAPH)),
            digest: digest_of(GRAPH),
            etag: Some("\"v42\"".to_owned()),
            size: GRAPH.len() as u64,
        }
    );
    let seen = registry.requests("/graph.pb");
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(seen[0].if_none_match, None);
}

#[tokio::test]
async fn chunked_body_without_content_length_is_fetched_whole() {
    let registry = protected_http_registry().await;
    registry.route(
        "/chunked.pb",
        Route::Graph {
            body: Bytes::from_static(GRAPH),
            etag: None,
            chunked: true,
        },
    );
    let token = token();
    let url = registry.url("/chunked.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    match fetcher().fetch(&request).await.expect("fetch") {
        FetchOutcome::Fetched { bytes, digest, .. } => {
            assert_eq!(bytes, GRAPH);
            assert_eq!(digest, digest_of(GRAPH));
        }
        other => panic!("expected Fetched, got {other:?}"),
    }
}

#[tokio::test]
async fn known_etag_is_sent_and_304_gives_not_modified_in_one_request() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(Some("\"v42\"")));
    let token = token();
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        previous_etag: Some("\"v42\""),
        previous_digest: Some(&digest_of(GRAPH)),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };

    let outcome = fetcher().fetch(&request).await.expect("fetch");

    assert_eq!(
        outcome,
        FetchOutcome::NotModified {
            etag: Some("\"v42\"".to_owned())
        }
    );
    let seen = registry.requests("/graph.pb");
    assert_eq!(seen.len(), 1, "a 304 must not be retried");
    assert_eq!(seen[0].if_none_match.as_deref(), Some("\"v42\""));
}

#[tokio::test]
async fn stale_etag_gets_the_new_graph_and_its_etag() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(Some("\"v43\"")));
    let token = token();
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        previous_etag: Some("\"v42\""),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    match fetcher().fetch(&request).await.expect("fetch") {
        FetchOutcome::Fetched { etag, .. } => assert_eq!(etag.as_deref(), Some("\"v43\"")),
        other => panic!("expected Fetched, got {other:?}"),
    }
    assert_eq!(
        registry.requests("/graph.pb")[0].if_none_match.as_deref(),
        Some("\"v42\"")
    );
}

#[tokio::test]
async fn same_digest_as_before_is_unchanged_in_both_digest_forms() {
    let registry = protected_http_registry().await;
    // No ETag: the server cannot answer 304, so only the digest shows nothing changed.
    registry.route("/graph.pb", graph_route(None));
    let token = token();
    let url = registry.url("/graph.pb");
    let fetcher = fetcher();
    let prefixed = digest_of(GRAPH);
    let bare = Sha256Digest::of(GRAPH).to_hex();
    for previous in [prefixed.as_str(), bare.as_str()] {
        let request = FetchRequest {
            bearer_token: Some(&token),
            previous_digest: Some(previous),
            allow_insecure_http: true,
            ..FetchRequest::new(&url)
        };
        let outcome = fetcher.fetch(&request).await.expect("fetch");
        assert_eq!(
            outcome,
            FetchOutcome::Unchanged {
                digest: prefixed.clone(),
                etag: None,
                size: GRAPH.len() as u64,
            }
        );
    }
}

#[tokio::test]
async fn pinned_digest_that_matches_is_accepted_in_both_forms() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(None));
    let token = token();
    let url = registry.url("/graph.pb");
    let fetcher = fetcher();
    let prefixed = digest_of(GRAPH);
    let bare_upper = Sha256Digest::of(GRAPH).to_hex().to_uppercase();
    for pin in [prefixed.as_str(), bare_upper.as_str()] {
        let request = FetchRequest {
            bearer_token: Some(&token),
            pinned_sha256: Some(pin),
            allow_insecure_http: true,
            ..FetchRequest::new(&url)
        };
        match fetcher.fetch(&request).await.expect("fetch") {
            FetchOutcome::Fetched { digest, .. } => assert_eq!(digest, prefixed),
            other => panic!("expected Fetched, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn pinned_digest_that_differs_is_refused_naming_both_digests() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(Some("\"v42\"")));
    let token = token();
    let url = registry.url("/graph.pb?sig=urlsecret-41d8cd98");
    let pin = digest_of(b"the graph that was reviewed");
    let request = FetchRequest {
        bearer_token: Some(&token),
        pinned_sha256: Some(&pin),
        // The applied graph does not match the pin, so a 304 could not prove anything:
        // the ETag must not be sent.
        previous_etag: Some("\"v42\""),
        previous_digest: Some(&digest_of(b"older")),
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };

    let error = fetch_error(&fetcher(), &request).await;

    assert_eq!(error.reason(), "DigestMismatch");
    assert!(!error.is_transient());
    match &error {
        SourceError::DigestMismatch {
            expected, actual, ..
        } => {
            assert_eq!(expected, &pin);
            assert_eq!(actual, &digest_of(GRAPH));
        }
        other => panic!("expected DigestMismatch, got {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains(&pin) && message.contains(&digest_of(GRAPH)),
        "{message}"
    );
    let seen = registry.requests("/graph.pb");
    assert_eq!(seen.len(), 1, "a digest mismatch is not retried");
    assert_eq!(seen[0].if_none_match, None);
}

#[tokio::test]
async fn malformed_pin_is_refused_before_any_request() {
    let registry = protected_http_registry().await;
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        pinned_sha256: Some("sha256:not-hex"),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "InvalidDigest");
    assert_eq!(registry.all_requests(), 0);
}

// ---------------------------------------------------------------------------------------
// Authorization and other 4xx: never retried.

#[tokio::test]
async fn wrong_token_is_unauthorized_after_one_request() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(None));
    let wrong = BearerToken::new("rp-wrong-token-0000");
    let url = registry.url("/graph.pb?sig=urlsecret-41d8cd98");
    let request = FetchRequest {
        bearer_token: Some(&wrong),
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };

    let error = fetch_error(&fetcher(), &request).await;

    assert_eq!(error.reason(), "Unauthorized");
    assert!(error.is_authorization_problem());
    assert!(!error.is_transient());
    assert!(!error.to_string().contains("rp-wrong-token"));
    assert!(error.to_string().contains("401"));
    assert!(error.to_string().contains(&registry.url("/graph.pb")));
    assert_eq!(registry.requests("/graph.pb").len(), 1);
}

#[tokio::test]
async fn missing_token_is_unauthorized_and_says_none_was_sent() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(None));
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert!(matches!(
        error,
        SourceError::Unauthorized {
            token_sent: false,
            ..
        }
    ));
    assert!(error.to_string().contains("no token was sent"));
    assert_eq!(registry.requests("/graph.pb")[0].authorization, None);
}

#[tokio::test]
async fn forbidden_is_an_authorization_problem_not_retried() {
    let registry = protected_http_registry().await;
    registry.route("/private.pb", Route::Status(403));
    let token = token();
    let url = registry.url("/private.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "Forbidden");
    assert!(error.is_authorization_problem());
    assert!(error.to_string().contains("403"));
    assert_eq!(registry.requests("/private.pb").len(), 1);
}

#[tokio::test]
async fn not_found_is_reported_after_exactly_one_request() {
    let registry = protected_http_registry().await;
    let token = token();
    let url = registry.url("/missing.pb?sig=urlsecret-41d8cd98");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(5),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "NotFound");
    assert!(!error.is_transient());
    assert!(error.to_string().contains("404"));
    assert_eq!(registry.requests("/missing.pb").len(), 1);
}

#[tokio::test]
async fn other_client_errors_are_not_retried() {
    let registry = protected_http_registry().await;
    registry.route("/bad.pb", Route::Status(400));
    let token = token();
    let url = registry.url("/bad.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(5),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "HttpError");
    assert!(error.to_string().contains("400"));
    assert_eq!(registry.requests("/bad.pb").len(), 1);
}

// ---------------------------------------------------------------------------------------
// Size cap.

#[tokio::test]
async fn body_at_the_cap_is_accepted_and_one_byte_over_is_refused_by_content_length() {
    let registry = protected_http_registry().await;
    let body = Bytes::from(vec![7u8; 1024]);
    registry.route(
        "/graph.pb",
        Route::Graph {
            body: body.clone(),
            etag: None,
            chunked: false,
        },
    );
    let token = token();
    let url = registry.url("/graph.pb");
    let fetcher = fetcher();
    let at_cap = FetchRequest {
        bearer_token: Some(&token),
        max_bytes: 1024,
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    assert!(matches!(
        fetcher.fetch(&at_cap).await.expect("fetch at cap"),
        FetchOutcome::Fetched { size: 1024, .. }
    ));

    let below = FetchRequest {
        max_bytes: 1023,
        retry: fast_retries(3),
        ..at_cap.clone()
    };
    let error = fetch_error(&fetcher, &below).await;
    assert_eq!(
        error,
        SourceError::TooLarge {
            url: url.clone(),
            limit: 1023,
            declared: Some(1024),
        }
    );
    assert!(!error.is_transient());
    assert_eq!(
        registry.requests("/graph.pb").len(),
        2,
        "TooLarge is not retried"
    );
}

#[tokio::test]
async fn chunked_body_is_cut_off_while_streaming_once_over_the_cap() {
    let registry = protected_http_registry().await;
    let total = 256 * 1024 * 1024;
    registry.route(
        "/endless.pb",
        Route::HugeChunked {
            chunk: 16 * 1024,
            total,
        },
    );
    let token = token();
    let url = registry.url("/endless.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        max_bytes: 100 * 1024,
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };

    let error = fetch_error(&fetcher(), &request).await;

    assert_eq!(
        error,
        SourceError::TooLarge {
            url: url.clone(),
            limit: 100 * 1024,
            declared: None,
        }
    );
    assert_eq!(registry.requests("/endless.pb").len(), 1);
    // The download stopped early: the server produced far less than the whole body (socket
    // buffers allow a few MiB beyond what the client read).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let produced = registry.state.produced_bytes.load(Ordering::Relaxed);
    assert!(
        produced < 32 * 1024 * 1024,
        "server produced {produced} bytes"
    );
}

// ---------------------------------------------------------------------------------------
// Timeouts, connection failures, retries.

#[tokio::test]
async fn slow_server_hits_the_total_timeout_and_is_retried() {
    let registry = protected_http_registry().await;
    registry.route("/slow.pb", Route::SlowHeaders(Duration::from_secs(30)));
    let token = token();
    let url = registry.url("/slow.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        timeout: Duration::from_millis(300),
        allow_insecure_http: true,
        retry: fast_retries(2),
        ..FetchRequest::new(&url)
    };

    let started = Instant::now();
    let error = fetch_error(&fetcher(), &request).await;

    assert_eq!(
        error,
        SourceError::Timeout {
            url: url.clone(),
            phase: TimeoutPhase::Transfer,
            limit: Duration::from_millis(300),
            attempts: 2,
        }
    );
    assert!(error.is_transient());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(registry.requests("/slow.pb").len(), 2);
}

#[tokio::test]
async fn trickling_body_hits_the_total_timeout() {
    let registry = protected_http_registry().await;
    registry.route(
        "/trickle.pb",
        Route::TrickleBody {
            len: 1000,
            interval: Duration::from_millis(20),
        },
    );
    let token = token();
    let url = registry.url("/trickle.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        timeout: Duration::from_millis(300),
        allow_insecure_http: true,
        retry: RetryPolicy::NONE,
        ..FetchRequest::new(&url)
    };
    let started = Instant::now();
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "Timeout");
    assert!(matches!(
        error,
        SourceError::Timeout {
            phase: TimeoutPhase::Transfer,
            attempts: 1,
            ..
        }
    ));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn closed_port_is_a_transient_connection_failure_retried_to_the_limit() {
    // Bind then drop: the port is closed, on the loopback.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let url = format!("http://{closed}/graph.pb");
    let token = token();
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "ConnectionFailed");
    assert!(error.is_transient());
    match &error {
        SourceError::ConnectionFailed {
            attempts,
            url: shown,
            ..
        } => {
            assert_eq!(*attempts, 3);
            assert_eq!(shown, &url);
        }
        other => panic!("expected ConnectionFailed, got {other:?}"),
    }
    assert!(error.to_string().contains("after 3 attempts"), "{error}");
}

#[tokio::test]
async fn server_error_then_success_is_retried_and_succeeds() {
    let registry = protected_http_registry().await;
    registry.route(
        "/flaky.pb",
        Route::FailingThenGraph {
            failures: 2,
            body: Bytes::from_static(GRAPH),
        },
    );
    let token = token();
    let url = registry.url("/flaky.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };
    let outcome = fetcher()
        .fetch(&request)
        .await
        .expect("fetch after retries");
    assert!(matches!(outcome, FetchOutcome::Fetched { .. }));
    let seen = registry.requests("/flaky.pb");
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter()
            .all(|s| s.authorization.as_deref() == Some(&format!("Bearer {TOKEN}")))
    );
}

#[tokio::test]
async fn persistent_server_error_gives_up_after_the_attempt_limit() {
    let registry = protected_http_registry().await;
    registry.route("/broken.pb", Route::Status(500));
    let token = token();
    let url = registry.url("/broken.pb?sig=urlsecret-41d8cd98");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(4),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(
        error,
        SourceError::ServerError {
            url: registry.url("/broken.pb"),
            status: reqwest::StatusCode::INTERNAL_SERVER_ERROR,
            attempts: 4,
        }
    );
    assert!(error.is_transient());
    assert!(error.to_string().contains("500"));
    assert_eq!(registry.requests("/broken.pb").len(), 4);
}

#[tokio::test]
async fn persistent_server_error_gives_up_when_the_time_budget_is_spent() {
    let registry = protected_http_registry().await;
    registry.route("/broken.pb", Route::Status(503));
    let token = token();
    let url = registry.url("/broken.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: RetryPolicy {
            max_attempts: 1000,
            max_elapsed: Duration::from_secs(1),
            initial_interval: Duration::from_millis(20),
            max_interval: Duration::from_millis(50),
        },
        ..FetchRequest::new(&url)
    };
    let started = Instant::now();
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "ServerError");
    assert!(started.elapsed() < Duration::from_secs(6));
    // Bounded by time, not by the (huge) attempt limit: waits of 20–50 ms fit a few dozen
    // attempts into one second.
    let attempts = registry.requests("/broken.pb").len();
    assert!((2..200).contains(&attempts), "{attempts} attempts");
}

#[tokio::test]
async fn rate_limiting_is_retried_then_reported() {
    let registry = protected_http_registry().await;
    registry.route("/busy.pb", Route::Status(429));
    let token = token();
    let url = registry.url("/busy.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(2),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "RateLimited");
    assert!(error.is_transient());
    assert_eq!(registry.requests("/busy.pb").len(), 2);
}

// ---------------------------------------------------------------------------------------
// URL rules.

#[tokio::test]
async fn plain_http_is_refused_unless_allowed() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(None));
    let token = token();
    let url = registry.url("/graph.pb?sig=urlsecret-41d8cd98");
    let fetcher = fetcher();
    let refused = FetchRequest {
        bearer_token: Some(&token),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher, &refused).await;
    assert_eq!(
        error,
        SourceError::InsecureUrl {
            url: registry.url("/graph.pb")
        }
    );
    assert!(error.to_string().contains("allowInsecureHttp"));
    assert_eq!(
        registry.all_requests(),
        0,
        "nothing may be sent over plain HTTP"
    );

    let allowed = FetchRequest {
        allow_insecure_http: true,
        ..refused.clone()
    };
    assert!(matches!(
        fetcher.fetch(&allowed).await.expect("allowed"),
        FetchOutcome::Fetched { .. }
    ));
}

#[tokio::test]
async fn credentials_in_the_url_are_refused_without_being_echoed() {
    let registry = protected_http_registry().await;
    let url = format!("http://user:{URL_SECRET}@{}/graph.pb", registry.addr);
    let request = FetchRequest {
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "InvalidUrl");
    assert_eq!(registry.all_requests(), 0);

    let garbage = format!("https://user:{URL_SECRET}@[not-a-host/graph.pb?sig={URL_SECRET}");
    let error = fetch_error(&fetcher(), &FetchRequest::new(&garbage)).await;
    assert_eq!(error.reason(), "InvalidUrl");
}

// ---------------------------------------------------------------------------------------
// TLS.

#[tokio::test]
async fn https_with_the_ca_bundle_succeeds() {
    let pki = TestPki::new();
    let registry = TestRegistry::https("127.0.0.1", Some(TOKEN), &pki).await;
    registry.route("/graph.pb", graph_route(Some("\"v1\"")));
    let token = token();
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        ca_bundle_pem: Some(pki.ca_pem.as_bytes()),
        ..FetchRequest::new(&url)
    };
    let fetcher = fetcher();
    for _ in 0..2 {
        match fetcher.fetch(&request).await.expect("https fetch") {
            FetchOutcome::Fetched { bytes, etag, .. } => {
                assert_eq!(bytes, GRAPH);
                assert_eq!(etag.as_deref(), Some("\"v1\""));
            }
            other => panic!("expected Fetched, got {other:?}"),
        }
    }
    assert_eq!(registry.requests("/graph.pb").len(), 2);
}

#[tokio::test]
async fn https_without_the_ca_bundle_is_a_tls_error_not_retried() {
    let pki = TestPki::new();
    let registry = TestRegistry::https("127.0.0.1", Some(TOKEN), &pki).await;
    registry.route("/graph.pb", graph_route(None));
    let token = token();
    let url = registry.url("/graph.pb?sig=urlsecret-41d8cd98");
    let fetcher = fetcher();
    let other_ca = TestPki::new();
    let without = FetchRequest {
        bearer_token: Some(&token),
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };
    let with_wrong_ca = FetchRequest {
        ca_bundle_pem: Some(other_ca.ca_pem.as_bytes()),
        ..without.clone()
    };
    for request in [without, with_wrong_ca] {
        let error = fetch_error(&fetcher, &request).await;
        assert_eq!(error.reason(), "TlsError", "{error}");
        assert!(!error.is_transient());
        assert!(error.to_string().contains("caBundleSecretRef"), "{error}");
    }
    assert_eq!(
        registry.all_requests(),
        0,
        "no HTTP request without trusted TLS"
    );
}

#[tokio::test]
async fn invalid_ca_bundle_is_refused_before_connecting() {
    let pki = TestPki::new();
    let registry = TestRegistry::https("127.0.0.1", Some(TOKEN), &pki).await;
    let token = token();
    let url = registry.url("/graph.pb");
    let fetcher = fetcher();
    let not_a_certificate =
        b"-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n".as_slice();
    for bundle in [b"".as_slice(), b"garbage".as_slice(), not_a_certificate] {
        let request = FetchRequest {
            bearer_token: Some(&token),
            ca_bundle_pem: Some(bundle),
            ..FetchRequest::new(&url)
        };
        let error = fetch_error(&fetcher, &request).await;
        assert_eq!(error.reason(), "InvalidCaBundle", "{error}");
        assert!(!error.is_transient());
    }
    assert_eq!(registry.all_requests(), 0);
}

// ---------------------------------------------------------------------------------------
// Redirects.

#[tokio::test]
async fn same_host_redirect_keeps_the_token() {
    let registry = protected_http_registry().await;
    registry
        .route(
            "/old.pb",
            Route::Redirect {
                location: "/graph.pb".to_owned(),
            },
        )
        .route("/graph.pb", graph_route(None));
    let token = token();
    let url = registry.url("/old.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    let outcome = fetcher().fetch(&request).await.expect("fetch");
    assert!(matches!(outcome, FetchOutcome::Fetched { .. }));
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(
        registry.requests("/graph.pb")[0].authorization.as_deref(),
        Some(bearer.as_str())
    );
}

#[tokio::test]
async fn cross_host_http_redirect_does_not_forward_the_token() {
    let origin = protected_http_registry().await;
    let elsewhere = TestRegistry::http("127.0.0.2", None).await;
    elsewhere.route("/graph.pb", graph_route(None));
    origin.route(
        "/graph.pb",
        Route::Redirect {
            location: elsewhere.url("/graph.pb"),
        },
    );
    let token = token();
    let url = origin.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };

    let outcome = fetcher().fetch(&request).await.expect("fetch");

    assert!(matches!(outcome, FetchOutcome::Fetched { .. }));
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(
        origin.requests("/graph.pb")[0].authorization.as_deref(),
        Some(bearer.as_str())
    );
    let forwarded = elsewhere.requests("/graph.pb");
    assert_eq!(forwarded.len(), 1);
    assert_eq!(
        forwarded[0].authorization, None,
        "token sent to another host"
    );
}

#[tokio::test]
async fn cross_host_https_redirect_does_not_forward_the_token() {
    let pki = TestPki::new();
    let origin = TestRegistry::https("127.0.0.1", Some(TOKEN), &pki).await;
    let elsewhere = TestRegistry::https("127.0.0.2", None, &pki).await;
    elsewhere.route("/blob", graph_route(None));
    origin.route(
        "/graph.pb",
        Route::Redirect {
            location: elsewhere.url("/blob"),
        },
    );
    let token = token();
    let url = origin.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        ca_bundle_pem: Some(pki.ca_pem.as_bytes()),
        ..FetchRequest::new(&url)
    };

    let outcome = fetcher().fetch(&request).await.expect("fetch");

    assert!(matches!(outcome, FetchOutcome::Fetched { .. }));
    assert!(origin.requests("/graph.pb")[0].authorization.is_some());
    let forwarded = elsewhere.requests("/blob");
    assert_eq!(forwarded.len(), 1);
    assert_eq!(
        forwarded[0].authorization, None,
        "token sent to another host"
    );
}

#[tokio::test]
async fn redirect_from_https_to_http_is_refused() {
    let pki = TestPki::new();
    let origin = TestRegistry::https("127.0.0.1", Some(TOKEN), &pki).await;
    let plain = TestRegistry::http("127.0.0.1", None).await;
    plain.route("/graph.pb", graph_route(None));
    origin.route(
        "/graph.pb",
        Route::Redirect {
            location: plain.url("/graph.pb?sig=urlsecret-41d8cd98"),
        },
    );
    let token = token();
    let url = origin.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        ca_bundle_pem: Some(pki.ca_pem.as_bytes()),
        // Even with plain HTTP allowed, an HTTPS source must not be downgraded.
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(
        error,
        SourceError::InsecureRedirect {
            from: origin.url("/graph.pb"),
            to: plain.url("/graph.pb"),
        }
    );
    assert_eq!(error.reason(), "InsecureUrl");
    assert_eq!(plain.all_requests(), 0);
}

#[tokio::test]
async fn redirect_loop_ends_with_too_many_redirects() {
    let registry = protected_http_registry().await;
    registry.route(
        "/loop.pb",
        Route::Redirect {
            location: "/loop.pb".to_owned(),
        },
    );
    let token = token();
    let url = registry.url("/loop.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "TooManyRedirects");
    assert!(!error.is_transient());
    assert_eq!(registry.requests("/loop.pb").len(), 11);
}

// ---------------------------------------------------------------------------------------
// Logs.

/// Collects everything written by the tracing subscriber of one test.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("logs").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("logs")).into_owned()
    }
}

#[tokio::test]
async fn logs_carry_url_status_and_size_but_never_the_token_or_url_secrets() {
    let logs = CapturedLogs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The test runtime is single-threaded, so a thread-local default sees every event.
    let _guard = tracing::subscriber::set_default(subscriber);

    let pki = TestPki::new();
    let origin = TestRegistry::https("127.0.0.1", Some(TOKEN), &pki).await;
    let elsewhere = TestRegistry::https("127.0.0.2", None, &pki).await;
    elsewhere.route("/blob", graph_route(None));
    origin
        .route("/graph.pb", graph_route(Some("\"v9\"")))
        .route(
            "/flaky.pb",
            Route::FailingThenGraph {
                failures: 1,
                body: Bytes::from_static(GRAPH),
            },
        )
        .route("/broken.pb", Route::Status(500))
        .route(
            "/moved.pb",
            Route::Redirect {
                location: elsewhere.url("/blob"),
            },
        );
    let token = token();
    let wrong = BearerToken::new(format!("{TOKEN}-wrong"));
    let fetcher = fetcher();
    let query = format!("?sig={URL_SECRET}");
    for (path, bearer) in [
        ("/graph.pb", &token),
        ("/graph.pb", &wrong),
        ("/flaky.pb", &token),
        ("/broken.pb", &token),
        ("/moved.pb", &token),
        ("/missing.pb", &token),
    ] {
        let url = origin.url(&format!("{path}{query}"));
        let request = FetchRequest {
            bearer_token: Some(bearer),
            ca_bundle_pem: Some(pki.ca_pem.as_bytes()),
            retry: fast_retries(2),
            ..FetchRequest::new(&url)
        };
        let _ = fetcher.fetch(&request).await;
        // And once without trusting the CA, for the TLS failure path.
        let untrusted = FetchRequest {
            ca_bundle_pem: None,
            ..request.clone()
        };
        let _ = fetcher.fetch(&untrusted).await;
    }

    let text = logs.text();
    assert!(
        text.contains("graph downloaded"),
        "nothing captured: {text}"
    );
    assert!(text.contains(&origin.url("/graph.pb")), "{text}");
    assert!(
        text.contains("status=200") && text.contains("bytes="),
        "{text}"
    );
    assert!(text.contains("retrying"), "{text}");
    assert!(!text.contains(TOKEN), "token in logs:\n{text}");
    assert!(!text.contains(URL_SECRET), "URL secret in logs:\n{text}");
}

// ---------------------------------------------------------------------------------------
// Hardening (issue 14): memory from the registry, the memory budget, the time ceiling, SSRF.

/// A memory figure of this process from /proc/self/status, in KiB (the whole test binary's:
/// measure with one test running).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

/// The process's peak resident memory so far (VmHWM), in KiB.
fn peak_kib() -> u64 {
    status_kib("VmHWM:")
}

/// How far the process's peak resident memory rose above `peak_before_kib`. Alone in the
/// process this is what the test's work cost at its peak; beside other tests it can only
/// under-count (an earlier, higher peak hides a rise), never blame this test for another's.
fn peak_growth_kib(peak_before_kib: u64) -> u64 {
    peak_kib().saturating_sub(peak_before_kib)
}

/// One test, so that the two peaks are measured one after the other (VmHWM is per process).
#[tokio::test]
async fn a_declared_terabyte_and_an_endless_body_stop_at_the_hard_ceiling() {
    let registry = protected_http_registry().await;
    let terabyte: u64 = 1 << 40;
    registry
        .route("/huge.pb", Route::DeclaredLength(terabyte))
        .route(
            "/endless.pb",
            Route::HugeChunked {
                chunk: 64 * 1024,
                total: usize::MAX,
            },
        );
    let token = token();
    let fetcher = fetcher();
    // maxBytes as large as a spec can ask: the old fetcher sized its buffer from the declared
    // length and aborted the process on the first request.
    let request = |url| FetchRequest {
        bearer_token: Some(&token),
        max_bytes: u64::MAX,
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(url)
    };

    let url = registry.url("/huge.pb");
    let peak_before = peak_kib();
    let error = fetch_error(&fetcher, &request(&url)).await;
    assert_eq!(
        error,
        SourceError::TooLarge {
            url: url.clone(),
            limit: MAX_MAX_BYTES,
            declared: Some(terabyte),
        }
    );
    assert!(!error.is_transient());
    assert_eq!(registry.requests("/huge.pb").len(), 1);
    let grown_kib = peak_growth_kib(peak_before);
    assert!(grown_kib < 64 * 1024, "peak RSS grew by {grown_kib} KiB");
    eprintln!("declared 1 TiB: peak RSS grew by {grown_kib} KiB");

    let url = registry.url("/endless.pb");
    let peak_before = peak_kib();
    let error = fetch_error(&fetcher, &request(&url)).await;
    assert_eq!(
        error,
        SourceError::TooLarge {
            url: url.clone(),
            limit: MAX_MAX_BYTES,
            declared: None,
        }
    );
    assert_eq!(registry.requests("/endless.pb").len(), 1, "not retried");
    let produced = registry.state.produced_bytes.load(Ordering::Relaxed);
    assert!(
        produced < 2 * MAX_MAX_BYTES,
        "server produced {produced} bytes"
    );
    // The buffer never passes the ceiling: 64 MiB, and a moment of the old buffer beside the
    // new one while it doubles.
    let grown_kib = peak_growth_kib(peak_before);
    assert!(grown_kib < 192 * 1024, "peak RSS grew by {grown_kib} KiB");
    eprintln!("endless body: peak RSS grew by {grown_kib} KiB, server produced {produced} bytes");
}

fn budgeted_fetcher(budget: u64, max_fetch_duration: Duration) -> Fetcher {
    raypipe::startup::init_crypto();
    Fetcher::with_options(FetcherOptions {
        honor_proxy_environment: false,
        allowed_destinations: DestinationPolicy::with_loopback(),
        graph_memory_budget: budget,
        max_fetch_duration,
    })
}

#[tokio::test]
async fn two_big_fetches_with_a_budget_for_one_take_turns() {
    const MIB: u64 = 1024 * 1024;
    let registry = protected_http_registry().await;
    let body = Bytes::from(vec![9u8; 4 * MIB as usize]);
    for path in ["/a.pb", "/b.pb", "/c.pb"] {
        registry.route(
            path,
            Route::Graph {
                body: body.clone(),
                etag: None,
                chunked: false,
            },
        );
    }
    let token = token();
    let (url_a, url_b, url_c) = (
        registry.url("/a.pb"),
        registry.url("/b.pb"),
        registry.url("/c.pb"),
    );
    let request = |url| FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: RetryPolicy::NONE,
        ..FetchRequest::new(url)
    };
    let fetcher = budgeted_fetcher(6 * MIB, Duration::from_secs(20));
    let rss_before = rss_kib();

    // A's bytes hold 4 MiB of the budget for as long as the controller keeps them (decoding).
    let FetchOutcome::Fetched { bytes: held, .. } =
        fetcher.fetch(&request(&url_a)).await.expect("fetch A")
    else {
        panic!("expected Fetched");
    };
    assert_eq!(held.len() as u64, 4 * MIB);
    assert_eq!(held.reservation().map(|r| r.bytes()), Some(4 * MIB));
    assert_eq!(fetcher.memory_budget().available_bytes(), 2 * MIB);

    // B waits for A's bytes to be dropped, then proceeds.
    let second = {
        let fetcher = fetcher.clone();
        let token = token.clone();
        let url = url_b.clone();
        tokio::spawn(async move {
            let request = FetchRequest {
                bearer_token: Some(&token),
                allow_insecure_http: true,
                retry: RetryPolicy::NONE,
                ..FetchRequest::new(&url)
            };
            fetcher.fetch(&request).await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !second.is_finished(),
        "B must wait while A holds the budget"
    );
    drop(held);
    let outcome = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("B proceeds once A is dropped")
        .expect("task")
        .expect("fetch B");
    let FetchOutcome::Fetched { bytes: held, .. } = outcome else {
        panic!("expected Fetched");
    };

    // C cannot get in before its deadline while B is held: a named, transient failure.
    let short = budgeted_fetcher(6 * MIB, Duration::from_millis(400));
    let _b_in_short = short
        .memory_budget()
        .reserve(4 * MIB, Duration::ZERO)
        .await
        .expect("fits");
    let started = Instant::now();
    let error = fetch_error(&short, &request(&url_c)).await;
    assert_eq!(error.reason(), "MemoryBudgetExhausted", "{error}");
    assert!(error.is_transient());
    assert!(
        error.to_string().contains("--graph-memory-budget"),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));

    // Memory stayed within the budget's order: two 4 MiB bodies were never held at once.
    let grown_kib = rss_kib().saturating_sub(rss_before);
    assert!(grown_kib < 64 * 1024, "RSS grew by {grown_kib} KiB");
    eprintln!("two 4 MiB fetches, 6 MiB budget: RSS grew by {grown_kib} KiB");
    drop(held);
    assert_eq!(fetcher.memory_budget().available_bytes(), 6 * MIB);
}

#[tokio::test]
async fn a_body_that_could_exceed_the_whole_budget_fails_at_once_without_retries() {
    let registry = protected_http_registry().await;
    // Chunked: no declared length, so the fetch must plan for maxBytes (16 MiB by default).
    registry.route(
        "/chunked.pb",
        Route::Graph {
            body: Bytes::from_static(GRAPH),
            etag: None,
            chunked: true,
        },
    );
    let token = token();
    let url = registry.url("/chunked.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(
        &budgeted_fetcher(1024 * 1024, Duration::from_secs(20)),
        &request,
    )
    .await;
    assert_eq!(
        error,
        SourceError::LargerThanMemoryBudget {
            url: url.clone(),
            requested: 16 * 1024 * 1024,
            budget: 1024 * 1024,
        }
    );
    assert_eq!(error.reason(), "MemoryBudgetExhausted");
    assert!(!error.is_transient());
    assert_eq!(registry.requests("/chunked.pb").len(), 1, "not retried");
    // With a maxBytes that fits, the same graph is fetched.
    let fitting = FetchRequest {
        max_bytes: 64 * 1024,
        ..request.clone()
    };
    let fetcher = budgeted_fetcher(1024 * 1024, Duration::from_secs(20));
    assert!(matches!(
        fetcher.fetch(&fitting).await.expect("fits the budget"),
        FetchOutcome::Fetched { .. }
    ));
}

#[tokio::test]
async fn one_fetch_with_all_its_retries_ends_at_the_fetch_ceiling() {
    let registry = protected_http_registry().await;
    registry.route(
        "/trickle.pb",
        Route::TrickleBody {
            len: 100_000,
            interval: Duration::from_millis(50),
        },
    );
    let token = token();
    let url = registry.url("/trickle.pb");
    // A spec asking for an hour per attempt and endless retries.
    let request = FetchRequest {
        bearer_token: Some(&token),
        timeout: Duration::from_secs(3600),
        allow_insecure_http: true,
        retry: RetryPolicy {
            max_attempts: 1000,
            max_elapsed: Duration::from_secs(3600),
            initial_interval: Duration::from_millis(10),
            max_interval: Duration::from_millis(20),
        },
        ..FetchRequest::new(&url)
    };
    let fetcher = budgeted_fetcher(1 << 28, Duration::from_secs(1));
    let started = Instant::now();
    let error = fetch_error(&fetcher, &request).await;
    let took = started.elapsed();
    assert_eq!(error.reason(), "Timeout", "{error}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(took >= Duration::from_millis(900), "took {took:?}");
}

#[tokio::test]
async fn default_policy_refuses_loopback_literals_and_names_before_any_request() {
    let pki = TestPki::new();
    let registry = TestRegistry::https("127.0.0.1", None, &pki).await;
    registry.route("/graph.pb", graph_route(None));
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let fetcher = fetcher_with(DestinationPolicy::public_only());
    let port = registry.addr.port();
    let mut messages = Vec::new();
    for (url, host) in [
        (format!("https://127.0.0.1:{port}/graph.pb"), "127.0.0.1"),
        (
            format!("https://127.0.0.1:{}/graph.pb", closed.port()),
            "127.0.0.1",
        ),
        (format!("https://localhost:{port}/graph.pb"), "localhost"),
        (
            format!("https://localhost:{}/graph.pb", closed.port()),
            "localhost",
        ),
        (
            format!("https://[::ffff:127.0.0.1]:{port}/graph.pb"),
            "[::ffff:7f00:1]",
        ),
        (format!("https://2130706433:{port}/graph.pb"), "127.0.0.1"),
    ] {
        let request = FetchRequest {
            ca_bundle_pem: Some(pki.ca_pem.as_bytes()),
            retry: fast_retries(3),
            ..FetchRequest::new(&url)
        };
        let error = fetch_error(&fetcher, &request).await;
        assert_eq!(
            error,
            SourceError::DestinationNotAllowed {
                host: host.to_owned()
            },
            "{url}"
        );
        assert!(!error.is_transient());
        let message = error.to_string();
        assert!(message.contains(host), "{message}");
        assert!(
            message.contains("--source-allowed-destinations"),
            "{message}"
        );
        messages.push((host, message));
    }
    assert_eq!(
        registry.all_requests(),
        0,
        "a request reached the refused host"
    );
    // The same words whether the port answered or was closed: no reachability oracle.
    assert_eq!(messages[0], messages[1]);
    assert_eq!(messages[2], messages[3]);
}

#[tokio::test]
async fn a_redirect_hop_to_a_refused_address_is_not_followed() {
    let pki = TestPki::new();
    let origin = TestRegistry::https("127.0.0.2", None, &pki).await;
    let internal = TestRegistry::https("127.0.0.1", None, &pki).await;
    internal.route("/secret", graph_route(None));
    origin
        .route(
            "/by-address.pb",
            Route::Redirect {
                location: internal.url("/secret"),
            },
        )
        .route(
            "/by-name.pb",
            Route::Redirect {
                location: format!("https://localhost:{}/secret", internal.addr.port()),
            },
        )
        .route("/graph.pb", graph_route(None));
    let fetcher = fetcher_with(DestinationPolicy::parse_list("127.0.0.2/32").expect("policy"));
    let fetch = |path: &str| {
        let url = origin.url(path);
        let fetcher = &fetcher;
        let ca = pki.ca_pem.clone();
        async move {
            let request = FetchRequest {
                ca_bundle_pem: Some(ca.as_bytes()),
                retry: fast_retries(2),
                ..FetchRequest::new(&url)
            };
            fetcher.fetch(&request).await
        }
    };

    // The allowed origin itself is fine.
    assert!(matches!(
        fetch("/graph.pb").await.expect("allowed origin"),
        FetchOutcome::Fetched { .. }
    ));
    let error = fetch("/by-address.pb").await.expect_err("hop refused");
    assert_secret_free(&error);
    assert_eq!(
        error,
        SourceError::DestinationNotAllowed {
            host: "127.0.0.1".to_owned()
        }
    );
    let error = fetch("/by-name.pb").await.expect_err("hop refused");
    assert_eq!(
        error,
        SourceError::DestinationNotAllowed {
            host: "localhost".to_owned()
        }
    );
    assert_eq!(origin.requests("/by-address.pb").len(), 1, "not retried");
    assert_eq!(internal.all_requests(), 0, "the refused hop was contacted");
}

// ---------------------------------------------------------------------------------------
// The operator: a refused source is named in the pipeline's condition.

/// `raypipe run` with its default policy (the test support allows the loopback unless told
/// otherwise; this test tells it the default) on the real API server.
#[tokio::test]
async fn the_operator_refuses_internal_sources_and_names_the_reason_in_the_condition() {
    use kube::api::{Api, PostParams};
    use raypipe::api::conditions;
    use raypipe::api::servepipeline::ServePipeline;

    let client = crate::support::client().await;
    let ns = crate::support::namespace(&client, "source-ssrf").await;
    let registry = crate::support::registry::Registry::start("ssrf-token").await;
    registry.put("g.pb", GRAPH.to_vec());
    let (stop_tx, operator) = crate::support::spawn_operator(
        client.clone(),
        vec![
            "--controllers=servepipeline".to_owned(),
            format!("--namespaces={ns}"),
            format!("--operator-namespace={ns}"),
            "--leader-election=false".to_owned(),
            "--admin-address=127.0.0.1:0".to_owned(),
            "--source-allowed-destinations=".to_owned(),
        ],
    );
    let port = registry.addr.port();
    let sources = [
        (
            "by-address",
            format!("http://127.0.0.1:{port}/g.pb"),
            "127.0.0.1",
        ),
        (
            "by-name",
            format!("http://localhost:{port}/g.pb"),
            "localhost",
        ),
        // Refused before any connection: nothing leaves the loopback.
        (
            "metadata",
            "http://169.254.169.254/latest/meta-data/g.pb".to_owned(),
            "169.254.169.254",
        ),
    ];
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    for (name, url, _) in &sources {
        let pipeline: ServePipeline = serde_json::from_value(serde_json::json!({
            "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline",
            "metadata": {"name": name},
            "spec": {
                "source": {"url": url, "allowInsecureHttp": true},
                "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
                    "template": {"spec": {"containers": [
                        {"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}}}
            }
        }))
        .expect("a ServePipeline");
        pipelines
            .create(&PostParams::default(), &pipeline)
            .await
            .expect("create the pipeline");
    }
    for (name, _, host) in &sources {
        let condition = crate::support::eventually(
            Duration::from_secs(60),
            &format!("{name}: SourceReady=False (DestinationNotAllowed)"),
            || {
                let pipelines = pipelines.clone();
                async move {
                    let pipeline = pipelines.get(name).await.ok()?;
                    let conds = pipeline.status?.conditions;
                    conditions::find(&conds, "SourceReady")
                        .filter(|c| c.status == "False" && c.reason == "DestinationNotAllowed")
                        .cloned()
                }
            },
        )
        .await;
        assert!(condition.message.contains(host), "{}", condition.message);
        assert!(
            condition.message.contains("--source-allowed-destinations"),
            "{}",
            condition.message
        );
    }
    assert_eq!(registry.counts().0, 0, "a refused source was contacted");
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(15), operator).await;
}
