//! The end-to-end fixture `pipeline` and `faults` share: a token-protected registry serving the
//! ensemble sample graph, the ServePipeline, RayCluster (Pods on kwok) and RayService controllers
//! as `raypipe dev` runs them (the runtime and sample models served to Ray as zips, dashboards
//! and Serve on the shared Ray head), a Ready ServePipeline `sentiment`, and a client that keeps
//! sending requests and counts what it sees.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use prost::Message;
use raypipe::api::conditions;
use raypipe::api::rayservice::RayService;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::config::ControllerKind;
use raypipe::config::ControllerSettings;
use serde_json::{Value, json};

use super::eventually;
use raypipe::devenv::registry::{Registry, sha256_hex};

pub const WAIT: Duration = Duration::from_secs(240);
pub const GRAPH_PATH: &str = "graphs/ensemble.pb";
pub const ROUTE: &str = "/e2e";
/// The ServePipeline every fixture creates.
pub const PIPELINE: &str = "sentiment";

/// The ensemble sample at `version`. Its 5 s node timeouts are raised to 20 s (and the deadline
/// to 30 s): on a 2-core machine running other suites, a starved model can take longer than 5 s,
/// and these tests count the failures a rollout or a fault causes, not those of CPU starvation.
pub fn ensemble(version: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/graphs/ensemble.pb");
    let graph = raypipe::graph::decode(&std::fs::read(path).expect("the sample graph"))
        .expect("the sample decodes");
    relaxed(graph, version)
}

/// `graph` at `version`, its node timeouts raised to 20 s and its deadline to 30 s, encoded.
fn relaxed(mut graph: raypipe::graph::proto::PipelineGraph, version: &str) -> Vec<u8> {
    graph.version = version.to_owned();
    graph.deadline_ms = 30_000;
    for node in &mut graph.nodes {
        if node.timeout_ms > 0 {
            node.timeout_ms = 20_000;
        }
    }
    graph.encode_to_vec()
}

/// The ensemble at `version` with `model_a` given the constructor arguments `kwargs` (YAML
/// lines, e.g. `error_share: 0.3`) besides its label: the sample classifier can be made to
/// fail at start, fail a share of its calls, or be slow (samples/models.py).
pub fn ensemble_with_model_a(version: &str, kwargs: &str) -> Vec<u8> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/graphs/ensemble.yaml");
    let text = std::fs::read_to_string(path).expect("the sample graph");
    let extra: String = kwargs
        .lines()
        .map(|l| format!("        {}\n", l.trim()))
        .collect();
    let text = text.replacen(
        "        label: a\n",
        &format!("        label: a\n{extra}"),
        1,
    );
    relaxed(
        raypipe::graph::from_yaml(&text).expect("the variant parses"),
        version,
    )
}

/// The ensemble with an edge from `combine` back to `preprocess`: a cycle.
pub fn cyclic_ensemble() -> Vec<u8> {
    let mut graph = raypipe::graph::decode(&ensemble("3")).expect("decodes");
    let mut back = graph.edges[0].clone();
    back.source = "combine".to_owned();
    back.target = "preprocess".to_owned();
    back.into = String::new();
    graph.edges.push(back);
    graph.encode_to_vec()
}

pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

/// What a client saw: answers, the first answer from each graph version (`x-raypipe-graph`,
/// e.g. `ensemble@2`), and failures with what they were.
#[derive(Default)]
pub struct Traffic {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    first_answers: std::sync::Mutex<BTreeMap<String, Instant>>,
    pub failures: std::sync::Mutex<Vec<String>>,
}

impl Traffic {
    /// When the first answer from `graph` (`name@version`) arrived.
    pub fn first_answer_from(&self, graph: &str) -> Option<Instant> {
        self.first_answers.lock().unwrap().get(graph).copied()
    }

    pub fn failures(&self) -> Vec<String> {
        self.failures.lock().unwrap().clone()
    }

    fn record_failure(&self, what: String) {
        self.failed.fetch_add(1, Ordering::SeqCst);
        self.failures.lock().unwrap().push(what);
    }
}

/// A client sending requests one after another until stopped.
pub struct Client {
    pub traffic: Arc<Traffic>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Client {
    pub fn start(url: String) -> Client {
        let traffic = Arc::new(Traffic::default());
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(keep_sending(url, traffic.clone(), stop.clone()));
        Client {
            traffic,
            stop,
            task,
        }
    }

    /// Stops after the request in flight; returns (answers, failures).
    pub async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the client task ran");
        (
            self.traffic.ok.load(Ordering::SeqCst),
            self.traffic.failed.load(Ordering::SeqCst),
        )
    }
}

/// Sends requests one after another until `stop`; records every answer.
async fn keep_sending(url: String, traffic: Arc<Traffic>, stop: Arc<AtomicBool>) {
    let http = super::fixture::loopback_http(Duration::from_secs(20));
    while !stop.load(Ordering::SeqCst) {
        let result = http
            .post(&url)
            .header("content-type", "application/json")
            .body(r#"{"text": "I love this"}"#)
            .send()
            .await;
        match result {
            Ok(response) if response.status().is_success() => {
                let graph = graph_header(&response);
                traffic.ok.fetch_add(1, Ordering::SeqCst);
                traffic
                    .first_answers
                    .lock()
                    .unwrap()
                    .entry(graph)
                    .or_insert_with(Instant::now);
            }
            Ok(response) => {
                let status = response.status();
                let body = response.text().await.unwrap_or_default();
                traffic.record_failure(format!("{status}: {body}"));
            }
            Err(e) => traffic.record_failure(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The graph (`name@version`) that answered, from `x-raypipe-graph`; empty when absent.
fn graph_header(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("x-raypipe-graph")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// One request: (status, `x-raypipe-graph`, JSON body).
pub async fn post(url: &str) -> (reqwest::StatusCode, String, Value) {
    let response = super::fixture::loopback_http(Duration::from_secs(20))
        .post(url)
        .header("content-type", "application/json")
        .body(r#"{"text": "I love this"}"#)
        .send()
        .await
        .expect("Serve answers");
    let status = response.status();
    let graph = graph_header(&response);
    let body =
        serde_json::from_slice(&response.bytes().await.unwrap_or_default()).unwrap_or(Value::Null);
    (status, graph, body)
}

/// The controllers of one in-process operator.
pub struct Operator {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Operator {
    pub fn start(client: kube::Client, settings: ControllerSettings) -> Operator {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            raypipe::controllers::run(client, settings.plan()?, async move {
                let _ = stop_rx.await;
            })
            .await
        });
        Operator {
            stop: Some(stop_tx),
            task,
        }
    }

    /// Its task ended (returned, failed or panicked).
    pub fn has_ended(&self) -> bool {
        self.task.is_finished()
    }

    /// Ends it as SIGKILL would: no shutdown, in-flight reconciles dropped where they are, all
    /// in-memory state (caches, what was pushed to Serve, ETags, backoffs) gone.
    pub async fn kill(mut self) {
        // Aborted before the stop sender goes: a dropped sender is a (graceful) stop request.
        self.task.abort();
        let ended = (&mut self.task).await;
        assert!(
            ended.as_ref().is_err_and(|e| e.is_cancelled()),
            "the operator was running until killed: {ended:?}"
        );
        self.stop.take();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A namespace with a token-protected registry serving the ensemble at version 1, an operator
/// running the ServePipeline, RayCluster and RayService controllers on it, and a Ready
/// ServePipeline [`PIPELINE`] pointing at the registry.
pub struct E2e {
    pub registry: Registry,
    pub client: kube::Client,
    pub namespace: String,
    pub pipelines: Api<ServePipeline>,
    pub rayservices: Api<RayService>,
    pub metrics: raypipe::admin::Metrics,
    /// Serve's URL for the pipeline's route.
    pub url: String,
    /// What the operator runs with: a restarted one gets the same (with fresh metrics).
    pub settings: ControllerSettings,
    pub operator: Option<Operator>,
}

impl E2e {
    /// Starts a new operator with the fixture's settings, fresh metrics and readiness (what a
    /// restarted process has).
    pub fn start_operator(&mut self) {
        let settings = ControllerSettings {
            metrics: raypipe::admin::Metrics::new(),
            readiness: raypipe::admin::Readiness::new(),
            ..self.settings.clone()
        };
        self.metrics = settings.metrics.clone();
        self.operator = Some(Operator::start(self.client.clone(), settings));
    }

    pub async fn pipeline(&self) -> ServePipeline {
        self.pipelines
            .get(PIPELINE)
            .await
            .expect("the ServePipeline")
    }
}

pub async fn ready_pipeline(head: &'static raypipe::devenv::ray::RayHead, prefix: &str) -> E2e {
    ready_pipeline_with(head, prefix, json!({})).await
}

/// [`ready_pipeline`] with the fields of `spec` added to the pipeline's spec (e.g. `rollout`).
pub async fn ready_pipeline_with(
    head: &'static raypipe::devenv::ray::RayHead,
    prefix: &str,
    spec: Value,
) -> E2e {
    ready_pipeline_on(super::client().await, head, prefix, spec).await
}

/// [`ready_pipeline_with`] on the control plane `client` talks to (a test with a control plane
/// of its own, e.g. one whose kube-apiserver it restarts).
pub async fn ready_pipeline_on(
    client: kube::Client,
    head: &'static raypipe::devenv::ray::RayHead,
    prefix: &str,
    spec: Value,
) -> E2e {
    ready_pipeline_laid_out(client, head, prefix, spec, Default::default()).await
}

/// [`ready_pipeline_on`] with the operator's `--node-layout` (a benchmark compares them).
pub async fn ready_pipeline_laid_out(
    client: kube::Client,
    head: &'static raypipe::devenv::ray::RayHead,
    prefix: &str,
    spec: Value,
    node_layout: raypipe::serve::shared::NodeLayout,
) -> E2e {
    let ns = super::namespace(&client, prefix).await;
    ready_pipeline_in(client, head, ns, spec, json!({}), node_layout).await
}

/// The fixture in the existing namespace `ns` (e.g. one whose Kueue LocalQueue exists first),
/// the pipeline carrying `labels` (e.g. Kueue's queue name).
pub async fn ready_pipeline_in(
    client: kube::Client,
    head: &'static raypipe::devenv::ray::RayHead,
    ns: String,
    spec: Value,
    labels: Value,
    node_layout: raypipe::serve::shared::NodeLayout,
) -> E2e {
    let token = raypipe::devenv::random_token().unwrap();
    let registry = Registry::start(&token).await;
    registry.put(GRAPH_PATH, ensemble("1"));
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "registry-token"},
        "stringData": {"token": token}
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let metrics = raypipe::admin::Metrics::new();
    let settings = ControllerSettings {
        namespaces: vec![ns.clone()],
        runtime_py_modules: raypipe::cli::dev::serve_packages(raypipe::cli::dev::dev_packages())
            .await
            .unwrap(),
        rayservice: Some(raypipe::cli::dev::local_rayservice_config(head).unwrap()),
        ray_serve_url: Some(head.serve_url()),
        metrics: metrics.clone(),
        fetcher: super::loopback_fetcher(),
        node_layout,
        ..ControllerSettings::new(&[
            ControllerKind::Servepipeline,
            ControllerKind::Raycluster,
            ControllerKind::Rayservice,
        ])
    };
    let operator = Operator::start(client.clone(), settings.clone());

    let pipeline = super::fixture::serving_pipeline(
        PIPELINE,
        super::fixture::token_source(&registry.url(GRAPH_PATH), json!({"refreshInterval": "1s"})),
        ROUTE,
        json!({"name": "ray-head", "image": "rayproject/ray:2.60.0",
            "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}),
    );
    let mut pipeline = pipeline;
    let mut value = serde_json::to_value(&pipeline).unwrap();
    for (k, v) in spec.as_object().cloned().unwrap_or_default() {
        value["spec"][k] = v;
    }
    if labels.as_object().is_some_and(|l| !l.is_empty()) {
        value["metadata"]["labels"] = labels;
    }
    pipeline = serde_json::from_value(value).expect("a valid ServePipeline");
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    let created = Instant::now();
    pipelines
        .create(&PostParams::default(), &pipeline)
        .await
        .unwrap();
    let ready = eventually(WAIT, "the ServePipeline to be Ready", || {
        let pipelines = pipelines.clone();
        async move {
            let p = pipelines.get(PIPELINE).await.ok()?;
            is_true(&p, "Ready").then_some(p)
        }
    })
    .await;
    eprintln!(
        "e2e: ServePipeline Ready {:.1}s after creation",
        created.elapsed().as_secs_f64()
    );
    assert_eq!(
        ready.status.unwrap().source.unwrap().digest,
        digest(&ensemble("1"))
    );
    E2e {
        registry,
        pipelines,
        rayservices: Api::namespaced(client.clone(), &ns),
        metrics,
        url: format!("{}{ROUTE}", head.serve_url()),
        client,
        namespace: ns,
        settings,
        operator: Some(operator),
    }
}

pub fn condition(p: &ServePipeline, type_: &str) -> Option<conditions::Condition> {
    p.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, type_).cloned())
}

/// The condition `type_` of `p` is `True`.
pub fn is_true(p: &ServePipeline, type_: &str) -> bool {
    condition(p, type_).is_some_and(|c| c.status == "True")
}
