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
//! - `NewClusterWithIncrementalUpgrade` (Gateway API traffic steps) is not implemented: such an
//!   upgrade runs as `NewCluster` and a Warning event says so.
//! - A RayCluster or Service of a child's name that the RayService does not control is never
//!   written, adopted or deleted: a `<Kind>Conflict` Warning (and for a first cluster the Ready
//!   condition) says so (issue 14).

pub mod build;
pub mod status;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tracing::{Instrument, debug, info, warn};

use crate::api::conditions::{FALSE, TRUE};
use crate::api::raycluster::{ClusterState, RayCluster, condition_types as cluster_conditions};
use crate::api::rayservice::{
    RayService, RayServiceClusterStatus, RayServiceStatus, condition_reasons, condition_types,
};
use crate::controllers::raycluster::builders::{BuildError, BuildOptions};
use crate::k8s::field_managers;
use crate::kuberay::keys::labels;
use crate::ray::{DashboardClient, DashboardClientOptions, DashboardLocator, DashboardUrl};
use build::{ClusterChange, HttpBinding};

/// KubeRay's requeue while anything is in motion.
const SHORT_REQUEUE: Duration = Duration::from_secs(2);
/// KubeRay's default `rayClusterDeletionDelaySeconds`.
const DEFAULT_DELETION_DELAY: Duration = Duration::from_secs(60);

/// Event reasons (KubeRay's).
pub mod reasons {
    pub const INVALID_SPEC: &str = "InvalidRayServiceSpec";
    pub const INITIALIZING_TIMEOUT: &str = "RayServiceInitializingTimeout";
    pub const UPDATED_HEAD_POD_SERVE_LABEL: &str = "UpdatedHeadPodServeLabel";
    pub const FAILED_TO_UPDATE_HEAD_POD_SERVE_LABEL: &str = "FailedToUpdateHeadPodServeLabel";
    pub const UPDATED_SERVE_APPLICATIONS: &str = "UpdatedServeApplications";
    pub const FAILED_TO_UPDATE_SERVE_APPLICATIONS: &str = "FailedToUpdateServeApplications";
    pub const CREATED_RAY_CLUSTER: &str = "CreatedRayCluster";
    pub const FAILED_TO_CREATE_RAY_CLUSTER: &str = "FailedToCreateRayCluster";
    pub const UPDATED_RAY_CLUSTER: &str = "UpdatedRayCluster";
    pub const FAILED_TO_UPDATE_RAY_CLUSTER: &str = "FailedToUpdateRayCluster";
    pub const DELETED_RAY_CLUSTER: &str = "DeletedRayCluster";
    pub const FAILED_TO_DELETE_RAY_CLUSTER: &str = "FailedToDeleteRayCluster";
    pub const CREATED_SERVICE: &str = "CreatedService";
    pub const UPDATED_SERVICE: &str = "UpdatedService";
    pub const FAILED_TO_CREATE_SERVICE: &str = "FailedToCreateService";
    pub const DELETED_SERVICE: &str = "DeletedService";
    pub const FAILED_TO_DELETE_SERVICE: &str = "FailedToDeleteService";
    /// raypipe's: the upgrade runs as NewCluster.
    pub const INCREMENTAL_UPGRADE_NOT_SUPPORTED: &str = "IncrementalUpgradeNotSupported";
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(transparent)]
    Apply(#[from] crate::k8s::K8sError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("the RayCluster and Service caches did not sync within {0:?}")]
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
            Error::CacheNotReady(_) => "cache",
            Error::Panicked(_) => "panic",
        }
    }

    fn kube(action: impl Into<String>, source: kube::Error) -> Error {
        Error::Kube {
            action: action.into(),
            source: Box::new(source),
        }
    }
}

/// Tells, for a dashboard, where Serve's HTTP proxy must listen (out-of-cluster runs).
pub type HttpBindingFor = Arc<dyn Fn(&DashboardUrl) -> Option<HttpBinding> + Send + Sync>;

#[derive(Clone)]
pub struct Config {
    /// Watch only this namespace (`None`: all namespaces).
    pub namespace: Option<String>,
    /// RayServices reconciled at once.
    pub concurrency: u16,
    /// Where each cluster's dashboard is.
    pub dashboard: DashboardLocator,
    /// Dashboard timeouts (short: a dead head must not hold a reconcile).
    pub dashboard_options: DashboardClientOptions,
    /// `http_options` forced onto pushed Serve configs (a Ray head on 127.0.0.1); `None`
    /// pushes the user's config as it is.
    pub http_binding: Option<HttpBindingFor>,
    /// `runtime_env` URI prefix rewrites (`from`, `to`), for clusters that fetch packages from a
    /// mirror instead of the Internet.
    pub runtime_env_mirrors: Vec<(String, String)>,
    /// `ENABLE_ZERO_DOWNTIME`: a cluster spec change starts a new cluster unless the
    /// RayService's upgrade strategy says otherwise.
    pub zero_downtime: bool,
    /// How often a settled RayService's Serve applications are re-read.
    pub steady_poll: Duration,
    pub build: BuildOptions,
    /// Where reconciles and upgrade durations are recorded.
    pub metrics: crate::admin::Metrics,
    /// The operator's feature gates, which the validation rules consult.
    pub feature_gates: crate::validation::feature_gates::FeatureGates,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: None,
            concurrency: 16,
            dashboard: DashboardLocator::in_cluster(),
            dashboard_options: DashboardClientOptions::default(),
            http_binding: None,
            runtime_env_mirrors: Vec::new(),
            zero_downtime: true,
            steady_poll: Duration::from_secs(10),
            build: BuildOptions::default(),
            metrics: crate::admin::Metrics::new(),
            feature_gates: crate::validation::feature_gates::FeatureGates::default(),
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("namespace", &self.namespace)
            .field("concurrency", &self.concurrency)
            .field("http_binding", &self.http_binding.is_some())
            .field("runtime_env_mirrors", &self.runtime_env_mirrors)
            .field("zero_downtime", &self.zero_downtime)
            .finish_non_exhaustive()
    }
}

type Key = (String, String);

/// What a Serve config push left behind, per cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pushed {
    config_hash: String,
    /// The head's Ray session when it was pushed (a new session is a restarted head).
    session: Option<String>,
}

#[derive(Default)]
struct ServiceMemory {
    uid: String,
    last_status: Option<RayServiceStatus>,
    pushed: HashMap<String, Pushed>,
    /// Clusters no longer active or pending, and when they may be deleted.
    deletion_due: HashMap<String, Instant>,
    /// Services applied (name → hash of what was applied).
    applied_services: HashMap<String, String>,
    consecutive_failures: u32,
}

pub struct Context {
    client: kube::Client,
    config: Config,
    recorder: Recorder,
    clusters: Store<RayCluster>,
    services: Store<Service>,
    head_pods: Store<Pod>,
    memory: Mutex<HashMap<Key, ServiceMemory>>,
    queue: crate::admin::metrics::ReconcileQueue,
}

fn key_of(service: &RayService) -> Key {
    (service.namespace().unwrap_or_default(), service.name_any())
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    client: kube::Client,
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let namespace = config.namespace.clone();
    let services_api: Api<RayService> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let clusters_api: Api<RayCluster> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let k8s_services: Api<Service> = crate::k8s::scoped_api(&client, namespace.as_deref());
    let pods: Api<Pod> = crate::k8s::scoped_api(&client, namespace.as_deref());

    let (cluster_store, cluster_writer) = reflector::store();
    let (service_store, service_writer) = reflector::store();
    let (pod_store, pod_writer) = reflector::store();
    let (rayservice_store, rayservice_writer) = reflector::store();
    let concurrency = config.concurrency.max(1);
    let queue = config.metrics.queue("rayservice");
    let ctx = Arc::new(Context {
        recorder: crate::k8s::recorder(client.clone(), field_managers::RAYSERVICE),
        client,
        config,
        clusters: cluster_store,
        services: service_store,
        head_pods: pod_store,
        memory: Mutex::new(HashMap::new()),
        queue,
    });

    // Label-scoped: only what RayServices made (clusters, Services) and their head Pods.
    let owned = format!("{}={}", labels::ORIGINATED_FROM_CRD, build::CREATOR);
    let cluster_events = watcher(clusters_api, watcher::Config::default().labels(&owned))
        .backoff(crate::k8s::watch_backoff())
        .modify(|c: &mut RayCluster| c.managed_fields_mut().clear())
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

    let queue = ctx.queue.clone();
    let rayservice_events = rayservice_events.inspect(move |s| {
        if let Ok(s) = s {
            queue.changed(s.namespace(), s.name_any());
        }
    });
    let queue = ctx.queue.clone();
    let cluster_events = cluster_events.inspect(move |c| {
        if let Ok(c) = c {
            queue.owner_changed(c.meta(), "RayService");
        }
    });
    let queue = ctx.queue.clone();
    let service_events = service_events.inspect(move |s| {
        if let Ok(s) = s {
            queue.owner_changed(s.meta(), "RayService");
        }
    });
    Controller::for_stream(rayservice_events, rayservice_store)
        .trigger_backoff(crate::k8s::watch_backoff())
        .owns_stream(cluster_events)
        .owns_stream(service_events)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            crate::controllers::frame::contain("rayservice", reconcile),
            crate::controllers::frame::contain_policy("rayservice", error_policy),
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "rayservice reconcile loop");
            }
        })
        .await;
}

impl crate::controllers::frame::ReportPanic<RayService> for Context {
    fn report_panic(
        &self,
        object: Arc<RayService>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        crate::controllers::frame::panic_event(&self.recorder, object, message)
    }
}

fn error_policy(service: Arc<RayService>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.with_memory(&service, |m| {
        m.consecutive_failures = m.consecutive_failures.saturating_add(1);
        m.consecutive_failures
    });
    let backoff = crate::k8s::failure_backoff(failures);
    warn!(
        namespace = %service.namespace().unwrap_or_default(),
        name = %service.name_any(),
        error = %error,
        retry_in = ?backoff,
        "RayService reconcile failed"
    );
    Action::requeue(backoff)
}

impl Context {
    fn with_memory<T>(&self, service: &RayService, f: impl FnOnce(&mut ServiceMemory) -> T) -> T {
        let mut memory = self.memory.lock().unwrap_or_else(|p| p.into_inner());
        let uid = service.uid().unwrap_or_default();
        let entry = memory.entry(key_of(service)).or_default();
        if entry.uid != uid {
            *entry = ServiceMemory {
                uid,
                ..Default::default()
            };
        }
        f(entry)
    }

    fn forget(&self, key: &Key) {
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    async fn event(
        &self,
        service: &RayService,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        crate::k8s::publish_event(&self.recorder, service, type_, reason, action, note).await;
    }

    async fn wait_for_caches(&self) -> Result<(), Error> {
        const LIMIT: Duration = Duration::from_secs(60);
        let ready = async {
            let _ = self.clusters.wait_until_ready().await;
            let _ = self.services.wait_until_ready().await;
            let _ = self.head_pods.wait_until_ready().await;
        };
        tokio::time::timeout(LIMIT, ready)
            .await
            .map_err(|_| Error::CacheNotReady(LIMIT))
    }

    /// The RayClusters this RayService owns.
    fn owned_clusters(&self, service: &RayService) -> Vec<Arc<RayCluster>> {
        let namespace = service.namespace();
        let uid = service.uid();
        self.clusters.state_filter(|c| {
            c.namespace() == namespace
                && c.owner_references()
                    .iter()
                    .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
        })
    }

    fn cached_service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.services.get(&ObjectRef::new(name).within(namespace))
    }
}

async fn reconcile(service: Arc<RayService>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "reconcile",
        kind = "RayService",
        namespace = %service.namespace().unwrap_or_default(),
        name = %service.name_any()
    );
    ctx.queue.started(service.namespace(), &service.name_any());
    let timer = ctx.config.metrics.reconcile_started("rayservice");
    let result = async move {
        ctx.wait_for_caches().await?;
        let action = reconcile_inner(&service, &ctx).await?;
        ctx.with_memory(&service, |m| m.consecutive_failures = 0);
        Ok(action)
    }
    .instrument(span)
    .await;
    timer.finish(result.as_ref().err().map(Error::category));
    result
}

/// What one pass learnt from a cluster's Serve.
#[derive(Default)]
struct ServeObservation {
    /// `None`: Serve was not read (head not ready, dashboard unreachable).
    apps: Option<std::collections::BTreeMap<String, crate::api::rayservice::AppStatus>>,
    /// Every application RUNNING.
    ready: bool,
    head_proxy_healthy: bool,
    /// What is being waited for, or what went wrong, in words.
    waiting_for: Option<String>,
}

async fn reconcile_inner(service: &RayService, ctx: &Context) -> Result<Action, Error> {
    use crate::api::raycluster::MANAGED_BY_KUBERAY;
    if service
        .spec
        .managed_by
        .as_deref()
        .is_some_and(|m| m != MANAGED_BY_KUBERAY)
    {
        return Ok(Action::await_change());
    }
    if service.meta().deletion_timestamp.is_some() {
        // The garbage collector deletes the owned clusters and Services.
        return Ok(Action::await_change());
    }
    let now = crate::k8s::now();
    let generation = service.meta().generation;
    let mut status = ctx
        .with_memory(service, |m| m.last_status.clone())
        .or_else(|| service.status.clone())
        .unwrap_or_default();
    let clusters = ctx.owned_clusters(service);

    // Validate.
    let problems = crate::validation::rayservice::validate(service, &ctx.config.feature_gates);
    if !problems.is_empty() {
        let message = crate::validation::problem::join(&problems);
        warn!(%message, "RayService refused");
        ctx.event(
            service,
            EventType::Warning,
            reasons::INVALID_SPEC,
            "Validate",
            message.clone(),
        )
        .await;
        status::set(
            &mut status,
            condition_types::READY,
            FALSE,
            condition_reasons::VALIDATION_FAILED,
            &message,
            generation,
            now,
        );
        status.service_status = None;
        status.observed_generation = generation;
        write_status_if_changed(service, ctx, status).await?;
        return Ok(Action::await_change());
    }

    // Suspend.
    if let Some(action) = reconcile_suspend(service, ctx, &mut status, &clusters).await? {
        write_status_if_changed(service, ctx, status).await?;
        return Ok(action);
    }

    // A RayService that did not start in time stays failed; only cleanup goes on.
    if status::reason(&status.conditions, condition_types::READY)
        == Some(condition_reasons::INITIALIZING_TIMEOUT)
    {
        status.active_service_status = None;
        status.pending_service_status = None;
        let remaining = delete_clusters(service, ctx, &clusters, Duration::ZERO).await;
        write_status_if_changed(service, ctx, status).await?;
        return Ok(if remaining > 0 {
            Action::requeue(SHORT_REQUEUE)
        } else {
            Action::await_change()
        });
    }

    let active_name = status
        .active_service_status
        .as_ref()
        .and_then(|s| s.ray_cluster_name.clone());
    let pending_name = status
        .pending_service_status
        .as_ref()
        .and_then(|s| s.ray_cluster_name.clone());
    let find = |name: &Option<String>| {
        name.as_ref()
            .and_then(|n| clusters.iter().find(|c| &c.name_any() == n).cloned())
    };
    let active = find(&active_name);
    let pending = find(&pending_name);

    // Clusters neither active nor pending go after the deletion delay.
    let keep: BTreeSet<&str> = [active_name.as_deref(), pending_name.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    let dangling: Vec<Arc<RayCluster>> = clusters
        .iter()
        .filter(|c| !keep.contains(c.name_any().as_str()))
        .cloned()
        .collect();
    let delay = service
        .spec
        .ray_cluster_deletion_delay_seconds
        .map_or(DEFAULT_DELETION_DELAY, |s| {
            Duration::from_secs(u64::try_from(s).unwrap_or(0))
        });
    let mut dangling_left = delete_clusters(service, ctx, &dangling, delay).await;

    // The pending cluster named in the status is created here (its name is recorded first, so
    // a crash in between never makes two).
    if let Some(name) = &pending_name
        && pending.is_none()
    {
        if let Err(e) = create_cluster(service, ctx, name).await {
            // A first cluster blocked by someone else's RayCluster: say so where people look.
            if let Error::Apply(k) = &e
                && let Some(reason) = k.conflict_reason()
                && active.is_none()
            {
                status::set(
                    &mut status,
                    condition_types::READY,
                    FALSE,
                    reason,
                    &k.to_string(),
                    generation,
                    now,
                );
                write_status_if_changed(service, ctx, status).await?;
            }
            return Err(e);
        }
        return Ok(Action::requeue(SHORT_REQUEUE));
    }
    let goal = build::goal_spec(service);
    if let Some(cluster) = &active
        && pending.is_none()
        && build::classify(cluster, &goal, true) == ClusterChange::InPlace
    {
        update_cluster(service, ctx, cluster).await?;
    }
    if let Some(cluster) = &pending
        && build::classify(cluster, &goal, false) == ClusterChange::InPlace
    {
        update_cluster(service, ctx, cluster).await?;
    }

    let namespace = service.namespace().unwrap_or_default();
    let serve_service_name = build::serve_service_name(service);
    let routed_to: Option<String> = ctx
        .cached_service(&namespace, &serve_service_name)
        .and_then(|s| build::selected_cluster(&s).map(str::to_owned));
    let needs_new_cluster = needs_new_cluster(
        service,
        ctx,
        active.as_deref(),
        pending.as_deref(),
        routed_to.as_deref(),
        &status,
    );

    // Serve: the pending cluster while there is one; the active one otherwise (never both:
    // a combined cluster + config change must not reach the cluster being replaced).
    let pending_obs = match &pending {
        Some(cluster) => Some(reconcile_serve(service, ctx, cluster).await),
        None => None,
    };
    let active_obs = match &active {
        Some(cluster) if pending.is_none() && !needs_new_cluster => {
            Some(reconcile_serve(service, ctx, cluster).await)
        }
        _ => None,
    };
    for (cluster, obs) in [(&active, &active_obs), (&pending, &pending_obs)] {
        if let (Some(cluster), Some(obs)) = (cluster, obs)
            && obs.apps.is_some()
        {
            let serving = obs.head_proxy_healthy
                && !service
                    .spec
                    .exclude_head_pod_from_serve_svc
                    .unwrap_or(false);
            label_head_pod(service, ctx, cluster, serving).await;
        }
    }

    // The traffic switch: both Services follow the pending cluster once its applications run,
    // else stay on (or go to) the active one.
    let target = match (&pending, &pending_obs, &active, &active_obs) {
        (Some(p), Some(obs), _, _) if obs.ready => Some(p.clone()),
        (_, _, Some(a), Some(obs)) if obs.ready => Some(a.clone()),
        _ => None,
    };
    let mut routed_to = routed_to;
    if let Some(target) = &target {
        apply_services(service, ctx, target).await?;
        routed_to = Some(target.name_any());
    }

    // Status.
    let mut active_status = status.active_service_status.clone().unwrap_or_default();
    let mut pending_status = status.pending_service_status.clone().unwrap_or_default();
    fill_cluster_status(&mut active_status, active.as_deref(), active_obs.as_ref());
    fill_cluster_status(
        &mut pending_status,
        pending.as_deref(),
        pending_obs.as_ref(),
    );
    if let (Some(routed), Some(pending_cluster)) = (&routed_to, &pending_name)
        && routed == pending_cluster
    {
        info!(cluster = %routed, "traffic switched to the new cluster; it is now active");
        // An upgrade (not the first start): from UpgradeInProgress=True to the switch.
        if active_name.is_some()
            && let Some(since) = crate::api::conditions::find(
                &status.conditions,
                condition_types::UPGRADE_IN_PROGRESS,
            )
            .filter(|c| c.status == TRUE)
            .map(|c| c.last_transition_time.0)
            && let Ok(took) = Duration::try_from(now.0.duration_since(since))
        {
            ctx.config.metrics.rayservice_upgraded(took);
        }
        active_status = pending_status;
        pending_status = RayServiceClusterStatus::default();
        // The old active cluster is now dangling: its deletion delay starts now.
        dangling_left += 1;
    }
    let now_active = active_status.ray_cluster_name.clone();
    let now_pending = if needs_new_cluster && pending_status.ray_cluster_name.is_none() {
        let name = build::new_cluster_name(service);
        info!(cluster = %name, "a new RayCluster will be prepared");
        if now_active.is_some()
            && service
                .spec
                .upgrade_strategy
                .as_ref()
                .and_then(|u| u.type_.as_ref())
                == Some(&crate::api::rayservice::RayServiceUpgradeType::NewClusterWithIncrementalUpgrade)
        {
            ctx.event(
                service,
                EventType::Warning,
                reasons::INCREMENTAL_UPGRADE_NOT_SUPPORTED,
                "Upgrade",
                format!("raypipe does not move traffic step by step (NewClusterWithIncrementalUpgrade): RayCluster {name} takes all traffic at once when its applications run, as with NewCluster"),
            )
            .await;
        }
        pending_status = RayServiceClusterStatus {
            ray_cluster_name: Some(name.clone()),
            ..Default::default()
        };
        Some(name)
    } else {
        pending_status.ray_cluster_name.clone()
    };
    status.active_service_status =
        (active_status != RayServiceClusterStatus::default()).then_some(active_status);
    status.pending_service_status =
        (pending_status != RayServiceClusterStatus::default()).then_some(pending_status);

    let num_endpoints = match &routed_to {
        Some(_) => count_serve_endpoints(ctx, &namespace, &serve_service_name).await?,
        None => 0,
    };
    status.num_serve_endpoints = Some(num_endpoints);
    let waiting_for = pending_obs
        .as_ref()
        .and_then(|o| o.waiting_for.clone())
        .or_else(|| active_obs.as_ref().and_then(|o| o.waiting_for.clone()))
        .or_else(|| {
            (now_active.is_none() && now_pending.is_some())
                .then(|| "the RayCluster is being created".to_owned())
        });
    let initializing_timeout = service
        .annotations()
        .get(crate::kuberay::keys::annotations::INITIALIZING_TIMEOUT)
        .and_then(|t| crate::validation::duration::parse_seconds_or_duration(t).ok());
    let timed_out = status::set_conditions(
        &mut status,
        &status::ConditionInputs {
            generation,
            num_serve_endpoints: num_endpoints,
            active_cluster: now_active.as_deref(),
            pending_cluster: now_pending.as_deref(),
            waiting_for,
            initializing_timeout,
            now: now.clone(),
        },
    );
    if timed_out {
        ctx.event(
            service,
            EventType::Warning,
            reasons::INITIALIZING_TIMEOUT,
            "Initialize",
            "the RayService did not become ready within ray.io/initializing-timeout; its clusters are deleted".to_owned(),
        )
        .await;
    }
    let settled = status::is_true(&status.conditions, condition_types::READY)
        && now_pending.is_none()
        && active_obs.as_ref().is_some_and(|o| o.ready)
        && dangling_left == 0;
    write_status_if_changed(service, ctx, status).await?;
    Ok(Action::requeue(if settled {
        ctx.config.steady_poll
    } else {
        SHORT_REQUEUE
    }))
}

/// Whether a new pending cluster must be prepared (KubeRay's `shouldPrepareNewCluster`).
fn needs_new_cluster(
    service: &RayService,
    ctx: &Context,
    active: Option<&RayCluster>,
    pending: Option<&RayCluster>,
    routed_to: Option<&str>,
    status: &RayServiceStatus,
) -> bool {
    if status
        .pending_service_status
        .as_ref()
        .and_then(|p| p.ray_cluster_name.as_ref())
        .is_some()
        && pending.is_none()
    {
        return false;
    }
    if let (Some(p), Some(routed)) = (pending, routed_to)
        && p.name_any() == routed
    {
        return false;
    }
    let newest = match pending.or(active) {
        None => return active.is_none() && pending.is_none(),
        Some(c) => c,
    };
    let goal = build::goal_spec(service);
    match build::classify(newest, &goal, false) {
        ClusterChange::Replace => {
            // The pending cluster is already the newest: a second change replaces it too.
            build::zero_downtime(service, ctx.config.zero_downtime) && pending.is_none()
        }
        _ => false,
    }
}

fn fill_cluster_status(
    out: &mut RayServiceClusterStatus,
    cluster: Option<&RayCluster>,
    obs: Option<&ServeObservation>,
) {
    match cluster {
        Some(cluster) => {
            out.ray_cluster_name = Some(cluster.name_any());
            out.ray_cluster_status = cluster.status.clone();
        }
        None => {
            out.ray_cluster_status = None;
            out.application_statuses = None;
        }
    }
    if let Some(apps) = obs.and_then(|o| o.apps.clone()) {
        out.application_statuses = (!apps.is_empty()).then_some(apps);
    }
}

fn head_ready(cluster: &RayCluster) -> Result<(), String> {
    let status = cluster.status.as_ref();
    let condition = status.and_then(|s| {
        crate::api::conditions::find(&s.conditions, cluster_conditions::HEAD_POD_READY)
    });
    match condition {
        Some(c) if c.status == TRUE => Ok(()),
        _ if status.and_then(|s| s.state) == Some(ClusterState::Ready) => Ok(()),
        Some(c) => Err(format!(
            "the head Pod of RayCluster {} is not ready ({}: {})",
            cluster.name_any(),
            c.reason,
            c.message
        )),
        None => Err(format!(
            "the head Pod of RayCluster {} is not ready yet",
            cluster.name_any()
        )),
    }
}

/// Reads one cluster's Serve state and pushes the Serve config when Serve needs it.
async fn reconcile_serve(
    service: &RayService,
    ctx: &Context,
    cluster: &RayCluster,
) -> ServeObservation {
    let waiting = |why: String| ServeObservation {
        waiting_for: Some(why),
        ..Default::default()
    };
    if let Err(why) = head_ready(cluster) {
        return waiting(why);
    }
    let cluster_name = cluster.name_any();
    let dashboard = match crate::controllers::dashboard::client_for(
        &ctx.client,
        &ctx.config.dashboard,
        &ctx.config.dashboard_options,
        cluster,
    )
    .await
    {
        Ok(d) => d,
        Err(e) => return waiting(format!("RayCluster {cluster_name}: {e}")),
    };
    let details = match dashboard.get_serve_applications().await {
        Ok(d) => d,
        Err(e) => {
            return waiting(format!(
                "the Ray dashboard of RayCluster {cluster_name} did not answer: {e}"
            ));
        }
    };

    let config_text = service.spec.serve_config_v2.as_deref().unwrap_or("").trim();
    let mut push_error = None;
    // The applications this config deploys, and whether Serve got it only now (then `details`
    // still shows what ran before the push).
    let mut expected_apps = None;
    let mut pushed_now = false;
    if config_text.is_empty() {
        push_error = Some("spec.serveConfigV2 is empty: there is nothing to deploy".to_owned());
    } else {
        let binding = ctx
            .config
            .http_binding
            .as_ref()
            .and_then(|f| f(dashboard.dashboard_url()));
        match build::serve_config_json(
            config_text,
            binding.as_ref(),
            &ctx.config.runtime_env_mirrors,
        ) {
            Err(e) => push_error = Some(format!("spec.serveConfigV2 is not valid: {e}")),
            Ok(config) => {
                expected_apps = Some(build::application_names(&config));
                let config_hash = crate::k8s::stable_hash(&config);
                let previous = ctx.with_memory(service, |m| m.pushed.get(&cluster_name).cloned());
                // The session says whether the head restarted since the last push; read it
                // only when the rest says the push is still in place.
                let session = match &previous {
                    Some(p) if p.config_hash == config_hash && !details.applications.is_empty() => {
                        dashboard
                            .get_version()
                            .await
                            .ok()
                            .and_then(|v| v.session_name)
                    }
                    _ => None,
                };
                let needed = match &previous {
                    None => true,
                    Some(p) => {
                        p.config_hash != config_hash
                            || details.applications.is_empty()
                            || (p.session.is_some() && session.is_some() && p.session != session)
                    }
                };
                if needed {
                    pushed_now = true;
                    match dashboard.put_serve_applications(&config).await {
                        Ok(()) => {
                            let session = match session {
                                Some(s) => Some(s),
                                None => dashboard
                                    .get_version()
                                    .await
                                    .ok()
                                    .and_then(|v| v.session_name),
                            };
                            info!(cluster = %cluster_name, "Serve config pushed");
                            ctx.with_memory(service, |m| {
                                m.pushed.insert(
                                    cluster_name.clone(),
                                    Pushed {
                                        config_hash,
                                        session,
                                    },
                                )
                            });
                            ctx.event(
                                service,
                                EventType::Normal,
                                reasons::UPDATED_SERVE_APPLICATIONS,
                                "UpdateServeApplications",
                                format!("pushed the Serve config to RayCluster {cluster_name}"),
                            )
                            .await;
                        }
                        Err(e) => {
                            let message = format!(
                                "pushing the Serve config to RayCluster {cluster_name} failed: {e}"
                            );
                            ctx.event(
                                service,
                                EventType::Warning,
                                reasons::FAILED_TO_UPDATE_SERVE_APPLICATIONS,
                                "UpdateServeApplications",
                                message.clone(),
                            )
                            .await;
                            push_error = Some(message);
                        }
                    }
                }
            }
        }
    }

    let apps = build::application_statuses(&details);
    // Ready only for this config: every application it names is what Serve runs, all RUNNING
    // (another config's applications may still run on the head, e.g. right after a push).
    let ready = !pushed_now
        && expected_apps
            .as_ref()
            .is_some_and(|names| names.iter().eq(apps.keys()))
        && details.all_applications_running();
    let waiting_for = push_error.or_else(|| {
        if ready {
            None
        } else {
            let summary = build::not_running_summary(&apps).unwrap_or_else(|| {
                "Serve is taking the new config (it still reports other applications)".to_owned()
            });
            Some(format!("RayCluster {cluster_name}: {summary}"))
        }
    });
    ServeObservation {
        head_proxy_healthy: head_proxy_healthy(&details),
        apps: Some(apps),
        ready,
        waiting_for,
    }
}

/// The head's Serve proxy: the one on the node of the Serve controller (which runs on the
/// head), else the only one.
fn head_proxy_healthy(details: &crate::ray::ServeInstanceDetails) -> bool {
    let controller_node = details
        .controller_info
        .as_ref()
        .and_then(|c| c.get("node_id"))
        .and_then(|n| n.as_str());
    let proxy = controller_node
        .and_then(|n| details.proxies.get(n))
        .or_else(|| {
            (details.proxies.len() == 1)
                .then(|| details.proxies.values().next())
                .flatten()
        });
    match proxy {
        Some(p) => p.status == Some(crate::ray::ProxyStatus::Healthy),
        None => build::proxy_healthy(details) && details.proxies.len() == 1,
    }
}

async fn label_head_pod(service: &RayService, ctx: &Context, cluster: &RayCluster, serving: bool) {
    let namespace = cluster.namespace().unwrap_or_default();
    let cluster_name = cluster.name_any();
    let wanted = if serving { "true" } else { "false" };
    let cluster_uid = cluster.uid().unwrap_or_default();
    // Only the cluster's own Pods: anyone can copy its labels onto a Pod.
    let heads = ctx.head_pods.state_filter(|p| {
        p.namespace().as_deref() == Some(namespace.as_str())
            && p.labels().get(labels::CLUSTER) == Some(&cluster_name)
            && crate::k8s::is_controlled_by(p.meta(), &cluster_uid)
    });
    for pod in heads {
        if pod.labels().get(labels::SERVE).map(String::as_str) == Some(wanted) {
            continue;
        }
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = serde_json::json!({"metadata": {"labels": {labels::SERVE: wanted}}});
        match api
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                ctx.event(
                    service,
                    EventType::Normal,
                    reasons::UPDATED_HEAD_POD_SERVE_LABEL,
                    "UpdateHeadPodServeLabel",
                    format!(
                        "set {}={wanted} on head Pod {}",
                        labels::SERVE,
                        pod.name_any()
                    ),
                )
                .await
            }
            Err(e) => {
                ctx.event(
                    service,
                    EventType::Warning,
                    reasons::FAILED_TO_UPDATE_HEAD_POD_SERVE_LABEL,
                    "UpdateHeadPodServeLabel",
                    format!("labelling head Pod {} failed: {e}", pod.name_any()),
                )
                .await
            }
        }
    }
}

/// Creates the RayCluster `name` (create-only: a RayCluster of that name someone else made is
/// reported as a conflict and left alone; one we made earlier is fine).
async fn create_cluster(service: &RayService, ctx: &Context, name: &str) -> Result<(), Error> {
    let cluster = build::cluster(service, name, None)?;
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    match crate::k8s::create_owned(&api, &cluster, field_managers::RAYSERVICE).await {
        // Made by an earlier pass whose event the cache has not shown yet.
        Ok(crate::k8s::Created::AlreadyOurs(_)) => Ok(()),
        Ok(crate::k8s::Created::New(_)) => {
            info!(cluster = %name, "created the RayCluster");
            ctx.event(
                service,
                EventType::Normal,
                reasons::CREATED_RAY_CLUSTER,
                "CreateRayCluster",
                format!("created RayCluster {name}"),
            )
            .await;
            Ok(())
        }
        Err(e) => {
            let reason = e
                .conflict_reason()
                .unwrap_or(reasons::FAILED_TO_CREATE_RAY_CLUSTER);
            ctx.event(
                service,
                EventType::Warning,
                reason,
                "CreateRayCluster",
                format!("creating RayCluster {name} failed: {e}"),
            )
            .await;
            Err(e.into())
        }
    }
}

async fn update_cluster(
    service: &RayService,
    ctx: &Context,
    cluster: &RayCluster,
) -> Result<(), Error> {
    let name = cluster.name_any();
    let desired = build::cluster(service, &name, Some(cluster.spec.suspend))?;
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    let known = Some(cluster.meta());
    match crate::k8s::apply_owned(&api, &desired, known, field_managers::RAYSERVICE).await {
        Ok(_) => {
            info!(cluster = %name, "updated the RayCluster in place");
            ctx.event(
                service,
                EventType::Normal,
                reasons::UPDATED_RAY_CLUSTER,
                "UpdateRayCluster",
                format!("updated RayCluster {name} in place"),
            )
            .await;
            Ok(())
        }
        Err(e) => {
            ctx.event(
                service,
                EventType::Warning,
                reasons::FAILED_TO_UPDATE_RAY_CLUSTER,
                "UpdateRayCluster",
                format!("updating RayCluster {name} failed: {e}"),
            )
            .await;
            Err(e.into())
        }
    }
}

/// Deletes `clusters` once each has been dangling for `delay`; returns how many remain.
async fn delete_clusters(
    service: &RayService,
    ctx: &Context,
    clusters: &[Arc<RayCluster>],
    delay: Duration,
) -> usize {
    let names: BTreeSet<String> = clusters.iter().map(|c| c.name_any()).collect();
    let due: Vec<String> = ctx.with_memory(service, |m| {
        m.deletion_due.retain(|name, _| names.contains(name));
        let now = Instant::now();
        names
            .iter()
            .filter(|name| {
                let at = *m
                    .deletion_due
                    .entry((*name).clone())
                    .or_insert_with(|| now + delay);
                at <= now
            })
            .cloned()
            .collect()
    });
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    for name in &due {
        if clusters
            .iter()
            .any(|c| &c.name_any() == name && c.meta().deletion_timestamp.is_some())
        {
            continue;
        }
        // Only the cluster that was seen as ours: a same-named one made since is not touched.
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: clusters.iter().find(|c| &c.name_any() == name).map(|c| {
                kube::api::Preconditions {
                    uid: c.uid(),
                    resource_version: None,
                }
            }),
            ..Default::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                info!(cluster = %name, "deleted a RayCluster that no longer serves");
                ctx.with_memory(service, |m| m.pushed.remove(name));
                ctx.event(
                    service,
                    EventType::Normal,
                    reasons::DELETED_RAY_CLUSTER,
                    "DeleteRayCluster",
                    format!("deleted RayCluster {name}"),
                )
                .await;
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                ctx.event(
                    service,
                    EventType::Warning,
                    reasons::FAILED_TO_DELETE_RAY_CLUSTER,
                    "DeleteRayCluster",
                    format!("deleting RayCluster {name} failed: {e}"),
                )
                .await;
            }
        }
    }
    clusters.len()
}

/// Points the head and serve Services at `target` (creating them on first use).
async fn apply_services(
    service: &RayService,
    ctx: &Context,
    target: &RayCluster,
) -> Result<(), Error> {
    let namespace = service.namespace().unwrap_or_default();
    let desired = [
        build::head_service(service, target, &ctx.config.build)?,
        build::serve_service(service, target)?,
    ];
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    for svc in desired {
        let name = svc.name_any();
        let hash = crate::k8s::stable_hash(&svc);
        let cached = ctx.cached_service(&namespace, &name);
        let unchanged = cached
            .as_ref()
            .is_some_and(|c| build::selected_cluster(c) == Some(target.name_any().as_str()))
            && ctx.with_memory(service, |m| m.applied_services.get(&name) == Some(&hash));
        if unchanged {
            continue;
        }
        let (reason, verb) = match &cached {
            None => (reasons::CREATED_SERVICE, "created"),
            Some(_) => (reasons::UPDATED_SERVICE, "updated"),
        };
        // A cached Service of that name we do not control is refused without a request.
        let known = cached.as_ref().map(|c| c.meta());
        match crate::k8s::apply_owned(&api, &svc, known, field_managers::RAYSERVICE).await {
            Ok(_) => {
                ctx.with_memory(service, |m| m.applied_services.insert(name.clone(), hash));
                let moved = cached
                    .as_ref()
                    .and_then(|c| build::selected_cluster(c).map(str::to_owned))
                    != Some(target.name_any());
                if moved {
                    ctx.event(
                        service,
                        EventType::Normal,
                        reason,
                        "ApplyService",
                        format!(
                            "{verb} Service {name}; it selects RayCluster {}",
                            target.name_any()
                        ),
                    )
                    .await;
                }
            }
            Err(e) => {
                ctx.event(
                    service,
                    EventType::Warning,
                    e.conflict_reason()
                        .unwrap_or(reasons::FAILED_TO_CREATE_SERVICE),
                    "ApplyService",
                    format!("applying Service {name} failed: {e}"),
                )
                .await;
                return Err(e.into());
            }
        }
    }
    Ok(())
}

/// Distinct ready Pods behind the serve Service (from its EndpointSlices).
async fn count_serve_endpoints(
    ctx: &Context,
    namespace: &str,
    service: &str,
) -> Result<i32, Error> {
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), namespace);
    let slices = api
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .map_err(|e| {
            Error::kube(
                format!("listing the EndpointSlices of Service {service}"),
                e,
            )
        })?;
    let pods: BTreeSet<String> = slices
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
        .filter_map(|e| e.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
        .filter_map(|r| r.uid.clone().or_else(|| r.name.clone()))
        .collect();
    Ok(i32::try_from(pods.len()).unwrap_or(i32::MAX))
}

/// The suspend state machine. `Some(action)`: the pass ends here (after the status is written).
async fn reconcile_suspend(
    service: &RayService,
    ctx: &Context,
    status: &mut RayServiceStatus,
    clusters: &[Arc<RayCluster>],
) -> Result<Option<Action>, Error> {
    let generation = service.meta().generation;
    let now = crate::k8s::now();
    let requested = service.spec.suspend == Some(true);
    let suspending = status::is_true(&status.conditions, condition_types::SUSPENDING);
    let suspended = status::is_true(&status.conditions, condition_types::SUSPENDED);
    let set = |status: &mut RayServiceStatus, t: &str, v: &str, r: &str, m: &str| {
        status::set(status, t, v, r, m, generation, now.clone())
    };
    if requested && !suspending && !suspended {
        set(
            status,
            condition_types::SUSPENDING,
            TRUE,
            condition_reasons::SUSPEND_REQUESTED,
            "spec.suspend is true: the clusters and Services are being deleted",
        );
        for t in [condition_types::READY, condition_types::UPGRADE_IN_PROGRESS] {
            set(
                status,
                t,
                FALSE,
                condition_reasons::SUSPEND_IN_PROGRESS,
                "suspending",
            );
        }
        status.active_service_status = None;
        status.pending_service_status = None;
        status.num_serve_endpoints = Some(0);
        status.service_status = None;
        status.observed_generation = generation;
        return Ok(Some(Action::requeue(SHORT_REQUEUE)));
    }
    if suspending {
        let mut remaining = delete_clusters(service, ctx, clusters, Duration::ZERO).await;
        let namespace = service.namespace().unwrap_or_default();
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
        for name in [
            build::head_service_name(service),
            build::serve_service_name(service),
        ] {
            // Someone else's Service of that name is not ours to delete.
            let Some(cached) = ctx.cached_service(&namespace, &name).filter(|s| {
                crate::k8s::is_controlled_by(s.meta(), &service.uid().unwrap_or_default())
            }) else {
                continue;
            };
            remaining += 1;
            // Only the Service that was seen: a same-named one made since is not touched.
            let params = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: cached.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            let deleted = match api.delete(&name, &params).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
                Err(e) => Err(e),
            };
            match deleted {
                Ok(()) => {
                    ctx.event(
                        service,
                        EventType::Normal,
                        reasons::DELETED_SERVICE,
                        "DeleteService",
                        format!("deleted Service {name}"),
                    )
                    .await;
                }
                Err(e) => {
                    ctx.event(
                        service,
                        EventType::Warning,
                        reasons::FAILED_TO_DELETE_SERVICE,
                        "DeleteService",
                        format!("deleting Service {name} failed: {e}"),
                    )
                    .await;
                }
            }
        }
        ctx.with_memory(service, |m| {
            m.pushed.clear();
            m.applied_services.clear();
        });
        if remaining > 0 {
            set(
                status,
                condition_types::SUSPENDING,
                TRUE,
                condition_reasons::SUSPEND_IN_PROGRESS,
                &format!("{remaining} cluster(s) and Service(s) left to delete"),
            );
            return Ok(Some(Action::requeue(SHORT_REQUEUE)));
        }
        set(
            status,
            condition_types::SUSPENDING,
            FALSE,
            condition_reasons::SUSPEND_COMPLETE,
            "suspended",
        );
        set(
            status,
            condition_types::SUSPENDED,
            TRUE,
            condition_reasons::SUSPEND_COMPLETE,
            "every cluster and Service of the RayService is deleted",
        );
        for t in [condition_types::READY, condition_types::UPGRADE_IN_PROGRESS] {
            set(
                status,
                t,
                FALSE,
                condition_reasons::SUSPEND_COMPLETE,
                "suspended",
            );
        }
        return Ok(Some(Action::await_change()));
    }
    if suspended {
        if requested {
            return Ok(Some(Action::await_change()));
        }
        set(
            status,
            condition_types::SUSPENDED,
            FALSE,
            condition_reasons::RAY_SERVICE_RESUMED,
            "spec.suspend is false: a new cluster is prepared",
        );
        // Initializing starts afresh (a new transition time for the initializing timeout).
        status.conditions.retain(|c| {
            c.type_ != condition_types::READY && c.type_ != condition_types::UPGRADE_IN_PROGRESS
        });
    }
    Ok(None)
}

async fn write_status_if_changed(
    service: &RayService,
    ctx: &Context,
    mut status: RayServiceStatus,
) -> Result<(), Error> {
    let base = ctx
        .with_memory(service, |m| m.last_status.clone())
        .or_else(|| service.status.clone());
    if !status::differs(base.as_ref(), &status) {
        return Ok(());
    }
    status.last_update_time = Some(crate::k8s::now());
    let api: Api<RayService> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": RayService::api_version(&()),
        "kind": RayService::kind(&()),
        "status": status,
    });
    api.patch_status(
        &service.name_any(),
        &PatchParams::apply(field_managers::RAYSERVICE).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(|e| {
        Error::kube(
            format!("writing the status of RayService {}", service.name_any()),
            e,
        )
    })?;
    ctx.with_memory(service, |m| m.last_status = Some(status));
    Ok(())
}
