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
pub(crate) mod batch;
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

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::controllers::frame::memory::ObjectMemory;
use crate::controllers::frame::run::Frame;
use crate::controllers::frame::watch::{Child, Watches};
use crate::k8s::field_managers;
use crate::k8s::index::ObjectIndex;
use crate::kuberay::keys::labels;
use cache::{trim_pod, trim_service};
pub use config::Config;
use context::Context;
use expectations::ScaleExpectations;

/// Runs the controller until `shutdown` completes.
pub async fn run(
    clients: impl Into<crate::k8s::Clients>,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let clients: crate::k8s::Clients = clients.into();
    let frame = Frame::new("raycluster", &config.metrics);
    let mut watches = Watches::new(&frame, &clients.api, &config.namespace, &config.readiness);
    // Label-scoped watches: memory does not grow with unrelated Pods, Services or Jobs.
    let pod_index = ObjectIndex::by_label(labels::CLUSTER);
    let pods = watches.owns_cached(
        Child::<Pod>::labelled(format!(
            "{} in ({},{}),{}",
            labels::NODE_TYPE,
            labels::HEAD,
            labels::WORKER,
            labels::CLUSTER
        ))
        .trimmed(trim_pod)
        .indexed(pod_index.clone()),
    );
    let created_by_us = format!("{}={}", labels::CREATED_BY, labels::CREATED_BY_VALUE);
    let service_index = ObjectIndex::by_label(labels::CLUSTER);
    let services = watches.owns_cached(
        Child::<Service>::labelled(&created_by_us)
            .trimmed(trim_service)
            .indexed(service_index.clone()),
    );
    watches.owns(Child::<Job>::labelled(format!(
        "{}={}",
        labels::NODE_TYPE,
        labels::REDIS_CLEANUP
    )));
    // The gated children are watched only with their gate on, by their labels.
    let gates = &config.feature_gates;
    if gates.enabled(crate::validation::feature_gates::gates::RAY_CLUSTER_NETWORK_POLICY) {
        watches.owns(Child::<NetworkPolicy>::labelled(&created_by_us));
    }
    if gates.enabled(crate::validation::feature_gates::gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE)
    {
        watches.owns(Child::<PersistentVolumeClaim>::labelled(labels::CLUSTER));
    }
    watches
        .concurrency(config.concurrency)
        .debounce(RECONCILE_DEBOUNCE);
    let _kuberay = config.metrics.observe_rayclusters(watches.store());
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(clients.events, field_managers::RAYCLUSTER),
        client: clients.api,
        config,
        pods,
        pod_index,
        services,
        service_index,
        expectations: ScaleExpectations::default(),
        memory: ObjectMemory::new(),
        frame,
    });
    watches.run(ctx, shutdown).await;
}

/// How long a cluster's triggers are gathered before it reconciles: a new cluster's Pods turn
/// ready within moments of each other, and one pass over all of them writes one status where
/// a pass per Pod would write one each. Short enough that nobody waits for it.
const RECONCILE_DEBOUNCE: Duration = Duration::from_millis(250);

#[cfg(test)]
mod tests {
    use super::status_write::now;
    use super::*;
    use crate::api::raycluster::{RayCluster, RayClusterStatus};

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
