//! Zero-downtime cluster switching: whether a new pending cluster must be prepared (KubeRay's
//! `shouldPrepareNewCluster`).

use super::*;

/// Whether a new pending cluster must be prepared (KubeRay's `shouldPrepareNewCluster`).
pub(super) fn needs_new_cluster(
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
