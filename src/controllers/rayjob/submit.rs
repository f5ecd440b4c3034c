//! The Running stage: where the Ray job is submitted (HTTP mode) and how its progress is
//! read: the dashboard (located through the configured locator, with the cluster's auth token
//! when it uses one) and the submitter (Job or head sidecar).

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use tracing::{info, warn};

use super::apply::{ensure_cluster, ensure_head_service};
use super::context::Context;
use super::error::{Error, kube_err};
use super::transitions::check_deadlines;
use super::{build, transitions};
use crate::api::RayCluster;
use crate::api::rayjob::{
    JobDeploymentStatus, JobFailedReason, JobStatus, JobSubmissionMode, RayJob, RayJobStatus,
    RayJobStatusInfo,
};
use crate::kuberay::keys::labels;
use crate::kuberay::names;
use crate::kuberay::spec::auth_enabled;
use crate::ray::{DashboardClientOptions, DashboardError, HeadService, RayDashboardClient};
use crate::validation::rayjob::RayJobValues;

/// `host:port` of the cluster's dashboard from its head Service (port named `dashboard`).
pub(super) async fn dashboard_url_of(
    job: &RayJob,
    ctx: &Context,
    cluster: &RayCluster,
) -> Result<String, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let service_name = names::head_service_name(&cluster.name_any(), &cluster.spec);
    let service = Api::<Service>::namespaced(ctx.client.clone(), &namespace)
        .get(&service_name)
        .await
        .map_err(kube_err(format!("reading head Service {service_name}")))?;
    let has_port = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .is_some_and(|ps| {
            ps.iter()
                .any(|p| p.name.as_deref() == Some(crate::ray::DASHBOARD_PORT_NAME))
        });
    if !has_port {
        return Err(Error::Invalid(format!(
            "head Service {service_name} has no port named dashboard"
        )));
    }
    let head = HeadService::from_service(&service)?;
    let _ = job;
    Ok(build::dashboard_url(
        &head.name,
        &head.namespace,
        &ctx.config.cluster_domain,
        head.dashboard_port,
    ))
}

/// A dashboard client for the URL in `status.dashboardURL`, located through the configured
/// locator (in cluster: the same DNS name; in tests: a Ray head on 127.0.0.1), with the
/// cluster's auth token when it uses token authentication.
pub(super) async fn dashboard(
    job: &RayJob,
    ctx: &Context,
    status: &RayJobStatus,
    cluster: Option<&RayCluster>,
) -> Result<RayDashboardClient, Error> {
    let url = status.dashboard_url.clone().unwrap_or_default();
    let (host, port) = url
        .rsplit_once(':')
        .ok_or_else(|| Error::Invalid(format!("status.dashboardURL {url:?} has no port")))?;
    let port: u16 = port
        .parse()
        .map_err(|_| Error::Invalid(format!("status.dashboardURL {url:?} has no valid port")))?;
    let mut parts = host.split('.');
    let service = parts.next().unwrap_or_default();
    let namespace = parts
        .next()
        .map(str::to_owned)
        .unwrap_or_else(|| job.namespace().unwrap_or_default());
    let located = ctx
        .config
        .locator
        .locate(&HeadService::new(namespace, service, port))?;
    let mut options = DashboardClientOptions {
        connect_timeout: ctx.config.dashboard_connect_timeout,
        request_timeout: ctx.config.dashboard_request_timeout,
        bearer_token: None,
    };
    if let Some(cluster) = cluster
        && auth_enabled(&cluster.spec)
    {
        let secret_name = cluster
            .spec
            .auth_options
            .as_ref()
            .and_then(|a| a.secret_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| names::auth_secret_name(&cluster.name_any()));
        let secret =
            Api::<Secret>::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default())
                .get(&secret_name)
                .await
                .map_err(kube_err(format!("reading auth Secret {secret_name}")))?;
        let token = secret
            .data
            .as_ref()
            .and_then(|d| d.get("auth_token"))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| Error::Invalid(format!("Secret {secret_name} has no auth_token key")))?;
        options.bearer_token = Some(crate::ray::BearerToken::new(token)?);
    }
    Ok(RayDashboardClient::new(located, options)?)
}

/// What the submitter (Job or head sidecar) says.
#[derive(Default)]
pub(super) struct Submitter {
    finished_at: Option<Time>,
    /// Set when it failed: a message for the status.
    failed: Option<String>,
}

pub(super) async fn submitter_state(
    job: &RayJob,
    values: &RayJobValues,
    ctx: &Context,
    cluster: &RayCluster,
) -> Result<Option<Submitter>, Error> {
    match values.mode {
        JobSubmissionMode::K8sJobMode => {
            let Some(submitter) = ctx
                .submitters(job)
                .get_opt(&job.name_any())
                .await
                .map_err(kube_err("reading the submitter Job"))?
            else {
                return Ok(Some(Submitter::default()));
            };
            let conditions = submitter
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default();
            let mut state = Submitter::default();
            for c in conditions.iter().filter(|c| c.status == "True") {
                match c.type_.as_str() {
                    "Failed" => {
                        state.finished_at = c.last_transition_time.clone();
                        state.failed = Some(format!(
                            "Job submission has failed. Reason: {}. Message: {}",
                            c.reason.clone().unwrap_or_default(),
                            c.message.clone().unwrap_or_default()
                        ));
                    }
                    "Complete" => state.finished_at = c.last_transition_time.clone(),
                    _ => {}
                }
            }
            Ok(Some(state))
        }
        JobSubmissionMode::SidecarMode => {
            let selector = format!(
                "{}={},{}={}",
                labels::CLUSTER,
                cluster.name_any(),
                labels::NODE_TYPE,
                labels::HEAD
            );
            let pods =
                Api::<Pod>::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default())
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(kube_err("listing the head Pod"))?;
            let Some(head) = pods.items.into_iter().next() else {
                return Ok(None);
            };
            let mut state = Submitter::default();
            let terminated = head
                .status
                .and_then(|s| s.container_statuses)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.name == build::SUBMITTER_CONTAINER)
                .and_then(|c| c.state)
                .and_then(|s| s.terminated);
            if let Some(t) = terminated {
                state.finished_at = t.finished_at;
                if t.exit_code != 0 {
                    state.failed = Some(format!(
                        "Ray head pod container {} terminated with exit code {}",
                        build::SUBMITTER_CONTAINER,
                        t.exit_code
                    ));
                }
            }
            Ok(Some(state))
        }
        _ => Ok(Some(Submitter::default())),
    }
}

pub(super) async fn running(
    job: &RayJob,
    values: &RayJobValues,
    ctx: &Context,
    status: &mut RayJobStatus,
    now: &Time,
) -> Result<Action, Error> {
    let requeue = Action::requeue(ctx.config.requeue);
    if settled_before_cluster(job, ctx, status, now) {
        return Ok(requeue);
    }

    // The cluster comes back if it vanished (selected clusters must exist).
    let cluster = ensure_cluster(job, values, ctx, status).await?;
    status.ray_cluster_status = cluster.status.clone();
    ensure_head_service(job, ctx, &cluster).await?;

    let mode = values.mode;
    let Some(submitter) = submitter_state(job, values, ctx, &cluster).await? else {
        transitions::fail(
            status,
            JobFailedReason::AppFailed,
            "Ray head pod not found.",
        );
        return Ok(requeue);
    };
    if settled_by_submitter(ctx, status, &submitter, now) {
        return Ok(requeue);
    }
    let submitter_done = matches!(
        mode,
        JobSubmissionMode::HttpMode | JobSubmissionMode::InteractiveMode
    ) || submitter.finished_at.is_some();

    let Some(job_id) = status.job_id.clone() else {
        return Ok(requeue);
    };
    let client = dashboard(job, ctx, status, Some(&cluster)).await?;
    let progress = RayJobProgress {
        job_id: &job_id,
        submitter_finished: submitter.finished_at.is_some(),
        submitter_done,
    };
    follow_ray_job(job, values, status, &client, &progress, now).await;
    Ok(requeue)
}

/// Settles the status without touching the cluster when the RayJob is suspended, past a
/// deadline, stuck Running after its Ray job ended, or blind for too long. Pure; true when
/// the pass ends here.
fn settled_before_cluster(
    job: &RayJob,
    ctx: &Context,
    status: &mut RayJobStatus,
    now: &Time,
) -> bool {
    if job.spec.suspend == Some(true) {
        status.job_deployment_status = Some(JobDeploymentStatus::Suspending);
        return true;
    }
    if check_deadlines(job, status, now, false) {
        return true;
    }
    if status.job_status.is_some_and(JobStatus::is_terminal)
        && transitions::passed(
            status
                .ray_job_info
                .as_ref()
                .and_then(|i| i.end_time.as_ref()),
            ctx.config.transition_grace_period.as_secs() as i64,
            now,
        )
    {
        let failed = status.job_status == Some(JobStatus::Failed);
        status.job_deployment_status = Some(if failed {
            JobDeploymentStatus::Failed
        } else {
            JobDeploymentStatus::Complete
        });
        status.reason = Some(JobFailedReason::JobDeploymentStatusTransitionGracePeriodExceeded);
        status.message = Some("The RayJob stayed Running long after its Ray job ended.".into());
        return true;
    }
    if transitions::passed(
        status.job_status_check_failure_start_time.as_ref(),
        ctx.config.status_check_timeout.as_secs() as i64,
        now,
    ) {
        transitions::fail(
            status,
            JobFailedReason::JobStatusCheckTimeoutExceeded,
            "The Ray job status could not be read from the dashboard for too long.",
        );
        return true;
    }
    false
}

/// Fails the RayJob when its submitter failed, or finished long ago while the Ray job did
/// not. Pure; true when the pass ends here.
fn settled_by_submitter(
    ctx: &Context,
    status: &mut RayJobStatus,
    submitter: &Submitter,
    now: &Time,
) -> bool {
    if let Some(message) = &submitter.failed {
        let reason = if status.job_status == Some(JobStatus::Failed) {
            JobFailedReason::AppFailed
        } else {
            JobFailedReason::SubmissionFailed
        };
        transitions::fail(status, reason, message.clone());
        return true;
    }
    if let Some(finished) = &submitter.finished_at
        && transitions::passed(
            Some(finished),
            ctx.config.submitter_finished_timeout.as_secs() as i64,
            now,
        )
        && !status.job_status.is_some_and(JobStatus::is_terminal)
    {
        status.job_status = Some(JobStatus::Failed);
        transitions::fail(
            status,
            JobFailedReason::JobDeploymentStatusTransitionGracePeriodExceeded,
            "The submitter finished over 30 seconds ago but the Ray job is not finished.",
        );
        return true;
    }
    false
}

/// What the dashboard poll needs to know about the Ray job and its submitter.
struct RayJobProgress<'a> {
    job_id: &'a str,
    /// The submitter (Job or sidecar) has finished.
    submitter_finished: bool,
    /// Nothing more to wait for from the submitter (HTTP and interactive modes have none).
    submitter_done: bool,
}

/// Reads the Ray job from the dashboard into the status; submits it (HTTP mode) when the
/// dashboard does not know it yet. A failed read starts the status-check timeout.
async fn follow_ray_job(
    job: &RayJob,
    values: &RayJobValues,
    status: &mut RayJobStatus,
    client: &RayDashboardClient,
    progress: &RayJobProgress<'_>,
    now: &Time,
) {
    match client.get_job(progress.job_id).await {
        Ok(details) => record_ray_job(status, &details, progress.submitter_done),
        Err(e) if e.is_not_found() => match values.mode {
            JobSubmissionMode::HttpMode => {
                let request = build::submit_request(job, values, progress.job_id);
                match client.submit_job(&request).await {
                    Ok(id) => info!(job_id = %id, "submitted the Ray job"),
                    Err(DashboardError::JobAlreadyExists { .. }) => {}
                    Err(e) => {
                        warn!(error = %e, "submitting the Ray job failed");
                        status
                            .job_status_check_failure_start_time
                            .get_or_insert_with(|| now.clone());
                    }
                }
            }
            _ if progress.submitter_finished => {
                transitions::fail(
                    status,
                    JobFailedReason::AppFailed,
                    "Submitter completed but Ray job not found in RayCluster.",
                );
            }
            _ => {}
        },
        Err(e) => {
            warn!(error = %e, "reading the Ray job status failed");
            status
                .job_status_check_failure_start_time
                .get_or_insert_with(|| now.clone());
        }
    }
}

/// The Ray job as the dashboard reports it; a terminal one ends the RayJob once the
/// submitter is done. Pure.
fn record_ray_job(
    status: &mut RayJobStatus,
    details: &crate::ray::JobDetails,
    submitter_done: bool,
) {
    status.job_status_check_failure_start_time = None;
    let ray_status = details
        .status
        .as_ref()
        .and_then(|s| serde_json::from_value::<JobStatus>(serde_json::to_value(s).ok()?).ok());
    status.job_status = ray_status;
    status.message = details.message.clone();
    status.ray_job_info = Some(RayJobStatusInfo {
        start_time: details.start_time.and_then(transitions::from_millis),
        end_time: details.end_time.and_then(transitions::from_millis),
    });
    if let Some(s) = ray_status.filter(|s| s.is_terminal())
        && submitter_done
    {
        if s == JobStatus::Failed {
            status.job_deployment_status = Some(JobDeploymentStatus::Failed);
            status.reason = Some(JobFailedReason::AppFailed);
        } else {
            status.job_deployment_status = Some(JobDeploymentStatus::Complete);
        }
    }
}
