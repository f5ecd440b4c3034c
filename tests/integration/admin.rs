//! The admin endpoints (health, readiness, OpenMetrics) of a ServePipeline controller running
//! against the real API server, scoped to one namespace: they answer on 127.0.0.1 and change
//! as work happens; pipelines in other namespaces are never touched.

use std::net::SocketAddr;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use raypipe::admin::{self, Metrics, Readiness};
use raypipe::api::servepipeline::ServePipeline;
use raypipe::config::ControllerKind;
use raypipe::config::ControllerSettings;
use serde_json::json;

use crate::support::{self, eventually, fixture};
use raypipe::devenv::registry::Registry;

pub(crate) const WAIT: Duration = Duration::from_secs(60);

/// GET `http://{address}{path}`: (status, body).
pub(crate) async fn get(address: SocketAddr, path: &str) -> Option<(u16, String)> {
    let response = reqwest::get(format!("http://{address}{path}")).await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

/// The value of the sample `series` (name plus labels exactly as exposed) in OpenMetrics text.
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
}

/// A ServePipeline; `url` `None` makes one with an invalid spec (plain http, not allowed),
/// which the controller reconciles into a `Failed` status without any download.
pub(crate) fn pipeline(name: &str, url: Option<&str>) -> ServePipeline {
    let source = match url {
        Some(url) => fixture::token_source(url, json!({})),
        None => json!({"url": "http://registry.invalid/graph.pb"}),
    };
    fixture::servepipeline(name, source)
}

#[tokio::test]
async fn health_readiness_and_metrics_follow_the_work_and_other_namespaces_are_ignored() {
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let watched = support::namespace(&client, "admin").await;
    let other = support::namespace(&client, "admin-other").await;
    let registry = Registry::start("s3cret").await;
    let graph = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/graphs/sequence.pb"),
    )
    .expect("sample graph");
    registry.put("graphs/p.pb", graph);
    fixture::put_token_secret(&client, &watched, "registry-token", "s3cret").await;

    let metrics = Metrics::new();
    let readiness = Readiness::new();
    let listener = admin::bind("127.0.0.1:0".parse().expect("an address"))
        .await
        .expect("bind the admin port");
    let address = listener.local_addr().expect("local address");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    tokio::spawn(admin::serve(
        listener,
        metrics.clone(),
        readiness.clone(),
        stopped(),
    ));

    // Before the controllers start: alive, not ready, and nothing reconciled.
    let (status, body) = eventually(WAIT, "/healthz to answer", || get(address, "/healthz")).await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (status, body) = get(address, "/readyz").await.expect("/readyz answers");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("CRDs"), "{body}");
    let (_, text) = get(address, "/metrics").await.expect("/metrics answers");
    assert!(
        text.trim_end().ends_with("# EOF"),
        "OpenMetrics ends with # EOF: {text}"
    );
    assert_eq!(
        sample(
            &text,
            "raypipe_reconcile_total{controller=\"servepipeline\"}"
        ),
        None
    );

    let settings = ControllerSettings {
        namespaces: vec![watched.clone()],
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        fetcher: support::loopback_fetcher(),
        ..ControllerSettings::new(&[ControllerKind::Servepipeline])
    };
    let controller_client = client.clone();
    let controllers = tokio::spawn(async move {
        raypipe::controllers::run(controller_client, settings.plan()?, stopped()).await
    });

    let last_readyz = std::sync::Mutex::new(String::new());
    let ready = tokio::time::timeout(WAIT, async {
        loop {
            if let Some((status, body)) = get(address, "/readyz").await {
                if status == 200 {
                    return;
                }
                *last_readyz.lock().expect("lock") = body;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        ready.is_ok(),
        "/readyz never became ready; it said: {}; controllers ended: {:?}",
        last_readyz.lock().expect("lock"),
        controllers.is_finished()
    );

    let watched_api: Api<ServePipeline> = Api::namespaced(client.clone(), &watched);
    let other_api: Api<ServePipeline> = Api::namespaced(client.clone(), &other);
    other_api
        .create(&PostParams::default(), &pipeline("elsewhere", None))
        .await
        .expect("create the pipeline in the other namespace");
    watched_api
        .create(
            &PostParams::default(),
            &pipeline("served", Some(&registry.url("graphs/p.pb"))),
        )
        .await
        .expect("create the served pipeline");
    watched_api
        .create(&PostParams::default(), &pipeline("refused", None))
        .await
        .expect("create the invalid pipeline");

    let text = eventually(WAIT, "metrics for both pipelines", || async {
        let (_, text) = get(address, "/metrics").await?;
        let ready = sample(&text, "raypipe_servepipelines{phase=\"Failed\"}") == Some(1.0)
            && sample(
                &text,
                "raypipe_graph_fetch_duration_seconds_count{outcome=\"fetched\"}",
            ) == Some(1.0)
            && sample(&text, "raypipe_servepipelines{phase=\"Deploying\"}").is_some()
            // A reconcile is counted when it starts and its duration observed when it ends:
            // wait until both of them have ended.
            && sample(
                &text,
                "raypipe_reconcile_duration_seconds_count{controller=\"servepipeline\"}",
            )
            .is_some_and(|n| n >= 2.0);
        ready.then_some(text)
    })
    .await;
    let reconciles = sample(
        &text,
        "raypipe_reconcile_total{controller=\"servepipeline\"}",
    )
    .expect("a reconcile counter");
    assert!(reconciles >= 2.0, "{text}");
    assert!(
        sample(
            &text,
            "raypipe_reconcile_errors_total{controller=\"servepipeline\",category=\"input\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "the refused pipeline counts as an input error: {text}"
    );
    assert!(
        sample(
            &text,
            "raypipe_reconcile_duration_seconds_count{controller=\"servepipeline\"}"
        )
        .is_some_and(|n| n >= 2.0),
        "{text}"
    );
    // The served pipeline's update was timed per stage.
    for stage in ["fetch_validate", "render", "apply"] {
        assert_eq!(
            sample(
                &text,
                &format!("raypipe_pipeline_update_stage_seconds_count{{stage=\"{stage}\"}}")
            ),
            Some(1.0),
            "{text}"
        );
    }
    // Both pipelines were queued and picked up: the queue drains to empty.
    eventually(WAIT, "the reconcile queue to drain", || async {
        let (_, text) = get(address, "/metrics").await?;
        (sample(
            &text,
            "raypipe_reconcile_queue_depth{controller=\"servepipeline\"}",
        ) == Some(0.0))
        .then_some(())
    })
    .await;
    assert!(
        !text.contains("served") && !text.contains("refused") && !text.contains(&watched),
        "object names and namespaces never appear in metrics: {text}"
    );

    // A further change is counted again.
    let mut changed = pipeline("refused", None);
    changed.spec.source.url = "http://registry.invalid/other.pb".into();
    watched_api
        .patch(
            "refused",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&changed),
        )
        .await
        .expect("change the pipeline");
    eventually(WAIT, "the reconcile counter to grow", || async {
        let (_, text) = get(address, "/metrics").await?;
        sample(
            &text,
            "raypipe_reconcile_total{controller=\"servepipeline\"}",
        )
        .filter(|n| *n > reconciles)
    })
    .await;

    // The other namespace was never reconciled: no status, ever.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let elsewhere = other_api.get("elsewhere").await.expect("get");
    assert!(
        elsewhere.status.is_none(),
        "a pipeline outside the watched namespace got a status: {:?}",
        elsewhere.status
    );

    let _ = stop_tx.send(true);
    let result = tokio::time::timeout(WAIT, controllers)
        .await
        .expect("the controllers stop")
        .expect("the controller task ran");
    assert!(result.is_ok(), "{result:?}");
}
