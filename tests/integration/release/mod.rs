//! The release as a platform team gets it, proven with real parts: the image built without a
//! container engine (`deploy/image/build.sh`), pushed to the real distribution registry and run
//! by `runc` with the chart's own ServiceAccount token (`image`); the chart packaged, pushed and
//! installed as an OCI chart with the real `helm`, every `controllers` subset working under the
//! chart's RBAC, upgraded from the previous chart version and uninstalled (`chart`); raypipe
//! beside KubeRay's own CRDs and chart values (`beside_kuberay`).

mod appwrapper_values;
mod beside_kuberay;
mod chart;
mod history_values;
mod image;
mod krew;

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::Api;
use serde_json::Value;

use crate::support::tools::{helm, run};

/// The repository (what a clean clone holds).
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The chart's version (Chart.yaml), which is also the image tag it defaults to.
fn chart_version() -> String {
    let chart = std::fs::read_to_string(repo().join("deploy/raypipe/Chart.yaml"))
        .expect("deploy/raypipe/Chart.yaml");
    chart
        .lines()
        .find_map(|l| l.strip_prefix("version: "))
        .expect("Chart.yaml has a version")
        .trim()
        .to_owned()
}

/// `helm` with the kubeconfig of `kubeconfig` and helm's own state in `home` (so nothing of the
/// machine's helm configuration is read or written).
fn helm_command(home: &Path, kubeconfig: &Path) -> Command {
    let mut command = Command::new(helm());
    command
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env("HELM_REGISTRY_CONFIG", home.join("registry.json"));
    command
}

/// `helm package` of the chart in `dir` into `out`; the path of the archive.
fn package_chart(home: &Path, dir: &Path, out: &Path) -> PathBuf {
    let stdout = run(helm_command(home, Path::new("/nonexistent"))
        .arg("package")
        .arg(dir)
        .arg("--destination")
        .arg(out));
    // "Successfully packaged chart and saved it to: /path/raypipe-0.2.0.tgz"
    PathBuf::from(
        stdout
            .trim()
            .rsplit(": ")
            .next()
            .expect("helm package names the archive"),
    )
}

/// A token of ServiceAccount `namespace/name`, from the TokenRequest API as the kubelet gets
/// one for a Pod: the operator authenticates as that account, not with the admin token.
async fn service_account_token(client: &kube::Client, namespace: &str, name: &str) -> String {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &Default::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for {namespace}/{name}: {e}"))
        .status
        .expect("a token request's status")
        .token
        .expect("a token")
}

/// The number of requests the operator's Kubernetes client saw answered 403 (its
/// `raypipe_kube_requests_total` series): a verb the chart's RBAC does not grant.
fn forbidden_requests(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("raypipe_kube_requests_total{") && line.contains("code=\"403\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The rendered Deployment's operator container, from the cluster (what the kubelet would run).
async fn installed_container(client: &kube::Client, namespace: &str, name: &str) -> Value {
    let deployment =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), namespace)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("the chart's Deployment {namespace}/{name}: {e}"));
    let value = serde_json::to_value(deployment).expect("a Deployment serializes");
    value["spec"]["template"]["spec"]["containers"][0].clone()
}

/// The container's environment as the kubelet would set it: literal values, and the two
/// downward-API fields the chart uses (the Pod's namespace and name).
fn container_env(container: &Value, namespace: &str, pod: &str) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| {
            let name = entry["name"].as_str().expect("env name").to_owned();
            let value = match entry["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.namespace") => namespace.to_owned(),
                Some("metadata.name") => pod.to_owned(),
                Some(other) => {
                    panic!("the chart sets {name} from {other}, which this test does not resolve")
                }
                None => entry["value"].as_str().unwrap_or_default().to_owned(),
            };
            (name, value)
        })
        .collect()
}

/// The container's `args`.
fn container_args(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .expect("the operator container has args")
        .iter()
        .map(|a| a.as_str().expect("string args").to_owned())
        .collect()
}

/// A free TCP port on the loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `--flag=value` for each environment entry whose name is a `raypipe run` flag's environment
/// twin (how `raypipe run` reads them); entries of no flag (KubeRay's own names are flags too)
/// are a chart error.
pub(crate) fn env_as_flags(env: &[(String, String)]) -> Vec<String> {
    use clap::CommandFactory;
    let cli = raypipe::cli::Cli::command();
    let run = cli.find_subcommand("run").expect("a run subcommand");
    env.iter()
        .map(|(name, value)| {
            let flag = run
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|env| env == name.as_str()))
                .and_then(|a| a.get_long())
                .unwrap_or_else(|| panic!("{name} is no `raypipe run` flag's environment name"));
            format!("--{flag}={value}")
        })
        .collect()
}

/// An operator as the chart installed it, run in-process: the installed Deployment's arguments
/// and environment, a client that authenticates with the chart ServiceAccount's own token, and
/// the request metrics the binary records (so a forbidden request is counted).
pub(crate) struct InstalledOperator {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    pub admin: std::net::SocketAddr,
}

impl InstalledOperator {
    /// Starts the operator of Deployment `namespace/deployment`, authenticated as
    /// `namespace/service_account`; its admin server must listen on `admin_port`.
    pub(crate) async fn start(
        plane: &raypipe::devenv::control_plane::ControlPlane,
        admin_client: &kube::Client,
        namespace: &str,
        deployment: &str,
        service_account: &str,
        admin_port: u16,
    ) -> InstalledOperator {
        let container = installed_container(admin_client, namespace, deployment).await;
        let argv: Vec<String> = ["raypipe".to_owned()]
            .into_iter()
            .chain(container_args(&container))
            .chain(env_as_flags(&container_env(
                &container,
                namespace,
                &format!("{deployment}-0"),
            )))
            .collect();
        let raypipe::cli::Command::Run(args) =
            <raypipe::cli::Cli as clap::Parser>::try_parse_from(&argv)
                .unwrap_or_else(|e| panic!("the chart's arguments do not parse: {e}\n{argv:?}"))
                .command
        else {
            panic!("the chart runs `raypipe run`");
        };
        let token = service_account_token(admin_client, namespace, service_account).await;
        let kubeconfig = raypipe::devenv::control_plane::kubeconfig_yaml(
            &plane.api_url,
            &plane.ca_pem,
            service_account,
            &token,
        );
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&kubeconfig).expect("a kubeconfig"),
            &Default::default(),
        )
        .await
        .expect("a client configuration");
        let metrics = args.operator.admin.metrics();
        let client = kube::client::ClientBuilder::try_from(config)
            .expect("a client")
            .with_layer(&metrics.kube_client_layer())
            .build();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(raypipe::cli::run::run_with_metrics(
            client,
            metrics,
            *args,
            async move {
                let _ = stopped.await;
            },
        ));
        let admin = ([127, 0, 0, 1], admin_port).into();
        crate::support::eventually(
            std::time::Duration::from_secs(120),
            "the installed operator's /readyz to answer 200",
            || async {
                let (status, _) = crate::admin::get(admin, "/readyz").await?;
                (status == 200).then_some(())
            },
        )
        .await;
        InstalledOperator {
            stop: Some(stop),
            task: Some(task),
            admin,
        }
    }

    /// Requests the chart's RBAC refused so far.
    pub(crate) async fn forbidden(&self) -> f64 {
        let (_, metrics) = crate::admin::get(self.admin, "/metrics")
            .await
            .expect("/metrics answers");
        forbidden_requests(&metrics)
    }

    /// Stops it and asserts it ended cleanly.
    pub(crate) async fn stop(mut self) {
        let _ = self.stop.take().expect("running").send(());
        let result = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            self.task.take().expect("running"),
        )
        .await
        .expect("the operator stops")
        .expect("the operator task ran");
        assert!(result.is_ok(), "{result:?}");
    }
}

impl Drop for InstalledOperator {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The API server of a test control plane cannot reach a Service (it would dial a cluster IP),
/// so once the operator has written its CA bundle, the test points the chart's webhooks at no
/// namespace: objects are then admitted by the API server alone. Webhooks are tested by URL in
/// `tests/integration/webhook.rs` and over TLS for the Service's name in `image`.
pub(crate) async fn select_no_namespace(client: &kube::Client, configuration: &str) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let nothing: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
        serde_json::from_value(serde_json::json!({
            "matchLabels": {"raypipe.dev/release-test": "no-such-namespace"}
        }))
        .expect("a selector");
    // The operator may be writing its CA bundle at the same moment: retry on a conflict.
    for _ in 0..10 {
        let mut current = api
            .get(configuration)
            .await
            .unwrap_or_else(|e| panic!("the chart's webhook configuration {configuration}: {e}"));
        for webhook in current.webhooks.iter_mut().flatten() {
            webhook.namespace_selector = Some(nothing.clone());
        }
        current.metadata.managed_fields = None;
        match api
            .replace(configuration, &Default::default(), &current)
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("the test narrows the webhooks: {e}"),
        }
    }
    panic!("the webhook configuration {configuration} kept changing");
}
