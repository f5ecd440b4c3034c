//! `NewClusterWithIncrementalUpgrade` on the real API server with the Gateway API CRDs
//! installed (from the `sigs.k8s.io/gateway-api` Go module, cached) and real Ray heads for the
//! Serve side (`target_capacity`). No Gateway controller runs: the tests write the status one
//! would (Accepted, Programmed, ResolvedRefs), and follow the HTTPRoute's weights and the
//! capacities step by step.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use raypipe::api::conditions;
use raypipe::api::rayservice::{RayServiceClusterStatus, RayServiceStatus};
use raypipe::controllers::rayservice::gateway::{Gateway, HTTPRoute};
use raypipe::devenv::control_plane::{ControlPlane, ControlPlaneOptions};
use raypipe::devenv::ray::{RayHead, RayHeadOptions};
use serde_json::{Value, json};

use crate::rayservice::{
    Fixture, app_status, echo_config, echo_service, fixture, fixture_on, fixture_with, pending_name,
};
use crate::support::e2e::Client;
use crate::support::fixture::{active_cluster_name, rayservice_ready};
use crate::support::{self, eventually};

/// The Gateway API release KubeRay v1.7 builds against.
const GATEWAY_API_VERSION: &str = "v1.4.1";
const WAIT: Duration = Duration::from_secs(240);

/// The standard-channel CRDs of Gateway and HTTPRoute, read from the Go module (downloaded
/// once through the Go module proxy by the `go` client, then cached under raypipe's cache).
fn gateway_api_crds() -> Vec<CustomResourceDefinition> {
    let cache = raypipe::devenv::binaries::cache_root()
        .join("gateway-api")
        .join(GATEWAY_API_VERSION);
    let files = [
        "gateway.networking.k8s.io_gateways.yaml",
        "gateway.networking.k8s.io_httproutes.yaml",
    ];
    if !files.iter().all(|f| cache.join(f).is_file()) {
        let output = Command::new("go")
            .args(["mod", "download", "-json"])
            .arg(format!("sigs.k8s.io/gateway-api@{GATEWAY_API_VERSION}"))
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=mod")
            .current_dir(std::env::temp_dir())
            .output()
            .expect("`go` runs (it fetches the Gateway API CRDs)");
        assert!(
            output.status.success(),
            "go mod download failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let info: Value = serde_json::from_slice(&output.stdout).expect("go prints JSON");
        let dir = PathBuf::from(info["Dir"].as_str().expect("the module's directory"));
        std::fs::create_dir_all(&cache).expect("the cache directory");
        for f in files {
            let from = dir.join("config/crd/standard").join(f);
            let partial = cache.join(format!("{f}.partial"));
            std::fs::copy(&from, &partial).expect("copy a CRD");
            std::fs::rename(&partial, cache.join(f)).expect("install a CRD");
        }
    }
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(cache.join(f)).expect("a cached CRD");
            serde_yaml::from_str(&text).expect("a CRD")
        })
        .collect()
}

async fn install_gateway_api(client: &kube::Client) {
    raypipe::devenv::control_plane::install_crds(
        client,
        &gateway_api_crds(),
        Duration::from_secs(60),
    )
    .await
    .expect("the Gateway API CRDs are served");
}

fn condition(type_: &str, generation: i64) -> Value {
    json!({
        "type": type_, "status": "True", "reason": type_, "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": generation
    })
}

/// Writes what a Gateway controller would: the Gateway is Accepted and Programmed.
async fn gateway_controller_accepts_gateway(client: &kube::Client, ns: &str, name: &str) {
    let api: Api<Gateway> = Api::namespaced(client.clone(), ns);
    let gw = eventually(WAIT, "the Gateway to exist", || async {
        api.get_opt(name).await.ok().flatten()
    })
    .await;
    let generation = gw.meta().generation.unwrap_or(1);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"conditions": [
            condition("Accepted", generation), condition("Programmed", generation)
        ]}})),
    )
    .await
    .expect("the Gateway's status is written");
}

/// Writes what a Gateway controller would: the route is Accepted by `gateway` with every
/// reference resolved.
async fn gateway_controller_accepts_route(
    client: &kube::Client,
    ns: &str,
    name: &str,
    gateway: (&str, &str),
) {
    let api: Api<HTTPRoute> = Api::namespaced(client.clone(), ns);
    let route = eventually(WAIT, "the HTTPRoute to exist", || async {
        api.get_opt(name).await.ok().flatten()
    })
    .await;
    let generation = route.meta().generation.unwrap_or(1);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"parents": [{
            "parentRef": {"name": gateway.1, "namespace": gateway.0},
            "controllerName": "example.com/test-gateway-controller",
            "conditions": [condition("Accepted", generation), condition("ResolvedRefs", generation)]
        }]}})),
    )
    .await
    .expect("the HTTPRoute's status is written");
}

/// Patches `inc` to a new head image serving "green"; returns the status once the pending
/// cluster serves at 0 %.
async fn upgrade_to_green(fx: &Fixture) -> RayServiceStatus {
    fx.patch_spec(
        "inc",
        json!({
            "serveConfigV2": echo_config("green"),
            "rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [{
                "name": "ray-head", "image": "rayproject/ray:2.60.0-py311",
                "ports": [
                    {"containerPort": 6379, "name": "gcs-server"},
                    {"containerPort": 8265, "name": "dashboard"},
                    {"containerPort": 8000, "name": "serve"}
                ],
                "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}
            }]}}}}
        }),
    )
    .await;
    fx.status_until("inc", "the pending cluster serving at 0 %", |s| {
        s.pending_service_status
            .as_ref()
            .is_some_and(|p| p.traffic_routed_percent == Some(0))
    })
    .await
}

fn incremental(object: &mut Value, step: i32, surge: i32) {
    object["spec"]["upgradeStrategy"] = json!({
        "type": "NewClusterWithIncrementalUpgrade",
        "clusterUpgradeOptions": {
            "gatewayClassName": "test-class",
            "stepSizePercent": step,
            "intervalSeconds": 1,
            "maxSurgePercent": surge
        }
    });
    object["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] = json!(true);
}

/// (active capacity, pending capacity, active traffic, pending traffic) as the status says.
fn split(status: &RayServiceStatus) -> (Option<i32>, Option<i32>, Option<i32>, Option<i32>) {
    let empty = RayServiceClusterStatus::default();
    let a = status.active_service_status.as_ref().unwrap_or(&empty);
    let p = status.pending_service_status.as_ref().unwrap_or(&empty);
    (
        a.target_capacity,
        p.target_capacity,
        a.traffic_routed_percent,
        p.traffic_routed_percent,
    )
}

async fn route(fx: &Fixture, name: &str) -> Option<HTTPRoute> {
    Api::<HTTPRoute>::namespaced(fx.client.clone(), &fx.ns)
        .get_opt(name)
        .await
        .expect("read the HTTPRoute")
}

/// The route's backends as (Service, weight).
fn backends(route: &HTTPRoute) -> Vec<(String, i32)> {
    route.spec.rules[0]
        .backend_refs
        .iter()
        .map(|b| (b.name.clone(), b.weight.unwrap_or(1)))
        .collect()
}

async fn second_head() -> &'static RayHead {
    Box::leak(Box::new(
        RayHead::start(RayHeadOptions {
            python_path: vec![support::ray_test_apps_dir()],
            ..Default::default()
        })
        .await
        .expect("a second Ray head starts"),
    ))
}

/// Serve's own `target_capacity` on a head.
async fn serve_target_capacity(head: &RayHead) -> Option<f64> {
    let dashboard = head.client(Duration::from_secs(30)).unwrap();
    dashboard
        .get_serve_applications()
        .await
        .expect("Serve answers")
        .target_capacity
}

/// Follows an upgrade until `done`, checking KubeRay's invariants at every status seen;
/// returns the distinct (capacity, traffic) states in order.
async fn follow(
    fx: &Fixture,
    name: &str,
    rolling_back: bool,
    done: impl Fn(&RayServiceStatus) -> bool,
) -> Vec<(Option<i32>, Option<i32>, Option<i32>, Option<i32>)> {
    let api = fx.services();
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let status = api.get(name).await.unwrap().status.unwrap_or_default();
        let s = split(&status);
        if seen.last() != Some(&s) {
            seen.push(s);
        }
        if pending_name(&status).is_some() {
            let (_, pc, at, pt) = s;
            if let (Some(pc), Some(at), Some(pt)) = (pc, at, pt) {
                assert_eq!(at + pt, 100, "weights always sum to 100: {seen:?}");
                if !rolling_back {
                    assert!(pt <= pc, "traffic never exceeds capacity: {seen:?}");
                }
            }
            // The serve Service keeps endpoints throughout (raypipe's improvement).
            assert!(
                rayservice_ready(&status),
                "Ready stays True during an incremental upgrade: {status:?}"
            );
        }
        if done(&status) {
            return seen;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the upgrade did not finish; states: {seen:?}; status: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incremental_upgrade_moves_capacity_and_weights_step_by_step_then_promotes() {
    let head_a = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let head_b = second_head().await;
    let fx = fixture("rsvc-incr", vec![head_a, head_b]).await;
    install_gateway_api(&fx.client).await;
    let mut object = echo_service("inc", "blue", "rayproject/ray:2.60.0");
    incremental(&mut object, 25, 50);
    fx.create(&object).await;

    // First start: KubeRay's Gateway right away; the first cluster at full capacity.
    let gw = eventually(WAIT, "the Gateway", || async {
        Api::<Gateway>::namespaced(fx.client.clone(), &fx.ns)
            .get_opt("inc-gateway")
            .await
            .ok()
            .flatten()
    })
    .await;
    assert_eq!(gw.spec.gateway_class_name, "test-class");
    assert_eq!(
        serde_json::to_value(&gw.spec.listeners).unwrap(),
        json!([{"name": "http", "protocol": "HTTP", "port": 80}])
    );
    let status = fx
        .status_until("inc", "Ready", |s| {
            rayservice_ready(s) && app_status(s, "echo").as_deref() == Some("RUNNING")
        })
        .await;
    let old = active_cluster_name(&status).unwrap();
    assert_eq!(split(&status).0, Some(100), "{status:?}");
    assert_eq!(serve_target_capacity(head_a).await, Some(100.0));
    let first_route = eventually(WAIT, "the HTTPRoute", || async {
        route(&fx, "inc-httproute").await
    })
    .await;
    assert_eq!(backends(&first_route), [(format!("{old}-serve-svc"), 100)]);
    assert_eq!(
        serde_json::to_value(&first_route.spec.parent_refs).unwrap(),
        json!([{"name": "inc-gateway", "namespace": fx.ns}])
    );
    let per_cluster = Api::<Service>::namespaced(fx.client.clone(), &fx.ns)
        .get(&format!("{old}-serve-svc"))
        .await
        .expect("the active cluster's serve Service");
    assert_eq!(
        per_cluster.owner_references()[0].kind,
        "RayCluster",
        "deleted with its cluster"
    );
    assert_eq!(fx.service_selects("inc-serve-svc").await, Some(old.clone()));

    // A new image: a pending cluster at 0 % capacity. Without a ready Gateway nothing moves.
    let status = upgrade_to_green(&fx).await;
    let new = pending_name(&status).unwrap();
    assert_eq!(split(&status), (Some(100), Some(0), Some(100), Some(0)));
    assert_eq!(
        backends(&route(&fx, "inc-httproute").await.unwrap()),
        [
            (format!("{old}-serve-svc"), 100),
            (format!("{new}-serve-svc"), 0)
        ]
    );
    let upgrade = conditions::find(&status.conditions, "UpgradeInProgress").unwrap();
    assert_eq!(upgrade.status, "True");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let still = fx.services().get("inc").await.unwrap().status.unwrap();
    assert_eq!(
        split(&still),
        (Some(100), Some(0), Some(100), Some(0)),
        "capacity waits for the Gateway and the route to be ready"
    );

    // The Gateway controller's word: now capacity and traffic alternate to the new cluster.
    gateway_controller_accepts_gateway(&fx.client, &fx.ns, "inc-gateway").await;
    gateway_controller_accepts_route(&fx.client, &fx.ns, "inc-httproute", (&fx.ns, "inc-gateway"))
        .await;
    let states = follow(&fx, "inc", false, |s| {
        active_cluster_name(s).as_deref() == Some(new.as_str()) && pending_name(s).is_none()
    })
    .await;
    // KubeRay's sequence for stepSize 25, maxSurge 50 (each state as the status showed it),
    // then the promoted cluster with everything.
    let expected = [
        (Some(100), Some(0), Some(100), Some(0)),
        (Some(100), Some(50), Some(100), Some(0)),
        (Some(100), Some(50), Some(75), Some(25)),
        (Some(100), Some(50), Some(50), Some(50)),
        (Some(50), Some(50), Some(50), Some(50)),
        (Some(50), Some(100), Some(50), Some(50)),
        (Some(50), Some(100), Some(25), Some(75)),
        // (50, 100, 0, 100) follows, but the serve Service's switch in that pass wakes the
        // next pass at once (active capacity to 0, promotion): too short-lived to poll.
        (Some(100), None, Some(100), None),
    ];
    let mut rest = states.iter();
    for state in expected {
        assert!(
            rest.any(|s| *s == state),
            "state {state:?} missing or out of order in {states:?}"
        );
    }
    // Promoted: the new cluster has everything; the old one drained to 0 before.
    let done = fx.services().get("inc").await.unwrap().status.unwrap();
    assert_eq!(split(&done).0, Some(100));
    assert_eq!(split(&done).2, Some(100));
    assert_eq!(
        serve_target_capacity(head_a).await,
        Some(0.0),
        "the old cluster drained"
    );
    assert_eq!(serve_target_capacity(head_b).await, Some(100.0));
    fixture_serve_answer(head_b, "green").await;
    let final_route = eventually(WAIT, "the route on the new cluster only", || async {
        let r = route(&fx, "inc-httproute").await?;
        (backends(&r).len() == 1).then_some(r)
    })
    .await;
    assert_eq!(backends(&final_route), [(format!("{new}-serve-svc"), 100)]);
    assert_eq!(fx.service_selects("inc-serve-svc").await, Some(new.clone()));
    let upgrade = conditions::find(&done.conditions, "UpgradeInProgress").unwrap();
    assert_eq!(
        (upgrade.status.as_str(), upgrade.reason.as_str()),
        ("False", "NoPendingCluster")
    );
    eventually(WAIT, "the old cluster deleted", || async {
        let names: Vec<String> = fx.clusters().await.iter().map(|c| c.name_any()).collect();
        (names == [new.clone()]).then_some(())
    })
    .await;
    let reasons = fx.event_reasons().await;
    for reason in [
        "CreatedGateway",
        "CreatedHTTPRoute",
        "UpdatedHTTPRoute",
        "UpdatedServeTargetCapacity",
    ] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "no {reason} event: {reasons:?}"
        );
    }
}

async fn fixture_serve_answer(head: &RayHead, greeting: &str) {
    crate::support::fixture::serve_post(head, "/echo", "hi", WAIT, |b| b["greeting"] == greeting)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reverted_spec_rolls_traffic_back_through_a_shared_gateway_and_suspend_cleans_up() {
    let head_a = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let head_b = second_head().await;
    let fx = fixture("rsvc-rollback", vec![head_a, head_b]).await;
    install_gateway_api(&fx.client).await;
    // The platform's shared Gateway, made by someone else.
    let shared: Gateway = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "edge"},
        "spec": {"gatewayClassName": "platform", "listeners": [{"name": "web", "protocol": "HTTP", "port": 8080}]}
    }))
    .unwrap();
    Api::<Gateway>::namespaced(fx.client.clone(), &fx.ns)
        .create(&PostParams::default(), &shared)
        .await
        .expect("the shared Gateway");
    gateway_controller_accepts_gateway(&fx.client, &fx.ns, "edge").await;

    let mut object = echo_service("rb", "blue", "rayproject/ray:2.60.0");
    incremental(&mut object, 25, 50);
    object["metadata"]["annotations"] = json!({"raypipe.dev/gateway": "edge"});
    let original_cluster = object["spec"]["rayClusterConfig"].clone();
    fx.create(&object).await;
    let status = fx
        .status_until("rb", "Ready", |s| {
            rayservice_ready(s) && app_status(s, "echo").as_deref() == Some("RUNNING")
        })
        .await;
    let old = active_cluster_name(&status).unwrap();
    let r = eventually(WAIT, "the HTTPRoute", || async {
        route(&fx, "rb-httproute").await
    })
    .await;
    assert_eq!(
        serde_json::to_value(&r.spec.parent_refs).unwrap(),
        json!([{"name": "edge", "namespace": fx.ns}]),
        "the route attaches to the shared Gateway"
    );
    assert!(
        Api::<Gateway>::namespaced(fx.client.clone(), &fx.ns)
            .get_opt("rb-gateway")
            .await
            .unwrap()
            .is_none(),
        "no Gateway of its own"
    );
    gateway_controller_accepts_route(&fx.client, &fx.ns, "rb-httproute", (&fx.ns, "edge")).await;

    // Upgrade, and revert once some traffic moved.
    let mut upgraded = original_cluster.clone();
    upgraded["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] =
        json!("rayproject/ray:2.60.0-py311");
    fx.patch_spec("rb", json!({"rayClusterConfig": upgraded}))
        .await;
    let status = fx
        .status_until("rb", "some traffic on the new cluster", |s| {
            split(s).3.is_some_and(|t| t >= 25)
        })
        .await;
    let new = pending_name(&status).unwrap();
    fx.services()
        .patch(
            "rb",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"rayClusterConfig": original_cluster}})),
        )
        .await
        .unwrap();
    let status = fx
        .status_until("rb", "RollbackInProgress", |s| {
            conditions::find(&s.conditions, "RollbackInProgress")
                .is_some_and(|c| c.status == "True")
        })
        .await;
    let rollback = conditions::find(&status.conditions, "RollbackInProgress").unwrap();
    assert_eq!(rollback.reason, "DesiredClusterSpecChanged");
    let states = follow(&fx, "rb", true, |s| pending_name(s).is_none()).await;
    // Traffic only flows back during the rollback.
    let pending_traffic: Vec<i32> = states.iter().filter_map(|s| s.3).collect();
    assert!(
        pending_traffic.windows(2).all(|w| w[1] <= w[0]),
        "traffic flows back to the active cluster: {states:?}"
    );
    let done = fx.services().get("rb").await.unwrap().status.unwrap();
    assert_eq!(
        active_cluster_name(&done),
        Some(old.clone()),
        "the old cluster stays"
    );
    assert_eq!(split(&done).0, Some(100));
    assert_eq!(split(&done).2, Some(100));
    assert!(conditions::find(&done.conditions, "RollbackInProgress").is_none());
    let upgrade = conditions::find(&done.conditions, "UpgradeInProgress").unwrap();
    assert_eq!(
        (upgrade.status.as_str(), upgrade.reason.as_str()),
        ("False", "NoPendingCluster")
    );
    eventually(WAIT, "the rolled-back cluster deleted", || async {
        let names: Vec<String> = fx.clusters().await.iter().map(|c| c.name_any()).collect();
        (!names.contains(&new)).then_some(())
    })
    .await;
    assert_eq!(serve_target_capacity(head_a).await, Some(100.0));
    fixture_serve_answer(head_a, "blue").await;

    // Suspend: the route goes, the shared Gateway stays.
    fx.patch_spec("rb", json!({"suspend": true})).await;
    fx.status_until("rb", "Suspended", |s| {
        conditions::find(&s.conditions, "Suspended").is_some_and(|c| c.status == "True")
    })
    .await;
    assert!(route(&fx, "rb-httproute").await.is_none());
    assert!(
        Api::<Gateway>::namespaced(fx.client.clone(), &fx.ns)
            .get_opt("edge")
            .await
            .unwrap()
            .is_some(),
        "a shared Gateway is never deleted"
    );
    let reasons = fx.event_reasons().await;
    assert!(
        reasons.iter().any(|r| r == "DeletedHTTPRoute"),
        "{reasons:?}"
    );
    assert!(
        !reasons.iter().any(|r| r == "CreatedGateway"),
        "{reasons:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incremental_rayservice_of_kuberays_sample_shape_is_accepted_and_gets_its_gateway() {
    // No Ray answers: the Kubernetes side is what is checked here. The object has the shape of
    // KubeRay's `ray-service.incremental-upgrade.yaml` (not among the shared samples): in-tree
    // autoscaling, and step 10 % every 30 s with 20 % surge through a Gateway of class `istio`.
    let nowhere =
        raypipe::ray::DashboardLocator::resolver(|_| Some("http://127.0.0.1:9".to_owned()));
    let config = raypipe::controllers::rayservice::Config {
        dashboard: nowhere,
        ..raypipe::controllers::rayservice::Config::default()
    };
    let fx = fixture_with("rsvc-incr-sample", config, WAIT).await;
    install_gateway_api(&fx.client).await;
    let mut doc = echo_service(
        "rayservice-incremental-upgrade",
        "hello",
        "rayproject/ray:2.60.0",
    );
    incremental(&mut doc, 10, 20);
    doc["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["gatewayClassName"] = json!("istio");
    doc["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["intervalSeconds"] = json!(30);
    fx.create(&doc).await;
    let name = "rayservice-incremental-upgrade";
    let gw = eventually(WAIT, "the sample's Gateway", || async {
        Api::<Gateway>::namespaced(fx.client.clone(), &fx.ns)
            .get_opt(&format!("{name}-gateway"))
            .await
            .ok()
            .flatten()
    })
    .await;
    assert_eq!(gw.spec.gateway_class_name, "istio");
    let status = fx
        .status_until(name, "a first cluster at full capacity", |s| {
            s.pending_service_status
                .as_ref()
                .is_some_and(|p| p.target_capacity == Some(100))
        })
        .await;
    assert!(pending_name(&status).is_some());
    eventually(WAIT, "the sample's RayCluster", || async {
        (!fx.clusters().await.is_empty()).then_some(())
    })
    .await;
    let reasons = fx.event_reasons().await;
    assert!(
        !reasons.iter().any(|r| r == "InvalidRayServiceSpec"),
        "the sample is valid: {reasons:?}"
    );
}

/// How long the kube-apiserver is stopped mid-upgrade.
const APISERVER_DOWN: Duration = Duration::from_secs(10);
/// From the kube-apiserver answering again to the new cluster promoted: about 3× what was
/// measured (BENCHMARKS.md).
const APISERVER_RESTARTED_BOUND: Duration = Duration::from_secs(45);

/// On a full control plane of its own (others share the default one): an incremental upgrade
/// as above, and once capacity and traffic moved partly (the new cluster takes some traffic,
/// not all), the kube-apiserver is stopped for 10 s and started again on the same port and
/// etcd; the test's RayCluster and RayService controllers keep running. The upgrade goes on
/// from where it was (the new cluster's traffic never drops below what it had, the weights
/// still sum to 100 and traffic never exceeds capacity), promotes the new cluster within the
/// bound, and cleans up as without the fault: the old cluster drained and deleted, the route
/// on the new one only. No RayCluster or Pod made again. No Gateway controller runs (as above),
/// so clients send to each cluster's Serve directly wherever it has a healthy replica, and no
/// request may fail: to the old one's while the kube-apiserver is away (its capacity stays at
/// least 50 % until after), to the new one's from the fault to the end (at least 50 % from
/// before the fault on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "its own control plane and two Ray heads: about 3 minutes, out of CI for time; run by hand"]
async fn apiserver_restarted_mid_incremental_upgrade_the_upgrade_completes() {
    raypipe::startup::init_crypto();
    let head_a = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let head_b = second_head().await;
    let mut plane = ControlPlane::start(ControlPlaneOptions::full())
        .await
        .expect("a dedicated control plane");
    let client = plane.client().await.expect("a client");
    let fx = fixture_on(client, "fault-incr-apiserver", vec![head_a, head_b]).await;
    install_gateway_api(&fx.client).await;
    let mut object = echo_service("inc", "blue", "rayproject/ray:2.60.0");
    incremental(&mut object, 25, 50);
    fx.create(&object).await;
    let status = fx
        .status_until("inc", "Ready", |s| {
            rayservice_ready(s) && app_status(s, "echo").as_deref() == Some("RUNNING")
        })
        .await;
    let old = active_cluster_name(&status).unwrap();
    let new = pending_name(&upgrade_to_green(&fx).await).unwrap();
    gateway_controller_accepts_gateway(&fx.client, &fx.ns, "inc-gateway").await;
    gateway_controller_accepts_route(&fx.client, &fx.ns, "inc-httproute", (&fx.ns, "inc-gateway"))
        .await;

    // Between steps: some traffic on the new cluster, not all of it.
    let api = fx.services();
    let deadline = Instant::now() + WAIT;
    let at_fault = loop {
        let status = api.get("inc").await.unwrap().status.unwrap_or_default();
        assert_eq!(
            pending_name(&status).as_deref(),
            Some(new.as_str()),
            "the upgrade ended before the fault: {status:?}"
        );
        if split(&status).3.is_some_and(|t| t > 0 && t < 100) {
            break split(&status);
        }
        assert!(Instant::now() < deadline, "no traffic moved: {status:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (clusters_before, pods_before) = crate::faults::children(&fx.client, &fx.ns).await;
    let created_before =
        crate::faults::events(&fx.client, &fx.ns, "inc", "CreatedRayCluster").await;
    let to_old = Client::start(format!("{}/echo", head_a.serve_url()));
    let to_new = Client::start(format!("{}/echo", head_b.serve_url()));
    let outage = plane
        .restart_apiserver(APISERVER_DOWN)
        .await
        .expect("the kube-apiserver restarts");
    let back = Instant::now();
    let old_traffic = to_old.traffic.clone();
    let during = to_old.stop().await;
    let states = follow(&fx, "inc", false, |s| {
        active_cluster_name(s).as_deref() == Some(new.as_str()) && pending_name(s).is_none()
    })
    .await;
    let converged = back.elapsed();

    // Cleaned up as without the fault.
    eventually(WAIT, "the old cluster deleted", || async {
        let names: Vec<String> = fx.clusters().await.iter().map(|c| c.name_any()).collect();
        (names == [new.clone()]).then_some(())
    })
    .await;
    let cleaned_up = back.elapsed();
    let final_route = eventually(WAIT, "the route on the new cluster only", || async {
        let r = route(&fx, "inc-httproute").await?;
        (backends(&r).len() == 1).then_some(r)
    })
    .await;
    let new_traffic = to_new.traffic.clone();
    let after = to_new.stop().await;
    let requests = (during.0 + after.0, during.1 + after.1);
    let (clusters_after, pods_after) = crate::faults::children(&fx.client, &fx.ns).await;
    let created_after = crate::faults::events(&fx.client, &fx.ns, "inc", "CreatedRayCluster").await;
    let duplicates = clusters_after.difference(&clusters_before).count()
        + pods_after.difference(&pods_before).count();
    eprintln!(
        "apiserver restarted mid-incremental-upgrade: unreachable {:.1} s; (active capacity, pending capacity, active traffic, pending traffic) at the fault {at_fault:?}, after {states:?}; old cluster deleted {:.1} s after; CreatedRayCluster {created_before} before, {created_after} after; (answers, failed) from the old cluster's Serve during the outage {during:?}, from the new one's to the end {after:?}",
        outage.as_secs_f64(),
        cleaned_up.as_secs_f64()
    );
    crate::faults::fault_bound(
        "apiserver_restarted_mid_incremental_upgrade",
        converged,
        requests,
        duplicates,
    );
    assert!(
        during.0 > 20 && after.0 > 20,
        "the clients kept sending: {during:?} {after:?}"
    );
    assert_eq!(
        requests.1,
        0,
        "requests failed: {:?} {:?}",
        old_traffic.failures(),
        new_traffic.failures()
    );
    let pending_traffic: Vec<i32> = states.iter().filter_map(|s| s.3).collect();
    assert!(
        pending_traffic.iter().all(|t| *t >= at_fault.3.unwrap()),
        "the upgrade started over: {at_fault:?} at the fault, then {states:?}"
    );
    assert_eq!(duplicates, 0, "a RayCluster or Pod made again");
    assert_eq!(created_after, 2, "one RayCluster created per spec");
    assert!(
        pods_after.is_subset(&pods_before) && !pods_after.is_empty(),
        "the new cluster's Pods kept: {pods_before:?} → {pods_after:?}"
    );
    let done = api.get("inc").await.unwrap().status.unwrap();
    assert_eq!(split(&done), (Some(100), None, Some(100), None));
    let upgrade = conditions::find(&done.conditions, "UpgradeInProgress").unwrap();
    assert_eq!(
        (upgrade.status.as_str(), upgrade.reason.as_str()),
        ("False", "NoPendingCluster")
    );
    assert_eq!(backends(&final_route), [(format!("{new}-serve-svc"), 100)]);
    assert_eq!(fx.service_selects("inc-serve-svc").await, Some(new.clone()));
    assert_ne!(old, new);
    assert_eq!(
        serve_target_capacity(head_a).await,
        Some(0.0),
        "the old cluster drained"
    );
    assert_eq!(serve_target_capacity(head_b).await, Some(100.0));
    fixture_serve_answer(head_b, "green").await;
    assert!(
        converged < APISERVER_RESTARTED_BOUND,
        "promoted {converged:?} after the restart, bound {APISERVER_RESTARTED_BOUND:?}"
    );
    drop(fx);
}
