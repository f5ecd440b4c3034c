//! The ServePipeline controller against a real API server (with kube-controller-manager for
//! garbage collection) and a real HTTP registry on 127.0.0.1.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use prost::Message;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::api::{RayService, conditions};
use raypipe::controllers::servepipeline::{self, Config};
use serde_json::json;

use crate::support::{self, eventually, fixture};
use raypipe::devenv::registry::{Registry, sha256_hex};

const WAIT: Duration = Duration::from_secs(30);

/// The encoded sample graph `samples/graphs/<name>.pb`.
fn sample_graph(name: &str) -> Vec<u8> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("samples/graphs/{name}.pb"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A sample graph with its version changed (so a different digest and Serve config).
fn sample_graph_version(name: &str, version: &str) -> Vec<u8> {
    let mut graph = raypipe::graph::decode(&sample_graph(name)).expect("sample decodes");
    graph.version = version.to_owned();
    graph.encode_to_vec()
}

/// The sequence sample (request → preprocess → classify → response) with an edge back from
/// classify to preprocess: a cycle and nothing else wrong.
fn cyclic_graph() -> Vec<u8> {
    let mut graph = raypipe::graph::decode(&sample_graph("sequence")).expect("sample decodes");
    let forward = graph
        .edges
        .iter()
        .find(|e| e.source == "preprocess" && e.target == "classify")
        .expect("the sample has preprocess -> classify")
        .clone();
    let mut back = forward.clone();
    back.source = forward.target;
    back.target = forward.source;
    graph.edges.push(back);
    graph.encode_to_vec()
}

/// The Serve config the controller must render for `bytes` in a pipeline named `name`.
fn expected_serve_config(bytes: &[u8], name: &str) -> String {
    let graph =
        raypipe::graph::validate(raypipe::graph::decode(bytes).expect("decodes")).expect("valid");
    let options = raypipe::serve::RenderOptions {
        application_name: Some(name.to_owned()),
        ..Default::default()
    };
    let rendered = raypipe::serve::render(&graph, &options).expect("renders");
    // The operator's default layout: the version application and one per model node.
    let config = raypipe::serve::shared::config_json(&rendered, name).expect("laid out");
    serde_yaml::to_string(&config).expect("YAML")
}

struct Fixture {
    client: kube::Client,
    /// Write requests the controller under test has sent.
    controller_writes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ns: String,
    registry: Registry,
    /// Stops the test's controllers when the fixture is dropped.
    _stop: fixture::Stopper,
}

/// A namespace with a token Secret, a registry serving `sequence.pb`, and the controller
/// running for that namespace only.
async fn fixture(prefix: &str, token: &str) -> Fixture {
    support::capture_logs();
    let client = support::client().await;
    let ns = support::namespace(&client, prefix).await;
    let registry = Registry::start(token).await;
    registry.put("graphs/pipeline.pb", sample_graph("sequence"));
    fixture::put_token_secret(&client, &ns, "registry-token", token).await;
    let mut stop = fixture::Stopper::default();
    let config = Config {
        namespace: Some(ns.clone()),
        fetcher: support::loopback_fetcher(),
        ..Default::default()
    };
    let (controller_client, controller_writes) = support::counting_client().await;
    tokio::spawn(servepipeline::run(controller_client, config, stop.signal()));
    Fixture {
        client,
        controller_writes,
        ns,
        registry,
        _stop: stop,
    }
}

fn pipeline(name: &str, url: &str, source_extra: serde_json::Value) -> ServePipeline {
    fixture::servepipeline(name, fixture::token_source(url, source_extra))
}

impl Fixture {
    fn pipelines(&self) -> Api<ServePipeline> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    fn rayservices(&self) -> Api<RayService> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    async fn create(&self, p: &ServePipeline) {
        self.pipelines()
            .create(&PostParams::default(), p)
            .await
            .expect("create ServePipeline");
    }
    async fn rayservice(&self, name: &str) -> RayService {
        let api = self.rayservices();
        eventually(WAIT, "the RayService to exist", || {
            let api = api.clone();
            async move { api.get_opt(name).await.expect("get RayService") }
        })
        .await
    }
    /// Waits until condition `type_` of pipeline `name` has `status` and `reason`.
    async fn condition(
        &self,
        name: &str,
        type_: &str,
        status: &str,
        reason: &str,
    ) -> ServePipeline {
        let api = self.pipelines();
        eventually(
            WAIT,
            &format!("{name}: {type_}={status} ({reason})"),
            || {
                let api = api.clone();
                async move {
                    let p = api.get(name).await.expect("get ServePipeline");
                    let conds = p
                        .status
                        .as_ref()
                        .map(|s| s.conditions.clone())
                        .unwrap_or_default();
                    conditions::find(&conds, type_)
                        .is_some_and(|c| c.status == status && c.reason == reason)
                        .then_some(p)
                }
            },
        )
        .await
    }
}

fn serve_config(rs: &RayService) -> String {
    rs.spec
        .serve_config_v2
        .clone()
        .expect("serveConfigV2 is set")
}

#[tokio::test]
async fn a_pipeline_gets_a_rayservice_with_the_rendered_serve_config_and_honest_status() {
    let f = fixture("sp-create", "token-create-1").await;
    f.create(&pipeline(
        "sentiment",
        &f.registry.url("graphs/pipeline.pb"),
        json!({}),
    ))
    .await;
    let rs = f.rayservice("sentiment").await;

    let bytes = sample_graph("sequence");
    assert_eq!(
        serve_config(&rs),
        expected_serve_config(&bytes, "sentiment")
    );
    let owner = &rs.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("ServePipeline", "sentiment", Some(true))
    );
    assert_eq!(
        rs.labels().get("raypipe.dev/pipeline").map(String::as_str),
        Some("sentiment")
    );

    let p = f
        .condition("sentiment", "GraphValid", "True", "Valid")
        .await;
    let status = p.status.expect("status");
    assert_eq!(status.observed_generation, p.metadata.generation);
    let source = status.source.expect("source status");
    assert_eq!(source.digest, format!("sha256:{}", sha256_hex(&bytes)));
    assert_eq!(source.bytes, bytes.len() as i64);
    assert_eq!(status.ray_service_name.as_deref(), Some("sentiment"));
    let graph =
        raypipe::graph::validate(raypipe::graph::decode(&bytes).expect("decodes")).expect("valid");
    assert_eq!(
        status.graph.expect("graph status").nodes as usize,
        graph.node_count()
    );
    // Nothing serves yet (no RayService controller in this test): honest about it.
    assert_eq!(status.phase.as_deref(), Some("Deploying"));
    let ready = conditions::find(&status.conditions, "Ready").expect("Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "RayServiceNotReady")
    );
}

#[tokio::test]
async fn ready_follows_the_rayservice_and_serve_statuses_are_copied() {
    let f = fixture("sp-ready", "token-ready-1").await;
    f.create(&pipeline(
        "ready",
        &f.registry.url("graphs/pipeline.pb"),
        json!({}),
    ))
    .await;
    f.rayservice("ready").await;
    let status = json!({
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints", "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "serviceStatus": "Running",
            "activeServiceStatus": {"rayClusterName": "ready-abcde", "applicationStatuses": {"ready": {
                "status": "RUNNING", "serveDeploymentStatuses": {"preprocess": {"status": "HEALTHY"}}}}}
        }
    });
    f.rayservices()
        .patch_status("ready", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("write RayService status");
    let p = f.condition("ready", "Ready", "True", "Serving").await;
    let status = p.status.expect("status");
    assert_eq!(status.phase.as_deref(), Some("Ready"));
    let app = status
        .applications
        .get("ready")
        .expect("application status copied");
    assert_eq!(app.status.as_deref(), Some("RUNNING"));
    assert_eq!(
        app.deployments["preprocess"].status.as_deref(),
        Some("HEALTHY")
    );
}

/// Argo CD's health check (deploy/argocd/servepipeline-health.lua, run by gopher-lua as Argo CD
/// runs it) on the statuses the controller writes: Progressing while the RayService does not
/// serve, Healthy once it does, Degraded after a refused push even though `Ready` stays True
/// (the previous graph serves; `UpToDate` says it is not the pushed one), Healthy again when
/// the registry serves a good graph. Flux's CEL check (deploy/flux/kustomization.yaml, run by
/// cel-go as kustomize-controller runs it) says the same each time: InProgress, Current, Failed,
/// Current.
#[tokio::test]
async fn argocd_health_follows_the_pipeline_and_a_refused_push_is_degraded() {
    use crate::support::argocd::health;
    let f = fixture("sp-argocd", "token-argocd-1").await;
    f.create(&pipeline(
        "argocd",
        &f.registry.url("graphs/pipeline.pb"),
        json!({"refreshInterval": "1s"}),
    ))
    .await;
    f.rayservice("argocd").await;
    let health_of = |p: &ServePipeline| health(&serde_json::to_value(p).expect("JSON"));
    let flux_of =
        |p: &ServePipeline| crate::support::flux::health(&serde_json::to_value(p).expect("JSON"));
    let p = f
        .condition("argocd", "Ready", "False", "RayServiceNotReady")
        .await;
    assert_eq!(health_of(&p).0, "Progressing", "{:?}", p.status);
    assert_eq!(flux_of(&p).0, "InProgress", "{:?}", p.status);

    let status = json!({
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints",
            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}], "serviceStatus": "Running"}
    });
    f.rayservices()
        .patch_status("argocd", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("write RayService status");
    let p = f.condition("argocd", "UpToDate", "True", "Serving").await;
    assert_eq!(health_of(&p).0, "Healthy", "{:?}", p.status);
    assert_eq!(flux_of(&p).0, "Current", "{:?}", p.status);

    f.registry
        .put("graphs/pipeline.pb", b"\xff not a graph".to_vec());
    let api = f.pipelines();
    let p = eventually(WAIT, "UpToDate False after the refused push", || {
        let api = api.clone();
        async move {
            let p = api.get("argocd").await.ok()?;
            let conds = p.status.as_ref()?.conditions.clone();
            conditions::find(&conds, "UpToDate")
                .is_some_and(|c| c.status == "False")
                .then_some(p)
        }
    })
    .await;
    let ready = raypipe::api::conditions::find(&p.status.as_ref().unwrap().conditions, "Ready")
        .cloned()
        .unwrap();
    assert_eq!(ready.status, "True", "the previous graph still serves");
    let (status, message) = health_of(&p);
    assert_eq!(status, "Degraded", "{message}");
    assert!(message.contains("refused"), "{message}");
    assert_eq!(flux_of(&p).0, "Failed", "{:?}", p.status);

    f.registry.put(
        "graphs/pipeline.pb",
        sample_graph_version("sequence", "v3-good"),
    );
    let p = f.condition("argocd", "UpToDate", "True", "Serving").await;
    assert_eq!(health_of(&p).0, "Healthy");
    assert_eq!(flux_of(&p).0, "Current", "{:?}", p.status);
}

#[tokio::test]
async fn a_new_graph_at_the_registry_rolls_out_within_the_refresh_interval() {
    let f = fixture("sp-refresh", "token-refresh-1").await;
    f.create(&pipeline(
        "refresh",
        &f.registry.url("graphs/pipeline.pb"),
        json!({"refreshInterval": "1s"}),
    ))
    .await;
    let before = serve_config(&f.rayservice("refresh").await);

    let v2 = sample_graph_version("sequence", "v2-from-test");
    f.registry.put("graphs/pipeline.pb", v2.clone());
    let want = expected_serve_config(&v2, "refresh");
    assert_ne!(before, want, "the new version renders differently");
    let api = f.rayservices();
    eventually(WAIT, "the RayService to carry the new graph", || {
        let api = api.clone();
        let want = want.clone();
        async move { (serve_config(&api.get("refresh").await.expect("get")) == want).then_some(()) }
    })
    .await;
    let digest = format!("sha256:{}", sha256_hex(&v2));
    eventually(WAIT, "the status to show the new digest", || {
        let api = f.pipelines();
        let digest = digest.clone();
        async move {
            let p = api.get("refresh").await.expect("get");
            (p.status?.source?.digest == digest).then_some(())
        }
    })
    .await;
}

/// A new source URL is fetched when the pipeline changes, and what it brings is applied when
/// the fetch ends, not at the next refresh (an hour away here).
#[tokio::test]
async fn a_changed_source_is_applied_when_its_fetch_ends_not_at_the_next_refresh() {
    let f = fixture("sp-moved", "token-moved-1").await;
    f.create(&pipeline(
        "moved",
        &f.registry.url("graphs/pipeline.pb"),
        json!({"refreshInterval": "1h"}),
    ))
    .await;
    // The first graph is applied before the source moves (a pipeline without a graph fetches
    // at every pass anyway).
    f.rayservice("moved").await;
    let v2 = sample_graph_version("sequence", "v2-moved");
    f.registry.put("graphs/moved.pb", v2.clone());
    let patch = json!({"spec": {"source": {"url": f.registry.url("graphs/moved.pb")}}});
    f.pipelines()
        .patch(
            "moved",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("patched");
    let want = expected_serve_config(&v2, "moved");
    let api = f.rayservices();
    eventually(
        WAIT,
        "the RayService to carry the graph at the new URL",
        || {
            let api = api.clone();
            let want = want.clone();
            async move { (serve_config(&api.get("moved").await.ok()?) == want).then_some(()) }
        },
    )
    .await;
}

#[tokio::test]
async fn an_unchanged_source_writes_nothing_to_the_api_server() {
    let f = fixture("sp-steady", "token-steady-1").await;
    f.create(&pipeline(
        "steady",
        &f.registry.url("graphs/pipeline.pb"),
        json!({"refreshInterval": "1s"}),
    ))
    .await;
    f.rayservice("steady").await;
    f.condition("steady", "GraphValid", "True", "Valid").await;
    // Let the first reconciles (triggered by our own apply) settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rs_version = f
        .rayservices()
        .get("steady")
        .await
        .expect("get")
        .resource_version();
    let p_version = f
        .pipelines()
        .get("steady")
        .await
        .expect("get")
        .resource_version();
    let (requests_before, not_modified_before, _) = f.registry.counts();
    let writes_before = f
        .controller_writes
        .load(std::sync::atomic::Ordering::SeqCst);

    tokio::time::sleep(Duration::from_secs(4)).await;
    let (requests_after, not_modified_after, _) = f.registry.counts();
    let writes_after = f
        .controller_writes
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        writes_after, writes_before,
        "the controller sent write requests while nothing changed"
    );
    assert!(
        requests_after >= requests_before + 2,
        "the source was polled every refresh interval"
    );
    assert_eq!(
        requests_after - requests_before,
        not_modified_after - not_modified_before,
        "every poll of an unchanged graph was answered 304"
    );
    assert_eq!(
        f.rayservices()
            .get("steady")
            .await
            .expect("get")
            .resource_version(),
        rs_version
    );
    assert_eq!(
        f.pipelines()
            .get("steady")
            .await
            .expect("get")
            .resource_version(),
        p_version
    );
}

#[tokio::test]
async fn an_invalid_graph_is_refused_and_the_rayservice_is_left_exactly_as_it_was() {
    let f = fixture("sp-invalid", "token-invalid-1").await;
    f.create(&pipeline(
        "invalid",
        &f.registry.url("graphs/pipeline.pb"),
        json!({"refreshInterval": "1s"}),
    ))
    .await;
    f.condition("invalid", "GraphValid", "True", "Valid").await;
    let rs_before = f.rayservice("invalid").await;

    f.registry.put("graphs/pipeline.pb", cyclic_graph());
    let p = f
        .condition("invalid", "GraphValid", "False", "CycleDetected")
        .await;
    let message = &conditions::find(&p.status.as_ref().expect("status").conditions, "GraphValid")
        .expect("cond")
        .message;
    assert!(
        message.contains("cycle"),
        "the message names the problem: {message}"
    );

    f.registry.put(
        "graphs/pipeline.pb",
        b"\xff\xff\xff not a protobuf".to_vec(),
    );
    let p = f
        .condition("invalid", "GraphValid", "False", "DecodeError")
        .await;
    assert_eq!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Degraded")
    );

    let rs_after = f.rayservices().get("invalid").await.expect("get");
    assert_eq!(
        rs_after.resource_version(),
        rs_before.resource_version(),
        "the RayService was not touched"
    );
    // The status still describes what runs.
    let digest = p
        .status
        .and_then(|s| s.source)
        .expect("source status")
        .digest;
    assert_eq!(
        digest,
        format!("sha256:{}", sha256_hex(&sample_graph("sequence")))
    );
}

#[tokio::test]
async fn a_wrong_token_is_reported_as_unauthorized_and_a_rotated_token_is_picked_up() {
    let f = fixture("sp-token", "the-right-token-0001").await;
    fixture::put_token_secret(&f.client, &f.ns, "registry-token", "a-wrong-token-0002").await;
    // No refresh interval: only the Secret watch can trigger the next fetch.
    f.create(&pipeline(
        "token",
        &f.registry.url("graphs/pipeline.pb"),
        json!({}),
    ))
    .await;
    let p = f
        .condition("token", "SourceReady", "False", "Unauthorized")
        .await;
    assert_eq!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed")
    );
    assert!(
        f.rayservices()
            .get_opt("token")
            .await
            .expect("get")
            .is_none(),
        "no RayService without a graph"
    );

    fixture::put_token_secret(&f.client, &f.ns, "registry-token", "the-right-token-0001").await;
    f.condition("token", "SourceReady", "True", "Fetched").await;
    f.rayservice("token").await;

    // Neither token appears in the status, the events or any log line.
    let status = serde_json::to_string(&f.pipelines().get("token").await.expect("get").status)
        .expect("json");
    let events = Api::<Event>::namespaced(f.client.clone(), &f.ns)
        .list(&ListParams::default())
        .await
        .expect("events");
    let events = serde_json::to_string(&events.items).expect("json");
    assert!(
        events.contains("Unauthorized"),
        "the failure was announced as an event"
    );
    let logs = support::captured_logs();
    for token in ["the-right-token-0001", "a-wrong-token-0002"] {
        assert!(!status.contains(token), "token in status");
        assert!(!events.contains(token), "token in events");
        assert!(!logs.contains(token), "token in logs");
    }
}

#[tokio::test]
async fn a_pinned_digest_that_does_not_match_is_refused() {
    let f = fixture("sp-pin", "token-pin-1").await;
    let wrong = "0".repeat(64);
    f.create(&pipeline(
        "pinned",
        &f.registry.url("graphs/pipeline.pb"),
        json!({"sha256": wrong}),
    ))
    .await;
    let p = f
        .condition("pinned", "SourceReady", "False", "DigestMismatch")
        .await;
    let message = conditions::find(&p.status.expect("status").conditions, "SourceReady")
        .expect("cond")
        .message
        .clone();
    assert!(
        message.contains(&sha256_hex(&sample_graph("sequence"))),
        "the message gives the actual digest: {message}"
    );
    assert!(
        f.rayservices()
            .get_opt("pinned")
            .await
            .expect("get")
            .is_none()
    );

    let right = sha256_hex(&sample_graph("sequence"));
    let patch = json!({"spec": {"source": {"sha256": right}}});
    f.pipelines()
        .patch("pinned", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");
    f.condition("pinned", "SourceReady", "True", "Fetched")
        .await;
    f.rayservice("pinned").await;
}

#[tokio::test]
async fn a_missing_graph_and_a_missing_secret_get_their_own_reasons() {
    let f = fixture("sp-missing", "token-missing-1").await;
    f.create(&pipeline(
        "nograph",
        &f.registry.url("graphs/does-not-exist.pb"),
        json!({}),
    ))
    .await;
    f.condition("nograph", "SourceReady", "False", "NotFound")
        .await;

    let mut p = pipeline("nosecret", &f.registry.url("graphs/pipeline.pb"), json!({}));
    p.spec
        .source
        .bearer_token_secret_ref
        .as_mut()
        .expect("ref")
        .name = "absent".into();
    f.create(&p).await;
    f.condition("nosecret", "SourceReady", "False", "SecretNotFound")
        .await;
}

#[tokio::test]
async fn suspend_suspends_the_rayservice() {
    let f = fixture("sp-suspend", "token-suspend-1").await;
    f.create(&pipeline(
        "suspend",
        &f.registry.url("graphs/pipeline.pb"),
        json!({}),
    ))
    .await;
    f.rayservice("suspend").await;
    let patch = json!({"spec": {"suspend": true}});
    f.pipelines()
        .patch("suspend", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");
    let api = f.rayservices();
    eventually(WAIT, "the RayService to be suspended", || {
        let api = api.clone();
        async move { (api.get("suspend").await.expect("get").spec.suspend == Some(true)).then_some(()) }
    })
    .await;
    let p = f.condition("suspend", "Ready", "False", "Suspended").await;
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Suspended"));
}

#[tokio::test]
async fn deleting_the_pipeline_garbage_collects_its_rayservice() {
    let f = fixture("sp-delete", "token-delete-1").await;
    f.create(&pipeline(
        "delete",
        &f.registry.url("graphs/pipeline.pb"),
        json!({}),
    ))
    .await;
    let rs = f.rayservice("delete").await;
    assert!(
        rs.meta()
            .owner_references
            .as_ref()
            .is_some_and(|o| o[0].block_owner_deletion == Some(true))
    );
    f.pipelines()
        .delete("delete", &DeleteParams::foreground())
        .await
        .expect("delete");
    let api = f.rayservices();
    eventually(
        Duration::from_secs(60),
        "the RayService to be garbage-collected",
        || {
            let api = api.clone();
            async move {
                api.get_opt("delete")
                    .await
                    .expect("get")
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await;
}

/// What "left exactly as it was" means for an object someone else owns.
fn untouched_parts(rs: &RayService) -> serde_json::Value {
    let meta = rs.meta();
    json!({
        "uid": meta.uid,
        "resourceVersion": meta.resource_version,
        "labels": meta.labels,
        "annotations": meta.annotations,
        "ownerReferences": meta.owner_references,
        "managedFields": meta.managed_fields,
        "spec": rs.spec,
    })
}

/// Issue 14, class 6: a RayService of the pipeline's name made by another team (no owner
/// reference, another field manager) is never written: the pipeline reports RayServiceConflict,
/// deleting the pipeline leaves the RayService, and once it is gone the pipeline makes its own.
#[tokio::test]
async fn a_foreign_rayservice_of_the_pipelines_name_is_reported_and_never_taken_over() {
    let f = fixture("sp-foreign", "token-foreign-1").await;
    let foreign: RayService = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": "taken", "labels": {"team": "other"},
            "annotations": {"owner": "the other team"}},
        "spec": {
            "serveConfigV2": "applications: []\n",
            "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-head", "image": "example/other:1"}]}}}}
        }
    }))
    .expect("a RayService");
    f.rayservices()
        .patch(
            "taken",
            &PatchParams::apply("other-team"),
            &Patch::Apply(&foreign),
        )
        .await
        .expect("the other team applies its RayService");
    let before = untouched_parts(&f.rayservices().get("taken").await.expect("get"));

    // A refresh interval of 1 s also bounds the retry backoff: the test need not wait long.
    let spec = pipeline(
        "taken",
        &f.registry.url("graphs/pipeline.pb"),
        json!({"refreshInterval": "1s"}),
    );
    f.create(&spec).await;
    let p = f
        .condition("taken", "Ready", "False", "RayServiceConflict")
        .await;
    let message = &conditions::find(&p.status.as_ref().expect("status").conditions, "Ready")
        .expect("Ready")
        .message;
    assert!(
        message.contains("RayService") && message.contains("taken"),
        "the message names the RayService: {message}"
    );
    let events = Api::<Event>::namespaced(f.client.clone(), &f.ns)
        .list(&ListParams::default())
        .await
        .expect("events");
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("RayServiceConflict")
                && e.type_.as_deref() == Some("Warning")),
        "a Warning event says RayServiceConflict"
    );
    // Several retries later it is still exactly as the other team left it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = untouched_parts(&f.rayservices().get("taken").await.expect("get"));
    assert_eq!(after, before, "the foreign RayService was modified");

    // Deleting the pipeline leaves the other team's RayService.
    f.pipelines()
        .delete("taken", &DeleteParams::foreground())
        .await
        .expect("delete the pipeline");
    let pipelines = f.pipelines();
    eventually(WAIT, "the pipeline to be gone", || {
        let api = pipelines.clone();
        async move {
            api.get_opt("taken")
                .await
                .expect("get")
                .is_none()
                .then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = untouched_parts(&f.rayservices().get("taken").await.expect("still there"));
    assert_eq!(
        after, before,
        "deleting the pipeline touched the RayService"
    );

    // Once the other team deletes theirs, a pipeline of that name makes its own.
    f.create(&spec).await;
    f.condition("taken", "Ready", "False", "RayServiceConflict")
        .await;
    f.rayservices()
        .delete("taken", &DeleteParams::default())
        .await
        .expect("the other team deletes its RayService");
    let api = f.rayservices();
    let ours = eventually(WAIT, "the pipeline's own RayService", || {
        let api = api.clone();
        async move {
            api.get_opt("taken")
                .await
                .expect("get")
                .filter(|rs| !rs.owner_references().is_empty())
        }
    })
    .await;
    let owner = &ours.owner_references()[0];
    assert_eq!(owner.kind, "ServePipeline");
    assert_eq!(owner.controller, Some(true));
    assert_eq!(
        serve_config(&ours),
        expected_serve_config(&sample_graph("sequence"), "taken")
    );
}
