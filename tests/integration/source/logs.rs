//! What fetches log: URL, status and size, never the token or URL secrets.

use super::*;

// ---------------------------------------------------------------------------------------
// Logs.

/// Collects everything written by the tracing subscriber of one test.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("logs").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLogs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("logs")).into_owned()
    }
}

#[tokio::test]
async fn logs_carry_url_status_and_size_but_never_the_token_or_url_secrets() {
    let logs = CapturedLogs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The test runtime is single-threaded, so a thread-local default sees every event.
    let _guard = tracing::subscriber::set_default(subscriber);

    let pki = TestPki::new();
    let origin = Registry::https("127.0.0.1", Some(TOKEN), pki.server_config.clone()).await;
    let elsewhere = Registry::https("127.0.0.2", None, pki.server_config.clone()).await;
    elsewhere.route("/blob", graph_route(None));
    origin
        .route("/graph.pb", graph_route(Some("\"v9\"")))
        .route(
            "/flaky.pb",
            Route::FailingThenGraph {
                failures: 1,
                body: Bytes::from_static(GRAPH),
            },
        )
        .route("/broken.pb", Route::Status(500))
        .route(
            "/moved.pb",
            Route::Redirect {
                location: elsewhere.url("/blob"),
            },
        );
    let token = token();
    let wrong = BearerToken::new(format!("{TOKEN}-wrong"));
    let fetcher = fetcher();
    let query = format!("?sig={URL_SECRET}");
    for (path, bearer) in [
        ("/graph.pb", &token),
        ("/graph.pb", &wrong),
        ("/flaky.pb", &token),
        ("/broken.pb", &token),
        ("/moved.pb", &token),
        ("/missing.pb", &token),
    ] {
        let url = origin.url(&format!("{path}{query}"));
        let request = FetchRequest {
            bearer_token: Some(bearer),
            ca_bundle_pem: Some(pki.ca_pem.as_bytes()),
            retry: fast_retries(2),
            ..FetchRequest::new(&url)
        };
        let _ = fetcher.fetch(&request).await;
        // And once without trusting the CA, for the TLS failure path.
        let untrusted = FetchRequest {
            ca_bundle_pem: None,
            ..request.clone()
        };
        let _ = fetcher.fetch(&untrusted).await;
    }

    let text = logs.text();
    assert!(
        text.contains("graph downloaded"),
        "nothing captured: {text}"
    );
    assert!(text.contains(&origin.url("/graph.pb")), "{text}");
    assert!(
        text.contains("status=200") && text.contains("bytes="),
        "{text}"
    );
    assert!(text.contains("retrying"), "{text}");
    assert!(!text.contains(TOKEN), "token in logs:\n{text}");
    assert!(!text.contains(URL_SECRET), "URL secret in logs:\n{text}");
}
