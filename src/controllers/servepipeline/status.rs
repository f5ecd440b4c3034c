//! What follows a ServePipeline pass's status (the frame writes the status `plan` settled on,
//! when it changed): the Events, once per transition (a graph newly applied, a new problem); an
//! ended rollout counted once; the pipeline's memory for the next pass; and the wait for a cache
//! that does not show the last write yet.

use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::conditions::{MAX_LOGGED_MESSAGE, Problem};
use super::context::Context;
use super::memory::{GoodGraph, MemoryUpdate};
use crate::api::servepipeline::ServePipeline;

/// How soon a pass that found the cache behind looks again (the watch event usually comes first).
pub(super) const CACHE_CATCH_UP: Duration = Duration::from_millis(500);
/// How long a pass waits for the cache at most: a write the server kept as a no-op leaves the
/// resourceVersion where it was, and the pipeline must not wait for it forever.
const CACHE_CATCH_UP_LIMIT: Duration = Duration::from_secs(5);

/// Whether the cached pipeline is still the copy this controller's last status write was
/// planned from: a pass on it would decide again what that pass decided (a canary started
/// twice, its Event published twice).
pub(super) fn cache_is_behind(ctx: &Context, pipeline: &ServePipeline) -> bool {
    let current = pipeline.resource_version().unwrap_or_default();
    ctx.status_written
        .peek(pipeline, |written| {
            written.as_ref().is_some_and(|(planned_from, at)| {
                *planned_from == current && at.elapsed() < CACHE_CATCH_UP_LIMIT
            })
        })
        .unwrap_or(false)
}

/// Publishes the Events of this pass: `GraphApplied` for a graph `newly_applied`, and a Warning
/// for a problem other than the one `announced` last. Returns the problem now announced.
pub(super) async fn announce(
    ctx: &Context,
    pipeline: &ServePipeline,
    newly_applied: Option<&GoodGraph>,
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
                "RayService {} now carries graph {} ({}, {} nodes)",
                super::build::rayservice_name(pipeline),
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

/// Counts a rollout that ended in the rollouts metric, once per rollout: a reconcile on a
/// cached status that predates our own status write decides the same ending again.
pub(super) fn count_ended_rollout(
    ctx: &Context,
    pipeline: &ServePipeline,
    ended: Option<(&'static str, String)>,
) {
    let Some((result, rollout_key)) = ended else {
        return;
    };
    let first_time = ctx.counted_rollout.with(pipeline, |counted| {
        let first = counted.as_deref() != Some(rollout_key.as_str());
        *counted = Some(rollout_key);
        first
    });
    if first_time {
        ctx.config.metrics.pipeline_rollout_ended(result);
    }
}

/// Keeps what the next pass needs in the pipeline's memory.
pub(super) fn remember(ctx: &Context, pipeline: &ServePipeline, memory: MemoryUpdate) {
    ctx.state
        .with(pipeline, |state| memory.write_into(state, Instant::now()));
}
