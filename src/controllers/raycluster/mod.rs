//! The RayCluster controller, compatible with KubeRay: get → validate → build (pure, in
//! `builders`) → apply (RBAC, Ingress, Secret, Services by server-side apply; Pods by create and
//! delete, guarded by scale expectations) → status (computed in `status`, written only when it
//! changed).
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

mod apply;
pub mod builders;
mod cache;
mod children;
mod deletion;
pub mod expectations;
mod pods;
mod reconcile;
pub mod scaling;
pub mod status;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Container, Pod, PodSpec, PodStatus, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::NamespaceResourceScope;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use crate::api::conditions;
use crate::api::raycluster::{
    AutoscalerVersion, MANAGED_BY_KUBERAY, RayCluster, RayClusterStatus, condition_reasons,
    condition_types,
};
use crate::controllers::frame::memory::ObjectMemory;
use crate::controllers::frame::policy::ReconcileError;
use crate::controllers::frame::run::{self, Frame};
use crate::k8s::field_managers;
use crate::kuberay::keys::{annotations, labels, reasons};
use crate::kuberay::names;
use builders::pod::WorkerReplica;
use builders::{BuildError, BuildOptions};
use cache::{trim_pod, trim_service};
use expectations::{Action as ScaleAction, ClusterKey, Group, ScaleExpectations};
use scaling::DeleteReason;
use status::Outcome;

/// KubeRay's short requeue: after a status change or a step that needs another pass.
const SHORT_REQUEUE: Duration = Duration::from_secs(2);
/// While the head Pod of a deleted GCS-FT cluster terminates.
const HEAD_TERMINATION_REQUEUE: Duration = Duration::from_secs(10);
/// How long a reconcile waits for the Pod and Service caches after start-up.
const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        /// The `ReplicaFailure` reason when a Pod could not be created or deleted.
        replica_failure: Option<&'static str>,
        // Boxed: kube::Error is large and this enum travels through every reconcile.
        #[source]
        source: Box<kube::Error>,
    },
    #[error(transparent)]
    Apply(#[from] crate::k8s::K8sError),
    #[error(transparent)]
    Build(#[from] BuildError),
    /// Objects in the way: two head Pods, a Service of the same name owned by someone else.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    InvalidStatus(String),
    #[error("the Pod and Service caches did not sync within {0:?}")]
    CacheNotReady(Duration),
    /// A bug: the reconcile panicked; contained to this object (see `controllers::frame`).
    #[error(transparent)]
    Panicked(#[from] crate::controllers::frame::Panicked),
}

impl ReconcileError for Error {
    fn category(&self) -> &'static str {
        match self {
            Error::Kube { .. } | Error::Apply(_) => "apply",
            Error::Build(_) => "build",
            Error::Conflict(_) => "conflict",
            Error::InvalidStatus(_) => "status",
            Error::CacheNotReady(_) => "cache",
            Error::Panicked(_) => "panic",
        }
    }
}

impl Error {
    fn kube(action: impl Into<String>, source: kube::Error) -> Error {
        Error::Kube {
            action: action.into(),
            replica_failure: None,
            source: Box::new(source),
        }
    }

    fn replica(reason: &'static str, action: impl Into<String>, source: kube::Error) -> Error {
        Error::Kube {
            action: action.into(),
            replica_failure: Some(reason),
            source: Box::new(source),
        }
    }

    fn replica_failure(&self) -> Option<&'static str> {
        match self {
            Error::Kube {
                replica_failure, ..
            } => *replica_failure,
            // An object in the way of a child blocks the cluster as a failed Pod would.
            Error::Apply(e) => e.conflict_reason(),
            _ => None,
        }
    }
}

/// Operator-level settings (KubeRay's flags and environment switches, built by `config`).
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch only this namespace (`None`: all namespaces).
    pub namespace: Option<String>,
    /// Clusters reconciled at once.
    pub concurrency: u16,
    /// Periodic re-check of a settled cluster (`RAYCLUSTER_DEFAULT_REQUEUE_SECONDS_ENV`).
    pub requeue_after: Duration,
    pub build: BuildOptions,
    /// `ENABLE_RANDOM_POD_DELETE`: scale down surplus Pods even with the autoscaler on.
    pub random_pod_delete: bool,
    /// `ENABLE_GCS_FT_REDIS_CLEANUP`: the Redis cleanup Job and its finalizer.
    pub gcs_ft_redis_cleanup: bool,
    /// How long a deleted GCS-FT cluster may wait for its cleanup before the finalizer is
    /// removed anyway (annotation `ray.io/gcs-ft-deletion-timeout` overrides it per cluster).
    pub gcs_ft_deletion_timeout: Duration,
    /// Where reconciles and provisioning times are recorded.
    pub metrics: crate::admin::Metrics,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: None,
            concurrency: 16,
            requeue_after: Duration::from_secs(300),
            build: BuildOptions::default(),
            random_pod_delete: false,
            gcs_ft_redis_cleanup: true,
            gcs_ft_deletion_timeout: Duration::from_secs(300),
            metrics: crate::admin::Metrics::new(),
        }
    }
}

/// What the controller remembers about one cluster between reconciles. Lost on restart, which
/// costs one status write and one existence check per owned object.
#[derive(Default)]
struct ClusterMemory {
    /// The status last written: the base of the next one, even before the cache shows it.
    last_status: Option<RayClusterStatus>,
    /// Objects known to exist (kind/name → hash of what was desired, when checked), so that a
    /// settled cluster costs no API calls for them.
    ensured: HashMap<String, (String, Instant)>,
}

pub struct Context {
    client: kube::Client,
    config: Config,
    recorder: Recorder,
    pods: Store<Pod>,
    services: Store<Service>,
    expectations: ScaleExpectations,
    /// Per cluster, reset when its uid changes (see `frame::memory`).
    memory: ObjectMemory<ClusterMemory>,
    frame: Frame<RayCluster>,
}

fn key_of(cluster: &RayCluster) -> ClusterKey {
    (cluster.namespace().unwrap_or_default(), cluster.name_any())
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    client: kube::Client,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let namespace = config.namespace.clone();
    let clusters: Api<RayCluster> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let pods: Api<Pod> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let services: Api<Service> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let jobs: Api<Job> = crate::k8s::scoped_api(&client, namespace.as_deref());

    let (pod_store, pod_writer) = reflector::store();
    let (service_store, service_writer) = reflector::store();
    let (cluster_store, cluster_writer) = reflector::store();
    let concurrency = config.concurrency.max(1);
    let frame = Frame::new("raycluster", &config.metrics);
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(client.clone(), field_managers::RAYCLUSTER),
        client,
        config,
        pods: pod_store,
        services: service_store,
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
        .reflect(pod_writer)
        .touched_objects();
    let service_selector = format!("{}={}", labels::CREATED_BY, labels::CREATED_BY_VALUE);
    let service_events = watcher(
        services,
        watcher::Config::default().labels(&service_selector),
    )
    .backoff(crate::k8s::watch_backoff())
    .modify(trim_service)
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

    Controller::for_stream(cluster_events, cluster_store)
        .trigger_backoff(crate::k8s::watch_backoff())
        .owns_stream(pod_events)
        .owns_stream(service_events)
        .owns_stream(job_events)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            run::reconciler(reconcile::reconcile),
            run::error_policy(),
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "raycluster reconcile loop");
            }
        })
        .await;
}

impl run::Framed<RayCluster> for Context {
    fn frame(&self) -> &Frame<RayCluster> {
        &self.frame
    }
}

impl crate::controllers::frame::ReportPanic<RayCluster> for Context {
    fn report_panic(
        &self,
        object: Arc<RayCluster>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        crate::controllers::frame::panic_event(&self.recorder, object, message)
    }
}

impl Context {
    fn with_memory<T>(&self, cluster: &RayCluster, f: impl FnOnce(&mut ClusterMemory) -> T) -> T {
        self.memory.with(cluster, f)
    }

    fn forget(&self, key: &ClusterKey) {
        self.expectations.forget(key);
        self.memory.forget(key);
        self.frame.forget(key);
    }

    async fn event(
        &self,
        cluster: &RayCluster,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        crate::k8s::publish_event(&self.recorder, cluster, type_, reason, action, note).await;
    }

    fn recently_ensured(&self, cluster: &RayCluster, object: &str, hash: &str) -> bool {
        let period = self.config.requeue_after;
        self.with_memory(cluster, |m| {
            m.ensured
                .get(object)
                .is_some_and(|(h, at)| h == hash && at.elapsed() < period)
        })
    }

    fn remember_ensured(&self, cluster: &RayCluster, object: String, hash: String) {
        self.with_memory(cluster, |m| {
            m.ensured.insert(object, (hash, Instant::now()));
        });
    }
}

/// The current time in whole seconds, as the API server stores it: a status computed from the
/// last written one then compares equal to what the cache shows.
fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

fn owned_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    cluster: &RayCluster,
) -> bool {
    let uid = cluster.uid();
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn random_suffixes_use_the_kubernetes_alphabet() {
        let a = pods::random_suffix();
        assert_eq!(a.len(), 5);
        assert!(
            a.bytes()
                .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b))
        );
        assert_ne!(a, pods::random_suffix());
        assert_eq!(children::random_token().expect("urandom").len(), 44);
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
