//! OCI sources against the real CNCF distribution registry with the token flow
//! (`support::oci::token_registry`, its own token issuer): pulls by tag and by digest, and the
//! reason of each refusal — wrong password, expired token, missing tag, wrong media type,
//! unsigned and wrongly signed artifacts — through the fetcher, and through a running operator
//! (a new push to the tag rolls out; a refused one keeps the running version).
//!
//! Artifacts are pushed here with plain distribution API calls (monolithic blob upload,
//! manifest PUT), independent of `raypipe dag push`, so a push-side bug cannot hide a
//! pull-side one. Every test uses its own repository.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use raypipe::source::oci::manifest::{
    Descriptor, GRAPH_LAYER_MEDIA_TYPE, Manifest, OCI_MANIFEST_MEDIA_TYPE,
};
use raypipe::source::oci::verify::{SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE};
use raypipe::source::oci::{
    OciOutcome, OciReference, OciRequest, RegistryCredentials, VerificationKey,
};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};

use super::*;
use crate::support::oci::{IssuerUser, PASSWORD, SERVICE, USER, token_registry};

fn fetcher() -> Fetcher {
    Fetcher::with_options(FetcherOptions {
        honor_proxy_environment: false,
        allowed_destinations: DestinationPolicy::with_loopback(),
        ..FetcherOptions::default()
    })
}

/// A push token for `repository` from the issuer.
async fn push_token(repository: &str) -> String {
    let issuer = &token_registry().issuer;
    let mut url = reqwest::Url::parse(&issuer.realm).expect("realm URL");
    url.query_pairs_mut()
        .append_pair("service", SERVICE)
        .append_pair("scope", &format!("repository:{repository}:pull,push"));
    let response = http()
        .get(url)
        .basic_auth(USER, Some(PASSWORD))
        .send()
        .await
        .expect("token request");
    assert!(response.status().is_success(), "{}", response.status());
    let body: serde_json::Value =
        serde_json::from_slice(&response.bytes().await.expect("token body")).expect("JSON");
    body["token"].as_str().expect("a token").to_owned()
}

/// A plain client for the test's own pushes.
fn http() -> reqwest::Client {
    raypipe::startup::init_crypto();
    reqwest::Client::new()
}

fn descriptor(media_type: &str, bytes: &[u8]) -> Descriptor {
    Descriptor::of(media_type, bytes)
}

/// POST an upload session, then PUT the bytes with their digest (the two-step upload every
/// registry supports).
async fn upload_blob(repository: &str, token: &str, bytes: &[u8]) {
    let registry = &token_registry().registry;
    let digest = Sha256Digest::of(bytes).to_string();
    let start = reqwest::Url::parse(&registry.url(&format!("/v2/{repository}/blobs/uploads/")))
        .expect("upload URL");
    let session = http()
        .post(start.clone())
        .bearer_auth(token)
        .send()
        .await
        .expect("upload session");
    assert_eq!(
        session.status().as_u16(),
        202,
        "upload session for {digest}"
    );
    let location = session
        .headers()
        .get("location")
        .and_then(|value| value.to_str().ok())
        .expect("a Location");
    let mut url = start.join(location).expect("upload location");
    url.query_pairs_mut().append_pair("digest", &digest);
    let response = http()
        .put(url)
        .bearer_auth(token)
        .header("content-type", "application/octet-stream")
        .body(bytes.to_vec())
        .send()
        .await
        .expect("blob upload");
    assert_eq!(response.status().as_u16(), 201, "blob upload of {digest}");
}

async fn put_manifest(
    repository: &str,
    token: &str,
    tag: &str,
    manifest: &Manifest,
) -> Sha256Digest {
    let registry = &token_registry().registry;
    let bytes = serde_json::to_vec(manifest).expect("manifest JSON");
    let response = http()
        .put(registry.url(&format!("/v2/{repository}/manifests/{tag}")))
        .bearer_auth(token)
        .header("content-type", OCI_MANIFEST_MEDIA_TYPE)
        .body(bytes.clone())
        .send()
        .await
        .expect("manifest PUT");
    assert_eq!(response.status().as_u16(), 201, "manifest PUT {tag}");
    Sha256Digest::of(&bytes)
}

/// Pushes `graph` as a one-layer artifact of `layer_media_type` under `tag`; returns the
/// manifest digest.
pub(crate) async fn push(
    repository: &str,
    tag: &str,
    layer_media_type: &str,
    graph: &[u8],
) -> Sha256Digest {
    let token = push_token(repository).await;
    upload_blob(repository, &token, b"{}").await;
    upload_blob(repository, &token, graph).await;
    let manifest = Manifest::graph_artifact(layer_media_type, graph, Default::default());
    put_manifest(repository, &token, tag, &manifest).await
}

/// A P-256 key pair and its public key as cosign writes it (PEM SubjectPublicKeyInfo).
pub(crate) fn signer() -> (EcdsaKeyPair, String) {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).expect("key");
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
        .expect("key pair");
    // SubjectPublicKeyInfo of a P-256 key: a fixed header, then the uncompressed point.
    let mut spki = vec![
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
        0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ];
    spki.extend_from_slice(pair.public_key().as_ref());
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        BASE64.encode(&spki)
    );
    (pair, pem)
}

/// Pushes a cosign signature of `digest` by `pair` under cosign's tag `sha256-<hex>.sig`.
pub(crate) async fn push_signature(repository: &str, digest: Sha256Digest, pair: &EcdsaKeyPair) {
    let payload = format!(
        r#"{{"critical":{{"identity":{{"docker-reference":"{repository}"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
    )
    .into_bytes();
    let signature = pair
        .sign(&SystemRandom::new(), &payload)
        .expect("signature");
    let token = push_token(repository).await;
    upload_blob(repository, &token, b"{}").await;
    upload_blob(repository, &token, &payload).await;
    let mut layer = descriptor(SIMPLE_SIGNING_MEDIA_TYPE, &payload);
    layer.annotations.insert(
        SIGNATURE_ANNOTATION.into(),
        BASE64.encode(signature.as_ref()),
    );
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST_MEDIA_TYPE.into()),
        artifact_type: None,
        config: descriptor("application/vnd.oci.image.config.v1+json", b"{}"),
        layers: vec![layer],
        subject: None,
        annotations: Default::default(),
    };
    let tag = format!("sha256-{}.sig", digest.to_hex());
    put_manifest(repository, &token, &tag, &manifest).await;
}

async fn pull(
    reference: &str,
    credentials: &RegistryCredentials,
    previous: Option<Sha256Digest>,
    verify: Option<&VerificationKey>,
) -> Result<OciOutcome, SourceError> {
    let reference: OciReference = token_registry()
        .registry
        .reference(reference)
        .parse()
        .expect("a reference");
    let request = OciRequest {
        previous_manifest_digest: previous,
        verify,
        allow_insecure_http: true,
        retry: RetryPolicy::NONE,
        ..OciRequest::new(&reference, credentials)
    };
    fetcher().pull_oci(&request).await
}

fn user() -> RegistryCredentials {
    RegistryCredentials::basic(USER, PASSWORD)
}

/// The reason of a refusal, after checking that its message holds no secret.
fn refusal(result: Result<OciOutcome, SourceError>) -> &'static str {
    let error = result.expect_err("the pull must be refused");
    let shown = format!("{error} {error:?}");
    for secret in [PASSWORD, "wrong-password"] {
        assert!(!shown.contains(secret), "a secret leaked: {shown}");
    }
    error.reason()
}

#[tokio::test]
async fn pulls_by_tag_and_by_digest_check_both_digests() {
    let repository = "oci-client/pull";
    let graph = GRAPH.to_vec();
    let digest = push(repository, "v1", GRAPH_LAYER_MEDIA_TYPE, &graph).await;

    let by_tag = pull(&format!("{repository}:v1"), &user(), None, None)
        .await
        .expect("pull by tag");
    let OciOutcome::Fetched {
        bytes,
        manifest_digest,
        graph_digest,
        ..
    } = by_tag
    else {
        panic!("expected a graph, got {by_tag:?}");
    };
    assert_eq!(bytes, GRAPH);
    assert_eq!(manifest_digest, digest);
    assert_eq!(graph_digest, Sha256Digest::of(GRAPH));

    let by_digest = pull(&format!("{repository}@{digest}"), &user(), None, None)
        .await
        .expect("pull by digest");
    assert!(matches!(by_digest, OciOutcome::Fetched { bytes, .. } if bytes == GRAPH));
    let unchanged = pull(&format!("{repository}:v1"), &user(), Some(digest), None)
        .await
        .expect("poll");
    assert_eq!(
        unchanged,
        OciOutcome::Unchanged {
            manifest_digest: digest
        }
    );
}

#[tokio::test]
async fn each_refusal_has_its_own_reason() {
    let repository = "oci-client/refusals";
    push(repository, "v1", GRAPH_LAYER_MEDIA_TYPE, GRAPH).await;
    push(repository, "text", "text/plain", b"not a graph").await;
    let tagged = format!("{repository}:v1");

    let wrong_password = RegistryCredentials::basic(USER, "wrong-password");
    assert_eq!(
        refusal(pull(&tagged, &wrong_password, None, None).await),
        "RegistryUnauthorized"
    );
    assert_eq!(
        refusal(pull(&tagged, &RegistryCredentials::Anonymous, None, None).await),
        "RegistryUnauthorized"
    );
    let issuer = &token_registry().issuer;
    issuer.add_user(
        "oci-client-expired",
        IssuerUser {
            lifetime_secs: -120,
            ..IssuerUser::full_access("expired-pw")
        },
    );
    let expired = RegistryCredentials::basic("oci-client-expired", "expired-pw");
    assert_eq!(
        refusal(pull(&tagged, &expired, None, None).await),
        "TokenExpired"
    );
    // A token for another repository only: the registry refuses it for this one.
    issuer.add_user(
        "oci-client-elsewhere",
        IssuerUser::only("elsewhere-pw", "oci-client/other", &["pull"]),
    );
    let elsewhere = RegistryCredentials::basic("oci-client-elsewhere", "elsewhere-pw");
    assert_eq!(
        refusal(pull(&tagged, &elsewhere, None, None).await),
        "TokenRejected"
    );
    assert_eq!(
        refusal(pull(&format!("{repository}:v9"), &user(), None, None).await),
        "TagNotFound"
    );
    assert_eq!(
        refusal(pull(&format!("{repository}:text"), &user(), None, None).await),
        "WrongMediaType"
    );
}

#[tokio::test]
async fn signatures_are_checked_before_the_graph_is_fetched() {
    let repository = "oci-client/signed";
    let digest = push(repository, "v1", GRAPH_LAYER_MEDIA_TYPE, GRAPH).await;
    let tagged = format!("{repository}:v1");
    let (pair, pem) = signer();
    let (other, _) = signer();
    let key = VerificationKey::from_pem(pem.as_bytes()).expect("key");

    assert_eq!(
        refusal(pull(&tagged, &user(), None, Some(&key)).await),
        "SignatureMissing"
    );
    push_signature(repository, digest, &other).await;
    assert_eq!(
        refusal(pull(&tagged, &user(), None, Some(&key)).await),
        "SignatureInvalid"
    );
    push_signature(repository, digest, &pair).await;
    let signed = pull(&tagged, &user(), None, Some(&key))
        .await
        .expect("a signed graph");
    assert!(matches!(signed, OciOutcome::Fetched { bytes, .. } if bytes == GRAPH));
}

/// The operator's reading of a `kubernetes.io/dockerconfigjson` Secret: an `identitytoken`
/// (what `docker login` to ACR or GCR leaves) is exchanged at the realm with the OAuth2
/// refresh-token grant; a Secret that only names credential helpers is refused with a reason
/// (the operator never runs a program a Secret names).
#[tokio::test]
async fn an_identity_token_in_a_pull_secret_is_exchanged_at_the_realm() {
    let repository = "oci-client/identity";
    push(repository, "v1", GRAPH_LAYER_MEDIA_TYPE, GRAPH).await;
    let crate::support::oci::TokenRegistry { registry, issuer } = token_registry();
    let host = registry.host.as_str();
    issuer.add_user("oci-client-identity", IssuerUser::full_access("unused-pw"));
    issuer.add_refresh_token("refresh-oci-client-7b1e", "oci-client-identity");
    let secret = |token: &str| {
        serde_json::json!({"auths": {host: {
            "auth": BASE64.encode("00000000-0000-0000-0000-000000000000:"),
            "identitytoken": token}}})
        .to_string()
    };
    let credentials =
        RegistryCredentials::from_docker_config(secret("refresh-oci-client-7b1e").as_bytes(), host)
            .expect("a usable Secret");
    let pulled = pull(&format!("{repository}:v1"), &credentials, None, None)
        .await
        .expect("pulled with the identity token");
    assert!(matches!(pulled, OciOutcome::Fetched { bytes, .. } if bytes == GRAPH));
    assert!(issuer.requests().iter().any(|seen| seen.issued
        && seen.grant.as_deref() == Some("refresh_token")
        && seen.user.as_deref() == Some("oci-client-identity")));

    let revoked =
        RegistryCredentials::from_docker_config(secret("refresh-revoked-7b1e").as_bytes(), host)
            .expect("a usable Secret");
    let error = pull(&format!("{repository}:v1"), &revoked, None, None)
        .await
        .expect_err("a revoked identity token");
    assert_eq!(error.reason(), "RegistryUnauthorized");
    assert!(
        !format!("{error} {error:?}").contains("revoked-7b1e"),
        "{error}"
    );

    let helpers_only = serde_json::json!({"auths": {}, "credsStore": "desktop"}).to_string();
    let problem = RegistryCredentials::from_docker_config(helpers_only.as_bytes(), host)
        .expect_err("helpers are not run by the operator");
    assert!(problem.0.contains("credential helpers"), "{problem}");
}

/// Through the operator: the pipeline follows its tag (the manifest digest is the change
/// signal), and an artifact pushed to the tag that is not a graph is refused with its own
/// reason while the RayService keeps the running version.
#[tokio::test]
async fn the_operator_rolls_out_a_new_push_and_keeps_the_running_version_on_a_refused_one() {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, PostParams};
    use raypipe::api::conditions;
    use raypipe::api::rayservice::RayService;
    use raypipe::api::servepipeline::ServePipeline;

    let repository = "oci-client/operator";
    let registry = &token_registry().registry;
    let first = push(
        repository,
        "live",
        GRAPH_LAYER_MEDIA_TYPE,
        &crate::support::e2e::ensemble("1"),
    )
    .await;

    let client = crate::support::client().await;
    let ns = crate::support::namespace(&client, "source-oci").await;
    let host = registry.reference("").trim_end_matches('/').to_owned();
    let docker_config =
        serde_json::json!({"auths": {host: {"username": USER, "password": PASSWORD}}});
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("registry".into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/dockerconfigjson".into()),
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
    let (_stop, _operator) = crate::support::spawn_operator(
        client.clone(),
        vec![
            "--controllers=servepipeline".to_owned(),
            format!("--namespaces={ns}"),
            format!("--operator-namespace={ns}"),
            "--leader-election=false".to_owned(),
            "--admin-address=127.0.0.1:0".to_owned(),
        ],
    );
    let pipeline: ServePipeline = serde_json::from_value(serde_json::json!({
        "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline",
        "metadata": {"name": "from-oci"},
        "spec": {
            "source": {
                "oci": registry.reference(&format!("{repository}:live")),
                "credentialsSecretRef": {"name": "registry", "key": ".dockerconfigjson"},
                "allowInsecureHttp": true,
                "refreshInterval": "1s"
            },
            "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
                "template": {"spec": {"containers": [
                    {"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}}}
        }
    }))
    .expect("a ServePipeline");
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    let rayservices: Api<RayService> = Api::namespaced(client.clone(), &ns);
    pipelines
        .create(&PostParams::default(), &pipeline)
        .await
        .expect("create the pipeline");

    let applied = |digest: Sha256Digest, version: &'static str| {
        let (pipelines, rayservices) = (pipelines.clone(), rayservices.clone());
        async move {
            let pipeline = pipelines.get("from-oci").await.ok()?;
            let oci = pipeline.status?.source?.oci?;
            let rayservice = rayservices.get("from-oci").await.ok()?;
            let config = rayservice.spec.serve_config_v2?;
            (oci.manifest_digest == digest.to_string()
                && oci.tag.as_deref() == Some("live")
                && config.contains(&format!("version: '{version}'")))
            .then_some(config)
        }
    };
    crate::support::eventually(Duration::from_secs(90), "version 1 from the tag", || {
        applied(first, "1")
    })
    .await;

    let second = push(
        repository,
        "live",
        GRAPH_LAYER_MEDIA_TYPE,
        &crate::support::e2e::ensemble("2"),
    )
    .await;
    let serving = crate::support::eventually(
        Duration::from_secs(90),
        "version 2 after a push to the tag",
        || applied(second, "2"),
    )
    .await;

    push(repository, "live", "text/plain", b"not a graph").await;
    let condition = crate::support::eventually(
        Duration::from_secs(60),
        "SourceReady=False (WrongMediaType)",
        || {
            let pipelines = pipelines.clone();
            async move {
                let pipeline = pipelines.get("from-oci").await.ok()?;
                let conds = pipeline.status?.conditions;
                conditions::find(&conds, "SourceReady")
                    .filter(|c| c.status == "False" && c.reason == "WrongMediaType")
                    .cloned()
            }
        },
    )
    .await;
    assert!(
        condition.message.contains("text/plain"),
        "{}",
        condition.message
    );
    let still = applied(second, "2").await;
    assert_eq!(
        still.as_deref(),
        Some(serving.as_str()),
        "the running version stays"
    );
}
