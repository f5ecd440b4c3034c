//! `raypipe dag diff` as a person runs it (the built binary on two graph files), and its plan
//! checked against a real Ray (2.60, on 127.0.0.1): a change the plan calls in place, with the
//! runtime's `args` untouched, keeps every replica; a change of what the executor reads changes
//! `args`, and Ray restarts every replica, as the plan's `restartsAllReplicas` says.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use raypipe::devenv::ray::RayHead;
use raypipe::graph::diff::{Change, GraphDiff, diff};
use raypipe::graph::proto::{self, DeploymentOptions, JsonObject, JsonValue, PipelineGraph};
use raypipe::ray::{ApplicationStatus, RayDashboardClient, ReplicaState, ServeInstanceDetails};
use raypipe::serve::{ProxyLocation, RenderOptions};
use serde_json::{Value, json};

use crate::support;

/// Build and replica start-up of a small application (runtime and models from zips), or a
/// rolling restart of all of it, on a machine busy with other tests.
const DEPLOY_TIMEOUT: Duration = Duration::from_secs(240);

fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples/graphs")
        .join(name)
}

fn raypipe(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_raypipe"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("raypipe runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn dag_diff_prints_the_plan_of_two_graph_files() {
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read_to_string(sample("ensemble.yaml")).unwrap();
    let edited = original
        .replace("max_replicas: 4", "max_replicas: 6")
        .replace("label: b", "label: b2")
        .replace(
            "{source: model_b, target: combine, into: /b, optional: true}",
            "{source: model_b, target: combine, into: /b}",
        );
    let new = dir.path().join("ensemble-v2.yaml");
    std::fs::write(&new, edited).unwrap();
    let old = sample("ensemble.pb");
    let (old, new) = (old.to_str().unwrap(), new.to_str().unwrap());

    // The operator's default layout, shared node applications: the edge's `optional` is
    // wiring, applied in place; only model_b's application (and, for a canary, its executor)
    // starts.
    let (code, out, err) = raypipe(&["dag", "diff", old, new]);
    assert_eq!(code, 0, "{err}");
    let expected = "\
4 unchanged, 1 in place, 1 restarted, 0 added, 0 removed, 1 routing change, 0 graph changes
starts: 1 replica with strategy Immediate, 2 replicas with Canary

NODE        KIND    CHANGE     FIELDS
combine     model   unchanged  -
model_a     model   in place   model.deployment.autoscaling_config
model_b     model   restarted  model.init_kwargs
preprocess  model   unchanged  -
request     input   unchanged  -
response    output  unchanged  -

routing:
  edge model_b -> combine: optional true -> false
";
    assert_eq!(out, expected);

    let (code, out, err) = raypipe(&["dag", "diff", "--output", "json", old, new]);
    assert_eq!(code, 0, "{err}");
    let plan: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["restartsAllReplicas"], false);
    assert_eq!(plan["sharedNodes"], true);
    assert_eq!(plan["nodes"][1]["change"], "inPlace");
    assert_eq!(plan["starts"]["immediate"]["replicas"], 1);
    assert_eq!(plan["starts"]["canary"]["replicas"], 2);

    // The inline layout (`--node-layout inline`): the edge's `optional` is wiring in the one
    // application's args, so everything restarts.
    let (code, out, err) = raypipe(&["dag", "diff", "--node-layout", "inline", old, new]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("starts: 5 replicas with strategy Immediate, 5 replicas with Canary\n"),
        "{out}"
    );
    assert!(out.contains("\nnote: "), "{out}");
    let (code, out, err) = raypipe(&[
        "dag",
        "diff",
        "--node-layout",
        "inline",
        "--output",
        "json",
        old,
        new,
    ]);
    assert_eq!(code, 0, "{err}");
    let plan: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["restartsAllReplicas"], true);
    assert_eq!(plan["starts"]["immediate"]["replicas"], 5);
    assert_eq!(plan["starts"]["canary"]["replicas"], 5);

    let (code, out, _) = raypipe(&["dag", "diff", old, old]);
    assert_eq!((code, out.as_str()), (0, "no changes\n"));
    let (code, _, err) = raypipe(&["dag", "diff", old, "/nonexistent.yaml"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read /nonexistent.yaml"), "{err}");
}

fn json_value(value: Value) -> JsonValue {
    serde_json::from_value(value).expect("a JSON value")
}

fn classify_options(graph: &mut PipelineGraph) -> &mut DeploymentOptions {
    let node = graph
        .nodes
        .iter_mut()
        .find(|n| n.name == "classify")
        .unwrap();
    let Some(proto::node::Kind::Model(model)) = &mut node.kind else {
        panic!("classify is a model node")
    };
    model.deployment.get_or_insert_with(Default::default)
}

/// Ids of the running replicas per deployment of `app`.
type Replicas = BTreeMap<String, BTreeSet<String>>;

fn replicas(details: &ServeInstanceDetails, app: &str) -> Replicas {
    details.applications[app]
        .deployments
        .iter()
        .map(|(name, deployment)| {
            let ids = deployment
                .replicas
                .iter()
                .filter(|r| r.state == Some(ReplicaState::Running))
                .filter_map(|r| r.replica_id.clone())
                .collect();
            (name.clone(), ids)
        })
        .collect()
}

/// The Serve config of a graph, as the dashboard takes it.
fn render(graph: &PipelineGraph, options: &RenderOptions) -> Value {
    let valid = raypipe::graph::validate(graph.clone()).expect("a valid graph");
    let config = raypipe::serve::render(&valid, options).expect("the graph renders");
    serde_json::from_str(&config.to_json()).unwrap()
}

fn args(graph: &PipelineGraph, options: &RenderOptions) -> Value {
    render(graph, options)["applications"][0]["args"].take()
}

/// How many of each deployment's replicas in `before` are still running in `after`.
fn still_running(before: &Replicas, after: &Replicas) -> BTreeMap<String, usize> {
    before
        .iter()
        .map(|(deployment, ids)| {
            let kept = after
                .get(deployment)
                .map_or(0, |now| ids.intersection(now).count());
            (deployment.clone(), kept)
        })
        .collect()
}

/// PUTs the rendered graph and waits until Ray has taken it (a new deployment time) and the
/// application is RUNNING again with the expected number of replicas.
async fn deploy(
    client: &RayDashboardClient,
    graph: &PipelineGraph,
    options: &RenderOptions,
    replica_count: usize,
) -> ServeInstanceDetails {
    let app = options.application_name.clone().unwrap();
    let before = client
        .get_serve_applications()
        .await
        .ok()
        .and_then(|d| d.applications.get(&app)?.last_deployed_time_s);
    let body = render(graph, options);
    client
        .put_serve_applications(&body)
        .await
        .expect("PUT the Serve config");
    support::eventually(
        DEPLOY_TIMEOUT,
        "the application to run the new config",
        || async {
            let details = client.get_serve_applications().await.ok()?;
            let application = details.applications.get(&app)?;
            let running = application.status == Some(ApplicationStatus::Running);
            let taken = application.last_deployed_time_s != before;
            let count: usize = replicas(&details, &app).values().map(BTreeSet::len).sum();
            (running && taken && count == replica_count).then_some(details)
        },
    )
    .await
}

async fn classify(head: &RayHead, positive: bool) -> Value {
    support::fixture::serve_post(
        head,
        "/plan/x",
        r#"{"text": "i love this"}"#,
        Duration::from_secs(120),
        |answer| answer["positive"] == positive,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_changes_keep_every_replica_and_args_changes_restart_them() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let client = head
        .client(Duration::from_secs(60))
        .expect("a dashboard client");
    let started = Instant::now();
    let options = RenderOptions {
        application_name: Some("plan".to_string()),
        route_prefix: Some("/plan".to_string()),
        runtime_py_modules: raypipe::cli::dev::serve_packages(raypipe::cli::dev::dev_packages())
            .await
            .expect("the runtime and sample models served"),
        http_host: Some("127.0.0.1".to_string()),
        http_port: Some(head.ports().serve_http),
        proxy_location: Some(ProxyLocation::HeadOnly),
        ..Default::default()
    };
    let v1 = raypipe::graph::from_yaml(&std::fs::read_to_string(sample("sequence.yaml")).unwrap())
        .unwrap();
    // preprocess, classify and the executor: one replica each.
    let details = deploy(&client, &v1, &options, 3).await;
    let before = replicas(&details, "plan");
    // "i love this" scores 0.6667: positive at the sample's threshold of 0.5.
    let answer = classify(head, true).await;
    assert_eq!(answer["label"], "stable", "{answer}");

    // Only what Serve applies to running replicas: a live user_config and request cap, one
    // more preprocess replica, and executor options.
    let mut v2 = v1.clone();
    let options_of_classify = classify_options(&mut v2);
    options_of_classify.user_config = Some(JsonObject {
        fields: [("threshold".to_string(), json_value(json!(0.9)))].into(),
    });
    options_of_classify.max_ongoing_requests = Some(12);
    let preprocess = v2
        .nodes
        .iter_mut()
        .find(|n| n.name == "preprocess")
        .unwrap();
    if let Some(proto::node::Kind::Model(model)) = &mut preprocess.kind {
        model
            .deployment
            .get_or_insert_with(Default::default)
            .num_replicas = Some(2);
    }
    v2.executor
        .get_or_insert_with(Default::default)
        .graceful_shutdown_timeout_s = Some(5.0);
    let plan: GraphDiff = diff(&v1, &v2);
    assert!(!plan.restarts_all_replicas, "{plan}");
    assert_eq!(plan.count(Change::InPlace), 2, "{plan}");
    assert_eq!(plan.count(Change::Restarted), 0, "{plan}");
    assert_eq!(args(&v1, &options), args(&v2, &options));

    let details = deploy(&client, &v2, &options, 4).await;
    let after = replicas(&details, "plan");
    let counts: BTreeMap<String, usize> = before
        .iter()
        .map(|(d, ids)| (d.clone(), ids.len()))
        .collect();
    assert_eq!(
        still_running(&before, &after),
        counts,
        "every replica should survive an in-place change: {before:?} before, {after:?} after"
    );
    // The same classify replica now judges with the new threshold.
    classify(head, false).await;

    // A field only the executor reads changes the wiring in `args`: Ray gives every
    // deployment a new code version and replaces every replica, as the plan warns.
    let mut v3 = v2.clone();
    let node = v3.nodes.iter_mut().find(|n| n.name == "classify").unwrap();
    node.timeout_ms = 4000;
    let plan = diff(&v2, &v3);
    assert!(plan.restarts_all_replicas, "{plan}");
    assert_eq!(plan.count(Change::InPlace), 1, "{plan}");
    assert_ne!(args(&v2, &options), args(&v3, &options));
    let details = deploy(&client, &v3, &options, 4).await;
    let restarted = replicas(&details, "plan");
    assert!(
        still_running(&after, &restarted)
            .values()
            .all(|kept| *kept == 0),
        "every replica should be replaced after an args change: {after:?} before, {restarted:?} after"
    );
    classify(head, false).await;
    eprintln!(
        "graph diff on Ray: three graph versions deployed in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    client
        .delete_serve_applications()
        .await
        .expect("DELETE serve applications");
}
