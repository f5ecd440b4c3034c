//! The generic pieces every integration module builds its fixture from, so that no module
//! re-declares them: applying any object from JSON into a test's namespace, the namespace's
//! events, the registry-token Secret, the ServePipeline the tests start from, RayService status
//! predicates, and POSTing to a Ray head's Serve proxy until it answers.
//!
//! A test gets its client and namespace from `support::client()` and `support::namespace()`,
//! starts controllers with `support::spawn_operator` (flags as `raypipe run` takes them) or the
//! module's own `Controller::run`, and waits with `support::eventually`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Secret};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::discovery::pinned_kind;
use raypipe::api::conditions;
use raypipe::api::rayservice::RayServiceStatus;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::devenv::ray::RayHead;
use serde_json::{Value, json};

use super::eventually;

/// Stops the controllers a test spawned when it is dropped (with the test's fixture): each
/// controller's `run` gets one [`Stopper::signal`] as its shutdown future.
#[derive(Default)]
pub struct Stopper(Vec<tokio::sync::oneshot::Sender<()>>);

impl Stopper {
    /// A future that resolves when this stopper is dropped.
    pub fn signal(&mut self) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        self.0.push(tx);
        async move {
            let _ = rx.await;
        }
    }
}

impl Drop for Stopper {
    fn drop(&mut self) {
        for tx in self.0.drain(..) {
            let _ = tx.send(());
        }
    }
}

/// Starts a RayCluster controller on `config` that watches only `ns`; it stops with `stop`.
pub fn spawn_raycluster_controller(
    client: &kube::Client,
    ns: &str,
    config: raypipe::controllers::raycluster::Config,
    stop: &mut Stopper,
) {
    tokio::spawn(raypipe::controllers::raycluster::run(
        client.clone(),
        raypipe::controllers::raycluster::Config {
            namespace: Some(ns.to_owned()),
            ..config
        },
        stop.signal(),
    ));
}

/// Server-side applies `doc` (any kind the API server serves) into `ns`, as `field_manager`.
pub async fn apply(client: &kube::Client, ns: &str, doc: &Value, field_manager: &str) {
    let api_version = doc["apiVersion"].as_str().expect("apiVersion");
    let kind = doc["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let (resource, _) = pinned_kind(client, &GroupVersionKind::gvk(group, version, kind))
        .await
        .unwrap_or_else(|e| panic!("{api_version} {kind}: {e}"));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let object: DynamicObject = serde_json::from_value(doc.clone()).expect("an object");
    api.patch(
        &object.name_any(),
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {kind} {}: {e}", object.name_any()));
}

/// Every Event in `ns`.
pub async fn events(client: &kube::Client, ns: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
}

/// The Events in `ns` with this `reason`.
pub async fn events_with_reason(client: &kube::Client, ns: &str, reason: &str) -> Vec<Event> {
    events(client, ns)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Applies a Secret `name` with `token` under the key `token` (what a ServePipeline's
/// `bearerTokenSecretRef` names) into `ns`.
pub async fn put_token_secret(client: &kube::Client, ns: &str, name: &str, token: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "stringData": {"token": token}
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("apply Secret");
}

/// A ServePipeline `name` fetching from `source`, with a one-container head group (Ray 2.52.0).
pub fn servepipeline(name: &str, source: Value) -> ServePipeline {
    serde_json::from_value(json!({
        "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline", "metadata": {"name": name},
        "spec": {
            "source": source,
            "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}}}
        }
    }))
    .expect("a ServePipeline")
}

/// A ServePipeline `name` serving at `route` from `source`, its Ray head running the container
/// `head` (as the end-to-end tests run it on the shared Ray head).
pub fn serving_pipeline(name: &str, source: Value, route: &str, head: Value) -> ServePipeline {
    serde_json::from_value(json!({
        "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline",
        "metadata": {"name": name},
        "spec": {
            "source": source,
            "serve": {"routePrefix": route},
            "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
                "containers": [head]}}}}
        }
    }))
    .expect("a valid ServePipeline")
}

/// A source at `url` over plain HTTP with the token of the Secret `registry-token`, plus the
/// fields of `extra` (e.g. `refreshInterval`).
pub fn token_source(url: &str, extra: Value) -> Value {
    let mut source = json!({
        "url": url,
        "allowInsecureHttp": true,
        "bearerTokenSecretRef": {"name": "registry-token", "key": "token"}
    });
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        source[k] = v;
    }
    source
}

/// Polls RayService `name` in `ns` until its status satisfies `check` and returns that status;
/// after `wait` fails naming `what` and the last status seen.
pub async fn rayservice_status_until(
    client: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    wait: Duration,
    check: impl Fn(&RayServiceStatus) -> bool,
) -> RayServiceStatus {
    let api: Api<raypipe::api::rayservice::RayService> = Api::namespaced(client.clone(), ns);
    let mut last = None::<RayServiceStatus>;
    let deadline = std::time::Instant::now() + wait;
    loop {
        if let Ok(service) = api.get(name).await
            && let Some(status) = service.status
        {
            if check(&status) {
                return status;
            }
            last = Some(status);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "RayService {name}: {what} did not happen within {wait:?}; last status: {}",
            serde_json::to_string_pretty(&last).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The RayService's `Ready` condition is True.
pub fn rayservice_ready(status: &RayServiceStatus) -> bool {
    conditions::find(&status.conditions, "Ready").is_some_and(|c| c.status == "True")
}

/// The RayCluster the RayService serves from.
pub fn active_cluster_name(status: &RayServiceStatus) -> Option<String> {
    status
        .active_service_status
        .as_ref()?
        .ray_cluster_name
        .clone()
}

/// A plain HTTP client for the loopback (no proxy from the environment), `timeout` per request.
pub fn loopback_http(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .build()
        .expect("an HTTP client")
}

/// POSTs `body` to `path` on `head`'s Serve proxy until it answers 200 with JSON for which
/// `check` holds, for at most `timeout`; returns that JSON.
pub async fn serve_post(
    head: &RayHead,
    path: &str,
    body: &str,
    timeout: Duration,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let http = loopback_http(Duration::from_secs(10));
    let url = format!("{}{path}", head.serve_url());
    eventually(
        timeout,
        &format!("Serve at {url} to answer POST {body} as expected"),
        || {
            let request = http.post(&url).body(body.to_owned());
            let check = &check;
            async move {
                let response = request.send().await.ok()?;
                if !response.status().is_success() {
                    return None;
                }
                let answer: Value = serde_json::from_slice(&response.bytes().await.ok()?).ok()?;
                check(&answer).then_some(answer)
            }
        },
    )
    .await
}
