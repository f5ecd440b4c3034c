//! The history API (`raypipe history serve`) against the real kube-apiserver: callers' tokens
//! are ServiceAccount tokens from the TokenRequest API, reviewed by Kubernetes (TokenReview),
//! and what each may read is RBAC's answer (SubjectAccessReview) per namespace and kind. The
//! history is written by hand into a local-directory bucket with the revision store.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use object_store::{ObjectStoreExt, PutPayload};
use raypipe::history::api::{ApiConfig, ApiTls, serve_on};
use raypipe::history::revisions::{
    Happening, Outcome, PipelineIndex, RevisionRecord, RevisionStore, RevisionSummary, ServedSpan,
    TimelineEntry,
};
use raypipe::history::sink::Sink;
use raypipe::history::store;
use raypipe::tls::CertificateFiles;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{self, eventually};

const WAIT: Duration = Duration::from_secs(60);
const READER: &str = "history-reader";

/// A ServiceAccount `READER` in `ns`, allowed `get` on `resources` (`(group, plural)`) there.
async fn reader_with(client: &kube::Client, ns: &str, resources: &[(&str, &str)]) -> String {
    let account: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": READER}
    }))
    .expect("a ServiceAccount");
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &account)
        .await
        .expect("create the ServiceAccount");
    let rules: Vec<Value> = resources
        .iter()
        .map(|(group, plural)| json!({"apiGroups": [group], "resources": [plural], "verbs": ["get"]}))
        .collect();
    let role: Role = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": READER}, "rules": rules
    }))
    .expect("a Role");
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("create the Role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": READER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": READER},
        "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": ns}]
    }))
    .expect("a RoleBinding");
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the RoleBinding");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(READER, &PostParams::default(), &request)
        .await
        .expect("a token")
        .status
        .expect("a token request's status")
        .token
        .expect("a token")
}

/// Whether RBAC already lets `ns`'s reader `get` `plural` in `ns` (the authorizer's caches
/// follow new Roles within moments; a denial the API cached would last its TTL).
async fn rbac_allows(client: &kube::Client, ns: &str, group: &str, plural: &str) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{ns}:{READER}")),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some("get".into()),
                group: Some(group.into()),
                resource: Some(plural.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .ok()
        .and_then(|r| r.status)
        .is_some_and(|s| s.allowed)
}

fn span(role: &str, from: &str, until: Option<&str>) -> ServedSpan {
    ServedSpan {
        role: role.into(),
        from: from.into(),
        until: until.map(str::to_owned),
    }
}

fn index_of(ns: &str, name: &str) -> PipelineIndex {
    let promoted = |at: &str| Outcome {
        result: "Promoted".into(),
        reason: "GatesPassed".into(),
        node: None,
        message: "every gate passed".into(),
        at: at.into(),
    };
    PipelineIndex {
        namespace: ns.into(),
        name: name.into(),
        uid: "uid-1".into(),
        next_seq: 3,
        revisions: vec![
            RevisionSummary {
                id: "000001-aaaaaaaaaaaa".into(),
                seq: 1,
                digest: format!("sha256:{}", "a".repeat(64)),
                version: Some("v1".into()),
                first_seen: "2026-12-01T09:59:00Z".into(),
                last_change: "2026-12-01T14:00:00Z".into(),
                served: vec![span(
                    "stable",
                    "2026-12-01T10:00:00Z",
                    Some("2026-12-01T14:00:00Z"),
                )],
                outcome: Some(promoted("2026-12-01T10:00:00Z")),
            },
            RevisionSummary {
                id: "000002-bbbbbbbbbbbb".into(),
                seq: 2,
                digest: format!("sha256:{}", "b".repeat(64)),
                version: Some("v2".into()),
                first_seen: "2026-12-01T13:45:00Z".into(),
                last_change: "2026-12-01T14:00:00Z".into(),
                served: vec![
                    span(
                        "canary",
                        "2026-12-01T13:50:00Z",
                        Some("2026-12-01T14:00:00Z"),
                    ),
                    span("stable", "2026-12-01T14:00:00Z", None),
                ],
                outcome: Some(promoted("2026-12-01T14:00:00Z")),
            },
        ],
        removed: 0,
        deleted_at: None,
    }
}

fn record_of(ns: &str, name: &str) -> RevisionRecord {
    RevisionRecord {
        namespace: ns.into(),
        name: name.into(),
        uid: "uid-1".into(),
        id: "000002-bbbbbbbbbbbb".into(),
        seq: 2,
        digest: format!("sha256:{}", "b".repeat(64)),
        version: Some("v2".into()),
        generation: Some(4),
        first_seen: "2026-12-01T13:45:00Z".into(),
        serve_config: Some(json!({"applications": [{"name": "demo", "route_prefix": "/"}]})),
        ray_clusters: vec![format!("{name}-raycluster-x1")],
        ray_service: Some(name.into()),
        timeline: vec![
            TimelineEntry {
                at: "2026-12-01T13:45:00Z".into(),
                what: Happening::Seen {
                    source: Some("oci://registry/demo:v2".into()),
                },
            },
            TimelineEntry {
                at: "2026-12-01T13:50:00Z".into(),
                what: Happening::Step {
                    step: 1,
                    steps: 2,
                    weight: 10,
                },
            },
            TimelineEntry {
                at: "2026-12-01T14:00:00Z".into(),
                what: Happening::Serving {
                    role: "stable".into(),
                    serving: true,
                },
            },
        ],
        readings_dropped: 0,
    }
}

/// A GET of `path` with `token` (if any): status and body.
async fn get(base: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut request = reqwest::Client::new().get(format!("{base}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("an answer");
    let status = response.status().as_u16();
    (status, response.text().await.expect("a body"))
}

fn parsed(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// A request sent as is: HTTP clients resolve `..` before sending, so a climbing path needs a
/// raw socket. The status code.
async fn raw_status(address: std::net::SocketAddr, path: &str, token: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .await
        .expect("read the answer");
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer}"))
}

#[tokio::test]
async fn the_history_api_answers_what_kubernetes_rbac_allows_each_caller() {
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let ns_a = support::namespace(&client, "history-api-a").await;
    let ns_b = support::namespace(&client, "history-api-b").await;
    // Tenant A reads pipelines and clusters in A; tenant B reads pipelines in B only.
    let token_a = reader_with(
        &client,
        &ns_a,
        &[("raypipe.dev", "servepipelines"), ("ray.io", "rayclusters")],
    )
    .await;
    let token_b = reader_with(&client, &ns_b, &[("raypipe.dev", "servepipelines")]).await;
    for (ns, group, plural) in [
        (&ns_a, "raypipe.dev", "servepipelines"),
        (&ns_a, "ray.io", "rayclusters"),
        (&ns_b, "raypipe.dev", "servepipelines"),
    ] {
        eventually(WAIT, "RBAC to grant the readers' roles", || async {
            rbac_allows(&client, ns, group, plural).await.then_some(())
        })
        .await;
    }

    let bucket = tempfile::tempdir().expect("tmp");
    let env: BTreeMap<String, String> = [
        ("STORAGE_BACKEND", "local"),
        (
            "RAYPIPE_HISTORY_LOCAL_DIR",
            &*bucket.path().to_string_lossy(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let sink = Sink::new(store::from_env(&env).expect("local store"), "history");
    let revisions = RevisionStore::new(sink.clone());
    let (index_a, record_a) = (index_of(&ns_a, "demo"), record_of(&ns_a, "demo"));
    revisions.put_revision(&record_a).await.expect("a record");
    revisions.put_index(&index_a).await.expect("an index");
    revisions
        .put_index(&index_of(&ns_b, "other"))
        .await
        .expect("B's index");
    // One session of a RayCluster in A, with one log file.
    let put = |key: String, body: &'static str| {
        let sink = sink.clone();
        async move {
            sink.store()
                .put(&sink.key(&key), PutPayload::from(body))
                .await
                .expect("put");
        }
    };
    put(
        format!("cluster-metadata/raycluster/{ns_a}_c1/session_1"),
        "",
    )
    .await;
    put(
        format!("cluster-history/raycluster/{ns_a}/c1/session_1/node1/logs/raylet.out"),
        "raylet started\n",
    )
    .await;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let base = format!("http://{address}");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = ApiConfig {
        listen: address,
        sink: sink.clone(),
        audiences: Vec::new(),
        tls: None,
    };
    let server = tokio::spawn(serve_on(listener, client.clone(), config, async move {
        let _ = stopped.await;
    }));

    let pipeline_a = format!("/api/v1/namespaces/{ns_a}/pipelines/demo");
    assert_eq!(get(&base, "/healthz", None).await, (200, "ok".to_owned()));

    // Without a token, or with one Kubernetes does not know: 401, and nothing about the pipeline.
    let (status, body) = get(&base, &pipeline_a, None).await;
    assert_eq!(status, 401, "{body}");
    assert!(parsed(&body)["error"].as_str().is_some(), "{body}");
    let garbage = "not-a-real-token-0123456789";
    let response = reqwest::Client::new()
        .get(format!("{base}{pipeline_a}"))
        .bearer_auth(garbage)
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 401);
    assert_eq!(
        response
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );
    let body = response.text().await.expect("a body");
    assert!(!body.contains(garbage), "the token was echoed: {body}");
    assert!(!body.contains("GatesPassed"), "{body}");

    // Tenant A: the index, one record, what served at a time.
    let (status, body) = get(&base, &pipeline_a, Some(&token_a)).await;
    assert_eq!(status, 200, "{body}");
    let index = parsed(&body);
    assert_eq!(
        index,
        serde_json::to_value(&index_a).expect("the index as JSON")
    );
    assert_eq!(index["revisions"][1]["served"][0]["role"], "canary");
    assert_eq!(index["revisions"][1]["outcome"]["reason"], "GatesPassed");

    let (status, body) = get(
        &base,
        &format!("{pipeline_a}/revisions/000002-bbbbbbbbbbbb"),
        Some(&token_a),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let record = parsed(&body);
    assert_eq!(
        record,
        serde_json::to_value(&record_a).expect("the record as JSON")
    );
    assert_eq!(record["timeline"][1]["kind"], "step");
    assert_eq!(record["serveConfig"]["applications"][0]["name"], "demo");

    let (status, body) = get(
        &base,
        &format!("{pipeline_a}/revisions/000009-cccccccccccc"),
        Some(&token_a),
    )
    .await;
    assert_eq!(status, 404, "{body}");

    let (status, body) = get(
        &base,
        &format!("{pipeline_a}/serving?at=2026-12-01T13:55:00Z"),
        Some(&token_a),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let serving = parsed(&body);
    assert_eq!(serving["at"], "2026-12-01T13:55:00Z");
    let served: Vec<(String, String)> = serving["serving"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| {
            (
                s["revision"]["id"].as_str().unwrap_or_default().to_owned(),
                s["role"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        served,
        vec![
            ("000002-bbbbbbbbbbbb".to_owned(), "canary".to_owned()),
            ("000001-aaaaaaaaaaaa".to_owned(), "stable".to_owned()),
        ]
    );
    // An offset is read as such (+ needs no escaping); before anything served: nothing.
    let (status, body) = get(
        &base,
        &format!("{pipeline_a}/serving?at=2026-12-01T11:00:00+02:00"),
        Some(&token_a),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(parsed(&body)["serving"], json!([]));
    let (status, body) = get(
        &base,
        &format!("{pipeline_a}/serving?at=noon"),
        Some(&token_a),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = get(
        &base,
        &format!("/api/v1/namespaces/{ns_a}/pipelines/missing"),
        Some(&token_a),
    )
    .await;
    assert_eq!(status, 404, "{body}");

    // A's list holds A's pipeline, not B's.
    let (status, body) = get(&base, "/api/v1/pipelines", Some(&token_a)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        parsed(&body)["pipelines"],
        json!([{"namespace": ns_a, "name": "demo"}])
    );

    // A's clusters: the session, its events, its log files and a log.
    let session = format!("/api/v1/namespaces/{ns_a}/clusters/c1/sessions/session_1");
    let (status, body) = get(
        &base,
        &format!("/api/v1/namespaces/{ns_a}/clusters"),
        Some(&token_a),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        parsed(&body)["sessions"],
        json!([{"namespace": ns_a, "cluster": "c1", "session": "session_1"}])
    );
    let (status, body) = get(&base, &format!("{session}/logs"), Some(&token_a)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(parsed(&body)["files"], json!(["node1/raylet.out"]));
    let (status, body) = get(
        &base,
        &format!("{session}/logs/node1/raylet.out"),
        Some(&token_a),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "raylet started\n"));
    let (status, body) = get(&base, &format!("{session}/events"), Some(&token_a)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(parsed(&body)["events"], json!([]));
    // Paths that climb out of the session's logs are refused before anything is read.
    for climbing in [
        format!("{session}/logs/../../../../pipelines/demo"),
        format!("{session}/logs/node1/%2E%2E/%2E%2E/x"),
        format!("{session}/logs/node1/..%2F..%2Fx"),
    ] {
        let status = raw_status(address, &climbing, &token_a).await;
        assert!(matches!(status, 400 | 404), "{climbing}: {status}");
    }
    let (status, body) = get(
        &base,
        &format!("{session}/logs/node1/other.out"),
        Some(&token_a),
    )
    .await;
    assert_eq!(status, 404, "{body}");

    // Tenant B: nothing of A, and not B's own clusters (B may read only pipelines).
    let (status, body) = get(&base, &pipeline_a, Some(&token_b)).await;
    assert_eq!(status, 403, "{body}");
    let error = parsed(&body)["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        error.contains("servepipelines") && error.contains(&ns_a) && error.contains("get"),
        "{error}"
    );
    assert!(!body.contains(&token_b), "the token was echoed: {body}");
    let (status, body) = get(
        &base,
        &format!("{pipeline_a}/revisions/000002-bbbbbbbbbbbb"),
        Some(&token_b),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains("serveConfig"), "{body}");
    let (status, body) = get(&base, &format!("{session}/logs"), Some(&token_b)).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = get(
        &base,
        &format!("/api/v1/namespaces/{ns_b}/clusters"),
        Some(&token_b),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("rayclusters"), "{body}");
    let (status, body) = get(&base, "/api/v1/pipelines", Some(&token_b)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        parsed(&body)["pipelines"],
        json!([{"namespace": ns_b, "name": "other"}])
    );
    let (status, body) = get(
        &base,
        &format!("/api/v1/namespaces/{ns_b}/pipelines/other"),
        Some(&token_b),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(parsed(&body)["name"], "other");

    // Only GET.
    let response = reqwest::Client::new()
        .delete(format!("{base}{pipeline_a}"))
        .bearer_auth(&token_a)
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), 405);

    let _ = stop.send(());
    server
        .await
        .expect("the server task did not panic")
        .expect("the server ran");

    https_with_rotation(&client, sink, &token_a, &pipeline_a, &index_a).await;
}

/// A self-signed certificate for 127.0.0.1 (PEM certificate, PEM key); `name` tells two apart.
fn self_signed_localhost(name: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.subject_alt_names = vec![rcgen::SanType::IpAddress(std::net::IpAddr::V4(
        std::net::Ipv4Addr::LOCALHOST,
    ))];
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("a certificate");
    (cert.pem(), key.serialize_pem())
}

/// Writes `pem` to `path` as the kubelet updates a mounted Secret: whole, then renamed in place.
fn replace_file(path: &std::path::Path, pem: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, pem).expect("write the new file");
    std::fs::rename(&next, path).expect("swap the file in");
}

/// A GET over HTTPS from a fresh client (no pooled connection) that trusts only `ca_pem`.
async fn https_get(ca_pem: &str, url: &str, token: &str) -> reqwest::Result<(u16, String)> {
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("a PEM CA")])
        .build()
        .expect("an HTTPS client");
    let response = client.get(url).bearer_auth(token).send().await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

/// The same API with `tls` set: HTTPS answers as before, plain HTTP gets nothing, and a
/// certificate replaced on disk is served after the reload interval, without a restart.
async fn https_with_rotation(
    client: &kube::Client,
    sink: Sink,
    token_a: &str,
    pipeline_a: &str,
    index_a: &PipelineIndex,
) {
    let dir = tempfile::tempdir().expect("tmp");
    let files = CertificateFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    let (first_cert, first_key) = self_signed_localhost("history-api-first");
    std::fs::write(&files.cert, &first_cert).expect("write the certificate");
    std::fs::write(&files.key, &first_key).expect("write the key");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = ApiConfig {
        listen: address,
        sink,
        audiences: Vec::new(),
        tls: Some(ApiTls {
            files: files.clone(),
            reload_every: Duration::from_secs(1),
        }),
    };
    let server = tokio::spawn(serve_on(listener, client.clone(), config, async move {
        let _ = stopped.await;
    }));

    let url = format!("https://{address}{pipeline_a}");
    let (status, body) = https_get(&first_cert, &url, token_a)
        .await
        .expect("an HTTPS answer");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        parsed(&body),
        serde_json::to_value(index_a).expect("the index as JSON")
    );
    // Plain HTTP to the same port: the handshake fails and the connection is dropped.
    let plain = reqwest::Client::new()
        .get(format!("http://{address}{pipeline_a}"))
        .bearer_auth(token_a)
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");

    // cert-manager renews the Secret: a new certificate, which only its own CA's clients trust.
    let (second_cert, second_key) = self_signed_localhost("history-api-second");
    assert!(
        https_get(&second_cert, &url, token_a).await.is_err(),
        "the new certificate is served before it was written"
    );
    replace_file(&files.key, &second_key);
    replace_file(&files.cert, &second_cert);
    let (status, body) = eventually(WAIT, "the renewed certificate to be served", || async {
        https_get(&second_cert, &url, token_a).await.ok()
    })
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        https_get(&first_cert, &url, token_a).await.is_err(),
        "the old certificate is still served"
    );

    let _ = stop.send(());
    server
        .await
        .expect("the server task did not panic")
        .expect("the HTTPS server ran");
}
