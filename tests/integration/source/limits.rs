//! The size cap: by Content-Length up front, and while a chunked body streams.

use super::*;

// ---------------------------------------------------------------------------------------
// Size cap.

#[tokio::test]
async fn body_at_the_cap_is_accepted_and_one_byte_over_is_refused_by_content_length() {
    let registry = protected_http_registry().await;
    let body = Bytes::from(vec![7u8; 1024]);
    registry.route(
        "/graph.pb",
        Route::Graph {
            body: body.clone(),
            etag: None,
            chunked: false,
        },
    );
    let token = token();
    let url = registry.url("/graph.pb");
    let fetcher = fetcher();
    let at_cap = FetchRequest {
        bearer_token: Some(&token),
        max_bytes: 1024,
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    assert!(matches!(
        fetcher.fetch(&at_cap).await.expect("fetch at cap"),
        FetchOutcome::Fetched { size: 1024, .. }
    ));

    let below = FetchRequest {
        max_bytes: 1023,
        retry: fast_retries(3),
        ..at_cap.clone()
    };
    let error = fetch_error(&fetcher, &below).await;
    assert_eq!(
        error,
        SourceError::TooLarge {
            url: url.clone(),
            limit: 1023,
            declared: Some(1024),
        }
    );
    assert!(!error.is_transient());
    assert_eq!(
        registry.requests("/graph.pb").len(),
        2,
        "TooLarge is not retried"
    );
}

#[tokio::test]
async fn chunked_body_is_cut_off_while_streaming_once_over_the_cap() {
    let registry = protected_http_registry().await;
    let total = 256 * 1024 * 1024;
    registry.route(
        "/endless.pb",
        Route::HugeChunked {
            chunk: 16 * 1024,
            total,
        },
    );
    let token = token();
    let url = registry.url("/endless.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        max_bytes: 100 * 1024,
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };

    let error = fetch_error(&fetcher(), &request).await;

    assert_eq!(
        error,
        SourceError::TooLarge {
            url: url.clone(),
            limit: 100 * 1024,
            declared: None,
        }
    );
    assert_eq!(registry.requests("/endless.pb").len(), 1);
    // The download stopped early: the server produced far less than the whole body (socket
    // buffers allow a few MiB beyond what the client read).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let produced = registry.produced_bytes();
    assert!(
        produced < 32 * 1024 * 1024,
        "server produced {produced} bytes"
    );
}
