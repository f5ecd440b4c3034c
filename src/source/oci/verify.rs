//! `source.verify`: a cosign signature over the manifest digest, checked with a public key
//! before anything is applied.
//!
//! cosign's layout (read from its format, implemented here): the signature is an OCI manifest
//! in the same repository, found through the referrers API
//! (`GET /v2/<repo>/referrers/<digest>`, signatures having artifact type
//! [`COSIGN_SIGNATURE_ARTIFACT_TYPE`]) or through the tag `sha256-<hex>.sig`. Each of its
//! layers of media type [`SIMPLE_SIGNING_MEDIA_TYPE`] is a JSON payload whose
//! `critical.image.docker-manifest-digest` names the signed manifest, and carries in the
//! annotation [`SIGNATURE_ANNOTATION`] the base64 ECDSA P-256/SHA-256 (ASN.1 DER) signature of
//! the payload's exact bytes. One valid signature by the key is enough.
//!
//! Deliberate: the payload's `docker-reference` is not compared with `source.oci` (artifacts
//! are copied between registries and keep their signatures; the digest is what binds the
//! signature to the content). Keyless verification (Fulcio certificates, Rekor) is not
//! implemented: `source.verify` has a place for it ([`crate::api`]), refused by validation
//! until it exists.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use reqwest::header::{ACCEPT, HeaderValue};
use reqwest::{Method, StatusCode};
use ring::signature::{ECDSA_P256_SHA256_ASN1, UnparsedPublicKey};
use rustls::pki_types::SubjectPublicKeyInfoDer;
use rustls::pki_types::pem::PemObject;
use serde::Deserialize;
use tracing::debug;

use crate::source::digest::Sha256Digest;
use crate::source::error::SourceError;
use crate::source::redact::redact_url;

use super::auth::Session;
use super::fetch::get_document;
use super::manifest::{
    Index, MANIFEST_ACCEPT, MAX_MANIFEST_BYTES, Manifest, OCI_INDEX_MEDIA_TYPE,
    sha256_of_descriptor,
};
use super::reference::OciReference;
use super::transport::read_small_body;

/// The layer media type of a cosign signature payload.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The artifact type of cosign signatures stored as referrers (OCI 1.1).
pub const COSIGN_SIGNATURE_ARTIFACT_TYPE: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";

/// Largest signature payload read (they are a few hundred bytes).
const MAX_PAYLOAD_BYTES: u64 = 64 * 1024;
/// Signature manifests looked at per pull, so a registry cannot make a pull endless.
const MAX_SIGNATURE_MANIFESTS: usize = 8;
/// Signature layers checked in all.
const MAX_SIGNATURE_LAYERS: usize = 16;

/// DER prefix of a P-256 SubjectPublicKeyInfo (id-ecPublicKey, prime256v1, BIT STRING of 66
/// bytes), followed by the 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// A public key signatures must verify with: ECDSA P-256, as `cosign generate-key-pair`
/// makes (`cosign.pub`, PEM `PUBLIC KEY`).
#[derive(Clone, PartialEq, Eq)]
pub struct VerificationKey {
    /// The uncompressed point (0x04 ‖ X ‖ Y).
    point: Vec<u8>,
}

impl std::fmt::Debug for VerificationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VerificationKey(P-256, {})",
            Sha256Digest::of(&self.point)
        )
    }
}

impl VerificationKey {
    pub fn from_pem(pem: &[u8]) -> Result<Self, SourceError> {
        let invalid = |problem: &str| SourceError::InvalidPublicKey {
            problem: problem.to_owned(),
        };
        let der = SubjectPublicKeyInfoDer::from_pem_slice(pem)
            .map_err(|_| invalid("no PEM PUBLIC KEY block found"))?;
        let point = der
            .as_ref()
            .strip_prefix(&P256_SPKI_PREFIX[..])
            .filter(|point| point.len() == 65 && point.first() == Some(&0x04))
            .ok_or_else(|| {
                invalid("only ECDSA P-256 keys are supported (as cosign generate-key-pair makes)")
            })?;
        Ok(Self {
            point: point.to_vec(),
        })
    }

    /// Checks `signature` (DER, as cosign stores it) over `message`.
    fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &self.point)
            .verify(message, signature)
            .is_ok()
    }
}

/// Checks one signature layer: the signature over the payload, then that the payload names
/// `manifest_digest`. The error says what is wrong.
pub fn check_signed_payload(
    key: &VerificationKey,
    payload: &[u8],
    signature_base64: &str,
    manifest_digest: Sha256Digest,
) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Payload {
        critical: Critical,
    }
    #[derive(Deserialize)]
    struct Critical {
        image: Image,
    }
    #[derive(Deserialize)]
    struct Image {
        #[serde(rename = "docker-manifest-digest")]
        docker_manifest_digest: String,
    }
    let signature = BASE64
        .decode(signature_base64.trim())
        .map_err(|_| "the signature annotation is not base64".to_owned())?;
    if !key.verifies(payload, &signature) {
        return Err("the signature does not verify with the public key of source.verify".into());
    }
    let payload: Payload = serde_json::from_slice(payload)
        .map_err(|_| "the signed payload is not a cosign simple-signing payload".to_owned())?;
    let signed = payload.critical.image.docker_manifest_digest;
    if signed != manifest_digest.to_string() {
        return Err(format!(
            "the signature is for manifest {:?}, not this one",
            signed.chars().take(80).collect::<String>()
        ));
    }
    Ok(())
}

/// The tag cosign stores a manifest's signature under.
pub fn signature_tag(manifest_digest: Sha256Digest) -> String {
    format!("sha256-{}.sig", manifest_digest.to_hex())
}

/// Requires a valid signature by `key` over `manifest_digest`.
pub(crate) async fn verify_signature(
    session: &Session<'_>,
    reference: &OciReference,
    manifest_digest: Sha256Digest,
    key: &VerificationKey,
) -> Result<(), SourceError> {
    let mut manifests = referrer_signatures(session, reference, manifest_digest).await?;
    if let Some(by_tag) = tagged_signature(session, reference, manifest_digest).await? {
        manifests.push(by_tag);
    }
    let mut last_problem = None;
    let mut layers_checked = 0;
    for manifest in manifests.iter().take(MAX_SIGNATURE_MANIFESTS) {
        for layer in manifest
            .layers
            .iter()
            .filter(|layer| layer.media_type == SIMPLE_SIGNING_MEDIA_TYPE)
        {
            if layers_checked >= MAX_SIGNATURE_LAYERS {
                break;
            }
            layers_checked += 1;
            let Some(signature) = layer.annotations.get(SIGNATURE_ANNOTATION) else {
                last_problem = Some("a signature layer has no signature annotation".to_owned());
                continue;
            };
            let payload = match read_payload(session, reference, layer).await {
                Ok(payload) => payload,
                Err(problem) => {
                    last_problem = Some(problem);
                    continue;
                }
            };
            match check_signed_payload(key, &payload, signature, manifest_digest) {
                Ok(()) => {
                    debug!(manifest_digest = %manifest_digest, "signature verified");
                    return Ok(());
                }
                Err(problem) => last_problem = Some(problem),
            }
        }
    }
    match last_problem {
        Some(problem) => Err(SourceError::SignatureInvalid {
            reference: reference.to_string(),
            digest: manifest_digest.to_string(),
            problem,
        }),
        None => Err(SourceError::SignatureMissing {
            reference: reference.to_string(),
            digest: manifest_digest.to_string(),
            tag: signature_tag(manifest_digest),
        }),
    }
}

/// Signature manifests listed by the referrers API; none when the registry lacks the API.
async fn referrer_signatures(
    session: &Session<'_>,
    reference: &OciReference,
    manifest_digest: Sha256Digest,
) -> Result<Vec<Manifest>, SourceError> {
    let mut url = session.transport.api_url(&format!(
        "{}/referrers/{manifest_digest}",
        reference.repository()
    ))?;
    url.query_pairs_mut()
        .append_pair("artifactType", COSIGN_SIGNATURE_ARTIFACT_TYPE);
    let headers = [(ACCEPT, HeaderValue::from_static(OCI_INDEX_MEDIA_TYPE))];
    // A registry without the API answers 404 (or 405).
    let absent = [StatusCode::NOT_FOUND, StatusCode::METHOD_NOT_ALLOWED];
    let Some(body) = get_document(session, &url, &headers, MAX_MANIFEST_BYTES, &absent).await?
    else {
        return Ok(Vec::new());
    };
    // A registry that answers something else has no usable referrers: fall back to the tag.
    let Ok(index) = serde_json::from_slice::<Index>(&body) else {
        return Ok(Vec::new());
    };
    let mut manifests = Vec::new();
    for descriptor in index
        .manifests
        .iter()
        .filter(|descriptor| {
            descriptor.artifact_type.as_deref() == Some(COSIGN_SIGNATURE_ARTIFACT_TYPE)
        })
        .take(MAX_SIGNATURE_MANIFESTS)
    {
        let Ok(digest) = sha256_of_descriptor(descriptor) else {
            continue;
        };
        if let Some(manifest) =
            signature_manifest(session, reference, &digest.to_string(), Some(digest)).await?
        {
            manifests.push(manifest);
        }
    }
    Ok(manifests)
}

async fn tagged_signature(
    session: &Session<'_>,
    reference: &OciReference,
    manifest_digest: Sha256Digest,
) -> Result<Option<Manifest>, SourceError> {
    signature_manifest(session, reference, &signature_tag(manifest_digest), None).await
}

/// A signature manifest by tag or digest; `None` when there is none (404) or it is not a
/// manifest.
async fn signature_manifest(
    session: &Session<'_>,
    reference: &OciReference,
    name: &str,
    expected: Option<Sha256Digest>,
) -> Result<Option<Manifest>, SourceError> {
    let url = session
        .transport
        .api_url(&format!("{}/manifests/{name}", reference.repository()))?;
    let headers = [(ACCEPT, HeaderValue::from_static(MANIFEST_ACCEPT))];
    let absent = [StatusCode::NOT_FOUND];
    let Some(body) = get_document(session, &url, &headers, MAX_MANIFEST_BYTES, &absent).await?
    else {
        return Ok(None);
    };
    if let Some(expected) = expected
        && Sha256Digest::of(&body) != expected
    {
        return Ok(None);
    }
    Ok(Manifest::parse(&body).ok())
}

/// The payload blob of a signature layer, checked against its descriptor.
async fn read_payload(
    session: &Session<'_>,
    reference: &OciReference,
    layer: &super::manifest::Descriptor,
) -> Result<Vec<u8>, String> {
    let digest = sha256_of_descriptor(layer)?;
    if layer.size > MAX_PAYLOAD_BYTES {
        return Err(format!(
            "a signature payload declares {} bytes, more than {MAX_PAYLOAD_BYTES}",
            layer.size
        ));
    }
    let fetched = async {
        let url = session
            .transport
            .api_url(&format!("{}/blobs/{digest}", reference.repository()))?;
        let response = session.send(Method::GET, &url, &[]).await?;
        if response.status() != StatusCode::OK {
            return Err(SourceError::from_status(
                response.status(),
                redact_url(&url),
                true,
            ));
        }
        read_small_body(session.transport, response, layer.size, &redact_url(&url)).await
    }
    .await
    .map_err(|error| format!("its payload cannot be read: {error}"))?;
    if Sha256Digest::of(&fetched) != digest {
        return Err("a signature payload does not match its digest".to_owned());
    }
    Ok(fetched.to_vec())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};

    /// A key pair for tests: the signer and the PEM public key cosign would write.
    pub(crate) fn test_signer() -> (EcdsaKeyPair, String) {
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).expect("keygen");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .expect("key pair");
        let mut spki = P256_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(pair.public_key().as_ref());
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            BASE64.encode(&spki)
        );
        (pair, pem)
    }

    /// The simple-signing payload for `digest` and its base64 signature by `pair`.
    pub(crate) fn sign(pair: &EcdsaKeyPair, digest: Sha256Digest) -> (Vec<u8>, String) {
        let payload = format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"registry.example/g"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
        )
        .into_bytes();
        let signature = pair
            .sign(&SystemRandom::new(), &payload)
            .expect("signature");
        (payload, BASE64.encode(signature.as_ref()))
    }

    #[test]
    fn a_signature_by_the_key_over_the_digest_verifies() {
        let (pair, pem) = test_signer();
        let key = VerificationKey::from_pem(pem.as_bytes()).expect("key");
        let digest = Sha256Digest::of(b"manifest");
        let (payload, signature) = sign(&pair, digest);
        assert_eq!(
            check_signed_payload(&key, &payload, &signature, digest),
            Ok(())
        );
    }

    #[test]
    fn other_keys_digests_and_tampered_payloads_fail() {
        let (pair, pem) = test_signer();
        let (_, other_pem) = test_signer();
        let other_key = VerificationKey::from_pem(other_pem.as_bytes()).expect("key");
        let digest = Sha256Digest::of(b"manifest");
        let (payload, signature) = sign(&pair, digest);
        let problem =
            check_signed_payload(&other_key, &payload, &signature, digest).expect_err("wrong key");
        assert!(problem.contains("does not verify"), "{problem}");
        let key = VerificationKey::from_pem(pem.as_bytes()).expect("key");
        let problem = check_signed_payload(&key, &payload, &signature, Sha256Digest::of(b"other"))
            .expect_err("signed another manifest");
        assert!(problem.contains("not this one"), "{problem}");
        let mut tampered = payload.clone();
        tampered.push(b' ');
        assert!(check_signed_payload(&key, &tampered, &signature, digest).is_err());
        assert!(check_signed_payload(&key, &payload, "%%%", digest).is_err());
        // A valid signature over something that is not a payload.
        let junk_signature = BASE64.encode(
            pair.sign(&SystemRandom::new(), b"junk")
                .expect("signature")
                .as_ref(),
        );
        let problem = check_signed_payload(&key, b"junk", &junk_signature, digest)
            .expect_err("not a payload");
        assert!(problem.contains("simple-signing"), "{problem}");
    }

    #[test]
    fn only_p256_public_keys_in_pem_are_accepted() {
        let rsa_like = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            BASE64.encode([0x30, 0x82, 0x01, 0x22, 0x30, 0x0d])
        );
        for pem in ["", "not pem", rsa_like.as_str()] {
            let error = VerificationKey::from_pem(pem.as_bytes()).expect_err(pem);
            assert_eq!(error.reason(), "InvalidPublicKey");
        }
    }

    #[test]
    fn the_signature_tag_follows_cosign() {
        let digest = Sha256Digest::of(b"abc");
        assert_eq!(
            signature_tag(digest),
            format!("sha256-{}.sig", digest.to_hex())
        );
    }
}
