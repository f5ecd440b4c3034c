//! URL rules (plain HTTP, credentials in the URL) and redirects (token forwarding, downgrade,
//! loops).

use super::*;

// ---------------------------------------------------------------------------------------
// URL rules.

#[tokio::test]
async fn plain_http_is_refused_unless_allowed() {
    let registry = protected_http_registry().await;
    registry.route("/graph.pb", graph_route(None));
    let token = token();
    let url = registry.url("/graph.pb?sig=urlsecret-41d8cd98");
    let fetcher = fetcher();
    let refused = FetchRequest {
        bearer_token: Some(&token),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher, &refused).await;
    assert_eq!(
        error,
        SourceError::InsecureUrl {
            url: registry.url("/graph.pb")
        }
    );
    assert!(error.to_string().contains("allowInsecureHttp"));
    assert_eq!(
        registry.all_requests(),
        0,
        "nothing may be sent over plain HTTP"
    );

    let allowed = FetchRequest {
        allow_insecure_http: true,
        ..refused.clone()
    };
    assert!(matches!(
        fetcher.fetch(&allowed).await.expect("allowed"),
        FetchOutcome::Fetched { .. }
    ));
}

#[tokio::test]
async fn credentials_in_the_url_are_refused_without_being_echoed() {
    let registry = protected_http_registry().await;
    let url = format!("http://user:{URL_SECRET}@{}/graph.pb", registry.addr);
    let request = FetchRequest {
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(error.reason(), "InvalidUrl");
    assert_eq!(registry.all_requests(), 0);

    let garbage = format!("https://user:{URL_SECRET}@[not-a-host/graph.pb?sig={URL_SECRET}");
    let error = fetch_error(&fetcher(), &FetchRequest::new(&garbage)).await;
    assert_eq!(error.reason(), "InvalidUrl");
}

// ---------------------------------------------------------------------------------------
// Redirects.

#[tokio::test]
async fn same_host_redirect_keeps_the_token() {
    let registry = protected_http_registry().await;
    registry
        .route(
            "/old.pb",
            Route::Redirect {
                location: "/graph.pb".to_owned(),
            },
        )
        .route("/graph.pb", graph_route(None));
    let token = token();
    let url = registry.url("/old.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    let outcome = fetcher().fetch(&request).await.expect("fetch");
    assert!(matches!(outcome, FetchOutcome::Fetched { .. }));
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(
        registry.requests("/graph.pb")[0].authorization.as_deref(),
        Some(bearer.as_str())
    );
}

#[tokio::test]
async fn cross_host_http_redirect_does_not_forward_the_token() {
    let origin = protected_http_registry().await;
    let elsewhere = Registry::http("127.0.0.2", None).await;
    elsewhere.route("/graph.pb", graph_route(None));
    origin.route(
        "/graph.pb",
        Route::Redirect {
            location: elsewhere.url("/graph.pb"),
        },
    );
    let token = token();
    let url = origin.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };

    let outcome = fetcher().fetch(&request).await.expect("fetch");

    assert!(matches!(outcome, FetchOutcome::Fetched { .. }));
    let bearer = format!("Bearer {TOKEN}");
    assert_eq!(
        origin.requests("/graph.pb")[0].authorization.as_deref(),
        Some(bearer.as_str())
    );
    let forwarded = elsewhere.requests("/graph.pb");
    assert_eq!(forwarded.len(), 1);
    assert_eq!(
        forwarded[0].authorization, None,
        "token sent to another host"
    );
}

#[tokio::test]
async fn cross_host_https_redirect_does_not_forward_the_token() {
    let pki = TestPki::new();
    let origin = Registry::https("127.0.0.1", Some(TOKEN), pki.server_config.clone()).await;
    let elsewhere = Registry::https("127.0.0.2", None, pki.server_config.clone()).await;
    elsewhere.route("/blob", graph_route(None));
    origin.route(
        "/graph.pb",
        Route::Redirect {
            location: elsewhere.url("/blob"),
        },
    );
    let token = token();
    let url = origin.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        ca_bundle_pem: Some(pki.ca_pem.as_bytes()),
        ..FetchRequest::new(&url)
    };

    let outcome = fetcher().fetch(&request).await.expect("fetch");

    assert!(matches!(outcome, FetchOutcome::Fetched { .. }));
    assert!(origin.requests("/graph.pb")[0].authorization.is_some());
    let forwarded = elsewhere.requests("/blob");
    assert_eq!(forwarded.len(), 1);
    assert_eq!(
        forwarded[0].authorization, None,
        "token sent to another host"
    );
}

#[tokio::test]
async fn redirect_from_https_to_http_is_refused() {
    let pki = TestPki::new();
    let origin = Registry::https("127.0.0.1", Some(TOKEN), pki.server_config.clone()).await;
    let plain = Registry::http("127.0.0.1", None).await;
    plain.route("/graph.pb", graph_route(None));
    origin.route(
        "/graph.pb",
        Route::Redirect {
            location: plain.url("/graph.pb?sig=urlsecret-41d8cd98"),
        },
    );
    let token = token();
    let url = origin.url("/graph.pb");
    let request = FetchRequest {
        bearer_token: Some(&token),
        ca_bundle_pem: Some(pki.ca_pem.as_bytes()),
        // Even with plain HTTP allowed, an HTTPS source must not be downgraded.
        allow_insecure_http: true,
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(&fetcher(), &request).await;
    assert_eq!(
        error,
        SourceError::InsecureRedirect {
            from: origin.url("/graph.pb"),
            to: plain.url("/graph.pb"),
        }
    );
    assert_eq!(error.reason(), "InsecureUrl");
    assert_eq!(plain.all_requests(), 0);
}

#[tokio::test]
async fn redirect_loop_ends_with_too_many_redirects() {
    let registry = protected_http_registry().await;
    registry.route(
        "/loop.pb",
        Route::Redirect {
            location: "/loop.pb".to_owned(),
        },
    );
    let error = failed_fetch(&registry, "/loop.pb", 3).await;
    assert_eq!(error.reason(), "TooManyRedirects");
    assert!(!error.is_transient());
    assert_eq!(registry.requests("/loop.pb").len(), 11);
}
