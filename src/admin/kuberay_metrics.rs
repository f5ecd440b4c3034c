//! The KubeRay-compatible metrics (`--kuberay-metrics`): the series KubeRay's operator exports
//! for RayClusters, RayJobs and RayServices, under KubeRay's names, labels and values, so that
//! KubeRay's Grafana dashboard works against raypipe unchanged. They are computed at scrape time
//! from the controllers' caches (see `stores`): nothing is kept per object, and a deleted object
//! leaves the metrics when it leaves the cache.
//!
//! Where KubeRay records a value at the moment of a status transition, raypipe derives the same
//! value from the timestamps the status keeps, so it also survives an operator restart:
//! - `kuberay_cluster_provisioned_duration_seconds`: the `RayClusterProvisioned` condition's
//!   `lastTransitionTime` minus the cluster's `creationTimestamp`;
//! - `kuberay_job_execution_duration_seconds`: `endTime` minus `startTime` of a job in a
//!   terminal state, with `retry_count` the failures before that run ended. KubeRay also emits
//!   one sample when a run ends in `Retrying`; that state lasts one status write and keeps no
//!   end time, so that sample cannot be derived from the object and is not exported.
//!
//! The same switch adds the controller-runtime series the dashboard's operator panels query
//! (`controller_runtime_reconcile_total{controller, result}`,
//! `controller_runtime_reconcile_time_seconds`, `controller_runtime_active_workers`,
//! `workqueue_depth`), mirrored from raypipe's own reconcile metrics.
//!
//! Labels carry object names, namespaces and uids as KubeRay's do: one series per object, which
//! is why the set is opt-in.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use super::stores::StoreSet;
use crate::api::raycluster::condition_types as cluster_conditions;
use crate::api::rayservice::condition_types as service_conditions;
use crate::api::{RayCluster, RayJob, RayService};
use crate::kuberay::keys::labels::ORIGINATED_FROM_CRD;

/// `owner_kind` of a RayCluster that no RayJob or RayService created (KubeRay's value).
const OWNER_NONE: &str = "None";

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ObjectLabels {
    name: String,
    namespace: String,
    uid: String,
}

impl ObjectLabels {
    fn of(meta: &ObjectMeta) -> ObjectLabels {
        ObjectLabels {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ClusterInfoLabels {
    #[prometheus(flatten)]
    object: ObjectLabels,
    owner_kind: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ConditionLabels {
    #[prometheus(flatten)]
    object: ObjectLabels,
    /// `"true"` or `"false"`, as Go's `strconv.FormatBool` writes it.
    condition: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct DeploymentStatusLabels {
    #[prometheus(flatten)]
    object: ObjectLabels,
    deployment_status: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ExecutionLabels {
    #[prometheus(flatten)]
    object: ObjectLabels,
    job_deployment_status: String,
    retry_count: i64,
}

fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

fn condition(object: &ObjectLabels, value: bool) -> ConditionLabels {
    ConditionLabels {
        object: object.clone(),
        condition: if value { "true" } else { "false" },
    }
}

/// Seconds from `from` to `to`, never negative (clocks of different writers may disagree).
fn seconds_between(
    from: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    to: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> f64 {
    to.0.duration_since(from.0).as_secs_f64().max(0.0)
}

/// The series of one RayCluster.
#[derive(Debug, PartialEq)]
pub(crate) struct ClusterSeries {
    info: ClusterInfoLabels,
    provisioned: ConditionLabels,
    provisioned_duration: Option<(ObjectLabels, f64)>,
}

pub(crate) fn cluster_series(cluster: &RayCluster) -> ClusterSeries {
    let object = ObjectLabels::of(&cluster.metadata);
    let owner_kind = cluster
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ORIGINATED_FROM_CRD))
        .cloned()
        .unwrap_or_else(|| OWNER_NONE.to_owned());
    let conditions = cluster
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let provisioned_condition = conditions
        .iter()
        .find(|c| c.type_ == cluster_conditions::RAY_CLUSTER_PROVISIONED && c.status == "True");
    let provisioned_duration = provisioned_condition
        .zip(cluster.metadata.creation_timestamp.as_ref())
        .map(|(c, created)| {
            (
                object.clone(),
                seconds_between(created, &c.last_transition_time),
            )
        });
    ClusterSeries {
        info: ClusterInfoLabels {
            object: object.clone(),
            owner_kind,
        },
        provisioned: condition(&object, provisioned_condition.is_some()),
        provisioned_duration,
    }
}

/// The series of one RayJob.
#[derive(Debug, PartialEq)]
pub(crate) struct JobSeries {
    info: ObjectLabels,
    deployment_status: DeploymentStatusLabels,
    execution_duration: Option<(ExecutionLabels, f64)>,
}

pub(crate) fn job_series(job: &RayJob) -> JobSeries {
    use crate::api::rayjob::JobDeploymentStatus;
    let object = ObjectLabels::of(&job.metadata);
    let status = job.status.clone().unwrap_or_default();
    // KubeRay writes the Go string of the status: the variant's name, empty for a new job.
    let deployment_status = status
        .job_deployment_status
        .map(|s| format!("{s:?}"))
        .unwrap_or_default();
    let execution_duration = match (
        status.job_deployment_status,
        &status.start_time,
        &status.end_time,
    ) {
        (Some(finished), Some(start), Some(end)) if finished.is_terminal() => {
            // `failed` already counts a run that ended Failed; KubeRay labels the sample with
            // the count from before that run.
            let failed = i64::from(status.failed.unwrap_or(0).max(0));
            let retry_count = if finished == JobDeploymentStatus::Failed {
                failed.saturating_sub(1).max(0)
            } else {
                failed
            };
            Some((
                ExecutionLabels {
                    object: object.clone(),
                    job_deployment_status: deployment_status.clone(),
                    retry_count,
                },
                seconds_between(start, end),
            ))
        }
        _ => None,
    };
    JobSeries {
        info: object.clone(),
        deployment_status: DeploymentStatusLabels {
            object,
            deployment_status,
        },
        execution_duration,
    }
}

/// The series of one RayService.
#[derive(Debug, PartialEq)]
pub(crate) struct ServiceSeries {
    info: ObjectLabels,
    ready: ConditionLabels,
    upgrade_in_progress: ConditionLabels,
}

pub(crate) fn service_series(service: &RayService) -> ServiceSeries {
    let object = ObjectLabels::of(&service.metadata);
    let conditions = service
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    ServiceSeries {
        ready: condition(&object, is_true(conditions, service_conditions::READY)),
        upgrade_in_progress: condition(
            &object,
            is_true(conditions, service_conditions::UPGRADE_IN_PROGRESS),
        ),
        info: object,
    }
}

/// Encodes one gauge family from `samples` (a family without samples is still described).
fn gauges<'a, L, V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (&'a L, V)>,
) -> Result<(), std::fmt::Error>
where
    L: EncodeLabelSet + 'a,
    V: EncodeGaugeValue,
{
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(value).encode(metric.encode_family(labels)?)?;
    }
    Ok(())
}

/// Reads the RayCluster, RayJob and RayService caches at every scrape.
#[derive(Default)]
pub(crate) struct KubeRayCollector {
    pub(crate) clusters: Arc<StoreSet<RayCluster>>,
    pub(crate) jobs: Arc<StoreSet<RayJob>>,
    pub(crate) services: Arc<StoreSet<RayService>>,
}

impl std::fmt::Debug for KubeRayCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeRayCollector")
    }
}

impl Collector for KubeRayCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let clusters: Vec<ClusterSeries> = self
            .clusters
            .objects()
            .iter()
            .map(|c| cluster_series(c))
            .collect();
        gauges(
            &mut encoder,
            "kuberay_cluster_info",
            "Metadata information about RayCluster custom resources",
            clusters.iter().map(|c| (&c.info, 1_i64)),
        )?;
        gauges(
            &mut encoder,
            "kuberay_cluster_condition_provisioned",
            "Indicates whether the RayCluster is provisioned",
            clusters.iter().map(|c| (&c.provisioned, 1_i64)),
        )?;
        gauges(
            &mut encoder,
            "kuberay_cluster_provisioned_duration_seconds",
            "The time, in seconds, when a RayCluster's `RayClusterProvisioned` status transitions from false (or unset) to true",
            clusters
                .iter()
                .filter_map(|c| c.provisioned_duration.as_ref())
                .map(|(labels, seconds)| (labels, *seconds)),
        )?;

        let jobs: Vec<JobSeries> = self.jobs.objects().iter().map(|j| job_series(j)).collect();
        gauges(
            &mut encoder,
            "kuberay_job_info",
            "Metadata information about RayJob custom resources",
            jobs.iter().map(|j| (&j.info, 1_i64)),
        )?;
        gauges(
            &mut encoder,
            "kuberay_job_deployment_status",
            "The RayJob's current deployment status",
            jobs.iter().map(|j| (&j.deployment_status, 1_i64)),
        )?;
        gauges(
            &mut encoder,
            "kuberay_job_execution_duration_seconds",
            "Duration from when the RayJob's JobDeploymentStatus transitions from Initializing to a terminal state (Complete or Failed)",
            jobs.iter()
                .filter_map(|j| j.execution_duration.as_ref())
                .map(|(labels, seconds)| (labels, *seconds)),
        )?;

        let services: Vec<ServiceSeries> = self
            .services
            .objects()
            .iter()
            .map(|s| service_series(s))
            .collect();
        gauges(
            &mut encoder,
            "kuberay_service_info",
            "Metadata information about RayService custom resources",
            services.iter().map(|s| (&s.info, 1_i64)),
        )?;
        gauges(
            &mut encoder,
            "kuberay_service_condition_ready",
            "Describes whether the RayService is ready. Ready means users can send requests to the underlying cluster and the number of serve endpoints is greater than 0.",
            services.iter().map(|s| (&s.ready, 1_i64)),
        )?;
        gauges(
            &mut encoder,
            "kuberay_service_condition_upgrade_in_progress",
            "Describes whether the RayService is performing a zero-downtime upgrade.",
            services.iter().map(|s| (&s.upgrade_in_progress, 1_i64)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher;
    use serde_json::json;

    fn labels(name: &str) -> ObjectLabels {
        ObjectLabels {
            name: name.into(),
            namespace: "team".into(),
            uid: format!("uid-{name}"),
        }
    }

    fn metadata(name: &str) -> serde_json::Value {
        json!({"name": name, "namespace": "team", "uid": format!("uid-{name}"),
               "creationTimestamp": "2026-01-01T00:00:00Z"})
    }

    fn cluster(name: &str, extra: serde_json::Value) -> RayCluster {
        let mut value = json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": metadata(name),
            "spec": {"headGroupSpec": {"rayStartParams": {}, "template": {}}},
        });
        merge(&mut value, extra);
        serde_json::from_value(value).expect("a RayCluster")
    }

    fn job(name: &str, status: serde_json::Value) -> RayJob {
        serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": metadata(name),
            "spec": {"entrypoint": "python job.py"}, "status": status,
        }))
        .expect("a RayJob")
    }

    fn service(name: &str, conditions: serde_json::Value) -> RayService {
        serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": metadata(name),
            "spec": {"rayClusterConfig": {"headGroupSpec": {"rayStartParams": {}, "template": {}}}},
            "status": {"conditions": conditions},
        }))
        .expect("a RayService")
    }

    fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
        if let (Some(into), serde_json::Value::Object(from)) = (into.as_object_mut(), from) {
            into.extend(from);
        }
    }

    fn condition_json(type_: &str, status: &str, at: &str) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": "R", "message": "",
               "lastTransitionTime": at})
    }

    #[test]
    fn a_provisioned_cluster_reports_its_owner_condition_and_time_to_provision() {
        let made_by_a_job = cluster(
            "c",
            json!({
                "metadata": {"name": "c", "namespace": "team", "uid": "uid-c",
                             "creationTimestamp": "2026-01-01T00:00:00Z",
                             "labels": {"ray.io/originated-from-crd": "RayJob"}},
                "status": {"conditions": [condition_json(
                    "RayClusterProvisioned", "True", "2026-01-01T00:01:30Z")]},
            }),
        );
        assert_eq!(
            cluster_series(&made_by_a_job),
            ClusterSeries {
                info: ClusterInfoLabels {
                    object: labels("c"),
                    owner_kind: "RayJob".into()
                },
                provisioned: condition(&labels("c"), true),
                provisioned_duration: Some((labels("c"), 90.0)),
            }
        );
        let waiting = cluster(
            "w",
            json!({"status": {"conditions": [condition_json(
                "RayClusterProvisioned", "False", "2026-01-01T00:00:10Z")]}}),
        );
        let series = cluster_series(&waiting);
        assert_eq!(series.info.owner_kind, "None");
        assert_eq!(series.provisioned.condition, "false");
        assert_eq!(series.provisioned_duration, None);
        assert_eq!(
            cluster_series(&cluster("new", json!({})))
                .provisioned
                .condition,
            "false"
        );
    }

    #[test]
    fn a_finished_job_reports_its_run_time_and_the_failures_before_it() {
        let running = job(
            "r",
            json!({"jobDeploymentStatus": "Running", "startTime": "2026-01-01T00:00:00Z"}),
        );
        let series = job_series(&running);
        assert_eq!(series.deployment_status.deployment_status, "Running");
        assert_eq!(series.execution_duration, None);

        let failed_twice = job(
            "f",
            json!({"jobDeploymentStatus": "Failed", "failed": 2,
                   "startTime": "2026-01-01T00:00:00Z", "endTime": "2026-01-01T00:00:45Z"}),
        );
        let (execution, seconds) = job_series(&failed_twice)
            .execution_duration
            .expect("a terminal job has a duration");
        assert_eq!(
            (
                execution.job_deployment_status.as_str(),
                execution.retry_count,
                seconds
            ),
            ("Failed", 1, 45.0)
        );

        let completed_after_a_retry = job(
            "c",
            json!({"jobDeploymentStatus": "Complete", "failed": 1, "succeeded": 1,
                   "startTime": "2026-01-01T00:10:00Z", "endTime": "2026-01-01T00:10:05Z"}),
        );
        let (execution, seconds) = job_series(&completed_after_a_retry)
            .execution_duration
            .expect("a duration");
        assert_eq!(
            (
                execution.job_deployment_status.as_str(),
                execution.retry_count,
                seconds
            ),
            ("Complete", 1, 5.0)
        );

        let new = job_series(&job("n", json!(null)));
        assert_eq!(new.deployment_status.deployment_status, "");
        assert_eq!(new.info, labels("n"));
    }

    #[test]
    fn a_service_reports_ready_and_upgrade_conditions_as_true_or_false() {
        let upgrading = service(
            "s",
            json!([
                condition_json("Ready", "True", "2026-01-01T00:00:00Z"),
                condition_json("UpgradeInProgress", "True", "2026-01-01T00:00:00Z"),
            ]),
        );
        let series = service_series(&upgrading);
        assert_eq!(
            (series.ready.condition, series.upgrade_in_progress.condition),
            ("true", "true")
        );
        let new = service_series(&service("n", json!([])));
        assert_eq!(
            (new.ready.condition, new.upgrade_in_progress.condition),
            ("false", "false")
        );
    }

    #[test]
    fn the_collector_exposes_kuberays_names_and_labels_from_the_registered_caches() {
        let metrics =
            super::super::Metrics::with_options(super::super::MetricsOptions { kuberay: true });
        let (clusters, mut cluster_writer) = kube::runtime::reflector::store();
        let (jobs, mut job_writer) = kube::runtime::reflector::store();
        let (services, mut service_writer) = kube::runtime::reflector::store();
        cluster_writer.apply_watcher_event(&watcher::Event::Apply(cluster(
            "c",
            json!({"status": {"conditions": [condition_json(
                "RayClusterProvisioned", "True", "2026-01-01T00:00:30Z")]}}),
        )));
        job_writer.apply_watcher_event(&watcher::Event::Apply(job(
            "j",
            json!({"jobDeploymentStatus": "Complete", "failed": 0,
                   "startTime": "2026-01-01T00:00:00Z", "endTime": "2026-01-01T00:00:07Z"}),
        )));
        service_writer.apply_watcher_event(&watcher::Event::Apply(service("s", json!([]))));
        let registrations = (
            metrics.observe_rayclusters(clusters),
            metrics.observe_rayjobs(jobs),
            metrics.observe_rayservices(services),
        );
        let text = metrics.encode().expect("encodes");
        for expected in [
            "kuberay_cluster_info{name=\"c\",namespace=\"team\",uid=\"uid-c\",owner_kind=\"None\"} 1",
            "kuberay_cluster_condition_provisioned{name=\"c\",namespace=\"team\",uid=\"uid-c\",condition=\"true\"} 1",
            "kuberay_cluster_provisioned_duration_seconds{name=\"c\",namespace=\"team\",uid=\"uid-c\"} 30.0",
            "kuberay_job_info{name=\"j\",namespace=\"team\",uid=\"uid-j\"} 1",
            "kuberay_job_deployment_status{name=\"j\",namespace=\"team\",uid=\"uid-j\",deployment_status=\"Complete\"} 1",
            "kuberay_job_execution_duration_seconds{name=\"j\",namespace=\"team\",uid=\"uid-j\",job_deployment_status=\"Complete\",retry_count=\"0\"} 7.0",
            "kuberay_service_info{name=\"s\",namespace=\"team\",uid=\"uid-s\"} 1",
            "kuberay_service_condition_ready{name=\"s\",namespace=\"team\",uid=\"uid-s\",condition=\"false\"} 1",
            "kuberay_service_condition_upgrade_in_progress{name=\"s\",namespace=\"team\",uid=\"uid-s\",condition=\"false\"} 1",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        drop(registrations);
        let text = metrics.encode().expect("encodes");
        assert!(!text.contains("uid-c"), "{text}");
        assert!(text.contains("# TYPE kuberay_cluster_info gauge"), "{text}");
    }

    #[test]
    fn the_set_is_off_unless_asked_for() {
        let metrics = super::super::Metrics::new();
        let (clusters, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&watcher::Event::Apply(cluster("c", json!({}))));
        let _registration = metrics.observe_rayclusters(clusters);
        let text = metrics.encode().expect("encodes");
        assert!(!text.contains("kuberay_"), "{text}");
        assert!(!text.contains("controller_runtime_"), "{text}");
    }
}
