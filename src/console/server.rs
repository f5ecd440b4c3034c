//! The console's HTTP server: pages and JSON for people and programs, each request answered
//! only after Kubernetes said who is asking (a bearer token through a TokenReview, or a browser
//! session from an OpenID Connect sign-in) and that they may `get` what is shown
//! (SubjectAccessReview per namespace). A caller without a valid identity learns nothing, not
//! even which pipelines exist.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::Serialize;

use super::cookie::{CookieKey, clear_cookie, set_cookie};
use super::oidc::{Identity, OidcProvider, OidcSettings, PendingLogin, safe_return_path};
use super::page;
use super::proxy;
use super::view;
use crate::api::rayservice::RayService;
use crate::api::servepipeline::ServePipeline;
use crate::history::api::{ApiTls, percent_decode, query_value};
use crate::k8s::review::{
    Caller, CallerKey, Permission, ReviewError, Reviewer, bearer_token, identity_key, token_key,
};
use crate::present::summary::{PipelineSummary, summary};
use crate::ray::DashboardLocator;
use crate::tls::{CertificateResolver, TlsError, TlsListener, server_config};

/// The browser session's cookie: the signed-in identity, sealed.
pub const SESSION_COOKIE: &str = "raypipe_session";
/// The sign-in in progress (state, nonce, PKCE verifier), sealed, for the callback.
pub const LOGIN_COOKIE: &str = "raypipe_login";
/// How long a sign-in may take at the provider.
const LOGIN_TTL: Duration = Duration::from_secs(600);
/// The longest a browser session lasts, however long the ID token would.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// Namespaces reviewed at once when listing.
const PARALLEL_REVIEWS: usize = 8;
/// How long the pipeline cache may take to fill before requests are answered 503.
const CACHE_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("listening for the console on {address}: {source}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving the console: {0}")]
    Serve(#[source] std::io::Error),
    #[error("the console's TLS certificate: {0}")]
    Tls(#[from] TlsError),
    #[error("the console's OpenID Connect provider: {0}")]
    Oidc(#[from] super::oidc::OidcError),
    #[error("building the console's HTTP client: {0}")]
    Http(String),
    #[error("the console's settings: {0}")]
    Settings(String),
}

/// Everything the console runs with.
pub struct ConsoleConfig {
    pub listen: SocketAddr,
    /// HTTPS with this certificate; `None`: plain HTTP (behind a TLS-terminating ingress, or
    /// on loopback).
    pub tls: Option<ApiTls>,
    /// Audiences the bearer tokens must be meant for; empty: the API server's own.
    pub audiences: Vec<String>,
    /// Browser sign-in; `None`: bearer tokens only.
    pub oidc: Option<OidcSettings>,
    /// Seals the session cookies; from a Secret, so sessions survive restarts and replicas.
    pub cookie_key: CookieKey,
    /// Send cookies with `Secure` (the console is reached over HTTPS, directly or through an
    /// ingress).
    pub secure_cookies: bool,
    /// The history API's base URL, for links (`raypipe history serve`).
    pub history_url: Option<String>,
    /// Where each RayCluster's dashboard is, for the dashboard front; `None`: no front.
    pub dashboards: Option<DashboardLocator>,
    /// Namespaces whose pipelines are shown; empty: every namespace.
    pub namespaces: Vec<String>,
    /// Where the runtime's per-node metrics are queried: a Prometheus base URL and the label
    /// its scrape puts the Pod's namespace in (empty: none); `None`: no metrics on the page.
    pub prometheus: Option<(String, String)>,
}

pub(super) struct Console {
    pub(super) client: kube::Client,
    reviewer: Reviewer,
    oidc: Option<OidcProvider>,
    cookies: CookieKey,
    secure_cookies: bool,
    history_url: Option<String>,
    pub(super) dashboards: Option<DashboardLocator>,
    pub(super) http: reqwest::Client,
    stores: Vec<Store<ServePipeline>>,
    prometheus: Option<super::metrics::Prometheus>,
}

/// Binds `config.listen` and serves there (see [`serve_on`]).
pub async fn serve(
    client: kube::Client,
    config: ConsoleConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ConsoleError> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ConsoleError::Bind {
            address: config.listen,
            source,
        })?;
    serve_on(listener, client, config, shutdown).await
}

/// One watch-fed cache of pipelines per namespace (or one for all): a page of 1,000 pipelines
/// is read from memory, not listed from the API server on every request.
fn pipeline_stores(
    client: &kube::Client,
    namespaces: &[String],
) -> (Vec<Store<ServePipeline>>, Vec<tokio::task::JoinHandle<()>>) {
    let apis: Vec<Api<ServePipeline>> = if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    };
    let mut stores = Vec::new();
    let mut tasks = Vec::new();
    for api in apis {
        let (reader, writer) = reflector::store();
        let stream = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default()).default_backoff(),
        )
        .applied_objects();
        tasks.push(tokio::spawn(async move {
            use futures::StreamExt as _;
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                if let Err(e) = item {
                    tracing::debug!(error = %e, "console: pipeline watch error (retried)");
                }
            }
        }));
        stores.push(reader);
    }
    (stores, tasks)
}

/// Serves the console on `listener` until `shutdown` resolves.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    client: kube::Client,
    config: ConsoleConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ConsoleError> {
    let address = listener.local_addr().map_err(ConsoleError::Serve)?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .read_timeout(Duration::from_secs(60))
        .no_proxy()
        .build()
        .map_err(|e| ConsoleError::Http(e.to_string()))?;
    let oidc = match config.oidc {
        Some(settings) => Some(OidcProvider::discover(settings, http.clone()).await?),
        None => None,
    };
    let prometheus = match &config.prometheus {
        Some((url, label)) => Some(
            super::metrics::Prometheus::new(url, label, http.clone())
                .map_err(ConsoleError::Settings)?,
        ),
        None => None,
    };
    let (stores, tasks) = pipeline_stores(&client, &config.namespaces);
    let console = Arc::new(Console {
        reviewer: Reviewer::new(client.clone(), config.audiences),
        client,
        oidc,
        cookies: config.cookie_key,
        secure_cookies: config.secure_cookies,
        history_url: config.history_url,
        dashboards: config.dashboards,
        http,
        stores,
        prometheus,
    });
    let app = Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .fallback(answer)
        .with_state(console);
    let _watches = AbortOnDrop(tasks);
    let Some(tls) = config.tls else {
        tracing::info!(%address, "console listening (plain HTTP)");
        return axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(ConsoleError::Serve);
    };
    let resolver = CertificateResolver::new(&tls.files.read()?)?;
    let listener = TlsListener::new(listener, server_config(resolver.clone())?)
        .map_err(ConsoleError::Serve)?;
    tracing::info!(%address, "console listening (HTTPS)");
    let server = std::future::IntoFuture::into_future(
        axum::serve(listener, app).with_graceful_shutdown(shutdown),
    );
    tokio::select! {
        served = server => served.map_err(ConsoleError::Serve),
        () = tls.files.watch(resolver, tls.reload_every) => Ok(()),
    }
}

struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Why a request is not answered as asked. The texts never hold a token or a cookie.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    #[error("{0}")]
    Unauthenticated(&'static str),
    #[error("{user} may not {verb} {resource} in namespace {namespace}")]
    Forbidden {
        user: String,
        verb: &'static str,
        resource: String,
        namespace: String,
    },
    #[error("Kubernetes could not review the request; try again later")]
    ReviewUnavailable,
    /// The provider refused the sign-in, or it did not check out.
    #[error("{0}")]
    SignInFailed(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    BadGateway(String),
    #[error("only GET is served here")]
    MethodNotAllowed,
}

impl From<ReviewError> for Refusal {
    fn from(error: ReviewError) -> Refusal {
        match error {
            ReviewError::Unauthenticated(why) => Refusal::Unauthenticated(why),
            ReviewError::Unavailable => Refusal::ReviewUnavailable,
        }
    }
}

impl Refusal {
    fn status(&self) -> StatusCode {
        match self {
            Refusal::Unauthenticated(_) | Refusal::SignInFailed(_) => StatusCode::UNAUTHORIZED,
            Refusal::Forbidden { .. } => StatusCode::FORBIDDEN,
            Refusal::ReviewUnavailable | Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::NotFound(_) => StatusCode::NOT_FOUND,
            Refusal::BadRequest(_) => StatusCode::BAD_REQUEST,
            Refusal::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Refusal::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    fn into_response(self, html: bool, user: &str) -> Response {
        let status = self.status();
        let mut response = if html {
            (
                status,
                [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                page::problem_page(
                    user,
                    status.canonical_reason().unwrap_or(""),
                    &self.to_string(),
                ),
            )
                .into_response()
        } else {
            json(status, &serde_json::json!({"error": self.to_string()}))
        };
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_string(value) {
        Ok(body) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn html(body: String) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

fn redirect(to: &str, cookies: &[String]) -> Response {
    let mut response = StatusCode::FOUND.into_response();
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(to) {
        headers.insert(header::LOCATION, location);
    }
    for cookie in cookies {
        if let Ok(value) = HeaderValue::from_str(cookie) {
            headers.append(header::SET_COOKIE, value);
        }
    }
    response
}

/// The value of cookie `name` in the request.
pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k == name).then_some(v)
        })
}

fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"))
}

fn now_unix() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// The console's pages and API, by path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Route {
    Index,
    PipelinePage {
        namespace: String,
        name: String,
    },
    ApiPipelines,
    ApiPipeline {
        namespace: String,
        name: String,
    },
    Login,
    Callback,
    Logout,
    Dashboard {
        namespace: String,
        cluster: String,
        /// The path below the dashboard's root, starting with `/`.
        rest: String,
    },
}

fn name_part(raw: &str) -> Result<String, Refusal> {
    let decoded =
        percent_decode(raw).ok_or_else(|| Refusal::BadRequest(format!("bad escape in {raw:?}")))?;
    // Kubernetes names: a DNS subdomain at most; nothing that climbs or splits.
    let edge_ok = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    if !edge_ok(decoded.as_bytes().first())
        || !edge_ok(decoded.as_bytes().last())
        || decoded.len() > 253
        || !decoded
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return Err(Refusal::NotFound(format!("no such name: {decoded:?}")));
    }
    Ok(decoded)
}

pub(super) fn route(path: &str) -> Result<Route, Refusal> {
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    let not_found = || Refusal::NotFound(format!("no page {path}"));
    Ok(match parts.as_slice() {
        [""] => Route::Index,
        ["login"] => Route::Login,
        ["oauth2", "callback"] => Route::Callback,
        ["logout"] => Route::Logout,
        ["pipelines", ns, name] => Route::PipelinePage {
            namespace: name_part(ns)?,
            name: name_part(name)?,
        },
        ["api", "v1", "pipelines"] => Route::ApiPipelines,
        ["api", "v1", "namespaces", ns, "pipelines", name] => Route::ApiPipeline {
            namespace: name_part(ns)?,
            name: name_part(name)?,
        },
        ["dashboards", ns, cluster, rest @ ..] => Route::Dashboard {
            namespace: name_part(ns)?,
            cluster: name_part(cluster)?,
            // Empty for the root without its slash, which is redirected (below).
            rest: if rest.is_empty() {
                String::new()
            } else {
                format!("/{}", rest.join("/"))
            },
        },
        _ => return Err(not_found()),
    })
}

async fn answer(State(console): State<Arc<Console>>, request: Request) -> Response {
    let html = wants_html(request.headers());
    let path = request.uri().path().to_owned();
    let dashboard = path.starts_with("/dashboards/");
    let response = match handle(&console, request).await {
        Ok(response) => response,
        Err((refusal, user)) => {
            if refusal.status().is_server_error() {
                tracing::warn!(path, status = %refusal.status(), error = %refusal, "console request failed");
            } else {
                tracing::debug!(path, status = %refusal.status(), error = %refusal, "console request refused");
            }
            refusal.into_response(html, &user)
        }
    };
    // The dashboard's own answers keep the dashboard's headers (its UI runs scripts).
    if dashboard {
        response
    } else {
        with_security_headers(response)
    }
}

type Failure = (Refusal, String);

fn anonymous(refusal: Refusal) -> Failure {
    (refusal, String::new())
}

impl Console {
    /// Who is asking: a bearer token wins over a session cookie (programs send the former).
    async fn caller(&self, headers: &HeaderMap) -> Result<(Caller, CallerKey), Refusal> {
        if headers.contains_key(header::AUTHORIZATION) {
            let token = bearer_token(headers)?;
            let key = token_key(token);
            return Ok((self.reviewer.authenticate(token, key).await?, key));
        }
        let identity = cookie(headers, SESSION_COOKIE)
            .and_then(|value| self.cookies.open(SESSION_COOKIE, value, now_unix()))
            .and_then(|bytes| serde_json::from_slice::<Identity>(&bytes).ok())
            .filter(|identity| identity.expires_at > now_unix())
            .ok_or(Refusal::Unauthenticated(
                "sign in, or send a Kubernetes bearer token: Authorization: Bearer <token>",
            ))?;
        let caller = Caller {
            username: identity.username,
            uid: None,
            groups: identity.groups,
            extra: Default::default(),
        };
        let key = identity_key(&caller);
        Ok((caller, key))
    }

    pub(super) async fn authorize(
        &self,
        caller: &Caller,
        key: CallerKey,
        permission: &Permission,
    ) -> Result<(), Refusal> {
        if self.reviewer.allowed(caller, key, permission).await? {
            return Ok(());
        }
        let resource = if permission.subresource.is_empty() {
            format!("{}.{}", permission.resource, permission.group)
        } else {
            format!(
                "{}/{}.{}",
                permission.resource, permission.subresource, permission.group
            )
        };
        Err(Refusal::Forbidden {
            user: caller.username.clone(),
            verb: permission.verb,
            resource,
            namespace: permission.namespace.clone(),
        })
    }

    /// Every pipeline the caller may `get`, sorted by namespace and name.
    async fn visible_pipelines(
        &self,
        caller: &Caller,
        key: CallerKey,
    ) -> Result<Vec<PipelineSummary>, Refusal> {
        let mut all = Vec::new();
        for store in &self.stores {
            tokio::time::timeout(CACHE_WAIT, store.wait_until_ready())
                .await
                .map_err(|_| Refusal::Unavailable("the pipeline list is still loading".into()))?
                .map_err(|_| Refusal::Unavailable("the pipeline list is not available".into()))?;
            all.extend(store.state());
        }
        let namespaces: std::collections::BTreeSet<String> = all
            .iter()
            .filter_map(|p| p.metadata.namespace.clone())
            .collect();
        let permissions: Vec<Permission> = namespaces
            .iter()
            .map(|ns| Permission::pipelines(ns))
            .collect();
        let mut readable = std::collections::BTreeSet::new();
        for batch in permissions.chunks(PARALLEL_REVIEWS) {
            let answers = futures::future::join_all(
                batch.iter().map(|p| self.reviewer.allowed(caller, key, p)),
            )
            .await;
            for (permission, allowed) in batch.iter().zip(answers) {
                if allowed? {
                    readable.insert(permission.namespace.clone());
                }
            }
        }
        let mut rows: Vec<PipelineSummary> = all
            .iter()
            .filter(|p| {
                p.metadata
                    .namespace
                    .as_ref()
                    .is_some_and(|ns| readable.contains(ns))
            })
            .map(|p| summary(p))
            .collect();
        rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ok(rows)
    }

    async fn detail(&self, namespace: &str, name: &str) -> Result<view::PipelineDetail, Refusal> {
        let pipeline = self
            .stores
            .iter()
            .find_map(|s| s.get(&reflector::ObjectRef::new(name).within(namespace)))
            .ok_or_else(|| Refusal::NotFound(format!("no ServePipeline {namespace}/{name}")))?;
        let rayservice_name = pipeline
            .status
            .as_ref()
            .and_then(|s| s.ray_service_name.clone())
            .unwrap_or_else(|| name.to_owned());
        let rayservices: Api<RayService> = Api::namespaced(self.client.clone(), namespace);
        let rayservice = rayservices.get_opt(&rayservice_name).await.map_err(|e| {
            Refusal::Unavailable(format!(
                "reading RayService {namespace}/{rayservice_name}: {e}"
            ))
        })?;
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let events = events
            .list(&ListParams::default().fields(&format!(
                "involvedObject.kind=ServePipeline,involvedObject.name={name}"
            )))
            .await
            .map(|l| l.items)
            .unwrap_or_else(|e| {
                tracing::debug!(error = %e, "console: listing Events failed");
                Vec::new()
            });
        let mut detail = view::detail(&pipeline, rayservice.as_ref(), &events);
        if let Some(prometheus) = &self.prometheus {
            let versions = detail
                .versions
                .iter()
                .filter(|v| v.role != "retiring" && !v.application.is_empty())
                .map(|v| prometheus.version(namespace, v.role, &v.application));
            for answer in futures::future::join_all(versions).await {
                match answer {
                    Ok(version) => detail.metrics.push(version),
                    Err(problem) => detail.metrics_problem = Some(problem),
                }
            }
        }
        Ok(detail)
    }

    fn login_start(&self, return_to: &str) -> Result<Response, Refusal> {
        let oidc = self.oidc.as_ref().ok_or_else(|| {
            Refusal::NotFound(
                "browser sign-in is not configured; send a Kubernetes bearer token".into(),
            )
        })?;
        let (authorize_url, pending) = oidc.begin_login(&safe_return_path(return_to));
        let sealed = self.cookies.seal(
            LOGIN_COOKIE,
            &serde_json::to_vec(&pending).unwrap_or_default(),
            now_unix(),
            LOGIN_TTL,
        );
        Ok(redirect(
            &authorize_url,
            &[set_cookie(
                LOGIN_COOKIE,
                &sealed,
                LOGIN_TTL,
                self.secure_cookies,
            )],
        ))
    }

    async fn login_finish(
        &self,
        headers: &HeaderMap,
        query: Option<&str>,
    ) -> Result<Response, Refusal> {
        let oidc = self
            .oidc
            .as_ref()
            .ok_or_else(|| Refusal::NotFound("browser sign-in is not configured".into()))?;
        if let Some(error) = query_value(query, "error") {
            let mut text: String = error.chars().take(100).collect();
            if let Some(description) = query_value(query, "error_description") {
                text.push_str(": ");
                text.extend(description.chars().take(200));
            }
            return Err(Refusal::SignInFailed(text));
        }
        let pending: PendingLogin = cookie(headers, LOGIN_COOKIE)
            .and_then(|v| self.cookies.open(LOGIN_COOKIE, v, now_unix()))
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or(Refusal::Unauthenticated(
                "the sign-in expired or was started in another browser; sign in again",
            ))?;
        let state = query_value(query, "state").unwrap_or_default();
        let code = query_value(query, "code")
            .ok_or_else(|| Refusal::BadRequest("the callback carries no code".into()))?;
        let identity = oidc
            .finish_login(&pending, &state, &code)
            .await
            .map_err(|e| {
                tracing::info!(error = %e, "console sign-in refused");
                Refusal::SignInFailed(format!("sign-in refused: {e}"))
            })?;
        let now = now_unix();
        let ttl = Duration::from_secs(
            u64::try_from(identity.expires_at.saturating_sub(now))
                .unwrap_or(0)
                .min(SESSION_TTL.as_secs()),
        );
        let identity = Identity {
            expires_at: now + ttl.as_secs() as i64,
            ..identity
        };
        tracing::info!(user = %identity.username, "console sign-in");
        let sealed = self.cookies.seal(
            SESSION_COOKIE,
            &serde_json::to_vec(&identity).unwrap_or_default(),
            now,
            ttl,
        );
        Ok(redirect(
            &safe_return_path(pending.return_to()),
            &[
                set_cookie(SESSION_COOKIE, &sealed, ttl, self.secure_cookies),
                clear_cookie(LOGIN_COOKIE, self.secure_cookies),
            ],
        ))
    }
}

async fn handle(console: &Console, request: Request) -> Result<Response, Failure> {
    let path = request.uri().path().to_owned();
    let query = request.uri().query().map(str::to_owned);
    let method = request.method().clone();
    let headers = request.headers().clone();
    let route = route(&path).map_err(anonymous)?;
    // Signing in and out needs no identity.
    match &route {
        Route::Login => {
            let return_to = query_value(query.as_deref(), "return").unwrap_or_else(|| "/".into());
            return console.login_start(&return_to).map_err(anonymous);
        }
        Route::Callback => {
            return console
                .login_finish(&headers, query.as_deref())
                .await
                .map_err(anonymous);
        }
        Route::Logout => {
            let mut response = html(page::problem_page(
                "",
                "Signed out",
                "You are signed out of the raypipe console.",
            ));
            if let Ok(value) =
                HeaderValue::from_str(&clear_cookie(SESSION_COOKIE, console.secure_cookies))
            {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            return Ok(response);
        }
        _ => {}
    }
    let (caller, key) = match console.caller(&headers).await {
        Ok(found) => found,
        Err(Refusal::Unauthenticated(why)) => {
            // A browser asking for a page is sent to sign in (and back here afterwards).
            if console.oidc.is_some() && method == Method::GET && wants_html(&headers) {
                let back = match &query {
                    Some(q) => format!("{path}?{q}"),
                    None => path.clone(),
                };
                let to = format!("/login?return={}", page_query_escape(&back));
                return Ok(redirect(&to, &[]));
            }
            return Err(anonymous(Refusal::Unauthenticated(why)));
        }
        Err(other) => return Err(anonymous(other)),
    };
    let user = caller.username.clone();
    let fail = |refusal: Refusal| (refusal, user.clone());
    if let Route::Dashboard {
        namespace,
        cluster,
        rest,
    } = route
    {
        // The dashboard's page links its assets relative to its root: the root needs its slash.
        if rest.is_empty() {
            let to = match &query {
                Some(q) => format!("{path}/?{q}"),
                None => format!("{path}/"),
            };
            return Ok(redirect(&to, &[]));
        }
        return proxy::forward(console, &caller, key, &namespace, &cluster, &rest, request)
            .await
            .map_err(fail);
    }
    if method != Method::GET && method != Method::HEAD {
        return Err(fail(Refusal::MethodNotAllowed));
    }
    tracing::debug!(user = %caller.username, path, "console request");
    match route {
        Route::Index => {
            let rows = console
                .visible_pipelines(&caller, key)
                .await
                .map_err(fail)?;
            Ok(html(page::pipelines_page(&user, &rows)))
        }
        Route::ApiPipelines => {
            let rows = console
                .visible_pipelines(&caller, key)
                .await
                .map_err(fail)?;
            Ok(json(
                StatusCode::OK,
                &serde_json::json!({ "pipelines": rows }),
            ))
        }
        Route::PipelinePage { namespace, name } | Route::ApiPipeline { namespace, name } => {
            console
                .authorize(&caller, key, &Permission::pipelines(&namespace))
                .await
                .map_err(fail)?;
            let detail = console.detail(&namespace, &name).await.map_err(fail)?;
            if path.starts_with("/api/") {
                Ok(json(StatusCode::OK, &detail))
            } else {
                Ok(html(page::pipeline_page(
                    &user,
                    &detail,
                    console.history_url.as_deref(),
                )))
            }
        }
        Route::Login | Route::Callback | Route::Logout | Route::Dashboard { .. } => {
            Err(fail(Refusal::NotFound(format!("no page {path}"))))
        }
    }
}

/// `text` as a query value.
fn page_query_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Every page answer carries the security headers.
pub(super) fn with_security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(page::CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_name_their_objects_and_refuse_the_rest() {
        assert_eq!(route("/").ok(), Some(Route::Index));
        assert_eq!(
            route("/pipelines/ml/demo").ok(),
            Some(Route::PipelinePage {
                namespace: "ml".into(),
                name: "demo".into()
            })
        );
        assert_eq!(
            route("/api/v1/namespaces/ml/pipelines/demo").ok(),
            Some(Route::ApiPipeline {
                namespace: "ml".into(),
                name: "demo".into()
            })
        );
        assert_eq!(
            route("/dashboards/ml/c1/api/jobs/").ok(),
            Some(Route::Dashboard {
                namespace: "ml".into(),
                cluster: "c1".into(),
                rest: "/api/jobs/".into()
            })
        );
        assert_eq!(
            route("/dashboards/ml/c1/").ok(),
            Some(Route::Dashboard {
                namespace: "ml".into(),
                cluster: "c1".into(),
                rest: "/".into()
            })
        );
        // Without its slash: redirected to it.
        assert_eq!(
            route("/dashboards/ml/c1").ok(),
            Some(Route::Dashboard {
                namespace: "ml".into(),
                cluster: "c1".into(),
                rest: String::new()
            })
        );
        for bad in [
            "/pipelines/ml",
            "/pipelines/../x",
            "/pipelines/ml/%2e%2e",
            "/pipelines/ML/demo",
            "/api/v1/namespaces/ml/pipelines/a%2Fb",
            "/nothing",
        ] {
            assert!(route(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; raypipe_session=abc.def; b=2"),
        );
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("abc.def"));
        assert_eq!(cookie(&headers, "c"), None);
        assert_eq!(
            page_query_escape("/pipelines/ml/demo?x=1&y"),
            "/pipelines/ml/demo%3Fx%3D1%26y"
        );
    }
}
