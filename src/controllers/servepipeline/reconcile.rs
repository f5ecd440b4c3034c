//! One ServePipeline reconcile: validate → source (token, conditional fetch, decode, validate;
//! in `source`, outside the reconcile workers) → ownership check → build and apply the
//! RayService (`apply`) → status and Events (`status`) → remember. Bad input never touches what
//! runs. The frame (`controllers::frame::run`) adds the span, metrics, panic containment and the
//! retry policy.

use std::sync::Arc;
use std::time::Instant;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::apply::{self, Applied};
use super::build::{self, reasons};
use super::conditions::Problem;
use super::fetches::{self, Poll};
use super::{
    Context, Error, MAX_LOGGED_MESSAGE, PipelineState, canary, refresh_interval, source, status,
};
use crate::api::rayservice::RayService;
use crate::api::servepipeline::{RolloutStrategy, ServePipeline, condition_types};

/// The reconcile the frame runs for every ServePipeline.
pub(super) async fn reconcile(
    pipeline: Arc<ServePipeline>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if pipeline.meta().deletion_timestamp.is_some() {
        // The RayService goes with its owner (garbage collection); a fetch is no longer wanted.
        ctx.fetches.forget(&ObjectRef::from_obj(&*pipeline));
        ctx.stats.stop(&ObjectRef::from_obj(&*pipeline));
        return Ok(Action::await_change());
    }
    let namespace = pipeline.namespace().unwrap_or_default();
    let key = ObjectRef::from_obj(&*pipeline);
    let rs_api: Api<RayService> = Api::namespaced(ctx.client.clone(), &namespace);
    let rs_name = build::rayservice_name(&pipeline);
    let existing = rs_api
        .get_opt(&rs_name)
        .await
        .map_err(|source| Error::Read {
            what: format!("RayService {namespace}/{rs_name}"),
            source,
        })?;

    // validate
    let mut problem: Option<Problem> = None;
    let mut transient = false;
    let problems = crate::validation::servepipeline::validate_spec(&pipeline);
    if !problems.is_empty() {
        problem = Some(Problem {
            condition: condition_types::READY,
            reason: reasons::INVALID_SPEC.to_owned(),
            message: crate::k8s::truncate(
                &crate::validation::problem::join(&problems),
                MAX_LOGGED_MESSAGE,
            ),
        });
    }

    let previous_state = ctx.state.peek(&*pipeline, Option::clone).flatten();
    let mut good = previous_state.as_ref().and_then(|s| s.good.clone());
    let source_inputs = source::source_inputs_hash(&pipeline, &ctx.secrets);
    let due = match &previous_state {
        None => true,
        Some(s) => {
            s.source_inputs != source_inputs
                || s.good.is_none()
                || refresh_interval(&pipeline).is_some_and(|r| s.last_checked.elapsed() >= r)
                // retry after a failure when the requeue brings us back
                || ctx.frame.failures(&pipeline) > 0
        }
    };
    let mut checked = false;

    let mut fetching = false;
    if problem.is_none() && due {
        let host = fetches::source_host(&pipeline.spec.source);
        let poll = ctx.fetches.poll(&key, &source_inputs, &host, || {
            source::fetch_and_validate(pipeline.clone(), ctx.clone(), good.clone())
        });
        match poll {
            Poll::Done(outcome) => {
                checked = true;
                match outcome {
                    Ok(Some(new_good)) => {
                        good = Some(keep_fetch_time(&pipeline, good.as_ref(), new_good))
                    }
                    Ok(None) => {}
                    Err((p, is_transient)) => {
                        transient = is_transient;
                        problem = Some(p);
                    }
                }
            }
            Poll::Pending => {
                // The fetch wakes this pipeline when it ends; until then the latest outcome
                // stands (nothing to apply, and the status says what it said).
                fetching = true;
                if let Some((p, is_transient)) =
                    previous_state.as_ref().and_then(|s| s.last_problem.clone())
                {
                    transient = is_transient;
                    problem = Some(p);
                }
            }
        }
    }

    // A RayService of that name the pipeline does not control is someone else's: it is neither
    // written nor read as ours. Retried with backoff: the owner may delete or rename it.
    let mut rayservice = existing.clone();
    if let Some(rs) = &existing
        && let Err(conflict) =
            crate::k8s::check_controlled_by(rs, &pipeline.uid().unwrap_or_default())
    {
        rayservice = None;
        transient = true;
        problem = problem.or(Some(Problem {
            condition: condition_types::READY,
            reason: reasons::RAYSERVICE_CONFLICT.to_owned(),
            message: conflict.to_string(),
        }));
    }

    // The code layers the RayService names must be pullable again by the package server
    // (after a restart the store is empty while Ray may still start replicas that need them).
    if rayservice.is_some() {
        source::register_code_in_use(&pipeline, &ctx, rayservice.as_ref());
    }

    let mut newly_applied = false;
    let canary_strategy = is_canary(&pipeline);
    let mut rollout = canary_strategy
        .then(|| pipeline.status.as_ref().and_then(|s| s.rollout.clone()))
        .flatten();
    let mut rollout_active = false;
    // Only a source or graph problem lets a rollout go on: it keeps judging (and can roll
    // back) the versions already on the cluster while the registry misbehaves.
    let rollout_may_run = problem.as_ref().is_none_or(|p| {
        p.condition == condition_types::SOURCE_READY || p.condition == condition_types::GRAPH_VALID
    }) && (existing.is_none() || rayservice.is_some());
    let has_stable = rollout.as_ref().is_some_and(|r| r.stable.is_some());
    let outcome = if canary_strategy {
        if rollout_may_run && (good.is_some() || has_stable) {
            let stable_graph = previous_state.as_ref().and_then(|s| s.stable.as_ref());
            let result = canary::apply(
                &pipeline,
                &ctx,
                &rs_api,
                existing.as_ref(),
                good.as_ref(),
                stable_graph,
            )
            .await?;
            rollout_active = result.active;
            rollout = Some(result.rollout);
            Some(result.applied)
        } else {
            None
        }
    } else if problem.is_none()
        && let Some(g) = &good
    {
        Some(apply::apply(&pipeline, &ctx, &rs_api, existing.as_ref(), g).await?)
    } else {
        None
    };
    match outcome {
        None | Some(Applied::UpToDate) => {}
        Some(Applied::New(applied)) => {
            newly_applied = !canary_strategy;
            rayservice = Some(*applied);
        }
        Some(Applied::Refused {
            problem: p,
            transient: t,
            not_ours,
        }) => {
            if not_ours {
                rayservice = None;
            }
            transient = t;
            problem = Some(p);
        }
    }
    // With a canary policy the status's source and graph describe the version that serves
    // (the stable one); the version being tried is in `status.rollout.canary`.
    let stable_digest = rollout
        .as_ref()
        .and_then(|r| r.stable.as_ref())
        .map(|s| s.digest.clone());
    let mut stable = previous_state.as_ref().and_then(|s| s.stable.clone());
    if let Some(g) = good
        .as_ref()
        .filter(|g| Some(&g.applied.digest) == stable_digest.as_ref())
    {
        stable = Some(g.clone());
    }
    stable = stable.filter(|g| Some(&g.applied.digest) == stable_digest.as_ref());
    let described = if canary_strategy {
        stable.as_ref().map(|g| g.applied.clone()).or_else(|| {
            // Not in memory (a restart, or the newest graph was rolled back): as the status
            // last described it, when that is still the stable version.
            build::applied_from_status(pipeline.status.as_ref()?)
                .filter(|a| Some(&a.digest) == stable_digest.as_ref())
        })
    } else {
        good.as_ref().map(|g| g.applied.clone()).or_else(|| {
            // Not in memory (a restart, the first fetch under way or failed): the RayService
            // still carries what the status last described.
            build::applied_from_status(pipeline.status.as_ref()?)
        })
    };
    status::update(
        &ctx,
        &pipeline,
        described.as_ref(),
        problem.as_ref(),
        rayservice.as_ref(),
        rollout.as_ref(),
        good.as_ref().map(|g| &g.applied),
    )
    .await?;
    let announced = previous_state
        .as_ref()
        .and_then(|s| s.announced_problem.clone());
    let current = status::announce(
        &ctx,
        &pipeline,
        if newly_applied { good.as_ref() } else { None },
        &rs_name,
        problem.as_ref(),
        announced,
    )
    .await;
    ctx.state.with(&*pipeline, |state| {
        let entry = state.get_or_insert_with(|| PipelineState {
            source_inputs: source_inputs.clone(),
            last_checked: Instant::now(),
            good: None,
            stable: None,
            announced_problem: None,
            last_problem: None,
        });
        // While a fetch for new inputs runs, the old inputs stay remembered: the fetch's
        // wake-up then finds the source still due and takes the outcome at once (remembering
        // the new ones here left it waiting for the refresh interval).
        if !fetching {
            entry.source_inputs = source_inputs;
        }
        if checked {
            entry.last_checked = Instant::now();
        }
        entry.good = good;
        entry.stable = stable;
        entry.announced_problem = current;
        if !fetching {
            entry.last_problem = problem.clone().map(|p| (p, transient));
        }
    });
    if fetching {
        // The fetch's end reconciles this pipeline again; no failure is counted meanwhile, and
        // this pass does not end a failure streak (the fetch decides).
        ctx.frame.keep_failures(&pipeline);
        return Ok(if rollout_active {
            Action::requeue(ctx.config.rollout_poll())
        } else {
            Action::await_change()
        });
    }
    match problem {
        Some(p) => Err(Error::Input {
            reason: p.reason,
            message: p.message,
            transient,
        }),
        None if rollout_active => Ok(Action::requeue(ctx.config.rollout_poll())),
        None => Ok(refresh_interval(&pipeline).map_or_else(Action::await_change, Action::requeue)),
    }
}

/// A graph fetched while none was in memory (the first fetch of a restarted operator) that
/// is the one the status describes keeps the time it was first fetched: a restart then
/// rewrites no status.
fn keep_fetch_time(
    pipeline: &ServePipeline,
    in_memory: Option<&super::GoodGraph>,
    mut fetched: super::GoodGraph,
) -> super::GoodGraph {
    if in_memory.is_none()
        && let Some(described) = pipeline
            .status
            .as_ref()
            .and_then(build::applied_from_status)
        && described.digest == fetched.applied.digest
        && described.etag == fetched.applied.etag
    {
        fetched.applied.fetched_at = described.fetched_at;
    }
    fetched
}

/// Whether new graph versions go out as canaries.
fn is_canary(pipeline: &ServePipeline) -> bool {
    pipeline
        .spec
        .rollout
        .as_ref()
        .is_some_and(|r| r.strategy == RolloutStrategy::Canary)
}
