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

/// Serves the admin endpoints of `metrics` and `readiness` on a free loopback port: the
/// address, the stop switch, and a maker of futures that complete when it is thrown.
async fn serve_admin(
    metrics: &Metrics,
    readiness: &Readiness,
) -> (
    SocketAddr,
    tokio::sync::watch::Sender<bool>,
    impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Clone + Send + use<>,
) {
    let listener = admin::bind("127.0.0.1:0".parse().expect("an address"))
        .await
        .expect("bind the admin port");
    let address = listener.local_addr().expect("local address");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        Box::pin(async move {
            let _ = rx.wait_for(|s| *s).await;
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
    };
    tokio::spawn(admin::serve(
        listener,
        metrics.clone(),
        readiness.clone(),
        stopped(),
    ));
    (address, stop_tx, stopped)
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
    let (address, stop_tx, stopped) = serve_admin(&metrics, &readiness).await;

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

/// A client whose requests are recorded in `metrics`, built as `raypipe run` builds its own.
async fn measured_client(metrics: &Metrics) -> kube::Client {
    let plane = support::control_plane();
    let kubeconfig = kube::config::Kubeconfig::read_from(&plane.kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("client config");
    kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&metrics.kube_client_layer())
        .build()
}

/// The series names the panels and variables of KubeRay's Grafana dashboard
/// (`config/grafana/KubeRay-Operator.json`) query on the operator's endpoint.
const KUBERAY_DASHBOARD_SERIES: &[&str] = &[
    "kuberay_cluster_info",
    "kuberay_cluster_condition_provisioned",
    "kuberay_cluster_provisioned_duration_seconds",
    "kuberay_job_info",
    "kuberay_job_deployment_status",
    "kuberay_job_execution_duration_seconds",
    "kuberay_service_info",
    "kuberay_service_condition_ready",
    "kuberay_service_condition_upgrade_in_progress",
    "controller_runtime_reconcile_total",
    "controller_runtime_reconcile_time_seconds_bucket",
    "controller_runtime_active_workers",
    "workqueue_depth",
];

/// Whether `text` has at least one sample of the metric `name`.
fn has_series(text: &str, name: &str) -> bool {
    text.lines().any(|line| {
        line.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(['{', ' ']))
    })
}

fn head_group() -> serde_json::Value {
    json!({"rayStartParams": {}, "template": {"spec": {"containers": [
        {"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}})
}

/// The sample names of `text` as the Prometheus project's own OpenMetrics parser reads it
/// (Python `prometheus_client`, from the Ray virtualenv the tests use); fails the test when
/// the parser refuses the exposition.
async fn parsed_sample_names(text: &str) -> std::collections::BTreeSet<String> {
    use tokio::io::AsyncWriteExt;
    const PARSE: &str = "import sys\n\
        from prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
        for family in text_string_to_metric_families(sys.stdin.read()):\n    \
            for sample in family.samples:\n        print(sample.name)\n";
    let ray = tokio::task::spawn_blocking(raypipe::devenv::ray::locate_ray)
        .await
        .expect("the lookup ran")
        .expect("the Ray virtualenv");
    let mut child = tokio::process::Command::new(ray.with_file_name("python"))
        .args(["-c", PARSE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(text.as_bytes())
        .await
        .expect("the exposition is written");
    drop(stdin);
    let output = child.wait_with_output().await.expect("python ends");
    assert!(
        output.status.success(),
        "the OpenMetrics parser refused the exposition: {}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Creates the object `doc` describes in `namespace`; its uid.
async fn create<K>(client: &kube::Client, namespace: &str, doc: serde_json::Value) -> String
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let object: K = serde_json::from_value(doc).expect("a valid object");
    Api::<K>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create a {}: {e}", K::kind(&())))
        .meta()
        .uid
        .clone()
        .expect("a created object has a uid")
}

#[tokio::test]
async fn every_controller_reports_and_process_kube_and_kuberay_series_are_exported() {
    use raypipe::api::{RayCluster, RayCronJob, RayJob, RayService};
    raypipe::startup::init_crypto();
    let metrics = Metrics::with_options(admin::MetricsOptions { kuberay: true });
    let client = measured_client(&metrics).await;
    let ns = support::namespace(&client, "opmetrics").await;
    let readiness = Readiness::new();
    let (address, stop_tx, stopped) = serve_admin(&metrics, &readiness).await;

    // The process metrics are there from the start.
    let (_, text) = eventually(WAIT, "/metrics to answer", || get(address, "/metrics")).await;
    for name in [
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(sample(&text, name).is_some(), "no {name} in\n{text}");
    }
    assert!(
        sample(&text, "process_resident_memory_bytes").is_some_and(|b| b > 1e6),
        "{text}"
    );

    let all = [
        ControllerKind::Servepipeline,
        ControllerKind::Raycluster,
        ControllerKind::Rayservice,
        ControllerKind::Rayjob,
        ControllerKind::Raycronjob,
    ];
    // Dashboards and Serve proxies on a closed loopback port: nothing leaves 127.0.0.1.
    let settings = ControllerSettings {
        namespaces: vec![ns.clone()],
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        fetcher: support::loopback_fetcher(),
        ray_dashboard_url: Some("http://127.0.0.1:1".into()),
        ray_serve_url: Some("http://127.0.0.1:1".into()),
        // The RayCronJob controller runs only under its gate, as in KubeRay.
        feature_gates: raypipe::validation::feature_gates::FeatureGates::default().with(
            raypipe::validation::feature_gates::gates::RAY_CRON_JOB,
            true,
        ),
        ..ControllerSettings::new(&all)
    };
    let controller_client = client.clone();
    let controllers = tokio::spawn(async move {
        raypipe::controllers::run(controller_client, settings.plan()?, stopped()).await
    });
    eventually(WAIT, "/readyz to say ready", || async {
        let (status, _) = get(address, "/readyz").await?;
        (status == 200).then_some(())
    })
    .await;
    let tracked = readiness.tracked_caches();
    for name in [
        "servepipeline",
        "raycluster",
        "rayservice",
        "rayjob",
        "raycronjob",
    ] {
        assert!(
            tracked.iter().any(|t| t == name),
            "readiness never waited for the {name} cache: {tracked:?}"
        );
    }

    let cluster_uid = create::<RayCluster>(
        &client,
        &ns,
        json!({"apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "plain"}, "spec": {"headGroupSpec": head_group()}}),
    )
    .await;
    let job_uid = create::<RayJob>(
        &client,
        &ns,
        json!({"apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": "paused"}, "spec": {"entrypoint": "python -c 'print(1)'",
        "suspend": true, "rayClusterSpec": {"headGroupSpec": head_group()}}}),
    )
    .await;
    let service_uid = create::<RayService>(&client, &ns, json!({"apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": "svc"}, "spec": {"rayClusterConfig": {"headGroupSpec": head_group()}}}))
    .await;
    create::<RayCronJob>(
        &client,
        &ns,
        json!({"apiVersion": "ray.io/v1", "kind": "RayCronJob",
        "metadata": {"name": "cron"}, "spec": {"schedule": "*/5 * * * *", "suspend": true,
        "jobTemplate": {"entrypoint": "python -c 'print(1)'",
                        "rayClusterSpec": {"headGroupSpec": head_group()}}}}),
    )
    .await;
    Api::<ServePipeline>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &pipeline("refused", None))
        .await
        .expect("create the invalid pipeline");

    // Every controller counts and times its reconciles.
    eventually(WAIT, "a finished reconcile of every controller", || async {
        let (_, text) = get(address, "/metrics").await?;
        all.iter()
            .map(|kind| format!("{kind:?}").to_lowercase())
            .all(|controller| {
                sample(
                    &text,
                    &format!(
                        "raypipe_reconcile_duration_seconds_count{{controller=\"{controller}\"}}"
                    ),
                )
                .is_some_and(|n| n >= 1.0)
            })
            .then_some(())
    })
    .await;

    // A terminal RayJob's run time comes from its status as the cache holds it.
    let jobs: Api<RayJob> = Api::namespaced(client.clone(), &ns);
    eventually(WAIT, "the suspended RayJob to get a status", || async {
        let job = jobs.get("paused").await.ok()?;
        job.status?.job_deployment_status.map(|_| ())
    })
    .await;
    jobs.patch_status(
        "paused",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"jobDeploymentStatus": "Complete", "failed": 0,
            "startTime": "2026-01-01T00:00:00Z", "endTime": "2026-01-01T00:00:05Z"}}),
        ),
    )
    .await
    .expect("finish the RayJob");
    // A request the API server refuses is counted under its code.
    assert!(jobs.get("missing").await.is_err());

    let object =
        |name: &str, uid: &str| format!("name=\"{name}\",namespace=\"{ns}\",uid=\"{uid}\"");
    let cluster = object("plain", &cluster_uid);
    let job = object("paused", &job_uid);
    let service = object("svc", &service_uid);
    let text = eventually(WAIT, "the KubeRay series of every object", || async {
        let (_, text) = get(address, "/metrics").await?;
        let complete = sample(
            &text,
            &format!("kuberay_cluster_condition_provisioned{{{cluster},condition=\"true\"}}"),
        ) == Some(1.0)
            && sample(
                &text,
                &format!(
                    "kuberay_job_execution_duration_seconds{{{job},job_deployment_status=\"Complete\",retry_count=\"0\"}}"
                ),
            ) == Some(5.0)
            && sample(&text, "raypipe_kube_requests_total{verb=\"get\",code=\"404\"}")
                .is_some_and(|n| n >= 1.0);
        complete.then_some(text)
    })
    .await;
    for series in [
        format!("kuberay_cluster_info{{{cluster},owner_kind=\"None\"}}"),
        format!("kuberay_job_info{{{job}}}"),
        format!("kuberay_job_deployment_status{{{job},deployment_status=\"Complete\"}}"),
        format!("kuberay_service_info{{{service}}}"),
        format!("kuberay_service_condition_ready{{{service},condition=\"false\"}}"),
        format!("kuberay_service_condition_upgrade_in_progress{{{service},condition=\"false\"}}"),
    ] {
        assert_eq!(sample(&text, &series), Some(1.0), "{series} in\n{text}");
    }
    let provisioned_after = sample(
        &text,
        &format!("kuberay_cluster_provisioned_duration_seconds{{{cluster}}}"),
    )
    .expect("the provisioned cluster's time to provision");
    assert!((0.0..120.0).contains(&provisioned_after), "{text}");
    // The RayService's own cluster says who made it.
    eventually(
        WAIT,
        "the RayService's cluster in kuberay_cluster_info",
        || async {
            let (_, text) = get(address, "/metrics").await?;
            text.lines()
                .any(|l| {
                    l.starts_with("kuberay_cluster_info{")
                        && l.contains(&format!("namespace=\"{ns}\""))
                        && l.contains("owner_kind=\"RayService\"")
                })
                .then_some(())
        },
    )
    .await;
    for series in [
        "raypipe_kube_requests_total{verb=\"list\",code=\"200\"}",
        "raypipe_kube_requests_total{verb=\"watch\",code=\"200\"}",
        "raypipe_kube_requests_total{verb=\"create\",code=\"201\"}",
        "raypipe_kube_request_duration_seconds_count{verb=\"list\"}",
    ] {
        assert!(
            sample(&text, series).is_some_and(|n| n >= 1.0),
            "{series} in\n{text}"
        );
    }
    // The exposition parses, and carries the process series and every series KubeRay's
    // dashboard queries.
    let parsed = parsed_sample_names(&text).await;
    for name in KUBERAY_DASHBOARD_SERIES.iter().chain(&[
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
        "raypipe_kube_requests_total",
        "raypipe_kube_request_duration_seconds_bucket",
    ]) {
        assert!(
            parsed.contains(*name),
            "the parser found no {name} in {parsed:?}"
        );
    }
    for name in KUBERAY_DASHBOARD_SERIES {
        assert!(
            has_series(&text, name),
            "KubeRay's dashboard finds no {name} in\n{text}"
        );
    }

    // A deleted object leaves the metrics with the cache: nothing is kept for it.
    jobs.delete("paused", &Default::default())
        .await
        .expect("delete the RayJob");
    eventually(WAIT, "the deleted RayJob's series to go", || async {
        let (_, text) = get(address, "/metrics").await?;
        (!text.contains(&job_uid)).then_some(())
    })
    .await;

    let _ = stop_tx.send(true);
    let result = tokio::time::timeout(WAIT, controllers)
        .await
        .expect("the controllers stop")
        .expect("the controller task ran");
    assert!(result.is_ok(), "{result:?}");
}
