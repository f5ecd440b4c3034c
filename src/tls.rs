//! The process-wide rustls crypto provider. kube, reqwest and rcgen share one provider and
//! reqwest is built without its own, so every TLS client needs ring installed first. Start-up
//! installs it; the HTTP clients in `source` and `ray` call this too, so the library works for
//! embedders and tests that never ran start-up (installing twice is a no-op).

/// Installs ring as rustls' process-wide crypto provider unless one is installed already.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
