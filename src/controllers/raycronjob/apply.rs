//! The apply stage of a RayCronJob pass: lists the RayJobs it owns, deletes the ones the plan
//! prunes or replaces, and creates the RayJob of the due tick, with an Event for each.

use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::info;

use super::build::CRONJOB_NAME_LABEL;
use super::build::{JobState, Observed, Plan, build_job};
use super::context::Context;
use super::error::{Error, kube_err};
use super::reasons;
use crate::api::raycronjob::RayCronJob;
use crate::api::rayjob::RayJob;
use crate::controllers::frame::children::{ChildEvents, ChildWriter, Mode};
use crate::k8s::field_managers;

/// What the apply stage leaves for the status.
pub(super) struct Applied {
    /// Names of the RayJobs still active (unsorted).
    pub active: Vec<String>,
    /// The tick a RayJob now exists for.
    pub scheduled: Option<k8s_openapi::jiff::Timestamp>,
}

/// The live RayJobs this RayCronJob controls (listed by label, kept only with our uid).
pub(super) async fn owned_jobs(
    jobs_api: &Api<RayJob>,
    cron: &RayCronJob,
) -> Result<Vec<RayJob>, Error> {
    let uid = cron.uid();
    Ok(jobs_api
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
        .collect())
}

/// Carries out `plan`: deletions first, then the skipped-tick Event, then the creation.
pub(super) async fn apply(
    cron: &RayCronJob,
    ctx: &Context,
    jobs_api: &Api<RayJob>,
    owned: &[RayJob],
    observed: &[Observed],
    plan: &Plan,
) -> Result<Applied, Error> {
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
                    cron,
                    EventType::Normal,
                    reasons::DELETED_RAY_JOB,
                    "DeleteRayJob",
                    format!("Deleted RayJob {name}"),
                )
                .await;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(kube_err(format!("deleting RayJob {name}"))(e).into()),
        }
    }
    let mut active: Vec<String> = observed
        .iter()
        .filter(|o| o.state == JobState::Active && !plan.delete.contains(&o.name))
        .map(|o| o.name.clone())
        .collect();
    if let Some(tick) = plan.skipped {
        crate::k8s::publish_event(
            &ctx.recorder,
            cron,
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
    let mut scheduled = None;
    if let Some(tick) = plan.create {
        let job = build_job(cron, tick)?;
        let name = job.name_any();
        // Someone else's RayJob of the name is left alone, reported, and the tick retried;
        // other failures go to the error policy without an Event.
        let events = ChildEvents::new("CreateRayJob")
            .written(reasons::CREATED_RAY_JOB, format!("Created RayJob {name}"))
            .conflict_report("CreateRayJob");
        let written = ChildWriter::new(&ctx.recorder, cron, field_managers::RAYCRONJOB)
            .write(jobs_api, &job, Mode::Create, events)
            .await?;
        // Not new: created in an earlier pass whose status write was lost; the tick is done.
        if written.is_new() {
            info!(job = %name, %tick, "created a RayJob");
        }
        if !active.contains(&name) {
            active.push(name);
        }
        scheduled = Some(tick);
    }
    Ok(Applied { active, scheduled })
}
