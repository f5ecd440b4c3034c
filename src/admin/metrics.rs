//! Prometheus/OpenMetrics metrics: one registry per operator process, filled through typed
//! methods so controllers never touch metric families or label values directly.
//!
//! Labels are bounded sets (controller, error category, fetch outcome, phase, Kubernetes verb
//! and status code) — never object names: those would grow the series count with every
//! pipeline ever created. The one exception is opt-in: KubeRay's series
//! ([`MetricsOptions::kuberay`], see `kuberay_metrics`) carry object names as KubeRay's do.
//!
//! Besides the `raypipe_` metrics the registry holds the standard `process_*` series (see
//! `process`), computed at scrape time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

use super::kuberay_metrics::KubeRayCollector;
use super::process::ProcessCollector;
use super::stores::{StoreRegistration, StoreSet};
use crate::api::{RayCluster, RayJob, RayService, ServePipeline};

/// Keeps a pipeline store counted in `raypipe_servepipelines`; dropping it stops that.
pub type PipelineRegistration = StoreRegistration;

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Phase reported for a pipeline whose status has none yet.
const PHASE_UNKNOWN: &str = "Unknown";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: &'static str,
    category: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FetchLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutLabels {
    result: &'static str,
}

/// How a canary rollout can end (the ServePipeline controller's `rollout::results`). Each starts
/// at 0, so an alert on `increase(…)` sees the first rollback after a restart too.
pub const ROLLOUT_RESULTS: [&str; 3] = ["Promoted", "RolledBack", "Aborted"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    kind: &'static str,
    allowed: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KubeRequestLabels {
    verb: &'static str,
    /// The HTTP status, or `error` when no answer came (connection refused, timeout).
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabels {
    verb: &'static str,
}

/// controller-runtime's `result` label: raypipe knows success and error (a requeue is part of
/// a success).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: &'static str,
    result: &'static str,
}

/// What a [`Metrics`] registry exports beyond the always-on metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsOptions {
    /// KubeRay's `kuberay_*` series and the controller-runtime series its dashboard reads
    /// (`--kuberay-metrics`).
    pub kuberay: bool,
}

/// What a graph download ended in, as far as metrics care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchOutcome {
    /// New bytes arrived.
    Fetched,
    /// The server answered 304 to our ETag.
    NotModified,
    /// Bytes arrived but their digest equals the applied graph's.
    Unchanged,
}

impl FetchOutcome {
    fn label(self) -> &'static str {
        match self {
            FetchOutcome::Fetched => "fetched",
            FetchOutcome::NotModified => "not_modified",
            FetchOutcome::Unchanged => "unchanged",
        }
    }
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Reconciles take milliseconds to tens of seconds: 5 ms … ~20 s.
fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 13))
}

/// Downloads: 10 ms … ~80 s.
fn fetch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

/// API requests: 5 ms … ~41 s (a watch is timed until its response headers).
fn kube_request_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Provisioning a cluster or upgrading a service: 1 s … ~2.3 h.
fn rollout_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

/// Registers `metric` under `name` and hands it back: metrics are shared handles, so the one
/// kept records into the registry.
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Cloneable handle on the process' metrics; every clone records into the same registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: HistogramFamily<ControllerLabels>,
    reconciles_in_flight: Family<ControllerLabels, Gauge>,
    queue_depth: Family<ControllerLabels, Gauge>,
    update_stages: HistogramFamily<StageLabels>,
    fetch_duration: HistogramFamily<FetchLabels>,
    fetch_failures: Family<ReasonLabels, Counter>,
    raycluster_provisioning: Histogram,
    rayservice_upgrade: Histogram,
    rollouts: Family<RolloutLabels, Counter>,
    leader: Gauge,
    admissions: Family<AdmissionLabels, Counter>,
    pipelines: Arc<PipelinePhases>,
    kube_requests: Family<KubeRequestLabels, Counter>,
    kube_request_duration: HistogramFamily<VerbLabels>,
    /// Reconcile outcomes under controller-runtime's labels; exported with `kuberay` only.
    reconcile_results: Family<ResultLabels, Counter>,
    /// `None` unless [`MetricsOptions::kuberay`].
    kuberay: Option<Arc<KubeRayCollector>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with every raypipe metric (prefix `raypipe_`) and the process metrics.
    pub fn new() -> Metrics {
        Metrics::with_options(MetricsOptions::default())
    }

    /// A fresh registry with the always-on metrics and what `options` adds.
    pub fn with_options(options: MetricsOptions) -> Metrics {
        let mut root = Registry::default();
        root.register_collector(Box::new(ProcessCollector));
        let registry = root.sub_registry_with_prefix("raypipe");
        let reconciles = register(
            registry,
            "reconcile",
            "Reconciliations run, by controller",
            Family::<ControllerLabels, Counter>::default(),
        );
        let reconcile_errors = register(
            registry,
            "reconcile_errors",
            "Reconciliations that ended in an error, by controller and error category",
            Family::<ErrorLabels, Counter>::default(),
        );
        let reconcile_duration: HistogramFamily<ControllerLabels> = register(
            registry,
            "reconcile_duration_seconds",
            "Time one reconciliation took, by controller",
            Family::new_with_constructor(reconcile_histogram),
        );
        let reconciles_in_flight = register(
            registry,
            "reconciles_in_flight",
            "Reconciliations running now, by controller (kube-runtime keeps its queue private, so this is the visible part of it)",
            Family::<ControllerLabels, Gauge>::default(),
        );
        let queue_depth = register(
            registry,
            "reconcile_queue_depth",
            "Objects with a change seen (their own or an owned object's) and not yet picked up by a reconciliation, by controller",
            Family::<ControllerLabels, Gauge>::default(),
        );
        let update_stages: HistogramFamily<StageLabels> = register(
            registry,
            "pipeline_update_stage_seconds",
            "Time each stage took when a ServePipeline adopted a new graph: fetch_validate (download, decode, validate), render, apply (the RayService update)",
            Family::new_with_constructor(reconcile_histogram),
        );
        let fetch_duration: HistogramFamily<FetchLabels> = register(
            registry,
            "graph_fetch_duration_seconds",
            "Time a model-graph download took, by outcome (failed downloads included)",
            Family::new_with_constructor(fetch_histogram),
        );
        let fetch_failures = register(
            registry,
            "graph_fetch_failures",
            "Model-graph downloads that failed, by reason",
            Family::<ReasonLabels, Counter>::default(),
        );
        let raycluster_provisioning = register(
            registry,
            "raycluster_provisioning_duration_seconds",
            "Time from a RayCluster's creation until all its Pods were first ready",
            rollout_histogram(),
        );
        let rayservice_upgrade = register(
            registry,
            "rayservice_upgrade_duration_seconds",
            "Time a RayService took to move its traffic to a new RayCluster",
            rollout_histogram(),
        );
        let rollouts = register(
            registry,
            "pipeline_rollouts",
            "Canary rollouts of a new graph that ended, by result (Promoted, RolledBack, Aborted)",
            Family::<RolloutLabels, Counter>::default(),
        );
        for result in ROLLOUT_RESULTS {
            let _ = rollouts.get_or_create(&RolloutLabels { result });
        }
        let leader = register(
            registry,
            "leader",
            "1 while this replica holds the leader lease and runs the controllers",
            Gauge::default(),
        );
        let admissions = register(
            registry,
            "webhook_admissions",
            "Admission reviews answered, by kind and verdict",
            Family::<AdmissionLabels, Counter>::default(),
        );
        let pipelines = Arc::new(PipelinePhases::default());
        registry.register_collector(Box::new(pipelines.clone()));
        let kube_requests = register(
            registry,
            "kube_requests",
            "Requests the operator sent to the Kubernetes API server, by verb and HTTP status code",
            Family::<KubeRequestLabels, Counter>::default(),
        );
        let kube_request_duration: HistogramFamily<VerbLabels> = register(
            registry,
            "kube_request_duration_seconds",
            "Time until the Kubernetes API server's answer, by verb",
            Family::new_with_constructor(kube_request_histogram),
        );
        let reconcile_results = Family::<ResultLabels, Counter>::default();
        let kuberay = options.kuberay.then(|| {
            let collector = Arc::new(KubeRayCollector::default());
            root.register_collector(Box::new(collector.clone()));
            // The operator panels of KubeRay's dashboard read controller-runtime's names.
            root.register(
                "controller_runtime_reconcile",
                "Total number of reconciliations per controller",
                reconcile_results.clone(),
            );
            root.register(
                "controller_runtime_reconcile_time_seconds",
                "Length of time per reconciliation per controller",
                reconcile_duration.clone(),
            );
            root.register(
                "controller_runtime_active_workers",
                "Number of currently used workers per controller",
                reconciles_in_flight.clone(),
            );
            root.register(
                "workqueue_depth",
                "Current depth of workqueue",
                queue_depth.clone(),
            );
            collector
        });
        Metrics {
            inner: Arc::new(Inner {
                registry: root,
                reconciles,
                reconcile_errors,
                reconcile_duration,
                reconciles_in_flight,
                queue_depth,
                update_stages,
                fetch_duration,
                fetch_failures,
                raycluster_provisioning,
                rayservice_upgrade,
                rollouts,
                leader,
                admissions,
                pipelines,
                kube_requests,
                kube_request_duration,
                reconcile_results,
                kuberay,
            }),
        }
    }

    /// A layer for `kube::client::ClientBuilder::with_layer` that records every API request
    /// in `raypipe_kube_requests_total` and `raypipe_kube_request_duration_seconds`.
    pub fn kube_client_layer(&self) -> super::kube_requests::KubeRequestMetricsLayer {
        super::kube_requests::KubeRequestMetricsLayer::new(self)
    }

    /// One API request answered with `code` (`None`: no answer) after `took`.
    pub(crate) fn kube_request(&self, verb: &'static str, code: Option<u16>, took: Duration) {
        let code = code.map_or_else(|| "error".to_owned(), |c| c.to_string());
        self.inner
            .kube_requests
            .get_or_create(&KubeRequestLabels { verb, code })
            .inc();
        self.inner
            .kube_request_duration
            .get_or_create(&VerbLabels { verb })
            .observe(took.as_secs_f64());
    }

    /// KubeRay's RayCluster series read `store` at every scrape while the registration is
    /// kept (a no-op unless the KubeRay set is on).
    pub fn observe_rayclusters(&self, store: Store<RayCluster>) -> StoreRegistration {
        self.observe_for_kuberay(|k| &k.clusters, store)
    }

    /// As [`observe_rayclusters`](Self::observe_rayclusters), for RayJobs.
    pub fn observe_rayjobs(&self, store: Store<RayJob>) -> StoreRegistration {
        self.observe_for_kuberay(|k| &k.jobs, store)
    }

    /// As [`observe_rayclusters`](Self::observe_rayclusters), for RayServices.
    pub fn observe_rayservices(&self, store: Store<RayService>) -> StoreRegistration {
        self.observe_for_kuberay(|k| &k.services, store)
    }

    fn observe_for_kuberay<K>(
        &self,
        set: impl FnOnce(&KubeRayCollector) -> &Arc<StoreSet<K>>,
        store: Store<K>,
    ) -> StoreRegistration
    where
        K: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        match &self.inner.kuberay {
            Some(kuberay) => set(kuberay).register(store),
            None => StoreRegistration::none(),
        }
    }

    /// Starts timing one reconciliation of `controller` (a fixed name such as
    /// `servepipeline`); finish it with [`ReconcileTimer::finish`].
    pub fn reconcile_started(&self, controller: &'static str) -> ReconcileTimer {
        let labels = ControllerLabels { controller };
        self.inner.reconciles.get_or_create(&labels).inc();
        self.inner.reconciles_in_flight.get_or_create(&labels).inc();
        ReconcileTimer {
            metrics: self.clone(),
            controller,
            started: Instant::now(),
            finished: false,
        }
    }

    /// Records how long one stage of adopting a new graph took (`fetch_validate`, `render`,
    /// `apply`).
    pub fn pipeline_update_stage(&self, stage: &'static str, took: Duration) {
        self.inner
            .update_stages
            .get_or_create(&StageLabels { stage })
            .observe(took.as_secs_f64());
    }

    /// The queue of `controller`: objects whose reconciliation is due because something changed.
    pub fn queue(&self, controller: &'static str) -> ReconcileQueue {
        let gauge = self
            .inner
            .queue_depth
            .get_or_create(&ControllerLabels { controller })
            .clone();
        ReconcileQueue {
            pending: Arc::new(std::sync::Mutex::new(std::collections::HashSet::new())),
            gauge,
        }
    }

    /// Records one graph download that produced an answer.
    pub fn graph_fetched(&self, outcome: FetchOutcome, took: Duration) {
        self.inner
            .fetch_duration
            .get_or_create(&FetchLabels {
                outcome: outcome.label(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records one failed graph download; `reason` is the failure's fixed reason string (such
    /// as `Unauthorized` or `DigestMismatch`).
    pub fn graph_fetch_failed(&self, reason: &'static str, took: Duration) {
        self.inner
            .fetch_duration
            .get_or_create(&FetchLabels { outcome: "failed" })
            .observe(took.as_secs_f64());
        self.inner
            .fetch_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// A RayCluster became provisioned (all Pods ready for the first time) `took` after it was
    /// created.
    pub fn raycluster_provisioned(&self, took: Duration) {
        self.inner
            .raycluster_provisioning
            .observe(took.as_secs_f64());
    }

    /// A RayService finished moving its traffic to a new cluster, `took` after the upgrade began.
    pub fn rayservice_upgraded(&self, took: Duration) {
        self.inner.rayservice_upgrade.observe(took.as_secs_f64());
    }

    /// A ServePipeline's canary rollout ended with `result` (one of [`ROLLOUT_RESULTS`]; the
    /// reason is in the pipeline's status and Events, not in a label).
    pub fn pipeline_rollout_ended(&self, result: &'static str) {
        self.inner
            .rollouts
            .get_or_create(&RolloutLabels { result })
            .inc();
    }

    /// Whether this replica leads (runs the controllers).
    pub fn set_leader(&self, leading: bool) {
        self.inner.leader.set(i64::from(leading));
    }

    /// One admission review answered for `kind` (a fixed kind name).
    pub fn admission_reviewed(&self, kind: &'static str, allowed: bool) {
        self.inner
            .admissions
            .get_or_create(&AdmissionLabels { kind, allowed })
            .inc();
    }

    /// Counts the pipelines in `store` by `status.phase` at every scrape, until the returned
    /// registration is dropped (a controller holds it for as long as it runs).
    pub fn observe_pipelines(&self, store: Store<ServePipeline>) -> PipelineRegistration {
        self.inner.pipelines.stores.register(store)
    }

    /// The registry in the OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.inner.registry)?;
        Ok(out)
    }

    fn reconcile_finished(
        &self,
        controller: &'static str,
        took: Duration,
        error: Option<&'static str>,
    ) {
        let labels = ControllerLabels { controller };
        self.inner.reconciles_in_flight.get_or_create(&labels).dec();
        let result = if error.is_some() { "error" } else { "success" };
        self.inner
            .reconcile_results
            .get_or_create(&ResultLabels { controller, result })
            .inc();
        self.inner
            .reconcile_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if let Some(category) = error {
            self.inner
                .reconcile_errors
                .get_or_create(&ErrorLabels {
                    controller,
                    category,
                })
                .inc();
        }
    }
}

/// One running reconciliation. Dropped without [`finish`](Self::finish) (the reconcile future
/// was cancelled), it still leaves the in-flight gauge correct.
pub struct ReconcileTimer {
    metrics: Metrics,
    controller: &'static str,
    started: Instant,
    finished: bool,
}

impl ReconcileTimer {
    /// Records the duration and, for a failure, its category (a fixed string such as `kube`,
    /// `input` or `apply`).
    pub fn finish(mut self, error_category: Option<&'static str>) {
        self.finished = true;
        self.metrics
            .reconcile_finished(self.controller, self.started.elapsed(), error_category);
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        if !self.finished {
            self.metrics.reconcile_finished(
                self.controller,
                self.started.elapsed(),
                Some("cancelled"),
            );
        }
    }
}

/// Computes pipelines by phase from the controllers' caches at scrape time, so deleted
/// pipelines disappear without bookkeeping (KubeRay computes its info metrics the same way).
#[derive(Default)]
struct PipelinePhases {
    stores: Arc<StoreSet<ServePipeline>>,
}

impl std::fmt::Debug for PipelinePhases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PipelinePhases")
    }
}

impl PipelinePhases {
    fn counts(&self) -> BTreeMap<String, i64> {
        let mut counts = BTreeMap::new();
        for pipeline in self.stores.objects() {
            let phase = pipeline
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| PHASE_UNKNOWN.to_owned());
            *counts.entry(phase).or_insert(0) += 1;
        }
        counts
    }
}

impl Collector for PipelinePhases {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = Family::<PhaseLabels, Gauge>::default();
        for (phase, count) in self.counts() {
            family.get_or_create(&PhaseLabels { phase }).set(count);
        }
        let metric = encoder.encode_descriptor(
            "servepipelines",
            "ServePipelines in the watched namespaces, by status.phase",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}

/// Counts the objects a controller has to look at: a change to the object or to something it
/// owns adds it, the start of its reconciliation removes it. kube-runtime keeps its own queue
/// private; this mirrors it from the same events (a change seen while the object is being
/// reconciled queues it again, as kube-runtime does). Cheap to clone.
#[derive(Clone, Debug)]
pub struct ReconcileQueue {
    pending: Arc<std::sync::Mutex<std::collections::HashSet<(String, String)>>>,
    gauge: Gauge,
}

impl ReconcileQueue {
    /// A change to `namespace/name` (the controller's own kind) was seen.
    pub fn changed(&self, namespace: Option<String>, name: String) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.insert((namespace.unwrap_or_default(), name));
        self.gauge.set(pending.len() as i64);
    }

    /// A change to an owned object: its controlling owner of kind `owner_kind` is queued.
    pub fn owner_changed(&self, owned: &kube::api::ObjectMeta, owner_kind: &str) {
        if let Some(owner) = owned
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true) && o.kind == owner_kind)
        {
            self.changed(owned.namespace.clone(), owner.name.clone());
        }
    }

    /// The reconciliation of `namespace/name` started.
    pub fn started(&self, namespace: Option<String>, name: &str) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.remove(&(namespace.unwrap_or_default(), name.to_owned()));
        self.gauge.set(pending.len() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_counts_each_changed_object_once_until_its_reconcile_starts() {
        let metrics = Metrics::new();
        let queue = metrics.queue("raycluster");
        let depth = |m: &Metrics| {
            m.encode()
                .unwrap()
                .lines()
                .find(|l| l.starts_with("raypipe_reconcile_queue_depth{controller=\"raycluster\"}"))
                .map(|l| l.rsplit(' ').next().unwrap().to_owned())
        };
        queue.changed(Some("ns".into()), "a".into());
        queue.changed(Some("ns".into()), "a".into());
        let pod: kube::api::ObjectMeta = serde_json::from_value(serde_json::json!({
            "name": "a-head-x", "namespace": "ns",
            "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "b",
                "uid": "u", "controller": true}]
        }))
        .unwrap();
        queue.owner_changed(&pod, "RayCluster");
        queue.owner_changed(&pod, "RayService");
        assert_eq!(depth(&metrics).as_deref(), Some("2"));
        queue.started(Some("ns".into()), "a");
        assert_eq!(depth(&metrics).as_deref(), Some("1"));
        queue.started(Some("ns".into()), "b");
        assert_eq!(depth(&metrics).as_deref(), Some("0"));
    }

    #[test]
    fn reconcile_counts_errors_and_durations_are_labelled_by_controller_only() {
        let metrics = Metrics::new();
        metrics.reconcile_started("servepipeline").finish(None);
        metrics
            .reconcile_started("servepipeline")
            .finish(Some("kube"));
        drop(metrics.reconcile_started("raycluster"));
        let text = metrics.encode().expect("encodes");
        assert!(
            text.contains("raypipe_reconcile_total{controller=\"servepipeline\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "raypipe_reconcile_errors_total{controller=\"servepipeline\",category=\"kube\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "raypipe_reconcile_errors_total{controller=\"raycluster\",category=\"cancelled\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "raypipe_reconcile_duration_seconds_count{controller=\"servepipeline\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("raypipe_reconciles_in_flight{controller=\"servepipeline\"} 0"),
            "{text}"
        );
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }

    #[test]
    fn domain_metrics_are_recorded() {
        let metrics = Metrics::new();
        metrics.graph_fetched(FetchOutcome::NotModified, Duration::from_millis(20));
        metrics.graph_fetch_failed("Unauthorized", Duration::from_millis(5));
        metrics.raycluster_provisioned(Duration::from_secs(30));
        metrics.rayservice_upgraded(Duration::from_secs(90));
        metrics.pipeline_rollout_ended("RolledBack");
        metrics.set_leader(true);
        metrics.admission_reviewed("RayCluster", false);
        let text = metrics.encode().expect("encodes");
        for expected in [
            "raypipe_graph_fetch_duration_seconds_count{outcome=\"not_modified\"} 1",
            "raypipe_graph_fetch_duration_seconds_count{outcome=\"failed\"} 1",
            "raypipe_graph_fetch_failures_total{reason=\"Unauthorized\"} 1",
            "raypipe_raycluster_provisioning_duration_seconds_count 1",
            "raypipe_rayservice_upgrade_duration_seconds_sum 90.0",
            "raypipe_pipeline_rollouts_total{result=\"RolledBack\"} 1",
            "raypipe_pipeline_rollouts_total{result=\"Promoted\"} 0",
            "raypipe_leader 1",
            "raypipe_webhook_admissions_total{kind=\"RayCluster\",allowed=\"false\"} 1",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }

    #[test]
    fn process_metrics_are_always_there_and_the_kuberay_set_mirrors_reconciles() {
        let plain = Metrics::new().encode().expect("encodes");
        #[cfg(target_os = "linux")]
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(plain.contains(name), "missing {name:?} in\n{plain}");
        }
        assert!(!plain.contains("raypipe_process"), "{plain}");

        let compatible = Metrics::with_options(MetricsOptions { kuberay: true });
        compatible.reconcile_started("rayjob").finish(None);
        compatible.reconcile_started("rayjob").finish(Some("kube"));
        let _running = compatible.reconcile_started("raycluster");
        compatible.queue("rayjob").changed(None, "j".into());
        let text = compatible.encode().expect("encodes");
        for expected in [
            "controller_runtime_reconcile_total{controller=\"rayjob\",result=\"success\"} 1",
            "controller_runtime_reconcile_total{controller=\"rayjob\",result=\"error\"} 1",
            "controller_runtime_reconcile_time_seconds_count{controller=\"rayjob\"} 2",
            "controller_runtime_active_workers{controller=\"raycluster\"} 1",
            "workqueue_depth{controller=\"rayjob\"} 1",
            "raypipe_reconcile_total{controller=\"rayjob\"} 2",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }

    #[test]
    fn pipelines_are_counted_by_phase_while_registered() {
        use kube::runtime::watcher;
        let metrics = Metrics::new();
        let (store, mut writer) = kube::runtime::reflector::store::<ServePipeline>();
        let pipeline = |name: &str, phase: Option<&str>| -> ServePipeline {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"source": {"url": "https://example.invalid/g.pb"},
                         "rayClusterConfig": {"headGroupSpec": {"template": {}}}},
                "status": phase.map(|p| serde_json::json!({"phase": p})),
            }))
            .expect("a pipeline")
        };
        writer.apply_watcher_event(&watcher::Event::Apply(pipeline("a", Some("Ready"))));
        writer.apply_watcher_event(&watcher::Event::Apply(pipeline("b", Some("Ready"))));
        writer.apply_watcher_event(&watcher::Event::Apply(pipeline("c", None)));
        let registration = metrics.observe_pipelines(store);
        let text = metrics.encode().expect("encodes");
        assert!(
            text.contains("raypipe_servepipelines{phase=\"Ready\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("raypipe_servepipelines{phase=\"Unknown\"} 1"),
            "{text}"
        );
        assert!(!text.contains("name="), "no object names as labels: {text}");
        drop(registration);
        let text = metrics.encode().expect("encodes");
        assert!(!text.contains("phase=\"Ready\""), "{text}");
    }
}
