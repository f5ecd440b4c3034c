//! The observe stage of a ServePipeline pass: reads only. The RayService of the pipeline's
//! name, the pipeline's memory, the graph versions the source lane published (`source`), and
//! the canary routers' counters their reader last read (`stats`). Nothing here waits on a
//! registry or a Serve proxy.

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use super::admission;
use super::build;
use super::canary;
use super::context::Context;
use super::error::{Error, KubeFailure};
use super::memory::{PipelineState, Versions};
use super::plan::Strategy;
use super::source;
use super::stats::Target;
use crate::api::rayservice::RayService;
use crate::api::servepipeline::ServePipeline;
use crate::serve::rollout::{RouterStats, STATS_PATH};
use crate::validation::servepipeline::Validated;

/// The Serve port KubeRay gives the `<rayservice>-serve-svc` Service.
pub const SERVE_PORT: u16 = 8000;

/// What one pass found.
pub(super) struct Observed {
    /// The RayService of the pipeline's name (ours or not).
    pub existing: Option<RayService>,
    /// The pipeline's memory from the previous pass.
    pub previous: Option<PipelineState>,
    pub versions: Versions,
    pub stats: Option<RouterStats>,
    /// Kueue's admission of its clusters, for a pipeline in a queue.
    pub admission: Option<admission::Reading>,
}

pub(super) async fn observe(
    pipeline: &Arc<ServePipeline>,
    ctx: &Arc<Context>,
    spec: &Validated,
) -> Result<Observed, Error> {
    let existing = read_rayservice(pipeline, ctx).await?;
    let previous = ctx.state.peek(&**pipeline, Option::clone).flatten();
    let versions = source::versions(pipeline, ctx, spec, previous.as_ref());
    let stats = router_stats(pipeline, ctx, &versions, existing.as_ref());
    let admission = admission::read(pipeline, ctx, existing.as_ref()).await;
    Ok(Observed {
        existing,
        previous,
        versions,
        stats,
        admission,
    })
}

async fn read_rayservice(
    pipeline: &ServePipeline,
    ctx: &Context,
) -> Result<Option<RayService>, Error> {
    let namespace = pipeline.namespace().unwrap_or_default();
    let rs_name = build::rayservice_name(pipeline);
    let rs_api: Api<RayService> = Api::namespaced(ctx.client.clone(), &namespace);
    rs_api.get_opt(&rs_name).await.map_err(|source| {
        KubeFailure::new(format!("reading RayService {namespace}/{rs_name}"), source).into()
    })
}

/// The routers' counters as the pipeline's reader last read them, mid-rollout (never a wait);
/// outside a rollout its reader is stopped.
fn router_stats(
    pipeline: &ServePipeline,
    ctx: &Context,
    versions: &Versions,
    existing: Option<&RayService>,
) -> Option<RouterStats> {
    if Strategy::of(pipeline) != Strategy::Canary {
        return None;
    }
    let key = ObjectRef::from_obj(pipeline);
    match pipeline.status.as_ref().and_then(|s| s.rollout.as_ref()) {
        Some(r) if r.canary.is_some() || r.retiring.is_some() => {
            let route =
                canary::route_prefix(pipeline, &ctx.config, versions.newest.as_ref(), existing);
            stats_target(ctx, pipeline, &route, &r.generation)
                .and_then(|target| ctx.stats.latest(&key, target))
        }
        _ => {
            ctx.stats.stop(&key);
            None
        }
    }
}

/// Where the routers' counters of `pipeline` are read: through the Serve proxy of its
/// RayService (`<name>-serve-svc`, or `--ray-serve-url`). `None` when no URL can be made (the
/// gates then wait, and the deadline still counts).
fn stats_target(
    ctx: &Context,
    pipeline: &ServePipeline,
    route_prefix: &str,
    generation: &str,
) -> Option<Target> {
    let namespace = pipeline.namespace().unwrap_or_default();
    let service = crate::ray::HeadService::new(
        namespace,
        format!("{}-serve-svc", build::rayservice_name(pipeline)),
        SERVE_PORT,
    );
    let base = ctx.config.serve_locator().locate(&service).ok()?;
    let mut path: Vec<String> = route_prefix
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    path.extend(STATS_PATH.split('/').map(str::to_owned));
    Some(Target {
        base_url: base.as_str().to_owned(),
        path,
        generation: generation.to_owned(),
    })
}
