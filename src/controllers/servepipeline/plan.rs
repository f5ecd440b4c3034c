//! The plan of one ServePipeline pass, pure: from the spec (its durations parsed once by
//! `validation`), the graph versions the source lane published, the RayService as read, the
//! rollout in the pipeline's status and the time, [`plan`] computes what to write (a RayService,
//! a refusal, or nothing), the rollout step and its Events. [`Plan::settle`] folds in how the
//! apply stage ended and yields the status and what the pipeline's memory keeps. No client, no
//! clock: every input is passed in.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::build::{self, reasons};
use super::canary::{self, CanaryInputs};
use super::conditions::{self, MAX_LOGGED_MESSAGE, Problem, StatusInputs};
use super::config::Config;
use super::desired::{Applied, Desired};
use super::memory::{GoodGraph, MemoryUpdate, Versions};
use super::rollout::{Announcement, Policy};
use super::shared;
use crate::api::rayservice::RayService;
use crate::api::servepipeline::{
    RolloutStatus, RolloutStrategy, ServePipeline, ServePipelineStatus, condition_types,
};
use crate::k8s::K8sError;
use crate::serve::rollout::RouterStats;
use crate::serve::shared::NodeLayout;
use crate::validation::servepipeline::{Validated, rollout_timing};

/// Everything one pass is planned from.
pub(super) struct PlanInputs<'a> {
    /// The pipeline: its spec, and its status (the rollout it is in).
    pub pipeline: &'a ServePipeline,
    pub spec: &'a Validated,
    pub config: &'a Config,
    pub versions: &'a Versions,
    /// The RayService of the pipeline's name, as read (ours or not).
    pub existing: Option<&'a RayService>,
    /// The canary routers' counters, as their reader last read them.
    pub stats: Option<&'a RouterStats>,
    pub now: &'a Time,
}

/// How new graph versions go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Strategy {
    /// Each new graph replaces the Serve config at once.
    Immediate,
    /// Each new graph is rolled out in weighted steps judged on its own traffic.
    Canary,
}

impl Strategy {
    pub fn of(pipeline: &ServePipeline) -> Strategy {
        match &pipeline.spec.rollout {
            Some(r) if r.strategy == RolloutStrategy::Canary => Strategy::Canary,
            _ => Strategy::Immediate,
        }
    }

    /// What this strategy writes, given what is wrong so far (`problem`) and whether the
    /// RayService of the pipeline's name is ours or absent (`owned`).
    fn plan(
        self,
        inputs: &PlanInputs<'_>,
        problem: Option<&Problem>,
        owned: bool,
    ) -> Result<(Desired, RolloutPlan), K8sError> {
        match self {
            Strategy::Immediate => {
                let (desired, mut rollout) = immediate(inputs, problem)?;
                // A command acts on canaries only: said once, then dropped.
                if inputs
                    .pipeline
                    .annotations()
                    .contains_key(crate::api::servepipeline::ROLLOUT_COMMAND_ANNOTATION)
                {
                    rollout.events.push(Announcement {
                        warning: true,
                        reason: "RolloutCommandIgnored",
                        message: "the pipeline's rollout strategy is Immediate; rollout commands act on canaries".to_owned(),
                    });
                    rollout.command_consumed = true;
                }
                Ok((desired, rollout))
            }
            Strategy::Canary => canary_step(inputs, problem, owned),
        }
    }
}

/// The rollout half of a plan (strategy `Canary`; empty with `Immediate`).
#[derive(Default)]
pub(super) struct RolloutPlan {
    /// The rollout status as this pass decided it.
    pub status: Option<RolloutStatus>,
    /// The rollout status to keep when the write is refused.
    pub if_refused: Option<RolloutStatus>,
    /// A step or a retirement is under way: reconcile again soon.
    pub active: bool,
    /// The step's Events, published before the write.
    pub events: Vec<Announcement>,
    /// A rollout this step ended: (result, key), counted once the RayService carries it.
    pub ended: Option<(&'static str, String)>,
    /// The pipeline's rollout command was acted on or refused.
    pub command_consumed: bool,
    /// The write only stages the newest graph (Immediate, shared nodes: its new nodes start
    /// while the previous wiring serves): not announced as applied yet.
    pub staging: bool,
}

/// One pass, planned.
pub(super) struct Plan {
    pub strategy: Strategy,
    pub desired: Desired,
    /// What is wrong before any write (spec, source, graph, ownership).
    pub problem: Option<Problem>,
    pub transient: bool,
    /// The RayService the pipeline controls, as read (`None`: absent, or someone else's).
    pub rayservice: Option<RayService>,
    pub rollout: RolloutPlan,
}

/// Plans one pass.
pub(super) fn plan(inputs: &PlanInputs<'_>) -> Result<Plan, K8sError> {
    let (mut problem, mut transient) = input_problem(inputs);
    // A RayService of that name the pipeline does not control is someone else's: it is neither
    // written nor read as ours. Retried with backoff: the owner may delete or rename it.
    let mut rayservice = inputs.existing.cloned();
    if let Some(rs) = inputs.existing
        && let Err(conflict) =
            crate::k8s::check_controlled_by(rs, &inputs.pipeline.uid().unwrap_or_default())
    {
        rayservice = None;
        transient = true;
        problem = problem.or(Some(Problem {
            condition: condition_types::READY,
            reason: reasons::RAYSERVICE_CONFLICT.to_owned(),
            message: conflict.to_string(),
        }));
    }
    let strategy = Strategy::of(inputs.pipeline);
    let owned = inputs.existing.is_none() || rayservice.is_some();
    let (desired, rollout) = strategy.plan(inputs, problem.as_ref(), owned)?;
    Ok(Plan {
        strategy,
        desired,
        problem,
        transient,
        rayservice,
        rollout,
    })
}

/// The spec's problems, else the source's latest (and whether it is transient).
fn input_problem(inputs: &PlanInputs<'_>) -> (Option<Problem>, bool) {
    if !inputs.spec.is_valid() {
        let message = crate::validation::problem::join(&inputs.spec.problems);
        let problem = Problem {
            condition: condition_types::READY,
            reason: reasons::INVALID_SPEC.to_owned(),
            message: crate::k8s::truncate(&message, MAX_LOGGED_MESSAGE),
        };
        return (Some(problem), false);
    }
    match inputs.versions.problem.clone() {
        Some((problem, transient)) => (Some(problem), transient),
        None => (None, false),
    }
}

/// Strategy `Immediate`: the newest graph's Serve config, when nothing is wrong.
fn immediate(
    inputs: &PlanInputs<'_>,
    problem: Option<&Problem>,
) -> Result<(Desired, RolloutPlan), K8sError> {
    let desired = match (problem, &inputs.versions.newest) {
        (None, Some(g)) if inputs.config.node_layout == NodeLayout::Shared => {
            return immediate_shared(inputs, g);
        }
        (None, Some(g)) => {
            let pipeline = inputs.pipeline;
            match build::render(pipeline, inputs.config, &g.graph, &g.applied) {
                Err(message) => Desired::render_failed(message),
                Ok(yaml) => Desired::Write(Box::new(build::desired_rayservice(
                    pipeline,
                    &yaml,
                    &g.applied.digest,
                )?)),
            }
        }
        _ => Desired::Keep,
    };
    Ok((desired, RolloutPlan::default()))
}

/// Strategy `Immediate` with shared node applications: the newest graph's nodes start beside
/// the wiring that serves, then the executor is switched to them, then the nodes it no longer
/// names are retired (`shared::immediate_step`).
fn immediate_shared(
    inputs: &PlanInputs<'_>,
    g: &GoodGraph,
) -> Result<(Desired, RolloutPlan), K8sError> {
    let pipeline = inputs.pipeline;
    let options = build::version_render_options(pipeline, inputs.config, &g.applied);
    let laid_out = crate::serve::render(&g.graph, &options).and_then(|rendered| {
        let base = rendered
            .applications
            .first()
            .map(|a| a.name.clone())
            .unwrap_or_default();
        let layout = crate::serve::shared::split(&rendered, &base)?;
        Ok((rendered, layout))
    });
    let (rendered, layout) = match laid_out {
        Ok(done) => done,
        Err(e) => {
            return Ok((
                Desired::render_failed(e.to_string()),
                RolloutPlan::default(),
            ));
        }
    };
    let step = shared::immediate_step(&layout, inputs.existing, inputs.now);
    let config = crate::serve::rollout::compose(
        crate::serve::rollout::rendered_options(&rendered),
        step.applications,
    );
    let yaml = serde_yaml::to_string(&config).unwrap_or_default();
    // While staging, the RayService still serves the graph it carried.
    let digest = inputs
        .existing
        .filter(|_| step.staging)
        .and_then(|rs| {
            rs.annotations()
                .get(crate::k8s::ANNOTATION_GRAPH_DIGEST)
                .cloned()
        })
        .unwrap_or_else(|| g.applied.digest.clone());
    let mut annotations = std::collections::BTreeMap::new();
    if !step.retiring.is_empty() {
        annotations.insert(
            shared::ANNOTATION_RETIRING.to_owned(),
            serde_json::to_string(&step.retiring).unwrap_or_default(),
        );
    }
    let rayservice = build::desired_rayservice_annotated(pipeline, &yaml, &digest, annotations)?;
    let rollout = RolloutPlan {
        active: step.active,
        staging: step.staging,
        ..RolloutPlan::default()
    };
    Ok((Desired::Write(Box::new(rayservice)), rollout))
}

/// Strategy `Canary`: one rollout step, when the rollout may go on.
fn canary_step(
    inputs: &PlanInputs<'_>,
    problem: Option<&Problem>,
    owned: bool,
) -> Result<(Desired, RolloutPlan), K8sError> {
    let pipeline = inputs.pipeline;
    let previous = pipeline.status.as_ref().and_then(|s| s.rollout.clone());
    // Only a source or graph problem lets a rollout go on: it keeps judging (and can roll
    // back) the versions already on the cluster while the registry misbehaves.
    let may_run = problem.is_none_or(|p| {
        p.condition == condition_types::SOURCE_READY || p.condition == condition_types::GRAPH_VALID
    }) && owned;
    let has_stable = previous.as_ref().is_some_and(|r| r.stable.is_some());
    if !may_run || (inputs.versions.newest.is_none() && !has_stable) {
        let kept = RolloutPlan {
            status: previous.clone(),
            if_refused: previous,
            ..RolloutPlan::default()
        };
        return Ok((Desired::Keep, kept));
    }
    let spec = pipeline.spec.rollout.clone().unwrap_or_default();
    let timing = inputs
        .spec
        .rollout
        .clone()
        .unwrap_or_else(|| rollout_timing(&spec));
    let step = canary::plan(&CanaryInputs {
        pipeline,
        config: inputs.config,
        policy: &Policy::new(&spec, &timing),
        newest: inputs.versions.newest.as_ref(),
        stable: inputs.versions.stable.as_ref(),
        existing: inputs.existing,
        stats: inputs.stats,
        now: inputs.now,
    })?;
    let rollout = RolloutPlan {
        status: Some(step.rollout),
        if_refused: Some(step.rollout_if_refused),
        active: step.active,
        events: step.events,
        ended: step.ended,
        command_consumed: step.command_consumed,
        staging: false,
    };
    Ok((step.desired, rollout))
}

/// A pass with the apply stage's outcome folded in.
pub(super) struct Settled {
    pub status: ServePipelineStatus,
    /// What is wrong after the writes, and whether it is transient.
    pub problem: Option<Problem>,
    pub transient: bool,
    /// A graph the RayService newly carries (strategy `Immediate`), for the `GraphApplied` Event.
    pub newly_applied: Option<GoodGraph>,
    pub rollout_active: bool,
    pub rollout_ended: Option<(&'static str, String)>,
    /// The rollout command is done with (its effect, if any, is in `status`): remove it.
    pub command_consumed: bool,
    /// What the pipeline's memory keeps (the announced problem is the status stage's).
    pub memory: MemoryUpdate,
}

impl Plan {
    /// Folds in how the apply stage ended: a refused write keeps the rollout where it was
    /// (nothing changed on the cluster), and its problem is the pass's.
    pub fn settle(self, applied: Option<Applied>, inputs: &PlanInputs<'_>) -> Settled {
        let Plan {
            strategy,
            desired,
            mut problem,
            mut transient,
            mut rayservice,
            rollout,
        } = self;
        let canary = strategy == Strategy::Canary;
        let staging = rollout.staging;
        let wrote = matches!(desired, Desired::Write(_));
        let (mut rollout_status, mut rollout_active) = (rollout.status, rollout.active);
        let mut command_consumed = rollout.command_consumed;
        let mut rollout_ended = None;
        let mut newly_applied = false;
        match applied {
            None | Some(Applied::UpToDate) => rollout_ended = rollout.ended.filter(|_| wrote),
            Some(Applied::New(applied)) => {
                newly_applied = !canary && !rollout.staging;
                rayservice = Some(*applied);
                rollout_ended = rollout.ended.filter(|_| wrote);
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
                if canary && wrote {
                    rollout_status = rollout.if_refused;
                    rollout_active = true;
                    // The command's effect was not written: it is carried out again.
                    command_consumed = false;
                }
            }
        }
        let versions = inputs.versions;
        let stable = stable_in_memory(versions, rollout_status.as_ref());
        let described = described_graph(
            inputs.pipeline,
            canary,
            staging,
            versions,
            stable.as_ref(),
            rollout_status.as_ref(),
        );
        let status = conditions::compute_status(&StatusInputs {
            pipeline: inputs.pipeline,
            applied: described.as_ref(),
            problem: problem.as_ref(),
            rayservice: rayservice.as_ref(),
            rollout: rollout_status.as_ref(),
            newest: versions.newest.as_ref().map(|g| &g.applied),
            now: inputs.now.clone(),
        });
        let memory = MemoryUpdate {
            source_inputs: versions.source_inputs.clone(),
            fetching: versions.fetching,
            checked: versions.checked,
            good: versions.newest.clone(),
            stable,
            announced_problem: None,
            last_problem: problem.clone().map(|p| (p, transient)),
        };
        Settled {
            status,
            newly_applied: versions.newest.clone().filter(|_| newly_applied),
            problem,
            transient,
            rollout_active,
            rollout_ended,
            command_consumed,
            memory,
        }
    }
}

/// The stable version's graph kept in memory: the newest graph once it is the stable one,
/// else the one remembered, while it still is the stable one.
fn stable_in_memory(versions: &Versions, rollout: Option<&RolloutStatus>) -> Option<GoodGraph> {
    let stable_digest = rollout
        .and_then(|r| r.stable.as_ref())
        .map(|s| s.digest.clone());
    let is_stable = |g: &&GoodGraph| Some(&g.applied.digest) == stable_digest.as_ref();
    versions
        .newest
        .as_ref()
        .filter(is_stable)
        .or(versions.stable.as_ref())
        .filter(is_stable)
        .cloned()
}

/// The graph the status's source and graph describe: with a canary policy the version that
/// serves (the stable one; the version being tried is in `status.rollout.canary`), else the
/// newest (while its shared nodes start: the one that serves).
fn described_graph(
    pipeline: &ServePipeline,
    canary: bool,
    staging: bool,
    versions: &Versions,
    stable: Option<&GoodGraph>,
    rollout: Option<&RolloutStatus>,
) -> Option<build::AppliedGraph> {
    if !canary && staging {
        // The newest graph's nodes are starting; the previous wiring still serves.
        return build::applied_from_status(pipeline.status.as_ref()?);
    }
    if !canary {
        return versions
            .newest
            .as_ref()
            .map(|g| g.applied.clone())
            .or_else(|| {
                // Not in memory (a restart, the first fetch under way or failed): the RayService
                // still carries what the status last described.
                build::applied_from_status(pipeline.status.as_ref()?)
            });
    }
    let stable_digest = rollout.and_then(|r| r.stable.as_ref()).map(|s| &s.digest);
    stable.map(|g| g.applied.clone()).or_else(|| {
        // Not in memory (a restart, or the newest graph was rolled back): as the status
        // last described it, when that is still the stable version.
        build::applied_from_status(pipeline.status.as_ref()?)
            .filter(|a| Some(&a.digest) == stable_digest)
    })
}
