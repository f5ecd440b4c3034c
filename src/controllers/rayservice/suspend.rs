//! The suspend state machine of a RayService: Suspending deletes every cluster and Service
//! (and the Gateway and HTTPRoute of an incremental upgrade), Suspended waits, a resume starts
//! initializing afresh.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::apply::delete_clusters;
use super::config::SHORT_REQUEUE;
use super::context::Context;
use super::error::Error;
use super::{build, reasons, status};
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
    let stamp = Stamp {
        generation: service.meta().generation,
        now: crate::k8s::now(),
    };
    let requested = service.spec.suspend == Some(true);
    let suspending = status::is_true(&status.conditions, condition_types::SUSPENDING);
    let suspended = status::is_true(&status.conditions, condition_types::SUSPENDED);
    if requested && !suspending && !suspended {
        start_suspending(status, &stamp);
        return Ok(Some(Action::requeue(SHORT_REQUEUE)));
    }
    if suspending {
        let remaining = delete_everything(service, ctx, clusters).await;
        return Ok(Some(report_suspending(status, &stamp, remaining)));
    }
    if suspended {
        if requested {
            return Ok(Some(Action::await_change()));
        }
        resume(status, &stamp);
    }
    Ok(None)
}

/// The generation and time the conditions of one pass are stamped with.
struct Stamp {
    generation: Option<i64>,
    now: Time,
}

impl Stamp {
    fn set(
        &self,
        status: &mut RayServiceStatus,
        type_: &str,
        value: &str,
        reason: &str,
        message: &str,
    ) {
        status::set(
            status,
            type_,
            value,
            reason,
            message,
            self.generation,
            self.now.clone(),
        )
    }

    /// While suspending and once suspended: not ready, not upgrading, not rolling back.
    fn nothing_serves(&self, status: &mut RayServiceStatus, reason: &str, message: &str) {
        for type_ in [
            condition_types::READY,
            condition_types::UPGRADE_IN_PROGRESS,
            condition_types::ROLLBACK_IN_PROGRESS,
        ] {
            self.set(status, type_, FALSE, reason, message);
        }
    }
}

/// A suspension was just requested: Suspending, nothing ready or upgrading, no Serve status.
fn start_suspending(status: &mut RayServiceStatus, stamp: &Stamp) {
    stamp.set(
        status,
        condition_types::SUSPENDING,
        TRUE,
        condition_reasons::SUSPEND_REQUESTED,
        "spec.suspend is true: the clusters and Services are being deleted",
    );
    stamp.nothing_serves(status, condition_reasons::SUSPEND_IN_PROGRESS, "suspending");
    status.active_service_status = None;
    status.pending_service_status = None;
    status.num_serve_endpoints = Some(0);
    status.service_status = None;
    status.observed_generation = stamp.generation;
}

/// Deletes the clusters, the Services and (for an incremental upgrade) the Gateway objects,
/// and forgets what was pushed and applied; returns how many objects were still there.
async fn delete_everything(
    service: &RayService,
    ctx: &Context,
    clusters: &[Arc<RayCluster>],
) -> usize {
    let mut remaining = delete_clusters(service, ctx, clusters, Duration::ZERO).await;
    remaining += delete_services(service, ctx).await;
    if super::incremental::options(service, &ctx.config.feature_gates).is_some() {
        remaining += delete_gateway_objects(service, ctx).await;
    }
    ctx.with_memory(service, |m| {
        m.pushed.clear();
        m.applied_services.clear();
    });
    remaining
}

/// Deletes the RayService's own head and Serve Services; returns how many were still there.
async fn delete_services(service: &RayService, ctx: &Context) -> usize {
    let mut remaining = 0;
    let namespace = service.namespace().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    for name in [
        build::head_service_name(service),
        build::serve_service_name(service),
    ] {
        // Someone else's Service of that name is not ours to delete.
        let Some(cached) = ctx
            .cached_service(&namespace, &name)
            .filter(|s| crate::k8s::is_controlled_by(s.meta(), &service.uid().unwrap_or_default()))
        else {
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
    remaining
}

/// The conditions after a Suspending pass that found `remaining` objects still there: still
/// Suspending (checked again soon), or Suspended.
fn report_suspending(status: &mut RayServiceStatus, stamp: &Stamp, remaining: usize) -> Action {
    if remaining > 0 {
        stamp.set(
            status,
            condition_types::SUSPENDING,
            TRUE,
            condition_reasons::SUSPEND_IN_PROGRESS,
            &format!("{remaining} cluster(s) and Service(s) left to delete"),
        );
        return Action::requeue(SHORT_REQUEUE);
    }
    stamp.set(
        status,
        condition_types::SUSPENDING,
        FALSE,
        condition_reasons::SUSPEND_COMPLETE,
        "suspended",
    );
    stamp.set(
        status,
        condition_types::SUSPENDED,
        TRUE,
        condition_reasons::SUSPEND_COMPLETE,
        "every cluster and Service of the RayService is deleted",
    );
    stamp.nothing_serves(status, condition_reasons::SUSPEND_COMPLETE, "suspended");
    Action::await_change()
}

/// `spec.suspend` turned false: no longer Suspended, and initializing starts afresh.
fn resume(status: &mut RayServiceStatus, stamp: &Stamp) {
    stamp.set(
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
