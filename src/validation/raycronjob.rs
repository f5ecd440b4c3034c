//! KubeRay's rules for a RayCronJob, one book for its webhook and its controller: name,
//! schedule (through the one cron parser), time zone, history limits and the RayJob template.
//! The controller schedules from [`RayCronJobValues`], the schedule and zone parsed here.

use k8s_openapi::jiff::tz::TimeZone;
use kube::ResourceExt;

use super::cron::{self, Schedule, ScheduleError};
use super::feature_gates::{FeatureGates, gates};
use super::k8s_names::check_name_kuberay;
use super::problem::Problems;
use super::rayjob::rayjob_spec;
use super::validated::{RuleBook, Validated};
use crate::api::RayCronJob;

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

/// What the RayCronJob book parses: the schedule and its zone (UTC when unset).
#[derive(Clone, Debug)]
pub struct RayCronJobValues {
    pub schedule: Schedule,
    pub zone: TimeZone,
}

impl RuleBook for RayCronJob {
    type Values = RayCronJobValues;
    const SPEC_REASON: &'static str = INVALID_SPEC;

    fn check(&self, feature_gates: &FeatureGates) -> (Problems, Option<RayCronJobValues>) {
        let mut problems = Problems::new(INVALID_SPEC, INVALID_SPEC);
        let spec = &self.spec;
        // KubeRay runs no RayCronJob controller without the gate; raypipe's neither (`config`),
        // so an admitted RayCronJob would never be scheduled.
        if !feature_gates.enabled(gates::RAY_CRON_JOB) {
            problems.webhook_only(format!(
                "RayCronJobs need the {} feature gate, which is off: no controller would schedule this one",
                gates::RAY_CRON_JOB
            ));
        }
        check_name_kuberay(
            "RayCronJob",
            &self.name_any(),
            MAX_RAYCRONJOB_NAME,
            "",
            &mut problems,
        );
        let mut schedule = None;
        if spec.schedule.contains("TZ") {
            problems.both(
                "spec.schedule must not contain TZ or CRON_TZ; use spec.timeZone".to_owned(),
                "CRON_TZ or TZ in the schedule is not supported; use spec.timeZone instead",
            );
        } else {
            let parsed = cron::parse(&spec.schedule);
            problems.judged(
                "spec.schedule",
                schedule_problem(&spec.schedule)
                    .map(|problem| format!("spec.schedule {:?}: {problem}", spec.schedule)),
                parsed.as_ref().err().map(ToString::to_string),
            );
            schedule = parsed.ok();
        }
        let zone = match spec.time_zone.as_deref() {
            None => Some(TimeZone::UTC),
            Some(zone) => {
                let loaded = cron::load_time_zone(zone.trim());
                problems.judged(
                    "spec.timeZone",
                    (!is_time_zone_name(zone)).then(|| format!(
                        "spec.timeZone {zone:?} is not a time zone name like Europe/Paris or UTC"
                    )),
                    loaded.as_ref().err().map(ToString::to_string),
                );
                loaded.ok()
            }
        };
        for (field, limit) in [
            (
                "successfulJobsHistoryLimit",
                spec.successful_jobs_history_limit,
            ),
            ("failedJobsHistoryLimit", spec.failed_jobs_history_limit),
        ] {
            if limit.is_some_and(|l| l < 0) {
                problems.controller_only(&format!("spec.{field}"), format!("{field} must be >= 0"));
            }
        }
        // The template is judged as the RayJobs it makes will be (their annotations are not
        // the RayCronJob's, so the controller reads none; the webhook reads the RayCronJob's).
        rayjob_spec(
            &spec.job_template,
            "spec.jobTemplate",
            self.annotations(),
            feature_gates,
            &mut problems,
        );
        let values = schedule
            .zip(zone)
            .map(|(schedule, zone)| RayCronJobValues { schedule, zone });
        (problems, values)
    }
}

/// A RayCronJob: every finding, or the parsed schedule and zone.
pub fn validate(
    cron: &RayCronJob,
    feature_gates: &FeatureGates,
) -> Result<Validated<RayCronJob>, Problems> {
    super::validated::validate(cron, feature_gates)
}
