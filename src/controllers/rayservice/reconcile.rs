//! One RayService pass inside the shared frame (`controllers::frame::run`: span, metrics,
//! per-object backoff): `reconcile_inner` reads get → validate → suspend → build (the desired clusters and
//! Services, pure) → apply (clusters, Serve, the Gateway API objects of an incremental upgrade,
//! traffic switch; the apply stage owns the order) → status, each stage one call into its own
//! file.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::apply::{ClustersApplied, apply_services, count_serve_endpoints, delete_clusters};
use super::config::SHORT_REQUEUE;
use super::context::Context;
use super::error::Error;
use super::observed::Observed;
use super::status::write_status_if_changed;
use super::suspend::reconcile_suspend;
use super::upgrade::Desired;
use super::{apply, build, incremental, reasons, serve, status, upgrade};
use crate::api::conditions::FALSE;
use crate::api::raycluster::RayCluster;
use crate::api::rayservice::{RayService, RayServiceStatus, condition_reasons, condition_types};
use crate::controllers::frame::refuse::refuse;
use crate::validation::validated::Validated;

impl crate::controllers::frame::ReportPanic<RayService> for Context {
    fn report_panic(
        &self,
        object: Arc<RayService>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        crate::controllers::frame::panic_event(&self.recorder, object, message)
    }
}

/// The stage sequence inside the frame (span, metrics, backoff: `controllers::frame::run`).
pub(super) async fn reconcile(
    service: Arc<RayService>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.wait_for_caches().await?;
    reconcile_inner(&service, &ctx).await
}

/// One pass over a RayService: validate → suspend → build → apply → status.
async fn reconcile_inner(service: &RayService, ctx: &Context) -> Result<Action, Error> {
    use crate::api::raycluster::MANAGED_BY_KUBERAY;
    if service
        .spec
        .managed_by
        .as_deref()
        .is_some_and(|m| m != MANAGED_BY_KUBERAY)
    {
        return Ok(Action::await_change());
    }
    if service.meta().deletion_timestamp.is_some() {
        // The garbage collector deletes the owned clusters and Services.
        return Ok(Action::await_change());
    }
    let now = crate::k8s::now();
    let generation = service.meta().generation;
    let mut status = ctx
        .with_memory(service, |m| m.last_status.clone())
        .or_else(|| service.status.clone())
        .unwrap_or_default();
    let clusters = ctx.owned_clusters(service);

    // Validate.
    let valid = match validate(service, ctx, &mut status, generation, &now).await? {
        Ok(valid) => valid,
        Err(action) => return Ok(action),
    };

    // Suspend.
    if let Some(action) = reconcile_suspend(service, ctx, &mut status, &clusters).await? {
        write_status_if_changed(service, ctx, status).await?;
        return Ok(action);
    }

    // A RayService that did not start in time stays failed; only cleanup goes on.
    if status::reason(&status.conditions, condition_types::READY)
        == Some(condition_reasons::INITIALIZING_TIMEOUT)
    {
        return stay_failed(service, ctx, status, &clusters).await;
    }

    // Build: the desired clusters and Services (pure).
    let mut desired = upgrade::desired(service, &status, &clusters, &ctx.config.build);
    desired.initializing_timeout = valid.initializing_timeout;

    // Apply: clusters first, then Serve on the cluster it belongs to, then the traffic switch.
    let dangling_left =
        match apply::clusters(service, ctx, &mut desired, &mut status, generation, &now).await? {
            ClustersApplied::PendingCreated => return Ok(Action::requeue(SHORT_REQUEUE)),
            ClustersApplied::Applied { dangling_left } => dangling_left,
        };
    // An incremental upgrade: a rollback starts when the spec moved, and the pass's
    // capacities are decided before Serve takes them.
    let incremental = incremental::options(service, &ctx.config.feature_gates).cloned();
    if let Some(options) = &incremental {
        upgrade::detect_rollback(service, ctx, &desired, &mut status, &now).await;
        desired.incremental =
            Some(upgrade::incremental_plan(service, ctx, options, &desired, &status).await);
    }
    let traffic = upgrade::traffic(service, ctx, &desired, &status);
    let mut observed = serve::reconcile_clusters(service, ctx, &desired, traffic).await;
    if let Some(plan) = &desired.incremental {
        apply::gateway_objects(service, ctx, plan, &desired, &observed, &mut status, &now).await?;
    }
    if let Some(target) = upgrade::traffic_target(&mut desired, &observed, &status) {
        apply_services(service, ctx, target).await?;
        observed.traffic.routed_to = Some(target.cluster.name_any());
    }

    // Status.
    record_status(
        service,
        ctx,
        status,
        &desired,
        &observed,
        dangling_left,
        &now,
    )
    .await
}

/// The status stage: the clusters after the switch, the Serve endpoints, the conditions (and
/// the initializing timeout), written when changed; settled RayServices are polled slowly.
async fn record_status(
    service: &RayService,
    ctx: &Context,
    mut status: RayServiceStatus,
    desired: &Desired,
    observed: &Observed,
    mut dangling_left: usize,
    now: &Time,
) -> Result<Action, Error> {
    let generation = service.meta().generation;
    let upgrade::Advanced {
        now_active,
        now_pending,
        promoted,
    } = upgrade::advance(service, ctx, &mut status, desired, observed, now).await;
    if promoted {
        dangling_left += 1;
    }
    let namespace = service.namespace().unwrap_or_default();
    // During an incremental upgrade both clusters serve (KubeRay counts their per-cluster
    // serve Services); a Pod behind several of them counts once.
    let mut serve_services = vec![build::serve_service_name(service)];
    if desired.incremental.is_some() {
        serve_services.extend(
            [desired.active_cluster(), desired.pending_cluster()]
                .into_iter()
                .flatten()
                .map(|c| crate::kuberay::names::serve_service_name(&c.name_any())),
        );
    }
    let num_endpoints = match &observed.traffic.routed_to {
        Some(_) => count_serve_endpoints(ctx, &namespace, &serve_services).await?,
        None => 0,
    };
    status.num_serve_endpoints = Some(num_endpoints);
    let waiting_for = observed
        .pending
        .as_ref()
        .and_then(|o| o.waiting_for.clone())
        .or_else(|| observed.active.as_ref().and_then(|o| o.waiting_for.clone()))
        .or_else(|| {
            (now_active.is_none() && now_pending.is_some())
                .then(|| "the RayCluster is being created".to_owned())
        });
    let initializing_timeout = desired.initializing_timeout;
    let timed_out = status::set_conditions(
        &mut status,
        &status::ConditionInputs {
            generation,
            num_serve_endpoints: num_endpoints,
            active_cluster: now_active.as_deref(),
            pending_cluster: now_pending.as_deref(),
            waiting_for,
            initializing_timeout,
            now: now.clone(),
        },
    );
    if timed_out {
        ctx.event(
            service,
            EventType::Warning,
            reasons::INITIALIZING_TIMEOUT,
            "Initialize",
            "the RayService did not become ready within ray.io/initializing-timeout; its clusters are deleted".to_owned(),
        )
        .await;
    }
    let settled = status::is_true(&status.conditions, condition_types::READY)
        && now_pending.is_none()
        && observed.active.as_ref().is_some_and(|o| o.ready)
        && dangling_left == 0;
    // A settled RayService's Serve is watched between passes, so a lost application is pushed
    // again within a second or two instead of at the next steady poll.
    let key = kube::runtime::reflector::ObjectRef::from_obj(service);
    match observed.active.as_ref().and_then(|o| o.watch.as_ref()) {
        Some((dashboard, applications)) if settled => ctx.serve_watches.watch(
            &key,
            dashboard,
            applications.clone(),
            ctx.config.steady_poll * 3,
        ),
        _ => ctx.serve_watches.unwatch(&key),
    }
    write_status_if_changed(service, ctx, status).await?;
    Ok(Action::requeue(if settled {
        ctx.config.steady_poll
    } else {
        SHORT_REQUEUE
    }))
}

/// The validate stage: a refused spec is named in an Event and the Ready condition, and the
/// pass ends (`Err`) after the status is written; else the values parsed on the way.
async fn validate(
    service: &RayService,
    ctx: &Context,
    status: &mut RayServiceStatus,
    generation: Option<i64>,
    now: &Time,
) -> Result<Result<Validated<RayService>, Action>, Error> {
    let problems = match crate::validation::rayservice::validate(service, &ctx.config.feature_gates)
    {
        Ok(valid) => return Ok(Ok(valid)),
        Err(problems) => problems.into_vec(),
    };
    let message = crate::validation::problem::join(&problems);
    let wait = refuse(&ctx.recorder, service, reasons::INVALID_SPEC, &message).await;
    status::set(
        status,
        condition_types::READY,
        FALSE,
        condition_reasons::VALIDATION_FAILED,
        &message,
        generation,
        now.clone(),
    );
    status.service_status = None;
    status.observed_generation = generation;
    write_status_if_changed(service, ctx, status.clone()).await?;
    Ok(Err(wait))
}

/// After the initializing timeout: no cluster is active or pending, and every cluster goes.
async fn stay_failed(
    service: &RayService,
    ctx: &Context,
    mut status: RayServiceStatus,
    clusters: &[Arc<RayCluster>],
) -> Result<Action, Error> {
    status.active_service_status = None;
    status.pending_service_status = None;
    let remaining = delete_clusters(service, ctx, clusters, Duration::ZERO).await;
    write_status_if_changed(service, ctx, status).await?;
    Ok(if remaining > 0 {
        Action::requeue(SHORT_REQUEUE)
    } else {
        Action::await_change()
    })
}
