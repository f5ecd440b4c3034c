//! `raypipe dev`: one command for a local playground. Starts a real control plane on 127.0.0.1
//! (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok with one fake Node),
//! installs the CRDs, runs the controllers in-process and prints how to reach it. Ctrl-C stops
//! everything it started.

pub mod heads;

use std::path::PathBuf;

use crate::config::ControllerKind;
use crate::devenv::control_plane::{ControlPlane, ControlPlaneOptions};

#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// Where to write the admin kubeconfig (default: `<cache>/dev/kubeconfig`, a stable path
    /// across restarts).
    #[arg(long, env = "RAYPIPE_DEV_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    pub controllers: crate::config::flags::ControllerListArgs,
    /// Start only etcd and kube-apiserver (no controller-manager, scheduler or kwok).
    #[arg(long)]
    pub minimal: bool,
    /// Do not start the sample registry or create the sample ServePipeline.
    #[arg(long)]
    pub no_sample: bool,
    /// Do not start a local Ray head (RayServices then never reach their dashboards).
    #[arg(long)]
    pub no_ray: bool,
    /// Port of the sample registry on 127.0.0.1; `samples/servepipeline.yaml` expects 8787
    /// (with another port, `raypipe dev` rewrites its own copy of the sample).
    #[arg(long, env = "RAYPIPE_DEV_REGISTRY_PORT", default_value_t = SAMPLE_REGISTRY_PORT)]
    pub registry_port: u16,
    /// Port of the console on 127.0.0.1 (a browser is signed in by a local OpenID provider as
    /// a member of `system:masters`).
    #[arg(long, env = "RAYPIPE_DEV_CONSOLE_PORT", default_value_t = DEV_CONSOLE_PORT)]
    pub console_port: u16,
    /// Do not start the console.
    #[arg(long)]
    pub no_console: bool,
    #[command(flatten)]
    pub log_level: crate::config::flags::LogLevelArgs,
}

/// The sample user models the sample graphs import (`samples.models`), delivered to Ray as a
/// package like the runtime, so the local Ray needs nothing installed.
const SAMPLE_MODELS: &[(&str, &[u8])] = &[
    (
        "samples/__init__.py",
        include_bytes!("../../../samples/__init__.py"),
    ),
    (
        "samples/models.py",
        include_bytes!("../../../samples/models.py"),
    ),
];

/// The packages `raypipe dev` serves to its Ray head: the graph runtime and the sample models.
pub fn dev_packages() -> Vec<crate::pypackage::PythonPackage> {
    let models: Vec<(String, Vec<u8>)> = SAMPLE_MODELS
        .iter()
        .map(|(path, bytes)| ((*path).to_owned(), bytes.to_vec()))
        .collect();
    vec![
        crate::pypackage::runtime(),
        crate::pypackage::PythonPackage::from_files("samples", &models),
    ]
}

/// Serves `packages` on 127.0.0.1 (an ephemeral port); returns their URIs.
pub async fn serve_packages(
    packages: Vec<crate::pypackage::PythonPackage>,
) -> anyhow::Result<Vec<String>> {
    Ok(
        serve_packages_with_code(packages, crate::pypackage::CodeStore::default())
            .await?
            .0,
    )
}

/// [`serve_packages`], and the code layers of `code` beside them (as the operator's admin
/// port serves them); returns the packages' URIs and the base URL (`--runtime-base-url`).
pub async fn serve_packages_with_code(
    packages: Vec<crate::pypackage::PythonPackage>,
    code: crate::pypackage::CodeStore,
) -> anyhow::Result<(Vec<String>, String)> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let base = format!("http://{}/packages", listener.local_addr()?);
    let uris = packages
        .iter()
        .map(|p| crate::pypackage::uri(&base, p))
        .collect();
    tokio::spawn(async move {
        let _ = axum::serve(listener, crate::pypackage::router_with_code(packages, code)).await;
    });
    Ok((uris, base))
}

/// The RayService controller's settings for RayClusters whose dashboard is one Ray head on
/// 127.0.0.1: every cluster maps to it, and Serve listens on its loopback port.
pub fn local_rayservice_config(
    head: &crate::devenv::ray::RayHead,
) -> anyhow::Result<crate::controllers::rayservice::Config> {
    use crate::controllers::rayservice::{Config, build::HttpBinding};
    let port = head.ports().serve_http;
    Ok(Config {
        dashboard: crate::ray::DashboardLocator::fixed(head.dashboard_url().as_str())?,
        http_binding: Some(std::sync::Arc::new(move |_: &crate::ray::DashboardUrl| {
            Some(HttpBinding {
                host: "127.0.0.1".to_owned(),
                port,
            })
        })),
        ..Config::default()
    })
}

/// The RayService controller's settings for `raypipe dev`: each RayService's clusters map to
/// its own local Ray head ([`heads::HeadPool`]), and Serve listens on that head's loopback port.
fn pooled_rayservice_config(pool: &heads::HeadPool) -> crate::controllers::rayservice::Config {
    use crate::controllers::rayservice::{Config, build::HttpBinding};
    let ports = pool.clone();
    Config {
        dashboard: pool.dashboard_locator(),
        http_binding: Some(std::sync::Arc::new(
            move |url: &crate::ray::DashboardUrl| {
                ports.serve_port(url).map(|port| HttpBinding {
                    host: "127.0.0.1".to_owned(),
                    port,
                })
            },
        )),
        ..Config::default()
    }
}

/// The graphs `raypipe dev`'s registry serves, at `graphs/<file>`.
const SAMPLE_GRAPHS: &[(&str, &[u8])] = &[
    (
        "ensemble.pb",
        include_bytes!("../../../samples/graphs/ensemble.pb"),
    ),
    (
        "ensemble-v2.pb",
        include_bytes!("../../../samples/graphs/ensemble-v2.pb"),
    ),
    (
        "ensemble-broken.pb",
        include_bytes!("../../../samples/graphs/ensemble-broken.pb"),
    ),
    (
        "sequence.pb",
        include_bytes!("../../../samples/graphs/sequence.pb"),
    ),
    (
        "switch-canary.pb",
        include_bytes!("../../../samples/graphs/switch-canary.pb"),
    ),
];
/// The sample ServePipeline, applied as printed so the file a user reads is the one that runs.
const SAMPLE_PIPELINE_YAML: &str = include_str!("../../../samples/servepipeline.yaml");
/// The registry address written in `samples/servepipeline.yaml`.
pub const SAMPLE_REGISTRY_PORT: u16 = 8787;
/// Where `raypipe dev` serves the console.
pub const DEV_CONSOLE_PORT: u16 = 8788;
/// Who the dev console's browser sessions are: the local OpenID provider signs every browser
/// in as this user, in the API server's privileged group, so the console shows everything.
const DEV_CONSOLE_USER: &str = "developer@raypipe.dev";
const DEV_CONSOLE_GROUP: &str = "system:masters";
const SAMPLE_NAMESPACE: &str = "default";
const SAMPLE_PIPELINE: &str = "demo";
const SAMPLE_TOKEN_SECRET: &str = "demo-registry-token";
/// The `kubernetes.io/dockerconfigjson` Secret with the registry's credentials for `source.oci`.
const SAMPLE_CREDENTIALS_SECRET: &str = "demo-registry-credentials";
/// The OCI repository and tag the sample graph is pushed to (what `raypipe dag push` updates).
pub const SAMPLE_OCI_REPOSITORY: &str = "samples/ensemble";
pub const SAMPLE_OCI_TAG: &str = "demo";
/// User name in the dev Docker config (the registry checks only the password, its token).
const SAMPLE_REGISTRY_USER: &str = "raypipe";

/// A Docker config (`auths`) with the dev registry's credentials, as `docker login` writes it.
pub fn dev_docker_config(registry_host: &str, token: &str) -> serde_json::Value {
    use base64::Engine as _;
    let auth =
        base64::engine::general_purpose::STANDARD.encode(format!("{SAMPLE_REGISTRY_USER}:{token}"));
    serde_json::json!({"auths": {registry_host: {"auth": auth}}})
}

/// Pushes every sample graph to the registry's OCI side as `samples/<file stem>:v1`, and the
/// first ensemble as [`SAMPLE_OCI_REPOSITORY`]:[`SAMPLE_OCI_TAG`], the tag the walkthrough's
/// `raypipe dag push` moves.
pub fn push_sample_graphs(registry: &crate::devenv::registry::Registry) -> anyhow::Result<()> {
    for (file, bytes) in SAMPLE_GRAPHS {
        let graph = crate::graph::load(bytes, crate::graph::Format::Protobuf)?;
        let stem = file.trim_end_matches(".pb");
        registry.push_graph(
            &format!("samples/{stem}"),
            "v1",
            bytes.to_vec(),
            &graph.name,
            &graph.version,
        )?;
        if *file == "ensemble.pb" {
            registry.push_graph(
                SAMPLE_OCI_REPOSITORY,
                SAMPLE_OCI_TAG,
                bytes.to_vec(),
                &graph.name,
                &graph.version,
            )?;
        }
    }
    Ok(())
}

/// `samples/servepipeline.yaml`'s ServePipeline, its registry moved to `registry_port`.
pub fn sample_pipeline(registry_port: u16) -> anyhow::Result<serde_json::Value> {
    let mut pipeline = crate::api::yaml::documents(SAMPLE_PIPELINE_YAML)?
        .into_iter()
        .find(|d| d["kind"] == "ServePipeline")
        .ok_or_else(|| anyhow::anyhow!("samples/servepipeline.yaml has no ServePipeline"))?;
    // The registry's address, in whichever of `url` / `oci` the sample uses.
    for field in ["url", "oci"] {
        if let Some(address) = pipeline["spec"]["source"][field].as_str() {
            let moved = address.replace(
                &format!("127.0.0.1:{SAMPLE_REGISTRY_PORT}/"),
                &format!("127.0.0.1:{registry_port}/"),
            );
            pipeline["spec"]["source"][field] = serde_json::Value::String(moved);
        }
    }
    pipeline["metadata"]["namespace"] = SAMPLE_NAMESPACE.into();
    Ok(pipeline)
}

/// Where `raypipe dev` writes a Docker config with its registry's credentials.
/// Where `raypipe dev` records pipeline history (the `local` storage backend), kept across
/// restarts like the kubeconfig.
pub fn dev_history_dir() -> PathBuf {
    crate::devenv::binaries::cache_root()
        .join("dev")
        .join("history")
}

pub fn dev_docker_config_dir() -> PathBuf {
    crate::devenv::binaries::cache_root()
        .join("dev")
        .join("docker")
}

/// Starts a token-protected registry on 127.0.0.1 serving the sample graphs, creates a Secret
/// with the token and applies the sample ServePipeline that points at it.
async fn create_sample(
    client: &kube::Client,
    registry_port: u16,
) -> anyhow::Result<crate::devenv::registry::Registry> {
    use crate::api::ServePipeline;
    use anyhow::Context;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, Patch, PatchParams};

    let token = crate::devenv::random_token()?;
    let registry = crate::devenv::registry::Registry::start_on(registry_port, &token)
        .await
        .with_context(|| {
            format!("the sample registry cannot listen on 127.0.0.1:{registry_port} (another raypipe dev?); choose another with --registry-port")
        })?;
    for (file, bytes) in SAMPLE_GRAPHS {
        registry.put(&format!("graphs/{file}"), bytes.to_vec());
    }
    push_sample_graphs(&registry)?;
    let host = registry.addr.to_string();
    let docker_config = dev_docker_config(&host, &token);
    let credentials: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": SAMPLE_CREDENTIALS_SECRET, "namespace": SAMPLE_NAMESPACE},
        "stringData": {".dockerconfigjson": docker_config.to_string()}
    }))?;
    // The same credentials for `raypipe dag push` in the user's shell (DOCKER_CONFIG).
    let docker_dir = dev_docker_config_dir();
    std::fs::create_dir_all(&docker_dir)?;
    std::fs::write(docker_dir.join("config.json"), docker_config.to_string())?;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SAMPLE_TOKEN_SECRET, "namespace": SAMPLE_NAMESPACE},
        "stringData": {"token": token}
    }))?;
    let params = PatchParams::apply("raypipe-dev").force();
    let secrets = Api::<Secret>::namespaced(client.clone(), SAMPLE_NAMESPACE);
    secrets
        .patch(SAMPLE_TOKEN_SECRET, &params, &Patch::Apply(&secret))
        .await?;
    secrets
        .patch(
            SAMPLE_CREDENTIALS_SECRET,
            &params,
            &Patch::Apply(&credentials),
        )
        .await?;
    let pipeline: ServePipeline = serde_json::from_value(sample_pipeline(registry.addr.port())?)?;
    Api::<ServePipeline>::namespaced(client.clone(), SAMPLE_NAMESPACE)
        .patch(SAMPLE_PIPELINE, &params, &Patch::Apply(&pipeline))
        .await?;
    Ok(registry)
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    // Take Ctrl-C/SIGTERM from the very start: an interrupt during start-up must stop what has
    // been started, not kill raypipe and leave servers behind.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let signal = crate::controllers::shutdown_signal();
    tokio::spawn(async move {
        signal.await;
        let _ = stop_tx.send(true);
    });
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let kubeconfig = args.kubeconfig.clone().unwrap_or_else(|| {
        crate::devenv::binaries::cache_root()
            .join("dev")
            .join("kubeconfig")
    });
    // Before the controllers run, an interrupt abandons start-up (dropping what was started
    // stops it); after, `serve` itself stops in order on the same signal.
    let controllers_running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let serving = serve(args, &kubeconfig, stopped(), controllers_running.clone());
    tokio::pin!(serving);
    let result = tokio::select! {
        result = &mut serving => result,
        _ = stopped() => {
            if controllers_running.load(std::sync::atomic::Ordering::SeqCst) {
                serving.await
            } else {
                eprintln!("raypipe dev: interrupted during start-up");
                Ok(())
            }
        }
    };
    // Whichever way we got here, the control plane (owned by `serve`) has been dropped and so
    // stopped; remove the kubeconfig that pointed at it.
    let _ = std::fs::remove_file(&kubeconfig);
    eprintln!("raypipe dev: stopped");
    result
}

/// The dev console and the OpenID provider that signs its browsers in; both stop when dropped.
struct DevConsole {
    task: tokio::task::JoinHandle<()>,
    _issuer: crate::devenv::oidc::TestIssuer,
}

impl Drop for DevConsole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves the console on 127.0.0.1:`port`, browsers signed in by a local OpenID provider as
/// [`DEV_CONSOLE_USER`] (bearer tokens work as everywhere).
async fn start_console(
    client: &kube::Client,
    port: u16,
    dashboards: Option<crate::ray::DashboardLocator>,
) -> anyhow::Result<DevConsole> {
    use anyhow::Context;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| {
            format!("the console cannot listen on 127.0.0.1:{port} (another raypipe dev?); choose another with --console-port or use --no-console")
        })?;
    let url = format!("http://127.0.0.1:{port}");
    let client_id = "raypipe-console";
    let issuer =
        crate::devenv::oidc::TestIssuer::start(client_id, None, &format!("{url}/oauth2/callback"))
            .await?;
    issuer.set_user(DEV_CONSOLE_USER, &[DEV_CONSOLE_GROUP]);
    let config = crate::console::ConsoleConfig {
        listen: listener.local_addr()?,
        tls: None,
        audiences: Vec::new(),
        oidc: Some(crate::console::oidc::OidcSettings::new(
            &issuer.issuer(),
            client_id,
            &format!("{url}/oauth2/callback"),
        )),
        cookie_key: crate::console::cookie::CookieKey::generate()
            .map_err(|e| anyhow::anyhow!("the console's cookie key: {e}"))?,
        secure_cookies: false,
        history_url: None,
        dashboards,
        namespaces: Vec::new(),
        prometheus: None,
    };
    let client = client.clone();
    let task = tokio::spawn(async move {
        if let Err(e) =
            crate::console::serve_on(listener, client, config, std::future::pending()).await
        {
            eprintln!("raypipe dev: the console stopped: {e}");
        }
    });
    println!(
        "\nConsole: {url}/pipelines/{SAMPLE_NAMESPACE}/{SAMPLE_PIPELINE} (a local OpenID provider signs your browser in as {DEV_CONSOLE_USER}, group {DEV_CONSOLE_GROUP}); the JSON API takes Kubernetes bearer tokens:\n  curl -s -H \"Authorization: Bearer $(kubectl create token default)\" {url}/api/v1/pipelines   # lists what RBAC lets that account get"
    );
    Ok(DevConsole {
        task,
        _issuer: issuer,
    })
}

/// Starts everything and runs the controllers until `shutdown`.
async fn serve(
    args: DevArgs,
    kubeconfig: &std::path::Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    controllers_running: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<()> {
    let options = if args.minimal {
        ControlPlaneOptions::default()
    } else {
        ControlPlaneOptions::full()
    };
    let started = std::time::Instant::now();
    eprintln!("raypipe dev: starting a local control plane on 127.0.0.1 …");
    let plane = ControlPlane::start(options).await?;
    if let Some(parent) = kubeconfig.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(&plane.kubeconfig, kubeconfig)?;
    let kubectl = plane
        .binaries
        .kubectl
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "kubectl".to_owned());
    let pids: Vec<String> = plane
        .pids()
        .iter()
        .map(|(n, p)| format!("{n}={p}"))
        .collect();
    println!(
        "raypipe dev: ready in {:.1}s (API server {}; processes {})\n\n  export KUBECONFIG={}\n  alias kubectl={}\n  kubectl get crds\n  kubectl apply --server-side -f samples/ray-cluster.yaml -f samples/ray-job.yaml -f samples/ray-cronjob.yaml\n  # samples/ray-service.yaml needs github.com (its runtime_env downloads code from there)\n  kubectl get servepipelines,rayservices,rayclusters,pods -A\n\nPress Ctrl-C to stop everything.",
        started.elapsed().as_secs_f64(),
        plane.api_url,
        pids.join(" "),
        kubeconfig.display(),
        kubectl,
    );
    let client = plane.client().await?;
    let _registry = if args.no_sample {
        None
    } else {
        let registry = create_sample(&client, args.registry_port).await?;
        println!(
            "\nSample: ServePipeline {SAMPLE_NAMESPACE}/{SAMPLE_PIPELINE} follows {}/{SAMPLE_OCI_REPOSITORY}:{SAMPLE_OCI_TAG} (samples/servepipeline.yaml; credentials in Secret {SAMPLE_CREDENTIALS_SECRET}):\n  kubectl get servepipeline {SAMPLE_PIPELINE} -o yaml\n  kubectl get rayservice {SAMPLE_PIPELINE} -o jsonpath='{{.spec.serveConfigV2}}'",
            registry.addr
        );
        println!(
            "\nOCI: the same registry holds the sample graphs as OCI artifacts ({host}/samples/<name>:v1; Secret {SAMPLE_CREDENTIALS_SECRET}). Push a new version of the demo graph:\n  export DOCKER_CONFIG={}\n  raypipe dag push --plain-http samples/graphs/ensemble-v2.yaml {host}/{SAMPLE_OCI_REPOSITORY}:{SAMPLE_OCI_TAG}\n  raypipe dag pull --plain-http --format yaml {host}/{SAMPLE_OCI_REPOSITORY}:{SAMPLE_OCI_TAG}",
            dev_docker_config_dir().display(),
            host = registry.addr,
        );
        Some(registry)
    };
    let controllers = &args.controllers.controllers;
    let mut settings = crate::config::ControllerSettings::new(controllers);
    // `raypipe dev` runs every controller it is given; RayCronJob's needs its gate.
    if controllers.contains(&ControllerKind::Raycronjob) {
        settings.feature_gates = settings
            .feature_gates
            .clone()
            .with(crate::validation::feature_gates::gates::RAY_CRON_JOB, true);
    }
    // The sample registry and everything else `raypipe dev` starts listen on the loopback.
    settings.fetcher = crate::source::Fetcher::with_options(crate::source::FetcherOptions {
        allowed_destinations: crate::source::DestinationPolicy::with_loopback(),
        ..Default::default()
    });
    // Every pipeline revision is recorded, so a rollback can be read back afterwards.
    let history_dir = dev_history_dir();
    let history_env = [
        ("STORAGE_BACKEND".to_owned(), "local".to_owned()),
        (
            "RAYPIPE_HISTORY_LOCAL_DIR".to_owned(),
            history_dir.display().to_string(),
        ),
    ]
    .into_iter()
    .collect();
    settings.history = Some(crate::history::recorder::RecorderConfig {
        store: crate::history::revisions::RevisionStore::from_env(&history_env)?,
        default_retention: Default::default(),
    });
    println!(
        "\nHistory: every pipeline revision (its config, rollout steps, gate readings, decision) is recorded under {dir}:\n  export STORAGE_BACKEND=local RAYPIPE_HISTORY_LOCAL_DIR={dir}\n  raypipe history revisions {SAMPLE_NAMESPACE}/{SAMPLE_PIPELINE}",
        dir = history_dir.display(),
    );
    let ray_heads = if args.no_ray {
        None
    } else {
        eprintln!("raypipe dev: starting a local Ray head on 127.0.0.1 …");
        // The custom resource samples/ray-job.yaml's driver reserves, as its RayCluster's
        // head would offer it.
        let options = crate::devenv::ray::RayHeadOptions {
            resources: [("driver_slot".to_owned(), 4.0)].into_iter().collect(),
            ..Default::default()
        };
        let head = crate::devenv::ray::RayHead::start(options.clone()).await?;
        // The runtime, the sample models and teams' code layers (`dag push --code`), as the
        // operator's admin port serves them on a cluster.
        let (uris, base) =
            serve_packages_with_code(dev_packages(), settings.code_store.clone()).await?;
        settings.runtime_py_modules = uris;
        settings.code_base_url = Some(base);
        // RayJobs of every cluster run on the first local head.
        settings.ray_dashboard_url = Some(head.dashboard_url().as_str().to_owned());
        println!(
            "\nRay: dashboard {} ; Serve answers on {} once the pipeline is Ready:\n  kubectl wait servepipeline/{SAMPLE_PIPELINE} --for=condition=Ready --timeout=300s\n  curl -s -X POST {}/demo -H 'content-type: application/json' -d '{{\"text\": \"I love this, great and fast\"}}'\nEvery further RayService gets a local Ray head of its own (at most {}); raypipe dev prints where its Serve answers.",
            head.dashboard_url(),
            head.serve_url(),
            head.serve_url(),
            heads::MAX_HEADS,
        );
        // Every further RayService gets a head of its own (the first one the first).
        let pool = heads::HeadPool::new(&client, head, options);
        settings.rayservice = Some(pooled_rayservice_config(&pool));
        // Canary routers' counters: through the Serve proxy of the pipeline's own head.
        settings.serve_locator_override = Some(pool.serve_locator());
        Some(pool)
    };
    let console = if args.no_console {
        None
    } else {
        let dashboards = settings.rayservice.as_ref().map(|c| c.dashboard.clone());
        Some(start_console(&client, args.console_port, dashboards).await?)
    };
    // However `serve` ends, the heads stop before the control plane.
    let stop_heads = ray_heads.map(heads::StopOnDrop);
    controllers_running.store(true, std::sync::atomic::Ordering::SeqCst);
    let result = crate::controllers::run(client, settings.plan()?, shutdown).await;
    drop(console);
    drop(stop_heads);
    eprintln!("raypipe dev: stopping the control plane …");
    drop(plane);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_sample_graphs_are_seeded_as_oci_artifacts_under_the_demo_tag() {
        let registry = crate::devenv::registry::Registry::http("127.0.0.1", None).await;
        push_sample_graphs(&registry).expect("seeded");
        crate::startup::init_crypto();
        let client = reqwest::Client::new();
        let manifest = registry.url(&format!(
            "v2/{SAMPLE_OCI_REPOSITORY}/manifests/{SAMPLE_OCI_TAG}"
        ));
        let answer = client.get(&manifest).send().await.expect("answers");
        assert_eq!(answer.status(), 200);
        let body = answer.bytes().await.expect("body");
        let parsed = crate::source::oci::manifest::Manifest::parse(&body).expect("a manifest");
        assert_eq!(
            parsed.annotations[crate::source::oci::manifest::ANNOTATION_GRAPH_NAME],
            "ensemble"
        );
        let tags = client
            .get(registry.url("v2/samples/switch-canary/tags/list"))
            .send()
            .await
            .expect("answers");
        assert_eq!(tags.status(), 200);
    }

    #[test]
    fn the_sample_pipeline_is_the_file_and_follows_the_registry_port() {
        let printed = sample_pipeline(SAMPLE_REGISTRY_PORT).expect("the sample parses");
        assert_eq!(printed["metadata"]["name"], SAMPLE_PIPELINE);
        assert_eq!(
            printed["spec"]["source"]["oci"],
            format!("127.0.0.1:8787/{SAMPLE_OCI_REPOSITORY}:{SAMPLE_OCI_TAG}")
        );
        assert_eq!(
            printed["spec"]["source"]["credentialsSecretRef"]["name"],
            SAMPLE_CREDENTIALS_SECRET
        );
        let moved = sample_pipeline(18080).expect("the sample parses");
        assert_eq!(
            moved["spec"]["source"]["oci"],
            format!("127.0.0.1:18080/{SAMPLE_OCI_REPOSITORY}:{SAMPLE_OCI_TAG}")
        );
        serde_json::from_value::<crate::api::ServePipeline>(moved).expect("a valid ServePipeline");
    }
}
