//! KubeRay's rules for a RayJob (and the job template of a RayCronJob): collects every
//! problem. The RayJob controller's own pre-reconcile check, which reports KubeRay's first
//! problem in KubeRay's words, is [`controller`].

pub mod controller;

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;

use super::feature_gates::{FeatureGates, gates};
use super::k8s_names::check_name;
use super::pod::restart_policy_never_or_unset;
use super::problem::{Problem, Problems};
use super::raycluster::{ClusterContext, raycluster_spec};
use crate::api::RayJob;
use crate::api::rayjob::{DeletionPolicyType, JobSubmissionMode, RayJobSpec};
use crate::kuberay::keys::labels::CLUSTER as LABEL_CLUSTER;

/// Longest RayJob name KubeRay accepts: the name plus a 5-character suffix must stay a valid
/// cluster name.
pub const MAX_RAYJOB_NAME: usize = 47;

/// KubeRay's Event reasons for a refused RayJob.
pub mod reasons {
    pub const INVALID_SPEC: &str = "InvalidRayJobSpec";
    pub const INVALID_METADATA: &str = "InvalidRayJobMetadata";
    pub const INVALID_STATUS: &str = "InvalidRayJobStatus";
}

/// KubeRay's rules for a RayJob spec (`path` is `spec`, or `spec.jobTemplate` in a RayCronJob).
pub fn rayjob_spec(
    spec: &RayJobSpec,
    path: &str,
    annotations: &BTreeMap<String, String>,
    feature_gates: &FeatureGates,
    problems: &mut Problems,
) {
    let p = path;
    let shutdown = spec.shutdown_after_job_finishes.unwrap_or(false);
    let selector = spec.cluster_selector.as_ref().filter(|s| !s.is_empty());
    let mode = spec
        .submission_mode
        .unwrap_or(JobSubmissionMode::K8sJobMode);
    let cluster_spec = spec.ray_cluster_spec.as_ref();
    let autoscaling = cluster_spec.is_some_and(|c| c.enable_in_tree_autoscaling == Some(true));

    if spec.suspend == Some(true) && !shutdown {
        problems.push(format!(
            "{p}.suspend needs shutdownAfterJobFinishes: true (a suspended job's cluster is deleted)"
        ));
    }
    if let Some(ttl) = spec.ttl_seconds_after_finished {
        if ttl < 0 {
            problems.push(format!("{p}.ttlSecondsAfterFinished must not be negative"));
        } else if ttl > 0 && !shutdown {
            problems.push(format!(
                "{p}.ttlSecondsAfterFinished needs shutdownAfterJobFinishes: true"
            ));
        }
    }
    if cluster_spec.is_none() && selector.is_none() {
        problems.push(format!(
            "{p}: set rayClusterSpec (a new cluster) or clusterSelector (an existing one)"
        ));
    }
    if let Some(selector) = selector {
        if spec.suspend == Some(true) {
            problems.push(format!(
                "{p}.suspend cannot be used with clusterSelector (the cluster is not the job's)"
            ));
        }
        if selector.get(LABEL_CLUSTER).is_none_or(|v| v.is_empty()) {
            problems.push(format!(
                "{p}.clusterSelector needs a non-empty {LABEL_CLUSTER} entry"
            ));
        }
        if mode == JobSubmissionMode::SidecarMode {
            problems.push(format!(
                "{p}.clusterSelector cannot be used with submissionMode SidecarMode"
            ));
        }
        if spec.backoff_limit.is_some_and(|b| b != 0) {
            problems.push(format!(
                "{p}.backoffLimit must be 0 or unset with clusterSelector (retries need a new cluster)"
            ));
        }
    }
    if mode == JobSubmissionMode::InteractiveMode && spec.backoff_limit.is_some_and(|b| b != 0) {
        problems.push(format!(
            "{p}.backoffLimit must be 0 or unset in InteractiveMode"
        ));
    }
    if mode == JobSubmissionMode::SidecarMode {
        if spec.submitter_pod_template.is_some() {
            problems.push(format!(
                "{p}.submitterPodTemplate cannot be used in SidecarMode"
            ));
        }
        if spec.submitter_config.is_some() {
            problems.push(format!("{p}.submitterConfig cannot be used in SidecarMode"));
        }
        if cluster_spec.is_some_and(|c| !restart_policy_never_or_unset(&c.head_group_spec.template))
        {
            problems.push(format!(
                "{p}.rayClusterSpec.headGroupSpec.template.spec.restartPolicy must be Never or unset in SidecarMode"
            ));
        }
    }
    if cluster_spec
        .and_then(|c| c.auth_options.as_ref())
        .is_some_and(|a| a.enable_k8s_token_auth == Some(true))
    {
        problems.push(format!(
            "{p}.rayClusterSpec.authOptions.enableK8sTokenAuth is not supported for RayJob"
        ));
    }
    if let Some(yaml) = &spec.runtime_env_yaml
        && let Err(e) = serde_yaml::from_str::<serde_yaml::Value>(yaml)
    {
        problems.push(format!("{p}.runtimeEnvYAML is not valid YAML: {e}"));
    }
    if spec.active_deadline_seconds.is_some_and(|s| s <= 0) {
        problems.push(format!("{p}.activeDeadlineSeconds must be positive"));
    }
    if spec.pre_running_deadline_seconds.is_some_and(|s| s <= 0) {
        problems.push(format!("{p}.preRunningDeadlineSeconds must be positive"));
    }
    if spec.backoff_limit.is_some_and(|b| b < 0) {
        problems.push(format!("{p}.backoffLimit must not be negative"));
    }
    if let Some(strategy) = &spec.deletion_strategy {
        let dp = format!("{p}.deletionStrategy");
        if !feature_gates.enabled(gates::RAY_JOB_DELETION_POLICY) {
            problems.push(format!(
                "{dp} needs the {} feature gate",
                gates::RAY_JOB_DELETION_POLICY
            ));
        }
        let destructive_with_selector = |policy: DeletionPolicyType| {
            selector.is_some()
                && matches!(
                    policy,
                    DeletionPolicyType::DeleteCluster | DeletionPolicyType::DeleteWorkers
                )
        };
        if let Some(rules) = &strategy.deletion_rules {
            if shutdown {
                problems.push(format!(
                    "{dp}.deletionRules cannot be used with shutdownAfterJobFinishes; the rules decide what is deleted"
                ));
            }
            let mut pairs = BTreeSet::new();
            // Per condition: the delay of each policy, to check their order.
            let mut delays: BTreeMap<String, BTreeMap<DeletionPolicyType, i32>> = BTreeMap::new();
            for (i, rule) in rules.iter().enumerate() {
                let rp = format!("{dp}.deletionRules[{i}]");
                let ttl = rule.condition.ttl_seconds.unwrap_or(0);
                if ttl < 0 {
                    problems.push(format!("{rp}.condition.ttlSeconds must not be negative"));
                }
                if destructive_with_selector(rule.policy) {
                    problems.push(format!(
                        "{rp}.policy {:?} cannot be used with clusterSelector (the cluster is not the job's)",
                        rule.policy
                    ));
                }
                if rule.policy == DeletionPolicyType::DeleteWorkers && autoscaling {
                    problems.push(format!(
                        "{rp}.policy DeleteWorkers cannot be used with autoscaling (the autoscaler would bring them back)"
                    ));
                }
                let condition = format!(
                    "{:?}/{:?}",
                    rule.condition.job_status, rule.condition.job_deployment_status
                );
                if !pairs.insert((condition.clone(), rule.policy)) {
                    problems.push(format!(
                        "{rp}: another rule already has policy {:?} for the same condition",
                        rule.policy
                    ));
                }
                delays
                    .entry(condition)
                    .or_default()
                    .insert(rule.policy, ttl);
            }
            for by_policy in delays.values() {
                let ordered = [
                    DeletionPolicyType::DeleteWorkers,
                    DeletionPolicyType::DeleteCluster,
                    DeletionPolicyType::DeleteSelf,
                ];
                let present: Vec<(DeletionPolicyType, i32)> = ordered
                    .iter()
                    .filter_map(|policy| by_policy.get(policy).map(|ttl| (*policy, *ttl)))
                    .collect();
                for pair in present.windows(2) {
                    if pair[0].1 > pair[1].1 {
                        problems.push(format!(
                            "{dp}.deletionRules: {:?} (after {}s) must not come later than {:?} (after {}s) for the same condition",
                            pair[0].0, pair[0].1, pair[1].0, pair[1].1
                        ));
                    }
                }
            }
        } else {
            for (field, policy) in [
                ("onSuccess", &strategy.on_success),
                ("onFailure", &strategy.on_failure),
            ] {
                match policy.as_ref().and_then(|p| p.policy) {
                    None => problems.push(format!("{dp}.{field}.policy is required")),
                    Some(policy) => {
                        if destructive_with_selector(policy) {
                            problems.push(format!(
                                "{dp}.{field}.policy {policy:?} cannot be used with clusterSelector"
                            ));
                        }
                        if policy == DeletionPolicyType::DeleteWorkers && autoscaling {
                            problems.push(format!(
                                "{dp}.{field}.policy DeleteWorkers cannot be used with autoscaling"
                            ));
                        }
                        if policy == DeletionPolicyType::DeleteNone && shutdown {
                            problems.push(format!(
                                "{dp}.{field}.policy DeleteNone contradicts shutdownAfterJobFinishes: true"
                            ));
                        }
                    }
                }
            }
        }
    }
    if let Some(cluster) = cluster_spec {
        raycluster_spec(
            cluster,
            &ClusterContext {
                path: &format!("{p}.rayClusterSpec"),
                created_by: Some("RayJob"),
                annotations,
            },
            feature_gates,
            problems,
        );
    }
}

pub fn validate(job: &RayJob, feature_gates: &FeatureGates) -> Vec<Problem> {
    let mut problems = Problems::new(reasons::INVALID_SPEC, reasons::INVALID_METADATA);
    check_name("RayJob", &job.name_any(), MAX_RAYJOB_NAME, &mut problems);
    rayjob_spec(
        &job.spec,
        "spec",
        job.annotations(),
        feature_gates,
        &mut problems,
    );
    problems.into_vec()
}
