//! Opening a pipeline's history cold (issue 33's bound: under a second for a pipeline with 100
//! revisions). A bucket gets 100 revisions written as the recorder writes them: each with a
//! Serve config of the size a canary's carries, and a full rollout's timeline (steps, readings
//! every 10 s of a 10-minute rollout, Serve transitions, the decision). Then new `raypipe
//! history` processes, as a person runs them, read it back:
//!
//! 1. `revisions NS/NAME`: the list (one read: the index);
//! 2. `revision NS/NAME ID` of the oldest revision: its whole record;
//! 3. `serving NS/NAME --at T`: what served at a time (the index again).
//!
//! Each is run 5 times; the table shows the median and the slowest wall time, process start
//! included. The local backend always; S3 too when `RAYPIPE_VERSITYGW` names a versitygw
//! binary (the S3 server the integration tests build), served on 127.0.0.1.
//!
//! Run: `cargo bench --bench history_revisions`. Prints the rows for BENCHMARKS.md.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use raypipe::api::servepipeline::GateReadings;
use raypipe::history::revisions::{
    Happening, Outcome, PipelineIndex, RevisionRecord, RevisionStore, RevisionSummary, ServedSpan,
    TimelineEntry, revision_id,
};
use raypipe::history::sink::Sink;

const REVISIONS: u64 = 100;
const NAMESPACE: &str = "ml";
const PIPELINE: &str = "demo";

fn at(second: i64) -> String {
    jiff::Timestamp::from_second(1_796_000_000 + second)
        .expect("a valid time")
        .to_string()
}

/// Revision `seq`: started at `seq` hours, a 10-minute canary rollout.
fn record(seq: u64, serve_config: &serde_json::Value) -> (RevisionSummary, RevisionRecord) {
    let digest = format!("sha256:{seq:064x}");
    let id = revision_id(seq, &digest);
    let start = seq as i64 * 3600;
    let mut timeline = vec![TimelineEntry {
        at: at(start),
        what: Happening::Seen { source: None },
    }];
    for (step, weight) in [(0, 0), (1, 20), (2, 50)] {
        timeline.push(TimelineEntry {
            at: at(start + step * 200),
            what: Happening::Step {
                step: step as i32,
                steps: 2,
                weight,
            },
        });
    }
    for node in [
        "preprocess",
        "model_a",
        "model_b",
        "combine",
        "raypipe-executor",
    ] {
        for status in ["UPDATING", "HEALTHY"] {
            timeline.push(TimelineEntry {
                at: at(start + 30),
                what: Happening::Deployment {
                    application: format!("demo--{seq:012x}"),
                    deployment: node.to_owned(),
                    status: status.to_owned(),
                    message: String::new(),
                },
            });
        }
    }
    for tick in 0..60 {
        timeline.push(TimelineEntry {
            at: at(start + 200 + tick * 10),
            what: Happening::Readings {
                step: 1 + (tick / 30) as i32,
                readings: GateReadings {
                    canary_requests: tick * 40,
                    canary_errors: tick,
                    retried_on_stable: tick,
                    stable_requests: tick * 160,
                    canary_latency_ms: Some(41.5),
                    stable_latency_ms: Some(39.2),
                    latency_shift_z: Some(0.7),
                },
            },
        });
    }
    timeline.push(TimelineEntry {
        at: at(start + 800),
        what: Happening::Decision {
            result: "Promoted".into(),
            reason: "Promoted".into(),
            node: None,
            message: "every step passed its gates".into(),
            readings: None,
        },
    });
    let summary = RevisionSummary {
        id: id.clone(),
        seq,
        digest: digest.clone(),
        version: Some(seq.to_string()),
        first_seen: at(start),
        last_change: at(start + 800),
        served: vec![
            ServedSpan {
                role: "canary".into(),
                from: at(start + 200),
                until: Some(at(start + 800)),
            },
            ServedSpan {
                role: "stable".into(),
                from: at(start + 800),
                until: (seq < REVISIONS).then(|| at(start + 3600 + 800)),
            },
        ],
        outcome: Some(Outcome {
            result: "Promoted".into(),
            reason: "Promoted".into(),
            node: None,
            message: "every step passed its gates".into(),
            at: at(start + 800),
        }),
    };
    let record = RevisionRecord {
        namespace: NAMESPACE.into(),
        name: PIPELINE.into(),
        uid: "uid".into(),
        id,
        seq,
        digest,
        version: Some(seq.to_string()),
        generation: Some(1),
        first_seen: at(start),
        serve_config: Some(serve_config.clone()),
        ray_clusters: vec!["demo-raycluster-abcde".into()],
        ray_service: Some(PIPELINE.into()),
        timeline,
        readings_dropped: 0,
    };
    (summary, record)
}

/// A Serve config of the size a canary's carries: the sample ensemble rendered twice.
fn serve_config() -> serde_json::Value {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("samples/graphs/ensemble.yaml"))
        .expect("the sample graph");
    let graph = raypipe::graph::from_yaml(&text).expect("the sample parses");
    let validated = raypipe::graph::validate(graph).expect("the sample is valid");
    let config = raypipe::serve::render(&validated, &Default::default()).expect("it renders");
    let mut value = serde_json::to_value(&config).expect("serialisable");
    if let Some(apps) = value["applications"].as_array_mut() {
        let copy = apps.clone();
        apps.extend(copy);
    }
    value
}

async fn fill(store: &RevisionStore) -> usize {
    let config = serve_config();
    let mut index = PipelineIndex {
        namespace: NAMESPACE.into(),
        name: PIPELINE.into(),
        uid: "uid".into(),
        next_seq: REVISIONS + 1,
        ..PipelineIndex::default()
    };
    let mut record_bytes = 0;
    for seq in 1..=REVISIONS {
        let (summary, record) = record(seq, &config);
        record_bytes = serde_json::to_vec(&record).expect("JSON").len();
        store
            .put_revision(&record)
            .await
            .expect("a revision written");
        index.revisions.push(summary);
    }
    store.put_index(&index).await.expect("the index written");
    record_bytes
}

/// Median and slowest wall time of 5 runs of `raypipe history <args>` with `env`.
fn timed(args: &[&str], env: &BTreeMap<String, String>) -> (Duration, Duration) {
    let mut times = Vec::new();
    for _ in 0..5 {
        let began = Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_raypipe"))
            .arg("history")
            .args(args)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .output()
            .expect("raypipe history runs");
        times.push(began.elapsed());
        assert!(
            output.status.success(),
            "raypipe history {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!output.stdout.is_empty());
    }
    times.sort();
    (times[2], times[4])
}

fn rows(backend: &str, env: &BTreeMap<String, String>) {
    let pipeline = format!("{NAMESPACE}/{PIPELINE}");
    let oldest = revision_id(1, &format!("sha256:{:064x}", 1));
    let when = at(50 * 3600 + 300);
    for (what, args) in [
        (
            "revisions (the list)",
            vec!["revisions", pipeline.as_str(), "--output", "json"],
        ),
        (
            "revision (the oldest one's record)",
            vec![
                "revision",
                pipeline.as_str(),
                oldest.as_str(),
                "--output",
                "json",
            ],
        ),
        (
            "serving --at (what served then)",
            vec![
                "serving",
                pipeline.as_str(),
                "--at",
                when.as_str(),
                "--output",
                "json",
            ],
        ),
    ] {
        let (median, slowest) = timed(&args, env);
        println!(
            "| {backend}: `raypipe history {what}`, 100 revisions, new process | {:.0} ms median, {:.0} ms slowest of 5 |",
            median.as_secs_f64() * 1000.0,
            slowest.as_secs_f64() * 1000.0
        );
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    raypipe::startup::init_crypto();
    let base: BTreeMap<String, String> = ["PATH", "HOME"]
        .iter()
        .filter_map(|k| Some((k.to_string(), std::env::var(k).ok()?)))
        .collect();

    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut local = base.clone();
    local.insert("STORAGE_BACKEND".into(), "local".into());
    local.insert(
        "RAYPIPE_HISTORY_LOCAL_DIR".into(),
        dir.path().display().to_string(),
    );
    let store = RevisionStore::new(Sink::new(
        raypipe::history::store::from_env(&local).expect("a local store"),
        "",
    ));
    let record_bytes = fill(&store).await;
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| one revision's record (Serve config of two applications, {} timeline entries) | {:.1} KiB |",
        record(1, &serve_config()).1.timeline.len(),
        record_bytes as f64 / 1024.0
    );
    rows("local", &local);

    if let Ok(binary) = std::env::var("RAYPIPE_VERSITYGW") {
        let buckets = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir(buckets.path().join("history")).expect("the bucket");
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = Command::new(binary)
            .args(["--port", &format!("127.0.0.1:{port}"), "--quiet", "posix"])
            .arg(buckets.path())
            .env("ROOT_ACCESS_KEY_ID", "benchaccess")
            .env("ROOT_SECRET_ACCESS_KEY", "benchsecretkey")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("versitygw starts");
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut s3 = base.clone();
        for (k, v) in [
            ("STORAGE_BACKEND", "s3".to_owned()),
            ("S3_BUCKET", "history".to_owned()),
            ("S3_ENDPOINT", format!("http://127.0.0.1:{port}")),
            ("S3FORCE_PATH_STYLE", "true".to_owned()),
            ("AWS_ACCESS_KEY_ID", "benchaccess".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "benchsecretkey".to_owned()),
        ] {
            s3.insert(k.into(), v);
        }
        let store = RevisionStore::new(Sink::new(
            raypipe::history::store::from_env(&s3).expect("an S3 store"),
            "",
        ));
        fill(&store).await;
        rows("S3 (versitygw on 127.0.0.1)", &s3);
        let _ = server.kill();
        let _ = server.wait();
    }
}
