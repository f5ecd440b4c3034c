//! The Python graph runtime (`runtime/`): its pytest suite run by cargo, and the check that its
//! fixtures — the Serve configs raypipe renders for the sample graphs, which the Python tests
//! parse as the runtime's `args` — still match what raypipe renders today.
//!
//! The suite runs on a test venv's Python (a pinned `ray[serve]` and `pytest`, provisioned on
//! first use), once on the newest and once on the oldest Ray the support matrix claims; its
//! end-to-end tests start their own Ray head on 127.0.0.1, so each run takes the shared Ray lock
//! to keep Ray-heavy tests of this binary from overlapping on 2 cores.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support;

const SAMPLES: [&str; 3] = ["sequence", "ensemble", "switch-canary"];
/// The suite is mostly Ray start-ups (four modules start a head of their own). Both suites side
/// by side took 429 s on 2 cores beside a cold Go build of the control plane; the limit only
/// catches a hang, on a machine that other Ray heads and builds may be loading too.
const PYTEST_TIMEOUT: Duration = Duration::from_secs(900);
/// After the limit: SIGTERM lets the suite stop its Ray head before it is killed.
const PYTEST_GRACE: Duration = Duration::from_secs(30);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixture_path(sample: &str) -> PathBuf {
    repo().join(format!("runtime/tests/fixtures/rendered/{sample}.json"))
}

/// The sample graph rendered with the default options.
fn rendered_config(sample: &str) -> raypipe::serve::ServeConfig {
    let path = repo().join(format!("samples/graphs/{sample}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let graph = raypipe::graph::from_yaml(&text).expect("the sample graph parses");
    let valid = raypipe::graph::validate(graph).expect("the sample graph is valid");
    raypipe::serve::render(&valid, &raypipe::serve::RenderOptions::default())
        .expect("the sample graph renders")
}

/// What `raypipe dag render --json samples/graphs/<sample>.yaml` prints.
fn render_sample(sample: &str) -> serde_json::Value {
    serde_json::from_str(&rendered_config(sample).to_json()).expect("rendered JSON")
}

/// `render_sample` laid out with shared node applications (`dag render --shared-nodes`).
fn render_sample_shared(sample: &str) -> serde_json::Value {
    raypipe::serve::shared::config_json(&rendered_config(sample), "ensemble").expect("the layout")
}

/// The shared-node fixtures: a version and its successor with one changed node.
const SHARED_SAMPLES: [&str; 2] = ["ensemble", "ensemble-v2"];

/// Set `RAYPIPE_UPDATE_FIXTURES=1` to rewrite the fixtures after a deliberate rendering change.
#[test]
fn runtime_fixtures_match_current_rendering() {
    let update = std::env::var_os("RAYPIPE_UPDATE_FIXTURES").is_some();
    let mut drifted = Vec::new();
    let plain = SAMPLES.iter().map(|s| (s.to_string(), render_sample(s)));
    let shared = SHARED_SAMPLES
        .iter()
        .map(|s| (format!("{s}.shared"), render_sample_shared(s)));
    for (sample, rendered) in plain.chain(shared) {
        let path = fixture_path(&sample);
        if update {
            let text = serde_json::to_string_pretty(&rendered).expect("JSON") + "\n";
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            continue;
        }
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let fixture: serde_json::Value = serde_json::from_str(&text).expect("fixture JSON");
        if fixture != rendered {
            drifted.push(path.display().to_string());
        }
    }
    assert!(
        drifted.is_empty(),
        "the graph runtime's fixtures no longer match `raypipe dag render --json`: {drifted:?}; \
         check that runtime/raypipe_runtime still reads the new args, then rerun with \
         RAYPIPE_UPDATE_FIXTURES=1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn python_runtime_tests_pass() {
    run_suite(raypipe::devenv::ray::RAY_VERSION).await;
}

/// The same suite on the oldest Ray the support matrix claims (README, "What runs where"): the
/// Ray the samples' images run, with its own cached venv.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn python_runtime_tests_pass_on_the_oldest_ray() {
    run_suite(raypipe::devenv::ray::RAY_VERSION_OLDEST).await;
}

/// `pytest runtime/tests` on the venv of Ray `version`; every test must pass, none skipped.
async fn run_suite(version: &'static str) {
    let _turn = support::ray_serve_lock().await;
    let ray =
        tokio::task::spawn_blocking(move || raypipe::devenv::ray::locate_ray_version(version))
            .await
            .expect("provisioning did not panic")
            .expect("the Ray test venv");
    let python = ray.with_file_name("python");
    assert!(
        python.exists(),
        "no python beside {} (the runtime tests need the Ray venv's interpreter)",
        ray.display()
    );
    // The suite's Ray is the one named, not whatever the venv happens to hold.
    let reported = std::process::Command::new(&python)
        .args(["-c", "import ray; print(ray.__version__)"])
        .output()
        .expect("the venv's python runs");
    assert_eq!(
        String::from_utf8_lossy(&reported.stdout).trim(),
        version,
        "{}",
        String::from_utf8_lossy(&reported.stderr)
    );
    let python_path = format!("{}:{}", repo().display(), repo().join("runtime").display());
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&python)
        .args([
            "-m",
            "pytest",
            "runtime/tests",
            "-q",
            "-p",
            "no:cacheprovider",
        ])
        .current_dir(repo())
        .env("PYTHONPATH", python_path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("RAYPIPE_REQUIRE_RAY", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("pytest starts");
    let stdout_task = tokio::spawn(read_all(child.stdout.take()));
    let stderr_task = tokio::spawn(read_all(child.stderr.take()));
    let status = match tokio::time::timeout(PYTEST_TIMEOUT, child.wait()).await {
        Ok(status) => status.expect("pytest ran"),
        Err(_) => {
            if let Some(pid) = child.id().and_then(|pid| libc::pid_t::try_from(pid).ok()) {
                // SAFETY: signalling the child this test spawned (still running: not reaped).
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
            let _ = tokio::time::timeout(PYTEST_GRACE, child.wait()).await;
            let _ = child.kill().await;
            let stdout =
                String::from_utf8_lossy(&stdout_task.await.unwrap_or_default()).into_owned();
            panic!(
                "pytest runtime/tests on Ray {version} took longer than {PYTEST_TIMEOUT:?}:\n{stdout}"
            );
        }
    };
    let stdout = String::from_utf8_lossy(&stdout_task.await.unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&stderr_task.await.unwrap_or_default()).into_owned();
    assert!(
        status.success(),
        "pytest runtime/tests on Ray {version} failed ({}) after {:.1}s:\n{stdout}\n{stderr}",
        status,
        started.elapsed().as_secs_f64()
    );
    // The end-to-end test must have run, not been skipped.
    assert!(
        !stdout.contains("skipped"),
        "pytest skipped tests:\n{stdout}"
    );
    eprintln!(
        "runtime tests on Ray {version}: {} in {:.1}s",
        stdout.lines().last().unwrap_or_default(),
        started.elapsed().as_secs_f64()
    );
}

/// Everything a pipe yields until it closes.
async fn read_all(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Some(mut pipe) = pipe {
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut pipe, &mut bytes).await;
    }
    bytes
}
