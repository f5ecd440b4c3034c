//! Code named by an `s3://` URI (issue 31 item 3): a graph whose `runtime_env.py_modules`
//! names a zip in a bucket of a real S3-compatible server on 127.0.0.1 (versitygw, see
//! `support::s3`), served through the operator to Serve on the shared Ray head, whose nodes
//! carry only the AWS settings a RayCluster's Pods would (endpoint, key pair, region). Ray's own
//! downloader (boto3 and smart_open in the runtime-env agent) fetches the zip; nothing on the
//! node's PYTHONPATH holds the package.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use prost::Message;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::config::{ControllerKind, ControllerSettings};
use raypipe::devenv::registry::Registry;
use serde_json::{Value, json};

use crate::support::e2e::{Operator, WAIT, is_true};

const PIPELINE: &str = "s3-code";
const ROUTE: &str = "/s3-code";
const GRAPH_PATH: &str = "graphs/s3-code.pb";

/// A graph at `version` whose one model comes from the package at `code_uri`.
fn graph(version: &str, code_uri: &str) -> Vec<u8> {
    let yaml = format!(
        r#"name: s3-code
version: "{version}"
ingress: request
route_prefix: /s3-code
deadline_ms: 30000
runtime_env:
  py_modules: ["{code_uri}"]
nodes:
  - name: request
    input: {{}}
  - name: answer
    model:
      import_path: s3_team_models.models:Answer
    timeout_ms: 20000
  - name: response
    output: {{}}
edges:
  - {{source: request, target: answer}}
  - {{source: answer, target: response}}
executor:
  ray_actor_options:
    num_cpus: 0.1
"#
    );
    raypipe::graph::from_yaml(&yaml)
        .expect("the graph parses")
        .encode_to_vec()
}

/// The zip of a package `s3_team_models` whose model answers `marker` and where it was loaded
/// from, as `raypipe dag push --code` packs it (the layout Ray's py_modules loader expects).
fn package_zip(marker: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("s3_team_models");
    std::fs::create_dir_all(&root).expect("mkdir");
    std::fs::write(root.join("__init__.py"), b"").expect("write");
    std::fs::write(
        root.join("models.py"),
        format!(
            "import os\n\nMARKER = {marker:?}\n\n\nclass Answer:\n    def __call__(self, payload):\n        \
             return {{'marker': MARKER, 'loaded_from': os.path.dirname(os.path.abspath(__file__))}}\n"
        ),
    )
    .expect("write");
    let package = raypipe::pypackage::code::pack(&root).expect("the package packs");
    package.bytes.as_ref().clone()
}

/// One request: the answer's JSON, or why there was none.
async fn ask(http: &reqwest::Client, url: &str) -> Result<Value, String> {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body(r#"{"question": 1}"#)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {body}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
}

/// Through the operator to Serve on real Ray 2.60: the model's package is a zip in a bucket,
/// named by `s3://` in the graph's `py_modules`, and the route answers with that code's output
/// from the directory Ray's downloader unpacked it into. Then a version naming an object that
/// is not in the bucket: Serve fails to deploy it, the pipeline's status says so with Ray's
/// reason, and the running version keeps answering every request meanwhile.
#[tokio::test]
async fn code_named_by_an_s3_uri_is_fetched_by_ray_and_a_missing_object_is_reported_while_the_running_version_answers()
 {
    let head = crate::support::ray_head();
    let _serve = crate::support::ray_serve_lock().await;
    let s3 = crate::support::s3::server();
    let unique = raypipe::devenv::random_token().expect("token");
    let bucket = format!("team-code-{}", &unique[..8]);
    let marker = format!("from-s3-{}", &unique[8..16]);
    s3.put(&bucket, "s3_team_models/v1.zip", &package_zip(&marker));
    let code_uri = format!("s3://{bucket}/s3_team_models/v1.zip");

    let client = crate::support::client().await;
    let ns = crate::support::namespace(&client, "s3-code").await;
    let token = raypipe::devenv::random_token().expect("token");
    let registry = Registry::start(&token).await;
    registry.put(GRAPH_PATH, graph("1", &code_uri));
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "registry-token"},
        "stringData": {"token": token}
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the registry Secret");
    let settings = ControllerSettings {
        namespaces: vec![ns.clone()],
        runtime_py_modules: raypipe::cli::dev::serve_packages(raypipe::cli::dev::dev_packages())
            .await
            .expect("the runtime package server"),
        rayservice: Some(raypipe::cli::dev::local_rayservice_config(head).expect("config")),
        ray_serve_url: Some(head.serve_url()),
        fetcher: crate::support::loopback_fetcher(),
        ..ControllerSettings::new(&[
            ControllerKind::Servepipeline,
            ControllerKind::Raycluster,
            ControllerKind::Rayservice,
        ])
    };
    let operator = Operator::start(client.clone(), settings);
    let pipeline = crate::support::fixture::serving_pipeline(
        PIPELINE,
        crate::support::fixture::token_source(
            &registry.url(GRAPH_PATH),
            json!({"refreshInterval": "1s"}),
        ),
        ROUTE,
        json!({"name": "ray-head", "image": "rayproject/ray:2.60.0",
            "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}),
    );
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    let created = Instant::now();
    pipelines
        .create(&PostParams::default(), &pipeline)
        .await
        .expect("created");
    let last_status = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let status_changes = |p: &ServePipeline| {
        let now = serde_json::to_string(
            &p.status
                .as_ref()
                .map(|s| (&s.phase, &s.conditions, &s.applications)),
        )
        .unwrap_or_default();
        let mut last = last_status.lock().unwrap();
        if *last != now {
            eprintln!("s3-code: status {now}");
            *last = now;
        }
    };
    crate::support::eventually(WAIT, "the pipeline Ready", || {
        let pipelines = pipelines.clone();
        let status_changes = &status_changes;
        async move {
            let p = pipelines.get(PIPELINE).await.ok()?;
            status_changes(&p);
            is_true(&p, "Ready").then_some(())
        }
    })
    .await;
    eprintln!(
        "s3-code: Ready {:.1}s after creation",
        created.elapsed().as_secs_f64()
    );

    let url = format!("{}{ROUTE}", head.serve_url());
    let http = crate::support::fixture::loopback_http(Duration::from_secs(20));
    let answer = ask(&http, &url).await.expect("the route answers");
    assert_eq!(answer["marker"], marker.as_str(), "{answer}");
    // Unpacked by Ray's py_modules plugin from the downloaded zip, not found on a path.
    let loaded_from = answer["loaded_from"].as_str().unwrap_or_default();
    assert!(
        loaded_from.contains("/runtime_resources/py_modules_files/")
            && loaded_from.ends_with("/s3_team_models"),
        "{answer}"
    );

    // A new version naming an object the bucket does not hold.
    let missing_uri = format!("s3://{bucket}/s3_team_models/v2-never-uploaded.zip");
    registry.put(GRAPH_PATH, graph("2", &missing_uri));
    let failed = crate::support::eventually(WAIT, "the missing object reported", || {
        let (pipelines, http, url) = (pipelines.clone(), http.clone(), url.clone());
        let (marker, status_changes) = (marker.clone(), &status_changes);
        async move {
            let p = pipelines.get(PIPELINE).await.ok()?;
            status_changes(&p);
            // Every answer meanwhile comes from the running version.
            let answer = ask(&http, &url).await.expect("the running version answers");
            assert_eq!(answer["marker"], marker.as_str(), "{answer}");
            p.status?.applications.into_values().find(|app| {
                app.status.as_deref() == Some("DEPLOY_FAILED")
                    && app
                        .message
                        .as_deref()
                        .is_some_and(|m| m.contains("v2-never-uploaded.zip"))
            })
        }
    })
    .await;
    eprintln!(
        "s3-code: the missing object reported: {}",
        failed.message.unwrap_or_default()
    );
    // The status says so: what serves is not the newest graph (it said "serves" before).
    crate::support::eventually(WAIT, "UpToDate False, Serve did not deploy it", || {
        let pipelines = pipelines.clone();
        async move {
            let p = pipelines.get(PIPELINE).await.ok()?;
            p.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "UpToDate")
                .filter(|c| c.status == "False" && c.reason == "ServeDeployFailed")
        }
    })
    .await;
    for _ in 0..5 {
        let answer = ask(&http, &url).await.expect("the running version answers");
        assert_eq!(answer["marker"], marker.as_str(), "{answer}");
    }

    operator.kill().await;
    // Leave the shared head without this pipeline's application.
    let _ = pipelines.delete(PIPELINE, &DeleteParams::default()).await;
}
