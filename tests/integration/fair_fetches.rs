//! Fair fetches (issue 29): pipelines of some namespaces whose registry path hangs (headers, then
//! no body) must not keep a pipeline of another namespace from the registry they share.
//!
//! Before, four such pipelines held the four fetch slots of their registry host for their whole
//! `timeout` (2 m), whatever namespace they were in, and a healthy pipeline of another namespace
//! on the same host waited 116 s for its first fetch. The operator here watches every namespace
//! with one ServePipeline controller, as the chart installs it: that is where namespaces share
//! the pools (with `--namespaces`, each namespace used to get pools of its own). So the test
//! starts a control plane of its own (etcd and kube-apiserver): an operator watching every
//! namespace of the shared one would reconcile the other tests' pipelines.

use std::time::{Duration, Instant};

use kube::api::{Api, ListParams, PostParams};
use raypipe::api::servepipeline::ServePipeline;
use raypipe::api::{RayService, conditions};
use raypipe::devenv::control_plane::{ControlPlane, ControlPlaneOptions};
use raypipe::devenv::registry::{Registry, Route};
use serde_json::json;

use crate::support::{self, e2e, eventually, fixture};

const TOKEN: &str = "fair-t0ken";
/// The goal (issue 29) is 5 s; the assertion allows twice that for a busy 2-core machine.
/// Measured: 0.11 s after the fix. Before it, no healthy pipeline was applied within 150 s: it
/// queued at its host behind about 36 hanging fetches, four at a time, each for 2 m.
const HEALTHY_WITHIN: Duration = Duration::from_secs(10);
/// Hanging namespaces on the healthy pipelines' host, and hanging pipelines in each.
const HANGING_NAMESPACES: usize = 5;
const HANGING_PER_NAMESPACE: usize = 10;

/// A control plane of this test's own: etcd, kube-apiserver and raypipe's CRDs (started on its
/// own runtime, as `support::control_plane` does, so it outlives nothing it needs).
fn own_control_plane() -> ControlPlane {
    raypipe::startup::init_crypto();
    std::thread::spawn(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime starts")
            .block_on(ControlPlane::start(ControlPlaneOptions::default()))
    })
    .join()
    .expect("control-plane start-up did not panic")
    .expect("the control plane starts")
}

async fn create_pipeline(client: &kube::Client, ns: &str, name: &str, url: &str) {
    let pipeline =
        fixture::servepipeline(name, fixture::token_source(url, json!({"timeout": "2m"})));
    Api::<ServePipeline>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pipeline)
        .await
        .unwrap_or_else(|e| panic!("create {ns}/{name}: {e}"));
}

/// A namespace with the registry token in it.
async fn tenant(client: &kube::Client, prefix: &str) -> String {
    let ns = support::namespace(client, prefix).await;
    fixture::put_token_secret(client, &ns, "registry-token", TOKEN).await;
    ns
}

/// A server that accepts connections, reads nothing and never answers.
async fn silent_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("http://{addr}/g.pb")
}

/// The first pipeline of `namespaces` whose SourceReady condition says `BodyStalled`, with the
/// condition's message.
async fn first_stalled(client: &kube::Client, namespaces: &[String]) -> Option<(String, String)> {
    for ns in namespaces {
        let pipelines = Api::<ServePipeline>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .expect("list ServePipelines");
        for pipeline in pipelines.items {
            let conds = pipeline.status.map(|s| s.conditions).unwrap_or_default();
            if let Some(c) = conditions::find(&conds, "SourceReady")
                .filter(|c| c.status == "False" && c.reason == "BodyStalled")
            {
                let name = pipeline.metadata.name.unwrap_or_default();
                return Some((format!("{ns}/{name}"), c.message.clone()));
            }
        }
    }
    None
}

/// 50 pipelines of five namespaces hang on one registry host (headers, then no body), and 10 of
/// another namespace hang on two other hosts (one never answers, one stalls after its headers);
/// a healthy pipeline in each of three other namespaces, on the same host as the 50, still gets
/// its RayService within the goal. The hanging ones then end with `BodyStalled` long before
/// their 2 m timeout.
#[tokio::test]
async fn pipelines_hanging_on_a_shared_host_do_not_delay_another_namespace() {
    let plane = own_control_plane();
    let admin = plane.client().await.expect("a client");
    let operator_ns = support::namespace(&admin, "fair-operator").await;

    let shared = Registry::start(TOKEN).await;
    shared.put("graph.pb", e2e::ensemble("1"));
    let graph_len = e2e::ensemble("1").len() as u64;
    // What a sick registry path looks like: the headers of the real object, then nothing.
    shared.route(
        "hang.pb",
        Route::StalledBody {
            declared: graph_len,
        },
    );
    let elsewhere = Registry::start(TOKEN).await;
    elsewhere.route(
        "hang.pb",
        Route::StalledBody {
            declared: graph_len,
        },
    );
    let silent = silent_server().await;

    let mut hanging = Vec::new();
    for n in 0..HANGING_NAMESPACES {
        let ns = tenant(&admin, &format!("fair-hang{n}")).await;
        for i in 0..HANGING_PER_NAMESPACE {
            create_pipeline(&admin, &ns, &format!("hang-{i}"), &shared.url("hang.pb")).await;
        }
        hanging.push(ns);
    }
    let other_hosts = tenant(&admin, "fair-other-hosts").await;
    for i in 0..5 {
        create_pipeline(&admin, &other_hosts, &format!("silent-{i}"), &silent).await;
        let url = elsewhere.url("hang.pb");
        create_pipeline(&admin, &other_hosts, &format!("stalled-{i}"), &url).await;
    }

    let (stop, operator) = support::spawn_operator(
        admin.clone(),
        vec![
            "--controllers=servepipeline".to_owned(),
            format!("--operator-namespace={operator_ns}"),
            "--leader-election=false".to_owned(),
            "--admin-address=127.0.0.1:0".to_owned(),
        ],
    );
    let operator_started = Instant::now();
    // The hanging fetches take whatever they may of the shared host first.
    eventually(
        Duration::from_secs(60),
        "the hanging pipelines to reach the shared registry",
        || async { (shared.requests("hang.pb").len() >= 4).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let hanging_requests = shared.requests("hang.pb").len();

    let mut waits = Vec::new();
    for n in 0..3 {
        let ns = tenant(&admin, &format!("fair-healthy{n}")).await;
        let started = Instant::now();
        create_pipeline(&admin, &ns, "healthy", &shared.url("graph.pb")).await;
        let rayservices = Api::<RayService>::namespaced(admin.clone(), &ns);
        // Long enough to measure a wait well past the goal, rather than only see it missed.
        let applied = eventually(
            Duration::from_secs(60),
            &format!("the RayService of {ns}/healthy"),
            || {
                let rayservices = rayservices.clone();
                async move {
                    let found = rayservices
                        .get_opt("healthy")
                        .await
                        .expect("get RayService");
                    found.map(|_| started.elapsed())
                }
            },
        )
        .await;
        println!(
            "FAIR-FETCH healthy pipeline {ns}/healthy applied {applied:?} after create \
             ({hanging_requests} hanging requests on its host)"
        );
        waits.push(applied);
    }
    for (n, waited) in waits.iter().enumerate() {
        assert!(
            *waited < HEALTHY_WITHIN,
            "healthy pipeline {n} waited {waited:?} behind other namespaces' hanging fetches \
             (all waits: {waits:?})"
        );
    }

    // The hanging ones end with their own reason, long before their 2 m timeout (each
    // namespace's turn on the shared host comes round; the first ends after the stall timeout).
    for (namespaces, path) in [
        (&hanging[..], "hang.pb"),
        (&[other_hosts.clone()][..], "hang.pb"),
    ] {
        let (name, message) = eventually(
            Duration::from_secs(60),
            "a hanging pipeline's SourceReady reason BodyStalled",
            || first_stalled(&admin, namespaces),
        )
        .await;
        assert!(message.contains(path), "{message}");
        assert!(!message.contains(TOKEN), "{message}");
        println!(
            "FAIR-FETCH {name}: BodyStalled {:?} after the operator started",
            operator_started.elapsed()
        );
    }
    for ns in hanging.iter().chain([&other_hosts]) {
        let applied = Api::<RayService>::namespaced(admin.clone(), ns)
            .list(&ListParams::default())
            .await
            .expect("list RayServices");
        assert!(
            applied.items.is_empty(),
            "{ns}: a hanging pipeline was applied"
        );
    }
    support::stop_operator(stop, operator, Duration::from_secs(30)).await;
    drop(plane);
}
