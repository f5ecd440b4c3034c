//! The apply stage of a ServePipeline: renders the Serve config of the validated graph and
//! server-side applies the RayService it owns, only when it differs from what runs.

use kube::Resource;
use kube::api::Api;

use super::build::{self, reasons};
use super::conditions::Problem;
use super::{Context, Error, GoodGraph};
use crate::api::rayservice::RayService;
use crate::api::servepipeline::{ServePipeline, condition_types};
use crate::k8s::field_managers;

/// How the apply stage ended.
pub(super) enum Applied {
    /// The RayService already carries this graph.
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

pub(super) async fn apply(
    pipeline: &ServePipeline,
    ctx: &Context,
    rs_api: &Api<RayService>,
    existing: Option<&RayService>,
    g: &GoodGraph,
) -> Result<Applied, Error> {
    let render_started = std::time::Instant::now();
    let yaml = match build::render(pipeline, &ctx.config, &g.graph, &g.applied) {
        Ok(yaml) => yaml,
        Err(message) => return Ok(render_failed(message)),
    };
    let desired = build::desired_rayservice(pipeline, &yaml, &g.applied.digest)?;
    let rendered = render_started.elapsed();
    let apply_started = std::time::Instant::now();
    let applied = write(rs_api, existing, &desired).await;
    if matches!(applied, Applied::New(_)) {
        let metrics = &ctx.config.metrics;
        metrics.pipeline_update_stage("render", rendered);
        metrics.pipeline_update_stage("apply", apply_started.elapsed());
    }
    Ok(applied)
}

/// A graph that cannot be rendered: refused, nothing written.
pub(super) fn render_failed(message: String) -> Applied {
    Applied::Refused {
        problem: Problem {
            condition: condition_types::GRAPH_VALID,
            reason: reasons::RENDER_FAILED.to_owned(),
            message,
        },
        transient: false,
        not_ours: false,
    }
}

/// Server-side applies `desired` unless `existing` already carries it.
pub(super) async fn write(
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
