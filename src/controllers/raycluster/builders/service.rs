//! The head Service, the headless worker Service of multi-host groups and the serve Service.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::pod::RAY_CONTAINER;
use super::{BuildError, BuildOptions};
use crate::api::raycluster::RayCluster;
use crate::kuberay::keys::{labels, ports};
use crate::kuberay::names::{self, NodeType};

/// The head container's ports by name (an unnamed port is `<port>-port`); KubeRay's five
/// defaults when the container declares none; `metrics` always.
pub fn head_ports(cluster: &RayCluster) -> BTreeMap<String, i32> {
    let declared = cluster
        .spec
        .head_group_spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers.get(RAY_CONTAINER))
        .and_then(|c| c.ports.clone())
        .unwrap_or_default();
    let mut by_name: BTreeMap<String, i32> = declared
        .into_iter()
        .map(|p| {
            let name = p
                .name
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("{}-port", p.container_port));
            (name, p.container_port)
        })
        .collect();
    if by_name.is_empty() {
        by_name = BTreeMap::from([
            (ports::CLIENT_NAME.to_owned(), ports::CLIENT),
            (ports::GCS_SERVER_NAME.to_owned(), ports::GCS_SERVER),
            (ports::DASHBOARD_NAME.to_owned(), ports::DASHBOARD),
            (ports::METRICS_NAME.to_owned(), ports::METRICS),
            (ports::SERVE_NAME.to_owned(), ports::SERVE),
        ]);
    }
    by_name
        .entry(ports::METRICS_NAME.to_owned())
        .or_insert(ports::METRICS);
    by_name
}

/// `serve` or `serve-*`: the ports the serve Service exposes.
pub fn is_serve_port(name: &str) -> bool {
    name == ports::SERVE_NAME || name.starts_with("serve-")
}

/// The labels (and selector) of the head Service; `app.kubernetes.io/name` follows the head
/// template when it sets one.
pub fn head_service_labels(cluster: &RayCluster) -> BTreeMap<String, String> {
    let name = cluster.name_any();
    let app_name = cluster
        .spec
        .head_group_spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .and_then(|l| l.get(labels::APP_NAME))
        .cloned()
        .unwrap_or_else(|| labels::APP_NAME_VALUE.to_owned());
    BTreeMap::from([
        (labels::CLUSTER.to_owned(), name.clone()),
        (labels::NODE_TYPE.to_owned(), labels::HEAD.to_owned()),
        (
            labels::IDENTIFIER.to_owned(),
            names::identifier(&name, NodeType::Head),
        ),
        (labels::APP_NAME.to_owned(), app_name),
        (
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        ),
    ])
}

/// The head Service: from `headGroupSpec.headService` when given (its ports first, then the
/// head ports it lacks), else headless by default (`ClusterIP: None`, not-ready addresses
/// published: the head is reachable while it starts).
pub fn head_service(cluster: &RayCluster, options: &BuildOptions) -> Result<Service, BuildError> {
    let name = cluster.name_any();
    let namespace = cluster.namespace();
    let selector = head_service_labels(cluster);
    let annotations = cluster
        .spec
        .head_service_annotations
        .clone()
        .unwrap_or_default();
    let service_type = cluster.spec.head_group_spec.service_type.clone();
    let default_ports: Vec<ServicePort> = head_ports(cluster)
        .into_iter()
        .map(|(port_name, port)| ServicePort {
            name: Some(port_name),
            port,
            app_protocol: Some(ports::APP_PROTOCOL.to_owned()),
            ..Default::default()
        })
        .collect();
    let owner = crate::k8s::controller_owner_ref(cluster)?;

    let mut service = match &cluster.spec.head_group_spec.head_service {
        Some(custom) => {
            let mut service = custom.clone();
            let mut user_annotations = service.metadata.annotations.take().unwrap_or_default();
            user_annotations.extend(annotations);
            service.metadata.annotations = Some(user_annotations);
            let mut user_labels = service.metadata.labels.take().unwrap_or_default();
            user_labels.extend(selector.clone());
            service.metadata.labels = Some(user_labels);
            if service
                .metadata
                .name
                .as_deref()
                .unwrap_or_default()
                .is_empty()
            {
                service.metadata.name = Some(names::head_service_name(&name, &cluster.spec));
            }
            let spec = service.spec.get_or_insert_with(Default::default);
            spec.selector = Some(selector);
            if spec.type_.as_deref().unwrap_or_default().is_empty() {
                spec.type_ = service_type;
            }
            // The user's ports first; a default port the user already declared (by name or
            // number) is left out rather than duplicated, which the API server would refuse.
            let user_ports = spec.ports.get_or_insert_with(Vec::new);
            for port in default_ports {
                let taken = user_ports
                    .iter()
                    .any(|p| p.name == port.name || p.port == port.port);
                if !taken {
                    user_ports.push(port);
                }
            }
            service
        }
        None => {
            let headless = !options.head_cluster_ip_service
                && matches!(service_type.as_deref(), None | Some("") | Some("ClusterIP"));
            Service {
                metadata: ObjectMeta {
                    name: Some(names::head_service_name(&name, &cluster.spec)),
                    labels: Some(selector.clone()),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                spec: Some(ServiceSpec {
                    selector: Some(selector),
                    ports: Some(default_ports),
                    type_: service_type,
                    cluster_ip: headless.then(|| "None".to_owned()),
                    publish_not_ready_addresses: headless.then_some(true),
                    ..Default::default()
                }),
                status: None,
            }
        }
    };
    service.metadata.namespace = namespace;
    service.metadata.owner_references = Some(vec![owner]);
    Ok(service)
}

/// The head Service a RayService or RayJob keeps in front of its current cluster,
/// `<owner>-head-svc`: `target`'s head Service (ports, selector, type) under the owner's name
/// and labels (`originated-from-*`, `node-type: head`, identifier `<owner>-head`), controlled
/// by the owner. Its selector names the cluster, so it follows the owner to a new cluster.
pub fn owner_head_service<K: kube::Resource<DynamicType = ()>>(
    owner: &K,
    originated_from_crd: &str,
    target: &RayCluster,
    options: &BuildOptions,
) -> Result<Service, BuildError> {
    let mut service = head_service(target, options)?;
    let owner_name = owner.name_any();
    let owner_labels = BTreeMap::from([
        (
            labels::ORIGINATED_FROM_CR_NAME.to_owned(),
            owner_name.clone(),
        ),
        (
            labels::ORIGINATED_FROM_CRD.to_owned(),
            originated_from_crd.to_owned(),
        ),
        (labels::NODE_TYPE.to_owned(), labels::HEAD.to_owned()),
        (
            labels::IDENTIFIER.to_owned(),
            names::identifier(&owner_name, NodeType::Head),
        ),
    ]);
    service.metadata = ObjectMeta {
        name: Some(names::owner_head_service_name(&owner_name)),
        namespace: owner.namespace(),
        labels: Some(owner_labels),
        annotations: service.metadata.annotations.take(),
        owner_references: Some(vec![crate::k8s::controller_owner_ref(owner)?]),
        ..Default::default()
    };
    Ok(service)
}

/// The headless Service multi-host workers use to find each other; only for clusters with a
/// group of more than one host.
pub fn headless_worker_service(cluster: &RayCluster) -> Result<Option<Service>, BuildError> {
    let multi_host = cluster
        .spec
        .worker_group_specs
        .iter()
        .flatten()
        .any(|g| g.num_of_hosts.unwrap_or(1) > 1);
    if !multi_host {
        return Ok(None);
    }
    let name = cluster.name_any();
    Ok(Some(Service {
        metadata: ObjectMeta {
            name: Some(names::headless_service_name(&name)),
            namespace: cluster.namespace(),
            labels: Some(BTreeMap::from([
                (labels::HEADLESS_WORKER_SVC.to_owned(), name.clone()),
                // Not in KubeRay: lets the operator watch only the Services it made.
                (
                    labels::CREATED_BY.to_owned(),
                    labels::CREATED_BY_VALUE.to_owned(),
                ),
            ])),
            owner_references: Some(vec![crate::k8s::controller_owner_ref(cluster)?]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(BTreeMap::from([
                (labels::CLUSTER.to_owned(), name),
                (labels::NODE_TYPE.to_owned(), labels::WORKER.to_owned()),
            ])),
            type_: Some("ClusterIP".into()),
            publish_not_ready_addresses: Some(true),
            ..Default::default()
        }),
        status: None,
    }))
}

/// The serve Service of a plain RayCluster (annotation `ray.io/enable-serve-service: "true"`):
/// the head's `serve`/`serve-*` ports, selecting every Pod of the cluster.
pub fn serve_service(cluster: &RayCluster) -> Result<Service, BuildError> {
    let name = cluster.name_any();
    let serve_ports: Vec<ServicePort> = head_ports(cluster)
        .into_iter()
        .filter(|(port_name, _)| is_serve_port(port_name))
        .map(|(port_name, port)| ServicePort {
            name: Some(port_name),
            port,
            ..Default::default()
        })
        .collect();
    if serve_ports.is_empty() {
        return Err(BuildError::NoServePort);
    }
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(names::serve_service_name(&name)),
            namespace: cluster.namespace(),
            labels: Some(BTreeMap::from([
                (labels::ORIGINATED_FROM_CR_NAME.to_owned(), name.clone()),
                (
                    labels::ORIGINATED_FROM_CRD.to_owned(),
                    "RayCluster".to_owned(),
                ),
                (labels::SERVE.to_owned(), names::serve_service_label(&name)),
                // Not in KubeRay: lets the operator watch only the Services it made.
                (
                    labels::CREATED_BY.to_owned(),
                    labels::CREATED_BY_VALUE.to_owned(),
                ),
            ])),
            owner_references: Some(vec![crate::k8s::controller_owner_ref(cluster)?]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(labels::CLUSTER.to_owned(), name)])),
            ports: Some(serve_ports),
            type_: cluster.spec.head_group_spec.service_type.clone(),
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::raycluster::builders::test_cluster as cluster;
    use serde_json::json;

    fn with_head(head: serde_json::Value) -> RayCluster {
        cluster(json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c"},
            "spec": {"headGroupSpec": head}
        }))
    }

    fn port_list(service: &Service) -> Vec<(String, i32)> {
        service
            .spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.name.unwrap_or_default(), p.port))
            .collect()
    }

    #[test]
    fn default_head_service_is_headless_with_sorted_ports() {
        let c = with_head(
            json!({"template": {"spec": {"containers": [{"name": "ray-head", "image": "i",
            "ports": [{"containerPort": 6379, "name": "gcs"}, {"containerPort": 8265, "name": "dashboard"}, {"containerPort": 9999}]}]}}}),
        );
        let service = head_service(&c, &BuildOptions::default()).expect("builds");
        assert_eq!(service.metadata.name.as_deref(), Some("c-head-svc"));
        assert_eq!(service.metadata.namespace.as_deref(), Some("ns"));
        let spec = service.spec.as_ref().expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(
            port_list(&service),
            [
                ("9999-port".to_owned(), 9999),
                ("dashboard".into(), 8265),
                ("gcs".into(), 6379),
                ("metrics".into(), 8080)
            ]
        );
        assert!(
            spec.ports
                .iter()
                .flatten()
                .all(|p| p.app_protocol.as_deref() == Some("tcp"))
        );
        assert_eq!(
            serde_json::to_value(&spec.selector).expect("json"),
            json!({"app.kubernetes.io/created-by": "kuberay-operator", "app.kubernetes.io/name": "kuberay",
                   "ray.io/cluster": "c", "ray.io/identifier": "c-head", "ray.io/node-type": "head"})
        );
        assert_eq!(service.metadata.labels, spec.selector);

        let cluster_ip = BuildOptions {
            head_cluster_ip_service: true,
            ..Default::default()
        };
        let service = head_service(&c, &cluster_ip).expect("builds");
        assert_eq!(service.spec.and_then(|s| s.cluster_ip), None);
    }

    #[test]
    fn container_without_ports_gets_the_five_defaults() {
        let c = with_head(
            json!({"serviceType": "NodePort", "template": {"spec": {"containers": [{"name": "h", "image": "i"}]}}}),
        );
        let service = head_service(&c, &BuildOptions::default()).expect("builds");
        assert_eq!(
            port_list(&service),
            [
                ("client".to_owned(), 10001),
                ("dashboard".into(), 8265),
                ("gcs-server".into(), 6379),
                ("metrics".into(), 8080),
                ("serve".into(), 8000)
            ]
        );
        let spec = service.spec.expect("spec");
        assert_eq!(spec.type_.as_deref(), Some("NodePort"));
        assert_eq!(
            spec.cluster_ip, None,
            "only ClusterIP Services are made headless"
        );
    }

    #[test]
    fn custom_head_service_keeps_user_fields_and_appends_missing_ports() {
        let mut c = with_head(json!({
            "headService": {"metadata": {"name": "custom", "labels": {"team": "a", "ray.io/cluster": "spoof"}, "annotations": {"a": "user", "b": "user"}},
                            "spec": {"type": "LoadBalancer", "selector": {"x": "y"}, "ports": [{"name": "extra", "port": 9000}, {"name": "dashboard", "port": 8265}]}},
            "template": {"metadata": {"labels": {"app.kubernetes.io/name": "mine"}}, "spec": {"containers": [{"name": "h", "image": "i", "ports": [{"containerPort": 8265, "name": "dashboard"}]}]}}
        }));
        c.spec.head_service_annotations = Some(BTreeMap::from([("b".into(), "cluster".into())]));
        let service = head_service(&c, &BuildOptions::default()).expect("builds");
        assert_eq!(service.metadata.name.as_deref(), Some("custom"));
        let labels = service.metadata.labels.clone().expect("labels");
        assert_eq!(labels["team"], "a");
        assert_eq!(labels["ray.io/cluster"], "c");
        assert_eq!(labels["app.kubernetes.io/name"], "mine");
        let annotations = service.metadata.annotations.clone().expect("annotations");
        assert_eq!(
            (annotations["a"].as_str(), annotations["b"].as_str()),
            ("user", "cluster")
        );
        let spec = service.spec.as_ref().expect("spec");
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(
            spec.selector.as_ref().expect("selector")["app.kubernetes.io/name"],
            "mine"
        );
        assert!(!spec.selector.as_ref().expect("selector").contains_key("x"));
        assert_eq!(spec.cluster_ip, None);
        assert_eq!(
            port_list(&service),
            [
                ("extra".to_owned(), 9000),
                ("dashboard".into(), 8265),
                ("metrics".into(), 8080)
            ]
        );
    }

    #[test]
    fn headless_only_for_multi_host_groups() {
        let mut c =
            with_head(json!({"template": {"spec": {"containers": [{"name": "h", "image": "i"}]}}}));
        assert!(headless_worker_service(&c).expect("builds").is_none());
        c.spec.worker_group_specs = Some(vec![serde_json::from_value(json!({
            "groupName": "tpu", "numOfHosts": 2, "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}
        })).expect("group")]);
        let service = headless_worker_service(&c).expect("builds").expect("made");
        assert_eq!(service.metadata.name.as_deref(), Some("c-headless"));
        assert_eq!(
            service.metadata.labels.as_ref().expect("labels")["ray.io/headless-worker-svc"],
            "c"
        );
        let spec = service.spec.expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(
            spec.selector.expect("selector")["ray.io/node-type"],
            "worker"
        );
        assert_eq!(spec.ports, None);
    }

    #[test]
    fn serve_service_needs_a_serve_port() {
        let c = with_head(
            json!({"template": {"spec": {"containers": [{"name": "h", "image": "i",
            "ports": [{"containerPort": 8000, "name": "serve"}, {"containerPort": 9000, "name": "serve-grpc"}, {"containerPort": 8265, "name": "dashboard"}]}]}}}),
        );
        let service = serve_service(&c).expect("builds");
        assert_eq!(service.metadata.name.as_deref(), Some("c-serve-svc"));
        let labels = service.metadata.labels.clone().expect("labels");
        assert_eq!(labels["ray.io/serve"], "c-serve");
        assert_eq!(labels["ray.io/originated-from-crd"], "RayCluster");
        assert_eq!(
            port_list(&service),
            [("serve".to_owned(), 8000), ("serve-grpc".into(), 9000)]
        );
        assert_eq!(
            service.spec.expect("spec").selector.expect("selector"),
            BTreeMap::from([("ray.io/cluster".to_owned(), "c".to_owned())])
        );

        let no_serve = with_head(
            json!({"template": {"spec": {"containers": [{"name": "h", "image": "i", "ports": [{"containerPort": 8265, "name": "dashboard"}]}]}}}),
        );
        assert!(matches!(
            serve_service(&no_serve),
            Err(BuildError::NoServePort)
        ));
    }
}
