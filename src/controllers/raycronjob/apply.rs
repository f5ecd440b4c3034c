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
        match crate::k8s::create_owned(jobs_api, &job, field_managers::RAYCRONJOB).await {
            // Created in an earlier pass whose status write was lost: the tick is done.
            Ok(crate::k8s::Created::AlreadyOurs(_)) => {}
            Ok(crate::k8s::Created::New(_)) => {
                info!(job = %name, %tick, "created a RayJob");
                crate::k8s::publish_event(
                    &ctx.recorder,
                    cron,
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
                        cron,
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
        scheduled = Some(tick);
    }
    Ok(Applied { active, scheduled })
}
