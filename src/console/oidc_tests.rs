use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use reqwest::Url;
use serde_json::{Value, json};

use super::*;
use crate::devenv::oidc::{JWKS_PATH, TOKEN_PATH, TestIssuer};

const CLIENT: &str = "raypipe-console";
const SECRET: &str = "s3cret&=:/ value";
/// Never contacted: the test follows the authorize redirect no further than its Location.
const REDIRECT: &str = "http://127.0.0.1:9/auth/callback";

/// Our own throwaway 2048-bit RSA key (PKCS#8 DER), made once with
/// `openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048` and `openssl pkcs8 -topk8`.
const RSA_TEST_KEY_PKCS8: &[&str] = &[
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC10xctUny7Sknf7cwt6ysaljEuyFsWocx8DXWF",
    "urXcgib9lZg0MFrOshZ8YN61/sANfmTB3/5+SfcQCp/2SwiQfb+t3H03Zi87HYTfIZfSaTM4cntyby7nhwbdQHNg",
    "9Sr7CnX0BjaLifMJdPHwvvL7ClcVtWvn0ZnveIVJr2t4aGrxgtLi+JKmJ2XXC6ZqG3Mw+mfFk3C1ZlvB5q6oqQle",
    "BzbhbOgydGL+lw5P1GsznVS9pUjN+rI/YnVjKJrWDzH4yj48Su8nAiAC2S0nT4Em1+tMheRvn1OdIHLjIUm80ALU",
    "Tb29W4shwfaaTsqK8hl/6njta07TPkEVmkFA90pxAgMBAAECggEABGJY3a+7Uq0t7KIsm1kbEBCvPRwsgqD1hT9L",
    "1S17tl/wXGh+ktxgjkp3NRFrsIa6OcXeQtGN8wMBW+Sg5FEOYdfuYG4Qs81dZOo2RDWbuFKaDhJIEcwTYTjKK3te",
    "uaNoQ5pbiSR5V8EiWB1DmJUcPTlQGpOIVU/eJT4oEnery3ymY/P2jsumZrlSCbZG3wq8nZQCG944KjyWfgeMrUfS",
    "hERzZ8/Bjjtp/VIN6+FP9s8v6mTi/tb63BRv9V6y/qqQCpL7MkNjyk+MIsyx7sPhNm79m5Re5UAwJT8PcQXMWtif",
    "UhA3hEdEhvqxY0/lYIdNh1iNu3dY+h/jshScoQR/ewKBgQDYN6JZura2GHZXJuJEg81phNR+OB46vhWTxIq97hzM",
    "yIaufCaCPeyXDx1kCvvjMSPzxz+mewH8pJBu23HYAjyakIRgw1BBpPcHRO9fL2XfaBry4Z8UWBOldj10tiPKsgOd",
    "gCiZ9kme7hntXYq+l47f8C2sMzAIHqIFt4nIB6fcCwKBgQDXR3k9JHcVvSIG8dGD/LEvIrPHbvsWu+KHd5UZS1xo",
    "rVJRdMupGIxcjy4Ow3t0TolJ5YK8kykT5AS976ZqWQ3W6qzLd45LqhmlyfHqZTJeXzdZsCOcUXl+WFmlCNddYcOz",
    "pHm6tEvsdBCbnvqjM7oc9dgtE8il1lVm0NBqqRvE8wKBgDHnNUtscrs4jiezS8nwebp+8+Rl42Q/dw9x72vCx1bk",
    "eWFQOjsZO7/ptyjd+CEJuHiNZj1wapb7DHLppy7p5T7vV/5VVfKwtmsxF+ZqNCMKDh48wNCbO32W+rwzRbOEvpzd",
    "dYGDfJ536fgE/P7cUBeTgZcbAVz+ZPrYz64hRjbdAoGBAKMUY8VrkEKJifNU0HB5xgd89E+JxO/N2KbicbI9on0x",
    "fwBxx64LCJk9ZZiNgUH0FJBEKquLlzyYKPdxSdGaMJ+0Gr3vjX3IF7G9r2Lu0h8nZhitE+zg03Zgm1gnwG3fF49I",
    "c2Z6GmG+8q3Q2vEyyDQUEHTlXcQy/3LpkFicTor9AoGAJKq6G5JO1yyY38UApb7MvggWg+wAnOx61MmJ1xYb6KzT",
    "H8419RkdA3Yt0YCZH0cC7BK/uWNqE6XE+77rSvbTIWd6ddGJ2qs3ICkbkEqeN7oJZ96VlmcE36W/nydXWPeWYB/7",
    "Dag6Kvhm+WrusEZ7ng4D+0LzGm/9rM+jCYbvf8E=",
];

fn http() -> reqwest::Client {
    crate::startup::init_crypto();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .unwrap()
}

fn settings(issuer: &TestIssuer, secret: Option<&str>) -> OidcSettings {
    OidcSettings {
        client_secret: secret.map(str::to_string),
        ..OidcSettings::new(&issuer.issuer(), CLIENT, REDIRECT)
    }
}

async fn start(secret: Option<&str>) -> TestIssuer {
    TestIssuer::start(CLIENT, secret, REDIRECT).await.unwrap()
}

/// `_issuer` documents (and keeps alive) the issuer the settings point at.
async fn provider(_issuer: &TestIssuer, settings: OidcSettings) -> OidcProvider {
    OidcProvider::discover(settings, http()).await.unwrap()
}

/// Follows the authorize URL as a browser would (one hop) and returns the callback's query.
async fn authorize(url: &str) -> HashMap<String, String> {
    let response = http().get(url).send().await.unwrap();
    assert_eq!(response.status(), 302, "authorize answered {response:?}");
    let location = response.headers()["location"].to_str().unwrap();
    assert!(location.starts_with(REDIRECT), "{location}");
    Url::parse(location)
        .unwrap()
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// A whole login; `tamper` may change the pending login before the callback is handled.
async fn login(
    provider: &OidcProvider,
    tamper: impl FnOnce(&mut PendingLogin),
) -> Result<Identity, OidcError> {
    let (url, mut pending) = provider.begin_login("/");
    let callback = authorize(&url).await;
    tamper(&mut pending);
    provider
        .finish_login(&pending, &callback["state"], &callback["code"])
        .await
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

#[tokio::test]
async fn round_trip_with_a_confidential_client_and_prefixes() {
    let issuer = start(Some(SECRET)).await;
    issuer.set_user("bob@example.com", &["team-a", "team-b"]);
    let provider = provider(
        &issuer,
        OidcSettings {
            username_prefix: "oidc:".to_string(),
            groups_prefix: "oidc:".to_string(),
            ..settings(&issuer, Some(SECRET))
        },
    )
    .await;
    let (url, pending) = provider.begin_login("/pipelines/default/demo?tab=history");
    assert_eq!(pending.return_to(), "/pipelines/default/demo?tab=history");
    let callback = authorize(&url).await;
    assert_eq!(callback["state"], pending.state());
    let identity = provider
        .finish_login(&pending, &callback["state"], &callback["code"])
        .await
        .unwrap();
    assert_eq!(identity.username, "oidc:bob@example.com");
    assert_eq!(identity.groups, ["oidc:team-a", "oidc:team-b"]);
    assert!((identity.expires_at - (now() + 3600)).abs() < 60);
    assert_eq!(
        issuer.requests(),
        [
            "/.well-known/openid-configuration",
            "/jwks",
            "/authorize",
            "/token"
        ]
    );
}

#[tokio::test]
async fn round_trip_with_a_public_client() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let identity = login(&provider, |_| {}).await.unwrap();
    assert_eq!(identity.username, "alice@example.com");
    assert_eq!(identity.groups, ["developers"]);
}

#[tokio::test]
async fn login_hint_selects_a_registered_user() {
    let issuer = start(None).await;
    issuer.add_user("carol@example.com", &["ops"]);
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let (url, pending) = provider.begin_login("/");
    let callback = authorize(&format!("{url}&login_hint=carol%40example.com")).await;
    let identity = provider
        .finish_login(&pending, &callback["state"], &callback["code"])
        .await
        .unwrap();
    assert_eq!(identity.username, "carol@example.com");
    assert_eq!(identity.groups, ["ops"]);
}

#[tokio::test]
async fn username_prefix_follows_the_api_server_defaults() {
    let issuer = start(None).await;
    let sub = |prefix: &str| OidcSettings {
        username_claim: "sub".to_string(),
        username_prefix: prefix.to_string(),
        ..settings(&issuer, None)
    };
    // Claims other than email get `{issuer}#` by default; `-` turns prefixing off.
    let defaulted = provider(&issuer, sub("")).await;
    let identity = login(&defaulted, |_| {}).await.unwrap();
    assert_eq!(
        identity.username,
        format!("{}#alice@example.com", issuer.issuer())
    );
    let none = provider(&issuer, sub("-")).await;
    assert_eq!(
        login(&none, |_| {}).await.unwrap().username,
        "alice@example.com"
    );
}

#[tokio::test]
async fn authorize_url_carries_pkce_and_everything_else() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let (url, pending) = provider.begin_login("https://evil.example/");
    assert_eq!(pending.return_to(), "/");
    let url = Url::parse(&url).unwrap();
    assert_eq!(url.path(), "/authorize");
    let query: HashMap<String, String> = url.query_pairs().into_owned().collect();
    assert_eq!(query["response_type"], "code");
    assert_eq!(query["client_id"], CLIENT);
    assert_eq!(query["redirect_uri"], REDIRECT);
    assert_eq!(query["scope"], "openid email profile");
    assert_eq!(query["code_challenge_method"], "S256");
    assert_eq!(query["state"], pending.state);
    assert_eq!(query["nonce"], pending.nonce);
    assert_eq!(query["code_challenge"], pkce_challenge(&pending.verifier));
    for token in [&pending.state, &pending.nonce, &pending.verifier] {
        assert_eq!(token.len(), 43);
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
    }
    // The verifier itself never travels in the URL.
    assert!(!url.as_str().contains(&pending.verifier));
    let (_, other) = provider.begin_login("/");
    assert_ne!(other.state, pending.state);
    assert_ne!(other.verifier, pending.verifier);
}

#[test]
fn pkce_challenge_matches_rfc_7636_appendix_b() {
    assert_eq!(
        pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
        "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    );
}

#[tokio::test]
async fn wrong_state_is_refused_before_the_code_is_spent() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let (url, pending) = provider.begin_login("/");
    let callback = authorize(&url).await;
    let error = provider
        .finish_login(&pending, "forged-state", &callback["code"])
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::StateMismatch), "{error}");
    assert_eq!(issuer.request_count(TOKEN_PATH), 0);
    // The real callback still works.
    provider
        .finish_login(&pending, &callback["state"], &callback["code"])
        .await
        .unwrap();
}

#[tokio::test]
async fn a_code_is_single_use() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let (url, pending) = provider.begin_login("/");
    let callback = authorize(&url).await;
    provider
        .finish_login(&pending, &callback["state"], &callback["code"])
        .await
        .unwrap();
    let error = provider
        .finish_login(&pending, &callback["state"], &callback["code"])
        .await
        .unwrap_err();
    match &error {
        OidcError::TokenRefused { status, error, .. } => {
            assert_eq!(*status, 400);
            assert_eq!(error, "invalid_grant");
        }
        other => panic!("unexpected {other}"),
    }
    // The provider's explanation is shown; the code is not.
    let text = error.to_string();
    assert!(text.contains("already used"), "{text}");
    assert!(!text.contains(&callback["code"]), "{text}");
}

#[tokio::test]
async fn a_wrong_pkce_verifier_is_refused_by_the_provider() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let error = login(&provider, |pending| pending.verifier = random_token())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, OidcError::TokenRefused { error, .. } if error == "invalid_grant"),
        "{error}"
    );
    assert!(error.to_string().contains("PKCE"), "{error}");
}

#[tokio::test]
async fn a_wrong_client_secret_is_refused_by_the_provider() {
    let issuer = start(Some(SECRET)).await;
    let provider = provider(&issuer, settings(&issuer, Some("not the secret"))).await;
    let error = login(&provider, |_| {}).await.unwrap_err();
    assert!(
        matches!(&error, OidcError::TokenRefused { status: 401, error, .. } if error == "invalid_client"),
        "{error}"
    );
    assert!(!error.to_string().contains("not the secret"));
}

#[tokio::test]
async fn a_wrong_nonce_is_refused() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let error = login(&provider, |pending| pending.nonce = random_token())
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::NonceMismatch), "{error}");
}

#[tokio::test]
async fn a_token_signed_by_an_unknown_key_is_refused_after_one_jwks_refetch() {
    let issuer = start(None).await;
    let impostor = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let mut claims = issuer.standard_claims("mallory@example.com", &["admins"], "n");
    claims["iss"] = json!(issuer.issuer());
    let token = impostor.sign_id_token(&claims);
    assert_eq!(issuer.request_count(JWKS_PATH), 1);
    let error = provider
        .verify_id_token(&token, "n", now())
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::UnknownKey { .. }), "{error}");
    assert_eq!(issuer.request_count(JWKS_PATH), 2);
    assert!(error.to_string().contains(&impostor.kid()), "{error}");
}

#[tokio::test]
async fn a_tampered_token_is_refused() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let token = issuer.sign_id_token(&issuer.standard_claims("alice@example.com", &[], "n"));
    provider.verify_id_token(&token, "n", now()).await.unwrap();
    // Other claims under the genuine header and signature.
    let parts: Vec<&str> = token.split('.').collect();
    let forged_claims = issuer.standard_claims("root@example.com", &["system:masters"], "n");
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(forged_claims.to_string()),
        parts[2]
    );
    let error = provider
        .verify_id_token(&forged, "n", now())
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::BadSignature { .. }), "{error}");
    let empty_parts = format!("{}..", parts[0]);
    for malformed in ["", "a.b", "a.b.c.d", empty_parts.as_str()] {
        let error = provider
            .verify_id_token(malformed, "n", now())
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                OidcError::MalformedToken { .. } | OidcError::BadSignature { .. }
            ),
            "{malformed:?}: {error}"
        );
    }
}

#[tokio::test]
async fn key_rotation_is_followed() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    login(&provider, |_| {}).await.unwrap();
    let old_kid = issuer.kid();
    issuer.rotate_key();
    assert_ne!(issuer.kid(), old_kid);
    login(&provider, |_| {}).await.unwrap();
    assert_eq!(issuer.request_count(JWKS_PATH), 2);
    // The new key is cached now.
    login(&provider, |_| {}).await.unwrap();
    assert_eq!(issuer.request_count(JWKS_PATH), 2);
}

#[tokio::test]
async fn expired_and_future_tokens_are_refused() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let now = now();
    let mut claims = issuer.standard_claims("alice@example.com", &[], "n");
    claims["iat"] = json!(now - 7200);
    claims["exp"] = json!(now - 10);
    let error = provider
        .verify_id_token(&issuer.sign_id_token(&claims), "n", now)
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::Expired { .. }), "{error}");

    claims["iat"] = json!(now + 600);
    claims["exp"] = json!(now + 4200);
    let error = provider
        .verify_id_token(&issuer.sign_id_token(&claims), "n", now)
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::IssuedInFuture { .. }), "{error}");

    // Within the skew is fine.
    claims["iat"] = json!(now + 30);
    provider
        .verify_id_token(&issuer.sign_id_token(&claims), "n", now)
        .await
        .unwrap();

    claims.as_object_mut().unwrap().remove("exp");
    let error = provider
        .verify_id_token(&issuer.sign_id_token(&claims), "n", now)
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "the ID token has no claim `exp`");
}

fn unsigned_token(header: &Value, claims: &Value, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

#[tokio::test]
async fn alg_none_and_hmac_are_refused() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let claims = issuer.standard_claims("alice@example.com", &[], "n");
    for alg in ["none", "None", "HS256", "RS384", "ES384", "PS256", ""] {
        let token = unsigned_token(&json!({"alg": alg, "kid": issuer.kid()}), &claims, b"");
        let error = provider
            .verify_id_token(&token, "n", now())
            .await
            .unwrap_err();
        assert!(
            matches!(&error, OidcError::UnsupportedAlgorithm { alg: found } if found == alg),
            "{alg}: {error}"
        );
    }
    let token = unsigned_token(&json!({"typ": "JWT"}), &claims, b"");
    let error = provider
        .verify_id_token(&token, "n", now())
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::MalformedToken { .. }), "{error}");
}

#[tokio::test]
async fn audience_and_issuer_are_checked() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let mut claims = issuer.standard_claims("alice@example.com", &[], "n");
    claims["aud"] = json!("another-client");
    let error = provider
        .verify_id_token(&issuer.sign_id_token(&claims), "n", now())
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "the ID token's audience does not include client `raypipe-console`"
    );
    claims["aud"] = json!(["another-client"]);
    assert!(matches!(
        provider
            .verify_id_token(&issuer.sign_id_token(&claims), "n", now())
            .await,
        Err(OidcError::WrongAudience { .. })
    ));
    // An array that includes us is fine, with azp naming us.
    claims["aud"] = json!(["another-client", CLIENT]);
    claims["azp"] = json!(CLIENT);
    provider
        .verify_id_token(&issuer.sign_id_token(&claims), "n", now())
        .await
        .unwrap();
    claims["azp"] = json!("another-client");
    assert!(matches!(
        provider
            .verify_id_token(&issuer.sign_id_token(&claims), "n", now())
            .await,
        Err(OidcError::WrongAuthorizedParty { .. })
    ));

    let mut claims = issuer.standard_claims("alice@example.com", &[], "n");
    claims["iss"] = json!("https://accounts.example.com");
    let error = provider
        .verify_id_token(&issuer.sign_id_token(&claims), "n", now())
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::WrongIssuer { .. }), "{error}");
}

#[tokio::test]
async fn discovery_must_name_the_configured_issuer_exactly() {
    let issuer = start(None).await;
    let configured = format!("{}/", issuer.issuer());
    let error = OidcProvider::discover(OidcSettings::new(&configured, CLIENT, REDIRECT), http())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, OidcError::IssuerMismatch { configured: c, discovered } if *c == configured && *discovered == issuer.issuer()),
        "{error}"
    );
}

#[tokio::test]
async fn an_unreachable_provider_is_reported() {
    // A port nobody listens on: bind, note it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let error = OidcProvider::discover(
        OidcSettings::new(&format!("http://127.0.0.1:{port}"), CLIENT, REDIRECT),
        http(),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, OidcError::Unreachable { .. }), "{error}");
}

#[test]
fn insecure_issuers_are_refused_without_network() {
    for issuer in [
        "http://example.com",
        "http://10.0.0.1:8080",
        "http://localhost.evil.example",
        "http://127.0.0.1.nip.io",
        "ftp://127.0.0.1",
        "http://[::2]:80",
    ] {
        let error = OidcSettings::new(issuer, CLIENT, REDIRECT)
            .validate()
            .unwrap_err();
        assert!(
            matches!(error, OidcError::InsecureUrl { .. }),
            "{issuer}: {error}"
        );
        assert!(error.to_string().contains("must use https"), "{error}");
    }
    for issuer in [
        "https://accounts.example.com",
        "https://example.com/realms/raypipe",
        "http://127.0.0.1:5556",
        "http://127.5.6.7",
        "http://[::1]:8080/dex",
        "http://localhost:5556",
        "http://LOCALHOST",
    ] {
        OidcSettings::new(issuer, CLIENT, REDIRECT)
            .validate()
            .unwrap_or_else(|error| panic!("{issuer}: {error}"));
    }
    for issuer in [
        "not a url",
        "https://user:pass@example.com",
        "https://example.com?x=1",
    ] {
        assert!(
            matches!(
                OidcSettings::new(issuer, CLIENT, REDIRECT).validate(),
                Err(OidcError::InvalidSettings { .. })
            ),
            "{issuer}"
        );
    }
}

#[tokio::test]
async fn discover_refuses_an_insecure_issuer_before_any_request() {
    let error = OidcProvider::discover(
        OidcSettings::new("http://example.com", CLIENT, REDIRECT),
        http(),
    )
    .await
    .unwrap_err();
    assert!(matches!(error, OidcError::InsecureUrl { .. }), "{error}");
}

#[test]
fn settings_need_openid_and_a_client() {
    let issuer = "https://accounts.example.com";
    let mut settings = OidcSettings::new(issuer, CLIENT, REDIRECT);
    settings.scopes = vec!["email".to_string()];
    assert!(
        settings
            .validate()
            .unwrap_err()
            .to_string()
            .contains("openid")
    );
    let settings = OidcSettings::new(issuer, "", REDIRECT);
    assert!(settings.validate().is_err());
    let settings = OidcSettings::new(issuer, CLIENT, "/callback");
    assert!(settings.validate().is_err());
}

#[tokio::test]
async fn an_unverified_email_is_refused() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let mut claims = issuer.standard_claims("alice@example.com", &[], "n");
    claims["email_verified"] = json!(false);
    let claims = provider
        .verify_id_token(&issuer.sign_id_token(&claims), "n", now())
        .await
        .unwrap();
    let error = provider.identity(&claims).unwrap_err();
    assert!(
        matches!(error, OidcError::EmailNotVerified { .. }),
        "{error}"
    );
}

#[tokio::test]
async fn a_missing_username_claim_is_named() {
    let issuer = start(None).await;
    let provider = provider(
        &issuer,
        OidcSettings {
            username_claim: "preferred_username".to_string(),
            ..settings(&issuer, None)
        },
    )
    .await;
    let error = login(&provider, |_| {}).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "the ID token has no claim `preferred_username` holding a string"
    );
}

#[tokio::test]
async fn groups_may_be_a_string_and_must_be_strings() {
    let issuer = start(None).await;
    let provider = provider(&issuer, settings(&issuer, None)).await;
    let mut claims = issuer.standard_claims("alice@example.com", &[], "n");
    claims["groups"] = json!("solo");
    let verified = provider
        .verify_id_token(&issuer.sign_id_token(&claims), "n", now())
        .await
        .unwrap();
    assert_eq!(provider.identity(&verified).unwrap().groups, ["solo"]);
    claims["groups"] = json!(["a", 1]);
    let verified = provider
        .verify_id_token(&issuer.sign_id_token(&claims), "n", now())
        .await
        .unwrap();
    assert!(matches!(
        provider.identity(&verified),
        Err(OidcError::InvalidGroups { .. })
    ));
    claims.as_object_mut().unwrap().remove("groups");
    let verified = provider
        .verify_id_token(&issuer.sign_id_token(&claims), "n", now())
        .await
        .unwrap();
    assert!(provider.identity(&verified).unwrap().groups.is_empty());
}

/// A provider built without discovery, holding `jwks`; its JWKS URL is a closed port.
fn offline_provider(jwks: &Value) -> OidcProvider {
    crate::startup::init_crypto();
    OidcProvider {
        settings: OidcSettings::new("https://issuer.example", CLIENT, REDIRECT),
        http: http(),
        authorization_endpoint: Url::parse("https://issuer.example/authorize").unwrap(),
        token_endpoint: Url::parse("https://issuer.example/token").unwrap(),
        jwks_uri: Url::parse("http://127.0.0.1:9/jwks").unwrap(),
        keys: RwLock::new(Arc::new(parse_jwks(jwks.to_string().as_bytes()).unwrap())),
    }
}

fn rsa_test_key() -> ring::signature::RsaKeyPair {
    let der = STANDARD.decode(RSA_TEST_KEY_PKCS8.concat()).unwrap();
    ring::signature::RsaKeyPair::from_pkcs8(&der).unwrap()
}

fn rs256_token(key: &ring::signature::RsaKeyPair, kid: &str, claims: &Value) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(json!({"alg": "RS256", "kid": kid}).to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let mut signature = vec![0u8; key.public().modulus_len()];
    key.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        input.as_bytes(),
        &mut signature,
    )
    .unwrap();
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature))
}

#[tokio::test]
async fn rs256_tokens_verify_through_the_jwk() {
    let key = rsa_test_key();
    let public = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(key.public());
    let jwks = json!({"keys": [
        // Keys we cannot use are skipped, not fatal.
        {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"},
        {"kty": "RSA", "use": "enc", "kid": "rsa-1", "n": "AQAB", "e": "AQAB"},
        {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": "rsa-1",
         "n": URL_SAFE_NO_PAD.encode(&public.n), "e": URL_SAFE_NO_PAD.encode(&public.e)},
    ]});
    let provider = offline_provider(&jwks);
    let now = now();
    let claims = json!({
        "iss": "https://issuer.example",
        "sub": "1234",
        "aud": CLIENT,
        "exp": now + 300,
        "iat": now,
        "nonce": "n",
        "email": "dana@example.com",
        "groups": ["ml"],
    });
    let token = rs256_token(&key, "rsa-1", &claims);
    let verified = provider.verify_id_token(&token, "n", now).await.unwrap();
    let identity = provider.identity(&verified).unwrap();
    assert_eq!(identity.username, "dana@example.com");
    assert_eq!(identity.expires_at, now + 300);

    // A flipped signature bit fails.
    let mut bytes = token.into_bytes();
    let last = bytes.len() - 5;
    bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
    let error = provider
        .verify_id_token(&String::from_utf8(bytes).unwrap(), "n", now)
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::BadSignature { .. }), "{error}");

    // The RSA key does not verify an ES256 header naming it: the key does not fit, the JWKS
    // is read again (here: unreachable), and the token is refused.
    let forged = unsigned_token(&json!({"alg": "ES256", "kid": "rsa-1"}), &claims, &[0; 64]);
    assert!(provider.verify_id_token(&forged, "n", now).await.is_err());
}

#[test]
fn debug_output_hides_secrets() {
    let pending = PendingLogin {
        state: "the-state".to_string(),
        nonce: "the-nonce".to_string(),
        verifier: "the-verifier-value".to_string(),
        return_to: "/".to_string(),
    };
    let shown = format!("{pending:?}");
    assert!(!shown.contains("the-verifier-value"), "{shown}");
    let settings = OidcSettings {
        client_secret: Some("hunter2-secret".to_string()),
        ..OidcSettings::new("https://issuer.example", CLIENT, REDIRECT)
    };
    let shown = format!("{settings:?}");
    assert!(!shown.contains("hunter2-secret"), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
}

#[test]
fn pending_login_and_identity_round_trip_through_json() {
    let pending = PendingLogin {
        state: "s".to_string(),
        nonce: "n".to_string(),
        verifier: "v".to_string(),
        return_to: "/x".to_string(),
    };
    let json = serde_json::to_vec(&pending).unwrap();
    assert_eq!(
        serde_json::from_slice::<PendingLogin>(&json).unwrap(),
        pending
    );
    let identity = Identity {
        username: "u".to_string(),
        groups: vec!["g".to_string()],
        expires_at: 5,
    };
    let json = serde_json::to_vec(&identity).unwrap();
    assert_eq!(serde_json::from_slice::<Identity>(&json).unwrap(), identity);
}

#[test]
fn safe_return_path_keeps_local_paths() {
    for path in [
        "/",
        "/pipelines",
        "/pipelines/default/demo?tab=history&x=%20y",
        "/a/b#frag",
        "/%7Euser",
        "/%C3%A9t%C3%A9",
        "/search?q=100%25",
        "/@evil.example",
    ] {
        assert_eq!(safe_return_path(path), path);
    }
}

#[test]
fn safe_return_path_refuses_open_redirects() {
    for path in [
        "",
        "pipelines",
        "//evil.example",
        "//evil.example/path",
        "/\\evil.example",
        "\\\\evil.example",
        "/\\/evil.example",
        "https://evil.example",
        "http:evil.example",
        "javascript:alert(1)",
        " /pipelines",
        "/\t/evil.example",
        "/\n/evil.example",
        "/%2Fevil.example",
        "/%2fevil.example",
        "/%5Cevil.example",
        "/%5cevil.example",
        "/%252Fevil.example",
        "/%09/evil.example",
        "/pipelines/%0d%0aSet-Cookie:x=y",
        "/évil",
        "/a b",
        "/%ff%fe",
    ] {
        assert_eq!(safe_return_path(path), "/", "{path:?}");
    }
    assert_eq!(safe_return_path(&format!("/{}", "a".repeat(3000))), "/");
}

#[test]
fn provider_texts_are_truncated() {
    let long = "x".repeat(1000);
    let cut = truncate(&long);
    assert_eq!(cut.chars().count(), MAX_PROVIDER_TEXT + 1);
    assert_eq!(truncate("short"), "short");
    assert_eq!(
        truncate(&"é".repeat(300)).chars().count(),
        MAX_PROVIDER_TEXT + 1
    );
}

#[test]
fn form_encoding_escapes_reserved_characters() {
    assert_eq!(form_encode_component("a b&c=d:e/f"), "a+b%26c%3Dd%3Ae%2Ff");
    assert_eq!(form_encode(&[("x", "1"), ("y", "&")]), "x=1&y=%26");
}

/// A server on 127.0.0.1 answering every path with `status` and `body`; the URL is returned
/// and the body may name it as `{base}`.
async fn serve_fixed(status: u16, body: String) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let body = body.replace("{base}", &base);
    let app = axum::Router::new().fallback(move || {
        let body = body.clone();
        async move {
            (
                axum::http::StatusCode::from_u16(status).unwrap(),
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                body,
            )
        }
    });
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (base, server)
}

fn discovery_document(extra: Value) -> String {
    let mut document = json!({
        "issuer": "{base}",
        "authorization_endpoint": "{base}/authorize",
        "token_endpoint": "{base}/token",
        "jwks_uri": "{base}/jwks",
    });
    document
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    document.to_string()
}

#[tokio::test]
async fn discovery_requires_s256_when_methods_are_listed() {
    let (base, server) = serve_fixed(
        200,
        discovery_document(json!({"code_challenge_methods_supported": ["plain"]})),
    )
    .await;
    let error = OidcProvider::discover(OidcSettings::new(&base, CLIENT, REDIRECT), http())
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::NoPkceS256 { .. }), "{error}");
    server.abort();
}

#[tokio::test]
async fn discovery_refuses_insecure_endpoints() {
    let (base, server) = serve_fixed(
        200,
        discovery_document(json!({"token_endpoint": "http://token.example.com/token"})),
    )
    .await;
    let error = OidcProvider::discover(OidcSettings::new(&base, CLIENT, REDIRECT), http())
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::InsecureUrl { .. }), "{error}");
    assert!(error.to_string().contains("token_endpoint"), "{error}");
    server.abort();
}

#[tokio::test]
async fn oversized_and_failed_documents_are_refused() {
    let (base, server) = serve_fixed(200, " ".repeat(MAX_RESPONSE_BYTES + 1)).await;
    let error = OidcProvider::discover(OidcSettings::new(&base, CLIENT, REDIRECT), http())
        .await
        .unwrap_err();
    assert!(matches!(error, OidcError::TooLarge { .. }), "{error}");
    server.abort();

    let (base, server) = serve_fixed(503, "{}".to_string()).await;
    let error = OidcProvider::discover(OidcSettings::new(&base, CLIENT, REDIRECT), http())
        .await
        .unwrap_err();
    assert!(
        matches!(error, OidcError::Status { status: 503, .. }),
        "{error}"
    );
    server.abort();

    let (base, server) = serve_fixed(200, "not json".to_string()).await;
    let error = OidcProvider::discover(OidcSettings::new(&base, CLIENT, REDIRECT), http())
        .await
        .unwrap_err();
    assert!(
        matches!(error, OidcError::InvalidDocument { .. }),
        "{error}"
    );
    server.abort();
}

#[test]
fn settings_serialize_without_the_secret() {
    let settings = OidcSettings {
        client_secret: Some("hunter2-secret".to_string()),
        ..OidcSettings::new("https://issuer.example", CLIENT, REDIRECT)
    };
    let json = serde_json::to_string(&settings).unwrap();
    assert!(!json.contains("hunter2"), "{json}");
}
