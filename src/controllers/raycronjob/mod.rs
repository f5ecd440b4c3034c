//! The RayCronJob controller (KubeRay §5, plus batch/v1 CronJob's concurrency policy and history
//! limits as opt-in extensions): get → validate → observe its RayJobs → decide (pure, in
//! [`plan`]) → create / delete RayJobs → status.
//!
//! Decisions taken where KubeRay is quirky:
//! - Missed ticks: KubeRay creates every missed tick, one per pass, so an operator that was down
//!   for an hour starts sixty RayJobs (each with its own RayCluster) in a burst. Here only the
//!   most recent missed tick runs, as batch/v1 CronJob does.
//! - `CRON_TZ=`/`TZ=` in `schedule` are refused (KubeRay and batch/v1 CronJob both do); the
//!   zone comes from `timeZone`, else the operator's local zone.
//! - The clock is injected ([`Clock`]), so tests run a minute-schedule in about a second.

pub mod schedule;

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tracing::{Instrument, debug, info, warn};

use crate::api::raycronjob::{ConcurrencyPolicy, RayCronJob, RayCronJobStatus};
use crate::api::rayjob::{JobDeploymentStatus, RayJob};
use crate::k8s::field_managers;
use crate::validation::cron::Schedule;

/// Label naming the RayCronJob a RayJob was created by.
pub const CRONJOB_NAME_LABEL: &str = "ray.io/cronjob-name";
/// Annotation with the tick a RayJob was created for (RFC 3339, UTC).
pub const SCHEDULED_TIMESTAMP_ANNOTATION: &str = "ray.io/cronjob-scheduled-timestamp";
/// KubeRay's limit on RayCronJob names (the RayJob name adds a suffix).
pub const MAX_NAME_LENGTH: usize = crate::validation::raycronjob::MAX_RAYCRONJOB_NAME;

pub mod reasons {
    pub const INVALID_SPEC: &str = "InvalidRayCronJobSpec";
    pub const SUSPENDED: &str = "SuspendedRayCronJob";
    /// raypipe's own (batch/v1 CronJob's reasons).
    pub const CREATED_RAY_JOB: &str = "SuccessfulCreate";
    pub const DELETED_RAY_JOB: &str = "SuccessfulDelete";
    pub const JOB_ALREADY_ACTIVE: &str = "JobAlreadyActive";
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(transparent)]
    K8s(#[from] crate::k8s::K8sError),
    /// A bug: the reconcile panicked; contained to this object (see `controllers::frame`).
    #[error(transparent)]
    Panicked(#[from] crate::controllers::frame::Panicked),
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube {
        action,
        source: Box::new(source),
    }
}

/// Where "now" comes from, and how long a wait for a future instant really takes.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Timestamp;
    /// Real time to sleep until `at`.
    fn sleep_until(&self, at: Timestamp) -> Duration {
        Duration::try_from(at.duration_since(self.now())).unwrap_or_default()
    }
}

/// The wall clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that starts at `origin` and runs `speed` times faster than real time (tests: at 60×
/// a minute schedule ticks every second).
#[derive(Debug)]
pub struct FastClock {
    origin: Timestamp,
    started: std::time::Instant,
    speed: u32,
}

impl FastClock {
    pub fn new(origin: Timestamp, speed: u32) -> FastClock {
        FastClock {
            origin,
            started: std::time::Instant::now(),
            speed: speed.max(1),
        }
    }
}

impl Clock for FastClock {
    fn now(&self) -> Timestamp {
        let elapsed = self.started.elapsed() * self.speed;
        self.origin
            .checked_add(SignedDuration::try_from(elapsed).unwrap_or(SignedDuration::MAX))
            .unwrap_or(self.origin)
    }
    fn sleep_until(&self, at: Timestamp) -> Duration {
        Duration::try_from(at.duration_since(self.now())).unwrap_or_default() / self.speed
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub namespace: Option<String>,
    pub concurrency: u16,
    pub clock: Arc<dyn Clock>,
    /// The zone of schedules without `timeZone` (KubeRay: the operator's local zone).
    pub default_time_zone: TimeZone,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: None,
            concurrency: 4,
            clock: Arc::new(SystemClock),
            default_time_zone: TimeZone::system(),
        }
    }
}

struct Context {
    client: kube::Client,
    config: Config,
    recorder: Recorder,
}

fn reconcile_relevant(cron: &RayCronJob) -> Option<u64> {
    let meta = cron.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    Some(hasher.finish())
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    client: kube::Client,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (crons, jobs): (Api<RayCronJob>, Api<RayJob>) = match config.namespace.as_deref() {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let concurrency = config.concurrency.max(1);
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(client.clone(), "raycronjob-controller"),
        client,
        config,
    });
    let (store, writer) = reflector::store();
    let cron_events = watcher(crons, watcher::Config::default())
        .backoff(crate::k8s::watch_backoff())
        .modify(|c: &mut RayCronJob| c.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(reconcile_relevant, Default::default());
    // RayJobs finishing free a Forbid slot and feed the history: watch the ones we created.
    let job_events = watcher(jobs, watcher::Config::default().labels(CRONJOB_NAME_LABEL))
        .backoff(crate::k8s::watch_backoff())
        .touched_objects();
    Controller::for_stream(cron_events, store)
        .trigger_backoff(crate::k8s::watch_backoff())
        .owns_stream(job_events)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            crate::controllers::frame::contain("raycronjob", reconcile),
            crate::controllers::frame::contain_policy("raycronjob", error_policy),
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "raycronjob reconcile loop");
            }
        })
        .await;
}

impl crate::controllers::frame::ReportPanic<RayCronJob> for Context {
    fn report_panic(
        &self,
        object: Arc<RayCronJob>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        crate::controllers::frame::panic_event(&self.recorder, object, message)
    }
}

fn error_policy(cron: Arc<RayCronJob>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(
        namespace = %cron.namespace().unwrap_or_default(),
        name = %cron.name_any(),
        error = %error,
        "RayCronJob reconcile failed"
    );
    Action::requeue(Duration::from_secs(5))
}

/// The problem KubeRay would report (§6.2), if any.
pub fn validate(cron: &RayCronJob) -> Result<(Schedule, TimeZone), String> {
    crate::validation::raycronjob::controller_checks(cron).map_err(|p| p.message)
}

/// The RayJob name for a tick: `<cronjob>-<minutes since the epoch>` (KubeRay's and batch/v1's).
pub fn job_name(cron: &str, tick: Timestamp) -> String {
    format!("{cron}-{}", tick.as_second().div_euclid(60))
}

/// How a RayJob of this RayCronJob stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    Active,
    Succeeded,
    Failed,
}

/// One RayJob as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub name: String,
    pub state: JobState,
    /// For ordering history: the tick it ran for (or its creation time).
    pub scheduled: Timestamp,
}

/// What a pass does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Create a RayJob for this tick.
    pub create: Option<Timestamp>,
    /// Delete these RayJobs (Replace, history limits).
    pub delete: Vec<String>,
    /// The tick was skipped because RayJobs are active (Forbid).
    pub skipped: Option<Timestamp>,
    /// When to look again.
    pub next: Option<Timestamp>,
}

/// The decision of one pass (pure): which tick is due, what the concurrency policy makes of it,
/// what the history limits prune.
pub fn plan(
    cron: &RayCronJob,
    schedule: &Schedule,
    zone: &TimeZone,
    jobs: &[Observed],
    now: Timestamp,
) -> Plan {
    let mut plan = Plan::default();
    let created = cron
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    let last = cron
        .status
        .as_ref()
        .and_then(|s| s.last_schedule_time.as_ref())
        .map_or(created, |t| t.0);
    // The most recent tick in (last, now], walking at most a bounded number of ticks.
    let mut due = None;
    let mut cursor = last;
    for _ in 0..100_000 {
        match schedule.next(cursor, zone) {
            Some(t) if t <= now => {
                due = Some(t);
                cursor = t;
            }
            _ => break,
        }
    }
    plan.next = schedule.next(due.unwrap_or(last).max(now), zone);
    let active: Vec<&Observed> = jobs
        .iter()
        .filter(|j| j.state == JobState::Active)
        .collect();
    if cron.spec.suspend != Some(true)
        && let Some(tick) = due
    {
        match cron.spec.concurrency_policy.unwrap_or_default() {
            ConcurrencyPolicy::Forbid if !active.is_empty() => plan.skipped = Some(tick),
            ConcurrencyPolicy::Replace => {
                plan.delete.extend(active.iter().map(|j| j.name.clone()));
                plan.create = Some(tick);
            }
            _ => plan.create = Some(tick),
        }
    }
    for (state, limit) in [
        (JobState::Succeeded, cron.spec.successful_jobs_history_limit),
        (JobState::Failed, cron.spec.failed_jobs_history_limit),
    ] {
        let Some(limit) = limit else { continue };
        let mut finished: Vec<&Observed> = jobs.iter().filter(|j| j.state == state).collect();
        finished.sort_by_key(|j| (j.scheduled, j.name.clone()));
        let excess = finished
            .len()
            .saturating_sub(usize::try_from(limit).unwrap_or(0));
        plan.delete
            .extend(finished.iter().take(excess).map(|j| j.name.clone()));
    }
    plan
}

fn observe(job: &RayJob) -> Observed {
    let state = match job.status.as_ref().and_then(|s| s.job_deployment_status) {
        Some(JobDeploymentStatus::Complete) => JobState::Succeeded,
        Some(JobDeploymentStatus::Failed) => JobState::Failed,
        _ => JobState::Active,
    };
    let scheduled = job
        .annotations()
        .get(SCHEDULED_TIMESTAMP_ANNOTATION)
        .and_then(|t| t.parse().ok())
        .or_else(|| job.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .unwrap_or_default();
    Observed {
        name: job.name_any(),
        state,
        scheduled,
    }
}

/// The RayJob for `tick` (§5): the template's spec, owned by the RayCronJob.
pub fn build_job(cron: &RayCronJob, tick: Timestamp) -> Result<RayJob, Error> {
    let mut job = RayJob::new(
        &job_name(&cron.name_any(), tick),
        cron.spec.job_template.clone(),
    );
    job.metadata = ObjectMeta {
        name: Some(job_name(&cron.name_any(), tick)),
        namespace: cron.namespace(),
        labels: Some(BTreeMap::from([(
            CRONJOB_NAME_LABEL.to_owned(),
            cron.name_any(),
        )])),
        annotations: Some(BTreeMap::from([(
            SCHEDULED_TIMESTAMP_ANNOTATION.to_owned(),
            // RFC 3339 in UTC, whole seconds.
            crate::k8s::whole_seconds(tick).0.to_string(),
        )])),
        owner_references: Some(vec![crate::k8s::controller_owner_ref(cron)?]),
        ..Default::default()
    };
    Ok(job)
}

async fn reconcile(cron: Arc<RayCronJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "reconcile",
        kind = "RayCronJob",
        namespace = %cron.namespace().unwrap_or_default(),
        name = %cron.name_any()
    );
    reconcile_inner(&cron, &ctx).instrument(span).await
}

async fn reconcile_inner(cron: &RayCronJob, ctx: &Context) -> Result<Action, Error> {
    if cron.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = cron.namespace().unwrap_or_default();
    let crons: Api<RayCronJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let jobs_api: Api<RayJob> = Api::namespaced(ctx.client.clone(), &namespace);
    // Fresh: lastScheduleTime decides whether a tick is due, so it must not be read stale.
    let Some(cron) = crons
        .get_opt(&cron.name_any())
        .await
        .map_err(kube_err("reading the RayCronJob"))?
    else {
        return Ok(Action::await_change());
    };
    let (parsed, zone) = match validate(&cron) {
        Ok((parsed, zone)) => {
            let zone = if cron.spec.time_zone.is_some() {
                zone
            } else {
                ctx.config.default_time_zone.clone()
            };
            (parsed, zone)
        }
        Err(message) => {
            warn!(%message, "RayCronJob refused");
            crate::k8s::publish_event(
                &ctx.recorder,
                &cron,
                EventType::Warning,
                reasons::INVALID_SPEC,
                "Validate",
                message,
            )
            .await;
            return Ok(Action::await_change());
        }
    };

    let uid = cron.uid();
    let owned: Vec<RayJob> = jobs_api
        .list(&ListParams::default().labels(&format!("{CRONJOB_NAME_LABEL}={}", cron.name_any())))
        .await
        .map_err(kube_err("listing the RayCronJob's RayJobs"))?
        .items
        .into_iter()
        .filter(|j| {
            j.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == uid.as_ref())
        })
        .filter(|j| j.meta().deletion_timestamp.is_none())
        .collect();
    let observed: Vec<Observed> = owned.iter().map(observe).collect();
    let now = ctx.config.clock.now();
    let plan = plan(&cron, &parsed, &zone, &observed, now);

    for name in &plan.delete {
        // Only the RayJob that was listed as ours (a same-named one made since is not touched).
        let params = DeleteParams {
            preconditions: owned.iter().find(|j| &j.name_any() == name).map(|j| {
                kube::api::Preconditions {
                    uid: j.uid(),
                    resource_version: None,
                }
            }),
            ..DeleteParams::background()
        };
        match jobs_api.delete(name, &params).await {
            Ok(_) => {
                crate::k8s::publish_event(
                    &ctx.recorder,
                    &cron,
                    EventType::Normal,
                    reasons::DELETED_RAY_JOB,
                    "DeleteRayJob",
                    format!("Deleted RayJob {name}"),
                )
                .await;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(kube_err(format!("deleting RayJob {name}"))(e)),
        }
    }
    let mut status = cron.status.clone().unwrap_or_default();
    let mut active: Vec<String> = observed
        .iter()
        .filter(|o| o.state == JobState::Active && !plan.delete.contains(&o.name))
        .map(|o| o.name.clone())
        .collect();
    if let Some(tick) = plan.skipped {
        crate::k8s::publish_event(
            &ctx.recorder,
            &cron,
            EventType::Normal,
            reasons::JOB_ALREADY_ACTIVE,
            "CreateRayJob",
            format!(
                "Not starting a RayJob for {tick}: {} still active and concurrencyPolicy is Forbid",
                active.join(", ")
            ),
        )
        .await;
    }
    if let Some(tick) = plan.create {
        let job = build_job(&cron, tick)?;
        let name = job.name_any();
        match crate::k8s::create_owned(&jobs_api, &job, field_managers::RAYCRONJOB).await {
            // Created in an earlier pass whose status write was lost: the tick is done.
            Ok(crate::k8s::Created::AlreadyOurs(_)) => {}
            Ok(crate::k8s::Created::New(_)) => {
                info!(job = %name, %tick, "created a RayJob");
                crate::k8s::publish_event(
                    &ctx.recorder,
                    &cron,
                    EventType::Normal,
                    reasons::CREATED_RAY_JOB,
                    "CreateRayJob",
                    format!("Created RayJob {name}"),
                )
                .await;
            }
            // Someone else's RayJob has the name: left alone, reported, the tick retried.
            Err(e) => {
                if let Some(reason) = e.conflict_reason() {
                    crate::k8s::publish_event(
                        &ctx.recorder,
                        &cron,
                        EventType::Warning,
                        reason,
                        "CreateRayJob",
                        e.to_string(),
                    )
                    .await;
                }
                return Err(e.into());
            }
        }
        if !active.contains(&name) {
            active.push(name);
        }
        status.last_schedule_time = Some(crate::k8s::whole_seconds(tick));
    }
    active.sort();
    status.active = (!active.is_empty()).then(|| {
        active
            .iter()
            .map(|name| ObjectReference {
                api_version: Some(RayJob::api_version(&()).into_owned()),
                kind: Some(RayJob::kind(&()).into_owned()),
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            })
            .collect()
    });
    write_status(&crons, &cron, &status).await?;

    if cron.spec.suspend == Some(true) {
        crate::k8s::publish_event(
            &ctx.recorder,
            &cron,
            EventType::Normal,
            reasons::SUSPENDED,
            "Suspend",
            "The RayCronJob is suspended; no RayJobs are created".into(),
        )
        .await;
        return Ok(Action::await_change());
    }
    let wait = match plan.next {
        Some(next) => ctx.config.clock.sleep_until(next),
        None => return Ok(Action::await_change()),
    };
    // Also look again soon while RayJobs are active (their status feeds history and Forbid);
    // their watch events bring us back earlier.
    Ok(Action::requeue(wait.max(Duration::from_millis(50))))
}

async fn write_status(
    api: &Api<RayCronJob>,
    cron: &RayCronJob,
    status: &RayCronJobStatus,
) -> Result<(), Error> {
    if cron.status.as_ref() == Some(status)
        || (cron.status.is_none() && *status == RayCronJobStatus::default())
    {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": RayCronJob::api_version(&()),
        "kind": RayCronJob::kind(&()),
        "status": status,
    });
    api.patch_status(
        &cron.name_any(),
        &PatchParams::apply(field_managers::RAYCRONJOB).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(kube_err("writing the RayCronJob status"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cron(extra: serde_json::Value) -> RayCronJob {
        let mut doc = json!({
            "apiVersion": "ray.io/v1", "kind": "RayCronJob",
            "metadata": {"name": "nightly", "namespace": "ns", "uid": "c-1",
                         "creationTimestamp": "2026-01-01T00:00:30Z"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"entrypoint": "python -c 'print(1)'",
                "rayClusterSpec": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "r"}]}}}}}}
        });
        if let (Some(d), Some(e)) = (doc.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                if k == "spec" {
                    for (sk, sv) in v.as_object().expect("object") {
                        d["spec"][sk] = sv.clone();
                    }
                } else {
                    d.insert(k.clone(), v.clone());
                }
            }
        }
        serde_json::from_value(doc).expect("a RayCronJob")
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn job(name: &str, state: JobState, at: &str) -> Observed {
        Observed {
            name: name.into(),
            state,
            scheduled: ts(at),
        }
    }

    fn plan_at(cron: &RayCronJob, jobs: &[Observed], now: &str) -> Plan {
        let (schedule, zone) = validate(cron).expect("valid");
        plan(cron, &schedule, &zone, jobs, ts(now))
    }

    #[test]
    fn the_first_tick_after_creation_runs_and_missed_ticks_collapse() {
        let c = cron(json!({}));
        assert_eq!(plan_at(&c, &[], "2026-01-01T00:00:59Z").create, None);
        let p = plan_at(&c, &[], "2026-01-01T00:01:00Z");
        assert_eq!(p.create, Some(ts("2026-01-01T00:01:00Z")));
        assert_eq!(p.next, Some(ts("2026-01-01T00:02:00Z")));
        // An hour later only the most recent tick runs.
        let p = plan_at(&c, &[], "2026-01-01T01:00:20Z");
        assert_eq!(p.create, Some(ts("2026-01-01T01:00:00Z")));
        assert_eq!(
            job_name("nightly", ts("2026-01-01T01:00:00Z")),
            "nightly-29453820"
        );
    }

    #[test]
    fn concurrency_policies() {
        let active = [job("nightly-1", JobState::Active, "2026-01-01T00:01:00Z")];
        let forbid = cron(json!({"spec": {"concurrencyPolicy": "Forbid"},
            "status": {"lastScheduleTime": "2026-01-01T00:01:00Z"}}));
        let p = plan_at(&forbid, &active, "2026-01-01T00:02:00Z");
        assert_eq!(
            (p.create, p.skipped),
            (None, Some(ts("2026-01-01T00:02:00Z")))
        );
        let p = plan_at(&forbid, &[], "2026-01-01T00:02:00Z");
        assert_eq!(p.create, Some(ts("2026-01-01T00:02:00Z")));

        let replace = cron(json!({"spec": {"concurrencyPolicy": "Replace"},
            "status": {"lastScheduleTime": "2026-01-01T00:01:00Z"}}));
        let p = plan_at(&replace, &active, "2026-01-01T00:02:00Z");
        assert_eq!(
            (p.create, p.delete),
            (
                Some(ts("2026-01-01T00:02:00Z")),
                vec!["nightly-1".to_owned()]
            )
        );

        let allow = cron(json!({"status": {"lastScheduleTime": "2026-01-01T00:01:00Z"}}));
        let p = plan_at(&allow, &active, "2026-01-01T00:02:00Z");
        assert_eq!((p.create.is_some(), p.delete.len()), (true, 0));
    }

    #[test]
    fn history_limits_prune_the_oldest_finished_jobs() {
        let c =
            cron(json!({"spec": {"successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 0}}));
        let jobs = [
            job("a", JobState::Succeeded, "2026-01-01T00:01:00Z"),
            job("b", JobState::Succeeded, "2026-01-01T00:03:00Z"),
            job("c", JobState::Succeeded, "2026-01-01T00:02:00Z"),
            job("d", JobState::Failed, "2026-01-01T00:02:00Z"),
            job("e", JobState::Active, "2026-01-01T00:00:00Z"),
        ];
        let mut deleted = plan_at(&c, &jobs, "2026-01-01T00:00:40Z").delete;
        deleted.sort();
        assert_eq!(deleted, ["a", "c", "d"]);
        let unlimited = cron(json!({}));
        assert!(
            plan_at(&unlimited, &jobs, "2026-01-01T00:00:40Z")
                .delete
                .is_empty()
        );
    }

    #[test]
    fn suspend_creates_nothing() {
        let c = cron(json!({"spec": {"suspend": true}}));
        assert_eq!(plan_at(&c, &[], "2026-01-01T00:05:00Z").create, None);
    }

    #[test]
    fn validation_follows_kuberay() {
        assert!(validate(&cron(json!({}))).is_ok());
        for (patch, needle) in [
            (
                json!({"spec": {"schedule": "CRON_TZ=UTC * * * * *"}}),
                "timeZone",
            ),
            (json!({"spec": {"schedule": "61 * * * *"}}), "cron"),
            (json!({"spec": {"timeZone": "Mars/Base"}}), "time zone"),
            (
                json!({"metadata": {"name": "a-very-long-raycronjob-name-over-36-chars", "namespace": "ns"}}),
                "longer",
            ),
            (
                json!({"spec": {"jobTemplate": {"entrypoint": "x"}}}),
                "rayClusterSpec",
            ),
        ] {
            let message = validate(&cron(patch.clone())).expect_err(&patch.to_string());
            assert!(message.contains(needle), "{patch}: {message}");
        }
        let (_, zone) =
            validate(&cron(json!({"spec": {"timeZone": "Asia/Tokyo"}}))).expect("valid");
        assert_eq!(zone.iana_name(), Some("Asia/Tokyo"));
    }

    #[test]
    fn built_jobs_carry_kuberays_label_and_annotation() {
        let c = cron(json!({}));
        let job = build_job(&c, ts("2026-01-01T00:01:00Z")).expect("builds");
        assert_eq!(job.name_any(), "nightly-29453761");
        assert_eq!(job.labels()[CRONJOB_NAME_LABEL], "nightly");
        assert_eq!(
            job.annotations()[SCHEDULED_TIMESTAMP_ANNOTATION],
            "2026-01-01T00:01:00Z"
        );
        assert_eq!(job.spec, c.spec.job_template);
        assert_eq!(job.owner_references()[0].uid, "c-1");
    }

    #[test]
    fn fast_clock_runs_faster() {
        let clock = FastClock::new(ts("2026-01-01T00:00:00Z"), 60);
        let wait = clock.sleep_until(ts("2026-01-01T00:01:00Z"));
        assert!(
            wait <= Duration::from_secs(1) && wait > Duration::from_millis(900),
            "{wait:?}"
        );
    }
}
