//! The ServePipeline controller: token → fetch (conditional) → decode → validate → render →
//! RayService (server-side apply, owned) → status. Bad input never touches what runs: on any
//! fetch, validation or render failure the existing RayService is left exactly as it was.
//!
//! Layout: this file holds the module list and `run` (watches); nothing in the folder imports
//! it. `reconcile` reads the stages in order: `observe` (reads; the graph versions come from the
//! source lane, `source` and `fetches`, which fetches outside the reconcile workers), `plan`
//! (pure; strategy `Immediate` there, `Canary` in `canary` and `rollout`), `apply` (the only
//! writes), `status`. Pure builders: `build`, `conditions`, `desired`; shared state: `config`,
//! `context`, `memory`, `error`.

mod admission;
mod apply;
pub mod build;
mod canary;
pub mod conditions;
mod config;
mod context;
mod desired;
mod error;
mod fetches;
mod memory;
mod observe;
mod plan;
mod reconcile;
mod rollout;
mod shared;
mod source;
mod stats;
mod status;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::runtime::predicates;
use kube::runtime::reflector::ObjectRef;
use tracing::warn;

use crate::api::rayservice::RayService;
use crate::api::servepipeline::ServePipeline;
use crate::controllers::frame::memory::{ObjectKey, ObjectMemory};
use crate::controllers::frame::run::{self, Frame};
use crate::controllers::frame::watch::{Child, Watches};
use crate::k8s::{LABEL_MANAGED_BY, MANAGED_BY, field_managers};
pub use config::Config;
use context::Context;
pub use error::Error;
use fetches::FetchQueue;
pub use fetches::FetchSlots;
/// How a promoted rollout is recorded in `status.rollout.last.result`.
pub use rollout::results::PROMOTED as ROLLOUT_PROMOTED;

/// The controller's name in metrics.
const METRICS_NAME: &str = "servepipeline";

/// Runs the controller until `shutdown` completes.
pub async fn run(
    clients: impl Into<crate::k8s::Clients>,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let clients: crate::k8s::Clients = clients.into();
    let frame = Frame::new(METRICS_NAME, &config.metrics).with_retry_ceiling(refresh_interval);
    let mut watches = Watches::new(&frame, &clients.api, &config.namespace, &config.readiness);
    // Only the metadata of Secrets is watched: enough to see a rotation, without caching values.
    let secrets = watches.watches_cached(
        Child::<PartialObjectMeta<Secret>>::every(),
        |secret, pipelines| {
            let (namespace, name) = (secret.namespace(), secret.name_any());
            pipelines
                .state()
                .into_iter()
                .filter(|p| p.namespace() == namespace && references_secret(p, &name))
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
        },
    );
    let (fetches, fetched) = FetchQueue::new(config.fetch_slots.clone());
    watches
        // Our own status writes do not change the generation: filtering on it avoids a hot loop.
        .relevant_when(predicates::generation)
        .concurrency(config.concurrency)
        .owns(Child::<RayService>::labelled(format!(
            "{LABEL_MANAGED_BY}={MANAGED_BY}"
        )))
        // A finished fetch brings its pipeline back.
        .reconcile_on(fetched);
    let _phases = config.metrics.observe_pipelines(watches.store());
    let ctx = Arc::new(Context {
        client: clients.api,
        fetcher: config.fetcher.clone(),
        recorder: crate::k8s::recorder(clients.events, field_managers::SERVEPIPELINE),
        config,
        secrets,
        state: ObjectMemory::new(),
        status_written: ObjectMemory::new(),
        counted_rollout: ObjectMemory::new(),
        frame,
        fetches,
        stats: Default::default(),
    });
    watches.run(ctx, shutdown).await;
}

fn references_secret(pipeline: &ServePipeline, secret: &str) -> bool {
    let source = &pipeline.spec.source;
    source
        .bearer_token_secret_ref
        .as_ref()
        .is_some_and(|r| r.name == secret)
        || source
            .ca_bundle_secret_ref
            .as_ref()
            .is_some_and(|r| r.name == secret)
}

impl run::Framed<ServePipeline> for Context {
    fn frame(&self) -> &Frame<ServePipeline> {
        &self.frame
    }

    /// A deleted pipeline: what is remembered of it, its fetch and its counters reader go.
    fn forget(&self, key: &ObjectKey) {
        self.state.forget(key);
        self.status_written.forget(key);
        self.counted_rollout.forget(key);
        self.frame.forget(key);
        let pipeline = ObjectRef::new(&key.1).within(&key.0);
        self.fetches.forget(&pipeline);
        self.stats.stop(&pipeline);
    }
}

impl crate::controllers::frame::ReportPanic<ServePipeline> for Context {
    /// A Warning Event, and `Ready` False with reason `ReconcilePanicked` in the pipeline's
    /// status (the RayService it owns is left as it is).
    fn report_panic(
        &self,
        pipeline: Arc<ServePipeline>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        let event = crate::controllers::frame::panic_event(
            &self.recorder,
            pipeline.clone(),
            message.clone(),
        );
        let client = self.client.clone();
        let applied = self
            .state
            .peek(&*pipeline, |s| {
                s.as_ref()
                    .and_then(|s| s.good.as_ref().map(|g| g.applied.clone()))
            })
            .flatten();
        Box::pin(async move {
            event.await;
            let status =
                conditions::panic_status(&pipeline, applied.as_ref(), &message, crate::k8s::now());
            if let Err(e) = crate::controllers::frame::status::apply_status(
                &client,
                &*pipeline,
                crate::k8s::field_managers::SERVEPIPELINE,
                &status,
            )
            .await
            {
                warn!(error = %e, "recording a panic in the status failed");
            }
        })
    }
}

/// The validated refresh interval (at least a second; `None` when unset or invalid).
fn refresh_interval(pipeline: &ServePipeline) -> Option<Duration> {
    crate::validation::servepipeline::source_timing(&pipeline.spec.source).refresh_interval
}
