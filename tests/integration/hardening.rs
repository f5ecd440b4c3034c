//! Hostile input against a running operator on the real API server (issue 14): values the CRD
//! admits that used to panic or hot-loop the ServePipeline controller, registries that hang,
//! and a reconcile that panics on purpose. Each test also checks that other pipelines (in other
//! namespaces) are unaffected and that the operator stays alive.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::api::{RayService, conditions};
use raypipe::config::ControllerKind;
use raypipe::config::ControllerSettings;
use raypipe::controllers::frame;
use serde_json::json;

use crate::support::{self, eventually, fixture};

const WAIT: Duration = Duration::from_secs(60);

/// A client that counts every request it sends (reads included).
async fn request_counting_client() -> (kube::Client, Arc<AtomicU64>) {
    let plane = support::control_plane();
    let kubeconfig = kube::config::Kubeconfig::read_from(&plane.kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("client config");
    let requests = Arc::new(AtomicU64::new(0));
    let counter = requests.clone();
    let count = tower::util::MapRequestLayer::new(move |r: http::Request<kube::client::Body>| {
        counter.fetch_add(1, Ordering::SeqCst);
        r
    });
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&count)
        .build();
    (client, requests)
}

/// The ServePipeline controller for `namespaces`, as `raypipe run` starts it (supervised, with
/// its health state returned); stops when the sender is dropped.
fn start_operator(
    client: kube::Client,
    namespaces: &[&str],
) -> (tokio::sync::oneshot::Sender<()>, raypipe::admin::Readiness) {
    let mut settings = ControllerSettings::new(&[ControllerKind::Servepipeline]);
    settings.namespaces = namespaces.iter().map(|n| (*n).to_owned()).collect();
    settings.fetcher = support::loopback_fetcher();
    let health = settings.readiness.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = raypipe::controllers::run(client, settings.plan().expect("a plan"), async move {
            let _ = stopped.await;
        })
        .await;
    });
    (stop, health)
}

/// The registries' bearer token, in a Secret `registry-token` in `ns`.
const TOKEN: &str = "t0ken";

async fn put_token(client: &kube::Client, ns: &str) {
    fixture::put_token_secret(client, ns, "registry-token", TOKEN).await;
}

fn pipeline(name: &str, url: &str, source_extra: serde_json::Value) -> ServePipeline {
    fixture::servepipeline(name, fixture::token_source(url, source_extra))
}

async fn create(client: &kube::Client, ns: &str, p: &ServePipeline) {
    Api::<ServePipeline>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), p)
        .await
        .expect("the API server admits the pipeline");
}

/// Waits for condition `type_` of a pipeline to have `reason`; returns its message.
async fn condition_reason(
    client: &kube::Client,
    ns: &str,
    name: &str,
    type_: &str,
    reason: &str,
) -> String {
    let api = Api::<ServePipeline>::namespaced(client.clone(), ns);
    eventually(
        WAIT,
        &format!("{ns}/{name}: {type_} reason {reason}"),
        || {
            let api = api.clone();
            async move {
                let p = api.get(name).await.expect("get ServePipeline");
                let conds = p.status.map(|s| s.conditions).unwrap_or_default();
                conditions::find(&conds, type_)
                    .filter(|c| c.reason == reason)
                    .map(|c| c.message.clone())
            }
        },
    )
    .await
}

async fn rayservice_appears(
    client: &kube::Client,
    ns: &str,
    name: &str,
    within: Duration,
) -> Duration {
    let api = Api::<RayService>::namespaced(client.clone(), ns);
    let started = Instant::now();
    eventually(within, &format!("RayService {ns}/{name}"), || {
        let api = api.clone();
        async move { api.get_opt(name).await.expect("get RayService") }
    })
    .await;
    started.elapsed()
}

fn sample_graph() -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/graphs/sequence.pb");
    std::fs::read(path).expect("the sample graph")
}

/// Classes 2 and 4: values the CRD pattern admits. `99999999999999999999h` used to panic in
/// `Duration::from_secs_f64` and silently stop the controller for every namespace; `0s` was
/// requeued after 0 s, about 300 failed reconciles (each with a GET) per second.
#[tokio::test]
async fn durations_the_crd_admits_are_refused_by_name_without_a_panic_or_a_hot_loop() {
    let admin = support::client().await;
    let hostile = support::namespace(&admin, "hostile").await;
    let healthy = support::namespace(&admin, "healthy").await;
    let registry = raypipe::devenv::registry::Registry::start(TOKEN).await;
    registry.put("g.pb", sample_graph());
    put_token(&admin, &hostile).await;
    put_token(&admin, &healthy).await;
    let (client, requests) = request_counting_client().await;
    let (_stop, health) = start_operator(client, &[&hostile, &healthy]);

    let huge = "99999999999999999999h";
    create(
        &admin,
        &hostile,
        &pipeline(
            "huge",
            &registry.url("g.pb"),
            json!({"refreshInterval": huge, "timeout": huge}),
        ),
    )
    .await;
    create(
        &admin,
        &hostile,
        &pipeline(
            "zero",
            &registry.url("g.pb"),
            json!({"refreshInterval": "0s"}),
        ),
    )
    .await;
    let message = condition_reason(&admin, &hostile, "huge", "Ready", "InvalidSpec").await;
    assert!(
        message.contains("source.refreshInterval") && message.contains("too large"),
        "{message}"
    );
    let message = condition_reason(&admin, &hostile, "zero", "Ready", "InvalidSpec").await;
    assert!(
        message.contains("shorter than the minimum of 1s"),
        "{message}"
    );

    // Another tenant created afterwards is served: the controller is alive for everybody.
    create(
        &admin,
        &healthy,
        &pipeline("ok", &registry.url("g.pb"), json!({})),
    )
    .await;
    rayservice_appears(&admin, &healthy, "ok", WAIT).await;
    assert!(
        health.liveness_problems().is_empty(),
        "{:?}",
        health.liveness_problems()
    );

    // No hot loop: with everything settled, the controller sends (almost) nothing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = requests.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let during = requests.load(Ordering::SeqCst) - before;
    println!(
        "HARDENING-BOUND hot-loop: {during} API requests in 5 s with two invalid specs settled"
    );
    assert!(
        during <= 10,
        "{during} requests in 5 s: an invalid spec is being retried"
    );
    assert!(registry.counts().0 > 0, "the healthy pipeline was fetched");
}

/// A registry that accepts connections, reads the request and never answers.
async fn hanging_registry() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket); // kept open, never answered
        }
    });
    (format!("http://{addr}/g.pb"), task)
}

/// Class 5: 50 pipelines hanging on a slow registry (timeout at its 2 m maximum) must not
/// hold the reconcile workers: a new healthy pipeline elsewhere is fetched at once. Before,
/// fetches ran inside the 4 reconcile slots and a healthy pipeline waited for a timeout.
#[tokio::test]
async fn pipelines_hanging_on_slow_registries_do_not_delay_a_healthy_one() {
    let admin = support::client().await;
    let slow = support::namespace(&admin, "slow").await;
    let healthy = support::namespace(&admin, "fast").await;
    let (slow_url, _server) = hanging_registry().await;
    let registry = raypipe::devenv::registry::Registry::start(TOKEN).await;
    registry.put("g.pb", sample_graph());
    put_token(&admin, &slow).await;
    put_token(&admin, &healthy).await;
    let client = support::client().await;
    let (_stop, health) = start_operator(client, &[&slow, &healthy]);

    for i in 0..50 {
        create(
            &admin,
            &slow,
            &pipeline(&format!("hang-{i}"), &slow_url, json!({"timeout": "2m"})),
        )
        .await;
    }
    // Let the slow ones take whatever they can take.
    tokio::time::sleep(Duration::from_secs(3)).await;
    create(
        &admin,
        &healthy,
        &pipeline("fresh", &registry.url("g.pb"), json!({})),
    )
    .await;
    let took = rayservice_appears(&admin, &healthy, "fresh", Duration::from_secs(30)).await;
    println!(
        "HARDENING-BOUND head-of-line: healthy pipeline's RayService {took:?} after create, 50 pipelines hanging"
    );
    assert!(health.liveness_problems().is_empty());
    // The hanging ones have no RayService and no failure yet (their fetch is in flight).
    let rayservices = Api::<RayService>::namespaced(admin.clone(), &slow)
        .list(&ListParams::default())
        .await
        .expect("list");
    assert!(rayservices.items.is_empty());
}

#[derive(Debug, thiserror::Error)]
enum TestError {
    #[error(transparent)]
    Panicked(#[from] frame::Panicked),
}

struct PanicContext {
    recorder: raypipe::k8s::EventRecorder,
    reconciled: Mutex<BTreeSet<String>>,
}

impl frame::ReportPanic<ConfigMap> for PanicContext {
    fn report_panic(
        &self,
        object: Arc<ConfigMap>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        frame::panic_event(&self.recorder, object, message)
    }
}

async fn reconcile_or_panic(
    object: Arc<ConfigMap>,
    ctx: Arc<PanicContext>,
) -> Result<Action, TestError> {
    let name = object.metadata.name.clone().unwrap_or_default();
    if name == "boom" {
        panic!("on purpose, for {name}");
    }
    ctx.reconciled.lock().expect("lock").insert(name);
    Ok(Action::await_change())
}

/// No panic may stop a controller: a reconcile that panics on purpose becomes an error (and a
/// Warning Event) for that object alone, and the controller keeps reconciling the others —
/// the frame every raypipe controller runs in, on a real kube-runtime Controller.
#[tokio::test]
async fn a_reconcile_that_panics_on_purpose_affects_only_its_object() {
    let client = support::client().await;
    let ns = support::namespace(&client, "panic").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let ctx = Arc::new(PanicContext {
        recorder: raypipe::k8s::recorder(client.clone(), "raypipe-panic-test"),
        reconciled: Mutex::default(),
    });
    let health = raypipe::admin::Readiness::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let supervisor = frame::Supervisor::new(health.clone(), stop_rx);
    let controller = Controller::new(configmaps.clone(), watcher::Config::default())
        .run(
            frame::contain("panic-test", reconcile_or_panic),
            frame::contain_policy(
                "panic-test",
                |_: Arc<ConfigMap>, _: &TestError, _: Arc<PanicContext>| {
                    Action::requeue(Duration::from_secs(300))
                },
            ),
            ctx.clone(),
        )
        .for_each(|_| async {});
    let task = tokio::spawn(supervisor.watch("panic-test", controller));

    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("ConfigMap")
    };
    configmaps
        .create(&PostParams::default(), &cm("boom"))
        .await
        .expect("create");
    // Created after the panic: only reconciled if the controller survived it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    configmaps
        .create(&PostParams::default(), &cm("after"))
        .await
        .expect("create");
    eventually(
        WAIT,
        "the ConfigMap created after the panic to be reconciled",
        || {
            let ctx = ctx.clone();
            async move {
                ctx.reconciled
                    .lock()
                    .expect("lock")
                    .contains("after")
                    .then_some(())
            }
        },
    )
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let event = eventually(WAIT, "a ReconcilePanicked Warning Event", || {
        let events = events.clone();
        async move {
            events
                .list(&ListParams::default())
                .await
                .expect("list events")
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(frame::REASON_RECONCILE_PANICKED))
        }
    })
    .await;
    assert_eq!(event.involved_object.name.as_deref(), Some("boom"));
    assert!(
        event
            .message
            .unwrap_or_default()
            .contains("on purpose, for boom")
    );
    assert!(!task.is_finished(), "the controller is still running");
    assert!(health.liveness_problems().is_empty());
    let _ = stop_tx.send(true);
    task.abort();
}

/// The sample graph with `extra` Model nodes `r0…` chained in a ring (a cycle through them all).
fn ring_graph(extra: usize) -> Vec<u8> {
    let mut graph = raypipe::graph::decode(&sample_graph()).expect("sample decodes");
    let model = graph
        .nodes
        .iter()
        .find(|n| matches!(n.kind, Some(raypipe::graph::proto::node::Kind::Model(_))))
        .expect("the sample has a model node")
        .clone();
    let template_edge = graph.edges[0].clone();
    for i in 0..extra {
        let mut node = model.clone();
        node.name = format!("r{i}");
        graph.nodes.push(node);
        let mut edge = template_edge.clone();
        edge.source = format!("r{i}");
        edge.target = format!("r{}", (i + 1) % extra);
        graph.edges.push(edge);
    }
    // Reachable from the ingress, so the cycle is what is wrong.
    let mut entry = template_edge;
    entry.source = graph.ingress.clone();
    entry.target = "r0".into();
    graph.edges.push(entry);
    prost::Message::encode_to_vec(&graph)
}

/// The sample graph with `depth` nested lists as one node's input template.
fn deep_graph(depth: usize) -> Vec<u8> {
    use raypipe::graph::proto::JsonValue;
    let mut graph = raypipe::graph::decode(&sample_graph()).expect("sample decodes");
    let mut value = JsonValue::int(1);
    for _ in 0..depth {
        value = JsonValue::list(vec![value]);
    }
    graph.nodes[1].input_template = Some(value);
    prost::Message::encode_to_vec(&graph)
}

/// Classes 1, 3, 8 and 9 through a running operator: hostile graphs served by a registry are
/// each refused with a named reason in the pipeline's conditions (message capped), while a
/// pipeline of another tenant is served and the operator stays alive.
#[tokio::test]
async fn hostile_graphs_from_a_registry_are_named_in_conditions_and_harm_nobody_else() {
    let admin = support::client().await;
    let hostile = support::namespace(&admin, "hostile-graphs").await;
    let healthy = support::namespace(&admin, "neighbour").await;
    let registry = raypipe::devenv::registry::Registry::start(TOKEN).await;
    registry.put("good.pb", sample_graph());
    registry.put("ring.pb", ring_graph(99_000));
    // 16 MiB of empty `nodes` entries (field 6, length 0): 2.3 GB once decoded, before.
    registry.put("empty-nodes.pb", [0x32u8, 0x00].repeat(8 << 20));
    registry.put("deep.pb", deep_graph(50));
    put_token(&admin, &hostile).await;
    put_token(&admin, &healthy).await;
    let client = support::client().await;
    let (_stop, health) = start_operator(client, &[&hostile, &healthy]);

    let cases = [
        ("ring", "ring.pb", "CycleDetected"),
        ("empty-nodes", "empty-nodes.pb", "LimitExceeded"),
        ("deep", "deep.pb", "NestingTooDeep"),
    ];
    for (name, path, _) in &cases {
        create(
            &admin,
            &hostile,
            &pipeline(name, &registry.url(path), json!({"maxBytes": 33554432})),
        )
        .await;
    }
    create(
        &admin,
        &healthy,
        &pipeline("fine", &registry.url("good.pb"), json!({})),
    )
    .await;
    for (name, _, reason) in &cases {
        let message = condition_reason(&admin, &hostile, name, "GraphValid", reason).await;
        assert!(
            message.len() <= 2048,
            "{name}: a {}-byte condition message",
            message.len()
        );
    }
    rayservice_appears(&admin, &healthy, "fine", WAIT).await;
    assert!(
        health.liveness_problems().is_empty(),
        "{:?}",
        health.liveness_problems()
    );
    // Nothing was applied for the hostile graphs.
    let applied = Api::<RayService>::namespaced(admin.clone(), &hostile)
        .list(&ListParams::default())
        .await
        .expect("list");
    assert!(applied.items.is_empty());
}
