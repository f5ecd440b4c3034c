//! Every transition of the canary step function, on plain values.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::{
    DEFAULT_DEADLINE, DEFAULT_PAUSE, Decision, Inputs, Newest, Policy, decide, newly_ended, phases,
    readings, reasons, results,
};
use crate::api::servepipeline::{
    ApplicationStatus, NodeStatus, RolloutCommand, RolloutGates, RolloutPolicy, RolloutStatus,
    RolloutStep, RolloutVerb,
};
use crate::serve::rollout::{RouterReplica, RouterStats, SIGNIFICANT_SHIFT_Z, VersionCounters};

const OLD: &str = "sha256:aaaaaaaaaaaa0000";
const NEW: &str = "sha256:bbbbbbbbbbbb0000";
const NEWER: &str = "sha256:cccccccccccc0000";

fn at(second: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + second).unwrap())
}

fn policy() -> Policy {
    Policy::from_spec(&RolloutPolicy {
        steps: vec![
            RolloutStep {
                weight: 10,
                pause: Some("10s".into()),
            },
            RolloutStep {
                weight: 50,
                pause: Some("10s".into()),
            },
        ],
        gates: Some(RolloutGates {
            min_requests: Some(10),
            ..Default::default()
        }),
        progress_deadline: Some("5m".into()),
        ..Default::default()
    })
}

fn newest(digest: &str) -> Newest {
    Newest {
        digest: digest.to_owned(),
        version: Some(digest[7..8].to_owned()),
        application: json!({"name": "rendered", "route_prefix": null, "import_path": "raypipe_runtime.app:build"}),
        plan: vec!["classifier: restarted (import_path)".into()],
    }
}

struct World {
    policy: Policy,
    status: Option<RolloutStatus>,
    current: BTreeMap<String, Value>,
    serve: BTreeMap<String, ApplicationStatus>,
    stats: Option<RouterStats>,
    suspended: bool,
    paused: bool,
    command: Option<RolloutCommand>,
    stable_rendered: Option<Newest>,
}

impl World {
    fn new() -> World {
        World {
            policy: policy(),
            status: None,
            current: BTreeMap::new(),
            serve: BTreeMap::new(),
            stats: None,
            suspended: false,
            paused: false,
            command: None,
            stable_rendered: None,
        }
    }

    /// One pass at `second` with `newest`; the config it decides is then "on the RayService".
    fn pass(&mut self, second: i64, newest: Option<&Newest>) -> Decision {
        let now = at(second);
        let decision = decide(&Inputs {
            policy: &self.policy,
            previous: self.status.as_ref(),
            base: "pipe",
            executor: "raypipe-executor",
            newest,
            stable_rendered: self.stable_rendered.as_ref(),
            current: &self.current,
            serve: &self.serve,
            stats: self.stats.as_ref(),
            suspended: self.suspended,
            paused: self.paused,
            command: self.command.as_ref(),
            now: &now,
        });
        self.status = Some(decision.status.clone());
        self.current = decision
            .applications
            .iter()
            .map(|a| (a["name"].as_str().unwrap().to_owned(), a.clone()))
            .collect();
        decision
    }

    fn set_serve(&mut self, app: &str, status: &str) {
        self.serve.insert(
            app.to_owned(),
            ApplicationStatus {
                status: Some(status.to_owned()),
                ..Default::default()
            },
        );
    }

    fn generation(&self) -> String {
        self.status.as_ref().unwrap().generation.clone()
    }

    /// The routers report `canary` and `stable` requests (errors, latency bucket index).
    fn traffic(&mut self, canary: (u64, u64, usize), stable: (u64, usize)) {
        let one_bucket = |requests: u64, bucket: usize| {
            let mut buckets = vec![0; 5];
            buckets[bucket] = requests;
            buckets
        };
        self.histograms(
            (one_bucket(canary.0, canary.2), canary.1),
            one_bucket(stable.0, stable.1),
        );
    }

    /// The routers report these latency histograms (bounds 5, 10, 20, 40 ms and overflow)
    /// and the canary's errors.
    fn histograms(&mut self, canary: (Vec<u64>, u64), stable: Vec<u64>) {
        let generation = self.generation();
        let counters = |buckets: Vec<u64>, errors: u64| VersionCounters {
            requests: buckets.iter().sum(),
            errors,
            retried: errors,
            sum_ms: 0.0,
            buckets,
        };
        self.stats = Some(RouterStats {
            generation: Some(generation.clone()),
            bounds_ms: vec![5.0, 10.0, 20.0, 40.0],
            routers: BTreeMap::from([(
                "r1".to_owned(),
                RouterReplica {
                    generation: Some(generation),
                    age_s: 0.2,
                    config_error: None,
                },
            )]),
            stable: counters(stable, 0),
            canary: counters(canary.0, canary.1),
        });
    }
}

/// A world serving OLD as stable.
fn serving_old() -> World {
    let mut w = World::new();
    let d = w.pass(0, Some(&newest(OLD)));
    assert!(d.events.is_empty());
    let stable = d.status.stable.clone().unwrap();
    assert_eq!(stable.application, "pipe--aaaaaaaaaaaa");
    assert_eq!(d.applications.len(), 1);
    assert_eq!(d.applications[0]["name"], "pipe--aaaaaaaaaaaa");
    assert!(d.router.as_ref().unwrap().canary.is_none());
    assert!(!d.active);
    w.set_serve("pipe--aaaaaaaaaaaa", "RUNNING");
    w
}

/// OLD stable, NEW deployed and RUNNING at step 1 (10 %) from second 10.
fn canary_at_step_one() -> World {
    let mut w = serving_old();
    let d = w.pass(1, Some(&newest(NEW)));
    let c = d.status.canary.clone().unwrap();
    assert_eq!((c.step, c.weight), (0, 0));
    assert_eq!(d.applications.len(), 2);
    assert_eq!(
        d.router.as_ref().unwrap().canary.as_ref().unwrap().weight,
        0.0
    );
    assert_eq!(d.events[0].reason, "RolloutStarted");
    assert!(d.active);
    // Deploying: stays at step 0.
    w.set_serve("pipe--bbbbbbbbbbbb", "DEPLOYING");
    assert_eq!(w.pass(5, Some(&newest(NEW))).status.canary.unwrap().step, 0);
    w.set_serve("pipe--bbbbbbbbbbbb", "RUNNING");
    let d = w.pass(10, Some(&newest(NEW)));
    let c = d.status.canary.unwrap();
    assert_eq!((c.step, c.weight), (1, 10));
    assert_eq!(d.router.unwrap().canary.unwrap().weight, 10.0);
    assert_eq!(d.events[0].reason, "RolloutStep");
    w
}

#[test]
fn a_good_canary_is_promoted_step_by_step_and_the_old_version_retires() {
    let mut w = canary_at_step_one();
    // Enough good traffic, but the pause is not over.
    w.traffic((20, 0, 0), (100, 0));
    assert_eq!(
        w.pass(15, Some(&newest(NEW))).status.canary.unwrap().step,
        1
    );
    let d = w.pass(20, Some(&newest(NEW)));
    let c = d.status.canary.unwrap();
    assert_eq!((c.step, c.weight), (2, 50));
    // A new step starts with fresh counters (the old generation's do not count).
    assert_eq!(
        w.pass(31, Some(&newest(NEW))).status.canary.unwrap().step,
        2
    );
    w.traffic((50, 1, 0), (50, 0));
    let d = w.pass(32, Some(&newest(NEW)));
    assert!(d.status.canary.is_none());
    assert_eq!(d.status.stable.as_ref().unwrap().digest, NEW);
    assert_eq!(d.status.retiring.as_deref(), Some("pipe--aaaaaaaaaaaa"));
    assert_eq!(d.status.phase, phases::FINISHING);
    assert_eq!(d.status.last.as_ref().unwrap().result, results::PROMOTED);
    assert_eq!(d.events[0].reason, "RolloutPromoted");
    // The old version stays until the routers run the new generation.
    assert_eq!(d.applications.len(), 2);
    assert!(d.router.as_ref().unwrap().canary.is_none());
    assert_eq!(d.router.as_ref().unwrap().stable.app, "pipe--bbbbbbbbbbbb");
    let d = w.pass(33, Some(&newest(NEW)));
    assert_eq!(d.applications.len(), 2, "the routers have not moved on yet");
    w.traffic((0, 0, 0), (5, 0));
    let d = w.pass(34, Some(&newest(NEW)));
    assert_eq!(d.applications.len(), 1);
    assert_eq!(d.applications[0]["name"], "pipe--bbbbbbbbbbbb");
    assert_eq!(d.status.phase, phases::STABLE);
    assert!(!d.active);
}

#[test]
fn an_error_rate_over_the_gate_rolls_back_at_once_and_the_digest_is_remembered() {
    let mut w = canary_at_step_one();
    w.traffic((10, 3, 0), (90, 0));
    let before = w.status.clone();
    let d = w.pass(12, Some(&newest(NEW)));
    assert!(d.status.canary.is_none());
    assert_eq!(d.status.stable.as_ref().unwrap().digest, OLD);
    let last = d.status.last.as_ref().unwrap();
    assert_eq!(
        (last.result.as_str(), last.reason.as_str()),
        (results::ROLLED_BACK, reasons::ERROR_RATE)
    );
    // What the rollout metric counts: this pass ended it, a later one with the same outcome not.
    let (result, key) = newly_ended(before.as_ref(), &d.status).expect("a rollout ended");
    assert_eq!(result, results::ROLLED_BACK);
    assert_eq!(newly_ended(Some(&d.status), &d.status), None);
    // A pass on the same, older status (a stale cache) ends the same rollout again, later: the
    // key is the same, so it is counted once.
    let mut stale = canary_at_step_one();
    stale.traffic((10, 3, 0), (90, 0));
    let again = stale.pass(14, Some(&newest(NEW)));
    assert_ne!(again.status.last, d.status.last, "decided at another time");
    assert_eq!(
        newly_ended(before.as_ref(), &again.status).map(|(_, k)| k),
        Some(key)
    );
    // The metric starts every result the controller can report at 0.
    assert_eq!(
        crate::admin::metrics::ROLLOUT_RESULTS,
        [results::PROMOTED, results::ROLLED_BACK, results::ABORTED]
    );
    assert!(last.message.contains("3 of 10"), "{}", last.message);
    assert_eq!(d.status.failed_digests, vec![NEW.to_owned()]);
    assert!(d.events[0].warning);
    assert_eq!(d.router.as_ref().unwrap().stable.app, "pipe--aaaaaaaaaaaa");
    assert!(d.router.as_ref().unwrap().canary.is_none());
    // The same bytes are not tried again.
    w.traffic((0, 0, 0), (1, 0));
    let d = w.pass(100, Some(&newest(NEW)));
    assert!(d.status.canary.is_none());
    assert_eq!(d.applications.len(), 1);
    // Different bytes are.
    let d = w.pass(101, Some(&newest(NEWER)));
    assert_eq!(d.status.canary.unwrap().version.digest, NEWER);
}

#[test]
fn a_slow_canary_trips_the_latency_gate_over_a_whole_window() {
    let mut w = canary_at_step_one();
    // Canary p95 in the 20 ms bucket, stable in the 5 ms one: 4× and 15 ms slower; judged
    // when the window is over, not on its first requests.
    w.traffic((20, 0, 2), (100, 0));
    assert_eq!(
        w.pass(12, Some(&newest(NEW))).status.canary.unwrap().step,
        1
    );
    let d = w.pass(20, Some(&newest(NEW)));
    assert_eq!(d.status.last.unwrap().reason, reasons::LATENCY);
    // Too few samples for a percentile: the step waits for more.
    let mut w = canary_at_step_one();
    w.traffic((12, 0, 2), (100, 0));
    assert_eq!(
        w.pass(20, Some(&newest(NEW))).status.canary.unwrap().step,
        1
    );
    // Within the tolerance it passes: 10 ms against 5 ms is 2× but only 5 ms slower.
    let mut w = canary_at_step_one();
    w.traffic((20, 0, 1), (100, 0));
    let d = w.pass(21, Some(&newest(NEW)));
    assert_eq!(d.status.canary.unwrap().step, 2);
}

#[test]
fn a_canary_whose_tail_differs_by_chance_is_not_rolled_back() {
    // Canary p95 33 ms against stable's 20 ms: over 1.5× and over the 10 ms tolerance, but
    // both histograms have the same shape, as when a loaded machine spreads a good version's
    // few dozen requests; the rank test sees no shift and the step passes.
    let mut w = canary_at_step_one();
    w.histograms((vec![10, 4, 3, 3, 0], 0), vec![20, 10, 8, 2, 0]);
    let readings = readings(w.stats.as_ref(), &w.generation(), &w.policy);
    let d = w.pass(21, Some(&newest(NEW)));
    assert_eq!(d.status.canary.unwrap().step, 2, "{:?}", d.status.last);
    let (c, s) = (
        readings.canary_latency_ms.unwrap(),
        readings.stable_latency_ms.unwrap(),
    );
    assert!(c > 1.5 * s && c - s > 10.0, "{readings:?}");
    assert!(readings.latency_shift_z.unwrap() < SIGNIFICANT_SHIFT_Z);
    // The same tail with the body shifted up a bucket is a regression.
    let mut w = canary_at_step_one();
    w.histograms((vec![0, 10, 4, 3, 3], 0), vec![20, 10, 8, 2, 0]);
    let d = w.pass(21, Some(&newest(NEW)));
    let last = d.status.last.unwrap();
    assert_eq!(last.reason, reasons::LATENCY);
    assert!(last.message.contains("rank test"), "{}", last.message);
}

#[test]
fn a_canary_whose_deployment_fails_is_rolled_back_naming_the_node() {
    let mut w = serving_old();
    w.pass(1, Some(&newest(NEW)));
    w.serve.insert(
        "pipe--bbbbbbbbbbbb".into(),
        ApplicationStatus {
            status: Some("DEPLOY_FAILED".into()),
            message: Some("boom".into()),
            deployments: BTreeMap::from([(
                "classifier".to_owned(),
                NodeStatus {
                    status: Some("DEPLOY_FAILED".into()),
                    message: Some("Traceback ...\nRuntimeError: no weights".into()),
                },
            )]),
        },
    );
    let d = w.pass(30, Some(&newest(NEW)));
    let last = d.status.last.unwrap();
    assert_eq!(last.reason, reasons::DEPLOYMENT_FAILED);
    assert_eq!(last.node.as_deref(), Some("classifier"));
    assert!(last.message.contains("RuntimeError: no weights"));
    assert_eq!(d.status.failed_digests, vec![NEW.to_owned()]);
}

#[test]
fn the_registry_going_back_aborts_without_marking_anything_bad() {
    let mut w = canary_at_step_one();
    let d = w.pass(12, Some(&newest(OLD)));
    let last = d.status.last.unwrap();
    assert_eq!(
        (last.result.as_str(), last.reason.as_str()),
        (results::ABORTED, reasons::REVERTED)
    );
    assert!(d.status.failed_digests.is_empty());
    assert_eq!(d.status.stable.unwrap().digest, OLD);
    // The stable application is rendered from the (same) newest graph, not restarted.
    assert_eq!(d.applications[0]["name"], "pipe--aaaaaaaaaaaa");
}

#[test]
fn pushes_in_quick_succession_run_one_canary_at_a_time_and_end_with_the_newest() {
    let mut w = canary_at_step_one();
    let d = w.pass(12, Some(&newest(NEWER)));
    assert_eq!(d.status.last.unwrap().reason, reasons::SUPERSEDED);
    assert!(
        d.status.canary.is_none(),
        "not while the superseded one retires"
    );
    assert_eq!(d.status.retiring.as_deref(), Some("pipe--bbbbbbbbbbbb"));
    w.traffic((0, 0, 0), (1, 0));
    let d = w.pass(13, Some(&newest(NEWER)));
    let c = d.status.canary.unwrap();
    assert_eq!(c.version.digest, NEWER);
    assert_eq!(c.step, 0);
    assert_eq!(d.applications.len(), 2);
}

#[test]
fn a_canary_without_traffic_is_not_promoted_and_the_deadline_rolls_it_back() {
    let mut w = canary_at_step_one();
    w.traffic((3, 0, 0), (3, 0));
    assert_eq!(
        w.pass(200, Some(&newest(NEW))).status.canary.unwrap().step,
        1
    );
    let d = w.pass(311, Some(&newest(NEW)));
    assert_eq!(d.status.last.unwrap().reason, reasons::NO_TRAFFIC);
    // Unless the policy says so.
    let mut w = canary_at_step_one();
    w.policy.promote_without_traffic = true;
    assert_eq!(
        w.pass(21, Some(&newest(NEW))).status.canary.unwrap().step,
        2
    );
}

fn command(verb: RolloutVerb, digest: &str) -> Option<RolloutCommand> {
    Some(RolloutCommand {
        verb,
        digest: digest.to_owned(),
    })
}

#[test]
fn a_paused_canary_holds_its_step_and_its_clocks_then_goes_on_where_it_stood() {
    let mut w = canary_at_step_one();
    w.paused = true;
    w.traffic((20, 0, 0), (100, 0));
    let d = w.pass(12, Some(&newest(NEW)));
    assert_eq!(d.events[0].reason, "RolloutPaused");
    let c = d.status.canary.clone().unwrap();
    assert_eq!((c.step, c.weight), (1, 10));
    assert_eq!(c.paused_at, Some(at(12)));
    // Long past the step's pause and the 5 min deadline: held, neither advanced nor rolled back.
    let d = w.pass(1_000, Some(&newest(NEW)));
    assert!(d.events.is_empty(), "{:?}", d.events);
    let c = d.status.canary.clone().unwrap();
    assert_eq!((c.step, c.weight), (1, 10));
    assert_eq!(
        d.router.unwrap().canary.unwrap().weight,
        10.0,
        "still takes its share"
    );
    // Resumed: the 989 s held are added to its clocks; 2 s of the step's 10 s had passed.
    w.paused = false;
    let d = w.pass(1_001, Some(&newest(NEW)));
    assert_eq!(d.events[0].reason, "RolloutResumed");
    let c = d.status.canary.clone().unwrap();
    assert_eq!(c.paused_at, None);
    assert_eq!(c.step_started_at, at(10 + 989));
    assert_eq!(c.started_at, at(1 + 989));
    assert_eq!(
        w.pass(1_008, Some(&newest(NEW)))
            .status
            .canary
            .unwrap()
            .step,
        1
    );
    let d = w.pass(1_009, Some(&newest(NEW)));
    assert_eq!(d.status.canary.unwrap().step, 2, "the rest of the step ran");
}

#[test]
fn a_paused_canary_with_failing_gates_is_still_rolled_back() {
    let mut w = canary_at_step_one();
    w.paused = true;
    w.pass(11, Some(&newest(NEW)));
    w.traffic((20, 10, 0), (100, 0));
    let d = w.pass(12, Some(&newest(NEW)));
    assert!(d.status.canary.is_none());
    assert_eq!(d.status.last.unwrap().reason, reasons::ERROR_RATE);
}

#[test]
fn a_new_graph_while_paused_starts_its_canary_but_takes_no_traffic() {
    let mut w = serving_old();
    w.paused = true;
    w.pass(1, Some(&newest(NEW)));
    w.set_serve("pipe--bbbbbbbbbbbb", "RUNNING");
    let d = w.pass(10, Some(&newest(NEW)));
    let c = d.status.canary.unwrap();
    assert_eq!((c.step, c.weight), (0, 0));
    assert!(c.paused_at.is_some());
}

#[test]
fn promote_by_command_skips_the_remaining_steps_once_the_canary_runs() {
    // At step 0 and still deploying: the command waits (not consumed).
    let mut w = serving_old();
    w.pass(1, Some(&newest(NEW)));
    w.set_serve("pipe--bbbbbbbbbbbb", "DEPLOYING");
    w.command = command(RolloutVerb::Promote, NEW);
    let d = w.pass(2, Some(&newest(NEW)));
    assert!(!d.command_consumed);
    assert_eq!(d.status.canary.unwrap().step, 0);
    w.set_serve("pipe--bbbbbbbbbbbb", "RUNNING");
    let d = w.pass(3, Some(&newest(NEW)));
    assert!(d.command_consumed);
    assert!(d.status.canary.is_none());
    assert_eq!(d.status.stable.as_ref().unwrap().digest, NEW);
    let last = d.status.last.clone().unwrap();
    assert_eq!(
        (last.result.as_str(), last.reason.as_str()),
        (results::PROMOTED, reasons::PROMOTED_BY_COMMAND)
    );
    assert_eq!(d.events[0].reason, "RolloutPromoted");
    // The annotation outlives the pass (a cached copy): dropped without a word.
    let d = w.pass(4, Some(&newest(NEW)));
    assert!(d.command_consumed);
    assert!(d.events.is_empty(), "{:?}", d.events);
    // Paused does not stop an explicit promote.
    let mut w = canary_at_step_one();
    w.paused = true;
    w.command = command(RolloutVerb::Promote, NEW);
    let d = w.pass(11, Some(&newest(NEW)));
    assert_eq!(d.status.stable.unwrap().digest, NEW);
}

#[test]
fn abort_by_command_remembers_the_digest_until_retried() {
    let mut w = canary_at_step_one();
    w.command = command(RolloutVerb::Abort, NEW);
    let d = w.pass(11, Some(&newest(NEW)));
    assert!(d.command_consumed);
    assert!(d.status.canary.is_none());
    assert_eq!(d.status.stable.as_ref().unwrap().digest, OLD);
    let last = d.status.last.clone().unwrap();
    assert_eq!(
        (last.result.as_str(), last.reason.as_str()),
        (results::ABORTED, reasons::ABORTED_BY_COMMAND)
    );
    assert_eq!(d.status.failed_digests, vec![NEW.to_owned()]);
    assert_eq!(d.events[0].reason, "RolloutAborted");
    // The registry still serves NEW: no new canary.
    w.command = None;
    w.traffic((0, 0, 0), (5, 0));
    let d = w.pass(12, Some(&newest(NEW)));
    assert!(d.status.canary.is_none());
    // Retried: it starts again in the same pass.
    w.command = command(RolloutVerb::Retry, NEW);
    let d = w.pass(13, Some(&newest(NEW)));
    assert!(d.command_consumed);
    assert_eq!(d.events[0].reason, "RolloutRetry");
    assert!(d.status.failed_digests.is_empty());
    assert_eq!(d.status.canary.unwrap().version.digest, NEW);
}

#[test]
fn a_command_for_another_digest_or_without_a_canary_is_ignored_with_a_warning() {
    let mut w = canary_at_step_one();
    w.command = command(RolloutVerb::Promote, NEWER);
    let d = w.pass(11, Some(&newest(NEW)));
    assert!(d.command_consumed);
    assert_eq!(d.status.canary.unwrap().version.digest, NEW, "untouched");
    assert!(d.events[0].warning);
    assert_eq!(d.events[0].reason, "RolloutCommandIgnored");
    assert!(d.events[0].message.contains(NEW), "{}", d.events[0].message);
    let mut w = serving_old();
    w.command = command(RolloutVerb::Abort, NEW);
    let d = w.pass(1, Some(&newest(OLD)));
    assert!(d.command_consumed);
    assert!(d.events[0].message.contains("no canary is in progress"));
    w.command = command(RolloutVerb::Retry, NEW);
    let d = w.pass(2, Some(&newest(OLD)));
    assert!(d.events[0].message.contains("not remembered"));
}

#[test]
fn rollout_commands_parse_only_a_verb_and_a_full_digest() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let parsed = RolloutCommand::parse(&format!("promote {digest}")).unwrap();
    assert_eq!(parsed.verb, RolloutVerb::Promote);
    assert_eq!(RolloutCommand::parse(&parsed.annotation()).unwrap(), parsed);
    for bad in [
        "",
        "promote",
        "promote sha256:abc",
        "launch sha256:aaaa",
        &format!("abort {digest} now"),
        &format!("abort md5:{}", "ab".repeat(32)),
    ] {
        assert!(RolloutCommand::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn suspend_aborts_and_the_rollout_starts_again_after_resume() {
    let mut w = canary_at_step_one();
    w.suspended = true;
    let d = w.pass(12, Some(&newest(NEW)));
    assert_eq!(d.status.last.unwrap().reason, reasons::SUSPENDED);
    assert!(
        d.status.retiring.is_none(),
        "nothing serves while suspended"
    );
    assert!(d.status.failed_digests.is_empty());
    w.suspended = false;
    let d = w.pass(50, Some(&newest(NEW)));
    assert_eq!(d.status.canary.unwrap().step, 0);
}

#[test]
fn a_restarted_operator_resumes_from_status_and_the_rayservice() {
    let mut w = canary_at_step_one();
    // Restarted: the graph is not fetched yet, so nothing is newest; the step stands and both
    // applications are carried over as they are.
    let d = w.pass(12, None);
    let c = d.status.canary.unwrap();
    assert_eq!((c.step, c.weight), (1, 10));
    assert_eq!(d.applications.len(), 2);
    assert!(d.missing.is_none());
    // A version whose application is gone and whose graph is not in memory is reported.
    w.current.remove("pipe--aaaaaaaaaaaa");
    let d = w.pass(13, None);
    assert!(d.missing.unwrap().contains("pipe--aaaaaaaaaaaa"));
}

#[test]
fn defaults_and_bounds_of_the_policy() {
    let p = Policy::from_spec(&RolloutPolicy::default());
    assert_eq!(p.steps, vec![(10, DEFAULT_PAUSE), (50, DEFAULT_PAUSE)]);
    assert_eq!(
        (p.max_error_rate, p.latency_percentile, p.min_requests),
        (0.05, 95.0, 20)
    );
    assert!(p.retry_on_stable && !p.promote_without_traffic);
    let odd = Policy::from_spec(&RolloutPolicy {
        progress_deadline: Some("1ms".into()),
        gates: Some(RolloutGates {
            max_error_rate: Some(7.0),
            latency_percentile: Some(42),
            max_latency_ratio: Some(0.5),
            min_requests: Some(-3),
            ..Default::default()
        }),
        ..Default::default()
    });
    assert_eq!(odd.progress_deadline, DEFAULT_DEADLINE);
    assert_eq!(
        (
            odd.max_error_rate,
            odd.latency_percentile,
            odd.max_latency_ratio,
            odd.min_requests
        ),
        (0.05, 95.0, 1.5, 20)
    );
}

#[test]
fn validation_and_rendering_agree_on_the_longest_application_name() {
    assert_eq!(
        crate::serve::rollout::MAX_BASE_NAME,
        crate::validation::servepipeline::MAX_CANARY_APPLICATION_NAME
    );
}

#[test]
fn a_spec_edit_mid_rollout_reaches_the_stable_version_when_its_graph_is_in_memory() {
    let mut w = canary_at_step_one();
    // Without the stable graph in memory the stable application is carried over as it is.
    let before = w.current["pipe--aaaaaaaaaaaa"].clone();
    let d = w.pass(12, Some(&newest(NEW)));
    assert_eq!(d.applications[0], before);
    let mut edited = newest(OLD);
    edited.application["deployments"] = json!([{"name": "model_a", "num_replicas": 3}]);
    w.stable_rendered = Some(edited);
    let d = w.pass(13, Some(&newest(NEW)));
    assert_eq!(d.applications[0]["name"], "pipe--aaaaaaaaaaaa");
    assert_eq!(d.applications[0]["deployments"][0]["num_replicas"], 3);
    assert_eq!(
        d.status.canary.unwrap().step,
        1,
        "the rollout goes on at its step"
    );
}

/// OLD stable, NEW deployed beside it and not RUNNING yet (step 0).
fn canary_deploying() -> World {
    let mut w = serving_old();
    w.pass(1, Some(&newest(NEW)));
    w.set_serve("pipe--bbbbbbbbbbbb", "DEPLOYING");
    w
}

/// NEW at its last step (step 2, 50 %) from second 20.
fn canary_at_last_step() -> World {
    let mut w = canary_at_step_one();
    w.traffic((20, 0, 0), (100, 0));
    assert_eq!(
        w.pass(20, Some(&newest(NEW))).status.canary.unwrap().step,
        2
    );
    w
}

/// NEW promoted at second 32; OLD retiring.
fn promoted() -> World {
    let mut w = canary_at_last_step();
    w.traffic((50, 1, 0), (50, 0));
    assert!(w.pass(32, Some(&newest(NEW))).status.canary.is_none());
    w
}

/// One row of the transition table: a world in a phase, what changes, one pass.
struct Transition {
    name: &'static str,
    start: fn() -> World,
    change: fn(&mut World),
    second: i64,
    newest: Option<&'static str>,
    /// The phase after the pass, the Events it publishes, and how a rollout ended (if it did).
    phase: &'static str,
    events: &'static [&'static str],
    ended: Option<(&'static str, &'static str)>,
}

/// A row's world as its start left it.
fn nothing(_: &mut World) {}

/// Every canary transition: (phase, inputs) → (next phase, Events, ending).
const TRANSITIONS: &[Transition] = &[
    Transition {
        name: "Stable, no version yet: the first graph becomes stable at once",
        start: World::new,
        change: nothing,
        second: 0,
        newest: Some(OLD),
        phase: phases::STABLE,
        events: &[],
        ended: None,
    },
    Transition {
        name: "Stable: the same graph again changes nothing",
        start: serving_old,
        change: nothing,
        second: 1,
        newest: Some(OLD),
        phase: phases::STABLE,
        events: &[],
        ended: None,
    },
    Transition {
        name: "Stable: a new graph starts a canary at step 0",
        start: serving_old,
        change: nothing,
        second: 1,
        newest: Some(NEW),
        phase: phases::PROGRESSING,
        events: &["RolloutStarted"],
        ended: None,
    },
    Transition {
        name: "Stable: a rolled-back digest is not tried again",
        start: serving_old,
        change: |w| {
            let status = w.status.as_mut().unwrap();
            status.failed_digests.push(NEW.to_owned());
        },
        second: 1,
        newest: Some(NEW),
        phase: phases::STABLE,
        events: &[],
        ended: None,
    },
    Transition {
        name: "Stable: nothing starts while suspended",
        start: serving_old,
        change: |w| w.suspended = true,
        second: 1,
        newest: Some(NEW),
        phase: phases::STABLE,
        events: &[],
        ended: None,
    },
    Transition {
        name: "Progressing, step 0: waits while the canary deploys",
        start: canary_deploying,
        change: nothing,
        second: 5,
        newest: Some(NEW),
        phase: phases::PROGRESSING,
        events: &[],
        ended: None,
    },
    Transition {
        name: "Progressing, step 0: a RUNNING canary takes the first step",
        start: canary_deploying,
        change: |w| w.set_serve("pipe--bbbbbbbbbbbb", "RUNNING"),
        second: 5,
        newest: Some(NEW),
        phase: phases::PROGRESSING,
        events: &["RolloutStep"],
        ended: None,
    },
    Transition {
        name: "Progressing: a passing step waits for its pause",
        start: canary_at_step_one,
        change: |w| w.traffic((20, 0, 0), (100, 0)),
        second: 15,
        newest: Some(NEW),
        phase: phases::PROGRESSING,
        events: &[],
        ended: None,
    },
    Transition {
        name: "Progressing: a step that passed over its pause advances",
        start: canary_at_step_one,
        change: |w| w.traffic((20, 0, 0), (100, 0)),
        second: 20,
        newest: Some(NEW),
        phase: phases::PROGRESSING,
        events: &["RolloutStep"],
        ended: None,
    },
    Transition {
        name: "Progressing: the last step passed promotes, the old version retires",
        start: canary_at_last_step,
        change: |w| w.traffic((50, 1, 0), (50, 0)),
        second: 32,
        newest: Some(NEW),
        phase: phases::FINISHING,
        events: &["RolloutPromoted"],
        ended: Some((results::PROMOTED, reasons::PROMOTED)),
    },
    Transition {
        name: "Progressing: errors over the gate roll back",
        start: canary_at_step_one,
        change: |w| w.traffic((20, 10, 0), (100, 0)),
        second: 12,
        newest: Some(NEW),
        phase: phases::FINISHING,
        events: &["RolledBack"],
        ended: Some((results::ROLLED_BACK, reasons::ERROR_RATE)),
    },
    Transition {
        name: "Progressing: a failed deployment rolls back",
        start: canary_at_step_one,
        change: |w| w.set_serve("pipe--bbbbbbbbbbbb", "DEPLOY_FAILED"),
        second: 12,
        newest: Some(NEW),
        phase: phases::FINISHING,
        events: &["RolledBack"],
        ended: Some((results::ROLLED_BACK, reasons::DEPLOYMENT_FAILED)),
    },
    Transition {
        name: "Progressing: the deadline without enough traffic rolls back",
        start: canary_at_step_one,
        change: |w| w.traffic((3, 0, 0), (3, 0)),
        second: 311,
        newest: Some(NEW),
        phase: phases::FINISHING,
        events: &["RolledBack"],
        ended: Some((results::ROLLED_BACK, reasons::NO_TRAFFIC)),
    },
    Transition {
        name: "Progressing: suspending aborts, and nothing retires",
        start: canary_at_step_one,
        change: |w| w.suspended = true,
        second: 12,
        newest: Some(NEW),
        phase: phases::STABLE,
        events: &["RolloutAborted"],
        ended: Some((results::ABORTED, reasons::SUSPENDED)),
    },
    Transition {
        name: "Progressing: the registry serving the stable graph again aborts",
        start: canary_at_step_one,
        change: nothing,
        second: 12,
        newest: Some(OLD),
        phase: phases::FINISHING,
        events: &["RolloutAborted"],
        ended: Some((results::ABORTED, reasons::REVERTED)),
    },
    Transition {
        name: "Progressing: a newer graph supersedes the canary",
        start: canary_at_step_one,
        change: nothing,
        second: 12,
        newest: Some(NEWER),
        phase: phases::FINISHING,
        events: &["RolloutAborted"],
        ended: Some((results::ABORTED, reasons::SUPERSEDED)),
    },
    Transition {
        name: "Progressing: without the newest graph (a restart) the step stands",
        start: canary_at_step_one,
        change: nothing,
        second: 12,
        newest: None,
        phase: phases::PROGRESSING,
        events: &[],
        ended: None,
    },
    Transition {
        name: "Finishing: the leaving version stays until the routers move on",
        start: promoted,
        change: nothing,
        second: 33,
        newest: Some(NEW),
        phase: phases::FINISHING,
        events: &[],
        ended: None,
    },
    Transition {
        name: "Finishing: every router on the new generation ends it",
        start: promoted,
        change: |w| w.traffic((0, 0, 0), (5, 0)),
        second: 34,
        newest: Some(NEW),
        phase: phases::STABLE,
        events: &[],
        ended: None,
    },
    Transition {
        name: "Finishing: the grace running out ends it",
        start: promoted,
        change: nothing,
        second: 62,
        newest: Some(NEW),
        phase: phases::STABLE,
        events: &[],
        ended: None,
    },
];

#[test]
fn every_phase_transition_of_the_table() {
    for row in TRANSITIONS {
        let mut w = (row.start)();
        (row.change)(&mut w);
        let before = w.status.clone();
        let newest = row.newest.map(newest);
        let d = w.pass(row.second, newest.as_ref());
        let events: Vec<&str> = d.events.iter().map(|e| e.reason).collect();
        let ended = newly_ended(before.as_ref(), &d.status).map(|_| {
            let last = d.status.last.as_ref().unwrap();
            (last.result.as_str(), last.reason.as_str())
        });
        assert_eq!(
            (d.status.phase.as_str(), events.as_slice(), ended),
            (row.phase, row.events, row.ended),
            "{}",
            row.name
        );
    }
}
