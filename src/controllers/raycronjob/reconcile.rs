//! The stages of one RayCronJob pass, as the frame runs them (`controllers::frame::pass`):
//! observe (the RayCronJob read fresh, its RayJobs) → validate (the schedule and its zone) →
//! act (plan, pure, in `build`; then delete and create RayJobs in `apply`) → status (`active`,
//! `lastScheduleTime`) → finish (wait for the next tick). The frame adds the span, metrics,
//! panic containment and the retry policy.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::tz::TimeZone;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::build::{self, Observed};
use super::context::Context;
use super::error::{Error, kube_err};
use super::{apply, reasons, status};
use crate::api::raycronjob::{RayCronJob, RayCronJobStatus};
use crate::api::rayjob::RayJob;
use crate::controllers::frame::pass::{Acted, Flow, Stages, StatusWrite};
use crate::validation::cron::Schedule;
use crate::validation::problem::Problem;

/// What a RayCronJob pass reads.
pub struct Seen {
    /// Read fresh: `lastScheduleTime` decides whether a tick is due, so it must not be stale.
    cron: RayCronJob,
    jobs_api: Api<RayJob>,
    owned: Vec<RayJob>,
    observed: Vec<Observed>,
}

impl Stages<RayCronJob> for Context {
    type Observed = Seen;
    type Valid = (Schedule, TimeZone);
    type Status = RayCronJobStatus;
    /// When the next tick is due, if any.
    type Applied = Option<Duration>;
    type Error = Error;
    const FIELD_MANAGER: &'static str = crate::k8s::field_managers::RAYCRONJOB;

    fn kube(&self) -> (&kube::Client, &crate::k8s::EventRecorder) {
        (&self.client, &self.recorder)
    }

    async fn observe(
        self: &Arc<Self>,
        cron: Arc<RayCronJob>,
    ) -> Result<Flow<RayCronJob, Seen>, Error> {
        if cron.meta().deletion_timestamp.is_some() {
            return Ok(Flow::Deleting(cron));
        }
        let namespace = cron.namespace().unwrap_or_default();
        let crons: Api<RayCronJob> = Api::namespaced(self.client.clone(), &namespace);
        let jobs_api: Api<RayJob> = Api::namespaced(self.client.clone(), &namespace);
        let Some(cron) = crons
            .get_opt(&cron.name_any())
            .await
            .map_err(kube_err("reading the RayCronJob"))?
        else {
            return Ok(Flow::Done(Action::await_change()));
        };
        let owned = apply::owned_jobs(&jobs_api, &cron).await?;
        let observed = owned.iter().map(build::observe).collect();
        Ok(Flow::Go(Seen {
            cron,
            jobs_api,
            owned,
            observed,
        }))
    }

    fn object(seen: &Seen) -> &RayCronJob {
        &seen.cron
    }

    /// The parsed schedule and its zone (the operator's when the spec names none); a refused
    /// RayCronJob gets the Event only.
    fn validate(&self, seen: &Seen) -> Result<(Schedule, TimeZone), Problem> {
        let values =
            crate::validation::validated::for_controller(&seen.cron, &self.config.feature_gates)
                .map_err(|p| Problem {
                    reason: reasons::INVALID_SPEC,
                    ..p
                })?
                .into_values();
        let zone = if seen.cron.spec.time_zone.is_some() {
            values.zone
        } else {
            self.config.default_time_zone.clone()
        };
        Ok((values.schedule, zone))
    }

    async fn act(
        self: &Arc<Self>,
        seen: &Seen,
        (schedule, zone): (Schedule, TimeZone),
    ) -> Acted<RayCronJobStatus, Option<Duration>, Error> {
        let cron = &seen.cron;
        let plan = build::plan(
            cron,
            &schedule,
            &zone,
            &seen.observed,
            self.config.clock.now(),
        );
        let applied = match apply::apply(
            cron,
            self,
            &seen.jobs_api,
            &seen.owned,
            &seen.observed,
            &plan,
        )
        .await
        {
            Ok(applied) => applied,
            Err(e) => return Acted::failed(e),
        };
        let next = plan.next.map(|next| self.config.clock.sleep_until(next));
        Acted {
            status: Some(status::desired(cron, applied)),
            result: Ok(next),
        }
    }

    fn plan_write(&self, seen: &Seen, status: &RayCronJobStatus) -> StatusWrite {
        status::plan_write(&seen.cron, status)
    }

    /// A suspended RayCronJob says so and waits; else the next tick (or sooner while RayJobs
    /// are active: their status feeds history and Forbid, and their watch events come first).
    async fn finish(
        &self,
        seen: &Seen,
        next: Result<Option<Duration>, Error>,
        _: StatusWrite,
    ) -> Result<Action, Error> {
        let next = next?;
        if seen.cron.spec.suspend == Some(true) {
            crate::k8s::publish_event(
                &self.recorder,
                &seen.cron,
                EventType::Normal,
                reasons::SUSPENDED,
                "Suspend",
                "The RayCronJob is suspended; no RayJobs are created".into(),
            )
            .await;
            return Ok(Action::await_change());
        }
        Ok(next.map_or_else(Action::await_change, |wait| {
            Action::requeue(wait.max(Duration::from_millis(50)))
        }))
    }
}

/// The problem KubeRay would report (§6.2), if any.
pub fn validate(
    cron: &RayCronJob,
    feature_gates: &crate::validation::feature_gates::FeatureGates,
) -> Result<(Schedule, TimeZone), String> {
    crate::validation::validated::for_controller(cron, feature_gates)
        .map(|valid| {
            let values = valid.into_values();
            (values.schedule, values.zone)
        })
        .map_err(|p| p.message)
}
