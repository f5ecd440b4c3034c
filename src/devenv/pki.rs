//! Certificates and keys for a loopback control plane, generated in-process (no openssl).

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use super::DevEnvError;

/// PEM material for one control plane.
pub struct Pki {
    pub ca_cert: String,
    pub ca_key: String,
    pub serving_cert: String,
    pub serving_key: String,
    /// Signs service-account tokens (PKCS#8).
    pub service_account_key: String,
    /// Verifies them (the API server reads only public keys from `--service-account-key-file`).
    pub service_account_public_key: String,
}

fn err(e: rcgen::Error) -> DevEnvError {
    DevEnvError::Pki(e.to_string())
}

impl Pki {
    pub fn generate() -> Result<Pki, DevEnvError> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca_params.distinguished_name = DistinguishedName::new();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "raypipe-local-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().map_err(err)?;
        let ca_key_pem = ca_key.serialize_pem();
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(err)?;

        // A v3 leaf with CA:FALSE, serverAuth and an IP SAN: what rustls (webpki) insists on.
        let mut serving = CertificateParams::new(vec![
            "localhost".to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ])
        .map_err(err)?;
        serving
            .subject_alt_names
            .push(SanType::IpAddress(std::net::IpAddr::V4(
                std::net::Ipv4Addr::LOCALHOST,
            )));
        serving.distinguished_name = DistinguishedName::new();
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.is_ca = IsCa::ExplicitNoCa;
        serving.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate().map_err(err)?;
        let serving_cert = serving.signed_by(&serving_key, &ca).map_err(err)?;

        let sa_key = KeyPair::generate().map_err(err)?;
        Ok(Pki {
            ca_cert: ca.pem(),
            ca_key: ca_key_pem,
            serving_cert: serving_cert.pem(),
            serving_key: serving_key.serialize_pem(),
            service_account_key: sa_key.serialize_pem(),
            service_account_public_key: sa_key.public_key_pem(),
        })
    }
}
