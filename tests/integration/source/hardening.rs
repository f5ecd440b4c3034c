//! Hardening (issue 14): memory from the registry, the memory budget, the time ceiling, SSRF.

use super::*;

// ---------------------------------------------------------------------------------------
// Hardening (issue 14): memory from the registry, the memory budget, the time ceiling, SSRF.

/// A memory figure of this process from /proc/self/status, in KiB (the whole test binary's:
/// measure with one test running).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// The process's peak resident memory so far (VmHWM), in KiB.
fn peak_kib() -> u64 {
    status_kib("VmHWM:")
}

/// How far the process's peak resident memory rose above `peak_before_kib`. Alone in the
/// process this is what the test's work cost at its peak; beside other tests it can only
/// under-count (an earlier, higher peak hides a rise), never blame this test for another's.
fn peak_growth_kib(peak_before_kib: u64) -> u64 {
    peak_kib().saturating_sub(peak_before_kib)
}

/// One test, so that the two peaks are measured one after the other (VmHWM is per process).
#[tokio::test]
async fn a_declared_terabyte_and_an_endless_body_stop_at_the_hard_ceiling() {
    let registry = protected_http_registry().await;
    let terabyte: u64 = 1 << 40;
    registry
        .route("/huge.pb", Route::DeclaredLength(terabyte))
        .route(
            "/endless.pb",
            Route::HugeChunked {
                chunk: 64 * 1024,
                total: usize::MAX,
            },
        );
    let token = token();
    let fetcher = fetcher();
    // maxBytes as large as a spec can ask: the old fetcher sized its buffer from the declared
    // length and aborted the process on the first request.
    let request = |url| FetchRequest {
        bearer_token: Some(&token),
        max_bytes: u64::MAX,
        allow_insecure_http: true,
        retry: fast_retries(3),
        ..FetchRequest::new(url)
    };

    let url = registry.url("/huge.pb");
    let peak_before = peak_kib();
    let error = fetch_error(&fetcher, &request(&url)).await;
    assert_eq!(
        error,
        SourceError::TooLarge {
            url: url.clone(),
            limit: MAX_MAX_BYTES,
            declared: Some(terabyte),
        }
    );
    assert!(!error.is_transient());
    assert_eq!(registry.requests("/huge.pb").len(), 1);
    let grown_kib = peak_growth_kib(peak_before);
    assert!(grown_kib < 64 * 1024, "peak RSS grew by {grown_kib} KiB");
    eprintln!("declared 1 TiB: peak RSS grew by {grown_kib} KiB");

    let url = registry.url("/endless.pb");
    let peak_before = peak_kib();
    let error = fetch_error(&fetcher, &request(&url)).await;
    assert_eq!(
        error,
        SourceError::TooLarge {
            url: url.clone(),
            limit: MAX_MAX_BYTES,
            declared: None,
        }
    );
    assert_eq!(registry.requests("/endless.pb").len(), 1, "not retried");
    let produced = registry.produced_bytes();
    assert!(
        produced < 2 * MAX_MAX_BYTES,
        "server produced {produced} bytes"
    );
    // The buffer never passes the ceiling: 64 MiB, and a moment of the old buffer beside the
    // new one while it doubles.
    let grown_kib = peak_growth_kib(peak_before);
    assert!(grown_kib < 192 * 1024, "peak RSS grew by {grown_kib} KiB");
    eprintln!("endless body: peak RSS grew by {grown_kib} KiB, server produced {produced} bytes");
}

fn budgeted_fetcher(budget: u64, max_fetch_duration: Duration) -> Fetcher {
    raypipe::startup::init_crypto();
    Fetcher::with_options(FetcherOptions {
        honor_proxy_environment: false,
        allowed_destinations: DestinationPolicy::with_loopback(),
        graph_memory_budget: budget,
        max_fetch_duration,
    })
}

#[tokio::test]
async fn two_big_fetches_with_a_budget_for_one_take_turns() {
    const MIB: u64 = 1024 * 1024;
    let registry = protected_http_registry().await;
    let body = Bytes::from(vec![9u8; 4 * MIB as usize]);
    for path in ["/a.pb", "/b.pb", "/c.pb"] {
        registry.route(
            path,
            Route::Graph {
                body: body.clone(),
                etag: None,
                chunked: false,
            },
        );
    }
    let token = token();
    let (url_a, url_b, url_c) = (
        registry.url("/a.pb"),
        registry.url("/b.pb"),
        registry.url("/c.pb"),
    );
    let request = |url| FetchRequest {
        bearer_token: Some(&token),
        allow_insecure_http: true,
        retry: RetryPolicy::NONE,
        ..FetchRequest::new(url)
    };
    let fetcher = budgeted_fetcher(6 * MIB, Duration::from_secs(20));

    // A's bytes hold 4 MiB of the budget for as long as the controller keeps them (decoding).
    let FetchOutcome::Fetched { bytes: held, .. } =
        fetcher.fetch(&request(&url_a)).await.expect("fetch A")
    else {
        panic!("expected Fetched");
    };
    assert_eq!(held.len() as u64, 4 * MIB);
    assert_eq!(held.reservation().map(|r| r.bytes()), Some(4 * MIB));
    assert_eq!(fetcher.memory_budget().available_bytes(), 2 * MIB);

    // B waits for A's bytes to be dropped, then proceeds.
    let second = {
        let fetcher = fetcher.clone();
        let token = token.clone();
        let url = url_b.clone();
        tokio::spawn(async move {
            let request = FetchRequest {
                bearer_token: Some(&token),
                allow_insecure_http: true,
                retry: RetryPolicy::NONE,
                ..FetchRequest::new(&url)
            };
            fetcher.fetch(&request).await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !second.is_finished(),
        "B must wait while A holds the budget"
    );
    drop(held);
    let outcome = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("B proceeds once A is dropped")
        .expect("task")
        .expect("fetch B");
    let FetchOutcome::Fetched { bytes: held, .. } = outcome else {
        panic!("expected Fetched");
    };

    // C cannot get in before its deadline while B is held: a named, transient failure.
    let short = budgeted_fetcher(6 * MIB, Duration::from_millis(400));
    let _b_in_short = short
        .memory_budget()
        .reserve(4 * MIB, Duration::ZERO)
        .await
        .expect("fits");
    let started = Instant::now();
    let error = fetch_error(&short, &request(&url_c)).await;
    assert_eq!(error.reason(), "MemoryBudgetExhausted", "{error}");
    assert!(error.is_transient());
    assert!(
        error.to_string().contains("--graph-memory-budget"),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));

    // The two 4 MiB bodies were never held at once: B waited above, and the budget now holds
    // exactly B's bytes. (Not the process's RSS: other tests share this process and their
    // allocations would count against this one.)
    assert_eq!(fetcher.memory_budget().available_bytes(), 2 * MIB);
    drop(held);
    assert_eq!(fetcher.memory_budget().available_bytes(), 6 * MIB);
}

#[tokio::test]
async fn a_body_that_could_exceed_the_whole_budget_fails_at_once_without_retries() {
    let registry = protected_http_registry().await;
    // Chunked: no declared length, so the fetch must plan for maxBytes (16 MiB by default).
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
        retry: fast_retries(3),
        ..FetchRequest::new(&url)
    };
    let error = fetch_error(
        &budgeted_fetcher(1024 * 1024, Duration::from_secs(20)),
        &request,
    )
    .await;
    assert_eq!(
        error,
        SourceError::LargerThanMemoryBudget {
            url: url.clone(),
            requested: 16 * 1024 * 1024,
            budget: 1024 * 1024,
        }
    );
    assert_eq!(error.reason(), "MemoryBudgetExhausted");
    assert!(!error.is_transient());
    assert_eq!(registry.requests("/chunked.pb").len(), 1, "not retried");
    // With a maxBytes that fits, the same graph is fetched.
    let fitting = FetchRequest {
        max_bytes: 64 * 1024,
        ..request.clone()
    };
    let fetcher = budgeted_fetcher(1024 * 1024, Duration::from_secs(20));
    assert!(matches!(
        fetcher.fetch(&fitting).await.expect("fits the budget"),
        FetchOutcome::Fetched { .. }
    ));
}

#[tokio::test]
async fn one_fetch_with_all_its_retries_ends_at_the_fetch_ceiling() {
    let registry = protected_http_registry().await;
    registry.route(
        "/trickle.pb",
        Route::TrickleBody {
            len: 100_000,
            interval: Duration::from_millis(50),
        },
    );
    let token = token();
    let url = registry.url("/trickle.pb");
    // A spec asking for an hour per attempt and endless retries.
    let request = FetchRequest {
        bearer_token: Some(&token),
        timeout: Duration::from_secs(3600),
        allow_insecure_http: true,
        retry: RetryPolicy {
            max_attempts: 1000,
            max_elapsed: Duration::from_secs(3600),
            initial_interval: Duration::from_millis(10),
            max_interval: Duration::from_millis(20),
        },
        ..FetchRequest::new(&url)
    };
    let fetcher = budgeted_fetcher(1 << 28, Duration::from_secs(1));
    let started = Instant::now();
    let error = fetch_error(&fetcher, &request).await;
    let took = started.elapsed();
    assert_eq!(error.reason(), "Timeout", "{error}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(took >= Duration::from_millis(900), "took {took:?}");
}

#[tokio::test]
async fn default_policy_refuses_loopback_literals_and_names_before_any_request() {
    let pki = TestPki::new();
    let registry = Registry::https("127.0.0.1", None, pki.server_config.clone()).await;
    registry.route("/graph.pb", graph_route(None));
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let fetcher = fetcher_with(DestinationPolicy::public_only());
    let port = registry.addr.port();
    let mut messages = Vec::new();
    for (url, host) in [
        (format!("https://127.0.0.1:{port}/graph.pb"), "127.0.0.1"),
        (
            format!("https://127.0.0.1:{}/graph.pb", closed.port()),
            "127.0.0.1",
        ),
        (format!("https://localhost:{port}/graph.pb"), "localhost"),
        (
            format!("https://localhost:{}/graph.pb", closed.port()),
            "localhost",
        ),
        (
            format!("https://[::ffff:127.0.0.1]:{port}/graph.pb"),
            "[::ffff:7f00:1]",
        ),
        (format!("https://2130706433:{port}/graph.pb"), "127.0.0.1"),
    ] {
        let request = FetchRequest {
            ca_bundle_pem: Some(pki.ca_pem.as_bytes()),
            retry: fast_retries(3),
            ..FetchRequest::new(&url)
        };
        let error = fetch_error(&fetcher, &request).await;
        assert_eq!(
            error,
            SourceError::DestinationNotAllowed {
                host: host.to_owned()
            },
            "{url}"
        );
        assert!(!error.is_transient());
        let message = error.to_string();
        assert!(message.contains(host), "{message}");
        assert!(
            message.contains("--source-allowed-destinations"),
            "{message}"
        );
        messages.push((host, message));
    }
    assert_eq!(
        registry.all_requests(),
        0,
        "a request reached the refused host"
    );
    // The same words whether the port answered or was closed: no reachability oracle.
    assert_eq!(messages[0], messages[1]);
    assert_eq!(messages[2], messages[3]);
}

#[tokio::test]
async fn a_redirect_hop_to_a_refused_address_is_not_followed() {
    let pki = TestPki::new();
    let origin = Registry::https("127.0.0.2", None, pki.server_config.clone()).await;
    let internal = Registry::https("127.0.0.1", None, pki.server_config.clone()).await;
    internal.route("/secret", graph_route(None));
    origin
        .route(
            "/by-address.pb",
            Route::Redirect {
                location: internal.url("/secret"),
            },
        )
        .route(
            "/by-name.pb",
            Route::Redirect {
                location: format!("https://localhost:{}/secret", internal.addr.port()),
            },
        )
        .route("/graph.pb", graph_route(None));
    let fetcher = fetcher_with(DestinationPolicy::parse_list("127.0.0.2/32").expect("policy"));
    let fetch = |path: &str| {
        let url = origin.url(path);
        let fetcher = &fetcher;
        let ca = pki.ca_pem.clone();
        async move {
            let request = FetchRequest {
                ca_bundle_pem: Some(ca.as_bytes()),
                retry: fast_retries(2),
                ..FetchRequest::new(&url)
            };
            fetcher.fetch(&request).await
        }
    };

    // The allowed origin itself is fine.
    assert!(matches!(
        fetch("/graph.pb").await.expect("allowed origin"),
        FetchOutcome::Fetched { .. }
    ));
    let error = fetch("/by-address.pb").await.expect_err("hop refused");
    assert_secret_free(&error);
    assert_eq!(
        error,
        SourceError::DestinationNotAllowed {
            host: "127.0.0.1".to_owned()
        }
    );
    let error = fetch("/by-name.pb").await.expect_err("hop refused");
    assert_eq!(
        error,
        SourceError::DestinationNotAllowed {
            host: "localhost".to_owned()
        }
    );
    assert_eq!(origin.requests("/by-address.pb").len(), 1, "not retried");
    assert_eq!(internal.all_requests(), 0, "the refused hop was contacted");
}
