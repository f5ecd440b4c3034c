//! The raypipe graph artifact: its media types (the one place they are defined; the push side
//! uses them too), OCI manifest and index documents, and the checks that pick the graph layer
//! out of a manifest.
//!
//! A graph artifact is an OCI image manifest whose artifact type (`artifactType`, or the
//! config's media type when `artifactType` is absent, as OCI 1.1 defines) is
//! [`GRAPH_ARTIFACT_TYPE`] and which holds exactly one layer of [`GRAPH_LAYER_MEDIA_TYPE`]: the
//! graph's protobuf bytes, and at most one layer of [`CODE_LAYER_MEDIA_TYPE`]: the team's
//! own Python code as the zip Ray loads through `py_modules` (`raypipe dag push --code`, issue
//! 31), so one manifest digest, and one signature over it, pins graph and code. Other layers
//! are ignored; an index is refused (a graph has no platforms to choose between).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::source::digest::Sha256Digest;

/// The artifact type of a raypipe graph manifest.
pub const GRAPH_ARTIFACT_TYPE: &str = "application/vnd.raypipe.graph.v1";
/// The media type of the one layer that holds the graph (protobuf `Graph`).
pub const GRAPH_LAYER_MEDIA_TYPE: &str = "application/vnd.raypipe.graph.v1+protobuf";
/// The media type of the optional code layer: a zip of stored entries under one top-level
/// directory (`pypackage::code`).
pub const CODE_LAYER_MEDIA_TYPE: &str = "application/vnd.raypipe.code.v1+zip";
/// Annotation of the code layer: the top-level Python packages and modules it holds, comma
/// separated (what `raypipe dag diff` and people read without unpacking it).
pub const ANNOTATION_CODE_MODULES: &str = "dev.raypipe.code.modules";
/// Annotations the push side sets on the manifest: the graph's name and version, under the
/// standard keys registry UIs show.
pub const ANNOTATION_GRAPH_NAME: &str = "org.opencontainers.image.title";
pub const ANNOTATION_GRAPH_VERSION: &str = "org.opencontainers.image.version";

pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// The empty config blob every graph artifact carries (of [`OCI_EMPTY_MEDIA_TYPE`]).
pub const EMPTY_CONFIG: &[u8] = b"{}";
/// The empty config an artifact with an `artifactType` carries (`{}`).
pub const OCI_EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// The `Accept` header for manifest requests: raypipe reads OCI manifests (Docker v2 ones
/// are listed so a registry converting between them answers rather than 404s).
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json;q=0.9";

/// Largest manifest read (the distribution spec lets registries refuse bigger ones).
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;

/// A content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An OCI image manifest (the fields raypipe reads or writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An OCI image index, as the referrers API answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// Why a manifest is not a usable graph artifact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not an OCI/Docker image manifest, or malformed.
    #[error("{0}")]
    Invalid(String),
    /// A well-formed manifest of something other than a raypipe graph.
    #[error("{0}")]
    WrongMediaType(String),
}

impl Descriptor {
    /// The descriptor of `bytes` stored as `media_type`.
    pub fn of(media_type: &str, bytes: &[u8]) -> Descriptor {
        Descriptor {
            media_type: media_type.to_owned(),
            digest: Sha256Digest::of(bytes).to_string(),
            size: bytes.len() as u64,
            artifact_type: None,
            annotations: BTreeMap::new(),
        }
    }
}

impl Manifest {
    /// A graph artifact's manifest: the empty config `{}` and one layer of `layer_media_type`
    /// holding `graph` (tests pass other media types to build refused artifacts).
    pub fn graph_artifact(
        layer_media_type: &str,
        graph: &[u8],
        annotations: BTreeMap<String, String>,
    ) -> Manifest {
        Manifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST_MEDIA_TYPE.to_owned()),
            artifact_type: Some(GRAPH_ARTIFACT_TYPE.to_owned()),
            config: Descriptor::of(OCI_EMPTY_MEDIA_TYPE, EMPTY_CONFIG),
            layers: vec![Descriptor::of(layer_media_type, graph)],
            subject: None,
            annotations,
        }
    }

    /// Parses manifest bytes; an index or an unknown document is [`ManifestError::Invalid`].
    pub fn parse(bytes: &[u8]) -> Result<Self, ManifestError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Probe {
            media_type: Option<String>,
            manifests: Option<serde_json::Value>,
        }
        let probe: Probe = serde_json::from_slice(bytes)
            .map_err(|error| ManifestError::Invalid(format!("not JSON ({error})")))?;
        if probe.manifests.is_some()
            || matches!(
                probe.media_type.as_deref(),
                Some(OCI_INDEX_MEDIA_TYPE | DOCKER_LIST_MEDIA_TYPE)
            )
        {
            return Err(ManifestError::Invalid(
                "it is an index (a list of manifests), not the manifest of one artifact".to_owned(),
            ));
        }
        if let Some(media_type) = probe.media_type.as_deref()
            && media_type != OCI_MANIFEST_MEDIA_TYPE
            && media_type != DOCKER_MANIFEST_MEDIA_TYPE
        {
            return Err(ManifestError::Invalid(format!(
                "its media type {media_type:?} is not an image manifest"
            )));
        }
        let manifest: Manifest = serde_json::from_slice(bytes)
            .map_err(|error| ManifestError::Invalid(format!("malformed ({error})")))?;
        if manifest.schema_version != 2 {
            return Err(ManifestError::Invalid(format!(
                "schemaVersion is {}, not 2",
                manifest.schema_version
            )));
        }
        Ok(manifest)
    }

    /// The artifact type: `artifactType`, else the config's media type (OCI 1.1).
    pub fn effective_artifact_type(&self) -> &str {
        self.artifact_type
            .as_deref()
            .unwrap_or(&self.config.media_type)
    }

    /// The code layer and its digest, when the artifact has one (more than one is invalid).
    /// Call after [`Manifest::graph_layer`], which checks the artifact type.
    pub fn code_layer(&self) -> Result<Option<(&Descriptor, Sha256Digest)>, ManifestError> {
        let mut code = self
            .layers
            .iter()
            .filter(|layer| layer.media_type == CODE_LAYER_MEDIA_TYPE);
        match (code.next(), code.next()) {
            (None, _) => Ok(None),
            (Some(layer), None) => {
                let digest = sha256_of_descriptor(layer).map_err(ManifestError::Invalid)?;
                Ok(Some((layer, digest)))
            }
            (Some(_), Some(_)) => Err(ManifestError::Invalid(format!(
                "it has more than one layer of media type {CODE_LAYER_MEDIA_TYPE:?}"
            ))),
        }
    }

    /// The graph layer and its digest, after checking the artifact type.
    pub fn graph_layer(&self) -> Result<(&Descriptor, Sha256Digest), ManifestError> {
        let artifact_type = self.effective_artifact_type();
        if artifact_type != GRAPH_ARTIFACT_TYPE {
            return Err(ManifestError::WrongMediaType(format!(
                "its artifact type is {artifact_type:?}, not {GRAPH_ARTIFACT_TYPE:?} (push it \
                 with `raypipe dag push`)"
            )));
        }
        let mut graphs = self
            .layers
            .iter()
            .filter(|layer| layer.media_type == GRAPH_LAYER_MEDIA_TYPE);
        let layer = match (graphs.next(), graphs.next()) {
            (Some(layer), None) => layer,
            (None, _) => {
                let found: Vec<&str> = self
                    .layers
                    .iter()
                    .map(|layer| layer.media_type.as_str())
                    .take(8)
                    .collect();
                return Err(ManifestError::WrongMediaType(format!(
                    "it has no layer of media type {GRAPH_LAYER_MEDIA_TYPE:?} (layers: {found:?})"
                )));
            }
            (Some(_), Some(_)) => {
                return Err(ManifestError::Invalid(format!(
                    "it has more than one layer of media type {GRAPH_LAYER_MEDIA_TYPE:?}"
                )));
            }
        };
        let digest = sha256_of_descriptor(layer).map_err(ManifestError::Invalid)?;
        Ok((layer, digest))
    }
}

/// The descriptor's digest, which must be `sha256:<64 hex>` (the only algorithm checked).
pub fn sha256_of_descriptor(descriptor: &Descriptor) -> Result<Sha256Digest, String> {
    descriptor
        .digest
        .strip_prefix(Sha256Digest::PREFIX)
        .and_then(|hex| hex.parse().ok())
        .ok_or_else(|| {
            format!(
                "the digest {:?} is not a sha256 digest",
                descriptor.digest.chars().take(80).collect::<String>()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    fn descriptor(media_type: &str) -> Descriptor {
        Descriptor {
            media_type: media_type.into(),
            digest: format!("sha256:{HEX}"),
            size: 3,
            artifact_type: None,
            annotations: BTreeMap::new(),
        }
    }

    fn manifest(artifact_type: Option<&str>, config: &str, layers: &[&str]) -> Manifest {
        Manifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST_MEDIA_TYPE.into()),
            artifact_type: artifact_type.map(str::to_owned),
            config: descriptor(config),
            layers: layers.iter().map(|media| descriptor(media)).collect(),
            subject: None,
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn a_graph_artifact_round_trips_and_yields_its_layer() {
        let graph = manifest(
            Some(GRAPH_ARTIFACT_TYPE),
            OCI_EMPTY_MEDIA_TYPE,
            &["text/plain", GRAPH_LAYER_MEDIA_TYPE],
        );
        let bytes = serde_json::to_vec(&graph).expect("serialize");
        let parsed = Manifest::parse(&bytes).expect("parse");
        assert_eq!(parsed, graph);
        let (layer, digest) = parsed.graph_layer().expect("graph layer");
        assert_eq!(layer.media_type, GRAPH_LAYER_MEDIA_TYPE);
        assert_eq!(digest.to_hex(), HEX);
        // Without artifactType, the config's media type is the artifact type.
        let old_style = manifest(None, GRAPH_ARTIFACT_TYPE, &[GRAPH_LAYER_MEDIA_TYPE]);
        assert!(old_style.graph_layer().is_ok());
    }

    #[test]
    fn other_artifacts_and_layers_are_the_wrong_media_type() {
        let image = manifest(
            None,
            "application/vnd.oci.image.config.v1+json",
            &[GRAPH_LAYER_MEDIA_TYPE],
        );
        assert!(matches!(
            image.graph_layer(),
            Err(ManifestError::WrongMediaType(_))
        ));
        let wrong_layer = manifest(
            Some(GRAPH_ARTIFACT_TYPE),
            OCI_EMPTY_MEDIA_TYPE,
            &["text/plain"],
        );
        let Err(ManifestError::WrongMediaType(problem)) = wrong_layer.graph_layer() else {
            panic!("wrong layer must be refused");
        };
        assert!(problem.contains("text/plain"), "{problem}");
        let two = manifest(
            Some(GRAPH_ARTIFACT_TYPE),
            OCI_EMPTY_MEDIA_TYPE,
            &[GRAPH_LAYER_MEDIA_TYPE, GRAPH_LAYER_MEDIA_TYPE],
        );
        assert!(matches!(two.graph_layer(), Err(ManifestError::Invalid(_))));
        let mut bad_digest = manifest(
            Some(GRAPH_ARTIFACT_TYPE),
            OCI_EMPTY_MEDIA_TYPE,
            &[GRAPH_LAYER_MEDIA_TYPE],
        );
        bad_digest.layers[0].digest = "sha512:abc".into();
        assert!(matches!(
            bad_digest.graph_layer(),
            Err(ManifestError::Invalid(_))
        ));
    }

    #[test]
    fn a_code_layer_is_optional_and_single() {
        let graph_only = manifest(
            Some(GRAPH_ARTIFACT_TYPE),
            OCI_EMPTY_MEDIA_TYPE,
            &[GRAPH_LAYER_MEDIA_TYPE],
        );
        assert_eq!(graph_only.code_layer(), Ok(None));
        let with_code = manifest(
            Some(GRAPH_ARTIFACT_TYPE),
            OCI_EMPTY_MEDIA_TYPE,
            &[GRAPH_LAYER_MEDIA_TYPE, CODE_LAYER_MEDIA_TYPE],
        );
        let (layer, digest) = with_code.code_layer().expect("valid").expect("present");
        assert_eq!(layer.media_type, CODE_LAYER_MEDIA_TYPE);
        assert_eq!(digest.to_hex(), HEX);
        let two = manifest(
            Some(GRAPH_ARTIFACT_TYPE),
            OCI_EMPTY_MEDIA_TYPE,
            &[
                GRAPH_LAYER_MEDIA_TYPE,
                CODE_LAYER_MEDIA_TYPE,
                CODE_LAYER_MEDIA_TYPE,
            ],
        );
        assert!(matches!(two.code_layer(), Err(ManifestError::Invalid(_))));
    }

    #[test]
    fn indexes_garbage_and_old_schemas_are_invalid() {
        let index =
            format!(r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX_MEDIA_TYPE}","manifests":[]}}"#);
        for bytes in [
            index.as_bytes(),
            br#"{"schemaVersion":2,"manifests":[]}"#,
            b"not json",
            br#"{"schemaVersion":1,"config":{"mediaType":"a","digest":"d","size":1}}"#,
            br#"{"schemaVersion":2,"mediaType":"text/html","config":{"mediaType":"a","digest":"d","size":1}}"#,
            br#"{"schemaVersion":2}"#,
        ] {
            assert!(
                matches!(Manifest::parse(bytes), Err(ManifestError::Invalid(_))),
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}
