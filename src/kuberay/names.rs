//! Object names derived from a RayCluster, with KubeRay's truncation rules.

use crate::api::raycluster::RayClusterSpec;

/// Longest prefix KubeRay keeps in a Pod name (63 minus `-worker-` and 5 random characters).
const MAX_POD_PREFIX: usize = 50;
/// Longest name `check_name` keeps.
const MAX_NAME: usize = 50;
/// Longest label value (and Job name).
const MAX_LABEL: usize = 63;

/// The head or a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeType {
    Head,
    Worker,
}

impl NodeType {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeType::Head => crate::kuberay::keys::labels::HEAD,
            NodeType::Worker => crate::kuberay::keys::labels::WORKER,
        }
    }
}

/// KubeRay's `CheckName`: keeps the last 50 characters and replaces a leading digit or
/// punctuation character with `r`.
pub fn check_name(name: &str) -> String {
    fix_first_char(keep_last(name, MAX_NAME), |c| {
        c.is_ascii_digit() || c.is_ascii_punctuation()
    })
}

/// KubeRay's `CheckLabel`: keeps the last 63 characters and replaces a leading punctuation
/// character with `r`.
pub fn check_label(value: &str) -> String {
    fix_first_char(keep_last(value, MAX_LABEL), |c| c.is_ascii_punctuation())
}

fn keep_last(s: &str, max: usize) -> &str {
    let excess = s.len().saturating_sub(max);
    let mut start = excess;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

fn fix_first_char(s: &str, replace: impl Fn(char) -> bool) -> String {
    match s.chars().next() {
        Some(first) if replace(first) => format!("r{}", &s[first.len_utf8()..]),
        _ => s.to_owned(),
    }
}

/// A Pod name (or `generateName` with the trailing dash): the prefix cut to its first 50
/// characters, then `-<type>`, lower-cased.
pub fn pod_name(prefix: &str, node_type: NodeType, generate: bool) -> String {
    let mut end = prefix.len().min(MAX_POD_PREFIX);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    let mut name = format!("{}-{}", &prefix[..end], node_type.as_str()).to_lowercase();
    if generate {
        name.push('-');
    }
    name
}

/// `generateName` (or fixed name) of the head Pod.
pub fn head_pod_name(cluster: &str, deterministic: bool) -> String {
    pod_name(cluster, NodeType::Head, !deterministic)
}

/// `generateName` of a worker Pod of `group`.
pub fn worker_pod_generate_name(cluster: &str, group: &str) -> String {
    pod_name(&format!("{cluster}-{group}"), NodeType::Worker, true)
}

/// `ray.io/identifier` of a node type.
pub fn identifier(cluster: &str, node_type: NodeType) -> String {
    check_label(&format!("{cluster}-{}", node_type.as_str()))
}

/// The head Service a RayService or RayJob keeps in front of its current cluster.
pub fn owner_head_service_name(owner: &str) -> String {
    format!("{owner}-head-svc")
}

/// The head Service: `headService.metadata.name` when given, else `<cluster>-head-svc`.
pub fn head_service_name(cluster: &str, spec: &RayClusterSpec) -> String {
    spec.head_group_spec
        .head_service
        .as_ref()
        .and_then(|s| s.metadata.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("{cluster}-head-svc"))
}

/// `<headService>.<namespace>.svc.<domain>`: how workers reach the head.
pub fn head_fqdn(cluster: &str, namespace: &str, spec: &RayClusterSpec, domain: &str) -> String {
    format!(
        "{}.{namespace}.svc.{domain}",
        head_service_name(cluster, spec)
    )
}

/// The deprecated `RAY_IP`: the first DNS label of the head FQDN.
pub fn ray_ip_from_fqdn(fqdn: &str) -> &str {
    fqdn.split('.').next().unwrap_or(fqdn)
}

/// `<name>-serve-svc`.
pub fn serve_service_name(cluster: &str) -> String {
    format!("{cluster}-serve-svc")
}

/// `<name>-serve`: the `ray.io/serve` label value of the serve Service.
pub fn serve_service_label(cluster: &str) -> String {
    format!("{cluster}-serve")
}

/// `<cluster>-headless`: the Service multi-host workers use to find each other.
pub fn headless_service_name(cluster: &str) -> String {
    format!("{cluster}-headless")
}

/// The head Ingress.
pub fn ingress_name(cluster: &str) -> String {
    check_name(&format!("{cluster}-head-ingress"))
}

/// The Redis cleanup Job.
pub fn redis_cleanup_job_name(cluster: &str) -> String {
    check_label(&format!("{cluster}-redis-cleanup"))
}

/// The autoscaler's ServiceAccount: the head template's, else the cluster's name.
pub fn autoscaler_service_account_name(cluster: &str, spec: &RayClusterSpec) -> String {
    let from_template = spec
        .head_group_spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|n| !n.is_empty());
    check_name(from_template.as_deref().unwrap_or(cluster))
}

/// Whether the user named the head ServiceAccount (then they must create it).
pub fn user_named_service_account(spec: &RayClusterSpec) -> bool {
    spec.head_group_spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// The autoscaler's Role and RoleBinding.
pub fn autoscaler_role_name(cluster: &str) -> String {
    check_name(cluster)
}

/// The Secret holding the auth token the operator generates.
pub fn auth_secret_name(cluster: &str) -> String {
    check_name(cluster)
}

/// The NetworkPolicy of the head Pod.
pub fn head_network_policy_name(cluster: &str) -> String {
    format!("{cluster}-head")
}

/// The NetworkPolicy of one worker group's Pods.
pub fn worker_network_policy_name(cluster: &str, group: &str) -> String {
    format!("{cluster}-workers-{group}")
}

/// The operator-made PVC of the embedded GCS store, or the user's claim.
pub fn gcs_storage_pvc_name(cluster: &str, spec: &RayClusterSpec) -> String {
    spec.gcs_fault_tolerance_options
        .as_ref()
        .and_then(|o| o.storage.as_ref())
        .and_then(|s| s.claim_name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("{cluster}-gcs-pvc"))
}

/// cert-manager objects of a cluster's mTLS PKI (KubeRay's names).
pub fn tls_self_signed_issuer_name(cluster: &str) -> String {
    format!("ray-selfsigned-issuer-{cluster}")
}
pub fn tls_ca_certificate_name(cluster: &str) -> String {
    format!("ray-ca-certificate-{cluster}")
}
pub fn tls_ca_issuer_name(cluster: &str) -> String {
    format!("ray-ca-issuer-{cluster}")
}
/// The CA's Secret carries the first 8 characters of the cluster UID, so a cluster recreated
/// under the same name never picks up an old CA.
pub fn tls_ca_secret_name(cluster: &str, uid: &str) -> String {
    let prefix: String = uid.chars().take(8).collect();
    format!("{cluster}-ca-secret-{prefix}")
}
pub fn tls_certificate_name(cluster: &str, node_type: NodeType) -> String {
    match node_type {
        NodeType::Head => format!("ray-head-cert-{cluster}"),
        NodeType::Worker => format!("ray-worker-cert-{cluster}"),
    }
}
pub fn tls_secret_name(cluster: &str, node_type: NodeType) -> String {
    match node_type {
        NodeType::Head => format!("ray-head-secret-{cluster}"),
        NodeType::Worker => format!("ray-worker-secret-{cluster}"),
    }
}

/// A multi-host replica's name: `<group>-<5 lowercase alphanumerics>`; the suffix comes from
/// the caller so this stays deterministic.
pub fn replica_name(group: &str, suffix: &str) -> String {
    format!("{group}-{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_name_keeps_the_last_50_characters_and_fixes_the_first() {
        assert_eq!(check_name("raycluster"), "raycluster");
        let long = format!("a{}", "b".repeat(59));
        assert_eq!(check_name(&long), "b".repeat(50));
        assert_eq!(check_name("1abc"), "rabc");
        assert_eq!(check_name("-abc"), "rabc");
        let long_digit = format!("{}9xyz", "a".repeat(50));
        let checked = check_name(&long_digit);
        assert_eq!(checked.len(), 50);
        assert!(checked.starts_with('a'));
    }

    #[test]
    fn check_label_keeps_63_and_allows_a_leading_digit() {
        assert_eq!(check_label("1abc"), "1abc");
        assert_eq!(check_label(".abc"), "rabc");
        let long = "x".repeat(70);
        assert_eq!(check_label(&long).len(), 63);
    }

    #[test]
    fn pod_names_follow_kuberay() {
        assert_eq!(
            head_pod_name("raycluster-kuberay", false),
            "raycluster-kuberay-head-"
        );
        assert_eq!(
            head_pod_name("raycluster-kuberay", true),
            "raycluster-kuberay-head"
        );
        assert_eq!(
            worker_pod_generate_name("raycluster-kuberay", "workergroup"),
            "raycluster-kuberay-workergroup-worker-"
        );
        // The prefix keeps its first 50 characters; the result is lower-cased.
        let name = worker_pod_generate_name(&"c".repeat(48), "Group");
        assert_eq!(name, format!("{}-g-worker-", "c".repeat(48)));
        assert!(name.len() <= 63 - 5);
    }

    #[test]
    fn service_names_and_fqdn() {
        let mut spec = RayClusterSpec::default();
        assert_eq!(head_service_name("c", &spec), "c-head-svc");
        assert_eq!(
            head_fqdn("c", "ns", &spec, "cluster.local"),
            "c-head-svc.ns.svc.cluster.local"
        );
        spec.head_group_spec.head_service = Some(
            serde_json::from_value(serde_json::json!({"metadata": {"name": "custom"}}))
                .expect("a Service"),
        );
        assert_eq!(head_service_name("c", &spec), "custom");
        assert_eq!(ray_ip_from_fqdn("custom.ns.svc.cluster.local"), "custom");
        assert_eq!(serve_service_name("c"), "c-serve-svc");
        assert_eq!(headless_service_name("c"), "c-headless");
        assert_eq!(identifier("c", NodeType::Worker), "c-worker");
        assert_eq!(redis_cleanup_job_name("c"), "c-redis-cleanup");
        assert_eq!(ingress_name("c"), "c-head-ingress");
    }

    #[test]
    fn autoscaler_service_account_defaults_to_the_cluster_name() {
        let mut spec = RayClusterSpec::default();
        assert_eq!(autoscaler_service_account_name("c", &spec), "c");
        assert!(!user_named_service_account(&spec));
        spec.head_group_spec.template.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            service_account_name: Some("mine".into()),
            ..Default::default()
        });
        assert_eq!(autoscaler_service_account_name("c", &spec), "mine");
        assert!(user_named_service_account(&spec));
    }
}
