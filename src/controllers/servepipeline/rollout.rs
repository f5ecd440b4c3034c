//! The canary rollout of a ServePipeline (strategy `Canary`), as a pure step function: from the
//! rollout's status, the newest valid graph, the applications the RayService carries, their
//! Serve statuses and the routers' counters, [`decide`] computes the next rollout status, the
//! router's configuration, the version applications to keep, and the Events. No client, no
//! clock: everything it needs is passed in, so every transition is unit-tested here.
//!
//! Lifecycle: a new digest starts at step 0 (deployed beside the stable version, no traffic);
//! when its application is RUNNING it takes each step's weight for the step's pause; a step
//! passes when its gates hold on at least `minRequests` canary requests; after the last step
//! it is promoted. A failed gate, a failed deployment or the deadline rolls it back, and its
//! digest is remembered. The version leaving (old stable, or the rolled-back canary) stays
//! deployed until every router reports the new generation, so requests routed to it before
//! the switch finish where they started ("retiring").

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use crate::api::servepipeline::{
    ApplicationStatus, CanaryStatus, GateReadings, RolloutCommand, RolloutOutcome, RolloutPolicy,
    RolloutStatus, RolloutVerb, VersionStatus,
};
use crate::serve::rollout::{
    CanaryTarget, RouteTarget, RouterConfig, RouterStats, SIGNIFICANT_SHIFT_Z, VersionCounters,
    latency_shift_z, version_application_name,
};
use crate::validation::servepipeline::RolloutTiming;

/// Rollout phases in status.
pub mod phases {
    pub const STABLE: &str = "Stable";
    pub const PROGRESSING: &str = "Progressing";
    pub const FINISHING: &str = "Finishing";
}

/// How a rollout ended (`RolloutOutcome.result`).
pub mod results {
    pub const PROMOTED: &str = "Promoted";
    pub const ROLLED_BACK: &str = "RolledBack";
    pub const ABORTED: &str = "Aborted";
}

/// Why (`RolloutOutcome.reason`, Event reasons).
pub mod reasons {
    pub const PROMOTED: &str = "Promoted";
    pub const ERROR_RATE: &str = "ErrorRate";
    pub const LATENCY: &str = "Latency";
    pub const DEPLOYMENT_FAILED: &str = "DeploymentFailed";
    pub const PROGRESS_DEADLINE: &str = "ProgressDeadlineExceeded";
    pub const NO_TRAFFIC: &str = "NoTraffic";
    pub const REVERTED: &str = "Reverted";
    pub const SUPERSEDED: &str = "Superseded";
    pub const SUSPENDED: &str = "Suspended";
    pub const PROMOTED_BY_COMMAND: &str = "PromotedByCommand";
    pub const ABORTED_BY_COMMAND: &str = "AbortedByCommand";
}

/// A rollout that `next` records as ended and `previous` did not: its result, one of the fixed
/// `results` (so a metric labelled with it stays bounded; a string outside them, e.g. from a
/// status another writer left, is not counted), and a key naming that rollout (the canary's
/// digest and start), by which a caller counts it once even when a reconcile on a cached,
/// older status decides the same ending again.
pub fn newly_ended(
    previous: Option<&RolloutStatus>,
    next: &RolloutStatus,
) -> Option<(&'static str, String)> {
    let last = next.last.as_ref()?;
    if previous.and_then(|p| p.last.as_ref()) == Some(last) {
        return None;
    }
    let result = [results::PROMOTED, results::ROLLED_BACK, results::ABORTED]
        .into_iter()
        .find(|known| *known == last.result)?;
    let started = previous
        .and_then(|p| p.canary.as_ref())
        .filter(|c| c.version.digest == last.digest)
        .map(|c| c.started_at.0.to_string())
        .unwrap_or_default();
    Some((result, format!("{}@{started}", last.digest)))
}

/// Digests remembered as rolled back (the oldest are forgotten first).
pub const MAX_FAILED_DIGESTS: usize = 10;
/// How long a leaving version is kept when the routers' counters cannot be read to confirm
/// they moved on (a router takes a new `user_config` within about a second).
pub const RETIRE_GRACE: Duration = Duration::from_secs(30);

/// The policy with its defaults applied and its durations parsed (bounded).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// (weight in percent, pause) per step.
    pub steps: Vec<(i32, Duration)>,
    pub max_error_rate: f64,
    pub latency_percentile: f64,
    pub max_latency_ratio: f64,
    pub latency_tolerance_ms: f64,
    pub min_requests: u64,
    pub progress_deadline: Duration,
    pub retry_on_stable: bool,
    pub promote_without_traffic: bool,
}

pub const DEFAULT_PAUSE: Duration = crate::validation::servepipeline::DEFAULT_STEP_PAUSE;
#[cfg(test)]
pub const DEFAULT_DEADLINE: Duration = crate::validation::servepipeline::DEFAULT_PROGRESS_DEADLINE;

impl Policy {
    /// The policy of a spec whose durations `validation` parsed; unset or out of bounds values
    /// (an object the webhook did not see) are the defaults.
    #[cfg(test)]
    pub fn from_spec(spec: &RolloutPolicy) -> Policy {
        Policy::new(
            spec,
            &crate::validation::servepipeline::rollout_timing(spec),
        )
    }

    /// Defaults for what the spec leaves out, with the durations `timing` parsed from it.
    pub fn new(spec: &RolloutPolicy, timing: &RolloutTiming) -> Policy {
        let mut steps: Vec<(i32, Duration)> = spec
            .steps
            .iter()
            .zip(&timing.step_pauses)
            .map(|(s, pause)| (s.weight.clamp(1, 100), *pause))
            .collect();
        if steps.is_empty() {
            steps = vec![(10, DEFAULT_PAUSE), (50, DEFAULT_PAUSE)];
        }
        let gates = spec.gates.clone().unwrap_or_default();
        let percentile = match gates.latency_percentile {
            Some(p @ (50 | 90 | 95 | 99)) => f64::from(p),
            _ => 95.0,
        };
        Policy {
            steps,
            max_error_rate: gates
                .max_error_rate
                .filter(|r| (0.0..=1.0).contains(r))
                .unwrap_or(0.05),
            latency_percentile: percentile,
            max_latency_ratio: gates
                .max_latency_ratio
                .filter(|r| r.is_finite() && *r >= 1.0)
                .unwrap_or(1.5),
            latency_tolerance_ms: gates
                .latency_tolerance_ms
                .filter(|t| t.is_finite() && *t >= 0.0)
                .unwrap_or(10.0),
            min_requests: gates
                .min_requests
                .and_then(|n| u64::try_from(n).ok())
                .filter(|n| *n >= 1)
                .unwrap_or(20),
            progress_deadline: timing.progress_deadline,
            retry_on_stable: spec.retry_on_stable.unwrap_or(true),
            promote_without_traffic: spec.promote_without_traffic.unwrap_or(false),
        }
    }
}

/// The newest valid graph, rendered as a version application.
#[derive(Debug, Clone)]
pub struct Newest {
    pub digest: String,
    pub version: Option<String>,
    /// Its application (named by [`version_application_name`]).
    pub application: Value,
    /// What it changes against the stable graph, when that graph is known.
    pub plan: Vec<String>,
}

pub struct Inputs<'a> {
    pub policy: &'a Policy,
    pub previous: Option<&'a RolloutStatus>,
    /// The router application's name; version applications are named after it.
    pub base: &'a str,
    /// The executor deployment of every version application.
    pub executor: &'a str,
    pub newest: Option<&'a Newest>,
    /// The stable version's graph rendered with today's spec, when that graph is in memory:
    /// a spec edit then reaches the stable version too, not only the canary.
    pub stable_rendered: Option<&'a Newest>,
    /// The applications the RayService's Serve config carries now, by name.
    pub current: &'a BTreeMap<String, Value>,
    /// Their Serve statuses as the RayService reports them.
    pub serve: &'a BTreeMap<String, ApplicationStatus>,
    /// The routers' counters, when they could be read.
    pub stats: Option<&'a RouterStats>,
    pub suspended: bool,
    /// `rollout.paused`: the canary holds its step and its clocks stand still.
    pub paused: bool,
    /// The pipeline's rollout command, when its annotation parses.
    pub command: Option<&'a RolloutCommand>,
    pub now: &'a Time,
}

/// An Event to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Announcement {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Debug, Clone)]
pub struct Decision {
    pub status: RolloutStatus,
    /// `None` while there is no version to serve yet.
    pub router: Option<RouterConfig>,
    /// Version applications to deploy: stable, canary, retiring (those present).
    pub applications: Vec<Value>,
    pub events: Vec<Announcement>,
    /// A rollout step or a retirement is under way: look again soon.
    pub active: bool,
    /// A version the config needs cannot be produced (its application is gone and its graph
    /// is not in memory); the RayService is then left as it is.
    pub missing: Option<String>,
    /// The command was acted on, or found not to apply: its annotation can go.
    pub command_consumed: bool,
}

fn elapsed(now: &Time, since: &Time) -> Duration {
    Duration::try_from(now.0.duration_since(since.0)).unwrap_or_default()
}

fn short(digest: &str) -> String {
    crate::api::servepipeline::short_digest(digest)
}

/// `<n+1>.<short digest>.<step>`: a new generation restarts the routers' counters.
fn next_generation(previous: &str, digest: &str, step: &str) -> String {
    let n: u64 = previous
        .split('.')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    format!("{}.{}.{}", n.saturating_add(1), short(digest), step)
}

/// A failed deployment of a version application: (node, message).
fn deployment_failure(app: Option<&ApplicationStatus>) -> Option<(Option<String>, String)> {
    let app = app?;
    let failed = |s: Option<&str>| matches!(s, Some("DEPLOY_FAILED" | "UNHEALTHY"));
    let node = app
        .deployments
        .iter()
        .find(|(_, d)| failed(d.status.as_deref()));
    if let Some((name, d)) = node {
        return Some((
            Some(name.clone()),
            format!(
                "deployment {name} is {}: {}",
                d.status.as_deref().unwrap_or_default(),
                first_line(d.message.as_deref().unwrap_or("no message"))
            ),
        ));
    }
    failed(app.status.as_deref()).then(|| {
        (
            None,
            format!(
                "the application is {}: {}",
                app.status.as_deref().unwrap_or_default(),
                first_line(app.message.as_deref().unwrap_or("no message"))
            ),
        )
    })
}

/// The last non-empty line (a Python traceback ends with the exception).
fn first_line(text: &str) -> String {
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(text);
    crate::k8s::truncate(line.trim(), 400)
}

fn running(app: Option<&ApplicationStatus>) -> bool {
    app.is_some_and(|a| a.status.as_deref() == Some("RUNNING"))
}

/// The readings of the current step from the routers' counters (zeros when they report
/// another generation).
pub fn readings(stats: Option<&RouterStats>, generation: &str, policy: &Policy) -> GateReadings {
    let Some(stats) = stats.filter(|s| s.generation.as_deref() == Some(generation)) else {
        return GateReadings::default();
    };
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    // Two decimals: enough to judge, and a status that does not churn on noise.
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let percentile = |c: &VersionCounters| {
        c.percentile_ms(&stats.bounds_ms, policy.latency_percentile)
            .map(round)
    };
    GateReadings {
        canary_requests: count(stats.canary.requests),
        canary_errors: count(stats.canary.errors),
        retried_on_stable: count(stats.canary.retried),
        stable_requests: count(stats.stable.requests),
        canary_latency_ms: percentile(&stats.canary),
        stable_latency_ms: percentile(&stats.stable),
        latency_shift_z: latency_shift_z(&stats.canary, &stats.stable).map(round),
    }
}

/// The verdict of the gates on one step's readings.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Not enough canary requests yet.
    NoEvidence,
    Pass,
    Fail {
        reason: &'static str,
        message: String,
    },
}

/// Fewest samples on each side before latency percentiles are compared: below it a p95 is
/// the single slowest request (often a cold start of the new replicas).
pub const MIN_LATENCY_SAMPLES: u64 = 20;

/// The gates on one step's readings. Errors fail at once; latency is compared only over a whole
/// step window (`window_over`) and with at least [`MIN_LATENCY_SAMPLES`] (or `minRequests`)
/// requests on both sides, so the first requests to new replicas do not decide alone. A
/// latency failure needs all three: the percentile over the ratio, over the tolerance, and the
/// whole distribution shifted ([`SIGNIFICANT_SHIFT_Z`]), so a loaded machine's chance spread in
/// the tail does not roll a good version back. A step at 100 % has no stable traffic to compare
/// with, so only its errors count.
pub fn judge(r: &GateReadings, policy: &Policy, window_over: bool, weight: i32) -> Verdict {
    let requests = u64::try_from(r.canary_requests).unwrap_or(0);
    if requests < policy.min_requests {
        return Verdict::NoEvidence;
    }
    let rate = r.canary_errors as f64 / requests as f64;
    if rate > policy.max_error_rate {
        return Verdict::Fail {
            reason: reasons::ERROR_RATE,
            message: format!(
                "{} of {} canary requests failed ({:.1} %, the gate allows {:.1} %)",
                r.canary_errors,
                requests,
                rate * 100.0,
                policy.max_error_rate * 100.0
            ),
        };
    }
    if weight >= 100 {
        return Verdict::Pass;
    }
    let samples = policy.min_requests.max(MIN_LATENCY_SAMPLES);
    if requests < samples || u64::try_from(r.stable_requests).unwrap_or(0) < samples {
        return Verdict::NoEvidence;
    }
    if !window_over {
        return Verdict::Pass;
    }
    if let (Some(canary), Some(stable), Some(shift)) =
        (r.canary_latency_ms, r.stable_latency_ms, r.latency_shift_z)
        && canary > stable * policy.max_latency_ratio
        && canary - stable > policy.latency_tolerance_ms
        && shift >= SIGNIFICANT_SHIFT_Z
    {
        return Verdict::Fail {
            reason: reasons::LATENCY,
            message: format!(
                "canary p{} latency {canary:.1} ms against stable {stable:.1} ms (the gate \
                 allows {}×), and slower over the whole step (rank test z {shift:.2})",
                policy.latency_percentile, policy.max_latency_ratio
            ),
        };
    }
    Verdict::Pass
}

/// One rollout step: each phase's step in turn (a version that stopped retiring lets a canary
/// start in the same pass; a canary that ended lets the next one start), then what to deploy.
pub fn decide(inputs: &Inputs<'_>) -> Decision {
    let mut status = inputs.previous.cloned().unwrap_or_else(|| RolloutStatus {
        phase: phases::STABLE.to_owned(),
        ..Default::default()
    });
    let mut events = Vec::new();
    let mut consumed = false;
    finishing_step(&mut status, inputs);
    if let Some(command) = inputs.command.filter(|c| c.verb == RolloutVerb::Retry) {
        retry(&mut status, command, &mut events);
        consumed = true;
    }
    if let Some(canary) = status.canary.clone() {
        let canary = held_or_released(canary, inputs, &mut events);
        consumed |= progressing_step(&mut status, canary, inputs, &mut events);
    }
    if inputs.suspended {
        // Nothing serves while suspended: no version waits for routers to move on.
        status.retiring = None;
        status.retiring_since = None;
    }
    if let Some(command) = inputs.command
        && !consumed
        && !waits_for_its_canary(&status, command)
    {
        ignored(&status, command, &mut events);
        consumed = true;
    }
    stable_step(&mut status, inputs, &mut events);
    status.phase = phase_of(&status).to_owned();
    let mut decision = deployment(status, events, inputs);
    decision.command_consumed = consumed;
    decision
}

/// A promote command waits while its canary's application starts (nothing to promote yet).
fn waits_for_its_canary(status: &RolloutStatus, command: &RolloutCommand) -> bool {
    command.verb == RolloutVerb::Promote
        && status
            .canary
            .as_ref()
            .is_some_and(|c| c.version.digest == command.digest)
}

/// `retry`: a digest remembered as failed may start a canary again.
fn retry(status: &mut RolloutStatus, command: &RolloutCommand, events: &mut Vec<Announcement>) {
    if !status.failed_digests.contains(&command.digest) {
        ignored(status, command, events);
        return;
    }
    status.failed_digests.retain(|d| d != &command.digest);
    events.push(Announcement {
        warning: false,
        reason: "RolloutRetry",
        message: format!(
            "graph {} may be rolled out again (by command)",
            command.digest
        ),
    });
}

/// A command that names no canary in progress: a Warning, unless it was already carried out
/// (the annotation outlived the pass that acted on it).
fn ignored(status: &RolloutStatus, command: &RolloutCommand, events: &mut Vec<Announcement>) {
    let done = status.last.as_ref().is_some_and(|last| {
        last.digest == command.digest
            && match command.verb {
                RolloutVerb::Promote => last.reason == reasons::PROMOTED_BY_COMMAND,
                RolloutVerb::Abort => last.reason == reasons::ABORTED_BY_COMMAND,
                RolloutVerb::Retry => false,
            }
    });
    if done {
        return;
    }
    let why = match command.verb {
        RolloutVerb::Retry => "it is not remembered as rolled back or aborted".to_owned(),
        _ => match &status.canary {
            Some(c) => format!("the canary in progress is {}", c.version.digest),
            None => "no canary is in progress".to_owned(),
        },
    };
    events.push(Announcement {
        warning: true,
        reason: "RolloutCommandIgnored",
        message: format!("{} {}: {why}", command.verb.as_str(), command.digest),
    });
}

/// `rollout.paused`: the canary's clocks stop when it is paused and, when it is resumed, move
/// on by the time it was held, so neither its step's pause nor the deadline counts the hold.
fn held_or_released(
    mut canary: CanaryStatus,
    inputs: &Inputs<'_>,
    events: &mut Vec<Announcement>,
) -> CanaryStatus {
    let label = label_of(&canary.version);
    match (&canary.paused_at, inputs.paused) {
        (None, true) => {
            canary.paused_at = Some(inputs.now.clone());
            events.push(Announcement {
                warning: false,
                reason: "RolloutPaused",
                message: format!(
                    "graph {label} holds at step {} of {} ({} %) while rollout.paused is true",
                    canary.step, canary.steps, canary.weight
                ),
            });
        }
        (Some(since), false) => {
            let held = elapsed(inputs.now, since);
            let later = |t: &Time| {
                Time(
                    t.0.checked_add(jiff::SignedDuration::try_from(held).unwrap_or_default())
                        .unwrap_or(t.0),
                )
            };
            canary.started_at = later(&canary.started_at);
            canary.step_started_at = later(&canary.step_started_at);
            canary.paused_at = None;
            events.push(Announcement {
                warning: false,
                reason: "RolloutResumed",
                message: format!(
                    "graph {label} goes on from step {} of {} after {} s held",
                    canary.step,
                    canary.steps,
                    held.as_secs()
                ),
            });
        }
        _ => {}
    }
    canary
}

fn label_of(version: &VersionStatus) -> String {
    version
        .version
        .clone()
        .unwrap_or_else(|| short(&version.digest))
}

/// The phase a rollout status is in.
fn phase_of(status: &RolloutStatus) -> &'static str {
    if status.canary.is_some() {
        phases::PROGRESSING
    } else if status.retiring.is_some() {
        phases::FINISHING
    } else {
        phases::STABLE
    }
}

/// Phase `Finishing`: the version leaving the cluster goes once every router moved to the
/// current generation (or the grace ran out, or nothing serves it any more).
fn finishing_step(status: &mut RolloutStatus, inputs: &Inputs<'_>) {
    let Some(retiring) = status.retiring.clone() else {
        return;
    };
    let moved_on = inputs
        .stats
        .is_some_and(|s| s.all_routers_on(&status.generation));
    let waited = status
        .retiring_since
        .as_ref()
        .is_none_or(|since| elapsed(inputs.now, since) >= RETIRE_GRACE);
    if moved_on || waited || inputs.suspended || !inputs.current.contains_key(&retiring) {
        status.retiring = None;
        status.retiring_since = None;
    }
}

/// Phase `Progressing`: the canary is aborted, fails, advances, is promoted or waits.
fn progressing_step(
    status: &mut RolloutStatus,
    canary: CanaryStatus,
    inputs: &Inputs<'_>,
    events: &mut Vec<Announcement>,
) -> bool {
    let newest = inputs.newest;
    let is_newest = |digest: &str| newest.is_some_and(|n| n.digest == digest);
    let stable_digest = status.stable.as_ref().map(|s| s.digest.clone());
    let app_status = inputs.serve.get(&canary.version.application);
    let ending = if inputs.suspended {
        Some(Ending::aborted(
            reasons::SUSPENDED,
            "the pipeline was suspended; the rollout starts again when it resumes",
        ))
    } else if newest.is_some() && stable_digest.as_deref().is_some_and(is_newest) {
        Some(Ending::aborted(
            reasons::REVERTED,
            "the registry serves the stable graph again",
        ))
    } else if newest.is_some() && !is_newest(&canary.version.digest) {
        Some(Ending::aborted(
            reasons::SUPERSEDED,
            "the registry serves a newer graph; it is rolled out next",
        ))
    } else if let Some((node, message)) = deployment_failure(app_status) {
        Some(Ending {
            result: results::ROLLED_BACK,
            reason: reasons::DEPLOYMENT_FAILED,
            node,
            message,
        })
    } else {
        commanded_ending(&canary, inputs)
    };
    let consumed = ending.as_ref().is_some_and(|e| {
        matches!(
            e.reason,
            reasons::PROMOTED_BY_COMMAND | reasons::ABORTED_BY_COMMAND
        )
    });
    match ending {
        Some(ending) => end(status, &canary, ending, inputs.now, events),
        None => judged_step(status, canary, inputs, events),
    }
    consumed
}

/// The ending a promote or abort command for this canary asks for (promote only once the
/// canary's application runs: before that it has nothing to answer with).
fn commanded_ending(canary: &CanaryStatus, inputs: &Inputs<'_>) -> Option<Ending> {
    let command = inputs
        .command
        .filter(|c| c.digest == canary.version.digest)?;
    let at_step = format!("at step {} of {}", canary.step, canary.steps);
    match command.verb {
        RolloutVerb::Abort => Some(Ending {
            result: results::ABORTED,
            reason: reasons::ABORTED_BY_COMMAND,
            node: None,
            message: format!(
                "aborted by command {at_step}; the digest is not rolled out again unless retried"
            ),
        }),
        RolloutVerb::Promote
            if canary.step > 0 || running(inputs.serve.get(&canary.version.application)) =>
        {
            Some(Ending {
                result: results::PROMOTED,
                reason: reasons::PROMOTED_BY_COMMAND,
                node: None,
                message: format!("promoted by command {at_step}"),
            })
        }
        _ => None,
    }
}

/// How a canary ends.
struct Ending {
    result: &'static str,
    reason: &'static str,
    node: Option<String>,
    message: String,
}

impl Ending {
    fn aborted(reason: &'static str, message: &str) -> Ending {
        Ending {
            result: results::ABORTED,
            reason,
            node: None,
            message: message.to_owned(),
        }
    }

    fn rolled_back(reason: &'static str, message: String) -> Ending {
        Ending {
            result: results::ROLLED_BACK,
            reason,
            node: None,
            message,
        }
    }
}

/// A canary that runs: judged on its step's readings against the gates and the deadline.
fn judged_step(
    status: &mut RolloutStatus,
    mut canary: CanaryStatus,
    inputs: &Inputs<'_>,
    events: &mut Vec<Announcement>,
) {
    let (policy, now) = (inputs.policy, inputs.now);
    // A held canary's clocks stand at the moment it was paused.
    let clock = canary.paused_at.clone().unwrap_or_else(|| now.clone());
    let held = canary.paused_at.is_some();
    let readings = readings(inputs.stats, &status.generation, policy);
    let over_deadline = elapsed(&clock, &canary.started_at) >= policy.progress_deadline;
    let step_over = canary.step > 0
        && usize::try_from(canary.step - 1)
            .ok()
            .and_then(|i| policy.steps.get(i))
            .is_none_or(|(_, pause)| elapsed(&clock, &canary.step_started_at) >= *pause);
    let verdict = if canary.step == 0 {
        Verdict::NoEvidence
    } else {
        judge(&readings, policy, step_over, canary.weight)
    };
    canary.readings = (canary.step > 0).then(|| readings.clone());
    match verdict {
        Verdict::Fail { reason, message } => end(
            status,
            &canary,
            Ending::rolled_back(reason, message),
            now,
            events,
        ),
        _ if over_deadline => {
            let ending = deadline_ending(&canary, &verdict, &readings, policy);
            end(status, &canary, ending, now, events);
        }
        _ if held => status.canary = Some(canary),
        _ if canary.step == 0 => {
            if running(inputs.serve.get(&canary.version.application)) {
                advance(status, &mut canary, policy, now, events);
            }
            status.canary = Some(canary);
        }
        Verdict::Pass | Verdict::NoEvidence
            if step_over && (verdict == Verdict::Pass || policy.promote_without_traffic) =>
        {
            if usize::try_from(canary.step).unwrap_or(usize::MAX) >= policy.steps.len() {
                let message = format!(
                    "passed {} steps in {} s",
                    policy.steps.len(),
                    elapsed(now, &canary.started_at).as_secs()
                );
                let ending = Ending {
                    result: results::PROMOTED,
                    reason: reasons::PROMOTED,
                    node: None,
                    message,
                };
                end(status, &canary, ending, now, events);
            } else {
                advance(status, &mut canary, policy, now, events);
                status.canary = Some(canary);
            }
        }
        _ => status.canary = Some(canary),
    }
}

/// Why a canary past its deadline is rolled back: no traffic to judge, or too slow a rollout.
fn deadline_ending(
    canary: &CanaryStatus,
    verdict: &Verdict,
    readings: &GateReadings,
    policy: &Policy,
) -> Ending {
    if canary.step > 0 && *verdict == Verdict::NoEvidence {
        Ending::rolled_back(
            reasons::NO_TRAFFIC,
            format!(
                "step {} saw {} canary and {} stable requests before the deadline, too few to judge (the gates need {} canary requests, and {} on each side to compare latency)",
                canary.step,
                readings.canary_requests,
                readings.stable_requests,
                policy.min_requests,
                policy.min_requests.max(MIN_LATENCY_SAMPLES)
            ),
        )
    } else {
        Ending::rolled_back(
            reasons::PROGRESS_DEADLINE,
            format!(
                "not promoted within {}",
                crate::validation::duration::format_duration(policy.progress_deadline)
            ),
        )
    }
}

/// Ends the canary: promoted (it becomes stable) or not (it leaves, and a rolled-back digest
/// is remembered); the leaving version retires, and the outcome goes to `last` and an Event.
fn end(
    status: &mut RolloutStatus,
    canary: &CanaryStatus,
    ending: Ending,
    now: &Time,
    events: &mut Vec<Announcement>,
) {
    let Ending {
        result,
        reason,
        node,
        message,
    } = ending;
    let promoted = result == results::PROMOTED;
    let leaving = if promoted {
        status.stable.as_ref().map(|s| s.application.clone())
    } else {
        Some(canary.version.application.clone())
    };
    if promoted {
        status.stable = Some(canary.version.clone());
    } else if result == results::ROLLED_BACK || reason == reasons::ABORTED_BY_COMMAND {
        remember_failed(status, &canary.version.digest);
    }
    status.canary = None;
    status.retiring = leaving.filter(|l| Some(l) != status.stable.as_ref().map(|s| &s.application));
    status.retiring_since = status.retiring.as_ref().map(|_| now.clone());
    let stable_digest = status
        .stable
        .as_ref()
        .map(|s| s.digest.clone())
        .unwrap_or_default();
    status.generation = next_generation(&status.generation, &stable_digest, "s");
    let label = canary
        .version
        .version
        .clone()
        .unwrap_or_else(|| short(&canary.version.digest));
    events.push(Announcement {
        warning: result == results::ROLLED_BACK,
        reason: match result {
            results::PROMOTED => "RolloutPromoted",
            results::ROLLED_BACK => "RolledBack",
            _ => "RolloutAborted",
        },
        message: crate::k8s::truncate(
            &format!(
                "graph {label} ({}): {reason}: {message}",
                canary.version.digest
            ),
            1024,
        ),
    });
    status.last = Some(RolloutOutcome {
        digest: canary.version.digest.clone(),
        version: canary.version.version.clone(),
        result: result.to_owned(),
        reason: reason.to_owned(),
        node,
        message,
        at: now.clone(),
        readings: canary.readings.clone(),
    });
}

/// Remembers a rolled-back digest (the newest last; the oldest forgotten past the bound).
fn remember_failed(status: &mut RolloutStatus, digest: &str) {
    status.failed_digests.retain(|d| d != digest);
    status.failed_digests.push(digest.to_owned());
    let overflow = status
        .failed_digests
        .len()
        .saturating_sub(MAX_FAILED_DIGESTS);
    status.failed_digests.drain(..overflow);
}

/// Phase `Stable` (nothing in progress): the first graph becomes stable at once; a new one
/// starts a canary (one at a time: not while a version is still retiring).
fn stable_step(status: &mut RolloutStatus, inputs: &Inputs<'_>, events: &mut Vec<Announcement>) {
    if status.canary.is_some() || inputs.suspended {
        return;
    }
    let Some(n) = inputs.newest else {
        return;
    };
    let known_bad = status.failed_digests.contains(&n.digest);
    let version = VersionStatus {
        digest: n.digest.clone(),
        version: n.version.clone(),
        application: version_application_name(inputs.base, &n.digest),
    };
    match &status.stable {
        None => {
            status.stable = Some(version);
            status.generation = next_generation(&status.generation, &n.digest, "s");
        }
        Some(stable) if stable.digest != n.digest && !known_bad && status.retiring.is_none() => {
            events.push(Announcement {
                warning: false,
                reason: "RolloutStarted",
                message: format!(
                    "graph {} ({}) is deployed beside {} ({}) with no traffic yet; {}",
                    n.version.as_deref().unwrap_or("unversioned"),
                    n.digest,
                    stable.version.as_deref().unwrap_or("unversioned"),
                    stable.digest,
                    if n.plan.is_empty() {
                        "no plan".to_owned()
                    } else {
                        crate::k8s::truncate(&n.plan.join("; "), 600)
                    }
                ),
            });
            status.canary = Some(CanaryStatus {
                version,
                step: 0,
                steps: i32::try_from(inputs.policy.steps.len()).unwrap_or(i32::MAX),
                weight: 0,
                started_at: inputs.now.clone(),
                step_started_at: inputs.now.clone(),
                readings: None,
                plan: n.plan.clone(),
                paused_at: None,
            });
            status.generation = next_generation(&status.generation, &n.digest, "0");
        }
        _ => {}
    }
}

/// What to deploy for `status`: each version's application, rendered from the newest graph
/// (or today's stable render) when it is that version, else carried over from the RayService
/// as it is; and the router's configuration.
fn deployment(status: RolloutStatus, events: Vec<Announcement>, inputs: &Inputs<'_>) -> Decision {
    let mut missing = None;
    let mut application_of = |version: &VersionStatus| -> Option<Value> {
        if let Some(n) = inputs
            .newest
            .filter(|n| n.digest == version.digest)
            .or(inputs
                .stable_rendered
                .filter(|n| n.digest == version.digest))
        {
            let mut app = n.application.clone();
            app["name"] = Value::String(version.application.clone());
            return Some(app);
        }
        let found = inputs.current.get(&version.application).cloned();
        if found.is_none() {
            missing = Some(format!(
                "the Serve application {} of graph {} is not on the RayService and the graph is not in memory",
                version.application, version.digest
            ));
        }
        found
    };
    let mut applications = Vec::new();
    let stable_app = status.stable.as_ref().and_then(&mut application_of);
    applications.extend(stable_app);
    if let Some(c) = &status.canary {
        applications.extend(application_of(&c.version));
    }
    if let Some(r) = &status.retiring
        && let Some(app) = inputs.current.get(r)
    {
        applications.push(app.clone());
    }
    let router = status.stable.as_ref().map(|stable| RouterConfig {
        generation: status.generation.clone(),
        stable: target(stable, inputs.executor),
        canary: status.canary.as_ref().map(|c| CanaryTarget {
            target: target(&c.version, inputs.executor),
            weight: f64::from(c.weight),
        }),
        retry_on_stable: inputs.policy.retry_on_stable,
    });
    Decision {
        active: status.canary.is_some() || status.retiring.is_some(),
        status,
        router,
        applications,
        events,
        missing,
        command_consumed: false,
    }
}

fn target(version: &VersionStatus, executor: &str) -> RouteTarget {
    RouteTarget {
        app: version.application.clone(),
        deployment: executor.to_owned(),
        version: version
            .version
            .clone()
            .unwrap_or_else(|| short(&version.digest)),
    }
}

/// Moves the canary to its next step.
fn advance(
    status: &mut RolloutStatus,
    canary: &mut CanaryStatus,
    policy: &Policy,
    now: &Time,
    events: &mut Vec<Announcement>,
) {
    canary.step = canary.step.saturating_add(1);
    let index = usize::try_from(canary.step - 1).unwrap_or(0);
    canary.weight = policy.steps.get(index).map_or(100, |(w, _)| *w);
    canary.step_started_at = now.clone();
    canary.readings = None;
    status.generation = next_generation(
        &status.generation,
        &canary.version.digest,
        &canary.step.to_string(),
    );
    events.push(Announcement {
        warning: false,
        reason: "RolloutStep",
        message: format!(
            "graph {} takes {} % of requests (step {} of {})",
            canary
                .version
                .version
                .as_deref()
                .unwrap_or(&short(&canary.version.digest)),
            canary.weight,
            canary.step,
            policy.steps.len()
        ),
    });
}

#[cfg(test)]
#[path = "rollout_tests.rs"]
mod tests;
