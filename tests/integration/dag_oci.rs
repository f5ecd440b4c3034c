//! `raypipe dag push` / `raypipe dag pull` against the real distribution registry on 127.0.0.1
//! (htpasswd and token auth, `support::oci`), and the fixtures themselves: the registries refuse
//! what they should, so the OCI tests that rely on them test something.

use crate::support::oci::{self, IssuerUser, PASSWORD, USER};

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

#[tokio::test]
async fn the_htpasswd_registry_accepts_its_user_only() {
    let registry = oci::basic_registry();
    let client = reqwest::Client::new();
    let status = |authorization: Option<String>| {
        let mut request = client.get(registry.url("/v2/"));
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        async move { request.send().await.expect("the registry answers").status() }
    };
    assert_eq!(status(None).await, 401);
    assert_eq!(status(Some(basic(USER, "wrong"))).await, 401);
    assert_eq!(status(Some(basic(USER, PASSWORD))).await, 200);
}

/// The token flow by hand: the 401 names our issuer, its token opens the repository it grants,
/// and an expired token or one for another repository is refused.
#[tokio::test]
async fn the_token_registry_trusts_its_issuer_for_the_scopes_it_grants() {
    let oci::TokenRegistry { registry, issuer } = oci::token_registry();
    let client = reqwest::Client::new();
    let tags = registry.url("/v2/fixture/graph/tags/list");
    let challenge = client
        .get(&tags)
        .send()
        .await
        .expect("the registry answers");
    assert_eq!(challenge.status(), 401);
    let www = challenge
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        www.contains(&issuer.realm) && www.contains(oci::SERVICE),
        "{www}"
    );

    issuer.add_user(
        "fixture-expired",
        IssuerUser {
            lifetime_secs: -120,
            ..IssuerUser::full_access("pw")
        },
    );
    issuer.add_user(
        "fixture-other",
        IssuerUser::only("pw", "fixture/other", &["pull"]),
    );
    let token = |user: &'static str, password: &'static str| {
        let client = client.clone();
        let realm = issuer.realm.clone();
        async move {
            let url = format!(
                "{realm}?service={}&scope=repository:fixture/graph:pull",
                oci::SERVICE
            );
            let answer = client
                .get(&url)
                .header("authorization", basic(user, password))
                .send()
                .await
                .expect("the issuer answers");
            if answer.status() != 200 {
                return Err(answer.status());
            }
            let bytes = answer.bytes().await.expect("a body");
            let body: serde_json::Value = serde_json::from_slice(&bytes).expect("JSON");
            Ok(body["token"].as_str().expect("a token").to_owned())
        }
    };
    assert_eq!(
        token(USER, "wrong").await,
        Err(reqwest::StatusCode::UNAUTHORIZED)
    );
    let with = |token: String| {
        let request = client.get(&tags).bearer_auth(token);
        async move { request.send().await.expect("the registry answers").status() }
    };
    // The repository does not exist yet: 404 means the token was accepted.
    assert_eq!(
        with(token(USER, PASSWORD).await.expect("issued")).await,
        404
    );
    assert_eq!(
        with(token("fixture-expired", "pw").await.expect("issued")).await,
        401
    );
    assert_eq!(
        with(token("fixture-other", "pw").await.expect("issued")).await,
        401,
        "a token without the repository's scope is refused"
    );
    assert!(issuer.issued_to(USER) >= 1);
    assert!(
        issuer
            .requests()
            .iter()
            .any(|seen| seen.user.as_deref() == Some("fixture-other")
                && seen.scopes == ["repository:fixture/graph:pull"]),
        "the issuer logs who asked for which scope"
    );
}
