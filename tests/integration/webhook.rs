//! The validating webhook against the real API server: served over HTTPS on 127.0.0.1 with a
//! generated certificate, registered by URL (never a Service) and scoped to this test's
//! namespace so parallel tests are unaffected. Invalid objects are refused with our messages;
//! every sample is admitted.

use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use raypipe::admin::Metrics;
use raypipe::validation::feature_gates::FeatureGates;
use raypipe::webhook::registration::{self, Endpoint, FailurePolicy, Selectors};
use raypipe::webhook::{self, WebhookKind, tls};
use serde_json::{Value, json};

use crate::admin::{WAIT, sample};
use crate::support::{self, eventually};

fn api_for(client: &kube::Client, ns: &str, kind: WebhookKind) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(kind.group(), kind.version(), kind.kind());
    let resource = ApiResource::from_gvk_with_plural(&gvk, kind.plural());
    Api::namespaced_with(client.clone(), ns, &resource)
}

fn kind_of(doc: &Value) -> Option<WebhookKind> {
    WebhookKind::ALL
        .into_iter()
        .find(|k| doc["kind"].as_str() == Some(k.kind()))
}

/// Creates `doc` with `dryRun=All` (admission runs, nothing is stored): Ok, or the API
/// server's message.
async fn dry_run_create(client: &kube::Client, ns: &str, doc: &Value) -> Result<(), String> {
    let kind = kind_of(doc).expect("a webhook kind");
    let mut doc = doc.clone();
    doc["metadata"]["namespace"] = json!(ns);
    let object: DynamicObject = serde_json::from_value(doc).expect("a Kubernetes object");
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match api_for(client, ns, kind).create(&params, &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) => Err(e.message),
        Err(e) => Err(e.to_string()),
    }
}

fn cluster_spec() -> Value {
    let container = json!({"name": "ray", "image": "rayproject/ray:2.52.0"});
    json!({
        "rayVersion": "2.52.0",
        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [container]}}},
        "workerGroupSpecs": [
            {"groupName": "small", "minReplicas": 1, "maxReplicas": 2,
             "template": {"spec": {"containers": [container]}}}
        ]
    })
}

fn object(api_version: &str, kind: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec})
}

fn pipeline(name: &str, source: Value) -> Value {
    object(
        "raypipe.dev/v1alpha1",
        "ServePipeline",
        name,
        json!({"source": source, "rayClusterConfig": cluster_spec()}),
    )
}

#[tokio::test]
async fn the_webhook_refuses_invalid_objects_with_our_messages_and_admits_every_sample() {
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let ns = support::namespace(&client, "webhook").await;

    let (bundle, _) = tls::generate(
        &["localhost".to_owned()],
        &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
    )
    .expect("a certificate");
    let resolver = tls::CertificateResolver::new(&bundle).expect("a usable certificate");
    let listener = webhook::bind("127.0.0.1:0".parse().expect("an address"))
        .await
        .expect("bind the webhook port");
    let port = listener.local_addr().expect("local address").port();
    let metrics = Metrics::new();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // The alpha sample says the operator must run with these gates to accept it.
    let gates = FeatureGates::parse(
        "GCSFaultToleranceEmbeddedStorage=true,RayClusterHistoryServer=true,RayClusterNetworkPolicy=true,RayClusterMTLS=true,RayCronJob=true",
    )
    .expect("known gates");
    tokio::spawn(webhook::serve(
        listener,
        resolver,
        gates,
        metrics.clone(),
        async move {
            let _ = stop_rx.await;
        },
    ));

    // Only this test's namespace goes to this webhook.
    let selectors = Selectors {
        namespace_selector: Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "kubernetes.io/metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![ns.clone()]),
            }]),
            match_labels: None,
        }),
        object_selector: None,
    };
    let configuration_name = format!("raypipe-test-{ns}");
    let configuration = registration::validating_webhook_configuration(
        &configuration_name,
        &Endpoint::Url(format!("https://127.0.0.1:{port}")),
        &bundle.ca_pem,
        &selectors,
        FailurePolicy::Fail,
        &WebhookKind::ALL,
    );
    registration::apply(&client, &configuration)
        .await
        .expect("register the webhook");

    let duplicate_groups = {
        let mut spec = cluster_spec();
        let group = spec["workerGroupSpecs"][0].clone();
        spec["workerGroupSpecs"]
            .as_array_mut()
            .expect("a list")
            .push(group);
        object("ray.io/v1", "RayCluster", "dup", spec)
    };
    // The API server picks up new webhook configurations asynchronously.
    let message = eventually(WAIT, "the webhook to take effect", || async {
        dry_run_create(&client, &ns, &duplicate_groups).await.err()
    })
    .await;
    assert!(
        message.contains("admission webhook \"validate.rayclusters.ray.io\" denied the request")
            && message.contains("RayCluster.ray.io \"dup\" is invalid")
            && message.contains("duplicate worker group name \"small\""),
        "{message}"
    );

    let long_name = "a-rayservice-name-that-is-much-too-long-for-kuberay";
    let cases = [
        (
            object(
                "ray.io/v1",
                "RayService",
                long_name,
                json!({"rayClusterConfig": cluster_spec()}),
            ),
            "RayService names may have at most 47 characters",
        ),
        (
            object(
                "ray.io/v1",
                "RayService",
                "too-big",
                json!({"rayClusterConfig": cluster_spec(),
                       "serveConfigV2": "#".repeat(raypipe::validation::rayservice::MAX_SERVE_CONFIG_BYTES + 1)}),
            ),
            "fit in one object",
        ),
        (
            pipeline(
                "fast",
                json!({"url": "https://registry.example/g.pb", "refreshInterval": "500ms"}),
            ),
            "is shorter than the minimum of 1s",
        ),
        (
            pipeline("plain", json!({"url": "http://registry.example/g.pb"})),
            "source.url uses plain http://; use https://, or set source.allowInsecureHttp: true",
        ),
        (
            object(
                "ray.io/v1",
                "RayJob",
                "suspended",
                json!({"entrypoint": "python job.py", "suspend": true, "rayClusterSpec": cluster_spec()}),
            ),
            "spec.suspend needs shutdownAfterJobFinishes: true",
        ),
        (
            object(
                "ray.io/v1",
                "RayCronJob",
                "every",
                json!({"schedule": "*/5 * * *", "jobTemplate": {"entrypoint": "python job.py", "rayClusterSpec": cluster_spec()}}),
            ),
            "expected five fields",
        ),
    ];
    for (doc, expected) in &cases {
        let refused = dry_run_create(&client, &ns, doc).await;
        match refused {
            Err(message) => assert!(
                message.contains(expected) && message.contains("denied the request"),
                "{} {}: expected {expected:?} in {message:?}",
                doc["kind"],
                doc["metadata"]["name"]
            ),
            Ok(()) => panic!("{} {} was admitted", doc["kind"], doc["metadata"]["name"]),
        }
    }

    // A valid pipeline with allowInsecureHttp is fine.
    dry_run_create(
        &client,
        &ns,
        &pipeline(
            "allowed",
            json!({"url": "http://registry.example/g.pb", "allowInsecureHttp": true}),
        ),
    )
    .await
    .expect("an explicitly allowed http source is admitted");

    let mut admitted = 0;
    let own = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples");
    for dir in [own, support::kuberay_samples_dir()] {
        for (file, doc) in support::yaml_documents(&dir) {
            if kind_of(&doc).is_none() {
                continue;
            }
            if let Err(message) = dry_run_create(&client, &ns, &doc).await {
                panic!(
                    "{file}: {} {} was refused: {message}",
                    doc["kind"], doc["metadata"]["name"]
                );
            }
            admitted += 1;
        }
    }
    assert!(admitted >= 10, "only {admitted} samples");
    let text = metrics.encode().expect("metrics");
    let allowed_services = sample(
        &text,
        "raypipe_webhook_admissions_total{kind=\"RayService\",allowed=\"true\"}",
    )
    .unwrap_or(0.0);
    assert!(
        allowed_services >= 1.0,
        "the samples went through the webhook: {text}"
    );

    // Objects really stored are checked too (not only dry runs).
    let stored = api_for(&client, &ns, WebhookKind::RayCluster);
    let err = stored
        .create(
            &PostParams::default(),
            &serde_json::from_value(duplicate_groups).expect("an object"),
        )
        .await
        .expect_err("refused");
    assert!(
        err.to_string().contains("duplicate worker group name"),
        "{err}"
    );

    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(&configuration_name, &DeleteParams::default())
        .await
        .expect("remove the webhook configuration");
    let _ = stop_tx.send(());
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

/// `raypipe run --webhook` as deployed, except that the API server reaches it by URL: the
/// operator generates the certificate into a Secret, writes the CA into the existing webhook
/// configuration, and serves; invalid objects are then refused.
#[tokio::test]
async fn raypipe_run_generates_its_certificate_fills_in_the_ca_bundle_and_serves() {
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let ns = support::namespace(&client, "webhook-run").await;
    let webhook_port = free_port();
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));

    // Installed without a CA bundle, as the Helm chart does; "localhost" is the name the
    // generated certificate covers (the operator's --webhook-service).
    let configuration_name = format!("raypipe-run-{ns}");
    let selectors = Selectors {
        namespace_selector: Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "kubernetes.io/metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![ns.clone()]),
            }]),
            match_labels: None,
        }),
        object_selector: None,
    };
    registration::apply(
        &client,
        &registration::validating_webhook_configuration(
            &configuration_name,
            &Endpoint::Url(format!("https://localhost:{webhook_port}")),
            "",
            &selectors,
            FailurePolicy::Fail,
            &WebhookKind::ALL,
        ),
    )
    .await
    .expect("install the webhook configuration");

    let (stop_tx, operator) = support::spawn_operator(
        client.clone(),
        vec![
            "--controllers=servepipeline".to_owned(),
            format!("--namespaces={ns}"),
            format!("--operator-namespace={ns}"),
            "--leader-election=false".to_owned(),
            format!("--admin-address={admin}"),
            "--webhook=true".to_owned(),
            format!("--webhook-address=127.0.0.1:{webhook_port}"),
            "--webhook-service=localhost".to_owned(),
            format!("--webhook-configuration={configuration_name}"),
        ],
    );
    eventually(WAIT, "the operator to be ready", || async {
        crate::admin::get(admin, "/readyz")
            .await
            .filter(|(s, _)| *s == 200)
    })
    .await;

    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
        .get("raypipe-webhook-cert")
        .await
        .expect("the generated certificate Secret");
    let ca = secret
        .data
        .as_ref()
        .and_then(|d| d.get(tls::SECRET_CA_KEY))
        .expect("a CA")
        .clone();
    let installed = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(&configuration_name)
        .await
        .expect("the webhook configuration");
    for webhook in installed.webhooks.iter().flatten() {
        assert_eq!(
            webhook.client_config.ca_bundle.as_ref(),
            Some(&ca),
            "{}",
            webhook.name
        );
    }

    let message = eventually(WAIT, "the operator's webhook to refuse", || async {
        dry_run_create(
            &client,
            &ns,
            &pipeline(
                "fast",
                json!({"url": "https://registry.example/g.pb", "refreshInterval": "100ms"}),
            ),
        )
        .await
        .err()
        .filter(|m| m.contains("denied the request"))
    })
    .await;
    assert!(
        message.contains("is shorter than the minimum of 1s"),
        "{message}"
    );

    crate::support::stop_operator(stop_tx, operator, WAIT).await;
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(&configuration_name, &DeleteParams::default())
        .await
        .expect("remove the webhook configuration");
}
