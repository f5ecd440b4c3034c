//! End to end, everything real and on 127.0.0.1: a registry with a token serves a model graph;
//! a ServePipeline on the API server fetches it; the ServePipeline, RayCluster (Pods on kwok)
//! and RayService controllers turn it into a RayService, a RayCluster and a Serve application on
//! a real Ray head, which loads the graph runtime and the sample models as zips served by the
//! operator. HTTP requests get the answer the graph computes; a new graph version rolls out
//! while a client keeps sending requests; an invalid graph is refused while the running one
//! keeps answering.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::e2e::{
    self, Client, GRAPH_PATH, WAIT, condition, cyclic_ensemble, digest, ensemble, post,
};
use crate::support::{self, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_in_the_registry_serves_http_rolls_out_a_new_version_and_refuses_a_bad_one() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let e2e = e2e::ready_pipeline(head, "e2e").await;
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
    let client = Client::start(url.clone());
    let traffic = client.traffic.clone();
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
    let serving = eventually(WAIT, "answers from version 2", || {
        let traffic = traffic.clone();
        async move { traffic.first_answer_from("ensemble@2") }
    })
    .await;
    // Keep going a little after the switch: old replicas drain, new ones answer.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (ok, failed) = client.stop().await;
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
        traffic.failures()
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
    use raypipe::serve::shared::NodeLayout;
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let dashboard = head.client(Duration::from_secs(10)).unwrap();
    // Both layouts in one run: each version changes only the graph's version label (wiring).
    for layout in [NodeLayout::Inline, NodeLayout::Shared] {
        let prefix = format!("bench-rollout-{}", format!("{layout:?}").to_lowercase());
        let e2e =
            e2e::ready_pipeline_laid_out(support::client().await, head, &prefix, json!({}), layout)
                .await;
        let rows = rollout_rows(&e2e, &dashboard).await;
        eprintln!("layout {layout:?}:");
        print_medians(&rows);
        drop(e2e);
        // The aborted operator must not push its config again after the delete.
        tokio::time::sleep(Duration::from_secs(2)).await;
        dashboard
            .delete_serve_applications()
            .await
            .expect("DELETE serve applications");
    }
}

/// Five rollouts (v2…v6) of the pipeline, each pushed 1.5 s after the last one served: per
/// rollout, its total and stages in seconds.
async fn rollout_rows(
    e2e: &e2e::E2e,
    dashboard: &raypipe::ray::RayDashboardClient,
) -> Vec<[f64; 7]> {
    use std::time::{SystemTime, UNIX_EPOCH};
    let http = crate::support::fixture::loopback_http(Duration::from_secs(20));
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
    rows
}

fn print_medians(rows: &[[f64; 7]]) {
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
