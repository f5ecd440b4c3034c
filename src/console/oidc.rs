//! The console's OpenID Connect relying party: the authorization-code flow with PKCE (S256),
//! and ID-token verification with the provider's published keys (RS256 or ES256).
//!
//! The identity it yields (username and groups) is built the way kube-apiserver builds it from
//! the same ID token when started with the same `--oidc-*` flags, so the SubjectAccessReviews
//! the console makes on behalf of a user are answered for the very user the API server would
//! see if that user called it directly with the token.
//!
//! The login in progress ([`PendingLogin`]) holds no server state: the console keeps it sealed
//! in a cookie (see [`super::cookie`]) between [`OidcProvider::begin_login`] and
//! [`OidcProvider::finish_login`].

use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use reqwest::Url;
use ring::rand::{SecureRandom as _, SystemRandom};
use ring::signature::{self, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Bound on every document read from the provider (discovery, JWKS, token response).
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// Bound on each exchange with the provider, body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Clock skew tolerated for `iat`.
const CLOCK_SKEW_SECS: i64 = 60;
/// Longest `return_to` path kept; a longer one is replaced by `/`.
const MAX_RETURN_PATH: usize = 2048;
/// Provider error texts are cut to this many characters in our errors.
const MAX_PROVIDER_TEXT: usize = 200;

/// How the console authenticates users with an OpenID Connect provider.
///
/// The claim and prefix fields mean what kube-apiserver's flags of the same names mean; give
/// them the values the API server runs with, so the console asks authorization questions
/// (SubjectAccessReviews) about the user the API server itself would see.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OidcSettings {
    /// The provider's issuer URL (`--oidc-issuer-url`), compared exactly with the `iss` of
    /// tokens and the discovery document. Must be https, except http on a loopback address
    /// (127.0.0.0/8, ::1, localhost) for development and tests.
    pub issuer: String,
    /// The console's client id at the provider (`--oidc-client-id`: an ID token's audience
    /// must include it).
    pub client_id: String,
    /// The client secret for a confidential client, sent with HTTP Basic
    /// (`client_secret_basic`); `None` for a public client (PKCE alone). Never serialized.
    #[serde(skip_serializing)]
    pub client_secret: Option<String>,
    /// The console's callback URL, registered at the provider exactly as written here.
    pub redirect_url: String,
    /// Scopes requested; `openid` is required.
    pub scopes: Vec<String>,
    /// The claim that names the user (`--oidc-username-claim`).
    pub username_claim: String,
    /// `--oidc-username-prefix`: empty means the API server's default (no prefix for the
    /// `email` claim, `{issuer}#` for any other claim), `-` means no prefix, anything else is
    /// prepended as is.
    pub username_prefix: String,
    /// The claim that lists the user's groups (`--oidc-groups-claim`): a string or an array
    /// of strings; absent means no groups.
    pub groups_claim: String,
    /// Prepended to every group (`--oidc-groups-prefix`).
    pub groups_prefix: String,
}

impl Default for OidcSettings {
    fn default() -> OidcSettings {
        OidcSettings {
            issuer: String::new(),
            client_id: String::new(),
            client_secret: None,
            redirect_url: String::new(),
            scopes: vec![
                "openid".to_string(),
                "email".to_string(),
                "profile".to_string(),
            ],
            username_claim: "email".to_string(),
            username_prefix: String::new(),
            groups_claim: "groups".to_string(),
            groups_prefix: String::new(),
        }
    }
}

impl fmt::Debug for OidcSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OidcSettings")
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("redirect_url", &self.redirect_url)
            .field("scopes", &self.scopes)
            .field("username_claim", &self.username_claim)
            .field("username_prefix", &self.username_prefix)
            .field("groups_claim", &self.groups_claim)
            .field("groups_prefix", &self.groups_prefix)
            .finish()
    }
}

impl OidcSettings {
    /// Settings with the defaults (scopes `openid email profile`, username from `email`,
    /// groups from `groups`, no prefixes) and no client secret.
    pub fn new(issuer: &str, client_id: &str, redirect_url: &str) -> OidcSettings {
        OidcSettings {
            issuer: issuer.to_string(),
            client_id: client_id.to_string(),
            redirect_url: redirect_url.to_string(),
            ..OidcSettings::default()
        }
    }

    /// Checks the settings without any network access.
    pub fn validate(&self) -> Result<(), OidcError> {
        let invalid = |problem: String| Err(OidcError::InvalidSettings { problem });
        check_provider_url("the issuer URL", &self.issuer)?;
        let issuer = Url::parse(&self.issuer).map_err(|_| OidcError::InvalidSettings {
            problem: format!("the issuer URL `{}` is not a URL", self.issuer),
        })?;
        if issuer.query().is_some() || issuer.fragment().is_some() {
            return invalid(format!(
                "the issuer URL `{}` must not have a query or a fragment",
                self.issuer
            ));
        }
        if self.client_id.is_empty() {
            return invalid("the client id is empty".to_string());
        }
        if self.client_secret.as_deref() == Some("") {
            return invalid(
                "the client secret is empty (leave it unset for a public client)".to_string(),
            );
        }
        match Url::parse(&self.redirect_url) {
            Ok(url) if matches!(url.scheme(), "https" | "http") && url.fragment().is_none() => {}
            _ => {
                return invalid(format!(
                    "the redirect URL `{}` is not an absolute http(s) URL without a fragment",
                    self.redirect_url
                ));
            }
        }
        if !self.scopes.iter().any(|s| s == "openid") {
            return invalid("the scopes must include `openid`".to_string());
        }
        if let Some(scope) = self
            .scopes
            .iter()
            .find(|s| s.is_empty() || s.contains(|c: char| c.is_whitespace() || c.is_control()))
        {
            return invalid(format!(
                "the scope {scope:?} is empty or contains whitespace"
            ));
        }
        if self.username_claim.is_empty() {
            return invalid("the username claim is empty".to_string());
        }
        if self.groups_claim.is_empty() {
            return invalid("the groups claim is empty".to_string());
        }
        Ok(())
    }

    /// The prefix applied to usernames, resolved as kube-apiserver resolves
    /// `--oidc-username-prefix`.
    fn effective_username_prefix(&self) -> String {
        match self.username_prefix.as_str() {
            "-" => String::new(),
            "" if self.username_claim == "email" => String::new(),
            "" => format!("{}#", self.issuer),
            prefix => prefix.to_string(),
        }
    }
}

/// Whether `url` may be used to talk to the provider: https, or http to a loopback address.
fn check_provider_url(what: &str, url: &str) -> Result<Url, OidcError> {
    let parsed = Url::parse(url).map_err(|_| OidcError::InvalidSettings {
        problem: format!("{what} `{url}` is not a URL"),
    })?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(OidcError::InvalidSettings {
            problem: format!("{what} must not carry credentials"),
        });
    }
    match parsed.scheme() {
        "https" if parsed.host_str().is_some() => Ok(parsed),
        "http" if parsed.host_str().is_some_and(is_loopback_host) => Ok(parsed),
        _ => Err(OidcError::InsecureUrl {
            what: what.to_string(),
            url: url.to_string(),
        }),
    }
}

fn is_loopback_host(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => bare.eq_ignore_ascii_case("localhost"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    #[error("invalid OIDC settings: {problem}")]
    InvalidSettings { problem: String },
    #[error(
        "{what} `{url}` must use https (http is allowed only on a loopback address: 127.0.0.0/8, ::1, localhost)"
    )]
    InsecureUrl { what: String, url: String },
    #[error("cannot reach the OIDC provider for the {what} at `{url}`: {detail}")]
    Unreachable {
        what: &'static str,
        url: String,
        detail: String,
    },
    #[error(
        "the OIDC provider did not answer the {what} request at `{url}` within {REQUEST_TIMEOUT:?}"
    )]
    Timeout { what: &'static str, url: String },
    #[error("the OIDC provider answered the {what} request at `{url}` with HTTP {status}")]
    Status {
        what: &'static str,
        url: String,
        status: u16,
    },
    #[error("the OIDC provider's {what} is larger than {MAX_RESPONSE_BYTES} bytes")]
    TooLarge { what: &'static str },
    #[error("the OIDC provider's {what} is invalid: {problem}")]
    InvalidDocument { what: &'static str, problem: String },
    #[error(
        "the discovery document names the issuer `{discovered}`, not the configured `{configured}` (they must match exactly)"
    )]
    IssuerMismatch {
        configured: String,
        discovered: String,
    },
    #[error(
        "the OIDC provider does not support PKCE with S256 (code_challenge_methods_supported: {supported})"
    )]
    NoPkceS256 { supported: String },
    #[error(
        "the login's state does not match this browser's login in progress (a stale or forged callback)"
    )]
    StateMismatch,
    #[error("the token endpoint refused the code (HTTP {status}): {error}{}", description.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    TokenRefused {
        status: u16,
        error: String,
        description: Option<String>,
    },
    #[error("the token response has no id_token (is `openid` among the scopes?)")]
    NoIdToken,
    #[error("the ID token is malformed: {problem}")]
    MalformedToken { problem: String },
    #[error("the ID token is signed with `{alg}`; only RS256 and ES256 are accepted")]
    UnsupportedAlgorithm { alg: String },
    #[error(
        "the ID token's signing key {kid} is not in the provider's JWKS, even after fetching it again"
    )]
    UnknownKey { kid: String },
    #[error("the ID token's signature does not verify with the provider's key {kid}")]
    BadSignature { kid: String },
    #[error("the ID token's issuer is `{found}`, not `{expected}`")]
    WrongIssuer { expected: String, found: String },
    #[error("the ID token's audience does not include client `{client_id}`")]
    WrongAudience { client_id: String },
    #[error("the ID token's authorized party (azp) is `{azp}`, not client `{client_id}`")]
    WrongAuthorizedParty { azp: String, client_id: String },
    #[error("the ID token expired at {exp} (now {now}, unix seconds)")]
    Expired { exp: i64, now: i64 },
    #[error("the ID token is issued in the future (iat {iat}, now {now}, unix seconds)")]
    IssuedInFuture { iat: i64, now: i64 },
    #[error("the ID token's nonce does not match the login in progress")]
    NonceMismatch,
    #[error("the ID token has no claim `{claim}`{}", if *.string { " holding a string" } else { "" })]
    MissingClaim { claim: String, string: bool },
    #[error("the ID token's claim `{claim}` is not a string or an array of strings")]
    InvalidGroups { claim: String },
    #[error("the email `{email}` is not verified by the provider (email_verified is false)")]
    EmailNotVerified { email: String },
}

/// A login in progress, between the redirect to the provider and the callback. The console
/// keeps it sealed in a short-lived cookie, so it binds the callback to the browser that
/// started the login (state), the ID token to this login (nonce), and the code to this client
/// (PKCE verifier).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingLogin {
    state: String,
    nonce: String,
    verifier: String,
    return_to: String,
}

impl fmt::Debug for PendingLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingLogin")
            .field("state", &self.state)
            .field("nonce", &self.nonce)
            .field("verifier", &"<redacted>")
            .field("return_to", &self.return_to)
            .finish()
    }
}

impl PendingLogin {
    /// The local path to return to after the login (already made safe).
    pub fn return_to(&self) -> &str {
        &self.return_to
    }

    /// The `state` sent to the provider, which its callback must carry back.
    pub fn state(&self) -> &str {
        &self.state
    }
}

/// Who logged in, as kube-apiserver would name them from the same ID token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The username claim with the username prefix applied.
    pub username: String,
    /// The groups claim with the groups prefix applied to each group.
    pub groups: Vec<String>,
    /// When the ID token expires (unix seconds): the session should not outlive it.
    pub expires_at: i64,
}

/// A verification key from the provider's JWKS.
#[derive(Clone)]
enum PublicKey {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// The uncompressed P-256 point, 0x04 ‖ x ‖ y.
    EcP256 {
        point: Vec<u8>,
    },
}

#[derive(Clone)]
struct Jwk {
    kid: Option<String>,
    alg: Option<String>,
    key: PublicKey,
}

/// The token signature algorithms accepted. Anything else, `none` and the HMAC family (which
/// would take a public key for a shared secret) first, is refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Algorithm {
    Rs256,
    Es256,
}

impl Algorithm {
    fn name(self) -> &'static str {
        match self {
            Algorithm::Rs256 => "RS256",
            Algorithm::Es256 => "ES256",
        }
    }

    fn fits(self, key: &PublicKey) -> bool {
        matches!(
            (self, key),
            (Algorithm::Rs256, PublicKey::Rsa { .. })
                | (Algorithm::Es256, PublicKey::EcP256 { .. })
        )
    }
}

/// A discovered OpenID provider, ready to run logins. Cheap to share behind an `Arc`; the
/// JWKS is cached and fetched again when a token names a key it does not hold.
pub struct OidcProvider {
    settings: OidcSettings,
    http: reqwest::Client,
    authorization_endpoint: Url,
    token_endpoint: Url,
    jwks_uri: Url,
    keys: RwLock<Arc<Vec<Jwk>>>,
}

impl fmt::Debug for OidcProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OidcProvider")
            .field("settings", &self.settings)
            .field(
                "authorization_endpoint",
                &self.authorization_endpoint.as_str(),
            )
            .field("token_endpoint", &self.token_endpoint.as_str())
            .field("jwks_uri", &self.jwks_uri.as_str())
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct DiscoveryDocument {
    issuer: Option<String>,
    authorization_endpoint: Option<String>,
    token_endpoint: Option<String>,
    jwks_uri: Option<String>,
    code_challenge_methods_supported: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct TokenResponse {
    id_token: Option<String>,
}

#[derive(Deserialize)]
struct ProviderError {
    error: Option<String>,
    error_description: Option<String>,
}

#[derive(Deserialize)]
struct JwsHeader {
    alg: String,
    kid: Option<String>,
    crit: Option<Value>,
}

impl OidcProvider {
    /// Validates the settings, reads the provider's discovery document and fetches its keys.
    ///
    /// `http` should not follow redirects to other hosts blindly and must have a rustls
    /// provider installed (see `crate::startup::init_crypto`); every request made here is
    /// bounded to 10 s and 1 MiB regardless.
    pub async fn discover(
        settings: OidcSettings,
        http: reqwest::Client,
    ) -> Result<OidcProvider, OidcError> {
        settings.validate()?;
        let url = format!(
            "{}/.well-known/openid-configuration",
            settings.issuer.trim_end_matches('/')
        );
        let url = Url::parse(&url).map_err(|_| OidcError::InvalidSettings {
            problem: format!("the issuer URL `{}` is not a URL", settings.issuer),
        })?;
        const WHAT: &str = "discovery document";
        let body = fetch(WHAT, http.get(url.clone()), &url).await?;
        let document: DiscoveryDocument =
            serde_json::from_slice(&body).map_err(|error| OidcError::InvalidDocument {
                what: WHAT,
                problem: error.to_string(),
            })?;
        let missing = |field: &str| OidcError::InvalidDocument {
            what: WHAT,
            problem: format!("`{field}` is missing"),
        };
        let discovered = document.issuer.ok_or_else(|| missing("issuer"))?;
        // Exactly: a provider that names another issuer would issue tokens that the API
        // server (configured with this issuer) refuses, or worse, a mix-up attack is underway.
        if discovered != settings.issuer {
            return Err(OidcError::IssuerMismatch {
                configured: settings.issuer.clone(),
                discovered,
            });
        }
        if let Some(methods) = &document.code_challenge_methods_supported
            && !methods.iter().any(|m| m == "S256")
        {
            return Err(OidcError::NoPkceS256 {
                supported: truncate(&methods.join(", ")),
            });
        }
        let endpoint = |field: &'static str, value: Option<String>| -> Result<Url, OidcError> {
            let value = value.ok_or_else(|| missing(field))?;
            check_provider_url(&format!("the provider's {field}"), &value)
        };
        let authorization_endpoint =
            endpoint("authorization_endpoint", document.authorization_endpoint)?;
        let token_endpoint = endpoint("token_endpoint", document.token_endpoint)?;
        let jwks_uri = endpoint("jwks_uri", document.jwks_uri)?;
        let keys = fetch_jwks(&http, &jwks_uri).await?;
        Ok(OidcProvider {
            settings,
            http,
            authorization_endpoint,
            token_endpoint,
            jwks_uri,
            keys: RwLock::new(Arc::new(keys)),
        })
    }

    pub fn settings(&self) -> &OidcSettings {
        &self.settings
    }

    /// Starts a login: the URL to redirect the browser to, and the login in progress to keep
    /// (sealed) until the callback. `return_to` is made a safe local path
    /// ([`safe_return_path`]).
    ///
    /// Panics only if the system random number generator fails.
    pub fn begin_login(&self, return_to: &str) -> (String, PendingLogin) {
        let pending = PendingLogin {
            state: random_token(),
            nonce: random_token(),
            verifier: random_token(),
            return_to: safe_return_path(return_to),
        };
        let challenge = pkce_challenge(&pending.verifier);
        let mut url = self.authorization_endpoint.clone();
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.settings.client_id)
            .append_pair("redirect_uri", &self.settings.redirect_url)
            .append_pair("scope", &self.settings.scopes.join(" "))
            .append_pair("state", &pending.state)
            .append_pair("nonce", &pending.nonce)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256");
        (url.into(), pending)
    }

    /// Completes a login from the provider's callback (`state` and `code` from its query):
    /// checks the state, redeems the code with the PKCE verifier, verifies the ID token and
    /// returns who logged in.
    pub async fn finish_login(
        &self,
        pending: &PendingLogin,
        state: &str,
        code: &str,
    ) -> Result<Identity, OidcError> {
        if !constant_time_eq(state.as_bytes(), pending.state.as_bytes()) {
            return Err(OidcError::StateMismatch);
        }
        let id_token = self.redeem(pending, code).await?;
        let claims = self
            .verify_id_token(&id_token, &pending.nonce, now_secs())
            .await?;
        self.identity(&claims)
    }

    /// Exchanges the code at the token endpoint for an ID token.
    async fn redeem(&self, pending: &PendingLogin, code: &str) -> Result<String, OidcError> {
        const WHAT: &str = "token response";
        let form = form_encode(&[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", &self.settings.redirect_url),
            ("client_id", &self.settings.client_id),
            ("code_verifier", &pending.verifier),
        ]);
        let mut request = self
            .http
            .post(self.token_endpoint.clone())
            .header(http::header::ACCEPT, "application/json")
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(form);
        if let Some(secret) = &self.settings.client_secret {
            // RFC 6749 section 2.3.1: both parts form-encoded before the Basic encoding.
            let credentials = format!(
                "{}:{}",
                form_encode_component(&self.settings.client_id),
                form_encode_component(secret)
            );
            let mut value =
                http::HeaderValue::try_from(format!("Basic {}", STANDARD.encode(credentials)))
                    .map_err(|_| OidcError::InvalidSettings {
                        problem: "the client credentials cannot be sent in a header".to_string(),
                    })?;
            value.set_sensitive(true);
            request = request.header(http::header::AUTHORIZATION, value);
        }
        let url = &self.token_endpoint;
        let response = exchange(request, url, "token", |status, body| {
            // The provider's own explanation helps; it is about the request, not a secret.
            let parsed: Option<ProviderError> = serde_json::from_slice(body).ok();
            let parsed = parsed.unwrap_or(ProviderError {
                error: None,
                error_description: None,
            });
            OidcError::TokenRefused {
                status,
                error: truncate(parsed.error.as_deref().unwrap_or("no error code given")),
                description: parsed.error_description.as_deref().map(truncate),
            }
        })
        .await?;
        let token: TokenResponse =
            serde_json::from_slice(&response).map_err(|error| OidcError::InvalidDocument {
                what: WHAT,
                // serde's message names the position and expectation, not the content.
                problem: error.to_string(),
            })?;
        token.id_token.ok_or(OidcError::NoIdToken)
    }

    /// Verifies an ID token's signature and claims at `now` (unix seconds) and returns its
    /// claims.
    async fn verify_id_token(
        &self,
        token: &str,
        nonce: &str,
        now: i64,
    ) -> Result<serde_json::Map<String, Value>, OidcError> {
        let malformed = |problem: &str| OidcError::MalformedToken {
            problem: problem.to_string(),
        };
        let mut parts = token.split('.');
        let (Some(header_b64), Some(claims_b64), Some(signature_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed("not a compact JWS of three parts"));
        };
        let header: JwsHeader = URL_SAFE_NO_PAD
            .decode(header_b64)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| malformed("the header is not base64url JSON with an `alg`"))?;
        let alg = match header.alg.as_str() {
            "RS256" => Algorithm::Rs256,
            "ES256" => Algorithm::Es256,
            other => {
                return Err(OidcError::UnsupportedAlgorithm {
                    alg: truncate(other),
                });
            }
        };
        if header.crit.is_some() {
            return Err(malformed("the header has critical extensions (`crit`)"));
        }
        let signature = URL_SAFE_NO_PAD
            .decode(signature_b64)
            .map_err(|_| malformed("the signature is not base64url"))?;
        let signing_input = &token[..header_b64.len() + 1 + claims_b64.len()];
        let kid = header.kid.as_deref();
        let key = match self.find_key(alg, kid) {
            Some(key) => key,
            None => {
                // Providers rotate keys: a token signed with a key we have not seen yet is
                // the sign to read the JWKS again (once per token).
                let fresh = fetch_jwks(&self.http, &self.jwks_uri).await?;
                *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh);
                self.find_key(alg, kid)
                    .ok_or_else(|| OidcError::UnknownKey {
                        kid: describe_kid(kid),
                    })?
            }
        };
        let verified = match &key.key {
            PublicKey::Rsa { n, e } => signature::RsaPublicKeyComponents { n, e }.verify(
                &signature::RSA_PKCS1_2048_8192_SHA256,
                signing_input.as_bytes(),
                &signature,
            ),
            PublicKey::EcP256 { point } => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(signing_input.as_bytes(), &signature)
            }
        };
        if verified.is_err() {
            return Err(OidcError::BadSignature {
                kid: describe_kid(kid),
            });
        }
        // Only now, with the signature verified, are the claims worth reading.
        let claims: serde_json::Map<String, Value> = URL_SAFE_NO_PAD
            .decode(claims_b64)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| malformed("the claims are not a base64url JSON object"))?;
        self.check_claims(&claims, nonce, now)?;
        Ok(claims)
    }

    fn check_claims(
        &self,
        claims: &serde_json::Map<String, Value>,
        nonce: &str,
        now: i64,
    ) -> Result<(), OidcError> {
        let client_id = &self.settings.client_id;
        let issuer =
            claims
                .get("iss")
                .and_then(Value::as_str)
                .ok_or_else(|| OidcError::MissingClaim {
                    claim: "iss".to_string(),
                    string: true,
                })?;
        if issuer != self.settings.issuer {
            return Err(OidcError::WrongIssuer {
                expected: self.settings.issuer.clone(),
                found: truncate(issuer),
            });
        }
        let audience_ok = match claims.get("aud") {
            Some(Value::String(aud)) => aud == client_id,
            Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(client_id)),
            _ => false,
        };
        if !audience_ok {
            return Err(OidcError::WrongAudience {
                client_id: client_id.clone(),
            });
        }
        // OIDC Core 3.1.3.7: when present, azp must be this client.
        if let Some(azp) = claims.get("azp")
            && azp.as_str() != Some(client_id)
        {
            return Err(OidcError::WrongAuthorizedParty {
                azp: truncate(&azp.to_string()),
                client_id: client_id.clone(),
            });
        }
        let exp = numeric_date(claims, "exp")?;
        if exp <= now {
            return Err(OidcError::Expired { exp, now });
        }
        let iat = numeric_date(claims, "iat")?;
        if iat > now + CLOCK_SKEW_SECS {
            return Err(OidcError::IssuedInFuture { iat, now });
        }
        let token_nonce = claims.get("nonce").and_then(Value::as_str);
        if !token_nonce.is_some_and(|n| constant_time_eq(n.as_bytes(), nonce.as_bytes())) {
            return Err(OidcError::NonceMismatch);
        }
        Ok(())
    }

    /// The identity kube-apiserver would derive from these (verified) claims.
    fn identity(&self, claims: &serde_json::Map<String, Value>) -> Result<Identity, OidcError> {
        let settings = &self.settings;
        let username = claims
            .get(&settings.username_claim)
            .and_then(Value::as_str)
            .ok_or_else(|| OidcError::MissingClaim {
                claim: settings.username_claim.clone(),
                string: true,
            })?;
        // As the API server does: an email is a username only when the provider says it is
        // verified, or says nothing about it.
        if settings.username_claim == "email"
            && let Some(verified) = claims.get("email_verified")
            && verified.as_bool() != Some(true)
        {
            return Err(OidcError::EmailNotVerified {
                email: truncate(username),
            });
        }
        let groups = match claims.get(&settings.groups_claim) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(group)) => vec![group.clone()],
            Some(Value::Array(groups)) => groups
                .iter()
                .map(|g| g.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| OidcError::InvalidGroups {
                    claim: settings.groups_claim.clone(),
                })?,
            Some(_) => {
                return Err(OidcError::InvalidGroups {
                    claim: settings.groups_claim.clone(),
                });
            }
        };
        Ok(Identity {
            username: format!("{}{username}", settings.effective_username_prefix()),
            groups: groups
                .into_iter()
                .map(|g| format!("{}{g}", settings.groups_prefix))
                .collect(),
            expires_at: numeric_date(claims, "exp")?,
        })
    }

    /// The key for `alg` and `kid`: by `kid` when the token names one, else the only key
    /// fitting the algorithm.
    fn find_key(&self, alg: Algorithm, kid: Option<&str>) -> Option<Jwk> {
        let keys = self
            .keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let usable =
            |jwk: &&Jwk| alg.fits(&jwk.key) && jwk.alg.as_deref().is_none_or(|a| a == alg.name());
        match kid {
            Some(kid) => keys
                .iter()
                .filter(usable)
                .find(|jwk| jwk.kid.as_deref() == Some(kid))
                .cloned(),
            None => {
                let mut fitting = keys.iter().filter(usable);
                match (fitting.next(), fitting.next()) {
                    (Some(only), None) => Some(only.clone()),
                    _ => None,
                }
            }
        }
    }
}

fn describe_kid(kid: Option<&str>) -> String {
    match kid {
        Some(kid) => format!("`{}`", truncate(kid)),
        None => "(no kid)".to_string(),
    }
}

fn numeric_date(claims: &serde_json::Map<String, Value>, claim: &str) -> Result<i64, OidcError> {
    let value = claims.get(claim).ok_or_else(|| OidcError::MissingClaim {
        claim: claim.to_string(),
        string: false,
    })?;
    value
        .as_i64()
        .or_else(|| {
            value
                .as_f64()
                .filter(|f| f.is_finite() && f.abs() < 1e15)
                .map(|f| f.floor() as i64)
        })
        .ok_or_else(|| OidcError::MalformedToken {
            problem: format!("the claim `{claim}` is not a number of seconds"),
        })
}

/// The keys of a JWKS that can verify RS256 or ES256 signatures; others are skipped.
fn parse_jwks(body: &[u8]) -> Result<Vec<Jwk>, OidcError> {
    #[derive(Deserialize)]
    struct Set {
        keys: Vec<Value>,
    }
    let set: Set = serde_json::from_slice(body).map_err(|error| OidcError::InvalidDocument {
        what: "JWKS",
        problem: error.to_string(),
    })?;
    let field = |key: &Value, name: &str| key.get(name).and_then(Value::as_str).map(str::to_string);
    let bytes = |key: &Value, name: &str| {
        field(key, name).and_then(|v| URL_SAFE_NO_PAD.decode(v.trim_end_matches('=')).ok())
    };
    let mut keys = Vec::new();
    for key in &set.keys {
        if field(key, "use").is_some_and(|u| u != "sig") {
            continue;
        }
        let public = match field(key, "kty").as_deref() {
            Some("RSA") => match (bytes(key, "n"), bytes(key, "e")) {
                (Some(n), Some(e)) => PublicKey::Rsa {
                    n: strip_leading_zeros(n),
                    e: strip_leading_zeros(e),
                },
                _ => continue,
            },
            Some("EC") if field(key, "crv").as_deref() == Some("P-256") => {
                match (bytes(key, "x"), bytes(key, "y")) {
                    (Some(x), Some(y)) if x.len() == 32 && y.len() == 32 => {
                        let mut point = Vec::with_capacity(65);
                        point.push(0x04);
                        point.extend_from_slice(&x);
                        point.extend_from_slice(&y);
                        PublicKey::EcP256 { point }
                    }
                    _ => continue,
                }
            }
            _ => continue,
        };
        keys.push(Jwk {
            kid: field(key, "kid"),
            alg: field(key, "alg"),
            key: public,
        });
    }
    Ok(keys)
}

fn strip_leading_zeros(mut bytes: Vec<u8>) -> Vec<u8> {
    let zeros = bytes.iter().take_while(|b| **b == 0).count();
    bytes.drain(..zeros);
    bytes
}

async fn fetch_jwks(http: &reqwest::Client, url: &Url) -> Result<Vec<Jwk>, OidcError> {
    let body = fetch("JWKS", http.get(url.clone()), url).await?;
    parse_jwks(&body)
}

/// A GET whose non-2xx answers are plain status errors.
async fn fetch(
    what: &'static str,
    request: reqwest::RequestBuilder,
    url: &Url,
) -> Result<Vec<u8>, OidcError> {
    let request = request.header(http::header::ACCEPT, "application/json");
    exchange(request, url, what, |status, _| OidcError::Status {
        what,
        url: url.to_string(),
        status,
    })
    .await
}

/// Sends `request` and reads the body, within [`REQUEST_TIMEOUT`] and [`MAX_RESPONSE_BYTES`];
/// a non-2xx answer becomes `on_error(status, body)`.
async fn exchange(
    request: reqwest::RequestBuilder,
    url: &Url,
    what: &'static str,
    on_error: impl FnOnce(u16, &[u8]) -> OidcError,
) -> Result<Vec<u8>, OidcError> {
    let url_text = url.to_string();
    let work = async {
        let mut response = request
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|error| OidcError::Unreachable {
                what,
                url: url_text.clone(),
                detail: describe_reqwest_error(&error),
            })?;
        if response
            .content_length()
            .is_some_and(|len| len > MAX_RESPONSE_BYTES as u64)
        {
            return Err(OidcError::TooLarge { what });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| OidcError::Unreachable {
                what,
                url: url_text.clone(),
                detail: describe_reqwest_error(&error),
            })?
        {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(OidcError::TooLarge { what });
            }
            body.extend_from_slice(&chunk);
        }
        let status = response.status();
        if !status.is_success() {
            return Err(on_error(status.as_u16(), &body));
        }
        Ok(body)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| {
            Err(OidcError::Timeout {
                what,
                url: url_text.clone(),
            })
        })
}

/// reqwest's error with its causes, without the URL (which the caller's error names).
fn describe_reqwest_error(error: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut text = if error.is_timeout() {
        "timed out".to_string()
    } else if error.is_connect() {
        "cannot connect".to_string()
    } else {
        "request failed".to_string()
    };
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    truncate(&text)
}

/// At most [`MAX_PROVIDER_TEXT`] characters of text that came from the provider.
fn truncate(text: &str) -> String {
    match text.char_indices().nth(MAX_PROVIDER_TEXT) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// `application/x-www-form-urlencoded` pairs, with the URL crate's serializer.
fn form_encode(pairs: &[(&str, &str)]) -> String {
    let mut url = Url::parse("http://form.invalid/").expect("a static URL");
    url.query_pairs_mut().extend_pairs(pairs);
    url.query().unwrap_or_default().to_string()
}

fn form_encode_component(value: &str) -> String {
    form_encode(&[("v", value)])
        .strip_prefix("v=")
        .unwrap_or_default()
        .to_string()
}

/// 256 random bits as base64url (43 characters of the unreserved set): state, nonce and
/// PKCE verifier alike (RFC 7636 asks 43–128 such characters of the verifier).
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system random number generator failed");
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The PKCE S256 challenge of a verifier: base64url(SHA-256(verifier)).
fn pkce_challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(ring::digest::digest(
        &ring::digest::SHA256,
        verifier.as_bytes(),
    ))
}

/// Equality without an early exit, so the time taken does not tell how much of a guess was
/// right: both sides are MACed with a random key and the MACs compared with ring's
/// constant-time verification (which also hides the lengths).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let rng = SystemRandom::new();
    let Ok(key) = ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng) else {
        return false;
    };
    let tag = ring::hmac::sign(&key, a);
    ring::hmac::verify(&key, b, tag.as_ref()).is_ok()
}

fn now_secs() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// `return_to` if it is a path on this site, else `/`: what the console redirects to after a
/// login must not send the user elsewhere (an open redirect). Refused: anything not starting
/// with a single `/` (`//host` and `/\host` are other hosts to a browser, `https:` a scheme),
/// backslashes, whitespace and control characters (browsers drop tabs and newlines, making
/// `/\t/host` into `//host`), non-ASCII, and the same tricks percent-encoded.
pub fn safe_return_path(return_to: &str) -> String {
    /// Starts with one `/` and holds no backslash: what every later form must satisfy.
    fn local(path: &[u8]) -> bool {
        path.first() == Some(&b'/') && path.get(1) != Some(&b'/') && !path.contains(&b'\\')
    }
    // As sent: printable ASCII only (a Location header needs no more).
    let raw = return_to.as_bytes();
    if raw.len() > MAX_RETURN_PATH || !local(raw) || !raw.iter().all(|b| (0x21..0x7f).contains(b)) {
        return "/".to_string();
    }
    // Whatever decoding a later hop applies (once, twice), the result must stay local and
    // free of control characters; encoded spaces and UTF-8 are fine.
    let mut decoded = raw.to_vec();
    for _ in 0..3 {
        let next = percent_decode(&decoded);
        if next == decoded {
            break;
        }
        let Ok(text) = std::str::from_utf8(&next) else {
            return "/".to_string();
        };
        if !local(&next) || text.chars().any(char::is_control) {
            return "/".to_string();
        }
        decoded = next;
    }
    return_to.to_string()
}

fn percent_decode(input: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                input.get(i + 1).copied().and_then(hex),
                input.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(hi << 4 | lo);
            i += 3;
            continue;
        }
        out.push(input[i]);
        i += 1;
    }
    out
}

#[cfg(all(test, feature = "dev"))]
#[path = "oidc_tests.rs"]
mod tests;
