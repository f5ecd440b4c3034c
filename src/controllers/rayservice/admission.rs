//! Per-cluster admission by Kueue (`raypipe.dev/cluster-queue-name`): an upgrade's new cluster
//! is its own Kueue workload. While it waits for quota the active cluster keeps serving; when it
//! is not admitted within the admission timeout the upgrade is given up by itself (the waiting
//! cluster deleted, the spec remembered so it is not tried again until it changes), instead of
//! holding the serving cluster's quota twice or waiting forever.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::build::{self, HASH_ANNOTATION};
use super::context::Context;
use super::error::{Error, KubeFailure};
use super::reasons;
use super::upgrade::Desired;
use crate::api::raycluster::RayCluster;
use crate::api::rayservice::{RayService, RayServiceStatus};
use crate::k8s::field_managers;
use crate::kuberay::kueue;

/// The admission timeout of `service`'s upgrade clusters: its annotation, else the default (an
/// unparsable value falls back to the default too; the validator reports it).
pub(super) fn admission_timeout(service: &RayService) -> Duration {
    service
        .annotations()
        .get(kueue::ADMISSION_TIMEOUT_ANNOTATION)
        .and_then(|text| crate::validation::duration::parse_duration(text).ok())
        .unwrap_or(kueue::DEFAULT_ADMISSION_TIMEOUT)
}

/// The pending cluster that has waited for admission longer than the timeout, while another
/// cluster serves (a first cluster waits as long as it takes: nothing serves without it).
pub(super) fn not_admitted_in_time<'a>(
    service: &RayService,
    desired: &'a Desired,
    now: &Time,
) -> Option<&'a RayCluster> {
    if !build::admitted_per_cluster(service) {
        return None;
    }
    desired.active_cluster()?;
    let pending = desired.pending_cluster()?;
    if pending.spec.suspend != Some(true) || pending.meta().deletion_timestamp.is_some() {
        return None;
    }
    let created = pending.meta().creation_timestamp.as_ref()?;
    let waited = Duration::try_from(now.0.duration_since(created.0)).ok()?;
    (waited >= admission_timeout(service)).then_some(pending)
}

/// Gives up the upgrade whose cluster was not admitted in time: the spec is remembered on the
/// RayService (so the next pass does not start it again), the waiting cluster is deleted (it
/// held no quota, and now cannot be admitted later behind the operator's back), and the status
/// no longer names it. `Ok(true)`: given up.
pub(super) async fn give_up_unadmitted(
    service: &RayService,
    ctx: &Context,
    desired: &Desired,
    status: &mut RayServiceStatus,
    now: &Time,
) -> Result<bool, Error> {
    let Some(pending) = not_admitted_in_time(service, desired, now) else {
        return Ok(false);
    };
    let name = pending.name_any();
    let spec_hash = pending
        .annotations()
        .get(HASH_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    let namespace = service.namespace().unwrap_or_default();
    let services: Api<RayService> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = serde_json::json!({"metadata": {"annotations": {
        kueue::ABANDONED_SPEC_ANNOTATION: spec_hash,
    }}});
    services
        .patch(
            &service.name_any(),
            &PatchParams {
                field_manager: Some(field_managers::RAYSERVICE.to_owned()),
                ..Default::default()
            },
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| KubeFailure::new("record the upgrade given up", e))?;
    let clusters: Api<RayCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: pending.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match clusters.delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => return Err(KubeFailure::new("delete the unadmitted RayCluster", e).into()),
    }
    status.pending_service_status = None;
    let queue = service
        .annotations()
        .get(kueue::CLUSTER_QUEUE_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    let waited = crate::validation::duration::format_duration(admission_timeout(service));
    warn!(cluster = %name, %queue, "the upgrade's cluster was not admitted in time; the upgrade is given up");
    ctx.event(
        service,
        EventType::Warning,
        reasons::UPGRADE_NOT_ADMITTED,
        "Upgrade",
        format!(
            "RayCluster {name} was not admitted by Kueue in LocalQueue {queue} within {waited}; the \
             upgrade is given up and the active cluster keeps serving (a changed spec, or removing \
             the {} annotation, tries again)",
            kueue::ABANDONED_SPEC_ANNOTATION
        ),
    )
    .await;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(annotations: serde_json::Value) -> RayService {
        serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "demo", "namespace": "ns", "uid": "u1", "annotations": annotations},
            "spec": {"rayClusterConfig": {"headGroupSpec": {"template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}}}}}
        }))
        .unwrap()
    }

    #[test]
    fn the_admission_timeout_is_the_annotation_or_ten_minutes() {
        assert_eq!(
            admission_timeout(&service(json!({}))),
            Duration::from_secs(600)
        );
        assert_eq!(
            admission_timeout(&service(
                json!({kueue::ADMISSION_TIMEOUT_ANNOTATION: "90s"})
            )),
            Duration::from_secs(90)
        );
        assert_eq!(
            admission_timeout(&service(
                json!({kueue::ADMISSION_TIMEOUT_ANNOTATION: "soon"})
            )),
            Duration::from_secs(600)
        );
    }

    #[test]
    fn a_given_up_spec_is_known_by_its_replacement_hash() {
        let plain = service(json!({}));
        let goal = build::goal_spec(&plain);
        assert!(!build::given_up(&plain, &goal));
        let abandoned = service(json!({
            kueue::ABANDONED_SPEC_ANNOTATION: build::replacement_hash(&goal)
        }));
        assert!(build::given_up(&abandoned, &goal));
        let mut other = goal.clone();
        other.head_group_spec.ray_start_params =
            Some([("num-cpus".to_owned(), "0".to_owned())].into());
        assert!(!build::given_up(&abandoned, &other));
    }
}
