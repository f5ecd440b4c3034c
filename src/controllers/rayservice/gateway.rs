//! The Gateway API objects of `NewClusterWithIncrementalUpgrade`: the few fields of
//! `gateway.networking.k8s.io/v1` Gateway and HTTPRoute raypipe writes and reads (typed here
//! rather than through the large `gateway-api` crates), their builders (pure), the readiness
//! a Gateway controller reports on them, and the per-cluster serve Services the route's
//! backends name.
//!
//! Gateway `<svc>-gateway` (one HTTP listener on port 80, class from `clusterUpgradeOptions`)
//! and HTTPRoute `<svc>-httproute` (path prefix `/`, one weighted backend per cluster) are
//! KubeRay's. Not in KubeRay: the annotation [`SHARED_GATEWAY_ANNOTATION`] names an existing
//! Gateway (`name` or `namespace/name`) for platforms that forbid a Gateway per service; then
//! no Gateway is made and only the HTTPRoute attaches to the named one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::{CustomResource, Resource, ResourceExt};
use serde::{Deserialize, Serialize};

use crate::api::RayCluster;
use crate::api::rayservice::RayService;
use crate::controllers::raycluster::builders::BuildError;
use crate::kuberay::keys::labels;
use crate::kuberay::names;

pub use crate::api::rayservice::SHARED_GATEWAY_ANNOTATION;
/// KubeRay's listener name and port.
const LISTENER_NAME: &str = "http";
const LISTENER_PORT: i32 = 80;

/// A Gateway (only the fields raypipe writes or reads).
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "Gateway",
    namespaced,
    status = "GatewayStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    pub gateway_class_name: String,
    pub listeners: Vec<Listener>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Listener {
    pub name: String,
    pub protocol: String,
    pub port: i32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GatewayStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// An HTTPRoute (only the fields raypipe writes or reads).
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "HTTPRoute",
    namespaced,
    status = "HTTPRouteStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteSpec {
    pub parent_refs: Vec<ParentReference>,
    pub rules: Vec<HTTPRouteRule>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ParentReference {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteRule {
    pub matches: Vec<HTTPRouteMatch>,
    pub backend_refs: Vec<HTTPBackendRef>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HTTPRouteMatch {
    pub path: HTTPPathMatch,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HTTPPathMatch {
    #[serde(rename = "type")]
    pub type_: String,
    pub value: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HTTPBackendRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HTTPRouteStatus {
    #[serde(default)]
    pub parents: Vec<RouteParentStatus>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    pub parent_ref: ParentReference,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// `<svc>-gateway`.
pub fn gateway_name(service: &RayService) -> String {
    format!("{}-gateway", service.name_any())
}

/// `<svc>-httproute`.
pub fn http_route_name(service: &RayService) -> String {
    format!("{}-httproute", service.name_any())
}

/// The Gateway the HTTPRoute attaches to: the shared one the annotation names, else the
/// RayService's own (`None` in `.1`: the RayService makes it).
pub fn parent(service: &RayService) -> (ParentReference, bool) {
    let namespace = service.namespace();
    match service
        .annotations()
        .get(SHARED_GATEWAY_ANNOTATION)
        .map(|a| a.trim())
        .filter(|a| !a.is_empty())
    {
        Some(named) => {
            let (ns, name) = match named.split_once('/') {
                Some((ns, name)) => (Some(ns.to_owned()), name.to_owned()),
                None => (namespace, named.to_owned()),
            };
            (
                ParentReference {
                    name,
                    namespace: ns,
                },
                true,
            )
        }
        None => (
            ParentReference {
                name: gateway_name(service),
                namespace,
            },
            false,
        ),
    }
}

fn owned_meta(service: &RayService, name: String) -> Result<ObjectMeta, BuildError> {
    Ok(ObjectMeta {
        name: Some(name),
        namespace: service.namespace(),
        labels: Some(BTreeMap::from([
            (
                labels::ORIGINATED_FROM_CR_NAME.to_owned(),
                service.name_any(),
            ),
            (
                labels::ORIGINATED_FROM_CRD.to_owned(),
                super::build::CREATOR.to_owned(),
            ),
        ])),
        owner_references: Some(vec![crate::k8s::controller_owner_ref(service)?]),
        ..Default::default()
    })
}

/// KubeRay's Gateway: one HTTP listener on port 80 of the configured class.
pub fn gateway(service: &RayService, class: &str) -> Result<Gateway, BuildError> {
    Ok(Gateway {
        metadata: owned_meta(service, gateway_name(service))?,
        spec: GatewaySpec {
            gateway_class_name: class.to_owned(),
            listeners: vec![Listener {
                name: LISTENER_NAME.to_owned(),
                protocol: "HTTP".to_owned(),
                port: LISTENER_PORT,
            }],
        },
        status: None,
    })
}

/// One weighted backend: a cluster's serve Service at its serve port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    pub cluster: String,
    pub port: i32,
    pub weight: i32,
}

/// KubeRay's HTTPRoute: every path to the clusters' serve Services, weighted (active first).
pub fn http_route(
    service: &RayService,
    parent: ParentReference,
    backends: &[Backend],
) -> Result<HTTPRoute, BuildError> {
    Ok(HTTPRoute {
        metadata: owned_meta(service, http_route_name(service))?,
        spec: HTTPRouteSpec {
            parent_refs: vec![parent],
            rules: vec![HTTPRouteRule {
                matches: vec![HTTPRouteMatch {
                    path: HTTPPathMatch {
                        type_: "PathPrefix".to_owned(),
                        value: "/".to_owned(),
                    },
                }],
                backend_refs: backends
                    .iter()
                    .map(|b| HTTPBackendRef {
                        name: names::serve_service_name(&b.cluster),
                        // The serve Services live beside the RayService (KubeRay writes the
                        // Gateway's namespace, which breaks a Gateway in another namespace).
                        namespace: service.namespace(),
                        port: Some(b.port),
                        weight: Some(b.weight),
                    })
                    .collect(),
            }],
        },
        status: None,
    })
}

/// The weight of `cluster` in the route (`None`: not a backend).
pub fn weight_of(route: &HTTPRoute, cluster: &str) -> Option<i32> {
    let name = names::serve_service_name(cluster);
    route
        .spec
        .rules
        .first()?
        .backend_refs
        .iter()
        .find(|b| b.name == name)
        .map(|b| b.weight.unwrap_or(1))
}

fn condition_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// KubeRay's rule: a Gateway is ready when its controller reports Accepted and Programmed.
pub fn gateway_ready(gateway: &Gateway) -> bool {
    let conditions = gateway
        .status
        .as_ref()
        .map_or(&[][..], |s| &s.conditions[..]);
    condition_true(conditions, "Accepted") && condition_true(conditions, "Programmed")
}

/// KubeRay's rule: an HTTPRoute is ready when the status entry of its Gateway says Accepted
/// and ResolvedRefs.
pub fn http_route_ready(
    route: &HTTPRoute,
    parent: &ParentReference,
    route_namespace: &str,
) -> bool {
    route.status.as_ref().is_some_and(|s| {
        s.parents.iter().any(|p| {
            p.parent_ref.name == parent.name
                && p.parent_ref.namespace.as_deref().unwrap_or(route_namespace)
                    == parent.namespace.as_deref().unwrap_or(route_namespace)
                && condition_true(&p.conditions, "Accepted")
                && condition_true(&p.conditions, "ResolvedRefs")
        })
    })
}

/// The per-cluster serve Service `<cluster>-serve-svc` an HTTPRoute backend names: the
/// RayService's serve Service for that cluster under the cluster's name, owned by the cluster
/// (deleted with it), as KubeRay makes it.
pub fn cluster_serve_service(
    service: &RayService,
    cluster: &RayCluster,
) -> Result<Service, BuildError> {
    let mut svc = super::build::serve_service(service, cluster)?;
    let cluster_name = cluster.name_any();
    svc.metadata.name = Some(names::serve_service_name(&cluster_name));
    let svc_labels = svc.metadata.labels.get_or_insert_with(Default::default);
    svc_labels.insert(
        labels::ORIGINATED_FROM_CR_NAME.to_owned(),
        cluster_name.clone(),
    );
    svc_labels.insert(
        labels::SERVE.to_owned(),
        names::serve_service_label(&cluster_name),
    );
    svc.metadata.owner_references = Some(vec![crate::k8s::controller_owner_ref(cluster)?]);
    Ok(svc)
}

/// The serve port of a cluster (`serve`, else the first `serve-*`; Serve's 8000 by default).
pub fn serve_port(cluster: &RayCluster) -> i32 {
    let ports = crate::controllers::raycluster::builders::service::head_ports(cluster);
    ports
        .iter()
        .find(|(name, _)| name.as_str() == "serve")
        .or_else(|| {
            ports.iter().find(|(name, _)| {
                crate::controllers::raycluster::builders::service::is_serve_port(name)
            })
        })
        .map_or(8000, |(_, port)| *port)
}

/// Whether `meta` names a Gateway API object of the RayService (controlled by it).
pub fn is_ours(meta: &ObjectMeta, service: &RayService) -> bool {
    service
        .meta()
        .uid
        .as_deref()
        .is_some_and(|uid| crate::k8s::is_controlled_by(meta, uid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::rayservice::build::tests::{service, spec};
    use serde_json::json;

    fn named(annotation: Option<&str>) -> RayService {
        let mut svc = service(spec("ray:1", 1, 1));
        if let Some(a) = annotation {
            svc.metadata.annotations = Some(BTreeMap::from([(
                SHARED_GATEWAY_ANNOTATION.into(),
                a.into(),
            )]));
        }
        svc
    }

    #[test]
    fn the_gateway_and_route_have_kuberays_shape() {
        let svc = named(None);
        let gw = gateway(&svc, "istio").expect("builds");
        assert_eq!(
            serde_json::to_value(&gw.spec).unwrap(),
            json!({"gatewayClassName": "istio", "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]})
        );
        assert_eq!(gw.name_any(), "svc-gateway");
        let (parent_ref, shared) = parent(&svc);
        assert!(!shared);
        let route = http_route(
            &svc,
            parent_ref,
            &[
                Backend {
                    cluster: "svc-a".into(),
                    port: 8000,
                    weight: 70,
                },
                Backend {
                    cluster: "svc-b".into(),
                    port: 8000,
                    weight: 30,
                },
            ],
        )
        .expect("builds");
        assert_eq!(route.name_any(), "svc-httproute");
        let value = serde_json::to_value(&route.spec).unwrap();
        assert_eq!(
            value["parentRefs"],
            json!([{"name": "svc-gateway", "namespace": "ns"}])
        );
        assert_eq!(
            value["rules"][0]["matches"],
            json!([{"path": {"type": "PathPrefix", "value": "/"}}])
        );
        assert_eq!(
            value["rules"][0]["backendRefs"][1],
            json!({"name": "svc-b-serve-svc", "namespace": "ns", "port": 8000, "weight": 30})
        );
        assert_eq!(weight_of(&route, "svc-a"), Some(70));
        assert_eq!(weight_of(&route, "svc-c"), None);
    }

    #[test]
    fn the_annotation_names_a_shared_gateway() {
        assert_eq!(
            parent(&named(Some("infra/edge"))),
            (
                ParentReference {
                    name: "edge".into(),
                    namespace: Some("infra".into())
                },
                true
            )
        );
        assert_eq!(
            parent(&named(Some("edge"))),
            (
                ParentReference {
                    name: "edge".into(),
                    namespace: Some("ns".into())
                },
                true
            )
        );
    }

    #[test]
    fn readiness_follows_the_conditions_a_gateway_controller_writes() {
        let svc = named(None);
        let mut gw = gateway(&svc, "istio").unwrap();
        assert!(!gateway_ready(&gw));
        let cond = |t: &str, s: &str| {
            crate::api::conditions::condition(t, s, "R", "", None, crate::k8s::now())
        };
        gw.status = Some(GatewayStatus {
            conditions: vec![cond("Accepted", "True")],
        });
        assert!(!gateway_ready(&gw), "Programmed is needed too");
        gw.status = Some(GatewayStatus {
            conditions: vec![cond("Accepted", "True"), cond("Programmed", "True")],
        });
        assert!(gateway_ready(&gw));

        let (p, _) = parent(&svc);
        let mut route = http_route(&svc, p.clone(), &[]).unwrap();
        assert!(!http_route_ready(&route, &p, "ns"));
        route.status = Some(HTTPRouteStatus {
            parents: vec![RouteParentStatus {
                parent_ref: ParentReference {
                    name: "svc-gateway".into(),
                    namespace: None,
                },
                conditions: vec![cond("Accepted", "True"), cond("ResolvedRefs", "True")],
            }],
        });
        assert!(http_route_ready(&route, &p, "ns"));
        let other = ParentReference {
            name: "other".into(),
            namespace: None,
        };
        assert!(!http_route_ready(&route, &other, "ns"));
    }
}
