//! Shared test support: one real control plane per test binary, a namespace per test.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use raypipe::devenv::control_plane::{ControlPlane, ControlPlaneOptions};

pub mod argocd;
pub mod browser;
pub mod e2e;
pub mod fixture;
pub mod flux;
pub mod kueue;
pub mod kwok;
pub mod oci;
pub mod prometheus;
pub mod s3;
pub mod tools;

/// The control plane every test in this binary shares: etcd, kube-apiserver,
/// kube-controller-manager, kube-scheduler and kwok, with raypipe's CRDs installed. Started by
/// the first test that asks; its processes die with the test binary (parent-death signal).
pub fn control_plane() -> &'static ControlPlane {
    static PLANE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
    let plane = PLANE.get_or_init(start_control_plane);
    // A failed start is remembered, so the other tests fail fast with the same message.
    match plane {
        Ok(plane) => plane,
        Err(e) => panic!("the test control plane failed to start: {e}"),
    }
}

/// Starts a full control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
/// kwok, raypipe's CRDs); dropping it stops its processes. The shared one above is one of these;
/// a test that needs an empty cluster of its own (the scale benchmark's phases) starts another.
pub fn start_control_plane() -> Result<ControlPlane, String> {
    start_control_plane_with(ControlPlaneOptions::full())
}

/// Starts a control plane of its own with `options` (raypipe's CRDs installed unless turned
/// off), for a test whose assertions are about the whole cluster, which tests sharing a control
/// plane would disturb.
pub fn start_control_plane_with(options: ControlPlaneOptions) -> Result<ControlPlane, String> {
    raypipe::startup::init_crypto();
    // Its own runtime on its own thread: each #[tokio::test] has a runtime that ends with the
    // test, and nothing the control plane needs may live on one of those.
    std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime starts");
        rt.block_on(ControlPlane::start(options))
    })
    .join()
    .expect("control-plane start-up did not panic")
    .map_err(|e| e.to_string())
}

/// A client for the current test's runtime (clients hold connections tied to one runtime).
pub async fn client() -> kube::Client {
    let plane = control_plane();
    plane
        .client()
        .await
        .expect("a client for the test control plane")
}

/// A client whose write requests (anything but GET) are counted: how tests prove that a
/// controller at steady state writes nothing.
pub async fn counting_client() -> (kube::Client, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let plane = control_plane();
    let kubeconfig = kube::config::Kubeconfig::read_from(&plane.kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("client config");
    let writes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = writes.clone();
    let count_writes =
        tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
            if request.method() != http::Method::GET {
                counter.fetch_add(1, Ordering::SeqCst);
            }
            request
        });
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&count_writes)
        .build();
    (client, writes)
}

/// Creates a namespace unique to this test run: `<prefix>-<n>`.
pub async fn namespace(client: &kube::Client, prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!("{prefix}-{}", N.fetch_add(1, Ordering::Relaxed));
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
    }))
    .expect("a valid Namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
    name
}

/// Path of the KubeRay sample objects (test data beside the repository).
pub fn kuberay_samples_dir() -> std::path::PathBuf {
    raypipe::api::yaml::kuberay_samples_dir()
}

/// Every YAML document in the `*.yaml` files of `dir`, as (file name, document).
pub fn yaml_documents(dir: &std::path::Path) -> Vec<(String, serde_json::Value)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("sample is readable");
        let name = file
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for value in raypipe::api::yaml::documents(&text)
            .unwrap_or_else(|e| panic!("{}: not YAML: {e}", file.display()))
        {
            docs.push((name.clone(), value));
        }
    }
    docs
}

/// Asserts every field of `expected` is present with the same value in `actual` (which may
/// carry more: server defaults, metadata). Reports the path of the first difference.
pub fn assert_contains(expected: &serde_json::Value, actual: &serde_json::Value, path: &str) {
    use serde_json::Value;
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, v) in e {
                match a.get(k) {
                    Some(av) => assert_contains(v, av, &format!("{path}.{k}")),
                    None => panic!("{path}.{k} was dropped (expected {v})"),
                }
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            assert_eq!(e.len(), a.len(), "{path}: list length differs");
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                assert_contains(ev, av, &format!("{path}[{i}]"));
            }
        }
        // Quantities and numbers may be normalised; compare numerically where both are numbers.
        (Value::Number(e), Value::Number(a)) => {
            assert_eq!(e.as_f64(), a.as_f64(), "{path}");
        }
        (e, a) => assert_eq!(e, a, "{path}"),
    }
}

/// Everything raypipe and kube log in this test binary (debug level), for asserting what never
/// appears in a log line (tokens). Installed once, as the process-wide subscriber.
pub fn captured_logs() -> String {
    let buffer = log_buffer();
    String::from_utf8_lossy(&buffer.lock().expect("log buffer")).into_owned()
}

fn log_buffer() -> &'static std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    static BUFFER: OnceLock<std::sync::Arc<std::sync::Mutex<Vec<u8>>>> = OnceLock::new();
    BUFFER.get_or_init(|| std::sync::Arc::new(std::sync::Mutex::new(Vec::new())))
}

#[derive(Clone)]
struct BufferWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for BufferWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber (idempotent).
pub fn capture_logs() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let writer = BufferWriter(log_buffer().clone());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "raypipe=trace,kube=debug,info",
            ))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .try_init();
    });
}

/// Polls `check` every 100 ms until it returns `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: std::time::Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The Ray head every Ray test in this binary shares (2 cores: one head for all). Ray comes
/// from the cached virtualenv (provisioned on first use); the Serve test apps in
/// `tests/ray/apps` are on its PYTHONPATH. Its nodes carry the AWS settings of this process's
/// S3 endpoint (`s3::endpoint`), so `s3://` URIs resolve to the test S3 server once a test
/// starts it (`s3::server`). Started by the first test that asks, on its own runtime like the
/// control plane; stopped by its process ids when the test binary exits.
pub fn ray_head() -> &'static raypipe::devenv::ray::RayHead {
    use raypipe::devenv::ray::{RayHead, RayHeadOptions, stop_at_exit};
    static HEAD: OnceLock<Result<RayHead, String>> = OnceLock::new();
    let head = HEAD.get_or_init(|| {
        raypipe::startup::init_crypto();
        // RayJob samples run `python /home/ray/samples/…` from a ConfigMap a Pod would mount:
        // the head sees `ray_samples_dir()` there (in its own mount namespace only), and
        // offers the custom resource raypipe's own RayJob sample reserves for its driver.
        let samples = ray_samples_dir();
        std::fs::create_dir_all(&samples).expect("create the Ray samples directory");
        let options = RayHeadOptions {
            python_path: vec![ray_test_apps_dir()],
            private_mounts: vec![(samples, "/home/ray/samples".into())],
            resources: [("driver_slot".to_owned(), 4.0)].into_iter().collect(),
            credential_env: s3::endpoint().ray_node_credentials(),
            ..Default::default()
        };
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime starts");
            rt.block_on(RayHead::start(options))
        })
        .join()
        .expect("Ray head start-up did not panic")
        .map_err(|e| e.to_string())
    });
    match head {
        Ok(head) => {
            static STOP_AT_EXIT: std::sync::Once = std::sync::Once::new();
            STOP_AT_EXIT.call_once(|| stop_at_exit(head));
            head
        }
        Err(e) => panic!("the test Ray head failed to start: {e}"),
    }
}

/// A Serve PUT replaces the head's whole declarative config (applications left out are
/// deleted), so tests that deploy Serve applications on the shared head take turns.
pub async fn ray_serve_lock() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// The host directory the shared Ray head sees as `/home/ray/samples` (where KubeRay's RayJob
/// samples mount their ConfigMap): tests write a ConfigMap's files here.
pub fn ray_samples_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("raypipe-ray-samples-{}", std::process::id()))
}

/// The Serve applications tests deploy (importable on the test Ray heads).
pub fn ray_test_apps_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ray/apps")
}

/// What test registries need: graph fetches may reach the loopback (`127.0.0.0/8,::1/128`),
/// which the operator refuses by default.
pub const LOOPBACK_DESTINATIONS: &str = "127.0.0.0/8,::1/128";

/// A fetcher for controllers started directly in tests: the loopback allowed, no proxy from
/// the environment (nothing may leave 127.0.0.0/8).
pub fn loopback_fetcher() -> raypipe::source::Fetcher {
    raypipe::source::Fetcher::with_options(raypipe::source::FetcherOptions {
        honor_proxy_environment: false,
        allowed_destinations: raypipe::source::DestinationPolicy::with_loopback(),
        ..Default::default()
    })
}

/// Stops an operator started by [`spawn_operator`] and asserts it ended cleanly within `wait`.
pub async fn stop_operator(
    stop_tx: tokio::sync::oneshot::Sender<()>,
    operator: tokio::task::JoinHandle<anyhow::Result<()>>,
    wait: std::time::Duration,
) {
    let _ = stop_tx.send(());
    let result = tokio::time::timeout(wait, operator)
        .await
        .expect("the operator stops")
        .expect("the operator task ran");
    assert!(result.is_ok(), "{result:?}");
}

/// Runs `raypipe run FLAGS…` in-process on `client`, as the binary would; the operator stops
/// when the returned sender is used (or dropped). Graph fetches may reach the loopback unless
/// the flags set `--source-allowed-destinations` themselves.
pub fn spawn_operator(
    client: kube::Client,
    flags: Vec<String>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let loopback = (!flags
        .iter()
        .any(|flag| flag.starts_with("--source-allowed-destinations")))
    .then(|| format!("--source-allowed-destinations={LOOPBACK_DESTINATIONS}"));
    let argv = ["raypipe".to_owned(), "run".to_owned()]
        .into_iter()
        .chain(loopback)
        .chain(flags);
    let raypipe::cli::Command::Run(args) =
        <raypipe::cli::Cli as clap::Parser>::try_parse_from(argv)
            .expect("valid flags")
            .command
    else {
        panic!("expected the run command");
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(async move {
        raypipe::cli::run::run_with_client(client, *args, async move {
            let _ = stop_rx.await;
        })
        .await
    });
    (stop_tx, operator)
}
