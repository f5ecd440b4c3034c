//! Fetching: success, conditional requests (ETag, 304), digests and pinned digests.

use super::*;

// ---------------------------------------------------------------------------------------
// Success, conditional requests, digests.

#[tokio::test]
async fn fetches_graph_with_token_digest_etag_and_size() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(Some("\"v42\"")));
    let token = token();
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };

    let outcome = fetcher().fetch(&request).await.expect("fetch");

    assert_eq!(
        outcome,
        FetchOutcome::Fetched {
            bytes: FetchedBytes::unbudgeted(Bytes::from_static(GRAPH)),
            digest: digest_of(GRAPH),
            etag: Some("\"v42\"".to_owned()),
            size: GRAPH.len() as u64,
        }
    );
    let seen = registry.requests("/graph.pb");
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(seen[0].if_none_match, None);
}

#[tokio::test]
async fn chunked_body_without_content_length_is_fetched_whole() {
    let registry = protected_http_registry().await;
    registry.route(
        "/chunked.pb",
        Route::Graph {
            body: Bytes::from_static(GRAPH),
            etag: None,
            chunked: true,
        },
    );
    let token = token();
    let url = registry.url("/chunked.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    match fetcher().fetch(&request).await.expect("fetch") {
        FetchOutcome::Fetched { bytes, digest, .. } => {
            assert_eq!(bytes, GRAPH);
            assert_eq!(digest, digest_of(GRAPH));
        }
        other => panic!("expected Fetched, got {other:?}"),
    }
}

#[tokio::test]
async fn known_etag_is_sent_and_304_gives_not_modified_in_one_request() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(Some("\"v42\"")));
    let token = token();
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        previous_etag: Some("\"v42\""),
        previous_digest: Some(&digest_of(GRAPH)),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };

    let outcome = fetcher().fetch(&request).await.expect("fetch");

    assert_eq!(
        outcome,
        FetchOutcome::NotModified {
            etag: Some("\"v42\"".to_owned())
        }
    );
    let seen = registry.requests("/graph.pb");
    assert_eq!(seen.len(), 1, "a 304 must not be retried");
    assert_eq!(seen[0].if_none_match.as_deref(), Some("\"v42\""));
}

#[tokio::test]
async fn stale_etag_gets_the_new_graph_and_its_etag() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(Some("\"v43\"")));
    let token = token();
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        previous_etag: Some("\"v42\""),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    match fetcher().fetch(&request).await.expect("fetch") {
        FetchOutcome::Fetched { etag, .. } => assert_eq!(etag.as_deref(), Some("\"v43\"")),
        other => panic!("expected Fetched, got {other:?}"),
    }
    assert_eq!(
        registry.requests("/graph.pb")[0].if_none_match.as_deref(),
        Some("\"v42\"")
    );
}

#[tokio::test]
async fn same_digest_as_before_is_unchanged_in_both_digest_forms() {
    let registry = protected_http_registry().await;
    // No ETag: the server cannot answer 304, so only the digest shows nothing changed.
    registry.route("/graph.pb", graph_route(None));
    let token = token();
    let url = registry.url("/graph.pb");
    let fetcher = fetcher();
    let prefixed = digest_of(GRAPH);
    let bare = Sha256Digest::of(GRAPH).to_hex();
    for previous in [prefixed.as_str(), bare.as_str()] {
        let request = FetchRequest {
            bearer_token: Some(&token),
            previous_digest: Some(previous),
            allow_insecure_http: true,
            ..FetchRequest::new(&url)
        };
        let outcome = fetcher.fetch(&request).await.expect("fetch");
        assert_eq!(
            outcome,
            FetchOutcome::Unchanged {
                digest: prefixed.clone(),
                etag: None,
                size: GRAPH.len() as u64,
            }
        );
    }
}

#[tokio::test]
async fn pinned_digest_that_matches_is_accepted_in_both_forms() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(None));
    let token = token();
    let url = registry.url("/graph.pb");
    let fetcher = fetcher();
    let prefixed = digest_of(GRAPH);
    let bare_upper = Sha256Digest::of(GRAPH).to_hex().to_uppercase();
    for pin in [prefixed.as_str(), bare_upper.as_str()] {
        let request = FetchRequest {
            bearer_token: Some(&token),
            pinned_sha256: Some(pin),
            allow_insecure_http: true,
            ..FetchRequest::new(&url)
        };
        match fetcher.fetch(&request).await.expect("fetch") {
            FetchOutcome::Fetched { digest, .. } => assert_eq!(digest, prefixed),
            other => panic!("expected Fetched, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn pinned_digest_that_differs_is_refused_naming_both_digests() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(Some("\"v42\"")));
    let token = token();
    let url = registry.url("/graph.pb?sig=urlsecret-41d8cd98");
    let pin = digest_of(b"the graph that was reviewed");
    let request = FetchRequest {
        bearer_token: Some(&token),
        pinned_sha256: Some(&pin),
        // The applied graph does not match the pin, so a 304 could not prove anything:
        // the ETag must not be sent.
        previous_etag: Some("\"v42\""),
        previous_digest: Some(&digest_of(b"older")),
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };

    let error = fetch_error(&fetcher(), &request).await;

    assert_eq!(error.reason(), "DigestMismatch");
    assert!(!error.is_transient());
    match &error {
        SourceError::DigestMismatch {
            expected, actual, ..
        } => {
            assert_eq!(expected, &pin);
            assert_eq!(actual, &digest_of(GRAPH));
        }
        other => panic!("expected DigestMismatch, got {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains(&pin) && message.contains(&digest_of(GRAPH)),
        "{message}"
    );
    let seen = registry.requests("/graph.pb");
    assert_eq!(seen.len(), 1, "a digest mismatch is not retried");
    assert_eq!(seen[0].if_none_match, None);
}

#[tokio::test]
async fn malformed_pin_is_refused_before_any_request() {
    let registry = protected_http_registry().await;
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        pinned_sha256: Some("sha256:not-hex"),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "InvalidDigest");
    assert_eq!(registry.all_requests(), 0);
}
