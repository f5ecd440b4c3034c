//! What a plan asks the apply stage to do with the pipeline's RayService.

use super::build::reasons;
use super::conditions::Problem;
use crate::api::rayservice::RayService;
use crate::api::servepipeline::condition_types;

pub(super) enum Desired {
    /// Nothing to write this pass.
    Keep,
    /// Refused before any write (a graph that does not render, a rollout whose state is lost):
    /// the RayService stays as it is.
    Refuse { problem: Problem, transient: bool },
    /// This RayService, server-side applied unless the one on the cluster already carries it.
    Write(Box<RayService>),
}

impl Desired {
    /// A graph that cannot be rendered: refused, nothing written.
    pub fn render_failed(message: String) -> Desired {
        Desired::Refuse {
            problem: Problem {
                condition: condition_types::GRAPH_VALID,
                reason: reasons::RENDER_FAILED.to_owned(),
                message,
            },
            transient: false,
        }
    }
}

/// How the apply stage ended.
pub(super) enum Applied {
    /// The RayService already carries what the plan wants.
    UpToDate,
    /// The RayService was written; what the API server returned.
    New(Box<RayService>),
    /// Nothing was written. `not_ours`: the name belongs to a RayService we do not control.
    Refused {
        problem: Problem,
        transient: bool,
        not_ours: bool,
    },
}
