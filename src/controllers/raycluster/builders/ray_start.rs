//! The `ray start` command KubeRay generates: the effective start parameters of a group and
//! their rendering (sorted flags, each written as ` --flag ` or ` --flag=value `).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;

use crate::kuberay::keys::ports;
use crate::kuberay::names::NodeType;
use crate::kuberay::quantity::Amount;

/// Flags that take an explicit `true`/`false` value instead of being bare switches.
const EXPLICIT_BOOLEAN_FLAGS: [&str; 3] = ["log-color", "include-dashboard", "include-log-monitor"];

/// Kubernetes accelerator resources Ray knows under another name; the first one found in the
/// Ray container's limits is added to `--resources`.
const ACCELERATORS: [(&str, &str); 2] = [
    ("aws.amazon.com/neuroncore", "neuron_cores"),
    ("google.com/tpu", "TPU"),
];

/// The port workers use to reach the head's GCS: head `port` parameter, else 6379.
pub fn head_port(head_params: &BTreeMap<String, String>) -> String {
    head_params
        .get("port")
        .cloned()
        .unwrap_or_else(|| ports::GCS_SERVER.to_string())
}

/// Whether a Kubernetes resource name is a GPU: ends in `gpu`, or is an NVIDIA MIG slice
/// `nvidia.com/mig-<n>g.<m>gb`.
pub fn is_gpu_resource(name: &str) -> bool {
    if name.ends_with("gpu") {
        return true;
    }
    // KubeRay's match is anchored at the end only.
    const MIG: &str = "nvidia.com/mig-";
    name.find(MIG)
        .is_some_and(|i| is_mig_suffix(&name[i + MIG.len()..]))
}

/// `<digits>g.<digits>gb`.
fn is_mig_suffix(rest: &str) -> bool {
    let Some((slices, memory)) = rest.split_once("g.") else {
        return false;
    };
    let Some(memory) = memory.strip_suffix("gb") else {
        return false;
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    all_digits(slices) && all_digits(memory)
}

/// Applies a group's `resources` map: `cpu`, `memory` and GPUs become `num-cpus`, `memory` and
/// `num-gpus` (whole numbers, rounded up); everything else goes into `--resources` as JSON.
pub fn apply_group_resources(
    params: &mut BTreeMap<String, String>,
    resources: &BTreeMap<String, String>,
) {
    let mut custom = BTreeMap::new();
    for (name, value) in resources {
        // An unparsable quantity is skipped, as KubeRay does (validation does not catch it).
        let Some(amount) = Amount::parse(value) else {
            continue;
        };
        let lower = name.to_lowercase();
        if lower == "cpu" {
            params.insert("num-cpus".into(), amount.ceil_units().to_string());
        } else if lower == "memory" {
            params.insert("memory".into(), amount.ceil_units().to_string());
        } else if is_gpu_resource(&lower) {
            params.insert("num-gpus".into(), amount.ceil_units().to_string());
        } else {
            custom.insert(name.clone(), amount.as_f64());
        }
    }
    if !custom.is_empty() {
        params.insert("resources".into(), quoted_resources_json(&custom));
    }
}

/// Applies a group's Ray `labels` map as `--labels=k1=v1,k2=v2` (keys sorted).
pub fn apply_group_labels(
    params: &mut BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) {
    if labels.is_empty() {
        return;
    }
    let joined = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    params.insert("labels".into(), joined);
}

/// The parameters KubeRay always sets: the head address for workers, the dashboard host on the
/// head, the metrics and dashboard-agent ports, and `--block`.
pub fn set_missing_params(
    params: &mut BTreeMap<String, String>,
    node_type: NodeType,
    head_port: &str,
    head_fqdn: &str,
) {
    match node_type {
        NodeType::Worker => {
            params
                .entry("address".into())
                .or_insert_with(|| format!("{head_fqdn}:{head_port}"));
        }
        NodeType::Head => {
            params
                .entry("dashboard-host".into())
                .or_insert_with(|| "0.0.0.0".into());
        }
    }
    params
        .entry("metrics-export-port".into())
        .or_insert_with(|| ports::METRICS.to_string());
    params.insert("block".into(), "true".into());
    params
        .entry("dashboard-agent-listen-port".into())
        .or_insert_with(|| ports::DASHBOARD_AGENT.to_string());
}

/// Fills `num-cpus`, `memory`, `num-gpus` and accelerator `resources` from the Ray container's
/// resources where the parameters do not set them: CPU from the limit (else the request),
/// rounded up; memory from the limit only; GPUs and accelerators from limits.
pub fn apply_container_resources(
    params: &mut BTreeMap<String, String>,
    resources: Option<&ResourceRequirements>,
) {
    let limits = resources.and_then(|r| r.limits.as_ref());
    let requests = resources.and_then(|r| r.requests.as_ref());
    let amount = |list: Option<
        &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
                  key: &str| {
        list.and_then(|l| l.get(key))
            .and_then(Amount::of)
            .filter(|a| !a.is_zero())
    };
    if !params.contains_key("num-cpus")
        && let Some(cpu) = amount(limits, "cpu").or_else(|| amount(requests, "cpu"))
    {
        params.insert("num-cpus".into(), cpu.ceil_units().to_string());
    }
    if !params.contains_key("memory")
        && let Some(memory) = amount(limits, "memory")
    {
        params.insert("memory".into(), memory.ceil_units().to_string());
    }
    let Some(limits) = limits.filter(|l| !l.is_empty()) else {
        return;
    };
    // A `resources` parameter that is not JSON leaves the accelerators alone (KubeRay logs it).
    let Some(mut custom) = parse_resources_param(params.get("resources")) else {
        return;
    };
    let mut accelerator_present = ACCELERATORS
        .iter()
        .any(|(_, ray_name)| custom.contains_key(*ray_name));
    // BTreeMap: keys are visited sorted, so the first accelerator found is deterministic.
    for (name, quantity) in limits {
        let Some(value) = Amount::of(quantity).filter(|a| !a.is_zero()) else {
            continue;
        };
        if !params.contains_key("num-gpus") && is_gpu_resource(name) {
            params.insert("num-gpus".into(), value.ceil_units().to_string());
        }
        if !accelerator_present
            && let Some((_, ray_name)) = ACCELERATORS.iter().find(|(k8s, _)| k8s == name)
        {
            if !custom.contains_key(*ray_name) {
                custom.insert((*ray_name).to_owned(), value.as_f64());
                params.insert("resources".into(), quoted_resources_json(&custom));
            }
            accelerator_present = true;
        }
    }
}

/// The `resources` parameter as a map; absent means empty, `None` means it is not JSON.
fn parse_resources_param(value: Option<&String>) -> Option<BTreeMap<String, f64>> {
    let Some(value) = value else {
        return Some(BTreeMap::new());
    };
    let trimmed = value.trim_matches(|c| matches!(c, '\'' | '"' | '`' | ' '));
    serde_json::from_str(trimmed).ok()
}

/// `'{"name":1,"other":0.5}'`: sorted keys, numbers as Go prints them (no `.0`), single-quoted
/// for the shell.
fn quoted_resources_json(resources: &BTreeMap<String, f64>) -> String {
    let body = resources
        .iter()
        .map(|(k, v)| {
            let key = serde_json::to_string(k).unwrap_or_else(|_| format!("\"{k}\""));
            format!("{key}:{}", go_float(*v))
        })
        .collect::<Vec<_>>()
        .join(",");
    format!("'{{{body}}}'")
}

/// A float the way Go's encoding/json writes it for ordinary magnitudes: shortest digits, no
/// trailing `.0`.
fn go_float(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e21 {
        format!("{}", value as i128)
    } else {
        format!("{value}")
    }
}

/// The flags of a parameter map: sorted; `true`/`false` values make bare switches (present or
/// omitted) except for the flags that take an explicit boolean.
pub fn render_flags(params: &BTreeMap<String, String>) -> String {
    let mut flags = String::new();
    for (key, value) in params {
        let lower = value.to_lowercase();
        let is_bool = lower == "true" || lower == "false";
        if is_bool && !EXPLICIT_BOOLEAN_FLAGS.contains(&key.as_str()) {
            if lower == "true" {
                flags.push_str(&format!(" --{key} "));
            }
        } else {
            flags.push_str(&format!(" --{key}={value} "));
        }
    }
    flags
}

/// `ray start --head <flags>` or `ray start <flags>`.
pub fn ray_start_command(node_type: NodeType, params: &BTreeMap<String, String>) -> String {
    match node_type {
        NodeType::Head => format!("ray start --head {}", render_flags(params)),
        NodeType::Worker => format!("ray start {}", render_flags(params)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn resources(limits: &[(&str, &str)], requests: &[(&str, &str)]) -> ResourceRequirements {
        let list = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect(),
            )
        };
        ResourceRequirements {
            limits: list(limits),
            requests: list(requests),
            ..Default::default()
        }
    }

    #[test]
    fn head_command_of_the_kuberay_sample() {
        let mut params = BTreeMap::new();
        set_missing_params(&mut params, NodeType::Head, "6379", "");
        apply_container_resources(
            &mut params,
            Some(&resources(
                &[("cpu", "1"), ("memory", "5Gi")],
                &[("cpu", "1"), ("memory", "5Gi")],
            )),
        );
        assert_eq!(
            ray_start_command(NodeType::Head, &params),
            "ray start --head  --block  --dashboard-agent-listen-port=52365  --dashboard-host=0.0.0.0  --memory=5368709120  --metrics-export-port=8080  --num-cpus=1 "
        );
    }

    #[test]
    fn worker_command_has_the_head_address_first() {
        let mut params = BTreeMap::new();
        set_missing_params(
            &mut params,
            NodeType::Worker,
            "6379",
            "c-head-svc.ns.svc.cluster.local",
        );
        apply_container_resources(&mut params, Some(&resources(&[("cpu", "500m")], &[])));
        assert_eq!(
            ray_start_command(NodeType::Worker, &params),
            "ray start  --address=c-head-svc.ns.svc.cluster.local:6379  --block  --dashboard-agent-listen-port=52365  --metrics-export-port=8080  --num-cpus=1 "
        );
    }

    #[test]
    fn user_parameters_win_and_booleans_render_as_switches() {
        let mut params = map(&[
            ("num-cpus", "0"),
            ("dashboard-host", "127.0.0.1"),
            ("disable-usage-stats", "TRUE"),
            ("include-dashboard", "false"),
            ("log-color", "true"),
            ("object-store-memory", "100000000"),
            ("verbose", "false"),
            ("metrics-export-port", "9090"),
        ]);
        set_missing_params(&mut params, NodeType::Head, "6379", "");
        apply_container_resources(&mut params, Some(&resources(&[("cpu", "4")], &[])));
        let command = ray_start_command(NodeType::Head, &params);
        assert!(command.contains(" --num-cpus=0 "), "{command}");
        assert!(command.contains(" --dashboard-host=127.0.0.1 "));
        assert!(command.contains(" --disable-usage-stats "));
        assert!(command.contains(" --include-dashboard=false "));
        assert!(command.contains(" --log-color=true "));
        assert!(command.contains(" --metrics-export-port=9090 "));
        assert!(!command.contains("verbose"));
    }

    #[test]
    fn cpu_falls_back_to_the_request_but_memory_uses_only_the_limit() {
        let mut params = BTreeMap::new();
        apply_container_resources(
            &mut params,
            Some(&resources(&[], &[("cpu", "1500m"), ("memory", "2Gi")])),
        );
        assert_eq!(params.get("num-cpus").map(String::as_str), Some("2"));
        assert!(!params.contains_key("memory"));
    }

    #[test]
    fn gpus_and_accelerators_come_from_limits() {
        let mut params = BTreeMap::new();
        apply_container_resources(
            &mut params,
            Some(&resources(
                &[
                    ("nvidia.com/gpu", "2"),
                    ("google.com/tpu", "4"),
                    ("cpu", "8"),
                ],
                &[],
            )),
        );
        assert_eq!(params.get("num-gpus").map(String::as_str), Some("2"));
        assert_eq!(
            params.get("resources").map(String::as_str),
            Some("'{\"TPU\":4}'")
        );

        let mut with_user_tpu = map(&[("resources", "'{\"TPU\": 1, \"custom\": 2}'")]);
        apply_container_resources(
            &mut with_user_tpu,
            Some(&resources(&[("google.com/tpu", "4")], &[])),
        );
        assert_eq!(
            with_user_tpu.get("resources").map(String::as_str),
            Some("'{\"TPU\": 1, \"custom\": 2}'"),
            "a TPU count the user gave is kept verbatim"
        );
        assert!(is_gpu_resource("nvidia.com/mig-2g.32gb"));
        assert!(is_gpu_resource("amd.com/gpu"));
        assert!(!is_gpu_resource("nvidia.com/mig-2g.32"));
        assert!(!is_gpu_resource("memory"));
    }

    #[test]
    fn group_resources_override_and_custom_ones_become_quoted_json() {
        let mut params = map(&[("num-cpus", "8")]);
        apply_group_resources(
            &mut params,
            &map(&[
                ("CPU", "0"),
                ("memory", "1Gi"),
                ("GPU", "1"),
                ("batch_slot", "4"),
                ("half", "500m"),
            ]),
        );
        assert_eq!(params.get("num-cpus").map(String::as_str), Some("0"));
        assert_eq!(params.get("memory").map(String::as_str), Some("1073741824"));
        assert_eq!(params.get("num-gpus").map(String::as_str), Some("1"));
        assert_eq!(
            params.get("resources").map(String::as_str),
            Some("'{\"batch_slot\":4,\"half\":0.5}'")
        );
        let mut labels = BTreeMap::new();
        apply_group_labels(&mut labels, &map(&[("zone", "b"), ("accel", "a")]));
        assert_eq!(
            labels.get("labels").map(String::as_str),
            Some("accel=a,zone=b")
        );
        assert_eq!(
            render_flags(&map(&[("resources", "'{\"batch_slot\":4}'")])),
            " --resources='{\"batch_slot\":4}' "
        );
    }

    #[test]
    fn head_port_follows_the_port_parameter() {
        assert_eq!(head_port(&BTreeMap::new()), "6379");
        assert_eq!(head_port(&map(&[("port", "6380")])), "6380");
    }
}
