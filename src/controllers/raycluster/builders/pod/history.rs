//! KubeRay's history-server collector (gate `RayClusterHistoryServer`): a sidecar in every Ray
//! Pod that receives Ray's events on port 8084 and ships them with the session logs from the
//! shared `/tmp/ray` to object storage. Built as KubeRay v1.7 builds it (container, environment
//! in KubeRay's order, volume, and the Ray container's event export), so KubeRay's own collector
//! and history server work against raypipe's clusters unchanged.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use super::env_vars::{push_env, push_env_if_absent};
use super::{ClusterFacts, RAY_CONTAINER};
use crate::api::raycluster::CollectorOptions;
use crate::controllers::raycluster::builders::{env, field_env, has_env};
use crate::kuberay::keys::{collector, env as env_names, labels};
use crate::kuberay::names::NodeType;

/// The collector's options when the cluster asks for one (validation has refused the spec
/// while the gate is off).
pub(super) fn collector_options<'a>(facts: &ClusterFacts<'a>) -> Option<&'a CollectorOptions> {
    facts
        .cluster
        .spec
        .history_server_options
        .as_ref()?
        .collector_options
        .as_ref()
}

/// The collector container for a Pod of `node_type`; the user's `env` comes last, after the
/// operator's.
pub(super) fn collector_container(
    facts: &ClusterFacts<'_>,
    options: &CollectorOptions,
    node_type: NodeType,
) -> Container {
    let role = match node_type {
        NodeType::Head => "Head",
        NodeType::Worker => "Worker",
    };
    let mut container = Container {
        name: collector::CONTAINER_NAME.into(),
        image: options.image.clone().filter(|i| !i.is_empty()),
        image_pull_policy: Some(
            options
                .image_pull_policy
                .clone()
                .unwrap_or_else(|| "IfNotPresent".into()),
        ),
        resources: Some(options.resources.clone().unwrap_or_else(default_resources)),
        env: Some(vec![
            field_env(collector::POD_IP, "status.podIP"),
            env(env_names::RAY_CLUSTER_NAME, facts.name.clone()),
            env(env_names::RAY_CLUSTER_NAMESPACE, facts.namespace.clone()),
            env(collector::RAY_ROLE, role),
            env(collector::EVENTS_PORT, collector::EVENTS_PORT_VALUE),
        ]),
        ..Default::default()
    };
    if !facts.head_fqdn.is_empty() {
        push_env(
            &mut container,
            env(env_names::FQ_RAY_IP, facts.head_fqdn.clone()),
        );
    }
    let cluster_labels = facts.cluster.labels();
    for (label, name) in [
        (labels::ORIGINATED_FROM_CRD, collector::OWNER_KIND),
        (labels::ORIGINATED_FROM_CR_NAME, collector::OWNER_NAME),
    ] {
        if let Some(value) = cluster_labels.get(label).filter(|v| !v.is_empty()) {
            push_env(&mut container, env(name, value.clone()));
        }
    }
    let user_env = options.env.clone().unwrap_or_default();
    if node_type == NodeType::Head && !has_env(&user_env, collector::RAY_DASHBOARD_ADDRESS) {
        push_env(
            &mut container,
            env(
                collector::RAY_DASHBOARD_ADDRESS,
                collector::HEAD_DASHBOARD_ADDRESS,
            ),
        );
    }
    for var in user_env {
        push_env(&mut container, var);
    }
    container
}

/// KubeRay's default: requests 50m CPU / 64Mi, limits 200m CPU / 256Mi.
fn default_resources() -> ResourceRequirements {
    let quantities = |cpu: &str, memory: &str| {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.into())),
            ("memory".to_owned(), Quantity(memory.into())),
        ])
    };
    ResourceRequirements {
        limits: Some(quantities("200m", "256Mi")),
        requests: Some(quantities("50m", "64Mi")),
        ..Default::default()
    }
}

/// Where the collector sits in the Pod. KubeRay keys the volume and the event export on a
/// container of this name being present (with the gate on), not on the spec field.
pub(super) fn collector_index(spec: &PodSpec) -> Option<usize> {
    spec.containers
        .iter()
        .position(|c| c.name == collector::CONTAINER_NAME)
}

/// Points the Ray container's event export at the collector, keeping what the user set.
pub(super) fn set_event_export_env(spec: &mut PodSpec) {
    let ray = &mut spec.containers[RAY_CONTAINER];
    for (name, value) in [
        (env_names::RAY_ENABLE_RAY_EVENT, "true"),
        (
            env_names::RAY_ENABLE_CORE_WORKER_RAY_EVENT_TO_AGGREGATOR,
            "true",
        ),
        (
            env_names::RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR,
            collector::EVENTS_EXPORT_ADDR,
        ),
        (
            env_names::RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES,
            collector::EXPOSABLE_EVENT_TYPES,
        ),
        (
            env_names::RAY_DASHBOARD_AGGREGATOR_AGENT_PUBLISHER_HTTP_ENDPOINT_EXPOSABLE_EVENT_TYPES,
            collector::EXPOSABLE_EVENT_TYPES,
        ),
    ] {
        push_env_if_absent(ray, env(name, value));
    }
}
