//! The history collector's overhead, as a sidecar pays it: `raypipe collector` runs as its own
//! process (local backend in a temporary directory, everything on 127.0.0.1) and this bench
//! posts Ray-shaped event batches to it.
//!
//! 1. Steady load: one batch per second of `RAYPIPE_BENCH_RATE` events (default 1000, a busy
//!    node; Ray's agent flushes about once a second) for 30 s: the collector's CPU share and
//!    resident memory.
//! 2. Saturation: two posters sending 1000-event batches back to back for 10 s: events per
//!    second accepted (on disk), and CPU per 1000 events. Event files close at 1 MiB here, so
//!    the session ends up in a hundred-odd files.
//! 3. Cold read: once that collector has drained (SIGTERM), `raypipe history events` (a new
//!    process) reads the session back from the bucket: wall time, files and events.
//!
//! Run: `cargo bench --bench collector`. Prints the rows for BENCHMARKS.md.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A task lifecycle event as Ray 2.60 exports it (the most frequent kind), about 700 bytes.
fn event(i: u64) -> Value {
    json!({
        "eventId": format!("{:016x}{:08x}", i, i ^ 0x5a5a_5a5a),
        "sourceType": "CORE_WORKER", "eventType": "TASK_LIFECYCLE_EVENT",
        "timestamp": "2026-11-29T07:06:40.123456789Z", "severity": "INFO", "message": "",
        "sessionName": "session_2026-11-29_07-00-00_123456_4242",
        "nodeId": "q6urq6urq6urq6urq6urq6urq6urq6urq6urqw==",
        "taskLifecycleEvent": {
            "taskId": format!("{i:032x}"), "taskAttempt": 0, "jobId": "AQAAAA==",
            "stateTransitions": [
                {"state": "PENDING_NODE_ASSIGNMENT", "timestamp": "2026-11-29T07:06:40.100Z"},
                {"state": "SUBMITTED_TO_WORKER", "timestamp": "2026-11-29T07:06:40.110Z"},
                {"state": "RUNNING", "timestamp": "2026-11-29T07:06:40.120Z"},
                {"state": "FINISHED", "timestamp": "2026-11-29T07:06:40.123Z"}
            ],
            "nodeId": "q6urq6urq6urq6urq6urq6urq6urq6urq6urqw==",
            "workerId": "3q2+796tvu/erb7v3q2+796tvu/erb7v3q2+7w==", "workerPid": 4242,
            "rayErrorInfo": {}, "isDebuggerPaused": false
        }
    })
}

fn batch(start: u64, size: u64) -> String {
    Value::Array((start..start + size).map(event).collect()).to_string()
}

/// CPU seconds (user + system) of `pid` so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / per_second
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

struct Collector {
    child: Child,
    url: String,
    dirs: Vec<tempfile::TempDir>,
}

impl Collector {
    /// SIGTERM, and waits while it closes its files and uploads them.
    fn drain(&mut self) {
        // SAFETY: signals a child this process started and has not reaped.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(max_file_mb: u64) -> Collector {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("tmp")).collect();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_raypipe"))
        .arg("collector")
        .env("RAY_CLUSTER_NAME", "bench")
        .env("RAYPIPE_COLLECTOR_BIND_ADDRESS", "127.0.0.1")
        .env("EVENTS_PORT", port.to_string())
        .env("STORAGE_BACKEND", "local")
        .env("RAYPIPE_HISTORY_LOCAL_DIR", dirs[0].path())
        .env("RAY_COLLECTOR_EVENT_DATA_DIR", dirs[1].path())
        .env("RAY_TMP_ROOT", dirs[2].path())
        .env("RAY_COLLECTOR_EVENT_ROTATION_INTERVAL", "5s")
        .env("RAY_COLLECTOR_EVENT_MAX_DISK_MB", "2000")
        .env(
            "RAY_COLLECTOR_EVENT_MAX_FILE_SIZE_MB",
            max_file_mb.to_string(),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("raypipe collector");
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let started = Instant::now();
    while http.get(format!("{url}/healthz")).send().await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the collector did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Collector { child, url, dirs }
}

#[tokio::main]
async fn main() {
    raypipe::startup::init_crypto();
    let rate: u64 = std::env::var("RAYPIPE_BENCH_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let http = reqwest::Client::new();

    // 1. Steady load, one batch a second.
    let collector = start(100).await;
    let pid = collector.child.id();
    let idle_rss = status_kib(pid, "VmRSS:");
    let seconds = 30;
    let cpu_before = cpu_seconds(pid);
    let began = Instant::now();
    for second in 0..seconds {
        let body = batch(second * rate, rate);
        let answer = http
            .post(format!("{}/v1/events", collector.url))
            .body(body)
            .send()
            .await
            .expect("an answer");
        assert!(answer.status().is_success(), "{}", answer.status());
        let next = Duration::from_secs(second + 1);
        if let Some(wait) = next.checked_sub(began.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    let cpu = cpu_seconds(pid) - cpu_before;
    let wall = began.elapsed().as_secs_f64();
    let steady_rss = status_kib(pid, "VmRSS:");
    let steady_peak = status_kib(pid, "VmHWM:");
    drop(collector);

    // 2. Saturation: two posters, back to back.
    let mut collector = start(1).await;
    let pid = collector.child.id();
    let accepted = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu_seconds(pid);
    let began = Instant::now();
    let window = Duration::from_secs(10);
    let posters: Vec<_> = (0..2u64)
        .map(|p| {
            let (http, url, accepted) = (http.clone(), collector.url.clone(), accepted.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while began.elapsed() < window {
                    let body = batch((p << 40) + n * 1000, 1000);
                    let answer = http
                        .post(format!("{url}/v1/events"))
                        .body(body)
                        .send()
                        .await
                        .expect("an answer");
                    if answer.status().is_success() {
                        accepted.fetch_add(1000, Ordering::Relaxed);
                    }
                    n += 1;
                }
            })
        })
        .collect();
    for poster in posters {
        poster.await.expect("poster");
    }
    let saturated_wall = began.elapsed().as_secs_f64();
    let saturated_cpu = cpu_seconds(pid) - cpu_before;
    let saturated_events = accepted.load(Ordering::Relaxed);
    let saturated_peak = status_kib(pid, "VmHWM:");

    // 3. Cold read of that session by a new process, once everything is uploaded.
    collector.drain();
    let bucket = collector.dirs[0].path().to_owned();
    let files = walk(&bucket)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .count();
    let began = Instant::now();
    let read = Command::new(env!("CARGO_BIN_EXE_raypipe"))
        .args(["history", "events", "default/bench", "--output", "json"])
        .env("STORAGE_BACKEND", "local")
        .env("RAYPIPE_HISTORY_LOCAL_DIR", &bucket)
        .output()
        .expect("raypipe history");
    let cold_read = began.elapsed().as_secs_f64();
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let timeline: Vec<Value> = serde_json::from_slice(&read.stdout).expect("JSON");
    drop(collector);

    let event_bytes = event(1).to_string().len();
    println!("| measure | value |");
    println!("|---|---|");
    println!("| event size (task lifecycle, as posted) | {event_bytes} B |");
    println!(
        "| steady {rate} events/s for {seconds} s: collector CPU | {:.1} % of one core ({cpu:.2} s in {wall:.1} s) |",
        100.0 * cpu / wall
    );
    println!(
        "| steady: resident memory idle / after / peak | {:.1} / {:.1} / {:.1} MiB |",
        idle_rss as f64 / 1024.0,
        steady_rss as f64 / 1024.0,
        steady_peak as f64 / 1024.0
    );
    println!(
        "| saturated (2 posters, 1000-event batches): accepted | {:.0} events/s |",
        saturated_events as f64 / saturated_wall
    );
    println!(
        "| saturated: collector CPU per 1000 events | {:.1} ms |",
        1000.0 * saturated_cpu / (saturated_events.max(1) as f64 / 1000.0)
    );
    println!(
        "| saturated: peak resident memory | {:.1} MiB |",
        saturated_peak as f64 / 1024.0
    );
    println!(
        "| cold read (`raypipe history events`, new process, local backend): {} files, {} events | {:.2} s |",
        files,
        timeline.len(),
        cold_read
    );
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found
}
