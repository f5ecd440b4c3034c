//! raypipe's OCI artifacts with the tools teams sign and move them with, run for real
//! (`support::tools`: built from their Go modules once per machine) against the CNCF
//! distribution registry on 127.0.0.1:
//!
//! - cosign v3 signs what `raypipe dag push` pushed — as a sigstore bundle (its default, an OCI
//!   1.1 referrer found through the referrers tag, since distribution has no referrers API) and
//!   in the older simple-signing layout — and the operator's check
//!   (`Fetcher::pull_oci` with `verify`, what `verify.publicKeySecretRef` feeds) accepts it
//!   with the signer's key only, and refuses moved or altered signatures;
//! - oras pushes a graph raypipe pulls, copies one raypipe pushed, and logs in (a password, an
//!   identity token) for raypipe to use.
//!
//! Nothing leaves 127.0.0.0/8: the tools run with `HTTP(S)_PROXY` pointing at a [`Tripwire`]
//! (Go sends loopback requests direct and everything else to the proxy), cosign without
//! Rekor, Fulcio or TUF (an empty signing config and trusted root), and each test asserts the
//! tripwire saw no connection.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use raypipe::source::oci::manifest::{
    Index, Manifest, OCI_INDEX_MEDIA_TYPE, OCI_MANIFEST_MEDIA_TYPE,
};
use raypipe::source::oci::{
    OciOutcome, OciReference, OciRequest, RegistryCredentials, VerificationKey,
};
use raypipe::source::{DestinationPolicy, Fetcher, FetcherOptions, RetryPolicy, Sha256Digest};

use crate::support::oci::{self, IssuerUser, PASSWORD, USER};
use crate::support::tools;

/// A listener that stands in for every host off the loopback and counts who called.
struct Tripwire {
    url: String,
    calls: Arc<AtomicUsize>,
}

impl Tripwire {
    fn new() -> Tripwire {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the tripwire");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        // Lives as long as the test binary; every connection is counted and dropped.
        std::thread::spawn(move || {
            for connection in listener.incoming() {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(connection);
            }
        });
        Tripwire { url, calls }
    }

    /// The proxy settings every tool runs with.
    fn env(&self) -> Vec<(&'static str, String)> {
        ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"]
            .into_iter()
            .map(|name| (name, self.url.clone()))
            .chain([("NO_PROXY", String::new()), ("no_proxy", String::new())])
            .collect()
    }

    fn assert_untouched(&self) {
        assert_eq!(
            self.calls.load(Ordering::SeqCst),
            0,
            "a tool tried to reach a host off the loopback"
        );
    }
}

/// A working directory with a Docker config holding `auths` for the htpasswd registry.
struct Workspace {
    dir: tempfile::TempDir,
    tripwire: Tripwire,
}

impl Workspace {
    fn new() -> Workspace {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("docker")).expect("docker dir");
        Workspace {
            dir,
            tripwire: Tripwire::new(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn docker_config(&self) -> PathBuf {
        self.path().join("docker")
    }

    fn write_docker_config(&self, config: &serde_json::Value) {
        std::fs::write(self.docker_config().join("config.json"), config.to_string())
            .expect("write config.json");
    }

    fn login_basic_registry(&self) {
        use base64::Engine as _;
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
        let host = oci::basic_registry().host.as_str();
        self.write_docker_config(&serde_json::json!({"auths": {host: {"auth": auth}}}));
    }

    /// Runs a Go tool: [`Workspace::run_program`] with the tripwire as proxy (Go sends loopback
    /// requests direct, so only a request elsewhere reaches it).
    fn run(
        &self,
        program: &Path,
        args: &[&str],
        stdin: &str,
        env: &[(&str, &str)],
    ) -> (bool, String, String) {
        let proxy = self.tripwire.env();
        let mut env: Vec<(&str, &str)> = env.to_vec();
        env.extend(proxy.iter().map(|(name, value)| (*name, value.as_str())));
        self.run_program(program, args, stdin, &env)
    }

    /// Runs `program ARGS` in the workspace with its Docker config, `HOME` and TUF root;
    /// (success, stdout, stderr).
    fn run_program(
        &self,
        program: &Path,
        args: &[&str],
        stdin: &str,
        env: &[(&str, &str)],
    ) -> (bool, String, String) {
        use std::io::Write as _;
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(self.path())
            .env("DOCKER_CONFIG", self.docker_config())
            .env("HOME", self.path())
            .env("TUF_ROOT", self.path().join("tuf"))
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("{} runs: {e}", program.display()));
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        let output = child.wait_with_output().expect("the tool ends");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// raypipe itself honours a proxy for every host (loopback included), so it runs without
    /// the tripwire; it only ever talks to the registry it is given.
    fn raypipe(&self, args: &[&str]) -> (bool, String, String) {
        self.run_program(Path::new(env!("CARGO_BIN_EXE_raypipe")), args, "", &[])
    }

    /// `raypipe dag push SAMPLE REFERENCE`; the manifest digest.
    fn push_sample(&self, sample: &str, reference: &str) -> Sha256Digest {
        let file = sample_path(sample);
        let (ok, out, err) = self.raypipe(&[
            "dag",
            "push",
            file.to_str().expect("utf-8"),
            reference,
            "--plain-http",
        ]);
        assert!(ok, "raypipe dag push: {err}");
        digest_of(out.trim())
    }

    fn cosign(&self, args: &[&str]) -> (bool, String, String) {
        self.run(
            tools::cosign(),
            args,
            "",
            &[("COSIGN_PASSWORD", COSIGN_PASSWORD)],
        )
    }

    /// `cosign generate-key-pair` in `subdir`; the public key.
    fn cosign_key_pair(&self, subdir: &str) -> (PathBuf, VerificationKey) {
        let dir = self.path().join(subdir);
        std::fs::create_dir_all(&dir).expect("key dir");
        let prefix = dir.join("cosign");
        let (ok, _, err) = self.cosign(&[
            "generate-key-pair",
            "--output-key-prefix",
            prefix.to_str().expect("utf-8"),
        ]);
        assert!(ok, "cosign generate-key-pair: {err}");
        let pem = std::fs::read(dir.join("cosign.pub")).expect("cosign.pub");
        let key = VerificationKey::from_pem(&pem).expect("raypipe reads cosign's public key");
        (dir.join("cosign.key"), key)
    }

    /// `cosign sign --key` of `repository@digest` in the htpasswd registry, offline: a
    /// signing config and trusted root without any service, so no Rekor, Fulcio, TSA or TUF.
    fn cosign_sign(&self, key: &Path, repository: &str, digest: Sha256Digest, extra: &[&str]) {
        let signing_config = self.path().join("signing-config.json");
        let trusted_root = self.path().join("trusted-root.json");
        std::fs::write(
            &signing_config,
            serde_json::json!({
                "mediaType": "application/vnd.dev.sigstore.signingconfig.v0.2+json",
                "caUrls": [], "oidcUrls": [], "rekorTlogUrls": [], "tsaUrls": [],
                "rekorTlogConfig": {"selector": "ANY"}, "tsaConfig": {"selector": "ANY"},
            })
            .to_string(),
        )
        .expect("signing config");
        std::fs::write(
            &trusted_root,
            serde_json::json!({
                "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
                "tlogs": [], "certificateAuthorities": [], "ctlogs": [],
                "timestampAuthorities": [],
            })
            .to_string(),
        )
        .expect("trusted root");
        let reference = oci::basic_registry().reference(&format!("{repository}@{digest}"));
        let mut args = vec![
            "sign",
            "--key",
            key.to_str().expect("utf-8"),
            "--allow-http-registry",
            "--yes",
        ];
        let offline = [
            "--signing-config",
            signing_config.to_str().expect("utf-8"),
            "--trusted-root",
            trusted_root.to_str().expect("utf-8"),
        ];
        // The old layout takes the deprecated switches instead (a signing config implies the
        // bundle format).
        if extra.contains(&"--new-bundle-format=false") {
            args.extend(["--use-signing-config=false", "--tlog-upload=false"]);
        } else {
            args.extend(offline);
        }
        args.extend_from_slice(extra);
        args.push(&reference);
        let (ok, _, err) = self.cosign(&args);
        assert!(ok, "cosign sign: {err}");
    }
}

const COSIGN_PASSWORD: &str = "cosign-key-password";

fn sample_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples/graphs")
        .join(name)
}

fn digest_of(text: &str) -> Sha256Digest {
    text.strip_prefix("sha256:")
        .and_then(|hex| hex.parse().ok())
        .unwrap_or_else(|| panic!("not a digest: {text:?}"))
}

/// The operator's pull (`source.oci` with `verify.publicKeySecretRef`): `Fetcher::pull_oci`.
async fn operator_pull(
    reference: &str,
    key: &VerificationKey,
) -> Result<OciOutcome, raypipe::source::SourceError> {
    raypipe::startup::init_crypto();
    let fetcher = Fetcher::with_options(FetcherOptions {
        honor_proxy_environment: false,
        allowed_destinations: DestinationPolicy::with_loopback(),
        ..FetcherOptions::default()
    });
    let reference: OciReference = oci::basic_registry()
        .reference(reference)
        .parse()
        .expect("a reference");
    let credentials = RegistryCredentials::basic(USER, PASSWORD);
    let request = OciRequest {
        verify: Some(key),
        allow_insecure_http: true,
        retry: RetryPolicy::NONE,
        ..OciRequest::new(&reference, &credentials)
    };
    fetcher.pull_oci(&request).await
}

fn reason(result: Result<OciOutcome, raypipe::source::SourceError>) -> String {
    match result {
        Ok(outcome) => format!("Ok({outcome:?})"),
        Err(error) => {
            assert!(!error.to_string().contains(PASSWORD), "{error}");
            error.reason().to_owned()
        }
    }
}

/// Plain distribution API calls on the htpasswd registry, to move and alter what cosign
/// stored.
struct RegistryApi {
    client: reqwest::Client,
}

impl RegistryApi {
    fn new() -> RegistryApi {
        raypipe::startup::init_crypto();
        RegistryApi {
            client: reqwest::Client::new(),
        }
    }

    async fn get(&self, path: &str, accept: &str) -> Vec<u8> {
        let response = self
            .client
            .get(oci::basic_registry().url(path))
            .basic_auth(USER, Some(PASSWORD))
            .header("accept", accept)
            .send()
            .await
            .expect("the registry answers");
        assert_eq!(response.status(), 200, "GET {path}");
        response.bytes().await.expect("a body").to_vec()
    }

    async fn put_manifest(&self, repository: &str, name: &str, media_type: &str, bytes: Vec<u8>) {
        let response = self
            .client
            .put(oci::basic_registry().url(&format!("/v2/{repository}/manifests/{name}")))
            .basic_auth(USER, Some(PASSWORD))
            .header("content-type", media_type)
            .body(bytes)
            .send()
            .await
            .expect("the registry answers");
        assert_eq!(response.status(), 201, "PUT manifest {name}");
    }

    async fn put_blob(&self, repository: &str, bytes: &[u8]) -> Sha256Digest {
        let digest = Sha256Digest::of(bytes);
        let registry = oci::basic_registry();
        let session = self
            .client
            .post(registry.url(&format!("/v2/{repository}/blobs/uploads/")))
            .basic_auth(USER, Some(PASSWORD))
            .send()
            .await
            .expect("upload session");
        assert_eq!(session.status(), 202);
        let location = session
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .expect("a location")
            .to_owned();
        let mut url = reqwest::Url::parse(&registry.url("/"))
            .and_then(|base| base.join(&location))
            .expect("upload URL");
        url.query_pairs_mut()
            .append_pair("digest", &digest.to_string());
        let response = self
            .client
            .put(url)
            .basic_auth(USER, Some(PASSWORD))
            .body(bytes.to_vec())
            .send()
            .await
            .expect("upload");
        assert_eq!(response.status(), 201, "blob upload");
        digest
    }

    /// The index under the referrers tag of `digest` (cosign's fallback for registries
    /// without the referrers API).
    async fn referrers(&self, repository: &str, digest: Sha256Digest) -> Index {
        let bytes = self
            .get(
                &format!("/v2/{repository}/manifests/sha256-{}", digest.to_hex()),
                OCI_INDEX_MEDIA_TYPE,
            )
            .await;
        serde_json::from_slice(&bytes).expect("an index")
    }
}

/// cosign v3's default: a sigstore bundle (DSSE, in-toto statement) as an OCI 1.1 referrer.
#[tokio::test]
async fn cosign_v3_bundles_are_accepted_with_the_signers_key_only() {
    let ws = Workspace::new();
    ws.login_basic_registry();
    let repository = "interop/cosign-bundle";
    let registry = oci::basic_registry();
    let v1 = ws.push_sample(
        "ensemble.yaml",
        &registry.reference(&format!("{repository}:v1")),
    );
    let v2 = ws.push_sample(
        "ensemble-v2.yaml",
        &registry.reference(&format!("{repository}:v2")),
    );
    let (signing_key, key) = ws.cosign_key_pair("signer");
    let (other_signing_key, other_key) = ws.cosign_key_pair("other");
    let tagged = |tag: &str| format!("{repository}:{tag}");

    assert_eq!(
        reason(operator_pull(&tagged("v1"), &key).await),
        "SignatureMissing"
    );
    ws.cosign_sign(&signing_key, repository, v1, &[]);
    let api = RegistryApi::new();
    let listed = api.referrers(repository, v1).await;
    assert!(
        listed.manifests.iter().any(|d| d
            .artifact_type
            .as_deref()
            .is_some_and(|t| t.starts_with("application/vnd.dev.sigstore.bundle"))),
        "cosign wrote a sigstore bundle referrer: {listed:?}"
    );
    let pulled = operator_pull(&tagged("v1"), &key)
        .await
        .expect("a graph signed by the key");
    let expected = std::fs::read(sample_path("ensemble.pb")).expect("sample");
    assert!(
        matches!(&pulled, OciOutcome::Fetched { bytes, manifest_digest, .. }
        if *bytes == expected[..] && *manifest_digest == v1)
    );
    assert_eq!(
        reason(operator_pull(&tagged("v1"), &other_key).await),
        "SignatureInvalid"
    );

    // v2 signed by another key: refused with ours.
    ws.cosign_sign(&other_signing_key, repository, v2, &[]);
    assert_eq!(
        reason(operator_pull(&tagged("v2"), &key).await),
        "SignatureInvalid"
    );
    assert!(matches!(
        operator_pull(&tagged("v2"), &other_key).await,
        Ok(OciOutcome::Fetched { .. })
    ));

    // v1's genuine bundle listed as v2's referrer: it signs v1's digest, so not v2.
    let v1_index = api
        .get(
            &format!("/v2/{repository}/manifests/sha256-{}", v1.to_hex()),
            OCI_INDEX_MEDIA_TYPE,
        )
        .await;
    api.put_manifest(
        repository,
        &format!("sha256-{}", v2.to_hex()),
        OCI_INDEX_MEDIA_TYPE,
        v1_index.clone(),
    )
    .await;
    let error = operator_pull(&tagged("v2"), &key)
        .await
        .expect_err("a bundle for another digest");
    assert_eq!(error.reason(), "SignatureInvalid");
    assert!(error.to_string().contains("not this one"), "{error}");

    // v1's bundle with its signature altered, in place of the genuine one.
    let descriptor = listed.manifests.first().expect("a referrer").clone();
    let bundle_manifest: Manifest = serde_json::from_slice(
        &api.get(
            &format!("/v2/{repository}/manifests/{}", descriptor.digest),
            OCI_MANIFEST_MEDIA_TYPE,
        )
        .await,
    )
    .expect("the bundle manifest");
    let layer = bundle_manifest
        .layers
        .first()
        .expect("the bundle layer")
        .clone();
    let bundle = api
        .get(
            &format!("/v2/{repository}/blobs/{}", layer.digest),
            "application/octet-stream",
        )
        .await;
    let mut altered: serde_json::Value = serde_json::from_slice(&bundle).expect("bundle JSON");
    let statement = altered["dsseEnvelope"]["payload"]
        .as_str()
        .expect("a DSSE payload")
        .to_owned();
    // Re-encoded with one more byte of whitespace: the same statement, other signed bytes.
    {
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::STANDARD;
        let mut decoded = engine.decode(statement).expect("base64");
        decoded.push(b' ');
        altered["dsseEnvelope"]["payload"] = engine.encode(decoded).into();
    }
    let altered = altered.to_string().into_bytes();
    api.put_blob(repository, &altered).await;
    let mut altered_manifest = bundle_manifest.clone();
    let altered_layer = altered_manifest.layers.first_mut().expect("layer");
    altered_layer.digest = Sha256Digest::of(&altered).to_string();
    altered_layer.size = altered.len() as u64;
    let altered_manifest = serde_json::to_vec(&altered_manifest).expect("manifest");
    let altered_digest = Sha256Digest::of(&altered_manifest);
    api.put_manifest(
        repository,
        &altered_digest.to_string(),
        OCI_MANIFEST_MEDIA_TYPE,
        altered_manifest.clone(),
    )
    .await;
    let mut index: serde_json::Value = serde_json::from_slice(&v1_index).expect("index JSON");
    index["manifests"][0]["digest"] = altered_digest.to_string().into();
    index["manifests"][0]["size"] = altered_manifest.len().into();
    api.put_manifest(
        repository,
        &format!("sha256-{}", v1.to_hex()),
        OCI_INDEX_MEDIA_TYPE,
        index.to_string().into_bytes(),
    )
    .await;
    let error = operator_pull(&tagged("v1"), &key)
        .await
        .expect_err("an altered bundle");
    assert_eq!(error.reason(), "SignatureInvalid");
    assert!(error.to_string().contains("does not verify"), "{error}");

    ws.tripwire.assert_untouched();
}

/// cosign v3 still writes the simple-signing layout (`sha256-<hex>.sig`) when asked.
#[tokio::test]
async fn cosign_simple_signatures_still_verify() {
    let ws = Workspace::new();
    ws.login_basic_registry();
    let repository = "interop/cosign-simple";
    let registry = oci::basic_registry();
    let digest = ws.push_sample(
        "ensemble.yaml",
        &registry.reference(&format!("{repository}:v1")),
    );
    let (signing_key, key) = ws.cosign_key_pair("signer");
    let (_, other_key) = ws.cosign_key_pair("other");
    ws.cosign_sign(
        &signing_key,
        repository,
        digest,
        &["--new-bundle-format=false"],
    );
    let tags = RegistryApi::new()
        .get(&format!("/v2/{repository}/tags/list"), "application/json")
        .await;
    let tags = String::from_utf8_lossy(&tags);
    assert!(
        tags.contains(&format!("sha256-{}.sig", digest.to_hex())),
        "cosign wrote the .sig tag: {tags}"
    );
    let tagged = format!("{repository}:v1");
    assert!(matches!(
        operator_pull(&tagged, &key).await,
        Ok(OciOutcome::Fetched { .. })
    ));
    assert_eq!(
        reason(operator_pull(&tagged, &other_key).await),
        "SignatureInvalid"
    );
    ws.tripwire.assert_untouched();
}

/// oras and raypipe read each other's artifacts and logins.
#[test]
fn oras_and_raypipe_share_artifacts_and_logins() {
    let ws = Workspace::new();
    let registry = oci::basic_registry();
    let oras = tools::oras();

    // `oras login` writes the Docker config raypipe reads.
    let (ok, _, err) = ws.run(
        oras,
        &[
            "login",
            "--plain-http",
            "--username",
            USER,
            "--password-stdin",
            &registry.host,
        ],
        PASSWORD,
        &[],
    );
    assert!(ok, "oras login: {err}");

    // A graph pushed by oras with raypipe's media types, pulled by raypipe.
    let graph = std::fs::read(sample_path("ensemble.pb")).expect("sample");
    std::fs::write(ws.path().join("graph.pb"), &graph).expect("write");
    let by_oras = registry.reference("interop/oras-pushed:v1");
    let (ok, _, err) = ws.run(
        oras,
        &[
            "push",
            "--plain-http",
            "--artifact-type",
            raypipe::source::oci::GRAPH_ARTIFACT_TYPE,
            &by_oras,
            &format!("graph.pb:{}", raypipe::source::oci::GRAPH_LAYER_MEDIA_TYPE),
        ],
        "",
        &[],
    );
    assert!(ok, "oras push: {err}");
    let (ok, out, err) = ws.raypipe(&["dag", "pull", &by_oras, "--plain-http", "--format", "json"]);
    assert!(ok, "raypipe dag pull of oras's push: {err}");
    assert!(out.contains("ensemble"), "{out}");

    // A graph raypipe pushed, copied by oras into an OCI layout: the layer holds the graph's
    // protobuf bytes under raypipe's media types. (`oras pull` writes only layers with an
    // `org.opencontainers.image.title`, which raypipe's artifact does not set.)
    let by_raypipe = registry.reference("interop/raypipe-pushed:v1");
    let manifest_digest = ws.push_sample("ensemble.yaml", &by_raypipe);
    let (ok, _, err) = ws.run(
        oras,
        &[
            "copy",
            "--from-plain-http",
            &by_raypipe,
            "--to-oci-layout",
            "layout:v1",
        ],
        "",
        &[],
    );
    assert!(ok, "oras copy: {err}");
    let blob = |digest: &str| {
        let hex = digest.strip_prefix("sha256:").expect("sha256");
        std::fs::read(ws.path().join("layout/blobs/sha256").join(hex)).expect("a blob")
    };
    let manifest: Manifest =
        serde_json::from_slice(&blob(&manifest_digest.to_string())).expect("the manifest");
    let (layer, graph_digest) = manifest.graph_layer().expect("a graph artifact");
    assert_eq!(
        layer.media_type,
        raypipe::source::oci::GRAPH_LAYER_MEDIA_TYPE
    );
    assert_eq!(blob(&graph_digest.to_string()), graph);

    // An identity token `oras login` stores (after checking it at the realm) is what raypipe
    // exchanges for its own tokens.
    let oci::TokenRegistry {
        registry: token_registry,
        issuer,
    } = oci::token_registry();
    const REFRESH: &str = "refresh-oras-login-5a7c";
    issuer.add_user("interop-oras", IssuerUser::full_access("not-used-here"));
    issuer.add_refresh_token(REFRESH, "interop-oras");
    let (ok, _, err) = ws.run(
        oras,
        &[
            "login",
            "--plain-http",
            "--identity-token-stdin",
            &token_registry.host,
        ],
        REFRESH,
        &[],
    );
    assert!(ok, "oras login --identity-token-stdin: {err}");
    let config =
        std::fs::read_to_string(ws.docker_config().join("config.json")).expect("config.json");
    assert!(
        config.contains("identitytoken"),
        "oras stored an identity token"
    );
    // Tests run side by side on the shared issuer: count this user's grants only.
    let grants = || {
        issuer
            .requests()
            .iter()
            .filter(|seen| {
                seen.grant.as_deref() == Some("refresh_token")
                    && seen.issued
                    && seen.user.as_deref() == Some("interop-oras")
            })
            .count()
    };
    let before = grants();
    let pushed = ws.push_sample(
        "ensemble.yaml",
        &token_registry.reference("interop/oras-identity:v1"),
    );
    let (ok, out, err) = ws.run(
        oras,
        &[
            "manifest",
            "fetch",
            "--plain-http",
            "--descriptor",
            &token_registry.reference("interop/oras-identity:v1"),
        ],
        "",
        &[],
    );
    assert!(ok, "oras manifest fetch with its identity token: {err}");
    assert!(out.contains(&pushed.to_string()), "{out}");
    let after = grants();
    assert!(
        after > before,
        "raypipe and oras used the refresh-token grant"
    );
    ws.tripwire.assert_untouched();
}
