//! Source fetching against a real HTTP(S) server on 127.0.0.1.
//!
//! The server is the one test registry, `raypipe::devenv::registry::Registry` (axum; HTTPS
//! through tokio-rustls + hyper-util), here with an rcgen CA: it checks the bearer token,
//! serves configurable routes and records every request it sees. Every address used is on
//! 127.0.0.0/8. The certificates and helpers live here; the tests are in one sub-module per
//! area (fetch, auth, limits, retries, stalls, urls, tls, logs, hardening, operator).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use raypipe::devenv::registry::{Registry, Route};
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
pub(crate) mod oci;
mod operator;
mod retries;
mod stalls;
mod tls;
mod urls;

const TOKEN: &str = "rp-test-token-7f3c9e1d";
/// Put in query strings and userinfo to check that URLs are redacted in messages.
const URL_SECRET: &str = "urlsecret-41d8cd98";
const GRAPH: &[u8] = b"\x0a\x05graph\x12\x03v42 protobuf bytes";

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
async fn failed_fetch(registry: &Registry, path: &str, attempts: u32) -> SourceError {
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

async fn protected_http_registry() -> Registry {
    Registry::http("127.0.0.1", Some(TOKEN)).await
}

fn graph_route(etag: Option<&str>) -> Route {
    Route::Graph {
        body: Bytes::from_static(GRAPH),
        etag: etag.map(str::to_owned),
        chunked: false,
    }
}
