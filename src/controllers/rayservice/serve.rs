//! The Serve stage: reads a cluster's Serve applications from its dashboard, pushes
//! `serveConfigV2` when Serve needs it (content changed, no applications, or a new head
//! session), and keeps the head Pod's `ray.io/serve` label on the health of its proxy.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::info;

use super::context::Context;
use super::context::Pushed;
use super::observed::{Observed, ServeObservation, Traffic};
use super::upgrade::{Desired, IncrementalPlan};
use super::{build, reasons};
use crate::api::raycluster::RayCluster;
use crate::api::rayservice::RayService;
use crate::kuberay::keys::labels;
use crate::ray::DashboardClient;

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

/// Reads one cluster's Serve state and pushes the Serve config when Serve needs it: observe
/// (head, dashboard, Serve's applications) → build the config to run (pure) → PUT it when
/// Serve needs it → the observation the status is made from.
async fn reconcile_serve(
    service: &RayService,
    ctx: &Context,
    cluster: &RayCluster,
    plan: Option<&IncrementalPlan>,
) -> ServeObservation {
    let (dashboard, details) = match observe_serve(ctx, cluster).await {
        Ok(observed) => observed,
        Err(why) => {
            return ServeObservation {
                waiting_for: Some(why),
                ..Default::default()
            };
        }
    };
    let cluster_name = cluster.name_any();
    let binding = ctx
        .config
        .http_binding
        .as_ref()
        .and_then(|f| f(dashboard.dashboard_url()));
    let previous = ctx.with_memory(service, |m| m.pushed.get(&cluster_name).cloned());
    let desired = desired_serve_config(
        service.spec.serve_config_v2.as_deref(),
        binding.as_ref(),
        &ctx.config.runtime_env_mirrors,
        plan,
        &cluster_name,
        previous.as_ref(),
    );
    let mut pushed_now = false;
    let push_error = match &desired {
        Err(why) => Some(why.clone()),
        Ok(desired) => {
            let (needed, session) =
                push_needed(&dashboard, &details, desired, previous.as_ref()).await;
            pushed_now = needed;
            if needed {
                push_serve_config(service, ctx, &dashboard, &cluster_name, desired, session)
                    .await
                    .err()
            } else {
                None
            }
        }
    };
    serve_observation(
        dashboard,
        &details,
        &cluster_name,
        desired.ok().map(|d| d.apps),
        pushed_now,
        push_error,
        plan,
    )
}

/// The head is ready and its dashboard answers: the client and Serve's applications, or what
/// is being waited for.
async fn observe_serve(
    ctx: &Context,
    cluster: &RayCluster,
) -> Result<
    (
        crate::ray::RayDashboardClient,
        crate::ray::ServeInstanceDetails,
    ),
    String,
> {
    build::head_ready(cluster)?;
    let cluster_name = cluster.name_any();
    let dashboard = crate::controllers::dashboard::client_for(
        &ctx.client,
        &ctx.config.dashboard,
        &ctx.config.dashboard_options,
        cluster,
    )
    .await
    .map_err(|e| format!("RayCluster {cluster_name}: {e}"))?;
    let details = dashboard.get_serve_applications().await.map_err(|e| {
        format!("the Ray dashboard of RayCluster {cluster_name} did not answer: {e}")
    })?;
    Ok((dashboard, details))
}

/// The Serve config one cluster should run.
struct DesiredServe {
    config: serde_json::Value,
    config_hash: String,
    /// The applications it deploys.
    apps: std::collections::BTreeSet<String>,
    /// The `target_capacity` it carries (incremental upgrade), and whether that alone changed.
    capacity: Option<i32>,
    capacity_changed: bool,
}

/// Builds the config for `cluster_name` (pure): the spec's `serveConfigV2` with the HTTP
/// binding and mirrors, or, for a cluster being phased out, the config it was pushed last;
/// then the incremental upgrade's `target_capacity`.
fn desired_serve_config(
    serve_config_v2: Option<&str>,
    binding: Option<&build::HttpBinding>,
    mirrors: &[(String, String)],
    plan: Option<&IncrementalPlan>,
    cluster_name: &str,
    previous: Option<&Pushed>,
) -> Result<DesiredServe, String> {
    let config_text = serve_config_v2.unwrap_or("").trim();
    if config_text.is_empty() {
        return Err("spec.serveConfigV2 is empty: there is nothing to deploy".to_owned());
    }
    let capacity = plan.and_then(|p| p.capacity.get(cluster_name).copied());
    // A held config (the cluster being phased out) is what was pushed last.
    let held = plan
        .filter(|p| p.held.contains(cluster_name))
        .and(previous)
        .map(|p| p.config.clone());
    let mut config = match held {
        Some(config) => config,
        None => build::serve_config_json(config_text, binding, mirrors)
            .map_err(|e| format!("spec.serveConfigV2 is not valid: {e}"))?,
    };
    if let (Some(capacity), Some(object)) = (capacity, config.as_object_mut()) {
        object.insert("target_capacity".into(), capacity.into());
    }
    let capacity_changed = capacity.is_some()
        && previous.is_some_and(|p| {
            p.config.get("target_capacity").and_then(|c| c.as_i64()) != capacity.map(i64::from)
        });
    Ok(DesiredServe {
        apps: build::application_names(&config),
        config_hash: crate::k8s::stable_hash(&config),
        config,
        capacity,
        capacity_changed,
    })
}

/// Whether Serve needs the config now: never pushed here, changed, Serve runs nothing, an
/// application of it is lost (deleted through the dashboard, or gone), or the head restarted
/// (a new Ray session). Also the session when it was read.
async fn push_needed(
    dashboard: &crate::ray::RayDashboardClient,
    details: &crate::ray::ServeInstanceDetails,
    desired: &DesiredServe,
    previous: Option<&Pushed>,
) -> (bool, Option<String>) {
    let Some(previous) = previous else {
        return (true, None);
    };
    // The session says whether the head restarted since the last push; read it only when the
    // rest says the push is still in place.
    let session = if previous.config_hash == desired.config_hash && !details.applications.is_empty()
    {
        dashboard
            .get_version()
            .await
            .ok()
            .and_then(|v| v.session_name)
    } else {
        None
    };
    let lost_one = desired
        .apps
        .iter()
        .any(|n| super::serve_watch::lost(details, n));
    let needed = previous.config_hash != desired.config_hash
        || details.applications.is_empty()
        || lost_one
        || (previous.session.is_some() && session.is_some() && previous.session != session);
    (needed, session)
}

/// PUTs `desired` to the cluster's Serve, remembers what was pushed (with the head's
/// session) and says so in an Event; the error in words when Serve refused it.
async fn push_serve_config(
    service: &RayService,
    ctx: &Context,
    dashboard: &crate::ray::RayDashboardClient,
    cluster_name: &str,
    desired: &DesiredServe,
    session: Option<String>,
) -> Result<(), String> {
    if let Err(e) = dashboard.put_serve_applications(&desired.config).await {
        let message = format!("pushing the Serve config to RayCluster {cluster_name} failed: {e}");
        let reason = if desired.capacity_changed {
            reasons::FAILED_TO_UPDATE_TARGET_CAPACITY
        } else {
            reasons::FAILED_TO_UPDATE_SERVE_APPLICATIONS
        };
        ctx.event(
            service,
            EventType::Warning,
            reason,
            "UpdateServeApplications",
            message.clone(),
        )
        .await;
        return Err(message);
    }
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
            cluster_name.to_owned(),
            Pushed {
                config_hash: desired.config_hash.clone(),
                session,
                config: desired.config.clone(),
            },
        )
    });
    let (reason, note) = match desired.capacity {
        Some(c) if desired.capacity_changed => (
            reasons::UPDATED_SERVE_TARGET_CAPACITY,
            format!("set the Serve target_capacity of RayCluster {cluster_name} to {c}"),
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
    Ok(())
}

/// What the status is made from (pure): ready only for this config, when every application it
/// names is what Serve runs, all RUNNING, and it was not pushed just now (`details` then still
/// shows what ran before); otherwise what is being waited for.
fn serve_observation(
    dashboard: crate::ray::RayDashboardClient,
    details: &crate::ray::ServeInstanceDetails,
    cluster_name: &str,
    expected_apps: Option<std::collections::BTreeSet<String>>,
    pushed_now: bool,
    push_error: Option<String>,
    plan: Option<&IncrementalPlan>,
) -> ServeObservation {
    let apps = build::application_statuses(details);
    let ready = !pushed_now
        && expected_apps
            .as_ref()
            .is_some_and(|names| names.iter().eq(apps.keys()))
        && details.all_applications_running();
    let target_capacity = plan
        .and_then(|p| p.capacity.get(cluster_name).copied())
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
        head_proxy_healthy: head_proxy_healthy(details),
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

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "applications:\n- name: app\n  import_path: m:app\n  route_prefix: /\n";

    fn plan(cluster: &str, capacity: i32) -> IncrementalPlan {
        IncrementalPlan {
            options: Default::default(),
            upgrading: true,
            rolling_back: false,
            capacity: [(cluster.to_owned(), capacity)].into(),
            held: [cluster.to_owned()].into(),
            gateway: None,
            route: None,
        }
    }

    #[test]
    fn an_empty_or_invalid_spec_is_nothing_to_push_in_words() {
        let empty = desired_serve_config(Some("  "), None, &[], None, "c", None)
            .err()
            .expect("refused");
        assert!(empty.contains("empty"), "{empty}");
        let invalid = desired_serve_config(Some("applications: ["), None, &[], None, "c", None)
            .err()
            .expect("refused");
        assert!(invalid.contains("not valid"), "{invalid}");
    }

    #[test]
    fn a_config_names_its_applications_and_hashes_what_is_pushed() {
        let desired = desired_serve_config(Some(SPEC), None, &[], None, "c", None).expect("built");
        assert_eq!(desired.apps, ["app".to_owned()].into());
        assert_eq!(
            desired.config_hash,
            crate::k8s::stable_hash(&desired.config)
        );
        assert!(desired.capacity.is_none() && !desired.capacity_changed);
    }

    #[test]
    fn a_held_cluster_keeps_what_it_was_pushed_and_only_its_capacity_moves() {
        let pushed = Pushed {
            config_hash: "before".to_owned(),
            session: None,
            config: serde_json::json!({"applications": [{"name": "old"}], "target_capacity": 100}),
        };
        let desired = desired_serve_config(
            Some(SPEC),
            None,
            &[],
            Some(&plan("c", 40)),
            "c",
            Some(&pushed),
        )
        .expect("built");
        assert_eq!(desired.apps, ["old".to_owned()].into(), "the held config");
        assert_eq!(desired.config["target_capacity"], 40);
        assert!(desired.capacity_changed);
        // A cluster not held gets the spec's config, with its capacity.
        let other = desired_serve_config(
            Some(SPEC),
            None,
            &[],
            Some(&plan("d", 60)),
            "c",
            Some(&pushed),
        )
        .expect("built");
        assert_eq!(other.apps, ["app".to_owned()].into());
        assert!(other.capacity.is_none());
    }
}
