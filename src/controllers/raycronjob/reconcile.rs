//! One RayCronJob pass: read it fresh → validate → observe its RayJobs → plan (pure, in
//! `build`) → apply (delete, create) → status → wait for the next tick. The frame
//! (`controllers::frame::run`) adds the span, metrics, panic containment and the retry policy.

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
use crate::api::raycronjob::RayCronJob;
use crate::api::rayjob::RayJob;
use crate::controllers::frame::refuse::refuse;
use crate::validation::cron::Schedule;

/// The reconcile the frame runs for every RayCronJob.
pub(super) async fn reconcile(cron: Arc<RayCronJob>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ctx = &*ctx;
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
    let Some((parsed, zone)) = validated(&cron, ctx).await else {
        return Ok(Action::await_change());
    };
    let owned = apply::owned_jobs(&jobs_api, &cron).await?;
    let observed: Vec<Observed> = owned.iter().map(build::observe).collect();
    let plan = build::plan(&cron, &parsed, &zone, &observed, ctx.config.clock.now());
    let applied = apply::apply(&cron, ctx, &jobs_api, &owned, &observed, &plan).await?;
    status::write(ctx, &cron, &status::desired(&cron, applied)).await?;

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

/// The validate stage: the parsed schedule and its zone, or `None` after a Warning Event
/// (nothing is written for a refused RayCronJob; a change brings it back).
async fn validated(
    cron: &RayCronJob,
    ctx: &Context,
) -> Option<(crate::validation::cron::Schedule, TimeZone)> {
    match validate(cron, &ctx.config.feature_gates) {
        Ok((parsed, zone)) => {
            let zone = if cron.spec.time_zone.is_some() {
                zone
            } else {
                ctx.config.default_time_zone.clone()
            };
            Some((parsed, zone))
        }
        Err(message) => {
            refuse(&ctx.recorder, cron, reasons::INVALID_SPEC, &message).await;
            None
        }
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
