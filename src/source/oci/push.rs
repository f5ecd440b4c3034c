//! The upload side of graph artifacts (`raypipe dag push`): the manifest raypipe writes for a
//! graph, and [`Fetcher::push_oci`], which uploads its two blobs and puts the manifest.
//!
//! The artifact: an OCI image manifest with `artifactType` [`GRAPH_ARTIFACT_TYPE`], the empty
//! config descriptor (`application/vnd.oci.empty.v1+json`, `{}`, as OCI 1.1 asks of artifacts)
//! and one layer of [`GRAPH_LAYER_MEDIA_TYPE`], the graph's protobuf bytes. The graph's name and
//! version go in the standard annotations `org.opencontainers.image.title` and
//! `org.opencontainers.image.version`: every registry UI and OCI tool shows those, and they
//! mean exactly that (the title of the artifact, the version of what it packages). Nothing
//! time-dependent is written, so pushing the same graph twice gives the same manifest digest.
//! With `--code`, a second layer of [`CODE_LAYER_MEDIA_TYPE`] holds the team's code (a
//! reproducible zip, see `pypackage::code`), titled with its file name (so `oras pull` writes
//! it) and annotated with the modules it holds.
//!
//! Each blob: `HEAD` first (a registry that has it already is not sent it again), else a
//! monolithic upload — `POST /v2/<repo>/blobs/uploads/`, then `PUT <location>&digest=…` with the
//! bytes. The upload location must stay on the registry's own host and port (the credentials
//! go there). Then `PUT /v2/<repo>/manifests/<tag>`; the digest the registry answers must equal
//! the one computed here. Authentication is the pull side's [`Session`] with the scope
//! `repository:<repo>:pull,push`.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderName, HeaderValue, LOCATION};
use reqwest::{Method, StatusCode, Url};

use super::auth::{RegistryCredentials, Session, check_destination};
use super::manifest::{
    ANNOTATION_CODE_MODULES, ANNOTATION_GRAPH_NAME, ANNOTATION_GRAPH_VERSION,
    CODE_LAYER_MEDIA_TYPE, Descriptor, EMPTY_CONFIG, GRAPH_LAYER_MEDIA_TYPE, Manifest,
    OCI_MANIFEST_MEDIA_TYPE,
};
use super::reference::OciReference;
use super::transport::{Connection, Transport, read_small_body};
use crate::source::Fetcher;
use crate::source::digest::Sha256Digest;
use crate::source::error::SourceError;
use crate::source::redact::redact_url;

/// Largest error body read from the registry (its `errors` JSON).
const MAX_ERROR_BODY_BYTES: u64 = 16 * 1024;
/// Longest registry error detail quoted in a message.
const MAX_DETAIL_CHARS: usize = 300;

/// Why a push failed.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// Authentication, transport, destination or budget: the pull side's reasons.
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("{reference} names a digest only: push to a tag (REGISTRY/REPOSITORY:TAG)")]
    NoTag { reference: String },
    #[error("the registry refused to {action} ({status}){detail}")]
    Refused {
        action: String,
        status: u16,
        /// `: CODE: message` from the registry's error body, when it sent one.
        detail: String,
    },
    #[error("the registry sent an upload location raypipe will not use: {problem}")]
    BadLocation { problem: String },
    #[error(
        "the registry stored the manifest as {actual} but raypipe computed {expected}: the \
         registry rewrote it"
    )]
    ManifestDigestMismatch { expected: String, actual: String },
    #[error("cannot encode the manifest: {0}")]
    Encode(String),
}

/// The code layer of an artifact: the zip and what describes it.
#[derive(Debug, Clone)]
pub struct CodeLayer {
    pub bytes: Bytes,
    /// Its file name (`org.opencontainers.image.title`), e.g. `team_models-0123456789abcdef.zip`.
    pub title: String,
    /// The top-level packages and modules it holds.
    pub modules: Vec<String>,
}

/// A graph artifact ready to upload.
#[derive(Debug, Clone)]
pub struct GraphArtifact {
    pub graph: Bytes,
    pub graph_digest: Sha256Digest,
    /// The code layer's bytes and digest, when the artifact carries code.
    pub code: Option<(Bytes, Sha256Digest)>,
    /// The manifest JSON, exactly as uploaded (its digest is the manifest digest).
    pub manifest: Bytes,
    pub manifest_digest: Sha256Digest,
}

impl GraphArtifact {
    /// The artifact of `graph` (protobuf bytes of a valid graph) named `name` at `version`.
    pub fn new(graph: Vec<u8>, name: &str, version: &str) -> Result<Self, PushError> {
        Self::with_code(graph, name, version, None)
    }

    /// [`GraphArtifact::new`] with a code layer.
    pub fn with_code(
        graph: Vec<u8>,
        name: &str,
        version: &str,
        code: Option<CodeLayer>,
    ) -> Result<Self, PushError> {
        let graph = Bytes::from(graph);
        let graph_digest = Sha256Digest::of(&graph);
        let mut annotations = BTreeMap::new();
        if !name.is_empty() {
            annotations.insert(ANNOTATION_GRAPH_NAME.to_owned(), name.to_owned());
        }
        if !version.is_empty() {
            annotations.insert(ANNOTATION_GRAPH_VERSION.to_owned(), version.to_owned());
        }
        let mut manifest = Manifest::graph_artifact(GRAPH_LAYER_MEDIA_TYPE, &graph, annotations);
        let code = code.map(|code| {
            let mut layer = Descriptor::of(CODE_LAYER_MEDIA_TYPE, &code.bytes);
            layer
                .annotations
                .insert(ANNOTATION_GRAPH_NAME.to_owned(), code.title);
            layer
                .annotations
                .insert(ANNOTATION_CODE_MODULES.to_owned(), code.modules.join(","));
            manifest.layers.push(layer);
            let digest = Sha256Digest::of(&code.bytes);
            (code.bytes, digest)
        });
        let manifest = Bytes::from(
            serde_json::to_vec(&manifest).map_err(|e| PushError::Encode(e.to_string()))?,
        );
        Ok(Self {
            graph,
            graph_digest,
            code,
            manifest_digest: Sha256Digest::of(&manifest),
            manifest,
        })
    }
}

/// What to push where.
pub struct PushRequest<'a> {
    /// Must carry a tag; a digest in it is ignored (the manifest's digest is what it is).
    pub reference: &'a OciReference,
    pub credentials: &'a RegistryCredentials,
    pub artifact: &'a GraphArtifact,
    pub allow_insecure_http: bool,
    pub ca_bundle_pem: Option<&'a [u8]>,
    pub connect_timeout: Duration,
    /// Longest the whole push may take.
    pub timeout: Duration,
}

/// What a push did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    pub manifest_digest: Sha256Digest,
    pub graph_digest: Sha256Digest,
    pub code_digest: Option<Sha256Digest>,
    /// Blobs uploaded or found, and those the registry had already (not uploaded again).
    pub blobs: usize,
    pub blobs_skipped: usize,
}

impl Fetcher {
    /// Uploads the artifact's blobs (skipping those the registry has) and puts its manifest
    /// under the reference's tag.
    pub async fn push_oci(&self, request: &PushRequest<'_>) -> Result<Pushed, PushError> {
        let reference = request.reference;
        let tag = reference.tag().ok_or_else(|| PushError::NoTag {
            reference: reference.to_string(),
        })?;
        let transport = self.oci_transport(Connection {
            registry: reference.registry(),
            ca_bundle_pem: request.ca_bundle_pem,
            allow_insecure_http: request.allow_insecure_http,
            connect_timeout: request.connect_timeout,
            timeout: request.timeout,
            // The push reads only small answers (tokens, error documents).
            stall_timeout: crate::source::DEFAULT_STALL_TIMEOUT,
            deadline: tokio::time::Instant::now() + request.timeout,
        })?;
        let session = Session::new(
            &transport,
            request.credentials,
            self.oci_tokens(),
            format!("repository:{}:pull,push", reference.repository()),
        );
        let repository = reference.repository();
        let artifact = request.artifact;
        let mut blobs_skipped = 0;
        let mut blobs = vec![Bytes::from_static(EMPTY_CONFIG), artifact.graph.clone()];
        blobs.extend(artifact.code.as_ref().map(|(bytes, _)| bytes.clone()));
        let blob_count = blobs.len();
        for blob in blobs {
            if upload_blob(&session, repository, blob).await? {
                blobs_skipped += 1;
            }
        }
        let url = transport.api_url(&format!("{repository}/manifests/{tag}"))?;
        let response = session
            .send_body(
                Method::PUT,
                &url,
                &[(
                    CONTENT_TYPE,
                    HeaderValue::from_static(OCI_MANIFEST_MEDIA_TYPE),
                )],
                Some(artifact.manifest.clone()),
            )
            .await?;
        if response.status() != StatusCode::CREATED {
            return Err(refused(&transport, "put the manifest", response).await);
        }
        let stored = response
            .headers()
            .get(HeaderName::from_static("docker-content-digest"))
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let expected = artifact.manifest_digest.to_string();
        if let Some(stored) = stored
            && stored != expected
        {
            return Err(PushError::ManifestDigestMismatch {
                expected,
                actual: stored.chars().take(MAX_DETAIL_CHARS).collect(),
            });
        }
        Ok(Pushed {
            manifest_digest: artifact.manifest_digest,
            graph_digest: artifact.graph_digest,
            code_digest: artifact.code.as_ref().map(|(_, digest)| *digest),
            blobs: blob_count,
            blobs_skipped,
        })
    }
}

/// Uploads one blob unless the registry has it; `true` when it was there already.
async fn upload_blob(
    session: &Session<'_>,
    repository: &str,
    blob: Bytes,
) -> Result<bool, PushError> {
    let transport = session.transport;
    let digest = Sha256Digest::of(&blob);
    let existing = transport.api_url(&format!("{repository}/blobs/{digest}"))?;
    let response = session
        .send_body(Method::HEAD, &existing, &[], None)
        .await?;
    if response.status() == StatusCode::OK {
        return Ok(true);
    }
    let start = transport.api_url(&format!("{repository}/blobs/uploads/"))?;
    let response = session.send_body(Method::POST, &start, &[], None).await?;
    if response.status() != StatusCode::ACCEPTED {
        return Err(refused(transport, "start a blob upload", response).await);
    }
    let location = upload_location(&start, response.headers().get(LOCATION))?;
    check_destination(&location, transport.destinations)?;
    let mut put = location;
    put.query_pairs_mut()
        .append_pair("digest", &digest.to_string());
    let response = session
        .send_body(
            Method::PUT,
            &put,
            &[(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            )],
            Some(blob),
        )
        .await?;
    if response.status() != StatusCode::CREATED {
        return Err(refused(transport, "complete a blob upload", response).await);
    }
    Ok(false)
}

/// The upload URL from a `Location` header (relative ones resolve against the POST's URL);
/// it must stay on the registry's scheme, host and port, where the credentials are meant to go.
fn upload_location(start: &Url, location: Option<&HeaderValue>) -> Result<Url, PushError> {
    let bad = |problem: &str| PushError::BadLocation {
        problem: problem.to_owned(),
    };
    let text = location
        .and_then(|value| value.to_str().ok())
        .ok_or_else(|| bad("no Location header"))?;
    let url = start.join(text).map_err(|_| bad("not a URL"))?;
    let origin = |url: &Url| {
        (
            url.scheme().to_owned(),
            url.host_str().map(str::to_owned),
            url.port_or_known_default(),
        )
    };
    if origin(&url) != origin(start) {
        return Err(bad(&format!(
            "{} is not on the registry {}",
            redact_url(&url),
            start.host_str().unwrap_or_default()
        )));
    }
    Ok(url)
}

/// A [`PushError::Refused`] with the registry's own error codes, when it sent them.
async fn refused(
    transport: &Transport<'_>,
    action: &str,
    response: reqwest::Response,
) -> PushError {
    let status = response.status().as_u16();
    let shown = redact_url(response.url());
    let detail = match read_small_body(transport, response, MAX_ERROR_BODY_BYTES, &shown).await {
        Ok(body) => registry_error_detail(&body),
        Err(_) => String::new(),
    };
    PushError::Refused {
        action: action.to_owned(),
        status,
        detail,
    }
}

/// `: CODE: message; …` from a distribution error body (`{"errors":[{"code","message"}]}`),
/// bounded and printable; empty when the body is not one.
fn registry_error_detail(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Body {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    let Ok(body) = serde_json::from_slice::<Body>(body) else {
        return String::new();
    };
    let text = body
        .errors
        .iter()
        .map(|entry| format!("{}: {}", entry.code, entry.message))
        .collect::<Vec<_>>()
        .join("; ");
    if text.is_empty() {
        return text;
    }
    let printable: String = text
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_DETAIL_CHARS)
        .collect();
    format!(": {printable}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::oci::manifest::{GRAPH_ARTIFACT_TYPE, OCI_EMPTY_MEDIA_TYPE};

    #[test]
    fn the_manifest_is_an_oci_artifact_with_the_empty_config_and_one_graph_layer() {
        let artifact = GraphArtifact::new(b"graph bytes".to_vec(), "fraud", "7").expect("built");
        let manifest = Manifest::parse(&artifact.manifest).expect("it parses as a manifest");
        assert_eq!(manifest.artifact_type.as_deref(), Some(GRAPH_ARTIFACT_TYPE));
        assert_eq!(manifest.config.media_type, OCI_EMPTY_MEDIA_TYPE);
        assert_eq!(
            manifest.config.digest,
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
            "the well-known digest of the empty descriptor"
        );
        assert_eq!(manifest.layers.len(), 1);
        assert_eq!(manifest.layers[0].media_type, GRAPH_LAYER_MEDIA_TYPE);
        assert_eq!(manifest.layers[0].digest, artifact.graph_digest.to_string());
        assert_eq!(manifest.layers[0].size, 11);
        assert_eq!(manifest.annotations[ANNOTATION_GRAPH_NAME], "fraud");
        assert_eq!(manifest.annotations[ANNOTATION_GRAPH_VERSION], "7");
        assert_eq!(
            artifact.manifest_digest,
            Sha256Digest::of(&artifact.manifest)
        );
    }

    #[test]
    fn the_same_graph_gives_the_same_manifest_digest() {
        let a = GraphArtifact::new(b"g".to_vec(), "n", "1").expect("built");
        let b = GraphArtifact::new(b"g".to_vec(), "n", "1").expect("built");
        let c = GraphArtifact::new(b"g".to_vec(), "n", "2").expect("built");
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert_ne!(a.manifest_digest, c.manifest_digest);
    }

    #[test]
    fn a_code_layer_follows_the_graph_with_its_title_and_modules() {
        let code = CodeLayer {
            bytes: Bytes::from_static(b"zip bytes"),
            title: "team-0123.zip".into(),
            modules: vec!["team".into(), "util".into()],
        };
        let artifact =
            GraphArtifact::with_code(b"g".to_vec(), "n", "1", Some(code.clone())).expect("built");
        let manifest = Manifest::parse(&artifact.manifest).expect("parses");
        assert_eq!(manifest.layers.len(), 2);
        let (layer, digest) = manifest.code_layer().expect("valid").expect("present");
        assert_eq!(layer.annotations[ANNOTATION_GRAPH_NAME], "team-0123.zip");
        assert_eq!(layer.annotations[ANNOTATION_CODE_MODULES], "team,util");
        assert_eq!(Some(digest), artifact.code.as_ref().map(|(_, d)| *d));
        let again = GraphArtifact::with_code(b"g".to_vec(), "n", "1", Some(code)).expect("built");
        assert_eq!(artifact.manifest_digest, again.manifest_digest);
        let graph_only = GraphArtifact::new(b"g".to_vec(), "n", "1").expect("built");
        assert_ne!(graph_only.manifest_digest, artifact.manifest_digest);
    }

    #[test]
    fn upload_locations_stay_on_the_registry() {
        let start = Url::parse("http://127.0.0.1:5000/v2/team/g/blobs/uploads/").expect("url");
        let relative = HeaderValue::from_static("/v2/team/g/blobs/uploads/abc?_state=x");
        let url = upload_location(&start, Some(&relative)).expect("relative is fine");
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:5000/v2/team/g/blobs/uploads/abc?_state=x"
        );
        let elsewhere = HeaderValue::from_static("http://169.254.169.254/latest");
        assert!(matches!(
            upload_location(&start, Some(&elsewhere)),
            Err(PushError::BadLocation { .. })
        ));
        assert!(upload_location(&start, None).is_err());
    }

    #[test]
    fn registry_errors_are_quoted_bounded_and_printable() {
        let body = br#"{"errors":[{"code":"DENIED","message":"no push\naccess"}]}"#;
        assert_eq!(registry_error_detail(body), ": DENIED: no pushaccess");
        assert_eq!(registry_error_detail(b"<html>"), "");
        let long = format!(
            r#"{{"errors":[{{"code":"X","message":"{}"}}]}}"#,
            "m".repeat(5000)
        );
        assert!(registry_error_detail(long.as_bytes()).len() <= MAX_DETAIL_CHARS + 2);
    }
}
