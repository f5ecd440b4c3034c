//! What the controller remembers about one pipeline between reconciles, and the graph
//! versions the source lane publishes into it. Lost on restart, which costs one unconditional
//! download per pipeline.

use std::sync::Arc;
use std::time::Instant;

use super::build::AppliedGraph;
use super::conditions::Problem;
use crate::graph::ValidatedGraph;

/// What one fetch ends in: a new valid graph, `None` when unchanged, or a problem (and whether
/// it is transient).
pub(super) type FetchResult = Result<Option<GoodGraph>, (Problem, bool)>;

/// One pipeline's memory.
#[derive(Clone)]
pub(super) struct PipelineState {
    /// Hash of everything that decides what to fetch: spec.source and the Secrets' versions.
    pub source_inputs: String,
    pub last_checked: Instant,
    pub good: Option<GoodGraph>,
    /// With a canary policy: the graph of the stable version, while it is in memory.
    pub stable: Option<GoodGraph>,
    /// The last problem an Event was published for, so a persisting failure is announced once.
    pub announced_problem: Option<(String, String)>,
    /// The latest fetch's problem (and whether it is transient), shown while the next fetch runs.
    pub last_problem: Option<(Problem, bool)>,
}

/// A validated graph and how the status describes it.
#[derive(Clone)]
pub(super) struct GoodGraph {
    pub graph: Arc<ValidatedGraph>,
    pub applied: AppliedGraph,
}

/// The graph versions of one pipeline as a reconcile reads them from the source lane.
#[derive(Clone)]
pub(super) struct Versions {
    /// The newest valid graph the source offered.
    pub newest: Option<GoodGraph>,
    /// With a canary policy: the stable version's graph, while it is in memory.
    pub stable: Option<GoodGraph>,
    /// The source's latest problem and whether it is transient.
    pub problem: Option<(Problem, bool)>,
    /// A fetch runs; its end reconciles the pipeline again.
    pub fetching: bool,
    /// A fetch ended and its outcome was taken in this pass.
    pub checked: bool,
    /// Hash of what decides the fetch (see [`PipelineState::source_inputs`]).
    pub source_inputs: String,
}

/// What one pass leaves in the pipeline's memory.
pub(super) struct MemoryUpdate {
    pub source_inputs: String,
    /// While a fetch runs, the inputs and the problem it was started for stay remembered.
    pub fetching: bool,
    pub checked: bool,
    pub good: Option<GoodGraph>,
    pub stable: Option<GoodGraph>,
    pub announced_problem: Option<(String, String)>,
    pub last_problem: Option<(Problem, bool)>,
}

impl MemoryUpdate {
    /// Writes the update into `state`, created on the first pass; `now` is the check time.
    pub fn write_into(self, state: &mut Option<PipelineState>, now: Instant) {
        let entry = state.get_or_insert_with(|| PipelineState {
            source_inputs: self.source_inputs.clone(),
            last_checked: now,
            good: None,
            stable: None,
            announced_problem: None,
            last_problem: None,
        });
        // While a fetch for new inputs runs, the old inputs stay remembered: the fetch's
        // wake-up then finds the source still due and takes the outcome at once (remembering
        // the new ones here left it waiting for the refresh interval).
        if !self.fetching {
            entry.source_inputs = self.source_inputs;
            entry.last_problem = self.last_problem;
        }
        if self.checked {
            entry.last_checked = now;
        }
        entry.good = self.good;
        entry.stable = self.stable;
        entry.announced_problem = self.announced_problem;
    }
}
