//! The RayService controller on a real API server + kube-controller-manager + kwok (the Pods of
//! the RayClusters it owns), talking to real Ray heads on 127.0.0.1 (the dashboards of those
//! clusters, through a locator override). Every test has its own namespace and its own
//! namespace-scoped RayCluster and RayService controllers; tests that deploy Serve on the
//! shared head take turns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use raypipe::api::RayCluster;
use raypipe::api::conditions;
use raypipe::api::rayservice::{RayService, RayServiceStatus};
use raypipe::controllers::rayservice::build::HttpBinding;
use raypipe::controllers::{raycluster, rayservice};
use raypipe::devenv::ray::{RayHead, RayHeadOptions};
use raypipe::ray::{DashboardLocator, DashboardUrl};
use serde_json::{Value, json};

use crate::support::fixture::{self, active_cluster_name, rayservice_ready};
use crate::support::{self, eventually};

const WAIT: Duration = Duration::from_secs(180);

/// A namespace with its own RayCluster and RayService controllers (the RayService module's tests
/// and `rayservice_samples`, `rayservice_incremental` share it); dropping it stops them.
pub(crate) struct Fixture {
    pub(crate) client: kube::Client,
    pub(crate) ns: String,
    metrics: raypipe::admin::Metrics,
    /// How long `status_until` waits.
    wait: Duration,
    /// Stops the test's controllers when the fixture is dropped.
    _stop: fixture::Stopper,
}

/// Maps each RayCluster (by its head Service) to one of `heads`, in the order clusters first
/// ask: the first cluster gets the first head, the next one the second.
pub(crate) fn locator_over(
    heads: Vec<&'static RayHead>,
) -> (DashboardLocator, rayservice::HttpBindingFor) {
    let assigned: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let urls: Vec<String> = heads
        .iter()
        .map(|h| h.dashboard_url().as_str().to_owned())
        .collect();
    let bindings: Vec<(String, u16)> = heads
        .iter()
        .map(|h| (h.dashboard_url().authority(), h.ports().serve_http))
        .collect();
    let locator = DashboardLocator::resolver(move |head| {
        let mut assigned = assigned.lock().unwrap();
        let next = assigned.len();
        let index = *assigned
            .entry(format!("{}/{}", head.namespace, head.name))
            .or_insert(next);
        urls.get(index % urls.len()).cloned()
    });
    let binding: rayservice::HttpBindingFor = Arc::new(move |url: &DashboardUrl| {
        let authority = url.authority();
        bindings
            .iter()
            .find(|(a, _)| *a == authority)
            .map(|(_, port)| HttpBinding {
                host: "127.0.0.1".to_owned(),
                port: *port,
            })
    });
    (locator, binding)
}

pub(crate) async fn fixture(prefix: &str, heads: Vec<&'static RayHead>) -> Fixture {
    fixture_on(support::client().await, prefix, heads).await
}

/// `fixture` on the control plane `client` talks to (a test's own, when it disturbs it).
pub(crate) async fn fixture_on(
    client: kube::Client,
    prefix: &str,
    heads: Vec<&'static RayHead>,
) -> Fixture {
    let (locator, binding) = locator_over(heads);
    let config = rayservice::Config {
        dashboard: locator,
        http_binding: Some(binding),
        ..rayservice::Config::default()
    };
    fixture_with_on(client, prefix, config, WAIT).await
}

/// A namespace with its own RayCluster and RayService controllers, finding dashboards
/// through `locator`.
pub(crate) async fn fixture_with(
    prefix: &str,
    config: rayservice::Config,
    wait: Duration,
) -> Fixture {
    fixture_with_on(support::client().await, prefix, config, wait).await
}

/// `fixture_with` on the control plane `client` talks to.
async fn fixture_with_on(
    client: kube::Client,
    prefix: &str,
    config: rayservice::Config,
    wait: Duration,
) -> Fixture {
    let ns = support::namespace(&client, prefix).await;
    let mut stop = fixture::Stopper::default();
    let metrics = raypipe::admin::Metrics::new();
    let cluster_config = raycluster::Config {
        concurrency: 4,
        metrics: metrics.clone(),
        ..raycluster::Config::default()
    };
    fixture::spawn_raycluster_controller(&client, &ns, cluster_config, &mut stop);
    // Tests settle faster than production's steady poll, unless they ask for another one.
    let steady_poll = if config.steady_poll == rayservice::Config::default().steady_poll {
        Duration::from_secs(2)
    } else {
        config.steady_poll
    };
    tokio::spawn(rayservice::run(
        client.clone(),
        rayservice::Config {
            namespace: Some(ns.clone()),
            concurrency: 4,
            steady_poll,
            metrics: metrics.clone(),
            ..config
        },
        stop.signal(),
    ));
    Fixture {
        client,
        ns,
        metrics,
        wait,
        _stop: stop,
    }
}

/// A small RayService serving the echo test app (importable on the test heads).
pub(crate) fn echo_service(name: &str, greeting: &str, image: &str) -> Value {
    json!({
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name},
        "spec": {
            "rayClusterDeletionDelaySeconds": 1,
            "serveConfigV2": echo_config(greeting),
            "rayClusterConfig": {
                "rayVersion": "2.60.0",
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{
                        "name": "ray-head",
                        "image": image,
                        "ports": [
                            {"containerPort": 6379, "name": "gcs-server"},
                            {"containerPort": 8265, "name": "dashboard"},
                            {"containerPort": 8000, "name": "serve"}
                        ],
                        "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}
                    }]}}
                },
                "workerGroupSpecs": [{
                    "groupName": "small",
                    "replicas": 1,
                    "minReplicas": 1,
                    "maxReplicas": 2,
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{
                        "name": "ray-worker",
                        "image": image,
                        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}
                    }]}}
                }]
            }
        }
    })
}

pub(crate) fn echo_config(greeting: &str) -> String {
    format!(
        r#"proxy_location: HeadOnly
applications:
  - name: echo
    route_prefix: /echo
    import_path: raypipe_echo:build
    args:
      greeting: {greeting}
    deployments:
      - name: Echo
        num_replicas: 1
        ray_actor_options:
          num_cpus: 0.05
"#
    )
}

impl Fixture {
    pub(crate) fn services(&self) -> Api<RayService> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub(crate) async fn create(&self, object: &Value) -> RayService {
        let service: RayService = serde_json::from_value(object.clone()).expect("a RayService");
        self.services()
            .create(&PostParams::default(), &service)
            .await
            .expect("the RayService is created")
    }

    pub(crate) async fn patch_spec(&self, name: &str, spec: Value) {
        self.services()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": spec})),
            )
            .await
            .expect("the RayService is patched");
    }

    /// Waits until the status satisfies `check`; returns it.
    pub(crate) async fn status_until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&RayServiceStatus) -> bool,
    ) -> RayServiceStatus {
        fixture::rayservice_status_until(&self.client, &self.ns, name, what, self.wait, check).await
    }

    pub(crate) async fn clusters(&self) -> Vec<RayCluster> {
        Api::<RayCluster>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .expect("list RayClusters")
            .items
            .into_iter()
            .filter(|c| c.meta().deletion_timestamp.is_none())
            .collect()
    }

    pub(crate) async fn service_selects(&self, name: &str) -> Option<String> {
        let svc = Api::<Service>::namespaced(self.client.clone(), &self.ns)
            .get_opt(name)
            .await
            .expect("get Service")?;
        svc.spec?.selector?.get("ray.io/cluster").cloned()
    }

    pub(crate) async fn event_reasons(&self) -> Vec<String> {
        fixture::events(&self.client, &self.ns)
            .await
            .into_iter()
            .filter_map(|e| e.reason)
            .collect()
    }
}

pub(crate) fn pending_name(status: &RayServiceStatus) -> Option<String> {
    status
        .pending_service_status
        .as_ref()?
        .ray_cluster_name
        .clone()
}

pub(crate) fn app_status(status: &RayServiceStatus, app: &str) -> Option<String> {
    status
        .active_service_status
        .as_ref()?
        .application_statuses
        .as_ref()?
        .get(app)?
        .status
        .clone()
}

/// POSTs to a head's Serve proxy until it answers 200 with `check` true; returns the body.
async fn serve_answer(head: &RayHead, path: &str, check: impl Fn(&Value) -> bool) -> Value {
    fixture::serve_post(head, path, "hi", WAIT, check).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rayservice_becomes_ready_updates_in_place_and_recovers_a_head_that_lost_serve() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let fx = fixture("rsvc-ready", vec![head]).await;
    fx.create(&echo_service("echo", "hello", "rayproject/ray:2.60.0"))
        .await;

    // Ready: the cluster exists, Serve runs the app, the head Pod serves, endpoints counted.
    let status = fx
        .status_until("echo", "Ready", |s| {
            rayservice_ready(s) && app_status(s, "echo").as_deref() == Some("RUNNING")
        })
        .await;
    let active = active_cluster_name(&status).expect("an active cluster");
    assert!(active.starts_with("echo-"), "{active}");
    assert_eq!(pending_name(&status), None);
    assert_eq!(status.service_status.map(|_| "Running"), Some("Running"));
    assert!(status.num_serve_endpoints.unwrap_or(0) >= 1, "{status:?}");
    let upgrade = conditions::find(&status.conditions, "UpgradeInProgress").unwrap();
    assert_eq!(
        (upgrade.status.as_str(), upgrade.reason.as_str()),
        ("False", "NoPendingCluster")
    );
    assert_eq!(
        fx.service_selects("echo-serve-svc").await,
        Some(active.clone())
    );
    assert_eq!(
        fx.service_selects("echo-head-svc").await,
        Some(active.clone())
    );
    let heads = Api::<Pod>::namespaced(fx.client.clone(), &fx.ns)
        .list(
            &ListParams::default()
                .labels(&format!("ray.io/cluster={active},ray.io/node-type=head")),
        )
        .await
        .unwrap()
        .items;
    assert_eq!(heads.len(), 1);
    assert_eq!(
        heads[0].labels().get("ray.io/serve").map(String::as_str),
        Some("true"),
        "the head Pod serves once its proxy is healthy"
    );
    serve_answer(head, "/echo", |b| b["greeting"] == "hello").await;

    // A Serve-config-only change is applied in place: same cluster, new answer.
    fx.patch_spec("echo", json!({"serveConfigV2": echo_config("bonjour")}))
        .await;
    serve_answer(head, "/echo", |b| b["greeting"] == "bonjour").await;
    let status = fx
        .status_until("echo", "still ready on the same cluster", |s| {
            rayservice_ready(s) && app_status(s, "echo").as_deref() == Some("RUNNING")
        })
        .await;
    assert_eq!(active_cluster_name(&status), Some(active.clone()));
    assert_eq!(pending_name(&status), None);
    assert_eq!(
        fx.clusters().await.len(),
        1,
        "no second cluster for a config change"
    );

    // The head loses its applications (as a head restarted without GCS FT would): they are
    // pushed again, though the operator's memory says they were pushed.
    let dashboard = head.client(Duration::from_secs(30)).unwrap();
    dashboard.delete_serve_applications().await.unwrap();
    eventually(WAIT, "Serve to report no applications", || async {
        let details = dashboard.get_serve_applications().await.ok()?;
        details.applications.is_empty().then_some(())
    })
    .await;
    serve_answer(head, "/echo", |b| b["greeting"] == "bonjour").await;
    // Only the controller pushes configs: the answer above proves the second push.
    let reasons = fx.event_reasons().await;
    for reason in [
        "CreatedRayCluster",
        "CreatedService",
        "UpdatedHeadPodServeLabel",
        "UpdatedServeApplications",
    ] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "no {reason} event: {reasons:?}"
        );
    }
}

/// Serve losing what the operator pushed, at production's pace (a settled RayService is
/// reconciled once a minute here, far longer than the watch needs): someone replaces the Serve
/// config with one that lacks an application (Serve deletes it), and later the whole of Serve is
/// deleted. Each time the operator's watch notices within a second or two and pushes the config
/// again, and a client of the lost application sees errors only for the few seconds Serve needs
/// to start it again. Before the watch, a lost application next to a running one was never
/// pushed again, and a deleted Serve waited for the steady poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_losing_what_was_pushed_is_noticed_and_restored_within_seconds() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let (locator, binding) = locator_over(vec![head]);
    let fx = fixture_with(
        "rsvc-lost",
        rayservice::Config {
            dashboard: locator,
            http_binding: Some(binding),
            steady_poll: Duration::from_secs(60),
            ..rayservice::Config::default()
        },
        WAIT,
    )
    .await;
    let two_apps = format!(
        "{}  - name: echo2\n    route_prefix: /echo2\n    import_path: raypipe_echo:build\n    args:\n      greeting: second\n    deployments:\n      - name: Echo\n        num_replicas: 1\n        ray_actor_options:\n          num_cpus: 0.05\n",
        echo_config("first")
    );
    let mut service = echo_service("lost", "first", "rayproject/ray:2.60.0");
    service["spec"]["serveConfigV2"] = json!(two_apps);
    fx.create(&service).await;
    fx.status_until("lost", "Ready with both applications", |s| {
        rayservice_ready(s)
            && app_status(s, "echo").as_deref() == Some("RUNNING")
            && app_status(s, "echo2").as_deref() == Some("RUNNING")
    })
    .await;
    serve_answer(head, "/echo2", |b| b["greeting"] == "second").await;
    let dashboard = head.client(Duration::from_secs(30)).unwrap();

    // A client of the second application, counting what fails.
    let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let client_loop = {
        let (failed, served) = (failed.clone(), served.clone());
        let url = format!("{}/echo2", head.serve_url());
        tokio::spawn(async move {
            let http = fixture::loopback_http(Duration::from_secs(5));
            loop {
                let ok = http
                    .post(&url)
                    .body("\"hi\"")
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                let counter = if ok { &served } else { &failed };
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    // After Serve lost echo2 at `since` (unix seconds): how long until the operator pushed it
    // again (Serve shows echo2 deployed after `since`) and until it runs.
    let restored = |what: &'static str, since: f64| {
        let dashboard = dashboard.clone();
        async move {
            let started = std::time::Instant::now();
            let redeployed = |details: &raypipe::ray::ServeInstanceDetails| {
                details
                    .applications
                    .get("echo2")
                    .filter(|app| app.last_deployed_time_s.is_some_and(|t| t > since))
                    .cloned()
            };
            let pushed = eventually(Duration::from_secs(60), what, || async {
                let details = dashboard.get_serve_applications().await.ok()?;
                redeployed(&details).map(|_| started.elapsed())
            })
            .await;
            eventually(Duration::from_secs(60), what, || async {
                let details = dashboard.get_serve_applications().await.ok()?;
                (redeployed(&details)?.status == Some(raypipe::ray::ApplicationStatus::Running))
                    .then_some(())
            })
            .await;
            (pushed, started.elapsed())
        }
    };
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };

    // 1. Serve's config replaced by one without echo2: Serve deletes echo2.
    let only_first: Value = serde_json::to_value(
        serde_yaml::from_str::<serde_yaml::Value>(&echo_config("first")).unwrap(),
    )
    .unwrap();
    let mut only_first = only_first;
    let binding = json!({"host": "127.0.0.1", "port": head.ports().serve_http});
    only_first["http_options"] = binding;
    let since = unix_now();
    dashboard.put_serve_applications(&only_first).await.unwrap();
    let one_lost = restored("echo2 pushed again after it was replaced away", since).await;

    // 2. The whole of Serve deleted.
    serve_answer(head, "/echo2", |b| b["greeting"] == "second").await;
    let failed_before = failed.load(std::sync::atomic::Ordering::Relaxed);
    let since = unix_now();
    dashboard.delete_serve_applications().await.unwrap();
    let all_lost = restored("Serve pushed again after it was deleted", since).await;
    serve_answer(head, "/echo2", |b| b["greeting"] == "second").await;
    client_loop.abort();
    let failed_after = failed.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "Serve lost one application: pushed again after {:?}, running after {:?}; all of Serve deleted: pushed again after {:?}, running after {:?}; the client's failed requests while Serve was deleted: {} (of {} in all, every 50 ms)",
        one_lost.0,
        one_lost.1,
        all_lost.0,
        all_lost.1,
        failed_after - failed_before,
        failed_after + served.load(std::sync::atomic::Ordering::Relaxed)
    );
    // The steady poll is a minute: a push within half of it was the watch. (Deleting all of
    // Serve on the shared head tears down every test's applications first; that took 11.3 s
    // in a CI run while the release image was built beside it, 2.0 s when run alone.)
    for (what, (pushed, _)) in [("one application", one_lost), ("all of Serve", all_lost)] {
        assert!(
            pushed < Duration::from_secs(30),
            "{what} lost: pushed again only after {pushed:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_serve_config_is_reported_in_status_in_rays_words() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let fx = fixture("rsvc-broken", vec![head]).await;
    let mut object = echo_service("broken", "x", "rayproject/ray:2.60.0");
    object["spec"]["serveConfigV2"] = json!(
        "applications:\n  - name: broken\n    route_prefix: /broken\n    import_path: no_such_module_for_raypipe:app\n"
    );
    fx.create(&object).await;
    let status = fx
        .status_until("broken", "the Serve error in status", |s| {
            s.pending_service_status
                .as_ref()
                .and_then(|p| p.application_statuses.as_ref())
                .and_then(|a| a.get("broken"))
                .is_some_and(|a| a.status.as_deref() == Some("DEPLOY_FAILED"))
        })
        .await;
    let app = &status
        .pending_service_status
        .as_ref()
        .unwrap()
        .application_statuses
        .as_ref()
        .unwrap()["broken"];
    let message = app.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("no_such_module_for_raypipe"),
        "Serve's own error is kept verbatim: {message}"
    );
    let ready = conditions::find(&status.conditions, "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, "Initializing");
    assert!(
        ready.message.contains("DEPLOY_FAILED") && ready.message.contains("no_such_module"),
        "the condition says why: {}",
        ready.message
    );
    assert_eq!(status.service_status, None);
    assert_eq!(
        fx.service_selects("broken-serve-svc").await,
        None,
        "no traffic to a failed app"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_spec_change_moves_traffic_to_a_new_cluster_then_deletes_the_old_one() {
    let head_a = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let head_b: &'static RayHead = Box::leak(Box::new(
        RayHead::start(RayHeadOptions {
            python_path: vec![support::ray_test_apps_dir()],
            ..Default::default()
        })
        .await
        .expect("a second Ray head starts"),
    ));
    let fx = fixture("rsvc-upgrade", vec![head_a, head_b]).await;
    fx.create(&echo_service("up", "blue", "rayproject/ray:2.60.0"))
        .await;
    let status = fx
        .status_until("up", "Ready on the first cluster", |s| {
            rayservice_ready(s) && app_status(s, "echo").as_deref() == Some("RUNNING")
        })
        .await;
    let old = active_cluster_name(&status).unwrap();
    serve_answer(head_a, "/echo", |b| b["greeting"] == "blue").await;

    // New image and new greeting at once: the new config must reach only the new cluster.
    fx.patch_spec(
        "up",
        json!({
            "serveConfigV2": echo_config("green"),
            "rayClusterConfig": echo_service("up", "green", "rayproject/ray:2.60.0-py311")["spec"]["rayClusterConfig"],
        }),
    )
    .await;
    let during = fx
        .status_until("up", "an upgrade in progress", |s| {
            pending_name(s).is_some()
                && conditions::find(&s.conditions, "UpgradeInProgress")
                    .is_some_and(|c| c.status == "True")
        })
        .await;
    let new = pending_name(&during).unwrap();
    assert_ne!(new, old);
    assert!(
        rayservice_ready(&during),
        "the old cluster keeps serving during the upgrade"
    );

    let after = fx
        .status_until("up", "the new cluster to become active", |s| {
            active_cluster_name(s).as_deref() == Some(new.as_str())
                && pending_name(s).is_none()
                && rayservice_ready(s)
        })
        .await;
    assert_eq!(app_status(&after, "echo").as_deref(), Some("RUNNING"));
    assert_eq!(fx.service_selects("up-serve-svc").await, Some(new.clone()));
    assert_eq!(fx.service_selects("up-head-svc").await, Some(new.clone()));
    serve_answer(head_b, "/echo", |b| b["greeting"] == "green").await;
    // The old head never saw the new config.
    serve_answer(head_a, "/echo", |b| b["greeting"] == "blue").await;
    let upgrade = conditions::find(&after.conditions, "UpgradeInProgress").unwrap();
    assert_eq!(upgrade.status, "False");

    eventually(
        WAIT,
        "the old cluster to be deleted after the delay",
        || async {
            let names: Vec<String> = fx.clusters().await.iter().map(|c| c.name_any()).collect();
            (names == vec![new.clone()]).then_some(())
        },
    )
    .await;
    let reasons = fx.event_reasons().await;
    assert!(
        reasons.iter().any(|r| r == "DeletedRayCluster"),
        "{reasons:?}"
    );
    // One upgrade measured; both clusters' provisioning measured.
    let exposition = fx.metrics.encode().unwrap();
    for line in [
        "raypipe_rayservice_upgrade_duration_seconds_count 1",
        "raypipe_raycluster_provisioning_duration_seconds_count 2",
    ] {
        assert!(exposition.contains(line), "no {line:?} in:\n{exposition}");
    }
    head_b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_strategy_none_keeps_the_cluster_and_suspend_deletes_then_resume_recreates() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let fx = fixture("rsvc-none", vec![head]).await;
    let mut object = echo_service("keep", "same", "rayproject/ray:2.60.0");
    object["spec"]["upgradeStrategy"] = json!({"type": "None"});
    fx.create(&object).await;
    let status = fx
        .status_until("keep", "Ready", |s| {
            rayservice_ready(s) && app_status(s, "echo").as_deref() == Some("RUNNING")
        })
        .await;
    let first = active_cluster_name(&status).unwrap();

    let mut changed =
        echo_service("keep", "same", "rayproject/ray:2.60.0-py311")["spec"]["rayClusterConfig"]
            .clone();
    changed["headGroupSpec"]["rayStartParams"] = json!({"num-cpus": "1"});
    fx.patch_spec("keep", json!({"rayClusterConfig": changed}))
        .await;
    // Several passes later: still one cluster, no pending one.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let status = fx
        .status_until("keep", "a settled status", rayservice_ready)
        .await;
    assert_eq!(active_cluster_name(&status), Some(first.clone()));
    assert_eq!(pending_name(&status), None);
    assert_eq!(fx.clusters().await.len(), 1);

    // Suspend: clusters and Services go; the conditions say so.
    fx.patch_spec("keep", json!({"suspend": true})).await;
    let status = fx
        .status_until("keep", "Suspended", |s| {
            conditions::find(&s.conditions, "Suspended").is_some_and(|c| c.status == "True")
        })
        .await;
    assert_eq!(active_cluster_name(&status), None);
    assert_eq!(status.service_status, None);
    eventually(WAIT, "the clusters to be gone", || async {
        fx.clusters().await.is_empty().then_some(())
    })
    .await;
    assert_eq!(fx.service_selects("keep-serve-svc").await, None);

    // Resume: a new cluster, ready again.
    fx.patch_spec("keep", json!({"suspend": false})).await;
    let status = fx
        .status_until("keep", "Ready after resume", |s| {
            rayservice_ready(s) && app_status(s, "echo").as_deref() == Some("RUNNING")
        })
        .await;
    let resumed = active_cluster_name(&status).unwrap();
    assert_ne!(resumed, first);
    let suspended = conditions::find(&status.conditions, "Suspended").unwrap();
    assert_eq!(
        (suspended.status.as_str(), suspended.reason.as_str()),
        ("False", "RayServiceResumed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_that_cannot_progress_says_why_while_the_old_cluster_serves() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let fx = fixture("rsvc-stuck", vec![head]).await;
    fx.create(&echo_service("stuck", "steady", "rayproject/ray:2.60.0"))
        .await;
    let status = fx
        .status_until("stuck", "Ready", |s| {
            rayservice_ready(s) && app_status(s, "echo").as_deref() == Some("RUNNING")
        })
        .await;
    let old = active_cluster_name(&status).unwrap();

    // A head no node can hold: the new cluster's head Pod stays Pending.
    let mut config =
        echo_service("stuck", "steady", "rayproject/ray:2.60.0-py311")["spec"]["rayClusterConfig"]
            .clone();
    config["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"limits": {"cpu": "1000", "memory": "2Gi"}, "requests": {"cpu": "1000"}});
    fx.patch_spec("stuck", json!({"rayClusterConfig": config}))
        .await;
    let status = fx
        .status_until("stuck", "the upgrade to say what it waits for", |s| {
            pending_name(s).is_some()
                && conditions::find(&s.conditions, "UpgradeInProgress").is_some_and(|c| {
                    c.status == "True"
                        && c.message.contains("head Pod")
                        && c.message.contains("not ready")
                })
        })
        .await;
    let pending = pending_name(&status).unwrap();
    let upgrade = conditions::find(&status.conditions, "UpgradeInProgress").unwrap();
    assert_eq!(upgrade.reason, "BothActivePendingClustersExist");
    assert!(upgrade.message.contains(&pending), "{}", upgrade.message);
    // Meanwhile the old cluster keeps the traffic and the RayService stays Ready.
    assert!(rayservice_ready(&status));
    assert_eq!(active_cluster_name(&status), Some(old.clone()));
    assert_eq!(fx.service_selects("stuck-serve-svc").await, Some(old));
}

/// Issue 14, class 6: a Service of the serve Service's name made by someone else is reported
/// (a ServiceConflict Warning) and never written, even once the cluster serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_serve_service_is_reported_and_never_taken_over() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let fx = fixture("rsvc-foreign", vec![head]).await;
    let services = Api::<Service>::namespaced(fx.client.clone(), &fx.ns);
    let foreign: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "squat-serve-svc", "labels": {"team": "other"}},
        "spec": {"selector": {"app": "other"}, "ports": [{"name": "http", "port": 80}]}
    }))
    .expect("a Service");
    services
        .patch(
            "squat-serve-svc",
            &PatchParams::apply("other-team"),
            &Patch::Apply(&foreign),
        )
        .await
        .expect("the other team applies its Service");
    let before =
        serde_json::to_value(services.get("squat-serve-svc").await.expect("get")).expect("json");

    fx.create(&echo_service("squat", "hello", "rayproject/ray:2.60.0"))
        .await;
    eventually(WAIT, "a ServiceConflict event", || async {
        fx.event_reasons()
            .await
            .iter()
            .any(|r| r == "ServiceConflict")
            .then_some(())
    })
    .await;
    // The head Service, which nobody else claims, is made as usual.
    assert!(fx.service_selects("squat-head-svc").await.is_some());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after =
        serde_json::to_value(services.get("squat-serve-svc").await.expect("get")).expect("json");
    assert_eq!(after, before, "the foreign Service was modified");
}
