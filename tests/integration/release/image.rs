//! The release image: built by `deploy/image/build.sh` (no container engine), twice to the same
//! digest, pushed to the real distribution registry and pulled back with `oras` (the install
//! guide's commands), installed with the chart from the OCI registry, and run by `runc` the way
//! a kubelet would run the chart's Deployment: its image's entrypoint and user, the Deployment's
//! arguments and environment, the chart's ServiceAccount token mounted at the in-cluster path, a
//! read-only root and no capabilities. It must answer `/healthz` and `/readyz`, write the
//! webhook's CA bundle, judge an admission review, reconcile KubeRay's RayCluster sample, and
//! stop cleanly on SIGTERM.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::{
    chart_version, container_args, container_env, forbidden_requests, free_port, helm_command,
    installed_container, package_chart, repo, service_account_token,
};
use crate::admin::get;
use crate::support::oci::{PASSWORD, USER, basic_registry};
use crate::support::tools::{oras, qemu_aarch64, run, runc};
use crate::support::{self, eventually};

/// Long enough for a loaded 2-core machine to start the operator and a cluster's Pods.
const WAIT: Duration = Duration::from_secs(180);

/// The platforms built: `RAYPIPE_IMAGE_PLATFORMS`, else amd64 and (where Debian's cross
/// compiler is installed, as `.ci/run` does) arm64.
fn platforms() -> String {
    if let Ok(platforms) = std::env::var("RAYPIPE_IMAGE_PLATFORMS") {
        return platforms;
    }
    let cross = Command::new("aarch64-linux-gnu-gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if cross {
        "amd64,arm64".to_owned()
    } else {
        eprintln!("no aarch64-linux-gnu-gcc (Debian: gcc-aarch64-linux-gnu): building amd64 only");
        "amd64".to_owned()
    }
}

/// `deploy/image/build.sh` into `out`; the image index digest it prints.
fn build(out: &Path) -> String {
    let stdout = run(Command::new("bash")
        .arg(repo().join("deploy/image/build.sh"))
        .args(["--platforms", &platforms(), "--out"])
        .arg(out));
    stdout.trim().lines().last().unwrap_or_default().to_owned()
}

/// An OCI image layout on disk, every blob read checked against its digest.
struct Layout(PathBuf);

impl Layout {
    fn blob(&self, digest: &str) -> Vec<u8> {
        let hex = digest
            .strip_prefix("sha256:")
            .unwrap_or_else(|| panic!("a sha256 digest: {digest}"));
        let bytes = std::fs::read(self.0.join("blobs/sha256").join(hex))
            .unwrap_or_else(|e| panic!("blob {digest}: {e}"));
        assert_eq!(
            hex::encode(Sha256::digest(&bytes)),
            hex,
            "blob {digest} is intact"
        );
        bytes
    }

    fn json(&self, digest: &str) -> Value {
        serde_json::from_slice(&self.blob(digest)).expect("a JSON blob")
    }

    /// The digest of the image index the layout's `index.json` names.
    fn index_digest(&self) -> String {
        let top: Value =
            serde_json::from_slice(&std::fs::read(self.0.join("index.json")).expect("index.json"))
                .expect("index.json is JSON");
        top["manifests"][0]["digest"]
            .as_str()
            .expect("index.json names the image")
            .to_owned()
    }

    fn image_index(&self) -> Value {
        self.json(&self.index_digest())
    }

    fn manifest(&self, arch: &str) -> Value {
        let index = self.image_index();
        let digest = index["manifests"]
            .as_array()
            .expect("an index")
            .iter()
            .find(|m| m["platform"]["architecture"] == arch)
            .and_then(|m| m["digest"].as_str())
            .unwrap_or_else(|| panic!("the index has {arch}: {index}"))
            .to_owned();
        self.json(&digest)
    }

    fn config(&self, arch: &str) -> Value {
        self.json(
            self.manifest(arch)["config"]["digest"]
                .as_str()
                .expect("a config"),
        )
    }

    /// The layers of `arch`, in order, extracted into `into` (no whiteouts: the image has none).
    fn unpack(&self, arch: &str, into: &Path) {
        std::fs::create_dir_all(into).expect("the root directory");
        let config = self.config(arch);
        for (i, layer) in self.manifest(arch)["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .enumerate()
        {
            let gz = self.blob(layer["digest"].as_str().expect("a layer digest"));
            let mut tar = Vec::new();
            flate_decompress(&gz, &mut tar);
            assert_eq!(
                format!("sha256:{}", hex::encode(Sha256::digest(&tar))),
                config["rootfs"]["diff_ids"][i],
                "layer {i}'s diff_id"
            );
            let mut child = Command::new("tar")
                .arg("-x")
                .arg("-C")
                .arg(into)
                .stdin(Stdio::piped())
                .spawn()
                .expect("tar runs");
            std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), &tar)
                .expect("tar reads the layer");
            drop(child.stdin.take());
            assert!(
                child.wait().expect("tar ends").success(),
                "tar -x layer {i}"
            );
        }
    }
}

/// gunzip through the system's gzip (no decompression crate in the tree for one test).
fn flate_decompress(gz: &[u8], out: &mut Vec<u8>) {
    let mut child = Command::new("gzip")
        .arg("-dc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip runs");
    let mut stdin = child.stdin.take().expect("stdin");
    let data = gz.to_vec();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &data));
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(out)
        .expect("gzip output");
    writer.join().expect("writer").expect("gzip input");
    assert!(child.wait().expect("gzip ends").success(), "gzip -d");
}

/// The ELF machine of a binary: 62 for x86-64, 183 for AArch64.
fn elf_machine(path: &Path) -> u16 {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..4], b"\x7fELF", "{} is an ELF file", path.display());
    u16::from_le_bytes([bytes[18], bytes[19]])
}

/// A container run by runc; deleted (killed if need be) when dropped, so a failing test leaves
/// nothing running.
struct Container {
    id: String,
    state: PathBuf,
    child: Option<Child>,
}

impl Container {
    fn runc(&self) -> Command {
        let mut command = Command::new(runc());
        command.arg("--root").arg(&self.state);
        command
    }

    /// SIGTERM, as the kubelet sends; the exit status within `wait`.
    fn terminate(&mut self, wait: Duration) -> std::process::ExitStatus {
        run(self.runc().args(["kill", &self.id, "TERM"]));
        let mut child = self.child.take().expect("the container runs");
        let deadline = std::time::Instant::now() + wait;
        loop {
            if let Some(status) = child.try_wait().expect("runc's status") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the operator did not stop within {wait:?} of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = self.runc().args(["kill", &self.id, "KILL"]).output();
            let _ = child.wait();
        }
        let _ = self.runc().args(["delete", "--force", &self.id]).output();
    }
}

/// The OCI runtime config for the operator container: runc's defaults, then what the kubelet
/// would set from the image and the chart's Deployment. The network namespace is the host's, so
/// the loopback control plane and the admin port are reachable (a Pod's would be its own).
fn runtime_config(
    bundle: &Path,
    image_config: &Value,
    args: &[String],
    env: &[(String, String)],
    secrets: &Path,
) -> Value {
    run(Command::new(runc()).arg("spec").current_dir(bundle));
    let path = bundle.join("config.json");
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("runc spec wrote config.json"))
            .expect("config.json is JSON");
    let image = &image_config["config"];
    let (uid, gid) = image["User"]
        .as_str()
        .and_then(|u| u.split_once(':'))
        .and_then(|(u, g)| Some((u.parse::<u32>().ok()?, g.parse::<u32>().ok()?)))
        .expect("the image runs as a numeric user:group");
    let argv: Vec<String> = image["Entrypoint"]
        .as_array()
        .expect("an entrypoint")
        .iter()
        .map(|a| a.as_str().expect("string").to_owned())
        .chain(args.iter().cloned())
        .collect();
    let environment: Vec<String> = image["Env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str().map(str::to_owned))
        .chain(env.iter().map(|(k, v)| format!("{k}={v}")))
        .collect();
    config["process"]["terminal"] = json!(false);
    config["process"]["user"] = json!({"uid": uid, "gid": gid});
    config["process"]["args"] = json!(argv);
    config["process"]["env"] = json!(environment);
    config["process"]["cwd"] = json!(image["WorkingDir"].as_str().unwrap_or("/"));
    config["process"]["noNewPrivileges"] = json!(true);
    // The chart's securityContext: capabilities drop ALL, read-only root filesystem.
    config["process"]["capabilities"] =
        json!({"bounding": [], "effective": [], "permitted": [], "ambient": []});
    config["root"]["readonly"] = json!(true);
    config["hostname"] = json!("raypipe-0");
    config["mounts"]
        .as_array_mut()
        .expect("mounts")
        .push(json!({
            "destination": "/var/run/secrets/kubernetes.io/serviceaccount",
            "type": "bind",
            "source": secrets,
            "options": ["rbind", "ro"],
        }));
    config["linux"]["namespaces"]
        .as_array_mut()
        .expect("namespaces")
        .retain(|n| n["type"] != "network");
    std::fs::write(&path, serde_json::to_vec_pretty(&config).expect("JSON")).expect("write");
    config
}

#[tokio::test]
async fn the_release_image_is_reproducible_and_runs_under_runc_with_the_charts_service_account() {
    raypipe::startup::init_crypto();
    let work = tempfile::tempdir().expect("a work directory");
    let work = work.path();

    // Built twice from the same commit: the same digest.
    let first = build(&work.join("first"));
    let second = build(&work.join("second"));
    assert!(
        first.starts_with("sha256:"),
        "build.sh prints the digest: {first:?}"
    );
    assert_eq!(first, second, "two builds of one commit differ");
    let layout = Layout(work.join("first"));
    assert_eq!(layout.index_digest(), first);

    let version = chart_version();
    let revision = run(Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(repo()))
    .trim()
    .to_owned();
    let archs: Vec<String> = platforms().split(',').map(str::to_owned).collect();
    let index = layout.image_index();
    let mut crds = Vec::new();
    assert_eq!(
        index["manifests"].as_array().expect("manifests").len(),
        archs.len()
    );
    for arch in &archs {
        let config = layout.config(arch);
        assert_eq!(config["architecture"], json!(arch));
        assert_eq!(config["os"], "linux");
        let image = &config["config"];
        assert_eq!(image["User"], "65532:65532", "a numeric non-root user");
        assert_eq!(image["Entrypoint"], json!(["/usr/local/bin/raypipe"]));
        // No default arguments: the binary picks the operator or the collector sidecar.
        assert_eq!(image["Cmd"], Value::Null);
        let labels = &image["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], json!(version));
        assert!(
            labels["org.opencontainers.image.revision"]
                .as_str()
                .is_some_and(|r| r.starts_with(&revision)),
            "the image names its commit: {labels}"
        );
        assert!(
            labels["dev.raypipe.image.debian-packages"]
                .as_str()
                .is_some_and(|p| p.contains("libc6=") && p.contains("ca-certificates=")),
            "the image records its Debian packages: {labels}"
        );
        let root = work.join(format!("root-{arch}"));
        layout.unpack(arch, &root);
        let binary = root.join("usr/local/bin/raypipe");
        let want = if arch == "amd64" { 62 } else { 183 };
        assert_eq!(elf_machine(&binary), want, "{arch} binary");
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("/etc/passwd");
        assert!(passwd.contains(":65532:65532:"), "{passwd}");
        let bundle = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt"))
            .expect("the CA bundle");
        assert!(
            bundle.matches("BEGIN CERTIFICATE").count() > 100,
            "Mozilla's CA set"
        );
        assert!(
            root.join("usr/share/zoneinfo/Europe/Berlin").exists(),
            "time zones"
        );
        assert!(!root.join("bin/sh").exists(), "no shell in a minimal image");
        assert!(
            root.join("var/lib/dpkg/status.d/libc6").exists(),
            "scanners find the packages"
        );
        // The binary runs on its image's own loader and libraries: amd64 natively (with the
        // image's root as the library path), arm64 under qemu-user.
        let loader = |args: &[&str]| {
            let mut command = if arch == "amd64" {
                let mut c = Command::new(root.join("lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"));
                c.arg("--library-path")
                    .arg(root.join("lib/x86_64-linux-gnu"));
                c.arg(&binary);
                c
            } else {
                let mut c = Command::new(qemu_aarch64());
                c.arg("-L").arg(&root).arg(&binary);
                c
            };
            run(command.args(args))
        };
        assert_eq!(loader(&["--version"]).trim(), format!("raypipe {version}"));
        crds.push(loader(&["crds"]));
    }
    assert!(
        crds.windows(2).all(|pair| pair[0] == pair[1]),
        "every architecture's binary prints the same CRDs"
    );

    // Pushed with oras (the install guide's command) to the real registry, and pulled back.
    let registry = basic_registry();
    let reference = format!("{}/raypipe/operator", registry.host);
    let credentials = ["--username", USER, "--password", PASSWORD];
    run(Command::new(oras())
        .args(["cp", "--from-oci-layout"])
        .arg(format!("{}:{version}", layout.0.display()))
        .arg(format!("{reference}:{version}"))
        .arg("--to-plain-http")
        .args(credentials.map(|a| a.replacen("--", "--to-", 1))));
    let pulled = work.join("pulled");
    run(Command::new(oras())
        .args(["cp", "--from-plain-http"])
        .args(credentials.map(|a| a.replacen("--", "--from-", 1)))
        .arg(format!("{reference}@{first}"))
        .arg("--to-oci-layout")
        .arg(format!("{}:{version}", pulled.display())));
    let pulled = Layout(pulled);
    assert_eq!(
        pulled.index_digest(),
        first,
        "the registry serves what was built"
    );

    // The chart, packaged and pushed as an OCI chart, installed from the registry onto a control
    // plane of its own (the operator watches every namespace, as installed by default).
    let plane = support::start_control_plane().expect("a control plane");
    let client = plane.client().await.expect("a client");
    let helm_home = work.join("helm");
    let archive = package_chart(&helm_home, &repo().join("deploy/raypipe"), work);
    run(helm_command(&helm_home, &plane.kubeconfig)
        .args(["registry", "login", &registry.host, "--insecure"])
        .args(["--username", USER, "--password", PASSWORD]));
    run(helm_command(&helm_home, &plane.kubeconfig)
        .arg("push")
        .arg(&archive)
        .arg(format!("oci://{}/charts", registry.host))
        .arg("--plain-http"));
    let (admin_port, webhook_port) = (free_port(), free_port());
    let namespace = "raypipe-system";
    run(helm_command(&helm_home, &plane.kubeconfig)
        .args(["install", "rp"])
        .arg(format!("oci://{}/charts/raypipe", registry.host))
        .args(["--version", &version, "--plain-http"])
        .args(["--namespace", namespace, "--create-namespace"])
        .args(["--set", &format!("image.repository={reference}")])
        .args(["--set", &format!("image.tag={version}")])
        .args(["--set", "replicaCount=1"])
        .args(["--set", &format!("admin.port={admin_port}")])
        .args(["--set", &format!("webhook.port={webhook_port}")]));
    let container = installed_container(&client, namespace, "rp-raypipe").await;
    assert_eq!(container["image"], json!(format!("{reference}:{version}")));

    // The Pod as the kubelet would start it: the image from the registry, the Deployment's
    // arguments and environment, the ServiceAccount's token and the cluster CA.
    let bundle = work.join("bundle");
    pulled.unpack("amd64", &bundle.join("rootfs"));
    let secrets = work.join("serviceaccount");
    std::fs::create_dir_all(&secrets).expect("the token directory");
    let token = service_account_token(&client, namespace, "rp-raypipe").await;
    std::fs::write(secrets.join("token"), token).expect("token");
    std::fs::write(secrets.join("ca.crt"), &plane.ca_pem).expect("ca.crt");
    std::fs::write(secrets.join("namespace"), namespace).expect("namespace");
    let api = reqwest::Url::parse(&plane.api_url).expect("the API server's URL");
    let mut env = container_env(&container, namespace, "raypipe-0");
    env.push(("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()));
    env.push((
        "KUBERNETES_SERVICE_PORT".into(),
        api.port().expect("a port").to_string(),
    ));
    runtime_config(
        &bundle,
        &pulled.config("amd64"),
        &container_args(&container),
        &env,
        &secrets,
    );
    let state = work.join("runc-state");
    let log = std::fs::File::create(work.join("operator.log")).expect("a log file");
    let id = format!("raypipe-{}", std::process::id());
    let mut operator = Container {
        child: Some(
            Command::new(runc())
                .arg("--root")
                .arg(&state)
                .args(["run", "--bundle"])
                .arg(&bundle)
                .arg(&id)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("runc starts"),
        ),
        id,
        state,
    };
    let logs = || std::fs::read_to_string(work.join("operator.log")).unwrap_or_default();

    let admin: std::net::SocketAddr = ([127, 0, 0, 1], admin_port).into();
    for path in ["/healthz", "/readyz"] {
        eventually(WAIT, &format!("{path} to answer 200"), || async {
            let (status, _) = get(admin, path).await?;
            (status == 200).then_some(())
        })
        .await;
    }

    // The webhook: the operator generated its certificate, kept it in the chart's Secret and
    // wrote the CA into the chart's configuration (all under the chart's RBAC), and it serves
    // that certificate for the Service's name.
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let configuration = eventually(WAIT, "the webhook CA bundle to be written", || async {
        let c = configurations.get("rp-raypipe").await.ok()?;
        c.webhooks
            .as_ref()?
            .iter()
            .all(|w| w.client_config.ca_bundle.is_some())
            .then_some(c)
    })
    .await;
    let ca = configuration.webhooks.as_ref().expect("webhooks")[0]
        .client_config
        .ca_bundle
        .clone()
        .expect("a CA bundle");
    let service_host = format!("rp-raypipe-webhook.{namespace}.svc");
    let https = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca.0).expect("a PEM CA")])
        .resolve(&service_host, ([127, 0, 0, 1], webhook_port).into())
        .build()
        .expect("an HTTPS client");
    let sample = support::yaml_documents(&support::kuberay_samples_dir())
        .into_iter()
        .find(|(file, _)| file == "ray-cluster.sample.yaml")
        .map(|(_, doc)| doc)
        .expect("KubeRay's RayCluster sample");
    let mut broken = sample.clone();
    broken["spec"]["headGroupSpec"]["template"]["spec"]["containers"] = json!([]);
    for (object, allowed) in [(&sample, true), (&broken, false)] {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "release-test",
                "kind": {"group": "ray.io", "version": "v1", "kind": "RayCluster"},
                "resource": {"group": "ray.io", "version": "v1", "resource": "rayclusters"},
                "operation": "CREATE",
                "namespace": "default",
                "name": object["metadata"]["name"],
                "userInfo": {"username": "release-test"},
                "object": object,
            }
        });
        let answer: Value = https
            .post(format!(
                "https://{service_host}:{webhook_port}/validate-ray-io-v1-raycluster"
            ))
            .header("content-type", "application/json")
            .body(review.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("the webhook answers over TLS for {service_host}: {e}"))
            .text()
            .await
            .map(|body| serde_json::from_str(&body).expect("an AdmissionReview"))
            .expect("an AdmissionReview");
        assert_eq!(answer["response"]["allowed"], json!(allowed), "{answer}");
    }
    // The API server here cannot reach a Service (it would dial a cluster IP): from now on the
    // webhooks select no namespace, and objects are admitted by the API server alone.
    super::select_no_namespace(&client, "rp-raypipe").await;

    // KubeRay's sample RayCluster, reconciled by the containerised operator to ready.
    let ns = support::namespace(&client, "image").await;
    let resource = kube::discovery::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "ray.io",
        "v1",
        "RayCluster",
    ));
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    let name = sample["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_owned();
    clusters
        .patch(
            &name,
            &PatchParams::apply("release-test"),
            &Patch::Apply(&sample),
        )
        .await
        .expect("create the sample");
    eventually(WAIT, "the sample RayCluster to be ready", || async {
        let cluster = clusters.get(&name).await.ok()?;
        (cluster.data["status"]["state"] == "ready").then_some(())
    })
    .await;

    // Nothing was forbidden: the chart's RBAC covers what the operator did.
    let (_, metrics) = get(admin, "/metrics").await.expect("/metrics answers");
    assert_eq!(
        forbidden_requests(&metrics),
        0.0,
        "requests forbidden by the chart's RBAC; the operator said:\n{}",
        logs()
    );

    // SIGTERM: the operator stops its controllers, releases the Lease and exits 0.
    let status = operator.terminate(Duration::from_secs(30));
    assert!(
        status.success(),
        "exit {status}; the operator said:\n{}",
        logs()
    );
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get("raypipe-leader")
        .await
        .expect("the Lease");
    assert!(
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .is_none_or(|h| h.is_empty()),
        "the Lease is released on SIGTERM"
    );
}
