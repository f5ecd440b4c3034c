//! Canary rollouts end to end (issue 17), everything real and on 127.0.0.1: a registry serves
//! graph versions, the ServePipeline, RayCluster and RayService controllers run a pipeline with
//! `rollout.strategy: Canary` on the shared Ray head, and a client keeps sending requests the
//! whole time and counts every failure it sees.
//!
//! One pipeline goes through, in order: a good version promoted step by step; a version whose
//! model cannot start; one that fails 30 % of its calls; one that is slow; a version reverted at
//! the registry mid-rollout (the stable version keeps its replicas); three pushes within ten
//! seconds; and an operator killed and restarted mid-rollout. The client must see no failure
//! at all: a canary takes traffic only once it runs, and a canary's failed request is answered
//! by the stable version.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use raypipe::api::servepipeline::{RolloutOutcome, RolloutStatus, ServePipeline};
use serde_json::{Value, json};

use crate::support::e2e::{
    self, Client, E2e, GRAPH_PATH, PIPELINE, condition, digest, ensemble, ensemble_with_model_a,
};
use crate::support::{self, eventually};

/// Argo CD's health of a pipeline (deploy/argocd/servepipeline-health.lua).
fn health(p: &ServePipeline) -> (String, String) {
    support::argocd::health(&serde_json::to_value(p).expect("JSON"))
}

/// Flux's health of a pipeline (deploy/flux/kustomization.yaml's healthCheckExprs).
fn flux_health(p: &ServePipeline) -> String {
    support::flux::health(&serde_json::to_value(p).expect("JSON")).0
}

const ROLLOUT_WAIT: Duration = Duration::from_secs(300);

fn rollout_of(p: &ServePipeline) -> Option<RolloutStatus> {
    p.status.as_ref().and_then(|s| s.rollout.clone())
}

/// Waits until the rollout of `bytes` ended in `result` and the leaving version is gone;
/// fails at once when it ended otherwise. Also returns when each step was first seen and when
/// it ended, counted from `pushed` (for BENCHMARKS.md).
async fn outcome(
    e2e: &E2e,
    bytes: &[u8],
    result: &str,
    pushed: Instant,
) -> (RolloutOutcome, Vec<(String, Duration)>) {
    let wanted = digest(bytes);
    let what = format!("the rollout of {wanted} to end in {result}");
    let pipelines = e2e.pipelines.clone();
    let milestones = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, Duration)>::new()));
    let url = e2e.url.clone();
    let last = eventually(ROLLOUT_WAIT, &what, || {
        let pipelines = pipelines.clone();
        let wanted = wanted.clone();
        let milestones = milestones.clone();
        let url = url.clone();
        async move {
            let p = pipelines.get(PIPELINE).await.ok()?;
            let rollout = rollout_of(&p)?;
            if let Some(c) = rollout
                .canary
                .as_ref()
                .filter(|c| c.version.digest == wanted)
            {
                let step = format!("step {} ({} %)", c.step, c.weight);
                let new = {
                    let mut seen = milestones.lock().unwrap();
                    let new = !seen.iter().any(|(s, _)| *s == step);
                    if new {
                        seen.push((step.clone(), pushed.elapsed()));
                    }
                    new
                };
                if new && c.step > 0 {
                    eprintln!(
                        "canary e2e: {step}: previous step's routers: {}",
                        routers(&url).await
                    );
                }
            }
            let mut seen = milestones.lock().unwrap();
            let last = rollout.last.clone()?;
            if last.digest != wanted {
                return None;
            }
            assert_eq!(last.result, result, "the rollout ended otherwise: {last:?}");
            if !seen.iter().any(|(s, _)| s == "ended") {
                seen.push(("ended".to_owned(), pushed.elapsed()));
            }
            (rollout.phase == "Stable").then_some(last)
        }
    })
    .await;
    let mut seen = milestones.lock().unwrap().clone();
    seen.push(("old version retired".to_owned(), pushed.elapsed()));
    eprintln!("canary e2e: {wanted} {result}: {seen:?}");
    (last, seen)
}

/// The routers' counters of their current generation, in a line: requests and p50/p95 per
/// version (for the log of a run).
async fn routers(url: &str) -> String {
    let answer = support::fixture::loopback_http(Duration::from_secs(5))
        .get(format!("{url}/-/raypipe/rollout"))
        .send()
        .await;
    let Ok(answer) = answer else {
        return "unreadable".to_owned();
    };
    let stats: raypipe::serve::rollout::RouterStats =
        serde_json::from_slice(&answer.bytes().await.unwrap_or_default()).unwrap_or_default();
    let line = |name: &str, c: &raypipe::serve::rollout::VersionCounters| {
        format!(
            "{name} {} requests, {} errors, p50 {:?} p95 {:?} ms",
            c.requests,
            c.errors,
            c.percentile_ms(&stats.bounds_ms, 50.0),
            c.percentile_ms(&stats.bounds_ms, 95.0)
        )
    };
    format!(
        "{}; {}",
        line("stable", &stats.stable),
        line("canary", &stats.canary)
    )
}

/// The replica ids of the executor of Serve application `app` on the shared head.
async fn executor_replicas(app: &str) -> BTreeSet<String> {
    let url = format!(
        "{}/api/serve/applications/",
        support::ray_head().dashboard_url().as_str()
    );
    let body = support::fixture::loopback_http(Duration::from_secs(10))
        .get(url)
        .send()
        .await
        .expect("the dashboard answers")
        .bytes()
        .await
        .expect("an answer");
    let details: Value = serde_json::from_slice(&body).expect("JSON");
    details["applications"][app]["deployments"]["raypipe-executor"]["replicas"]
        .as_array()
        .map(|replicas| {
            replicas
                .iter()
                .filter_map(|r| r["replica_id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The applications of a Serve config that are not shared node applications (the router and
/// the version applications).
fn versions_and_router(serve_config: &str) -> usize {
    raypipe::serve::rollout::applications_of(serve_config)
        .values()
        .filter(|app| !raypipe::serve::shared::is_node_application(app))
        .count()
}

async fn stable_application(e2e: &E2e) -> String {
    rollout_of(&e2e.pipeline().await)
        .and_then(|r| r.stable)
        .map(|s| s.application)
        .expect("a stable version")
}

/// Waits until the canary of `bytes` answers at step `step` or later.
async fn canary_at_step(e2e: &E2e, bytes: &[u8], step: i32) -> RolloutStatus {
    let wanted = digest(bytes);
    let pipelines = e2e.pipelines.clone();
    eventually(
        ROLLOUT_WAIT,
        &format!("the canary {wanted} at step {step}"),
        || {
            let pipelines = pipelines.clone();
            let wanted = wanted.clone();
            async move {
                let rollout = rollout_of(&pipelines.get(PIPELINE).await.ok()?)?;
                let canary = rollout.canary.as_ref()?;
                (canary.version.digest == wanted && canary.step >= step).then_some(rollout)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_rollouts_promote_good_versions_and_roll_back_bad_ones_with_no_failed_request() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let policy = json!({"rollout": {
        "strategy": "Canary",
        "steps": [{"weight": 30, "pause": "8s"}, {"weight": 60, "pause": "6s"}],
        "gates": {"minRequests": 8, "maxErrorRate": 0.1},
        "progressDeadline": "240s"
    }});
    let mut e2e = e2e::ready_pipeline_with(head, "canary", policy).await;
    // The operator records the pipeline's history into a local bucket from here on (issue 33):
    // restarted with the recorder, as `raypipe run --record-history` would run.
    let bucket = tempfile::tempdir().expect("a temporary directory");
    let store = history_store(bucket.path());
    e2e.settings.history = Some(raypipe::history::recorder::RecorderConfig {
        store: store.clone(),
        default_retention: Default::default(),
    });
    e2e.operator.take().expect("running").kill().await;
    e2e.start_operator();
    let first = rollout_of(&e2e.pipeline().await).expect("the rollout status");
    assert_eq!(first.phase, "Stable");
    assert_eq!(
        first.stable.as_ref().unwrap().digest,
        digest(&ensemble("1"))
    );
    assert!(first.last.is_none(), "the first graph is not a rollout");

    // Two clients: enough requests per step for the latency percentiles of both versions.
    let client = Client::start(e2e.url.clone());
    let second_client = Client::start(e2e.url.clone());
    let traffic = client.traffic.clone();
    let second_traffic = second_client.traffic.clone();

    // 1. A good version: every step, then promoted; answers come from it.
    let good = ensemble("2");
    e2e.registry.put(GRAPH_PATH, good.clone());
    let (promoted, _) = outcome(&e2e, &good, "Promoted", Instant::now()).await;
    assert_eq!(promoted.reason, "Promoted");
    eventually(e2e::WAIT, "answers from version 2", || {
        let traffic = traffic.clone();
        async move { traffic.first_answer_from("ensemble@2") }
    })
    .await;
    let p = e2e.pipeline().await;
    assert_eq!(condition(&p, "Progressing").unwrap().reason, "Promoted");
    assert_eq!(condition(&p, "RolledBack").unwrap().status, "False");
    assert_eq!(condition(&p, "Ready").unwrap().status, "True");
    assert_eq!(condition(&p, "UpToDate").unwrap().status, "True");
    assert_eq!(health(&p).0, "Healthy");
    assert_eq!(flux_health(&p), "Current", "{:?}", p.status);
    let apps = e2e
        .rayservices
        .get(PIPELINE)
        .await
        .unwrap()
        .spec
        .serve_config_v2
        .unwrap();
    assert_eq!(
        versions_and_router(&apps),
        2,
        "the router and the promoted version only: {apps}"
    );
    let reasons: BTreeSet<String> = support::fixture::events(&e2e.client, &e2e.namespace)
        .await
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    for reason in ["RolloutStarted", "RolloutStep", "RolloutPromoted"] {
        assert!(reasons.contains(reason), "no {reason} Event in {reasons:?}");
    }

    // 2. A model that cannot start: rolled back naming the node, before it took any traffic.
    let broken = ensemble_with_model_a("3", "fail_at_start: true");
    e2e.registry.put(GRAPH_PATH, broken.clone());
    let (rolled_back, _) = outcome(&e2e, &broken, "RolledBack", Instant::now()).await;
    assert_eq!(rolled_back.reason, "DeploymentFailed", "{rolled_back:?}");
    assert_eq!(rolled_back.node.as_deref(), Some("model_a"));
    let p = e2e.pipeline().await;
    let rolled = condition(&p, "RolledBack").unwrap();
    assert_eq!(
        (rolled.status.as_str(), rolled.reason.as_str()),
        ("True", "DeploymentFailed")
    );
    assert!(
        rollout_of(&p)
            .unwrap()
            .failed_digests
            .contains(&digest(&broken))
    );
    // What serves is not the newest graph: Ready stays True, UpToDate and Argo CD say so.
    let current = condition(&p, "UpToDate").unwrap();
    assert_eq!(
        (current.status.as_str(), current.reason.as_str()),
        ("False", "RolledBack")
    );
    assert_eq!(condition(&p, "Ready").unwrap().status, "True");
    assert_eq!(health(&p).0, "Degraded");
    assert_eq!(flux_health(&p), "Failed", "{:?}", p.status);

    // 3. 30 % errors at the first step trip the error-rate gate; the stable version answers
    // the canary's failures.
    let flaky = ensemble_with_model_a("4", "error_share: 0.3");
    e2e.registry.put(GRAPH_PATH, flaky.clone());
    let (rolled_back, _) = outcome(&e2e, &flaky, "RolledBack", Instant::now()).await;
    assert_eq!(rolled_back.reason, "ErrorRate", "{rolled_back:?}");
    let readings = rolled_back
        .readings
        .expect("the readings of the failed step");
    assert!(
        readings.canary_errors >= 1 && readings.retried_on_stable == readings.canary_errors,
        "every canary failure was answered by the stable version: {readings:?}"
    );

    // 4. Slow: 300 ms more per request (several times the graph's own latency here) trips the
    // latency gate (p95 against stable's over the step).
    let slow = ensemble_with_model_a("5", "delay_ms: 300");
    e2e.registry.put(GRAPH_PATH, slow.clone());
    let (rolled_back, _) = outcome(&e2e, &slow, "RolledBack", Instant::now()).await;
    assert_eq!(rolled_back.reason, "Latency", "{rolled_back:?}");

    // 5. The registry goes back to the stable graph mid-rollout: aborted, and the stable
    // version keeps its replicas (it was never restarted).
    let stable_app = stable_application(&e2e).await;
    let replicas = executor_replicas(&stable_app).await;
    assert!(!replicas.is_empty(), "the stable executor has replicas");
    let next = ensemble("6");
    e2e.registry.put(GRAPH_PATH, next.clone());
    canary_at_step(&e2e, &next, 1).await;
    let p = e2e.pipeline().await;
    assert_eq!(
        condition(&p, "UpToDate").unwrap().reason,
        "RolloutInProgress"
    );
    assert_eq!(health(&p).0, "Progressing");
    assert_eq!(flux_health(&p), "InProgress", "{:?}", p.status);
    e2e.registry.put(GRAPH_PATH, good.clone());
    let (aborted, _) = outcome(&e2e, &next, "Aborted", Instant::now()).await;
    assert_eq!(aborted.reason, "Reverted");
    assert_eq!(stable_application(&e2e).await, stable_app);
    assert_eq!(executor_replicas(&stable_app).await, replicas);
    // Each rollout that ended so far is counted once, by result: what the chart's rollback
    // alert reads (the first graph was no rollout).
    let text = e2e.metrics.encode().expect("the metrics encode");
    for (result, count) in [("Promoted", 1.0), ("RolledBack", 3.0), ("Aborted", 1.0)] {
        let series = format!("raypipe_pipeline_rollouts_total{{result=\"{result}\"}}");
        assert_eq!(
            crate::admin::sample(&text, &series),
            Some(count),
            "{series} in\n{text}"
        );
    }

    // 6. Three pushes within ten seconds: one canary at a time, and the newest wins.
    let pushes = [ensemble("7"), ensemble("8"), ensemble("9")];
    for bytes in &pushes {
        e2e.registry.put(GRAPH_PATH, bytes.clone());
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    outcome(&e2e, &pushes[2], "Promoted", Instant::now()).await;
    let rs = e2e.rayservices.get(PIPELINE).await.unwrap();
    assert_eq!(
        versions_and_router(rs.spec.serve_config_v2.as_deref().unwrap()),
        2
    );

    // 7. The operator is killed mid-rollout and a new one resumes at the same step.
    let resumed = ensemble("10");
    e2e.registry.put(GRAPH_PATH, resumed.clone());
    let before = canary_at_step(&e2e, &resumed, 1).await;
    e2e.operator.take().expect("running").kill().await;
    e2e.start_operator();
    let after = canary_at_step(&e2e, &resumed, 1).await;
    let (b, a) = (before.canary.unwrap(), after.canary.unwrap());
    assert_eq!(a.started_at, b.started_at, "the rollout was not restarted");
    assert!(a.step >= b.step);
    // Steered with `kubectl raypipe`: paused, it holds its step past the step's 8 s; promoted
    // by command, it skips what is left. Every verb ran as the plugin binary.
    let ns = e2e.namespace.clone();
    let paused = crate::plugin::kubectl_raypipe(&ns, &["rollout", "pause", PIPELINE]).await;
    assert!(paused.ok, "{paused:?}");
    let held = eventually(e2e::WAIT, "the canary held", || {
        let pipelines = e2e.pipelines.clone();
        async move {
            let canary = rollout_of(&pipelines.get(PIPELINE).await.ok()?)?.canary?;
            canary.paused_at.is_some().then_some(canary)
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(9)).await;
    let still = rollout_of(&e2e.pipeline().await).unwrap().canary.unwrap();
    assert_eq!((still.step, still.weight), (held.step, held.weight), "held");
    let status = crate::plugin::kubectl_raypipe(
        &ns,
        &["rollout", "status", PIPELINE, "--watch=false", "-o", "json"],
    )
    .await
    .json();
    assert_eq!(status["canary"]["paused"], true);
    assert_eq!(status["canary"]["digest"], digest(&resumed));
    let drawn = crate::plugin::kubectl_raypipe(
        &ns,
        &["graph", PIPELINE, "--version", "canary", "-o", "json"],
    )
    .await
    .json();
    assert!(
        drawn["nodeStatus"]
            .as_object()
            .is_some_and(|s| s.values().any(|v| v == "HEALTHY")),
        "Serve's node statuses: {drawn}"
    );
    let promoted = crate::plugin::kubectl_raypipe(&ns, &["rollout", "promote", PIPELINE]).await;
    assert!(promoted.ok, "{promoted:?}");
    let (by_command, _) = outcome(&e2e, &resumed, "Promoted", Instant::now()).await;
    assert_eq!(by_command.reason, "PromotedByCommand", "{by_command:?}");
    let resumed_ok = crate::plugin::kubectl_raypipe(&ns, &["rollout", "resume", PIPELINE]).await;
    assert!(resumed_ok.ok, "{resumed_ok:?}");
    let done =
        crate::plugin::kubectl_raypipe(&ns, &["rollout", "status", PIPELINE, "--timeout", "60s"])
            .await;
    assert!(done.ok, "a promoted rollout is done: {done:?}");

    let (ok, failed) = client.stop().await;
    let (ok2, failed2) = second_client.stop().await;
    eprintln!(
        "canary e2e: {} answers, {} failures",
        ok + ok2,
        failed + failed2
    );
    assert_eq!(failed, 0, "failures: {:?}", traffic.failures());
    assert_eq!(failed2, 0, "failures: {:?}", second_traffic.failures());
    assert!(
        ok > 100 && ok2 > 100,
        "the clients kept sending ({ok}, {ok2} answers)"
    );

    // 8. The history: every rollout above can be read back from the bucket, after the canaries'
    // replicas are gone, and retention kept the newest 8 revisions.
    the_history_tells_every_rollout(&e2e, &store, &[&good, &broken, &flaky, &resumed]).await;
}

fn history_store(dir: &std::path::Path) -> raypipe::history::revisions::RevisionStore {
    let env = [
        ("STORAGE_BACKEND", "local".to_owned()),
        ("RAYPIPE_HISTORY_LOCAL_DIR", dir.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    raypipe::history::revisions::RevisionStore::from_env(&env).expect("a local store")
}

async fn the_history_tells_every_rollout(
    e2e: &E2e,
    store: &raypipe::history::revisions::RevisionStore,
    [good, broken, flaky, resumed]: &[&Vec<u8>; 4],
) {
    use raypipe::history::revisions::Happening;
    // The recorder writes within a second of a change.
    let index = eventually(
        Duration::from_secs(30),
        "the history of the last promotion",
        || async {
            let index = store.index(&e2e.namespace, PIPELINE).await.ok()??;
            let newest = index
                .revisions
                .iter()
                .find(|r| r.digest == digest(resumed))?;
            newest.outcome.as_ref()?;
            Some(index)
        },
    )
    .await;
    let summary = |bytes: &[u8]| index.revisions.iter().find(|r| r.digest == digest(bytes));
    // Every version pushed has a revision (7 and 8 may have been superseded before a fetch).
    for version in ["1", "2", "3", "4", "5", "6", "9", "10"] {
        let bytes = match version {
            "3" => broken.to_vec(),
            "4" => flaky.to_vec(),
            "5" => ensemble_with_model_a("5", "delay_ms: 300"),
            _ => ensemble(version),
        };
        let found = summary(&bytes)
            .unwrap_or_else(|| panic!("no revision of version {version}: {index:#?}"));
        assert_eq!(found.version.as_deref(), Some(version));
    }

    // The promoted version 10 serves as stable now; its summary says how it got there.
    let newest = summary(resumed).expect("version 10");
    assert_eq!(newest.outcome.as_ref().unwrap().result, "Promoted");
    assert!(
        newest
            .served
            .iter()
            .any(|s| s.role == "stable" && s.until.is_none()),
        "{newest:?}"
    );
    assert!(
        newest
            .served
            .iter()
            .any(|s| s.role == "canary" && s.until.is_some()),
        "{newest:?}"
    );
    let serving_now = raypipe::history::revisions::serving_at(&index, &jiff::Timestamp::now());
    assert_eq!(
        serving_now
            .iter()
            .map(|(r, _)| r.digest.clone())
            .collect::<Vec<_>>(),
        vec![digest(resumed)]
    );

    // Version 3 could not start: rolled back naming model_a, never served.
    let broken_summary = summary(broken).expect("version 3");
    let outcome = broken_summary.outcome.as_ref().unwrap();
    assert_eq!(
        (
            outcome.result.as_str(),
            outcome.reason.as_str(),
            outcome.node.as_deref()
        ),
        ("RolledBack", "DeploymentFailed", Some("model_a"))
    );
    assert!(broken_summary.served.is_empty(), "{broken_summary:?}");
    let record = store
        .revision(&e2e.namespace, PIPELINE, &broken_summary.id)
        .await
        .unwrap()
        .expect("its record");
    assert!(
        record.timeline.iter().any(
            |e| matches!(&e.what, Happening::Decision { node: Some(node), .. } if node == "model_a")
        ),
        "{:#?}",
        record.timeline
    );

    // Version 4 failed the error-rate gate at its first step: its record has the step, the
    // readings the decision was taken on, and the time it served as a canary.
    let flaky_summary = summary(flaky).expect("version 4");
    assert_eq!(flaky_summary.outcome.as_ref().unwrap().reason, "ErrorRate");
    let canary_span = flaky_summary
        .served
        .iter()
        .find(|s| s.role == "canary")
        .expect("it served as a canary");
    assert!(canary_span.until.is_some());
    let record = store
        .revision(&e2e.namespace, PIPELINE, &flaky_summary.id)
        .await
        .unwrap()
        .expect("its record");
    assert_eq!(record.digest, digest(flaky));
    assert_eq!(record.version.as_deref(), Some("4"));
    let steps: Vec<i32> = record
        .timeline
        .iter()
        .filter_map(|e| match &e.what {
            Happening::Step { step, .. } => Some(*step),
            _ => None,
        })
        .collect();
    assert!(steps.contains(&1), "{:#?}", record.timeline);
    let decision = record
        .timeline
        .iter()
        .find_map(|e| match &e.what {
            Happening::Decision {
                result,
                reason,
                readings,
                ..
            } => Some((result.clone(), reason.clone(), readings.clone())),
            _ => None,
        })
        .expect("the decision");
    assert_eq!(
        (decision.0.as_str(), decision.1.as_str()),
        ("RolledBack", "ErrorRate")
    );
    assert!(
        decision.2.is_some_and(|r| r.canary_errors >= 1),
        "the readings it was judged on"
    );
    let config = record
        .serve_config
        .as_ref()
        .expect("the Serve config it went live with");
    assert!(
        config["applications"]
            .as_array()
            .is_some_and(|apps| apps.len() >= 2),
        "{config}"
    );
    assert!(
        !record.ray_clusters.is_empty(),
        "the clusters that served it"
    );
    // Its replicas are gone: the canary's application left Serve when it was rolled back.
    let rs = e2e.rayservices.get(PIPELINE).await.unwrap();
    let live = rs.spec.serve_config_v2.unwrap_or_default();
    let flaky_app = record.timeline.iter().find_map(|e| match &e.what {
        Happening::Application { application, .. } => Some(application.clone()),
        _ => None,
    });
    if let Some(app) = flaky_app {
        assert!(
            !live.contains(&format!("name: {app}\n")),
            "{app} still in {live}"
        );
    }

    // Version 2 was promoted, then served as stable until a later version replaced it.
    let good_summary = summary(good).expect("version 2");
    assert!(
        good_summary
            .served
            .iter()
            .any(|s| s.role == "stable" && s.until.is_some()),
        "{good_summary:?}"
    );

    // Retention: keep 3. The newest three stay (10 serves); the rest go, records included.
    let before = index.revisions.len();
    e2e.pipelines
        .patch(
            PIPELINE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"history": {"keepRevisions": 3}}})),
        )
        .await
        .expect("patched");
    let index = eventually(
        Duration::from_secs(60),
        "retention to keep 3 revisions",
        || async {
            let index = store.index(&e2e.namespace, PIPELINE).await.ok()??;
            (index.revisions.len() == 3).then_some(index)
        },
    )
    .await;
    assert_eq!(index.removed as usize, before - 3);
    let newest_seq = index.next_seq - 1;
    assert_eq!(
        index.revisions.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![newest_seq - 2, newest_seq - 1, newest_seq]
    );
    assert!(index.revisions.iter().any(|r| r.digest == digest(resumed)));
    assert!(
        store
            .revision(&e2e.namespace, PIPELINE, &flaky_summary.id)
            .await
            .unwrap()
            .is_none(),
        "a removed revision's record is gone"
    );

    // The pipeline deleted: its history stays, every span closed.
    e2e.pipelines
        .delete(PIPELINE, &Default::default())
        .await
        .expect("deleted");
    let index = eventually(
        Duration::from_secs(60),
        "the deletion in the history",
        || async {
            let index = store.index(&e2e.namespace, PIPELINE).await.ok()??;
            index.deleted_at.is_some().then_some(index)
        },
    )
    .await;
    assert!(
        index
            .revisions
            .iter()
            .all(|r| r.served.iter().all(|s| s.until.is_some())),
        "{index:?}"
    );
}
