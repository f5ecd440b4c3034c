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

pub mod builders;
mod children;
mod deletion;
pub mod expectations;
mod pods;
pub mod scaling;
pub mod status;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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
use tracing::{Instrument, debug, info, warn};

use crate::api::conditions;
use crate::api::raycluster::{
    AutoscalerVersion, MANAGED_BY_KUBERAY, RayCluster, RayClusterStatus, condition_reasons,
    condition_types,
};
use crate::k8s::field_managers;
use crate::kuberay::keys::{annotations, labels, reasons};
use crate::kuberay::names;
use builders::pod::WorkerReplica;
use builders::{BuildError, BuildOptions};
use expectations::{Action as ScaleAction, ClusterKey, Group, ScaleExpectations};
use scaling::DeleteReason;
use status::{Outcome, StatusInputs};

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

impl Error {
    /// The `error` label of the reconcile error metric.
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
    uid: String,
    /// The status last written: the base of the next one, even before the cache shows it.
    last_status: Option<RayClusterStatus>,
    consecutive_failures: u32,
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
    memory: Mutex<HashMap<ClusterKey, ClusterMemory>>,
    queue: crate::admin::metrics::ReconcileQueue,
}

fn key_of(cluster: &RayCluster) -> ClusterKey {
    (cluster.namespace().unwrap_or_default(), cluster.name_any())
}

/// Keeps what the controller reads of a Pod; the cache then holds a few hundred bytes per Pod
/// instead of its full spec.
fn trim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.retain(|k, _| k.starts_with("ray.io/"));
    }
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(PodSpec {
            containers: spec
                .containers
                .into_iter()
                .take(1)
                .map(|c| Container {
                    name: c.name,
                    ..Default::default()
                })
                .collect(),
            restart_policy: spec.restart_policy,
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            phase: status.phase,
            conditions: status.conditions,
            container_statuses: status.container_statuses.map(|statuses| {
                statuses
                    .into_iter()
                    .map(|mut s| {
                        s.image = String::new();
                        s.image_id = String::new();
                        s.last_state = None;
                        s
                    })
                    .collect()
            }),
            pod_ip: status.pod_ip,
            reason: status.reason,
            message: status.message,
            ..Default::default()
        });
    }
}

fn trim_service(service: &mut Service) {
    service.metadata.managed_fields = None;
    service.status = None;
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
    let queue = config.metrics.queue("raycluster");
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(client.clone(), field_managers::RAYCLUSTER),
        client,
        config,
        pods: pod_store,
        services: service_store,
        expectations: ScaleExpectations::default(),
        memory: Mutex::new(HashMap::new()),
        queue,
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
    let queue = ctx.queue.clone();
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
        owned(ctx.queue.clone()),
        owned(ctx.queue.clone()),
        owned(ctx.queue.clone()),
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
            crate::controllers::frame::contain("raycluster", reconcile),
            crate::controllers::frame::contain_policy("raycluster", error_policy),
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "raycluster reconcile loop");
            }
        })
        .await;
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

fn error_policy(cluster: Arc<RayCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.with_memory(&cluster, |m| {
        m.consecutive_failures = m.consecutive_failures.saturating_add(1);
        m.consecutive_failures
    });
    // 2 s, 4 s, 8 s … up to 5 minutes, per cluster: one failing cluster slows only itself.
    let backoff = crate::k8s::failure_backoff(failures);
    warn!(
        namespace = %cluster.namespace().unwrap_or_default(),
        name = %cluster.name_any(),
        error = %error,
        retry_in = ?backoff,
        "RayCluster reconcile failed"
    );
    Action::requeue(backoff)
}

impl Context {
    fn with_memory<T>(&self, cluster: &RayCluster, f: impl FnOnce(&mut ClusterMemory) -> T) -> T {
        let mut memory = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        let uid = cluster.uid().unwrap_or_default();
        let entry = memory.entry(key_of(cluster)).or_default();
        if entry.uid != uid {
            // A new cluster of the same name: nothing carries over.
            *entry = ClusterMemory {
                uid,
                ..Default::default()
            };
        }
        f(entry)
    }

    fn forget(&self, key: &ClusterKey) {
        self.expectations.forget(key);
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
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

    /// The first reconciles after start-up wait for the caches: an empty Pod cache would make
    /// every cluster look empty and get duplicate Pods.
    async fn wait_for_caches(&self) -> Result<(), Error> {
        let ready = async {
            let _ = self.pods.wait_until_ready().await;
            let _ = self.services.wait_until_ready().await;
        };
        tokio::time::timeout(CACHE_SYNC_TIMEOUT, ready)
            .await
            .map_err(|_| Error::CacheNotReady(CACHE_SYNC_TIMEOUT))
    }

    /// The cluster's head and worker Pods in the cache (terminating ones included).
    fn cluster_pods(&self, cluster: &RayCluster) -> Vec<Arc<Pod>> {
        let namespace = cluster.namespace();
        let name = cluster.name_any();
        let uid = cluster.uid();
        self.pods.state_filter(|pod| {
            pod.namespace() == namespace
                && pod.labels().get(labels::CLUSTER) == Some(&name)
                && pod
                    .owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == uid.as_ref())
        })
    }

    fn pod_in_cache(&self, namespace: &str, name: &str) -> bool {
        self.pods
            .get(&ObjectRef::new(name).within(namespace))
            .is_some()
    }

    fn cached_service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.services.get(&ObjectRef::new(name).within(namespace))
    }

    /// The head Service in the cache, found by labels as KubeRay does, among the Services the
    /// cluster controls (anyone can copy the labels).
    fn head_service(&self, cluster: &RayCluster) -> Result<Option<Arc<Service>>, Error> {
        let namespace = cluster.namespace();
        let name = cluster.name_any();
        let found = self.services.state_filter(|s| {
            s.namespace() == namespace
                && owned_by(&s.metadata, cluster)
                && s.labels().get(labels::CLUSTER) == Some(&name)
                && s.labels().get(labels::NODE_TYPE).map(String::as_str) == Some(labels::HEAD)
        });
        match found.len() {
            0 | 1 => Ok(found.into_iter().next()),
            n => Err(Error::Conflict(format!(
                "{n} head Services carry the labels of RayCluster {name}; delete the extra ones"
            ))),
        }
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

async fn reconcile(cluster: Arc<RayCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "reconcile",
        kind = "RayCluster",
        namespace = %cluster.namespace().unwrap_or_default(),
        name = %cluster.name_any()
    );
    ctx.queue.started(cluster.namespace(), &cluster.name_any());
    let timer = ctx.config.metrics.reconcile_started("raycluster");
    let result = async move {
        ctx.wait_for_caches().await?;
        let action = reconcile_inner(&cluster, &ctx).await?;
        ctx.with_memory(&cluster, |m| m.consecutive_failures = 0);
        Ok(action)
    }
    .instrument(span)
    .await;
    timer.finish(result.as_ref().err().map(Error::category));
    result
}

/// How the Pods step ended when it did not fail.
enum Progress {
    Done,
    Waiting(String),
}

async fn reconcile_inner(cluster: &RayCluster, ctx: &Context) -> Result<Action, Error> {
    if cluster
        .spec
        .managed_by
        .as_deref()
        .is_some_and(|m| m != MANAGED_BY_KUBERAY)
    {
        // Another controller (e.g. Kueue MultiKueue) owns this cluster.
        return Ok(Action::await_change());
    }
    if cluster.meta().deletion_timestamp.is_some() {
        return deletion::finalize(cluster, ctx).await;
    }

    // validate
    if let Err(invalid) = crate::validation::raycluster::controller::validate(cluster) {
        warn!(reason = invalid.reason, message = %invalid.message, "RayCluster refused");
        ctx.event(
            cluster,
            EventType::Warning,
            invalid.reason,
            "Validate",
            invalid.message.clone(),
        )
        .await;
        if invalid.reason == reasons::INVALID_STATUS {
            return Err(Error::InvalidStatus(invalid.message));
        }
        // Nothing is written for a refused cluster; a spec change brings it back.
        return Ok(Action::await_change());
    }
    warn_autoscaler_v1_restart_policy(cluster, ctx).await;

    if ctx.config.gcs_ft_redis_cleanup
        && crate::kuberay::spec::gcs_ft_redis(cluster)
        && !cluster
            .finalizers()
            .iter()
            .any(|f| f == crate::kuberay::keys::GCS_FT_REDIS_CLEANUP_FINALIZER)
    {
        // The finalizer goes on before anything exists that Redis state could belong to.
        let mut finalizers = cluster.finalizers().to_vec();
        finalizers.push(crate::kuberay::keys::GCS_FT_REDIS_CLEANUP_FINALIZER.to_owned());
        set_finalizers(cluster, ctx, finalizers).await?;
        info!("added the GCS fault tolerance cleanup finalizer");
        return Ok(Action::requeue(SHORT_REQUEUE));
    }

    let base_status = ctx
        .with_memory(cluster, |m| m.last_status.clone())
        .or_else(|| cluster.status.clone());

    // build + apply
    let outcome = match apply_children(cluster, ctx, base_status.as_ref()).await {
        Ok(Progress::Done) => Ok(Outcome::Clean),
        Ok(Progress::Waiting(why)) => {
            debug!(why, "another pass needed");
            Ok(Outcome::Waiting(why))
        }
        Err(e) => Err(e),
    };

    // status
    let pods = ctx.cluster_pods(cluster);
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    // KubeRay writes no status at all while the head Service is missing; here the status goes
    // out without the Service's part, so a failure to create it stays visible.
    let head_service = ctx.head_service(cluster).ok().flatten();
    let status_outcome = match &outcome {
        Ok(o) => o.clone(),
        Err(e) => Outcome::Failed {
            replica_failure: e.replica_failure(),
            message: e.to_string(),
        },
    };
    let new_status = status::compute_status(&StatusInputs {
        cluster,
        pods: &pod_refs,
        head_service: head_service.as_deref(),
        outcome: &status_outcome,
        previous: base_status.as_ref(),
        now: now(),
    });
    let provisioned = |s: Option<&RayClusterStatus>| {
        s.is_some_and(|s| {
            conditions::find(&s.conditions, condition_types::RAY_CLUSTER_PROVISIONED)
                .is_some_and(|c| c.status == conditions::TRUE)
        })
    };
    if provisioned(Some(&new_status))
        && !provisioned(base_status.as_ref())
        && let Some(created) = cluster.meta().creation_timestamp.as_ref()
        && let Ok(took) = Duration::try_from(now().0.duration_since(created.0))
    {
        ctx.config.metrics.raycluster_provisioned(took);
    }
    let written = status::differs(cluster.status.as_ref(), &new_status);
    if written {
        write_status(cluster, ctx, &new_status).await?;
    }
    ctx.with_memory(cluster, |m| m.last_status = Some(new_status));

    match outcome {
        Err(e) => Err(e),
        Ok(Outcome::Clean) if !written => Ok(Action::requeue(ctx.config.requeue_after)),
        // A changed status or unfinished step: look again soon (suspension moves this way).
        Ok(_) => Ok(Action::requeue(SHORT_REQUEUE)),
    }
}

async fn write_status(
    cluster: &RayCluster,
    ctx: &Context,
    status: &RayClusterStatus,
) -> Result<(), Error> {
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": RayCluster::api_version(&()),
        "kind": RayCluster::kind(&()),
        "status": status,
    });
    api.patch_status(
        &cluster.name_any(),
        &PatchParams::apply(field_managers::RAYCLUSTER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| {
        Error::kube(
            format!("writing the status of RayCluster {}", cluster.name_any()),
            e,
        )
    })?;
    Ok(())
}

/// Replaces the finalizer list, failing on a concurrent change (resourceVersion precondition).
async fn set_finalizers(
    cluster: &RayCluster,
    ctx: &Context,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": cluster.resource_version()}
    });
    api.patch(
        &cluster.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|e| {
        Error::kube(
            format!(
                "updating the finalizers of RayCluster {}",
                cluster.name_any()
            ),
            e,
        )
    })?;
    Ok(())
}

/// KubeRay warns (and goes on) when autoscaler v1 meets worker Pods that restart containers.
async fn warn_autoscaler_v1_restart_policy(cluster: &RayCluster, ctx: &Context) {
    if !crate::kuberay::spec::autoscaling_enabled(&cluster.spec)
        || crate::kuberay::spec::autoscaler_version(&cluster.spec) != Some(AutoscalerVersion::V1)
    {
        return;
    }
    let groups: Vec<&str> = cluster
        .spec
        .worker_group_specs
        .iter()
        .flatten()
        .filter(|g| {
            g.template
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref())
                .is_some_and(|p| !p.is_empty() && p != "Never")
        })
        .map(|g| g.group_name.as_str())
        .collect();
    if !groups.is_empty() {
        let note = format!(
            "restartPolicy for worker groups [{}] should be Never or unset when using autoscaler V1",
            groups.join(", ")
        );
        ctx.event(
            cluster,
            EventType::Warning,
            reasons::INVALID_SPEC,
            "Validate",
            note,
        )
        .await;
    }
}

/// Everything the cluster owns, in KubeRay's order; the first failure stops the pass.
async fn apply_children(
    cluster: &RayCluster,
    ctx: &Context,
    status: Option<&RayClusterStatus>,
) -> Result<Progress, Error> {
    if crate::kuberay::spec::autoscaling_enabled(&cluster.spec) {
        children::ensure_autoscaler_rbac(cluster, ctx).await?;
    }
    if cluster.spec.head_group_spec.enable_ingress == Some(true) {
        children::ensure_ingress(cluster, ctx).await?;
    }
    if builders::objects::needs_auth_secret(cluster) {
        children::ensure_auth_secret(cluster, ctx).await?;
    }
    children::ensure_services(cluster, ctx).await?;
    pods::reconcile_pods(cluster, ctx, status).await
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
    fn trimmed_pods_keep_what_the_controller_reads() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "labels": {"ray.io/node-type": "head"},
                "annotations": {"ray.io/upgrade-strategy-recreate-hash": "h", "other": "x"},
                "managedFields": [{"manager": "m"}]},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "ray-head", "image": "i", "env": [{"name": "A", "value": "1"}]}, {"name": "side", "image": "i"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "ray-head", "image": "i", "imageID": "x", "ready": true, "restartCount": 0, "state": {"running": {}}}]}
        }))
        .expect("a Pod");
        trim_pod(&mut pod);
        assert!(pod.metadata.managed_fields.is_none());
        assert_eq!(pod.annotations().len(), 1);
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.containers.len(), 1);
        assert_eq!(spec.containers[0].name, "ray-head");
        assert!(spec.containers[0].env.is_none());
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert!(status::is_running_and_ready(&pod));
        assert_eq!(
            pod.status.and_then(|s| s.pod_ip).as_deref(),
            Some("10.0.0.1")
        );
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
