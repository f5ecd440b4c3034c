//! The Docker config file — `config.json` as `docker login` writes it, and the
//! `.dockerconfigjson` of image-pull Secrets — and what it holds for one registry.
//!
//! Docker's order, first configured wins (no fall-through: with a helper configured, the
//! `auths` entries are only placeholders, and Docker never reads them):
//! 1. `credHelpers.<registry>`: run `docker-credential-<name>` for this registry;
//! 2. `credsStore`: run `docker-credential-<name>` for every registry;
//! 3. `auths.<registry>`: the entry itself — `registrytoken` (a token for the registry, sent
//!    as is), else `identitytoken` (an OAuth2 refresh token, as ACR, GCR and Docker Desktop
//!    logins write; exchanged at the token realm), else `username` and `password`, else `auth`
//!    (base64 of `user:password`).
//!
//! Running a helper belongs to the command line (`cli::credential_helper`): the operator reads
//! `auths` only ([`DockerConfig::auths_credentials`]) and never executes a program a
//! tenant's Secret names (the kubelet ignores helpers in pull Secrets the same way).

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Deserialize;

use super::auth::{CredentialsError, RegistryCredentials, Secret};
use crate::source::request::BearerToken;

/// The key `docker login` uses for Docker Hub, whatever host name the reference used.
pub const DOCKER_HUB_SERVER: &str = "https://index.docker.io/v1/";
/// Host names that mean Docker Hub.
const DOCKER_HUB_HOSTS: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];

/// A parsed Docker config (the parts raypipe reads).
#[derive(Debug, Default)]
pub struct DockerConfig {
    auths: BTreeMap<String, AuthEntry>,
    creds_store: Option<String>,
    cred_helpers: BTreeMap<String, String>,
}

/// One `auths` entry; every field may be a secret, so `Debug` prints none.
#[derive(Default, Deserialize)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    identitytoken: Option<String>,
    registrytoken: Option<String>,
}

impl std::fmt::Debug for AuthEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthEntry(<redacted>)")
    }
}

/// Where the credentials for one registry are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// In the file itself (`auths`).
    Credentials(RegistryCredentials),
    /// With a credential helper, to be run by the caller.
    Helper(HelperRef),
}

/// A credential helper the config names for one registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperRef {
    /// The helper's name: the program is `docker-credential-<name>`.
    pub name: String,
    /// What to write on the helper's standard input: the server address `docker login`
    /// stored the credentials under.
    pub server: String,
    /// Which setting named it: `credHelpers` or `credsStore`.
    pub setting: &'static str,
}

impl HelperRef {
    /// The program to run, found on `PATH`.
    pub fn program(&self) -> String {
        format!("docker-credential-{}", self.name)
    }
}

/// Whether `registry` (`host[:port]`) is Docker Hub.
fn is_docker_hub(registry: &str) -> bool {
    DOCKER_HUB_HOSTS
        .iter()
        .any(|host| host.eq_ignore_ascii_case(registry))
}

/// `host[:port]` of a config key such as `https://index.docker.io/v1/`.
fn key_host(key: &str) -> &str {
    let without_scheme = key.split_once("://").map_or(key, |(_, rest)| rest);
    without_scheme.split('/').next().unwrap_or_default()
}

/// Whether config key `key` stands for `registry`.
fn key_matches(key: &str, registry: &str) -> bool {
    let host = key_host(key);
    host.eq_ignore_ascii_case(registry) || (is_docker_hub(registry) && is_docker_hub(host))
}

/// A helper name must be a plain name, so the program is always looked up on `PATH` (never a
/// path a config file smuggles in).
fn valid_helper_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl DockerConfig {
    /// Parses a Docker config. The serde error could quote a value, so only the place where
    /// it broke is said.
    pub fn parse(json: &[u8]) -> Result<Self, CredentialsError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct File {
            #[serde(default)]
            auths: BTreeMap<String, AuthEntry>,
            #[serde(default)]
            creds_store: Option<String>,
            #[serde(default)]
            cred_helpers: BTreeMap<String, String>,
        }
        let file: File = serde_json::from_slice(json).map_err(|error| {
            CredentialsError(format!(
                "the Docker config is not a Docker config (JSON with \"auths\"): broken at line \
                 {} column {}",
                error.line(),
                error.column()
            ))
        })?;
        Ok(Self {
            auths: file.auths,
            creds_store: file.creds_store.filter(|name| !name.is_empty()),
            cred_helpers: file
                .cred_helpers
                .into_iter()
                .filter(|(_, name)| !name.is_empty())
                .collect(),
        })
    }

    /// Docker's order (module header): a helper when one is configured for `registry`, else
    /// the `auths` entry.
    pub fn lookup(&self, registry: &str) -> Result<Lookup, CredentialsError> {
        let per_registry = self
            .cred_helpers
            .iter()
            .find(|(key, _)| key.as_str() == registry)
            .or_else(|| {
                self.cred_helpers
                    .iter()
                    .find(|(key, _)| key_matches(key, registry))
            })
            .map(|(_, name)| (name, "credHelpers"));
        let helper = per_registry.or_else(|| self.creds_store.as_ref().map(|n| (n, "credsStore")));
        if let Some((name, setting)) = helper {
            if !valid_helper_name(name) {
                return Err(CredentialsError(format!(
                    "the Docker config's {setting} names a credential helper that is not a plain \
                     name ({:?}): the program would be docker-credential-<name>",
                    name.chars().take(80).collect::<String>()
                )));
            }
            let server = if is_docker_hub(registry) {
                DOCKER_HUB_SERVER.to_owned()
            } else {
                registry.to_owned()
            };
            return Ok(Lookup::Helper(HelperRef {
                name: name.clone(),
                server,
                setting,
            }));
        }
        self.auths_credentials(registry).map(Lookup::Credentials)
    }

    /// The `auths` entry for `registry`, ignoring helpers (the operator's reading of an
    /// image-pull Secret).
    pub fn auths_credentials(
        &self,
        registry: &str,
    ) -> Result<RegistryCredentials, CredentialsError> {
        let entry = self
            .auths
            .get(registry)
            .or_else(|| {
                self.auths
                    .iter()
                    .find(|(key, _)| key_matches(key, registry))
                    .map(|(_, entry)| entry)
            })
            .ok_or_else(|| {
                let helpers = if self.creds_store.is_some() || !self.cred_helpers.is_empty() {
                    " (it names credential helpers, which only `raypipe dag` runs: put the \
                     credentials themselves under \"auths\")"
                } else {
                    ""
                };
                CredentialsError(format!(
                    "the Docker config has no entry for registry {registry:?} under \"auths\"{helpers}"
                ))
            })?;
        entry_credentials(entry, registry)
    }
}

/// The credentials of one `auths` entry, in the order of the module header.
fn entry_credentials(
    entry: &AuthEntry,
    registry: &str,
) -> Result<RegistryCredentials, CredentialsError> {
    fn present(value: &Option<String>) -> Option<&str> {
        value.as_deref().filter(|text| !text.trim().is_empty())
    }
    if let Some(token) = present(&entry.registrytoken) {
        return Ok(RegistryCredentials::Token(BearerToken::new(token.trim())));
    }
    if let Some(token) = present(&entry.identitytoken) {
        return Ok(RegistryCredentials::IdentityToken(Secret::new(
            token.trim(),
        )));
    }
    if let (Some(username), Some(password)) = (&entry.username, &entry.password) {
        return Ok(RegistryCredentials::basic(username, password));
    }
    let auth = entry.auth.as_deref().ok_or_else(|| {
        CredentialsError(format!(
            "the Docker config's entry for {registry:?} has none of \"auth\", \"username\" and \
             \"password\", \"identitytoken\", \"registrytoken\""
        ))
    })?;
    let decoded = BASE64
        .decode(auth.trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| {
            CredentialsError(format!(
                "the \"auth\" of the Docker config's entry for {registry:?} is not base64 of text"
            ))
        })?;
    let (username, password) = decoded.split_once(':').ok_or_else(|| {
        CredentialsError(format!(
            "the \"auth\" of the Docker config's entry for {registry:?} is not username:password"
        ))
    })?;
    Ok(RegistryCredentials::basic(username, password))
}

/// What a credential helper answered to `get` (its JSON on standard output).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelperAnswer {
    Found(RegistryCredentials),
    /// The helper has nothing stored for the server.
    NotFound,
}

/// The helper protocol's user name that marks `Secret` as an identity token.
const IDENTITY_TOKEN_USER: &str = "<token>";
/// What helpers print (with a failing exit) when they hold nothing for the server.
pub const HELPER_NOT_FOUND_MESSAGE: &str = "credentials not found in native keychain";

/// Reads a helper's `get` answer: `{"ServerURL": …, "Username": …, "Secret": …}`. A
/// `Username` of `<token>` makes `Secret` an identity token. Never quotes the answer.
pub fn parse_helper_answer(stdout: &[u8]) -> Result<HelperAnswer, CredentialsError> {
    #[derive(Deserialize)]
    struct Answer {
        #[serde(rename = "Username", default)]
        username: String,
        #[serde(rename = "Secret")]
        secret: String,
    }
    let answer: Answer = serde_json::from_slice(stdout).map_err(|_| {
        CredentialsError(
            "its answer is not the credential helper JSON ({\"Username\", \"Secret\"})".to_owned(),
        )
    })?;
    if answer.secret.is_empty() {
        return Ok(HelperAnswer::NotFound);
    }
    if answer.username == IDENTITY_TOKEN_USER {
        return Ok(HelperAnswer::Found(RegistryCredentials::IdentityToken(
            Secret::new(answer.secret),
        )));
    }
    Ok(HelperAnswer::Found(RegistryCredentials::basic(
        &answer.username,
        &answer.secret,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(config: &str, registry: &str) -> Result<Lookup, CredentialsError> {
        DockerConfig::parse(config.as_bytes())?.lookup(registry)
    }

    #[test]
    fn helpers_come_first_per_registry_then_the_store_then_auths() {
        let auth = BASE64.encode("u:p");
        let config = format!(
            r#"{{"auths":{{"r.example":{{"auth":"{auth}"}},"plain.example":{{"auth":"{auth}"}}}},
                "credsStore":"desktop",
                "credHelpers":{{"gcr.example":"gcloud","r.example":"pass"}}}}"#
        );
        let helper = |name: &str, server: &str, setting| {
            Ok(Lookup::Helper(HelperRef {
                name: name.into(),
                server: server.into(),
                setting,
            }))
        };
        assert_eq!(
            lookup(&config, "gcr.example"),
            helper("gcloud", "gcr.example", "credHelpers")
        );
        assert_eq!(
            lookup(&config, "r.example"),
            helper("pass", "r.example", "credHelpers")
        );
        // credsStore covers every other registry, even one with an inline entry (Docker too).
        assert_eq!(
            lookup(&config, "plain.example"),
            helper("desktop", "plain.example", "credsStore")
        );
        // Docker Hub is stored under its historical key whatever the reference's host.
        assert_eq!(
            lookup(&config, "docker.io"),
            helper("desktop", DOCKER_HUB_SERVER, "credsStore")
        );
        // Without helpers, the entry; the operator's reading ignores helpers.
        let parsed = DockerConfig::parse(config.as_bytes()).expect("parses");
        assert_eq!(
            parsed.auths_credentials("r.example"),
            Ok(RegistryCredentials::basic("u", "p"))
        );
        let no_store =
            format!(r#"{{"auths":{{"r.example":{{"auth":"{auth}"}}}},"credsStore":""}}"#);
        assert_eq!(
            lookup(&no_store, "r.example"),
            Ok(Lookup::Credentials(RegistryCredentials::basic("u", "p")))
        );
    }

    #[test]
    fn entries_prefer_registry_then_identity_tokens_then_passwords() {
        let auth = BASE64.encode("00000000-0000-0000-0000-000000000000:");
        let config = format!(
            r#"{{"auths":{{
                "acr.example":{{"auth":"{auth}","identitytoken":"refresh-secret"}},
                "bearer.example":{{"registrytoken":"registry-secret","identitytoken":"x"}},
                "https://index.docker.io/v1/":{{"username":"hub","password":"pw"}},
                "empty.example":{{"identitytoken":"","auth":"{}"}}}}}}"#,
            BASE64.encode("a:b")
        );
        let parsed = DockerConfig::parse(config.as_bytes()).expect("parses");
        assert_eq!(
            parsed.auths_credentials("acr.example"),
            Ok(RegistryCredentials::IdentityToken(Secret::new(
                "refresh-secret"
            )))
        );
        assert_eq!(
            parsed.auths_credentials("bearer.example"),
            Ok(RegistryCredentials::Token(BearerToken::new(
                "registry-secret"
            )))
        );
        assert_eq!(
            parsed.auths_credentials("registry-1.docker.io"),
            Ok(RegistryCredentials::basic("hub", "pw"))
        );
        assert_eq!(
            parsed.auths_credentials("empty.example"),
            Ok(RegistryCredentials::basic("a", "b"))
        );
    }

    #[test]
    fn an_exact_key_wins_over_a_normalised_one() {
        let config = format!(
            r#"{{"auths":{{"https://r.example/v1/":{{"auth":"{}"}},"r.example":{{"auth":"{}"}}}}}}"#,
            BASE64.encode("old:1"),
            BASE64.encode("new:2")
        );
        let parsed = DockerConfig::parse(config.as_bytes()).expect("parses");
        assert_eq!(
            parsed.auths_credentials("r.example"),
            Ok(RegistryCredentials::basic("new", "2"))
        );
    }

    #[test]
    fn helper_names_must_be_plain_and_the_operator_is_told_about_helpers() {
        for name in ["../../bin/sh", "/usr/bin/x", "a b", "x\u{0}"] {
            let config = serde_json::json!({"credsStore": name}).to_string();
            let problem = lookup(&config, "r.example").expect_err(name);
            assert!(problem.0.contains("plain name"), "{problem}");
        }
        let config = r#"{"credsStore":"desktop","auths":{}}"#;
        let parsed = DockerConfig::parse(config.as_bytes()).expect("parses");
        let problem = parsed.auths_credentials("r.example").expect_err("no entry");
        assert!(problem.0.contains("credential helpers"), "{problem}");
    }

    #[test]
    fn helper_answers_parse_and_never_echo() {
        assert_eq!(
            parse_helper_answer(br#"{"ServerURL":"r.example","Username":"u","Secret":"s"}"#),
            Ok(HelperAnswer::Found(RegistryCredentials::basic("u", "s")))
        );
        assert_eq!(
            parse_helper_answer(br#"{"ServerURL":"r","Username":"<token>","Secret":"refresh"}"#),
            Ok(HelperAnswer::Found(RegistryCredentials::IdentityToken(
                Secret::new("refresh")
            )))
        );
        assert_eq!(
            parse_helper_answer(br#"{"ServerURL":"r","Username":"","Secret":""}"#),
            Ok(HelperAnswer::NotFound)
        );
        for garbage in [&b"secret-garbage"[..], b"[]", br#"{"Secret": 5}"#] {
            let problem = parse_helper_answer(garbage).expect_err("garbage");
            assert!(!problem.0.contains("secret-garbage"), "{problem}");
        }
    }
}
