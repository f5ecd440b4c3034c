//! TLS for every caller: the process-wide rustls crypto provider, and the server side shared by
//! the admission webhook and the history API (a PEM certificate and key, read from files and
//! re-read when they change, served through a resolver that can be swapped mid-flight).
//!
//! kube, reqwest and rcgen share one provider and reqwest is built without its own, so every
//! TLS client needs ring installed first. Start-up installs it; the HTTP clients in `source` and
//! `ray` call this too, so the library works for embedders and tests that never ran start-up
//! (installing twice is a no-op).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

/// Installs ring as rustls' process-wide crypto provider unless one is installed already.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The text names what is wrong, never the key's bytes.
    #[error("the serving certificate or key is unusable: {0}")]
    Certificate(String),
    #[error("setting up TLS: {0}")]
    Config(String),
}

/// A serving certificate (chain, PEM) and its private key (PEM), wherever they came from.
pub trait CertificateAndKey {
    fn certificate_pem(&self) -> &str;
    fn private_key_pem(&self) -> &str;
}

/// A certificate and key as read from files.
#[derive(Clone, PartialEq, Eq)]
pub struct CertificatePem {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CertificatePem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("CertificatePem")
            .field("cert_pem_len", &self.cert_pem.len())
            .finish_non_exhaustive()
    }
}

impl CertificateAndKey for CertificatePem {
    fn certificate_pem(&self) -> &str {
        &self.cert_pem
    }

    fn private_key_pem(&self) -> &str {
        &self.key_pem
    }
}

/// Reads a PEM file as text.
pub fn read_pem(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Where a certificate and its key live on disk (a mounted `kubernetes.io/tls` Secret, say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertificateFiles {
    pub fn read(&self) -> Result<CertificatePem, TlsError> {
        Ok(CertificatePem {
            cert_pem: read_pem(&self.cert)?,
            key_pem: read_pem(&self.key)?,
        })
    }

    /// Re-reads the files every `every` and swaps the certificate when they changed
    /// (cert-manager renewing a mounted Secret in place). An unreadable or unusable pair (one
    /// file replaced, the other not yet) keeps the old one and is retried on the next round.
    /// Runs until the task is dropped.
    pub async fn watch(self, resolver: Arc<CertificateResolver>, every: Duration) {
        let mut last = self.read().ok();
        loop {
            tokio::time::sleep(every).await;
            match self.read() {
                Ok(pem) if Some(&pem) != last.as_ref() => match resolver.set(&pem) {
                    Ok(()) => {
                        tracing::info!(cert = %self.cert.display(), "loaded the renewed serving certificate");
                        last = Some(pem);
                    }
                    Err(e) => {
                        tracing::warn!(cert = %self.cert.display(), error = %e, "the renewed serving certificate is unusable; keeping the old one")
                    }
                },
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "re-reading the serving certificate failed"),
            }
        }
    }
}

/// The certificate chain and key parsed and checked to belong together.
pub fn certified_key(pem: &impl CertificateAndKey) -> Result<Arc<CertifiedKey>, TlsError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| TlsError::Certificate(format!("{what}: {e}"));
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pem.certificate_pem().as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| bad("the certificate PEM", &e))?;
    if chain.is_empty() {
        return Err(TlsError::Certificate(
            "the certificate PEM holds no certificate".to_owned(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(pem.private_key_pem().as_bytes())
        .map_err(|e| bad("the private key PEM", &e))?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .map(Arc::new)
        .map_err(|e| bad("certificate and key", &e))
}

/// Hands the current certificate to every new TLS handshake; [`set`](Self::set) swaps it.
#[derive(Debug)]
pub struct CertificateResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertificateResolver {
    pub fn new(pem: &impl CertificateAndKey) -> Result<Arc<CertificateResolver>, TlsError> {
        Ok(Arc::new(CertificateResolver {
            current: RwLock::new(certified_key(pem)?),
        }))
    }

    /// Serves `pem` from the next handshake on; an unusable pair leaves the old one.
    pub fn set(&self, pem: &impl CertificateAndKey) -> Result<(), TlsError> {
        let key = certified_key(pem)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = key;
        Ok(())
    }
}

impl ResolvesServerCert for CertificateResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// TLS 1.2/1.3 on ring, HTTP/1.1 only (the only protocol our servers speak).
pub fn server_config(
    certificates: Arc<CertificateResolver>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider: Arc<CryptoProvider> = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(certificates);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client gets this long to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS connections for `axum::serve`, handshaken off the accept path so one slow client cannot
/// stall others. A failed handshake (a plain-HTTP client, a client that does not trust us) is
/// logged at debug and dropped; it never stops the server.
pub struct TlsListener {
    incoming: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
    acceptor_task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor_task.abort();
    }
}

impl TlsListener {
    pub fn new(tcp: TcpListener, tls: Arc<rustls::ServerConfig>) -> std::io::Result<TlsListener> {
        let local_addr = tcp.local_addr()?;
        let (tx, incoming) = tokio::sync::mpsc::channel(64);
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let acceptor_task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(%local_addr, error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%local_addr, %peer, error = %e, "TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%local_addr, %peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            incoming,
            local_addr,
            acceptor_task,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(connection) => connection,
            // The acceptor task is gone only when the listener is being dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(name: &str) -> CertificatePem {
        let key = rcgen::KeyPair::generate().expect("a key");
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("a certificate");
        CertificatePem {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    #[test]
    fn files_load_swap_and_a_mismatched_pair_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let files = CertificateFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        assert!(matches!(files.read(), Err(TlsError::Read { .. })));
        let first = self_signed("a.example");
        std::fs::write(&files.cert, &first.cert_pem).expect("write");
        std::fs::write(&files.key, &first.key_pem).expect("write");
        let read = files.read().expect("reads");
        assert_eq!(read, first);
        let resolver = CertificateResolver::new(&read).expect("loads");
        assert!(server_config(resolver.clone()).is_ok());

        let second = self_signed("b.example");
        resolver.set(&second).expect("swaps");
        let mismatched = CertificatePem {
            key_pem: first.key_pem.clone(),
            ..second
        };
        assert!(resolver.set(&mismatched).is_err());
        let no_key = CertificatePem {
            key_pem: "not a key".into(),
            ..first.clone()
        };
        assert!(matches!(
            resolver.set(&no_key),
            Err(TlsError::Certificate(_))
        ));
        assert!(!format!("{first:?}").contains("PRIVATE"));
    }
}
