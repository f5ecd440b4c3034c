//! Protocol tests of a whole pull against a small in-process registry speaking the
//! distribution API with the token flow: tag and digest pulls, the token cache, and the
//! reasons of refused credentials, expired tokens, missing tags, wrong digests and
//! signatures. The real CNCF registry is exercised by the integration tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::manifest::{Descriptor, GRAPH_LAYER_MEDIA_TYPE, Manifest, OCI_MANIFEST_MEDIA_TYPE};
use super::verify::tests::{dsse_bundle, sign, statement, test_signer};
use super::verify::{
    COSIGN_SIGN_PREDICATE_TYPE, SIGNATURE_ANNOTATION, SIGSTORE_BUNDLE_V03_MEDIA_TYPE,
    SIMPLE_SIGNING_MEDIA_TYPE, referrers_tag, signature_tag,
};
use super::*;
use crate::source::digest::Sha256Digest;
use crate::source::{DestinationPolicy, Fetcher, FetcherOptions, RetryPolicy};

#[derive(Default)]
struct Registry {
    /// path after `/v2/` → (content type, bytes)
    objects: HashMap<String, (String, Vec<u8>)>,
    token_requests: usize,
    address: String,
}

type Shared = Arc<Mutex<Registry>>;

const GOOD_TOKEN: &str = "tok-good-secret";

async fn handle(State(registry): State<Shared>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut registry = registry.lock().expect("lock");
    if path == "/token" {
        registry.token_requests += 1;
        let expected = format!("Basic {}", BASE64.encode("alice:pw"));
        let stale = format!("Basic {}", BASE64.encode("stale:pw"));
        return if authorization == expected {
            format!(r#"{{"token":"{GOOD_TOKEN}","expires_in":300}}"#).into_response()
        } else if authorization == stale {
            r#"{"token":"tok-stale","expires_in":60,"issued_at":"2001-01-01T00:00:00Z"}"#
                .into_response()
        } else {
            StatusCode::UNAUTHORIZED.into_response()
        };
    }
    if authorization != format!("Bearer {GOOD_TOKEN}") {
        let challenge = format!(
            r#"Bearer realm="http://{}/token",service="test",scope="repository:team/g:pull""#,
            registry.address
        );
        let mut response = StatusCode::UNAUTHORIZED.into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_str(&challenge).expect("header"),
        );
        return response;
    }
    let Some(key) = path.strip_prefix("/v2/") else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match registry.objects.get(key) {
        Some((content_type, bytes)) => {
            let digest = Sha256Digest::of(bytes).to_string();
            let mut response = Response::new(Body::from(bytes.clone()));
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_str(content_type).expect("header"),
            );
            headers.insert(
                "docker-content-digest",
                HeaderValue::from_str(&digest).expect("header"),
            );
            response
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn start() -> Shared {
    let registry: Shared = Arc::default();
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(registry.clone());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind");
    registry.lock().expect("lock").address = listener.local_addr().expect("address").to_string();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    registry
}

fn descriptor(media_type: &str, bytes: &[u8]) -> Descriptor {
    Descriptor::of(media_type, bytes)
}

/// Stores a graph artifact under `tag`; returns the manifest digest.
fn push(registry: &Shared, tag: &str, layer_media_type: &str, graph: &[u8]) -> Sha256Digest {
    let manifest = Manifest::graph_artifact(layer_media_type, graph, Default::default());
    let bytes = serde_json::to_vec(&manifest).expect("manifest");
    let digest = Sha256Digest::of(&bytes);
    let mut registry = registry.lock().expect("lock");
    let object = |bytes: &[u8]| (OCI_MANIFEST_MEDIA_TYPE.to_owned(), bytes.to_vec());
    registry
        .objects
        .insert(format!("team/g/manifests/{tag}"), object(&bytes));
    registry
        .objects
        .insert(format!("team/g/manifests/{digest}"), object(&bytes));
    registry.objects.insert(
        format!("team/g/blobs/{}", Sha256Digest::of(graph)),
        ("application/octet-stream".into(), graph.to_vec()),
    );
    digest
}

/// Stores a cosign signature (tag convention) for `digest` signed by `pair`.
fn push_signature(registry: &Shared, digest: Sha256Digest, pair: &ring::signature::EcdsaKeyPair) {
    let (payload, signature) = sign(pair, digest);
    let mut layer = descriptor(SIMPLE_SIGNING_MEDIA_TYPE, &payload);
    layer
        .annotations
        .insert(SIGNATURE_ANNOTATION.into(), signature);
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST_MEDIA_TYPE.into()),
        artifact_type: None,
        config: descriptor("application/vnd.oci.image.config.v1+json", b"{}"),
        layers: vec![layer],
        subject: None,
        annotations: Default::default(),
    };
    let bytes = serde_json::to_vec(&manifest).expect("manifest");
    let mut registry = registry.lock().expect("lock");
    registry.objects.insert(
        format!("team/g/manifests/{}", signature_tag(digest)),
        (OCI_MANIFEST_MEDIA_TYPE.into(), bytes),
    );
    registry.objects.insert(
        format!("team/g/blobs/{}", Sha256Digest::of(&payload)),
        ("application/octet-stream".into(), payload),
    );
}

fn fetcher() -> Fetcher {
    Fetcher::with_options(FetcherOptions {
        honor_proxy_environment: false,
        allowed_destinations: DestinationPolicy::with_loopback(),
        ..FetcherOptions::default()
    })
}

async fn pull(
    fetcher: &Fetcher,
    registry: &Shared,
    reference: &str,
    credentials: &RegistryCredentials,
    previous: Option<Sha256Digest>,
    verify: Option<&VerificationKey>,
) -> Result<OciOutcome, crate::source::SourceError> {
    let address = registry.lock().expect("lock").address.clone();
    let reference: OciReference = format!("{address}/{reference}").parse().expect("reference");
    let request = OciRequest {
        previous_manifest_digest: previous,
        verify,
        allow_insecure_http: true,
        retry: RetryPolicy::NONE,
        ..OciRequest::new(&reference, credentials)
    };
    fetcher.pull_oci(&request).await
}

fn reason<T>(result: Result<T, crate::source::SourceError>) -> &'static str {
    match result {
        Ok(_) => "Ok",
        Err(error) => {
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains("secret"), "a secret leaked: {shown}");
            error.reason()
        }
    }
}

#[tokio::test]
async fn tag_and_digest_pulls_check_both_digests_and_reuse_the_token() {
    let registry = start().await;
    let graph = b"graph-v1".to_vec();
    let digest = push(&registry, "v1", GRAPH_LAYER_MEDIA_TYPE, &graph);
    let fetcher = fetcher();
    let alice = RegistryCredentials::basic("alice", "pw");

    let outcome = pull(&fetcher, &registry, "team/g:v1", &alice, None, None)
        .await
        .expect("pull by tag");
    let OciOutcome::Fetched {
        bytes,
        manifest_digest,
        graph_digest,
        size,
        code,
    } = outcome
    else {
        panic!("expected a graph");
    };
    assert_eq!(code, None, "a graph-only artifact has no code");
    assert_eq!(&bytes[..], &graph[..]);
    assert_eq!(manifest_digest, digest);
    assert_eq!(graph_digest, Sha256Digest::of(&graph));
    assert_eq!(size, graph.len() as u64);

    // The tag still names the same manifest: one HEAD, nothing downloaded.
    let again = pull(&fetcher, &registry, "team/g:v1", &alice, Some(digest), None).await;
    assert_eq!(
        again.expect("poll"),
        OciOutcome::Unchanged {
            manifest_digest: digest
        }
    );
    // A digest reference equal to the applied one needs no request at all.
    let pinned = format!("team/g@{digest}");
    let by_digest = pull(&fetcher, &registry, &pinned, &alice, Some(digest), None).await;
    assert!(matches!(by_digest, Ok(OciOutcome::Unchanged { .. })));
    let fresh = pull(&fetcher, &registry, &pinned, &alice, None, None).await;
    assert!(matches!(fresh, Ok(OciOutcome::Fetched { .. })));
    assert_eq!(
        registry.lock().expect("lock").token_requests,
        1,
        "the token is cached for its scope"
    );
}

#[tokio::test]
async fn each_failure_has_its_own_reason() {
    let registry = start().await;
    let digest = push(&registry, "v1", GRAPH_LAYER_MEDIA_TYPE, b"graph");
    push(&registry, "text", "text/plain", b"not a graph");
    let fetcher = fetcher();
    let alice = RegistryCredentials::basic("alice", "pw");
    let run = |reference: &'static str, credentials: RegistryCredentials| {
        let (fetcher, registry) = (fetcher.clone(), registry.clone());
        async move { reason(pull(&fetcher, &registry, reference, &credentials, None, None).await) }
    };
    assert_eq!(
        run(
            "team/g:v1",
            RegistryCredentials::basic("alice", "wrong-secret")
        )
        .await,
        "RegistryUnauthorized"
    );
    assert_eq!(
        run("team/g:v1", RegistryCredentials::Anonymous).await,
        "RegistryUnauthorized"
    );
    assert_eq!(
        run("team/g:v1", RegistryCredentials::basic("stale", "pw")).await,
        "TokenExpired"
    );
    assert_eq!(
        run(
            "team/g:v1",
            RegistryCredentials::Token(crate::source::BearerToken::new("tok-wrong-secret"))
        )
        .await,
        "TokenRejected"
    );
    assert_eq!(run("team/g:v9", alice.clone()).await, "TagNotFound");
    assert_eq!(run("team/g:text", alice.clone()).await, "WrongMediaType");

    // The blob the manifest names was replaced by other bytes.
    {
        let mut registry = registry.lock().expect("lock");
        let blob = format!("team/g/blobs/{}", Sha256Digest::of(b"graph"));
        registry
            .objects
            .insert(blob, ("application/octet-stream".into(), b"evil".to_vec()));
    }
    assert_eq!(run("team/g:v1", alice.clone()).await, "DigestMismatch");
    // A manifest served under a digest it does not have.
    {
        let mut registry = registry.lock().expect("lock");
        let other = registry
            .objects
            .get("team/g/manifests/text")
            .cloned()
            .expect("text manifest");
        registry
            .objects
            .insert(format!("team/g/manifests/{digest}"), other);
    }
    let result = pull(
        &fetcher,
        &registry,
        &format!("team/g@{digest}"),
        &alice,
        None,
        None,
    )
    .await;
    assert_eq!(reason(result), "DigestMismatch");
}

#[tokio::test]
async fn signatures_are_required_when_asked_for() {
    let registry = start().await;
    let digest = push(&registry, "v1", GRAPH_LAYER_MEDIA_TYPE, b"graph");
    let fetcher = fetcher();
    let alice = RegistryCredentials::basic("alice", "pw");
    let (signer, pem) = test_signer();
    let (other_signer, _) = test_signer();
    let key = VerificationKey::from_pem(pem.as_bytes()).expect("key");

    let unsigned = pull(&fetcher, &registry, "team/g:v1", &alice, None, Some(&key)).await;
    assert_eq!(reason(unsigned), "SignatureMissing");
    push_signature(&registry, digest, &other_signer);
    let wrongly = pull(&fetcher, &registry, "team/g:v1", &alice, None, Some(&key)).await;
    assert_eq!(reason(wrongly), "SignatureInvalid");
    // Also when the manifest is the one already applied (a key added later).
    let applied = pull(
        &fetcher,
        &registry,
        "team/g:v1",
        &alice,
        Some(digest),
        Some(&key),
    )
    .await;
    assert_eq!(reason(applied), "SignatureInvalid");
    push_signature(&registry, digest, &signer);
    let signed = pull(&fetcher, &registry, "team/g:v1", &alice, None, Some(&key)).await;
    assert!(
        matches!(signed, Ok(OciOutcome::Fetched { .. })),
        "{signed:?}"
    );
}

/// Stores `bundle` as cosign v3 does on a registry without the referrers API: a manifest of
/// artifact type and layer [`SIGSTORE_BUNDLE_V03_MEDIA_TYPE`] with `digest` as subject, listed
/// in the index under the fallback tag `sha256-<hex>`.
fn push_bundle(registry: &Shared, digest: Sha256Digest, bundle: &[u8]) {
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST_MEDIA_TYPE.into()),
        artifact_type: Some(SIGSTORE_BUNDLE_V03_MEDIA_TYPE.into()),
        config: descriptor("application/vnd.oci.empty.v1+json", b"{}"),
        layers: vec![descriptor(SIGSTORE_BUNDLE_V03_MEDIA_TYPE, bundle)],
        subject: Some(Descriptor {
            digest: digest.to_string(),
            ..descriptor(OCI_MANIFEST_MEDIA_TYPE, b"")
        }),
        annotations: Default::default(),
    };
    let bytes = serde_json::to_vec(&manifest).expect("manifest");
    let manifest_digest = Sha256Digest::of(&bytes);
    let mut listed = descriptor(OCI_MANIFEST_MEDIA_TYPE, &bytes);
    listed.artifact_type = Some(SIGSTORE_BUNDLE_V03_MEDIA_TYPE.into());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [listed],
    });
    let mut registry = registry.lock().expect("lock");
    registry.objects.insert(
        format!("team/g/manifests/{manifest_digest}"),
        (OCI_MANIFEST_MEDIA_TYPE.into(), bytes),
    );
    registry.objects.insert(
        format!("team/g/manifests/{}", referrers_tag(digest)),
        (
            "application/vnd.oci.image.index.v1+json".into(),
            index.to_string().into_bytes(),
        ),
    );
    registry.objects.insert(
        format!("team/g/blobs/{}", Sha256Digest::of(bundle)),
        ("application/octet-stream".into(), bundle.to_vec()),
    );
}

#[tokio::test]
async fn sigstore_bundles_are_found_through_the_referrers_tag() {
    let registry = start().await;
    let digest = push(&registry, "v1", GRAPH_LAYER_MEDIA_TYPE, b"graph");
    let other_digest = push(&registry, "v2", GRAPH_LAYER_MEDIA_TYPE, b"graph two");
    let fetcher = fetcher();
    let alice = RegistryCredentials::basic("alice", "pw");
    let (signer, pem) = test_signer();
    let (other_signer, _) = test_signer();
    let key = VerificationKey::from_pem(pem.as_bytes()).expect("key");
    let bundle_for = |pair, digest| {
        dsse_bundle(
            pair,
            "application/vnd.in-toto+json",
            &statement(COSIGN_SIGN_PREDICATE_TYPE, digest),
        )
    };

    push_bundle(&registry, digest, &bundle_for(&other_signer, digest));
    let wrongly = pull(&fetcher, &registry, "team/g:v1", &alice, None, Some(&key)).await;
    assert_eq!(reason(wrongly), "SignatureInvalid");
    // A genuine bundle for v1, listed as a referrer of v2: the signed digest decides.
    push_bundle(&registry, other_digest, &bundle_for(&signer, digest));
    let moved = pull(&fetcher, &registry, "team/g:v2", &alice, None, Some(&key)).await;
    assert_eq!(reason(moved), "SignatureInvalid");
    push_bundle(&registry, digest, &bundle_for(&signer, digest));
    let signed = pull(&fetcher, &registry, "team/g:v1", &alice, None, Some(&key)).await;
    assert!(
        matches!(signed, Ok(OciOutcome::Fetched { .. })),
        "{signed:?}"
    );
    let unchanged = pull(
        &fetcher,
        &registry,
        "team/g:v1",
        &alice,
        Some(digest),
        Some(&key),
    )
    .await;
    assert!(
        matches!(unchanged, Ok(OciOutcome::Unchanged { .. })),
        "{unchanged:?}"
    );
}
