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

fn sample(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples/graphs")
        .join(name)
}

/// Runs `raypipe ARGS` with `stdin` and its own Docker config directory; (exit code, stdout,
/// stderr).
fn raypipe(args: &[&str], stdin: &str, docker_config: &std::path::Path) -> (i32, Vec<u8>, String) {
    raypipe_with_path(args, stdin, docker_config, None)
}

/// [`raypipe`] with `extra_path` in front of `PATH` (where test credential helpers live).
fn raypipe_with_path(
    args: &[&str],
    stdin: &str,
    docker_config: &std::path::Path,
    extra_path: Option<&std::path::Path>,
) -> (i32, Vec<u8>, String) {
    use std::io::Write as _;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_raypipe"));
    if let Some(dir) = extra_path {
        let mut paths = vec![dir.to_owned()];
        paths.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        command.env("PATH", std::env::join_paths(paths).expect("PATH"));
    }
    let mut child = command
        .args(args)
        .env("DOCKER_CONFIG", docker_config)
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("raypipe runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let output = child.wait_with_output().expect("raypipe ends");
    (
        output.status.code().unwrap_or(-1),
        output.stdout,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_owned()
}

fn write_docker_config(dir: &std::path::Path, host: &str, user: &str, password: &str) {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let config = serde_json::json!({"auths": {host: {"auth": auth}}});
    std::fs::write(dir.join("config.json"), config.to_string()).expect("write config.json");
}

/// Push (YAML in), then pull by tag and by digest: the bytes are the graph's protobuf
/// encoding, and the printed digest is the manifest's.
fn round_trip(host: &str, repository: &str, login: &[&str], stdin: &str, docker: &std::path::Path) {
    round_trip_with_path(host, repository, login, stdin, docker, None);
}

/// [`round_trip`] with `extra_path` in front of `PATH`.
fn round_trip_with_path(
    host: &str,
    repository: &str,
    login: &[&str],
    stdin: &str,
    docker: &std::path::Path,
    extra_path: Option<&std::path::Path>,
) {
    let raypipe = |args: &[&str], stdin: &str, docker: &std::path::Path| {
        raypipe_with_path(args, stdin, docker, extra_path)
    };
    let reference = format!("{host}/{repository}:v1");
    let yaml = sample("ensemble.yaml");
    let mut push = vec![
        "dag",
        "push",
        yaml.to_str().expect("utf-8"),
        &reference,
        "--plain-http",
    ];
    push.extend_from_slice(login);
    let (code, out, err) = raypipe(&push, stdin, docker);
    assert_eq!(code, 0, "{err}");
    let digest = text(&out);
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    assert!(err.contains("manifest sha256:"), "{err}");

    let expected = std::fs::read(sample("ensemble.pb")).expect("the sample protobuf");
    let mut pull = vec!["dag", "pull", &reference, "--plain-http"];
    pull.extend_from_slice(login);
    let (code, out, err) = raypipe(&pull, stdin, docker);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, expected, "pulled by tag: the graph's protobuf");

    let by_digest = format!("{host}/{repository}@{digest}");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("pulled.yaml");
    let mut pull = vec![
        "dag",
        "pull",
        &by_digest,
        "--plain-http",
        "--format",
        "yaml",
        "-o",
        file.to_str().expect("utf-8"),
    ];
    pull.extend_from_slice(login);
    let (code, _, err) = raypipe(&pull, stdin, docker);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&digest), "{err}");
    let pulled = std::fs::read_to_string(&file).expect("written");
    assert!(pulled.contains("ensemble"), "{pulled}");

    // The same graph again: same manifest digest, both blobs already there.
    let mut push = vec![
        "dag",
        "push",
        yaml.to_str().expect("utf-8"),
        &reference,
        "--plain-http",
    ];
    push.extend_from_slice(login);
    let (code, out, err) = raypipe(&push, stdin, docker);
    assert_eq!((code, text(&out)), (0, digest), "{err}");
    assert!(err.contains("2 of 2 blobs already there"), "{err}");
}

#[test]
fn push_and_pull_with_basic_auth_from_the_command_line() {
    let registry = oci::basic_registry();
    let docker = tempfile::tempdir().expect("tempdir");
    round_trip(
        &registry.host,
        "cli/basic",
        &["--username", USER, "--password-stdin"],
        &format!("{PASSWORD}\n"),
        docker.path(),
    );
    // A wrong password is refused, naming the registry, and never printed.
    let reference = registry.reference("cli/basic:v1");
    let (code, _, err) = raypipe(
        &[
            "dag",
            "pull",
            &reference,
            "--plain-http",
            "--username",
            USER,
            "--password-stdin",
        ],
        "not-the-password",
        docker.path(),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&registry.host) && !err.contains("not-the-password"),
        "{err}"
    );
}

#[test]
fn push_and_pull_through_the_token_flow_with_docker_config_credentials() {
    let oci::TokenRegistry { registry, issuer } = oci::token_registry();
    let docker = tempfile::tempdir().expect("tempdir");
    write_docker_config(docker.path(), &registry.host, USER, PASSWORD);
    let before = issuer.issued_to(USER);
    round_trip(&registry.host, "cli/token", &[], "", docker.path());
    assert!(
        issuer.issued_to(USER) > before,
        "tokens came from the issuer"
    );

    // Pull-only credentials cannot push.
    issuer.add_user("cli-reader", IssuerUser::only("pw", "cli/token", &["pull"]));
    write_docker_config(docker.path(), &registry.host, "cli-reader", "pw");
    let yaml = sample("ensemble-v2.yaml");
    let reference = registry.reference("cli/token:v2");
    let (code, _, err) = raypipe(
        &[
            "dag",
            "push",
            yaml.to_str().expect("utf-8"),
            &reference,
            "--plain-http",
        ],
        "",
        docker.path(),
    );
    assert_eq!(code, 2, "{err}");
    let (code, out, err) = raypipe(
        &[
            "dag",
            "pull",
            &registry.reference("cli/token:v1"),
            "--plain-http",
        ],
        "",
        docker.path(),
    );
    assert_eq!(code, 0, "{err}");
    assert!(!out.is_empty());
}

#[test]
fn push_refuses_an_invalid_graph_and_sends_nothing() {
    let registry = oci::basic_registry();
    let docker = tempfile::tempdir().expect("tempdir");
    write_docker_config(docker.path(), &registry.host, USER, PASSWORD);
    let dir = tempfile::tempdir().expect("tempdir");
    let invalid = dir.path().join("dangling-edge.yaml");
    let text_of = std::fs::read_to_string(sample("ensemble.yaml")).expect("sample");
    // An edge to a node that does not exist.
    std::fs::write(
        &invalid,
        text_of.replace("target: combine", "target: nowhere"),
    )
    .expect("write");
    let reference = registry.reference("cli/invalid:v1");
    let (code, _, err) = raypipe(
        &[
            "dag",
            "push",
            invalid.to_str().expect("utf-8"),
            &reference,
            "--plain-http",
        ],
        "",
        docker.path(),
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("nothing pushed"), "{err}");
    let (code, _, err) = raypipe(
        &["dag", "pull", &reference, "--plain-http"],
        "",
        docker.path(),
    );
    assert_eq!(code, 2, "the tag was never created: {err}");
    assert!(
        err.contains("TagNotFound") || err.contains("no tag"),
        "{err}"
    );
}

/// The dev registry (embedded OCI): push and pull round trip with its token as the Basic
/// password, and a blob whose bytes do not match its digest is refused on pull.
#[tokio::test]
async fn the_dev_registry_takes_pushes_and_pull_checks_the_graph_digest() {
    let registry = raypipe::devenv::registry::Registry::http("127.0.0.1", Some("dev-token")).await;
    let host = registry.addr.to_string();
    let docker = tempfile::tempdir().expect("tempdir");
    write_docker_config(docker.path(), &host, "anyone", "dev-token");
    let docker_path = docker.path().to_owned();
    let host_for_push = host.clone();
    tokio::task::spawn_blocking(move || {
        round_trip(&host_for_push, "dev/ensemble", &[], "", &docker_path)
    })
    .await
    .expect("round trip");

    let graph = std::fs::read(sample("ensemble.pb")).expect("sample");
    let graph_digest = format!("sha256:{}", raypipe::devenv::registry::sha256_hex(&graph));
    registry.put(
        &format!("v2/dev/ensemble/blobs/{graph_digest}"),
        b"tampered".to_vec(),
    );
    let docker_path = docker.path().to_owned();
    let reference = format!("{host}/dev/ensemble:v1");
    let (code, _, err) = tokio::task::spawn_blocking(move || {
        raypipe(
            &["dag", "pull", &reference, "--plain-http"],
            "",
            &docker_path,
        )
    })
    .await
    .expect("pull");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("digest"), "{err}");
}

/// `docker login` to ACR, GCR or Docker Desktop stores an identity token (an OAuth2 refresh
/// token) rather than a password: the `auth` is a placeholder user with an empty password.
/// `dag push`/`pull` exchange it at the realm (`POST`, `grant_type=refresh_token`); before
/// they did, they sent the placeholder and got a 401.
#[test]
fn push_and_pull_with_an_identity_token_from_docker_config() {
    use base64::Engine as _;
    let oci::TokenRegistry { registry, issuer } = oci::token_registry();
    const REFRESH: &str = "refresh-3c1f0a9e-identity";
    issuer.add_user("cli-identity", IssuerUser::full_access("not-used-here"));
    issuer.add_refresh_token(REFRESH, "cli-identity");
    let docker = tempfile::tempdir().expect("tempdir");
    let placeholder =
        base64::engine::general_purpose::STANDARD.encode("00000000-0000-0000-0000-000000000000:");
    let write = |token: &str| {
        let config = serde_json::json!({"auths": {registry.host.as_str(): {
            "auth": placeholder, "identitytoken": token}}});
        std::fs::write(docker.path().join("config.json"), config.to_string()).expect("write");
    };
    write(REFRESH);
    round_trip(&registry.host, "cli/identity", &[], "", docker.path());
    let refreshed = issuer
        .requests()
        .iter()
        .filter(|seen| {
            seen.issued
                && seen.grant.as_deref() == Some("refresh_token")
                && seen.user.as_deref() == Some("cli-identity")
        })
        .count();
    assert!(refreshed > 0, "tokens came from the refresh-token grant");

    // A revoked identity token is refused by the realm, and never printed.
    write("refresh-revoked-secret");
    let (code, _, err) = raypipe(
        &[
            "dag",
            "pull",
            &registry.reference("cli/identity:v1"),
            "--plain-http",
        ],
        "",
        docker.path(),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&registry.host) && err.contains("refused") && !err.contains("revoked-secret"),
        "{err}"
    );
}

/// A `docker-credential-<name>` helper for the tests: answers `get` for `server` with `answer`
/// (raw JSON), records every server it was asked about in `asked.log`, and says "not found"
/// (as real helpers do) for any other server.
fn credential_helper(dir: &std::path::Path, name: &str, server: &str, answer: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(format!("docker-credential-{name}"));
    let log = dir.join("asked.log");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n[ \"$1\" = get ] || exit 3\nread -r server\n\
             printf '%s\\n' \"$server\" >> '{}'\n\
             if [ \"$server\" = '{server}' ]; then printf '%s' '{answer}'; exit 0; fi\n\
             echo 'credentials not found in native keychain'; exit 1\n",
            log.display()
        ),
    )
    .expect("write the helper");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Docker Desktop, `pass`, `secretservice`, ECR and GCR logins keep credentials in helpers:
/// `credsStore` (every registry) and `credHelpers` (one registry) name them. The real code
/// path runs the helper program; the helper protocol is the boundary.
#[test]
fn credential_helpers_named_by_the_docker_config_are_run() {
    let basic = oci::basic_registry();
    let oci::TokenRegistry { registry, issuer } = oci::token_registry();
    const REFRESH: &str = "refresh-9d2e-from-a-helper";
    issuer.add_user("cli-helper", IssuerUser::full_access("not-used-here"));
    issuer.add_refresh_token(REFRESH, "cli-helper");
    let helpers = tempfile::tempdir().expect("tempdir");
    // The store holds a password for the htpasswd registry; a per-registry helper holds an
    // identity token for the token registry.
    credential_helper(
        helpers.path(),
        "raypipe-store",
        &basic.host,
        &format!(
            r#"{{"ServerURL":"{}","Username":"{USER}","Secret":"{PASSWORD}"}}"#,
            basic.host
        ),
    );
    credential_helper(
        helpers.path(),
        "raypipe-token",
        &registry.host,
        &format!(
            r#"{{"ServerURL":"{}","Username":"<token>","Secret":"{REFRESH}"}}"#,
            registry.host
        ),
    );
    let docker = tempfile::tempdir().expect("tempdir");
    let config = serde_json::json!({
        // Placeholders, as Docker leaves them beside a store: never read.
        "auths": {basic.host.as_str(): {}, registry.host.as_str(): {}},
        "credsStore": "raypipe-store",
        "credHelpers": {registry.host.as_str(): "raypipe-token"},
    });
    std::fs::write(docker.path().join("config.json"), config.to_string()).expect("write");

    round_trip_with_path(
        &basic.host,
        "cli/helper-store",
        &[],
        "",
        docker.path(),
        Some(helpers.path()),
    );
    round_trip_with_path(
        &registry.host,
        "cli/helper-token",
        &[],
        "",
        docker.path(),
        Some(helpers.path()),
    );
    let asked = std::fs::read_to_string(helpers.path().join("asked.log")).expect("asked");
    assert!(
        asked.lines().any(|l| l == basic.host) && asked.lines().any(|l| l == registry.host),
        "each helper was asked for its registry: {asked}"
    );
    assert!(
        issuer.requests().iter().any(|seen| seen.issued
            && seen.grant.as_deref() == Some("refresh_token")
            && seen.user.as_deref() == Some("cli-helper")),
        "the helper's identity token was exchanged"
    );

    // A store that has nothing for the registry: a note, then anonymous, which the registry
    // refuses.
    let nothing = serde_json::json!({"credsStore": "raypipe-token"});
    std::fs::write(docker.path().join("config.json"), nothing.to_string()).expect("write");
    let reference = basic.reference("cli/helper-store:v1");
    let (code, _, err) = raypipe_with_path(
        &["dag", "pull", &reference, "--plain-http"],
        "",
        docker.path(),
        Some(helpers.path()),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("docker-credential-raypipe-token holds no credentials"),
        "{err}"
    );

    // A helper that is not installed is an error naming it; nothing is sent anonymously.
    let missing = serde_json::json!({"credHelpers": {basic.host.as_str(): "raypipe-absent"}});
    std::fs::write(docker.path().join("config.json"), missing.to_string()).expect("write");
    let yaml = sample("ensemble.yaml");
    let (code, _, err) = raypipe_with_path(
        &[
            "dag",
            "push",
            yaml.to_str().expect("utf-8"),
            &basic.reference("cli/helper-absent:v1"),
            "--plain-http",
        ],
        "",
        docker.path(),
        Some(helpers.path()),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("docker-credential-raypipe-absent")
            && err.contains("credHelpers")
            && err.contains("not installed"),
        "{err}"
    );
    for secret in [PASSWORD, REFRESH] {
        assert!(!err.contains(secret), "{err}");
    }
}
