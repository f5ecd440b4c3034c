//! Metrics of the operator's own Kubernetes API requests: a tower layer for
//! `kube::client::ClientBuilder::with_layer` that counts every request by Kubernetes verb and
//! HTTP status (`raypipe_kube_requests_total{verb, code}`) and times it by verb
//! (`raypipe_kube_request_duration_seconds{verb}`, until the response headers: a watch counts
//! the time to open it). Labels are bounded: the verb is one of the API server's (`get`,
//! `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`) or `other`,
//! never a URL, namespace or object name; the code is the HTTP status or `error` when no
//! answer came.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Method, Request, Response};

use super::Metrics;

/// The Kubernetes verb of a request, from its method, path and query: what the API server's
/// audit log and RBAC call it.
pub fn verb<B>(request: &Request<B>) -> &'static str {
    let uri = request.uri();
    let collection = is_collection(uri.path());
    match *request.method() {
        Method::GET if is_watch(uri.query()) => "watch",
        Method::GET if collection => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if collection => "deletecollection",
        Method::DELETE => "delete",
        _ => "other",
    }
}

fn is_watch(query: Option<&str>) -> bool {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .any(|pair| matches!(pair, "watch=true" | "watch=1"))
}

/// A resource path that names a collection (`/api/v1/namespaces/ns/pods`,
/// `/apis/ray.io/v1/rayclusters`) rather than one object or a sub-resource.
fn is_collection(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let resource = match segments.first() {
        Some(&"api") => segments.get(2..),
        Some(&"apis") => segments.get(3..),
        _ => None,
    };
    let Some(mut resource) = resource else {
        return false;
    };
    if resource.first() == Some(&"namespaces") && resource.len() >= 3 {
        resource = &resource[2..];
    }
    resource.len() == 1
}

/// Adds request metrics to a kube client's service stack.
#[derive(Clone, Debug)]
pub struct KubeRequestMetricsLayer {
    metrics: Metrics,
}

impl KubeRequestMetricsLayer {
    pub fn new(metrics: &Metrics) -> Self {
        KubeRequestMetricsLayer {
            metrics: metrics.clone(),
        }
    }
}

impl<S> tower::Layer<S> for KubeRequestMetricsLayer {
    type Service = KubeRequestMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        KubeRequestMetrics {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`KubeRequestMetricsLayer`] wraps around the client's stack.
#[derive(Clone, Debug)]
pub struct KubeRequestMetrics<S> {
    inner: S,
    metrics: Metrics,
}

impl<S, B, RB> tower::Service<Request<B>> for KubeRequestMetrics<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let verb = verb(&request);
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(response) => Some(response.status().as_u16()),
                Err(_) => None,
            };
            metrics.kube_request(verb, code, started.elapsed());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, uri: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .expect("a request")
    }

    #[test]
    fn verbs_follow_the_api_servers_names() {
        let cases = [
            (
                Method::GET,
                "/api/v1/namespaces/ns/pods?labelSelector=a",
                "list",
            ),
            (Method::GET, "/api/v1/namespaces/ns/pods/p", "get"),
            (Method::GET, "/api/v1/namespaces/ns/pods/p/log", "get"),
            (Method::GET, "/api/v1/namespaces", "list"),
            (Method::GET, "/api/v1/namespaces/ns", "get"),
            (
                Method::GET,
                "/apis/ray.io/v1/rayclusters?watch=true&resourceVersion=5",
                "watch",
            ),
            (Method::GET, "/apis/ray.io/v1/namespaces/ns/rayjobs", "list"),
            (Method::GET, "/apis/ray.io/v1", "get"),
            (Method::GET, "/version", "get"),
            (Method::POST, "/api/v1/namespaces/ns/events", "create"),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
                "update",
            ),
            (
                Method::PATCH,
                "/apis/ray.io/v1/namespaces/ns/rayclusters/c/status?fieldManager=x",
                "patch",
            ),
            (Method::DELETE, "/api/v1/namespaces/ns/pods/p", "delete"),
            (
                Method::DELETE,
                "/api/v1/namespaces/ns/pods",
                "deletecollection",
            ),
            (Method::HEAD, "/api/v1/namespaces/ns/pods", "other"),
        ];
        for (method, uri, expected) in cases {
            assert_eq!(
                verb(&request(method.clone(), uri)),
                expected,
                "{method} {uri}"
            );
        }
    }

    #[tokio::test]
    async fn the_layer_counts_answers_by_verb_and_code_and_failures_as_error() {
        use tower::{Layer, ServiceExt};
        let metrics = Metrics::new();
        let answer = tower::service_fn(|request: Request<()>| async move {
            if request.uri().path().ends_with("/missing") {
                Response::builder().status(404).body(())
            } else if request.uri().path().ends_with("/unreachable") {
                // An error that is not an HTTP answer (connection refused, say).
                Err(Response::builder()
                    .status(1000)
                    .body(())
                    .expect_err("1000 is no status"))
            } else {
                Response::builder().status(200).body(())
            }
        });
        let service = KubeRequestMetricsLayer::new(&metrics).layer(answer);
        for uri in [
            "/api/v1/namespaces/ns/pods",
            "/api/v1/namespaces/ns/pods",
            "/api/v1/namespaces/ns/pods/missing",
            "/api/v1/namespaces/ns/pods/unreachable",
        ] {
            let _ = service.clone().oneshot(request(Method::GET, uri)).await;
        }
        let text = metrics.encode().expect("encodes");
        for expected in [
            "raypipe_kube_requests_total{verb=\"list\",code=\"200\"} 2",
            "raypipe_kube_requests_total{verb=\"get\",code=\"404\"} 1",
            "raypipe_kube_requests_total{verb=\"get\",code=\"error\"} 1",
            "raypipe_kube_request_duration_seconds_count{verb=\"list\"} 2",
            "raypipe_kube_request_duration_seconds_count{verb=\"get\"} 2",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        assert!(!text.contains("pods"), "no paths in labels: {text}");
    }
}
