//! Real OCI registries for the OCI source and `raypipe dag push/pull` tests: the CNCF
//! distribution registry (built once per machine, see `raypipe::devenv::distribution`) on
//! 127.0.0.1 over plain HTTP, in two shared configurations started once per test binary:
//!
//! - [`basic_registry`]: htpasswd basic auth, one user ([`USER`]/[`PASSWORD`]);
//! - [`token_registry`]: the OCI token flow, with [`TokenIssuer`], a small token issuer of our
//!   own (axum): it checks basic credentials per user, grants scopes per repository, and signs
//!   ES256 JWTs with a key whose certificate the registry trusts (`auth.token.rootcertbundle`,
//!   the certificate travels in the JWT's `x5c` header). Each user has its own token lifetime,
//!   so an expired-token test does not disturb the others. Besides the token spec's `GET` with
//!   Basic credentials it takes the OAuth2 form `POST` with `grant_type=refresh_token` (an
//!   identity token, as `docker login` stores for ACR/GCR) or `grant_type=password`.
//!
//! The registries are shared: tests use their own repository names.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use raypipe::devenv::distribution::{DistributionAuth, DistributionRegistry};

/// The user both registries know, with full access to every repository.
pub const USER: &str = "raypipe";
pub const PASSWORD: &str = "push-and-pull";
/// `PASSWORD` as bcrypt (cost 4), the only hash distribution's htpasswd accepts; computed once,
/// so the tests need no bcrypt implementation.
const PASSWORD_BCRYPT: &str = "$2a$04$vqV3YTRsHYfNAx9k36NRLOI6MjTt0f9Olw8Px//RVVw8vlvU6h8d.";

/// What the registry calls itself in token requests and expects as the JWT audience.
pub const SERVICE: &str = "raypipe-test-registry";
/// The JWT issuer the registry trusts.
pub const ISSUER: &str = "raypipe-test-issuer";

/// One account of the token issuer.
#[derive(Clone, Debug)]
pub struct IssuerUser {
    pub password: String,
    /// (repository, actions) pairs; repository `*` matches every repository, `team/*` every
    /// repository under `team/`.
    pub grants: Vec<(String, Vec<String>)>,
    /// Seconds from now to the JWT's `exp`; negative issues tokens that have already expired
    /// (beyond the registry's 60 s leeway at -120).
    pub lifetime_secs: i64,
    /// `expires_in` in the answer, when it should differ from the lifetime (a token that a
    /// client caches as valid but the registry already refuses).
    pub advertised_expires_in: Option<u64>,
}

impl IssuerUser {
    /// Pull and push on every repository, tokens valid for five minutes.
    pub fn full_access(password: &str) -> IssuerUser {
        IssuerUser {
            password: password.to_owned(),
            grants: vec![("*".into(), vec!["pull".into(), "push".into()])],
            lifetime_secs: 300,
            advertised_expires_in: None,
        }
    }

    /// Only `actions` on `repository`.
    pub fn only(password: &str, repository: &str, actions: &[&str]) -> IssuerUser {
        IssuerUser {
            grants: vec![(
                repository.to_owned(),
                actions.iter().map(|a| (*a).to_owned()).collect(),
            )],
            ..IssuerUser::full_access(password)
        }
    }

    fn allowed(&self, repository: &str, action: &str) -> bool {
        self.grants.iter().any(|(pattern, actions)| {
            let matches = pattern == "*"
                || pattern == repository
                || pattern
                    .strip_suffix('*')
                    .is_some_and(|prefix| repository.starts_with(prefix));
            matches && actions.iter().any(|a| a == action || a == "*")
        })
    }
}

/// One request the issuer answered.
#[derive(Clone, Debug)]
pub struct TokenRequestSeen {
    /// The user of the basic credentials, or the one a refresh token belongs to.
    pub user: Option<String>,
    /// The OAuth2 `grant_type` of a `POST`; `None` for the token spec's `GET`.
    pub grant: Option<String>,
    pub scopes: Vec<String>,
    /// Whether a token was issued (false: 401).
    pub issued: bool,
}

#[derive(Default)]
struct IssuerState {
    users: HashMap<String, IssuerUser>,
    /// Refresh (identity) token → the user it stands for.
    refresh_tokens: HashMap<String, String>,
    seen: Vec<TokenRequestSeen>,
}

/// The test token issuer; runs as long as the test binary.
pub struct TokenIssuer {
    /// `http://127.0.0.1:PORT/token`.
    pub realm: String,
    /// The self-signed certificate (PEM) of the signing key.
    pub root_cert_pem: String,
    state: Arc<Mutex<IssuerState>>,
}

struct Signer {
    key: ring::signature::EcdsaKeyPair,
    cert_der_base64: String,
}

fn lock(state: &Mutex<IssuerState>) -> std::sync::MutexGuard<'_, IssuerState> {
    state.lock().expect("issuer lock")
}

impl TokenIssuer {
    async fn start() -> TokenIssuer {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a key");
        let mut params =
            rcgen::CertificateParams::new(Vec::<String>::new()).expect("certificate params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, ISSUER);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("a self-signed certificate");
        let rng = ring::rand::SystemRandom::new();
        let signer = Arc::new(Signer {
            key: ring::signature::EcdsaKeyPair::from_pkcs8(
                &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                &key.serialize_der(),
                &rng,
            )
            .expect("ring reads rcgen's PKCS#8"),
            cert_der_base64: STANDARD.encode(cert.der()),
        });
        let state = Arc::new(Mutex::new(IssuerState::default()));
        lock(&state)
            .users
            .insert(USER.into(), IssuerUser::full_access(PASSWORD));
        let (get_state, get_signer) = (state.clone(), signer.clone());
        let (post_state, post_signer) = (state.clone(), signer);
        let app = axum::Router::new().route(
            "/token",
            axum::routing::get(move |uri: Uri, headers: HeaderMap| {
                let (state, signer) = (get_state.clone(), get_signer.clone());
                async move { issue(&state, &signer, &uri, &headers) }
            })
            .post(move |headers: HeaderMap, body: String| {
                let (state, signer) = (post_state.clone(), post_signer.clone());
                async move { issue_oauth2(&state, &signer, &headers, &body) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the issuer");
        let realm = format!("http://{}/token", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        TokenIssuer {
            realm,
            root_cert_pem: cert.pem(),
            state,
        }
    }

    /// Adds (or replaces) an account.
    pub fn add_user(&self, name: &str, user: IssuerUser) {
        lock(&self.state).users.insert(name.to_owned(), user);
    }

    /// Makes `token` a refresh (identity) token of `user`, as an OAuth2 login would.
    pub fn add_refresh_token(&self, token: &str, user: &str) {
        lock(&self.state)
            .refresh_tokens
            .insert(token.to_owned(), user.to_owned());
    }

    /// Every token request so far, oldest first.
    pub fn requests(&self) -> Vec<TokenRequestSeen> {
        lock(&self.state).seen.clone()
    }

    /// How many tokens were issued to `user`.
    pub fn issued_to(&self, user: &str) -> usize {
        lock(&self.state)
            .seen
            .iter()
            .filter(|seen| seen.issued && seen.user.as_deref() == Some(user))
            .count()
    }
}

/// `(user, password)` from a Basic Authorization header.
fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = String::from_utf8(STANDARD.decode(encoded.trim()).ok()?).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// The name/value pairs of a query string or form body.
fn form_pairs(encoded: &str) -> Vec<(String, String)> {
    let Ok(url) = reqwest::Url::parse(&format!("http://issuer/?{encoded}")) else {
        return Vec::new();
    };
    url.query_pairs()
        .map(|(name, value)| (name.into_owned(), value.into_owned()))
        .collect()
}

/// The `scope` parameters of a token request (it may repeat).
fn scopes(encoded: &str) -> Vec<String> {
    form_pairs(encoded)
        .into_iter()
        .filter(|(name, _)| name == "scope")
        .flat_map(|(_, value)| {
            // Some clients join several scopes with spaces in one parameter.
            value
                .split(' ')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn issue(state: &Mutex<IssuerState>, signer: &Signer, uri: &Uri, headers: &HeaderMap) -> Response {
    let credentials = basic_credentials(headers);
    let requested = scopes(uri.query().unwrap_or_default());
    let mut state = lock(state);
    let user = credentials.as_ref().and_then(|(name, password)| {
        state
            .users
            .get(name)
            .filter(|user| &user.password == password)
            .cloned()
    });
    state.seen.push(TokenRequestSeen {
        user: credentials.as_ref().map(|(name, _)| name.clone()),
        grant: None,
        scopes: requested.clone(),
        issued: user.is_some(),
    });
    drop(state);
    let (Some(user), Some((name, _))) = (user, credentials) else {
        let mut refused = json_response(
            StatusCode::UNAUTHORIZED,
            &serde_json::json!({"errors": [{"code": "UNAUTHORIZED",
                "message": "wrong or missing credentials"}]}),
        );
        refused.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Basic realm=\"raypipe-test-issuer\""),
        );
        return refused;
    };
    let (token, expires_in, issued_at) = sign_token(signer, &name, &user, &requested);
    json_response(
        StatusCode::OK,
        &serde_json::json!({
            "token": token,
            "access_token": token,
            "expires_in": expires_in,
            "issued_at": issued_at,
        }),
    )
}

/// The OAuth2 flavour of the token endpoint: a form `POST` with `grant_type` `refresh_token`
/// (`refresh_token`) or `password` (`username`, `password`), plus `service`, `client_id` and
/// space-separated `scope`. A refused grant is `400 invalid_grant`, as RFC 6749 has it; only
/// `access_token` is answered (the OAuth2 response has no `token`).
fn issue_oauth2(
    state: &Mutex<IssuerState>,
    signer: &Signer,
    headers: &HeaderMap,
    body: &str,
) -> Response {
    let pairs = form_pairs(body);
    let param = |name: &str| {
        pairs
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let grant = param("grant_type").unwrap_or_default();
    let requested = scopes(body);
    let well_formed = form
        && param("client_id").is_some_and(|id| !id.is_empty())
        && param("service").as_deref() == Some(SERVICE);
    let mut state = lock(state);
    let name = match grant.as_str() {
        "refresh_token" => {
            param("refresh_token").and_then(|token| state.refresh_tokens.get(&token).cloned())
        }
        "password" => param("username").filter(|name| {
            state
                .users
                .get(name)
                .is_some_and(|user| Some(&user.password) == param("password").as_ref())
        }),
        _ => None,
    };
    let user = name
        .as_ref()
        .filter(|_| well_formed)
        .and_then(|name| state.users.get(name).cloned());
    state.seen.push(TokenRequestSeen {
        user: name.clone(),
        grant: Some(grant),
        scopes: requested.clone(),
        issued: user.is_some(),
    });
    drop(state);
    let (Some(user), Some(name)) = (user, name) else {
        let error = if well_formed {
            "invalid_grant"
        } else {
            "invalid_request"
        };
        return json_response(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({"error": error}),
        );
    };
    let (token, expires_in, issued_at) = sign_token(signer, &name, &user, &requested);
    json_response(
        StatusCode::OK,
        &serde_json::json!({
            "access_token": token,
            "scope": requested.join(" "),
            "expires_in": expires_in,
            "issued_at": issued_at,
        }),
    )
}

/// A JWT for `name` with the `requested` scopes `user` is granted; (token, expires_in,
/// issued_at).
fn sign_token(
    signer: &Signer,
    name: &str,
    user: &IssuerUser,
    requested: &[String],
) -> (String, u64, String) {
    let access: Vec<serde_json::Value> = requested
        .iter()
        .filter_map(|scope| {
            let mut parts = scope.splitn(3, ':');
            let (kind, repository, actions) = (parts.next()?, parts.next()?, parts.next()?);
            let granted: Vec<&str> = actions
                .split(',')
                .filter(|action| kind == "repository" && user.allowed(repository, action))
                .collect();
            Some(serde_json::json!({"type": kind, "name": repository, "actions": granted}))
        })
        .collect();
    let now = jiff::Timestamp::now();
    let issued_at = now.as_second();
    let claims = serde_json::json!({
        "iss": ISSUER,
        "sub": name,
        "aud": SERVICE,
        "exp": issued_at.saturating_add(user.lifetime_secs),
        "nbf": issued_at.saturating_sub(1),
        "iat": issued_at,
        "jti": raypipe::devenv::random_token().unwrap_or_default(),
        "access": access,
    });
    let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [signer.cert_der_base64]});
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature = signer
        .key
        .sign(&ring::rand::SystemRandom::new(), signing_input.as_bytes())
        .expect("ES256 signing");
    let token = format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature.as_ref())
    );
    let expires_in = user
        .advertised_expires_in
        .unwrap_or_else(|| u64::try_from(user.lifetime_secs).unwrap_or(0));
    (token, expires_in, now.to_string())
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The distribution registry with token auth and its issuer.
pub struct TokenRegistry {
    pub registry: DistributionRegistry,
    pub issuer: TokenIssuer,
}

/// A runtime that lives as long as the test binary: the issuer's server runs on it (each
/// `#[tokio::test]` runtime ends with its test).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime starts")
    })
}

/// Runs `future` to completion on [`runtime`] from a plain thread (tests call this from inside
/// their own runtime, where `block_on` is not allowed).
fn on_shared_runtime<T: Send + 'static>(
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    std::thread::spawn(move || runtime().block_on(future))
        .join()
        .expect("registry start-up did not panic")
}

/// The shared htpasswd registry ([`USER`]/[`PASSWORD`]).
pub fn basic_registry() -> &'static DistributionRegistry {
    static REGISTRY: OnceLock<Result<DistributionRegistry, String>> = OnceLock::new();
    let registry = REGISTRY.get_or_init(|| {
        on_shared_runtime(async {
            DistributionRegistry::start(DistributionAuth::Htpasswd {
                htpasswd: format!("{USER}:{PASSWORD_BCRYPT}\n"),
            })
            .await
            .map_err(|e| e.to_string())
        })
    });
    match registry {
        Ok(registry) => registry,
        Err(e) => panic!("the htpasswd registry failed to start: {e}"),
    }
}

/// The shared token-auth registry and its issuer.
pub fn token_registry() -> &'static TokenRegistry {
    static REGISTRY: OnceLock<Result<TokenRegistry, String>> = OnceLock::new();
    let registry = REGISTRY.get_or_init(|| {
        on_shared_runtime(async {
            let issuer = TokenIssuer::start().await;
            let registry = DistributionRegistry::start(DistributionAuth::Token {
                realm: issuer.realm.clone(),
                service: SERVICE.into(),
                issuer: ISSUER.into(),
                root_cert_pem: issuer.root_cert_pem.clone(),
            })
            .await
            .map_err(|e| e.to_string())?;
            Ok(TokenRegistry { registry, issuer })
        })
    });
    match registry {
        Ok(registry) => registry,
        Err(e) => panic!("the token registry failed to start: {e}"),
    }
}
