//! `raypipe dev` as a user runs it: the binary starts a control plane and a Ray head, prints
//! the kubeconfig line, serves the CRDs, the sample pipeline answers the `curl` line it prints,
//! and Ctrl-C (SIGINT) stops every process it started. Also the first-run path: a slow
//! provisioning of the control-plane binaries does not count against the start-up timeout.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped by raypipe) counts as stopped.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.split(") ")
                .nth(1)
                .is_some_and(|rest| rest.starts_with('Z'))
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn dev_starts_a_working_control_plane_and_ctrl_c_stops_everything() {
    // Make sure the binaries and the Ray virtualenv exist first (shared with the other tests):
    // the deadlines below are for start-up, not for a first-time build or install (issue 15).
    crate::support::control_plane();
    tokio::task::spawn_blocking(raypipe::devenv::ray::locate_ray)
        .await
        .expect("locate_ray did not panic")
        .expect("the Ray virtualenv");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let stderr_path = dir.path().join("stderr.log");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_raypipe"))
        .args(["dev", "--kubeconfig"])
        .arg(&kubeconfig)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("raypipe dev starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut pids = Vec::new();
    let export_line = read_until(&rx, deadline, "its ready lines", |line| {
        if let Some(procs) = line.split("processes ").nth(1) {
            pids = procs
                .trim_end_matches(')')
                .split_whitespace()
                .filter_map(|p| p.split('=').nth(1)?.parse::<u32>().ok())
                .collect();
        }
        line.trim_start()
            .starts_with("export KUBECONFIG=")
            .then(|| line.to_owned())
    });
    assert_eq!(
        pids.len(),
        5,
        "etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok"
    );
    assert!(export_line.contains(kubeconfig.to_str().expect("utf-8 path")));

    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig written"),
        &Default::default(),
    )
    .await
    .expect("kubeconfig is valid");
    let client = kube::Client::try_from(config).expect("client");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.get("servepipelines.raypipe.dev")
        .await
        .expect("CRDs are installed");
    // The embedded sample: a registry on 127.0.0.1 and a ServePipeline that the in-process
    // controller turns into a RayService.
    let services: Api<raypipe::api::RayService> = Api::namespaced(client.clone(), "default");
    let demo = crate::support::eventually(
        Duration::from_secs(60),
        "the sample pipeline's RayService",
        || {
            let services = services.clone();
            async move { services.get_opt("demo").await.expect("get RayService") }
        },
    )
    .await;
    assert!(
        demo.spec
            .serve_config_v2
            .is_some_and(|c| c.contains("route_prefix: /demo")),
        "the sample's Serve config carries its route prefix"
    );

    // raypipe dev records pipeline history and says where.
    let history_dir = read_until(&rx, deadline, "its history line", |line| {
        line.trim_start()
            .strip_prefix("export STORAGE_BACKEND=local RAYPIPE_HISTORY_LOCAL_DIR=")
            .map(|dir| dir.trim().to_owned())
    });

    // The newcomer's path: the printed curl line gets the sample graph's answer from Ray.
    let mut dashboard_port = None;
    let serve_url = read_until(&rx, deadline, "its curl line", |line| {
        if let Some(rest) = line.split("Ray: dashboard http://127.0.0.1:").nth(1) {
            dashboard_port = rest
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|p| p.parse::<u16>().ok());
        }
        line.trim_start()
            .strip_prefix("curl -s -X POST ")
            .and_then(|url| url.split_whitespace().next())
            .map(str::to_owned)
    });
    assert!(serve_url.starts_with("http://127.0.0.1:"), "{serve_url}");
    let http = crate::support::fixture::loopback_http(Duration::from_secs(10));
    let answer: serde_json::Value = crate::support::eventually(
        Duration::from_secs(300),
        "the sample pipeline to answer the curl line",
        || {
            let request = http
                .post(&serve_url)
                .header("content-type", "application/json")
                .body(r#"{"text": "I love this, great and fast"}"#);
            async move {
                let response = request.send().await.ok()?;
                if !response.status().is_success() {
                    return None;
                }
                serde_json::from_slice(&response.bytes().await.ok()?).ok()
            }
        },
    )
    .await;
    // 3 positive words of 6: each classifier scores 0.5 + 0.5 * 3 / 6.
    assert_eq!(
        answer,
        serde_json::json!({"score": 0.75, "votes": {"a": 0.75, "b": 0.75}})
    );
    // The history the README's post-mortem reads: the sample's revision serves as stable.
    let digest = pipelines_digest(&client).await;
    let index: serde_json::Value = crate::support::eventually(
        Duration::from_secs(30),
        "the sample's revision in raypipe dev's history",
        || {
            let (history_dir, digest) = (history_dir.clone(), digest.clone());
            async move {
                let output = Command::new(env!("CARGO_BIN_EXE_raypipe"))
                    .args(["history", "revisions", "default/demo", "--output", "json"])
                    .env("STORAGE_BACKEND", "local")
                    .env("RAYPIPE_HISTORY_LOCAL_DIR", &history_dir)
                    .output()
                    .ok()?;
                let index: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
                let serving = index["revisions"].as_array()?.iter().any(|r| {
                    r["digest"] == digest.as_str()
                        && r["served"].as_array().is_some_and(|spans| {
                            spans
                                .iter()
                                .any(|s| s["role"] == "stable" && s["until"].is_null())
                        })
                });
                serving.then_some(index)
            }
        },
    )
    .await;
    assert_eq!(index["namespace"], "default", "{index}");

    // The console it prints: a browser is signed in by the local provider and sees the sample.
    let console_page = read_until(&rx, deadline, "its console line", |line| {
        line.trim_start()
            .strip_prefix("Console: ")
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_owned)
    });
    let (status, page) = crate::console::browse(&console_page).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{console_page}: {page}");
    for shown in ["developer@raypipe.dev", digest.as_str(), "data-node="] {
        assert!(page.contains(shown), "{shown} on {console_page}");
    }

    // A second pipeline gets a Ray head of its own: on one shared head the two RayServices
    // replaced each other's Serve applications on every push, and most requests failed.
    let pipelines: Api<raypipe::api::ServePipeline> = Api::namespaced(client.clone(), "default");
    let mut second =
        serde_json::to_value(pipelines.get("demo").await.expect("get demo")).expect("serialisable");
    second["metadata"] = serde_json::json!({"name": "second", "namespace": "default"});
    second["spec"]["serve"]["routePrefix"] = "/second".into();
    if let Some(object) = second.as_object_mut() {
        object.remove("status");
    }
    pipelines
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(second).expect("a ServePipeline"),
        )
        .await
        .expect("create the second pipeline");
    let second_deadline = Instant::now() + Duration::from_secs(180);
    let (second_dashboard_port, second_serve) = read_until(
        &rx,
        second_deadline,
        "where the second pipeline's Serve answers",
        |line| {
            let rest = line
                .split("RayService default/second runs on the local Ray head with dashboard http://127.0.0.1:")
                .nth(1)?;
            let port = rest
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|p| p.parse::<u16>().ok())
                .expect("a dashboard port");
            let serve = rest
                .split("its Serve answers on ")
                .nth(1)
                .expect("a Serve URL")
                .trim()
                .to_owned();
            Some((port, serve))
        },
    );
    assert_ne!(
        Some(second_dashboard_port),
        dashboard_port,
        "a head of its own"
    );
    let second_url = format!("{second_serve}/second");
    let ask = |url: String| {
        let request = http
            .post(url)
            .header("content-type", "application/json")
            .body(r#"{"text": "I love this, great and fast"}"#);
        async move {
            let response = request.send().await.ok()?;
            if !response.status().is_success() {
                return None;
            }
            serde_json::from_slice::<serde_json::Value>(&response.bytes().await.ok()?).ok()
        }
    };
    let second_answer = crate::support::eventually(
        Duration::from_secs(300),
        "the second pipeline to answer on its own head",
        || ask(second_url.clone()),
    )
    .await;
    assert_eq!(second_answer, answer);
    // Both keep answering: neither push replaces the other's applications any more.
    for round in 0..20 {
        for url in [&serve_url, &second_url] {
            assert_eq!(
                ask(url.clone()).await.as_ref(),
                Some(&answer),
                "round {round}: {url} failed while both pipelines ran"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    while let Ok(line) = rx.try_recv() {
        eprintln!("raypipe dev: {line}");
    }
    eprintln!(
        "sending SIGINT to raypipe dev at {:?}",
        std::time::SystemTime::now()
    );
    // SAFETY: signalling the child we started.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let stop_deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < stop_deadline,
            "raypipe dev did not stop after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "raypipe dev exited with {status}; its stderr:\n{}",
        std::fs::read_to_string(&stderr_path).unwrap_or_default()
    );
    for pid in pids {
        assert!(!alive(pid), "process {pid} outlived raypipe dev");
    }
    let dashboard_port = dashboard_port.expect("the Ray dashboard line");
    for port in [dashboard_port, second_dashboard_port] {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "the Ray head on dashboard port {port} outlived raypipe dev"
        );
    }
    assert!(
        !kubeconfig.exists(),
        "the kubeconfig of a stopped control plane is removed"
    );
}

/// The digest the sample pipeline serves (`status.source.digest`).
async fn pipelines_digest(client: &kube::Client) -> String {
    let pipelines: Api<raypipe::api::ServePipeline> = Api::namespaced(client.clone(), "default");
    crate::support::eventually(Duration::from_secs(60), "the sample's digest", || {
        let pipelines = pipelines.clone();
        async move {
            let p = pipelines.get("demo").await.ok()?;
            Some(p.status?.source?.digest)
        }
    })
    .await
}

/// Issue 15: on a fresh machine, building the control plane takes ~14 minutes, and the start-up
/// timeout used to be counted from before that build, so the first `raypipe dev` or `cargo
/// test` failed with "timed out … waiting for kube-apiserver /readyz". Here a stand-in
/// provisioning fills an empty cache (with the real binaries) and takes longer than the whole
/// start-up timeout; the control plane must still start.
#[tokio::test]
async fn a_slow_first_provisioning_does_not_consume_the_startup_timeout() {
    use raypipe::devenv::binaries::{Binaries, Lookup};
    use raypipe::devenv::control_plane::{ControlPlane, ControlPlaneOptions};

    let real = tokio::task::spawn_blocking(|| Binaries::locate(false))
        .await
        .expect("locate did not panic")
        .expect("the control-plane binaries");
    let cache = tempfile::tempdir().expect("tempdir");
    let lookup = Lookup {
        cache: cache.path().join("k8s"),
        ..Lookup::default()
    };
    // Long enough for kube-apiserver on a loaded machine; the provisioning outlasts it.
    let timeout = Duration::from_secs(90);
    let provisioning = timeout + Duration::from_secs(2);
    let options = ControlPlaneOptions {
        install_crds: false,
        startup_timeout: timeout,
        ..ControlPlaneOptions::default()
    };
    let started = Instant::now();
    let plane = ControlPlane::start_located(options, move || {
        lookup.locate(false, |dir| {
            std::thread::sleep(provisioning);
            std::fs::create_dir_all(dir.join("kwok-stages")).expect("create the cache");
            std::os::unix::fs::symlink(&real.etcd, dir.join("etcd")).expect("link etcd");
            std::os::unix::fs::symlink(&real.kube_apiserver, dir.join("kube-apiserver"))
                .expect("link kube-apiserver");
            Ok(())
        })
    })
    .await
    .expect("the control plane starts after a provisioning longer than its start-up timeout");
    assert!(started.elapsed() > provisioning);
    assert!(
        plane.binaries.kube_apiserver.starts_with(cache.path()),
        "the freshly provisioned cache was used: {:?}",
        plane.binaries
    );
    let client = plane.client().await.expect("client");
    Api::<CustomResourceDefinition>::all(client)
        .list(&Default::default())
        .await
        .expect("the API server answers");
}

/// Reads `raypipe dev`'s lines, echoing each, until `take` finds what it looks for in one;
/// fails naming `what` when `deadline` passes first.
fn read_until<T>(
    lines: &std::sync::mpsc::Receiver<String>,
    deadline: Instant,
    what: &str,
    mut take: impl FnMut(&str) -> Option<T>,
) -> T {
    loop {
        let line = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|e| panic!("raypipe dev did not print {what} in time: {e}"));
        eprintln!("raypipe dev: {line}");
        if let Some(found) = take(&line) {
            return found;
        }
    }
}
