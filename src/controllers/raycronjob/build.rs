//! The pure part of a RayCronJob pass: which tick is due and what the concurrency policy and
//! history limits make of it ([`plan`]), and the RayJob built for a tick ([`build_job`]).
//! No client, no clock (now is passed in).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::tz::TimeZone;
use kube::ResourceExt;

use super::error::Error;
use crate::api::raycronjob::{ConcurrencyPolicy, RayCronJob};
use crate::api::rayjob::{JobDeploymentStatus, RayJob};

/// Label naming the RayCronJob a RayJob was created by.
pub const CRONJOB_NAME_LABEL: &str = "ray.io/cronjob-name";
/// Annotation with the tick a RayJob was created for (RFC 3339, UTC).
pub const SCHEDULED_TIMESTAMP_ANNOTATION: &str = "ray.io/cronjob-scheduled-timestamp";

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
    schedule: &crate::validation::cron::Schedule,
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

pub fn observe(job: &RayJob) -> Observed {
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

/// KubeRay's name label, and the RayCronJob's Kueue labels (queue name, priority class): each
/// job is a workload Kueue admits on its own (KubeRay drops them, so its jobs bypass the
/// queue).
fn job_labels(cron: &RayCronJob) -> BTreeMap<String, String> {
    let mut labels = crate::kuberay::kueue::queue_labels(cron.labels());
    labels.insert(CRONJOB_NAME_LABEL.to_owned(), cron.name_any());
    labels
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
        labels: Some(job_labels(cron)),
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    pub(in crate::controllers::raycronjob) fn cron(extra: serde_json::Value) -> RayCronJob {
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

    pub(in crate::controllers::raycronjob) fn ts(s: &str) -> Timestamp {
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
        let (schedule, zone) = super::super::validate(cron, &Default::default()).expect("valid");
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
    fn built_jobs_carry_the_crons_queue_labels_and_no_other() {
        let mut c = cron(json!({}));
        c.metadata.labels = Some(BTreeMap::from([
            ("kueue.x-k8s.io/queue-name".to_owned(), "team-a".to_owned()),
            (
                "kueue.x-k8s.io/priority-class".to_owned(),
                "batch".to_owned(),
            ),
            ("team".to_owned(), "a".to_owned()),
        ]));
        let job = build_job(&c, ts("2026-01-01T00:01:00Z")).expect("builds");
        let labels = job.labels();
        assert_eq!(labels["kueue.x-k8s.io/queue-name"], "team-a");
        assert_eq!(labels["kueue.x-k8s.io/priority-class"], "batch");
        assert!(!labels.contains_key("team"));
        assert_eq!(labels.len(), 3);
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
}
