//! `raypipe dev` as a user runs it: the binary starts a control plane and a Ray head, prints
//! the kubeconfig line, serves the CRDs, the sample pipeline answers the `curl` line it prints,
//! and Ctrl-C (SIGINT) stops every process it started.

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
    // Make sure the binaries exist first (shared with the other tests), so this test measures
    // start-up rather than a cold build.
    crate::support::control_plane();
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
    let mut export_line = None;
    while export_line.is_none() {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("raypipe dev printed its ready lines in time");
        eprintln!("raypipe dev: {line}");
        if let Some(procs) = line.split("processes ").nth(1) {
            pids = procs
                .trim_end_matches(')')
                .split_whitespace()
                .filter_map(|p| p.split('=').nth(1)?.parse::<u32>().ok())
                .collect();
        }
        if line.trim_start().starts_with("export KUBECONFIG=") {
            export_line = Some(line);
        }
    }
    assert_eq!(
        pids.len(),
        5,
        "etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok"
    );
    assert!(
        export_line
            .expect("export line")
            .contains(kubeconfig.to_str().expect("utf-8 path"))
    );

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

    // The newcomer's path: the printed curl line gets the sample graph's answer from Ray.
    let mut serve_url = None;
    let mut dashboard_port = None;
    while serve_url.is_none() {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("raypipe dev printed its curl line in time");
        eprintln!("raypipe dev: {line}");
        if let Some(rest) = line.split("Ray: dashboard http://127.0.0.1:").nth(1) {
            dashboard_port = rest
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|p| p.parse::<u16>().ok());
        }
        if let Some(url) = line.trim_start().strip_prefix("curl -s -X POST ") {
            serve_url = url.split_whitespace().next().map(str::to_owned);
        }
    }
    let serve_url = serve_url.expect("a Serve URL");
    assert!(serve_url.starts_with("http://127.0.0.1:"), "{serve_url}");
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
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
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", dashboard_port)).is_err(),
        "the Ray head outlived raypipe dev"
    );
    assert!(
        !kubeconfig.exists(),
        "the kubeconfig of a stopped control plane is removed"
    );
}
