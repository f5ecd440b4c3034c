//! End to end, everything real and on 127.0.0.1: a registry with a token serves a model graph;
//! a ServePipeline on the API server fetches it; the ServePipeline, RayCluster (Pods on kwok)
//! and RayService controllers turn it into a RayService, a RayCluster and a Serve application on
//! a real Ray head, which loads the graph runtime and the sample models as zips served by the
//! operator. HTTP requests get the answer the graph computes; a new graph version rolls out
//! while a client keeps sending requests; an invalid graph is refused while the running one
//! keeps answering.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use prost::Message;
use raypipe::api::conditions;
use raypipe::api::rayservice::RayService;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::cli::ControllerKind;
use raypipe::config::ControllerSettings;
use serde_json::{Value, json};

use crate::support::{self, eventually, registry::Registry};

const WAIT: Duration = Duration::from_secs(240);
const GRAPH_PATH: &str = "graphs/ensemble.pb";
const ROUTE: &str = "/e2e";

/// The ensemble sample at `version`. Its 5 s node timeouts are raised to 20 s (and the deadline
/// to 30 s): on a 2-core machine running other suites, a starved model can take longer than 5 s,
/// and this test counts the failures a rollout causes, not those of CPU starvation.
fn ensemble(version: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/graphs/ensemble.pb");
    let mut graph = raypipe::graph::decode(&std::fs::read(path).expect("the sample graph"))
        .expect("the sample decodes");
    graph.version = version.to_owned();
    graph.deadline_ms = 30_000;
    for node in &mut graph.nodes {
        if node.timeout_ms > 0 {
            node.timeout_ms = 20_000;
        }
    }
    graph.encode_to_vec()
}

/// The ensemble with an edge from `combine` back to `preprocess`: a cycle.
fn cyclic_ensemble() -> Vec<u8> {
    let mut graph = raypipe::graph::decode(&ensemble("3")).expect("decodes");
    let mut back = graph.edges[0].clone();
    back.source = "combine".to_owned();
    back.target = "preprocess".to_owned();
    back.into = String::new();
    graph.edges.push(back);
    graph.encode_to_vec()
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", crate::support::registry::sha256_hex(bytes))
}

/// What a client saw: answers per graph version, and failures.
#[derive(Default)]
struct Traffic {
    ok: AtomicU64,
    failed: AtomicU64,
    first_v2: std::sync::Mutex<Option<Instant>>,
    failures: std::sync::Mutex<Vec<String>>,
}

/// Sends requests one after another until `stop`; records every answer.
async fn keep_sending(url: String, traffic: Arc<Traffic>, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("an HTTP client");
    while !stop.load(Ordering::SeqCst) {
        let result = http
            .post(&url)
            .header("content-type", "application/json")
            .body(r#"{"text": "I love this"}"#)
            .send()
            .await;
        match result {
            Ok(response) if response.status().is_success() => {
                let graph = response
                    .headers()
                    .get("x-raypipe-graph")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                traffic.ok.fetch_add(1, Ordering::SeqCst);
                if graph == "ensemble@2" {
                    traffic
                        .first_v2
                        .lock()
                        .unwrap()
                        .get_or_insert_with(Instant::now);
                }
            }
            Ok(response) => {
                traffic.failed.fetch_add(1, Ordering::SeqCst);
                let status = response.status();
                let body = response.text().await.unwrap_or_default();
                traffic
                    .failures
                    .lock()
                    .unwrap()
                    .push(format!("{status}: {body}"));
            }
            Err(e) => {
                traffic.failed.fetch_add(1, Ordering::SeqCst);
                traffic.failures.lock().unwrap().push(e.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn post(url: &str) -> (reqwest::StatusCode, String, Value) {
    let response = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
        .post(url)
        .header("content-type", "application/json")
        .body(r#"{"text": "I love this"}"#)
        .send()
        .await
        .expect("Serve answers");
    let status = response.status();
    let graph = response
        .headers()
        .get("x-raypipe-graph")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body =
        serde_json::from_slice(&response.bytes().await.unwrap_or_default()).unwrap_or(Value::Null);
    (status, graph, body)
}

/// A namespace with a token-protected registry serving the ensemble at version 1, the
/// controllers as `raypipe dev` runs them (runtime and sample models served to Ray as zips,
/// dashboards and Serve on `head`), and a Ready ServePipeline `sentiment` pointing at it.
struct E2e {
    registry: Registry,
    pipelines: Api<ServePipeline>,
    rayservices: Api<RayService>,
    metrics: raypipe::admin::Metrics,
    url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn ready_pipeline(head: &'static raypipe::ray::testenv::RayHead, prefix: &str) -> E2e {
    let client = support::client().await;
    let ns = support::namespace(&client, prefix).await;
    let token = raypipe::testenv::random_token().unwrap();
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
        metrics: metrics.clone(),
        fetcher: support::loopback_fetcher(),
        ..ControllerSettings::new(&[
            ControllerKind::Servepipeline,
            ControllerKind::Raycluster,
            ControllerKind::Rayservice,
        ])
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller_client = client.clone();
    tokio::spawn(async move {
        raypipe::controllers::run_with_settings(controller_client, &settings, async move {
            let _ = stop_rx.await;
        })
        .await
    });

    let pipeline: ServePipeline = serde_json::from_value(json!({
        "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline",
        "metadata": {"name": "sentiment"},
        "spec": {
            "source": {
                "url": registry.url(GRAPH_PATH),
                "allowInsecureHttp": true,
                "bearerTokenSecretRef": {"name": "registry-token", "key": "token"},
                "refreshInterval": "1s"
            },
            "serve": {"routePrefix": ROUTE},
            "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
                "containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0",
                    "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}]}}}}
        }
    }))
    .unwrap();
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    let created = Instant::now();
    pipelines
        .create(&PostParams::default(), &pipeline)
        .await
        .unwrap();
    let ready = eventually(WAIT, "the ServePipeline to be Ready", || {
        let pipelines = pipelines.clone();
        async move {
            let p = pipelines.get("sentiment").await.ok()?;
            condition(&p, "Ready")
                .is_some_and(|c| c.status == "True")
                .then_some(p)
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
        _stop: stop_tx,
    }
}

fn condition(p: &ServePipeline, type_: &str) -> Option<conditions::Condition> {
    p.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, type_).cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_in_the_registry_serves_http_rolls_out_a_new_version_and_refuses_a_bad_one() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let e2e = ready_pipeline(head, "e2e").await;
    let (registry, pipelines, rayservices, url) = (
        &e2e.registry,
        &e2e.pipelines,
        &e2e.rayservices,
        e2e.url.clone(),
    );
    // The answer the graph computes: "i love this" has 1 positive word of 3, so each
    // classifier scores 0.5 + 0.5 / 3 and the combiner averages both.
    let (code, graph, body) = post(&url).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(graph, "ensemble@1");
    assert_eq!(
        body,
        json!({"score": 0.6667, "votes": {"a": 0.6667, "b": 0.6667}})
    );

    // A new version at the registry rolls out while a client keeps sending requests.
    let traffic = Arc::new(Traffic::default());
    let stop = Arc::new(AtomicBool::new(false));
    let sender = tokio::spawn(keep_sending(url.clone(), traffic.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pushed = Instant::now();
    registry.put(GRAPH_PATH, ensemble("2"));
    let applied = eventually(WAIT, "the RayService to carry version 2", || {
        let rayservices = rayservices.clone();
        async move {
            let rs = rayservices.get("sentiment").await.ok()?;
            rs.spec
                .serve_config_v2
                .as_deref()?
                .contains("version: '2'")
                .then(Instant::now)
        }
    })
    .await;
    eventually(WAIT, "answers from version 2", || {
        let traffic = traffic.clone();
        async move { *traffic.first_v2.lock().unwrap() }
    })
    .await;
    let serving = traffic.first_v2.lock().unwrap().unwrap();
    // Keep going a little after the switch: old replicas drain, new ones answer.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    sender.await.unwrap();
    let ok = traffic.ok.load(Ordering::SeqCst);
    let failed = traffic.failed.load(Ordering::SeqCst);
    eprintln!(
        "e2e rollout: registry → RayService updated {:.2}s, → first v2 answer {:.2}s; requests ok {ok}, failed {failed}",
        applied.duration_since(pushed).as_secs_f64(),
        serving.duration_since(pushed).as_secs_f64(),
    );
    assert!(ok > 10, "the client kept sending ({ok} answers)");
    assert_eq!(
        failed,
        0,
        "requests failed during the rollout: {:?}",
        traffic.failures.lock().unwrap()
    );
    let p = eventually(WAIT, "the status to show the new digest", || {
        let pipelines = pipelines.clone();
        async move {
            let p = pipelines.get("sentiment").await.ok()?;
            (p.status.as_ref()?.source.as_ref()?.digest == digest(&ensemble("2"))).then_some(p)
        }
    })
    .await;
    assert_eq!(
        p.status.unwrap().graph.unwrap().version.as_deref(),
        Some("2")
    );

    // An invalid graph: refused with the reason; version 2 keeps answering.
    let before = rayservices.get("sentiment").await.unwrap().spec;
    registry.put(GRAPH_PATH, cyclic_ensemble());
    let refused = eventually(WAIT, "the cyclic graph to be refused", || {
        let pipelines = pipelines.clone();
        async move {
            let p = pipelines.get("sentiment").await.ok()?;
            condition(&p, "GraphValid")
                .filter(|c| c.status == "False")
                .map(|c| c.message)
        }
    })
    .await;
    assert!(refused.contains("cycle"), "{refused}");
    for _ in 0..5 {
        let (code, graph, _) = post(&url).await;
        assert_eq!((code.as_u16(), graph.as_str()), (200, "ensemble@2"));
    }
    assert_eq!(
        rayservices.get("sentiment").await.unwrap().spec,
        before,
        "the running RayService is left as it was"
    );
}

/// The sum and count of `raypipe_pipeline_update_stage_seconds{stage=…}`.
fn stage_total(metrics: &raypipe::admin::Metrics, stage: &str) -> (f64, f64) {
    let text = metrics.encode().unwrap();
    let value = |suffix: &str| {
        let prefix =
            format!("raypipe_pipeline_update_stage_seconds_{suffix}{{stage=\"{stage}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (value("sum"), value("count"))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// Benchmark (run with `--ignored`): from a new graph version at the registry to the new version
/// answering, five times, with the breakdown: detect (waiting for the next 1 s poll), fetch and
/// validate, render, apply (the RayService update), the RayService controller's push to Serve,
/// and Serve's rollout until the first answer from the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; results in BENCHMARKS.md"]
async fn bench_rollout_latency_breakdown() {
    use std::time::{SystemTime, UNIX_EPOCH};
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let e2e = ready_pipeline(head, "bench-rollout").await;
    let dashboard = head.client(Duration::from_secs(10)).unwrap();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let stages = ["fetch_validate", "render", "apply"];
    let mut rows: Vec<[f64; 7]> = Vec::new();
    for version in 2..=6 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let before: Vec<(f64, f64)> = stages
            .iter()
            .map(|s| stage_total(&e2e.metrics, s))
            .collect();
        let wall_put = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let put = Instant::now();
        e2e.registry.put(GRAPH_PATH, ensemble(&version.to_string()));
        let marker = format!("version: '{version}'");
        let applied = eventually(WAIT, "the RayService update", || {
            let rayservices = e2e.rayservices.clone();
            let marker = marker.clone();
            async move {
                let rs = rayservices.get("sentiment").await.ok()?;
                rs.spec
                    .serve_config_v2
                    .as_deref()?
                    .contains(&marker)
                    .then(Instant::now)
            }
        })
        .await;
        let wanted = format!("ensemble@{version}");
        let serving = eventually(WAIT, "an answer from the new version", || {
            let request = http
                .post(&e2e.url)
                .header("content-type", "application/json")
                .body(r#"{"text": "I love this"}"#);
            let wanted = wanted.clone();
            async move {
                let response = request.send().await.ok()?;
                let graph = response.headers().get("x-raypipe-graph")?.to_str().ok()?;
                (response.status().is_success() && graph == wanted).then(Instant::now)
            }
        })
        .await;
        // When Serve took the new config (its own clock, seconds since the epoch).
        let details = dashboard.get_serve_applications().await.unwrap();
        let deployed = details
            .applications
            .values()
            .filter_map(|a| a.last_deployed_time_s)
            .fold(0.0_f64, f64::max);
        let after: Vec<(f64, f64)> = stages
            .iter()
            .map(|s| stage_total(&e2e.metrics, s))
            .collect();
        let stage_secs: Vec<f64> = before
            .iter()
            .zip(&after)
            .map(|(b, a)| {
                assert_eq!(a.1 - b.1, 1.0, "one update per rollout");
                a.0 - b.0
            })
            .collect();
        let to_applied = applied.duration_since(put).as_secs_f64();
        let to_pushed = deployed - wall_put;
        let total = serving.duration_since(put).as_secs_f64();
        let detect = to_applied - stage_secs.iter().sum::<f64>();
        rows.push([
            total,
            detect,
            stage_secs[0],
            stage_secs[1],
            stage_secs[2],
            to_pushed - to_applied,
            total - to_pushed,
        ]);
        eprintln!(
            "rollout to v{version}: total {total:.2}s = detect {detect:.3} + fetch/validate {:.4} + render {:.5} + apply {:.4} + push to Serve {:.3} + Serve rollout {:.2}",
            stage_secs[0],
            stage_secs[1],
            stage_secs[2],
            to_pushed - to_applied,
            total - to_pushed
        );
    }
    let columns = [
        "total",
        "detect",
        "fetch+validate",
        "render",
        "apply",
        "push to Serve",
        "Serve rollout",
    ];
    for (i, name) in columns.iter().enumerate() {
        let mut values: Vec<f64> = rows.iter().map(|r| r[i]).collect();
        eprintln!("median {name}: {:.4}s", median(&mut values));
    }
}
