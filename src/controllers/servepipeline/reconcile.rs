//! The stages of one ServePipeline pass, as the frame runs them (`controllers::frame::pass`):
//! observe (reads only: the RayService, the graph versions the source lane published, the
//! routers' counters) → validate → act (plan, pure: desired RayService, rollout step, Events;
//! then apply, the only writes) → status (the settled status) → finish (Events, memory, when
//! to look again). Bad input never touches what runs.
//!
//! The spec is parsed (durations once, in `validation::servepipeline`) as the observe stage
//! begins, because the source lane it drives needs the spec's timing; a spec the rule book
//! faults becomes a condition through the plan, never a refusal that would stop the pipeline
//! from serving its last good graph. So the validate stage has nothing left to refuse.

use std::sync::Arc;
use std::time::Instant;

use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::context::Context;
use super::error::Error;
use super::observe::{self, Observed};
use super::plan::{self, PlanInputs, Settled};
use super::status;
use super::{admission, apply};
use crate::api::servepipeline::{ServePipeline, ServePipelineStatus};
use crate::controllers::frame::pass::{Acted, Flow, Stages, StatusWrite};
use crate::validation::problem::Problem;
use crate::validation::servepipeline::Validated;

/// What a ServePipeline pass reads.
pub struct Seen {
    pipeline: Arc<ServePipeline>,
    spec: Validated,
    observed: Observed,
}

/// The pass after its writes, for the finish stage.
pub struct Passed(Settled);

impl Stages<ServePipeline> for Context {
    type Observed = Seen;
    type Valid = ();
    type Status = ServePipelineStatus;
    type Applied = Passed;
    type Error = Error;
    const FIELD_MANAGER: &'static str = crate::k8s::field_managers::SERVEPIPELINE;

    fn kube(&self) -> (&kube::Client, &crate::k8s::EventRecorder) {
        (&self.client, &self.recorder)
    }

    async fn observe(
        self: &Arc<Self>,
        pipeline: Arc<ServePipeline>,
    ) -> Result<Flow<ServePipeline, Seen>, Error> {
        if pipeline.meta().deletion_timestamp.is_some() {
            return Ok(Flow::Deleting(pipeline));
        }
        if status::cache_is_behind(self, &pipeline) {
            // Its watch event brings the pipeline back with the status this controller wrote.
            self.frame.keep_failures(&pipeline);
            return Ok(Flow::Done(Action::requeue(status::CACHE_CATCH_UP)));
        }
        let spec = crate::validation::servepipeline::validated(&pipeline);
        let observed = observe::observe(&pipeline, self, &spec).await?;
        Ok(Flow::Go(Seen {
            pipeline,
            spec,
            observed,
        }))
    }

    fn object(seen: &Seen) -> &ServePipeline {
        &seen.pipeline
    }

    /// The pipeline is being deleted: its RayService goes with its owner (garbage collection),
    /// and its fetch and counters reader are no longer wanted.
    async fn finalize(&self, pipeline: Arc<ServePipeline>) -> Result<Action, Error> {
        self.fetches.forget(&ObjectRef::from_obj(&*pipeline));
        self.stats.stop(&ObjectRef::from_obj(&*pipeline));
        Ok(Action::await_change())
    }

    fn validate(&self, _: &Seen) -> Result<(), Problem> {
        Ok(())
    }

    async fn act(
        self: &Arc<Self>,
        seen: &Seen,
        _: (),
    ) -> Acted<ServePipelineStatus, Passed, Error> {
        let (pipeline, spec, observed) = (&seen.pipeline, &seen.spec, &seen.observed);
        let now = crate::k8s::now();
        let inputs = PlanInputs {
            pipeline,
            spec,
            config: &self.config,
            versions: &observed.versions,
            existing: observed.existing.as_ref(),
            stats: observed.stats.as_ref(),
            now: &now,
        };
        let planning = Instant::now();
        let plan = match plan::plan(&inputs) {
            Ok(plan) => plan,
            Err(e) => return Acted::failed(e.into()),
        };
        let planned_in = planning.elapsed();
        let applied = apply::apply(pipeline, self, spec, &plan, planned_in).await;
        let mut settled = plan.settle(applied, &inputs);
        admission::record(
            &mut settled.status.conditions,
            observed.admission.as_ref(),
            pipeline.metadata.generation,
            now.clone(),
        );
        status::count_ended_rollout(self, pipeline, settled.rollout_ended.take());
        Acted {
            status: Some(std::mem::take(&mut settled.status)),
            result: Ok(Passed(settled)),
        }
    }

    fn plan_write(&self, seen: &Seen, status: &ServePipelineStatus) -> StatusWrite {
        if seen.pipeline.status.as_ref() == Some(status) {
            StatusWrite::Skip
        } else {
            StatusWrite::Now
        }
    }

    /// A written status is remembered with the copy it was planned from, so a pass on that
    /// copy waits for the cache (see `status::cache_is_behind`).
    fn remember(&self, seen: &Seen, _: ServePipelineStatus, write: StatusWrite) {
        if write == StatusWrite::Now {
            let planned_from = seen.pipeline.resource_version().unwrap_or_default();
            self.status_written.with(&*seen.pipeline, |w| {
                *w = Some((planned_from, Instant::now()))
            });
        }
    }

    /// The Events of the pass (once per transition), the pipeline's memory, and when to look
    /// again.
    async fn finish(
        &self,
        seen: &Seen,
        passed: Result<Passed, Error>,
        _: StatusWrite,
    ) -> Result<Action, Error> {
        let Passed(mut settled) = passed?;
        let pipeline = &*seen.pipeline;
        if settled.command_consumed {
            apply::consume_rollout_command(pipeline, self).await;
        }
        let announced = seen
            .observed
            .previous
            .as_ref()
            .and_then(|s| s.announced_problem.clone());
        let newly_applied = settled.newly_applied.take();
        settled.memory.announced_problem = status::announce(
            self,
            pipeline,
            newly_applied.as_ref(),
            settled.problem.as_ref(),
            announced,
        )
        .await;
        next_action(pipeline, self, &seen.spec, settled)
    }
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
