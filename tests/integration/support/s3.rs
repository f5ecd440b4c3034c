//! A real S3-compatible server on 127.0.0.1 for code named by `s3://` URIs: Versity S3
//! Gateway (`versitygw`, Apache-2.0) with its POSIX backend on a temporary directory, built once
//! per machine from its Go module ([`super::tools::versitygw`]).
//!
//! Ray's downloader runs in each node's runtime-env agent and reads the AWS settings from the
//! node's own environment, so the shared Ray head is started with them
//! ([`S3Endpoint::ray_node_credentials`]): an endpoint on a loopback port this process holds
//! from then on, and a root key pair chosen here. The server itself starts only when a test
//! asks for it ([`server`]), on a port of its own; the endpoint then relays each connection to
//! it unchanged, byte for byte, so requests and their SigV4 signatures reach versitygw as the
//! client sent them. Until then a connection to the endpoint is closed at once. Holding the
//! port avoids a race: a port merely noted at head start could be taken by anything on the
//! machine before the server binds it.

use std::io::Write as _;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use raypipe::devenv::process::ManagedProcess;
use raypipe::devenv::ray::CredentialEnv;

/// The region the server and every client say (versitygw's default; S3 signatures name it).
pub const REGION: &str = "us-east-1";

/// Where the shared Ray head's nodes find S3: a loopback endpoint and the root key pair.
pub struct S3Endpoint {
    pub port: u16,
    pub access_key: String,
    secret_key: String,
    /// The running server's own address, once [`server`] started it.
    target: Arc<Mutex<Option<SocketAddr>>>,
}

impl std::fmt::Debug for S3Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Endpoint")
            .field("port", &self.port)
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

impl S3Endpoint {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The root key pair's secret, for clients of the tests' own (never printed).
    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    /// What a Ray node needs to fetch `s3://` URIs from this server, exactly the settings the
    /// install guide gives a RayCluster's containers.
    pub fn ray_node_credentials(&self) -> CredentialEnv {
        CredentialEnv::new(self.client_env())
    }

    fn client_env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", self.url()),
            ("AWS_ACCESS_KEY_ID", self.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret_key.clone()),
            ("AWS_DEFAULT_REGION", REGION.to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
    }
}

/// The endpoint of this test process: its port held and relaying from the first call on.
pub fn endpoint() -> &'static S3Endpoint {
    static ENDPOINT: OnceLock<S3Endpoint> = OnceLock::new();
    ENDPOINT.get_or_init(|| {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        let random = raypipe::devenv::random_token().expect("random bytes");
        let target = Arc::new(Mutex::new(None));
        let relay_target = target.clone();
        std::thread::Builder::new()
            .name("raypipe-s3-relay".into())
            .spawn(move || relay(&listener, &relay_target))
            .expect("the relay thread starts");
        S3Endpoint {
            port,
            access_key: random[..20].to_uppercase(),
            secret_key: random,
            target,
        }
    })
}

/// Accepts connections for as long as the process lives; each goes to the server, or is
/// closed while there is none.
fn relay(listener: &TcpListener, target: &Mutex<Option<SocketAddr>>) {
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let server = *target.lock().unwrap_or_else(|e| e.into_inner());
        let Some(server) = server else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        std::thread::spawn(move || {
            if let Ok(upstream) = TcpStream::connect(server) {
                splice(client, upstream);
            }
        });
    }
}

/// Copies both directions until each side has finished sending, passing each end-of-stream on.
fn splice(client: TcpStream, upstream: TcpStream) {
    let (Ok(mut client_reader), Ok(mut upstream_writer)) =
        (client.try_clone(), upstream.try_clone())
    else {
        return;
    };
    let to_server = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_reader, &mut upstream_writer);
        let _ = upstream_writer.shutdown(Shutdown::Write);
    });
    let (mut upstream_reader, mut client_writer) = (upstream, client);
    let _ = std::io::copy(&mut upstream_reader, &mut client_writer);
    let _ = client_writer.shutdown(Shutdown::Write);
    let _ = to_server.join();
}

/// A running versitygw serving [`endpoint`]'s key pair from a directory of its own.
pub struct S3Server {
    /// The buckets and the server's log, kept as long as the server runs.
    _dir: tempfile::TempDir,
    _process: ManagedProcess,
}

/// The running server's own address (started if it was not), for a test that puts its own
/// relay in front of it.
pub fn server_address() -> SocketAddr {
    server();
    endpoint()
        .target
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .expect("the server runs")
}

/// The server of this test process, started on first use (building versitygw first if this
/// machine never did).
pub fn server() -> &'static S3Server {
    static SERVER: OnceLock<Result<S3Server, String>> = OnceLock::new();
    match SERVER.get_or_init(start) {
        Ok(server) => server,
        Err(e) => panic!("the S3 server failed to start: {e}"),
    }
}

fn start() -> Result<S3Server, String> {
    let binary = super::tools::versitygw();
    let endpoint = endpoint();
    let dir = tempfile::Builder::new()
        .prefix("raypipe-s3-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let buckets = dir.path().join("buckets");
    std::fs::create_dir(&buckets).map_err(|e| e.to_string())?;
    let port = TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let args: Vec<String> = vec![
        "--port".into(),
        format!("127.0.0.1:{port}"),
        "--region".into(),
        REGION.into(),
        "--quiet".into(),
        "posix".into(),
        buckets.display().to_string(),
    ];
    // The root key pair through the environment, not the command line.
    let mut process = ManagedProcess::start_with_env(
        "versitygw",
        binary,
        &args,
        &[
            ("ROOT_ACCESS_KEY_ID", endpoint.access_key.as_str()),
            ("ROOT_SECRET_ACCESS_KEY", endpoint.secret_key.as_str()),
        ],
        &dir.path().join("versitygw.log"),
    )
    .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    while TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_err() {
        if let Some(status) = process.exited() {
            return Err(format!(
                "versitygw exited ({status}):\n{}",
                process.log_tail(20)
            ));
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "versitygw did not listen on {address} within 60 s:\n{}",
                process.log_tail(20)
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "versitygw {} listening on {address} after {:.1}s, reached as {}",
        super::tools::VERSITYGW_VERSION,
        started.elapsed().as_secs_f64(),
        endpoint.url()
    );
    *endpoint.target.lock().unwrap_or_else(|e| e.into_inner()) = Some(address);
    Ok(S3Server {
        _dir: dir,
        _process: process,
    })
}

impl S3Server {
    /// Stores `bytes` as `s3://bucket/key`, creating the bucket when it is new, with boto3 from
    /// the Ray venv (the client Ray's downloader uses) through [`endpoint`].
    pub fn put(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let python = ray_python();
        let mut child = Command::new(&python)
            .arg("-c")
            .arg(
                "import sys, boto3\n\
                 s3 = boto3.client('s3')\n\
                 bucket, key = sys.argv[1], sys.argv[2]\n\
                 try:\n\
                 \x20   s3.create_bucket(Bucket=bucket)\n\
                 except s3.exceptions.BucketAlreadyOwnedByYou:\n\
                 \x20   pass\n\
                 s3.put_object(Bucket=bucket, Key=key, Body=sys.stdin.buffer.read())\n",
            )
            .args([bucket, key])
            .envs(endpoint().client_env())
            // Nothing may leave 127.0.0.0/8.
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{} runs: {e}", python.display()));
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(bytes)
            .expect("the object's bytes go to boto3");
        let output = child.wait_with_output().expect("boto3 ends");
        assert!(
            output.status.success(),
            "putting s3://{bucket}/{key} failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The Python of the Ray venv the shared head runs (it has boto3).
fn ray_python() -> PathBuf {
    let ray = raypipe::devenv::ray::locate_ray().expect("the Ray venv");
    ray.parent().unwrap_or(Path::new(".")).join("python")
}
