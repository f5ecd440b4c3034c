//! A real Prometheus (and its `promtool`) for the alert tests, from the Debian package: the
//! `.deb` is fetched with `apt-get download` (no install: nothing outside raypipe's cache is
//! touched) and unpacked with `dpkg-deb -x` into `<raypipe cache>/prometheus/<package
//! version>/`, once per machine. A Prometheus server started here listens on 127.0.0.1 only and
//! is killed when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The unpacked package: `usr/bin/prometheus` and `usr/bin/promtool` under it.
pub fn package_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let version = candidate_version();
        // Debian versions hold `+` and `:`; neither belongs in a directory name.
        let key: String = version
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let root = raypipe::devenv::binaries::cache_root()
            .join("prometheus")
            .join(key);
        if root.join("usr/bin/promtool").is_file() && root.join("usr/bin/prometheus").is_file() {
            return root;
        }
        let started = Instant::now();
        let partial = root.with_extension(format!("partial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial).expect("create the Prometheus cache directory");
        let download = Command::new("apt-get")
            // As root apt drops to its sandbox user, who cannot write our cache: stay root.
            .args(["download", "-q", "-o", "APT::Sandbox::User=root"])
            .arg(format!("prometheus={version}"))
            .current_dir(&partial)
            .output()
            .expect("apt-get runs (the Prometheus package comes from Debian's mirror)");
        assert!(
            download.status.success(),
            "apt-get download prometheus={version} failed: {}",
            String::from_utf8_lossy(&download.stderr)
        );
        let deb = std::fs::read_dir(&partial)
            .expect("read the download directory")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .expect("apt-get left a .deb");
        let unpacked = partial.join("root");
        let extract = Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(&unpacked)
            .output()
            .expect("dpkg-deb runs");
        assert!(
            extract.status.success(),
            "dpkg-deb -x {} failed: {}",
            deb.display(),
            String::from_utf8_lossy(&extract.stderr)
        );
        // One rename makes the version's directory appear complete or not at all.
        if std::fs::rename(&unpacked, &root).is_err() {
            assert!(
                root.join("usr/bin/promtool").is_file(),
                "could not move the unpacked package to {}",
                root.display()
            );
        }
        let _ = std::fs::remove_dir_all(&partial);
        eprintln!(
            "prometheus {version}: fetched and unpacked into {} in {:.1}s (once per machine)",
            root.display(),
            started.elapsed().as_secs_f64()
        );
        root
    })
}

/// The version of the `prometheus` package apt would fetch; refreshes the package lists once
/// when they do not know it yet (a fresh machine).
fn candidate_version() -> String {
    let candidate = || {
        let output = Command::new("apt-cache")
            .args(["policy", "prometheus"])
            .env("LC_ALL", "C")
            .output()
            .ok()?;
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .find_map(|l| l.trim().strip_prefix("Candidate: ").map(str::to_owned))
            .filter(|v| v != "(none)")
    };
    if let Some(version) = candidate() {
        return version;
    }
    let update = Command::new("apt-get")
        .args(["update", "-q"])
        .output()
        .expect("apt-get runs");
    assert!(
        update.status.success(),
        "apt-get update failed (root is needed on a machine whose package lists are empty): {}",
        String::from_utf8_lossy(&update.stderr)
    );
    candidate().expect("Debian's package lists know a prometheus package")
}

pub fn promtool() -> PathBuf {
    package_root().join("usr/bin/promtool")
}

/// `promtool ARGS…` in `dir`: (success, stdout + stderr).
pub fn run_promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let output = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool runs");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// A Prometheus server on 127.0.0.1 with the configuration file `config` (in `dir`, which also
/// holds its data); killed on drop.
pub struct Server {
    child: Child,
    pub address: SocketAddr,
    log: PathBuf,
}

impl Server {
    pub fn start(dir: &Path, config: &Path) -> Server {
        let address = free_loopback_address();
        let log = dir.join("prometheus.log");
        let child = Command::new(package_root().join("usr/bin/prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .arg("--log.level=warn")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("create the log"))
            .stderr(std::fs::File::create(dir.join("prometheus.err")).expect("create the log"))
            .spawn()
            .expect("prometheus starts");
        Server {
            child,
            address,
            log,
        }
    }

    /// GET `/api/v1/<path>?<params>`; the answer's `data` when it succeeded.
    pub async fn api(&self, path: &str, params: &[(&str, &str)]) -> Option<serde_json::Value> {
        let url = reqwest::Url::parse_with_params(
            &format!("http://{}/api/v1/{path}", self.address),
            params,
        )
        .ok()?;
        let text = reqwest::get(url).await.ok()?.text().await.ok()?;
        let answer: serde_json::Value = serde_json::from_str(&text).ok()?;
        (answer["status"] == "success").then(|| answer["data"].clone())
    }

    /// An instant query's result vector.
    pub async fn query(&self, expr: &str) -> Option<Vec<serde_json::Value>> {
        let data = self.api("query", &[("query", expr)]).await?;
        data["result"].as_array().cloned()
    }

    /// The server's log so far (for failure messages).
    pub fn logs(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!(
            "{}{}",
            read(&self.log),
            read(&self.log.with_extension("err"))
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback address nothing listens on now.
pub fn free_loopback_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("its address")
}

/// How long the alert tests wait for Prometheus to see something.
pub const WAIT: Duration = Duration::from_secs(90);
