//! The Serve stage: reads a cluster's Serve applications from its dashboard, pushes
//! `serveConfigV2` when Serve needs it (content changed, no applications, or a new head
//! session), and keeps the head Pod's `ray.io/serve` label on the health of its proxy.

use super::context::Pushed;
use super::upgrade::{Desired, IncrementalPlan, Traffic};
use super::*;

/// What one pass learnt from a cluster's Serve.
#[derive(Default)]
pub(super) struct ServeObservation {
    /// `None`: Serve was not read (head not ready, dashboard unreachable).
    pub(super) apps: Option<std::collections::BTreeMap<String, crate::api::rayservice::AppStatus>>,
    /// Every application RUNNING.
    pub(super) ready: bool,
    pub(super) head_proxy_healthy: bool,
    /// What is being waited for, or what went wrong, in words.
    pub(super) waiting_for: Option<String>,
    /// The Serve `target_capacity` the cluster has from the operator (incremental upgrade).
    pub(super) target_capacity: Option<i32>,
    /// When the cluster runs this config: its dashboard and the applications to watch for
    /// (`serve_watch`).
    pub(super) watch: Option<(
        crate::ray::RayDashboardClient,
        std::collections::BTreeSet<String>,
    )>,
}

/// What the Serve stage learnt from the active and the pending cluster (`None`: not read),
/// with where traffic goes.
pub(super) struct Observed {
    pub(super) active: Option<ServeObservation>,
    pub(super) pending: Option<ServeObservation>,
    pub(super) traffic: Traffic,
}

/// Serve: the pending cluster while there is one; the active one otherwise (never both: a
/// combined cluster + config change must not reach the cluster being replaced), except during
/// an incremental upgrade, where both serve (the config of the cluster being phased out is
/// held; only its `target_capacity` moves). Then the head Pod label of each cluster whose
/// Serve was read.
pub(super) async fn reconcile_clusters(
    service: &RayService,
    ctx: &Context,
    desired: &Desired,
    traffic: Traffic,
) -> Observed {
    let plan = desired.incremental.as_ref();
    let pending_obs = match desired.pending_cluster() {
        Some(cluster) => Some(reconcile_serve(service, ctx, cluster, plan).await),
        None => None,
    };
    let both = plan.is_some_and(|p| p.upgrading);
    let active_obs = match desired.active_cluster() {
        Some(cluster) if both || (desired.pending.is_none() && !traffic.needs_new_cluster) => {
            Some(reconcile_serve(service, ctx, cluster, plan).await)
        }
        _ => None,
    };
    for (cluster, obs) in [
        (desired.active_cluster(), &active_obs),
        (desired.pending_cluster(), &pending_obs),
    ] {
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
    Observed {
        active: active_obs,
        pending: pending_obs,
        traffic,
    }
}

pub(super) fn head_ready(cluster: &RayCluster) -> Result<(), String> {
    let status = cluster.status.as_ref();
    let condition = status.and_then(|s| {
        crate::api::conditions::find(&s.conditions, cluster_conditions::HEAD_POD_READY)
    });
    match condition {
        Some(c) if c.status == TRUE => Ok(()),
        _ if status.and_then(|s| s.state) == Some(ClusterState::Ready) => Ok(()),
        Some(c) => Err(format!(
            "the head Pod of RayCluster {} is not ready ({}: {})",
            cluster.name_any(),
            c.reason,
            c.message
        )),
        None => Err(format!(
            "the head Pod of RayCluster {} is not ready yet",
            cluster.name_any()
        )),
    }
}

/// Reads one cluster's Serve state and pushes the Serve config when Serve needs it.
async fn reconcile_serve(
    service: &RayService,
    ctx: &Context,
    cluster: &RayCluster,
    plan: Option<&IncrementalPlan>,
) -> ServeObservation {
    let waiting = |why: String| ServeObservation {
        waiting_for: Some(why),
        ..Default::default()
    };
    if let Err(why) = head_ready(cluster) {
        return waiting(why);
    }
    let cluster_name = cluster.name_any();
    let dashboard = match crate::controllers::dashboard::client_for(
        &ctx.client,
        &ctx.config.dashboard,
        &ctx.config.dashboard_options,
        cluster,
    )
    .await
    {
        Ok(d) => d,
        Err(e) => return waiting(format!("RayCluster {cluster_name}: {e}")),
    };
    let details = match dashboard.get_serve_applications().await {
        Ok(d) => d,
        Err(e) => {
            return waiting(format!(
                "the Ray dashboard of RayCluster {cluster_name} did not answer: {e}"
            ));
        }
    };

    let config_text = service.spec.serve_config_v2.as_deref().unwrap_or("").trim();
    let mut push_error = None;
    // The applications this config deploys, and whether Serve got it only now (then `details`
    // still shows what ran before the push).
    let mut expected_apps = None;
    let mut pushed_now = false;
    if config_text.is_empty() {
        push_error = Some("spec.serveConfigV2 is empty: there is nothing to deploy".to_owned());
    } else {
        let binding = ctx
            .config
            .http_binding
            .as_ref()
            .and_then(|f| f(dashboard.dashboard_url()));
        let previous = ctx.with_memory(service, |m| m.pushed.get(&cluster_name).cloned());
        let capacity = plan.and_then(|p| p.capacity.get(&cluster_name).copied());
        // A held config (the cluster being phased out) is what was pushed last.
        let held = plan
            .filter(|p| p.held.contains(&cluster_name))
            .and(previous.as_ref())
            .map(|p| p.config.clone());
        let config = match held {
            Some(config) => Ok(config),
            None => build::serve_config_json(
                config_text,
                binding.as_ref(),
                &ctx.config.runtime_env_mirrors,
            ),
        }
        .map(|mut config| {
            if let (Some(capacity), Some(object)) = (capacity, config.as_object_mut()) {
                object.insert("target_capacity".into(), capacity.into());
            }
            config
        });
        let capacity_changed = capacity.is_some()
            && previous.as_ref().is_some_and(|p| {
                p.config.get("target_capacity").and_then(|c| c.as_i64()) != capacity.map(i64::from)
            });
        match config {
            Err(e) => push_error = Some(format!("spec.serveConfigV2 is not valid: {e}")),
            Ok(config) => {
                expected_apps = Some(build::application_names(&config));
                let config_hash = crate::k8s::stable_hash(&config);
                // The session says whether the head restarted since the last push; read it
                // only when the rest says the push is still in place.
                let session = match &previous {
                    Some(p) if p.config_hash == config_hash && !details.applications.is_empty() => {
                        dashboard
                            .get_version()
                            .await
                            .ok()
                            .and_then(|v| v.session_name)
                    }
                    _ => None,
                };
                // An application of this config that Serve does not know or is deleting (deleted through the
                // dashboard, or lost) is pushed again, like an empty Serve.
                let lost_one = expected_apps.as_ref().is_some_and(|names| {
                    names.iter().any(|n| super::serve_watch::lost(&details, n))
                });
                let needed = match &previous {
                    None => true,
                    Some(p) => {
                        p.config_hash != config_hash
                            || details.applications.is_empty()
                            || lost_one
                            || (p.session.is_some() && session.is_some() && p.session != session)
                    }
                };
                if needed {
                    pushed_now = true;
                    match dashboard.put_serve_applications(&config).await {
                        Ok(()) => {
                            let session = match session {
                                Some(s) => Some(s),
                                None => dashboard
                                    .get_version()
                                    .await
                                    .ok()
                                    .and_then(|v| v.session_name),
                            };
                            info!(cluster = %cluster_name, "Serve config pushed");
                            ctx.with_memory(service, |m| {
                                m.pushed.insert(
                                    cluster_name.clone(),
                                    Pushed {
                                        config_hash,
                                        session,
                                        config: config.clone(),
                                    },
                                )
                            });
                            let (reason, note) = match capacity {
                                Some(c) if capacity_changed => (
                                    reasons::UPDATED_SERVE_TARGET_CAPACITY,
                                    format!(
                                        "set the Serve target_capacity of RayCluster {cluster_name} to {c}"
                                    ),
                                ),
                                _ => (
                                    reasons::UPDATED_SERVE_APPLICATIONS,
                                    format!("pushed the Serve config to RayCluster {cluster_name}"),
                                ),
                            };
                            ctx.event(
                                service,
                                EventType::Normal,
                                reason,
                                "UpdateServeApplications",
                                note,
                            )
                            .await;
                        }
                        Err(e) => {
                            let message = format!(
                                "pushing the Serve config to RayCluster {cluster_name} failed: {e}"
                            );
                            ctx.event(
                                service,
                                EventType::Warning,
                                if capacity_changed {
                                    reasons::FAILED_TO_UPDATE_TARGET_CAPACITY
                                } else {
                                    reasons::FAILED_TO_UPDATE_SERVE_APPLICATIONS
                                },
                                "UpdateServeApplications",
                                message.clone(),
                            )
                            .await;
                            push_error = Some(message);
                        }
                    }
                }
            }
        }
    }

    let apps = build::application_statuses(&details);
    // Ready only for this config: every application it names is what Serve runs, all RUNNING
    // (another config's applications may still run on the head, e.g. right after a push).
    let ready = !pushed_now
        && expected_apps
            .as_ref()
            .is_some_and(|names| names.iter().eq(apps.keys()))
        && details.all_applications_running();
    let target_capacity = plan
        .and_then(|p| p.capacity.get(&cluster_name).copied())
        .filter(|_| push_error.is_none());
    let waiting_for = push_error.or_else(|| {
        if ready {
            None
        } else {
            let summary = build::not_running_summary(&apps).unwrap_or_else(|| {
                "Serve is taking the new config (it still reports other applications)".to_owned()
            });
            Some(format!("RayCluster {cluster_name}: {summary}"))
        }
    });
    let watch = expected_apps
        .filter(|_| ready)
        .map(|names| (dashboard, names));
    ServeObservation {
        head_proxy_healthy: head_proxy_healthy(&details),
        apps: Some(apps),
        ready,
        waiting_for,
        target_capacity,
        watch,
    }
}

/// The head's Serve proxy: the one on the node of the Serve controller (which runs on the
/// head), else the only one.
fn head_proxy_healthy(details: &crate::ray::ServeInstanceDetails) -> bool {
    let controller_node = details
        .controller_info
        .as_ref()
        .and_then(|c| c.get("node_id"))
        .and_then(|n| n.as_str());
    let proxy = controller_node
        .and_then(|n| details.proxies.get(n))
        .or_else(|| {
            (details.proxies.len() == 1)
                .then(|| details.proxies.values().next())
                .flatten()
        });
    match proxy {
        Some(p) => p.status == Some(crate::ray::ProxyStatus::Healthy),
        None => build::proxy_healthy(details) && details.proxies.len() == 1,
    }
}

async fn label_head_pod(service: &RayService, ctx: &Context, cluster: &RayCluster, serving: bool) {
    let namespace = cluster.namespace().unwrap_or_default();
    let cluster_name = cluster.name_any();
    let wanted = if serving { "true" } else { "false" };
    let cluster_uid = cluster.uid().unwrap_or_default();
    // Only the cluster's own Pods: anyone can copy its labels onto a Pod.
    let heads = ctx
        .head_pod_index
        .find(&ctx.head_pods, &namespace, &cluster_name, |p| {
            p.namespace().as_deref() == Some(namespace.as_str())
                && p.labels().get(labels::CLUSTER) == Some(&cluster_name)
                && crate::k8s::is_controlled_by(p.meta(), &cluster_uid)
        });
    for pod in heads {
        if pod.labels().get(labels::SERVE).map(String::as_str) == Some(wanted) {
            continue;
        }
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        let patch = serde_json::json!({"metadata": {"labels": {labels::SERVE: wanted}}});
        match api
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                ctx.event(
                    service,
                    EventType::Normal,
                    reasons::UPDATED_HEAD_POD_SERVE_LABEL,
                    "UpdateHeadPodServeLabel",
                    format!(
                        "set {}={wanted} on head Pod {}",
                        labels::SERVE,
                        pod.name_any()
                    ),
                )
                .await
            }
            Err(e) => {
                ctx.event(
                    service,
                    EventType::Warning,
                    reasons::FAILED_TO_UPDATE_HEAD_POD_SERVE_LABEL,
                    "UpdateHeadPodServeLabel",
                    format!("labelling head Pod {} failed: {e}", pod.name_any()),
                )
                .await
            }
        }
    }
}
