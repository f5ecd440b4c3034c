//! Graphs stored as OCI artifacts (issue 21): `source.oci` references, the registry token
//! flow, manifests and blobs, and cosign signatures.
//!
//! The fetch side lives here (`raypipe dag pull` and the controller); the push side adds
//! `push.rs` and shares [`reference`], [`auth`] and the media types of [`manifest`].
//! Everything goes through the [`Fetcher`](super::Fetcher)'s clients, so the destination
//! policy (SSRF), redirect rules, memory budget and redaction of `source.url` apply alike.

pub mod auth;
pub mod docker_config;
pub mod fetch;
pub mod manifest;
#[cfg(test)]
mod protocol_tests;
pub mod push;
pub mod reference;
pub mod transport;
pub mod verify;

pub use auth::{Challenge, CredentialsError, RegistryCredentials, Secret, TokenCache};
pub use docker_config::DockerConfig;
pub use fetch::{FetchedCode, OciOutcome, OciRequest};
pub use manifest::{CODE_LAYER_MEDIA_TYPE, GRAPH_ARTIFACT_TYPE, GRAPH_LAYER_MEDIA_TYPE};
pub use reference::{OciReference, ReferenceError};
pub use verify::VerificationKey;
