//! The apply stage of `--batch-scheduler`: the PodGroup Volcano or scheduler-plugins
//! gang-schedules the cluster's Pods with, made before the Pods as KubeRay makes it. Both are
//! kinds of optional CRDs, written as dynamic objects; without the CRD the cluster gets a
//! Warning naming it and no Pods (they would wait for a PodGroup that cannot exist).

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::runtime::events::EventType;
use tracing::info;

use super::builders::batch_scheduler::{self, BatchScheduler};
use super::context::Context;
use super::error::{Error, KubeFailure};
use crate::api::raycluster::RayCluster;
use crate::k8s::field_managers;
use crate::kuberay::quantity::Amount;

/// The Event reason when the scheduler's PodGroup CRD is not installed.
pub const POD_GROUP_CRD_MISSING: &str = "BatchSchedulerCRDMissing";

/// KubeRay's `DoBatchSchedulingOnSubmission` for a RayCluster.
pub(super) async fn ensure_pod_group(cluster: &RayCluster, ctx: &Context) -> Result<(), Error> {
    let Some(scheduler) = ctx.config.build.batch_scheduler else {
        return Ok(());
    };
    let desired = match scheduler {
        BatchScheduler::Volcano => batch_scheduler::cluster_volcano_pod_group(cluster)?,
        BatchScheduler::SchedulerPlugins => batch_scheduler::scheduler_plugins_pod_group(cluster)?,
        BatchScheduler::YuniKorn | BatchScheduler::KaiScheduler => None,
    };
    let Some(desired) = desired else {
        return Ok(());
    };
    let memo_key = format!("PodGroup/{}", desired.name_any());
    let hash = crate::k8s::stable_hash(&desired);
    if ctx.recently_ensured(cluster, &memo_key, &hash) {
        return Ok(());
    }
    // scheduler-plugins' PodGroup is made once; Volcano's follows the cluster's size.
    let resize = scheduler == BatchScheduler::Volcano;
    match write_pod_group(
        &ctx.client,
        scheduler,
        &desired,
        resize,
        field_managers::RAYCLUSTER,
    )
    .await
    {
        Ok(_) => {}
        Err(PodGroupError::Kube(failure)) => return Err(failure.into()),
        Err(PodGroupError::CrdMissing(message)) => {
            ctx.event(
                cluster,
                EventType::Warning,
                POD_GROUP_CRD_MISSING,
                "Create",
                message.clone(),
            )
            .await;
            // An error, so the frame backs off instead of repeating this every 2 s.
            return Err(Error::Conflict(message));
        }
    }
    ctx.remember_ensured(cluster, memo_key, hash);
    Ok(())
}

/// What writing a PodGroup did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PodGroupWrite {
    Created,
    Resized,
    Unchanged,
}

/// Why a PodGroup could not be written.
#[derive(Debug)]
pub(crate) enum PodGroupError {
    /// The scheduler's PodGroup CRD is not installed (the message names it).
    CrdMissing(String),
    Kube(KubeFailure),
}

/// Creates `desired` (a PodGroup of `scheduler`'s kind) if absent; with `resize`, brings an
/// existing one to the desired `minMember` and `minResources`, leaving the rest as it is.
pub(crate) async fn write_pod_group(
    client: &kube::Client,
    scheduler: BatchScheduler,
    desired: &DynamicObject,
    resize: bool,
    field_manager: &str,
) -> Result<PodGroupWrite, PodGroupError> {
    let resource = scheduler.pod_group_resource().ok_or_else(|| {
        PodGroupError::CrdMissing(format!("{} has no PodGroup", scheduler.flag_name()))
    })?;
    let name = desired.name_any();
    let namespace = desired.namespace().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
    let existing = match api.get_opt(&name).await {
        Ok(found) => found,
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(e) => {
            return Err(PodGroupError::Kube(KubeFailure::new(
                format!("reading PodGroup {name}"),
                e,
            )));
        }
    };
    match existing {
        None => match api.create(&post_params(field_manager), desired).await {
            Ok(_) => {
                info!(pod_group = %name, "created the PodGroup");
                Ok(PodGroupWrite::Created)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(PodGroupWrite::Unchanged),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                Err(PodGroupError::CrdMissing(crd_missing(scheduler, &resource)))
            }
            Err(e) => Err(PodGroupError::Kube(KubeFailure::new(
                format!("creating PodGroup {name}"),
                e,
            ))),
        },
        Some(found) if resize && !same_gang(&found, desired) => {
            let mut updated = found.clone();
            updated.data["spec"]["minMember"] = desired.data["spec"]["minMember"].clone();
            updated.data["spec"]["minResources"] = desired.data["spec"]["minResources"].clone();
            if let Some(spec) = updated.data["spec"].as_object_mut() {
                spec.retain(|_, v| !v.is_null());
            }
            api.replace(&name, &post_params(field_manager), &updated)
                .await
                .map_err(|e| {
                    PodGroupError::Kube(KubeFailure::new(format!("updating PodGroup {name}"), e))
                })?;
            info!(pod_group = %name, "resized the PodGroup");
            Ok(PodGroupWrite::Resized)
        }
        Some(_) => Ok(PodGroupWrite::Unchanged),
    }
}

/// The message naming the CRD a scheduler needs.
pub(crate) fn crd_missing(scheduler: BatchScheduler, resource: &ApiResource) -> String {
    format!(
        "--batch-scheduler {} needs the PodGroup CRD {}.{} ({}), which is not installed; no Pods are created until it is",
        scheduler.flag_name(),
        resource.plural,
        resource.group,
        resource.api_version,
    )
}

fn post_params(field_manager: &str) -> PostParams {
    PostParams {
        field_manager: Some(field_manager.to_owned()),
        ..PostParams::default()
    }
}

/// Whether the found PodGroup already asks for the desired members and resources (quantities
/// compared by value, as KubeRay does).
fn same_gang(found: &DynamicObject, desired: &DynamicObject) -> bool {
    let members = |o: &DynamicObject| o.data["spec"]["minMember"].as_i64().unwrap_or(0);
    let resources = |o: &DynamicObject| -> Option<BTreeMap<String, Option<Amount>>> {
        let map = o.data["spec"]["minResources"].as_object()?;
        Some(
            map.iter()
                .map(|(k, v)| (k.clone(), v.as_str().and_then(Amount::parse)))
                .collect(),
        )
    };
    let equal = |a: &Option<Amount>, b: &Option<Amount>| match (a, b) {
        (Some(a), Some(b)) => a.plus(b.times(-1)).is_zero(),
        _ => false,
    };
    let (Some(have), Some(want)) = (resources(found), resources(desired)) else {
        return false;
    };
    members(found) == members(desired)
        && have.len() == want.len()
        && have
            .iter()
            .all(|(k, v)| want.get(k).is_some_and(|w| equal(v, w)))
}
