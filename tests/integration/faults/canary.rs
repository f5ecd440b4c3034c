//! Faults in the middle of a canary rollout (issue 29 item 4), on real parts: the shared
//! kube-apiserver (or one of the test's own, when it restarts it), the shared Ray head, the
//! test registry. Two clients send requests the whole time and count every failure; every
//! test asserts the rollout ends where it should (promoted or rolled back) before a deadline,
//! reports it against a time bound (about 3× what was measured on the 2-core development
//! machine; BENCHMARKS.md), and asserts no request failed, the same
//! Pods, Serve running only the router and the stable version after, and the rollout started
//! once; each prints a `FAULT-BOUND` line per fault.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use raypipe::api::servepipeline::{RolloutStatus, ServePipeline};
use raypipe::devenv::control_plane::{ControlPlane, ControlPlaneOptions};
use raypipe::devenv::registry::Route;
use raypipe::serve::rollout::applications_of;
use serde_json::{Value, json};

use super::{children, events};
use crate::support::e2e::{
    self, Client, E2e, GRAPH_PATH, PIPELINE, digest, ensemble, ensemble_with_model_a, is_true,
};
use crate::support::{self, eventually};

/// From the fresh operator's start (or the end of the fault) to the rollout settled, per
/// fault: about 3× what was measured (BENCHMARKS.md). Killed before the canary takes traffic,
/// the rest of the rollout (Serve starting the new version, both steps) is in the time.
const OPERATOR_KILLED_NO_TRAFFIC_BOUND: Duration = Duration::from_secs(120);
const OPERATOR_KILLED_WEIGHTED_STEP_BOUND: Duration = Duration::from_secs(60);
const OPERATOR_KILLED_RETIRING_BOUND: Duration = Duration::from_secs(20);
const APISERVER_RESTARTED_BOUND: Duration = Duration::from_secs(90);
const SERVE_CONTROLLER_KILLED_BOUND: Duration = Duration::from_secs(60);
/// From the registry answering again to the source Ready and the rollout settled.
const REGISTRY_BACK_BOUND: Duration = Duration::from_secs(10);

/// How long the registry answers 503 mid-canary.
const REGISTRY_DOWN: Duration = Duration::from_secs(60);
/// How long the kube-apiserver is down mid-canary.
const APISERVER_DOWN: Duration = Duration::from_secs(10);
const ROLLOUT_WAIT: Duration = Duration::from_secs(300);

const PROMOTED: &str = "Promoted";
const ROLLED_BACK: &str = "RolledBack";

/// Short steps, so a whole rollout takes about half a minute: two weighted steps, enough
/// canary requests per step for two clients to give in a few seconds.
fn canary_policy() -> Value {
    json!({"rollout": {
        "strategy": "Canary",
        "steps": [{"weight": 30, "pause": "4s"}, {"weight": 60, "pause": "3s"}],
        "gates": {"minRequests": 8, "maxErrorRate": 0.1},
        "progressDeadline": "240s"
    }})
}

fn rollout_of(p: &ServePipeline) -> Option<RolloutStatus> {
    p.status.as_ref().and_then(|s| s.rollout.clone())
}

/// Where in a rollout the fault strikes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Moment {
    /// The new version deployed beside the stable one, taking no traffic yet (step 0).
    NoTraffic,
    /// The new version taking a step's share of the requests.
    WeightedStep,
    /// Promoted, the old version being retired (phase `Finishing`).
    Promotion,
    /// Rolled back, the failed version being retired (phase `Finishing`).
    Rollback,
}

impl Moment {
    /// How long a fresh operator may take to settle the rollout when killed at this moment.
    fn bound(self) -> Duration {
        match self {
            Moment::NoTraffic => OPERATOR_KILLED_NO_TRAFFIC_BOUND,
            Moment::WeightedStep => OPERATOR_KILLED_WEIGHTED_STEP_BOUND,
            Moment::Promotion | Moment::Rollback => OPERATOR_KILLED_RETIRING_BOUND,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Moment::NoTraffic => "no_traffic",
            Moment::WeightedStep => "weighted_step",
            Moment::Promotion => "promotion",
            Moment::Rollback => "rollback",
        }
    }

    /// `rollout` is at this moment of the rollout of `wanted`.
    fn is_now(self, rollout: &RolloutStatus, wanted: &str) -> bool {
        let canary = rollout
            .canary
            .as_ref()
            .filter(|c| c.version.digest == wanted);
        let ended_as = |result: &str| {
            rollout.phase == "Finishing"
                && rollout
                    .last
                    .as_ref()
                    .is_some_and(|l| l.digest == wanted && l.result == result)
        };
        match self {
            Moment::NoTraffic => canary.is_some_and(|c| c.step == 0 && c.weight == 0),
            Moment::WeightedStep => canary.is_some_and(|c| c.step >= 1 && c.weight > 0),
            Moment::Promotion => ended_as(PROMOTED),
            Moment::Rollback => ended_as(ROLLED_BACK),
        }
    }

    /// `rollout` is past this moment of the rollout of `wanted`.
    fn is_past(self, rollout: &RolloutStatus, wanted: &str) -> bool {
        let ended =
            rollout.phase == "Stable" && rollout.last.as_ref().is_some_and(|l| l.digest == wanted);
        let stepped = rollout
            .canary
            .as_ref()
            .is_some_and(|c| c.version.digest == wanted && c.step >= 1);
        ended || (self == Moment::NoTraffic && stepped)
    }
}

/// Polls the pipeline every 50 ms until the rollout of `wanted` is at `moment` and returns its
/// status; fails when the rollout went past it unseen (the fault would then strike elsewhere
/// than the test says). Errors reading the pipeline are retried (the apiserver may be away).
async fn wait_for(e2e: &E2e, moment: Moment, wanted: &str) -> RolloutStatus {
    let deadline = Instant::now() + ROLLOUT_WAIT;
    loop {
        if let Ok(p) = e2e.pipelines.get(PIPELINE).await
            && let Some(rollout) = rollout_of(&p)
        {
            if moment.is_now(&rollout, wanted) {
                return rollout;
            }
            assert!(
                !moment.is_past(&rollout, wanted),
                "the rollout of {wanted} went past {moment:?} unseen: {rollout:?}"
            );
        }
        assert!(
            Instant::now() < deadline,
            "the rollout of {wanted} never reached {moment:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The names of the Serve applications on the head.
async fn serve_applications(dashboard: &raypipe::ray::RayDashboardClient) -> BTreeSet<String> {
    dashboard
        .get_serve_applications()
        .await
        .map(|d| d.applications.into_keys().collect())
        .unwrap_or_default()
}

/// The names of the applications the pipeline's RayService carries: all of them, and those
/// that are not shared node applications (the router and the versions; the nodes come and go
/// with the versions that name them).
async fn rayservice_applications(e2e: &E2e) -> Option<(BTreeSet<String>, BTreeSet<String>)> {
    let rs = e2e.rayservices.get(PIPELINE).await.ok()?;
    let apps = applications_of(rs.spec.serve_config_v2.as_deref()?);
    let versions = apps
        .iter()
        .filter(|(_, app)| !raypipe::serve::shared::is_node_application(app))
        .map(|(name, _)| name.clone())
        .collect();
    Some((apps.into_keys().collect(), versions))
}

/// The rollout of `wanted` ended as `result` and settled: phase `Stable`, `stable` the stable
/// version, the RayService carrying two applications (the router and the stable version) and
/// Serve running exactly those. Fails at once when the rollout ended otherwise. Returns when
/// it was first seen settled, and every `startedAt` its canary was seen with meanwhile.
async fn settled(
    e2e: &E2e,
    dashboard: &raypipe::ray::RayDashboardClient,
    wanted: &str,
    result: &str,
    stable: &str,
) -> (Instant, BTreeSet<String>) {
    let deadline = Instant::now() + ROLLOUT_WAIT;
    let mut last_seen = String::new();
    let mut starts = BTreeSet::new();
    loop {
        if let Ok(p) = e2e.pipelines.get(PIPELINE).await
            && let Some(rollout) = rollout_of(&p)
        {
            if let Some(canary) = rollout
                .canary
                .as_ref()
                .filter(|c| c.version.digest == wanted)
            {
                starts.insert(canary.started_at.0.to_string());
            }
            if let Some(last) = rollout.last.as_ref().filter(|l| l.digest == wanted) {
                assert_eq!(last.result, result, "the rollout ended otherwise: {last:?}");
            }
            let ended = rollout.phase == "Stable"
                && rollout.last.as_ref().is_some_and(|l| l.digest == wanted)
                && rollout.stable.as_ref().is_some_and(|s| s.digest == stable);
            if ended && let Some((carried, versions)) = rayservice_applications(e2e).await {
                let on_serve = serve_applications(dashboard).await;
                let stable_app = rollout.stable.as_ref().map(|s| s.application.clone());
                if versions.len() == 2
                    && stable_app.is_some_and(|a| versions.contains(&a))
                    && on_serve == carried
                {
                    return (Instant::now(), starts);
                }
                last_seen = format!("RayService {carried:?}, Serve {on_serve:?}");
            } else {
                last_seen = format!("{rollout:?}");
            }
        }
        assert!(
            Instant::now() < deadline,
            "the rollout of {wanted} never settled as {result}: {last_seen}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two clients sending back to back (enough canary requests per step for the gates).
struct Clients(Client, Client);

impl Clients {
    fn start(url: &str) -> Clients {
        Clients(Client::start(url.to_owned()), Client::start(url.to_owned()))
    }

    /// (answers, failures) so far.
    fn counts(&self) -> (u64, u64) {
        let load = |c: &Client| {
            (
                c.traffic.ok.load(std::sync::atomic::Ordering::SeqCst),
                c.traffic.failed.load(std::sync::atomic::Ordering::SeqCst),
            )
        };
        let (a, b) = (load(&self.0), load(&self.1));
        (a.0 + b.0, a.1 + b.1)
    }

    fn failures(&self) -> Vec<String> {
        let mut all = self.0.traffic.failures();
        all.extend(self.1.traffic.failures());
        all
    }

    async fn stop(self) -> (u64, u64) {
        let (a, b) = (self.0.stop().await, self.1.stop().await);
        (a.0 + b.0, a.1 + b.1)
    }
}

/// What one fault cost, as measured.
struct Cost {
    converged: Duration,
    requests: u64,
    failed: u64,
    duplicate_pods: usize,
    duplicate_applications: usize,
}

impl Cost {
    fn print(&self, name: &str) {
        eprintln!(
            "FAULT-BOUND {name}: converged in {:.1} s, {} requests, {} failed, {} duplicate pods, {} duplicate serve applications",
            self.converged.as_secs_f64(),
            self.requests,
            self.failed,
            self.duplicate_pods,
            self.duplicate_applications,
        );
    }
}

/// What a test checks after each fault, against what was there before the rollout.
struct Before {
    pods: BTreeSet<String>,
    requests: (u64, u64),
}

async fn before(e2e: &E2e, clients: &Clients) -> Before {
    Before {
        pods: children(&e2e.client, &e2e.namespace).await.1,
        requests: clients.counts(),
    }
}

async fn rollouts_started(e2e: &E2e) -> usize {
    events(&e2e.client, &e2e.namespace, PIPELINE, "RolloutStarted").await
}

/// Where the rollout stood when the fault struck: the `RolloutStarted` Events so far and the
/// canary's `startedAt` (none once it ended).
struct AtFault {
    started_events: usize,
    started_at: Option<String>,
}

async fn at_fault(e2e: &E2e, rollout: &RolloutStatus) -> AtFault {
    AtFault {
        started_events: rollouts_started(e2e).await,
        started_at: rollout.canary.as_ref().map(|c| c.started_at.0.to_string()),
    }
}

/// After the rollout settled: prints the fault's line and asserts the same Pods, the rollout
/// not started again after the fault (no new `RolloutStarted` Event, the canary's `startedAt`
/// unchanged), no failed request, Serve still running only the two applications a second
/// later, and `converged` within `bound`.
#[allow(clippy::too_many_arguments)]
async fn check_after(
    name: &str,
    e2e: &E2e,
    dashboard: &raypipe::ray::RayDashboardClient,
    clients: &Clients,
    before: &Before,
    fault: &AtFault,
    (converged, starts_seen): (Duration, BTreeSet<String>),
    bound: Duration,
) {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pods = children(&e2e.client, &e2e.namespace).await.1;
    let started = rollouts_started(e2e).await;
    let on_serve = serve_applications(dashboard).await;
    let (carried, versions) = rayservice_applications(e2e).await.unwrap_or_default();
    let (ok, failed) = clients.counts();
    let cost = Cost {
        converged,
        requests: (ok + failed) - (before.requests.0 + before.requests.1),
        failed: failed - before.requests.1,
        duplicate_pods: pods.difference(&before.pods).count(),
        // Beyond the router and the stable version (and the node applications it names):
        // what Serve runs that the RayService does not carry, and any further version.
        duplicate_applications: on_serve.difference(&carried).count()
            + versions.len().saturating_sub(2),
    };
    cost.print(name);
    eprintln!(
        "{name}: RolloutStarted Events {} at the fault, {started} after; canary startedAt at the fault {:?}, after {starts_seen:?}",
        fault.started_events, fault.started_at
    );
    assert_eq!(pods, before.pods, "{name}: the same Pods, no new ones");
    assert_eq!(
        started, fault.started_events,
        "{name}: the rollout was announced again after the fault"
    );
    if let Some(started_at) = &fault.started_at {
        assert!(
            starts_seen.iter().all(|s| s == started_at),
            "{name}: the rollout was started again: startedAt {started_at} at the fault, {starts_seen:?} after"
        );
    }
    assert_eq!(
        cost.duplicate_applications, 0,
        "{name}: Serve runs the router and the stable version (and its nodes) only: {on_serve:?}"
    );
    assert!(cost.requests > 20, "{name}: the clients kept sending");
    assert_eq!(
        cost.failed,
        0,
        "{name}: requests failed: {:?}",
        clients.failures()
    );
    // The bound is reported, not asserted: timing on a loaded 2-core CI machine is not a test
    // result. `settled` still fails a rollout that never settles (ROLLOUT_WAIT), and
    // BENCHMARKS.md records these lines.
    eprintln!(
        "FAULT-BOUND {name}: bound {bound:?} {}",
        if converged < bound {
            "held"
        } else {
            "EXCEEDED"
        }
    );
}

/// The operator is killed (its task aborted: in-flight reconciles dropped, memory gone) at
/// each moment of a canary in turn, on one pipeline, and a fresh one starts a second later:
/// v2 while deployed with no traffic, v3 at a weighted step, v4 while promoted and the old
/// version retiring, v5 (30 % of its calls fail) while rolled back and retiring. Each ends as
/// it should have without the fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_killed_at_each_canary_step_the_rollout_ends_where_it_should() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let mut e2e = e2e::ready_pipeline_with(head, "fault-canary-operator", canary_policy()).await;
    let dashboard = head
        .client(Duration::from_secs(5))
        .expect("a dashboard client");
    let clients = Clients::start(&e2e.url);
    let cases = [
        (Moment::NoTraffic, ensemble("2"), PROMOTED),
        (Moment::WeightedStep, ensemble("3"), PROMOTED),
        (Moment::Promotion, ensemble("4"), PROMOTED),
        (
            Moment::Rollback,
            ensemble_with_model_a("5", "error_share: 0.3"),
            ROLLED_BACK,
        ),
    ];
    let mut stable = digest(&ensemble("1"));
    for (moment, bytes, result) in cases {
        let wanted = digest(&bytes);
        let before = before(&e2e, &clients).await;
        e2e.registry.put(GRAPH_PATH, bytes);
        let rollout_at_fault = wait_for(&e2e, moment, &wanted).await;
        let fault = at_fault(&e2e, &rollout_at_fault).await;
        e2e.operator
            .take()
            .expect("the fixture's operator")
            .kill()
            .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let restarted = Instant::now();
        e2e.start_operator();
        if result == PROMOTED {
            stable = wanted.clone();
        }
        let (settled_at, starts) = settled(&e2e, &dashboard, &wanted, result, &stable).await;
        eprintln!(
            "operator killed at {moment:?}: phase {} step {:?} at the kill",
            rollout_at_fault.phase,
            rollout_at_fault.canary.as_ref().map(|c| c.step)
        );
        check_after(
            &format!("operator_killed_at_canary_{}", moment.name()),
            &e2e,
            &dashboard,
            &clients,
            &before,
            &fault,
            (settled_at.duration_since(restarted), starts),
            moment.bound(),
        )
        .await;
    }
    let (ok, failed) = clients.stop().await;
    eprintln!("operator killed at each canary step: {ok} answers, {failed} failed in all");
}

/// The head's Serve controller actor is SIGKILLed while the canary takes a weighted step (Ray
/// restarts it; replicas and proxies keep serving). The rollout still promotes the version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_controller_killed_mid_canary_the_version_is_still_promoted() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let e2e = e2e::ready_pipeline_with(head, "fault-canary-serve", canary_policy()).await;
    let dashboard = head
        .client(Duration::from_secs(5))
        .expect("a dashboard client");
    let clients = Clients::start(&e2e.url);
    let bytes = ensemble("2");
    let wanted = digest(&bytes);
    let before = before(&e2e, &clients).await;
    e2e.registry.put(GRAPH_PATH, bytes);
    let fault = at_fault(&e2e, &wait_for(&e2e, Moment::WeightedStep, &wanted).await).await;
    let killed_pid = head
        .kill_serve_controller()
        .expect("the head runs a Serve controller");
    let killed = Instant::now();
    let (settled_at, starts) = settled(&e2e, &dashboard, &wanted, PROMOTED, &wanted).await;
    assert!(
        head.serve_controller_pid()
            .is_some_and(|pid| pid != killed_pid),
        "Ray started another Serve controller"
    );
    check_after(
        "serve_controller_killed_mid_canary",
        &e2e,
        &dashboard,
        &clients,
        &before,
        &fault,
        (settled_at.duration_since(killed), starts),
        SERVE_CONTROLLER_KILLED_BOUND,
    )
    .await;
    clients.stop().await;
}

/// The registry answers 503 for a minute from the moment the canary is deployed (no traffic
/// yet). The rollout goes on judging the version on its own traffic: it is promoted, not
/// rolled back or aborted for want of the registry, and at every sample the RayService still
/// carries the stable version. Once the registry is back the source is Ready again and nothing
/// starts over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_down_mid_canary_the_rollout_goes_on_and_nothing_is_lost() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let e2e = e2e::ready_pipeline_with(head, "fault-canary-registry", canary_policy()).await;
    let dashboard = head
        .client(Duration::from_secs(5))
        .expect("a dashboard client");
    let clients = Clients::start(&e2e.url);
    let bytes = ensemble("2");
    let wanted = digest(&bytes);
    let before = before(&e2e, &clients).await;
    e2e.registry.put(GRAPH_PATH, bytes.clone());
    let fault = at_fault(&e2e, &wait_for(&e2e, Moment::NoTraffic, &wanted).await).await;
    let fetches_before = e2e.registry.requests(GRAPH_PATH).len();
    e2e.registry.route(GRAPH_PATH, Route::Status(503));
    let down = Instant::now();
    let mut source_not_ready_seen = false;
    let mut ended_during_outage: Option<(String, Duration)> = None;
    while down.elapsed() < REGISTRY_DOWN {
        let p = e2e.pipeline().await;
        source_not_ready_seen |= !is_true(&p, "SourceReady");
        let rollout = rollout_of(&p).expect("the rollout status");
        if let Some(last) = rollout.last.as_ref().filter(|l| l.digest == wanted)
            && ended_during_outage.is_none()
        {
            ended_during_outage = Some((last.result.clone(), down.elapsed()));
        }
        let stable_app = rollout
            .stable
            .as_ref()
            .map(|s| s.application.clone())
            .expect("a stable version");
        let (carried, _) = rayservice_applications(&e2e)
            .await
            .expect("the RayService carries a Serve config");
        assert!(
            carried.contains(&stable_app),
            "the RayService dropped the stable version while the registry was down: {carried:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let failed_fetches = e2e.registry.requests(GRAPH_PATH).len() - fetches_before;
    e2e.registry.put(GRAPH_PATH, bytes);
    let back = Instant::now();
    let (settled_at, starts) = settled(&e2e, &dashboard, &wanted, PROMOTED, &wanted).await;
    let source_ready = eventually(e2e::WAIT, "SourceReady again", || {
        let pipelines = e2e.pipelines.clone();
        async move {
            let p = pipelines.get(PIPELINE).await.ok()?;
            (is_true(&p, "SourceReady") && is_true(&p, "Ready")).then(Instant::now)
        }
    })
    .await;
    eprintln!(
        "registry down {:.0} s mid-canary: {failed_fetches} fetches refused; SourceReady false seen: {source_not_ready_seen}; rollout ended during the outage: {ended_during_outage:?}",
        REGISTRY_DOWN.as_secs_f64()
    );
    assert!(
        source_not_ready_seen,
        "the status never said the source was failing"
    );
    assert!(
        failed_fetches >= 5,
        "the operator kept trying the registry ({failed_fetches} fetches)"
    );
    check_after(
        "registry_down_mid_canary",
        &e2e,
        &dashboard,
        &clients,
        &before,
        &fault,
        (settled_at.max(source_ready).duration_since(back), starts),
        REGISTRY_BACK_BOUND,
    )
    .await;
    clients.stop().await;
}

/// On a full control plane of its own (others share the default one): the kube-apiserver is
/// stopped for 10 s while the canary takes a weighted step, then started on the same port and
/// etcd; the operator keeps running. The rollout completes: promoted. Out of CI (its own
/// control plane and first Ready pipeline take about three minutes of CI's 45); run by hand
/// with `cargo test --test integration faults::canary -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "its own control plane: about 3.5 minutes, run by hand"]
async fn apiserver_restarted_mid_canary_the_rollout_completes() {
    raypipe::startup::init_crypto();
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let mut plane = ControlPlane::start(ControlPlaneOptions::full())
        .await
        .expect("a dedicated control plane");
    let client = plane.client().await.expect("a client");
    let e2e = e2e::ready_pipeline_on(client, head, "fault-canary-apiserver", canary_policy()).await;
    let dashboard = head
        .client(Duration::from_secs(5))
        .expect("a dashboard client");
    let clients = Clients::start(&e2e.url);
    let bytes = ensemble("2");
    let wanted = digest(&bytes);
    let before = before(&e2e, &clients).await;
    e2e.registry.put(GRAPH_PATH, bytes);
    let fault = at_fault(&e2e, &wait_for(&e2e, Moment::WeightedStep, &wanted).await).await;
    let outage = plane
        .restart_apiserver(APISERVER_DOWN)
        .await
        .expect("the kube-apiserver restarts");
    let back = Instant::now();
    let (settled_at, starts) = settled(&e2e, &dashboard, &wanted, PROMOTED, &wanted).await;
    eprintln!(
        "apiserver restarted mid-canary: unreachable {:.1} s",
        outage.as_secs_f64()
    );
    assert!(
        e2e.operator.as_ref().is_some_and(|o| !o.has_ended()),
        "the operator kept running"
    );
    check_after(
        "apiserver_restarted_mid_canary",
        &e2e,
        &dashboard,
        &clients,
        &before,
        &fault,
        (settled_at.duration_since(back), starts),
        APISERVER_RESTARTED_BOUND,
    )
    .await;
    clients.stop().await;
    drop(e2e);
}
