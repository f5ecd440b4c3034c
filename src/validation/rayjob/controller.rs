//! What KubeRay's RayJob controller refuses to run (§6.2, RayJob part): KubeRay's first problem
//! in KubeRay's order and words. A refused RayJob gets a Warning Event and the
//! `ValidationFailed` deployment status, and is not requeued. The full admission rule set,
//! which collects every problem, is the parent module.

use kube::ResourceExt;

use super::reasons;
use crate::api::RayCluster;
use crate::api::rayjob::{DeletionPolicyType, JobDeploymentStatus, JobSubmissionMode, RayJob};
use crate::kuberay::keys::labels;
use crate::kuberay::spec::autoscaling_enabled;
use crate::validation::feature_gates::{FeatureGates, gates};
use crate::validation::k8s_names::first_name_problem;
use crate::validation::problem::Problem;
use crate::validation::raycluster::controller as cluster_validate;

/// KubeRay's limit: the RayJob name plus a 5-character suffix must stay a valid cluster name.
pub const MAX_NAME_LENGTH: usize = super::MAX_RAYJOB_NAME;

fn spec(message: impl Into<String>) -> Problem {
    Problem::new("spec", reasons::INVALID_SPEC, message)
}

/// `spec.submissionMode`, K8sJobMode when unset.
pub fn mode(job: &RayJob) -> JobSubmissionMode {
    job.spec
        .submission_mode
        .unwrap_or(JobSubmissionMode::K8sJobMode)
}

/// The cluster named by `clusterSelector` (`ray.io/cluster`), if the RayJob uses one.
pub fn selected_cluster(job: &RayJob) -> Option<&str> {
    job.spec
        .cluster_selector
        .as_ref()
        .and_then(|s| s.get(labels::CLUSTER))
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// `runtimeEnvYAML` as JSON (`None` when unset, empty or null).
pub fn runtime_env(job: &RayJob) -> Result<Option<serde_json::Value>, String> {
    match job.spec.runtime_env_yaml.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(yaml) => {
            let value: serde_json::Value = serde_yaml::from_str(yaml)
                .map_err(|e| format!("runtimeEnvYAML is not valid YAML: {e}"))?;
            Ok((!value.is_null()).then_some(value))
        }
    }
}

/// `entrypointResources` as a map of resource name to amount.
pub fn entrypoint_resources(
    job: &RayJob,
) -> Result<Option<std::collections::BTreeMap<String, f64>>, String> {
    match job.spec.entrypoint_resources.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(json) => serde_json::from_str(json)
            .map(Some)
            .map_err(|e| format!("entrypointResources is not a JSON object of numbers: {e}")),
    }
}

/// The first problem KubeRay would report, under `feature_gates`.
pub fn validate(job: &RayJob, feature_gates: &FeatureGates) -> Result<(), Problem> {
    validate_metadata(job)?;
    validate_spec(job, feature_gates)?;
    validate_status(job)
}

fn validate_metadata(job: &RayJob) -> Result<(), Problem> {
    match first_name_problem("RayJob", &job.name_any(), MAX_NAME_LENGTH, "") {
        Some(message) => Err(Problem::new(
            "metadata.name",
            reasons::INVALID_METADATA,
            message,
        )),
        None => Ok(()),
    }
}

fn validate_spec(job: &RayJob, feature_gates: &FeatureGates) -> Result<(), Problem> {
    let s = &job.spec;
    let shutdown = s.shutdown_after_job_finishes == Some(true);
    let mode = mode(job);
    if s.suspend == Some(true) && !shutdown {
        return Err(spec(
            "a RayJob with suspend=true must also set shutdownAfterJobFinishes=true",
        ));
    }
    let ttl = s.ttl_seconds_after_finished.unwrap_or(0);
    if ttl < 0 {
        return Err(spec("ttlSecondsAfterFinished must be >= 0"));
    }
    if ttl > 0 && !shutdown {
        return Err(spec(
            "ttlSecondsAfterFinished > 0 needs shutdownAfterJobFinishes=true",
        ));
    }
    if s.active_deadline_seconds.is_some_and(|d| d <= 0) {
        return Err(spec("activeDeadlineSeconds must be a positive integer"));
    }
    if s.pre_running_deadline_seconds.is_some_and(|d| d <= 0) {
        return Err(spec("preRunningDeadlineSeconds must be a positive integer"));
    }
    let backoff = s.backoff_limit.unwrap_or(0);
    if backoff < 0 {
        return Err(spec("backoffLimit must be >= 0"));
    }
    if s.cluster_selector.is_some() {
        if selected_cluster(job).is_none() {
            return Err(spec(
                "clusterSelector must name the cluster with a non-empty ray.io/cluster",
            ));
        }
        if s.suspend == Some(true) {
            return Err(spec("a RayJob with clusterSelector cannot be suspended"));
        }
        if mode == JobSubmissionMode::SidecarMode {
            return Err(spec("SidecarMode cannot be used with clusterSelector"));
        }
        if backoff > 0 {
            return Err(spec("backoffLimit must be 0 with clusterSelector"));
        }
    } else if s.ray_cluster_spec.is_none() {
        return Err(spec("one of rayClusterSpec or clusterSelector must be set"));
    }
    if mode == JobSubmissionMode::InteractiveMode && backoff > 0 {
        return Err(spec("backoffLimit must be 0 in InteractiveMode"));
    }
    if mode == JobSubmissionMode::SidecarMode {
        if s.submitter_pod_template.is_some() {
            return Err(spec("SidecarMode does not use submitterPodTemplate"));
        }
        if s.submitter_config.is_some() {
            return Err(spec("SidecarMode does not use submitterConfig"));
        }
        let head_restart = s
            .ray_cluster_spec
            .as_ref()
            .and_then(|c| c.head_group_spec.template.spec.as_ref())
            .and_then(|p| p.restart_policy.as_deref());
        if head_restart.is_some_and(|p| !p.is_empty() && p != "Never") {
            return Err(spec(
                "SidecarMode needs the head Pod's restartPolicy to be Never or unset",
            ));
        }
    }
    if mode != JobSubmissionMode::InteractiveMode
        && s.entrypoint.as_deref().is_none_or(|e| e.trim().is_empty())
    {
        return Err(spec("entrypoint must be set"));
    }
    runtime_env(job).map_err(spec)?;
    entrypoint_resources(job).map_err(spec)?;
    if let Some(cluster_spec) = &s.ray_cluster_spec {
        if cluster_spec
            .auth_options
            .as_ref()
            .is_some_and(|a| a.enable_k8s_token_auth == Some(true))
        {
            return Err(spec(
                "Kubernetes token authentication is not supported for RayJob",
            ));
        }
        // The cluster spec passes the RayCluster rules (checked on a stand-in name).
        let stand_in = RayCluster::new("rayjob-cluster", cluster_spec.clone());
        cluster_validate::validate(&stand_in, feature_gates).map_err(|i| spec(i.message))?;
    }
    validate_deletion_strategy(job, feature_gates.enabled(gates::RAY_JOB_DELETION_POLICY))
}

fn validate_deletion_strategy(job: &RayJob, gate: bool) -> Result<(), Problem> {
    let s = &job.spec;
    let Some(strategy) = &s.deletion_strategy else {
        return Ok(());
    };
    if !gate {
        return Err(spec(
            "deletionStrategy needs the RayJobDeletionPolicy feature gate",
        ));
    }
    let shutdown = s.shutdown_after_job_finishes == Some(true);
    let selector = s.cluster_selector.is_some();
    let autoscaling = s.ray_cluster_spec.as_ref().is_some_and(autoscaling_enabled);
    let check_policy = |policy: DeletionPolicyType| -> Result<(), Problem> {
        if selector
            && matches!(
                policy,
                DeletionPolicyType::DeleteCluster | DeletionPolicyType::DeleteWorkers
            )
        {
            return Err(spec(format!(
                "{policy:?} cannot be used with clusterSelector (the cluster is not the RayJob's)"
            )));
        }
        if autoscaling && policy == DeletionPolicyType::DeleteWorkers {
            return Err(spec("DeleteWorkers cannot be used with autoscaling"));
        }
        Ok(())
    };
    if let Some(rules) = &strategy.deletion_rules {
        if shutdown {
            return Err(spec(
                "deletionRules and shutdownAfterJobFinishes cannot be used together",
            ));
        }
        if strategy.on_success.is_some() || strategy.on_failure.is_some() {
            return Err(spec(
                "deletionRules and onSuccess/onFailure cannot be used together",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for rule in rules {
            let c = &rule.condition;
            if c.job_status.is_some() == c.job_deployment_status.is_some() {
                return Err(spec(
                    "each deletion rule needs exactly one of jobStatus and jobDeploymentStatus",
                ));
            }
            if c.ttl_seconds.is_some_and(|t| t < 0) {
                return Err(spec("deletion rule ttlSeconds must be >= 0"));
            }
            check_policy(rule.policy)?;
            let key = (
                format!("{:?}/{:?}", c.job_status, c.job_deployment_status),
                rule.policy,
            );
            if !seen.insert(key) {
                return Err(spec("duplicate deletion rule (condition, policy)"));
            }
        }
        // Per condition: DeleteWorkers <= DeleteCluster <= DeleteSelf in ttl.
        let order = |p: DeletionPolicyType| match p {
            DeletionPolicyType::DeleteWorkers => Some(0),
            DeletionPolicyType::DeleteCluster => Some(1),
            DeletionPolicyType::DeleteSelf => Some(2),
            DeletionPolicyType::DeleteNone => None,
        };
        for a in rules {
            for b in rules {
                let same = a.condition.job_status == b.condition.job_status
                    && a.condition.job_deployment_status == b.condition.job_deployment_status;
                if let (true, Some(oa), Some(ob)) = (same, order(a.policy), order(b.policy))
                    && oa < ob
                    && a.condition.ttl_seconds.unwrap_or(0) > b.condition.ttl_seconds.unwrap_or(0)
                {
                    return Err(spec(format!(
                        "deletion rule ttlSeconds must grow from DeleteWorkers to DeleteCluster to DeleteSelf; {:?} comes after {:?}",
                        a.policy, b.policy
                    )));
                }
            }
        }
    } else {
        let policies = [&strategy.on_success, &strategy.on_failure];
        for policy in policies {
            let Some(policy) = policy.as_ref().and_then(|p| p.policy) else {
                return Err(spec(
                    "a legacy deletionStrategy needs both onSuccess.policy and onFailure.policy",
                ));
            };
            check_policy(policy)?;
            if shutdown && policy == DeletionPolicyType::DeleteNone {
                return Err(spec(
                    "DeleteNone cannot be used with shutdownAfterJobFinishes=true",
                ));
            }
        }
    }
    Ok(())
}

fn validate_status(job: &RayJob) -> Result<(), Problem> {
    let status = job.status.as_ref().and_then(|s| s.job_deployment_status);
    if status == Some(JobDeploymentStatus::Waiting)
        && mode(job) != JobSubmissionMode::InteractiveMode
    {
        return Err(Problem::new(
            "status.jobDeploymentStatus",
            reasons::INVALID_STATUS,
            "the Waiting deployment status is only valid in InteractiveMode",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A small valid RayJob with `extra` merged in (objects merge, anything else replaces).
    fn job(extra: Value) -> RayJob {
        crate::api::test_support::rayjob(extra)
    }

    #[test]
    fn accepts_a_plain_job_and_refuses_kuberays_mistakes() {
        assert_eq!(validate(&job(json!({})), &FeatureGates::default()), Ok(()));
        let cases = [
            (
                json!({"spec": {"suspend": true}}),
                "shutdownAfterJobFinishes",
            ),
            (
                json!({"spec": {"ttlSecondsAfterFinished": 5}}),
                "shutdownAfterJobFinishes",
            ),
            (
                json!({"spec": {"runtimeEnvYAML": "a: [b"}}),
                "runtimeEnvYAML",
            ),
            (
                json!({"spec": {"activeDeadlineSeconds": 0}}),
                "activeDeadlineSeconds",
            ),
            (
                json!({"spec": {"clusterSelector": {"ray.io/cluster": "c"}, "backoffLimit": 1}}),
                "backoffLimit",
            ),
            (
                json!({"spec": {"submissionMode": "InteractiveMode", "backoffLimit": 1}}),
                "InteractiveMode",
            ),
            (json!({"spec": {"rayClusterSpec": null}}), "rayClusterSpec"),
            (
                json!({"spec": {"deletionStrategy": {"onSuccess": {"policy": "DeleteCluster"}}}}),
                "both",
            ),
            (
                json!({"spec": {"shutdownAfterJobFinishes": true, "deletionStrategy": {"deletionRules": [
                {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED"}}]}}}),
                "together",
            ),
            (
                json!({"spec": {"deletionStrategy": {"deletionRules": [
                {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 10}},
                {"policy": "DeleteWorkers", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 20}}]}}}),
                "grow",
            ),
        ];
        for (patch, needle) in cases {
            let invalid = validate(&job(patch.clone()), &FeatureGates::default())
                .expect_err(&patch.to_string());
            assert_eq!(invalid.reason, reasons::INVALID_SPEC, "{patch}");
            assert!(
                invalid.message.contains(needle),
                "{patch}: {}",
                invalid.message
            );
        }
        let long = job(json!({"metadata": {"name": "a".repeat(48)}}));
        assert_eq!(
            validate(&long, &FeatureGates::default()).map_err(|i| i.reason),
            Err(reasons::INVALID_METADATA)
        );
        let waiting = job(json!({"status": {"jobDeploymentStatus": "Waiting"}}));
        assert_eq!(
            validate(&waiting, &FeatureGates::default()).map_err(|i| i.reason),
            Err(reasons::INVALID_STATUS)
        );
        let gated = job(json!({"spec": {"deletionStrategy": {"deletionRules": [
            {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED"}}]}}}));
        assert_eq!(validate(&gated, &FeatureGates::default()), Ok(()));
        assert!(
            validate(
                &gated,
                &FeatureGates::default().with(gates::RAY_JOB_DELETION_POLICY, false)
            )
            .is_err()
        );
    }
}
