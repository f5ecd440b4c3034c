//! The history collector (issue 33, item 2), against a real Ray 2.60 on 127.0.0.1 whose event
//! export points at it, and a real S3-compatible server (versitygw, `support::s3`) reached
//! through a relay this test controls: the sink is down at first (nothing may be lost), then
//! cuts uploads off mid-request (retried, nothing duplicated), then works. What lands in the
//! bucket is read back in KubeRay's layout; Ray's logs are there after the head is gone. The
//! local-filesystem backend and the HTTP answers are checked without Ray.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use raypipe::devenv::ray::{RayHead, RayHeadOptions};
use raypipe::history::collector::{CollectorConfig, Counters, run_on};
use raypipe::history::layout::ClusterIdentity;
use raypipe::history::read::Reader;
use raypipe::history::sink::Sink;
use raypipe::history::spool::{SpoolConfig, files_under};
use raypipe::history::store;
use raypipe::ray::{JobStatus, JobSubmitRequest};
use serde_json::{Value, json};

use crate::support::{self, eventually};

const BUCKET: &str = "ray-history";
const WAIT: Duration = Duration::from_secs(120);

/// What the relay in front of the S3 server does with a connection.
const REFUSE: u8 = 0;
const CUT_MID_REQUEST: u8 = 1;
const DROP_RESPONSE: u8 = 2;
const PASS: u8 = 3;

/// A TCP relay to `target` whose behaviour the test switches: refuse (the sink is not up yet),
/// cut the connection after the first bytes of a request (a failure mid-upload), deliver the
/// request but lose the answer (stored, yet the client must retry), or pass.
struct Relay {
    port: u16,
    mode: Arc<AtomicU8>,
    /// Connections cut mid-request, and answers lost.
    cut: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

impl Relay {
    fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind");
        let port = listener.local_addr().expect("address").port();
        let mode = Arc::new(AtomicU8::new(REFUSE));
        let cut = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (relay_mode, relay_cut, relay_dropped) = (mode.clone(), cut.clone(), dropped.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let mode = relay_mode.load(Ordering::SeqCst);
                let (cut, dropped) = (relay_cut.clone(), relay_dropped.clone());
                std::thread::spawn(move || relay(client, target, mode, &cut, &dropped));
            }
        });
        Relay {
            port,
            mode,
            cut,
            dropped,
        }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn relay(
    client: TcpStream,
    target: SocketAddr,
    mode: u8,
    cut: &AtomicUsize,
    dropped: &AtomicUsize,
) {
    use std::io::{Read, Write};
    if mode == REFUSE {
        return;
    }
    let Ok(upstream) = TcpStream::connect(target) else {
        return;
    };
    let (mut from_client, mut to_server) = (
        client.try_clone().expect("clone"),
        upstream.try_clone().expect("clone"),
    );
    if mode == CUT_MID_REQUEST {
        // Forward part of the request, then drop both sides: the upload fails half-sent.
        let mut buffer = [0u8; 64];
        if let Ok(n) = from_client.read(&mut buffer) {
            let _ = to_server.write_all(&buffer[..n / 2]);
        }
        cut.fetch_add(1, Ordering::SeqCst);
        let _ = client.shutdown(std::net::Shutdown::Both);
        let _ = upstream.shutdown(std::net::Shutdown::Both);
        return;
    }
    if mode == DROP_RESPONSE {
        // The whole request reaches the server; its answer never reaches the client.
        let forward = std::thread::spawn(move || {
            let _ = std::io::copy(&mut from_client, &mut to_server);
        });
        let mut first = [0u8; 1];
        let mut upstream_reader = upstream;
        if upstream_reader.read(&mut first).is_ok_and(|n| n > 0) {
            dropped.fetch_add(1, Ordering::SeqCst);
        }
        let _ = client.shutdown(std::net::Shutdown::Both);
        let _ = upstream_reader.shutdown(std::net::Shutdown::Both);
        let _ = forward.join();
        return;
    }
    let (mut upstream_reader, mut client_writer) = (upstream, client);
    let forward = std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_client, &mut to_server);
        let _ = to_server.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut upstream_reader, &mut client_writer);
    let _ = client_writer.shutdown(std::net::Shutdown::Write);
    let _ = forward.join();
}

fn s3_env(endpoint: &str) -> BTreeMap<String, String> {
    let keys = support::s3::endpoint();
    [
        ("STORAGE_BACKEND", "s3"),
        ("S3_BUCKET", BUCKET),
        ("S3_ENDPOINT", endpoint),
        ("S3_REGION", support::s3::REGION),
        ("S3FORCE_PATH_STYLE", "true"),
        ("AWS_ACCESS_KEY_ID", keys.access_key.as_str()),
        ("AWS_SECRET_ACCESS_KEY", keys.secret_key()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// A Ray head whose every process exports its events to `events_url`, as KubeRay's operator
/// sets the Ray container up beside a collector.
async fn exporting_head(events_url: &str) -> RayHead {
    RayHead::start(RayHeadOptions {
        env: [
            ("RAY_enable_ray_event", "true"),
            ("RAY_enable_core_worker_ray_event_to_aggregator", "true"),
            (
                "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR",
                events_url,
            ),
            (
                "RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES",
                "ALL",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
        num_cpus: Some(2),
        ..Default::default()
    })
    .await
    .expect("a Ray head exporting its events")
}

/// The session `head` runs (its `session_latest`).
fn session_of(head: &RayHead) -> String {
    std::fs::read_link(head.dir().join("session_latest"))
        .expect("session_latest")
        .file_name()
        .expect("a session dir")
        .to_string_lossy()
        .into_owned()
}

/// Submits `script` as a job and waits for it to succeed; its submission id.
async fn run_job(head: &RayHead, name: &str, script: &str) -> String {
    let client = head
        .client(Duration::from_secs(30))
        .expect("a dashboard client");
    let id = format!("{name}-{}", std::process::id());
    let request = JobSubmitRequest::new(format!("python -c \"{script}\"")).with_submission_id(&id);
    client.submit_job(&request).await.expect("submit");
    eventually(WAIT, "the job succeeded", || async {
        let job = client.get_job(&id).await.ok()?;
        (job.status == Some(JobStatus::Succeeded)).then_some(())
    })
    .await;
    id
}

/// The events stored under `prefix` (one session of one cluster): their types and ids, and
/// the job directories; every event must name `session`.
fn stored_events(
    stored: &BTreeMap<String, Vec<u8>>,
    prefix: &str,
    session: &str,
) -> (BTreeSet<String>, Vec<String>, BTreeSet<String>) {
    let (mut types, mut ids, mut job_dirs) = (BTreeSet::new(), Vec::new(), BTreeSet::new());
    for (key, bytes) in stored {
        if !key.ends_with(".jsonl") {
            continue;
        }
        let relative = key
            .strip_prefix(&format!("{prefix}/"))
            .expect("under the prefix");
        let parts: Vec<&str> = relative.split('/').collect();
        assert!(
            matches!(
                parts.as_slice(),
                [_, "node_events", _] | [_, "job_events", _, _]
            ),
            "{relative}"
        );
        if parts[1] == "job_events" {
            job_dirs.insert(parts[2].to_owned());
        }
        for line in String::from_utf8_lossy(bytes).lines() {
            let event: Value = serde_json::from_str(line).expect("one event per line");
            assert_eq!(event["sessionName"], json!(session), "{key}: {line}");
            types.insert(event["eventType"].as_str().unwrap_or_default().to_owned());
            ids.push(event["eventId"].as_str().unwrap_or_default().to_owned());
        }
    }
    (types, ids, job_dirs)
}

fn identity(cluster: &str) -> ClusterIdentity {
    ClusterIdentity {
        namespace: "ml".into(),
        cluster: cluster.into(),
        owner: Some(("RayService".into(), "demo".into())),
    }
}

fn config(
    identity: ClusterIdentity,
    spool: &std::path::Path,
    ray_root: &std::path::Path,
) -> CollectorConfig {
    CollectorConfig {
        identity,
        listen: "127.0.0.1:0".parse().expect("address"),
        spool: SpoolConfig {
            dir: spool.to_owned(),
            rotate_after: Duration::from_secs(1),
            max_file_bytes: 1 << 20,
            max_disk_bytes: 64 << 20,
        },
        ray_tmp_root: ray_root.to_owned(),
        log_interval: Duration::from_secs(1),
        drain_timeout: Duration::from_secs(30),
        fallback_node: "unknown-node".into(),
    }
}

/// Every object under `prefix`, with its bytes.
async fn objects(store: &dyn ObjectStore, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let listed: Vec<object_store::ObjectMeta> = store
        .list(Some(&object_store::path::Path::from(prefix)))
        .try_collect()
        .await
        .unwrap_or_default();
    let mut all = BTreeMap::new();
    for meta in listed {
        let bytes = store
            .get(&meta.location)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        all.insert(meta.location.to_string(), bytes.to_vec());
    }
    all
}

#[tokio::test]
async fn real_ray_events_and_logs_reach_s3_through_a_late_then_failing_sink() {
    let _serve = support::ray_serve_lock().await;
    // The bucket, and a relay in front of the server that refuses for now.
    support::s3::server().put(BUCKET, "probe", b"");
    let relay = Relay::start(support::s3::server_address());
    let sink = Sink::new(
        store::from_env(&s3_env(&relay.url())).expect("the S3 store"),
        "history",
    );

    // The collector's port is taken before Ray starts, so the export address is known; Ray's
    // agent retries until the collector answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let events_url = format!(
        "http://{}/v1/events",
        listener.local_addr().expect("address")
    );
    let head = exporting_head(&events_url).await;
    let spool = tempfile::tempdir().expect("tmp");
    let counters = Arc::new(Counters::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let collector = tokio::spawn(run_on(
        listener,
        config(identity("demo-raycluster-h1"), spool.path(), head.dir()),
        sink.clone(),
        counters.clone(),
        async move {
            let _ = stopped.await;
        },
    ));

    // A job with a task and an actor, while the sink is down.
    let script = "import ray; ray.init(); \
                  f = ray.remote(lambda: 1); \
                  Counter = ray.remote(type('Counter', (), {'add': lambda self, n: n + 1})); \
                  c = Counter.remote(); \
                  print('history-probe', ray.get(f.remote()) + ray.get(c.add.remote(1)))";
    let id = run_job(&head, "history", script).await;
    eventually(
        WAIT,
        "the job's task and actor events spooled while the sink is down",
        || async {
            let written = counters.events_written.load(Ordering::Relaxed);
            let failed = counters.upload_failures.load(Ordering::Relaxed);
            (written >= 10 && failed >= 1).then_some(())
        },
    )
    .await;

    // Uploads now fail half-sent a few times, then arrive with their answers lost (so the same
    // files are sent again), then go through.
    relay.set(CUT_MID_REQUEST);
    eventually(WAIT, "uploads cut off mid-request", || async {
        (relay.cut.load(Ordering::SeqCst) >= 3).then_some(())
    })
    .await;
    relay.set(DROP_RESPONSE);
    eventually(WAIT, "uploads stored but their answers lost", || async {
        (relay.dropped.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    relay.set(PASS);
    let ready = spool.path().join("ready");
    eventually(WAIT, "everything spooled so far uploaded", || async {
        let waiting = files_under(&ready).ok()?;
        (waiting.is_empty() && counters.files_uploaded.load(Ordering::Relaxed) > 0).then_some(())
    })
    .await;

    // The head goes (its logs stay, as a Pod's volume outlives the Ray container). A new Ray
    // session starts against the same collector, as after a restart: its events are its own.
    let session = session_of(&head);
    head.stop_processes();
    let direct = store::from_env(&s3_env(&format!(
        "http://{}",
        support::s3::server_address()
    )))
    .expect("a direct client");
    let restarted = exporting_head(&events_url).await;
    let second_session = session_of(&restarted);
    assert_ne!(second_session, session);
    run_job(
        &restarted,
        "after-restart",
        "import ray; ray.init(); print(ray.get(ray.remote(lambda: 7).remote()))",
    )
    .await;
    let second_prefix =
        format!("history/cluster-history/rayservice/ml/demo/demo-raycluster-h1/{second_session}");
    eventually(WAIT, "the new session's job events stored", || async {
        let stored = objects(direct.as_ref(), &second_prefix).await;
        stored
            .keys()
            .any(|k| k.contains("/job_events/"))
            .then_some(())
    })
    .await;
    restarted.stop();
    let _ = stop.send(());
    collector.await.expect("joined").expect("the collector ran");

    // Read back from the server itself, not through the relay.
    for listed in [&session, &second_session] {
        let marker =
            format!("history/cluster-metadata/rayservice/ml_demo_demo-raycluster-h1/{listed}");
        assert!(
            direct
                .head(&object_store::path::Path::from(marker.as_str()))
                .await
                .is_ok(),
            "the session is listed: {marker}"
        );
    }
    let second = objects(direct.as_ref(), &second_prefix).await;
    let (second_types, _, _) = stored_events(&second, &second_prefix, &second_session);
    assert!(
        second_types.contains("TASK_DEFINITION_EVENT"),
        "{second_types:?}"
    );
    let prefix = format!("history/cluster-history/rayservice/ml/demo/demo-raycluster-h1/{session}");
    let stored = objects(direct.as_ref(), &prefix).await;
    let (types, ids, job_dirs) = stored_events(&stored, &prefix, &session);
    for expected in [
        "NODE_DEFINITION_EVENT",
        "DRIVER_JOB_DEFINITION_EVENT",
        "TASK_DEFINITION_EVENT",
        "TASK_LIFECYCLE_EVENT",
        "ACTOR_DEFINITION_EVENT",
        "ACTOR_LIFECYCLE_EVENT",
    ] {
        assert!(types.contains(expected), "{expected} in {types:?}");
    }
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "no event stored twice");
    assert!(!job_dirs.is_empty(), "events filed per job");
    // Ray's logs outlive the head: the job's driver log holds what the job printed.
    let driver_log = stored
        .iter()
        .find(|(k, _)| k.contains("/logs/") && k.contains(&format!("job-driver-{id}")))
        .map(|(_, bytes)| String::from_utf8_lossy(bytes).into_owned())
        .unwrap_or_else(|| {
            panic!(
                "the driver log among {:?}",
                stored
                    .keys()
                    .filter(|k| k.contains("/logs/"))
                    .collect::<Vec<_>>()
            )
        });
    assert!(driver_log.contains("history-probe 3"), "{driver_log}");
    assert!(stored.keys().any(|k| k.ends_with("/logs/raylet.out")));

    // The post-mortem reader: the first session's timeline shows the job's actor, and its logs.
    let reader = Reader::new(Sink::new(direct, "history"));
    let sessions = reader.sessions().await.expect("sessions");
    let first = sessions
        .iter()
        .find(|s| s.session == session)
        .expect("the first session listed");
    assert_eq!(first.owner_name.as_deref(), Some("demo"));
    let timeline = reader.timeline(first).await.expect("timeline");
    assert!(
        timeline
            .iter()
            .any(|e| e.event_type == "ACTOR_DEFINITION_EVENT" && e.summary.contains("Counter")),
        "{timeline:?}"
    );
    let at = |e: &raypipe::history::read::TimelineEntry| {
        e.timestamp.parse::<jiff::Timestamp>().expect("a time")
    };
    assert!(timeline.windows(2).all(|w| at(&w[0]) <= at(&w[1])));
    let files = reader.log_files(first).await.expect("log files");
    let driver = files
        .iter()
        .find(|f| f.contains(&format!("job-driver-{id}")))
        .expect("the driver log listed");
    let text = reader.log(first, driver).await.expect("the driver log");
    assert!(String::from_utf8_lossy(&text).contains("history-probe 3"));
}

/// Without Ray: the HTTP answers (200 once on disk, 400 for a body that is not an array, 503
/// with Retry-After while the spool is full) and the local-filesystem backend's layout.
#[tokio::test]
async fn the_local_backend_gets_kuberays_layout_and_bad_bodies_are_answered() {
    let bucket = tempfile::tempdir().expect("tmp");
    let env: BTreeMap<String, String> = [
        ("STORAGE_BACKEND", "local"),
        (
            "RAYPIPE_HISTORY_LOCAL_DIR",
            &bucket.path().to_string_lossy(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let sink = Sink::new(store::from_env(&env).expect("local store"), "");
    let spool = tempfile::tempdir().expect("tmp");
    let no_ray = tempfile::tempdir().expect("tmp");
    let mut settings = config(
        ClusterIdentity {
            namespace: "ml".into(),
            cluster: "plain".into(),
            owner: None,
        },
        spool.path(),
        no_ray.path(),
    );
    settings.spool.max_disk_bytes = 4096;
    // Nothing closes (so nothing uploads) until shutdown: the cap stays reached.
    settings.spool.rotate_after = Duration::from_secs(600);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!(
        "http://{}/v1/events",
        listener.local_addr().expect("address")
    );
    let counters = Arc::new(Counters::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let collector = tokio::spawn(run_on(
        listener,
        settings,
        sink,
        counters.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let http = reqwest::Client::new();
    let event = |id: &str, session: &str| {
        json!({"eventId": id, "eventType": "DRIVER_JOB_LIFECYCLE_EVENT", "nodeId": "q6urqw==",
               "timestamp": "2026-11-29T07:06:40Z", "sessionName": session,
               "driverJobLifecycleEvent": {"jobId": "AQAAAA==", "stateTransitions": []}})
    };
    let post = |body: String| {
        let http = http.clone();
        let url = url.clone();
        async move { http.post(&url).body(body).send().await.expect("answer") }
    };
    let ok =
        post(json!([event("a", "session_1"), event("b", "session_2"), {"bad": true}]).to_string())
            .await;
    assert_eq!(ok.status(), 200);
    let bad = post("{\"not\": \"an array\"}".into()).await;
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap_or_default().contains("JSON array"));
    // Fill the spool past its cap: refused with Retry-After until uploads make room.
    let big: Vec<Value> = (0..40)
        .map(|i| event(&format!("big-{i}"), "session_1"))
        .collect();
    let _ = post(json!(big).to_string()).await;
    let full = post(json!([event("c", "session_1")]).to_string()).await;
    assert_eq!(full.status(), 503);
    assert_eq!(
        full.headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap_or_default()),
        Some("10")
    );
    let _ = stop.send(());
    collector.await.expect("joined").expect("ran");

    let stored = files_under(bucket.path()).expect("list");
    for expected in [
        "cluster-metadata/raycluster/ml_plain/session_1",
        "cluster-metadata/raycluster/ml_plain/session_2",
    ] {
        assert!(
            stored.contains(&expected.to_owned()),
            "{expected} in {stored:?}"
        );
    }
    let session_1: Vec<&String> = stored
        .iter()
        .filter(|k| k.starts_with("cluster-history/raycluster/ml/plain/session_1/abababab/job_events/01000000/abababab-"))
        .collect();
    assert!(!session_1.is_empty(), "{stored:?}");
    assert_eq!(counters.rejected.load(Ordering::Relaxed), 1);
    assert!(
        files_under(&spool.path().join("ready"))
            .expect("list")
            .is_empty()
    );

    // `raypipe history` reads it back: both sessions listed, the newest one's timeline.
    let history = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_raypipe"))
            .arg("history")
            .args(args)
            .envs(&env)
            .output()
            .expect("raypipe history");
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("UTF-8")
    };
    let sessions: Value =
        serde_json::from_str(&history(&["sessions", "--output", "json"])).expect("JSON");
    assert_eq!(
        sessions,
        json!([
            {"namespace": "ml", "cluster": "plain", "session": "session_1"},
            {"namespace": "ml", "cluster": "plain", "session": "session_2"}
        ])
    );
    let timeline: Value =
        serde_json::from_str(&history(&["events", "ml/plain", "--output", "json"])).expect("JSON");
    let entries = timeline.as_array().expect("a list");
    assert_eq!(entries.len(), 1, "session_2 holds one event: {timeline}");
    assert_eq!(entries[0]["eventType"], "DRIVER_JOB_LIFECYCLE_EVENT");
    assert_eq!(entries[0]["job"], "01000000");
    let text = history(&["events", "ml/plain", "--session", "session_1"]);
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("DRIVER_JOB_LIFECYCLE_EVENT"))
            .count(),
        41,
        "{text}"
    );
}
