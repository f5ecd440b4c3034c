//! KubeRay's rules for a RayService (its cluster spec, upgrade strategy, annotations and Serve
//! config size); the upgrade-strategy and cluster checks also apply to a ServePipeline, whose
//! RayService would face them. KubeRay's RayService controller applies its webhook's rules, so
//! both judges read every problem here; the controller acts on [`RayServiceValues`].

use std::time::Duration;

use kube::ResourceExt;

use super::feature_gates::{FeatureGates, gates};
use super::k8s_names::check_name;
use super::problem::Problems;
use super::raycluster::{ClusterContext, raycluster_spec};
use super::validated::{RuleBook, Validated};
use crate::api::RayService;
use crate::api::raycluster::RayClusterSpec;
use crate::api::rayservice::{
    RayServiceUpgradeStrategy, RayServiceUpgradeType, SHARED_GATEWAY_ANNOTATION,
};
use crate::kuberay::keys::annotations::INITIALIZING_TIMEOUT as ANNOTATION_INITIALIZING_TIMEOUT;

/// Longest RayService name KubeRay accepts (it derives child names by appending suffixes).
pub const MAX_RAYSERVICE_NAME: usize = 47;
/// A Serve config larger than this cannot travel in one RayService: etcd refuses objects over
/// ~1.5 MiB, and the cluster spec and status need room too.
pub const MAX_SERVE_CONFIG_BYTES: usize = 1024 * 1024;
/// The Event and condition reason of a refused RayService (KubeRay's).
pub const INVALID_SPEC: &str = "InvalidRayServiceSpec";

pub(crate) fn upgrade_strategy(
    strategy: Option<&RayServiceUpgradeStrategy>,
    cluster: &RayClusterSpec,
    path: &str,
    feature_gates: &FeatureGates,
    problems: &mut Problems,
) {
    let Some(strategy) = strategy else { return };
    if strategy.type_ != Some(RayServiceUpgradeType::NewClusterWithIncrementalUpgrade) {
        return;
    }
    let up = format!("{path}.upgradeStrategy");
    if !feature_gates.enabled(gates::RAY_SERVICE_INCREMENTAL_UPGRADE) {
        problems.push(format!(
            "{up}.type NewClusterWithIncrementalUpgrade needs the {} feature gate",
            gates::RAY_SERVICE_INCREMENTAL_UPGRADE
        ));
    }
    if cluster.enable_in_tree_autoscaling != Some(true) {
        problems.push(format!(
            "{up}.type NewClusterWithIncrementalUpgrade needs enableInTreeAutoscaling on the cluster"
        ));
    }
    let Some(options) = &strategy.cluster_upgrade_options else {
        problems.push(format!(
            "{up}.clusterUpgradeOptions is required for NewClusterWithIncrementalUpgrade"
        ));
        return;
    };
    let op = format!("{up}.clusterUpgradeOptions");
    let surge = options.max_surge_percent.unwrap_or(100);
    if !(0..=100).contains(&surge) {
        problems.push(format!("{op}.maxSurgePercent must be between 0 and 100"));
    }
    if options.step_size_percent < 0 || options.step_size_percent > surge {
        problems.push(format!(
            "{op}.stepSizePercent must be between 0 and maxSurgePercent ({surge})"
        ));
    }
    if options.interval_seconds <= 0 {
        problems.push(format!("{op}.intervalSeconds must be positive"));
    }
    if options.gateway_class_name.is_empty() {
        problems.push(format!("{op}.gatewayClassName must not be empty"));
    }
}

/// The shared Gateway annotation names a Gateway: `name` or `namespace/name`.
fn shared_gateway(value: &str) -> Result<(), String> {
    let parts: Vec<&str> = value.trim().split('/').collect();
    let valid = |s: &str| super::k8s_names::is_dns1123_subdomain(s);
    match parts.as_slice() {
        [name] if valid(name) => Ok(()),
        [ns, name] if super::k8s_names::is_dns1123_label(ns) && valid(name) => Ok(()),
        _ => Err(format!(
            "{value:?} is not a Gateway reference; write `name` or `namespace/name`"
        )),
    }
}

pub(crate) fn no_k8s_token_auth(cluster: &RayClusterSpec, path: &str, problems: &mut Problems) {
    if cluster
        .auth_options
        .as_ref()
        .is_some_and(|a| a.enable_k8s_token_auth == Some(true))
    {
        problems.push(format!(
            "{path}.authOptions.enableK8sTokenAuth is not supported for RayService"
        ));
    }
}

pub(crate) fn no_head_service_name(cluster: &RayClusterSpec, path: &str, problems: &mut Problems) {
    if cluster
        .head_group_spec
        .head_service
        .as_ref()
        .and_then(|s| s.metadata.name.as_deref())
        .is_some_and(|n| !n.is_empty())
    {
        problems.push(format!(
            "{path}.headGroupSpec.headService.metadata.name must be empty; the RayService names its head Service"
        ));
    }
}

/// What the RayService book parses, for the controller to act on.
#[derive(Clone, Debug, PartialEq)]
pub struct RayServiceValues {
    /// `ray.io/initializing-timeout`, when set.
    pub initializing_timeout: Option<Duration>,
}

impl RuleBook for RayService {
    type Values = RayServiceValues;
    const SPEC_REASON: &'static str = INVALID_SPEC;

    fn check(&self, feature_gates: &FeatureGates) -> (Problems, Option<RayServiceValues>) {
        let (problems, values) = check(self, feature_gates);
        (problems.judged_as_webhook(), values)
    }
}

/// A RayService: every problem, or the parsed values.
pub fn validate(
    service: &RayService,
    feature_gates: &FeatureGates,
) -> Result<Validated<RayService>, Problems> {
    super::validated::validate(service, feature_gates)
}

fn check(
    service: &RayService,
    feature_gates: &FeatureGates,
) -> (Problems, Option<RayServiceValues>) {
    let mut problems = Problems::new(INVALID_SPEC, INVALID_SPEC);
    let spec = &service.spec;
    check_name(
        "RayService",
        &service.name_any(),
        MAX_RAYSERVICE_NAME,
        &mut problems,
    );
    let initializing_timeout = match service.annotations().get(ANNOTATION_INITIALIZING_TIMEOUT) {
        None => Some(None),
        Some(timeout) => match crate::validation::duration::parse_seconds_or_duration(timeout) {
            Ok(timeout) => Some(Some(timeout)),
            Err(e) => {
                problems.push(format!(
                    "metadata.annotations[{ANNOTATION_INITIALIZING_TIMEOUT}]: {e}; write a positive duration (like 30m) or number of seconds"
                ));
                None
            }
        },
    };
    if let Some(gateway) = service.annotations().get(SHARED_GATEWAY_ANNOTATION)
        && let Err(e) = shared_gateway(gateway)
    {
        problems.push(format!(
            "metadata.annotations[{SHARED_GATEWAY_ANNOTATION}]: {e}"
        ));
    }
    let cluster_path = "spec.rayClusterConfig";
    no_k8s_token_auth(&spec.ray_cluster_config, cluster_path, &mut problems);
    no_head_service_name(&spec.ray_cluster_config, cluster_path, &mut problems);
    raycluster_spec(
        &spec.ray_cluster_config,
        &ClusterContext {
            path: cluster_path,
            created_by: Some("RayService"),
            annotations: service.annotations(),
        },
        feature_gates,
        &mut problems,
    );
    if spec
        .ray_cluster_deletion_delay_seconds
        .is_some_and(|s| s < 0)
    {
        problems.push("spec.rayClusterDeletionDelaySeconds must not be negative".to_owned());
    }
    upgrade_strategy(
        spec.upgrade_strategy.as_ref(),
        &spec.ray_cluster_config,
        "spec",
        feature_gates,
        &mut problems,
    );
    if let Some(config) = &spec.serve_config_v2
        && config.len() > MAX_SERVE_CONFIG_BYTES
    {
        problems.push(format!(
            "spec.serveConfigV2 has {} bytes; at most {MAX_SERVE_CONFIG_BYTES} fit in one object (split the pipeline into several)",
            config.len()
        ));
    }
    let values = initializing_timeout.map(|initializing_timeout| RayServiceValues {
        initializing_timeout,
    });
    (problems, values)
}
