//! The RayCluster controller, compatible with KubeRay: get → validate → build (pure, in
//! `builders`) → apply (RBAC, Ingress, Secret, Services by server-side apply; Pods by create and
//! delete, guarded by scale expectations) → status (computed in `status`, written by
//! `status_write` only when it changed). The error type lives in `error`, the context and
//! the per-cluster memory in `context`.
//!
//! Ownership (issue 14): only objects the cluster controls are written, deleted or read as its
//! own. A child's name taken by someone else is a `<Kind>Conflict` (Warning event and the
//! ReplicaFailure condition) and the object is left as it is; Pods are deleted one by one after
//! an owner check, never by label selector alone (anyone can copy labels).
//!
//! Scale: only Pods, Services and Jobs carrying Ray labels are watched (and cached trimmed); the
//! reconciler runs with bounded concurrency, failing clusters back off on their own, and status
//! writes do not trigger reconciles (the RayCluster stream passes spec, label, annotation,
//! finalizer and deletion changes only).
//!
//! Status, unlike KubeRay: while a cluster provisions, a change that only moves it along (worker
//! counts, the head Pod's IP and name, why the head is not ready yet) may be written up to
//! `status::PROGRESS_HOLD` (5 s) late, together with the next one; the head Pod turning ready,
//! the cluster provisioned, a failure or a new state are written at once.

mod apply;
pub mod builders;
mod cache;
mod children;
mod config;
mod context;
mod deletion;
mod error;
pub mod expectations;
mod isolation;
mod pods;
mod reconcile;
pub mod scaling;
pub mod status;
mod status_write;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use crate::api::raycluster::RayCluster;
use crate::controllers::frame::memory::ObjectMemory;
use crate::controllers::frame::run::{self, Frame};
use crate::k8s::field_managers;
use crate::k8s::index::ObjectIndex;
use crate::kuberay::keys::labels;
use cache::{trim_pod, trim_service};
pub use config::Config;
use context::Context;
use expectations::{ScaleExpectations, key_of};

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
    let clusters: Api<RayCluster> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let pods: Api<Pod> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let services: Api<Service> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let jobs: Api<Job> = crate::k8s::scoped_api(&client, namespace.as_deref());

    let (pod_store, pod_writer) = reflector::store();
    let (service_store, service_writer) = reflector::store();
    let (cluster_store, cluster_writer) = reflector::store();
    let pod_index = ObjectIndex::by_label(labels::CLUSTER);
    let service_index = ObjectIndex::by_label(labels::CLUSTER);
    let concurrency = config.concurrency.max(1);
    let frame = Frame::new("raycluster", &config.metrics);
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(events.clone(), field_managers::RAYCLUSTER),
        client,
        config,
        pods: pod_store,
        pod_index: pod_index.clone(),
        services: service_store,
        service_index: service_index.clone(),
        expectations: ScaleExpectations::default(),
        memory: ObjectMemory::new(),
        frame,
    });

    // Label-scoped watches: memory does not grow with unrelated Pods, Services or Jobs.
    let pod_selector = format!(
        "{} in ({},{}),{}",
        labels::NODE_TYPE,
        labels::HEAD,
        labels::WORKER,
        labels::CLUSTER
    );
    let pod_events = watcher(pods, watcher::Config::default().labels(&pod_selector))
        .backoff(crate::k8s::watch_backoff())
        .modify(trim_pod)
        .map_ok(move |event| {
            pod_index.apply(&event);
            event
        })
        .reflect(pod_writer)
        .touched_objects();
    let service_selector = format!("{}={}", labels::CREATED_BY, labels::CREATED_BY_VALUE);
    let service_events = watcher(
        services,
        watcher::Config::default().labels(&service_selector),
    )
    .backoff(crate::k8s::watch_backoff())
    .modify(trim_service)
    .map_ok(move |event| {
        service_index.apply(&event);
        event
    })
    .reflect(service_writer)
    .touched_objects();
    let job_selector = format!("{}={}", labels::NODE_TYPE, labels::REDIS_CLEANUP);
    let job_events = watcher(jobs, watcher::Config::default().labels(&job_selector))
        .backoff(crate::k8s::watch_backoff())
        .touched_objects();

    let forget_ctx = ctx.clone();
    let cluster_events = watcher(clusters, watcher::Config::default())
        .backoff(crate::k8s::watch_backoff())
        .modify(|cluster: &mut RayCluster| cluster.managed_fields_mut().clear())
        .map_ok(move |event| {
            // A deleted cluster is never reconciled again: drop what is remembered of it here.
            if let watcher::Event::Delete(cluster) = &event {
                forget_ctx.forget(&key_of(cluster));
            }
            event
        })
        .reflect(cluster_writer)
        .applied_objects()
        .predicate_filter(crate::k8s::spec_or_metadata_changed, Default::default());
    let queue = ctx.frame.queue().clone();
    let cluster_events = cluster_events.inspect(move |c| {
        if let Ok(c) = c {
            queue.changed(c.namespace(), c.name_any());
        }
    });
    let owned = |queue: crate::admin::metrics::ReconcileQueue| {
        move |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            queue.owner_changed(meta, "RayCluster")
        }
    };
    let (pod_seen, service_seen, job_seen) = (
        owned(ctx.frame.queue().clone()),
        owned(ctx.frame.queue().clone()),
        owned(ctx.frame.queue().clone()),
    );
    let pod_events = pod_events.inspect(move |p| {
        if let Ok(p) = p {
            pod_seen(p.meta())
        }
    });
    let service_events = service_events.inspect(move |s| {
        if let Ok(s) = s {
            service_seen(s.meta())
        }
    });
    let job_events = job_events.inspect(move |j| {
        if let Ok(j) = j {
            job_seen(j.meta())
        }
    });

    ctx.frame
        .track_ready(&ctx.config.readiness, ctx.pods.clone());
    ctx.frame
        .track_ready(&ctx.config.readiness, ctx.services.clone());
    ctx.frame
        .track_ready(&ctx.config.readiness, cluster_store.clone());
    let _kuberay = ctx
        .config
        .metrics
        .observe_rayclusters(cluster_store.clone());
    let mut controller = Controller::for_stream(cluster_events, cluster_store)
        .trigger_backoff(crate::k8s::watch_backoff())
        .owns_stream(pod_events)
        .owns_stream(service_events)
        .owns_stream(job_events);
    // The gated children are watched only with their gate on, by their labels.
    let gates = &ctx.config.feature_gates;
    if gates.enabled(crate::validation::feature_gates::gates::RAY_CLUSTER_NETWORK_POLICY) {
        let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
            crate::k8s::scoped_api(&ctx.client, namespace.as_deref());
        let selector = format!("{}={}", labels::CREATED_BY, labels::CREATED_BY_VALUE);
        let events = watcher(policies, watcher::Config::default().labels(&selector))
            .backoff(crate::k8s::watch_backoff())
            .touched_objects();
        controller = controller.owns_stream(events);
    }
    if gates.enabled(crate::validation::feature_gates::gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE)
    {
        let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
            crate::k8s::scoped_api(&ctx.client, namespace.as_deref());
        let events = watcher(claims, watcher::Config::default().labels(labels::CLUSTER))
            .backoff(crate::k8s::watch_backoff())
            .touched_objects();
        controller = controller.owns_stream(events);
    }
    let controller = controller
        .with_config(
            controller::Config::default()
                .concurrency(concurrency)
                .debounce(RECONCILE_DEBOUNCE),
        )
        .graceful_shutdown_on(shutdown);
    run::drive(controller, reconcile::reconcile, ctx).await;
}

/// How long a cluster's triggers are gathered before it reconciles: a new cluster's Pods turn
/// ready within moments of each other, and one pass over all of them writes one status where
/// a pass per Pod would write one each. Short enough that nobody waits for it.
const RECONCILE_DEBOUNCE: Duration = Duration::from_millis(250);

#[cfg(test)]
mod tests {
    use super::status_write::now;
    use super::*;
    use crate::api::raycluster::RayClusterStatus;

    #[test]
    fn status_writes_do_not_look_relevant() {
        let mut cluster: RayCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "c", "generation": 1, "resourceVersion": "1"},
            "spec": {"headGroupSpec": {"template": {}}}
        }))
        .expect("a RayCluster");
        let before = crate::k8s::spec_or_metadata_changed(&cluster);
        cluster.metadata.resource_version = Some("2".into());
        cluster.status = Some(RayClusterStatus {
            ready_worker_replicas: Some(3),
            ..Default::default()
        });
        assert_eq!(crate::k8s::spec_or_metadata_changed(&cluster), before);
        cluster.metadata.finalizers = Some(vec![
            crate::kuberay::keys::GCS_FT_REDIS_CLEANUP_FINALIZER.into(),
        ]);
        assert_ne!(crate::k8s::spec_or_metadata_changed(&cluster), before);
    }

    #[test]
    fn now_has_whole_seconds_like_the_api_server() {
        assert_eq!(now().0.subsec_nanosecond(), 0);
    }

    #[test]
    fn config_defaults_follow_kuberay() {
        let config = Config::default();
        assert!(config.gcs_ft_redis_cleanup && !config.random_pod_delete);
        assert_eq!(config.requeue_after, Duration::from_secs(300));
        assert_eq!(config.gcs_ft_deletion_timeout, Duration::from_secs(300));
        assert!(config.build.probes_injection && config.build.init_container_injection);
        assert_eq!(config.build.cluster_domain, "cluster.local");
    }
}
