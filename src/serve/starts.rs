//! What a rollout starts (`raypipe dag diff`'s "starts" line, a canary's plan): the replicas,
//! and the GPUs they ask for, counted on the new version's rendered Serve config, so the node
//! overrides, the fused nodes and the executor count as Serve will see them.

use std::collections::BTreeSet;

use super::config::{Deployment, NumReplicas, ServeConfig};
use crate::graph::diff::{Change, GraphDiff, RolloutStarts, Starts};

/// Per strategy: a canary is a Serve application of its own, so it starts every replica of the
/// new version; an Immediate rollout starts those of the nodes that restart or are added, or
/// every replica when the application's args or runtime_env change (`restarts_all_replicas`).
pub fn rollout_starts(plan: &GraphDiff, rendered: &ServeConfig) -> RolloutStarts {
    let restarting: BTreeSet<&str> = plan
        .nodes
        .iter()
        .filter(|n| matches!(n.change, Change::Restarted | Change::Added))
        .map(|n| n.node.as_str())
        .collect();
    let mut starts = RolloutStarts::default();
    for deployment in rendered.applications.iter().flat_map(|a| &a.deployments) {
        let replicas = replicas_started(deployment);
        starts.canary.add(replicas);
        if plan.restarts_all_replicas || restarting.contains(deployment.name.as_str()) {
            starts.immediate.add(replicas);
        }
    }
    starts
}

/// The replicas Serve starts for a deployment: its count; with autoscaling `initial_replicas`,
/// else `min_replicas`, else Serve's 1; without either 1. And their GPUs.
pub(super) fn replicas_started(deployment: &Deployment) -> Starts {
    let replicas = match (&deployment.num_replicas, &deployment.autoscaling_config) {
        (Some(NumReplicas::Count(n)), _) => *n,
        (_, Some(a)) => a.initial_replicas.or(a.min_replicas).unwrap_or(1),
        _ => 1,
    };
    let gpus_each = deployment
        .ray_actor_options
        .as_ref()
        .and_then(|a| a.num_gpus)
        .filter(|g| g.is_finite() && *g > 0.0)
        .unwrap_or(0.0);
    Starts {
        replicas,
        gpus: gpus_each * f64::from(replicas),
    }
}
