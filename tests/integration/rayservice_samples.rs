//! KubeRay's own sample RayServices, applied unchanged (every YAML document of each file), reach
//! Ready on raypipe: RayCluster + RayService controllers on the test control plane (kwok runs
//! the Pods), Serve on a real Ray head on 127.0.0.1 with one extra worker node (the samples ask
//! for `max_replicas_per_node: 1` with two replicas, which one node cannot place).
//!
//! The samples' `working_dir` URLs point at GitHub; the operator rewrites them (a
//! `runtime_env_mirrors` entry) to a server on 127.0.0.1 that answers any `<sha>.zip` with
//! raypipe's own stand-ins for the imported modules (`tests/ray/apps/kuberay_test_dag`).
//! Nothing leaves loopback.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use raypipe::api::rayservice::RayServiceStatus;
use raypipe::controllers::rayservice;
use raypipe::controllers::rayservice::build::HttpBinding;
use raypipe::devenv::ray::{RayHead, RayHeadOptions};
use raypipe::pypackage::PythonPackage;
use raypipe::ray::{DashboardLocator, DashboardUrl};
use serde_json::{Value, json};

use crate::rayservice::{Fixture, fixture_with};
use crate::support;
use crate::support::fixture::{self, active_cluster_name, rayservice_ready};

/// Eight replicas and a runtime env download on two shared cores.
const WAIT: Duration = Duration::from_secs(300);

/// Where the samples' `working_dir` zips live.
const TEST_DAG_ARCHIVES: &str = "https://github.com/ray-project/test_dag/archive/";

/// Serves the stand-in `test_dag` working dir at `/test_dag/<anything>.zip` on 127.0.0.1;
/// returns the mirror base URL and a count of downloads.
async fn serve_test_dag() -> (String, Arc<AtomicU32>) {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ray/apps/kuberay_test_dag");
    let package = PythonPackage::working_dir(&dir, "test_dag").expect("the test_dag package");
    let downloads = Arc::new(AtomicU32::new(0));
    let counter = downloads.clone();
    let app = axum::Router::new().route(
        "/test_dag/{file}",
        axum::routing::get(
            move |axum::extract::Path(file): axum::extract::Path<String>| {
                let package = package.clone();
                let counter = counter.clone();
                async move {
                    use axum::response::IntoResponse;
                    if !file.ends_with(".zip") {
                        return (axum::http::StatusCode::NOT_FOUND, "zips only\n").into_response();
                    }
                    counter.fetch_add(1, Ordering::SeqCst);
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/zip")],
                        package.bytes.as_ref().clone(),
                    )
                        .into_response()
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let address = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{address}/test_dag/"), downloads)
}

/// Controllers for a fresh namespace: every cluster's dashboard is `head`'s; Serve binds the
/// head's loopback port; the samples' GitHub archive URLs go to `mirror`.
async fn fixture(prefix: &str, head: &RayHead, mirror: &str) -> Fixture {
    let url = head.dashboard_url().as_str().to_owned();
    let authority = head.dashboard_url().authority();
    let serve_port = head.ports().serve_http;
    let binding: rayservice::HttpBindingFor = Arc::new(move |dashboard: &DashboardUrl| {
        (dashboard.authority() == authority).then(|| HttpBinding {
            host: "127.0.0.1".to_owned(),
            port: serve_port,
        })
    });
    let config = rayservice::Config {
        dashboard: DashboardLocator::resolver(move |_| Some(url.clone())),
        http_binding: Some(binding),
        runtime_env_mirrors: vec![(TEST_DAG_ARCHIVES.to_owned(), mirror.to_owned())],
        ..rayservice::Config::default()
    };
    fixture_with(prefix, config, WAIT).await
}

impl Fixture {
    /// Creates every document of the sample file in this namespace, as it is; returns the
    /// name of its RayService.
    async fn apply_sample(&self, file: &str) -> String {
        self.apply_documents(&support::kuberay_samples_dir().join(file), |_| true)
            .await
    }

    /// Creates the documents of `path` that `keep` selects, as they are; returns the name of
    /// the (last) RayService among them.
    async fn apply_documents(
        &self,
        path: &std::path::Path,
        keep: impl Fn(&Value) -> bool,
    ) -> String {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let documents = raypipe::api::yaml::documents(&text).expect("the sample is YAML");
        let mut service = None;
        for document in documents.into_iter().filter(|d| keep(d)) {
            let object: DynamicObject =
                serde_json::from_value(document.clone()).expect("a Kubernetes object");
            let types = object.types.clone().expect("apiVersion and kind");
            let gvk = GroupVersionKind::try_from(&types).expect("a group/version/kind");
            let (resource, _) = kube::discovery::pinned_kind(&self.client, &gvk)
                .await
                .unwrap_or_else(|e| panic!("{}: the API server serves no {gvk:?}: {e}", file));
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &self.ns, &resource);
            api.create(&PostParams::default(), &object)
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{file}: create {} {:?}: {e}",
                        types.kind, object.metadata.name
                    )
                });
            if types.kind == "RayService" {
                service = object.metadata.name.clone();
            }
        }
        service.unwrap_or_else(|| panic!("{file} has no RayService"))
    }

    /// Asserts the RayService's Services select `active`, and its head Pod serves.
    async fn assert_traffic_goes_to(&self, service: &str, active: &str) {
        for svc in [
            format!("{service}-serve-svc"),
            format!("{service}-head-svc"),
        ] {
            assert_eq!(
                self.service_selects(&svc).await.as_deref(),
                Some(active),
                "{svc} selects the active cluster"
            );
        }
        let heads = Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .list(
                &ListParams::default()
                    .labels(&format!("ray.io/cluster={active},ray.io/node-type=head")),
            )
            .await
            .expect("list head Pods")
            .items;
        assert_eq!(heads.len(), 1);
        assert_eq!(
            heads[0]
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("ray.io/serve"))
                .map(String::as_str),
            Some("true"),
            "the head Pod serves"
        );
    }
}

fn active_apps(status: &RayServiceStatus) -> BTreeMap<String, String> {
    status
        .active_service_status
        .as_ref()
        .and_then(|s| s.application_statuses.as_ref())
        .map(|apps| {
            apps.iter()
                .map(|(name, app)| (name.clone(), app.status.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

/// Ready, with exactly `apps` RUNNING on the active cluster.
fn ready_with(status: &RayServiceStatus, apps: &[&str]) -> bool {
    let running: BTreeMap<String, String> = apps
        .iter()
        .map(|a| ((*a).to_owned(), "RUNNING".to_owned()))
        .collect();
    rayservice_ready(status) && active_apps(status) == running
}

/// POSTs `body` to the head's Serve proxy until it answers 200 with JSON; returns it.
async fn serve_answer(head: &RayHead, path: &str, body: Value) -> Value {
    fixture::serve_post(head, path, &body.to_string(), WAIT, |_| true).await
}

/// Serve's view as the dashboard gives it (raw JSON: replicas and proxies per node).
async fn serve_details(head: &RayHead) -> Value {
    let http = fixture::loopback_http(Duration::from_secs(10));
    let url = format!("{}/api/serve/applications/", head.dashboard_url());
    let bytes = http
        .get(&url)
        .send()
        .await
        .expect("Serve details")
        .bytes()
        .await
        .expect("Serve details body");
    serde_json::from_slice(&bytes).expect("Serve details are JSON")
}

/// The nodes the RUNNING replicas of `deployment` of `app` run on.
fn replica_nodes(details: &Value, app: &str, deployment: &str) -> Vec<String> {
    details["applications"][app]["deployments"][deployment]["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["state"] == "RUNNING")
        .filter_map(|r| r["node_id"].as_str().map(str::to_owned))
        .collect()
}

/// Every two-replica deployment with `max_replicas_per_node: 1` has one replica per node.
fn assert_spread(details: &Value, app: &str, deployments: &[&str]) {
    for deployment in deployments {
        let nodes = replica_nodes(details, app, deployment);
        let distinct: BTreeSet<&String> = nodes.iter().collect();
        assert_eq!(
            (nodes.len(), distinct.len()),
            (2, 2),
            "{app}/{deployment}: two RUNNING replicas on two nodes: {nodes:?}"
        );
    }
}

/// The samples leave `proxy_location` at Serve's default, EveryNode: a proxy on each of the two
/// nodes, both bound to the same 127.0.0.1 port. Serve binds its proxies' sockets with
/// SO_REUSEPORT (`SERVE_SOCKET_REUSE_PORT_ENABLED`, on by default), so the second bind
/// succeeds, the kernel spreads connections over both, and both report HEALTHY.
/// Serve's details once both nodes' proxies are HEALTHY, or after 90 s (then the assertion
/// below says what was seen): a worker node's proxy can still be STARTING when the
/// applications already run, more so on a loaded machine.
async fn details_once_every_node_has_a_proxy(head: &RayHead) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let details = serve_details(head).await;
        let healthy = details["proxies"]
            .as_object()
            .map(|p| p.values().filter(|p| p["status"] == "HEALTHY").count())
            .unwrap_or(0);
        if healthy >= 2 || Instant::now() > deadline {
            return details;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn assert_proxies_on_every_node(details: &Value) {
    assert_eq!(details["proxy_location"], "EveryNode");
    let proxies = details["proxies"].as_object().cloned().unwrap_or_default();
    let healthy = proxies
        .values()
        .filter(|p| p["status"] == "HEALTHY" && p["node_ip"] == "127.0.0.1")
        .count();
    assert_eq!(
        (proxies.len(), healthy),
        (2, 2),
        "one HEALTHY proxy per node: {}",
        serde_json::to_string(&proxies).unwrap()
    );
}

fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = &stat[stat.rfind(')')? + 1..];
            after.split_whitespace().next().map(|state| state != "Z")
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kuberay_sample_rayservices_become_ready_on_a_two_node_ray() {
    let started = Instant::now();
    // Its own head (the samples deploy two applications of their own and spread replicas over
    // two nodes): the shared head stays one node, and nothing of the test_dag stand-ins is on
    // this head's PYTHONPATH, so the imports work only through the downloaded working_dir.
    let head = RayHead::start(RayHeadOptions {
        num_cpus: Some(4),
        worker_nodes: 1,
        worker_node_num_cpus: Some(4),
        ..Default::default()
    })
    .await
    .expect("a Ray head with one worker node starts");
    let worker_roots = head.worker_node_root_pids();
    assert_eq!(worker_roots.len(), 1);
    let (mirror, downloads) = serve_test_dag().await;

    // ray-service.sample.yaml: fruit_app and math_app.
    let fx = fixture("rsvc-sample", &head, &mirror).await;
    let name = fx.apply_sample("ray-service.sample.yaml").await;
    let status = fx
        .status_until(&name, "Ready with both apps RUNNING", |s| {
            ready_with(s, &["fruit_app", "math_app"])
        })
        .await;
    let active = active_cluster_name(&status).expect("an active cluster");
    assert!(active.starts_with("rayservice-sample-"), "{active}");
    assert!(status.num_serve_endpoints.unwrap_or(0) >= 1, "{status:?}");
    fx.assert_traffic_goes_to(&name, &active).await;
    for (fruit, amount, total) in [("MANGO", 2, 6), ("ORANGE", 3, 6), ("PEAR", 12, 12)] {
        let answer = serve_answer(&head, "/fruit", json!([fruit, amount])).await;
        assert_eq!(answer, json!(total), "{fruit} × {amount}");
    }
    assert_eq!(
        serve_answer(&head, "/calc", json!(["ADD", 1])).await,
        json!(4)
    );
    assert_eq!(
        serve_answer(&head, "/calc", json!(["MUL", 2])).await,
        json!(10)
    );
    let details = details_once_every_node_has_a_proxy(&head).await;
    assert_spread(&details, "fruit_app", &["MangoStand"]);
    assert_proxies_on_every_node(&details);
    assert!(
        downloads.load(Ordering::SeqCst) >= 1,
        "the working_dir came from the mirror"
    );
    drop(fx);

    // ray-service.high-availability.yaml: the RayService plus Redis, a query Pod and their
    // ConfigMaps/Service/Deployment/Secret (plain objects on kwok). Its Serve config replaces
    // the first one on the same head (the first sample's controllers are stopped).
    let fx = fixture("rsvc-ha", &head, &mirror).await;
    let name = fx.apply_sample("ray-service.high-availability.yaml").await;
    let status = fx
        .status_until(&name, "Ready with fruit_app RUNNING", |s| {
            ready_with(s, &["fruit_app"])
        })
        .await;
    let active = active_cluster_name(&status).expect("an active cluster");
    assert!(active.starts_with("rayservice-ha-"), "{active}");
    fx.assert_traffic_goes_to(&name, &active).await;
    // The HA sample's own query: `["PEAR", 12]` to /fruit/.
    assert_eq!(
        serve_answer(&head, "/fruit/", json!(["PEAR", 12])).await,
        json!(12)
    );
    assert_eq!(
        serve_answer(&head, "/fruit", json!(["MANGO", 1])).await,
        json!(3)
    );
    let details = details_once_every_node_has_a_proxy(&head).await;
    assert_spread(
        &details,
        "fruit_app",
        &["MangoStand", "OrangeStand", "PearStand", "FruitMarket"],
    );
    assert_proxies_on_every_node(&details);
    drop(fx);

    // The project's own sample (samples/ray-service.yaml, its NewCluster RayService): a custom
    // serve Service and the head kept out of it, so the workers' endpoints make it Ready.
    let fx = fixture("rsvc-project", &head, &mirror).await;
    let sample = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/ray-service.yaml");
    let name = fx
        .apply_documents(&sample, |d| d["metadata"]["name"] == "rayservice-calc")
        .await;
    let status = fx
        .status_until(&name, "Ready with calc RUNNING", |s| {
            ready_with(s, &["calc"])
        })
        .await;
    let active = active_cluster_name(&status).expect("an active cluster");
    assert_eq!(
        fx.service_selects("rayservice-calc-serve").await,
        Some(active.clone()),
        "the custom serve Service keeps its name and selects the active cluster"
    );
    assert!(status.num_serve_endpoints.unwrap_or(0) >= 1, "{status:?}");
    // This sample's own user_config: factor 3, increment 1.
    assert_eq!(
        serve_answer(&head, "/calc", json!(["MUL", 2])).await,
        json!(6)
    );
    assert_eq!(
        serve_answer(&head, "/calc", json!(["ADD", 2])).await,
        json!(3)
    );
    drop(fx);

    // Every process of both nodes listens on loopback only; all of them go with stop().
    let addresses: Vec<SocketAddr> = head.listening_addresses();
    assert!(
        addresses
            .iter()
            .all(|a| a.ip().to_canonical().is_loopback()),
        "{addresses:?}"
    );
    let worker_ports = head.worker_node_ports()[0];
    assert!(
        addresses
            .iter()
            .any(|a| a.port() == worker_ports.node_manager),
        "the worker node's raylet is among the head's processes: {addresses:?}"
    );
    let pids = head.pids();
    assert!(pids.contains(&worker_roots[0]), "{pids:?}");
    head.stop();
    let leftovers: Vec<u32> = pids.into_iter().filter(|p| is_alive(*p)).collect();
    assert!(
        leftovers.is_empty(),
        "still running after stop: {leftovers:?}"
    );
    assert!(head.worker_node_root_pids().is_empty());
    eprintln!("kuberay samples: {:.1} s", started.elapsed().as_secs_f64());
}
