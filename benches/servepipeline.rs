//! The ServePipeline controller against a real kube-apiserver (etcd + apiserver only, so the
//! operator is the only client that writes) and a registry on 127.0.0.1.
//!
//! 1. Latency from creating a ServePipeline to its RayService existing, and the registry fetch
//!    time measured on its own (so the controller's share is the difference).
//! 2. N pipelines (default 1000, `RAYPIPE_BENCH_PIPELINES`) at steady state with a 10 s refresh
//!    interval: process memory, and API writes during two refresh cycles when nothing changed.
//!
//! Run: `cargo bench --bench servepipeline`. Prints a table for BENCHMARKS.md.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use raypipe::api::{RayService, ServePipeline};
use raypipe::controllers::servepipeline::{self, Config};
use raypipe::devenv::control_plane::{ControlPlane, ControlPlaneOptions};
use raypipe::devenv::registry::Registry;
use serde_json::json;

const TOKEN: &str = "bench-token";
const LATENCY_SAMPLES: usize = 30;

fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn pipeline(name: &str, url: &str, refresh: Option<&str>) -> ServePipeline {
    let mut source = json!({"url": url, "allowInsecureHttp": true,
        "bearerTokenSecretRef": {"name": "token", "key": "token"}});
    if let Some(r) = refresh {
        source["refreshInterval"] = json!(r);
    }
    serde_json::from_value(json!({
        "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline", "metadata": {"name": name},
        "spec": {"source": source, "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
            "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}}}}
    }))
    .expect("a ServePipeline")
}

/// Write requests the API server has served for the resources the controller writes.
async fn write_requests(client: &kube::Client) -> f64 {
    let text = client
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("request"),
        )
        .await
        .expect("apiserver /metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            [
                "\"POST\"",
                "\"PATCH\"",
                "\"PUT\"",
                "\"DELETE\"",
                "\"APPLY\"",
            ]
            .iter()
            .any(|v| l.contains(v))
        })
        .filter(|l| {
            ["servepipelines", "rayservices", "events"]
                .iter()
                .any(|r| l.contains(&format!("resource=\"{r}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn bench() {
    let pipelines: usize = std::env::var("RAYPIPE_BENCH_PIPELINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let plane = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = plane.client().await.expect("client");
    let ns = "bench";
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "token"}, "stringData": {"token": TOKEN}}),
    )
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    let registry = Registry::start(TOKEN).await;
    let graph = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/samples/graphs/ensemble.pb"
    ))
    .expect("sample");
    registry.put("g.pb", graph);
    let url = registry.url("g.pb");

    // The fetch on its own, with the same client the controller uses.
    // The registry is on the loopback, which the operator refuses unless allowed.
    let fetcher = raypipe::source::Fetcher::with_options(raypipe::source::FetcherOptions {
        honor_proxy_environment: false,
        allowed_destinations: raypipe::source::DestinationPolicy::with_loopback(),
        ..Default::default()
    });
    let token = raypipe::source::BearerToken::new(TOKEN);
    let mut fetches = Vec::new();
    for _ in 0..LATENCY_SAMPLES {
        let request = raypipe::source::FetchRequest {
            bearer_token: Some(&token),
            allow_insecure_http: true,
            ..raypipe::source::FetchRequest::new(&url)
        };
        let t = Instant::now();
        fetcher.fetch(&request).await.expect("fetch");
        fetches.push(t.elapsed());
    }
    fetches.sort();

    let rss_before = proc_status_kib("VmRSS:");
    let config = Config {
        namespace: Some(ns.to_owned()),
        fetcher: fetcher.clone(),
        ..Default::default()
    };
    tokio::spawn(servepipeline::run(
        client.clone(),
        config,
        std::future::pending(),
    ));
    let pipes: Api<ServePipeline> = Api::namespaced(client.clone(), ns);
    let services: Api<RayService> = Api::namespaced(client.clone(), ns);

    let mut latencies = Vec::new();
    for i in 0..LATENCY_SAMPLES {
        let name = format!("latency-{i}");
        let t = Instant::now();
        pipes
            .create(&PostParams::default(), &pipeline(&name, &url, None))
            .await
            .expect("create");
        while services.get_opt(&name).await.expect("get").is_none() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        latencies.push(t.elapsed());
    }
    latencies.sort();

    let started = Instant::now();
    for i in 0..pipelines {
        let p = pipeline(&format!("scale-{i}"), &url, Some("10s"));
        pipes
            .patch(
                &format!("scale-{i}"),
                &PatchParams::apply("bench"),
                &Patch::Apply(&p),
            )
            .await
            .expect("apply pipeline");
    }
    let want = pipelines + LATENCY_SAMPLES;
    loop {
        let listed = services
            .list_metadata(&ListParams::default())
            .await
            .expect("list")
            .items
            .len();
        let with_status = pipes
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .iter()
            .filter(|p| p.status.as_ref().is_some_and(|s| s.source.is_some()))
            .count();
        if listed >= want && with_status >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let converge = started.elapsed();
    // Let the reconciles that our own applies trigger settle before measuring steady state.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let rss_steady = proc_status_kib("VmRSS:");
    let writes_before = write_requests(&client).await;
    let (requests_before, not_modified_before, _) = registry.counts();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let writes_after = write_requests(&client).await;
    let (requests_after, not_modified_after, _) = registry.counts();

    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        .unwrap_or_default();
    println!(
        "machine: {} cores, {cpu}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!("| measure | value |\n|---|---|");
    println!(
        "| create → RayService exists (n={LATENCY_SAMPLES}) | p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms |",
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.9).as_secs_f64() * 1e3,
        latencies.last().expect("samples").as_secs_f64() * 1e3
    );
    println!(
        "| of which registry fetch, measured alone | p50 {:.2} ms |",
        percentile(&fetches, 0.5).as_secs_f64() * 1e3
    );
    println!(
        "| {pipelines} pipelines applied → all RayServices + status | {:.1} s |",
        converge.as_secs_f64()
    );
    println!(
        "| process RSS: before controller / at steady state ({} pipelines) | {} MiB / {} MiB (+{:.1} KiB per pipeline) |",
        want,
        rss_before / 1024,
        rss_steady / 1024,
        (rss_steady.saturating_sub(rss_before)) as f64 / want as f64
    );
    println!(
        "| API writes in 2 refresh cycles (20 s), nothing changed | {} |",
        writes_after - writes_before
    );
    println!(
        "| registry requests in those cycles / answered 304 | {} / {} |",
        requests_after - requests_before,
        not_modified_after - not_modified_before
    );
    drop(plane);
}

fn main() {
    // `cargo test --benches` runs bench targets with `--bench` absent: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    raypipe::startup::init_crypto();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(bench());
}
