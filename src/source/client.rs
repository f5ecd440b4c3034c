//! reqwest clients, built once per distinct configuration and reused (connection pools and
//! TLS setup are costly, and a client per request would defeat keep-alive).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reqwest::redirect::{Attempt, Policy};
use reqwest::{Certificate, Client};
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::destination::{DestinationPolicy, GuardedResolver, check_literal_host};
use super::digest::Sha256Digest;
use super::error::{RedirectLimitExceeded, RedirectRefused, SourceError};
use super::redact::redact_url;

/// Redirects followed before giving up; registries and CDNs need one or two.
pub(crate) const MAX_REDIRECTS: usize = 10;

/// Clients kept; past this the cache starts over, so rotating CA bundles cannot grow it forever.
const MAX_CACHED_CLIENTS: usize = 32;

/// Everything that is a property of the client rather than of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ClientKey {
    ca_bundle: Option<Sha256Digest>,
    allow_insecure_http: bool,
    connect_timeout: Duration,
}

pub(crate) struct ClientCache {
    honor_proxy_environment: bool,
    destinations: Arc<DestinationPolicy>,
    clients: Mutex<HashMap<ClientKey, Client>>,
}

impl ClientCache {
    pub(crate) fn new(honor_proxy_environment: bool, destinations: Arc<DestinationPolicy>) -> Self {
        Self {
            honor_proxy_environment,
            destinations,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// The client for this configuration, built on first use.
    pub(crate) fn client(
        &self,
        ca_bundle_pem: Option<&[u8]>,
        allow_insecure_http: bool,
        connect_timeout: Duration,
    ) -> Result<Client, SourceError> {
        let key = ClientKey {
            ca_bundle: ca_bundle_pem.map(Sha256Digest::of),
            allow_insecure_http,
            connect_timeout,
        };
        // The map is never left half-updated, so a poisoned lock still holds a usable cache.
        if let Some(client) = self
            .clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(client.clone());
        }
        // Built outside the lock: loading the system roots takes a while.
        let client = self.build(ca_bundle_pem, allow_insecure_http, connect_timeout)?;
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if clients.len() >= MAX_CACHED_CLIENTS {
            clients.clear();
        }
        Ok(clients.entry(key).or_insert(client).clone())
    }

    fn build(
        &self,
        ca_bundle_pem: Option<&[u8]>,
        allow_insecure_http: bool,
        connect_timeout: Duration,
    ) -> Result<Client, SourceError> {
        // reqwest is built without a crypto provider of its own; it panics if none is
        // installed, so make sure ring is (a no-op when the process already did it).
        crate::tls::install_crypto_provider();
        let mut builder = Client::builder()
            .user_agent(concat!("raypipe/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(connect_timeout)
            // Every host name is resolved, and its addresses checked, by the guard; IP-literal
            // hosts are checked before the request and by the redirect policy.
            .dns_resolver(Arc::new(GuardedResolver::new(self.destinations.clone())))
            .redirect(redirect_policy(
                allow_insecure_http,
                self.destinations.clone(),
            ))
            // A Referer would carry the source URL, query string (presigned signature)
            // included, to whatever host a redirect points at.
            .referer(false)
            .https_only(!allow_insecure_http);
        // With a proxy from the environment, reqwest dials the proxy, and the proxy resolves
        // and dials the registry: the guard then checks the proxy's address (so a proxy on a
        // private address must be on the allow-list), and IP-literal registry hosts are still
        // refused here, but which host *names* the proxy reaches is the proxy's egress policy.
        if !self.honor_proxy_environment {
            builder = builder.no_proxy();
        }
        if let Some(pem) = ca_bundle_pem {
            builder = builder.tls_certs_merge(parse_ca_bundle(pem)?);
        }
        builder.build().map_err(|error| SourceError::TlsSetup {
            detail: describe_build_error(&error),
        })
    }
}

/// The certificates of a PEM bundle, each checked to be usable as a trust anchor (reqwest
/// would accept garbage here and fail later with a vaguer error).
pub(crate) fn parse_ca_bundle(pem: &[u8]) -> Result<Vec<Certificate>, SourceError> {
    let mut validation_store = RootCertStore::empty();
    let mut certificates = Vec::new();
    for (index, parsed) in CertificateDer::pem_slice_iter(pem).enumerate() {
        let der = parsed.map_err(|error| SourceError::InvalidCaBundle {
            problem: format!("PEM block {} cannot be read ({error})", index + 1),
        })?;
        validation_store
            .add(der.clone())
            .map_err(|error| SourceError::InvalidCaBundle {
                problem: format!(
                    "certificate {} cannot be used as a CA ({})",
                    index + 1,
                    anchor_problem(&error)
                ),
            })?;
        certificates.push(Certificate::from_der(&der).map_err(|error| {
            SourceError::InvalidCaBundle {
                problem: format!("certificate {} is rejected ({error})", index + 1),
            }
        })?);
    }
    if certificates.is_empty() {
        return Err(SourceError::InvalidCaBundle {
            problem: "no PEM CERTIFICATE block found".to_owned(),
        });
    }
    Ok(certificates)
}

/// Follows redirects to HTTPS; to plain HTTP only from plain HTTP when insecure HTTP is
/// allowed, so a redirect never downgrades an HTTPS source. reqwest itself drops the
/// Authorization header whenever the host, port or scheme changes. A hop to an IP literal the
/// destination policy refuses is not followed (host names are checked when resolved).
fn redirect_policy(allow_insecure_http: bool, destinations: Arc<DestinationPolicy>) -> Policy {
    Policy::custom(move |attempt: Attempt<'_>| {
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(RedirectLimitExceeded {
                limit: MAX_REDIRECTS,
            });
        }
        if let Err(refused) = check_literal_host(attempt.url(), &destinations) {
            return attempt.error(refused);
        }
        let from = attempt.previous().last();
        let follow = match attempt.url().scheme() {
            "https" => true,
            "http" => allow_insecure_http && from.is_some_and(|from| from.scheme() == "http"),
            _ => false,
        };
        if follow {
            attempt.follow()
        } else {
            let refused = RedirectRefused {
                from: from.map(redact_url).unwrap_or_default(),
                to: redact_url(attempt.url()),
            };
            attempt.error(refused)
        }
    })
}

/// rustls words trust-anchor errors as if about a peer ("invalid peer certificate: …"),
/// which would mislead about a CA bundle: keep only the specific part.
fn anchor_problem(error: &rustls::Error) -> String {
    match error {
        rustls::Error::InvalidCertificate(problem) => format!("{problem:?}"),
        other => other.to_string(),
    }
}

fn describe_build_error(error: &reqwest::Error) -> String {
    let mut detail = String::new();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if !detail.is_empty() {
            detail.push_str(": ");
        }
        detail.push_str(&current.to_string());
        cause = current.source();
    }
    detail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_ca_pem() -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).expect("self-signed CA").pem()
    }

    #[test]
    fn parses_a_bundle_of_two_cas_with_text_around_them() {
        let bundle = format!("# comment\n{}\nnoise\n{}", test_ca_pem(), test_ca_pem());
        let certificates = parse_ca_bundle(bundle.as_bytes()).expect("valid bundle");
        assert_eq!(certificates.len(), 2);
    }

    #[test]
    fn rejects_empty_garbage_and_non_certificate_bundles() {
        let undecodable = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        let not_der = "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n";
        let key_only = rcgen::KeyPair::generate().expect("key").serialize_pem();
        for bundle in [
            "",
            "not pem at all",
            undecodable,
            not_der,
            key_only.as_str(),
        ] {
            let error = parse_ca_bundle(bundle.as_bytes()).expect_err("invalid bundle");
            assert_eq!(error.reason(), "InvalidCaBundle", "{bundle:?}: {error}");
        }
    }

    #[test]
    fn clients_are_reused_per_configuration() {
        let cache = ClientCache::new(false, Arc::default());
        let pem = test_ca_pem();
        let timeout = Duration::from_secs(1);
        for _ in 0..3 {
            cache.client(None, false, timeout).expect("client");
            cache
                .client(Some(pem.as_bytes()), false, timeout)
                .expect("client with CA");
        }
        cache.client(None, true, timeout).expect("insecure client");
        let cached = cache.clients.lock().expect("lock").len();
        assert_eq!(cached, 3);
    }

    #[test]
    fn invalid_bundle_is_reported_and_not_cached() {
        let cache = ClientCache::new(false, Arc::default());
        let error = cache
            .client(Some(b"nope"), false, Duration::from_secs(1))
            .expect_err("invalid bundle");
        assert_eq!(error.reason(), "InvalidCaBundle");
        assert!(cache.clients.lock().expect("lock").is_empty());
    }
}
