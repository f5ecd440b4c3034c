//! Network isolation (`spec.networkPolicy`, gate RayClusterNetworkPolicy), as KubeRay builds
//! it: one NetworkPolicy for the head (`<cluster>-head`) and one per worker group
//! (`<cluster>-workers-<group>`). Ingress and/or egress (by mode) is limited to the cluster's
//! own Pods plus the user's rules; the head also admits the submitter of the RayJob that owns
//! the cluster (K8sJobMode only). DNS is not opened: the user adds it (KubeRay's sample does).

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::BuildError;
use crate::api::raycluster::{NetworkPolicyMode, NetworkPolicyRules, RayCluster};
use crate::kuberay::keys::{labels, ports};
use crate::kuberay::names;

/// The label a RayJob puts on the cluster it creates: only K8sJobMode has a submitter Pod.
const JOB_SUBMISSION_MODE_LABEL: &str = "ray.io/job-submission-mode";

/// Every NetworkPolicy the cluster should have (empty without `spec.networkPolicy`).
pub fn network_policies(cluster: &RayCluster) -> Result<Vec<NetworkPolicy>, BuildError> {
    let Some(config) = &cluster.spec.network_policy else {
        return Ok(Vec::new());
    };
    let mode = config.mode.unwrap_or(NetworkPolicyMode::DenyAll);
    let name = cluster.name_any();
    let cluster_peer = selector_peer([(labels::CLUSTER, name.as_str())]);

    let mut head_ingress = vec![NetworkPolicyIngressRule {
        from: Some(vec![cluster_peer.clone()]),
        ports: None,
    }];
    if let Some(submitter) = rayjob_submitter(cluster) {
        let dashboard_port = cluster
            .spec
            .head_group_spec
            .ray_start_params
            .as_ref()
            .and_then(|p| p.get("dashboard-port"))
            .and_then(|p| p.parse::<i32>().ok())
            .unwrap_or(ports::DASHBOARD);
        head_ingress.push(NetworkPolicyIngressRule {
            from: Some(vec![submitter]),
            ports: Some(vec![NetworkPolicyPort {
                protocol: Some("TCP".into()),
                port: Some(IntOrString::Int(dashboard_port)),
                end_port: None,
            }]),
        });
    }
    let mut policies = vec![policy(
        cluster,
        names::head_network_policy_name(&name),
        labels::HEAD_GROUP,
        BTreeMap::from([
            (labels::CLUSTER.to_owned(), name.clone()),
            (labels::NODE_TYPE.to_owned(), labels::HEAD.to_owned()),
        ]),
        mode,
        (head_ingress, config.head.as_ref()),
        &cluster_peer,
    )?];
    for group in cluster.spec.worker_group_specs.iter().flatten() {
        let group_name = group.group_name.as_str();
        // A group's own entry replaces the rules for all workers.
        let group_entry = config
            .worker_groups
            .iter()
            .flatten()
            .find(|g| g.group_name == group_name)
            .map(|g| NetworkPolicyRules {
                ingress_rules: g.ingress_rules.clone(),
                egress_rules: g.egress_rules.clone(),
            });
        let custom = group_entry.as_ref().or(config.worker.as_ref());
        let base_ingress = vec![NetworkPolicyIngressRule {
            from: Some(vec![cluster_peer.clone()]),
            ports: None,
        }];
        policies.push(policy(
            cluster,
            names::worker_network_policy_name(&name, group_name),
            group_name,
            BTreeMap::from([
                (labels::CLUSTER.to_owned(), name.clone()),
                (labels::NODE_TYPE.to_owned(), labels::WORKER.to_owned()),
                (labels::GROUP.to_owned(), group_name.to_owned()),
            ]),
            mode,
            (base_ingress, custom),
            &cluster_peer,
        )?);
    }
    Ok(policies)
}

fn selector_peer<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
            ),
            match_expressions: None,
        }),
        ..Default::default()
    }
}

/// The submitter Pod of the RayJob controlling this cluster, in K8sJobMode.
fn rayjob_submitter(cluster: &RayCluster) -> Option<NetworkPolicyPeer> {
    if cluster
        .labels()
        .get(JOB_SUBMISSION_MODE_LABEL)
        .map(String::as_str)
        != Some("K8sJobMode")
    {
        return None;
    }
    let owner = cluster.owner_references().iter().find(|o| {
        o.kind == "RayJob" && o.controller == Some(true) && o.api_version.starts_with("ray.io/")
    })?;
    Some(selector_peer([
        (labels::ORIGINATED_FROM_CR_NAME, owner.name.as_str()),
        (labels::ORIGINATED_FROM_CRD, "RayJob"),
    ]))
}

fn policy(
    cluster: &RayCluster,
    name: String,
    group_label: &str,
    pod_labels: BTreeMap<String, String>,
    mode: NetworkPolicyMode,
    (base_ingress, custom): (Vec<NetworkPolicyIngressRule>, Option<&NetworkPolicyRules>),
    cluster_peer: &NetworkPolicyPeer,
) -> Result<NetworkPolicy, BuildError> {
    let mut policy_types = Vec::new();
    let (mut ingress, mut egress) = (None, None);
    if matches!(
        mode,
        NetworkPolicyMode::DenyAll | NetworkPolicyMode::DenyAllIngress
    ) {
        policy_types.push("Ingress".to_owned());
        let mut rules = base_ingress;
        rules.extend(
            custom
                .and_then(|c| c.ingress_rules.clone())
                .into_iter()
                .flatten(),
        );
        ingress = Some(rules);
    }
    if matches!(
        mode,
        NetworkPolicyMode::DenyAll | NetworkPolicyMode::DenyAllEgress
    ) {
        policy_types.push("Egress".to_owned());
        let mut rules = vec![NetworkPolicyEgressRule {
            to: Some(vec![cluster_peer.clone()]),
            ports: None,
        }];
        rules.extend(
            custom
                .and_then(|c| c.egress_rules.clone())
                .into_iter()
                .flatten(),
        );
        egress = Some(rules);
    }
    let mut spec = NetworkPolicySpec {
        pod_selector: Some(LabelSelector {
            match_labels: Some(pod_labels),
            match_expressions: None,
        }),
        policy_types: Some(policy_types),
        ingress,
        egress,
    };
    default_protocols(&mut spec);
    Ok(NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: cluster.namespace(),
            labels: Some(policy_labels(&cluster.name_any(), group_label)),
            owner_references: Some(vec![crate::k8s::controller_owner_ref(cluster)?]),
            ..Default::default()
        },
        spec: Some(spec),
    })
}

/// `ray.io/cluster`, `ray.io/group` (`headgroup` for the head) and KubeRay's app labels.
pub fn policy_labels(cluster: &str, group: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::CLUSTER.to_owned(), cluster.to_owned()),
        (labels::GROUP.to_owned(), group.to_owned()),
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

/// The API server stores an unset port protocol as TCP; building it that way keeps a settled
/// policy equal to the stored one, so it is never rewritten.
fn default_protocols(spec: &mut NetworkPolicySpec) {
    let ingress_ports = spec
        .ingress
        .iter_mut()
        .flatten()
        .flat_map(|r| r.ports.iter_mut().flatten());
    let egress_ports = spec
        .egress
        .iter_mut()
        .flatten()
        .flat_map(|r| r.ports.iter_mut().flatten());
    for port in ingress_ports.chain(egress_ports) {
        port.protocol.get_or_insert_with(|| "TCP".to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn cluster(policy: Value, extra_meta: Value) -> RayCluster {
        let mut value = json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "rc"},
            "spec": {
                "networkPolicy": policy,
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "h", "image": "i"}]}}},
                "workerGroupSpecs": [
                    {"groupName": "a", "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}},
                    {"groupName": "b", "template": {"spec": {"containers": [{"name": "w", "image": "i"}]}}}
                ]
            }
        });
        for (k, v) in extra_meta.as_object().cloned().unwrap_or_default() {
            value["metadata"][k] = v;
        }
        super::super::test_cluster(value)
    }

    fn dns_rule() -> Value {
        json!({"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                       "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
               "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53}]})
    }

    #[test]
    fn deny_all_has_kuberays_head_and_worker_policies() {
        let rc = cluster(
            json!({"mode": "DenyAll", "head": {"egressRules": [dns_rule()]},
                   "worker": {"egressRules": [dns_rule()]}}),
            json!({}),
        );
        let policies = network_policies(&rc).expect("builds");
        let names: Vec<String> = policies.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["rc-head", "rc-workers-a", "rc-workers-b"]);
        let own = json!({"podSelector": {"matchLabels": {"ray.io/cluster": "rc"}}});
        let mut dns = dns_rule();
        dns["ports"][1]["protocol"] = json!("TCP");
        assert_eq!(
            serde_json::to_value(&policies[0]).expect("json"),
            json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {
                    "name": "rc-head", "namespace": "ns",
                    "labels": {"ray.io/cluster": "rc", "ray.io/group": "headgroup",
                        "app.kubernetes.io/name": "kuberay", "app.kubernetes.io/created-by": "kuberay-operator"},
                    "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc",
                        "uid": "uid-1", "controller": true, "blockOwnerDeletion": true}]
                },
                "spec": {
                    "podSelector": {"matchLabels": {"ray.io/cluster": "rc", "ray.io/node-type": "head"}},
                    "policyTypes": ["Ingress", "Egress"],
                    "ingress": [{"from": [own]}],
                    "egress": [{"to": [own]}, dns]
                }
            })
        );
        let worker = serde_json::to_value(&policies[2]).expect("json");
        assert_eq!(
            worker["spec"]["podSelector"],
            json!({"matchLabels": {"ray.io/cluster": "rc", "ray.io/node-type": "worker", "ray.io/group": "b"}})
        );
        assert_eq!(worker["metadata"]["labels"]["ray.io/group"], "b");
        assert_eq!(worker["spec"]["egress"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn modes_group_entries_and_the_rayjob_submitter() {
        let rc = cluster(
            json!({"mode": "DenyAllIngress",
                   "worker": {"ingressRules": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]},
                   "workerGroups": [{"groupName": "b", "ingressRules": []}]}),
            json!({
                "labels": {"ray.io/job-submission-mode": "K8sJobMode"},
                "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "job",
                    "uid": "u", "controller": true}]
            }),
        );
        let policies = network_policies(&rc).expect("builds");
        let spec = |i: usize| serde_json::to_value(&policies[i].spec).expect("json");
        assert_eq!(spec(0)["policyTypes"], json!(["Ingress"]));
        assert!(spec(0).get("egress").is_none());
        assert_eq!(
            spec(0)["ingress"][1],
            json!({"from": [{"podSelector": {"matchLabels": {
                        "ray.io/originated-from-cr-name": "job", "ray.io/originated-from-crd": "RayJob"}}}],
                   "ports": [{"protocol": "TCP", "port": 8265}]})
        );
        // Group a falls back to the `worker` rules; b's own (empty) entry replaces them.
        assert_eq!(spec(1)["ingress"].as_array().map(Vec::len), Some(2));
        assert_eq!(spec(2)["ingress"].as_array().map(Vec::len), Some(1));

        let egress_only = cluster(json!({"mode": "DenyAllEgress"}), json!({}));
        let policies = network_policies(&egress_only).expect("builds");
        let head = serde_json::to_value(&policies[0].spec).expect("json");
        assert_eq!(head["policyTypes"], json!(["Egress"]));
        assert!(head.get("ingress").is_none());
        let mut none = egress_only;
        none.spec.network_policy = None;
        assert!(network_policies(&none).expect("builds").is_empty());
    }
}
