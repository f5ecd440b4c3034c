//! The stages of one RayService pass, as the frame runs them (`controllers::frame::pass`):
//! observe (caches) → validate → act (suspend → build the desired clusters and Services, pure →
//! apply clusters, Serve, the Gateway API objects of an incremental upgrade, the traffic switch;
//! the act stage owns the order) → status → finish, each step one call into its own file.

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
use super::suspend::reconcile_suspend;
use super::upgrade::Desired;
use super::{admission, apply, build, incremental, reasons, serve, status, upgrade};
use crate::api::conditions::FALSE;
use crate::api::raycluster::RayCluster;
use crate::api::rayservice::{RayService, RayServiceStatus, condition_reasons, condition_types};
use crate::controllers::frame::pass::{Acted, Flow, Stages, StatusWrite};
use crate::k8s::field_managers;
use crate::validation::problem::Problem;
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

/// What a RayService pass reads.
pub struct Seen {
    service: Arc<RayService>,
    /// The status last written: this controller's memory (the cache may not show it yet), else
    /// the cache's.
    written: Option<RayServiceStatus>,
    /// The RayClusters this RayService owns.
    clusters: Vec<Arc<RayCluster>>,
    now: Time,
}

impl Stages<RayService> for Context {
    type Observed = Seen;
    type Valid = Validated<RayService>;
    type Status = RayServiceStatus;
    type Applied = Action;
    type Error = Error;
    const FIELD_MANAGER: &'static str = field_managers::RAYSERVICE;

    fn kube(&self) -> (&kube::Client, &crate::k8s::EventRecorder) {
        (&self.client, &self.recorder)
    }

    /// A deleted RayService is left to the garbage collector, which deletes the owned clusters
    /// and Services (the default `finalize`).
    async fn observe(
        self: &Arc<Self>,
        service: Arc<RayService>,
    ) -> Result<Flow<RayService, Seen>, Error> {
        self.wait_for_caches().await?;
        if crate::kuberay::spec::managed_elsewhere(service.spec.managed_by.as_deref()) {
            return Ok(Flow::Done(Action::await_change()));
        }
        if service.meta().deletion_timestamp.is_some() {
            return Ok(Flow::Deleting(service));
        }
        let written = self
            .with_memory(&service, |m| m.last_status.clone())
            .or_else(|| service.status.clone());
        let clusters = self.owned_clusters(&service);
        Ok(Flow::Go(Seen {
            service,
            written,
            clusters,
            now: crate::k8s::now(),
        }))
    }

    fn object(seen: &Seen) -> &RayService {
        &seen.service
    }

    /// Every problem the rule book finds, in one message.
    fn validate(&self, seen: &Seen) -> Result<Validated<RayService>, Problem> {
        crate::validation::rayservice::validate(&seen.service, &self.config.feature_gates).map_err(
            |problems| {
                let message = crate::validation::problem::join(&problems.into_vec());
                Problem::new("spec", reasons::INVALID_SPEC, message)
            },
        )
    }

    /// A refused spec is named in the Ready condition.
    fn refused(&self, seen: &Seen, problem: &Problem) -> Result<Option<RayServiceStatus>, Error> {
        let generation = seen.service.meta().generation;
        let mut status = seen.written.clone().unwrap_or_default();
        status::set(
            &mut status,
            condition_types::READY,
            FALSE,
            condition_reasons::VALIDATION_FAILED,
            &problem.message,
            generation,
            seen.now.clone(),
        );
        status.service_status = None;
        status.observed_generation = generation;
        Ok(Some(status))
    }

    async fn act(
        self: &Arc<Self>,
        seen: &Seen,
        valid: Validated<RayService>,
    ) -> Acted<RayServiceStatus, Action, Error> {
        act(seen, self, valid).await.unwrap_or_else(Acted::failed)
    }

    fn plan_write(&self, seen: &Seen, status: &RayServiceStatus) -> StatusWrite {
        if status::differs(seen.written.as_ref(), status) {
            StatusWrite::Now
        } else {
            StatusWrite::Skip
        }
    }

    fn stamp(&self, status: &mut RayServiceStatus) {
        status.last_update_time = Some(crate::k8s::now());
    }

    fn remember(&self, seen: &Seen, status: RayServiceStatus, write: StatusWrite) {
        if write == StatusWrite::Now {
            self.with_memory(&seen.service, |m| m.last_status = Some(status));
        }
    }

    async fn finish(
        &self,
        _: &Seen,
        action: Result<Action, Error>,
        _: StatusWrite,
    ) -> Result<Action, Error> {
        action
    }
}

/// The act stage: suspend → build (the desired clusters and Services, pure) → apply (clusters,
/// Serve, the Gateway API objects of an incremental upgrade, the traffic switch; in that order)
/// → the status to write.
async fn act(
    seen: &Seen,
    ctx: &Context,
    valid: Validated<RayService>,
) -> Result<Acted<RayServiceStatus, Action, Error>, Error> {
    let (service, clusters, now) = (&*seen.service, &seen.clusters, &seen.now);
    let generation = service.meta().generation;
    let mut status = seen.written.clone().unwrap_or_default();
    let done = |status: RayServiceStatus, action: Action| Acted {
        status: Some(status),
        result: Ok(action),
    };

    // Suspend.
    if let Some(action) = reconcile_suspend(service, ctx, &mut status, clusters).await? {
        return Ok(done(status, action));
    }

    // A RayService that did not start in time stays failed; only cleanup goes on.
    if status::reason(&status.conditions, condition_types::READY)
        == Some(condition_reasons::INITIALIZING_TIMEOUT)
    {
        let action = stay_failed(service, ctx, &mut status, clusters).await;
        return Ok(done(status, action));
    }

    // Build: the desired clusters and Services (pure).
    let mut desired = upgrade::desired(service, &status, clusters, &ctx.config.build);
    desired.initializing_timeout = valid.initializing_timeout;
    // Per-cluster admission: an upgrade whose cluster Kueue did not admit in time is given up.
    if admission::give_up_unadmitted(service, ctx, &desired, &mut status, now).await? {
        return Ok(done(status, Action::requeue(SHORT_REQUEUE)));
    }

    // Apply: clusters first, then Serve on the cluster it belongs to, then the traffic switch.
    let dangling_left =
        match apply::clusters(service, ctx, &mut desired, &mut status, generation, now).await? {
            // The pass ends and comes back shortly; its status is not written.
            ClustersApplied::PendingCreated => {
                return Ok(Acted {
                    status: None,
                    result: Ok(Action::requeue(SHORT_REQUEUE)),
                });
            }
            // The Ready condition names what blocks the first cluster; the pass fails.
            ClustersApplied::Blocked(error) => {
                return Ok(Acted {
                    status: Some(status),
                    result: Err(error),
                });
            }
            ClustersApplied::Applied { dangling_left } => dangling_left,
        };
    // An incremental upgrade: a rollback starts when the spec moved, and the pass's
    // capacities are decided before Serve takes them.
    let incremental = incremental::options(service, &ctx.config.feature_gates).cloned();
    if let Some(options) = &incremental {
        upgrade::detect_rollback(service, ctx, &desired, &mut status, now).await;
        desired.incremental =
            Some(upgrade::incremental_plan(service, ctx, options, &desired, &status).await);
    }
    let traffic = upgrade::traffic(service, ctx, &desired, &status);
    let mut observed = serve::reconcile_clusters(service, ctx, &desired, traffic).await;
    if let Some(plan) = &desired.incremental {
        apply::gateway_objects(service, ctx, plan, &desired, &observed, &mut status, now).await?;
    }
    if let Some(target) = upgrade::traffic_target(&mut desired, &observed, &status) {
        apply_services(service, ctx, target).await?;
        observed.traffic.routed_to = Some(target.cluster.name_any());
    }

    // Status.
    let action = record_status(
        service,
        ctx,
        &mut status,
        &desired,
        &observed,
        dangling_left,
        now,
    )
    .await?;
    Ok(done(status, action))
}

/// The status stage: the clusters after the switch, the Serve endpoints, the conditions (and
/// the initializing timeout), written when changed; settled RayServices are polled slowly.
async fn record_status(
    service: &RayService,
    ctx: &Context,
    status: &mut RayServiceStatus,
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
    } = upgrade::advance(service, ctx, status, desired, observed, now).await;
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
        status,
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
    Ok(Action::requeue(if settled {
        ctx.config.steady_poll
    } else {
        SHORT_REQUEUE
    }))
}

/// After the initializing timeout: no cluster is active or pending, and every cluster goes.
async fn stay_failed(
    service: &RayService,
    ctx: &Context,
    status: &mut RayServiceStatus,
    clusters: &[Arc<RayCluster>],
) -> Action {
    status.active_service_status = None;
    status.pending_service_status = None;
    let remaining = delete_clusters(service, ctx, clusters, Duration::ZERO).await;
    if remaining > 0 {
        Action::requeue(SHORT_REQUEUE)
    } else {
        Action::await_change()
    }
}
