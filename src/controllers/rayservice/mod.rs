//! The RayService controller, compatible with KubeRay: get → validate → suspend → clusters
//! (create the pending one, update in place) → Serve (push `serveConfigV2` to the pending
//! cluster, else the active one; read application statuses) → Services (the traffic switch) →
//! status (computed in `status`, written only when it changed).
//!
//! Deliberate differences from KubeRay, each for a reason users gave:
//! - The Serve config is pushed when its content changed, when Serve reports no applications
//!   (a head restarted without GCS fault tolerance), and when the head's Ray session changed:
//!   the in-memory record of what was pushed is never trusted alone.
//! - The head Pod's `ray.io/serve` label follows the health of its Serve proxy as the
//!   dashboard reports it, so the operator needs no route to Pod IPs.
//! - No finalizer: owner references let the garbage collector delete the clusters, so a
//!   RayService never hangs in deletion when the operator is gone.
//! - While an upgrade or the first start waits, the conditions say on what (head not ready,
//!   an application's Serve error, the dashboard unreachable) instead of only a reason.
//! - With the autoscaler off, a changed replica count is applied in place.
//! - `NewClusterWithIncrementalUpgrade` (Gateway API traffic steps, `incremental`): the
//!   `<svc>-serve-svc` and `<svc>-head-svc` keep their names and stay on the active cluster
//!   until the pending one takes all the route's traffic (KubeRay renames the serve Service
//!   per cluster, and it loses its endpoints while the old cluster drains); the annotation
//!   `raypipe.dev/gateway` attaches the HTTPRoute to an existing shared Gateway instead of
//!   making one per RayService.
//! - A RayCluster or Service of a child's name that the RayService does not control is never
//!   written, adopted or deleted: a `<Kind>Conflict` Warning (and for a first cluster the Ready
//!   condition) says so (issue 14).

mod apply;
pub mod build;
mod config;
mod context;
mod error;
pub mod gateway;
pub mod incremental;
mod observed;
pub mod reasons;
mod reconcile;
mod serve;
mod serve_watch;
pub mod status;
mod suspend;
mod upgrade;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use crate::api::raycluster::RayCluster;
use crate::api::rayservice::RayService;
use crate::controllers::frame::memory::{ObjectMemory, key_of};
use crate::controllers::frame::run::Frame;
use crate::k8s::field_managers;
use crate::k8s::index::ObjectIndex;
use crate::kuberay::keys::labels;
use context::Context;

pub use config::{Config, HttpBindingFor};
pub use error::Error;

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
    let namespace = config.namespace.clone();
    let services_api: Api<RayService> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let clusters_api: Api<RayCluster> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let k8s_services: Api<Service> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let pods: Api<Pod> = crate::k8s::scoped_api(&client, namespace.as_deref());

    let (cluster_store, cluster_writer) = reflector::store();
    let (service_store, service_writer) = reflector::store();
    let (pod_store, pod_writer) = reflector::store();
    let (rayservice_store, rayservice_writer) = reflector::store();
    let cluster_index = ObjectIndex::by_controller();
    let head_pod_index = ObjectIndex::by_label(labels::CLUSTER);
    let concurrency = config.concurrency.max(1);
    let frame = Frame::new("rayservice", &config.metrics);
    let (serve_watches, serve_lost) = serve_watch::ServeWatches::new();
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(events.clone(), field_managers::RAYSERVICE),
        client,
        config,
        clusters: cluster_store,
        cluster_index: cluster_index.clone(),
        services: service_store,
        head_pods: pod_store,
        head_pod_index: head_pod_index.clone(),
        memory: ObjectMemory::new(),
        frame,
        serve_watches,
    });

    // Label-scoped: only what RayServices made (clusters, Services) and their head Pods.
    let owned = format!("{}={}", labels::ORIGINATED_FROM_CRD, build::CREATOR);
    let cluster_events = watcher(clusters_api, watcher::Config::default().labels(&owned))
        .backoff(crate::k8s::watch_backoff())
        .modify(|c: &mut RayCluster| c.managed_fields_mut().clear())
        .map(move |event| {
            if let Ok(event) = &event {
                cluster_index.apply(event);
            }
            event
        })
        .reflect(cluster_writer)
        .touched_objects();
    let service_events = watcher(k8s_services, watcher::Config::default().labels(&owned))
        .backoff(crate::k8s::watch_backoff())
        .modify(|s: &mut Service| {
            s.managed_fields_mut().clear();
            s.status = None;
        })
        .reflect(service_writer)
        .touched_objects();
    let head_selector = format!("{}={},{}", labels::NODE_TYPE, labels::HEAD, labels::SERVE);
    let pod_events = watcher(pods, watcher::Config::default().labels(&head_selector))
        .backoff(crate::k8s::watch_backoff())
        .modify(|p: &mut Pod| {
            // Only the name, labels and owner matter here.
            p.managed_fields_mut().clear();
            p.spec = None;
            p.status = None;
            p.metadata.annotations = None;
        })
        .map(move |event| {
            if let Ok(event) = &event {
                head_pod_index.apply(event);
            }
            event
        })
        .reflect(pod_writer)
        .for_each(|_| async {});
    tokio::spawn(pod_events);

    let forget_ctx = ctx.clone();
    let rayservice_events = watcher(services_api, watcher::Config::default())
        .backoff(crate::k8s::watch_backoff())
        .modify(|s: &mut RayService| s.managed_fields_mut().clear())
        .map(move |event| {
            if let Ok(watcher::Event::Delete(service)) = &event {
                forget_ctx.forget(&key_of(service));
            }
            event
        })
        .reflect(rayservice_writer)
        .applied_objects()
        .predicate_filter(crate::k8s::spec_or_metadata_changed, Default::default());

    let queue = ctx.frame.queue().clone();
    let rayservice_events = rayservice_events.inspect(move |s| {
        if let Ok(s) = s {
            queue.changed(s.namespace(), s.name_any());
        }
    });
    let queue = ctx.frame.queue().clone();
    let cluster_events = cluster_events.inspect(move |c| {
        if let Ok(c) = c {
            queue.owner_changed(c.meta(), "RayService");
        }
    });
    let queue = ctx.frame.queue().clone();
    let service_events = service_events.inspect(move |s| {
        if let Ok(s) = s {
            queue.owner_changed(s.meta(), "RayService");
        }
    });
    ctx.frame
        .track_ready(&ctx.config.readiness, ctx.clusters.clone());
    ctx.frame
        .track_ready(&ctx.config.readiness, rayservice_store.clone());
    let _kuberay = ctx
        .config
        .metrics
        .observe_rayservices(rayservice_store.clone());
    let controller = Controller::for_stream(rayservice_events, rayservice_store)
        .trigger_backoff(crate::k8s::watch_backoff())
        .owns_stream(cluster_events)
        .owns_stream(service_events)
        .reconcile_on(serve_lost)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown);
    crate::controllers::frame::run::drive(controller, reconcile::reconcile, ctx).await;
}
