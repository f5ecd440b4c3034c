//! A real Kueue manager (the [`KUEUE_VERSION`] release, built from its Go module) for the Kueue
//! scenario tests, on a control plane of its own: Kueue's webhooks intercept every `ray.io`
//! object, which would disturb the tests sharing [`super::control_plane`].
//!
//! What the harness sets up, and why:
//! - Kueue's CRDs, straight from the module (`config/components/crd/bases`), and the AppWrapper
//!   CRD from the AppWrapper module ([`APPWRAPPER_VERSION`], `config/crd/bases`) before Kueue
//!   starts; raypipe's own CRDs come with the control plane. No raypipe controller runs there:
//!   tests that want one start it themselves on [`Kueue::client`].
//! - Kueue's webhook configurations from the module (`config/components/webhook/manifests.yaml`),
//!   keeping only the `ray.io`, `kueue.x-k8s.io` and `workload.codeflare.dev` (AppWrapper)
//!   webhooks (the others name CRDs this cluster lacks, and a Pod webhook would slow every Pod),
//!   each addressed by URL on 127.0.0.1 instead of a Service: nothing may leave the loopback
//!   here.
//! - The manager runs with the admin kubeconfig (no RBAC needed), no leader election, its own
//!   certificate management off: the webhook serves the control plane's serving certificate
//!   (IP SAN 127.0.0.1, signed by the plane's CA, which becomes the `caBundle`). Kueue then
//!   insists on reading its metrics certificate from the fixed `/etc/kueue/metrics/certs`, so it
//!   runs in a private mount namespace where `/etc` is an overlay holding that directory (the
//!   host's `/etc` is untouched; like the Ray head's private mounts, this needs root).
//! - Integrations: `ray.io/rayjob`, `ray.io/raycluster`, `ray.io/rayservice`,
//!   `workload.codeflare.dev/appwrapper`, and only objects with a `kueue.x-k8s.io/queue-name`
//!   label are managed (`manageJobsWithoutQueueName: false`). The visibility API server is off
//!   (it would listen on all interfaces).
//! - The AppWrapper controller ([`appwrapper_controller`], started by the first test that asks)
//!   runs beside Kueue on the same plane: admin kubeconfig, its configuration from a ConfigMap
//!   created first, its own webhooks off (they would listen on all interfaces, port 9443; Kueue's
//!   AppWrapper webhooks, which suspend a queued AppWrapper, are kept), metrics and health on
//!   127.0.0.1, no leader election, no Autopilot node monitoring.
//!
//! Capacity: the plane's one kwok Node ([`KWOK_NODE`](raypipe::devenv::control_plane::KWOK_NODE))
//! offers 1k CPUs, 1 TiB and 1M Pods, so admission is decided by the ClusterQueue quotas tests
//! set ([`queue`]), never by the Node.
//!
//! Timing here: the control plane starts in ~9 s, Kueue answers through its webhook ~2 s later,
//! and [`start`] then waits (~20 s) until the garbage collector deletes orphaned Workloads,
//! which is what frees a deleted job's quota.

// The scenario tests each use a part of this API; not every build uses all of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use raypipe::devenv::control_plane::{ControlPlane, ControlPlaneOptions};
use raypipe::devenv::process::ManagedProcess;
use serde_json::{Value, json};

use super::tools::{APPWRAPPER_MODULE, APPWRAPPER_VERSION, KUEUE_VERSION};

/// The label that puts a job into a LocalQueue.
pub const QUEUE_NAME_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// The label that gives a job a WorkloadPriorityClass.
pub const PRIORITY_CLASS_LABEL: &str = "kueue.x-k8s.io/priority-class";
/// The ResourceFlavor every ClusterQueue made by [`queue`] uses.
pub const FLAVOR: &str = "default";
/// The label the AppWrapper controller puts on its components and into the Pod templates its
/// AppWrappers declare (`podSets`), naming the AppWrapper: how it counts the Pods it runs.
pub const APPWRAPPER_LABEL: &str = "workload.codeflare.dev/appwrapper";
/// Where the AppWrapper controller runs and reads its configuration ConfigMap.
pub const APPWRAPPER_NAMESPACE: &str = "appwrapper-system";
/// The AppWrapper controller's configuration ConfigMap (its `--config`).
const APPWRAPPER_CONFIG_MAP: &str = "appwrapper-operator-config";
/// Field manager of the objects the harness applies.
const FIELD_MANAGER: &str = "raypipe-kueue-tests";
/// How long start-up steps (CRDs, readiness, the webhook probe) may take.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(90);

/// A running Kueue manager and the control plane it manages. Dropping it stops Kueue, then the
/// plane (fields drop in declaration order).
pub struct Kueue {
    process: ManagedProcess,
    /// Kueue's own control plane (never the shared one).
    pub plane: ControlPlane,
    /// The Kueue module's source directory (CRDs, webhook manifests).
    pub module_dir: PathBuf,
    /// Where Kueue's webhook server listens on 127.0.0.1.
    pub webhook_port: u16,
    /// Kueue's readyz/healthz endpoint, `http://127.0.0.1:<port>`.
    pub health_url: String,
    /// Kueue's log (JSON lines).
    pub log: PathBuf,
    /// How long starting took: the control plane, then Kueue until its webhook answered (the
    /// garbage collector's wait after that is in neither).
    pub plane_startup: Duration,
    pub kueue_startup: Duration,
}

impl Kueue {
    /// A client for the current test's runtime (clients hold connections tied to one runtime).
    pub async fn client(&self) -> kube::Client {
        self.plane
            .client()
            .await
            .expect("a client for Kueue's control plane")
    }

    /// The last `lines` of Kueue's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Kueue's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// The Kueue every Kueue test in this binary shares, started by the first test that asks. Tests
/// keep apart by namespace and by ClusterQueue/LocalQueue names of their own.
pub fn shared() -> &'static Kueue {
    static KUEUE: OnceLock<Result<Kueue, String>> = OnceLock::new();
    // A failed start is remembered, so the other tests fail fast with the same message.
    match KUEUE.get_or_init(start) {
        Ok(kueue) => kueue,
        Err(e) => panic!("Kueue failed to start: {e}"),
    }
}

/// A client of the shared Kueue's control plane for the current test's runtime.
pub async fn client() -> kube::Client {
    shared().client().await
}

/// A running AppWrapper controller (project-codeflare/appwrapper, [`APPWRAPPER_VERSION`], built
/// from its Go module) on a Kueue's control plane. Dropping it stops the process.
pub struct AppWrapperController {
    process: ManagedProcess,
    /// Its health endpoint (`/healthz`), `http://127.0.0.1:<port>`. Never ask its `/readyz`:
    /// that check starts the webhook server, which listens on all interfaces.
    pub health_url: String,
    /// Its metrics endpoint (HTTPS, authenticated) on 127.0.0.1.
    pub metrics_port: u16,
    /// Its log (zap console lines).
    pub log: PathBuf,
    /// From the process start until it had reconciled a probe AppWrapper.
    pub startup: Duration,
}

impl AppWrapperController {
    /// The last `lines` of its log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// The AppWrapper controller every AppWrapper test in this binary shares, on the [`shared`]
/// Kueue's plane, started (and built, once per machine) by the first test that asks.
pub fn appwrapper_controller() -> &'static AppWrapperController {
    static CONTROLLER: OnceLock<Result<AppWrapperController, String>> = OnceLock::new();
    match CONTROLLER.get_or_init(|| start_appwrapper_controller(shared())) {
        Ok(controller) => controller,
        Err(e) => panic!("the AppWrapper controller failed to start: {e}"),
    }
}

/// The AppWrapper controller's configuration (its ConfigMap's `config.yaml`, over the
/// controller's defaults): its webhooks off (their server's port is fixed at 9443 on all
/// interfaces), metrics and health on 127.0.0.1, no leader election, no Autopilot (no Node
/// monitor, no injected anti-affinities), no default queue (the AppWrapper names its queue), the
/// fault-tolerance defaults kept.
fn appwrapper_configuration(metrics_port: u16, health_port: u16) -> String {
    json!({
        "webhooksEnabled": false,
        "appwrapper": {
            "autopilot": {"injectAntiAffinities": false, "monitorNodes": false},
            "userRBACAdmissionCheck": false,
            "defaultQueueName": ""
        },
        "controllerManager": {
            "metrics": {"bindAddress": format!("127.0.0.1:{metrics_port}")},
            "health": {"bindAddress": format!("127.0.0.1:{health_port}")},
            "leaderElection": false
        }
    })
    .to_string()
}

/// Starts the AppWrapper controller against `kueue`'s plane with the admin kubeconfig; returns
/// once its `/healthz` answers and it has reconciled a probe AppWrapper (phase `Suspended`).
/// Builds it first on a machine that never did (minutes).
pub fn start_appwrapper_controller(kueue: &Kueue) -> Result<AppWrapperController, String> {
    let binary = super::tools::appwrapper().to_owned();
    // Its own runtime on its own thread, as for Kueue: clients are tied to one runtime.
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("a runtime for the AppWrapper controller: {e}"))?;
                rt.block_on(start_appwrapper_on(kueue, &binary))
            })
            .join()
            .map_err(|_| "the AppWrapper controller's start-up panicked".to_owned())?
    })
}

async fn start_appwrapper_on(kueue: &Kueue, binary: &Path) -> Result<AppWrapperController, String> {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    let client = kueue.client().await;
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": APPWRAPPER_NAMESPACE}}))
            .map_err(|e| e.to_string())?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(format!("create namespace {APPWRAPPER_NAMESPACE}: {e}")),
    }
    let metrics_port = free_port()?;
    let health_port = free_port()?;
    // The controller reads its ConfigMap at start (and would write its defaults, metrics and
    // health on all interfaces, into a missing one).
    let config_map: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": APPWRAPPER_CONFIG_MAP, "namespace": APPWRAPPER_NAMESPACE},
        "data": {"config.yaml": appwrapper_configuration(metrics_port, health_port)}
    }))
    .map_err(|e| e.to_string())?;
    Api::<ConfigMap>::namespaced(client.clone(), APPWRAPPER_NAMESPACE)
        .patch(
            APPWRAPPER_CONFIG_MAP,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&config_map),
        )
        .await
        .map_err(|e| format!("apply the AppWrapper controller's ConfigMap: {e}"))?;

    let log = kueue.plane.dir.join("appwrapper.log");
    let started = Instant::now();
    let mut process = ManagedProcess::start_with_env(
        "appwrapper",
        binary,
        &[
            format!("--config={APPWRAPPER_CONFIG_MAP}"),
            format!("--kubeconfig={}", kueue.plane.kubeconfig.display()),
            "--zap-devel=false".to_owned(),
            "--zap-log-level=info".to_owned(),
        ],
        &[("NAMESPACE", APPWRAPPER_NAMESPACE)],
        &log,
    )
    .map_err(|e| e.to_string())?;
    let failed = |process: &ManagedProcess, what: String| {
        format!(
            "{what}; the AppWrapper controller's log ({}) ends with:\n{}",
            log.display(),
            process.log_tail(40)
        )
    };
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while !answers_ok(health_port, "/healthz").await {
        if let Some(status) = process.exited() {
            return Err(failed(&process, format!("it exited ({status})")));
        }
        if Instant::now() > deadline {
            return Err(failed(&process, "its healthz never answered".into()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its controllers start after the manager: wait until one has reconciled an AppWrapper.
    loop {
        let Err(probe_error) = probe_appwrapper_controller(&client).await else {
            break;
        };
        if let Some(status) = process.exited() {
            return Err(failed(&process, format!("it exited ({status})")));
        }
        if Instant::now() > deadline {
            return Err(failed(
                &process,
                format!("it never reconciled a probe AppWrapper: {probe_error}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let startup = started.elapsed();
    eprintln!(
        "AppWrapper controller {APPWRAPPER_VERSION} ready in {:.1}s; log {}",
        startup.as_secs_f64(),
        log.display()
    );
    Ok(AppWrapperController {
        process,
        health_url: format!("http://127.0.0.1:{health_port}"),
        metrics_port,
        log,
        startup,
    })
}

/// A suspended AppWrapper (no queue: Kueue leaves it alone) wrapping a ConfigMap: Ok once the
/// controller has moved it to phase `Suspended`, then it is deleted.
async fn probe_appwrapper_controller(client: &kube::Client) -> Result<(), String> {
    let name = "appwrapper-controller-probe";
    let api = appwrappers(client, APPWRAPPER_NAMESPACE);
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": name},
        "spec": {
            "suspend": true,
            "components": [{"template": {
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}
            }}]
        }
    }))
    .map_err(|e| e.to_string())?;
    match api.create(&PostParams::default(), &probe).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(format!("create the probe AppWrapper: {e}")),
    }
    let found = api.get(name).await.map_err(|e| e.to_string())?;
    match found.data["status"]["phase"].as_str() {
        Some("Suspended") => {
            api.delete(name, &Default::default())
                .await
                .map_err(|e| format!("delete the probe AppWrapper: {e}"))?;
            Ok(())
        }
        other => Err(format!("its phase is {other:?}")),
    }
}

/// Starts a control plane and a Kueue manager on it; returns once Kueue's readyz answers, a
/// dry-run create of a labelled RayCluster comes back suspended (the API server really reaches
/// Kueue's mutating webhook), and the garbage collector deletes Workloads whose owner is gone.
/// Builds Kueue first on a machine that never did (minutes).
pub fn start() -> Result<Kueue, String> {
    let binary = super::tools::kueue().to_owned();
    let module_dir = module_dir()?;
    let appwrapper_dir = appwrapper_module_dir()?;
    let plane_started = Instant::now();
    let plane = super::start_control_plane_with(ControlPlaneOptions::full())?;
    let plane_startup = plane_started.elapsed();
    // Its own runtime on its own thread, like the control plane: nothing Kueue needs may live on
    // a test's runtime, which ends with the test.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime for Kueue's start-up: {e}"))?;
        rt.block_on(start_on(
            plane,
            plane_startup,
            &binary,
            module_dir,
            &appwrapper_dir,
        ))
    })
    .join()
    .map_err(|_| "Kueue's start-up panicked".to_owned())?
}

/// The Kueue module's directory: `$RAYPIPE_KUEUE_MODULE`, else what `go mod download` reports
/// (the module cache; downloaded once per machine).
pub fn module_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("RAYPIPE_KUEUE_MODULE") {
        return Ok(PathBuf::from(dir));
    }
    let output = Command::new("go")
        .args(["mod", "download", "-json"])
        .arg(format!("sigs.k8s.io/kueue@{KUEUE_VERSION}"))
        .env("GOTOOLCHAIN", "local")
        .current_dir(std::env::temp_dir())
        .output()
        .map_err(|e| format!("`go mod download` cannot run ({e}); set RAYPIPE_KUEUE_MODULE"))?;
    let info: Value = serde_json::from_slice(&output.stdout).map_err(|e| {
        format!(
            "`go mod download -json` printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    match info["Dir"].as_str() {
        Some(dir) if output.status.success() => Ok(PathBuf::from(dir)),
        _ => Err(format!("downloading the Kueue module failed: {info}")),
    }
}

/// The AppWrapper module's directory: `$RAYPIPE_APPWRAPPER_MODULE`, else what `go mod download`
/// reports (the module cache; Kueue's own build downloads it too).
pub fn appwrapper_module_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("RAYPIPE_APPWRAPPER_MODULE") {
        return Ok(PathBuf::from(dir));
    }
    super::tools::go_module_dir(APPWRAPPER_MODULE, APPWRAPPER_VERSION)
        .map_err(|e| format!("{e}; set RAYPIPE_APPWRAPPER_MODULE"))
}

async fn start_on(
    plane: ControlPlane,
    plane_startup: Duration,
    binary: &Path,
    module_dir: PathBuf,
    appwrapper_dir: &Path,
) -> Result<Kueue, String> {
    let started = Instant::now();
    let client = plane.client().await.map_err(|e| e.to_string())?;
    install_kueue_crds(&client, &module_dir).await?;
    // Kueue sets up an integration only for a kind the API server serves.
    install_appwrapper_crd(&client, appwrapper_dir).await?;

    let dir = plane.dir.join("kueue");
    let certs = dir.join("certs");
    let etc_overlay = dir.join("etc-overlay");
    for d in [&certs, &etc_overlay] {
        std::fs::create_dir_all(d).map_err(|e| format!("create {}: {e}", d.display()))?;
    }
    // The plane's serving certificate names 127.0.0.1: the API server verifies the webhook
    // against its URL's host.
    for (from, to) in [("apiserver.crt", "tls.crt"), ("apiserver.key", "tls.key")] {
        std::fs::copy(plane.dir.join(from), certs.join(to))
            .map_err(|e| format!("copy the serving certificate's {from}: {e}"))?;
    }
    let webhook_port = free_port()?;
    let health_port = free_port()?;
    let metrics_port = free_port()?;
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        configuration(&certs, webhook_port, metrics_port, health_port),
    )
    .map_err(|e| format!("write {}: {e}", config.display()))?;

    let log = plane.dir.join("kueue.log");
    let args = private_etc_command(
        &etc_overlay,
        &certs,
        binary,
        &[
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", plane.kubeconfig.display()),
        ],
    );
    let mut process = ManagedProcess::start("kueue", Path::new("/usr/bin/unshare"), &args, &log)
        .map_err(|e| e.to_string())?;
    let health_url = format!("http://127.0.0.1:{health_port}");
    let failed = |process: &ManagedProcess, what: String| {
        format!(
            "{what}; Kueue's log ({}) ends with:\n{}",
            log.display(),
            process.log_tail(40)
        )
    };

    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while !answers_ok(health_port, "/readyz").await {
        if let Some(status) = process.exited() {
            return Err(failed(&process, format!("Kueue exited ({status})")));
        }
        if Instant::now() > deadline {
            return Err(failed(&process, "Kueue's readyz never answered".into()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (mutating, validating) = webhook_configurations(&module_dir, webhook_port, &plane.ca_pem)?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let name = |o: &Value| {
        o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let mutating_api = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let typed: MutatingWebhookConfiguration =
        serde_json::from_value(mutating.clone()).map_err(|e| e.to_string())?;
    mutating_api
        .patch(&name(&mutating), &params, &Patch::Apply(&typed))
        .await
        .map_err(|e| format!("apply Kueue's mutating webhooks: {e}"))?;
    let validating_api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let typed: ValidatingWebhookConfiguration =
        serde_json::from_value(validating.clone()).map_err(|e| e.to_string())?;
    validating_api
        .patch(&name(&validating), &params, &Patch::Apply(&typed))
        .await
        .map_err(|e| format!("apply Kueue's validating webhooks: {e}"))?;

    // The API server picks up webhook configurations asynchronously: probe until Kueue's
    // mutating webhook has suspended a labelled RayCluster.
    loop {
        let Err(probe_error) = probe_webhook(&client).await else {
            break;
        };
        if let Some(status) = process.exited() {
            return Err(failed(&process, format!("Kueue exited ({status})")));
        }
        if Instant::now() > deadline {
            return Err(failed(
                &process,
                format!("Kueue's webhook never suspended a probe RayCluster: {probe_error}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let kueue_startup = started.elapsed();
    let collecting = Instant::now();
    if let Err(e) = wait_for_workload_garbage_collection(&client).await {
        return Err(failed(&process, e));
    }
    eprintln!(
        "Kueue {KUEUE_VERSION} ready: control plane in {:.1}s, then Kueue (CRDs, manager, \
         webhook) in {:.1}s, then the garbage collector in {:.1}s; log {}",
        plane_startup.as_secs_f64(),
        kueue_startup.as_secs_f64(),
        collecting.elapsed().as_secs_f64(),
        log.display()
    );
    Ok(Kueue {
        process,
        plane,
        module_dir,
        webhook_port,
        health_url,
        log,
        plane_startup,
        kueue_startup,
    })
}

/// Waits until kube-controller-manager's garbage collector deletes a Workload whose owner is
/// gone. Kueue frees a deleted job's quota only when that Workload goes, and the collector
/// watches a new CRD's kind only after its next discovery resync (every 30 s): without this
/// wait, the first test to delete a job would wait for that resync instead.
async fn wait_for_workload_garbage_collection(client: &kube::Client) -> Result<(), String> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let name = "kueue-gc-canary";
    let owners = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let owner: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name}})).map_err(|e| e.to_string())?;
    let owner = owners
        .create(&PostParams::default(), &owner)
        .await
        .map_err(|e| format!("create the garbage-collection canary's owner: {e}"))?;
    let workload: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": owner.metadata.uid
            }]
        },
        "spec": {
            "queueName": name,
            "podSets": [{
                "name": "main",
                "count": 1,
                "template": {"spec": {"containers": [{
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "1m"}}
                }]}}
            }]
        }
    }))
    .map_err(|e| e.to_string())?;
    let workloads = workload_api(client, "default");
    workloads
        .create(&PostParams::default(), &workload)
        .await
        .map_err(|e| format!("create the garbage-collection canary Workload: {e}"))?;
    owners
        .delete(name, &Default::default())
        .await
        .map_err(|e| format!("delete the garbage-collection canary's owner: {e}"))?;
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        match workloads.get_opt(name).await {
            Ok(None) => return Ok(()),
            Ok(Some(_)) if Instant::now() > deadline => {
                return Err("the garbage collector never deleted an orphaned Workload".into());
            }
            Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(250)).await,
            Err(e) => return Err(format!("read the garbage-collection canary Workload: {e}")),
        }
    }
}

/// Kueue's Configuration: everything on 127.0.0.1, certificates from `certs`, no leader
/// election, the Ray and AppWrapper integrations only.
fn configuration(certs: &Path, webhook_port: u16, metrics_port: u16, health_port: u16) -> String {
    let config = json!({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "manageJobsWithoutQueueName": false,
        "internalCertManagement": {"enable": false},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": certs},
        "metrics": {"bindAddress": format!("127.0.0.1:{metrics_port}")},
        "health": {"healthProbeBindAddress": format!("127.0.0.1:{health_port}")},
        "leaderElection": {"leaderElect": false},
        // On by default, it would serve on 0.0.0.0:8082.
        "featureGates": {"VisibilityOnDemand": false},
        "integrations": {
            "frameworks": [
                "ray.io/rayjob",
                "ray.io/raycluster",
                "ray.io/rayservice",
                "workload.codeflare.dev/appwrapper"
            ]
        }
    });
    // JSON is YAML.
    config.to_string()
}

/// `unshare` arguments that run `binary args…` in a private mount namespace whose `/etc` is an
/// overlay (on a private tmpfs mounted at `overlay_dir`) with `certs` at
/// `/etc/kueue/metrics/certs`, where Kueue reads its metrics certificate when it does not
/// manage certificates itself. `exec` keeps the process id, so [`ManagedProcess`] (its
/// parent-death signal, its stop) still reaches Kueue itself.
fn private_etc_command(
    overlay_dir: &Path,
    certs: &Path,
    binary: &Path,
    args: &[String],
) -> Vec<String> {
    let script = "set -e; \
        mount -t tmpfs raypipe-kueue \"$1\"; mkdir \"$1/upper\" \"$1/work\"; \
        mount -t overlay raypipe-kueue \
            -o \"lowerdir=/etc,upperdir=$1/upper,workdir=$1/work\" /etc; \
        mkdir -p /etc/kueue/metrics/certs; mount --bind \"$2\" /etc/kueue/metrics/certs; \
        shift 2; exec \"$@\"";
    let mut full: Vec<String> = ["--mount", "--propagation", "private", "/bin/sh", "-c"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    full.push(script.to_owned());
    full.push("kueue".to_owned());
    full.push(overlay_dir.display().to_string());
    full.push(certs.display().to_string());
    full.push(binary.display().to_string());
    full.extend(args.iter().cloned());
    full
}

/// Applies the module's CRDs and waits until the API server serves Workloads (Kueue gives up at
/// start when a kind it indexes is not discoverable yet).
async fn install_kueue_crds(client: &kube::Client, module_dir: &Path) -> Result<(), String> {
    let bases = module_dir.join("config/components/crd/bases");
    install_module_crds(client, &bases, "kueue.x-k8s.io", "Workload").await
}

/// Applies the AppWrapper CRD from the AppWrapper module and waits until the API server serves
/// `workload.codeflare.dev/v1beta2` AppWrappers.
async fn install_appwrapper_crd(client: &kube::Client, module_dir: &Path) -> Result<(), String> {
    let bases = module_dir.join("config/crd/bases");
    install_module_crds(client, &bases, "workload.codeflare.dev", "AppWrapper").await
}

/// Applies the CRDs in a module's directory `bases` and waits until discovery lists `kind` at
/// `group`/v1beta2.
async fn install_module_crds(
    client: &kube::Client,
    bases: &Path,
    group: &str,
    kind: &str,
) -> Result<(), String> {
    let crds: Vec<CustomResourceDefinition> = super::yaml_documents(bases)
        .into_iter()
        .filter(|(_, doc)| doc["kind"] == "CustomResourceDefinition")
        .map(|(file, doc)| serde_json::from_value(doc).map_err(|e| format!("{file}: {e}")))
        .collect::<Result<_, _>>()?;
    if crds.is_empty() {
        return Err(format!("no CRDs in {}", bases.display()));
    }
    raypipe::devenv::control_plane::install_crds(client, &crds, STARTUP_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        let discovery = kube::Discovery::new(client.clone())
            .filter(&[group])
            .run()
            .await;
        let served = discovery.is_ok_and(|d| {
            d.groups()
                .flat_map(|g| g.versioned_resources("v1beta2"))
                .any(|(resource, _)| resource.kind == kind)
        });
        if served {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the API server never listed {group}/v1beta2 {kind}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The module's webhook configurations, renamed for this harness, with only the `ray.io`,
/// `kueue.x-k8s.io` and `workload.codeflare.dev` webhooks, each pointed at
/// `https://127.0.0.1:<port><path>` and trusting the plane's CA. Returns (mutating, validating).
pub fn webhook_configurations(
    module_dir: &Path,
    port: u16,
    ca_pem: &str,
) -> Result<(Value, Value), String> {
    use base64::Engine;
    let file = module_dir.join("config/components/webhook/manifests.yaml");
    let text =
        std::fs::read_to_string(&file).map_err(|e| format!("read {}: {e}", file.display()))?;
    let docs = raypipe::api::yaml::documents(&text).map_err(|e| format!("{file:?}: {e}"))?;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let kept_groups = ["ray.io", "kueue.x-k8s.io", "workload.codeflare.dev"];
    let mut mutating = None;
    let mut validating = None;
    for mut doc in docs {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        doc["metadata"] = json!({"name": format!("raypipe-test-kueue-{name}")});
        let webhooks: Vec<Value> = doc["webhooks"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|webhook| {
                webhook["rules"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|rule| rule["apiGroups"].as_array().cloned().unwrap_or_default())
                    .all(|group| group.as_str().is_some_and(|g| kept_groups.contains(&g)))
            })
            .map(|mut webhook| {
                let path = webhook["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap_or("/")
                    .to_owned();
                webhook["clientConfig"] = json!({
                    "url": format!("https://127.0.0.1:{port}{path}"),
                    "caBundle": ca_bundle,
                });
                webhook
            })
            .collect();
        doc["webhooks"] = Value::Array(webhooks);
        match doc["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => mutating = Some(doc),
            Some("ValidatingWebhookConfiguration") => validating = Some(doc),
            _ => {}
        }
    }
    match (mutating, validating) {
        (Some(m), Some(v)) => Ok((m, v)),
        _ => Err(format!("{} lacks a webhook configuration", file.display())),
    }
}

/// A dry-run create of a RayCluster in a queue: Ok once it comes back suspended.
async fn probe_webhook(client: &kube::Client) -> Result<(), String> {
    let probe = ray_cluster(
        "kueue-webhook-probe",
        "kueue-webhook-probe",
        "100m",
        "128Mi",
    );
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let created = ray_clusters(client, "default")
        .create(&params, &probe)
        .await
        .map_err(|e| e.to_string())?;
    match created.data["spec"]["suspend"].as_bool() {
        Some(true) => Ok(()),
        other => Err(format!("spec.suspend came back as {other:?}")),
    }
}

/// `GET path` on 127.0.0.1:`port` answers 200.
async fn answers_ok(port: u16, path: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response).await;
    response
        .lines()
        .next()
        .is_some_and(|status| status.split_whitespace().nth(1) == Some("200"))
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("a free loopback port: {e}"))
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// `ray.io/v1` RayClusters in `ns`.
pub fn ray_clusters(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &resource("ray.io", "v1", "RayCluster", "rayclusters"),
    )
}

/// `workload.codeflare.dev/v1beta2` AppWrappers in `ns`.
pub fn appwrappers(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &resource(
            "workload.codeflare.dev",
            "v1beta2",
            "AppWrapper",
            "appwrappers",
        ),
    )
}

/// `kueue.x-k8s.io/v1beta2` Workloads in `ns`.
pub fn workload_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &resource("kueue.x-k8s.io", "v1beta2", "Workload", "workloads"),
    )
}

/// `kueue.x-k8s.io/v1beta2` ClusterQueues.
pub fn cluster_queue_api(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &resource("kueue.x-k8s.io", "v1beta2", "ClusterQueue", "clusterqueues"),
    )
}

/// A RayCluster in `local_queue` with a head and one worker group of one replica, each container
/// requesting `cpu` and `memory`.
pub fn ray_cluster(name: &str, local_queue: &str, cpu: &str, memory: &str) -> DynamicObject {
    let container = |name: &str| {
        json!({
            "name": name,
            "image": "rayproject/ray:2.52.0",
            "resources": {"requests": {"cpu": cpu, "memory": memory}}
        })
    };
    serde_json::from_value(json!({
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "labels": {QUEUE_NAME_LABEL: local_queue}},
        "spec": {
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {"containers": [container("ray-head")]}}
            },
            "workerGroupSpecs": [{
                "groupName": "workers",
                "replicas": 1,
                "minReplicas": 1,
                "maxReplicas": 1,
                "rayStartParams": {},
                "template": {"spec": {"containers": [container("ray-worker")]}}
            }]
        }
    }))
    .expect("a valid RayCluster")
}

/// Server-side applies `object` through `api` with the harness's field manager.
async fn apply(api: &Api<DynamicObject>, object: Value) {
    let name = object["metadata"]["name"]
        .as_str()
        .expect("a named object")
        .to_owned();
    let kind = object["kind"].clone();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
}

/// The ClusterQueue's resource groups for `quota`: one group covering cpu, memory and every
/// resource `quota` names (a covered resource missing from `quota` gets 0), flavor [`FLAVOR`].
fn resource_groups(quota: &[(&str, &str)]) -> Value {
    let mut covered = vec!["cpu", "memory"];
    for (resource, _) in quota {
        if !covered.contains(resource) {
            covered.push(resource);
        }
    }
    let resources: Vec<Value> = covered
        .iter()
        .map(|resource| {
            let nominal = quota
                .iter()
                .find(|(r, _)| r == resource)
                .map_or("0", |(_, q)| *q);
            json!({"name": resource, "nominalQuota": nominal})
        })
        .collect();
    json!([{
        "coveredResources": covered,
        "flavors": [{"name": FLAVOR, "resources": resources}]
    }])
}

/// A LocalQueue `local_queue` in `ns` feeding ClusterQueue `cluster_queue`, which admits up to
/// `quota` (e.g. `[("cpu", "2"), ("memory", "4Gi")]`) from any namespace and preempts lower
/// priority Workloads within itself; the shared ResourceFlavor [`FLAVOR`] is created if absent.
/// Applied, so calling it again with the same names updates the queues.
pub async fn queue(
    client: &kube::Client,
    ns: &str,
    local_queue: &str,
    cluster_queue: &str,
    quota: &[(&str, &str)],
) {
    let flavors: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "kueue.x-k8s.io",
            "v1beta2",
            "ResourceFlavor",
            "resourceflavors",
        ),
    );
    let flavor: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": FLAVOR}
    }))
    .expect("a valid ResourceFlavor");
    match flavors.create(&PostParams::default(), &flavor).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create ResourceFlavor {FLAVOR}: {e}"),
    }
    apply(
        &cluster_queue_api(client),
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": resource_groups(quota)
            }
        }),
    )
    .await;
    let local_queues: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &resource("kueue.x-k8s.io", "v1beta2", "LocalQueue", "localqueues"),
    );
    apply(
        &local_queues,
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": local_queue, "namespace": ns},
            "spec": {"clusterQueue": cluster_queue}
        }),
    )
    .await;
}

/// Replaces ClusterQueue `cluster_queue`'s quota (see [`queue`]): how a test frees or raises
/// quota after the fact.
pub async fn set_quota(client: &kube::Client, cluster_queue: &str, quota: &[(&str, &str)]) {
    let patch = json!({"spec": {"resourceGroups": resource_groups(quota)}});
    cluster_queue_api(client)
        .patch(
            cluster_queue,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap_or_else(|e| panic!("set ClusterQueue {cluster_queue}'s quota: {e}"));
}

/// A WorkloadPriorityClass `name` of `value` (jobs pick it with [`PRIORITY_CLASS_LABEL`]).
pub async fn workload_priority_class(client: &kube::Client, name: &str, value: i32) {
    let classes: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "kueue.x-k8s.io",
            "v1beta2",
            "WorkloadPriorityClass",
            "workloadpriorityclasses",
        ),
    );
    apply(
        &classes,
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": value
        }),
    )
    .await;
}

/// The Workloads in `ns`, as JSON (`status.conditions`, `metadata.ownerReferences`, …).
pub async fn workloads(client: &kube::Client, ns: &str) -> Vec<Value> {
    workload_api(client, ns)
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("list Workloads in {ns}: {e}"))
        .items
        .into_iter()
        .map(|w| serde_json::to_value(w).expect("a Workload serializes"))
        .collect()
}

/// The Workload in `ns` owned by the `kind` named `owner` (Kueue makes one per job), if any.
pub async fn workload_of(
    client: &kube::Client,
    ns: &str,
    kind: &str,
    owner: &str,
) -> Option<Value> {
    workloads(client, ns).await.into_iter().find(|workload| {
        workload["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|o| o["kind"] == kind && o["name"] == owner)
    })
}

/// The Workload of the `kind` named `owner` in `ns`, once `accept` holds for it (waits up to
/// 240 s; `what` names the wait in the failure message).
pub async fn workload_where(
    client: &kube::Client,
    ns: &str,
    kind: &str,
    owner: &str,
    what: &str,
    accept: impl Fn(&Value) -> bool,
) -> Value {
    super::eventually(
        Duration::from_secs(240),
        &format!("{kind} {owner}'s Workload {what}"),
        || {
            let accept = &accept;
            async move {
                workload_of(client, ns, kind, owner)
                    .await
                    .filter(|w| accept(w))
            }
        },
    )
    .await
}

/// The status condition `type_` of a Kueue object (Workload, ClusterQueue, …), if set.
pub fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Whether the condition `type_` of `object` has status `status` ("True"/"False").
pub fn condition_is(object: &Value, type_: &str, status: &str) -> bool {
    condition(object, type_).is_some_and(|c| c["status"] == status)
}

#[test]
fn only_ray_kueue_and_appwrapper_webhooks_are_kept_and_all_point_at_the_loopback() {
    let module_dir = module_dir().expect("the Kueue module");
    let (mutating, validating) =
        webhook_configurations(&module_dir, 9443, "CA").expect("the module's webhooks");
    for config in [&mutating, &validating] {
        let webhooks = config["webhooks"].as_array().expect("webhooks");
        for kept in ["raycluster", "appwrapper"] {
            assert!(
                webhooks
                    .iter()
                    .any(|w| w["name"].as_str().is_some_and(|n| n.contains(kept))),
                "no {kept} webhook in {config}"
            );
        }
        let groups: Vec<&str> = webhooks
            .iter()
            .flat_map(|w| w["rules"].as_array().into_iter().flatten())
            .flat_map(|r| r["apiGroups"].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        assert!(
            groups
                .iter()
                .all(|g| ["ray.io", "kueue.x-k8s.io", "workload.codeflare.dev"].contains(g)),
            "{groups:?}"
        );
        for webhook in webhooks {
            let url = webhook["clientConfig"]["url"].as_str().expect("a URL");
            assert!(url.starts_with("https://127.0.0.1:9443/"), "{url}");
            assert!(webhook["clientConfig"].get("service").is_none());
        }
    }
}
