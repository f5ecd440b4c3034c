//! Timeouts, connection failures and retries (attempt limit, time budget, rate limiting).

use super::*;

// ---------------------------------------------------------------------------------------
// Timeouts, connection failures, retries.

#[tokio::test]
async fn slow_server_hits_the_total_timeout_and_is_retried() {
    let registry = protected_http_registry().await;
    registry.route(
        "/slow.pb",
        Route::SlowHeaders {
            delay: Duration::from_secs(30),
            body: Bytes::from_static(GRAPH),
        },
    );
    let token = token();
    let url = registry.url("/slow.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        timeout: Duration::from_millis(300),
        allow_insecure_http: true,
        retry: fast_retries(2),
        ..FetchRequest::new(&url)
    };

    let started = Instant::now();
    let error = fetch_error(&fetcher(), &request).await;

    assert_eq!(
        error,
        SourceError::Timeout {
            url: url.clone(),
            phase: TimeoutPhase::Transfer,
            limit: Duration::from_millis(300),
            attempts: 2,
        }
    );
    assert!(error.is_transient());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(registry.requests("/slow.pb").len(), 2);
}

#[tokio::test]
async fn trickling_body_hits_the_total_timeout() {
    let registry = protected_http_registry().await;
    registry.route(
        "/trickle.pb",
        Route::TrickleBody {
            len: 1000,
            interval: Duration::from_millis(20),
        },
    );
    let token = token();
    let url = registry.url("/trickle.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        timeout: Duration::from_millis(300),
        allow_insecure_http: true,
        retry: RetryPolicy::NONE,
        ..FetchRequest::new(&url)
    };
    let started = Instant::now();
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "Timeout");
    assert!(matches!(
        error,
        SourceError::Timeout {
            phase: TimeoutPhase::Transfer,
            attempts: 1,
            ..
        }
    ));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn closed_port_is_a_transient_connection_failure_retried_to_the_limit() {
    // Bind then drop: the port is closed, on the loopback.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let url = format!("http://{closed}/graph.pb");
    let token = token();
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "ConnectionFailed");
    assert!(error.is_transient());
    match &error {
        SourceError::ConnectionFailed {
            attempts,
            url: shown,
            ..
        } => {
            assert_eq!(*attempts, 3);
            assert_eq!(shown, &url);
        }
        other => panic!("expected ConnectionFailed, got {other:?}"),
    }
    assert!(error.to_string().contains("after 3 attempts"), "{error}");
}

#[tokio::test]
async fn server_error_then_success_is_retried_and_succeeds() {
    let registry = protected_http_registry().await;
    registry.route(
        "/flaky.pb",
        Route::FailingThenGraph {
            failures: 2,
            body: Bytes::from_static(GRAPH),
        },
    );
    let token = token();
    let url = registry.url("/flaky.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };
    let outcome = fetcher()
        .fetch(&request)
        .await
        .expect("fetch after retries");
    assert!(matches!(outcome, FetchOutcome::Fetched { .. }));
    let seen = registry.requests("/flaky.pb");
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter()
            .all(|s| s.authorization.as_deref() == Some(&format!("Bearer {TOKEN}")))
    );
}

#[tokio::test]
async fn persistent_server_error_gives_up_after_the_attempt_limit() {
    let registry = protected_http_registry().await;
    registry.route("/broken.pb", Route::Status(500));
    let token = token();
    let url = registry.url("/broken.pb?sig=urlsecret-41d8cd98");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: fast_retries(4),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(
        error,
        SourceError::ServerError {
            url: registry.url("/broken.pb"),
            status: reqwest::StatusCode::INTERNAL_SERVER_ERROR,
            attempts: 4,
        }
    );
    assert!(error.is_transient());
    assert!(error.to_string().contains("500"));
    assert_eq!(registry.requests("/broken.pb").len(), 4);
}

#[tokio::test]
async fn persistent_server_error_gives_up_when_the_time_budget_is_spent() {
    let registry = protected_http_registry().await;
    registry.route("/broken.pb", Route::Status(503));
    let token = token();
    let url = registry.url("/broken.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: RetryPolicy {
            max_attempts: 1000,
            max_elapsed: Duration::from_secs(1),
            initial_interval: Duration::from_millis(20),
            max_interval: Duration::from_millis(50),
        },
        ..FetchRequest::new(&url)
    };
    let started = Instant::now();
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "ServerError");
    assert!(started.elapsed() < Duration::from_secs(6));
    // Bounded by time, not by the (huge) attempt limit: waits of 20–50 ms fit a few dozen
    // attempts into one second.
    let attempts = registry.requests("/broken.pb").len();
    assert!((2..200).contains(&attempts), "{attempts} attempts");
}

#[tokio::test]
async fn rate_limiting_is_retried_then_reported() {
    let registry = protected_http_registry().await;
    registry.route("/busy.pb", Route::Status(429));
    let error = failed_fetch(&registry, "/busy.pb", 2).await;
    assert_eq!(error.reason(), "RateLimited");
    assert!(error.is_transient());
    assert_eq!(registry.requests("/busy.pb").len(), 2);
}
