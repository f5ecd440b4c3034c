//! One RayCluster reconcile, stage by stage: caches → ownership and deletion → validate →
//! finalizer → build and apply the children (`apply`, from the pure `builders`) → status
//! (`status`). The frame (`controllers::frame::run`) adds the span, metrics, panic containment
//! and the retry policy around it.

use std::sync::Arc;

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::config::SHORT_REQUEUE;
use super::context::Context;
use super::error::Error;
use super::status::{Outcome, StatusWrite};
use super::{apply, deletion, status_write};
use crate::api::raycluster::{AutoscalerVersion, MANAGED_BY_KUBERAY, RayCluster};
use crate::controllers::frame::refuse::refuse;
use crate::kuberay::keys::reasons;

/// The reconcile the frame runs for every RayCluster.
pub(super) async fn reconcile(
    cluster: Arc<RayCluster>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.wait_for_caches().await?;
    let (cluster, ctx) = (&*cluster, &*ctx);
    if cluster
        .spec
        .managed_by
        .as_deref()
        .is_some_and(|m| m != MANAGED_BY_KUBERAY)
    {
        // Another controller (e.g. Kueue MultiKueue) owns this cluster.
        return Ok(Action::await_change());
    }
    if cluster.meta().deletion_timestamp.is_some() {
        return deletion::finalize(cluster, ctx).await;
    }
    if let Some(action) = validate(cluster, ctx).await? {
        return Ok(action);
    }
    if let Some(action) = apply::ensure_cleanup_finalizer(cluster, ctx).await? {
        return Ok(action);
    }
    let base_status = ctx
        .with_memory(cluster, |m| {
            m.held_status
                .as_ref()
                .map(|(held, _)| held.clone())
                .or_else(|| m.last_status.clone())
        })
        .or_else(|| cluster.status.clone());
    let outcome = apply::apply_children(cluster, ctx, base_status.as_ref()).await;
    let written = status_write::update(cluster, ctx, base_status.as_ref(), &outcome).await?;
    let next = match (&outcome, written) {
        (Ok(Outcome::Clean), StatusWrite::Skip) => ctx.config.requeue_after,
        (_, StatusWrite::Hold(rest)) => rest.min(SHORT_REQUEUE),
        // A changed status or unfinished step: look again soon (suspension moves this way).
        _ => SHORT_REQUEUE,
    };
    outcome.map(|_| Action::requeue(next))
}

/// The validate stage: `Some(action)` ends the pass (a refused cluster gets an Event and
/// nothing is written; a spec change brings it back).
async fn validate(cluster: &RayCluster, ctx: &Context) -> Result<Option<Action>, Error> {
    if let Err(invalid) =
        crate::validation::validated::for_controller(cluster, &ctx.config.feature_gates)
    {
        let wait = refuse(&ctx.recorder, cluster, invalid.reason, &invalid.message).await;
        if invalid.reason == reasons::INVALID_STATUS {
            return Err(Error::InvalidStatus(invalid.message));
        }
        return Ok(Some(wait));
    }
    warn_autoscaler_v1_restart_policy(cluster, ctx).await;
    Ok(None)
}

/// KubeRay warns (and goes on) when autoscaler v1 meets worker Pods that restart containers.
async fn warn_autoscaler_v1_restart_policy(cluster: &RayCluster, ctx: &Context) {
    if !crate::kuberay::spec::autoscaling_enabled(&cluster.spec)
        || crate::kuberay::spec::autoscaler_version(&cluster.spec) != Some(AutoscalerVersion::V1)
    {
        return;
    }
    let groups: Vec<&str> = cluster
        .spec
        .worker_group_specs
        .iter()
        .flatten()
        .filter(|g| {
            g.template
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref())
                .is_some_and(|p| !p.is_empty() && p != "Never")
        })
        .map(|g| g.group_name.as_str())
        .collect();
    if !groups.is_empty() {
        let note = format!(
            "restartPolicy for worker groups [{}] should be Never or unset when using autoscaler V1",
            groups.join(", ")
        );
        ctx.event(
            cluster,
            EventType::Warning,
            reasons::INVALID_SPEC,
            "Validate",
            note,
        )
        .await;
    }
}
