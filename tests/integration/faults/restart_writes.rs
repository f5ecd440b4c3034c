//! The operator restarted under many settled pipelines (issue 29 item 4): the ServePipeline
//! controller (as `benches/servepipeline.rs` runs it: the one controller, a registry on
//! 127.0.0.1, every pipeline fetching the same unchanged graph) brings N pipelines to their
//! RayServices, is killed (its task aborted) and a fresh one started. The fresh one fetches
//! every graph again (its memory is gone) and must find nothing to change: its write requests
//! to the apiserver are counted (the steady-state test's counting client) until every pipeline
//! was fetched again and one more refresh interval passed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams, PostParams};
use raypipe::api::rayservice::RayService;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::controllers::servepipeline::{self, Config};
use raypipe::devenv::registry::Registry;
use serde_json::json;

use crate::support::e2e::{GRAPH_PATH, digest, ensemble, is_true};
use crate::support::{self, fixture};

const REFRESH: Duration = Duration::from_secs(10);

/// A client whose write requests (anything but GET) are recorded as `METHOD path`: the
/// steady-state test's counting client, keeping what each write was.
async fn recording_client() -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    let plane = support::control_plane();
    let kubeconfig = kube::config::Kubeconfig::read_from(&plane.kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("client config");
    let writes = Arc::new(Mutex::new(Vec::new()));
    let recorded = writes.clone();
    let record_writes =
        tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
            if request.method() != http::Method::GET {
                recorded.lock().expect("the write log").push(format!(
                    "{} {}",
                    request.method(),
                    request.uri().path()
                ));
            }
            request
        });
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&record_writes)
        .build();
    (client, writes)
}

/// A ServePipeline controller for `ns` on a client of its own whose write requests are
/// recorded; aborting the returned task ends it as SIGKILL would.
async fn start_controller(ns: &str) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Vec<String>>>) {
    let (client, writes) = recording_client().await;
    let config = Config {
        namespace: Some(ns.to_owned()),
        fetcher: support::loopback_fetcher(),
        ..Default::default()
    };
    let task = tokio::spawn(servepipeline::run(
        client,
        config,
        std::future::pending::<()>(),
    ));
    (task, writes)
}

/// Writes by kind: `METHOD path` with the object's name left out, and how many.
fn by_kind(writes: &[String]) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for write in writes {
        let mut parts: Vec<&str> = write.split('/').collect();
        // …/namespaces/<ns>/<resource>/<name>[/status]: the name is the one after the resource.
        if let Some(i) = parts.iter().position(|p| *p == "namespaces")
            && parts.len() > i + 3
        {
            parts[i + 1] = "<ns>";
            parts[i + 3] = "<name>";
        }
        *kinds.entry(parts.join("/")).or_insert(0) += 1;
    }
    kinds
}

/// How many of the namespace's pipelines have settled on `bytes`: a status for their
/// generation naming the digest, the graph valid, and a RayService.
async fn settled(client: &kube::Client, ns: &str, bytes: &[u8]) -> usize {
    let wanted = digest(bytes);
    let Ok(pipelines) = Api::<ServePipeline>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    else {
        return 0;
    };
    let Ok(rayservices) = Api::<RayService>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    else {
        return 0;
    };
    let with_rayservice: std::collections::BTreeSet<String> = rayservices
        .items
        .iter()
        .filter_map(|rs| rs.metadata.name.clone())
        .collect();
    pipelines
        .items
        .iter()
        .filter(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.observed_generation == p.metadata.generation
                    && s.source.as_ref().is_some_and(|s| s.digest == wanted)
            }) && is_true(p, "GraphValid")
                && p.metadata
                    .name
                    .as_ref()
                    .is_some_and(|n| with_rayservice.contains(n))
        })
        .count()
}

/// What a restart cost: (write requests of the fresh operator, seconds until it had fetched
/// every pipeline's graph again, seconds until the first operator had settled them all).
async fn restart_under(pipelines: usize) -> (Vec<String>, f64, f64) {
    let client = support::client().await;
    let ns = support::namespace(&client, "fault-restart-writes").await;
    let token = raypipe::devenv::random_token().expect("a token");
    let registry = Registry::start(&token).await;
    let bytes = ensemble("1");
    registry.put(GRAPH_PATH, bytes.clone());
    fixture::put_token_secret(&client, &ns, "registry-token", &token).await;
    let api: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    let (first, _) = start_controller(&ns).await;
    let created = Instant::now();
    for i in 0..pipelines {
        let p = fixture::servepipeline(
            &format!("p{i}"),
            fixture::token_source(
                &registry.url(GRAPH_PATH),
                json!({"refreshInterval": format!("{}s", REFRESH.as_secs())}),
            ),
        );
        api.create(&PostParams::default(), &p)
            .await
            .expect("create a ServePipeline");
    }
    let wait = Duration::from_secs(60) + Duration::from_millis(300) * pipelines as u32;
    loop {
        let done = settled(&client, &ns, &bytes).await;
        if done == pipelines {
            break;
        }
        assert!(
            created.elapsed() < wait,
            "{done} of {pipelines} pipelines settled after {wait:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settled_in = created.elapsed().as_secs_f64();
    // The first operator's own writes (its statuses) come back as watch events: let them.
    tokio::time::sleep(Duration::from_secs(3)).await;

    first.abort();
    let _ = first.await;
    let fetched_before = registry.requests(GRAPH_PATH).len();
    let restarted = Instant::now();
    let (fresh, writes) = start_controller(&ns).await;
    // Every pipeline's graph fetched again: each pipeline was reconciled by the fresh operator.
    loop {
        let fetched = registry.requests(GRAPH_PATH).len() - fetched_before;
        if fetched >= pipelines {
            break;
        }
        assert!(
            restarted.elapsed() < wait,
            "the fresh operator fetched {fetched} of {pipelines} graphs after {wait:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let refetched_in = restarted.elapsed().as_secs_f64();
    tokio::time::sleep(REFRESH).await;
    let written = writes.lock().expect("the write log").clone();
    fresh.abort();
    let left = settled(&client, &ns, &bytes).await;
    assert_eq!(left, pipelines, "every pipeline still settled");
    (written, refetched_in, settled_in)
}

async fn check_restart_under(pipelines: usize) {
    let (written, refetched_in, settled_in) = restart_under(pipelines).await;
    eprintln!(
        "FAULT-BOUND operator_restarted_with_{pipelines}_pipelines: {} write requests after the restart, every graph fetched again in {refetched_in:.1} s (first settled in {settled_in:.1} s)",
        written.len()
    );
    assert_eq!(
        by_kind(&written),
        BTreeMap::new(),
        "the fresh operator wrote to the apiserver though nothing changed"
    );
}

/// 50 pipelines: quick enough for CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_restarted_with_50_settled_pipelines_writes_nothing() {
    check_restart_under(50).await;
}

/// The scale benchmark: 1,000 pipelines. Out of CI; run by hand with
/// `cargo test --test integration faults::restart_writes -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "scale benchmark (1,000 pipelines), run by hand"]
async fn operator_restarted_with_1000_settled_pipelines_writes_nothing() {
    check_restart_under(1000).await;
}
