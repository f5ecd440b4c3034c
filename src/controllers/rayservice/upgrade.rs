//! Zero-downtime cluster switching: the desired clusters and Services of a pass (pure), whether
//! a new pending cluster must be prepared (KubeRay's `shouldPrepareNewCluster`), which cluster
//! the Services should select, and the promotion of the pending cluster once traffic moved.
//! For `NewClusterWithIncrementalUpgrade` also the pass's plan (capacities, held configs,
//! rollback), from the step logic in `incremental`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use super::build::ClusterChange;
use super::config::DEFAULT_DELETION_DELAY;
use super::context::Context;
use super::observed::{Observed, Traffic};
use super::status::fill_cluster_status;
use super::{build, incremental, reasons, status};
use crate::api::conditions::TRUE;
use crate::api::raycluster::RayCluster;
use crate::api::rayservice::{
    RayService, RayServiceClusterStatus, RayServiceStatus, condition_reasons, condition_types,
};
use crate::controllers::raycluster::builders::{BuildError, BuildOptions};

/// What building produced: an object, or why it cannot be built (reported where it would have
/// been written, so a build error never stops an earlier write).
pub(super) type Built<T> = Result<T, BuildError>;

/// A cluster that may take traffic, with the head and serve Services that would select it.
pub(super) struct Candidate {
    pub(super) cluster: Arc<RayCluster>,
    /// Taken when traffic moves to this cluster.
    pub(super) services: Option<Built<[Service; 2]>>,
}

/// The desired clusters and Services of one pass, from the spec, the status and the cached
/// clusters. Building is pure; `apply` writes it in its own order.
pub(super) struct Desired {
    pub(super) active_name: Option<String>,
    pub(super) pending_name: Option<String>,
    pub(super) active: Option<Candidate>,
    pub(super) pending: Option<Candidate>,
    /// Clusters neither active nor pending: deleted after `deletion_delay`.
    pub(super) dangling: Vec<Arc<RayCluster>>,
    pub(super) deletion_delay: Duration,
    /// The pending cluster the status names but that does not exist yet (its name is recorded
    /// first, so a crash in between never makes two).
    pub(super) create: Option<(String, Built<RayCluster>)>,
    /// Existing clusters whose spec change is applied in place, with what they become.
    pub(super) update_in_place: Vec<(Arc<RayCluster>, Built<RayCluster>)>,
    /// The pass's plan of an incremental upgrade (set before Serve is reconciled).
    pub(super) incremental: Option<IncrementalPlan>,
    /// `ray.io/initializing-timeout`, as the rule book parsed it (set by the reconcile, which
    /// holds the validated values).
    pub(super) initializing_timeout: Option<Duration>,
}

impl Desired {
    pub(super) fn active_cluster(&self) -> Option<&RayCluster> {
        self.active.as_ref().map(|c| &*c.cluster)
    }

    pub(super) fn pending_cluster(&self) -> Option<&RayCluster> {
        self.pending.as_ref().map(|c| &*c.cluster)
    }
}

/// Builds the desired clusters and Services.
pub(super) fn desired(
    service: &RayService,
    status: &RayServiceStatus,
    clusters: &[Arc<RayCluster>],
    options: &BuildOptions,
) -> Desired {
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

    let keep: BTreeSet<&str> = [active_name.as_deref(), pending_name.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    let dangling: Vec<Arc<RayCluster>> = clusters
        .iter()
        .filter(|c| !keep.contains(c.name_any().as_str()))
        .cloned()
        .collect();
    let deletion_delay = service
        .spec
        .ray_cluster_deletion_delay_seconds
        .map_or(DEFAULT_DELETION_DELAY, |s| {
            Duration::from_secs(u64::try_from(s).unwrap_or(0))
        });

    let create = match (&pending_name, &pending) {
        (Some(name), None) => {
            let mut built = build::cluster(service, name, None);
            // KubeRay: a cluster that joins an incremental upgrade starts with the worker
            // counts the autoscaler gives it as its target_capacity grows.
            if active.is_some()
                && service
                    .spec
                    .upgrade_strategy
                    .as_ref()
                    .and_then(|u| u.type_)
                    == Some(crate::api::rayservice::RayServiceUpgradeType::NewClusterWithIncrementalUpgrade)
                && let Ok(cluster) = &mut built
            {
                for group in cluster.spec.worker_group_specs.iter_mut().flatten() {
                    group.replicas = None;
                }
            }
            Some((name.clone(), built))
        }
        _ => None,
    };
    let goal = build::goal_spec(service);
    let mut update_in_place = Vec::new();
    // Admitted per cluster, a cluster is never rewritten: a change is a new cluster.
    let in_place_allowed = !build::admitted_per_cluster(service);
    if let Some(cluster) = &active
        && pending.is_none()
        && in_place_allowed
        && build::classify(cluster, &goal, true) == ClusterChange::InPlace
    {
        update_in_place.push(cluster.clone());
    }
    if let Some(cluster) = &pending
        && in_place_allowed
        && build::classify(cluster, &goal, false) == ClusterChange::InPlace
    {
        update_in_place.push(cluster.clone());
    }
    // Admitted as a whole by Kueue: `rayClusterConfig.suspend` is its admission gate, and the
    // clusters follow it both ways (admission starts them, preemption stops them). KubeRay
    // takes it at creation only, which leaves a cluster created before admission suspended.
    let kueue_gate = build::admitted_as_a_whole(service);
    if kueue_gate {
        for cluster in [&active, &pending].into_iter().flatten() {
            if cluster.spec.suspend.unwrap_or(false) != goal.suspend.unwrap_or(false)
                && !update_in_place
                    .iter()
                    .any(|c: &Arc<RayCluster>| c.name_any() == cluster.name_any())
            {
                update_in_place.push(cluster.clone());
            }
        }
    }
    let update_in_place = update_in_place
        .into_iter()
        .map(|cluster| {
            let keep = (!kueue_gate).then_some(cluster.spec.suspend);
            let built = build::cluster(service, &cluster.name_any(), keep);
            (cluster, built)
        })
        .collect();

    let candidate = |cluster: Arc<RayCluster>| {
        let services = build::head_service(service, &cluster, options)
            .and_then(|head| Ok([head, build::serve_service(service, &cluster)?]));
        Candidate {
            cluster,
            services: Some(services),
        }
    };
    Desired {
        active_name,
        pending_name,
        active: active.map(candidate),
        pending: pending.map(candidate),
        dangling,
        deletion_delay,
        create,
        update_in_place,
        incremental: None,
        initializing_timeout: None,
    }
}

/// Reads where traffic goes now (the cached serve Service) and decides on a new cluster.
pub(super) fn traffic(
    service: &RayService,
    ctx: &Context,
    desired: &Desired,
    status: &RayServiceStatus,
) -> Traffic {
    let namespace = service.namespace().unwrap_or_default();
    let routed_to: Option<String> = ctx
        .cached_service(&namespace, &build::serve_service_name(service))
        .and_then(|s| build::selected_cluster(&s).map(str::to_owned));
    let needs_new_cluster = needs_new_cluster(
        service,
        ctx,
        desired.active_cluster(),
        desired.pending_cluster(),
        routed_to.as_deref(),
        status,
    );
    Traffic {
        routed_to,
        needs_new_cluster,
    }
}

/// The traffic switch: both Services follow the pending cluster once its applications run,
/// else stay on (or go to) the active one. During an incremental upgrade they stay on the
/// active cluster until the pending one takes all the route's traffic (at full capacity, as
/// the active cluster still is then): the serve Service never selects a cluster scaled to
/// nothing, and keeps its endpoints throughout.
pub(super) fn traffic_target<'a>(
    desired: &'a mut Desired,
    observed: &Observed,
    status: &RayServiceStatus,
) -> Option<&'a mut Candidate> {
    let pending_may_serve = match &desired.incremental {
        Some(plan) if plan.upgrading => {
            !plan.rolling_back
                && status
                    .pending_service_status
                    .as_ref()
                    .and_then(|p| p.traffic_routed_percent)
                    == Some(100)
        }
        _ => true,
    };
    match (
        &mut desired.pending,
        &observed.pending,
        &mut desired.active,
        &observed.active,
    ) {
        (Some(p), Some(obs), _, _) if obs.ready && pending_may_serve => Some(p),
        (_, _, Some(a), Some(obs)) if obs.ready => Some(a),
        _ => None,
    }
}

/// What an incremental upgrade decides for one pass before Serve is reconciled.
pub(super) struct IncrementalPlan {
    pub(super) options: crate::api::rayservice::ClusterUpgradeOptions,
    /// Both clusters exist: traffic and capacity move between them.
    pub(super) upgrading: bool,
    pub(super) rolling_back: bool,
    /// The Serve `target_capacity` each cluster must have after this pass.
    pub(super) capacity: std::collections::BTreeMap<String, i32>,
    /// Clusters whose Serve config is held (only `target_capacity` changes): the active one
    /// during an upgrade, the pending one during a rollback.
    pub(super) held: BTreeSet<String>,
    /// The Gateway and HTTPRoute as read this pass.
    pub(super) gateway: Option<super::gateway::Gateway>,
    pub(super) route: Option<super::gateway::HTTPRoute>,
}

/// Reads the Gateway API objects and decides the pass's capacities (capacity moves only once
/// the Gateway and the route are ready, as KubeRay requires).
pub(super) async fn incremental_plan(
    service: &RayService,
    ctx: &Context,
    options: &crate::api::rayservice::ClusterUpgradeOptions,
    desired: &Desired,
    status: &RayServiceStatus,
) -> IncrementalPlan {
    use super::gateway;
    let active_name = desired.active_cluster().map(|c| c.name_any());
    let pending_name = desired.pending_cluster().map(|c| c.name_any());
    let upgrading = active_name.is_some() && pending_name.is_some();
    let rolling_back =
        upgrading && status::is_true(&status.conditions, condition_types::ROLLBACK_IN_PROGRESS);
    let namespace = service.namespace().unwrap_or_default();
    let (parent, _) = gateway::parent(service);
    let gateways: Api<gateway::Gateway> = Api::namespaced(
        ctx.client.clone(),
        parent.namespace.as_deref().unwrap_or(&namespace),
    );
    let routes: Api<gateway::HTTPRoute> = Api::namespaced(ctx.client.clone(), &namespace);
    let found = gateways.get_opt(&parent.name).await;
    let gateway = found.unwrap_or_else(|e| {
        warn!(error = %e, "reading the Gateway failed");
        None
    });
    let route = routes
        .get_opt(&gateway::http_route_name(service))
        .await
        .unwrap_or_else(|e| {
            warn!(error = %e, "reading the HTTPRoute failed");
            None
        });
    let empty = RayServiceClusterStatus::default();
    let active_status = status.active_service_status.as_ref().unwrap_or(&empty);
    let pending_status = status.pending_service_status.as_ref().unwrap_or(&empty);
    let mut split = incremental::Split::of(active_status, pending_status);
    let routed = gateway.as_ref().is_some_and(gateway::gateway_ready)
        && route
            .as_ref()
            .is_some_and(|r| gateway::http_route_ready(r, &parent, &namespace));
    if upgrading && routed {
        let surge = options.max_surge_percent.unwrap_or(100);
        for (role, goal) in incremental::capacity_changes(split, surge, rolling_back) {
            match role {
                incremental::Role::Active => split.active_capacity = goal,
                incremental::Role::Pending => split.pending_capacity = goal,
            }
        }
    }
    let mut capacity = std::collections::BTreeMap::new();
    let mut held = BTreeSet::new();
    if let Some(name) = &active_name
        && (upgrading || active_status.target_capacity.is_some())
    {
        capacity.insert(name.clone(), split.active_capacity);
        if upgrading && !rolling_back {
            held.insert(name.clone());
        }
    }
    if let Some(name) = &pending_name
        && (upgrading || pending_status.target_capacity.is_some())
    {
        capacity.insert(name.clone(), split.pending_capacity);
        if rolling_back {
            held.insert(name.clone());
        }
    }
    IncrementalPlan {
        options: options.clone(),
        upgrading,
        rolling_back,
        capacity,
        held,
        gateway,
        route,
    }
}

/// Starts or cancels a rollback when the goal spec moved during an incremental upgrade
/// (KubeRay's `reconcileRollbackState`); an upgrade without its active cluster cannot roll
/// back and says so.
pub(super) async fn detect_rollback(
    service: &RayService,
    ctx: &Context,
    desired: &Desired,
    status: &mut RayServiceStatus,
    now: &Time,
) {
    if !status::is_true(&status.conditions, condition_types::UPGRADE_IN_PROGRESS) {
        return;
    }
    let (Some(active), Some(pending)) = (desired.active_cluster(), desired.pending_cluster())
    else {
        if desired.active_cluster().is_none() && desired.pending_name.is_some() {
            ctx.event(
                service,
                EventType::Warning,
                reasons::ROLLBACK_IMPOSSIBLE,
                "Reconcile",
                "the active RayCluster is gone: a rollback cannot be started".to_owned(),
            )
            .await;
        }
        return;
    };
    let goal = build::replacement_hash(&build::goal_spec(service));
    let hash = |c: &RayCluster| {
        c.annotations()
            .get(build::HASH_ANNOTATION)
            .cloned()
            .unwrap_or_default()
    };
    let rolling_back = status::is_true(&status.conditions, condition_types::ROLLBACK_IN_PROGRESS);
    match incremental::rollback_decision(&goal, &hash(active), &hash(pending), rolling_back) {
        incremental::Rollback::Start(why) => {
            info!(active = %active.name_any(), pending = %pending.name_any(), "rolling back the incremental upgrade");
            status::set(
                status,
                condition_types::ROLLBACK_IN_PROGRESS,
                TRUE,
                condition_reasons::DESIRED_CLUSTER_SPEC_CHANGED,
                why,
                service.meta().generation,
                now.clone(),
            );
        }
        incremental::Rollback::Cancel => {
            info!("the spec is the pending cluster's again: the rollback is cancelled");
            status
                .conditions
                .retain(|c| c.type_ != condition_types::ROLLBACK_IN_PROGRESS);
        }
        incremental::Rollback::Keep => {}
    }
}

/// Whether a new pending cluster must be prepared (KubeRay's `shouldPrepareNewCluster`).
pub(super) fn needs_new_cluster(
    service: &RayService,
    ctx: &Context,
    active: Option<&RayCluster>,
    pending: Option<&RayCluster>,
    routed_to: Option<&str>,
    status: &RayServiceStatus,
) -> bool {
    if status
        .pending_service_status
        .as_ref()
        .and_then(|p| p.ray_cluster_name.as_ref())
        .is_some()
        && pending.is_none()
    {
        return false;
    }
    if let (Some(p), Some(routed)) = (pending, routed_to)
        && p.name_any() == routed
    {
        return false;
    }
    let newest = match pending.or(active) {
        None => return active.is_none() && pending.is_none(),
        Some(c) => c,
    };
    let goal = build::goal_spec(service);
    if build::given_up(service, &goal) {
        return false;
    }
    let change = if build::admitted_per_cluster(service) {
        build::classify_admitted(newest, &goal)
    } else {
        build::classify(newest, &goal, false)
    };
    match change {
        ClusterChange::Replace => {
            // The pending cluster is already the newest: a second change replaces it too.
            build::zero_downtime(service, ctx.config.zero_downtime) && pending.is_none()
        }
        _ => false,
    }
}

/// The active and pending cluster after this pass's switch.
pub(super) struct Advanced {
    pub(super) now_active: Option<String>,
    pub(super) now_pending: Option<String>,
    /// The pending cluster took over: the old active one is dangling from now on.
    pub(super) promoted: bool,
}

/// Records the clusters in the status: the pending cluster becomes active once traffic moved
/// to it (the upgrade's duration is recorded), and a new pending cluster is named when one
/// must be prepared. In an incremental upgrade the pending cluster becomes active when the
/// upgrade is complete, and is dropped when a rollback is.
pub(super) async fn advance(
    service: &RayService,
    ctx: &Context,
    status: &mut RayServiceStatus,
    desired: &Desired,
    observed: &Observed,
    now: &Time,
) -> Advanced {
    let plan = desired.incremental.as_ref();
    let traffic = &observed.traffic;
    let mut active_status = status.active_service_status.clone().unwrap_or_default();
    let mut pending_status = status.pending_service_status.clone().unwrap_or_default();
    fill_cluster_status(
        &mut active_status,
        desired.active_cluster(),
        observed.active.as_ref(),
    );
    fill_cluster_status(
        &mut pending_status,
        desired.pending_cluster(),
        observed.pending.as_ref(),
    );
    let split = incremental::Split::of(&active_status, &pending_status);
    let promote = match plan {
        Some(plan) if plan.upgrading => !plan.rolling_back && incremental::upgrade_complete(split),
        _ => matches!(
            (&traffic.routed_to, &desired.pending_name),
            (Some(routed), Some(pending)) if routed == pending
        ),
    };
    let mut promoted = false;
    if promote && desired.pending.is_some() {
        info!(cluster = ?desired.pending_name, "traffic switched to the new cluster; it is now active");
        // An upgrade (not the first start): from UpgradeInProgress=True to the switch.
        if desired.active_name.is_some()
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
        promoted = true;
    }
    if let Some(plan) = plan
        && plan.upgrading
        && plan.rolling_back
    {
        let pending_head_ready = desired
            .pending_cluster()
            .is_some_and(|c| build::head_ready(c).is_ok());
        if incremental::rollback_complete(split, pending_head_ready) {
            info!(cluster = ?desired.pending_name, "rollback complete; the pending cluster is dropped");
            pending_status = RayServiceClusterStatus::default();
            status
                .conditions
                .retain(|c| c.type_ != condition_types::ROLLBACK_IN_PROGRESS);
            // The dropped cluster is dangling from now on.
            promoted = true;
        }
    }
    let now_active = active_status.ray_cluster_name.clone();
    let now_pending = if traffic.needs_new_cluster && pending_status.ray_cluster_name.is_none() {
        let name = build::new_cluster_name(service);
        info!(cluster = %name, "a new RayCluster will be prepared");
        pending_status = RayServiceClusterStatus {
            ray_cluster_name: Some(name.clone()),
            target_capacity: plan.map(|_| incremental::initial_capacity(now_active.is_some())),
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
    Advanced {
        now_active,
        now_pending,
        promoted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::rayservice::RayServiceClusterStatus;
    use build::tests::{service, spec};

    fn status(active: Option<&str>, pending: Option<&str>) -> RayServiceStatus {
        let named = |name: Option<&str>| {
            name.map(|n| RayServiceClusterStatus {
                ray_cluster_name: Some(n.to_owned()),
                ..Default::default()
            })
        };
        RayServiceStatus {
            active_service_status: named(active),
            pending_service_status: named(pending),
            ..Default::default()
        }
    }

    /// A cluster as the cache shows it (with the uid the API server gave it).
    fn cluster(service: &RayService, name: &str) -> Arc<RayCluster> {
        let mut cluster = build::cluster(service, name, None).expect("builds");
        cluster.metadata.uid = Some(format!("uid-{name}"));
        Arc::new(cluster)
    }

    #[test]
    fn a_pending_cluster_named_but_missing_is_built_for_creation_and_others_dangle() {
        let svc = service(spec("ray:1", 1, 1));
        let clusters = [cluster(&svc, "svc-old"), cluster(&svc, "svc-stray")];
        let desired = desired(
            &svc,
            &status(Some("svc-old"), Some("svc-new")),
            &clusters,
            &BuildOptions::default(),
        );
        let (name, built) = desired
            .create
            .as_ref()
            .expect("the pending cluster is to be created");
        assert_eq!(name, "svc-new");
        assert_eq!(built.as_ref().expect("builds").name_any(), "svc-new");
        let dangling: Vec<String> = desired.dangling.iter().map(|c| c.name_any()).collect();
        assert_eq!(dangling, ["svc-stray"]);
        assert_eq!(
            desired.active_cluster().map(|c| c.name_any()).as_deref(),
            Some("svc-old")
        );
        assert!(desired.pending.is_none());
        assert!(
            desired.update_in_place.is_empty(),
            "the spec did not change"
        );
    }

    #[test]
    fn a_cluster_joining_an_incremental_upgrade_leaves_worker_counts_to_the_autoscaler() {
        let mut svc = service(spec("ray:1", 3, 1));
        svc.spec.upgrade_strategy = Some(crate::api::rayservice::RayServiceUpgradeStrategy {
            type_: Some(
                crate::api::rayservice::RayServiceUpgradeType::NewClusterWithIncrementalUpgrade,
            ),
            cluster_upgrade_options: None,
        });
        let clusters = [cluster(&svc, "svc-old")];
        let replicas = |desired: &Desired| {
            let (_, built) = desired.create.as_ref().expect("a cluster to create");
            built
                .as_ref()
                .expect("builds")
                .spec
                .worker_group_specs
                .as_ref()
                .unwrap()[0]
                .replicas
        };
        let upgrade = desired(
            &svc,
            &status(Some("svc-old"), Some("svc-new")),
            &clusters,
            &BuildOptions::default(),
        );
        assert_eq!(replicas(&upgrade), None);
        let first = desired(
            &svc,
            &status(None, Some("svc-new")),
            &[],
            &BuildOptions::default(),
        );
        assert_eq!(replicas(&first), Some(3), "a first cluster keeps them");
    }

    #[test]
    fn a_replica_change_is_built_as_an_in_place_update_with_the_services_of_each_candidate() {
        let before = service(spec("ray:1", 1, 1));
        let clusters = [cluster(&before, "svc-old")];
        let after = service(spec("ray:1", 3, 1));
        let mut desired = desired(
            &after,
            &status(Some("svc-old"), None),
            &clusters,
            &BuildOptions::default(),
        );
        assert!(desired.create.is_none());
        let [(cluster, built)] = &desired.update_in_place[..] else {
            panic!("one in-place update expected");
        };
        assert_eq!(cluster.name_any(), "svc-old");
        let built = built.as_ref().expect("builds");
        assert_eq!(
            built.spec.worker_group_specs.as_ref().unwrap()[0].replicas,
            Some(3)
        );
        let active = desired.active.as_mut().expect("the active cluster");
        let services = active.services.take().expect("built").expect("builds");
        assert_eq!(
            services.map(|s| s.name_any()),
            ["svc-head-svc", "svc-serve-svc"]
        );
    }

    #[test]
    fn admitted_as_a_whole_the_clusters_follow_kueues_suspend_both_ways() {
        use crate::kuberay::kueue;
        let mut svc = service(spec("ray:1", 1, 1));
        svc.labels_mut()
            .insert(kueue::QUEUE_NAME_LABEL.to_owned(), "team-a".to_owned());
        // Created before admission: suspended.
        svc.spec.ray_cluster_config.suspend = Some(true);
        let clusters = [cluster(&svc, "svc-old")];
        assert_eq!(clusters[0].spec.suspend, Some(true));
        // Kueue admits: the cluster is resumed in place.
        svc.spec.ray_cluster_config.suspend = Some(false);
        let admitted = desired(
            &svc,
            &status(Some("svc-old"), None),
            &clusters,
            &BuildOptions::default(),
        );
        let [(_, built)] = &admitted.update_in_place[..] else {
            panic!("one in-place update expected");
        };
        assert_eq!(built.as_ref().expect("builds").spec.suspend, Some(false));
        // Kueue preempts: suspended again.
        let running = [Arc::new(built.as_ref().unwrap().clone())];
        svc.spec.ray_cluster_config.suspend = Some(true);
        let preempted = desired(
            &svc,
            &status(Some("svc-old"), None),
            &running,
            &BuildOptions::default(),
        );
        let [(_, built)] = &preempted.update_in_place[..] else {
            panic!("one in-place update expected");
        };
        assert_eq!(built.as_ref().expect("builds").spec.suspend, Some(true));
        // Preempted before its first cluster took traffic (still pending): suspended too.
        let first = desired(
            &svc,
            &status(None, Some("svc-old")),
            &running,
            &BuildOptions::default(),
        );
        let [(_, built)] = &first.update_in_place[..] else {
            panic!("one in-place update of the pending cluster expected");
        };
        assert_eq!(built.as_ref().expect("builds").spec.suspend, Some(true));
        // Without a queue label the cluster's own suspend is left alone (KubeRay's rule).
        svc.labels_mut().remove(kueue::QUEUE_NAME_LABEL);
        let plain = desired(
            &svc,
            &status(Some("svc-old"), None),
            &running,
            &BuildOptions::default(),
        );
        assert!(plain.update_in_place.is_empty());
    }

    #[test]
    fn admitted_per_cluster_a_replica_change_is_never_applied_in_place() {
        use crate::kuberay::kueue;
        let queued = |replicas| {
            let mut svc = service(spec("ray:1", replicas, 1));
            svc.annotations_mut().insert(
                kueue::CLUSTER_QUEUE_ANNOTATION.to_owned(),
                "team-a".to_owned(),
            );
            svc
        };
        let clusters = [cluster(&queued(1), "svc-old")];
        let desired = desired(
            &queued(3),
            &status(Some("svc-old"), None),
            &clusters,
            &BuildOptions::default(),
        );
        assert!(desired.update_in_place.is_empty());
    }
}
