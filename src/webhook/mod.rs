//! The validating admission webhook for ServePipeline and the four Ray kinds, over HTTPS.
//!
//! Each kind has its own path (KubeRay's for the Ray kinds, so existing configurations keep
//! working). A request is checked with the rules in `crate::validation` (KubeRay's, and ours for
//! ServePipeline), and denied as `Invalid` with every problem's message listed.
//! Objects being deleted, and updates that leave the spec alone, are always admitted: a rule
//! added in a later release must never keep a finalizer from being removed.

pub mod registration;
pub mod review;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::admin::Metrics;
use crate::api::{RayCluster, RayCronJob, RayJob, RayService, ServePipeline};
use crate::validation::{self, feature_gates::FeatureGates, problem::Problem};
use review::{AdmissionRequest, AdmissionResponse, AdmissionReview};

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("binding the webhook server to {address}: {source}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving the webhook: {0}")]
    Serve(#[source] std::io::Error),
    #[error("generating the webhook certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("the webhook certificate or key is unusable: {0}")]
    Certificate(String),
    #[error("the webhook certificate: {0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: Box<kube::Error>,
    },
}

impl WebhookError {
    fn kube(action: impl Into<String>, source: kube::Error) -> WebhookError {
        WebhookError::Kube {
            action: action.into(),
            source: Box::new(source),
        }
    }
}

/// The kinds the webhook validates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WebhookKind {
    ServePipeline,
    RayCluster,
    RayJob,
    RayService,
    RayCronJob,
}

impl WebhookKind {
    pub const ALL: [WebhookKind; 5] = [
        WebhookKind::ServePipeline,
        WebhookKind::RayCluster,
        WebhookKind::RayJob,
        WebhookKind::RayService,
        WebhookKind::RayCronJob,
    ];

    pub fn kind(self) -> &'static str {
        match self {
            WebhookKind::ServePipeline => "ServePipeline",
            WebhookKind::RayCluster => "RayCluster",
            WebhookKind::RayJob => "RayJob",
            WebhookKind::RayService => "RayService",
            WebhookKind::RayCronJob => "RayCronJob",
        }
    }

    pub fn group(self) -> &'static str {
        match self {
            WebhookKind::ServePipeline => "raypipe.dev",
            _ => "ray.io",
        }
    }

    pub fn version(self) -> &'static str {
        match self {
            WebhookKind::ServePipeline => "v1alpha1",
            _ => "v1",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            WebhookKind::ServePipeline => "servepipelines",
            WebhookKind::RayCluster => "rayclusters",
            WebhookKind::RayJob => "rayjobs",
            WebhookKind::RayService => "rayservices",
            WebhookKind::RayCronJob => "raycronjobs",
        }
    }

    /// The URL path, `/validate-<group with dashes>-<version>-<kind in lower case>` (KubeRay's).
    pub fn path(self) -> String {
        format!(
            "/validate-{}-{}-{}",
            self.group().replace('.', "-"),
            self.version(),
            self.kind().to_lowercase()
        )
    }

    /// The webhook's name in the ValidatingWebhookConfiguration (three or more DNS labels).
    pub fn webhook_name(self) -> String {
        format!("validate.{}.{}", self.plural(), self.group())
    }
}

/// Decides one admission request. Pure: no client, no clock.
pub fn review(
    kind: WebhookKind,
    request: &AdmissionRequest,
    gates: &FeatureGates,
) -> AdmissionResponse {
    let uid = &request.uid;
    let Some(object) = request.object.as_ref() else {
        return AdmissionResponse::allow(uid);
    };
    if request.operation != "CREATE" && request.operation != "UPDATE" {
        return AdmissionResponse::allow(uid);
    }
    if object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        return AdmissionResponse::allow(uid);
    }
    if request.operation == "UPDATE"
        && let Some(old) = &request.old_object
        && old.get("spec") == object.get("spec")
        && old.pointer("/metadata/name") == object.pointer("/metadata/name")
    {
        return AdmissionResponse::allow(uid);
    }
    let problems = match kind {
        WebhookKind::ServePipeline => typed(object, |p: ServePipeline| {
            validation::servepipeline::validate(&p, gates)
        }),
        WebhookKind::RayCluster => typed(object, |c: RayCluster| {
            validation::validated::for_webhook(&c, gates)
        }),
        WebhookKind::RayJob => typed(object, |j: RayJob| {
            validation::validated::for_webhook(&j, gates)
        }),
        WebhookKind::RayService => typed(object, |s: RayService| {
            validation::validated::for_webhook(&s, gates)
        }),
        WebhookKind::RayCronJob => typed(object, |c: RayCronJob| {
            validation::validated::for_webhook(&c, gates)
        }),
    };
    if problems.is_empty() {
        return AdmissionResponse::allow(uid);
    }
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .or(request.name.as_deref())
        .unwrap_or("<generated>");
    AdmissionResponse::deny(
        uid,
        format!(
            "{}.{} {name:?} is invalid: {}",
            kind.kind(),
            kind.group(),
            problems.join("; ")
        ),
    )
}

/// The problems' messages, or why the object could not be read as a `K`.
fn typed<K: DeserializeOwned>(
    object: &Value,
    check: impl FnOnce(K) -> Vec<Problem>,
) -> Vec<String> {
    match serde_json::from_value::<K>(object.clone()) {
        Ok(k) => check(k).into_iter().map(|p| p.message).collect(),
        Err(e) => vec![format!("the object cannot be read: {e}")],
    }
}

#[derive(Clone)]
struct WebhookState {
    gates: Arc<FeatureGates>,
    metrics: Metrics,
}

/// One POST route per kind.
pub fn router(gates: FeatureGates, metrics: Metrics) -> Router {
    let state = WebhookState {
        gates: Arc::new(gates),
        metrics,
    };
    let mut router = Router::new();
    for kind in WebhookKind::ALL {
        router = router.route(
            &kind.path(),
            post(
                move |State(state): State<WebhookState>, body: Bytes| async move {
                    handle(kind, &state, &body)
                },
            ),
        );
    }
    router.with_state(state)
}

fn handle(kind: WebhookKind, state: &WebhookState, body: &[u8]) -> Response {
    let parsed: Result<AdmissionReview, _> = serde_json::from_slice(body);
    let Some(request) = parsed.ok().and_then(|r| r.request) else {
        return (
            StatusCode::BAD_REQUEST,
            "expected an admission.k8s.io/v1 AdmissionReview with a request",
        )
            .into_response();
    };
    let response = review(kind, &request, &state.gates);
    state
        .metrics
        .admission_reviewed(kind.kind(), response.allowed);
    if !response.allowed {
        tracing::info!(
            kind = kind.kind(),
            namespace = request.namespace.as_deref().unwrap_or_default(),
            name = request.name.as_deref().unwrap_or_default(),
            message = response
                .status
                .as_ref()
                .map(|s| s.message.as_str())
                .unwrap_or_default(),
            "admission denied"
        );
    }
    match serde_json::to_vec(&response.into_review()) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Binds the webhook port.
pub async fn bind(address: SocketAddr) -> Result<TcpListener, WebhookError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| WebhookError::Bind { address, source })
}

/// Serves the webhook over HTTPS on `listener` until `shutdown` completes. The certificate
/// comes from `certificates`, which may be swapped while serving (renewal, rotation).
pub async fn serve(
    listener: TcpListener,
    certificates: Arc<tls::CertificateResolver>,
    gates: FeatureGates,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), WebhookError> {
    let tls = tls::server_config(certificates)?;
    let listener = crate::tls::TlsListener::new(listener, tls).map_err(WebhookError::Serve)?;
    axum::serve(listener, router(gates, metrics))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(WebhookError::Serve)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(operation: &str, object: Value, old: Option<Value>) -> AdmissionRequest {
        AdmissionRequest {
            uid: "uid-1".into(),
            kind: Default::default(),
            name: None,
            namespace: Some("ns".into()),
            operation: operation.into(),
            object: Some(object),
            old_object: old,
        }
    }

    fn cluster(name: &str, groups: &[&str]) -> Value {
        let container = json!({"name": "ray", "image": "rayproject/ray:2.52.0"});
        let groups: Vec<Value> = groups
            .iter()
            .map(|g| json!({"groupName": g, "template": {"spec": {"containers": [container]}}}))
            .collect();
        json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {
                "headGroupSpec": {"template": {"spec": {"containers": [container]}}},
                "workerGroupSpecs": groups
            }
        })
    }

    #[test]
    fn paths_and_names_follow_kuberay() {
        assert_eq!(
            WebhookKind::RayCluster.path(),
            "/validate-ray-io-v1-raycluster"
        );
        assert_eq!(
            WebhookKind::RayCronJob.path(),
            "/validate-ray-io-v1-raycronjob"
        );
        assert_eq!(
            WebhookKind::ServePipeline.path(),
            "/validate-raypipe-dev-v1alpha1-servepipeline"
        );
        assert_eq!(
            WebhookKind::RayService.webhook_name(),
            "validate.rayservices.ray.io"
        );
    }

    #[test]
    fn a_duplicate_worker_group_is_denied_with_the_kind_and_name() {
        let gates = FeatureGates::default();
        let response = review(
            WebhookKind::RayCluster,
            &request("CREATE", cluster("demo", &["small", "small"]), None),
            &gates,
        );
        assert!(!response.allowed);
        let status = response.status.expect("a status");
        assert_eq!(status.code, 422);
        assert!(
            status
                .message
                .starts_with("RayCluster.ray.io \"demo\" is invalid: "),
            "{}",
            status.message
        );
        assert!(status.message.contains("duplicate"), "{}", status.message);
        assert!(
            review(
                WebhookKind::RayCluster,
                &request("CREATE", cluster("demo", &["small", "large"]), None),
                &gates
            )
            .allowed
        );
    }

    #[test]
    fn deletions_and_metadata_only_updates_are_always_admitted() {
        let gates = FeatureGates::default();
        let invalid = cluster("demo", &["a", "a"]);
        let mut labelled = invalid.clone();
        labelled["metadata"]["labels"] = json!({"team": "x"});
        assert!(
            review(
                WebhookKind::RayCluster,
                &request("UPDATE", labelled, Some(invalid.clone())),
                &gates
            )
            .allowed
        );
        let mut deleting = invalid.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(
            review(
                WebhookKind::RayCluster,
                &request("UPDATE", deleting, Some(invalid)),
                &gates
            )
            .allowed
        );
    }
}
