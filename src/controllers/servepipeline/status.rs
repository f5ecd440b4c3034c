//! The status stage of a ServePipeline: the status computed by the pure `build` from what the
//! pass found, written (server-side apply) when it changed; and the Events, once per
//! transition (a graph newly applied, a new problem).

use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::build::AppliedGraph;
use super::conditions::{self, Problem, StatusInputs};
use super::{Context, Error, GoodGraph, MAX_LOGGED_MESSAGE, now};
use crate::api::rayservice::RayService;
use crate::api::servepipeline::{RolloutStatus, ServePipeline, ServePipelineStatus};
use crate::k8s::field_managers;

/// Computes the status and writes it when the pipeline does not show it yet.
pub(super) async fn update(
    ctx: &Context,
    pipeline: &ServePipeline,
    applied: Option<&AppliedGraph>,
    problem: Option<&Problem>,
    rayservice: Option<&RayService>,
    rollout: Option<&RolloutStatus>,
    newest: Option<&AppliedGraph>,
) -> Result<(), Error> {
    let status = conditions::compute_status(&StatusInputs {
        pipeline,
        applied,
        problem,
        rayservice,
        rollout,
        newest,
        now: now(),
    });
    if pipeline.status.as_ref() != Some(&status) {
        write(&ctx.client, pipeline, &status).await?;
    }
    Ok(())
}

/// Server-side applies the pipeline's status.
pub(super) async fn write(
    client: &kube::Client,
    pipeline: &ServePipeline,
    status: &ServePipelineStatus,
) -> Result<(), Error> {
    crate::controllers::frame::status::apply_status(
        client,
        pipeline,
        field_managers::SERVEPIPELINE,
        status,
    )
    .await
    .map_err(|source| Error::Status {
        name: pipeline.name_any(),
        source,
    })
}

/// Publishes the Events of this pass: `GraphApplied` for a graph `newly_applied`, and a Warning
/// for a problem other than the one `announced` last. Returns the problem now announced.
pub(super) async fn announce(
    ctx: &Context,
    pipeline: &ServePipeline,
    newly_applied: Option<&GoodGraph>,
    rs_name: &str,
    problem: Option<&Problem>,
    announced: Option<(String, String)>,
) -> Option<(String, String)> {
    let current = problem.map(|p| (p.reason.clone(), p.message.clone()));
    if let Some(g) = newly_applied {
        info!(digest = %g.applied.digest, "applied graph");
        crate::k8s::publish_event(
            &ctx.recorder,
            pipeline,
            EventType::Normal,
            "GraphApplied",
            "Apply",
            format!(
                "RayService {rs_name} now carries graph {} ({}, {} nodes)",
                g.applied.version.as_deref().unwrap_or("unversioned"),
                g.applied.digest,
                g.applied.nodes
            ),
        )
        .await;
    }
    if current != announced
        && let Some(p) = problem
    {
        let message = crate::k8s::truncate(&p.message, MAX_LOGGED_MESSAGE);
        warn!(reason = %p.reason, %message, "pipeline problem");
        crate::k8s::publish_event(
            &ctx.recorder,
            pipeline,
            EventType::Warning,
            &p.reason,
            "Reconcile",
            p.message.clone(),
        )
        .await;
    }
    current
}
