//! The RayService's writes to its children: RayClusters (create-only for a new one, in-place
//! update, delayed deletion of the ones no longer active or pending), the head and serve
//! Services (the traffic switch), and the EndpointSlice count. Objects come from `build`;
//! a child of our name that the RayService does not control is reported and left alone.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::status::write_status_if_changed;
use super::upgrade::{Built, Candidate, Desired};
use super::*;

/// How the cluster writes of a pass ended.
pub(super) enum ClustersApplied {
    /// The pending cluster was created: the pass ends and comes back shortly.
    PendingCreated,
    /// Clusters are as desired; `dangling_left` old ones still wait for deletion.
    Applied { dangling_left: usize },
}

/// Writes the desired clusters in order: clusters no longer active or pending go after the
/// deletion delay, then the pending cluster is created, else in-place updates are applied.
/// A first cluster blocked by someone else's RayCluster is named in the Ready condition.
pub(super) async fn clusters(
    service: &RayService,
    ctx: &Context,
    desired: &mut Desired,
    status: &mut RayServiceStatus,
    generation: Option<i64>,
    now: &Time,
) -> Result<ClustersApplied, Error> {
    let dangling_left =
        delete_clusters(service, ctx, &desired.dangling, desired.deletion_delay).await;
    if let Some((name, built)) = desired.create.take() {
        if let Err(e) = create_cluster(service, ctx, &name, built).await {
            // A first cluster blocked by someone else's RayCluster: say so where people look.
            if let Error::Apply(k) = &e
                && let Some(reason) = k.conflict_reason()
                && desired.active.is_none()
            {
                status::set(
                    status,
                    condition_types::READY,
                    FALSE,
                    reason,
                    &k.to_string(),
                    generation,
                    now.clone(),
                );
                write_status_if_changed(service, ctx, status.clone()).await?;
            }
            return Err(e);
        }
        return Ok(ClustersApplied::PendingCreated);
    }
    for (cluster, built) in std::mem::take(&mut desired.update_in_place) {
        update_cluster(service, ctx, &cluster, built).await?;
    }
    Ok(ClustersApplied::Applied { dangling_left })
}

/// Creates the RayCluster `name` (create-only: a RayCluster of that name someone else made is
/// reported as a conflict and left alone; one we made earlier is fine).
async fn create_cluster(
    service: &RayService,
    ctx: &Context,
    name: &str,
    built: Built<RayCluster>,
) -> Result<(), Error> {
    let cluster = built?;
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    match crate::k8s::create_owned(&api, &cluster, field_managers::RAYSERVICE).await {
        // Made by an earlier pass whose event the cache has not shown yet.
        Ok(crate::k8s::Created::AlreadyOurs(_)) => Ok(()),
        Ok(crate::k8s::Created::New(_)) => {
            info!(cluster = %name, "created the RayCluster");
            ctx.event(
                service,
                EventType::Normal,
                reasons::CREATED_RAY_CLUSTER,
                "CreateRayCluster",
                format!("created RayCluster {name}"),
            )
            .await;
            Ok(())
        }
        Err(e) => {
            let reason = e
                .conflict_reason()
                .unwrap_or(reasons::FAILED_TO_CREATE_RAY_CLUSTER);
            ctx.event(
                service,
                EventType::Warning,
                reason,
                "CreateRayCluster",
                format!("creating RayCluster {name} failed: {e}"),
            )
            .await;
            Err(e.into())
        }
    }
}

async fn update_cluster(
    service: &RayService,
    ctx: &Context,
    cluster: &RayCluster,
    built: Built<RayCluster>,
) -> Result<(), Error> {
    let name = cluster.name_any();
    let desired = built?;
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    let known = Some(cluster.meta());
    match crate::k8s::apply_owned(&api, &desired, known, field_managers::RAYSERVICE).await {
        Ok(_) => {
            info!(cluster = %name, "updated the RayCluster in place");
            ctx.event(
                service,
                EventType::Normal,
                reasons::UPDATED_RAY_CLUSTER,
                "UpdateRayCluster",
                format!("updated RayCluster {name} in place"),
            )
            .await;
            Ok(())
        }
        Err(e) => {
            ctx.event(
                service,
                EventType::Warning,
                reasons::FAILED_TO_UPDATE_RAY_CLUSTER,
                "UpdateRayCluster",
                format!("updating RayCluster {name} failed: {e}"),
            )
            .await;
            Err(e.into())
        }
    }
}

/// Deletes `clusters` once each has been dangling for `delay`; returns how many remain.
pub(super) async fn delete_clusters(
    service: &RayService,
    ctx: &Context,
    clusters: &[Arc<RayCluster>],
    delay: Duration,
) -> usize {
    let names: BTreeSet<String> = clusters.iter().map(|c| c.name_any()).collect();
    let due: Vec<String> = ctx.with_memory(service, |m| {
        m.deletion_due.retain(|name, _| names.contains(name));
        let now = Instant::now();
        names
            .iter()
            .filter(|name| {
                let at = *m
                    .deletion_due
                    .entry((*name).clone())
                    .or_insert_with(|| now + delay);
                at <= now
            })
            .cloned()
            .collect()
    });
    let api: Api<RayCluster> =
        Api::namespaced(ctx.client.clone(), &service.namespace().unwrap_or_default());
    for name in &due {
        if clusters
            .iter()
            .any(|c| &c.name_any() == name && c.meta().deletion_timestamp.is_some())
        {
            continue;
        }
        // Only the cluster that was seen as ours: a same-named one made since is not touched.
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: clusters.iter().find(|c| &c.name_any() == name).map(|c| {
                kube::api::Preconditions {
                    uid: c.uid(),
                    resource_version: None,
                }
            }),
            ..Default::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                info!(cluster = %name, "deleted a RayCluster that no longer serves");
                ctx.with_memory(service, |m| m.pushed.remove(name));
                ctx.event(
                    service,
                    EventType::Normal,
                    reasons::DELETED_RAY_CLUSTER,
                    "DeleteRayCluster",
                    format!("deleted RayCluster {name}"),
                )
                .await;
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                ctx.event(
                    service,
                    EventType::Warning,
                    reasons::FAILED_TO_DELETE_RAY_CLUSTER,
                    "DeleteRayCluster",
                    format!("deleting RayCluster {name} failed: {e}"),
                )
                .await;
            }
        }
    }
    clusters.len()
}

/// Points the head and serve Services at the `target` cluster (creating them on first use).
pub(super) async fn apply_services(
    service: &RayService,
    ctx: &Context,
    target: &mut Candidate,
) -> Result<(), Error> {
    // `None`: they were applied earlier in this pass.
    let Some(built) = target.services.take() else {
        return Ok(());
    };
    let desired = built?;
    let target = &*target.cluster;
    let namespace = service.namespace().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    for svc in desired {
        let name = svc.name_any();
        let hash = crate::k8s::stable_hash(&svc);
        let cached = ctx.cached_service(&namespace, &name);
        let unchanged = cached
            .as_ref()
            .is_some_and(|c| build::selected_cluster(c) == Some(target.name_any().as_str()))
            && ctx.with_memory(service, |m| m.applied_services.get(&name) == Some(&hash));
        if unchanged {
            continue;
        }
        let (reason, verb) = match &cached {
            None => (reasons::CREATED_SERVICE, "created"),
            Some(_) => (reasons::UPDATED_SERVICE, "updated"),
        };
        // A cached Service of that name we do not control is refused without a request.
        let known = cached.as_ref().map(|c| c.meta());
        match crate::k8s::apply_owned(&api, &svc, known, field_managers::RAYSERVICE).await {
            Ok(_) => {
                ctx.with_memory(service, |m| m.applied_services.insert(name.clone(), hash));
                let moved = cached
                    .as_ref()
                    .and_then(|c| build::selected_cluster(c).map(str::to_owned))
                    != Some(target.name_any());
                if moved {
                    ctx.event(
                        service,
                        EventType::Normal,
                        reason,
                        "ApplyService",
                        format!(
                            "{verb} Service {name}; it selects RayCluster {}",
                            target.name_any()
                        ),
                    )
                    .await;
                }
            }
            Err(e) => {
                ctx.event(
                    service,
                    EventType::Warning,
                    e.conflict_reason()
                        .unwrap_or(reasons::FAILED_TO_CREATE_SERVICE),
                    "ApplyService",
                    format!("applying Service {name} failed: {e}"),
                )
                .await;
                return Err(e.into());
            }
        }
    }
    Ok(())
}

/// Distinct ready Pods behind the serve Service (from its EndpointSlices).
pub(super) async fn count_serve_endpoints(
    ctx: &Context,
    namespace: &str,
    service: &str,
) -> Result<i32, Error> {
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), namespace);
    let slices = api
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .map_err(|e| {
            Error::kube(
                format!("listing the EndpointSlices of Service {service}"),
                e,
            )
        })?;
    let pods: BTreeSet<String> = slices
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
        .filter_map(|e| e.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
        .filter_map(|r| r.uid.clone().or_else(|| r.name.clone()))
        .collect();
    Ok(i32::try_from(pods.len()).unwrap_or(i32::MAX))
}
