//! One ServePipeline pass, as named stages: observe (reads only: the RayService, the graph
//! versions the source lane published, the routers' counters) → validate (pure, durations
//! parsed once) → plan (pure: desired RayService, rollout step, Events) → apply (the only
//! writes) → status (settled status, Events, memory). Bad input never touches what runs. The
//! frame (`controllers::frame::run`) adds the span, metrics, panic containment and the retry
//! policy.

use std::sync::Arc;
use std::time::Instant;

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use super::apply;
use super::context::Context;
use super::error::Error;
use super::observe;
use super::plan::{self, PlanInputs, Settled};
use super::status;
use crate::api::servepipeline::ServePipeline;
use crate::validation::servepipeline::Validated;

/// The reconcile the frame runs for every ServePipeline.
pub(super) async fn reconcile(
    pipeline: Arc<ServePipeline>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if pipeline.meta().deletion_timestamp.is_some() {
        return Ok(forget(&pipeline, &ctx));
    }
    if status::cache_is_behind(&ctx, &pipeline) {
        // Its watch event brings the pipeline back with the status this controller wrote.
        ctx.frame.keep_failures(&pipeline);
        return Ok(Action::requeue(status::CACHE_CATCH_UP));
    }
    let spec = crate::validation::servepipeline::validated(&pipeline);
    let observed = observe::observe(&pipeline, &ctx, &spec).await?;
    let now = crate::k8s::now();
    let inputs = PlanInputs {
        pipeline: &pipeline,
        spec: &spec,
        config: &ctx.config,
        versions: &observed.versions,
        existing: observed.existing.as_ref(),
        stats: observed.stats.as_ref(),
        now: &now,
    };
    let planning = Instant::now();
    let plan = plan::plan(&inputs)?;
    let planned_in = planning.elapsed();
    let applied = apply::apply(&pipeline, &ctx, &spec, &plan, planned_in).await;
    let mut settled = plan.settle(applied, &inputs);
    status::count_ended_rollout(&ctx, &pipeline, settled.rollout_ended.take());
    status::write_if_changed(&ctx, &pipeline, &settled.status).await?;
    let announced = observed
        .previous
        .as_ref()
        .and_then(|s| s.announced_problem.clone());
    let newly_applied = settled.newly_applied.take();
    settled.memory.announced_problem = status::announce(
        &ctx,
        &pipeline,
        newly_applied.as_ref(),
        settled.problem.as_ref(),
        announced,
    )
    .await;
    next_action(&pipeline, &ctx, &spec, settled)
}

/// The pipeline is being deleted: its RayService goes with its owner (garbage collection),
/// and its fetch and counters reader are no longer wanted.
fn forget(pipeline: &ServePipeline, ctx: &Context) -> Action {
    ctx.fetches.forget(&ObjectRef::from_obj(pipeline));
    ctx.stats.stop(&ObjectRef::from_obj(pipeline));
    Action::await_change()
}

/// Remembers the pass and says when to look again: soon mid-rollout, at the fetch's end while
/// one runs, on the refresh interval otherwise; a problem goes to the frame's retry policy.
fn next_action(
    pipeline: &ServePipeline,
    ctx: &Context,
    spec: &Validated,
    settled: Settled,
) -> Result<Action, Error> {
    let fetching = settled.memory.fetching;
    status::remember(ctx, pipeline, settled.memory);
    let poll = || Action::requeue(ctx.config.rollout_poll());
    if fetching {
        // The fetch's end reconciles this pipeline again; no failure is counted meanwhile, and
        // this pass does not end a failure streak (the fetch decides).
        ctx.frame.keep_failures(pipeline);
        return Ok(if settled.rollout_active {
            poll()
        } else {
            Action::await_change()
        });
    }
    match settled.problem {
        Some(p) => Err(Error::Input {
            reason: p.reason,
            message: p.message,
            transient: settled.transient,
        }),
        None if settled.rollout_active => Ok(poll()),
        None => Ok(spec
            .source
            .refresh_interval
            .map_or_else(Action::await_change, Action::requeue)),
    }
}
