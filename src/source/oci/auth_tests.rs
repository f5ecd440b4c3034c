//! Unit tests of the registry token flow (`auth.rs`), kept beside it so the module reads as code.

use super::*;

fn at(text: &str) -> jiff::Timestamp {
    text.parse().expect("timestamp")
}

#[test]
fn bearer_challenges_of_real_registries_parse() {
    let distribution = r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:team/g:pull""#;
    assert_eq!(
        parse_challenges(distribution),
        vec![Challenge::Bearer {
            realm: "https://auth.example/token".into(),
            service: Some("registry.example".into()),
            scope: Some("repository:team/g:pull".into()),
            error: None,
        }]
    );
    let spaced = r#"bearer  Realm = "https://a/t" , service=svc, scope="repository:g:pull,push", error="invalid_token""#;
    let parsed = parse_challenges(spaced);
    let [
        Challenge::Bearer {
            realm,
            service,
            scope,
            error,
        },
    ] = parsed.as_slice()
    else {
        panic!("one bearer challenge expected");
    };
    assert_eq!(realm, "https://a/t");
    assert_eq!(service.as_deref(), Some("svc"));
    assert_eq!(scope.as_deref(), Some("repository:g:pull,push"));
    assert_eq!(error.as_deref(), Some("invalid_token"));
}

#[test]
fn several_challenges_escapes_and_unknown_schemes() {
    let header = r#"Negotiate abc==, Basic realm="Registry \"R\"", Bearer realm="https://t/x\\y""#;
    assert_eq!(
        parse_challenges(header),
        vec![
            Challenge::Basic,
            Challenge::Bearer {
                realm: "https://t/x\\y".into(),
                service: None,
                scope: None,
                error: None,
            },
        ]
    );
    // Bearer without a realm cannot be followed; garbage yields nothing and never panics.
    assert!(parse_challenges("Bearer").is_empty());
    assert!(parse_challenges("Bearer service=x").is_empty());
    for garbage in [
        "",
        ",,,",
        "=",
        "\"",
        "Bearer realm=\"unterminated",
        "Bearer realm=",
    ] {
        let _ = parse_challenges(garbage);
    }
    assert_eq!(
        parse_challenges("Bearer realm=\"unterminated"),
        vec![Challenge::Bearer {
            realm: "unterminated".into(),
            service: None,
            scope: None,
            error: None
        }]
    );
}

#[test]
fn token_lifetime_follows_expires_in_and_issued_at() {
    let now = at("2026-11-25T00:00:00Z");
    assert_eq!(token_lifetime(None, None, now), Duration::from_secs(60));
    assert_eq!(
        token_lifetime(Some(300), None, now),
        Duration::from_secs(300)
    );
    // Issued 100 s ago for 300 s: 200 s left.
    assert_eq!(
        token_lifetime(Some(300), Some(at("2026-11-24T23:58:20Z")), now),
        Duration::from_secs(200)
    );
    // Issued longer ago than it lasts: already ended.
    assert_eq!(
        token_lifetime(Some(60), Some(at("2026-11-24T23:00:00Z")), now),
        Duration::ZERO
    );
    // An issuer clock ahead of ours gains nothing; negative lifetimes end at once.
    assert_eq!(
        token_lifetime(Some(60), Some(at("2026-11-25T01:00:00Z")), now),
        Duration::from_secs(60)
    );
    assert_eq!(token_lifetime(Some(-5), None, now), Duration::ZERO);
}

#[test]
fn token_responses_parse_and_garbage_is_refused_without_echo() {
    let now = at("2026-11-25T00:00:00Z");
    let issued = parse_token_response(
        br#"{"token":"tok-secret","expires_in":120,"issued_at":"2026-11-24T23:59:30Z"}"#,
        now,
    )
    .expect("valid");
    assert_eq!(issued.token.expose_secret(), "tok-secret");
    assert_eq!(issued.lifetime, Duration::from_secs(90));
    let oauth = parse_token_response(br#"{"access_token":"a"}"#, now).expect("valid");
    assert_eq!(oauth.token.expose_secret(), "a");
    assert_eq!(oauth.lifetime, Duration::from_secs(60));
    for bad in [
        &b"not json tok-secret"[..],
        br#"{"token":""}"#,
        br#"{}"#,
        br#"{"token":"tok-secret","issued_at":"yesterday"}"#,
    ] {
        let problem = parse_token_response(bad, now).expect_err("invalid");
        assert!(!problem.contains("tok-secret"), "{problem}");
    }
}

fn issued(token: &str, seconds: u64) -> IssuedToken {
    IssuedToken {
        token: BearerToken::new(token),
        lifetime: Duration::from_secs(seconds),
    }
}

fn key(scope: &str, credentials: &RegistryCredentials) -> TokenKey {
    TokenKey {
        registry: "registry.example".into(),
        scope: scope.into(),
        credentials: credentials.fingerprint(),
    }
}

#[test]
fn cached_tokens_expire_before_their_end_and_are_kept_per_scope_and_credentials() {
    let cache = TokenCache::default();
    let alice = RegistryCredentials::basic("alice", "pw-a");
    let bob = RegistryCredentials::basic("bob", "pw-b");
    let start = Instant::now();
    cache.insert(key("repository:g:pull", &alice), &issued("t1", 60), start);
    let get = |scope, credentials, after| {
        cache
            .get(&key(scope, credentials), start + Duration::from_secs(after))
            .map(|token| token.expose_secret().to_owned())
    };
    assert_eq!(get("repository:g:pull", &alice, 0), Some("t1".into()));
    // 60 s token, 10 s margin: used for 50 s.
    assert_eq!(get("repository:g:pull", &alice, 49), Some("t1".into()));
    assert_eq!(get("repository:g:pull", &bob, 1), None);
    assert_eq!(get("repository:other:pull", &alice, 1), None);
    assert_eq!(get("repository:g:pull", &alice, 50), None);
    // The ended entry was dropped.
    assert_eq!(cache.lock().len(), 0);
    // A short token keeps half its life; an ended one is not cached at all.
    cache.insert(key("s", &alice), &issued("short", 4), start);
    assert_eq!(get("s", &alice, 1), Some("short".into()));
    assert_eq!(get("s", &alice, 2), None);
    cache.insert(key("s", &alice), &issued("ended", 0), start);
    assert_eq!(get("s", &alice, 0), None);
    // Nothing is cached for more than an hour whatever the token says.
    cache.insert(key("long", &alice), &issued("long", 86_400), start);
    assert_eq!(get("long", &alice, 3_580), Some("long".into()));
    assert_eq!(get("long", &alice, 3_600), None);
}

#[test]
fn the_cache_stays_bounded() {
    let cache = TokenCache::default();
    let start = Instant::now();
    for index in 0..(MAX_CACHED_TOKENS + 10) {
        let scope = format!("repository:g{index}:pull");
        cache.insert(
            key(&scope, &RegistryCredentials::Anonymous),
            &issued("t", 60),
            start,
        );
    }
    assert!(cache.lock().len() <= MAX_CACHED_TOKENS);
}

#[test]
fn docker_config_entries_by_auth_or_username_and_password() {
    let auth = BASE64.encode("robot$ci:pa:ss");
    let config = format!(
        r#"{{"auths":{{"https://Registry.Example:5000/v1/":{{"auth":"{auth}"}},
               "other.example":{{"username":"u","password":"p"}}}}}}"#
    );
    assert_eq!(
        RegistryCredentials::from_docker_config(config.as_bytes(), "registry.example:5000"),
        Ok(RegistryCredentials::basic("robot$ci", "pa:ss"))
    );
    assert_eq!(
        RegistryCredentials::from_docker_config(config.as_bytes(), "other.example"),
        Ok(RegistryCredentials::basic("u", "p"))
    );
    let missing = RegistryCredentials::from_docker_config(config.as_bytes(), "registry.example")
        .expect_err("port differs");
    assert!(missing.0.contains("no entry"), "{missing}");
}

#[test]
fn broken_docker_configs_are_refused_without_quoting_secrets() {
    let not_base64 = r#"{"auths":{"r.example":{"auth":"%%secret%%"}}}"#;
    let no_colon = format!(
        r#"{{"auths":{{"r.example":{{"auth":"{}"}}}}}}"#,
        BASE64.encode("secretnocolon")
    );
    let nothing = r#"{"auths":{"r.example":{"email":"secret@x"}}}"#;
    let not_json = "secret garbage";
    for config in [not_base64, no_colon.as_str(), nothing, not_json] {
        let error = RegistryCredentials::from_docker_config(config.as_bytes(), "r.example")
            .expect_err(config);
        assert!(!error.0.contains("secret"), "{error}");
    }
}

#[test]
fn credentials_never_print_and_fingerprints_differ() {
    let basic = RegistryCredentials::basic("alice", "hunter2");
    let token = RegistryCredentials::Token(BearerToken::new("tok-hunter3"));
    let shown = format!("{basic:?} {token:?}");
    assert!(!shown.contains("hunter"), "{shown}");
    assert_ne!(basic.fingerprint(), token.fingerprint());
    assert_ne!(
        basic.fingerprint(),
        RegistryCredentials::basic("alice", "other").fingerprint()
    );
    let header = basic.basic_header().expect("valid").expect("basic");
    assert!(header.is_sensitive());
    assert_eq!(
        header.to_str().ok(),
        Some(format!("Basic {}", BASE64.encode("alice:hunter2")).as_str())
    );
    assert_eq!(RegistryCredentials::Anonymous.basic_header(), Ok(None));
}
