//! TLS: a private CA bundle, and what happens without one or with an invalid one.

use super::*;

// ---------------------------------------------------------------------------------------
// TLS.

#[tokio::test]
async fn https_with_the_ca_bundle_succeeds() {
    let pki = TestPki::new();
    let registry = Registry::https("127.0.0.1", Some(TOKEN), pki.server_config.clone()).await;
    registry.route("/graph.pb", graph_route(Some("\"v1\"")));
    let token = token();
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        ca_bundle_pem: Some(pki.ca_pem.as_bytes()),
        ..FetchRequest::new(&url)
    };
    let fetcher = fetcher();
    for _ in 0..2 {
        match fetcher.fetch(&request).await.expect("https fetch") {
            FetchOutcome::Fetched { bytes, etag, .. } => {
                assert_eq!(bytes, GRAPH);
                assert_eq!(etag.as_deref(), Some("\"v1\""));
            }
            other => panic!("expected Fetched, got {other:?}"),
        }
    }
    assert_eq!(registry.requests("/graph.pb").len(), 2);
}

#[tokio::test]
async fn https_without_the_ca_bundle_is_a_tls_error_not_retried() {
    let pki = TestPki::new();
    let registry = Registry::https("127.0.0.1", Some(TOKEN), pki.server_config.clone()).await;
    registry.route("/graph.pb", graph_route(None));
    let token = token();
    let url = registry.url("/graph.pb?sig=urlsecret-41d8cd98");
    let fetcher = fetcher();
    let other_ca = TestPki::new();
    let without = FetchRequest {
        bearer_token: Some(&token),
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };
    let with_wrong_ca = FetchRequest {
        ca_bundle_pem: Some(other_ca.ca_pem.as_bytes()),
        ..without.clone()
    };
    for request in [without, with_wrong_ca] {
        let error = fetch_error(&fetcher, &request).await;
        assert_eq!(error.reason(), "TlsError", "{error}");
        assert!(!error.is_transient());
        assert!(error.to_string().contains("caBundleSecretRef"), "{error}");
    }
    assert_eq!(
        registry.all_requests(),
        0,
        "no HTTP request without trusted TLS"
    );
}

#[tokio::test]
async fn invalid_ca_bundle_is_refused_before_connecting() {
    let pki = TestPki::new();
    let registry = Registry::https("127.0.0.1", Some(TOKEN), pki.server_config.clone()).await;
    let token = token();
    let url = registry.url("/graph.pb");
    let fetcher = fetcher();
    let not_a_certificate =
        b"-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n".as_slice();
    for bundle in [b"".as_slice(), b"garbage".as_slice(), not_a_certificate] {
        let request = FetchRequest {
            bearer_token: Some(&token),
            ca_bundle_pem: Some(bundle),
            ..FetchRequest::new(&url)
        };
        let error = fetch_error(&fetcher, &request).await;
        assert_eq!(error.reason(), "InvalidCaBundle", "{error}");
        assert!(!error.is_transient());
    }
    assert_eq!(registry.all_requests(), 0);
}
