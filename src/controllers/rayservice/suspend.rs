//! The suspend state machine of a RayService: Suspending deletes every cluster and Service,
//! Suspended waits, a resume starts initializing afresh.

use super::apply::delete_clusters;
use super::*;

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
        for t in [condition_types::READY, condition_types::UPGRADE_IN_PROGRESS] {
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
        for t in [condition_types::READY, condition_types::UPGRADE_IN_PROGRESS] {
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
