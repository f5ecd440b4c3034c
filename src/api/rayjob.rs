//! `ray.io/v1` RayJob, field for field the API that KubeRay v1.7 serves: a Ray job submitted to a
//! RayCluster that the RayJob creates (or selects), with retries, deadlines and cleanup.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::raycluster::{RayClusterSpec, RayClusterStatus};
use super::schema::{enum_schema, k8s_object_schema, managed_by_schema};

/// A Ray job and the RayCluster it runs on.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "ray.io",
    version = "v1",
    kind = "RayJob",
    doc = "A Ray job and the cluster it runs on (KubeRay ray.io/v1 API).",
    namespaced,
    status = "RayJobStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "all",
    printcolumn = r#"{"name":"job status","type":"string","jsonPath":".status.jobStatus"}"#,
    printcolumn = r#"{"name":"deployment status","type":"string","jsonPath":".status.jobDeploymentStatus"}"#,
    printcolumn = r#"{"name":"ray cluster name","type":"string","jsonPath":".status.rayClusterName"}"#,
    printcolumn = r#"{"name":"start time","type":"string","jsonPath":".status.startTime"}"#,
    printcolumn = r#"{"name":"end time","type":"string","jsonPath":".status.endTime"}"#,
    printcolumn = r#"{"name":"age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RayJobSpec {
    /// Seconds the RayJob may be active before it is failed with `DeadlineExceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i32>,
    /// Retries before the RayJob fails; each retry runs on a new RayCluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub backoff_limit: Option<i32>,
    /// The RayCluster created for the job (unless `clusterSelector` picks an existing one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_cluster_spec: Option<RayClusterSpec>,
    /// Pod template of the submitter (K8sJobMode); its first container runs `ray job submit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "k8s_object_schema::<PodTemplateSpec>")]
    pub submitter_pod_template: Option<PodTemplateSpec>,
    /// Job metadata passed to Ray.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Labels of an existing RayCluster to run on (key `ray.io/cluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitter_config: Option<SubmitterConfig>,
    /// Who reconciles this object: `ray.io/kuberay-operator` (also when unset) or
    /// `kueue.x-k8s.io/multikueue`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "managed_by_schema")]
    pub managed_by: Option<String>,
    /// Cleanup once the job is finished: legacy onSuccess/onFailure or deletionRules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_strategy: Option<DeletionStrategy>,
    /// The command that runs the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<String>,
    /// Ray runtime environment as a YAML string.
    #[serde(
        default,
        rename = "runtimeEnvYAML",
        skip_serializing_if = "Option::is_none"
    )]
    pub runtime_env_yaml: Option<String>,
    /// Ray job submission id (default: generated). InteractiveMode waits for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// How the job is submitted: `K8sJobMode`, `HTTPMode`, `InteractiveMode` or `SidecarMode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "K8sJobMode"))]
    #[schemars(schema_with = "enum_schema::<JobSubmissionMode>")]
    pub submission_mode: Option<JobSubmissionMode>,
    /// Custom Ray resources reserved for the entrypoint, as a JSON object string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint_resources: Option<String>,
    /// CPUs reserved for the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint_num_cpus: Option<f64>,
    /// GPUs reserved for the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint_num_gpus: Option<f64>,
    /// Seconds after the job finishes before the cluster is deleted (needs shutdownAfterJobFinishes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// Seconds from start to reach Running before the RayJob fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub pre_running_deadline_seconds: Option<i32>,
    /// Deletes the RayCluster once the job finishes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_after_job_finishes: Option<bool>,
    /// While true no RayCluster exists; a running one is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
}

/// How the job is submitted to the cluster.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum JobSubmissionMode {
    /// A Kubernetes Job runs `ray job submit`.
    K8sJobMode,
    /// The operator submits through the dashboard's HTTP API.
    #[serde(rename = "HTTPMode")]
    HttpMode,
    /// The user submits and then sets `spec.jobId`.
    InteractiveMode,
    /// A container in the head Pod submits.
    SidecarMode,
}

/// Settings of the submitter.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SubmitterConfig {
    /// Retries of the submitter Job (default 2), or container restarts in SidecarMode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_limit: Option<i32>,
}

/// Cleanup after the job ends: both `onSuccess` and `onFailure` (legacy), or `deletionRules`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!((has(self.onSuccess) || has(self.onFailure)) && has(self.deletionRules))",
        "message": "legacy policies (onSuccess/onFailure) and deletionRules cannot be used together within the same deletionStrategy"
    },
    {
        "rule": "((has(self.onSuccess) && has(self.onFailure)) || has(self.deletionRules))",
        "message": "deletionStrategy requires either BOTH onSuccess and onFailure, OR the deletionRules field (cannot be empty)"
    }
]))]
pub struct DeletionStrategy {
    /// Deprecated: use deletionRules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_success: Option<DeletionPolicy>,
    /// Deprecated: use deletionRules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<DeletionPolicy>,
    /// Staged cleanup; when several are overdue the most destructive runs first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minItems" = 1, "x-kubernetes-list-type" = "atomic"))]
    pub deletion_rules: Option<Vec<DeletionRule>>,
}

/// One cleanup step and when it happens.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeletionRule {
    /// What to delete.
    #[schemars(schema_with = "enum_schema::<DeletionPolicyType>")]
    pub policy: DeletionPolicyType,
    pub condition: DeletionCondition,
}

/// When a deletion rule fires: exactly one of `jobStatus` and `jobDeploymentStatus`, plus a delay.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!(has(self.jobStatus) && has(self.jobDeploymentStatus))",
        "message": "JobStatus and JobDeploymentStatus cannot be used together within the same deletion condition."
    },
    {
        "rule": "has(self.jobStatus) || has(self.jobDeploymentStatus)",
        "message": "the deletion condition requires either the JobStatus or the JobDeploymentStatus field."
    }
]))]
pub struct DeletionCondition {
    /// `SUCCEEDED` or `FAILED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "deletion_job_status_schema")]
    pub job_status: Option<JobStatus>,
    /// `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "deletion_job_deployment_status_schema")]
    pub job_deployment_status: Option<JobDeploymentStatus>,
    /// Seconds after the status is reached before the rule fires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0), extend("default" = 0))]
    pub ttl_seconds: Option<i32>,
}

fn deletion_job_status_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "enum": ["SUCCEEDED", "FAILED"]})
}

fn deletion_job_deployment_status_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "enum": ["Failed"]})
}

/// Legacy single-step cleanup policy.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeletionPolicy {
    /// What to delete (required in a legacy policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<DeletionPolicyType>")]
    pub policy: Option<DeletionPolicyType>,
}

/// What a deletion rule deletes.
#[derive(
    Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub enum DeletionPolicyType {
    /// The RayCluster.
    DeleteCluster,
    /// The worker Pods (worker groups are suspended).
    DeleteWorkers,
    /// The RayJob itself, and with it everything it owns.
    DeleteSelf,
    /// Nothing.
    DeleteNone,
}

/// Status of the Ray job, as Ray reports it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobStatus {
    Pending,
    Running,
    Stopped,
    Succeeded,
    Failed,
}

impl JobStatus {
    /// STOPPED, SUCCEEDED and FAILED are final (Ray's `is_terminal`).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Stopped | JobStatus::Succeeded | JobStatus::Failed
        )
    }
}

/// Lifecycle of the RayJob: cluster, submission and cleanup.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum JobDeploymentStatus {
    Initializing,
    Running,
    Complete,
    Failed,
    ValidationFailed,
    Suspending,
    Suspended,
    Retrying,
    Waiting,
}

impl JobDeploymentStatus {
    /// Complete and Failed are final.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobDeploymentStatus::Complete | JobDeploymentStatus::Failed
        )
    }
}

/// Why a RayJob failed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum JobFailedReason {
    SubmissionFailed,
    DeadlineExceeded,
    PreRunningDeadlineExceeded,
    AppFailed,
    JobDeploymentStatusTransitionGracePeriodExceeded,
    JobStatusCheckTimeoutExceeded,
    ValidationFailed,
}

/// Start and end of the Ray job, as the dashboard reports them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayJobStatusInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,
}

/// Observed state of a RayJob.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayJobStatus {
    /// Start and end of the Ray job, from the dashboard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_job_info: Option<RayJobStatusInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_cluster_name: Option<String>,
    /// `host:port` of the dashboard, without scheme.
    #[serde(
        default,
        rename = "dashboardURL",
        skip_serializing_if = "Option::is_none"
    )]
    pub dashboard_url: Option<String>,
    /// Status of the Ray job, as Ray reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<JobStatus>")]
    pub job_status: Option<JobStatus>,
    /// Lifecycle of the RayJob (unset: new).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<JobDeploymentStatus>")]
    pub job_deployment_status: Option<JobDeploymentStatus>,
    /// Why the RayJob failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "enum_schema::<JobFailedReason>")]
    pub reason: Option<JobFailedReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the deployment status left New for Initializing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the deployment status became Complete or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,
    /// Number of successful runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub succeeded: Option<i32>,
    /// Number of failed runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0))]
    pub failed: Option<i32>,
    /// Copy of the status of the RayCluster running the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_cluster_status: Option<RayClusterStatus>,
    /// Since when job status checks through the dashboard have been failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_status_check_failure_start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;
    use serde_json::json;

    use super::*;
    use crate::api::test_support::*;

    #[test]
    fn every_rayjob_sample_round_trips_exactly() {
        let (kuberay, own) = assert_samples_round_trip::<RayJob>("RayJob");
        assert!(
            kuberay >= 2,
            "expected KubeRay's two RayJob samples, found {kuberay}"
        );
        assert!(own >= 1);
    }

    #[test]
    fn kuberay_shutdown_sample_reads_as_expected() {
        let (_, doc) = ray_objects(&kuberay_samples_dir(), "RayJob")
            .into_iter()
            .find(|(file, _)| file == "ray-job.shutdown.yaml")
            .expect("ray-job.shutdown.yaml holds a RayJob");
        let job: RayJob = serde_json::from_value(doc).expect("RayJob");
        assert_eq!(job.spec.shutdown_after_job_finishes, Some(true));
        assert_eq!(job.spec.ttl_seconds_after_finished, Some(10));
        assert!(
            job.spec
                .runtime_env_yaml
                .as_deref()
                .is_some_and(|y| y.contains("requests==2.26.0"))
        );
        assert_eq!(
            job.spec.submission_mode, None,
            "the default is left to the API server"
        );
    }

    #[test]
    fn status_written_by_kuberay_round_trips() {
        let status = json!({
            "rayJobInfo": {"startTime": "2026-01-02T03:04:10Z"},
            "jobId": "rayjob-sample-x8k2q",
            "rayClusterName": "rayjob-sample-4mfd2",
            "dashboardURL": "rayjob-sample-4mfd2-head-svc.default.svc.cluster.local:8265",
            "jobStatus": "RUNNING",
            "jobDeploymentStatus": "Running",
            "startTime": "2026-01-02T03:04:05Z",
            "succeeded": 0,
            "failed": 0,
            "rayClusterStatus": {"state": "ready", "desiredCPU": "2", "head": {"podIP": "10.0.0.7"}},
            "observedGeneration": 1
        });
        let typed: RayJobStatus = assert_round_trip("RayJob status", &status);
        assert_eq!(typed.job_status, Some(JobStatus::Running));
        assert_eq!(
            typed.job_deployment_status,
            Some(JobDeploymentStatus::Running)
        );

        let failed = json!({"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "reason": "AppFailed", "message": "boom", "failed": 1});
        let typed: RayJobStatus = assert_round_trip("failed RayJob status", &failed);
        assert_eq!(typed.reason, Some(JobFailedReason::AppFailed));
        assert!(typed.job_status.is_some_and(JobStatus::is_terminal));
        assert!(
            typed
                .job_deployment_status
                .is_some_and(JobDeploymentStatus::is_terminal)
        );
    }

    #[test]
    fn enums_use_kuberays_strings() {
        let values = json!([
            JobSubmissionMode::K8sJobMode,
            JobSubmissionMode::HttpMode,
            JobSubmissionMode::InteractiveMode,
            JobSubmissionMode::SidecarMode,
            DeletionPolicyType::DeleteWorkers,
            JobStatus::Succeeded,
            JobDeploymentStatus::ValidationFailed,
            JobFailedReason::JobDeploymentStatusTransitionGracePeriodExceeded,
        ]);
        assert_eq!(
            values,
            json!([
                "K8sJobMode",
                "HTTPMode",
                "InteractiveMode",
                "SidecarMode",
                "DeleteWorkers",
                "SUCCEEDED",
                "ValidationFailed",
                "JobDeploymentStatusTransitionGracePeriodExceeded"
            ])
        );
    }

    #[test]
    fn crd_matches_kuberay() {
        let crd = RayJob::crd();
        assert_crd_shape(
            &crd,
            "rayjobs",
            &[
                ("job status", "string", ".status.jobStatus", 0),
                (
                    "deployment status",
                    "string",
                    ".status.jobDeploymentStatus",
                    0,
                ),
                ("ray cluster name", "string", ".status.rayClusterName", 0),
                ("start time", "string", ".status.startTime", 0),
                ("end time", "string", ".status.endTime", 0),
                ("age", "date", ".metadata.creationTimestamp", 0),
            ],
        );
        assert_installable_size(&crd);
        let schema = schema_json(&crd);
        assert_structural(&schema, "");
    }

    #[test]
    fn crd_schema_has_kuberays_defaults_enums_and_rules() {
        let schema = schema_json(&RayJob::crd());
        let spec = schema_at(&schema, "spec");
        assert_eq!(schema_at(spec, "submissionMode")["default"], "K8sJobMode");
        assert_eq!(
            schema_at(spec, "submissionMode")["enum"],
            json!(["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"])
        );
        assert_eq!(schema_at(spec, "backoffLimit")["default"], 0);
        assert_eq!(schema_at(spec, "ttlSecondsAfterFinished")["default"], 0);
        assert_eq!(schema_at(spec, "preRunningDeadlineSeconds")["minimum"], 1.0);
        assert_eq!(
            schema_at(spec, "managedBy")["x-kubernetes-validations"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        assert_eq!(
            schema_at(spec, "rayClusterSpec.managedBy")["x-kubernetes-validations"][0]["rule"],
            "self == oldSelf"
        );

        let strategy = schema_at(spec, "deletionStrategy");
        assert_eq!(
            strategy["x-kubernetes-validations"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        let rules = schema_at(strategy, "deletionRules");
        assert_eq!(
            (
                rules["minItems"].clone(),
                rules["x-kubernetes-list-type"].clone()
            ),
            (json!(1), json!("atomic"))
        );
        let rule = schema_at(rules, "[]");
        assert_eq!(rule["required"], json!(["condition", "policy"]));
        assert_eq!(
            schema_at(rule, "policy")["enum"],
            json!(["DeleteCluster", "DeleteWorkers", "DeleteSelf", "DeleteNone"])
        );
        let condition = schema_at(rule, "condition");
        assert_eq!(
            condition["x-kubernetes-validations"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        assert_eq!(
            schema_at(condition, "jobStatus")["enum"],
            json!(["SUCCEEDED", "FAILED"])
        );
        assert_eq!(
            schema_at(condition, "jobDeploymentStatus")["enum"],
            json!(["Failed"])
        );
        let ttl = schema_at(condition, "ttlSeconds");
        assert_eq!(
            (ttl["minimum"].clone(), ttl["default"].clone()),
            (json!(0.0), json!(0))
        );
        assert_eq!(schema_at(&schema, "status.succeeded")["default"], 0);
    }
}
