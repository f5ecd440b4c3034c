//! Liveness and readiness probes injected into the Ray container when the template has none
//! (KubeRay's `wget` health checks, or the unified health check from Ray 2.53).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ExecAction, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::UNIFIED_HEALTH_CHECK_VERSION;
use crate::kuberay::keys::ports;
use crate::kuberay::names::NodeType;
use crate::kuberay::spec::{Creator, ray_version_at_least};

/// A health check through the dashboard agent or dashboard.
pub(super) fn wget_check(timeout_seconds: i32, port: i32, path: &str) -> String {
    format!(
        "wget --tries 1 -T {timeout_seconds} -q -O- http://localhost:{port}/{path} | grep success"
    )
}

/// Liveness and readiness probes where the user set none: HTTP `/api/healthz` on the dashboard
/// agent for Ray >= 2.53, else `wget` checks of the raylet (and the GCS on the head).
pub(super) fn inject_probes(
    container: &mut Container,
    node_type: NodeType,
    creator: Creator,
    params: &BTreeMap<String, String>,
    ray_version: &str,
) {
    let port_param = |key: &str, default: i32| {
        params
            .get(key)
            .and_then(|v| v.parse::<i32>().ok())
            .unwrap_or(default)
    };
    let agent_port = port_param("dashboard-agent-listen-port", ports::DASHBOARD_AGENT);
    let dashboard_port = port_param("dashboard-port", ports::DASHBOARD);
    let http = ray_version_at_least(ray_version, UNIFIED_HEALTH_CHECK_VERSION);
    let mut checks = vec![wget_check(2, agent_port, "api/local_raylet_healthz")];
    if node_type == NodeType::Head {
        checks.push(wget_check(10, dashboard_port, "api/gcs_healthz"));
    }
    let exec = |checks: &[String]| ExecAction {
        command: Some(vec!["bash".into(), "-c".into(), checks.join(" && ")]),
    };
    let http_get = HTTPGetAction {
        path: Some("/api/healthz".into()),
        port: IntOrString::Int(agent_port),
        ..Default::default()
    };
    let timeout = if node_type == NodeType::Head { 5 } else { 2 };
    let probe = |initial_delay: i32, failure_threshold: i32| {
        let mut probe = Probe {
            initial_delay_seconds: Some(initial_delay),
            timeout_seconds: Some(timeout),
            period_seconds: Some(5),
            success_threshold: Some(1),
            failure_threshold: Some(failure_threshold),
            ..Default::default()
        };
        if http {
            probe.http_get = Some(http_get.clone());
        } else {
            probe.exec = Some(exec(&checks));
        }
        probe
    };
    if container.liveness_probe.is_none() {
        container.liveness_probe = Some(probe(30, 120));
    }
    if container.readiness_probe.is_none() {
        let mut readiness = probe(10, 10);
        if creator == Creator::RayService && node_type == NodeType::Worker {
            // A serving worker leaves the serve Service as soon as its proxy fails once.
            let serve_port = container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(ports::SERVE_NAME))
                .map_or(ports::SERVE, |p| p.container_port);
            let mut with_proxy = checks.clone();
            with_proxy.push(wget_check(10, serve_port, "-/healthz"));
            readiness.failure_threshold = Some(1);
            readiness.http_get = None;
            readiness.exec = Some(exec(&with_proxy));
        }
        container.readiness_probe = Some(readiness);
    }
}
