//! KubeRay's rules for a RayCronJob: name, schedule (through the one cron parser), time zone
//! and the RayJob template. [`validate`] collects every problem (the webhook);
//! [`controller_checks`] is the controller's pre-reconcile check, which stops at KubeRay's first
//! problem and hands back the parsed schedule and zone.

use k8s_openapi::jiff::tz::TimeZone;
use kube::ResourceExt;

use super::cron::{self, Schedule, ScheduleError};
use super::feature_gates::{FeatureGates, gates};
use super::k8s_names::{check_name, first_name_problem};
use super::problem::{Problem, Problems};
use super::rayjob::rayjob_spec;
use crate::api::{RayCronJob, RayJob};

/// Longest RayCronJob name KubeRay accepts (`<name>-<minutes>` must stay a valid RayJob name).
pub const MAX_RAYCRONJOB_NAME: usize = 36;
/// The Event reason of a refused RayCronJob (KubeRay's).
pub const INVALID_SPEC: &str = "InvalidRayCronJobSpec";

/// An IANA zone name such as `Europe/Paris` or `UTC` (syntax only: the zone database of the
/// machine that runs the schedule decides whether it exists).
pub(crate) fn is_time_zone_name(zone: &str) -> bool {
    !zone.is_empty()
        && !zone.starts_with('/')
        && !zone
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
        && zone
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '_' | '-' | '+'))
}

/// Why a schedule is refused at admission: the cron parser's problem, or an `@every` that is
/// not positive (the scheduler would round it up to a second; the webhook asks for intent).
pub(crate) fn schedule_problem(schedule: &str) -> Option<String> {
    if let Err(e) = cron::parse(schedule) {
        return Some(match e {
            ScheduleError::Invalid { problem, .. } => problem,
            other => other.to_string(),
        });
    }
    let every = schedule.trim().strip_prefix("@every ")?;
    match crate::validation::parse_go_duration(every.trim()) {
        Ok(nanos) if nanos > 0 => None,
        Ok(_) => Some(format!("@every needs a positive duration, not {every:?}")),
        Err(e) => Some(format!("@every: {e}")),
    }
}

/// Every problem of a RayCronJob (the webhook).
pub fn validate(cron: &RayCronJob, feature_gates: &FeatureGates) -> Vec<Problem> {
    let mut problems = Problems::new(INVALID_SPEC, INVALID_SPEC);
    let spec = &cron.spec;
    // KubeRay runs no RayCronJob controller without the gate; raypipe's neither (`config`),
    // so an admitted RayCronJob would never be scheduled.
    if !feature_gates.enabled(gates::RAY_CRON_JOB) {
        problems.push(format!(
            "RayCronJobs need the {} feature gate, which is off: no controller would schedule this one",
            gates::RAY_CRON_JOB
        ));
    }
    check_name(
        "RayCronJob",
        &cron.name_any(),
        MAX_RAYCRONJOB_NAME,
        &mut problems,
    );
    if spec.schedule.contains("TZ") {
        problems.push("spec.schedule must not contain TZ or CRON_TZ; use spec.timeZone".to_owned());
    } else if let Some(problem) = schedule_problem(&spec.schedule) {
        problems.push(format!("spec.schedule {:?}: {problem}", spec.schedule));
    }
    if let Some(zone) = &spec.time_zone
        && !is_time_zone_name(zone)
    {
        problems.push(format!(
            "spec.timeZone {zone:?} is not a time zone name like Europe/Paris or UTC"
        ));
    }
    rayjob_spec(
        &spec.job_template,
        "spec.jobTemplate",
        cron.annotations(),
        feature_gates,
        &mut problems,
    );
    problems.into_vec()
}

/// The controller's check before it schedules anything: KubeRay's first problem, in KubeRay's
/// words, or the parsed schedule and its zone (UTC when unset).
pub fn controller_checks(
    cron: &RayCronJob,
    feature_gates: &FeatureGates,
) -> Result<(Schedule, TimeZone), Problem> {
    let refuse = |field: &str, message: String| Problem::new(field, INVALID_SPEC, message);
    let name = cron.name_any();
    if let Some(message) = first_name_problem("RayCronJob", &name, MAX_RAYCRONJOB_NAME, "") {
        return Err(refuse("metadata.name", message));
    }
    if cron.spec.schedule.contains("TZ") {
        return Err(refuse(
            "spec.schedule",
            "CRON_TZ or TZ in the schedule is not supported; use spec.timeZone instead".into(),
        ));
    }
    let parsed =
        cron::parse(&cron.spec.schedule).map_err(|e| refuse("spec.schedule", e.to_string()))?;
    let zone = match cron.spec.time_zone.as_deref() {
        None => None,
        Some(zone) => Some(
            cron::load_time_zone(zone.trim())
                .map_err(|e| refuse("spec.timeZone", e.to_string()))?,
        ),
    };
    for (field, limit) in [
        (
            "successfulJobsHistoryLimit",
            cron.spec.successful_jobs_history_limit,
        ),
        (
            "failedJobsHistoryLimit",
            cron.spec.failed_jobs_history_limit,
        ),
    ] {
        if limit.is_some_and(|l| l < 0) {
            return Err(refuse(
                &format!("spec.{field}"),
                format!("{field} must be >= 0"),
            ));
        }
    }
    // The template must be a valid RayJob (checked under the name the first RayJob gets).
    let mut probe = RayJob::new(&format!("{name}-00000000"), cron.spec.job_template.clone());
    probe.metadata.namespace = cron.namespace();
    super::rayjob::controller::validate(&probe, feature_gates)
        .map_err(|p| refuse("spec.jobTemplate", p.message))?;
    Ok((parsed, zone.unwrap_or(TimeZone::UTC)))
}
