//! The apply stage of a RayCluster reconcile: every child in KubeRay's order (RBAC, Ingress,
//! Secret, Services by server-side apply; the gated NetworkPolicies, GCS PVC and mTLS PKI
//! (`isolation`); Pods by create and delete under scale expectations),
//! each built by the pure `builders`; and the cluster's own finalizers.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use tracing::{debug, info};

use super::config::SHORT_REQUEUE;
use super::context::Context;
use super::error::{Error, KubeFailure};
use super::status::{Outcome, Progress};
use super::{batch, builders, children, isolation, pods};
use crate::api::raycluster::{RayCluster, RayClusterStatus};

/// The GCS fault tolerance cleanup finalizer goes on before anything exists that Redis state
/// could belong to; `Some(action)` ends the pass when it was just added.
pub(super) async fn ensure_cleanup_finalizer(
    cluster: &RayCluster,
    ctx: &Context,
) -> Result<Option<Action>, Error> {
    if ctx.config.gcs_ft_redis_cleanup
        && crate::kuberay::spec::gcs_ft_redis(cluster)
        && !cluster
            .finalizers()
            .iter()
            .any(|f| f == crate::kuberay::keys::GCS_FT_REDIS_CLEANUP_FINALIZER)
    {
        let mut finalizers = cluster.finalizers().to_vec();
        finalizers.push(crate::kuberay::keys::GCS_FT_REDIS_CLEANUP_FINALIZER.to_owned());
        set_finalizers(cluster, ctx, finalizers).await?;
        info!("added the GCS fault tolerance cleanup finalizer");
        return Ok(Some(Action::requeue(SHORT_REQUEUE)));
    }
    Ok(None)
}

/// Replaces the finalizer list, failing on a concurrent change (resourceVersion precondition).
pub(super) async fn set_finalizers(
    cluster: &RayCluster,
    ctx: &Context,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": cluster.resource_version()}
    });
    api.patch(
        &cluster.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|e| {
        KubeFailure::new(
            format!(
                "updating the finalizers of RayCluster {}",
                cluster.name_any()
            ),
            e,
        )
    })?;
    Ok(())
}

/// Everything the cluster owns, in KubeRay's order; the first failure stops the pass.
pub(super) async fn apply_children(
    cluster: &RayCluster,
    ctx: &Context,
    status: Option<&RayClusterStatus>,
) -> Result<Outcome, Error> {
    match apply_in_order(cluster, ctx, status).await? {
        Progress::Done => Ok(Outcome::Clean),
        Progress::Waiting(why) => {
            debug!(why, "another pass needed");
            Ok(Outcome::Waiting(why))
        }
    }
}

async fn apply_in_order(
    cluster: &RayCluster,
    ctx: &Context,
    status: Option<&RayClusterStatus>,
) -> Result<Progress, Error> {
    if crate::kuberay::spec::autoscaling_enabled(&cluster.spec) {
        children::ensure_autoscaler_rbac(cluster, ctx).await?;
    }
    if cluster.spec.head_group_spec.enable_ingress == Some(true) {
        children::ensure_ingress(cluster, ctx).await?;
    }
    if builders::objects::needs_auth_secret(cluster) {
        children::ensure_auth_secret(cluster, ctx).await?;
    }
    children::ensure_services(cluster, ctx).await?;
    isolation::ensure_network_policies(cluster, ctx).await?;
    isolation::ensure_gcs_storage(cluster, ctx).await?;
    let mtls = isolation::ensure_mtls(cluster, ctx).await?;
    // KubeRay submits the gang to the batch scheduler just before reconciling the Pods.
    batch::ensure_pod_group(cluster, ctx).await?;
    match pods::reconcile_pods(cluster, ctx, status).await? {
        Progress::Done => Ok(mtls),
        waiting => Ok(waiting),
    }
}
