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

mod admission;
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

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::ResourceExt;

use crate::api::raycluster::RayCluster;
use crate::controllers::frame::memory::ObjectMemory;
use crate::controllers::frame::run::Frame;
use crate::controllers::frame::watch::{Child, Watches};
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
    let clients: crate::k8s::Clients = clients.into();
    let frame = Frame::new("rayservice", &config.metrics);
    let mut watches = Watches::new(&frame, &clients.api, &config.namespace, &config.readiness);
    // Label-scoped: only what RayServices made (clusters, Services) and their head Pods.
    let owned = format!("{}={}", labels::ORIGINATED_FROM_CRD, build::CREATOR);
    let cluster_index = ObjectIndex::by_controller();
    let clusters = watches.owns_cached(
        Child::<RayCluster>::labelled(&owned)
            .trimmed(|c| c.managed_fields_mut().clear())
            .indexed(cluster_index.clone()),
    );
    let services = watches.owns_cached(Child::<Service>::labelled(&owned).trimmed(|s| {
        s.managed_fields_mut().clear();
        s.status = None;
    }));
    let head_pod_index = ObjectIndex::by_label(labels::CLUSTER);
    let head_selector = format!("{}={},{}", labels::NODE_TYPE, labels::HEAD, labels::SERVE);
    let head_pods = watches.cache(
        Child::<Pod>::labelled(head_selector)
            .trimmed(|p| {
                // Only the name, labels and owner matter here.
                p.managed_fields_mut().clear();
                p.spec = None;
                p.status = None;
                p.metadata.annotations = None;
            })
            .indexed(head_pod_index.clone()),
    );
    let (serve_watches, serve_lost) = serve_watch::ServeWatches::new();
    watches
        .concurrency(config.concurrency)
        .reconcile_on(serve_lost);
    let _kuberay = config.metrics.observe_rayservices(watches.store());
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(clients.events, field_managers::RAYSERVICE),
        client: clients.api,
        config,
        clusters,
        cluster_index,
        services,
        head_pods,
        head_pod_index,
        memory: ObjectMemory::new(),
        frame,
        serve_watches,
    });
    watches.run(ctx, shutdown).await;
}
