//! Scale expectations: what the controller created or deleted and has not yet seen in its
//! Pod cache. A group with open expectations is left alone, so a slow cache never makes the
//! controller create or delete the same Pod twice.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;

use crate::api::raycluster::RayCluster;

/// A created Pod that never shows up (deleted at once by someone else) stops blocking after
/// this long.
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// The head or one worker group of a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    Head,
    Worker(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Create,
    Delete,
}

#[derive(Clone, Debug)]
struct Pending {
    pod: String,
    action: Action,
    recorded: Instant,
}

/// `namespace/name` of a RayCluster.
pub type ClusterKey = (String, String);

/// Open expectations of every cluster, by group.
#[derive(Debug, Default)]
pub struct ScaleExpectations {
    pending: Mutex<HashMap<ClusterKey, HashMap<Group, Vec<Pending>>>>,
}

impl ScaleExpectations {
    /// Records that `pod` was just created or deleted.
    pub fn record(
        &self,
        cluster: &ClusterKey,
        group: Group,
        pod: &str,
        action: Action,
        now: Instant,
    ) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending
            .entry(cluster.clone())
            .or_default()
            .entry(group)
            .or_default()
            .push(Pending {
                pod: pod.to_owned(),
                action,
                recorded: now,
            });
    }

    /// Whether the cache has caught up with every action on the group: created Pods are in it
    /// (or [`CREATE_TIMEOUT`] passed) and deleted Pods are gone from it. Met expectations are
    /// dropped.
    pub fn is_satisfied(
        &self,
        cluster: &ClusterKey,
        group: &Group,
        now: Instant,
        in_cache: impl Fn(&str) -> bool,
    ) -> bool {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let Some(groups) = pending.get_mut(cluster) else {
            return true;
        };
        let Some(items) = groups.get_mut(group) else {
            return true;
        };
        items.retain(|item| match item.action {
            Action::Create => {
                !in_cache(&item.pod) && now.duration_since(item.recorded) < CREATE_TIMEOUT
            }
            Action::Delete => in_cache(&item.pod),
        });
        let satisfied = items.is_empty();
        if satisfied {
            groups.remove(group);
            if groups.is_empty() {
                pending.remove(cluster);
            }
        }
        satisfied
    }

    /// Drops every expectation of a cluster (deleted, or all its Pods deleted at once).
    pub fn forget(&self, cluster: &ClusterKey) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(cluster);
    }

    /// Clusters with open expectations (for tests and metrics).
    pub fn clusters(&self) -> usize {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// The key a cluster's expectations are kept under.
pub(super) fn key_of(cluster: &RayCluster) -> ClusterKey {
    (cluster.namespace().unwrap_or_default(), cluster.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ClusterKey {
        ("ns".into(), "c".into())
    }

    #[test]
    fn creations_wait_for_the_cache_or_the_timeout() {
        let expectations = ScaleExpectations::default();
        let start = Instant::now();
        let group = Group::Worker("g".into());
        expectations.record(&key(), group.clone(), "p1", Action::Create, start);
        assert!(!expectations.is_satisfied(&key(), &group, start, |_| false));
        assert!(
            expectations.is_satisfied(&key(), &Group::Head, start, |_| false),
            "other groups are free"
        );
        assert!(expectations.is_satisfied(&key(), &group, start, |name| name == "p1"));
        assert_eq!(expectations.clusters(), 0, "met expectations are dropped");

        expectations.record(&key(), group.clone(), "p2", Action::Create, start);
        assert!(expectations.is_satisfied(&key(), &group, start + CREATE_TIMEOUT, |_| false));
    }

    #[test]
    fn deletions_wait_until_the_pod_is_gone() {
        let expectations = ScaleExpectations::default();
        let now = Instant::now();
        expectations.record(&key(), Group::Head, "h", Action::Delete, now);
        expectations.record(&key(), Group::Head, "h2", Action::Create, now);
        let later = now + Duration::from_secs(3600);
        assert!(
            !expectations.is_satisfied(&key(), &Group::Head, later, |_| true),
            "a terminating Pod blocks"
        );
        assert!(expectations.is_satisfied(&key(), &Group::Head, later, |name| name == "h2"));
    }

    #[test]
    fn forget_drops_a_cluster() {
        let expectations = ScaleExpectations::default();
        expectations.record(&key(), Group::Head, "h", Action::Delete, Instant::now());
        expectations.forget(&key());
        assert!(expectations.is_satisfied(&key(), &Group::Head, Instant::now(), |_| true));
    }
}
