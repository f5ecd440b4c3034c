//! A team's own code in the graph artifact (issue 31), against the real CNCF distribution
//! registry on 127.0.0.1: `raypipe dag push --code` / `pull --code-dir` / `diff` from the
//! command line, the fetcher's refusals of a missing, tampered (the registry's own storage
//! rewritten) or oversized code layer, and the operator serving the code by digest, refusing
//! an unsigned or tampered version while the running one stays, and pulling the code again by
//! its pinned digest after a restart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use raypipe::api::rayservice::RayService;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::config::{ControllerKind, ControllerSettings};
use raypipe::pypackage::CodeStore;
use raypipe::source::oci::push::{CodeLayer, GraphArtifact, PushRequest};
use raypipe::source::oci::{OciOutcome, OciReference, OciRequest, RegistryCredentials};
use raypipe::source::{RetryPolicy, Sha256Digest, SourceError};

use crate::support::oci::{self, PASSWORD, USER};

/// A package directory `team_models` under `dir`, its model module saying `marker`.
fn package(dir: &Path, marker: &str) -> PathBuf {
    let root = dir.join("team_models");
    std::fs::create_dir_all(root.join("nested")).expect("mkdir");
    std::fs::write(root.join("__init__.py"), b"").expect("write");
    std::fs::write(
        root.join("models.py"),
        format!("MARKER = {marker:?}\n\nclass Echo:\n    def __call__(self, payload):\n        return {{'marker': MARKER}}\n"),
    )
    .expect("write");
    std::fs::write(root.join("nested/util.py"), b"X = 1\n").expect("write");
    root
}

fn raypipe(args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write as _;
    let docker = tempfile::tempdir().expect("tempdir");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_raypipe"))
        .args(args)
        .env("DOCKER_CONFIG", docker.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("raypipe runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("stdin");
    let out = child.wait_with_output().expect("raypipe ends");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn sample(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples/graphs")
        .join(name)
        .display()
        .to_string()
}

/// Every file below `dir`, by relative path.
fn tree(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path
                    .strip_prefix(root)
                    .expect("below")
                    .display()
                    .to_string();
                out.insert(rel, std::fs::read(&path).expect("read"));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn push_with_code_pins_graph_and_code_in_one_digest_and_pull_extracts_it() {
    let registry = oci::basic_registry();
    let reference = registry.reference("code/cli:v1");
    let work = tempfile::tempdir().expect("tempdir");
    let code = package(&work.path().join("a"), "cli-1");
    let login = ["--plain-http", "--username", USER, "--password-stdin"];
    let stdin = format!("{PASSWORD}\n");
    let push = |code: &Path| {
        let code = code.display().to_string();
        let yaml = sample("ensemble.yaml");
        let mut args = vec!["dag", "push", &yaml, &reference, "--code", &code];
        args.extend(login);
        raypipe(&args, &stdin)
    };
    let (status, digest, err) = push(&code);
    assert_eq!(status, 0, "{err}");
    assert!(err.contains(", code sha256:"), "{err}");
    // The same files elsewhere, written later (other paths and timestamps): the same digest.
    std::thread::sleep(Duration::from_millis(1100));
    let copy = package(&work.path().join("b"), "cli-1");
    let (status, again, err) = push(&copy);
    assert_eq!((status, &again), (0, &digest), "{err}");
    assert!(err.contains("3 of 3 blobs already there"), "{err}");
    // One changed byte of code: a new manifest digest, the graph layer shared.
    let changed = package(&work.path().join("c"), "cli-2");
    let (status, other, err) = push(&changed);
    assert_eq!(status, 0, "{err}");
    assert_ne!(other, digest);
    assert!(err.contains("2 of 3 blobs already there"), "{err}");

    // Pulled by the first digest: the graph and exactly the files pushed.
    let by_digest = registry.reference(&format!("code/cli@{digest}"));
    let out = work.path().join("pulled");
    let graph = work.path().join("graph.pb");
    let mut args = vec![
        "dag",
        "pull",
        &by_digest,
        "-o",
        graph.to_str().expect("utf-8"),
        "--code-dir",
        out.to_str().expect("utf-8"),
    ];
    args.extend(login);
    let (status, _, err) = raypipe(&args, &stdin);
    assert_eq!(status, 0, "{err}");
    assert!(err.contains("extracted 3 files"), "{err}");
    let expected = tree(code.parent().expect("parent"));
    assert_eq!(tree(&out), expected, "the pulled code is the pushed code");
    assert_eq!(
        std::fs::read(&graph).expect("graph"),
        std::fs::read(sample("ensemble.pb")).expect("sample")
    );
    // Never into a directory that holds something.
    let (status, _, err) = raypipe(&args, &stdin);
    assert_eq!(status, 2, "{err}");

    // What a code change restarts.
    let (status, plan, err) = raypipe(
        &[
            "dag",
            "diff",
            &sample("ensemble.yaml"),
            &sample("ensemble.yaml"),
            "--old-code",
            code.to_str().expect("utf-8"),
            "--new-code",
            changed.to_str().expect("utf-8"),
        ],
        "",
    );
    assert_eq!(status, 0, "{err}");
    assert!(
        plan.contains("~team_models/models.py") && plan.contains("restarts every replica"),
        "{plan}"
    );

    // A wheel (deflated, as pip builds them) becomes the same kind of stored layer.
    let wheel = work.path().join("team_models-1.0-py3-none-any.whl");
    let built = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sys, zipfile\n\
             with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z:\n\
             \x20   z.writestr('team_models/__init__.py', '')\n\
             \x20   z.writestr('team_models/models.py', 'MARKER = \"wheel\"\\n' * 50)\n\
             \x20   z.writestr('team_models-1.0.dist-info/METADATA', 'Name: team_models\\n')\n",
        )
        .arg(&wheel)
        .status()
        .expect("python3 runs");
    assert!(built.success());
    let wheel_ref = registry.reference("code/wheel:v1");
    let yaml = sample("ensemble.yaml");
    let mut args = vec![
        "dag",
        "push",
        &yaml,
        &wheel_ref,
        "--code",
        wheel.to_str().expect("utf-8"),
    ];
    args.extend(login);
    let (status, _, err) = raypipe(&args, &stdin);
    assert_eq!(status, 0, "{err}");
    let out = work.path().join("wheel-out");
    let mut args = vec![
        "dag",
        "pull",
        &wheel_ref,
        "-o",
        "/dev/null",
        "--code-dir",
        out.to_str().expect("utf-8"),
    ];
    args.extend(login);
    let (status, _, err) = raypipe(&args, &stdin);
    assert_eq!(status, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(out.join("team_models/models.py")).expect("inflated"),
        "MARKER = \"wheel\"\n".repeat(50)
    );
    assert!(out.join("team_models-1.0.dist-info/METADATA").is_file());
}

fn fetcher() -> raypipe::source::Fetcher {
    crate::support::loopback_fetcher()
}

/// Pushes `graph` with `code` (a package below a fresh directory, its model saying `marker`)
/// to `repository:tag` of `registry` as raypipe's CLI would; returns (manifest, code digest).
async fn push_with_code(
    registry: &raypipe::devenv::distribution::DistributionRegistry,
    repository_and_tag: &str,
    graph: Vec<u8>,
    marker: &str,
) -> (Sha256Digest, Sha256Digest) {
    let dir = tempfile::tempdir().expect("tempdir");
    let package = raypipe::pypackage::code::pack(&package(dir.path(), marker)).expect("packs");
    let summary = raypipe::pypackage::code::check(&package.bytes).expect("valid");
    let decoded = raypipe::graph::decode(&graph).expect("a graph");
    let artifact = GraphArtifact::with_code(
        graph,
        &decoded.name,
        &decoded.version,
        Some(CodeLayer {
            bytes: bytes::Bytes::from(package.bytes.as_ref().clone()),
            title: package.file_name.clone(),
            modules: summary.modules,
        }),
    )
    .expect("an artifact");
    let reference: OciReference = registry
        .reference(repository_and_tag)
        .parse()
        .expect("reference");
    let pushed = fetcher()
        .push_oci(&PushRequest {
            reference: &reference,
            credentials: &RegistryCredentials::basic(USER, PASSWORD),
            artifact: &artifact,
            allow_insecure_http: true,
            ca_bundle_pem: None,
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(60),
        })
        .await
        .expect("pushed");
    (pushed.manifest_digest, pushed.code_digest.expect("code"))
}

/// The registry's own stored bytes of a blob (the filesystem driver's layout).
fn blob_file(
    registry: &raypipe::devenv::distribution::DistributionRegistry,
    digest: Sha256Digest,
) -> PathBuf {
    let hex = digest.to_hex();
    registry
        .dir
        .join("storage/docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(&hex)
        .join("data")
}

/// Rewrites a stored blob with other bytes of the same length, as a compromised storage would.
fn tamper(registry: &raypipe::devenv::distribution::DistributionRegistry, digest: Sha256Digest) {
    let path = blob_file(registry, digest);
    let mut bytes = std::fs::read(&path).expect("the stored blob");
    let at = bytes.len() - 30;
    bytes[at] ^= 0x20;
    std::fs::write(&path, bytes).expect("rewritten");
}

async fn pull(
    registry: &raypipe::devenv::distribution::DistributionRegistry,
    repository_and_tag: &str,
    max_code_bytes: u64,
) -> Result<OciOutcome, SourceError> {
    let reference: OciReference = registry
        .reference(repository_and_tag)
        .parse()
        .expect("reference");
    let credentials = RegistryCredentials::basic(USER, PASSWORD);
    fetcher()
        .pull_oci(&OciRequest {
            allow_insecure_http: true,
            retry: RetryPolicy::NONE,
            max_code_bytes,
            ..OciRequest::new(&reference, &credentials)
        })
        .await
}

#[tokio::test]
async fn missing_tampered_and_oversized_code_layers_are_refused_each_with_its_own_reason() {
    let registry = oci::basic_registry();
    let graph = crate::support::e2e::ensemble("1");
    let unique = raypipe::devenv::random_token().expect("token");
    let limit = raypipe::source::DEFAULT_MAX_CODE_BYTES;

    let (_, code) = push_with_code(registry, "code/fetch:ok", graph.clone(), &unique).await;
    let Ok(OciOutcome::Fetched {
        code: Some(fetched),
        ..
    }) = pull(registry, "code/fetch:ok", limit).await
    else {
        panic!("a pull with code");
    };
    assert_eq!(fetched.digest, code);
    assert_eq!(Sha256Digest::of(fetched.bytes.bytes()), code);
    raypipe::pypackage::code::check(fetched.bytes.bytes()).expect("a valid layer");

    let reason = |r: Result<OciOutcome, SourceError>| r.expect_err("refused").reason();
    // Larger than the pipeline allows: refused from the manifest, before any download.
    assert_eq!(
        reason(pull(registry, "code/fetch:ok", 64).await),
        "CodeTooLarge"
    );

    // The storage rewritten under the registry: the digest check catches it.
    let (_, tampered) = push_with_code(
        registry,
        "code/fetch:tampered",
        graph.clone(),
        &format!("{unique}-t"),
    )
    .await;
    tamper(registry, tampered);
    assert_eq!(
        reason(pull(registry, "code/fetch:tampered", limit).await),
        "CodeDigestMismatch"
    );

    // The layer gone from the repository (its link removed): missing.
    let (_, missing) = push_with_code(
        registry,
        "code/fetch:missing",
        graph,
        &format!("{unique}-m"),
    )
    .await;
    let link = registry
        .dir
        .join("storage/docker/registry/v2/repositories/code/fetch/_layers/sha256")
        .join(missing.to_hex());
    std::fs::remove_dir_all(&link).expect("the layer link");
    assert_eq!(
        reason(pull(registry, "code/fetch:missing", limit).await),
        "CodeLayerMissing"
    );
}

/// The package server as the operator's admin port runs it: `/packages/code-<hex>.zip` from
/// `store`, on `listener`; aborted to stop it (a restart).
fn package_server(
    listener: tokio::net::TcpListener,
    store: CodeStore,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            raypipe::pypackage::router_with_code(Vec::new(), store),
        )
        .await;
    })
}

async fn get_code(base: &str, code: Sha256Digest) -> (u16, Vec<u8>) {
    let url = raypipe::pypackage::store::uri(base, &code.to_hex());
    let response = reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(90))
        .send()
        .await
        .expect("the package server answers");
    let status = response.status().as_u16();
    (status, response.bytes().await.unwrap_or_default().to_vec())
}

/// Through the operator (ServePipeline controller only: the Serve config is what is checked,
/// Ray itself is the rollout tests' part): the code is rendered into `py_modules` and served by
/// its digest; an unsigned version and a signed one with tampered code are refused while the
/// RayService keeps the running version; after a restart (a new, empty code store) the
/// running version's code is pulled again by its pinned manifest digest, even though the tag
/// names a refused version; a code-only push is a new version.
#[tokio::test]
async fn the_operator_serves_code_by_digest_refuses_bad_code_and_pulls_it_again_after_a_restart() {
    let oci::TokenRegistry { registry, .. } = oci::token_registry();
    let repository = "code/operator";
    let tag = format!("{repository}:live");
    let unique = raypipe::devenv::random_token().expect("token");
    let (pair, public_pem) = crate::source::oci::signer();
    let (v1, code1) = push_with_code(
        registry,
        &tag,
        crate::support::e2e::ensemble("1"),
        &format!("{unique}-1"),
    )
    .await;
    crate::source::oci::push_signature(repository, v1, &pair).await;

    let client = crate::support::client().await;
    let ns = crate::support::namespace(&client, "code-operator").await;
    let host = registry.reference("").trim_end_matches('/').to_owned();
    let docker_config =
        serde_json::json!({"auths": {host: {"username": USER, "password": PASSWORD}}});
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    for (name, key, value) in [
        ("registry", ".dockerconfigjson", docker_config.to_string()),
        ("cosign", "cosign.pub", public_pem),
    ] {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some([(key.to_owned(), ByteString(value.into_bytes()))].into()),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("a Secret");
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let base = format!("http://{address}/packages");
    let store = CodeStore::default();
    let server = package_server(listener, store.clone());
    let settings = ControllerSettings {
        namespaces: vec![ns.clone()],
        fetcher: crate::support::loopback_fetcher(),
        code_store: store,
        code_base_url: Some(base.clone()),
        ..ControllerSettings::new(&[ControllerKind::Servepipeline])
    };
    let operator = crate::support::e2e::Operator::start(client.clone(), settings.clone());

    let pipeline: ServePipeline = serde_json::from_value(serde_json::json!({
        "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline",
        "metadata": {"name": "team"},
        "spec": {
            "source": {
                "oci": registry.reference(&tag),
                "credentialsSecretRef": {"name": "registry", "key": ".dockerconfigjson"},
                "verify": {"publicKeySecretRef": {"name": "cosign", "key": "cosign.pub"}},
                "allowInsecureHttp": true,
                "refreshInterval": "1s"
            },
            "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
                "template": {"spec": {"containers": [
                    {"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}}}}
        }
    }))
    .expect("a ServePipeline");
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    let rayservices: Api<RayService> = Api::namespaced(client.clone(), &ns);
    pipelines
        .create(&PostParams::default(), &pipeline)
        .await
        .expect("created");

    // Served: the Serve config names the code by digest, and the package server has it.
    let serving = |manifest: Sha256Digest, code: Sha256Digest| {
        let (pipelines, rayservices) = (pipelines.clone(), rayservices.clone());
        async move {
            let oci = pipelines.get("team").await.ok()?.status?.source?.oci?;
            let config = rayservices.get("team").await.ok()?.spec.serve_config_v2?;
            (oci.manifest_digest == manifest.to_string()
                && oci.code_digest == Some(code.to_string())
                && config.contains(&format!("/code-{}.zip", code.to_hex())))
            .then_some(config)
        }
    };
    let config =
        crate::support::eventually(Duration::from_secs(90), "version 1 with its code", || {
            serving(v1, code1)
        })
        .await;
    let (status, bytes) = get_code(&base, code1).await;
    assert_eq!(status, 200);
    assert_eq!(Sha256Digest::of(&bytes), code1, "served by its digest");

    let refused = |reason: &'static str| {
        let pipelines = pipelines.clone();
        async move {
            let p = pipelines.get("team").await.ok()?;
            raypipe::api::conditions::find(&p.status?.conditions, "SourceReady")
                .filter(|c| c.status == "False" && c.reason == reason)
                .cloned()
        }
    };
    // An unsigned version: refused, the running one stays.
    let (v2, code2) = push_with_code(
        registry,
        &tag,
        crate::support::e2e::ensemble("2"),
        &format!("{unique}-2"),
    )
    .await;
    crate::support::eventually(Duration::from_secs(60), "SignatureMissing", || {
        refused("SignatureMissing")
    })
    .await;
    assert_eq!(serving(v1, code1).await.as_deref(), Some(config.as_str()));
    // Signed, but its code rewritten in the registry's storage: refused, the running one stays.
    tamper(registry, code2);
    crate::source::oci::push_signature(repository, v2, &pair).await;
    crate::support::eventually(Duration::from_secs(60), "CodeDigestMismatch", || {
        refused("CodeDigestMismatch")
    })
    .await;
    assert_eq!(serving(v1, code1).await.as_deref(), Some(config.as_str()));

    // A restart: a new operator, a new (empty) store, the package server back on its port.
    operator.kill().await;
    server.abort();
    let _ = server.await;
    let store = CodeStore::default();
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .expect("rebind");
    let server = package_server(listener, store.clone());
    let operator = crate::support::e2e::Operator::start(
        client.clone(),
        ControllerSettings {
            code_store: store.clone(),
            metrics: raypipe::admin::Metrics::new(),
            readiness: raypipe::admin::Readiness::new(),
            ..settings.clone()
        },
    );
    // The tag still names the tampered version; the running version's code comes back by its
    // manifest digest, for a Ray node that asks for it.
    // (Until the new operator's first reconcile registers it, the package server cannot know
    // the layer; a Ray node asking then gets a 404 and retries its replica.)
    crate::support::eventually(
        Duration::from_secs(60),
        "the code in use registered",
        || {
            let store = store.clone();
            async move { store.knows(&code1.to_hex()).then_some(()) }
        },
    )
    .await;
    let (status, bytes) = get_code(&base, code1).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(Sha256Digest::of(&bytes), code1);
    assert!(store.holds(&code1.to_hex()));
    assert_eq!(serving(v1, code1).await.as_deref(), Some(config.as_str()));
    // Nothing the pipelines do not use is served (or pulled).
    let (status, _) = get_code(&base, code2).await;
    assert_eq!(status, 404);

    // A code-only change (the graph of version 1, new code), signed: a new version.
    let (v3, code3) = push_with_code(
        registry,
        &tag,
        crate::support::e2e::ensemble("1"),
        &format!("{unique}-3"),
    )
    .await;
    crate::source::oci::push_signature(repository, v3, &pair).await;
    let config3 =
        crate::support::eventually(Duration::from_secs(90), "the code-only change", || {
            serving(v3, code3)
        })
        .await;
    assert!(!config3.contains(&code1.to_hex()));
    let p = pipelines.get("team").await.expect("pipeline");
    let source = p.status.and_then(|s| s.source).expect("source");
    assert_eq!(
        source.digest,
        v3.to_string(),
        "with code, the version is the manifest"
    );
    let (status, bytes) = get_code(&base, code3).await;
    assert_eq!((status, Sha256Digest::of(&bytes)), (200, code3));
    // A pipeline whose maxCodeBytes the next version exceeds: refused from the manifest.
    pipelines
        .patch(
            "team",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"source": {"maxCodeBytes": 64}}})),
        )
        .await
        .expect("patched");
    let (v4, _) = push_with_code(
        registry,
        &tag,
        crate::support::e2e::ensemble("1"),
        &format!("{unique}-4"),
    )
    .await;
    crate::source::oci::push_signature(repository, v4, &pair).await;
    crate::support::eventually(Duration::from_secs(60), "CodeTooLarge", || {
        refused("CodeTooLarge")
    })
    .await;
    assert_eq!(serving(v3, code3).await.as_deref(), Some(config3.as_str()));
    operator.kill().await;
    server.abort();
}

/// Trains the digits sample into `out` with `seed` (train.py, scikit-learn's bundled data);
/// returns the held-out set (pixels, labels).
fn train_digits(out: &Path, seed: u32) -> (Vec<serde_json::Value>, Vec<i64>) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/digits/train.py");
    let printed = crate::support::tools::run(
        std::process::Command::new(crate::support::tools::sklearn_python())
            .arg(script)
            .arg("--out")
            .arg(out)
            .arg("--seed")
            .arg(seed.to_string()),
    );
    eprintln!("digits trained (seed {seed}): {}", printed.trim());
    let holdout: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("holdout.json")).expect("holdout"))
            .expect("JSON");
    let pixels = holdout["pixels"].as_array().expect("pixels").clone();
    let labels = holdout["labels"]
        .as_array()
        .expect("labels")
        .iter()
        .map(|l| l.as_i64().expect("a label"))
        .collect();
    (pixels, labels)
}

/// Pushes the digits graph with the package trained into `trained` (its `digits_models`).
async fn push_digits(
    registry: &raypipe::devenv::distribution::DistributionRegistry,
    repository_and_tag: &str,
    trained: &Path,
) -> (Sha256Digest, Sha256Digest, std::time::Instant) {
    let graph =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/graphs/digits.pb"))
            .expect("the digits graph");
    let package =
        raypipe::pypackage::code::pack(&trained.join("digits_models")).expect("the package packs");
    let summary = raypipe::pypackage::code::check(&package.bytes).expect("valid");
    let decoded = raypipe::graph::decode(&graph).expect("a graph");
    let artifact = GraphArtifact::with_code(
        graph,
        &decoded.name,
        &decoded.version,
        Some(CodeLayer {
            bytes: bytes::Bytes::from(package.bytes.as_ref().clone()),
            title: package.file_name.clone(),
            modules: summary.modules,
        }),
    )
    .expect("an artifact");
    let reference: OciReference = registry
        .reference(repository_and_tag)
        .parse()
        .expect("reference");
    let pushed_at = std::time::Instant::now();
    let pushed = fetcher()
        .push_oci(&PushRequest {
            reference: &reference,
            credentials: &RegistryCredentials::basic(USER, PASSWORD),
            artifact: &artifact,
            allow_insecure_http: true,
            ca_bundle_pem: None,
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(60),
        })
        .await
        .expect("pushed");
    (
        pushed.manifest_digest,
        pushed.code_digest.expect("code"),
        pushed_at,
    )
}

/// Classifies `pixels` through Serve; the digit, or why not.
async fn classify(
    http: &reqwest::Client,
    url: &str,
    pixels: &serde_json::Value,
) -> Result<i64, String> {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body(serde_json::json!({"pixels": pixels}).to_string())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let bytes = response.bytes().await.map_err(|e| e.to_string())?;
    let body: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("{status}: {e}"))?;
    if !status.is_success() {
        return Err(format!("{status}: {body}"));
    }
    body["digit"]
        .as_i64()
        .ok_or_else(|| format!("no digit in {body}"))
}

/// The real-model sample on real Ray 2.60: the digits graph and its trained code pushed as one
/// artifact, served by the operator to Ray by digest (no bucket, nothing installed on the Ray
/// node but Ray), answering the held-out images with the accuracy training measured; then a
/// code-only change (retrained weights, same graph) rolls out as a canary under traffic and is
/// served by its own digest, with no failed request.
#[tokio::test]
async fn the_digits_sample_answers_through_serve_and_a_code_only_change_rolls_out_as_a_canary() {
    let work = tempfile::tempdir().expect("tempdir");
    let (v1_dir, v2_dir) = (work.path().join("v1"), work.path().join("v2"));
    let (pixels, labels) = train_digits(&v1_dir, 0);
    let head = crate::support::ray_head();
    let _serve = crate::support::ray_serve_lock().await;
    let registry = oci::basic_registry();
    let unique = raypipe::devenv::random_token().expect("token");
    let repository = format!("code/digits-{}", &unique[..8].to_lowercase());
    let tag = format!("{repository}:live");
    let (v1, code1, _) = push_digits(registry, &tag, &v1_dir).await;

    let client = crate::support::client().await;
    let ns = crate::support::namespace(&client, "digits").await;
    let host = registry.reference("").trim_end_matches('/').to_owned();
    let docker_config =
        serde_json::json!({"auths": {host: {"username": USER, "password": PASSWORD}}});
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("registry".into()),
            ..Default::default()
        },
        data: Some(
            [(
                ".dockerconfigjson".to_owned(),
                ByteString(docker_config.to_string().into_bytes()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("the credentials Secret");
    let store = CodeStore::default();
    let (uris, base) = raypipe::cli::dev::serve_packages_with_code(
        raypipe::cli::dev::dev_packages(),
        store.clone(),
    )
    .await
    .expect("the package server");
    let settings = ControllerSettings {
        namespaces: vec![ns.clone()],
        runtime_py_modules: uris,
        code_store: store,
        code_base_url: Some(base),
        rayservice: Some(raypipe::cli::dev::local_rayservice_config(head).expect("config")),
        ray_serve_url: Some(head.serve_url()),
        fetcher: crate::support::loopback_fetcher(),
        ..ControllerSettings::new(&[
            ControllerKind::Servepipeline,
            ControllerKind::Raycluster,
            ControllerKind::Rayservice,
        ])
    };
    let operator = crate::support::e2e::Operator::start(client.clone(), settings);
    let route = "/digits-e2e";
    let mut pipeline = crate::support::fixture::serving_pipeline(
        "digits",
        serde_json::json!({
            "oci": registry.reference(&tag),
            "credentialsSecretRef": {"name": "registry", "key": ".dockerconfigjson"},
            "allowInsecureHttp": true,
            "refreshInterval": "1s"
        }),
        route,
        serde_json::json!({"name": "ray-head", "image": "rayproject/ray:2.60.0",
            "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}),
    );
    pipeline.spec.rollout = Some(
        serde_json::from_value(serde_json::json!({
            "strategy": "Canary",
            "steps": [{"weight": 50, "pause": "5s"}],
            "gates": {"minRequests": 5}
        }))
        .expect("a rollout policy"),
    );
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    let created = std::time::Instant::now();
    pipelines
        .create(&PostParams::default(), &pipeline)
        .await
        .expect("created");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    crate::support::eventually(
        crate::support::e2e::WAIT,
        "the digits pipeline Ready",
        || {
            let (pipelines, seen) = (pipelines.clone(), seen.clone());
            async move {
                let p = pipelines.get("digits").await.ok()?;
                // What it waits on, each time it changes (a failing deploy says why here).
                let now = serde_json::to_string(
                    &p.status.as_ref().map(|s| (&s.conditions, &s.applications)),
                )
                .unwrap_or_default();
                let mut last = seen.lock().unwrap();
                if *last != now {
                    eprintln!("digits: status {now}");
                    *last = now;
                }
                crate::support::e2e::is_true(&p, "Ready").then_some(())
            }
        },
    )
    .await;
    eprintln!(
        "digits: Ready {:.1}s after creation (manifest {v1}, code {code1})",
        created.elapsed().as_secs_f64()
    );

    // Real inputs, real predictions: the held-out images, never trained on.
    let url = format!("{}{route}", head.serve_url());
    let http = crate::support::fixture::loopback_http(Duration::from_secs(20));
    let checked = 150.min(pixels.len());
    let mut correct = 0;
    for (image, label) in pixels.iter().zip(&labels).take(checked) {
        let digit = classify(&http, &url, image).await.expect("an answer");
        correct += usize::from(digit == *label);
    }
    let accuracy = correct as f64 / checked as f64;
    eprintln!("digits: {correct} of {checked} held-out images right through Serve ({accuracy:.3})");
    assert!(
        accuracy >= 0.93,
        "accuracy {accuracy} on {checked} held-out images"
    );

    // A code-only change under traffic: retrained weights, the same graph.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let (http, url, stop) = (http.clone(), url.clone(), stop.clone());
        let images: Vec<serde_json::Value> = pixels.iter().take(50).cloned().collect();
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match classify(&http, &url, &images[i % images.len()]).await {
                    Ok(_) => ok += 1,
                    Err(e) => failed.push(e),
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (ok, failed)
        })
    };
    train_digits(&v2_dir, 1);
    let (v2, code2, pushed_at) = push_digits(registry, &tag, &v2_dir).await;
    assert_ne!(code1, code2, "retrained weights are new code");
    let rayservices: Api<RayService> = Api::namespaced(client.clone(), &ns);
    crate::support::eventually(
        crate::support::e2e::WAIT,
        "the code change taking canary traffic",
        || {
            let pipelines = pipelines.clone();
            async move {
                let rollout = pipelines.get("digits").await.ok()?.status?.rollout?;
                let canary = rollout.canary?;
                (canary.version.digest == v2.to_string() && canary.weight > 0).then_some(())
            }
        },
    )
    .await;
    let to_canary = pushed_at.elapsed();
    let promoted = crate::support::eventually(
        crate::support::e2e::WAIT,
        "the code change promoted",
        || {
            let pipelines = pipelines.clone();
            async move {
                let rollout = pipelines.get("digits").await.ok()?.status?.rollout?;
                let last = rollout.last?;
                (rollout.stable?.digest == v2.to_string() && last.result == "Promoted")
                    .then_some(last)
            }
        },
    )
    .await;
    let to_promoted = pushed_at.elapsed();
    eprintln!(
        "digits: code-only change: canary serving {:.1}s after the push, promoted after {:.1}s ({})",
        to_canary.as_secs_f64(),
        to_promoted.as_secs_f64(),
        promoted.message
    );
    // Served by its digest: the version application names the new code layer only, once the
    // old version has left.
    let config =
        crate::support::eventually(crate::support::e2e::WAIT, "the old version retired", || {
            let rayservices = rayservices.clone();
            async move {
                let config = rayservices.get("digits").await.ok()?.spec.serve_config_v2?;
                (!config.contains(&code1.to_hex())).then_some(config)
            }
        })
        .await;
    assert!(
        config.contains(&format!("/code-{}.zip", code2.to_hex())),
        "{config}"
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ok, failed) = traffic.await.expect("the client ran");
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        ok as usize + failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert!(ok > 10, "the canary was judged on traffic ({ok} answers)");
    let digit = classify(&http, &url, &pixels[0]).await.expect("an answer");
    assert_eq!(digit, labels[0]);
    operator.kill().await;
    // Leave the shared head without this pipeline's applications.
    let _ = pipelines
        .delete("digits", &kube::api::DeleteParams::default())
        .await;
}
