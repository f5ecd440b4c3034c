//! `ray.io/v1` RayCronJob, field for field the API that KubeRay v1.7 serves: a RayJob created on
//! a cron schedule.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::rayjob::RayJobSpec;

/// A RayJob created at every tick of a cron schedule.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "ray.io",
    version = "v1",
    kind = "RayCronJob",
    doc = "A RayJob created on a cron schedule (KubeRay ray.io/v1 API).",
    namespaced,
    status = "RayCronJobStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "all",
    printcolumn = r#"{"name":"schedule","type":"string","jsonPath":".spec.schedule"}"#,
    printcolumn = r#"{"name":"timezone","type":"string","jsonPath":".spec.timeZone"}"#,
    printcolumn = r#"{"name":"last schedule","type":"date","jsonPath":".status.lastScheduleTime"}"#,
    printcolumn = r#"{"name":"age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"suspend","type":"boolean","jsonPath":".spec.suspend"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RayCronJobSpec {
    /// Spec of each RayJob created.
    pub job_template: RayJobSpec,
    /// Standard five-field cron schedule.
    pub schedule: String,
    /// IANA time zone of the schedule (default: the operator's local zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub time_zone: Option<String>,
    /// Stops creating RayJobs; those already created are not touched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// raypipe extension (not in KubeRay; batch/v1 CronJob's meaning): what a tick does while an
    /// earlier RayJob is still active. `Allow` (default, KubeRay's behaviour) starts another,
    /// `Forbid` skips the tick, `Replace` deletes the active RayJobs first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::enum_schema::<ConcurrencyPolicy>")]
    pub concurrency_policy: Option<ConcurrencyPolicy>,
    /// raypipe extension: finished RayJobs that completed to keep (default: all, as KubeRay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub successful_jobs_history_limit: Option<i32>,
    /// raypipe extension: finished RayJobs that failed to keep (default: all, as KubeRay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub failed_jobs_history_limit: Option<i32>,
}

/// What a tick does while RayJobs of earlier ticks are still active.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum ConcurrencyPolicy {
    /// Start the new RayJob anyway.
    #[default]
    Allow,
    /// Skip the tick.
    Forbid,
    /// Delete the active RayJobs, then start the new one.
    Replace,
}

/// Observed state of a RayCronJob.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayCronJobStatus {
    /// The last tick a RayJob was created for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// raypipe extension: the RayJobs of this RayCronJob that have not finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub active: Option<Vec<ObjectReference>>,
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;
    use serde_json::json;

    use super::*;
    use crate::api::test_support::*;

    #[test]
    fn every_raycronjob_sample_round_trips_exactly() {
        let (kuberay, own) = assert_samples_round_trip::<RayCronJob>("RayCronJob");
        assert!(
            kuberay >= 1,
            "expected KubeRay's RayCronJob sample, found {kuberay}"
        );
        assert!(own >= 1);
    }

    #[test]
    fn kuberay_sample_reads_as_expected() {
        let (_, doc) = ray_objects(&kuberay_samples_dir(), "RayCronJob")
            .into_iter()
            .next()
            .expect("a RayCronJob sample");
        let cron: RayCronJob = serde_json::from_value(doc).expect("RayCronJob");
        assert_eq!(cron.spec.schedule, "* * * * *");
        assert_eq!(cron.spec.job_template.ttl_seconds_after_finished, Some(600));
        assert!(cron.spec.job_template.ray_cluster_spec.is_some());
    }

    #[test]
    fn status_round_trips() {
        let status = json!({"lastScheduleTime": "2026-01-02T03:04:00Z"});
        let typed: RayCronJobStatus = assert_round_trip("RayCronJob status", &status);
        assert!(typed.last_schedule_time.is_some());
    }

    #[test]
    fn crd_matches_kuberay() {
        let crd = RayCronJob::crd();
        assert_crd_shape(
            &crd,
            "raycronjobs",
            &[
                ("schedule", "string", ".spec.schedule", 0),
                ("timezone", "string", ".spec.timeZone", 0),
                ("last schedule", "date", ".status.lastScheduleTime", 0),
                ("age", "date", ".metadata.creationTimestamp", 0),
                ("suspend", "boolean", ".spec.suspend", 0),
            ],
        );
        assert_installable_size(&crd);
        let schema = schema_json(&crd);
        assert_structural(&schema, "");
        let spec = schema_at(&schema, "spec");
        assert_eq!(spec["required"], json!(["jobTemplate", "schedule"]));
        assert_eq!(schema_at(spec, "timeZone")["minLength"], 1);
        assert_eq!(
            schema_at(spec, "jobTemplate.submissionMode")["default"],
            "K8sJobMode"
        );
        assert_eq!(
            schema_at(spec, "jobTemplate.deletionStrategy")["x-kubernetes-validations"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
    }
}
