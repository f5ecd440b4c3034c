//! The Ray dashboard client against a real Ray head (from PyPI, on 127.0.0.1): Serve deploy →
//! statuses → requests → in-place update, Ray's errors for broken configs, Serve shutdown, jobs
//! from submission to logs, stop and delete, and token authentication.
//!
//! On the newest Ray the support matrix claims (2.60) the tests share one head
//! (`support::ray_head`); Serve tests take turns on it because a PUT replaces the head's whole
//! Serve config. On the oldest (2.52), `the_dashboard_client_works_on_the_oldest_ray` runs the
//! same checks in sequence on a head of its own, stopped when it ends.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use raypipe::devenv::ray::{RAY_VERSION_OLDEST, RayHead, RayHeadOptions};
use raypipe::ray::{
    ApplicationStatus, BearerToken, DashboardClient, DashboardClientOptions, DashboardError,
    DeploymentStatus, JobStatus, JobSubmitRequest, RayDashboardClient, ReplicaState,
    ServeInstanceDetails, serve_config_yaml_to_json,
};
use serde_json::json;

use crate::support;

/// The first PUT on a head starts Serve before answering (~5 s on an idle 2-core machine);
/// tests allow for a busy machine.
const SERVE_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Build + replica start-up of a small application, on a machine busy with other tests.
const DEPLOY_TIMEOUT: Duration = Duration::from_secs(180);
const JOB_TIMEOUT: Duration = Duration::from_secs(120);

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

fn serve_client(head: &RayHead) -> RayDashboardClient {
    head.client(SERVE_CALL_TIMEOUT).expect("a dashboard client")
}

/// A Serve config for one echo application, written as a RayService's `serveConfigV2` would be.
fn echo_config(
    head: &RayHead,
    app: &str,
    greeting: &str,
    startup_delay_s: f64,
) -> serde_json::Value {
    let yaml = format!(
        r#"
proxy_location: HeadOnly
applications:
  - name: {app}
    route_prefix: /{app}
    import_path: raypipe_echo:build
    args:
      greeting: {greeting}
      startup_delay_s: {startup_delay_s}
    deployments:
      - name: Echo
        num_replicas: 1
        ray_actor_options:
          num_cpus: 0.05
"#
    );
    let mut config = serve_config_yaml_to_json(&yaml).expect("the YAML config converts");
    head.bind_serve_to_loopback(&mut config);
    config
}

/// Polls the application until it is RUNNING or failed; returns the statuses seen, in order
/// (repeats collapsed), and the last answer.
async fn watch_application(
    client: &RayDashboardClient,
    app: &str,
) -> (Vec<ApplicationStatus>, ServeInstanceDetails) {
    let deadline = Instant::now() + DEPLOY_TIMEOUT;
    let mut seen: Vec<ApplicationStatus> = Vec::new();
    loop {
        let details = client
            .get_serve_applications()
            .await
            .expect("GET serve applications");
        if let Some(status) = details.applications.get(app).and_then(|a| a.status.clone()) {
            if seen.last() != Some(&status) {
                seen.push(status.clone());
            }
            if status == ApplicationStatus::Running || status.is_failed() {
                return (seen, details);
            }
        }
        assert!(
            Instant::now() < deadline,
            "application {app} did not settle within {DEPLOY_TIMEOUT:?}; statuses so far {seen:?}, last answer {details:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Listening addresses of the head's processes that are not loopback (there must be none).
fn exposed_listeners(head: &RayHead) -> Vec<std::net::SocketAddr> {
    let listeners = head.listening_addresses();
    assert!(
        listeners.iter().any(|a| a.port() == head.ports().dashboard),
        "the dashboard should be among the head's listeners: {listeners:?}"
    );
    listeners
        .into_iter()
        .filter(|address| match address.ip() {
            std::net::IpAddr::V4(ip) => !ip.is_loopback(),
            std::net::IpAddr::V6(ip) => {
                !(ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()))
            }
        })
        .collect()
}

/// POSTs to the Serve proxy until the route answers 200; returns the JSON body.
async fn call_serve(head: &RayHead, path: &str, body: &str) -> serde_json::Value {
    support::fixture::serve_post(head, path, body, Duration::from_secs(60), |_| true).await
}

#[tokio::test]
async fn serve_application_deploys_runs_answers_and_updates_in_place() {
    let _serve = support::ray_serve_lock().await;
    serve_deploys_runs_answers_and_updates(support::ray_head()).await;
}

async fn serve_deploys_runs_answers_and_updates(head: &RayHead) {
    let client = serve_client(head);
    let app = unique("echo");

    // A slow constructor keeps the application DEPLOYING for a few seconds.
    let config = echo_config(head, &app, "hello", 3.0);
    client
        .put_serve_applications(&config)
        .await
        .expect("PUT the config");
    let (statuses, details) = watch_application(&client, &app).await;
    assert_eq!(
        statuses.first(),
        Some(&ApplicationStatus::Deploying),
        "first status after the PUT: {statuses:?}"
    );
    assert_eq!(
        statuses.last(),
        Some(&ApplicationStatus::Running),
        "{statuses:?}: {details:?}"
    );
    assert!(details.all_applications_running());

    let application = &details.applications[&app];
    assert_eq!(
        application.route_prefix.as_deref(),
        Some(format!("/{app}").as_str())
    );
    assert_eq!(application.source.as_deref(), Some("declarative"));
    assert!(application.last_deployed_time_s.is_some());
    assert_eq!(application.message.as_deref(), Some(""));
    let deployment = &application.deployments["Echo"];
    assert_eq!(
        deployment.status,
        Some(DeploymentStatus::Healthy),
        "{deployment:?}"
    );
    assert_eq!(deployment.target_num_replicas, Some(1));
    assert_eq!(deployment.required_resources.get("CPU"), Some(&0.05));
    assert_eq!(deployment.replicas.len(), 1, "{deployment:?}");
    assert_eq!(deployment.replicas[0].state, Some(ReplicaState::Running));
    let http_options = details.http_options.as_ref().expect("http_options");
    assert_eq!(http_options.host.as_deref(), Some("127.0.0.1"));
    assert_eq!(http_options.port, Some(head.ports().serve_http));

    let answer = call_serve(head, &format!("/{app}/x"), "ping").await;
    assert_eq!(
        answer,
        json!({"greeting": "hello", "path": format!("/{app}/x"), "body": "ping"})
    );

    // A user_config change is applied in place: same replica, new value, still RUNNING.
    let replica_id = deployment.replicas[0].replica_id.clone();
    let mut updated = config.clone();
    updated["applications"][0]["deployments"][0]["user_config"] = json!({"greeting": "updated"});
    client
        .put_serve_applications(&updated)
        .await
        .expect("PUT the updated config");
    support::eventually(
        Duration::from_secs(60),
        "the new greeting to be served",
        || async {
            let answer = call_serve(head, &format!("/{app}/y"), "").await;
            (answer["greeting"] == "updated").then_some(())
        },
    )
    .await;
    // The new user_config answers before Ray reports the application RUNNING again.
    let details = support::eventually(
        Duration::from_secs(120),
        "the application to be RUNNING after the update",
        || async {
            let details = client.get_serve_applications().await.ok()?;
            (details.applications.get(&app)?.status == Some(ApplicationStatus::Running))
                .then_some(details)
        },
    )
    .await;
    let application = &details.applications[&app];
    assert_eq!(application.status, Some(ApplicationStatus::Running));
    assert_eq!(
        application.deployments["Echo"].replicas[0].replica_id,
        replica_id
    );

    let version = client.get_version().await.expect("GET version");
    assert_eq!(version.ray_version.as_deref(), Some(head.ray_version()));
    assert_eq!(version.version.as_deref(), Some("4"));
}

#[tokio::test]
async fn broken_serve_configs_are_reported_in_rays_words() {
    let _serve = support::ray_serve_lock().await;
    broken_serve_configs_are_reported(support::ray_head()).await;
}

async fn broken_serve_configs_are_reported(head: &RayHead) {
    let client = serve_client(head);

    // Rejected by validation: HTTP 400 with pydantic's text (2.60: "1 validation error for
    // ServeDeploySchema …"; 2.52: "ValidationError(model='ServeDeploySchema', …)").
    let mut invalid = json!({"applications": [{"name": "bad", "import_path": "nocolon"}]});
    head.bind_serve_to_loopback(&mut invalid);
    let error = client
        .put_serve_applications(&invalid)
        .await
        .expect_err("an invalid import path");
    match &error {
        DashboardError::Status {
            status,
            body,
            endpoint,
        } => {
            assert_eq!(status.as_u16(), 400, "{error}");
            assert!(body.contains("ServeDeploySchema"), "{body}");
            assert!(body.contains("invalid import path \"nocolon\""), "{body}");
            assert!(
                endpoint.starts_with("PUT http://127.0.0.1:")
                    && endpoint.ends_with("/api/serve/applications/")
            );
        }
        other => panic!("expected an HTTP status error, got {other:?}"),
    }

    // A local working_dir is refused too (hence PYTHONPATH for the test apps).
    let mut local_dir = json!({"applications": [{"name": "local", "import_path": "raypipe_echo:app",
        "runtime_env": {"working_dir": support::ray_test_apps_dir()}}]});
    head.bind_serve_to_loopback(&mut local_dir);
    let error = client
        .put_serve_applications(&local_dir)
        .await
        .expect_err("a local working_dir");
    assert_eq!(error.status().map(|s| s.as_u16()), Some(400), "{error}");
    assert!(error.to_string().contains("working_dir"), "{error}");

    // Accepted, then fails to build: DEPLOY_FAILED with the Python error as the message.
    let app = unique("missing-module");
    let mut missing = json!({"applications": [{"name": app, "route_prefix": "/missing", "import_path": "raypipe_no_such_module:app"}]});
    head.bind_serve_to_loopback(&mut missing);
    client
        .put_serve_applications(&missing)
        .await
        .expect("the PUT itself is accepted");
    let (statuses, details) = watch_application(&client, &app).await;
    assert_eq!(
        statuses.last(),
        Some(&ApplicationStatus::DeployFailed),
        "{statuses:?}"
    );
    let message = details.applications[&app]
        .message
        .clone()
        .unwrap_or_default();
    assert!(
        message.contains("No module named 'raypipe_no_such_module'"),
        "{message}"
    );
    assert!(!details.all_applications_running());
}

#[tokio::test]
async fn deleting_serve_applications_shuts_serve_down() {
    let _serve = support::ray_serve_lock().await;
    deleting_applications_shuts_serve_down(support::ray_head()).await;
}

async fn deleting_applications_shuts_serve_down(head: &RayHead) {
    let client = serve_client(head);
    let app = unique("short-lived");
    client
        .put_serve_applications(&echo_config(head, &app, "bye", 0.0))
        .await
        .expect("PUT the config");
    let (statuses, _) = watch_application(&client, &app).await;
    assert_eq!(
        statuses.last(),
        Some(&ApplicationStatus::Running),
        "{statuses:?}"
    );

    client
        .delete_serve_applications()
        .await
        .expect("DELETE serve applications");
    let details = support::eventually(Duration::from_secs(60), "Serve to shut down", || async {
        let details = client.get_serve_applications().await.ok()?;
        details.applications.is_empty().then_some(details)
    })
    .await;
    assert!(!details.all_applications_running());
}

async fn wait_for_job(
    client: &RayDashboardClient,
    id: &str,
    done: impl Fn(&JobStatus) -> bool,
) -> raypipe::ray::JobDetails {
    let deadline = Instant::now() + JOB_TIMEOUT;
    loop {
        let job = client.get_job(id).await.expect("GET job");
        if job.status.as_ref().is_some_and(&done) {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} did not get there within {JOB_TIMEOUT:?}: {job:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_job_runs_to_success_and_its_logs_can_be_read() {
    job_runs_to_success_with_logs(support::ray_head()).await;
}

async fn job_runs_to_success_with_logs(head: &RayHead) {
    let client = head
        .client(Duration::from_secs(30))
        .expect("a dashboard client");
    let id = unique("raypipe-hello");
    let request =
        JobSubmitRequest::new("python -c \"print('hello from raypipe')\"").with_submission_id(&id);
    assert_eq!(client.submit_job(&request).await.expect("submit"), id);

    let job = wait_for_job(&client, &id, JobStatus::is_terminal).await;
    assert_eq!(job.status, Some(JobStatus::Succeeded), "{job:?}");
    assert_eq!(job.submission_id.as_deref(), Some(id.as_str()));
    assert_eq!(job.driver_exit_code, Some(0));
    assert!(
        job.start_time.is_some() && job.end_time >= job.start_time,
        "{job:?}"
    );
    let logs = client.get_job_logs(&id).await.expect("logs");
    assert!(logs.contains("hello from raypipe"), "{logs}");
    let listed = client.list_jobs().await.expect("list");
    assert!(
        listed
            .iter()
            .any(|j| j.submission_id.as_deref() == Some(id.as_str()))
    );

    // Submitting the same id again is recognised, so a retrying controller can move on.
    let again = client
        .submit_job(&request)
        .await
        .expect_err("the id is taken");
    assert!(
        matches!(&again, DashboardError::JobAlreadyExists { submission_id, .. } if *submission_id == id),
        "{again:?}"
    );

    assert!(client.delete_job(&id).await.expect("delete"));
    let gone = client.get_job(&id).await.expect_err("deleted");
    assert!(gone.is_not_found(), "{gone:?}");
}

#[tokio::test]
async fn a_running_job_can_be_stopped_then_deleted() {
    running_job_is_stopped_then_deleted(support::ray_head()).await;
}

async fn running_job_is_stopped_then_deleted(head: &RayHead) {
    let client = head
        .client(Duration::from_secs(30))
        .expect("a dashboard client");
    let id = unique("raypipe-sleep");
    let request = JobSubmitRequest::new(
        "python -c \"import time; print('sleeping', flush=True); time.sleep(600)\"",
    )
    .with_submission_id(&id);
    client.submit_job(&request).await.expect("submit");
    wait_for_job(&client, &id, |s| *s == JobStatus::Running).await;

    // A running job cannot be deleted; Ray says why.
    let refused = client.delete_job(&id).await.expect_err("still running");
    assert_eq!(refused.status().map(|s| s.as_u16()), Some(500), "{refused}");

    assert!(
        client.stop_job(&id).await.expect("stop"),
        "a stop signal was sent"
    );
    let job = wait_for_job(&client, &id, JobStatus::is_terminal).await;
    assert_eq!(job.status, Some(JobStatus::Stopped), "{job:?}");
    assert!(
        !client.stop_job(&id).await.expect("stop again"),
        "nothing left to stop"
    );
    assert!(client.delete_job(&id).await.expect("delete"));
    assert!(
        client
            .get_job(&id)
            .await
            .expect_err("deleted")
            .is_not_found()
    );
}

#[tokio::test]
async fn a_head_with_token_auth_needs_the_token_and_stops_by_its_own_pids() {
    token_auth_is_enforced_and_a_head_stops_by_its_own_pids(support::ray_head()).await;
}

/// `shared` runs first, so stopping the second head (of the same Ray) can be seen to leave it
/// alone.
async fn token_auth_is_enforced_and_a_head_stops_by_its_own_pids(shared: &RayHead) {
    let token = BearerToken::new(unique("raypipe-token")).expect("a token");
    let secured = RayHead::start(RayHeadOptions {
        auth_token: Some(token.clone()),
        ray_version: shared.ray_version(),
        ..Default::default()
    })
    .await
    .expect("a second head with token auth");

    let options = |bearer_token: Option<BearerToken>| DashboardClientOptions {
        bearer_token,
        ..Default::default()
    };
    let anonymous =
        RayDashboardClient::new(secured.dashboard_url().clone(), options(None)).expect("client");
    let missing = anonymous
        .get_serve_applications()
        .await
        .expect_err("no token");
    assert_eq!(missing.status().map(|s| s.as_u16()), Some(401), "{missing}");
    assert!(
        missing.to_string().contains("Missing authentication token"),
        "{missing}"
    );

    let wrong_token = BearerToken::new("not-the-token").expect("a token");
    let impostor =
        RayDashboardClient::new(secured.dashboard_url().clone(), options(Some(wrong_token)))
            .expect("client");
    let forbidden = impostor.list_jobs().await.expect_err("wrong token");
    assert_eq!(
        forbidden.status().map(|s| s.as_u16()),
        Some(403),
        "{forbidden}"
    );
    assert!(
        !forbidden.to_string().contains("not-the-token")
            && !format!("{forbidden:?}").contains("not-the-token")
    );

    // Through the trait object, as a controller would hold it.
    let authorised: Box<dyn DashboardClient> = Box::new(
        RayDashboardClient::new(
            secured.dashboard_url().clone(),
            options(Some(token.clone())),
        )
        .expect("client"),
    );
    let version = authorised
        .get_version()
        .await
        .expect("version with the token");
    assert_eq!(version.ray_version.as_deref(), Some(shared.ray_version()));
    authorised.list_jobs().await.expect("jobs with the token");
    assert!(!format!("{secured:?}").contains(token.expose_secret()));
    // The console's dashboard front reaches this head with Ray's token (issue 35 item 3).
    crate::console::the_dashboard_front_forwards_rays_token(&secured, &token).await;

    assert_eq!(exposed_listeners(&secured), Vec::new());
    let pids = secured.pids();
    assert!(
        pids.len() > 5,
        "a head runs GCS, raylet, dashboard, agents…: {pids:?}"
    );
    let shared_pids = shared.pids();
    assert!(
        pids.iter().all(|pid| !shared_pids.contains(pid)),
        "{pids:?} vs {shared_pids:?}"
    );
    let dir = secured.dir().to_path_buf();
    drop(secured);
    let alive: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| !stat.contains(") Z "))
        })
        .collect();
    assert!(
        alive.is_empty(),
        "processes of the stopped head still alive: {alive:?}"
    );
    assert!(!dir.exists(), "{} was not removed", dir.display());
    let shared_client = shared.client(Duration::from_secs(10)).expect("client");
    shared_client
        .get_version()
        .await
        .expect("the shared head still answers");
}

/// The oldest Ray the support matrix claims (README, "What runs where"; the samples'
/// `rayproject/ray:2.52.0`): every check above, in sequence, on one head of that version (and a
/// second one for token authentication), stopped when the test ends. It holds the Serve lock
/// throughout, so its heads do not compete with the shared head's Serve tests for the 2 cores.
#[tokio::test]
async fn the_dashboard_client_works_on_the_oldest_ray() {
    let _serve = support::ray_serve_lock().await;
    let started = Instant::now();
    let head = RayHead::start(RayHeadOptions {
        python_path: vec![support::ray_test_apps_dir()],
        ray_version: RAY_VERSION_OLDEST,
        ..Default::default()
    })
    .await
    .expect("a head of the oldest Ray");
    assert_eq!(head.ray_version(), RAY_VERSION_OLDEST);
    serve_deploys_runs_answers_and_updates(&head).await;
    broken_serve_configs_are_reported(&head).await;
    deleting_applications_shuts_serve_down(&head).await;
    job_runs_to_success_with_logs(&head).await;
    running_job_is_stopped_then_deleted(&head).await;
    token_auth_is_enforced_and_a_head_stops_by_its_own_pids(&head).await;
    eprintln!(
        "dashboard client on Ray {RAY_VERSION_OLDEST}: every check passed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
}
