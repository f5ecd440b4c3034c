//! Pure decisions of the RayJob state machine: deadlines, retry accounting after a pass, and
//! which cleanup step runs when (shutdown + TTL, legacy onSuccess/onFailure, deletion rules).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::api::rayjob::{
    DeletionPolicyType, JobDeploymentStatus, JobFailedReason, JobStatus, RayJob, RayJobSpec,
    RayJobStatus,
};

/// `start + seconds` has passed at `now`.
pub fn passed(start: Option<&Time>, seconds: i64, now: &Time) -> bool {
    start.is_some_and(|s| s.0 + SignedDuration::from_secs(seconds) <= now.0)
}

/// The message KubeRay writes when activeDeadlineSeconds fails a job.
pub fn active_deadline_message(status: &RayJobStatus, seconds: i32) -> String {
    format!(
        "The RayJob has passed the activeDeadlineSeconds. StartTime: {}. ActiveDeadlineSeconds: {seconds}",
        status
            .start_time
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default()
    )
}

/// Fails `status` for `reason` with `message`.
pub fn fail(status: &mut RayJobStatus, reason: JobFailedReason, message: impl Into<String>) {
    status.job_deployment_status = Some(JobDeploymentStatus::Failed);
    status.reason = Some(reason);
    status.message = Some(message.into());
}

/// After a pass that began in a non-terminal state (§3.2, "after the switch"): count the run,
/// turn a failure into `Retrying` while retries remain, stamp `endTime` on a terminal status.
pub fn finish_pass(spec: &RayJobSpec, before: &RayJobStatus, after: &mut RayJobStatus, now: &Time) {
    let was = before.job_deployment_status;
    let is = after.job_deployment_status;
    if was == is || was.is_some_and(JobDeploymentStatus::is_terminal) {
        return;
    }
    match is {
        Some(JobDeploymentStatus::Failed) => {
            let failed = after.failed.unwrap_or(0).saturating_add(1);
            after.failed = Some(failed);
            let limit = spec.backoff_limit.unwrap_or(0);
            let retryable = !matches!(
                after.reason,
                Some(JobFailedReason::DeadlineExceeded)
                    | Some(JobFailedReason::JobStatusCheckTimeoutExceeded)
            );
            if limit > 0 && failed < limit.saturating_add(1) && retryable {
                after.job_deployment_status = Some(JobDeploymentStatus::Retrying);
                return;
            }
        }
        Some(JobDeploymentStatus::Complete) if after.job_status == Some(JobStatus::Succeeded) => {
            after.succeeded = Some(after.succeeded.unwrap_or(0).saturating_add(1));
        }
        _ => {}
    }
    if after
        .job_deployment_status
        .is_some_and(JobDeploymentStatus::is_terminal)
    {
        after.end_time = Some(now.clone());
    }
}

/// A cleanup rule in effect: what to delete and how long after `endTime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub policy: DeletionPolicyType,
    pub ttl_seconds: i64,
}

/// What the cluster looks like, as far as knowing whether a rule is done goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterView {
    /// The RayCluster exists and is not being deleted.
    pub exists: bool,
    /// Every worker group is suspended.
    pub workers_suspended: bool,
}

/// The next cleanup step of a finished RayJob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// Run this policy now.
    Run(DeletionPolicyType),
    /// Look again after this long (the earliest pending deadline, plus KubeRay's 2 s).
    Wait(Duration),
    /// Nothing left to do.
    Done,
}

fn destructiveness(policy: DeletionPolicyType) -> u8 {
    match policy {
        DeletionPolicyType::DeleteNone => 0,
        DeletionPolicyType::DeleteWorkers => 1,
        DeletionPolicyType::DeleteCluster => 2,
        DeletionPolicyType::DeleteSelf => 3,
    }
}

/// The rules that apply to a finished RayJob (§3.5 and the shutdown branch of §3.2), given
/// whether the RayJobDeletionPolicy gate is on and whether `DELETE_RAYJOB_CR_AFTER_JOB_FINISHES`
/// is set. A RayJob on an existing cluster (clusterSelector) gets no cleanup at all, as in
/// KubeRay (§3.2): validation accepts DeleteSelf and DeleteNone there, but nothing runs them.
pub fn rules(
    spec: &RayJobSpec,
    status: &RayJobStatus,
    deletion_gate: bool,
    delete_self_after_finish: bool,
) -> Vec<Rule> {
    if spec
        .cluster_selector
        .as_ref()
        .is_some_and(|s| !s.is_empty())
    {
        return Vec::new();
    }
    let ttl = i64::from(spec.ttl_seconds_after_finished.unwrap_or(0));
    let mut rules = Vec::new();
    match (&spec.deletion_strategy, deletion_gate) {
        (Some(strategy), true) => {
            if let Some(deletion_rules) = &strategy.deletion_rules {
                for rule in deletion_rules {
                    let c = &rule.condition;
                    let matches = (c.job_status.is_some() && c.job_status == status.job_status)
                        || (c.job_deployment_status.is_some()
                            && c.job_deployment_status == status.job_deployment_status);
                    if matches {
                        rules.push(Rule {
                            policy: rule.policy,
                            ttl_seconds: i64::from(c.ttl_seconds.unwrap_or(0)),
                        });
                    }
                }
            } else {
                let chosen = match status.job_status {
                    Some(JobStatus::Succeeded) => strategy.on_success.as_ref(),
                    Some(JobStatus::Failed) => strategy.on_failure.as_ref(),
                    _ => None,
                };
                if let Some(policy) = chosen.and_then(|p| p.policy) {
                    rules.push(Rule {
                        policy,
                        ttl_seconds: ttl,
                    });
                }
            }
        }
        _ if spec.shutdown_after_job_finishes == Some(true) => rules.push(Rule {
            policy: if delete_self_after_finish {
                DeletionPolicyType::DeleteSelf
            } else {
                DeletionPolicyType::DeleteCluster
            },
            ttl_seconds: ttl,
        }),
        _ => {}
    }
    rules
}

/// Among the overdue rules not yet carried out, the most destructive runs; otherwise wait for
/// the earliest pending deadline.
pub fn next_cleanup(
    rules: &[Rule],
    end_time: Option<&Time>,
    now: &Time,
    cluster: ClusterView,
) -> Cleanup {
    let Some(end) = end_time else {
        return Cleanup::Done;
    };
    let done = |policy: DeletionPolicyType| match policy {
        DeletionPolicyType::DeleteCluster => !cluster.exists,
        DeletionPolicyType::DeleteWorkers => !cluster.exists || cluster.workers_suspended,
        DeletionPolicyType::DeleteSelf => false,
        DeletionPolicyType::DeleteNone => true,
    };
    let deadline = |r: &Rule| end.0 + SignedDuration::from_secs(r.ttl_seconds.max(0));
    let pending: Vec<&Rule> = rules.iter().filter(|r| !done(r.policy)).collect();
    if let Some(rule) = pending
        .iter()
        .filter(|r| deadline(r) <= now.0)
        .max_by_key(|r| destructiveness(r.policy))
    {
        return Cleanup::Run(rule.policy);
    }
    match pending.iter().map(|r| deadline(r)).min() {
        Some(at) => Cleanup::Wait(until(now.0, at) + Duration::from_secs(2)),
        None => Cleanup::Done,
    }
}

fn until(now: Timestamp, at: Timestamp) -> Duration {
    let d = at.duration_since(now);
    Duration::try_from(d).unwrap_or_default()
}

/// Ray reports times in Unix milliseconds; the API stores whole seconds.
pub fn from_millis(ms: u64) -> Option<Time> {
    let ms = i64::try_from(ms).ok()?;
    Timestamp::from_millisecond(ms)
        .ok()
        .map(crate::k8s::whole_seconds)
}

/// Deadline checks shared by Initializing, Waiting and Running; true when the job failed.
pub(super) fn check_deadlines(
    job: &RayJob,
    status: &mut RayJobStatus,
    now: &Time,
    pre_running: bool,
) -> bool {
    if let Some(seconds) = job.spec.active_deadline_seconds
        && passed(status.start_time.as_ref(), seconds.into(), now)
    {
        let message = active_deadline_message(status, seconds);
        fail(status, JobFailedReason::DeadlineExceeded, message);
        return true;
    }
    if pre_running
        && let Some(seconds) = job.spec.pre_running_deadline_seconds
        && passed(status.start_time.as_ref(), seconds.into(), now)
    {
        fail(
            status,
            JobFailedReason::PreRunningDeadlineExceeded,
            format!(
                "The RayJob did not reach Running within preRunningDeadlineSeconds ({seconds})."
            ),
        );
        return true;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(s: &str) -> Time {
        Time(s.parse().expect("timestamp"))
    }

    fn spec(v: serde_json::Value) -> RayJobSpec {
        serde_json::from_value(v).expect("spec")
    }

    #[test]
    fn failures_retry_until_the_backoff_limit_then_fail() {
        let spec = spec(json!({"backoffLimit": 2}));
        let before = RayJobStatus {
            job_deployment_status: Some(JobDeploymentStatus::Running),
            ..Default::default()
        };
        let now = t("2026-01-01T00:00:10Z");
        let mut failed_count = 0;
        let mut outcomes = Vec::new();
        for _ in 0..3 {
            let mut after = before.clone();
            after.failed = Some(failed_count);
            fail(&mut after, JobFailedReason::AppFailed, "boom");
            finish_pass(&spec, &before, &mut after, &now);
            failed_count = after.failed.expect("counted");
            outcomes.push((after.job_deployment_status, after.end_time.is_some()));
        }
        assert_eq!(
            outcomes,
            [
                (Some(JobDeploymentStatus::Retrying), false),
                (Some(JobDeploymentStatus::Retrying), false),
                (Some(JobDeploymentStatus::Failed), true)
            ]
        );
        assert_eq!(failed_count, 3);

        let mut deadline = before.clone();
        fail(&mut deadline, JobFailedReason::DeadlineExceeded, "late");
        finish_pass(&spec, &before, &mut deadline, &now);
        assert_eq!(
            deadline.job_deployment_status,
            Some(JobDeploymentStatus::Failed),
            "deadlines are not retried"
        );
    }

    #[test]
    fn success_is_counted_once_and_stamped() {
        let before = RayJobStatus {
            job_deployment_status: Some(JobDeploymentStatus::Running),
            ..Default::default()
        };
        let mut after = before.clone();
        after.job_status = Some(JobStatus::Succeeded);
        after.job_deployment_status = Some(JobDeploymentStatus::Complete);
        let now = t("2026-01-01T00:00:10Z");
        finish_pass(&spec(json!({})), &before, &mut after, &now);
        assert_eq!(
            (after.succeeded, after.end_time.clone()),
            (Some(1), Some(now.clone()))
        );
        let mut again = after.clone();
        finish_pass(&spec(json!({})), &after, &mut again, &now);
        assert_eq!(again.succeeded, Some(1));
    }

    #[test]
    fn shutdown_waits_for_the_ttl_then_deletes_the_cluster() {
        let spec = spec(json!({"shutdownAfterJobFinishes": true, "ttlSecondsAfterFinished": 10}));
        let status = RayJobStatus {
            job_status: Some(JobStatus::Succeeded),
            ..Default::default()
        };
        let rules = rules(&spec, &status, true, false);
        assert_eq!(
            rules,
            [Rule {
                policy: DeletionPolicyType::DeleteCluster,
                ttl_seconds: 10
            }]
        );
        let end = t("2026-01-01T00:00:00Z");
        let live = ClusterView {
            exists: true,
            workers_suspended: false,
        };
        assert_eq!(
            next_cleanup(&rules, Some(&end), &t("2026-01-01T00:00:04Z"), live),
            Cleanup::Wait(Duration::from_secs(8))
        );
        assert_eq!(
            next_cleanup(&rules, Some(&end), &t("2026-01-01T00:00:10Z"), live),
            Cleanup::Run(DeletionPolicyType::DeleteCluster)
        );
        let gone = ClusterView {
            exists: false,
            workers_suspended: false,
        };
        assert_eq!(
            next_cleanup(&rules, Some(&end), &t("2026-01-01T00:00:20Z"), gone),
            Cleanup::Done
        );
    }

    #[test]
    fn the_most_destructive_overdue_rule_runs_first() {
        let spec = spec(json!({"deletionStrategy": {"deletionRules": [
            {"policy": "DeleteWorkers", "condition": {"jobStatus": "FAILED", "ttlSeconds": 0}},
            {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED", "ttlSeconds": 5}},
            {"policy": "DeleteSelf", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 0}},
            {"policy": "DeleteSelf", "condition": {"jobDeploymentStatus": "Failed", "ttlSeconds": 30}}
        ]}}));
        let status = RayJobStatus {
            job_status: Some(JobStatus::Failed),
            job_deployment_status: Some(JobDeploymentStatus::Failed),
            ..Default::default()
        };
        let rules = rules(&spec, &status, true, false);
        assert_eq!(rules.len(), 3, "the SUCCEEDED rule does not match");
        let end = t("2026-01-01T00:00:00Z");
        let live = ClusterView {
            exists: true,
            workers_suspended: false,
        };
        assert_eq!(
            next_cleanup(&rules, Some(&end), &t("2026-01-01T00:00:01Z"), live),
            Cleanup::Run(DeletionPolicyType::DeleteWorkers)
        );
        let suspended = ClusterView {
            exists: true,
            workers_suspended: true,
        };
        assert_eq!(
            next_cleanup(&rules, Some(&end), &t("2026-01-01T00:00:01Z"), suspended),
            Cleanup::Wait(Duration::from_secs(6))
        );
        assert_eq!(
            next_cleanup(&rules, Some(&end), &t("2026-01-01T00:01:00Z"), live),
            Cleanup::Run(DeletionPolicyType::DeleteSelf)
        );
        assert!(
            rules
                .iter()
                .all(|r| r.policy != DeletionPolicyType::DeleteNone)
        );
        // With the gate off the strategy is ignored (and nothing else asks for cleanup).
        assert!(super::rules(&spec, &status, false, false).is_empty());
    }

    #[test]
    fn a_job_on_an_existing_cluster_is_left_alone_when_it_ends() {
        // samples/ray-job.yaml's rayjob-existing-cluster: KubeRay skips every cleanup of a
        // RayJob with a clusterSelector, its legacy onSuccess DeleteSelf included.
        let legacy = spec(json!({
            "clusterSelector": {"ray.io/cluster": "raycluster-autoscaled"},
            "deletionStrategy": {"onSuccess": {"policy": "DeleteSelf"},
                                 "onFailure": {"policy": "DeleteNone"}}
        }));
        let rules_on_selector = spec(json!({
            "clusterSelector": {"ray.io/cluster": "c"},
            "deletionStrategy": {"deletionRules": [
                {"policy": "DeleteSelf", "condition": {"jobStatus": "SUCCEEDED"}}]}
        }));
        let shutdown = spec(json!({
            "clusterSelector": {"ray.io/cluster": "c"}, "shutdownAfterJobFinishes": true
        }));
        let status = RayJobStatus {
            job_status: Some(JobStatus::Succeeded),
            job_deployment_status: Some(JobDeploymentStatus::Complete),
            ..Default::default()
        };
        for s in [&legacy, &rules_on_selector, &shutdown] {
            assert_eq!(rules(s, &status, true, false), [], "{s:?}");
            assert_eq!(rules(s, &status, true, true), [], "{s:?}");
        }
        // Without the selector the same legacy policy deletes the RayJob.
        let mut own = legacy.clone();
        own.cluster_selector = None;
        assert_eq!(
            rules(&own, &status, true, false),
            [Rule {
                policy: DeletionPolicyType::DeleteSelf,
                ttl_seconds: 0
            }]
        );
    }

    #[test]
    fn ray_milliseconds_become_whole_seconds() {
        assert_eq!(
            from_millis(1_795_319_347_234),
            Some(t("2026-11-22T03:49:07Z"))
        );
    }
}
