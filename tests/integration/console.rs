//! The console (issue 35 items 2 and 3) against the real kube-apiserver: a canary pipeline the
//! ServePipeline controller drives from a registry on 127.0.0.1, two tenants, callers proven
//! by ServiceAccount tokens (TokenReview) or by a browser sign-in at an OpenID provider on
//! 127.0.0.1 (authorization code + PKCE), and what each sees decided by RBAC through
//! SubjectAccessReviews. The dashboard front reaches the shared real Ray head; the page is
//! checked in a real headless Chromium.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, Patch, PatchParams, PostParams};
use prost::Message;
use raypipe::api::rayservice::RayService;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::console::cookie::CookieKey;
use raypipe::console::oidc::OidcSettings;
use raypipe::console::{ConsoleConfig, SESSION_COOKIE, serve_on};
use raypipe::controllers::servepipeline::{self, Config};
use raypipe::devenv::oidc::TestIssuer;
use raypipe::devenv::registry::{Registry, sha256_hex};
use raypipe::ray::DashboardLocator;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, COOKIE, LOCATION, SET_COOKIE};
use serde_json::{Value, json};

use crate::support::{self, eventually, fixture};

const WAIT: Duration = Duration::from_secs(60);
const CLIENT_ID: &str = "raypipe-console";
/// The registry's bearer token: it must never appear in anything the console answers.
const REGISTRY_TOKEN: &str = "console-registry-s3cr3t";

fn sample_graph(version: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/graphs/sequence.pb");
    let mut graph = raypipe::graph::decode(&std::fs::read(path).expect("the sample")).unwrap();
    graph.version = version.to_owned();
    graph.encode_to_vec()
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

async fn apply(client: &kube::Client, ns: &str, doc: Value) {
    fixture::apply(client, ns, &doc, "console-test").await;
}

/// A ServiceAccount `name` in `ns` and a token for it.
async fn service_account_token(client: &kube::Client, ns: &str, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}
    }))
    .unwrap();
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("create the ServiceAccount");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .and_then(|s| s.token)
        .expect("a token")
}

/// A Role in `ns` with `rules`, bound to `subjects`.
async fn grant(client: &kube::Client, ns: &str, name: &str, rules: Value, subjects: Value) {
    apply(
        client,
        ns,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": name}, "rules": rules}),
    )
    .await;
    apply(
        client,
        ns,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": subjects}),
    )
    .await;
}

/// Waits until RBAC answers `allowed` for the user (the console caches answers for seconds,
/// so it must not ask before the API server's authorizer follows the new Roles).
async fn until_rbac(
    client: &kube::Client,
    (user, groups): (&str, &[&str]),
    (verb, resource, subresource): (&str, &str, Option<&str>),
    ns: &str,
) {
    let group = if resource == "servepipelines" {
        "raypipe.dev"
    } else {
        "ray.io"
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(groups.iter().map(|g| g.to_string()).collect()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource: subresource.map(str::to_owned),
                namespace: Some(ns.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    eventually(WAIT, &format!("RBAC lets {user} {verb} {resource}"), || {
        let review = review.clone();
        async move {
            Api::<SubjectAccessReview>::all(client.clone())
                .create(&PostParams::default(), &review)
                .await
                .ok()
                .and_then(|r| r.status)
                .filter(|s| s.allowed)
        }
    })
    .await;
}

fn sa_user(ns: &str, name: &str) -> String {
    format!("system:serviceaccount:{ns}:{name}")
}

const SA_GROUPS: &[&str] = &["system:serviceaccounts", "system:authenticated"];

/// Two tenants: `a` with a canary pipeline the controller drives (v1 stable, v2 waiting at
/// step 0), `b` with a pipeline of its own; a reader token and an OpenID group for each.
struct Tenants {
    client: kube::Client,
    a: String,
    b: String,
    token_a: String,
    token_b: String,
    v1: Vec<u8>,
    v2: Vec<u8>,
    _registry: Registry,
    _stop: fixture::Stopper,
}

async fn tenants(prefix: &str) -> Tenants {
    let client = support::client().await;
    let a = support::namespace(&client, &format!("{prefix}-a")).await;
    let b = support::namespace(&client, &format!("{prefix}-b")).await;
    let registry = Registry::start(REGISTRY_TOKEN).await;
    let v1 = sample_graph("v1");
    registry.put("graphs/pipeline.pb", v1.clone());
    let mut stop = fixture::Stopper::default();
    for ns in [&a, &b] {
        fixture::put_token_secret(&client, ns, "registry-token", REGISTRY_TOKEN).await;
        let config = Config {
            namespace: Some(ns.clone()),
            fetcher: support::loopback_fetcher(),
            ..Default::default()
        };
        tokio::spawn(servepipeline::run(client.clone(), config, stop.signal()));
        let mut pipeline = fixture::servepipeline(
            "demo",
            fixture::token_source(
                &registry.url("graphs/pipeline.pb"),
                json!({"refreshInterval": "1s"}),
            ),
        );
        if ns == &a {
            pipeline.spec.rollout = Some(
                serde_json::from_value(json!({"strategy": "Canary", "progressDeadline": "10m"}))
                    .unwrap(),
            );
        }
        Api::<ServePipeline>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &pipeline)
            .await
            .unwrap();
    }
    let token_a = service_account_token(&client, &a, "reader").await;
    let token_b = service_account_token(&client, &b, "reader").await;
    let read_pipelines = json!([{"apiGroups": ["raypipe.dev"], "resources": ["servepipelines"],
                                 "verbs": ["get", "list"]}]);
    grant(
        &client,
        &a,
        "console-reader",
        read_pipelines.clone(),
        json!([{"kind": "ServiceAccount", "name": "reader", "namespace": a},
               {"kind": "Group", "name": "team-a", "apiGroup": "rbac.authorization.k8s.io"}]),
    )
    .await;
    grant(
        &client,
        &b,
        "console-reader",
        read_pipelines,
        json!([{"kind": "ServiceAccount", "name": "reader", "namespace": b},
               {"kind": "Group", "name": "team-b", "apiGroup": "rbac.authorization.k8s.io"}]),
    )
    .await;
    for ns in [&a, &b] {
        until_rbac(
            &client,
            (&sa_user(ns, "reader"), SA_GROUPS),
            ("get", "servepipelines", None),
            ns,
        )
        .await;
    }
    until_rbac(
        &client,
        ("alice@example.com", &["team-a"]),
        ("get", "servepipelines", None),
        &a,
    )
    .await;
    until_rbac(
        &client,
        ("bob@example.com", &["team-b"]),
        ("get", "servepipelines", None),
        &b,
    )
    .await;

    // v1 serves; v2 becomes the canary, waiting at step 0 (nothing runs it here).
    let api: Api<ServePipeline> = Api::namespaced(client.clone(), &a);
    let stable_v1 = digest(&v1);
    eventually(WAIT, "v1 stable", || {
        let api = api.clone();
        let want = stable_v1.clone();
        async move {
            api.get("demo").await.ok().filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.rollout.as_ref())
                    .and_then(|r| r.stable.as_ref())
                    .is_some_and(|s| s.digest == want)
            })
        }
    })
    .await;
    let v2 = sample_graph("v2");
    registry.put("graphs/pipeline.pb", v2.clone());
    let canary_v2 = digest(&v2);
    let pipeline = eventually(WAIT, "the v2 canary", || {
        let api = api.clone();
        let want = canary_v2.clone();
        async move {
            api.get("demo").await.ok().filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.rollout.as_ref())
                    .and_then(|r| r.canary.as_ref())
                    .is_some_and(|c| c.version.digest == want)
            })
        }
    })
    .await;
    // Serve's word on the stable version's nodes, as the RayService controller would copy it
    // from Ray: every node healthy (the controller copies it into the pipeline's status).
    let stable_app = pipeline
        .status
        .as_ref()
        .and_then(|s| s.rollout.as_ref())
        .and_then(|r| r.stable.as_ref())
        .map(|s| s.application.clone())
        .expect("a stable application");
    let rayservice_name = pipeline
        .status
        .as_ref()
        .and_then(|s| s.ray_service_name.clone())
        .unwrap_or_else(|| "demo".into());
    let rayservices: Api<RayService> = Api::namespaced(client.clone(), &a);
    let rayservice = rayservices
        .get(&rayservice_name)
        .await
        .expect("the RayService");
    let running = raypipe::present::running::running_graph(&pipeline, &rayservice, "stable")
        .expect("the stable graph on the RayService");
    let deployments: serde_json::Map<String, Value> = running
        .graph
        .nodes
        .iter()
        .map(|n| (n.name.clone(), json!({"status": "HEALTHY"})))
        .collect();
    rayservices
        .patch_status(
            &rayservice_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"activeServiceStatus": {
                "rayClusterName": "demo-cluster",
                "applicationStatuses": {stable_app.clone(): {
                    "status": "RUNNING", "serveDeploymentStatuses": deployments}}}}})),
        )
        .await
        .expect("the RayService's status");
    eventually(WAIT, "the nodes' Serve status on the pipeline", || {
        let api = api.clone();
        let app = stable_app.clone();
        async move {
            api.get("demo").await.ok().filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.applications.get(&app))
                    .is_some_and(|s| !s.deployments.is_empty())
            })
        }
    })
    .await;
    Tenants {
        client,
        a,
        b,
        token_a,
        token_b,
        v1,
        v2,
        _registry: registry,
        _stop: stop,
    }
}

/// A console on 127.0.0.1 signing browsers in at `issuer`; returns its base URL.
struct Console {
    url: String,
    _task: tokio::task::JoinHandle<()>,
}

async fn start_console(
    client: &kube::Client,
    listener: tokio::net::TcpListener,
    issuer: Option<&TestIssuer>,
    key: CookieKey,
    dashboards: Option<DashboardLocator>,
) -> Console {
    start_console_with(client, listener, issuer, key, dashboards, None).await
}

/// [`start_console`] with per-node metrics from the Prometheus at `prometheus`.
async fn start_console_with(
    client: &kube::Client,
    listener: tokio::net::TcpListener,
    issuer: Option<&TestIssuer>,
    key: CookieKey,
    dashboards: Option<DashboardLocator>,
    prometheus: Option<String>,
) -> Console {
    let url = format!("http://{}", listener.local_addr().unwrap());
    let config = ConsoleConfig {
        listen: listener.local_addr().unwrap(),
        tls: None,
        audiences: Vec::new(),
        oidc: issuer
            .map(|i| OidcSettings::new(&i.issuer(), CLIENT_ID, &format!("{url}/oauth2/callback"))),
        cookie_key: key,
        secure_cookies: false,
        history_url: Some("http://127.0.0.1:9".into()),
        dashboards,
        namespaces: Vec::new(),
        prometheus: prometheus.map(|url| (url, "namespace".to_owned())),
    };
    let client = client.clone();
    let task = tokio::spawn(async move {
        serve_on(listener, client, config, std::future::pending())
            .await
            .expect("the console serves");
    });
    eventually(WAIT, "the console answers", || {
        let health = format!("{url}/healthz");
        async move {
            fixture::loopback_http(Duration::from_secs(2))
                .get(health)
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
        }
    })
    .await;
    Console { url, _task: task }
}

fn http() -> reqwest::Client {
    raypipe::startup::init_crypto();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .no_proxy()
        .build()
        .unwrap()
}

async fn get_json(url: &str, token: &str) -> (StatusCode, Value) {
    let response = http()
        .get(url)
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .send()
        .await
        .expect("the console answers");
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    assert!(!body.contains(REGISTRY_TOKEN), "a secret in {url}: {body}");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn names(list: &Value) -> Vec<String> {
    list["pipelines"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{}/{}",
                p["namespace"].as_str().unwrap_or(""),
                p["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

fn set_cookies(response: &reqwest::Response) -> Vec<(String, String)> {
    response
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| {
            let pair = v.split(';').next()?;
            let (name, value) = pair.split_once('=')?;
            Some((name.trim().to_owned(), value.to_owned()))
        })
        .collect()
}

fn location(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Signs `email` in through the browser flow (no browser: each redirect followed by hand,
/// cookies carried by hand) and returns the session cookie for `return_to`.
async fn sign_in(
    console: &str,
    issuer: &TestIssuer,
    email: &str,
    groups: &[&str],
    return_to: &str,
) -> String {
    issuer.set_user(email, groups);
    let http = http();
    let start = http
        .get(format!("{console}/login?return={return_to}"))
        .send()
        .await
        .unwrap();
    assert_eq!(start.status(), StatusCode::FOUND);
    let authorize = location(&start);
    assert!(authorize.starts_with(&issuer.issuer()), "{authorize}");
    assert!(
        authorize.contains("code_challenge_method=S256"),
        "{authorize}"
    );
    let login_cookie = set_cookies(&start)
        .into_iter()
        .find(|(n, _)| n == "raypipe_login")
        .expect("the sign-in cookie");
    let approved = http.get(&authorize).send().await.unwrap();
    assert_eq!(approved.status(), StatusCode::FOUND);
    let callback = location(&approved);
    assert!(
        callback.starts_with(&format!("{console}/oauth2/callback?")),
        "{callback}"
    );
    let back = http
        .get(&callback)
        .header(COOKIE, format!("raypipe_login={}", login_cookie.1))
        .send()
        .await
        .unwrap();
    assert_eq!(back.status(), StatusCode::FOUND, "{:?}", back.text().await);
    assert_eq!(location(&back), return_to);
    // The same code a second time is refused (single use at the provider).
    let again = http
        .get(&callback)
        .header(COOKIE, format!("raypipe_login={}", login_cookie.1))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
    let session = set_cookies(&back)
        .into_iter()
        .find(|(n, _)| n == SESSION_COOKIE)
        .expect("a session cookie");
    session.1
}

async fn page(url: &str, session: &str) -> (StatusCode, String) {
    let response = http()
        .get(url)
        .header(ACCEPT, "text/html")
        .header(COOKIE, format!("{SESSION_COOKIE}={session}"))
        .send()
        .await
        .unwrap();
    let status = response.status();
    if status.is_success() {
        let csp = response
            .headers()
            .get("content-security-policy")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(csp.contains("default-src 'none'"), "{csp}");
    }
    let body = response.text().await.unwrap_or_default();
    assert!(!body.contains(REGISTRY_TOKEN), "a secret in {url}");
    (status, body)
}

#[tokio::test]
async fn the_console_shows_each_tenant_only_its_own_pipelines_by_token_and_by_sign_in() {
    support::capture_logs();
    let t = tenants("console").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let issuer = TestIssuer::start(CLIENT_ID, None, &format!("{base}/oauth2/callback"))
        .await
        .expect("the OpenID provider");
    let key_bytes = [7u8; 32];
    let console = start_console(
        &t.client,
        listener,
        Some(&issuer),
        CookieKey::from_bytes(&key_bytes).unwrap(),
        None,
    )
    .await;
    let url = &console.url;

    // Nobody: refused, and a browser is sent to sign in.
    let anonymous = http()
        .get(format!("{url}/api/v1/pipelines"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        anonymous
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap()),
        Some("Bearer")
    );
    let browser = http()
        .get(format!("{url}/pipelines/{}/demo", t.a))
        .header(ACCEPT, "text/html")
        .send()
        .await
        .unwrap();
    assert_eq!(browser.status(), StatusCode::FOUND);
    assert_eq!(
        location(&browser),
        format!("/login?return=/pipelines/{}/demo", t.a)
    );
    let (status, _) = get_json(&format!("{url}/api/v1/pipelines"), "not-a-token").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Programs: each tenant's token lists its own pipeline and nothing of the other's.
    let (status, list_a) = get_json(&format!("{url}/api/v1/pipelines"), &t.token_a).await;
    assert_eq!(status, StatusCode::OK, "{list_a}");
    assert_eq!(names(&list_a), [format!("{}/demo", t.a)]);
    let (_, list_b) = get_json(&format!("{url}/api/v1/pipelines"), &t.token_b).await;
    assert_eq!(names(&list_b), [format!("{}/demo", t.b)]);
    let (status, refused) = get_json(
        &format!("{url}/api/v1/namespaces/{}/pipelines/demo", t.a),
        &t.token_b,
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(
        refused["error"],
        format!(
            "{} may not get servepipelines.raypipe.dev in namespace {}",
            sa_user(&t.b, "reader"),
            t.a
        )
    );

    // The detail: versions and digests, the graph drawn with Serve's status, the timeline.
    let (status, detail) = get_json(
        &format!("{url}/api/v1/namespaces/{}/pipelines/demo", t.a),
        &t.token_a,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["versions"][0]["role"], "stable");
    assert_eq!(detail["versions"][0]["digest"], digest(&t.v1));
    assert_eq!(detail["versions"][0]["version"], "v1");
    assert_eq!(detail["versions"][1]["role"], "canary");
    assert_eq!(detail["versions"][1]["digest"], digest(&t.v2));
    let svg = detail["graphs"][0]["svg"].as_str().unwrap_or_default();
    assert!(
        svg.starts_with("<svg") && svg.contains("data-node=\"classify\""),
        "{detail}"
    );
    assert_eq!(
        detail["graphs"][0]["nodes"]["classify"], "HEALTHY",
        "{detail}"
    );
    assert_eq!(detail["graphs"][1]["which"], "canary");
    let timeline: Vec<&str> = detail["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["what"].as_str())
        .collect();
    assert!(timeline.contains(&"RolloutStarted"), "{timeline:?}");
    assert!(
        timeline.iter().any(|w| w.starts_with("Step 0/")),
        "{timeline:?}"
    );

    // Browsers: alice (team-a) and bob (team-b) sign in at the provider.
    let page_a = format!("/pipelines/{}/demo", t.a);
    let alice = sign_in(url, &issuer, "alice@example.com", &["team-a"], &page_a).await;
    assert_eq!(issuer.request_count("/token"), 2, "{:?}", issuer.requests());
    let (status, html) = page(&format!("{url}{page_a}"), &alice).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    for shown in [
        "alice@example.com",
        &digest(&t.v1),
        &digest(&t.v2),
        "RolloutStarted",
        "data-node=\"classify\"",
    ] {
        assert!(html.contains(shown), "{shown} on the page");
    }
    let (_, index) = page(&format!("{url}/"), &alice).await;
    assert!(index.contains(&page_a), "alice sees her pipeline");
    assert!(!index.contains(&t.b), "alice sees nothing of {}", t.b);
    let bob = sign_in(url, &issuer, "bob@example.com", &["team-b"], "/").await;
    let (_, index) = page(&format!("{url}/"), &bob).await;
    assert!(index.contains(&format!("/pipelines/{}/demo", t.b)));
    assert!(!index.contains(&t.a), "bob sees nothing of {}", t.a);
    let (status, refused) = page(&format!("{url}{page_a}"), &bob).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(refused.contains("bob@example.com may not get"), "{refused}");
    // A tampered session is no session.
    let mut forged = alice.clone().into_bytes();
    let last = forged.len() - 2;
    forged[last] = if forged[last] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let refused = http()
        .get(format!("{url}/api/v1/pipelines"))
        .header(COOKIE, format!("{SESSION_COOKIE}={forged}"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);

    // The cookie key comes from a Secret: a console restarted with it keeps alice signed in;
    // one with another key does not.
    let same = start_console(
        &t.client,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        Some(&issuer),
        CookieKey::from_bytes(&key_bytes).unwrap(),
        None,
    )
    .await;
    let (status, _) = page(&format!("{}{page_a}", same.url), &alice).await;
    assert_eq!(status, StatusCode::OK);
    let other = start_console(
        &t.client,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        Some(&issuer),
        CookieKey::from_bytes(&[9u8; 32]).unwrap(),
        None,
    )
    .await;
    let refused = http()
        .get(format!("{}/api/v1/pipelines", other.url))
        .header(COOKIE, format!("{SESSION_COOKIE}={alice}"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let logs = support::captured_logs();
    assert!(
        !logs.contains(REGISTRY_TOKEN) && !logs.contains(&alice),
        "a secret in the logs"
    );
}

/// Lets `ns`'s ServiceAccount `jobs` `verb` on `rayclusters/proxy` there, and waits until the
/// console's cached denial (at most REVIEW_TTL old) is gone.
async fn grant_proxy(client: &kube::Client, ns: &str, verb: &str) {
    grant(
        client,
        ns,
        &format!("dashboard-{verb}"),
        json!([{"apiGroups": ["ray.io"], "resources": ["rayclusters/proxy"], "verbs": [verb]}]),
        json!([{"kind": "ServiceAccount", "name": "jobs", "namespace": ns}]),
    )
    .await;
    until_rbac(
        client,
        (&sa_user(ns, "jobs"), SA_GROUPS),
        (verb, "rayclusters", Some("proxy")),
        ns,
    )
    .await;
    tokio::time::sleep(raypipe::history::api::REVIEW_TTL).await;
}

async fn post_json(url: &str, token: &str, body: &Value) -> reqwest::Response {
    http()
        .post(url)
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn dashboards_sit_behind_the_console_for_browsers_and_bearer_token_clients() {
    support::capture_logs();
    let head = support::ray_head();
    let client = support::client().await;
    let a = support::namespace(&client, "console-dash-a").await;
    let b = support::namespace(&client, "console-dash-b").await;
    let dashboard = head.dashboard_url().to_string();
    let locator = DashboardLocator::resolver(move |_| Some(dashboard.clone()));
    let console = start_console(
        &client,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        None,
        CookieKey::generate().unwrap(),
        Some(locator),
    )
    .await;
    apply(
        &client,
        &a,
        json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c1"},
               "spec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
                   "containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}}}}}),
    )
    .await;
    let token_a = service_account_token(&client, &a, "jobs").await;
    let token_b = service_account_token(&client, &b, "jobs").await;
    let jobs = format!("{}/dashboards/{a}/c1/api/jobs/", console.url);

    // No credentials: refused before anything reaches Ray.
    let anonymous = http().get(&jobs).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    // A valid token without the grant: refused, naming what is missing.
    let (status, body) = get_json(&jobs, &token_a).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("may not get rayclusters/proxy.ray.io")),
        "{body}"
    );

    // Reading the dashboard (get) and submitting jobs (create) are separate grants.
    grant_proxy(&client, &a, "get").await;
    let (status, listed) = get_json(&jobs, &token_a).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert!(listed.is_array(), "Ray's job list: {listed}");
    // The root without its slash is sent to it (the dashboard's page links relative to it).
    let root = http()
        .get(format!("{}/dashboards/{a}/c1", console.url))
        .header(AUTHORIZATION, format!("Bearer {token_a}"))
        .send()
        .await
        .unwrap();
    assert_eq!(root.status(), StatusCode::FOUND);
    assert_eq!(location(&root), format!("/dashboards/{a}/c1/"));
    let submit = json!({"entrypoint": "python -c \"print('through the console')\"",
                        "submission_id": format!("console-{a}")});
    let refused = post_json(&jobs, &token_a, &submit).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    grant_proxy(&client, &a, "create").await;
    let submitted = post_json(&jobs, &token_a, &submit).await;
    let status = submitted.status();
    let answer: Value =
        serde_json::from_str(&submitted.text().await.unwrap_or_default()).unwrap_or(Value::Null);
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["submission_id"], format!("console-{a}"));
    let job = format!("{jobs}console-{a}");
    let finished = eventually(WAIT, "the job submitted through the console", || {
        let job = job.clone();
        let token = token_a.clone();
        async move {
            let (status, body) = get_json(&job, &token).await;
            (status == StatusCode::OK && body["status"] == "SUCCEEDED").then_some(body)
        }
    })
    .await;
    assert_eq!(finished["status"], "SUCCEEDED");
    // The other tenant's token reaches nothing of this cluster.
    let (status, _) = get_json(&jobs, &token_b).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // A cluster that does not exist is named, not guessed.
    let (status, body) = get_json(
        &format!("{}/dashboards/{a}/nothing/api/jobs/", console.url),
        &token_a,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let logs = support::captured_logs();
    assert!(!logs.contains(&token_a), "a token in the logs");
}

/// The console in a real headless Chromium: signed in through the OpenID provider by
/// redirects alone, the pipeline page shows the graph (its healthy nodes green), the versions
/// and the rollout.
#[tokio::test]
async fn a_browser_signs_in_and_sees_the_graph_the_versions_and_the_rollout() {
    support::capture_logs();
    let t = tenants("console-ui").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let issuer = TestIssuer::start(CLIENT_ID, None, &format!("{base}/oauth2/callback"))
        .await
        .expect("the OpenID provider");
    issuer.set_user("alice@example.com", &["team-a"]);
    let console = start_console(
        &t.client,
        listener,
        Some(&issuer),
        CookieKey::generate().unwrap(),
        None,
    )
    .await;
    // The browser runs as a blocking child process: off this test's runtime thread, which
    // serves the console and the provider it talks to.
    let page_url = format!("{}/pipelines/{}/demo", console.url, t.a);
    let dom = {
        let url = page_url.clone();
        tokio::task::spawn_blocking(move || crate::support::browser::browser().dump_dom(&url))
            .await
            .unwrap()
            .expect("the page's DOM")
    };
    for shown in [
        "alice@example.com",
        digest(&t.v1).as_str(),
        digest(&t.v2).as_str(),
        "RolloutStarted",
        "data-node=\"classify\"",
        "Step 0/",
    ] {
        assert!(dom.contains(shown), "{shown} in the browser's DOM");
    }
    let dir = tempfile::tempdir().unwrap();
    let shot = dir.path().join("pipeline.png");
    {
        let (url, shot) = (page_url.clone(), shot.clone());
        tokio::task::spawn_blocking(move || {
            crate::support::browser::browser().screenshot(&url, 1280, 1400, &shot)
        })
        .await
        .unwrap()
        .expect("a screenshot");
    }
    let screenshot = crate::support::browser::Screenshot::read(&shot);
    assert!(!screenshot.is_blank());
    // Healthy nodes are drawn with a green border (graph::draw's Good tone), the header bar
    // in the console's blue.
    let green = screenshot.count_pixels_near([0x1e, 0x8e, 0x3e], 24, None);
    let blue = screenshot.count_pixels_near([0x17, 0x4e, 0xa6], 16, None);
    eprintln!("screenshot: {green} green node pixels, {blue} header pixels");
    assert!(
        green > 200,
        "the graph's healthy nodes are drawn ({green} green pixels)"
    );
    assert!(
        blue > 5_000,
        "the console's header is drawn ({blue} blue pixels)"
    );
    if let Ok(out) = std::env::var("RAYPIPE_CONSOLE_SCREENSHOT") {
        std::fs::copy(&shot, out).expect("copy the screenshot");
    }
}

/// The dashboard front before a head with Ray token auth (run by `ray::a_head_with_token_auth…`
/// on its second head): the caller's Kubernetes token opens the front, the console sends Ray's
/// own token (from the cluster's Secret) instead, and Ray answers. Ray reads `Authorization`
/// before `x-ray-authorization`, so the answer also shows the caller's header was not passed.
pub(crate) async fn the_dashboard_front_forwards_rays_token(
    head: &raypipe::devenv::ray::RayHead,
    ray_token: &raypipe::ray::BearerToken,
) {
    let client = support::client().await;
    let ns = support::namespace(&client, "console-ray-token").await;
    let dashboard = head.dashboard_url().to_string();
    let console = start_console(
        &client,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        None,
        CookieKey::generate().unwrap(),
        Some(DashboardLocator::resolver(move |_| Some(dashboard.clone()))),
    )
    .await;
    apply(
        &client,
        &ns,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "secured"},
               "stringData": {"auth_token": ray_token.expose_secret()}}),
    )
    .await;
    apply(
        &client,
        &ns,
        json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "secured"},
               "spec": {"authOptions": {"mode": "token"},
                        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
                   "containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}}}}}),
    )
    .await;
    let token = service_account_token(&client, &ns, "jobs").await;
    grant_proxy(&client, &ns, "get").await;
    let (status, jobs) = get_json(
        &format!("{}/dashboards/{ns}/secured/api/jobs/", console.url),
        &token,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "Ray took the forwarded token: {jobs}"
    );
    assert!(jobs.is_array(), "{jobs}");
    // Without the front, the same call with the caller's token is Ray's 401/403.
    let direct = http()
        .get(format!(
            "{}/api/jobs/",
            head.dashboard_url().to_string().trim_end_matches('/')
        ))
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .send()
        .await
        .unwrap();
    assert!(direct.status().is_client_error(), "{}", direct.status());
    let logs = support::captured_logs();
    assert!(
        !logs.contains(ray_token.expose_secret()),
        "Ray's token in the logs"
    );
}

/// What a browser with no session would get at `url`: redirects followed by hand (at most
/// eight), each origin's cookies kept and sent back, as a sign-in at an OpenID provider that
/// approves without a form needs. Returns the last status and body.
pub(crate) async fn browse(url: &str) -> (StatusCode, String) {
    use std::collections::BTreeMap;
    let origin = |u: &reqwest::Url| format!("{}://{}", u.scheme(), u.authority());
    let http = http();
    let mut jar: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut at = reqwest::Url::parse(url).expect("a URL");
    for _ in 0..8 {
        let cookies = jar
            .get(&origin(&at))
            .map(|c| {
                c.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default();
        let mut request = http.get(at.clone()).header(ACCEPT, "text/html");
        if !cookies.is_empty() {
            request = request.header(COOKIE, cookies);
        }
        let response = request.send().await.expect("an answer");
        for (name, value) in set_cookies(&response) {
            jar.entry(origin(&at)).or_default().insert(name, value);
        }
        if response.status() != StatusCode::FOUND {
            let status = response.status();
            return (status, response.text().await.unwrap_or_default());
        }
        at = at.join(&location(&response)).expect("a Location");
    }
    panic!("more than eight redirects from {url}");
}

/// Percentiles of `samples` (milliseconds): (p50, p95, max).
fn percentiles(mut samples: Vec<f64>) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.95), at(1.0))
}

/// Page load and API latency with 1,000 pipelines in 50 namespaces (issue 35): the console
/// on the shared API server, each pipeline with a canary's status; a cluster-wide reader and
/// a one-namespace reader. Times one request after another from this process (loopback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; results in BENCHMARKS.md"]
async fn bench_page_and_api_with_1000_pipelines() {
    use std::time::Instant;
    const NAMESPACES: usize = 50;
    const PER_NAMESPACE: usize = 20;
    const REQUESTS: usize = 30;
    let client = support::client().await;
    let mut namespaces = Vec::new();
    let sample_status: Value = json!({
        "phase": "Ready",
        "source": {"digest": format!("sha256:{}", "a".repeat(64)), "bytes": 591},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Serving",
                        "message": "the RayService is serving the graph",
                        "lastTransitionTime": "2026-12-02T10:00:00Z"}],
        "rollout": {"phase": "Progressing", "generation": "1.1.s",
                    "stable": {"digest": format!("sha256:{}", "a".repeat(64)), "version": "1",
                               "application": "p--aaaaaaaaaaaa"},
                    "canary": {"digest": format!("sha256:{}", "b".repeat(64)), "version": "2",
                               "application": "p--bbbbbbbbbbbb", "step": 1, "steps": 2,
                               "weight": 20, "startedAt": "2026-12-02T10:01:00Z",
                               "stepStartedAt": "2026-12-02T10:02:00Z",
                               "readings": {"canaryRequests": 40, "canaryErrors": 0,
                                            "retriedOnStable": 0, "stableRequests": 160}}}
    });
    let created = Instant::now();
    for n in 0..NAMESPACES {
        let ns = support::namespace(&client, &format!("bench-console-{n}")).await;
        let api: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
        let creates = (0..PER_NAMESPACE).map(|i| {
            let api = api.clone();
            let status = sample_status.clone();
            async move {
                let pipeline = fixture::servepipeline(
                    &format!("p{i:02}"),
                    fixture::token_source("http://127.0.0.1:9/g.pb", json!({})),
                );
                api.create(&PostParams::default(), &pipeline).await.unwrap();
                api.patch_status(
                    &format!("p{i:02}"),
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .unwrap();
            }
        });
        futures::future::join_all(creates).await;
        namespaces.push(ns);
    }
    eprintln!(
        "created {} pipelines in {:.1}s",
        NAMESPACES * PER_NAMESPACE,
        created.elapsed().as_secs_f64()
    );
    let all_ns = support::namespace(&client, "bench-console-readers").await;
    let all_reader = service_account_token(&client, &all_ns, "all").await;
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": format!("{all_ns}-view")},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "cluster-admin"},
               "subjects": [{"kind": "ServiceAccount", "name": "all", "namespace": all_ns}]}),
    )
    .unwrap();
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("the ClusterRoleBinding");
    let one_ns = &namespaces[0];
    let one_reader = service_account_token(&client, one_ns, "reader").await;
    grant(
        &client,
        one_ns,
        "console-reader",
        json!([{"apiGroups": ["raypipe.dev"], "resources": ["servepipelines"],
                "verbs": ["get", "list"]}]),
        json!([{"kind": "ServiceAccount", "name": "reader", "namespace": one_ns}]),
    )
    .await;
    until_rbac(
        &client,
        (&sa_user(one_ns, "reader"), SA_GROUPS),
        ("get", "servepipelines", None),
        one_ns,
    )
    .await;
    until_rbac(
        &client,
        (&sa_user(&all_ns, "all"), SA_GROUPS),
        ("get", "servepipelines", None),
        one_ns,
    )
    .await;

    let started = Instant::now();
    let console = start_console(
        &client,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        None,
        CookieKey::generate().unwrap(),
        None,
    )
    .await;
    let list = format!("{}/api/v1/pipelines", console.url);
    let total = NAMESPACES * PER_NAMESPACE;
    eventually(WAIT, "every pipeline listed", || {
        let list = list.clone();
        let token = all_reader.clone();
        async move {
            let (status, body) = get_json(&list, &token).await;
            (status == StatusCode::OK
                && body["pipelines"].as_array().map(Vec::len).unwrap_or(0) >= total)
                .then_some(())
        }
    })
    .await;
    eprintln!(
        "console start to all {total} listed: {:.2}s",
        started.elapsed().as_secs_f64()
    );
    let time = |url: String, token: String, html: bool| async move {
        let started = Instant::now();
        let mut request = http()
            .get(&url)
            .header(AUTHORIZATION, format!("Bearer {token}"));
        if html {
            request = request.header(ACCEPT, "text/html");
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{url}");
        let bytes = response.bytes().await.unwrap().len();
        (started.elapsed().as_secs_f64() * 1000.0, bytes)
    };
    let page = format!("{}/pipelines/{}/p00", console.url, one_ns);
    let index = format!("{}/", console.url);
    for (what, url, token, html) in [
        ("API list, cluster-wide reader", &list, &all_reader, false),
        ("HTML list, cluster-wide reader", &index, &all_reader, true),
        ("API list, one-namespace reader", &list, &one_reader, false),
        ("HTML list, one-namespace reader", &index, &one_reader, true),
        (
            "pipeline page, one-namespace reader",
            &page,
            &one_reader,
            true,
        ),
    ] {
        // After the review cache's lifetime: the first request pays the reviews.
        tokio::time::sleep(raypipe::history::api::REVIEW_TTL).await;
        let (cold, bytes) = time(url.clone(), token.clone(), html).await;
        let mut warm = Vec::new();
        for _ in 0..REQUESTS {
            warm.push(time(url.clone(), token.clone(), html).await.0);
        }
        let (p50, p95, max) = percentiles(warm);
        eprintln!(
            "CONSOLE-BENCH {what}: {bytes} bytes; first (reviews) {cold:.1} ms; then p50 {p50:.1} ms, p95 {p95:.1} ms, max {max:.1} ms ({REQUESTS} requests)"
        );
    }
}

/// Per-node calls, failures and latency on a pipeline's page come from the graph runtime's
/// metrics as a real Prometheus scrapes them from the real Ray head (Ray's metrics export
/// port), while a client sends requests.
#[tokio::test]
async fn a_pipeline_page_shows_each_nodes_calls_failures_and_latency_from_prometheus() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let e2e = crate::support::e2e::ready_pipeline(head, "console-metrics").await;
    let traffic = crate::support::e2e::Client::start(e2e.url.clone());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    let scrape = json!({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{
            "job_name": "ray",
            "static_configs": [{
                "targets": [format!("127.0.0.1:{}", head.ports().metrics_export)],
                "labels": {"namespace": e2e.namespace}
            }]
        }]
    });
    std::fs::write(&config, scrape.to_string()).unwrap();
    let prometheus = crate::support::prometheus::Server::start(dir.path(), &config);
    let console = start_console_with(
        &e2e.client,
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        None,
        CookieKey::generate().unwrap(),
        None,
        Some(format!("http://{}", prometheus.address)),
    )
    .await;
    let reader = service_account_token(&e2e.client, &e2e.namespace, "reader").await;
    grant(
        &e2e.client,
        &e2e.namespace,
        "console-reader",
        json!([{"apiGroups": ["raypipe.dev"], "resources": ["servepipelines"],
                "verbs": ["get", "list"]}]),
        json!([{"kind": "ServiceAccount", "name": "reader", "namespace": e2e.namespace}]),
    )
    .await;
    until_rbac(
        &e2e.client,
        (&sa_user(&e2e.namespace, "reader"), SA_GROUPS),
        ("get", "servepipelines", None),
        &e2e.namespace,
    )
    .await;
    let url = format!(
        "{}/api/v1/namespaces/{}/pipelines/{}",
        console.url,
        e2e.namespace,
        crate::support::e2e::PIPELINE
    );
    let detail = eventually(
        Duration::from_secs(180),
        "every node's calls and latency on the page",
        || {
            let (url, reader) = (url.clone(), reader.clone());
            async move {
                let (status, detail) = get_json(&url, &reader).await;
                let nodes = detail["metrics"][0]["nodes"].as_array()?.clone();
                let called = nodes
                    .iter()
                    .filter(|n| n["calls"].as_f64() > Some(0.0) && n["p95Ms"].is_number())
                    .count();
                (status == StatusCode::OK && called >= 2).then_some(detail)
            }
        },
    )
    .await;
    let (answered, failed) = traffic.stop().await;
    let version = &detail["metrics"][0];
    assert_eq!(version["role"], "stable", "{detail}");
    assert_eq!(version["window"], "5m");
    assert_eq!(
        version["application"], detail["versions"][0]["application"],
        "{detail}"
    );
    for node in version["nodes"].as_array().unwrap() {
        assert_eq!(node["failed"], 0.0, "{node}");
    }
    assert!(detail.get("metricsProblem").is_none(), "{detail}");
    eprintln!(
        "{answered} answers, {failed} failed; per node: {}",
        version["nodes"]
    );
    assert!(answered > 0 && failed == 0);
    // The page shows the same table.
    let page = http()
        .get(format!(
            "{}/pipelines/{}/{}",
            console.url,
            e2e.namespace,
            crate::support::e2e::PIPELINE
        ))
        .header(AUTHORIZATION, format!("Bearer {reader}"))
        .header(ACCEPT, "text/html")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("id=\"metrics-stable\""), "{page}");
}
