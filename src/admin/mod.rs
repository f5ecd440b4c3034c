//! The admin HTTP server, on its own port: `/healthz` (the process serves), `/readyz` (CRDs
//! present, caches synced, webhook serving) and `/metrics` (OpenMetrics). Probes and scrapes
//! are not traced: they arrive every few seconds and would drown the logs.
//!
//! - `metrics`: the registry and its typed recording methods;
//! - `process`: the `process_*` series; `kube_requests`: the API client's request metrics;
//! - `kuberay_metrics`: the opt-in KubeRay-compatible series, read from the controllers'
//!   caches (`stores`) at scrape time.

pub mod kube_requests;
mod kuberay_metrics;
pub mod metrics;
mod process;
mod stores;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

pub use metrics::{FetchOutcome, Metrics, MetricsOptions, OPENMETRICS_CONTENT_TYPE};
pub use stores::StoreRegistration;

use kube::runtime::reflector::Store;

/// How often [`Readiness::track_store`] looks at a store again.
const STORE_POLL: std::time::Duration = std::time::Duration::from_millis(250);

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("binding the admin server to {address}: {source}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving the admin endpoints: {0}")]
    Serve(#[source] std::io::Error),
}

/// What `/readyz` waits for. Cloneable; every clone shares one state.
#[derive(Clone, Default)]
pub struct Readiness {
    state: Arc<Mutex<ReadinessState>>,
}

#[derive(Default)]
struct ReadinessState {
    crds_present: bool,
    /// Caches that have not finished their first list, by name (several controllers may share
    /// a name when one runs per namespace).
    unsynced_caches: BTreeMap<String, usize>,
    /// Every cache name ever tracked (synced or not).
    tracked_caches: BTreeSet<String>,
    /// `Some(false)` while a webhook server is configured but not yet serving.
    webhook_serving: Option<bool>,
    /// Controllers whose task ended before shutdown, with why: the process is not alive in
    /// any useful sense, so `/healthz` fails and the kubelet restarts it.
    failed_controllers: BTreeMap<String, String>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.problems()).finish()
    }
}

impl Readiness {
    pub fn new() -> Readiness {
        Readiness::default()
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut ReadinessState) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The CRDs the enabled controllers need are installed and Established.
    pub fn set_crds_present(&self) {
        self.with_state(|s| s.crds_present = true);
    }

    /// A webhook server will run: not ready until [`set_webhook_serving`](Self::set_webhook_serving).
    pub fn expect_webhook(&self) {
        self.with_state(|s| {
            s.webhook_serving.get_or_insert(false);
        });
    }

    pub fn set_webhook_serving(&self) {
        self.with_state(|s| s.webhook_serving = Some(true));
    }

    /// Not ready until `synced` completes (typically a reflector store's `wait_until_ready`).
    /// Spawns a task, so call it from within a Tokio runtime.
    pub fn track_cache(&self, name: &str, synced: impl Future<Output = ()> + Send + 'static) {
        let name = name.to_owned();
        self.with_state(|s| {
            *s.unsynced_caches.entry(name.clone()).or_insert(0) += 1;
            s.tracked_caches.insert(name.clone());
        });
        let this = self.clone();
        tokio::spawn(async move {
            synced.await;
            this.with_state(|s| {
                if let Some(count) = s.unsynced_caches.get_mut(&name) {
                    *count -= 1;
                    if *count == 0 {
                        s.unsynced_caches.remove(&name);
                    }
                }
            });
        });
    }

    /// Not ready until `store` holds its first complete list. `wait_until_ready` is re-polled
    /// on a timer because a reflector store wakes only one waiter (kube-runtime's `DelayedInit`
    /// wraps a oneshot channel) and the controller reading the store is waiting too.
    pub fn track_store<K>(&self, name: &str, store: Store<K>)
    where
        K: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        self.track_cache(name, async move {
            loop {
                let wait = store.wait_until_ready();
                if tokio::time::timeout(STORE_POLL, wait).await.is_ok() {
                    return;
                }
            }
        });
    }

    /// A controller's task ended while the operator was not stopping (see
    /// `controllers::frame::supervise`).
    pub fn controller_failed(&self, controller: &str, why: &str) {
        self.with_state(|s| {
            s.failed_controllers
                .insert(controller.to_owned(), why.to_owned());
        });
    }

    /// Why the operator is not alive; empty when it is.
    pub fn liveness_problems(&self) -> Vec<String> {
        self.with_state(|s| {
            s.failed_controllers
                .iter()
                .map(|(name, why)| format!("the {name} controller stopped: {why}"))
                .collect()
        })
    }

    /// Why the operator is not ready; empty when it is.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.liveness_problems();
        self.with_state(|s| {
            if !s.crds_present {
                problems.push("the CRDs have not been found yet".to_owned());
            }
            for name in s.unsynced_caches.keys() {
                problems.push(format!("the {name} cache has not synced yet"));
            }
            if s.webhook_serving == Some(false) {
                problems.push("the webhook server is not serving yet".to_owned());
            }
        });
        problems
    }

    pub fn is_ready(&self) -> bool {
        self.problems().is_empty()
    }

    /// The names of the caches readiness has waited for, synced or not (which controllers
    /// report their cache sync).
    pub fn tracked_caches(&self) -> Vec<String> {
        self.with_state(|s| s.tracked_caches.iter().cloned().collect())
    }
}

#[derive(Clone)]
struct AdminState {
    metrics: Metrics,
    readiness: Readiness,
}

/// The admin routes.
pub fn router(metrics: Metrics, readiness: Readiness) -> Router {
    router_with_code(metrics, readiness, None)
}

/// The admin routes, with the code layers of `code` on the package server (issue 31).
pub fn router_with_code(
    metrics: Metrics,
    readiness: Readiness,
    code: Option<crate::pypackage::CodeStore>,
) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_endpoint))
        .with_state(AdminState { metrics, readiness })
        // The graph runtime, for Ray nodes to fetch through `py_modules` (`--runtime-base-url`);
        // zipped on the first request, not at start-up. Teams' code layers beside it, by digest.
        .merge(crate::pypackage::lazy_router(
            || vec![crate::pypackage::runtime()],
            code,
        ))
}

async fn healthz(State(state): State<AdminState>) -> Response {
    let problems = state.readiness.liveness_problems();
    if problems.is_empty() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unhealthy:\n{}\n", problems.join("\n")),
        )
            .into_response()
    }
}

async fn readyz(State(state): State<AdminState>) -> Response {
    let problems = state.readiness.problems();
    if problems.is_empty() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready:\n{}\n", problems.join("\n")),
        )
            .into_response()
    }
}

async fn metrics_endpoint(State(state): State<AdminState>) -> Response {
    match state.metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body).into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the metrics failed",
        )
            .into_response(),
    }
}

/// Binds the admin port (before anything else starts, so a port clash fails fast).
pub async fn bind(address: SocketAddr) -> Result<tokio::net::TcpListener, AdminError> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| AdminError::Bind { address, source })
}

/// Serves the admin endpoints on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AdminError> {
    serve_with_code(listener, metrics, readiness, None, shutdown).await
}

/// [`serve`], with the code layers of `code` on the package server.
pub async fn serve_with_code(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    readiness: Readiness,
    code: Option<crate::pypackage::CodeStore>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AdminError> {
    axum::serve(listener, router_with_code(metrics, readiness, code))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(AdminError::Serve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readiness_lists_what_is_missing_until_everything_is_there() {
        let readiness = Readiness::new();
        readiness.expect_webhook();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        readiness.track_cache("servepipeline", async move {
            let _ = rx.await;
        });
        let problems = readiness.problems();
        assert_eq!(problems.len(), 3, "{problems:?}");
        readiness.set_crds_present();
        readiness.set_webhook_serving();
        assert_eq!(
            readiness.problems(),
            vec!["the servepipeline cache has not synced yet".to_owned()]
        );
        assert_eq!(readiness.tracked_caches(), vec!["servepipeline".to_owned()]);
        tx.send(()).expect("the cache task waits");
        for _ in 0..100 {
            if readiness.is_ready() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("still not ready: {:?}", readiness.problems());
    }
}
