//! Stalled bodies (issue 29): a registry that answers and then sends nothing ends the fetch with
//! `BodyStalled` after the stall timeout, long before the fetch's `timeout`, and the fetch is not
//! retried while it holds its slots: `source.url` over HTTP and HTTPS, and every body of an OCI
//! pull (manifest, blob, token realm, signature lookup).

use raypipe::source::oci::{
    OciOutcome, OciReference, OciRequest, RegistryCredentials, VerificationKey,
};

use super::*;

const STALL: Duration = Duration::from_millis(500);
/// The fetch's own timeout: a stall must end it far sooner.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Checks that `error` is a stall of `STALL` on a URL ending in `path`, found well before
/// `TIMEOUT`.
fn assert_stalled(error: &SourceError, path: &str, took: Duration) {
    assert_secret_free(error);
    let SourceError::BodyStalled { url, limit, .. } = error else {
        panic!("expected BodyStalled for {path}, got {error:?}");
    };
    assert!(url.ends_with(path), "{url} names {path}");
    assert_eq!(*limit, STALL);
    assert!(
        took >= STALL && took < Duration::from_secs(10),
        "{path}: {took:?}"
    );
    assert_eq!(error.reason(), "BodyStalled");
    assert!(error.is_transient(), "a later fetch may succeed");
}

#[tokio::test]
async fn a_url_source_whose_body_stalls_ends_after_the_stall_timeout_over_http_and_https() {
    let pki = TestPki::new();
    let http = protected_http_registry().await;
    let https = Registry::https("127.0.0.1", Some(TOKEN), pki.server_config.clone()).await;
    let token = token();
    for registry in [&http, &https] {
        registry.route("/hang.pb", Route::StalledBody { declared: 4096 });
        let url = format!("{}?sig={URL_SECRET}", registry.url("/hang.pb"));
        let request = FetchRequest {
            bearer_token: Some(&token),
            allow_insecure_http: true,
            ca_bundle_pem: Some(pki.ca_pem.as_bytes()),
            timeout: TIMEOUT,
            stall_timeout: STALL,
            retry: fast_retries(4),
            ..FetchRequest::new(&url)
        };
        let started = Instant::now();
        let error = fetch_error(&fetcher(), &request).await;
        let took = started.elapsed();
        assert_stalled(&error, "/hang.pb", took);
        assert!(error.to_string().contains("0 bytes received"), "{error}");
        // Not retried within the fetch: a path that hangs would hold its slots through every
        // attempt; the pipeline's next reconcile tries again.
        assert_eq!(registry.requests("/hang.pb").len(), 1);
        eprintln!("{}: BodyStalled after {took:?}", registry.url("/hang.pb"));
    }
}

/// An open registry (no token) on the loopback with `graph` pushed as `<repository>:v1`;
/// returns the registry, the reference, and the manifest and graph digests.
async fn oci_registry(repository: &str) -> (Registry, OciReference, String, String) {
    let registry = Registry::http("127.0.0.1", None).await;
    let manifest = registry
        .push_graph(repository, "v1", GRAPH.to_vec(), "stall", "1")
        .expect("push the graph");
    let reference = format!("{}/{repository}:v1", registry.addr)
        .parse()
        .expect("a reference");
    (registry, reference, manifest, digest_of(GRAPH))
}

async fn pull_error(
    reference: &OciReference,
    verify: Option<&VerificationKey>,
) -> (SourceError, Duration) {
    let credentials = RegistryCredentials::Anonymous;
    let request = OciRequest {
        verify,
        allow_insecure_http: true,
        timeout: TIMEOUT,
        stall_timeout: STALL,
        retry: fast_retries(4),
        ..OciRequest::new(reference, &credentials)
    };
    let started = Instant::now();
    let outcome = fetcher().pull_oci(&request).await;
    let took = started.elapsed();
    match outcome {
        Err(error) => (error, took),
        Ok(outcome) => panic!("the pull of {reference} should fail, got {outcome:?}"),
    }
}

#[tokio::test]
async fn every_body_of_an_oci_pull_is_bounded_by_the_stall_timeout() {
    // The graph blob.
    let (registry, reference, _, graph) = oci_registry("stall/blob").await;
    let blob = format!("/v2/stall/blob/blobs/{graph}");
    registry.route(
        &blob,
        Route::StalledBody {
            declared: GRAPH.len() as u64,
        },
    );
    let (error, took) = pull_error(&reference, None).await;
    assert_stalled(&error, &blob, took);
    assert_eq!(registry.requests(&blob).len(), 1, "not retried");

    // The manifest (HEAD answers with headers only; the GET's body stalls).
    let (registry, reference, _, _) = oci_registry("stall/manifest").await;
    let manifest = "/v2/stall/manifest/manifests/v1";
    registry.route(manifest, Route::StalledBody { declared: 512 });
    let (error, took) = pull_error(&reference, None).await;
    assert_stalled(&error, manifest, took);

    // The token realm: the registry asks for a token, and the realm stalls.
    let (registry, reference, _, _) = oci_registry("stall/token").await;
    let challenged = "/v2/stall/token/manifests/v1";
    registry
        .route(
            challenged,
            Route::BearerChallenge {
                realm: registry.url("/token"),
            },
        )
        .route("/token", Route::StalledBody { declared: 256 });
    let (error, took) = pull_error(&reference, None).await;
    assert_stalled(&error, "/token", took);
    assert_eq!(registry.requests("/token").len(), 1, "not retried");

    // The signature lookup (the referrers API), when source.verify asks for a signature.
    let (registry, reference, manifest, _) = oci_registry("stall/signature").await;
    let referrers = format!("/v2/stall/signature/referrers/{manifest}");
    registry.route(&referrers, Route::StalledBody { declared: 512 });
    let key = rcgen::KeyPair::generate().expect("a P-256 key");
    let key = VerificationKey::from_pem(key.public_key_pem().as_bytes()).expect("a key");
    let (error, took) = pull_error(&reference, Some(&key)).await;
    assert_stalled(&error, &referrers, took);
}

/// Without a stall the same registry serves the same pull: the routes above are what stalled.
#[tokio::test]
async fn the_same_pull_succeeds_when_nothing_stalls() {
    let (_registry, reference, _, graph) = oci_registry("stall/none").await;
    let credentials = RegistryCredentials::Anonymous;
    let request = OciRequest {
        allow_insecure_http: true,
        stall_timeout: STALL,
        ..OciRequest::new(&reference, &credentials)
    };
    let outcome = fetcher().pull_oci(&request).await.expect("the pull");
    let OciOutcome::Fetched { graph_digest, .. } = outcome else {
        panic!("expected a graph, got {outcome:?}");
    };
    assert_eq!(graph_digest.to_string(), graph);
}
