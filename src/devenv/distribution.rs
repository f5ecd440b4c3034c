//! The CNCF distribution registry (`registry`, built once per machine by `distribution.sh`, see
//! [`super::binaries::distribution_registry`]) run on 127.0.0.1: the real OCI registry the OCI
//! source tests push to and pull from. Plain HTTP on the loopback (sources opt into plain HTTP
//! with `allowInsecureHttp`), filesystem storage in a fresh run directory, and one of three auth
//! setups: none, htpasswd basic auth, or token auth trusting a given issuer certificate.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::DevEnvError;
use super::process::ManagedProcess;

/// How the registry authenticates clients.
#[derive(Clone, Debug)]
pub enum DistributionAuth {
    /// Anyone may push and pull.
    Open,
    /// Basic auth against an htpasswd file of `user:bcrypt-hash` lines (distribution accepts
    /// bcrypt only).
    Htpasswd { htpasswd: String },
    /// The OCI token flow: a `401` names `realm`; the registry accepts JWTs from `issuer` for
    /// `service`, signed by a key whose certificate chains to `root_cert_pem`.
    Token {
        realm: String,
        service: String,
        issuer: String,
        root_cert_pem: String,
    },
}

/// A running registry; stopped when dropped (and killed by the kernel if raypipe dies).
pub struct DistributionRegistry {
    /// `127.0.0.1:PORT`, the registry part of an OCI reference.
    pub host: String,
    pub dir: PathBuf,
    process: ManagedProcess,
}

/// A fresh run directory under `$TMPDIR/raypipe-testenv/`, after removing those left behind by
/// processes that no longer run.
fn run_dir() -> Result<PathBuf, DevEnvError> {
    let root = std::env::temp_dir().join("raypipe-testenv");
    super::fresh_run_dir(&root, "registry-", |abandoned| {
        let _ = std::fs::remove_dir_all(abandoned);
    })
}

/// The registry's configuration file (YAML; JSON strings are valid YAML scalars).
fn config(addr: &str, storage: &Path, auth: &str, secret: &str) -> String {
    let quoted = |text: &str| serde_json::Value::from(text).to_string();
    format!(
        "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: true\n\
         storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  \
         redirect:\n    disable: true\n\
         http:\n  addr: {}\n  secret: {}\n{auth}",
        quoted(&storage.display().to_string()),
        quoted(addr),
        quoted(secret),
    )
}

impl DistributionRegistry {
    /// Starts the registry on a free loopback port and waits until it answers `/v2/`.
    pub async fn start(auth: DistributionAuth) -> Result<DistributionRegistry, DevEnvError> {
        let binary = super::binaries::distribution_registry()?;
        Self::start_binary(&binary, auth).await
    }

    /// [`DistributionRegistry::start`] with an explicit binary.
    pub async fn start_binary(
        binary: &Path,
        auth: DistributionAuth,
    ) -> Result<DistributionRegistry, DevEnvError> {
        let dir = run_dir()?;
        let quoted = |text: &str| serde_json::Value::from(text).to_string();
        let auth_yaml = match &auth {
            DistributionAuth::Open => String::new(),
            DistributionAuth::Htpasswd { htpasswd } => {
                let path = dir.join("htpasswd");
                super::write(&path, htpasswd)?;
                format!(
                    "auth:\n  htpasswd:\n    realm: raypipe-test\n    path: {}\n",
                    quoted(&path.display().to_string())
                )
            }
            DistributionAuth::Token {
                realm,
                service,
                issuer,
                root_cert_pem,
            } => {
                let path = dir.join("token-issuer.pem");
                super::write(&path, root_cert_pem)?;
                format!(
                    "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    \
                     rootcertbundle: {}\n",
                    quoted(realm),
                    quoted(service),
                    quoted(issuer),
                    quoted(&path.display().to_string())
                )
            }
        };
        let port = super::free_port()?;
        let host = format!("127.0.0.1:{port}");
        let config_path = dir.join("config.yml");
        super::write(
            &config_path,
            &config(
                &host,
                &dir.join("storage"),
                &auth_yaml,
                &super::random_token()?,
            ),
        )?;
        // No OpenTelemetry exporter: nothing listens for traces on the loopback.
        let process = ManagedProcess::start_with_env(
            "registry",
            binary,
            &["serve".to_owned(), config_path.display().to_string()],
            &[
                ("OTEL_TRACES_EXPORTER", "none"),
                ("OTEL_SDK_DISABLED", "true"),
            ],
            &dir.join("registry.log"),
        )?;
        let mut registry = DistributionRegistry { host, dir, process };
        registry.wait_ready(Duration::from_secs(30)).await?;
        Ok(registry)
    }

    /// Until `GET /v2/` answers at all (200, or 401 with auth on).
    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), DevEnvError> {
        let deadline = Instant::now() + timeout;
        let url = format!("http://{}/v2/", self.host);
        crate::tls::install_crypto_provider();
        let client = reqwest::Client::new();
        loop {
            if let Some(status) = self.process.exited() {
                return Err(DevEnvError::Exited {
                    name: "registry".into(),
                    status,
                    log: self.process.log_tail(20),
                });
            }
            if client.get(&url).send().await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(DevEnvError::Timeout(
                    timeout,
                    format!("the registry at {url}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `http://127.0.0.1:PORT/<path>`; `path` may start with `/`.
    pub fn url(&self, path: &str) -> String {
        format!(
            "http://{}/{}",
            self.host,
            path.strip_prefix('/').unwrap_or(path)
        )
    }

    /// `127.0.0.1:PORT/<repository_and_tag>`: an OCI reference to this registry.
    pub fn reference(&self, repository_and_tag: &str) -> String {
        format!("{}/{repository_and_tag}", self.host)
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The registry's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

impl Drop for DistributionRegistry {
    fn drop(&mut self) {
        self.process.stop(Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_quotes_paths_and_appends_the_auth_section() {
        let text = config(
            "127.0.0.1:5000",
            Path::new("/tmp/a b"),
            "auth:\n  htpasswd: {}\n",
            "s",
        );
        assert!(text.contains("rootdirectory: \"/tmp/a b\""), "{text}");
        assert!(text.contains("addr: \"127.0.0.1:5000\""), "{text}");
        assert!(text.ends_with("auth:\n  htpasswd: {}\n"), "{text}");
    }
}
