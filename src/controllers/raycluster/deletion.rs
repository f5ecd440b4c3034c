//! The deletion of a GCS fault-tolerant cluster: its Redis storage is cleaned up by a Job before
//! the finalizer goes, within a time limit.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::info;

use super::apply::set_finalizers;
use super::builders;
use super::config::{HEAD_TERMINATION_REQUEUE, SHORT_REQUEUE};
use super::context::Context;
use super::error::{Error, KubeFailure};
use super::expectations::key_of;
use super::pods::{delete_pod_collection, node_type_of};
use crate::api::conditions;
use crate::api::raycluster::RayCluster;
use crate::controllers::frame::children::{ChildEvents, ChildWriter, Mode};
use crate::controllers::frame::run::Framed;
use crate::k8s::field_managers;
use crate::kuberay::keys::{annotations, labels, reasons};
use crate::kuberay::names;

/// The deletion of a GCS-FT cluster: delete its Pods, wait for the head to go, run the Redis
/// cleanup Job, then remove the finalizer. Bounded: past the timeout the finalizer goes anyway,
/// whatever Redis, the Job or a stuck Pod does.
pub(super) async fn finalize(cluster: &RayCluster, ctx: &Context) -> Result<Action, Error> {
    let has_finalizer = cluster
        .finalizers()
        .iter()
        .any(|f| f == crate::kuberay::keys::GCS_FT_REDIS_CLEANUP_FINALIZER);
    if !has_finalizer {
        // Garbage collection removes what the cluster owns.
        ctx.forget(&key_of(cluster));
        return Ok(Action::await_change());
    }
    if !crate::kuberay::spec::gcs_ft_redis(cluster) || !ctx.config.gcs_ft_redis_cleanup {
        // No Redis to clean (any more): the finalizer is stale.
        remove_cleanup_finalizer(cluster, ctx).await?;
        return Ok(Action::await_change());
    }

    let timeout = deletion_timeout(cluster, ctx);
    let age = deletion_age(cluster);
    // Checked first (KubeRay checks it only after the head Pod is gone): a head Pod stuck in
    // Terminating must not hold the cluster forever either.
    if age >= timeout {
        force_remove_finalizer(cluster, ctx, age).await?;
        return Ok(Action::await_change());
    }
    let remaining = timeout - age;

    let heads = ctx
        .cluster_pods(cluster)
        .iter()
        .filter(|p| node_type_of(p) == Some(labels::HEAD))
        .count();
    delete_all_pods(cluster, ctx).await?;
    if heads > 0 {
        // The GCS may still write to Redis until the head is gone.
        return Ok(soon(HEAD_TERMINATION_REQUEUE, remaining));
    }
    clean_up_redis(cluster, ctx, remaining).await
}

/// A requeue after `delay`, but no later than the deletion timeout (and not in a busy loop).
fn soon(delay: Duration, remaining: Duration) -> Action {
    Action::requeue(delay.min(remaining).max(Duration::from_millis(500)))
}

/// The cluster's own deletion timeout (annotation, in seconds), else the operator's.
fn deletion_timeout(cluster: &RayCluster, ctx: &Context) -> Duration {
    cluster
        .annotations()
        .get(annotations::GCS_FT_DELETION_TIMEOUT)
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(ctx.config.gcs_ft_deletion_timeout, Duration::from_secs)
}

/// How long ago the cluster was deleted.
fn deletion_age(cluster: &RayCluster) -> Duration {
    let deleted_at = cluster
        .meta()
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(k8s_openapi::jiff::Timestamp::now);
    Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(deleted_at))
        .unwrap_or_default()
}

/// Removes the Redis cleanup finalizer, keeping any others.
async fn remove_cleanup_finalizer(cluster: &RayCluster, ctx: &Context) -> Result<(), Error> {
    let rest: Vec<String> = cluster
        .finalizers()
        .iter()
        .filter(|f| *f != crate::kuberay::keys::GCS_FT_REDIS_CLEANUP_FINALIZER)
        .cloned()
        .collect();
    set_finalizers(cluster, ctx, rest).await
}

/// Past the timeout: the finalizer goes, and an Event says Redis may need a manual cleanup.
async fn force_remove_finalizer(
    cluster: &RayCluster,
    ctx: &Context,
    age: Duration,
) -> Result<(), Error> {
    remove_cleanup_finalizer(cluster, ctx).await?;
    let storage = builders::pod::env_vars::external_storage_namespace(cluster);
    ctx.event(
        cluster,
        EventType::Warning,
        reasons::FORCE_DELETED_STUCK_CLUSTER,
        "Cleanup",
        format!("Force-removed the GCS FT finalizer after {age:?}: the Redis cleanup did not finish; Redis storage namespace {storage:?} may need manual cleanup"),
    )
    .await;
    Ok(())
}

/// Deletes the head Pods, then the worker Pods.
async fn delete_all_pods(cluster: &RayCluster, ctx: &Context) -> Result<(), Error> {
    let (_, name) = key_of(cluster);
    for node_type in [labels::HEAD, labels::WORKER] {
        let selector = format!(
            "{}={name},{}={node_type}",
            labels::CLUSTER,
            labels::NODE_TYPE
        );
        delete_pod_collection(cluster, ctx, &selector)
            .await
            .map_err(|e| KubeFailure::new(format!("deleting the {node_type} Pods"), e))?;
    }
    Ok(())
}

/// The Redis cleanup Job: created when missing, waited for while it runs, and the finalizer
/// removed once it finished (whether it succeeded or not).
async fn clean_up_redis(
    cluster: &RayCluster,
    ctx: &Context,
    remaining: Duration,
) -> Result<Action, Error> {
    let (namespace, name) = key_of(cluster);
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
    let job_name = names::redis_cleanup_job_name(&name);
    let job = jobs
        .get_opt(&job_name)
        .await
        .map_err(|e| KubeFailure::new(format!("reading Job {job_name}"), e))?;
    match job {
        // Someone else's Job of that name says nothing about our Redis: it is left alone, and
        // the deletion waits (bounded by the timeout).
        Some(job)
            if !crate::k8s::is_controlled_by(job.meta(), &cluster.uid().unwrap_or_default()) =>
        {
            let conflict = crate::k8s::K8sError::NotOwned {
                kind: "Job".to_owned(),
                namespace: namespace.clone(),
                name: job_name.clone(),
                controller: crate::k8s::controller_of(job.meta()),
            };
            ctx.event(
                cluster,
                EventType::Warning,
                crate::k8s::conflict_reason("Job"),
                "Create",
                conflict.to_string(),
            )
            .await;
            Ok(soon(HEAD_TERMINATION_REQUEUE, remaining))
        }
        Some(job) => match finished_condition(&job) {
            Some(result) => {
                info!(job = %job_name, result = %result, "Redis cleanup finished; removing the finalizer");
                remove_cleanup_finalizer(cluster, ctx).await?;
                Ok(Action::await_change())
            }
            // The Job's watch event brings the next pass; the requeue bounds the wait.
            None => Ok(soon(HEAD_TERMINATION_REQUEUE, remaining)),
        },
        None => {
            create_cleanup_job(cluster, ctx, &jobs, &job_name).await?;
            Ok(soon(SHORT_REQUEUE, remaining))
        }
    }
}

/// The type of the Job's first true terminal condition, if it finished.
fn finished_condition(job: &Job) -> Option<&str> {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| {
            matches!(c.type_.as_str(), "Complete" | "Failed" | "FailureTarget")
                && c.status == conditions::TRUE
        })
        .map(|c| c.type_.as_str())
}

/// Creates the Redis cleanup Job (one already ours is fine) and reports it.
async fn create_cleanup_job(
    cluster: &RayCluster,
    ctx: &Context,
    jobs: &Api<Job>,
    job_name: &str,
) -> Result<(), Error> {
    let (namespace, _) = key_of(cluster);
    let spec_hash = crate::kuberay::spec::spec_hash(&cluster.spec);
    let job = builders::cleanup_job::redis_cleanup_job(cluster, &ctx.config.build, &spec_hash)?;
    let events = ChildEvents::new("Create")
        .written(
            reasons::CREATED_REDIS_CLEANUP_JOB,
            format!("Created Redis cleanup Job {namespace}/{job_name}"),
        )
        .failed(
            reasons::FAILED_TO_CREATE_REDIS_CLEANUP_JOB,
            format!("Failed to create Redis cleanup Job {namespace}/{job_name}"),
        )
        .conflict_reason();
    ChildWriter::new(&ctx.recorder, cluster, field_managers::RAYCLUSTER)
        .write(jobs, &job, Mode::Create, events)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};

    use super::*;

    fn job_with(conditions: &[(&str, &str)]) -> Job {
        Job {
            status: Some(JobStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(type_, status)| JobCondition {
                            type_: (*type_).to_owned(),
                            status: (*status).to_owned(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_cleanup_job_is_finished_by_its_first_true_terminal_condition() {
        assert_eq!(finished_condition(&Job::default()), None);
        let running = job_with(&[("Suspended", "True"), ("Complete", "False")]);
        assert_eq!(finished_condition(&running), None);
        let failed = job_with(&[("FailureTarget", "True"), ("Failed", "True")]);
        assert_eq!(finished_condition(&failed), Some("FailureTarget"));
    }

    #[test]
    fn a_requeue_is_bounded_by_the_timeout_but_not_below_half_a_second() {
        let secs = Duration::from_secs;
        assert_eq!(soon(secs(5), secs(60)), Action::requeue(secs(5)));
        assert_eq!(soon(secs(5), secs(2)), Action::requeue(secs(2)));
        assert_eq!(
            soon(secs(5), Duration::ZERO),
            Action::requeue(Duration::from_millis(500))
        );
    }
}
