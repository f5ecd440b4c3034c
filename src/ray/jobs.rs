//! The Jobs part of the dashboard API (Jobs REST API revision 4): submission request and the
//! job details Ray reports. Response fields are all optional; unknown ones are ignored.

use std::collections::BTreeMap;

use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};

use super::client::RayDashboardClient;
use super::error::{DashboardError, JOB_EXISTS_MARKER};
use super::lenient::{self, ray_enum};

ray_enum! {
    /// Status of a submitted job.
    JobStatus {
        /// Waiting for resources or for its runtime_env to be set up.
        Pending = "PENDING",
        Running = "RUNNING",
        Stopped = "STOPPED",
        Succeeded = "SUCCEEDED",
        Failed = "FAILED",
    }
}

impl JobStatus {
    /// The job will not change any more (and may be deleted).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            JobStatus::Stopped | JobStatus::Succeeded | JobStatus::Failed
        )
    }
}

/// Body of `POST /api/jobs/`. Unset fields are left out (Ray rejects unknown fields, and
/// treats absent ones as unset).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSubmitRequest {
    /// Shell command run on the head.
    pub entrypoint: String,
    /// Choose it (deterministically) so a retried submission is recognised: Ray answers
    /// [`DashboardError::JobAlreadyExists`](super::DashboardError::JobAlreadyExists) for a taken id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub submission_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_env: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint_num_cpus: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint_num_gpus: Option<f64>,
    /// Bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint_memory: Option<u64>,
    /// Custom resources only: `CPU`/`GPU` here make the job fail after a successful submit;
    /// use `entrypoint_num_cpus`/`entrypoint_num_gpus`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint_resources: Option<BTreeMap<String, f64>>,
}

impl JobSubmitRequest {
    pub fn new(entrypoint: impl Into<String>) -> JobSubmitRequest {
        JobSubmitRequest {
            entrypoint: entrypoint.into(),
            ..Default::default()
        }
    }

    pub fn with_submission_id(mut self, submission_id: impl Into<String>) -> JobSubmitRequest {
        self.submission_id = Some(submission_id.into());
        self
    }
}

/// Answer to `POST /api/jobs/`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct JobSubmitResponse {
    #[serde(deserialize_with = "lenient::option")]
    pub submission_id: Option<String>,
    /// Deprecated alias of `submission_id`, sent by every Ray that has it.
    #[serde(deserialize_with = "lenient::option")]
    pub job_id: Option<String>,
}

/// `GET /api/jobs/{id}` (and the elements of `GET /api/jobs/`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobDetails {
    /// `SUBMISSION` or `DRIVER` (a driver that connected to Ray directly, not through the API).
    #[serde(rename = "type", deserialize_with = "lenient::option")]
    pub job_type: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub submission_id: Option<String>,
    /// Ray's core job id (hex); `None` unless the entrypoint actually connected to Ray.
    #[serde(deserialize_with = "lenient::option")]
    pub job_id: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub status: Option<JobStatus>,
    #[serde(deserialize_with = "lenient::option")]
    pub entrypoint: Option<String>,
    /// Human-readable status explanation, e.g. "Job finished successfully.".
    #[serde(deserialize_with = "lenient::option")]
    pub message: Option<String>,
    /// E.g. `JOB_ENTRYPOINT_COMMAND_ERROR`, `RUNTIME_ENV_SETUP_FAILURE`.
    #[serde(deserialize_with = "lenient::option")]
    pub error_type: Option<String>,
    /// Unix milliseconds.
    #[serde(deserialize_with = "lenient::option")]
    pub start_time: Option<u64>,
    /// Unix milliseconds.
    #[serde(deserialize_with = "lenient::option")]
    pub end_time: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(deserialize_with = "lenient::option")]
    pub runtime_env: Option<serde_json::Value>,
    #[serde(deserialize_with = "lenient::option")]
    pub driver_exit_code: Option<i64>,
}

/// Answer to `POST /api/jobs/{id}/stop`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct JobStopResponse {
    #[serde(deserialize_with = "lenient::option")]
    pub stopped: Option<bool>,
}

/// Answer to `DELETE /api/jobs/{id}`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct JobDeleteResponse {
    #[serde(deserialize_with = "lenient::option")]
    pub deleted: Option<bool>,
}

/// Answer to `GET /api/jobs/{id}/logs`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct JobLogsResponse {
    #[serde(deserialize_with = "lenient::option")]
    pub logs: Option<String>,
}

/// The Jobs API calls (`/api/jobs/`).
impl RayDashboardClient {
    pub async fn submit_job(&self, request: &JobSubmitRequest) -> Result<String, DashboardError> {
        if request.entrypoint.trim().is_empty() {
            return Err(DashboardError::InvalidRequest {
                problem: "a job needs a non-empty entrypoint".to_owned(),
            });
        }
        if let Some(id) = &request.submission_id {
            check_job_id(id)?;
        }
        let body = serde_json::to_vec(request).map_err(|e| DashboardError::InvalidRequest {
            problem: e.to_string(),
        })?;
        let answer = self
            .call(Method::POST, &["api", "jobs", ""], None, Some(body))
            .await?;
        // Ray reports a taken submission id as a 500 with a traceback; recognise it so a
        // controller retrying its own submission can treat it as done.
        if answer.status == StatusCode::INTERNAL_SERVER_ERROR
            && String::from_utf8_lossy(&answer.body).contains(JOB_EXISTS_MARKER)
        {
            return Err(DashboardError::JobAlreadyExists {
                endpoint: answer.endpoint,
                submission_id: request.submission_id.clone().unwrap_or_default(),
            });
        }
        answer
            .into_success()?
            .decode_field("submission_id", |response: JobSubmitResponse| {
                response.submission_id.or(response.job_id)
            })
    }

    pub async fn get_job(&self, job_id: &str) -> Result<JobDetails, DashboardError> {
        check_job_id(job_id)?;
        self.call(Method::GET, &["api", "jobs", job_id], None, None)
            .await?
            .into_success()?
            .decode()
    }

    pub async fn list_jobs(&self) -> Result<Vec<JobDetails>, DashboardError> {
        let answer = self
            .call(Method::GET, &["api", "jobs", ""], None, None)
            .await?
            .into_success()?;
        let items: Vec<serde_json::Value> = answer.decode()?;
        // One odd entry (a driver job of another shape) must not hide the others.
        Ok(items
            .into_iter()
            .filter_map(|item| serde_json::from_value(item).ok())
            .collect())
    }

    pub async fn get_job_logs(&self, job_id: &str) -> Result<String, DashboardError> {
        check_job_id(job_id)?;
        self.call(Method::GET, &["api", "jobs", job_id, "logs"], None, None)
            .await?
            .into_success()?
            .decode_field("logs", |response: JobLogsResponse| response.logs)
    }

    pub async fn stop_job(&self, job_id: &str) -> Result<bool, DashboardError> {
        check_job_id(job_id)?;
        self.call(Method::POST, &["api", "jobs", job_id, "stop"], None, None)
            .await?
            .into_success()?
            .decode_field("stopped", |response: JobStopResponse| response.stopped)
    }

    pub async fn delete_job(&self, job_id: &str) -> Result<bool, DashboardError> {
        check_job_id(job_id)?;
        self.call(Method::DELETE, &["api", "jobs", job_id], None, None)
            .await?
            .into_success()?
            .decode_field("deleted", |response: JobDeleteResponse| response.deleted)
    }
}

/// An empty id would turn `GET /api/jobs/{id}` into the list endpoint.
fn check_job_id(job_id: &str) -> Result<(), DashboardError> {
    if job_id.trim().is_empty() {
        return Err(DashboardError::InvalidRequest {
            problem: "the job id is empty".to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn submit_requests_leave_unset_fields_out() {
        let request =
            JobSubmitRequest::new("python -c \"print('hello')\"").with_submission_id("rp-1");
        assert_eq!(
            serde_json::to_value(&request).expect("serialises"),
            json!({"entrypoint": "python -c \"print('hello')\"", "submission_id": "rp-1"})
        );
    }

    #[test]
    fn reads_observed_job_details() {
        let details: JobDetails = serde_json::from_str(
            r#"{"type": "SUBMISSION", "job_id": null, "submission_id": "t1", "driver_info": null, "status": "SUCCEEDED",
                "entrypoint": "python -c \"print(123)\"", "message": "Job finished successfully.", "error_type": null,
                "start_time": 1795319345693, "end_time": 1795319347234, "metadata": null, "runtime_env": null,
                "driver_agent_http_address": "http://127.0.0.1:40001", "driver_node_id": "1acb", "driver_exit_code": 0}"#,
        )
        .expect("decodes");
        assert_eq!(details.job_type.as_deref(), Some("SUBMISSION"));
        assert_eq!(details.submission_id.as_deref(), Some("t1"));
        assert_eq!(details.job_id, None);
        assert!(details.status.as_ref().is_some_and(JobStatus::is_terminal));
        assert_eq!(details.end_time, Some(1_795_319_347_234));
        assert_eq!(details.driver_exit_code, Some(0));
    }

    #[test]
    fn only_stopped_succeeded_and_failed_are_terminal() {
        assert!(!JobStatus::Pending.is_terminal());
        assert!(!JobStatus::Running.is_terminal());
        assert!(!JobStatus::Other("SUSPENDED".into()).is_terminal());
        assert!(JobStatus::Stopped.is_terminal() && JobStatus::Failed.is_terminal());
    }
}
