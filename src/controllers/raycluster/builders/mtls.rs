//! mTLS between Ray processes (`tlsOptions.enabled`, gate RayClusterMTLS), as KubeRay builds
//! it with cert-manager: a self-signed Issuer, a CA Certificate, a CA Issuer and two leaf
//! Certificates (head, workers) whose IP SANs follow the Pods' IPs; in the Pods, the Secret of
//! the node type mounted at `/etc/ray/tls`, Ray's TLS variables on the Ray container, the
//! `wait-gcs-ready` init container and the autoscaler, and a first init container that waits
//! until the mounted certificate names the Pod's IP.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, PodSpec, ResourceRequirements,
    SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

use super::{BuildError, env, has_env};
use crate::api::raycluster::RayCluster;
use crate::kuberay::keys::{env as env_names, labels, volumes};
use crate::kuberay::names::{self, NodeType};

pub const WAIT_FOR_TLS_IP_SAN: &str = "wait-for-tls-ip-san";
/// The keys cert-manager writes into a Certificate's Secret, all of which Ray reads.
pub const SECRET_KEYS: [&str; 3] = ["tls.crt", "tls.key", "ca.crt"];

pub fn issuer_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cert-manager.io", "v1", "Issuer"))
}

pub fn certificate_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cert-manager.io",
        "v1",
        "Certificate",
    ))
}

fn tls_labels(cluster: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::APP_NAME.to_owned(),
            labels::APP_NAME_VALUE.to_owned(),
        ),
        (
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        ),
        (
            "app.kubernetes.io/component".to_owned(),
            component.to_owned(),
        ),
        (labels::CLUSTER.to_owned(), cluster.to_owned()),
    ])
}

fn object(
    cluster: &RayCluster,
    resource: &ApiResource,
    name: String,
    component: &str,
    spec: Value,
) -> Result<DynamicObject, BuildError> {
    let mut object = DynamicObject::new(&name, resource).data(json!({ "spec": spec }));
    object.metadata.namespace = cluster.namespace();
    object.metadata.labels = Some(tls_labels(&cluster.name_any(), component));
    object.metadata.owner_references = Some(vec![crate::k8s::controller_owner_ref(cluster)?]);
    Ok(object)
}

fn issuer_ref(name: String) -> Value {
    json!({"name": name, "kind": "Issuer", "group": "cert-manager.io"})
}

/// The PKI in the order it depends on itself: self-signed Issuer, CA Certificate, CA Issuer.
/// Made once and never changed (their specs only depend on the cluster's name and UID).
pub fn pki(cluster: &RayCluster) -> Result<Vec<DynamicObject>, BuildError> {
    let name = cluster.name_any();
    let ca_secret = names::tls_ca_secret_name(&name, &cluster.uid().unwrap_or_default());
    Ok(vec![
        object(
            cluster,
            &issuer_resource(),
            names::tls_self_signed_issuer_name(&name),
            "selfsigned-issuer",
            json!({"selfSigned": {}}),
        )?,
        object(
            cluster,
            &certificate_resource(),
            names::tls_ca_certificate_name(&name),
            "ca-certificate",
            json!({
                "secretName": ca_secret,
                "isCA": true,
                "commonName": format!("ray-ca-{name}"),
                "privateKey": {"algorithm": "RSA", "size": 4096},
                "duration": "87600h0m0s",
                "renewBefore": "720h0m0s",
                "usages": ["cert sign", "crl sign"],
                "issuerRef": issuer_ref(names::tls_self_signed_issuer_name(&name)),
            }),
        )?,
        object(
            cluster,
            &issuer_resource(),
            names::tls_ca_issuer_name(&name),
            "ca-issuer",
            json!({"ca": {"secretName": ca_secret}}),
        )?,
    ])
}

/// The leaf Certificate of a node type: `localhost` (and the head Service's FQDN for the head)
/// and the Pods' IPs plus 127.0.0.1, sorted, so the same Pods give the same object.
pub fn leaf_certificate(
    cluster: &RayCluster,
    node_type: NodeType,
    pod_ips: &[String],
    cluster_domain: &str,
) -> Result<DynamicObject, BuildError> {
    let name = cluster.name_any();
    let mut dns_names = BTreeSet::from(["localhost".to_owned()]);
    if node_type == NodeType::Head {
        dns_names.insert(names::head_fqdn(
            &name,
            &cluster.namespace().unwrap_or_default(),
            &cluster.spec,
            cluster_domain,
        ));
    }
    let ips: BTreeSet<&str> = pod_ips
        .iter()
        .map(String::as_str)
        .filter(|ip| !ip.is_empty())
        .chain(["127.0.0.1"])
        .collect();
    let component = match node_type {
        NodeType::Head => "head-certificate",
        NodeType::Worker => "worker-certificate",
    };
    object(
        cluster,
        &certificate_resource(),
        names::tls_certificate_name(&name, node_type),
        component,
        json!({
            "secretName": names::tls_secret_name(&name, node_type),
            "duration": "2160h0m0s",
            "renewBefore": "360h0m0s",
            "dnsNames": dns_names,
            "ipAddresses": ips,
            "usages": ["digital signature", "key encipherment", "server auth", "client auth"],
            "issuerRef": issuer_ref(names::tls_ca_issuer_name(&name)),
        }),
    )
}

/// The SANs of a leaf Certificate as sets: what decides whether it must be rewritten.
pub fn sans(certificate: &DynamicObject) -> (BTreeSet<String>, BTreeSet<String>) {
    let list = |key: &str| -> BTreeSet<String> {
        certificate.data["spec"][key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    (list("dnsNames"), list("ipAddresses"))
}

/// Ready=True for the Certificate's current generation: a Ready left over from before a SAN
/// change does not count (the Secret still holds the old certificate).
pub fn certificate_ready(certificate: &DynamicObject) -> bool {
    let generation = certificate.metadata.generation.unwrap_or_default();
    certificate.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .is_some_and(|c| {
            c["status"] == "True" && c["observedGeneration"].as_i64() == Some(generation)
        })
}

/// Ray's TLS variables (where unset) and the read-only `ray-tls` mount (unless one of that
/// name or path exists).
pub(super) fn set_container_tls(container: &mut Container) {
    let path = volumes::RAY_TLS_PATH;
    for (name, value) in [
        (env_names::RAY_USE_TLS, "1".to_owned()),
        (env_names::RAY_TLS_SERVER_CERT, format!("{path}/tls.crt")),
        (env_names::RAY_TLS_SERVER_KEY, format!("{path}/tls.key")),
        (env_names::RAY_TLS_CA_CERT, format!("{path}/ca.crt")),
    ] {
        if !has_env(container.env.as_deref().unwrap_or_default(), name) {
            container
                .env
                .get_or_insert_with(Vec::new)
                .push(env(name, value));
        }
    }
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    if !mounts
        .iter()
        .any(|m| m.name == volumes::RAY_TLS || m.mount_path == path)
    {
        mounts.push(tls_mount());
    }
}

fn tls_mount() -> VolumeMount {
    VolumeMount {
        name: volumes::RAY_TLS.to_owned(),
        mount_path: volumes::RAY_TLS_PATH.to_owned(),
        read_only: Some(true),
        ..Default::default()
    }
}

/// The shell loop of the first init container: it ends once the mounted certificate lists the
/// Pod's IP (cert-manager reissues it after the operator adds the IP).
fn wait_script() -> String {
    let cert = format!("{}/tls.crt", volumes::RAY_TLS_PATH);
    [
        format!("CERT=\"{cert}\""),
        "if [ -z \"${POD_IP}\" ]; then".into(),
        "  POD_IP=$(hostname -i 2>/dev/null | awk '{print $1}')".into(),
        "fi".into(),
        "if ! command -v openssl >/dev/null 2>&1; then".into(),
        "  echo \"openssl not found; cannot verify IP SAN\" >&2".into(),
        "  exit 1".into(),
        "fi".into(),
        "echo \"Waiting for TLS cert to include IP SAN for ${POD_IP}...\"".into(),
        "while true; do".into(),
        "  if openssl x509 -in \"${CERT}\" -noout -text 2>/dev/null | grep -qE \"IP Address:${POD_IP}([^0-9.]|$)\"; then".into(),
        "    echo \"TLS cert now includes IP SAN for ${POD_IP}\"".into(),
        "    exit 0".into(),
        "  fi".into(),
        "  echo \"IP SAN for ${POD_IP} not yet in cert, retrying in 5s...\"".into(),
        "  sleep 5".into(),
        "done".into(),
    ]
    .join("\n")
}

/// Wires TLS into a Ray Pod of `node_type`: the Secret volume, the Ray container, the
/// `wait-gcs-ready` init container (not the user's), and the IP-SAN wait first of all.
pub(super) fn configure_pod(cluster: &str, node_type: NodeType, spec: &mut PodSpec, ray: usize) {
    let volumes_list = spec.volumes.get_or_insert_with(Vec::new);
    if !volumes_list.iter().any(|v| v.name == volumes::RAY_TLS) {
        volumes_list.push(Volume {
            name: volumes::RAY_TLS.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names::tls_secret_name(cluster, node_type)),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let Some(ray_container) = spec.containers.get_mut(ray) else {
        return;
    };
    set_container_tls(ray_container);
    let ray_container = ray_container.clone();
    let inits = spec.init_containers.get_or_insert_with(Vec::new);
    for init in inits.iter_mut() {
        if init.name == super::pod::WAIT_GCS_READY_CONTAINER_NAME {
            set_container_tls(init);
        }
    }
    if inits.iter().any(|c| c.name == WAIT_FOR_TLS_IP_SAN) {
        return;
    }
    let small = BTreeMap::from([
        ("cpu".to_owned(), Quantity("50m".into())),
        ("memory".to_owned(), Quantity("64Mi".into())),
    ]);
    inits.insert(
        0,
        Container {
            name: WAIT_FOR_TLS_IP_SAN.to_owned(),
            image: ray_container.image,
            image_pull_policy: ray_container.image_pull_policy,
            command: Some(vec!["sh".into(), "-c".into()]),
            args: Some(vec![wait_script()]),
            security_context: ray_container.security_context,
            env: Some(vec![EnvVar {
                name: "POD_IP".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "status.podIP".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }]),
            volume_mounts: Some(vec![tls_mount()]),
            resources: Some(ResourceRequirements {
                limits: Some(small.clone()),
                requests: Some(small),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> RayCluster {
        super::super::test_cluster(json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "raycluster-mtls"},
            "spec": {
                "tlsOptions": {"enabled": true},
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.55.1"}]}}}
            }
        }))
    }

    #[test]
    fn the_pki_has_kuberays_names_and_specs() {
        let mut rc = cluster();
        rc.metadata.uid = Some("0123456789abcdef".into());
        let pki = pki(&rc).expect("builds");
        let names: Vec<(String, String)> = pki
            .iter()
            .map(|o| {
                (
                    o.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default(),
                    o.name_any(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                (
                    "Issuer".into(),
                    "ray-selfsigned-issuer-raycluster-mtls".into()
                ),
                (
                    "Certificate".into(),
                    "ray-ca-certificate-raycluster-mtls".into()
                ),
                ("Issuer".into(), "ray-ca-issuer-raycluster-mtls".into()),
            ]
        );
        assert_eq!(
            pki[1].data["spec"]["secretName"],
            "raycluster-mtls-ca-secret-01234567"
        );
        assert_eq!(
            pki[2].data["spec"],
            json!({"ca": {"secretName": "raycluster-mtls-ca-secret-01234567"}})
        );
        assert_eq!(
            pki[0].labels()["app.kubernetes.io/component"],
            "selfsigned-issuer"
        );
        assert_eq!(pki[0].owner_references()[0].kind, "RayCluster");
    }

    #[test]
    fn leaf_certificates_follow_the_pod_ips() {
        let rc = cluster();
        let head = leaf_certificate(
            &rc,
            NodeType::Head,
            &["10.244.0.9".into(), "10.244.0.9".into()],
            "cluster.local",
        )
        .expect("builds");
        assert_eq!(head.name_any(), "ray-head-cert-raycluster-mtls");
        assert_eq!(
            head.data["spec"],
            json!({
                "secretName": "ray-head-secret-raycluster-mtls",
                "duration": "2160h0m0s", "renewBefore": "360h0m0s",
                "dnsNames": ["localhost", "raycluster-mtls-head-svc.ns.svc.cluster.local"],
                "ipAddresses": ["10.244.0.9", "127.0.0.1"],
                "usages": ["digital signature", "key encipherment", "server auth", "client auth"],
                "issuerRef": {"name": "ray-ca-issuer-raycluster-mtls", "kind": "Issuer", "group": "cert-manager.io"}
            })
        );
        let worker = leaf_certificate(&rc, NodeType::Worker, &[], "cluster.local").expect("builds");
        assert_eq!(worker.name_any(), "ray-worker-cert-raycluster-mtls");
        assert_eq!(
            sans(&worker),
            (
                BTreeSet::from(["localhost".to_owned()]),
                BTreeSet::from(["127.0.0.1".to_owned()])
            )
        );
        let mut ready = worker.clone();
        ready.metadata.generation = Some(2);
        ready.data["status"] =
            json!({"conditions": [{"type": "Ready", "status": "True", "observedGeneration": 1}]});
        assert!(!certificate_ready(&ready), "a stale Ready does not count");
        ready.data["status"]["conditions"][0]["observedGeneration"] = json!(2);
        assert!(certificate_ready(&ready));
    }

    #[test]
    fn pods_mount_the_secret_and_wait_for_their_ip() {
        let mut spec: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "ray-worker", "image": "img", "env": [{"name": "RAY_USE_TLS", "value": "0"}]}],
            "initContainers": [{"name": "wait-gcs-ready", "image": "img"}, {"name": "mine", "image": "x"}]
        }))
        .expect("spec");
        configure_pod("rc", NodeType::Worker, &mut spec, 0);
        configure_pod("rc", NodeType::Worker, &mut spec, 0);
        let value = serde_json::to_value(&spec).expect("json");
        assert_eq!(
            value["volumes"],
            json!([{"name": "ray-tls", "secret": {"secretName": "ray-worker-secret-rc"}}])
        );
        assert_eq!(
            value["containers"][0]["env"],
            json!([
                {"name": "RAY_USE_TLS", "value": "0"},
                {"name": "RAY_TLS_SERVER_CERT", "value": "/etc/ray/tls/tls.crt"},
                {"name": "RAY_TLS_SERVER_KEY", "value": "/etc/ray/tls/tls.key"},
                {"name": "RAY_TLS_CA_CERT", "value": "/etc/ray/tls/ca.crt"}
            ])
        );
        let inits: Vec<&str> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(inits, ["wait-for-tls-ip-san", "wait-gcs-ready", "mine"]);
        assert_eq!(
            value["initContainers"][1]["env"].as_array().map(Vec::len),
            Some(4)
        );
        assert!(value["initContainers"][2].get("env").is_none());
        let wait = &value["initContainers"][0];
        assert_eq!(wait["image"], "img");
        assert_eq!(wait["command"], json!(["sh", "-c"]));
        assert_eq!(
            wait["volumeMounts"],
            json!([{"name": "ray-tls", "mountPath": "/etc/ray/tls", "readOnly": true}])
        );
        assert_eq!(
            wait["resources"]["limits"],
            json!({"cpu": "50m", "memory": "64Mi"})
        );
        assert!(
            wait["args"][0]
                .as_str()
                .expect("script")
                .contains("IP Address:${POD_IP}")
        );
    }
}
