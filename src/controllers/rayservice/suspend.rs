//! The suspend state machine of a RayService: Suspending deletes every cluster and Service
//! (and the Gateway and HTTPRoute of an incremental upgrade), Suspended waits, a resume starts
//! initializing afresh.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::apply::delete_clusters;
use super::{Context, Error, SHORT_REQUEUE, build, reasons, status};
use crate::api::conditions::{FALSE, TRUE};
use crate::api::raycluster::RayCluster;
use crate::api::rayservice::{RayService, RayServiceStatus, condition_reasons, condition_types};

/// The suspend state machine. `Some(action)`: the pass ends here (after the status is written).
pub(super) async fn reconcile_suspend(
    service: &RayService,
    ctx: &Context,
    status: &mut RayServiceStatus,
    clusters: &[Arc<RayCluster>],
) -> Result<Option<Action>, Error> {
    let generation = service.meta().generation;
    let now = crate::k8s::now();
    let requested = service.spec.suspend == Some(true);
    let suspending = status::is_true(&status.conditions, condition_types::SUSPENDING);
    let suspended = status::is_true(&status.conditions, condition_types::SUSPENDED);
    let set = |status: &mut RayServiceStatus, t: &str, v: &str, r: &str, m: &str| {
        status::set(status, t, v, r, m, generation, now.clone())
    };
    if requested && !suspending && !suspended {
        set(
            status,
            condition_types::SUSPENDING,
            TRUE,
            condition_reasons::SUSPEND_REQUESTED,
            "spec.suspend is true: the clusters and Services are being deleted",
        );
        for t in [
            condition_types::READY,
            condition_types::UPGRADE_IN_PROGRESS,
            condition_types::ROLLBACK_IN_PROGRESS,
        ] {
            set(
                status,
                t,
                FALSE,
                condition_reasons::SUSPEND_IN_PROGRESS,
                "suspending",
            );
        }
        status.active_service_status = None;
        status.pending_service_status = None;
        status.num_serve_endpoints = Some(0);
        status.service_status = None;
        status.observed_generation = generation;
        return Ok(Some(Action::requeue(SHORT_REQUEUE)));
    }
    if suspending {
        let mut remaining = delete_clusters(service, ctx, clusters, Duration::ZERO).await;
        let namespace = service.namespace().unwrap_or_default();
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
        for name in [
            build::head_service_name(service),
            build::serve_service_name(service),
        ] {
            // Someone else's Service of that name is not ours to delete.
            let Some(cached) = ctx.cached_service(&namespace, &name).filter(|s| {
                crate::k8s::is_controlled_by(s.meta(), &service.uid().unwrap_or_default())
            }) else {
                continue;
            };
            remaining += 1;
            // Only the Service that was seen: a same-named one made since is not touched.
            let params = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: cached.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            let deleted = match api.delete(&name, &params).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
                Err(e) => Err(e),
            };
            match deleted {
                Ok(()) => {
                    ctx.event(
                        service,
                        EventType::Normal,
                        reasons::DELETED_SERVICE,
                        "DeleteService",
                        format!("deleted Service {name}"),
                    )
                    .await;
                }
                Err(e) => {
                    ctx.event(
                        service,
                        EventType::Warning,
                        reasons::FAILED_TO_DELETE_SERVICE,
                        "DeleteService",
                        format!("deleting Service {name} failed: {e}"),
                    )
                    .await;
                }
            }
        }
        if super::incremental::options(service, &ctx.config.feature_gates).is_some() {
            remaining += delete_gateway_objects(service, ctx).await;
        }
        ctx.with_memory(service, |m| {
            m.pushed.clear();
            m.applied_services.clear();
        });
        if remaining > 0 {
            set(
                status,
                condition_types::SUSPENDING,
                TRUE,
                condition_reasons::SUSPEND_IN_PROGRESS,
                &format!("{remaining} cluster(s) and Service(s) left to delete"),
            );
            return Ok(Some(Action::requeue(SHORT_REQUEUE)));
        }
        set(
            status,
            condition_types::SUSPENDING,
            FALSE,
            condition_reasons::SUSPEND_COMPLETE,
            "suspended",
        );
        set(
            status,
            condition_types::SUSPENDED,
            TRUE,
            condition_reasons::SUSPEND_COMPLETE,
            "every cluster and Service of the RayService is deleted",
        );
        for t in [
            condition_types::READY,
            condition_types::UPGRADE_IN_PROGRESS,
            condition_types::ROLLBACK_IN_PROGRESS,
        ] {
            set(
                status,
                t,
                FALSE,
                condition_reasons::SUSPEND_COMPLETE,
                "suspended",
            );
        }
        return Ok(Some(Action::await_change()));
    }
    if suspended {
        if requested {
            return Ok(Some(Action::await_change()));
        }
        set(
            status,
            condition_types::SUSPENDED,
            FALSE,
            condition_reasons::RAY_SERVICE_RESUMED,
            "spec.suspend is false: a new cluster is prepared",
        );
        // Initializing starts afresh (a new transition time for the initializing timeout).
        status.conditions.retain(|c| {
            c.type_ != condition_types::READY && c.type_ != condition_types::UPGRADE_IN_PROGRESS
        });
    }
    Ok(None)
}

/// Deletes the RayService's own Gateway and HTTPRoute (never a shared Gateway, never someone
/// else's object of those names); returns how many were still there.
async fn delete_gateway_objects(service: &RayService, ctx: &Context) -> usize {
    use super::gateway::{self, Gateway, HTTPRoute};
    let namespace = service.namespace().unwrap_or_default();
    let (_, shared) = gateway::parent(service);
    let mut remaining = 0;
    let route = delete_if_ours::<HTTPRoute>(
        service,
        ctx,
        &namespace,
        &gateway::http_route_name(service),
        [
            reasons::DELETED_HTTP_ROUTE,
            reasons::FAILED_TO_DELETE_HTTP_ROUTE,
        ],
    )
    .await;
    remaining += usize::from(route);
    if !shared {
        let gw = delete_if_ours::<Gateway>(
            service,
            ctx,
            &namespace,
            &gateway::gateway_name(service),
            [reasons::DELETED_GATEWAY, reasons::FAILED_TO_DELETE_GATEWAY],
        )
        .await;
        remaining += usize::from(gw);
    }
    remaining
}

/// Deletes `name` if the RayService controls it; true when it was still there.
async fn delete_if_ours<K>(
    service: &RayService,
    ctx: &Context,
    namespace: &str,
    name: &str,
    [deleted, failed]: [&str; 2],
) -> bool
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let kind = K::kind(&()).into_owned();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let found = match api.get_opt(name).await {
        Ok(Some(found)) if super::gateway::is_ours(found.meta(), service) => found,
        Ok(_) => return false,
        // No Gateway API installed, or not readable: nothing of ours to wait for.
        Err(kube::Error::Api(e)) if e.code == 404 => return false,
        Err(e) => {
            warn!(error = %e, %kind, "reading failed");
            return true;
        }
    };
    if found.meta().deletion_timestamp.is_some() {
        return true;
    }
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: found.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            ctx.event(
                service,
                EventType::Normal,
                deleted,
                "Delete",
                format!("deleted {kind} {name}"),
            )
            .await
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => {
            ctx.event(
                service,
                EventType::Warning,
                failed,
                "Delete",
                format!("deleting {kind} {name} failed: {e}"),
            )
            .await
        }
    }
    true
}
