//! Registry authentication (OCI distribution / Docker token flow): credentials from a Secret,
//! `WWW-Authenticate` challenges, the token endpoint ("realm") and the token cache.
//!
//! A request goes out with the best authorization known (a cached token for its scope, the
//! static token, or Basic credentials the registry asked for before). A `401` with
//! `Bearer realm=…,service=…,scope=…` sends the Secret's username and password (Basic) to the
//! realm, which answers a short-lived token; the token is cached per (registry, scope,
//! credentials) until `issued_at + expires_in` says it ends, and the request is repeated with
//! it once. A `401` with `Basic` repeats it once with the credentials themselves.
//!
//! Deliberate:
//! - The realm is tenant-controlled input (the registry names it): it passes the same checks
//!   as a source URL — HTTPS unless `allowInsecureHttp`, no userinfo, the operator's
//!   destination policy on every resolved address — before any credential is sent to it.
//! - The cache key includes a fingerprint of the credentials, so two pipelines with different
//!   Secrets never share a token (the brief's "per (registry, scope)" alone would let one
//!   tenant ride on another's token).
//! - Tokens, passwords and `auth` strings are never logged or put in errors; [`Secret`] and
//!   [`BearerToken`] print `<redacted>`, and headers carrying them are marked sensitive.
//! - A token the registry rejects is reported as `TokenExpired` when by its own stated times
//!   (`issued_at`, `expires_in`) it had already ended (usually a clock problem at the token
//!   issuer), else as `TokenRejected`; a realm refusing the credentials is
//!   `RegistryUnauthorized`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use reqwest::header::{CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use reqwest::{Method, Response, StatusCode, Url};
use serde::Deserialize;
use tracing::debug;

use crate::source::destination::{DestinationPolicy, check_literal_host};
use crate::source::digest::Sha256Digest;
use crate::source::error::SourceError;
use crate::source::redact::{redact_unparsed_url, redact_url};
use crate::source::request::BearerToken;

use super::transport::{Transport, read_small_body};

/// Largest token response read; real ones are a few KiB.
const MAX_TOKEN_RESPONSE_BYTES: u64 = 64 * 1024;
/// Lifetime assumed when the token response omits `expires_in` (the token spec's default).
const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(60);
/// Longest a token stays cached whatever it claims, so revoked credentials stop working soon.
const MAX_CACHED_LIFETIME: Duration = Duration::from_secs(3600);
/// A cached token is replaced this long before it ends (at most half its lifetime), so a
/// request never starts with a token about to expire on the way.
const REFRESH_MARGIN: Duration = Duration::from_secs(10);
/// Tokens kept; past this, ended ones are dropped, then everything.
const MAX_CACHED_TOKENS: usize = 256;
/// The OAuth2 `client_id` raypipe names itself by in refresh-token grants (Docker sends
/// `docker`, ORAS `oras-go`; registries accept any).
const OAUTH_CLIENT_ID: &str = "raypipe";

/// A password. `Debug` and `Display` print `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How raypipe identifies itself to one registry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RegistryCredentials {
    /// No Secret: public repositories, or anonymous tokens from the realm.
    #[default]
    Anonymous,
    /// A username and password (or access token used as password), sent Basic to the realm
    /// or, on a Basic challenge, to the registry.
    Basic { username: String, password: Secret },
    /// A registry token obtained elsewhere, sent as `Authorization: Bearer` to the registry.
    Token(BearerToken),
    /// An identity token: an OAuth2 refresh token that `docker login` stored (`identitytoken`,
    /// or a credential helper's `<token>` user). Exchanged at the realm for registry tokens
    /// with `grant_type=refresh_token`, never sent to the registry itself.
    IdentityToken(Secret),
}

/// What is wrong with the credentials Secret. Never quotes a secret value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CredentialsError(pub String);

impl RegistryCredentials {
    /// The `auths` entry for `registry` (`host[:port]`) in a `.dockerconfigjson`:
    /// `registrytoken`, `identitytoken`, `username` and `password`, or `auth` (base64 of
    /// `user:password`). Keys may be written with a scheme or a path (`https://host/v1/`), as
    /// `docker login` does. Credential helpers are never run here (see [`super::docker_config`]).
    pub fn from_docker_config(json: &[u8], registry: &str) -> Result<Self, CredentialsError> {
        super::docker_config::DockerConfig::parse(json)?.auths_credentials(registry)
    }

    pub fn basic(username: &str, password: &str) -> Self {
        Self::Basic {
            username: username.to_owned(),
            password: Secret::new(password),
        }
    }

    /// Distinguishes credentials in the token cache without keeping them in the key.
    fn fingerprint(&self) -> Sha256Digest {
        match self {
            Self::Anonymous => Sha256Digest::of(b"anonymous"),
            Self::Basic { username, password } => Sha256Digest::of(
                format!("basic\0{username}\0{}", password.expose_secret()).as_bytes(),
            ),
            Self::Token(token) => {
                Sha256Digest::of(format!("token\0{}", token.expose_secret()).as_bytes())
            }
            Self::IdentityToken(token) => {
                Sha256Digest::of(format!("identity\0{}", token.expose_secret()).as_bytes())
            }
        }
    }

    /// `Authorization: Basic …`, marked sensitive; `None` without a username and password.
    fn basic_header(&self) -> Result<Option<HeaderValue>, SourceError> {
        let Self::Basic { username, password } = self else {
            return Ok(None);
        };
        let encoded = BASE64.encode(format!("{username}:{}", password.expose_secret()));
        let mut value = HeaderValue::try_from(format!("Basic {encoded}"))
            .map_err(|_| SourceError::InvalidToken)?;
        value.set_sensitive(true);
        Ok(Some(value))
    }
}

/// One challenge of a `WWW-Authenticate` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
        /// `invalid_token`, `insufficient_scope`, … when the registry says why.
        error: Option<String>,
    },
    Basic,
}

/// The challenges of a `WWW-Authenticate` value (RFC 7235: `scheme param=value, …`, values
/// tokens or quoted strings, several challenges in one value). Unknown schemes and a Bearer
/// challenge without a realm are left out.
pub fn parse_challenges(header: &str) -> Vec<Challenge> {
    let mut parser = ChallengeParser {
        rest: header.as_bytes(),
    };
    let mut challenges = Vec::new();
    while let Some((scheme, params)) = parser.next_challenge() {
        let param = |name: &str| {
            params
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.clone())
        };
        if scheme.eq_ignore_ascii_case("bearer") {
            if let Some(realm) = param("realm") {
                challenges.push(Challenge::Bearer {
                    realm,
                    service: param("service"),
                    scope: param("scope"),
                    error: param("error"),
                });
            }
        } else if scheme.eq_ignore_ascii_case("basic") {
            challenges.push(Challenge::Basic);
        }
    }
    challenges
}

struct ChallengeParser<'h> {
    rest: &'h [u8],
}

impl ChallengeParser<'_> {
    fn skip_whitespace_and_commas(&mut self) {
        while let Some((first, rest)) = self.rest.split_first()
            && matches!(first, b' ' | b'\t' | b',')
        {
            self.rest = rest;
        }
    }

    fn skip_whitespace(&mut self) {
        while let Some((first, rest)) = self.rest.split_first()
            && matches!(first, b' ' | b'\t')
        {
            self.rest = rest;
        }
    }

    fn skip_to_comma(&mut self) {
        let length = self.rest.iter().take_while(|b| **b != b',').count();
        self.rest = self.rest.get(length..).unwrap_or_default();
    }

    fn token(&mut self) -> String {
        let length = self.rest.iter().take_while(|b| is_token_byte(**b)).count();
        let (token, rest) = self.rest.split_at(length);
        self.rest = rest;
        String::from_utf8_lossy(token).into_owned()
    }

    /// A quoted string after its opening quote, with `\` escapes resolved.
    fn quoted(&mut self) -> String {
        let mut value = Vec::new();
        while let Some((&byte, rest)) = self.rest.split_first() {
            self.rest = rest;
            match byte {
                b'"' => break,
                b'\\' => {
                    if let Some((&escaped, rest)) = self.rest.split_first() {
                        value.push(escaped);
                        self.rest = rest;
                    }
                }
                other => value.push(other),
            }
        }
        String::from_utf8_lossy(&value).into_owned()
    }

    /// Whether the input continues with `token =` (a parameter rather than a new scheme).
    fn at_parameter(&self) -> bool {
        let name_length = self.rest.iter().take_while(|b| is_token_byte(**b)).count();
        name_length > 0
            && self
                .rest
                .iter()
                .skip(name_length)
                .find(|b| !matches!(b, b' ' | b'\t'))
                == Some(&b'=')
    }

    fn next_challenge(&mut self) -> Option<(String, Vec<(String, String)>)> {
        let scheme = loop {
            self.skip_whitespace_and_commas();
            let (_, rest) = self.rest.split_first()?;
            let scheme = self.token();
            if !scheme.is_empty() {
                break scheme;
            }
            // Not a token where a scheme should start: skip the byte.
            self.rest = rest;
        };
        let mut params = Vec::new();
        loop {
            self.skip_whitespace_and_commas();
            if !self.at_parameter() {
                break;
            }
            let name = self.token();
            self.skip_whitespace();
            self.rest = self.rest.get(1..).unwrap_or_default(); // the `=`
            self.skip_whitespace();
            let value = match self.rest.split_first() {
                Some((b'"', rest)) => {
                    self.rest = rest;
                    self.quoted()
                }
                _ => self.token(),
            };
            params.push((name, value));
            // Whatever is left before the next comma (token68 padding, junk) is ignored.
            self.skip_to_comma();
        }
        // Skip a token68 or anything unparseable up to the next challenge.
        if params.is_empty() {
            self.skip_to_comma();
        }
        Some((scheme, params))
    }
}

fn is_token_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/:".contains(&byte)
}

/// A token from the realm and how long it may be used, measured from its arrival.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    pub token: BearerToken,
    pub lifetime: Duration,
}

/// Reads a token response: `token` (or `access_token`), `expires_in` seconds and
/// `issued_at` (RFC 3339). `now` is the wall clock at arrival.
pub fn parse_token_response(
    body: &[u8],
    now: jiff::Timestamp,
) -> Result<IssuedToken, &'static str> {
    #[derive(Deserialize)]
    struct TokenResponse {
        token: Option<String>,
        access_token: Option<String>,
        expires_in: Option<i64>,
        issued_at: Option<String>,
    }
    let response: TokenResponse =
        serde_json::from_slice(body).map_err(|_| "the body is not a JSON token response")?;
    let token = response
        .token
        .or(response.access_token)
        .filter(|token| !token.trim().is_empty())
        .ok_or("it holds neither \"token\" nor \"access_token\"")?;
    let issued_at = response
        .issued_at
        .as_deref()
        .map(|text| {
            text.parse::<jiff::Timestamp>()
                .map_err(|_| "\"issued_at\" is not an RFC 3339 time")
        })
        .transpose()?;
    Ok(IssuedToken {
        token: BearerToken::new(token),
        lifetime: token_lifetime(response.expires_in, issued_at, now),
    })
}

/// What is left of a token's life: `expires_in` (default 60 s) from `issued_at` (default
/// now), never more than `expires_in` (an issuer clock ahead of ours gains nothing) and
/// never below zero.
pub fn token_lifetime(
    expires_in: Option<i64>,
    issued_at: Option<jiff::Timestamp>,
    now: jiff::Timestamp,
) -> Duration {
    let stated = match expires_in {
        Some(seconds) => Duration::from_secs(u64::try_from(seconds).unwrap_or(0)),
        None => DEFAULT_TOKEN_LIFETIME,
    };
    let Some(issued_at) = issued_at else {
        return stated;
    };
    let elapsed_ms = now
        .as_millisecond()
        .saturating_sub(issued_at.as_millisecond());
    let elapsed = Duration::from_millis(u64::try_from(elapsed_ms).unwrap_or(0));
    stated.saturating_sub(elapsed)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TokenKey {
    registry: String,
    scope: String,
    credentials: Sha256Digest,
}

struct CachedToken {
    token: BearerToken,
    /// Not handed out after this (the token's end minus the refresh margin).
    use_until: Instant,
}

/// Registry tokens per (registry, scope, credentials), shared by every pull of the process.
#[derive(Default)]
pub struct TokenCache {
    tokens: Mutex<HashMap<TokenKey, CachedToken>>,
}

impl fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cached = self.lock().len();
        f.debug_struct("TokenCache")
            .field("cached", &cached)
            .finish()
    }
}

impl TokenCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TokenKey, CachedToken>> {
        // Entries are inserted and removed whole, so a poisoned map is still consistent.
        self.tokens.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, key: &TokenKey, now: Instant) -> Option<BearerToken> {
        let mut tokens = self.lock();
        match tokens.get(key) {
            Some(cached) if now < cached.use_until => Some(cached.token.clone()),
            Some(_) => {
                tokens.remove(key);
                None
            }
            None => None,
        }
    }

    fn insert(&self, key: TokenKey, issued: &IssuedToken, now: Instant) {
        let lifetime = issued.lifetime.min(MAX_CACHED_LIFETIME);
        let margin = REFRESH_MARGIN.min(lifetime / 2);
        let usable = lifetime.saturating_sub(margin);
        if usable.is_zero() {
            return;
        }
        let mut tokens = self.lock();
        if tokens.len() >= MAX_CACHED_TOKENS {
            tokens.retain(|_, cached| now < cached.use_until);
            if tokens.len() >= MAX_CACHED_TOKENS {
                tokens.clear();
            }
        }
        tokens.insert(
            key,
            CachedToken {
                token: issued.token.clone(),
                use_until: now + usable,
            },
        );
    }

    fn remove(&self, key: &TokenKey) {
        self.lock().remove(key);
    }
}

/// The authorization state of one pull from one repository: which credentials, which scope,
/// and what the registry asked for so far.
pub struct Session<'a> {
    pub transport: &'a Transport<'a>,
    pub credentials: &'a RegistryCredentials,
    pub cache: &'a TokenCache,
    /// `repository:<name>:pull` (the push side asks for `pull,push`).
    pub scope: String,
    /// Set after a Basic challenge: later requests send the credentials at once.
    basic_requested: std::sync::atomic::AtomicBool,
}

/// What authorized a request, to tell a rejected token from missing credentials.
enum Sent {
    Nothing,
    CachedToken,
    FreshToken { lifetime: Duration },
    StaticToken,
    Basic,
}

impl<'a> Session<'a> {
    pub fn new(
        transport: &'a Transport<'a>,
        credentials: &'a RegistryCredentials,
        cache: &'a TokenCache,
        scope: String,
    ) -> Self {
        Self {
            transport,
            credentials,
            cache,
            scope,
            basic_requested: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn key(&self, scope: &str) -> TokenKey {
        TokenKey {
            registry: self.transport.registry.to_owned(),
            scope: scope.to_owned(),
            credentials: self.credentials.fingerprint(),
        }
    }

    /// Sends `method url` with `headers`, authenticating as the registry asks; returns the
    /// first response that is not a `401`.
    pub async fn send(
        &self,
        method: Method,
        url: &Url,
        headers: &[(reqwest::header::HeaderName, HeaderValue)],
    ) -> Result<Response, SourceError> {
        self.send_body(method, url, headers, None).await
    }

    /// [`Session::send`] with a request body (the push side's uploads; `Bytes` clones share
    /// the buffer, so a repeat after a challenge costs no copy).
    pub async fn send_body(
        &self,
        method: Method,
        url: &Url,
        headers: &[(reqwest::header::HeaderName, HeaderValue)],
        body: Option<bytes::Bytes>,
    ) -> Result<Response, SourceError> {
        use std::sync::atomic::Ordering;
        let (mut authorization, mut sent) = self.initial_authorization()?;
        // At most: first try, one with a (new) token or Basic, one more after a cached
        // token turned out stale.
        for _ in 0..3 {
            let response = self
                .transport
                .send_body(
                    method.clone(),
                    url,
                    headers,
                    authorization.as_ref(),
                    body.clone(),
                )
                .await?;
            if response.status() != StatusCode::UNAUTHORIZED {
                return Ok(response);
            }
            let challenges = response
                .headers()
                .get_all(WWW_AUTHENTICATE)
                .iter()
                .filter_map(|value| value.to_str().ok())
                .flat_map(parse_challenges)
                .collect::<Vec<_>>();
            debug!(
                challenges = challenges.len(),
                "registry asked for authentication"
            );
            let registry = self.transport.registry.to_owned();
            match sent {
                Sent::FreshToken { lifetime } if lifetime.is_zero() => {
                    return Err(SourceError::TokenExpired { registry });
                }
                Sent::FreshToken { .. } | Sent::StaticToken => {
                    return Err(SourceError::TokenRejected { registry });
                }
                Sent::Basic => {
                    return Err(SourceError::RegistryUnauthorized {
                        registry,
                        credentials_sent: true,
                    });
                }
                Sent::CachedToken => self.cache.remove(&self.key(&self.scope)),
                Sent::Nothing => {}
            }
            let bearer = challenges.iter().find_map(|challenge| match challenge {
                Challenge::Bearer {
                    realm,
                    service,
                    scope,
                    ..
                } => Some((realm, service, scope)),
                Challenge::Basic => None,
            });
            if let Some((realm, service, scope)) = bearer {
                // The registry's scope wins: it is what it will check.
                let scope = scope.clone().unwrap_or_else(|| self.scope.clone());
                let issued = self
                    .request_token(realm, service.as_deref(), &scope)
                    .await?;
                // Kept under the scope later requests of this repository look up.
                self.cache
                    .insert(self.key(&self.scope), &issued, Instant::now());
                authorization = Some(issued.token.authorization_header()?);
                sent = Sent::FreshToken {
                    lifetime: issued.lifetime,
                };
            } else if challenges.contains(&Challenge::Basic)
                && let Some(basic) = self.credentials.basic_header()?
            {
                self.basic_requested.store(true, Ordering::Relaxed);
                authorization = Some(basic);
                sent = Sent::Basic;
            } else {
                return Err(SourceError::RegistryUnauthorized {
                    registry,
                    credentials_sent: false,
                });
            }
        }
        Err(SourceError::TokenRejected {
            registry: self.transport.registry.to_owned(),
        })
    }

    fn initial_authorization(&self) -> Result<(Option<HeaderValue>, Sent), SourceError> {
        if let RegistryCredentials::Token(token) = self.credentials {
            return Ok((Some(token.authorization_header()?), Sent::StaticToken));
        }
        if let Some(token) = self.cache.get(&self.key(&self.scope), Instant::now()) {
            return Ok((Some(token.authorization_header()?), Sent::CachedToken));
        }
        if self
            .basic_requested
            .load(std::sync::atomic::Ordering::Relaxed)
            && let Some(basic) = self.credentials.basic_header()?
        {
            return Ok((Some(basic), Sent::Basic));
        }
        Ok((None, Sent::Nothing))
    }

    /// A token from the realm: `GET realm?service=…&scope=…` with the Basic credentials
    /// (anonymous without them) — or, with an identity token, the OAuth2 form `POST realm`
    /// with `grant_type=refresh_token` (the distribution spec's OAuth2 token flow, as Docker
    /// and ORAS send it; a realm that only knows GET cannot take a refresh token).
    async fn request_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<IssuedToken, SourceError> {
        let mut url = self.realm_url(realm)?;
        let (response, credentials_sent) =
            if let RegistryCredentials::IdentityToken(refresh) = self.credentials {
                let mut pairs = vec![
                    ("grant_type", "refresh_token"),
                    ("refresh_token", refresh.expose_secret()),
                    ("client_id", OAUTH_CLIENT_ID),
                    ("scope", scope),
                ];
                if let Some(service) = service {
                    pairs.push(("service", service));
                }
                let headers = [(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/x-www-form-urlencoded"),
                )];
                let body = bytes::Bytes::from(form_urlencoded(&url, &pairs));
                let response = self
                    .transport
                    .send_body(Method::POST, &url, &headers, None, Some(body))
                    .await?;
                (response, true)
            } else {
                {
                    let mut query = url.query_pairs_mut();
                    if let Some(service) = service {
                        query.append_pair("service", service);
                    }
                    query.append_pair("scope", scope);
                }
                let basic = self.credentials.basic_header()?;
                let response = self
                    .transport
                    .send(Method::GET, &url, &[], basic.as_ref())
                    .await?;
                (response, basic.is_some())
            };
        let status = response.status();
        let shown_realm = redact_url(&url);
        // An OAuth2 endpoint answers a refused grant with 400 `invalid_grant` (RFC 6749 5.2).
        let refused_grant = status == StatusCode::BAD_REQUEST
            && matches!(self.credentials, RegistryCredentials::IdentityToken(_));
        if refused_grant || matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            return Err(SourceError::RegistryUnauthorized {
                registry: self.transport.registry.to_owned(),
                credentials_sent,
            });
        }
        if status != StatusCode::OK {
            return Err(SourceError::from_status(
                status,
                shown_realm,
                credentials_sent,
            ));
        }
        let body = read_small_body(
            self.transport,
            response,
            MAX_TOKEN_RESPONSE_BYTES,
            &shown_realm,
        )
        .await?;
        let issued = parse_token_response(&body, jiff::Timestamp::now()).map_err(|problem| {
            SourceError::InvalidTokenResponse {
                realm: shown_realm.clone(),
                problem: problem.to_owned(),
            }
        })?;
        debug!(
            lifetime_s = issued.lifetime.as_secs(),
            "registry token obtained"
        );
        Ok(issued)
    }

    /// The realm as a URL the fetcher may call: the same scheme, credential and destination
    /// rules as a source URL.
    fn realm_url(&self, realm: &str) -> Result<Url, SourceError> {
        let invalid = |problem: &str| SourceError::InvalidAuthChallenge {
            registry: self.transport.registry.to_owned(),
            problem: format!("realm {}: {problem}", redact_unparsed_url(realm)),
        };
        let url = Url::parse(realm).map_err(|_| invalid("not a URL"))?;
        match url.scheme() {
            "https" => {}
            "http" if self.transport.allow_insecure_http => {}
            "http" => {
                return Err(SourceError::InsecureUrl {
                    url: redact_url(&url),
                });
            }
            _ => return Err(invalid("only https:// (or http:// when allowed)")),
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(invalid("it has no host"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid("it embeds credentials"));
        }
        check_destination(&url, self.transport.destinations)?;
        Ok(url)
    }
}

/// `pairs` as an `application/x-www-form-urlencoded` body (the url crate's serializer,
/// through the query of a copy of `base`, so no second encoder lives here).
fn form_urlencoded(base: &Url, pairs: &[(&str, &str)]) -> String {
    let mut scratch = base.clone();
    scratch.set_query(None);
    scratch.query_pairs_mut().extend_pairs(pairs);
    scratch.query().unwrap_or_default().to_owned()
}

pub fn check_destination(url: &Url, policy: &DestinationPolicy) -> Result<(), SourceError> {
    check_literal_host(url, policy)
        .map_err(|refused| SourceError::DestinationNotAllowed { host: refused.host })
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
