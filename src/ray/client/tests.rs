//! The dashboard client against fake dashboards on loopback: tokens, Serve and Jobs calls,
//! Ray's error answers, timeouts, unreachable ports, connection pools across runtimes.

use std::time::Instant;

use reqwest::StatusCode;

use super::*;

#[test]
fn tokens_never_show_in_debug_output() {
    let token = BearerToken::new(" s3cr3t-token\n").expect("valid");
    assert_eq!(token.expose_secret(), "s3cr3t-token");
    assert!(!format!("{token:?}").contains("s3cr3t"));
    let options = DashboardClientOptions {
        bearer_token: Some(token),
        ..Default::default()
    };
    assert!(!format!("{options:?}").contains("s3cr3t"));
    let base = DashboardUrl::parse("http://127.0.0.1:8265").expect("valid");
    let client = RayDashboardClient::new(base, options).expect("client");
    let shown = format!("{client:?}");
    assert!(
        !shown.contains("s3cr3t") && shown.contains("<redacted>"),
        "{shown}"
    );
}

#[test]
fn tokens_that_cannot_be_a_header_are_refused() {
    assert_eq!(
        BearerToken::new("  ").expect_err("empty"),
        DashboardError::InvalidToken
    );
    assert_eq!(
        BearerToken::new("a\nb").expect_err("newline inside"),
        DashboardError::InvalidToken
    );
    assert_eq!(
        BearerToken::new("tökén").expect_err("non-ASCII"),
        DashboardError::InvalidToken
    );
}

/// A one-shot HTTP server on loopback: answers each connection with the next canned
/// `(status, body)` (or never answers, for `None`), and hands back the raw requests.
struct FakeDashboard {
    url: String,
    requests: tokio::sync::mpsc::UnboundedReceiver<String>,
}

async fn fake_dashboard(answers: Vec<Option<(u16, &'static str)>>) -> FakeDashboard {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (sender, requests) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        for answer in answers {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut raw = Vec::new();
            let mut buf = [0u8; 4096];
            // Headers, then as many body bytes as Content-Length announces.
            loop {
                let n = stream.read(&mut buf).await.unwrap_or(0);
                raw.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&raw).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().to_owned())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if raw.len() >= end + 4 + length {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            let _ = sender.send(String::from_utf8_lossy(&raw).into_owned());
            match answer {
                Some((status, body)) => {
                    let response = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                }
                None => tokio::time::sleep(Duration::from_secs(30)).await,
            }
        }
    });
    FakeDashboard { url, requests }
}

/// A keep-alive HTTP server on its own thread (outliving any test runtime) answering every
/// request with a version document after `delay`; returns its URL.
fn keep_alive_dashboard(delay: Duration) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut stream = stream;
                loop {
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0u8; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    std::thread::sleep(delay);
                    let body = r#"{"version": "4", "ray_version": "2.52.0"}"#;
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(response.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

#[test]
fn a_runtime_never_gets_a_connection_that_lives_on_another() {
    // Each #[tokio::test] (and each embedding program's runtime) has its own runtime, and a
    // pooled connection is driven by a task of the runtime that opened it. Were it handed to
    // another runtime, the call would fail ("dispatch task is gone") when the opener ends.
    let url = keep_alive_dashboard(Duration::from_millis(400));
    let (ready, idle) = std::sync::mpsc::channel();
    let opener_url = url.clone();
    let opener = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let client = client_for(&opener_url, None, Duration::from_secs(5));
            let version = client.get_version().await;
            assert!(version.is_ok(), "{version:?}");
            // The connection is back in the pool, ready; this runtime ends 200 ms later.
            tokio::time::sleep(Duration::from_millis(50)).await;
            ready.send(()).expect("send");
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
    });
    idle.recv().expect("the opener's call is done");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Answered after 400 ms: the opener's runtime is gone by then.
    let version = runtime.block_on(async {
        client_for(&url, None, Duration::from_secs(5))
            .get_version()
            .await
    });
    opener.join().expect("the opener ran");
    assert!(version.is_ok(), "{version:?}");
}

fn client_for(url: &str, token: Option<&str>, request_timeout: Duration) -> RayDashboardClient {
    RayDashboardClient::new(
        DashboardUrl::parse(url).expect("url"),
        DashboardClientOptions {
            request_timeout,
            bearer_token: token.map(|t| BearerToken::new(t).expect("token")),
            ..Default::default()
        },
    )
    .expect("client")
}

#[tokio::test]
async fn sends_the_token_and_no_browser_headers() {
    let mut fake = fake_dashboard(vec![Some((
        200,
        r#"{"version": "4", "ray_version": "2.60.0"}"#,
    ))])
    .await;
    let client = client_for(
        &format!("{}/proxy/path", fake.url),
        Some("tok-123"),
        DEFAULT_REQUEST_TIMEOUT,
    );
    let version = client.get_version().await.expect("version");
    assert_eq!(version.ray_version.as_deref(), Some("2.60.0"));
    let request = fake
        .requests
        .recv()
        .await
        .expect("a request")
        .to_ascii_lowercase();
    assert!(
        request.starts_with("get /proxy/path/api/version http/1.1\r\n"),
        "{request}"
    );
    assert!(
        request.contains("\r\nx-ray-authorization: bearer tok-123\r\n"),
        "{request}"
    );
    assert!(request.contains("\r\nuser-agent: raypipe/"), "{request}");
    for browser_header in ["origin:", "referer:", "sec-fetch-", "mozilla"] {
        assert!(
            !request.contains(browser_header),
            "{browser_header} in {request}"
        );
    }
}

#[tokio::test]
async fn serve_put_sends_json_and_reports_ray_validation_errors_verbatim() {
    const PYDANTIC: &str = "1 validation error for ServeDeploySchema\napplications.0.import_path\n  Value error, Got invalid import path \"nocolon\".";
    let mut fake = fake_dashboard(vec![Some((400, PYDANTIC))]).await;
    let client = client_for(&fake.url, None, DEFAULT_REQUEST_TIMEOUT);
    let config = serde_json::json!({"applications": [{"import_path": "nocolon"}]});
    let error = client
        .put_serve_applications(&config)
        .await
        .expect_err("400");
    let request = fake.requests.recv().await.expect("a request");
    assert!(
        request.starts_with("PUT /api/serve/applications/ HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(
        request
            .to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{request}"
    );
    assert!(
        request.ends_with(r#"{"applications":[{"import_path":"nocolon"}]}"#),
        "{request}"
    );
    assert!(
        !request.to_ascii_lowercase().contains("x-ray-authorization"),
        "{request}"
    );
    match &error {
        DashboardError::Status {
            endpoint,
            status,
            body,
        } => {
            assert_eq!(
                endpoint,
                &format!("PUT {}/api/serve/applications/", fake.url)
            );
            assert_eq!(*status, StatusCode::BAD_REQUEST);
            assert_eq!(body, PYDANTIC);
        }
        other => panic!("unexpected {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains("HTTP 400 Bad Request") && message.contains("invalid import path"),
        "{message}"
    );
}

#[tokio::test]
async fn a_taken_submission_id_and_an_unknown_job_are_recognised() {
    let traceback = "Traceback (most recent call last):\n  ...\nValueError: Job with submission_id rp-1 already exists. Please use a different submission_id.";
    let mut fake = fake_dashboard(vec![
        Some((500, traceback)),
        Some((404, "Job rp-2 does not exist")),
    ])
    .await;
    let client = client_for(&fake.url, None, DEFAULT_REQUEST_TIMEOUT);
    let taken = client
        .submit_job(&JobSubmitRequest::new("python -c 'print(1)'").with_submission_id("rp-1"))
        .await
        .expect_err("taken");
    assert!(
        matches!(&taken, DashboardError::JobAlreadyExists { submission_id, .. } if submission_id == "rp-1"),
        "{taken:?}"
    );
    let missing = client.get_job("rp-2").await.expect_err("unknown job");
    assert!(missing.is_not_found(), "{missing:?}");
    assert!(
        missing.to_string().contains("Job rp-2 does not exist"),
        "{missing}"
    );
    assert!(
        fake.requests
            .recv()
            .await
            .expect("submit")
            .starts_with("POST /api/jobs/ HTTP/1.1")
    );
    assert!(
        fake.requests
            .recv()
            .await
            .expect("get")
            .starts_with("GET /api/jobs/rp-2 HTTP/1.1")
    );
}

#[tokio::test]
async fn a_silent_dashboard_times_out_quickly() {
    let fake = fake_dashboard(vec![None]).await;
    let client = client_for(&fake.url, None, Duration::from_millis(300));
    let started = Instant::now();
    let error = client.get_serve_applications().await.expect_err("timeout");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(error, DashboardError::Timeout { .. }), "{error:?}");
    assert!(error.is_unreachable());
    assert!(
        error
            .to_string()
            .contains("/api/serve/applications/?api_type=declarative"),
        "{error}"
    );
}

#[tokio::test]
async fn a_closed_port_is_unreachable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let client = client_for(
        &format!("http://127.0.0.1:{port}"),
        None,
        DEFAULT_REQUEST_TIMEOUT,
    );
    let error = client.list_jobs().await.expect_err("nothing listens");
    assert!(
        matches!(error, DashboardError::Unreachable { .. }),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains(&format!("GET http://127.0.0.1:{port}/api/jobs/")),
        "{error}"
    );
}

#[tokio::test]
async fn answers_that_are_not_the_expected_json_are_decode_errors() {
    let fake = fake_dashboard(vec![
        Some((200, "<html>proxy login</html>")),
        Some((200, r#"{"stopped_": true}"#)),
    ])
    .await;
    let client = client_for(&fake.url, None, DEFAULT_REQUEST_TIMEOUT);
    let error = client.get_serve_applications().await.expect_err("html");
    assert!(
        matches!(&error, DashboardError::Decode { body, .. } if body.contains("proxy login")),
        "{error:?}"
    );
    let error = client.stop_job("x").await.expect_err("no `stopped`");
    assert!(error.to_string().contains("no `stopped` field"), "{error}");
    let empty_id = client.get_job_logs(" ").await.expect_err("empty id");
    assert!(
        matches!(empty_id, DashboardError::InvalidRequest { .. }),
        "{empty_id:?}"
    );
}
