//! The status stage of a RayCluster reconcile: computes the status (pure, in `status`) from
//! what the apply stage left and writes it only when it changed, remembering it as the base of
//! the next one; records the provisioning time when the cluster first becomes provisioned.

use k8s_openapi::api::core::v1::Pod;

use super::status::{Outcome, StatusInputs, compute_status, differs, is_true};
use crate::api::raycluster::{RayCluster, RayClusterStatus, condition_types};

/// The status stage: computes the status from what the apply stage left (`outcome`) and writes
/// it when it differs from the cluster's; `Ok(true)` when it was written. The status written is
/// remembered as the base of the next one, even before the cache shows it.
pub(super) async fn update(
    cluster: &RayCluster,
    ctx: &super::Context,
    base_status: Option<&RayClusterStatus>,
    outcome: &Result<Outcome, super::Error>,
) -> Result<bool, super::Error> {
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
    let now = super::now();
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
    let written = differs(cluster.status.as_ref(), &new_status);
    if written {
        crate::controllers::frame::status::apply_status(
            &ctx.client,
            cluster,
            crate::k8s::field_managers::RAYCLUSTER,
            &new_status,
        )
        .await
        .map_err(|e| {
            super::Error::kube(
                format!(
                    "writing the status of RayCluster {}",
                    kube::ResourceExt::name_any(cluster)
                ),
                e,
            )
        })?;
    }
    ctx.with_memory(cluster, |m| m.last_status = Some(new_status));
    Ok(written)
}
