//! The apply stage of a ServePipeline pass, the only writes to the cluster: the code layers
//! the RayService names are registered for pulling again, the rollout step's Events are
//! published, and the planned RayService is server-side applied when it differs from what runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::build::{self, reasons};
use super::conditions::Problem;
use super::context::Context;
use super::desired::{Applied, Desired};
use super::plan::{Plan, Strategy};
use super::source;
use crate::api::rayservice::RayService;
use crate::api::servepipeline::{ServePipeline, condition_types};
use crate::k8s::field_managers;
use crate::validation::servepipeline::Validated;

/// Carries out `plan`; `None` when it wants nothing written. `planned_in`: how long planning
/// (rendering) took, for the update-stage metrics.
pub(super) async fn apply(
    pipeline: &Arc<ServePipeline>,
    ctx: &Arc<Context>,
    spec: &Validated,
    plan: &Plan,
    planned_in: Duration,
) -> Option<Applied> {
    // The code layers the RayService names must be pullable again by the package server
    // (after a restart the store is empty while Ray may still start replicas that need them).
    if plan.rayservice.is_some() {
        source::register_code_in_use(pipeline, ctx, plan.rayservice.as_ref(), spec.source.timeout);
    }
    for event in &plan.rollout.events {
        let kind = if event.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        crate::k8s::publish_event(
            &ctx.recorder,
            &**pipeline,
            kind,
            event.reason,
            "Rollout",
            event.message.clone(),
        )
        .await;
    }
    match &plan.desired {
        Desired::Keep => None,
        Desired::Refuse { problem, transient } => Some(Applied::Refused {
            problem: problem.clone(),
            transient: *transient,
            not_ours: false,
        }),
        Desired::Write(desired) => {
            let namespace = pipeline.namespace().unwrap_or_default();
            let rs_api: Api<RayService> = Api::namespaced(ctx.client.clone(), &namespace);
            let apply_started = Instant::now();
            let applied = write(&rs_api, plan.rayservice.as_ref(), desired).await;
            if plan.strategy == Strategy::Immediate && matches!(applied, Applied::New(_)) {
                let metrics = &ctx.config.metrics;
                metrics.pipeline_update_stage("render", planned_in);
                metrics.pipeline_update_stage("apply", apply_started.elapsed());
            }
            Some(applied)
        }
    }
}

/// Server-side applies `desired` unless `existing` already carries it.
async fn write(
    rs_api: &Api<RayService>,
    existing: Option<&RayService>,
    desired: &RayService,
) -> Applied {
    if existing.is_some_and(|e| build::is_up_to_date(e, desired)) {
        return Applied::UpToDate;
    }
    let known = existing.map(|rs| rs.meta());
    match crate::k8s::apply_owned(rs_api, desired, known, field_managers::SERVEPIPELINE).await {
        Ok(applied) => Applied::New(Box::new(applied)),
        Err(e) => {
            let not_ours = e.is_not_owned();
            let reason = if not_ours {
                reasons::RAYSERVICE_CONFLICT
            } else {
                reasons::APPLY_FAILED
            };
            Applied::Refused {
                problem: Problem {
                    condition: condition_types::READY,
                    reason: reason.to_owned(),
                    message: e.to_string(),
                },
                transient: true,
                not_ours,
            }
        }
    }
}

/// Removes the rollout command the pass acted on (or found not to apply), after its effect is
/// in the status. Only that command goes: the annotation is read fresh and the removal is
/// conditional on that read's resourceVersion, so a command written meanwhile stays for the
/// next pass. A failure is only logged: the next pass finds the command carried out and drops
/// it silently.
pub(super) async fn consume_rollout_command(pipeline: &ServePipeline, ctx: &Context) {
    use crate::api::servepipeline::ROLLOUT_COMMAND_ANNOTATION;
    let Some(seen) = pipeline.annotations().get(ROLLOUT_COMMAND_ANNOTATION) else {
        return;
    };
    let api: Api<ServePipeline> = Api::namespaced(
        ctx.client.clone(),
        &pipeline.namespace().unwrap_or_default(),
    );
    let name = pipeline.name_any();
    let fresh = match api.get_metadata_opt(&name).await {
        Ok(Some(fresh)) => fresh,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(error = %e, "reading the pipeline to remove its rollout command");
            return;
        }
    };
    if fresh.annotations().get(ROLLOUT_COMMAND_ANNOTATION) != Some(seen) {
        return;
    }
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": fresh.resource_version(),
        "annotations": {ROLLOUT_COMMAND_ANNOTATION: null},
    }});
    if let Err(e) = api
        .patch_metadata(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        tracing::info!(error = %e, "the rollout command stays for the next pass");
    }
}
