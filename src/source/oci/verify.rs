//! `source.verify`: a cosign signature over the manifest digest, checked with a public key
//! before anything is applied. Both layouts cosign writes are read (their formats read from
//! what cosign v2 and v3 store, implemented here):
//!
//! - **Sigstore bundles** (cosign v3's default): an OCI 1.1 referrer of the signed manifest
//!   whose artifact type is a sigstore bundle media type ([`is_sigstore_bundle`], e.g.
//!   [`SIGSTORE_BUNDLE_V03_MEDIA_TYPE`]) and whose one layer, of the same media type, is the
//!   bundle JSON. `cosign sign` puts a DSSE envelope in it: payload type
//!   `application/vnd.in-toto+json`, an in-toto statement whose `predicateType` is
//!   [`COSIGN_SIGN_PREDICATE_TYPE`] and whose `subject` names the manifest's sha256, signed over
//!   DSSE's pre-authentication encoding. A bundle may instead carry a `messageSignature`: a
//!   signature over the manifest's own bytes, with their sha256 as `messageDigest`.
//! - **Simple signing** (cosign v2, and v3 with `--new-bundle-format=false`): an OCI manifest
//!   under the tag `sha256-<hex>.sig` (or a referrer of artifact type
//!   [`COSIGN_SIGNATURE_ARTIFACT_TYPE`]); each layer of media type
//!   [`SIMPLE_SIGNING_MEDIA_TYPE`] is a JSON payload whose
//!   `critical.image.docker-manifest-digest` names the signed manifest, and carries in the
//!   annotation [`SIGNATURE_ANNOTATION`] the signature of the payload's exact bytes.
//!
//! Referrers are listed by the referrers API (`GET /v2/<repo>/referrers/<digest>`), else — a
//! registry without it, such as the CNCF distribution registry — by the OCI 1.1 fallback, the
//! index under the tag `sha256-<hex>` that cosign maintains. Signatures are ECDSA P-256/SHA-256
//! (ASN.1 DER). One valid signature by the key is enough. The digest binding is always read
//! from the signed bytes, never from a manifest's `subject` or annotations, which anyone with
//! push access can write.
//!
//! Deliberate: the payload's `docker-reference` is not compared with `source.oci` (artifacts
//! are copied between registries and keep their signatures; the digest is what binds the
//! signature to the content). A bundle's verification material (certificate, Rekor entries,
//! timestamps) is not used: the configured key is the trust. Keyless verification (Fulcio
//! certificates, Rekor) is not implemented: `source.verify` has a place for it
//! ([`crate::api`]), refused by validation until it exists. Attestations (`cosign attest`,
//! other predicate types) are statements about an artifact, not its signature, and do not
//! count.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::{
    STANDARD as BASE64, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD,
};
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
use super::fetch::{get_document, get_manifest};
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

/// The media type (artifact type and layer) of the sigstore bundles cosign v3 writes.
pub const SIGSTORE_BUNDLE_V03_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The in-toto predicate type of `cosign sign` (what makes a DSSE bundle a signature).
pub const COSIGN_SIGN_PREDICATE_TYPE: &str = "https://sigstore.dev/cosign/sign/v1";
/// DSSE payload type of in-toto statements.
const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
const IN_TOTO_STATEMENT_TYPES: [&str; 2] = [
    "https://in-toto.io/Statement/v1",
    "https://in-toto.io/Statement/v0.1",
];

/// Largest signature payload or bundle read (payloads are a few hundred bytes, key-signed
/// bundles under 1 KiB, bundles with certificates and log entries a few KiB).
const MAX_PAYLOAD_BYTES: u64 = 64 * 1024;
/// Signatures tried per DSSE envelope.
const MAX_DSSE_SIGNATURES: usize = 4;
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

/// Whether `media_type` is a sigstore bundle (`application/vnd.dev.sigstore.bundle.v0.3+json`,
/// or the older `application/vnd.dev.sigstore.bundle+json;version=0.x`).
pub fn is_sigstore_bundle(media_type: &str) -> bool {
    media_type
        .strip_prefix("application/vnd.dev.sigstore.bundle")
        .is_some_and(|rest| rest.ends_with("+json") || rest.starts_with("+json;version="))
}

/// What a sigstore bundle signs, as read from its JSON (nothing checked yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleContent {
    /// A DSSE envelope: the payload, its type, and up to [`MAX_DSSE_SIGNATURES`] signatures.
    Dsse {
        payload_type: String,
        payload: Vec<u8>,
        signatures: Vec<Vec<u8>>,
    },
    /// A signature over the artifact's own bytes (here: the manifest) and their digest.
    MessageSignature {
        algorithm: String,
        digest: Vec<u8>,
        signature: Vec<u8>,
    },
}

/// Base64 as protobuf's JSON form allows it: standard or URL-safe, padded or not.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let text = text.trim();
    [&BASE64, &URL_SAFE, &STANDARD_NO_PAD, &URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(text).ok())
}

/// Reads a bundle's JSON (already bounded by [`MAX_PAYLOAD_BYTES`]). Never quotes it.
pub fn parse_bundle(bytes: &[u8]) -> Result<BundleContent, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Bundle {
        #[serde(default)]
        media_type: String,
        dsse_envelope: Option<Envelope>,
        message_signature: Option<MessageSignature>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Envelope {
        payload: String,
        payload_type: String,
        #[serde(default)]
        signatures: Vec<EnvelopeSignature>,
    }
    #[derive(Deserialize)]
    struct EnvelopeSignature {
        sig: String,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct MessageSignature {
        message_digest: Option<MessageDigest>,
        signature: String,
    }
    #[derive(Deserialize)]
    struct MessageDigest {
        algorithm: String,
        digest: String,
    }
    let bundle: Bundle = serde_json::from_slice(bytes)
        .map_err(|_| "the sigstore bundle is not bundle JSON".to_owned())?;
    if !is_sigstore_bundle(&bundle.media_type) {
        return Err(format!(
            "the sigstore bundle's mediaType {:?} is not a bundle media type",
            bundle.media_type.chars().take(80).collect::<String>()
        ));
    }
    match (bundle.dsse_envelope, bundle.message_signature) {
        (Some(envelope), None) => {
            let payload = decode_base64(&envelope.payload)
                .ok_or("the bundle's DSSE payload is not base64")?;
            let signatures = envelope
                .signatures
                .iter()
                .take(MAX_DSSE_SIGNATURES)
                .map(|signature| decode_base64(&signature.sig))
                .collect::<Option<Vec<_>>>()
                .ok_or("a DSSE signature of the bundle is not base64")?;
            if signatures.is_empty() {
                return Err("the bundle's DSSE envelope has no signature".to_owned());
            }
            Ok(BundleContent::Dsse {
                payload_type: envelope.payload_type,
                payload,
                signatures,
            })
        }
        (None, Some(message)) => {
            let digest = message
                .message_digest
                .ok_or("the bundle's messageSignature has no messageDigest")?;
            Ok(BundleContent::MessageSignature {
                algorithm: digest.algorithm,
                digest: decode_base64(&digest.digest)
                    .ok_or("the bundle's messageDigest is not base64")?,
                signature: decode_base64(&message.signature)
                    .ok_or("the bundle's messageSignature is not base64")?,
            })
        }
        (None, None) => {
            Err("the bundle holds neither a DSSE envelope nor a messageSignature".into())
        }
        (Some(_), Some(_)) => {
            Err("the bundle holds both a DSSE envelope and a messageSignature".into())
        }
    }
}

/// DSSE's pre-authentication encoding, the bytes a DSSE signature covers:
/// `DSSEv1 <len(type)> <type> <len(payload)> <payload>`.
fn dsse_pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut pae = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    pae.extend_from_slice(payload);
    pae
}

/// Checks a bundle: its signature by `key`, then that what it signed is `manifest_digest`.
/// A `messageSignature` covers the manifest's bytes, so it needs `manifest` (which must
/// have `manifest_digest`; the caller fetched it by that digest). The error says what is wrong.
pub fn check_bundle(
    key: &VerificationKey,
    bundle: &BundleContent,
    manifest_digest: Sha256Digest,
    manifest: Option<&[u8]>,
) -> Result<(), String> {
    match bundle {
        BundleContent::Dsse {
            payload_type,
            payload,
            signatures,
        } => {
            let pae = dsse_pae(payload_type, payload);
            if !signatures
                .iter()
                .any(|signature| key.verifies(&pae, signature))
            {
                return Err(
                    "the bundle's DSSE signature does not verify with the public key of \
                     source.verify"
                        .into(),
                );
            }
            if payload_type != IN_TOTO_PAYLOAD_TYPE {
                return Err(format!(
                    "the bundle signs a payload of type {:?}, not an in-toto statement",
                    payload_type.chars().take(80).collect::<String>()
                ));
            }
            check_statement(payload, manifest_digest)
        }
        BundleContent::MessageSignature {
            algorithm,
            digest,
            signature,
        } => {
            if algorithm != "SHA2_256" {
                return Err(format!(
                    "the bundle's messageDigest uses {:?}, not SHA2_256",
                    algorithm.chars().take(40).collect::<String>()
                ));
            }
            if digest.as_slice() != manifest_digest.as_bytes() {
                return Err("the bundle's messageSignature is for another manifest".into());
            }
            let manifest = manifest.ok_or("the signed manifest's bytes are not at hand")?;
            if Sha256Digest::of(manifest) != manifest_digest {
                return Err("the manifest's bytes do not have the manifest digest".into());
            }
            if !key.verifies(manifest, signature) {
                return Err(
                    "the bundle's messageSignature does not verify with the public key of \
                     source.verify"
                        .into(),
                );
            }
            Ok(())
        }
    }
}

/// The signed in-toto statement must be `cosign sign`'s, about `manifest_digest`.
fn check_statement(payload: &[u8], manifest_digest: Sha256Digest) -> Result<(), String> {
    #[derive(Deserialize)]
    struct Statement {
        #[serde(rename = "_type")]
        statement_type: String,
        #[serde(default)]
        subject: Vec<Subject>,
        #[serde(rename = "predicateType")]
        predicate_type: String,
    }
    #[derive(Deserialize)]
    struct Subject {
        #[serde(default)]
        digest: BTreeMap<String, String>,
    }
    let statement: Statement = serde_json::from_slice(payload)
        .map_err(|_| "the bundle's signed payload is not an in-toto statement".to_owned())?;
    if !IN_TOTO_STATEMENT_TYPES.contains(&statement.statement_type.as_str()) {
        return Err("the bundle's signed payload is not an in-toto statement".into());
    }
    if statement.predicate_type != COSIGN_SIGN_PREDICATE_TYPE {
        return Err(format!(
            "the bundle is an attestation ({:?}), not a cosign signature ({COSIGN_SIGN_PREDICATE_TYPE:?})",
            statement
                .predicate_type
                .chars()
                .take(80)
                .collect::<String>()
        ));
    }
    let wanted = manifest_digest.to_hex();
    if statement.subject.iter().any(|subject| {
        subject
            .digest
            .get("sha256")
            .is_some_and(|hex| hex.eq_ignore_ascii_case(&wanted))
    }) {
        return Ok(());
    }
    let named: Vec<String> = statement
        .subject
        .iter()
        .filter_map(|subject| subject.digest.get("sha256"))
        .take(3)
        .map(|hex| format!("sha256:{}", hex.chars().take(64).collect::<String>()))
        .collect();
    Err(format!("the bundle signs manifest {named:?}, not this one"))
}

/// The tag of the OCI 1.1 referrers fallback: an index of the manifest's referrers.
pub fn referrers_tag(manifest_digest: Sha256Digest) -> String {
    format!("sha256-{}", manifest_digest.to_hex())
}

/// The tag cosign stores a manifest's signature under.
pub fn signature_tag(manifest_digest: Sha256Digest) -> String {
    format!("sha256-{}.sig", manifest_digest.to_hex())
}

/// Requires a valid signature by `key` over `manifest_digest`. `manifest` is the manifest's
/// bytes when the caller has them (a `messageSignature` bundle needs them; they are fetched
/// by digest otherwise).
pub(crate) async fn verify_signature(
    session: &Session<'_>,
    reference: &OciReference,
    manifest_digest: Sha256Digest,
    manifest: Option<&[u8]>,
    key: &VerificationKey,
) -> Result<(), SourceError> {
    let mut manifests = referrer_signatures(session, reference, manifest_digest).await?;
    if let Some(by_tag) = tagged_signature(session, reference, manifest_digest).await? {
        manifests.push(by_tag);
    }
    let mut fetched_manifest: Option<bytes::Bytes> = None;
    let mut last_problem = None;
    let mut layers_checked = 0;
    for signature_manifest in manifests.iter().take(MAX_SIGNATURE_MANIFESTS) {
        for layer in signature_manifest.layers.iter().filter(|layer| {
            layer.media_type == SIMPLE_SIGNING_MEDIA_TYPE || is_sigstore_bundle(&layer.media_type)
        }) {
            if layers_checked >= MAX_SIGNATURE_LAYERS {
                break;
            }
            layers_checked += 1;
            let simple_signature = if layer.media_type == SIMPLE_SIGNING_MEDIA_TYPE {
                match layer.annotations.get(SIGNATURE_ANNOTATION) {
                    Some(signature) => Some(signature),
                    None => {
                        last_problem =
                            Some("a signature layer has no signature annotation".to_owned());
                        continue;
                    }
                }
            } else {
                None
            };
            let payload = match read_payload(session, reference, layer).await {
                Ok(payload) => payload,
                Err(problem) => {
                    last_problem = Some(problem);
                    continue;
                }
            };
            let checked = match simple_signature {
                Some(signature) => check_signed_payload(key, &payload, signature, manifest_digest),
                None => match parse_bundle(&payload) {
                    Ok(bundle) => {
                        let needs_manifest =
                            matches!(bundle, BundleContent::MessageSignature { .. });
                        if needs_manifest && manifest.is_none() && fetched_manifest.is_none() {
                            fetched_manifest = Some(
                                get_manifest(session, reference, Some(manifest_digest))
                                    .await?
                                    .0,
                            );
                        }
                        let bytes = manifest.or(fetched_manifest.as_deref());
                        check_bundle(key, &bundle, manifest_digest, bytes)
                    }
                    Err(problem) => Err(problem),
                },
            };
            match checked {
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
            tag: referrers_tag(manifest_digest),
        }),
    }
}

/// Whether a referrer may be a signature: cosign's simple-signing artifact or a sigstore
/// bundle.
fn is_signature_artifact(artifact_type: Option<&str>) -> bool {
    artifact_type.is_some_and(|t| t == COSIGN_SIGNATURE_ARTIFACT_TYPE || is_sigstore_bundle(t))
}

/// Signature manifests among the referrers of `manifest_digest`: from the referrers API, else
/// (a registry without it) from the fallback tag [`referrers_tag`]; none when neither exists.
async fn referrer_signatures(
    session: &Session<'_>,
    reference: &OciReference,
    manifest_digest: Sha256Digest,
) -> Result<Vec<Manifest>, SourceError> {
    let url = session.transport.api_url(&format!(
        "{}/referrers/{manifest_digest}",
        reference.repository()
    ))?;
    let headers = [(ACCEPT, HeaderValue::from_static(OCI_INDEX_MEDIA_TYPE))];
    // A registry without the API answers 404 (or 405). No `artifactType` filter: signatures
    // come in two artifact types, and a registry may ignore the filter anyway.
    let absent = [StatusCode::NOT_FOUND, StatusCode::METHOD_NOT_ALLOWED];
    let listed = get_document(session, &url, &headers, MAX_MANIFEST_BYTES, &absent).await?;
    let body = match listed {
        Some(body) => body,
        None => {
            let tag_url = session.transport.api_url(&format!(
                "{}/manifests/{}",
                reference.repository(),
                referrers_tag(manifest_digest)
            ))?;
            let by_tag = get_document(
                session,
                &tag_url,
                &headers,
                MAX_MANIFEST_BYTES,
                &[StatusCode::NOT_FOUND],
            )
            .await?;
            let Some(body) = by_tag else {
                return Ok(Vec::new());
            };
            body
        }
    };
    // Something that is not an index lists no usable referrers: the `.sig` tag may still.
    let Ok(index) = serde_json::from_slice::<Index>(&body) else {
        return Ok(Vec::new());
    };
    let mut manifests = Vec::new();
    for descriptor in index
        .manifests
        .iter()
        .filter(|descriptor| is_signature_artifact(descriptor.artifact_type.as_deref()))
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

    /// A bundle exactly as cosign v3.1.3 wrote it (`cosign sign --key` of a graph artifact in
    /// the distribution registry, key made by `cosign generate-key-pair`), with that key.
    const COSIGN_V3_BUNDLE: &[u8] = include_bytes!("testdata/cosign-v3-bundle.json");
    const COSIGN_V3_PUBLIC_KEY: &[u8] = include_bytes!("testdata/cosign-v3.pub");
    const COSIGN_V3_SIGNED: &str =
        "d1f192d10a0da97d021fdf6bbe6cf8469108ce98468c90bd6bf3a4d64cb66f14";

    fn cosign_v3_digest() -> Sha256Digest {
        COSIGN_V3_SIGNED.parse().expect("hex")
    }

    /// A DSSE bundle by `pair` over `statement`.
    pub(crate) fn dsse_bundle(pair: &EcdsaKeyPair, payload_type: &str, statement: &str) -> Vec<u8> {
        let signature = pair
            .sign(
                &SystemRandom::new(),
                &dsse_pae(payload_type, statement.as_bytes()),
            )
            .expect("signature");
        serde_json::json!({
            "mediaType": SIGSTORE_BUNDLE_V03_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": "x"}},
            "dsseEnvelope": {
                "payload": BASE64.encode(statement),
                "payloadType": payload_type,
                "signatures": [{"sig": BASE64.encode(signature.as_ref())}],
            },
        })
        .to_string()
        .into_bytes()
    }

    pub(crate) fn statement(predicate_type: &str, digest: Sha256Digest) -> String {
        format!(
            r#"{{"_type":"https://in-toto.io/Statement/v1","subject":[{{"digest":{{"sha256":"{}"}}}}],"predicateType":"{predicate_type}","predicate":{{}}}}"#,
            digest.to_hex()
        )
    }

    fn check(key: &VerificationKey, bundle: &[u8], digest: Sha256Digest) -> Result<(), String> {
        check_bundle(key, &parse_bundle(bundle)?, digest, None)
    }

    #[test]
    fn a_bundle_written_by_cosign_v3_verifies_for_its_digest_only() {
        let key = VerificationKey::from_pem(COSIGN_V3_PUBLIC_KEY).expect("cosign's key");
        assert_eq!(check(&key, COSIGN_V3_BUNDLE, cosign_v3_digest()), Ok(()));
        let problem = check(
            &key,
            COSIGN_V3_BUNDLE,
            Sha256Digest::of(b"another manifest"),
        )
        .expect_err("another digest");
        assert!(
            problem.contains("not this one") && problem.contains(COSIGN_V3_SIGNED),
            "{problem}"
        );
        let (_, other_pem) = test_signer();
        let other = VerificationKey::from_pem(other_pem.as_bytes()).expect("key");
        let problem = check(&other, COSIGN_V3_BUNDLE, cosign_v3_digest()).expect_err("other key");
        assert!(problem.contains("does not verify"), "{problem}");
    }

    #[test]
    fn a_tampered_cosign_bundle_is_refused() {
        let key = VerificationKey::from_pem(COSIGN_V3_PUBLIC_KEY).expect("cosign's key");
        let mut bundle: serde_json::Value =
            serde_json::from_slice(COSIGN_V3_BUNDLE).expect("bundle JSON");
        let envelope = &mut bundle["dsseEnvelope"];
        let payload = BASE64
            .decode(envelope["payload"].as_str().expect("payload"))
            .expect("base64");
        // The statement re-pointed at another manifest, signature kept.
        let other = Sha256Digest::of(b"other");
        let moved = String::from_utf8(payload)
            .expect("utf-8")
            .replace(COSIGN_V3_SIGNED, &other.to_hex());
        envelope["payload"] = BASE64.encode(moved).into();
        let tampered = bundle.to_string();
        for digest in [cosign_v3_digest(), other] {
            let problem = check(&key, tampered.as_bytes(), digest).expect_err("tampered");
            assert!(problem.contains("does not verify"), "{problem}");
        }
        // The payload type is signed too.
        let mut retyped: serde_json::Value =
            serde_json::from_slice(COSIGN_V3_BUNDLE).expect("bundle JSON");
        retyped["dsseEnvelope"]["payloadType"] = "application/json".into();
        assert!(check(&key, retyped.to_string().as_bytes(), cosign_v3_digest()).is_err());
    }

    #[test]
    fn attestations_and_other_statements_are_not_signatures() {
        let (pair, pem) = test_signer();
        let key = VerificationKey::from_pem(pem.as_bytes()).expect("key");
        let digest = Sha256Digest::of(b"manifest");
        let signed = dsse_bundle(
            &pair,
            IN_TOTO_PAYLOAD_TYPE,
            &statement(COSIGN_SIGN_PREDICATE_TYPE, digest),
        );
        assert_eq!(check(&key, &signed, digest), Ok(()));
        let attestation = dsse_bundle(
            &pair,
            IN_TOTO_PAYLOAD_TYPE,
            &statement("https://slsa.dev/provenance/v1", digest),
        );
        let problem = check(&key, &attestation, digest).expect_err("an attestation");
        assert!(problem.contains("attestation"), "{problem}");
        let not_in_toto = dsse_bundle(
            &pair,
            "application/vnd.dev.cosign.simplesigning.v1+json",
            &statement(COSIGN_SIGN_PREDICATE_TYPE, digest),
        );
        assert!(check(&key, &not_in_toto, digest).is_err());
        let not_a_statement = dsse_bundle(&pair, IN_TOTO_PAYLOAD_TYPE, r#"{"subject":[]}"#);
        assert!(check(&key, &not_a_statement, digest).is_err());
    }

    #[test]
    fn a_message_signature_covers_the_manifest_bytes() {
        let (pair, pem) = test_signer();
        let key = VerificationKey::from_pem(pem.as_bytes()).expect("key");
        let manifest = br#"{"schemaVersion":2}"#;
        let digest = Sha256Digest::of(manifest);
        let bundle = |digest_bytes: &[u8], signed: &[u8]| {
            let signature = pair.sign(&SystemRandom::new(), signed).expect("signature");
            serde_json::json!({
                "mediaType": "application/vnd.dev.sigstore.bundle+json;version=0.2",
                "messageSignature": {
                    "messageDigest": {"algorithm": "SHA2_256",
                                      "digest": BASE64.encode(digest_bytes)},
                    "signature": BASE64.encode(signature.as_ref()),
                },
            })
            .to_string()
        };
        let good = parse_bundle(bundle(digest.as_bytes(), manifest).as_bytes()).expect("parses");
        assert_eq!(check_bundle(&key, &good, digest, Some(manifest)), Ok(()));
        assert!(check_bundle(&key, &good, digest, None).is_err());
        assert!(check_bundle(&key, &good, digest, Some(b"other bytes")).is_err());
        let other = Sha256Digest::of(b"other");
        let problem = check_bundle(&key, &good, other, Some(manifest)).expect_err("other digest");
        assert!(problem.contains("another manifest"), "{problem}");
        let wrong_bytes = parse_bundle(bundle(digest.as_bytes(), b"not the manifest").as_bytes())
            .expect("parses");
        let problem = check_bundle(&key, &wrong_bytes, digest, Some(manifest))
            .expect_err("signed other bytes");
        assert!(problem.contains("does not verify"), "{problem}");
    }

    #[test]
    fn broken_bundles_are_refused_without_panicking() {
        let key = VerificationKey::from_pem(COSIGN_V3_PUBLIC_KEY).expect("cosign's key");
        // Every truncation of a genuine bundle is refused (and none panics).
        for end in 0..COSIGN_V3_BUNDLE.len() {
            let prefix = COSIGN_V3_BUNDLE.get(..end).expect("in range");
            assert!(check(&key, prefix, cosign_v3_digest()).is_err(), "{end}");
        }
        for junk in [
            &b"{}"[..],
            br#"{"mediaType":"text/plain","dsseEnvelope":{"payload":"","payloadType":"","signatures":[{"sig":""}]}}"#,
            br#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json"}"#,
            br#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","dsseEnvelope":{"payload":"%%","payloadType":"x","signatures":[]}}"#,
            br#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","dsseEnvelope":{"payload":"e30=","payloadType":"x","signatures":[]}}"#,
            br#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","messageSignature":{"signature":"AA=="}}"#,
        ] {
            assert!(
                check(&key, junk, cosign_v3_digest()).is_err(),
                "{}",
                String::from_utf8_lossy(junk)
            );
        }
        assert!(is_sigstore_bundle(SIGSTORE_BUNDLE_V03_MEDIA_TYPE));
        assert!(is_sigstore_bundle(
            "application/vnd.dev.sigstore.bundle+json;version=0.1"
        ));
        assert!(!is_sigstore_bundle(COSIGN_SIGNATURE_ARTIFACT_TYPE));
        assert!(!is_sigstore_bundle("application/vnd.dev.sigstore.bundlex"));
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
