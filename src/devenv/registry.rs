//! A model registry for tests, benchmarks and `raypipe dev`: HTTP on 127.0.0.1, bearer-token auth, strong ETags (the
//! content's sha256) with If-None-Match, replaceable content and token, request counters.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

#[derive(Default)]
struct Inner {
    token: String,
    objects: HashMap<String, Vec<u8>>,
    requests: u64,
    not_modified: u64,
    unauthorized: u64,
}

/// A running registry; it runs until the runtime it was started on ends.
#[derive(Clone)]
pub struct Registry {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

async fn serve_object(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Response {
    let mut inner = inner.lock().expect("registry lock");
    inner.requests += 1;
    let expected = format!("Bearer {}", inner.token);
    if headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        != Some(expected.as_str())
    {
        inner.unauthorized += 1;
        return (StatusCode::UNAUTHORIZED, "missing or wrong bearer token").into_response();
    }
    let Some(body) = inner.objects.get(&path).cloned() else {
        return (StatusCode::NOT_FOUND, "no such graph").into_response();
    };
    let etag = format!("\"{}\"", sha256_hex(&body));
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        == Some(etag.as_str())
    {
        inner.not_modified += 1;
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    (
        StatusCode::OK,
        [
            (header::ETAG, etag),
            (header::CONTENT_TYPE, "application/x-protobuf".to_owned()),
        ],
        body,
    )
        .into_response()
}

impl Registry {
    /// Starts a registry on 127.0.0.1 (an ephemeral port) that accepts `token`.
    pub async fn start(token: &str) -> Registry {
        Registry::start_on(0, token).await.expect("bind 127.0.0.1")
    }

    /// Starts a registry on `127.0.0.1:port` (0: ephemeral) that accepts `token`.
    pub async fn start_on(port: u16, token: &str) -> std::io::Result<Registry> {
        let inner = Arc::new(Mutex::new(Inner {
            token: token.to_owned(),
            ..Default::default()
        }));
        let app = axum::Router::new()
            .route("/{*path}", axum::routing::get(serve_object))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Registry { addr, inner })
    }

    /// `http://127.0.0.1:PORT/<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    pub fn put(&self, path: &str, bytes: Vec<u8>) {
        self.inner
            .lock()
            .expect("registry lock")
            .objects
            .insert(path.to_owned(), bytes);
    }

    pub fn set_token(&self, token: &str) {
        self.inner.lock().expect("registry lock").token = token.to_owned();
    }

    /// (all requests, 304 answers, 401 answers).
    pub fn counts(&self) -> (u64, u64, u64) {
        let inner = self.inner.lock().expect("registry lock");
        (inner.requests, inner.not_modified, inner.unauthorized)
    }
}
