//! A real Kubernetes control plane on 127.0.0.1, for tests and `raypipe dev`: etcd and
//! kube-apiserver (secure serving, an admin token, RBAC, service-account keys), optionally
//! kube-controller-manager, kube-scheduler and kwok with one fake Node so Pods become Running.
//! Binaries are built from their Go modules once per machine (see `binaries`); the start-up
//! timeout counts from when they exist, never the build.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::binaries::Binaries;
use super::pki::Pki;
use super::process::ManagedProcess;
use super::{DevEnvError, free_port, random_token, write};

/// Field manager under which the control plane installs CRDs.
pub const CRD_FIELD_MANAGER: &str = "raypipe-crds";
/// The fake Node that kwok manages when kwok runs.
pub const KWOK_NODE: &str = "kwok-node-0";

/// The kwok kinds served as CRDs when kwok's server runs (`ControlPlaneOptions::kwok_server`),
/// with the file of each CRD under `kustomize/crd/bases/` in kwok's Go module.
pub const KWOK_SERVER_CRDS: [(&str, &str); 4] = [
    ("PortForward", "kwok.x-k8s.io_portforwards.yaml"),
    (
        "ClusterPortForward",
        "kwok.x-k8s.io_clusterportforwards.yaml",
    ),
    ("Logs", "kwok.x-k8s.io_logs.yaml"),
    ("ClusterLogs", "kwok.x-k8s.io_clusterlogs.yaml"),
];

/// What to start beside etcd and kube-apiserver.
#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// Garbage collection, namespace deletion, Jobs → Pods, EndpointSlices.
    pub controller_manager: bool,
    /// Binds Pods created without `nodeName`.
    pub scheduler: bool,
    /// Fake Node + Pods that become Running/Ready (and Job Pods that complete).
    pub kwok: bool,
    /// With `kwok`: also run kwok's kubelet-like server on 127.0.0.1 (HTTPS, the plane's own
    /// serving certificate), so the API server's Pod `portforward` and `log` subresources reach
    /// it. What it forwards to and which files it serves as logs come from kwok's `PortForward`,
    /// `ClusterPortForward`, `Logs` and `ClusterLogs` objects (group `kwok.x-k8s.io`), whose
    /// CRDs are installed from kwok's Go module (see [`KWOK_SERVER_CRDS`]).
    pub kwok_server: bool,
    /// Install raypipe's CRDs and wait until they are Established.
    pub install_crds: bool,
    /// How long the servers may take to become ready, counted from when the binaries are found:
    /// a first-time build of the binaries is not part of it.
    pub startup_timeout: Duration,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        ControlPlaneOptions {
            controller_manager: false,
            scheduler: false,
            kwok: false,
            kwok_server: false,
            install_crds: true,
            startup_timeout: Duration::from_secs(180),
        }
    }
}

impl ControlPlaneOptions {
    /// Everything: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok.
    pub fn full() -> Self {
        ControlPlaneOptions {
            controller_manager: true,
            scheduler: true,
            kwok: true,
            ..Default::default()
        }
    }

    fn needs_full_binaries(&self) -> bool {
        self.controller_manager || self.scheduler || self.kwok
    }
}

/// A running control plane. Dropping it stops every process it started (by pid, in reverse
/// order) and removes its directory.
pub struct ControlPlane {
    /// Holds the PKI, tokens, kubeconfig, etcd data and logs.
    pub dir: PathBuf,
    pub api_url: String,
    pub admin_token: String,
    pub ca_pem: String,
    /// Kubeconfig for the admin user (`system:masters`).
    pub kubeconfig: PathBuf,
    pub binaries: Binaries,
    /// The port of kwok's kubelet-like server on 127.0.0.1, when it runs.
    pub kwok_server_port: Option<u16>,
    processes: Vec<ManagedProcess>,
    keep_dir: bool,
}

/// A fresh directory under `$TMPDIR/raypipe-testenv/`, after removing those left behind by
/// processes that no longer run.
fn run_dir() -> Result<PathBuf, DevEnvError> {
    let root = std::env::temp_dir().join("raypipe-testenv");
    super::fresh_run_dir(&root, "", |abandoned| {
        let _ = std::fs::remove_dir_all(abandoned);
    })
}

/// A kubeconfig for `token` against `server`, with the CA inline.
pub fn kubeconfig_yaml(server: &str, ca_pem: &str, user: &str, token: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: raypipe-local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: raypipe-local\n  context:\n    cluster: raypipe-local\n    user: {user}\n    namespace: default\ncurrent-context: raypipe-local\n"
    )
}

impl ControlPlane {
    /// Starts a control plane; blocks the calling thread on process start-up, so call it from a
    /// blocking context (`spawn_blocking`) inside an async runtime.
    pub async fn start(options: ControlPlaneOptions) -> Result<ControlPlane, DevEnvError> {
        let need_full = options.needs_full_binaries();
        Self::start_located(options, move || Binaries::locate(need_full)).await
    }

    /// `start`, with the step that finds (and on a fresh machine builds) the binaries given by
    /// the caller: how tests stand in a slow first-time provisioning.
    pub async fn start_located(
        options: ControlPlaneOptions,
        locate: impl FnOnce() -> Result<Binaries, DevEnvError> + Send + 'static,
    ) -> Result<ControlPlane, DevEnvError> {
        let locating = Instant::now();
        let binaries = tokio::task::spawn_blocking(locate)
            .await
            .map_err(|e| DevEnvError::Provision(e.to_string()))??;
        tracing::debug!(
            seconds = locating.elapsed().as_secs_f64(),
            "control-plane binaries located"
        );
        // The start-up timeout is for the servers: it starts only once the binaries exist, since
        // building them the first time takes many minutes (issue 15).
        let started = Instant::now();
        let dir = run_dir()?;
        let pki = Pki::generate()?;
        let p = |name: &str| dir.join(name);
        write(&p("ca.crt"), &pki.ca_cert)?;
        write(&p("ca.key"), &pki.ca_key)?;
        write(&p("apiserver.crt"), &pki.serving_cert)?;
        write(&p("apiserver.key"), &pki.serving_key)?;
        write(&p("sa.key"), &pki.service_account_key)?;
        write(&p("sa.pub"), &pki.service_account_public_key)?;
        let admin_token = random_token()?;
        write(
            &p("tokens.csv"),
            &format!("{admin_token},admin,uid-admin,\"system:masters\"\n"),
        )?;

        let (etcd_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let api_url = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = p("admin.kubeconfig");
        write(
            &kubeconfig,
            &kubeconfig_yaml(&api_url, &pki.ca_cert, "admin", &admin_token),
        )?;

        let mut plane = ControlPlane {
            dir: dir.clone(),
            api_url: api_url.clone(),
            admin_token,
            ca_pem: pki.ca_cert.clone(),
            kubeconfig: kubeconfig.clone(),
            binaries: binaries.clone(),
            kwok_server_port: None,
            processes: Vec::new(),
            keep_dir: std::env::var_os("RAYPIPE_TESTENV_KEEP").is_some(),
        };
        let d = |name: &str| p(name).display().to_string();

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        plane.processes.push(ManagedProcess::start(
            "etcd",
            &binaries.etcd,
            &[
                "--name=default".into(),
                format!("--data-dir={}", d("etcd-data")),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                // No metrics listener beyond the client URL; no fsync: test data is disposable.
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
            &p("etcd.log"),
        )?);

        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            // Advertising loopback needs the endpoint reconciler off (it rejects loopback).
            "--advertise-address=127.0.0.1".into(),
            "--endpoint-reconciler-type=none".into(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", d("certs")),
            format!("--tls-cert-file={}", d("apiserver.crt")),
            format!("--tls-private-key-file={}", d("apiserver.key")),
            format!("--client-ca-file={}", d("ca.crt")),
            format!("--token-auth-file={}", d("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", d("sa.pub")),
            format!("--service-account-signing-key-file={}", d("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            // Pods may be created right after their namespace, before any default SA exists.
            "--disable-admission-plugins=ServiceAccount".into(),
            "--v=1".into(),
        ];
        let kwok_server = options.kwok && options.kwok_server;
        if kwok_server {
            // kwok's Node also reports its name as a Hostname address, which nothing resolves:
            // the API server must dial the kubelet (kwok's server) at the InternalIP, 127.0.0.1.
            apiserver_args.push("--kubelet-preferred-address-types=InternalIP".into());
        }
        plane.processes.push(ManagedProcess::start(
            "kube-apiserver",
            &binaries.kube_apiserver,
            &apiserver_args,
            &p("kube-apiserver.log"),
        )?);

        let client = plane.client().await?;
        plane
            .wait_ready(&client, options.startup_timeout, started)
            .await?;

        if options.controller_manager
            && let Some(kcm) = &binaries.kube_controller_manager
        {
            plane.processes.push(ManagedProcess::start(
                "kube-controller-manager",
                kcm,
                &[
                    format!("--kubeconfig={}", kubeconfig.display()),
                    "--leader-elect=false".into(),
                    "--bind-address=127.0.0.1".into(),
                    "--secure-port=0".into(),
                    format!("--service-account-private-key-file={}", d("sa.key")),
                    format!("--root-ca-file={}", d("ca.crt")),
                    "--service-cluster-ip-range=10.0.0.0/24".into(),
                    // Fast garbage collection and Job handling for tests.
                    "--concurrent-gc-syncs=5".into(),
                    "--v=1".into(),
                ],
                &p("kube-controller-manager.log"),
            )?);
        }
        if options.scheduler
            && let Some(sched) = &binaries.kube_scheduler
        {
            let port = free_port()?;
            plane.processes.push(ManagedProcess::start(
                "kube-scheduler",
                sched,
                &[
                    format!("--kubeconfig={}", kubeconfig.display()),
                    "--leader-elect=false".into(),
                    "--bind-address=127.0.0.1".into(),
                    format!("--secure-port={port}"),
                    "--v=1".into(),
                ],
                &p("kube-scheduler.log"),
            )?);
        }
        if options.kwok
            && let (Some(kwok), Some(stages)) = (&binaries.kwok, &binaries.kwok_stages)
        {
            let mut args = vec![
                format!("--kubeconfig={}", kubeconfig.display()),
                "--manage-all-nodes=true".to_owned(),
                // Pod IPs are data only; nothing in raypipe's tests dials them.
                "--cidr=10.244.0.0/16".to_owned(),
                "--node-ip=127.0.0.1".to_owned(),
            ];
            let mut stage_files: Vec<PathBuf> = std::fs::read_dir(stages)
                .map_err(|e| DevEnvError::Io(format!("read {}", stages.display()), e))?
                .flatten()
                .map(|e| e.path())
                .collect();
            stage_files.sort();
            args.extend(
                stage_files
                    .iter()
                    .map(|f| format!("--config={}", f.display())),
            );
            if kwok_server {
                // kwok watches the objects of the kinds it serves as CRDs from its start.
                install_crds(&client, &kwok_server_crds()?, options.startup_timeout).await?;
                let port = free_port()?;
                let kinds: Vec<&str> = KWOK_SERVER_CRDS.iter().map(|(kind, _)| *kind).collect();
                args.extend([
                    format!("--server-address=127.0.0.1:{port}"),
                    // The Node's kubelet endpoint (`status.daemonEndpoints`) the API server dials.
                    format!("--node-port={port}"),
                    // Signed by the plane's CA for 127.0.0.1; the API server, started without
                    // `--kubelet-certificate-authority`, does not verify it anyway.
                    format!("--tls-cert-file={}", d("apiserver.crt")),
                    format!("--tls-private-key-file={}", d("apiserver.key")),
                    format!("--enable-crds={}", kinds.join(",")),
                ]);
                plane.kwok_server_port = Some(port);
            }
            plane
                .processes
                .push(ManagedProcess::start("kwok", kwok, &args, &p("kwok.log"))?);
            create_kwok_node(&client, KWOK_NODE).await?;
        }
        if options.install_crds {
            install_crds(&client, &crate::api::crds(), options.startup_timeout).await?;
        }
        tracing::info!(
            api = %plane.api_url,
            dir = %plane.dir.display(),
            seconds = started.elapsed().as_secs_f64(),
            "control plane ready"
        );
        Ok(plane)
    }

    /// A client for the admin user.
    pub async fn client(&self) -> Result<kube::Client, DevEnvError> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Process ids of everything started, by name.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.processes
            .iter()
            .map(|p| (p.name.clone(), p.pid()))
            .collect()
    }

    /// The log file of a component (`etcd`, `kube-apiserver`, `kwok`, …).
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.dir.join(format!("{component}.log"))
    }

    fn check_processes(&mut self) -> Result<(), DevEnvError> {
        for proc in &mut self.processes {
            if let Some(status) = proc.exited() {
                return Err(DevEnvError::Exited {
                    name: proc.name.clone(),
                    status,
                    log: proc.log_tail(30),
                });
            }
        }
        Ok(())
    }

    async fn wait_ready(
        &mut self,
        client: &kube::Client,
        timeout: Duration,
        since: Instant,
    ) -> Result<(), DevEnvError> {
        let deadline = since + timeout;
        use tracing::instrument::WithSubscriber;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        loop {
            self.check_processes()?;
            // Unanswered probes are expected while it starts; kube's client would log each as
            // an ERROR (`raypipe dev` printed a screenful of them), so they are not traced.
            let probe = async {
                let ready = client
                    .request_text(
                        http::Request::get("/readyz")
                            .body(Vec::new())
                            .expect("a static request is valid"),
                    )
                    .await
                    .is_ok_and(|body| body.trim() == "ok");
                // Like envtest, wait for the `default` namespace too: the first writes need it.
                ready && namespaces.get_opt("default").await.ok().flatten().is_some()
            };
            if probe
                .with_subscriber(tracing::subscriber::NoSubscriber::default())
                .await
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(DevEnvError::Timeout(
                    timeout,
                    format!(
                        "kube-apiserver /readyz; log: {}",
                        self.log_path("kube-apiserver").display()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Fault injection: stops kube-apiserver (SIGTERM, SIGKILL after 5 s), keeps it down for
    /// `down_for`, then starts it again with the same command line — so the same port, etcd,
    /// certificates and tokens, and clients made before keep working — and waits until it is
    /// ready. The old log is kept as `kube-apiserver-<n>.log`. Returns how long it was
    /// unreachable, from the stop to `/readyz` answering again.
    pub async fn restart_apiserver(&mut self, down_for: Duration) -> Result<Duration, DevEnvError> {
        const NAME: &str = "kube-apiserver";
        let Some(index) = self.processes.iter().position(|p| p.name == NAME) else {
            return Err(DevEnvError::Spawn(
                NAME.into(),
                "this control plane has no kube-apiserver".into(),
            ));
        };
        // Its own command line is the one place that holds its flags (the etcd port among
        // them), so they are read back rather than kept twice.
        let pid = self.processes[index].pid();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map_err(|e| DevEnvError::Io(format!("read /proc/{pid}/cmdline"), e))?;
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|arg| !arg.is_empty())
            .skip(1)
            .map(|arg| String::from_utf8_lossy(arg).into_owned())
            .collect();

        let stopped = Instant::now();
        // SAFETY: signalling our own child by its pid; it is not reaped before `stop` below.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
        let grace = stopped + Duration::from_secs(5);
        while self.processes[index].exited().is_none() && Instant::now() < grace {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Reaps it (SIGKILL first if the grace period ran out).
        self.processes[index].stop(Duration::ZERO);

        let mut generation = 1;
        while self.dir.join(format!("{NAME}-{generation}.log")).exists() {
            generation += 1;
        }
        let log = self.log_path(NAME);
        std::fs::rename(&log, self.dir.join(format!("{NAME}-{generation}.log")))
            .map_err(|e| DevEnvError::Io(format!("rename {}", log.display()), e))?;
        tokio::time::sleep(down_for.saturating_sub(stopped.elapsed())).await;

        self.processes[index] =
            ManagedProcess::start(NAME, &self.binaries.kube_apiserver, &args, &log)?;
        let client = self.client().await?;
        let restarted = Instant::now();
        self.wait_ready(&client, Duration::from_secs(120), restarted)
            .await?;
        Ok(stopped.elapsed())
    }

    /// Stops every process (reverse start order) and removes the directory unless
    /// `RAYPIPE_TESTENV_KEEP` is set.
    pub fn stop(&mut self) {
        while let Some(mut proc) = self.processes.pop() {
            proc.stop(Duration::from_secs(10));
        }
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The CRDs of the kwok kinds in [`KWOK_SERVER_CRDS`], read from kwok's Go module (the one
/// `provision.sh` builds kwok from): `go mod download` finds it in the module cache, or fetches
/// it through the Go module proxy when the binaries came from elsewhere.
pub fn kwok_server_crds() -> Result<Vec<CustomResourceDefinition>, DevEnvError> {
    let module = format!("sigs.k8s.io/kwok@v{}", super::binaries::KWOK_VERSION);
    let output = std::process::Command::new("go")
        .args(["mod", "download", "-json", &module])
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "")
        // Outside any Go module, whatever directory the caller runs in.
        .current_dir(std::env::temp_dir())
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| DevEnvError::Spawn("go mod download".into(), e.to_string()))?;
    let info: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    let dir = match info.get("Dir").and_then(|dir| dir.as_str()) {
        Some(dir) if output.status.success() => PathBuf::from(dir),
        _ => {
            return Err(DevEnvError::Provision(format!(
                "go mod download {module} ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stdout).trim()
            )));
        }
    };
    let bases = dir.join("kustomize").join("crd").join("bases");
    let mut crds = Vec::new();
    for (kind, file) in KWOK_SERVER_CRDS {
        let path = bases.join(file);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| DevEnvError::Io(format!("read {}", path.display()), e))?;
        let invalid = |e: String| {
            DevEnvError::Provision(format!("{}: not the CRD of {kind}: {e}", path.display()))
        };
        let doc = crate::api::yaml::documents(&text)
            .map_err(|e| invalid(e.to_string()))?
            .into_iter()
            .next()
            .ok_or_else(|| invalid("empty".into()))?;
        crds.push(serde_json::from_value(doc).map_err(|e| invalid(e.to_string()))?);
    }
    Ok(crds)
}

/// A fake Node named `name` for kwok to run Pods on (1k CPUs, 1 TiB, 1M Pods from kwok's
/// node-initialize stage); one that exists already is fine.
pub async fn create_kwok_node(client: &kube::Client, name: &str) -> Result<(), DevEnvError> {
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok"
            }
        }
    }))
    .expect("a static Node is valid");
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Server-side applies `crds` (they are too large for client-side apply's annotation) and waits
/// until every one is Established.
pub async fn install_crds(
    client: &kube::Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> Result<(), DevEnvError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(CRD_FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd)).await?;
    }
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let established = kube::runtime::wait::await_condition(
            api.clone(),
            &name,
            kube::runtime::wait::conditions::is_crd_established(),
        );
        tokio::time::timeout(timeout, established)
            .await
            .map_err(|_| {
                DevEnvError::Timeout(timeout, format!("CRD {name} to become Established"))
            })?
            .map_err(|e| DevEnvError::Timeout(timeout, format!("CRD {name}: {e}")))?;
    }
    Ok(())
}
