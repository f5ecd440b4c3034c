//! [`OciReference`]: the text of `source.oci` (and of `raypipe dag push/pull`), parsed.
//!
//! Accepted: `REGISTRY/REPOSITORY:TAG`, `REGISTRY/REPOSITORY@sha256:HEX` and
//! `REGISTRY/REPOSITORY:TAG@sha256:HEX` (the digest is what is fetched; the tag is shown).
//!
//! - `REGISTRY` is required and explicit: a host name, an IPv4 address or a bracketed IPv6
//!   address, optionally with `:PORT`. It must contain a `.` or a `:`, or be `localhost`;
//!   there is no implicit `docker.io` and no `library/` prefix, so a reference names exactly
//!   one place and a first path component is never mistaken for a host.
//! - `REPOSITORY` is one or more `/`-separated components of lowercase letters and digits,
//!   joined inside a component by `.`, `_`, `__` or runs of `-` (the OCI distribution grammar);
//!   at most 255 characters.
//! - `TAG` is `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`. A reference with neither tag nor digest is
//!   refused: no implicit `:latest`, so what runs is always named on purpose.
//! - Only `sha256` digests are accepted (the algorithm every registry supports and the one
//!   raypipe checks).

use std::fmt;
use std::str::FromStr;

use crate::source::digest::Sha256Digest;

/// Longest repository name the distribution spec allows registries to limit to.
const MAX_REPOSITORY_LEN: usize = 255;
/// Longest tag (the distribution spec's grammar).
const MAX_TAG_LEN: usize = 128;
/// Longest reference accepted at all; bounds every message that quotes one.
const MAX_REFERENCE_LEN: usize = 1024;

/// A parsed OCI reference. Displays in its canonical text form.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OciReference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<Sha256Digest>,
}

/// Why a text is not an [`OciReference`]. The text quoted is bounded and free of control
/// characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reference:?} is not an OCI reference: {problem}")]
pub struct ReferenceError {
    pub reference: String,
    pub problem: String,
}

impl OciReference {
    /// `host[:port]`, as written.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    pub fn repository(&self) -> &str {
        &self.repository
    }

    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    pub fn digest(&self) -> Option<Sha256Digest> {
        self.digest
    }

    /// What goes after `/manifests/`: the digest when there is one, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => digest.to_string(),
            (None, Some(tag)) => tag.clone(),
            // The parser never builds a reference with neither.
            (None, None) => String::new(),
        }
    }

    /// The same repository at `digest` (the tag, if any, is kept for display).
    pub fn with_digest(&self, digest: Sha256Digest) -> Self {
        Self {
            digest: Some(digest),
            ..self.clone()
        }
    }

    /// The same repository at `tag`, without a digest.
    pub fn with_tag(&self, tag: &str) -> Result<Self, ReferenceError> {
        check_tag(tag).map_err(|problem| error(tag, problem))?;
        Ok(Self {
            tag: Some(tag.to_owned()),
            digest: None,
            ..self.clone()
        })
    }
}

impl fmt::Display for OciReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for OciReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OciReference({self})")
    }
}

impl FromStr for OciReference {
    type Err = ReferenceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse(text).map_err(|problem| error(text, problem))
    }
}

fn error(text: &str, problem: impl Into<String>) -> ReferenceError {
    ReferenceError {
        reference: text
            .chars()
            .filter(|c| !c.is_control())
            .take(MAX_REFERENCE_LEN)
            .collect(),
        problem: problem.into(),
    }
}

fn parse(text: &str) -> Result<OciReference, String> {
    if text.len() > MAX_REFERENCE_LEN {
        return Err(format!("longer than {MAX_REFERENCE_LEN} characters"));
    }
    if text.is_empty() {
        return Err("it is empty".to_owned());
    }
    if text.contains("://") {
        return Err(
            "write it without a scheme (registry.example/team/graph:v1); the scheme follows \
             allowInsecureHttp"
                .to_owned(),
        );
    }
    let (name_and_tag, digest) = match text.split_once('@') {
        Some((rest, digest)) => {
            let digest = digest
                .strip_prefix(Sha256Digest::PREFIX)
                .filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|hex| hex.parse::<Sha256Digest>().ok())
                .ok_or("the digest after @ must be sha256: followed by 64 hex digits")?;
            (rest, Some(digest))
        }
        None => (text, None),
    };
    let (registry, path) = name_and_tag.split_once('/').ok_or(
        "it needs an explicit registry host (registry.example/repository:tag); there is no \
         default registry",
    )?;
    check_registry(registry)?;
    // A tag is whatever follows the last `:` of the path (the registry's port is not part of
    // it); repository components cannot hold a `:`.
    let (repository, tag) = match path.rsplit_once(':') {
        Some((repository, tag)) => {
            check_tag(tag)?;
            (repository, Some(tag.to_owned()))
        }
        None => (path, None),
    };
    check_repository(repository)?;
    if tag.is_none() && digest.is_none() {
        return Err(
            "it needs a tag (:v1) or a digest (@sha256:…); there is no implicit :latest".to_owned(),
        );
    }
    Ok(OciReference {
        registry: registry.to_owned(),
        repository: repository.to_owned(),
        tag,
        digest,
    })
}

fn check_registry(registry: &str) -> Result<(), String> {
    let (host, port) = split_host_port(registry)?;
    if let Some(port) = port
        && !port.parse::<u16>().is_ok_and(|port| port > 0)
    {
        return Err(format!("the registry port {port:?} is not a port number"));
    }
    if let Some(inner) = host.strip_prefix('[') {
        let address = inner
            .strip_suffix(']')
            .ok_or("the registry's IPv6 address lacks its closing ]")?;
        return address
            .parse::<std::net::Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| format!("the registry host {host:?} is not an IPv6 address"));
    }
    let valid_label = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(valid_label) {
        return Err(format!("the registry host {host:?} is not a host name"));
    }
    if !host.contains('.') && port.is_none() && host != "localhost" {
        return Err(format!(
            "{host:?} is not a registry host (it has no '.' or ':port' and is not localhost); \
             write the registry explicitly, such as registry.example/{host}/…"
        ));
    }
    Ok(())
}

fn split_host_port(registry: &str) -> Result<(&str, Option<&str>), String> {
    if registry.starts_with('[') {
        return Ok(match registry.rsplit_once("]:") {
            Some((host, port)) => (&registry[..host.len() + 1], Some(port)),
            None => (registry, None),
        });
    }
    Ok(match registry.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (registry, None),
    })
}

fn check_repository(repository: &str) -> Result<(), String> {
    if repository.is_empty() {
        return Err("the repository is missing after the registry host".to_owned());
    }
    if repository.len() > MAX_REPOSITORY_LEN {
        return Err(format!(
            "the repository is longer than {MAX_REPOSITORY_LEN} characters"
        ));
    }
    for component in repository.split('/') {
        if !is_path_component(component) {
            return Err(format!(
                "the repository component {component:?} is not valid: lowercase letters and \
                 digits, joined by '.', '_', '__' or '-'"
            ));
        }
    }
    Ok(())
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn is_path_component(component: &str) -> bool {
    let alphanumeric = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = component.as_bytes();
    let mut index = 0;
    let mut expect_alphanumeric = true;
    while index < bytes.len() {
        let Some(&byte) = bytes.get(index) else {
            return false;
        };
        if alphanumeric(byte) {
            expect_alphanumeric = false;
            index += 1;
            continue;
        }
        if expect_alphanumeric {
            return false;
        }
        // A separator: `.`, `_`, `__` or a run of `-`.
        let run = bytes[index..].iter().take_while(|b| **b == byte).count();
        let allowed = match byte {
            b'.' => run == 1,
            b'_' => run <= 2,
            b'-' => true,
            _ => false,
        };
        if !allowed {
            return false;
        }
        index += run;
        expect_alphanumeric = true;
    }
    !bytes.is_empty() && !expect_alphanumeric
}

fn check_tag(tag: &str) -> Result<(), String> {
    let bytes = tag.as_bytes();
    let valid = matches!(bytes.first(), Some(b) if b.is_ascii_alphanumeric() || *b == b'_')
        && bytes.len() <= MAX_TAG_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "the tag {tag:?} is not valid: up to {MAX_TAG_LEN} letters, digits, '_', '.' and \
             '-', not starting with '.' or '-'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    fn parsed(text: &str) -> OciReference {
        text.parse()
            .unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    #[test]
    fn tag_references_split_into_their_parts() {
        let reference = parsed("registry.example:5000/team/graphs/fraud:v1.2");
        assert_eq!(reference.registry(), "registry.example:5000");
        assert_eq!(reference.repository(), "team/graphs/fraud");
        assert_eq!(reference.tag(), Some("v1.2"));
        assert_eq!(reference.digest(), None);
        assert_eq!(reference.manifest_reference(), "v1.2");
        assert_eq!(
            reference.to_string(),
            "registry.example:5000/team/graphs/fraud:v1.2"
        );
    }

    #[test]
    fn digest_references_fetch_the_digest_and_keep_the_tag_for_display() {
        let by_digest = parsed(&format!("127.0.0.1:5000/g@sha256:{HEX}"));
        assert_eq!(by_digest.tag(), None);
        assert_eq!(by_digest.manifest_reference(), format!("sha256:{HEX}"));
        let both = parsed(&format!("localhost/a/b:v1@sha256:{HEX}"));
        assert_eq!(both.tag(), Some("v1"));
        assert_eq!(both.manifest_reference(), format!("sha256:{HEX}"));
        assert_eq!(both.to_string(), format!("localhost/a/b:v1@sha256:{HEX}"));
    }

    #[test]
    fn registry_forms_are_host_names_addresses_and_localhost() {
        for text in [
            "localhost/g:v1",
            "localhost:5000/g:v1",
            "ghcr.io/org/g:v1",
            "10.0.0.1/g:v1",
            "[::1]:5000/g:v1",
            "[fd00::1]/g:v1",
            "my-registry.svc.cluster.local/g:v1",
            "registry:5000/g:v1",
        ] {
            let reference = parsed(text);
            assert_eq!(reference.to_string(), text);
        }
        assert_eq!(parsed("[::1]:5000/g:v1").registry(), "[::1]:5000");
    }

    #[test]
    fn there_is_no_default_registry_and_no_default_tag() {
        for text in ["library/ubuntu:22.04", "ubuntu:22.04", "team/graph:v1"] {
            let error = text.parse::<OciReference>().expect_err(text);
            assert!(
                error.problem.contains("registry"),
                "{text}: {}",
                error.problem
            );
        }
        let error = "registry.example/team/graph"
            .parse::<OciReference>()
            .expect_err("no tag");
        assert!(error.problem.contains(":latest"), "{error}");
    }

    #[test]
    fn invalid_parts_are_refused_with_what_is_wrong() {
        for (text, hint) in [
            ("", "empty"),
            ("https://registry.example/g:v1", "scheme"),
            ("registry.example/Team/g:v1", "component"),
            ("registry.example/g..x:v1", "component"),
            ("registry.example/g___x:v1", "component"),
            ("registry.example/-g:v1", "component"),
            ("registry.example/g-:v1", "component"),
            ("registry.example//g:v1", "component"),
            ("registry.example/:v1", "missing"),
            ("registry.example/g:.v1", "tag"),
            ("registry.example/g:", "tag"),
            ("registry.example/g:v1:v2", "component"),
            ("registry.example:0/g:v1", "port"),
            ("registry.example:99999/g:v1", "port"),
            ("registry.example:http/g:v1", "port"),
            ("reg_istry.example/g:v1", "host"),
            ("-reg.example/g:v1", "host"),
            ("[::1/g:v1", "IPv6"),
            ("[zz::1]/g:v1", "IPv6"),
            ("registry.example/g@sha256:abc", "digest"),
            ("registry.example/g@sha512:abc", "digest"),
        ] {
            let error = text.parse::<OciReference>().expect_err(text);
            assert!(error.problem.contains(hint), "{text}: {}", error.problem);
        }
        let long_tag = format!("registry.example/g:{}", "t".repeat(129));
        assert!(long_tag.parse::<OciReference>().is_err());
        let long_repository = format!("registry.example/{}:v1", "r".repeat(256));
        assert!(long_repository.parse::<OciReference>().is_err());
        let huge = "a".repeat(5000);
        let error = huge.parse::<OciReference>().expect_err("too long");
        assert!(error.reference.len() <= MAX_REFERENCE_LEN);
    }

    #[test]
    fn separators_follow_the_distribution_grammar() {
        for component in ["a", "a1", "a.b", "a_b", "a__b", "a-b", "a---b", "a.b-c_d"] {
            assert!(is_path_component(component), "{component}");
        }
        for component in ["", ".a", "a.", "a..b", "a___b", "a_", "A", "a b", "a-.b"] {
            assert!(!is_path_component(component), "{component}");
        }
    }

    #[test]
    fn messages_carry_no_control_characters() {
        let error = "registry.example/g:\u{1b}[31mv1"
            .parse::<OciReference>()
            .expect_err("escape in tag");
        assert!(!error.to_string().contains('\u{1b}'), "{error}");
    }

    #[test]
    fn with_digest_and_with_tag_derive_references() {
        let reference = parsed("registry.example/g:v1");
        let digest: Sha256Digest = HEX.parse().expect("digest");
        let pinned = reference.with_digest(digest);
        assert_eq!(pinned.manifest_reference(), format!("sha256:{HEX}"));
        let signature_tag = pinned.with_tag(&format!("sha256-{HEX}.sig")).expect("tag");
        assert_eq!(signature_tag.digest(), None);
        assert_eq!(
            signature_tag.tag(),
            Some(format!("sha256-{HEX}.sig").as_str())
        );
        assert!(reference.with_tag("bad tag").is_err());
    }
}
