//! `raypipe collector`: a sidecar that speaks KubeRay's collector protocol. Ray's dashboard agent
//! posts its events to `POST /v1/events`; they are spooled to disk at once (the listener is up
//! before anything else, so nothing is lost while the node starts), filed by each event's own
//! session and node, and uploaded in KubeRay's bucket layout with the session logs. A sink that
//! is not ready, or fails mid-upload, is retried with backoff; the spool holds what waits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::{Mutex, Notify};

use super::event::parse_batch;
use super::layout::ClusterIdentity;
use super::sink::{LogShipper, Sink};
use super::spool::{Spool, SpoolConfig, SpoolError};

#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error("listening for Ray's events on {address}: {source}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving Ray's events: {0}")]
    Serve(#[source] std::io::Error),
}

/// Everything the collector runs with.
pub struct CollectorConfig {
    pub identity: ClusterIdentity,
    pub listen: SocketAddr,
    pub spool: SpoolConfig,
    /// Ray's temp root (`/tmp/ray`), whose `session_*/logs` are shipped.
    pub ray_tmp_root: PathBuf,
    /// How often changed logs are shipped while the node runs.
    pub log_interval: Duration,
    /// How long shutdown may spend on its last uploads.
    pub drain_timeout: Duration,
    /// Where events name no node (Rays before 2.5x).
    pub fallback_node: String,
}

/// What the collector has done, for `/healthz` and the tests.
#[derive(Default)]
pub struct Counters {
    pub events_written: AtomicU64,
    pub duplicates: AtomicU64,
    pub rejected: AtomicU64,
    pub refused_batches: AtomicU64,
    pub files_uploaded: AtomicU64,
    pub logs_uploaded: AtomicU64,
    pub upload_failures: AtomicU64,
}

struct Shared {
    spool: Mutex<Spool>,
    counters: Arc<Counters>,
    /// Wakes the uploader when a file closes.
    closed: Notify,
}

/// Binds `config.listen` and runs the collector there (see [`run_on`]).
pub async fn run(
    config: CollectorConfig,
    sink: Sink,
    counters: Arc<Counters>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), CollectorError> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| CollectorError::Bind {
            address: config.listen,
            source,
        })?;
    run_on(listener, config, sink, counters, shutdown).await
}

/// Serves Ray's events on `listener` until `shutdown` resolves, then closes every file and
/// makes a last attempt to upload it and the logs (what fails stays on disk for the next
/// start).
pub async fn run_on(
    listener: tokio::net::TcpListener,
    config: CollectorConfig,
    sink: Sink,
    counters: Arc<Counters>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), CollectorError> {
    let spool = Spool::open(
        config.spool.clone(),
        config.identity.clone(),
        config.fallback_node.clone(),
    )?;
    let held = spool.held();
    let ready_dir = spool.ready_dir();
    let shared = Arc::new(Shared {
        spool: Mutex::new(spool),
        counters: counters.clone(),
        closed: Notify::new(),
    });
    let address = listener.local_addr().map_err(CollectorError::Serve)?;
    tracing::info!(%address, cluster = %config.identity.cluster, "collector listening for Ray's events");

    let app = Router::new()
        .route("/v1/events", axum::routing::post(receive))
        .route("/healthz", axum::routing::get(health))
        .with_state(shared.clone());
    let stop = Arc::new(Notify::new());
    let server = {
        let stop = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.notified().await })
                .await
        })
    };

    let rotation = {
        let shared = shared.clone();
        let every = config
            .spool
            .rotate_after
            .clamp(Duration::from_millis(200), Duration::from_secs(30));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match shared.spool.lock().await.rotate_due() {
                    Ok(0) => {}
                    Ok(_) => shared.closed.notify_one(),
                    Err(e) => tracing::warn!(error = %e, "rotating event files"),
                }
            }
        })
    };
    let uploader = {
        let (shared, sink, held, ready_dir) = (
            shared.clone(),
            sink.clone(),
            held.clone(),
            ready_dir.clone(),
        );
        tokio::spawn(async move {
            let mut wait = Duration::from_secs(1);
            loop {
                let _ = tokio::time::timeout(wait, shared.closed.notified()).await;
                wait = match sink.upload_ready(&ready_dir, &held).await {
                    Ok(sent) => {
                        shared
                            .counters
                            .files_uploaded
                            .fetch_add(sent as u64, Ordering::Relaxed);
                        Duration::from_secs(1)
                    }
                    Err(e) => {
                        shared
                            .counters
                            .upload_failures
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, retry_in = ?wait * 2, "history sink not ready; events stay spooled");
                        (wait * 2).min(Duration::from_secs(30))
                    }
                };
            }
        })
    };
    let logs = {
        let (shared, sink, identity, root, every) = (
            shared.clone(),
            sink.clone(),
            config.identity.clone(),
            config.ray_tmp_root.clone(),
            config.log_interval,
        );
        tokio::spawn(async move {
            let mut shipper = LogShipper::new(root);
            loop {
                tokio::time::sleep(every).await;
                ship_logs(&mut shipper, &shared, &sink, &identity).await;
            }
        })
    };

    shutdown.await;
    tracing::info!("collector stopping: closing files, last uploads");
    stop.notify_one();
    let _ = server.await;
    for task in [rotation, uploader, logs] {
        task.abort();
    }
    shared.spool.lock().await.rotate_all()?;
    let drain = async {
        let mut shipper = LogShipper::new(config.ray_tmp_root.clone());
        ship_logs(&mut shipper, &shared, &sink, &config.identity).await;
        match sink.upload_ready(&ready_dir, &held).await {
            Ok(sent) => {
                counters
                    .files_uploaded
                    .fetch_add(sent as u64, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(error = %e, "last upload failed; the files stay spooled for the next start")
            }
        }
    };
    if tokio::time::timeout(config.drain_timeout, drain)
        .await
        .is_err()
    {
        tracing::warn!("last uploads timed out; the files stay spooled for the next start");
    }
    Ok(())
}

async fn ship_logs(
    shipper: &mut LogShipper,
    shared: &Shared,
    sink: &Sink,
    identity: &ClusterIdentity,
) {
    let nodes: std::collections::BTreeMap<String, String> = {
        let spool = shared.spool.lock().await;
        shipper
            .session_names()
            .into_iter()
            .map(|s| {
                let node = spool.node_of(&s);
                (s, node)
            })
            .collect()
    };
    let node_of = |session: &str| {
        nodes
            .get(session)
            .cloned()
            .unwrap_or_else(|| "unknown-node".to_owned())
    };
    match shipper.ship(sink, identity, node_of).await {
        Ok(shipped) => {
            shared
                .counters
                .logs_uploaded
                .fetch_add(shipped as u64, Ordering::Relaxed);
        }
        Err(e) => {
            shared
                .counters
                .upload_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "shipping session logs; retried next pass");
        }
    }
}

/// `POST /v1/events`: 200 once the batch is on disk; 400 only for a body that is not a JSON
/// array (a bad event is skipped and counted, since refusing its batch would make Ray resend it
/// forever); 503 with `Retry-After` while the spool is at its cap.
async fn receive(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let verdicts = match parse_batch(&body) {
        Ok(v) => v,
        Err(e) => {
            shared
                .counters
                .refused_batches
                .fetch_add(1, Ordering::Relaxed);
            return (
                StatusCode::BAD_REQUEST,
                format!("the body must be a JSON array of Ray events: {e}"),
            )
                .into_response();
        }
    };
    let mut events = Vec::with_capacity(verdicts.len());
    for verdict in verdicts {
        match verdict {
            Ok(event) => events.push(event),
            Err(why) => {
                shared.counters.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(reason = %why, "skipping an event");
            }
        }
    }
    let filed = shared.spool.lock().await.accept(events);
    match filed {
        Ok(filed) => {
            let c = &shared.counters;
            c.events_written
                .fetch_add(filed.written as u64, Ordering::Relaxed);
            c.duplicates
                .fetch_add(filed.duplicates as u64, Ordering::Relaxed);
            StatusCode::OK.into_response()
        }
        Err(e @ SpoolError::Full { .. }) => {
            shared
                .counters
                .refused_batches
                .fetch_add(1, Ordering::Relaxed);
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("10"));
            response
        }
        Err(e) => {
            tracing::error!(error = %e, "writing events to the spool");
            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    }
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    let c = &shared.counters;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let body = serde_json::json!({
        "eventsWritten": load(&c.events_written),
        "duplicates": load(&c.duplicates),
        "rejected": load(&c.rejected),
        "refusedBatches": load(&c.refused_batches),
        "filesUploaded": load(&c.files_uploaded),
        "logsUploaded": load(&c.logs_uploaded),
        "uploadFailures": load(&c.upload_failures),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
