//! `kubectl raypipe` against a real API server: the binary run under the plugin's name, on a
//! canary pipeline the ServePipeline controller drives from a registry on 127.0.0.1 (no Ray:
//! a canary waits at step 0, where abort and retry act; promote on a running canary is in
//! `rollout::canary_…`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use prost::Message;
use raypipe::api::servepipeline::{ROLLOUT_COMMAND_ANNOTATION, ServePipeline};
use raypipe::controllers::servepipeline::{self, Config};
use raypipe::devenv::registry::{Registry, sha256_hex};
use serde_json::{Value, json};

use crate::support::{self, eventually, fixture};

const WAIT: Duration = Duration::from_secs(30);

/// `kubectl-raypipe`: a symlink to the built `raypipe`, so the binary sees the plugin's name.
pub fn plugin_binary() -> &'static Path {
    static LINK: OnceLock<PathBuf> = OnceLock::new();
    LINK.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("raypipe-plugin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the plugin link");
        let link = dir.join("kubectl-raypipe");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_raypipe"), &link).expect("the link");
        link
    })
}

/// What one run of the plugin printed, and whether it succeeded.
#[derive(Debug)]
pub struct Ran {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("JSON from the plugin ({e}): {self:?}"))
    }
}

/// Runs `kubectl raypipe <args>` against the test plane in namespace `ns`.
pub async fn kubectl_raypipe(ns: &str, args: &[&str]) -> Ran {
    kubectl_raypipe_on(&support::control_plane().kubeconfig, ns, args).await
}

/// Runs `kubectl raypipe <args>` with `kubeconfig` in namespace `ns`.
pub async fn kubectl_raypipe_on(kubeconfig: &Path, ns: &str, args: &[&str]) -> Ran {
    let output = tokio::process::Command::new(plugin_binary())
        .args(args)
        .args(["-n", ns])
        .env("KUBECONFIG", kubeconfig)
        .env_remove("RUST_LOG")
        .output()
        .await
        .expect("the plugin runs");
    Ran {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn sample_graph(version: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/graphs/sequence.pb");
    let mut graph = raypipe::graph::decode(&std::fs::read(path).expect("the sample")).unwrap();
    graph.version = version.to_owned();
    graph.encode_to_vec()
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

async fn wait_for(
    api: &Api<ServePipeline>,
    what: &str,
    accept: impl Fn(&ServePipeline) -> bool,
) -> ServePipeline {
    eventually(WAIT, what, || {
        let accept = &accept;
        async move { api.get("demo").await.ok().filter(|p| accept(p)) }
    })
    .await
}

fn canary_digest(p: &ServePipeline) -> Option<String> {
    Some(
        p.status
            .as_ref()?
            .rollout
            .as_ref()?
            .canary
            .as_ref()?
            .version
            .digest
            .clone(),
    )
}

#[tokio::test]
async fn the_plugin_lists_draws_and_steers_a_canary_pipeline() {
    support::capture_logs();
    let client = support::client().await;
    let ns = support::namespace(&client, "plugin").await;
    let registry = Registry::start("plugin-token").await;
    let v1 = sample_graph("v1");
    registry.put("graphs/pipeline.pb", v1.clone());
    fixture::put_token_secret(&client, &ns, "registry-token", "plugin-token").await;
    let mut stop = fixture::Stopper::default();
    let config = Config {
        namespace: Some(ns.clone()),
        fetcher: support::loopback_fetcher(),
        ..Default::default()
    };
    tokio::spawn(servepipeline::run(client.clone(), config, stop.signal()));
    let mut pipeline = fixture::servepipeline(
        "demo",
        fixture::token_source(
            &registry.url("graphs/pipeline.pb"),
            json!({"refreshInterval": "1s"}),
        ),
    );
    pipeline.spec.rollout = Some(
        serde_json::from_value(json!({"strategy": "Canary", "progressDeadline": "10m"})).unwrap(),
    );
    let api: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &pipeline).await.unwrap();
    wait_for(&api, "v1 stable", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.rollout.as_ref())
            .and_then(|r| r.stable.as_ref())
            .is_some_and(|s| s.digest == digest(&v1))
    })
    .await;

    // get: a table for people, the summary for programs.
    let table = kubectl_raypipe(&ns, &["get"]).await;
    assert!(table.ok, "{table:?}");
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{table:?}");
    assert!(
        lines[1].starts_with("demo") && lines[1].contains("v1 ("),
        "{table:?}"
    );
    let one = kubectl_raypipe(&ns, &["get", "demo", "-o", "json"])
        .await
        .json();
    assert_eq!(one["serving"]["digest"], digest(&v1));
    assert_eq!(one["strategy"], "Canary");
    let yaml = kubectl_raypipe(&ns, &["get", "-o", "yaml"]).await;
    let listed: Value = serde_yaml::from_str(&yaml.stdout).expect("YAML");
    assert_eq!(listed["items"][0]["name"], "demo");
    let missing = kubectl_raypipe(&ns, &["get", "nothing"]).await;
    assert!(!missing.ok);
    assert!(
        missing
            .stderr
            .contains("ServePipeline \"nothing\" not found"),
        "{missing:?}"
    );

    // graph: read back from the RayService as it runs (shared nodes: the wiring is in the
    // executor's user_config).
    let drawn = kubectl_raypipe(&ns, &["graph", "demo"]).await;
    assert!(drawn.ok, "{drawn:?}");
    for node in ["preprocess", "classify"] {
        assert!(drawn.stdout.contains(node), "{node} in {}", drawn.stdout);
    }
    let svg = kubectl_raypipe(&ns, &["graph", "demo", "--format", "svg"]).await;
    assert!(
        svg.stdout.starts_with("<svg") && svg.stdout.contains("data-node=\"classify\""),
        "{svg:?}"
    );
    let as_json = kubectl_raypipe(&ns, &["graph", "demo", "-o", "json"])
        .await
        .json();
    assert_eq!(as_json["digest"], digest(&v1));
    assert!(
        as_json["graph"]["nodes"]
            .as_array()
            .is_some_and(|n| n.len() >= 2),
        "{as_json}"
    );
    let no_canary = kubectl_raypipe(&ns, &["rollout", "promote", "demo"]).await;
    assert!(
        !no_canary.ok && no_canary.stderr.contains("no canary in progress"),
        "{no_canary:?}"
    );

    // A new version: its canary starts and waits at step 0 (nothing runs it here).
    let v2 = sample_graph("v2");
    registry.put("graphs/pipeline.pb", v2.clone());
    wait_for(&api, "the v2 canary", |p| {
        canary_digest(p) == Some(digest(&v2))
    })
    .await;
    let row = kubectl_raypipe(&ns, &["get"]).await;
    assert!(
        row.stdout.contains("v2 (") && row.stdout.contains("0/2 0%"),
        "{row:?}"
    );
    let canary_graph =
        kubectl_raypipe(&ns, &["graph", "demo", "--version", "canary", "-o", "json"])
            .await
            .json();
    assert_eq!(canary_graph["digest"], digest(&v2));
    // Status without waiting, and a wait that gives up.
    let once = kubectl_raypipe(&ns, &["rollout", "status", "demo", "--watch=false"]).await;
    assert!(once.ok && once.stdout.contains("step 0 of 2"), "{once:?}");
    let gave_up = kubectl_raypipe(&ns, &["rollout", "status", "demo", "--timeout", "2s"]).await;
    assert!(
        !gave_up.ok && gave_up.stderr.contains("did not end within 2s"),
        "{gave_up:?}"
    );

    // pause: the spec says so, the canary is marked held.
    let paused = kubectl_raypipe(&ns, &["rollout", "pause", "demo"]).await;
    assert!(
        paused.ok && paused.stdout.contains("holds at step 0"),
        "{paused:?}"
    );
    let p = wait_for(&api, "the canary held", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.rollout.as_ref())
            .and_then(|r| r.canary.as_ref())
            .is_some_and(|c| c.paused_at.is_some())
    })
    .await;
    assert_eq!(p.spec.rollout.as_ref().unwrap().paused, Some(true));
    let row = kubectl_raypipe(&ns, &["get", "demo", "-o", "json"])
        .await
        .json();
    assert_eq!(row["canary"]["paused"], true);

    // abort: by the digest it saw; the wait that started before ends with exit 1.
    let watching = tokio::spawn({
        let ns = ns.clone();
        async move { kubectl_raypipe(&ns, &["rollout", "status", "demo", "--timeout", "60s"]).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let aborted = kubectl_raypipe(&ns, &["rollout", "abort", "demo"]).await;
    assert!(aborted.ok, "{aborted:?}");
    let p = wait_for(&api, "the canary aborted", |p| canary_digest(p).is_none()).await;
    let rollout = p.status.clone().unwrap().rollout.unwrap();
    let last = rollout.last.clone().unwrap();
    assert_eq!(
        (last.result.as_str(), last.reason.as_str()),
        ("Aborted", "AbortedByCommand")
    );
    assert_eq!(rollout.failed_digests, vec![digest(&v2)]);
    assert_eq!(
        rollout.stable.unwrap().digest,
        digest(&v1),
        "v1 still serves"
    );
    let watched = watching.await.unwrap();
    assert!(
        !watched.ok && watched.stderr.contains("Aborted (AbortedByCommand)"),
        "{watched:?}"
    );
    // The command is consumed once carried out.
    wait_for(&api, "the command annotation removed", |p| {
        !p.annotations().contains_key(ROLLOUT_COMMAND_ANNOTATION)
    })
    .await;
    // The registry still serves v2: it is not tried again on its own.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(canary_digest(&api.get("demo").await.unwrap()), None);

    // retry: the remembered digest starts again, held at step 0 while paused.
    let retried = kubectl_raypipe(&ns, &["rollout", "retry", "demo"]).await;
    assert!(retried.ok, "{retried:?}");
    wait_for(&api, "the v2 canary again", |p| {
        canary_digest(p) == Some(digest(&v2))
    })
    .await;
    let resumed = kubectl_raypipe(&ns, &["rollout", "resume", "demo"]).await;
    assert!(resumed.ok, "{resumed:?}");
    wait_for(&api, "the canary released", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.rollout.as_ref())
            .and_then(|r| r.canary.as_ref())
            .is_some_and(|c| c.paused_at.is_none())
    })
    .await;

    // A hand-written command that is wrong is refused in an Event and removed.
    let patch = json!({"metadata": {"annotations": {ROLLOUT_COMMAND_ANNOTATION: "launch now"}}});
    api.patch(
        "demo",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    wait_for(&api, "the bad command removed", |p| {
        !p.annotations().contains_key(ROLLOUT_COMMAND_ANNOTATION)
    })
    .await;

    // Every request and every reaction is an Event; the requests name the caller. Events are
    // posted beside the work, so on a loaded machine they may trail it: up to EVENTS_WAIT, and
    // a timeout names the reasons still missing.
    const EVENTS_WAIT: Duration = Duration::from_secs(90);
    let wanted = [
        "RolloutPauseRequested",
        "RolloutPaused",
        "RolloutAbortRequested",
        "RolloutAborted",
        "RolloutRetryRequested",
        "RolloutRetry",
        "RolloutResumeRequested",
        "RolloutResumed",
        "RolloutCommandInvalid",
    ];
    let deadline = std::time::Instant::now() + EVENTS_WAIT;
    let events = loop {
        let events = fixture::events(&client, &ns).await;
        let reasons: Vec<String> = events.iter().filter_map(|e| e.reason.clone()).collect();
        let missing: Vec<&str> = wanted
            .iter()
            .copied()
            .filter(|r| !reasons.iter().any(|have| have == r))
            .collect();
        if missing.is_empty() {
            break events;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after {EVENTS_WAIT:?} the rollout Events {missing:?} are missing; seen: {reasons:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let requested = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("RolloutAbortRequested"))
        .unwrap();
    let note = requested.message.clone().unwrap_or_default();
    assert!(
        note.contains(&format!("abort of {} requested by ", digest(&v2))),
        "{note}"
    );
    assert!(
        !note.contains("an unknown user"),
        "the API server named the caller: {note}"
    );
    drop(stop);
}

/// `session` and `logs` on a plane whose kwok serves port-forwards: the serving cluster's head
/// Pod forwards 8265 and 8000 to the real Ray head on 127.0.0.1, so the plugin reaches Ray
/// through the API server as it would on a real cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_and_logs_reach_the_serving_clusters_ray_through_the_api_server() {
    use crate::support::{e2e, kwok};
    use tokio::io::{AsyncBufReadExt, BufReader};

    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let client = kwok::kwok_server_client().await;
    let kubeconfig = kwok::kwok_server_plane().kubeconfig.clone();
    let ns = support::namespace(&client, "plugin-session").await;
    let e2e = e2e::ready_pipeline_in(
        client.clone(),
        head,
        ns.clone(),
        json!({}),
        json!({}),
        Default::default(),
    )
    .await;
    let rs = e2e.rayservices.get(e2e::PIPELINE).await.unwrap();
    let cluster = rs
        .status
        .and_then(|s| s.active_service_status)
        .and_then(|s| s.ray_cluster_name)
        .expect("a serving cluster");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let head_pod = pods
        .list(
            &kube::api::ListParams::default()
                .labels(&format!("ray.io/cluster={cluster},ray.io/node-type=head")),
        )
        .await
        .unwrap()
        .items
        .remove(0)
        .name_any();
    let ports = head.ports();
    kwok::forward_pod_port(&client, &ns, &head_pod, 8265, ports.dashboard).await;
    kwok::forward_pod_port(&client, &ns, &head_pod, 8000, ports.serve_http).await;

    // session: any free local ports; the dashboard and the pipeline answer through them.
    let mut session = tokio::process::Command::new(plugin_binary())
        .args([
            "session",
            e2e::PIPELINE,
            "--dashboard-port",
            "0",
            "--serve-port",
            "0",
            "-n",
            &ns,
        ])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the session starts");
    let mut lines = BufReader::new(session.stdout.take().unwrap()).lines();
    let address = |prefix: &str, line: Option<String>| -> String {
        let line = line.unwrap_or_else(|| panic!("a {prefix} line from the session"));
        line.strip_prefix(prefix)
            .unwrap_or_else(|| panic!("{line:?} starts with {prefix:?}"))
            .trim()
            .to_owned()
    };
    let dashboard = address("Ray dashboard:", lines.next_line().await.unwrap());
    let serve = address("Serve:", lines.next_line().await.unwrap());
    let http = reqwest::Client::new();
    let version = http
        .get(format!("{dashboard}/api/version"))
        .send()
        .await
        .expect("the dashboard through the session")
        .text()
        .await
        .unwrap();
    assert!(version.contains(head.ray_version()), "{version}");
    // Twice: each connection gets its own port-forward.
    for _ in 0..2 {
        let answer = http
            .post(format!("{serve}{}", e2e::ROUTE))
            .header("content-type", "application/json")
            .body(r#"{"text": "great"}"#)
            .send()
            .await
            .expect("the pipeline through the session");
        assert_eq!(answer.status(), 200);
    }
    // A port in use is said plainly.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let busy = kubectl_raypipe_on(
        &kubeconfig,
        &ns,
        &[
            "session",
            e2e::PIPELINE,
            "--dashboard-port",
            &port,
            "--serve-port",
            "0",
        ],
    )
    .await;
    assert!(!busy.ok, "{busy:?}");
    assert!(
        busy.stderr
            .contains(&format!("port {port} on 127.0.0.1 is busy")),
        "{busy:?}"
    );
    session.kill().await.ok();

    // logs: each replica of each node, from Ray's own log files.
    let logs = kubectl_raypipe_on(
        &kubeconfig,
        &ns,
        &["logs", e2e::PIPELINE, "--tail", "20", "-o", "json"],
    )
    .await;
    assert!(logs.ok, "{logs:?}");
    let items = logs.json()["items"].as_array().cloned().unwrap_or_default();
    let nodes: std::collections::BTreeSet<String> = items
        .iter()
        .filter_map(|i| i["node"].as_str().map(str::to_owned))
        .collect();
    assert!(
        nodes.contains("raypipe-executor") && nodes.len() >= 2,
        "{nodes:?}"
    );
    assert!(
        items
            .iter()
            .any(|i| i["lines"].as_array().is_some_and(|l| !l.is_empty())),
        "some replica logged: {items:?}"
    );
    let one = kubectl_raypipe_on(
        &kubeconfig,
        &ns,
        &["logs", e2e::PIPELINE, "--node", "nothing"],
    )
    .await;
    assert!(
        !one.ok && one.stderr.contains("\"nothing\" is not a node"),
        "{one:?}"
    );
    let text = kubectl_raypipe_on(
        &kubeconfig,
        &ns,
        &[
            "logs",
            e2e::PIPELINE,
            "--node",
            "raypipe-executor",
            "--tail",
            "5",
        ],
    )
    .await;
    assert!(
        text.ok
            && text
                .stdout
                .lines()
                .all(|l| l.starts_with("[raypipe-executor ")),
        "{text:?}"
    );
}
