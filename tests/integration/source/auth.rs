//! Authorization and other 4xx answers: reported after one request, never retried.

use super::*;

// ---------------------------------------------------------------------------------------
// Authorization and other 4xx: never retried.

#[tokio::test]
async fn wrong_token_is_unauthorized_after_one_request() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(None));
    let wrong = BearerToken::new("rp-wrong-token-0000");
    let url = registry.url("/graph.pb?sig=urlsecret-41d8cd98");
    let request = FetchRequest {
        bearer_token: Some(&wrong),
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };

    let error = fetch_error(&fetcher(), &request).await;

    assert_eq!(error.reason(), "Unauthorized");
    assert!(error.is_authorization_problem());
    assert!(!error.is_transient());
    assert!(!error.to_string().contains("rp-wrong-token"));
    assert!(error.to_string().contains("401"));
    assert!(error.to_string().contains(&registry.url("/graph.pb")));
    assert_eq!(registry.requests("/graph.pb").len(), 1);
}

#[tokio::test]
async fn missing_token_is_unauthorized_and_says_none_was_sent() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(None));
    let url = registry.url("/graph.pb");
    let request = FetchRequest {
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert!(matches!(
        error,
        SourceError::Unauthorized {
            token_sent: false,
            ..
        }
    ));
    assert!(error.to_string().contains("no token was sent"));
    assert_eq!(registry.requests("/graph.pb")[0].authorization, None);
}

#[tokio::test]
async fn forbidden_is_an_authorization_problem_not_retried() {
    let registry = protected_http_registry().await;
    registry.route("/private.pb", Route::Status(403));
    let error = failed_fetch(&registry, "/private.pb", 3).await;
    assert_eq!(error.reason(), "Forbidden");
    assert!(error.is_authorization_problem());
    assert!(error.to_string().contains("403"));
    assert_eq!(registry.requests("/private.pb").len(), 1);
}

#[tokio::test]
async fn not_found_is_reported_after_exactly_one_request() {
    let registry = protected_http_registry().await;
    let error = failed_fetch(&registry, "/missing.pb?sig=urlsecret-41d8cd98", 5).await;
    assert_eq!(error.reason(), "NotFound");
    assert!(!error.is_transient());
    assert!(error.to_string().contains("404"));
    assert_eq!(registry.requests("/missing.pb").len(), 1);
}

#[tokio::test]
async fn other_client_errors_are_not_retried() {
    let registry = protected_http_registry().await;
    registry.route("/bad.pb", Route::Status(400));
    let error = failed_fetch(&registry, "/bad.pb", 5).await;
    assert_eq!(error.reason(), "HttpError");
    assert!(error.to_string().contains("400"));
    assert_eq!(registry.requests("/bad.pb").len(), 1);
}
