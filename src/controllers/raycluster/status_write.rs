//! The status stage of a RayCluster pass: computes the status (pure, in `status`) from what the
//! apply stage left, decides with `status::plan_write` whether the frame writes it (changed, and
//! not merely provisioning progress that can wait for the next change), and remembers it as the
//! base of the next one; records the provisioning time when the cluster first becomes
//! provisioned.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use std::time::Instant;

use super::context::Context;
use super::error::Error;
use super::status::{
    LastWritten, Outcome, StatusInputs, StatusWrite, compute_status, is_true, plan_write,
};
use crate::api::raycluster::{RayCluster, RayClusterStatus, condition_types};

/// The status after this pass, from what the apply stage left (`outcome`); records the
/// provisioning time when the cluster first becomes provisioned.
pub(super) fn compute(
    cluster: &RayCluster,
    ctx: &Context,
    base_status: Option<&RayClusterStatus>,
    outcome: &Result<Outcome, Error>,
) -> RayClusterStatus {
    let pods = ctx.cluster_pods(cluster);
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    // KubeRay writes no status at all while the head Service is missing; here the status goes
    // out without the Service's part, so a failure to create it stays visible.
    let head_service = ctx.head_service(cluster).ok().flatten();
    let status_outcome = match outcome {
        Ok(o) => o.clone(),
        Err(e) => Outcome::Failed {
            replica_failure: e.replica_failure(),
            message: e.to_string(),
        },
    };
    let now = now();
    let new_status = compute_status(&StatusInputs {
        cluster,
        pods: &pod_refs,
        head_service: head_service.as_deref(),
        outcome: &status_outcome,
        previous: base_status,
        now: now.clone(),
    });
    let provisioned = |s: Option<&RayClusterStatus>| {
        s.is_some_and(|s| is_true(s, condition_types::RAY_CLUSTER_PROVISIONED))
    };
    if provisioned(Some(&new_status))
        && !provisioned(base_status)
        && let Some(created) = cluster.metadata.creation_timestamp.as_ref()
        && let Ok(took) = std::time::Duration::try_from(now.0.duration_since(created.0))
    {
        ctx.config.metrics.raycluster_provisioned(took);
    }
    new_status
}

/// Whether `new_status` is written now, held or skipped (`plan_write`, from what this process
/// last wrote or, after a restart, what the cache shows).
pub(super) fn plan(
    ctx: &Context,
    cluster: &RayCluster,
    new_status: &RayClusterStatus,
) -> StatusWrite {
    ctx.with_memory(cluster, |m| {
        let last = match &m.last_status {
            Some(status) => Some(LastWritten {
                status,
                since_write: m.last_write.map(|at| at.elapsed()),
            }),
            None => cluster.status.as_ref().map(|status| LastWritten {
                status,
                since_write: None,
            }),
        };
        let held_for = m.held_status.as_ref().map(|(_, since)| since.elapsed());
        plan_write(cluster.status.as_ref(), last, held_for, new_status)
    })
}

/// Remembers the status the stage decided on: a written one is the base of the next pass even
/// before the cache shows it; a held one is the base while it waits.
pub(super) fn remember(
    ctx: &Context,
    cluster: &RayCluster,
    new_status: RayClusterStatus,
    plan: StatusWrite,
) {
    ctx.with_memory(cluster, |m| match plan {
        StatusWrite::Hold(_) => {
            let since = m
                .held_status
                .take()
                .map_or_else(Instant::now, |(_, since)| since);
            m.held_status = Some((new_status, since));
        }
        StatusWrite::Now => {
            m.last_status = Some(new_status);
            m.last_write = Some(Instant::now());
            m.held_status = None;
        }
        StatusWrite::Skip => {
            // The cache shows it, or this process wrote it moments ago: either way it is the
            // written status (whose write time stays what it was).
            m.last_status = Some(new_status);
            m.held_status = None;
        }
    });
}

/// The current time in whole seconds, as the API server stores it: a status computed from the
/// last written one then compares equal to what the cache shows.
pub(super) fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}
