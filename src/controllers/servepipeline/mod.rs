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
mod source;
mod stats;
mod status;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Resource, ResourceExt};
use tracing::warn;

use crate::api::rayservice::RayService;
use crate::api::servepipeline::ServePipeline;
use crate::controllers::frame::memory::ObjectMemory;
use crate::controllers::frame::run::{self, Frame};
use crate::k8s::{LABEL_MANAGED_BY, MANAGED_BY, field_managers};
pub use config::Config;
use context::Context;
pub use error::Error;
use fetches::FetchQueue;
pub use fetches::FetchSlots;

/// The controller's name in metrics.
const METRICS_NAME: &str = "servepipeline";

/// Runs the controller until `shutdown` completes.
pub async fn run(
    clients: impl Into<crate::k8s::Clients>,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let crate::k8s::Clients {
        api: client,
        events,
    } = clients.into();
    let pipelines: Api<ServePipeline> =
        crate::k8s::scoped_api(&client, config.namespace.as_deref());
    let rayservices: Api<RayService> = crate::k8s::scoped_api(&client, config.namespace.as_deref());
    let secrets: Api<PartialObjectMeta<Secret>> = match config.namespace.as_deref() {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };

    // Only the metadata of Secrets is watched: enough to see a rotation, without caching values.
    let (secret_store, secret_writer) = reflector::store();
    let secret_events = watcher(secrets, watcher::Config::default())
        .backoff(crate::k8s::watch_backoff())
        .reflect(secret_writer)
        .touched_objects();

    // Our own status writes do not change the generation: filtering on it avoids a hot loop.
    let (pipeline_store, pipeline_writer) = reflector::store();
    let pipeline_stream = watcher(pipelines, watcher::Config::default())
        .backoff(crate::k8s::watch_backoff())
        .reflect(pipeline_writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let frame = Frame::new(METRICS_NAME, &config.metrics).with_retry_ceiling(refresh_interval);
    let queue = frame.queue().clone();
    let pipeline_stream = {
        let queue = queue.clone();
        pipeline_stream.inspect(move |p| {
            if let Ok(p) = p {
                queue.changed(p.namespace(), p.name_any());
            }
        })
    };
    let rayservice_events = {
        let queue = queue.clone();
        watcher(
            rayservices,
            watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}")),
        )
        .backoff(crate::k8s::watch_backoff())
        .touched_objects()
        .inspect(move |rs| {
            if let Ok(rs) = rs {
                queue.owner_changed(rs.meta(), "ServePipeline");
            }
        })
    };
    let secret_queue = queue.clone();
    let store_for_secrets = pipeline_store.clone();
    frame.track_ready(&config.readiness, pipeline_store.clone());
    frame.track_ready(&config.readiness, secret_store.clone());
    let _phases = config.metrics.observe_pipelines(pipeline_store.clone());
    let controller_config =
        kube::runtime::controller::Config::default().concurrency(config.concurrency);

    let (fetches, fetched) = FetchQueue::new(config.fetch_slots.clone());
    let ctx = Arc::new(Context {
        client: client.clone(),
        fetcher: config.fetcher.clone(),
        recorder: crate::k8s::recorder(events.clone(), field_managers::SERVEPIPELINE),
        config,
        secrets: secret_store,
        state: ObjectMemory::new(),
        status_written: ObjectMemory::new(),
        counted_rollout: ObjectMemory::new(),
        frame,
        fetches,
        stats: Default::default(),
    });

    let controller = Controller::for_stream(pipeline_stream, pipeline_store)
        .trigger_backoff(crate::k8s::watch_backoff())
        .with_config(controller_config)
        .owns_stream(rayservice_events)
        // A finished fetch brings its pipeline back.
        .reconcile_on(fetched)
        .watches_stream(secret_events, move |secret: PartialObjectMeta<Secret>| {
            let ns = secret.namespace();
            let name = secret.name_any();
            store_for_secrets
                .state()
                .into_iter()
                .filter(|p| p.namespace() == ns && references_secret(p, &name))
                .map(|p| {
                    secret_queue.changed(p.namespace(), p.name_any());
                    ObjectRef::from_obj(&*p)
                })
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown);
    crate::controllers::frame::run::drive(controller, reconcile::reconcile, ctx).await;
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
            if let Err(e) = status::write(&client, &pipeline, &status).await {
                warn!(error = %e, "recording a panic in the status failed");
            }
        })
    }
}

/// The validated refresh interval (at least a second; `None` when unset or invalid).
fn refresh_interval(pipeline: &ServePipeline) -> Option<Duration> {
    crate::validation::servepipeline::source_timing(&pipeline.spec.source).refresh_interval
}
