//! A test OpenID Connect provider on 127.0.0.1, for the console's login tests and
//! `raypipe dev`: discovery, an authorize endpoint that approves at once (no login form), a
//! token endpoint that checks everything a real provider checks (single-use codes, the exact
//! redirect URI, client authentication, the PKCE S256 verifier), and ES256 ID tokens signed
//! with a P-256 key generated at start, published in its JWKS. Key rotation and a request log
//! let tests assert what the relying party did.
//!
//! Only the authorization-code flow with PKCE S256 is offered: it is all the console uses, and a
//! provider that accepted less would hide a relying party that asked for less.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::{SecureRandom as _, SystemRandom};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::{Value, json};

/// How long an authorization code may be redeemed.
const CODE_LIFETIME: Duration = Duration::from_secs(60);
/// Lifetime of the ID tokens issued.
const TOKEN_LIFETIME_SECS: i64 = 3600;

pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
pub const AUTHORIZE_PATH: &str = "/authorize";
pub const TOKEN_PATH: &str = "/token";
pub const JWKS_PATH: &str = "/jwks";

/// A user the issuer can log in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestUser {
    pub email: String,
    pub groups: Vec<String>,
}

struct SigningKey {
    kid: String,
    pair: EcdsaKeyPair,
}

impl SigningKey {
    fn generate(rng: &SystemRandom) -> SigningKey {
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, rng)
            .expect("generating a P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), rng)
            .expect("reading the generated P-256 key");
        SigningKey {
            kid: random_token(rng, 8),
            pair,
        }
    }

    /// The public key as a JWK: the uncompressed point is 0x04 ‖ x ‖ y.
    fn jwk(&self) -> Value {
        let point = self.pair.public_key().as_ref();
        json!({
            "kty": "EC",
            "crv": "P-256",
            "use": "sig",
            "alg": "ES256",
            "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        })
    }
}

/// An issued, not yet redeemed authorization code.
struct Grant {
    user: TestUser,
    nonce: Option<String>,
    challenge: String,
    redirect_uri: String,
    issued: Instant,
}

struct Inner {
    issuer: String,
    client_id: String,
    client_secret: Option<String>,
    redirect_url: String,
    rng: SystemRandom,
    key: SigningKey,
    user: TestUser,
    users: Vec<TestUser>,
    codes: HashMap<String, Grant>,
    requests: Vec<String>,
}

type Shared = Arc<Mutex<Inner>>;

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // Every update is a single statement, so a poisoned lock still holds usable state.
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running test provider; it stops when dropped.
pub struct TestIssuer {
    addr: SocketAddr,
    inner: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for TestIssuer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl std::fmt::Debug for TestIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestIssuer")
            .field("issuer", &self.issuer())
            .finish_non_exhaustive()
    }
}

impl TestIssuer {
    /// Binds 127.0.0.1 on a free port and serves the provider for one client. The first
    /// logins get the user `alice@example.com` in the group `developers` until
    /// [`TestIssuer::set_user`] says otherwise.
    pub async fn start(
        client_id: &str,
        client_secret: Option<&str>,
        redirect_url: &str,
    ) -> std::io::Result<TestIssuer> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let rng = SystemRandom::new();
        let key = SigningKey::generate(&rng);
        let inner = Arc::new(Mutex::new(Inner {
            issuer: format!("http://{addr}"),
            client_id: client_id.to_string(),
            client_secret: client_secret.map(str::to_string),
            redirect_url: redirect_url.to_string(),
            rng,
            key,
            user: TestUser {
                email: "alice@example.com".to_string(),
                groups: vec!["developers".to_string()],
            },
            users: Vec::new(),
            codes: HashMap::new(),
            requests: Vec::new(),
        }));
        let app = Router::new()
            .route(DISCOVERY_PATH, get(discovery))
            .route(AUTHORIZE_PATH, get(authorize))
            .route(TOKEN_PATH, post(token))
            .route(JWKS_PATH, get(jwks))
            .with_state(inner.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(TestIssuer {
            addr,
            inner,
            server,
        })
    }

    /// The issuer URL, `http://127.0.0.1:PORT` (no trailing slash), as it appears in `iss`.
    pub fn issuer(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The identity the next logins get (those without a `login_hint`).
    pub fn set_user(&self, email: &str, groups: &[&str]) {
        lock(&self.inner).user = user(email, groups);
    }

    /// Registers a user that a `login_hint=<email>` on the authorize request selects.
    pub fn add_user(&self, email: &str, groups: &[&str]) {
        let mut inner = lock(&self.inner);
        inner.users.retain(|u| u.email != email);
        inner.users.push(user(email, groups));
    }

    /// Replaces the signing key with a new one under a new `kid`; the old key is no longer
    /// published, as after a provider's key rotation.
    pub fn rotate_key(&self) {
        let mut inner = lock(&self.inner);
        inner.key = SigningKey::generate(&inner.rng);
    }

    /// The `kid` of the current signing key.
    pub fn kid(&self) -> String {
        lock(&self.inner).key.kid.clone()
    }

    /// Every request path served so far, in order (without query strings).
    pub fn requests(&self) -> Vec<String> {
        lock(&self.inner).requests.clone()
    }

    /// How many requests `path` received.
    pub fn request_count(&self, path: &str) -> usize {
        lock(&self.inner)
            .requests
            .iter()
            .filter(|p| *p == path)
            .count()
    }

    /// A JWS signed with the current key (ES256, its `kid`), with these claims exactly: for
    /// tests that need tokens a well-behaved provider would not issue (expired, another
    /// audience, …).
    pub fn sign_id_token(&self, claims: &Value) -> String {
        lock(&self.inner).sign(claims)
    }

    /// The claims of an ID token this issuer would issue now for `email`, with `nonce`.
    pub fn standard_claims(&self, email: &str, groups: &[&str], nonce: &str) -> Value {
        let inner = lock(&self.inner);
        inner.claims(&user(email, groups), Some(nonce))
    }
}

fn user(email: &str, groups: &[&str]) -> TestUser {
    TestUser {
        email: email.to_string(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

fn random_token(rng: &SystemRandom, len: usize) -> String {
    let mut bytes = vec![0u8; len];
    rng.fill(&mut bytes).expect("the system random generator");
    URL_SAFE_NO_PAD.encode(bytes)
}

fn now_secs() -> i64 {
    jiff::Timestamp::now().as_second()
}

impl Inner {
    fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": self.key.kid});
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self
            .key
            .pair
            .sign(&self.rng, signing_input.as_bytes())
            .expect("ES256 signing");
        format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        )
    }

    fn claims(&self, user: &TestUser, nonce: Option<&str>) -> Value {
        let now = now_secs();
        let mut claims = json!({
            "iss": self.issuer,
            "sub": user.email,
            "aud": self.client_id,
            "exp": now + TOKEN_LIFETIME_SECS,
            "iat": now,
            "email": user.email,
            "email_verified": true,
            "groups": user.groups,
        });
        if let Some(nonce) = nonce {
            claims["nonce"] = json!(nonce);
        }
        claims
    }
}

fn query_pairs(query: Option<&str>) -> HashMap<String, String> {
    // The URL parser's form decoder, on a dummy base: no extra crate, and `+` and `%XX` are
    // decoded as browsers encode them.
    let Ok(url) = reqwest::Url::parse(&format!("http://query.invalid/?{}", query.unwrap_or("")))
    else {
        return HashMap::new();
    };
    url.query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body.to_string(),
    )
        .into_response()
}

fn oauth_error(status: StatusCode, error: &str, description: &str) -> Response {
    json_response(
        status,
        &json!({"error": error, "error_description": description}),
    )
}

async fn discovery(State(inner): State<Shared>) -> Response {
    let mut inner = lock(&inner);
    inner.requests.push(DISCOVERY_PATH.to_string());
    let issuer = inner.issuer.clone();
    json_response(
        StatusCode::OK,
        &json!({
            "issuer": issuer,
            "authorization_endpoint": format!("{issuer}{AUTHORIZE_PATH}"),
            "token_endpoint": format!("{issuer}{TOKEN_PATH}"),
            "jwks_uri": format!("{issuer}{JWKS_PATH}"),
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "scopes_supported": ["openid", "email", "profile", "groups"],
        }),
    )
}

async fn jwks(State(inner): State<Shared>) -> Response {
    let mut inner = lock(&inner);
    inner.requests.push(JWKS_PATH.to_string());
    json_response(StatusCode::OK, &json!({"keys": [inner.key.jwk()]}))
}

/// Approves at once: after checking the client and the redirect URI (errors about those are
/// shown, never redirected, as a real provider must), it redirects back with a code.
async fn authorize(State(inner): State<Shared>, uri: Uri) -> Response {
    let mut inner = lock(&inner);
    inner.requests.push(AUTHORIZE_PATH.to_string());
    let query = query_pairs(uri.query());
    let param = |name: &str| query.get(name).map(String::as_str);
    if param("client_id") != Some(inner.client_id.as_str()) {
        return (StatusCode::BAD_REQUEST, "unknown client_id").into_response();
    }
    if param("redirect_uri") != Some(inner.redirect_url.as_str()) {
        return (StatusCode::BAD_REQUEST, "redirect_uri is not registered").into_response();
    }
    let redirect_uri = inner.redirect_url.clone();
    let back = |pairs: &[(&str, &str)]| {
        let mut location = reqwest::Url::parse(&redirect_uri).expect("a registered redirect URL");
        location.query_pairs_mut().extend_pairs(pairs);
        if let Some(state) = param("state") {
            location.query_pairs_mut().append_pair("state", state);
        }
        (
            StatusCode::FOUND,
            [(header::LOCATION, location.to_string())],
        )
            .into_response()
    };
    if param("response_type") != Some("code") {
        return back(&[("error", "unsupported_response_type")]);
    }
    if param("code_challenge_method") != Some("S256") {
        return back(&[
            ("error", "invalid_request"),
            ("error_description", "PKCE with S256 is required"),
        ]);
    }
    let Some(challenge) = param("code_challenge").filter(|c| c.len() == 43) else {
        return back(&[
            ("error", "invalid_request"),
            (
                "error_description",
                "code_challenge is missing or malformed",
            ),
        ]);
    };
    if !param("scope").is_some_and(|s| s.split(' ').any(|s| s == "openid")) {
        return back(&[("error", "invalid_scope")]);
    }
    let user = match param("login_hint") {
        None => inner.user.clone(),
        Some(hint) => match inner.users.iter().find(|u| u.email == hint) {
            Some(user) => user.clone(),
            None => return back(&[("error", "access_denied")]),
        },
    };
    let code = random_token(&inner.rng, 32);
    let now = Instant::now();
    inner
        .codes
        .retain(|_, grant| now.duration_since(grant.issued) < CODE_LIFETIME);
    inner.codes.insert(
        code.clone(),
        Grant {
            user,
            nonce: param("nonce").map(str::to_string),
            challenge: challenge.to_string(),
            redirect_uri: redirect_uri.clone(),
            issued: now,
        },
    );
    back(&[("code", &code)])
}

/// The client id and secret of an `Authorization: Basic` header, form-decoded as RFC 6749
/// section 2.3.1 asks.
fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let encoded = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?;
    let decoded = String::from_utf8(STANDARD.decode(encoded.trim()).ok()?).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    let form = query_pairs(Some(&format!(
        "id={}&secret={}",
        id.replace('&', "%26"),
        secret.replace('&', "%26")
    )));
    Some((form.get("id")?.clone(), form.get("secret")?.clone()))
}

fn pkce_matches(verifier: &str, challenge: &str) -> bool {
    let well_formed = (43..=128).contains(&verifier.len())
        && verifier
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b));
    let digest = ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes());
    well_formed && URL_SAFE_NO_PAD.encode(digest.as_ref()) == challenge
}

async fn token(State(inner): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let mut inner = lock(&inner);
    inner.requests.push(TOKEN_PATH.to_string());
    let form = query_pairs(std::str::from_utf8(&body).ok());
    let param = |name: &str| form.get(name).map(String::as_str);
    // Client authentication: Basic or form credentials; with no secret, the client_id alone.
    let client_id = match (basic_credentials(&headers), &inner.client_secret) {
        (Some((id, secret)), Some(expected)) if secret == *expected => id,
        (Some(_), _) => {
            return oauth_error(
                StatusCode::UNAUTHORIZED,
                "invalid_client",
                "bad credentials",
            );
        }
        (None, Some(expected)) => {
            if param("client_secret") != Some(expected.as_str()) {
                return oauth_error(
                    StatusCode::UNAUTHORIZED,
                    "invalid_client",
                    "client authentication is required",
                );
            }
            param("client_id").unwrap_or_default().to_string()
        }
        (None, None) => param("client_id").unwrap_or_default().to_string(),
    };
    if client_id != inner.client_id || param("client_id").is_some_and(|id| id != client_id) {
        return oauth_error(StatusCode::UNAUTHORIZED, "invalid_client", "unknown client");
    }
    if param("grant_type") != Some("authorization_code") {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "only authorization_code is supported",
        );
    }
    // The code is spent by this request whatever happens next, as RFC 6749 asks.
    let Some(grant) = param("code").and_then(|code| inner.codes.remove(code)) else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "the code is unknown or was already used",
        );
    };
    if grant.issued.elapsed() >= CODE_LIFETIME {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", "the code expired");
    }
    if param("redirect_uri") != Some(grant.redirect_uri.as_str()) {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "redirect_uri does not match the authorization request",
        );
    }
    if !param("code_verifier").is_some_and(|v| pkce_matches(v, &grant.challenge)) {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "PKCE verification failed",
        );
    }
    let id_token = inner.sign(&inner.claims(&grant.user, grant.nonce.as_deref()));
    let access_token = random_token(&inner.rng, 32);
    json_response(
        StatusCode::OK,
        &json!({
            "access_token": access_token,
            "id_token": id_token,
            "token_type": "Bearer",
            "expires_in": TOKEN_LIFETIME_SECS,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: &str = "console";
    const REDIRECT: &str = "http://127.0.0.1:9/callback";

    fn http() -> reqwest::Client {
        crate::startup::init_crypto();
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .unwrap()
    }

    const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

    fn authorize_url(issuer: &TestIssuer, change: &[(&str, &str)]) -> reqwest::Url {
        let mut params: Vec<(&str, &str)> = vec![
            ("response_type", "code"),
            ("client_id", CLIENT),
            ("redirect_uri", REDIRECT),
            ("scope", "openid email"),
            ("state", "st"),
            ("nonce", "no"),
            ("code_challenge", CHALLENGE),
            ("code_challenge_method", "S256"),
        ];
        for (name, value) in change {
            params.retain(|(n, _)| n != name);
            params.push((name, value));
        }
        let mut url = reqwest::Url::parse(&format!("{}{AUTHORIZE_PATH}", issuer.issuer())).unwrap();
        url.query_pairs_mut().extend_pairs(params);
        url
    }

    async fn location(issuer: &TestIssuer, change: &[(&str, &str)]) -> HashMap<String, String> {
        let response = http()
            .get(authorize_url(issuer, change))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 302);
        let location = response.headers()["location"].to_str().unwrap();
        assert!(location.starts_with(REDIRECT), "{location}");
        query_pairs(reqwest::Url::parse(location).unwrap().query())
    }

    async fn redeem(issuer: &TestIssuer, form: &[(String, String)]) -> (u16, Value) {
        let mut body = reqwest::Url::parse("http://form.invalid/").unwrap();
        body.query_pairs_mut().extend_pairs(form);
        let response = http()
            .post(format!("{}{TOKEN_PATH}", issuer.issuer()))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.query().unwrap_or_default().to_string())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (
            status,
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap(),
        )
    }

    #[tokio::test]
    async fn discovery_and_jwks_describe_the_provider() {
        let issuer = TestIssuer::start(CLIENT, None, REDIRECT).await.unwrap();
        let base = issuer.issuer();
        let discovery: Value = serde_json::from_slice(
            &http()
                .get(format!("{base}{DISCOVERY_PATH}"))
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(discovery["issuer"], base);
        assert_eq!(discovery["token_endpoint"], format!("{base}{TOKEN_PATH}"));
        assert_eq!(
            discovery["code_challenge_methods_supported"],
            json!(["S256"])
        );
        let jwks_of = |issuer: &TestIssuer| {
            let url = format!("{}{JWKS_PATH}", issuer.issuer());
            async move {
                let bytes = http().get(url).send().await.unwrap().bytes().await.unwrap();
                serde_json::from_slice::<Value>(&bytes).unwrap()
            }
        };
        let jwks = jwks_of(&issuer).await;
        let keys = jwks["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0]["crv"], "P-256");
        assert_eq!(keys[0]["kid"], issuer.kid());
        for coordinate in ["x", "y"] {
            let bytes = URL_SAFE_NO_PAD
                .decode(keys[0][coordinate].as_str().unwrap())
                .unwrap();
            assert_eq!(bytes.len(), 32);
        }
        let old = issuer.kid();
        issuer.rotate_key();
        let jwks = jwks_of(&issuer).await;
        assert_eq!(jwks["keys"].as_array().unwrap().len(), 1);
        assert_ne!(jwks["keys"][0]["kid"], old);
        assert_eq!(issuer.requests(), [DISCOVERY_PATH, JWKS_PATH, JWKS_PATH]);
    }

    #[tokio::test]
    async fn authorize_checks_the_client_and_pkce() {
        let issuer = TestIssuer::start(CLIENT, None, REDIRECT).await.unwrap();
        for change in [
            ("redirect_uri", "http://127.0.0.1:9/elsewhere"),
            ("client_id", "someone-else"),
        ] {
            let response = http()
                .get(authorize_url(&issuer, &[change]))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 400, "{change:?}");
        }
        let back = location(&issuer, &[("code_challenge_method", "plain")]).await;
        assert_eq!(back["error"], "invalid_request");
        assert_eq!(back["state"], "st");
        let back = location(&issuer, &[("login_hint", "nobody@example.com")]).await;
        assert_eq!(back["error"], "access_denied");
        let back = location(&issuer, &[]).await;
        assert!(back.contains_key("code"));
    }

    #[tokio::test]
    async fn token_endpoint_checks_client_secret_verifier_and_code() {
        let issuer = TestIssuer::start(CLIENT, Some("pw"), REDIRECT)
            .await
            .unwrap();
        let form = |secret: &str, verifier: &str, code: &str| {
            [
                ("grant_type", "authorization_code"),
                ("client_id", CLIENT),
                ("redirect_uri", REDIRECT),
                ("client_secret", secret),
                ("code_verifier", verifier),
                ("code", code),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        };
        let code = location(&issuer, &[]).await["code"].clone();
        let (status, body) = redeem(&issuer, &form("wrong", VERIFIER, &code)).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("invalid_client"))
        );
        // Client authentication failed before the code was looked at: it is still valid,
        // until a redemption with a wrong verifier spends it.
        let (status, body) = redeem(&issuer, &form("pw", &"x".repeat(43), &code)).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_grant"))
        );
        assert_eq!(body["error_description"], "PKCE verification failed");
        let (status, _) = redeem(&issuer, &form("pw", VERIFIER, &code)).await;
        assert_eq!(status, 400);

        let code = location(&issuer, &[]).await["code"].clone();
        let (status, body) = redeem(&issuer, &form("pw", VERIFIER, &code)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["token_type"], "Bearer");
        let id_token = body["id_token"].as_str().unwrap();
        let claims: Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(id_token.split('.').nth(1).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(claims["aud"], CLIENT);
        assert_eq!(claims["nonce"], "no");
        assert_eq!(claims["email"], "alice@example.com");
    }

    #[test]
    fn pkce_and_basic_credentials() {
        assert!(pkce_matches(VERIFIER, CHALLENGE));
        assert!(!pkce_matches(&VERIFIER[1..], CHALLENGE));
        let mut headers = HeaderMap::new();
        let encoded = STANDARD.encode("my%20client:p%26w%3Ad");
        headers.insert(
            header::AUTHORIZATION,
            format!("Basic {encoded}").parse().unwrap(),
        );
        assert_eq!(
            basic_credentials(&headers),
            Some(("my client".to_string(), "p&w:d".to_string()))
        );
    }

    #[tokio::test]
    async fn dropping_stops_the_server() {
        let issuer = TestIssuer::start(CLIENT, None, REDIRECT).await.unwrap();
        let addr = issuer.addr();
        drop(issuer);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
