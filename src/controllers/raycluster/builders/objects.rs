//! The smaller objects of a RayCluster: the autoscaler's ServiceAccount, Role and RoleBinding,
//! the head Ingress and the auth token Secret.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::networking::v1::{
    HTTPIngressPath, HTTPIngressRuleValue, Ingress, IngressBackend, IngressRule,
    IngressServiceBackend, IngressSpec, ServiceBackendPort,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::BuildError;
use super::service::head_ports;
use crate::api::raycluster::{IngressPathType, RayCluster};
use crate::kuberay::keys::{annotations, labels, ports};
use crate::kuberay::names::{self, NodeType};

/// `ray.io/cluster`, `app.kubernetes.io/name` and `created-by`, as on KubeRay's RBAC objects.
fn rbac_labels(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::CLUSTER.to_owned(), cluster.to_owned()),
        (
            labels::APP_NAME.to_owned(),
            labels::APP_NAME_VALUE.to_owned(),
        ),
        (
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        ),
    ])
}

fn owned_meta(
    cluster: &RayCluster,
    name: String,
    labels: BTreeMap<String, String>,
) -> Result<ObjectMeta, BuildError> {
    Ok(ObjectMeta {
        name: Some(name),
        namespace: cluster.namespace(),
        labels: Some(labels),
        owner_references: Some(vec![crate::k8s::controller_owner_ref(cluster)?]),
        ..Default::default()
    })
}

/// The autoscaler's ServiceAccount (named like the head Pod's `serviceAccountName`).
pub fn autoscaler_service_account(cluster: &RayCluster) -> Result<ServiceAccount, BuildError> {
    let name = cluster.name_any();
    Ok(ServiceAccount {
        metadata: owned_meta(
            cluster,
            names::autoscaler_service_account_name(&name, &cluster.spec),
            rbac_labels(&name),
        )?,
        ..Default::default()
    })
}

/// What the autoscaler may do: watch and patch Pods (and resize them), read and patch its
/// RayCluster (to set replicas and `workersToDelete`).
pub fn autoscaler_role(cluster: &RayCluster) -> Result<Role, BuildError> {
    let name = cluster.name_any();
    let rule = |group: &str, resource: &str, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    };
    Ok(Role {
        metadata: owned_meta(
            cluster,
            names::autoscaler_role_name(&name),
            rbac_labels(&name),
        )?,
        rules: Some(vec![
            rule("", "pods", &["get", "list", "watch", "patch"]),
            rule("", "pods/resize", &["patch"]),
            rule("ray.io", "rayclusters", &["get", "patch"]),
        ]),
    })
}

/// Binds the autoscaler's ServiceAccount to its Role.
pub fn autoscaler_role_binding(cluster: &RayCluster) -> Result<RoleBinding, BuildError> {
    let name = cluster.name_any();
    Ok(RoleBinding {
        metadata: owned_meta(
            cluster,
            names::autoscaler_role_name(&name),
            rbac_labels(&name),
        )?,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: names::autoscaler_role_name(&name),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: names::autoscaler_service_account_name(&name, &cluster.spec),
            namespace: cluster.namespace(),
            ..Default::default()
        }]),
    })
}

/// The Ingress to the head's dashboard port. Every annotation of the cluster is copied, except
/// `kubernetes.io/ingress.class`, which becomes `ingressClassName`.
pub fn head_ingress(cluster: &RayCluster) -> Result<Ingress, BuildError> {
    let name = cluster.name_any();
    let cluster_annotations = cluster.annotations();
    let copied: BTreeMap<String, String> = cluster_annotations
        .iter()
        .filter(|(k, _)| k.as_str() != annotations::INGRESS_CLASS)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let options = cluster
        .spec
        .head_group_spec
        .ingress_options
        .clone()
        .unwrap_or_default();
    let path_type = match options.path_type.unwrap_or(IngressPathType::Prefix) {
        IngressPathType::Exact => "Exact",
        IngressPathType::Prefix => "Prefix",
        IngressPathType::ImplementationSpecific => "ImplementationSpecific",
    };
    let dashboard_port = head_ports(cluster)
        .get(ports::DASHBOARD_NAME)
        .copied()
        .unwrap_or(ports::DASHBOARD);
    let rule = IngressRule {
        host: options.host.clone(),
        http: Some(HTTPIngressRuleValue {
            paths: vec![HTTPIngressPath {
                path: Some(options.path.clone().unwrap_or_else(|| "/".into())),
                path_type: path_type.into(),
                backend: IngressBackend {
                    service: Some(IngressServiceBackend {
                        name: names::head_service_name(&name, &cluster.spec),
                        port: Some(ServiceBackendPort {
                            number: Some(dashboard_port),
                            name: None,
                        }),
                    }),
                    resource: None,
                },
            }],
        }),
    };
    let labels = BTreeMap::from([
        (labels::CLUSTER.to_owned(), name.clone()),
        (
            labels::IDENTIFIER.to_owned(),
            names::identifier(&name, NodeType::Head),
        ),
        (
            labels::APP_NAME.to_owned(),
            labels::APP_NAME_VALUE.to_owned(),
        ),
        (
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        ),
    ]);
    let mut meta = owned_meta(cluster, names::ingress_name(&name), labels)?;
    meta.annotations = Some(copied);
    Ok(Ingress {
        metadata: meta,
        spec: Some(IngressSpec {
            ingress_class_name: cluster_annotations.get(annotations::INGRESS_CLASS).cloned(),
            rules: Some(vec![rule]),
            tls: options.tls.clone().filter(|t| !t.is_empty()),
            ..Default::default()
        }),
        status: None,
    })
}

/// The Secret with a generated auth token (`auth_token`), for token auth without
/// `secretName`. The token comes from the caller so the builder stays pure.
pub fn auth_secret(cluster: &RayCluster, token: &str) -> Result<Secret, BuildError> {
    let name = cluster.name_any();
    Ok(Secret {
        metadata: owned_meta(
            cluster,
            names::auth_secret_name(&name),
            BTreeMap::from([(labels::CLUSTER.to_owned(), name.clone())]),
        )?,
        string_data: Some(BTreeMap::from([(
            "auth_token".to_owned(),
            token.to_owned(),
        )])),
        ..Default::default()
    })
}

/// Whether the operator must make the auth Secret: token auth without `secretName` and without
/// Kubernetes token auth. (KubeRay also makes it for an unset mode, where nothing uses it; here
/// only `mode: token` does.)
pub fn needs_auth_secret(cluster: &RayCluster) -> bool {
    let Some(auth) = &cluster.spec.auth_options else {
        return false;
    };
    crate::kuberay::spec::auth_enabled(&cluster.spec)
        && auth.enable_k8s_token_auth != Some(true)
        && auth.secret_name.as_deref().unwrap_or_default().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::raycluster::builders::test_cluster;
    use serde_json::json;

    fn autoscaled() -> RayCluster {
        test_cluster(json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "c", "annotations": {"kubernetes.io/ingress.class": "nginx", "team": "a"}},
            "spec": {"enableInTreeAutoscaling": true, "headGroupSpec": {
                "enableIngress": true, "ingressOptions": {"host": "ray.example.com"},
                "template": {"spec": {"containers": [{"name": "h", "image": "i", "ports": [{"name": "dashboard", "containerPort": 8266}]}]}}}}
        }))
    }

    #[test]
    fn rbac_objects_match_kuberay() {
        let c = autoscaled();
        let sa = autoscaler_service_account(&c).expect("builds");
        assert_eq!(sa.metadata.name.as_deref(), Some("c"));
        assert_eq!(
            sa.metadata.labels.as_ref().expect("labels")["app.kubernetes.io/created-by"],
            "kuberay-operator"
        );
        let role = autoscaler_role(&c).expect("builds");
        assert_eq!(
            serde_json::to_value(&role.rules).expect("json"),
            json!([
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]},
                {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]}
            ])
        );
        let binding = autoscaler_role_binding(&c).expect("builds");
        assert_eq!(binding.role_ref.name, "c");
        let subject = &binding.subjects.expect("subjects")[0];
        assert_eq!(
            (
                subject.kind.as_str(),
                subject.name.as_str(),
                subject.namespace.as_deref()
            ),
            ("ServiceAccount", "c", Some("ns"))
        );
    }

    #[test]
    fn ingress_points_at_the_dashboard_port() {
        let ingress = head_ingress(&autoscaled()).expect("builds");
        assert_eq!(ingress.metadata.name.as_deref(), Some("c-head-ingress"));
        let annotations = ingress.metadata.annotations.clone().expect("annotations");
        assert!(!annotations.contains_key("kubernetes.io/ingress.class"));
        assert_eq!(annotations["team"], "a");
        let spec = ingress.spec.expect("spec");
        assert_eq!(spec.ingress_class_name.as_deref(), Some("nginx"));
        assert_eq!(
            serde_json::to_value(&spec.rules).expect("json"),
            json!([{"host": "ray.example.com", "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "c-head-svc", "port": {"number": 8266}}}}]}}])
        );
    }

    #[test]
    fn auth_secret_only_for_token_mode_without_a_secret_name() {
        let mut c = autoscaled();
        assert!(!needs_auth_secret(&c));
        c.spec.auth_options = Some(serde_json::from_value(json!({"mode": "token"})).expect("auth"));
        assert!(needs_auth_secret(&c));
        let secret = auth_secret(&c, "t0ken").expect("builds");
        assert_eq!(secret.metadata.name.as_deref(), Some("c"));
        assert_eq!(secret.string_data.expect("data")["auth_token"], "t0ken");
        c.spec.auth_options = Some(
            serde_json::from_value(json!({"mode": "token", "secretName": "mine"})).expect("auth"),
        );
        assert!(!needs_auth_secret(&c));
        c.spec.auth_options = Some(serde_json::from_value(json!({})).expect("auth"));
        assert!(!needs_auth_secret(&c));
    }
}
