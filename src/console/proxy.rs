//! The dashboard front: each RayCluster's Ray dashboard under `/dashboards/<namespace>/<name>/`,
//! behind the console's sign-in. A browser comes with its session cookie, a program (the Jobs
//! SDK, `ray job submit --headers`, a Serve client) with a Kubernetes bearer token, so
//! programmatic clients keep working.
//!
//! Authorisation follows the API server's own Service proxy: the HTTP method maps to a verb
//! (GET and HEAD `get`, POST `create`, PUT `update`, PATCH `patch`, DELETE `delete`) on the
//! subresource `rayclusters/proxy` of the cluster's namespace. Reading a dashboard and
//! submitting a job (which runs code on the cluster) are thus separate grants.
//!
//! What the caller sent for the console (its `Authorization`, the console's cookies, any
//! `x-ray-authorization` of its own) is never passed on; a cluster with Ray token auth gets
//! Ray's own token in `x-ray-authorization`, read from the cluster's Secret.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use axum::response::Response;
use futures::TryStreamExt as _;
use kube::api::Api;

use super::server::{Console, LOGIN_COOKIE, Refusal, SESSION_COOKIE};
use crate::api::raycluster::RayCluster;
use crate::controllers::dashboard;
use crate::k8s::review::{Caller, CallerKey, Permission};
use crate::ray::TOKEN_HEADER;

/// Request and response headers that belong to one hop (RFC 9110 §7.6.1), never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// The verb the API server's Service proxy would check for `method`.
pub fn verb_of(method: &Method) -> Option<&'static str> {
    Some(match *method {
        Method::GET | Method::HEAD | Method::OPTIONS => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => return None,
    })
}

/// The permission a request to a cluster's dashboard needs.
pub fn permission(method: &Method, namespace: &str) -> Option<Permission> {
    Some(
        Permission::new(verb_of(method)?, "ray.io", "rayclusters", namespace)
            .on_subresource("proxy"),
    )
}

/// The request headers the dashboard gets: the caller's, minus hop-by-hop ones, its
/// credentials for the console and the console's cookies.
pub fn forwarded_headers(incoming: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in incoming {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n)
            || n == header::AUTHORIZATION.as_str()
            || n == TOKEN_HEADER
            || n == header::COOKIE.as_str()
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    // Other cookies of the browser may matter to the dashboard; the console's never do.
    let others: Vec<&str> = incoming
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(k, _)| k);
            !pair.is_empty() && name != SESSION_COOKIE && name != LOGIN_COOKIE
        })
        .collect();
    if !others.is_empty()
        && let Ok(value) = HeaderValue::from_str(&others.join("; "))
    {
        out.insert(header::COOKIE, value);
    }
    out
}

pub(super) async fn forward(
    console: &Console,
    caller: &Caller,
    key: CallerKey,
    namespace: &str,
    cluster: &str,
    rest: &str,
    request: Request,
) -> Result<Response, Refusal> {
    let locator = console
        .dashboards
        .as_ref()
        .ok_or_else(|| Refusal::NotFound("the console's dashboard front is not enabled".into()))?;
    let permission = permission(request.method(), namespace).ok_or(Refusal::MethodNotAllowed)?;
    console.authorize(caller, key, &permission).await?;
    let clusters: Api<RayCluster> = Api::namespaced(console.client.clone(), namespace);
    let ray_cluster = clusters
        .get_opt(cluster)
        .await
        .map_err(|e| {
            Refusal::Unavailable(format!("reading RayCluster {namespace}/{cluster}: {e}"))
        })?
        .ok_or_else(|| Refusal::NotFound(format!("no RayCluster {namespace}/{cluster}")))?;
    let base =
        dashboard::locate(locator, &ray_cluster).map_err(|e| Refusal::BadGateway(e.to_string()))?;
    let token = if crate::kuberay::spec::auth_enabled(&ray_cluster.spec) {
        Some(
            dashboard::read_token(&console.client, &ray_cluster)
                .await
                .map_err(|e| Refusal::BadGateway(e.to_string()))?,
        )
    } else {
        None
    };
    let segments: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    let mut url = base.join(&segments);
    url.set_query(request.uri().query());
    let (parts, body) = request.into_parts();
    let mut headers = forwarded_headers(&parts.headers);
    if let Some(token) = &token {
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.expose_secret()))
            .map_err(|_| Refusal::BadGateway("the Ray auth token is not a header value".into()))?;
        value.set_sensitive(true);
        headers.insert(HeaderName::from_static(TOKEN_HEADER), value);
    }
    tracing::debug!(user = %caller.username, %namespace, %cluster, method = %parts.method, path = rest, "console: dashboard request");
    let upstream = console
        .http
        .request(parts.method, url)
        .headers(headers)
        .body(reqwest::Body::wrap_stream(
            body.into_data_stream()
                .map_err(|e| std::io::Error::other(e.to_string())),
        ))
        .send()
        .await
        .map_err(|e| {
            Refusal::BadGateway(format!(
                "the Ray dashboard of {namespace}/{cluster} did not answer: {}",
                e.without_url()
            ))
        })?;
    let mut response = Response::builder().status(upstream.status());
    if let Some(out) = response.headers_mut() {
        for (name, value) in upstream.headers() {
            if !HOP_BY_HOP.contains(&name.as_str()) {
                out.append(name.clone(), value.clone());
            }
        }
    }
    response
        .body(Body::from_stream(upstream.bytes_stream()))
        .map_err(|e| Refusal::BadGateway(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_map_to_the_service_proxys_verbs() {
        let p = permission(&Method::POST, "ml").expect("a verb");
        assert_eq!(
            (
                p.verb,
                p.group,
                p.resource,
                p.subresource,
                p.namespace.as_str()
            ),
            ("create", "ray.io", "rayclusters", "proxy", "ml")
        );
        assert_eq!(verb_of(&Method::GET), Some("get"));
        assert_eq!(verb_of(&Method::DELETE), Some("delete"));
        assert_eq!(verb_of(&Method::CONNECT), None);
    }

    #[test]
    fn the_console_credentials_never_reach_the_dashboard() {
        let mut incoming = HeaderMap::new();
        incoming.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer k8s"),
        );
        incoming.insert(TOKEN_HEADER, HeaderValue::from_static("Bearer guessed"));
        incoming.insert(
            header::COOKIE,
            HeaderValue::from_static("raypipe_session=s; theme=dark; raypipe_login=l"),
        );
        incoming.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        incoming.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let out = forwarded_headers(&incoming);
        assert!(out.get(header::AUTHORIZATION).is_none());
        assert!(out.get(TOKEN_HEADER).is_none());
        assert!(out.get(header::CONNECTION).is_none());
        assert_eq!(out.get(header::COOKIE).unwrap(), "theme=dark");
        assert_eq!(out.get(header::ACCEPT).unwrap(), "application/json");
    }
}
