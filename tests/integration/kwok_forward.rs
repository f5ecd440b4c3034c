//! Port-forward and logs through the API server to a Pod kwok "runs": the kwok-server control
//! plane (`support::kwok`) sends the port of a Pod to a real server on 127.0.0.1, and the Pod's
//! log to a file on this machine.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support;
use crate::support::kwok::{
    create_running_pod, cri_log, forward_pod_port, kwok_server_client, serve_pod_log,
};

const ANSWER: &str = "hello from the process behind the kwok pod";

/// A one-request-per-connection HTTP server on 127.0.0.1 answering every request with
/// [`ANSWER`]; returns its port.
async fn answering_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let port = listener.local_addr().expect("local address").port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                // Read the request head, then answer and close.
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{ANSWER}",
                    ANSWER.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    port
}

#[tokio::test]
async fn port_forward_to_a_kwok_pod_reaches_a_local_server() {
    let client = kwok_server_client().await;
    let ns = support::namespace(&client, "kwok-forward").await;
    let target = answering_server().await;
    // The Pod's port and the local port differ, as they would for a real Ray head.
    let pod_port = 8265;
    create_running_pod(&client, &ns, "head", &[pod_port]).await;
    forward_pod_port(&client, &ns, "head", pod_port, target).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Twice: each port-forward is a new connection to the target.
    for _ in 0..2 {
        let mut forwarder = pods
            .portforward("head", &[pod_port])
            .await
            .expect("a port-forward through the API server");
        let mut stream = forwarder.take_stream(pod_port).expect("the port's stream");
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: head\r\nconnection: close\r\n\r\n")
            .await
            .expect("send the request");
        // The WebSocket port-forward protocol has no end-of-stream per port: read until the
        // whole answer is in, not until EOF.
        let mut response = Vec::new();
        let read_answer = async {
            let mut buf = [0u8; 4096];
            while !response.ends_with(ANSWER.as_bytes()) {
                let n = stream.read(&mut buf).await.expect("read the answer");
                if n == 0 {
                    break;
                }
                response.extend_from_slice(&buf[..n]);
            }
        };
        let answered = tokio::time::timeout(std::time::Duration::from_secs(20), read_answer).await;
        let response = String::from_utf8_lossy(&response).into_owned();
        assert!(
            answered.is_ok(),
            "no whole answer within 20 s: {response:?}"
        );
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with(ANSWER), "{response}");
        drop(stream);
        forwarder
            .join()
            .await
            .expect("the port-forward ends cleanly");
    }
}

#[tokio::test]
async fn logs_of_a_kwok_pod_are_a_local_file() {
    let client = kwok_server_client().await;
    let ns = support::namespace(&client, "kwok-logs").await;
    create_running_pod(&client, &ns, "head", &[]).await;
    let dir = std::env::temp_dir().join(format!("raypipe-kwok-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the log directory");
    let file = dir.join(format!("{ns}-head.log"));
    std::fs::write(&file, cri_log("first line\nsecond line")).expect("write the log");
    serve_pod_log(&client, &ns, "head", &file, false).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let log = pods
        .logs("head", &LogParams::default())
        .await
        .expect("the Pod's log through the API server");
    assert_eq!(log, "first line\nsecond line\n");
    let tail = pods
        .logs(
            "head",
            &LogParams {
                tail_lines: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("the last line");
    assert_eq!(tail, "second line\n");
    let _ = std::fs::remove_file(&file);
}
