//! One RayService pass: the frame (span, metrics, per-object backoff) around
//! `reconcile_inner`, which reads get → validate → suspend → build (the desired clusters and
//! Services, pure) → apply (clusters, Serve, traffic switch; the apply stage owns the order) →
//! status, each stage one call into its own file.

use super::apply::{
    apply_services, count_serve_endpoints, create_cluster, delete_clusters, update_cluster,
};
use super::serve::{label_head_pod, reconcile_serve};
use super::status::{fill_cluster_status, write_status_if_changed};
use super::suspend::reconcile_suspend;
use super::upgrade::needs_new_cluster;
use super::*;

impl crate::controllers::frame::ReportPanic<RayService> for Context {
    fn report_panic(
        &self,
        object: Arc<RayService>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        crate::controllers::frame::panic_event(&self.recorder, object, message)
    }
}

pub(super) fn error_policy(service: Arc<RayService>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.with_memory(&service, |m| {
        m.consecutive_failures = m.consecutive_failures.saturating_add(1);
        m.consecutive_failures
    });
    let backoff = crate::k8s::failure_backoff(failures);
    warn!(
        namespace = %service.namespace().unwrap_or_default(),
        name = %service.name_any(),
        error = %error,
        retry_in = ?backoff,
        "RayService reconcile failed"
    );
    Action::requeue(backoff)
}

pub(super) async fn reconcile(
    service: Arc<RayService>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let span = tracing::info_span!(
        "reconcile",
        kind = "RayService",
        namespace = %service.namespace().unwrap_or_default(),
        name = %service.name_any()
    );
    ctx.queue.started(service.namespace(), &service.name_any());
    let timer = ctx.config.metrics.reconcile_started("rayservice");
    let result = async move {
        ctx.wait_for_caches().await?;
        let action = reconcile_inner(&service, &ctx).await?;
        ctx.with_memory(&service, |m| m.consecutive_failures = 0);
        Ok(action)
    }
    .instrument(span)
    .await;
    timer.finish(result.as_ref().err().map(Error::category));
    result
}

pub(super) async fn reconcile_inner(service: &RayService, ctx: &Context) -> Result<Action, Error> {
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
    let problems =
        crate::webhook::rules::rayservice(service, &crate::config::FeatureGates::default());
    if !problems.is_empty() {
        let message = problems.join("; ");
        warn!(%message, "RayService refused");
        ctx.event(
            service,
            EventType::Warning,
            reasons::INVALID_SPEC,
            "Validate",
            message.clone(),
        )
        .await;
        status::set(
            &mut status,
            condition_types::READY,
            FALSE,
            condition_reasons::VALIDATION_FAILED,
            &message,
            generation,
            now,
        );
        status.service_status = None;
        status.observed_generation = generation;
        write_status_if_changed(service, ctx, status).await?;
        return Ok(Action::await_change());
    }

    // Suspend.
    if let Some(action) = reconcile_suspend(service, ctx, &mut status, &clusters).await? {
        write_status_if_changed(service, ctx, status).await?;
        return Ok(action);
    }

    // A RayService that did not start in time stays failed; only cleanup goes on.
    if status::reason(&status.conditions, condition_types::READY)
        == Some(condition_reasons::INITIALIZING_TIMEOUT)
    {
        status.active_service_status = None;
        status.pending_service_status = None;
        let remaining = delete_clusters(service, ctx, &clusters, Duration::ZERO).await;
        write_status_if_changed(service, ctx, status).await?;
        return Ok(if remaining > 0 {
            Action::requeue(SHORT_REQUEUE)
        } else {
            Action::await_change()
        });
    }

    let active_name = status
        .active_service_status
        .as_ref()
        .and_then(|s| s.ray_cluster_name.clone());
    let pending_name = status
        .pending_service_status
        .as_ref()
        .and_then(|s| s.ray_cluster_name.clone());
    let find = |name: &Option<String>| {
        name.as_ref()
            .and_then(|n| clusters.iter().find(|c| &c.name_any() == n).cloned())
    };
    let active = find(&active_name);
    let pending = find(&pending_name);

    // Clusters neither active nor pending go after the deletion delay.
    let keep: BTreeSet<&str> = [active_name.as_deref(), pending_name.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    let dangling: Vec<Arc<RayCluster>> = clusters
        .iter()
        .filter(|c| !keep.contains(c.name_any().as_str()))
        .cloned()
        .collect();
    let delay = service
        .spec
        .ray_cluster_deletion_delay_seconds
        .map_or(DEFAULT_DELETION_DELAY, |s| {
            Duration::from_secs(u64::try_from(s).unwrap_or(0))
        });
    let mut dangling_left = delete_clusters(service, ctx, &dangling, delay).await;

    // The pending cluster named in the status is created here (its name is recorded first, so
    // a crash in between never makes two).
    if let Some(name) = &pending_name
        && pending.is_none()
    {
        if let Err(e) = create_cluster(service, ctx, name).await {
            // A first cluster blocked by someone else's RayCluster: say so where people look.
            if let Error::Apply(k) = &e
                && let Some(reason) = k.conflict_reason()
                && active.is_none()
            {
                status::set(
                    &mut status,
                    condition_types::READY,
                    FALSE,
                    reason,
                    &k.to_string(),
                    generation,
                    now,
                );
                write_status_if_changed(service, ctx, status).await?;
            }
            return Err(e);
        }
        return Ok(Action::requeue(SHORT_REQUEUE));
    }
    let goal = build::goal_spec(service);
    if let Some(cluster) = &active
        && pending.is_none()
        && build::classify(cluster, &goal, true) == ClusterChange::InPlace
    {
        update_cluster(service, ctx, cluster).await?;
    }
    if let Some(cluster) = &pending
        && build::classify(cluster, &goal, false) == ClusterChange::InPlace
    {
        update_cluster(service, ctx, cluster).await?;
    }

    let namespace = service.namespace().unwrap_or_default();
    let serve_service_name = build::serve_service_name(service);
    let routed_to: Option<String> = ctx
        .cached_service(&namespace, &serve_service_name)
        .and_then(|s| build::selected_cluster(&s).map(str::to_owned));
    let needs_new_cluster = needs_new_cluster(
        service,
        ctx,
        active.as_deref(),
        pending.as_deref(),
        routed_to.as_deref(),
        &status,
    );

    // Serve: the pending cluster while there is one; the active one otherwise (never both:
    // a combined cluster + config change must not reach the cluster being replaced).
    let pending_obs = match &pending {
        Some(cluster) => Some(reconcile_serve(service, ctx, cluster).await),
        None => None,
    };
    let active_obs = match &active {
        Some(cluster) if pending.is_none() && !needs_new_cluster => {
            Some(reconcile_serve(service, ctx, cluster).await)
        }
        _ => None,
    };
    for (cluster, obs) in [(&active, &active_obs), (&pending, &pending_obs)] {
        if let (Some(cluster), Some(obs)) = (cluster, obs)
            && obs.apps.is_some()
        {
            let serving = obs.head_proxy_healthy
                && !service
                    .spec
                    .exclude_head_pod_from_serve_svc
                    .unwrap_or(false);
            label_head_pod(service, ctx, cluster, serving).await;
        }
    }

    // The traffic switch: both Services follow the pending cluster once its applications run,
    // else stay on (or go to) the active one.
    let target = match (&pending, &pending_obs, &active, &active_obs) {
        (Some(p), Some(obs), _, _) if obs.ready => Some(p.clone()),
        (_, _, Some(a), Some(obs)) if obs.ready => Some(a.clone()),
        _ => None,
    };
    let mut routed_to = routed_to;
    if let Some(target) = &target {
        apply_services(service, ctx, target).await?;
        routed_to = Some(target.name_any());
    }

    // Status.
    let mut active_status = status.active_service_status.clone().unwrap_or_default();
    let mut pending_status = status.pending_service_status.clone().unwrap_or_default();
    fill_cluster_status(&mut active_status, active.as_deref(), active_obs.as_ref());
    fill_cluster_status(
        &mut pending_status,
        pending.as_deref(),
        pending_obs.as_ref(),
    );
    if let (Some(routed), Some(pending_cluster)) = (&routed_to, &pending_name)
        && routed == pending_cluster
    {
        info!(cluster = %routed, "traffic switched to the new cluster; it is now active");
        // An upgrade (not the first start): from UpgradeInProgress=True to the switch.
        if active_name.is_some()
            && let Some(since) = crate::api::conditions::find(
                &status.conditions,
                condition_types::UPGRADE_IN_PROGRESS,
            )
            .filter(|c| c.status == TRUE)
            .map(|c| c.last_transition_time.0)
            && let Ok(took) = Duration::try_from(now.0.duration_since(since))
        {
            ctx.config.metrics.rayservice_upgraded(took);
        }
        active_status = pending_status;
        pending_status = RayServiceClusterStatus::default();
        // The old active cluster is now dangling: its deletion delay starts now.
        dangling_left += 1;
    }
    let now_active = active_status.ray_cluster_name.clone();
    let now_pending = if needs_new_cluster && pending_status.ray_cluster_name.is_none() {
        let name = build::new_cluster_name(service);
        info!(cluster = %name, "a new RayCluster will be prepared");
        if now_active.is_some()
            && service
                .spec
                .upgrade_strategy
                .as_ref()
                .and_then(|u| u.type_.as_ref())
                == Some(&crate::api::rayservice::RayServiceUpgradeType::NewClusterWithIncrementalUpgrade)
        {
            ctx.event(
                service,
                EventType::Warning,
                reasons::INCREMENTAL_UPGRADE_NOT_SUPPORTED,
                "Upgrade",
                format!("raypipe does not move traffic step by step (NewClusterWithIncrementalUpgrade): RayCluster {name} takes all traffic at once when its applications run, as with NewCluster"),
            )
            .await;
        }
        pending_status = RayServiceClusterStatus {
            ray_cluster_name: Some(name.clone()),
            ..Default::default()
        };
        Some(name)
    } else {
        pending_status.ray_cluster_name.clone()
    };
    status.active_service_status =
        (active_status != RayServiceClusterStatus::default()).then_some(active_status);
    status.pending_service_status =
        (pending_status != RayServiceClusterStatus::default()).then_some(pending_status);

    let num_endpoints = match &routed_to {
        Some(_) => count_serve_endpoints(ctx, &namespace, &serve_service_name).await?,
        None => 0,
    };
    status.num_serve_endpoints = Some(num_endpoints);
    let waiting_for = pending_obs
        .as_ref()
        .and_then(|o| o.waiting_for.clone())
        .or_else(|| active_obs.as_ref().and_then(|o| o.waiting_for.clone()))
        .or_else(|| {
            (now_active.is_none() && now_pending.is_some())
                .then(|| "the RayCluster is being created".to_owned())
        });
    let initializing_timeout = service
        .annotations()
        .get(crate::webhook::rules::ANNOTATION_INITIALIZING_TIMEOUT)
        .and_then(|t| crate::validation::duration::parse_seconds_or_duration(t).ok());
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
        && active_obs.as_ref().is_some_and(|o| o.ready)
        && dangling_left == 0;
    write_status_if_changed(service, ctx, status).await?;
    Ok(Action::requeue(if settled {
        ctx.config.steady_poll
    } else {
        SHORT_REQUEUE
    }))
}
