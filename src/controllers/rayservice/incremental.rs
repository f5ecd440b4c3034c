//! The step logic of `NewClusterWithIncrementalUpgrade`, pure (KubeRay's state machine): how
//! far the HTTPRoute's weights move per interval, how Serve `target_capacity` moves by
//! `maxSurgePercent` on each cluster, when an upgrade or a rollback is complete, and when a
//! changed spec starts or cancels a rollback. The controller reads these from the status and
//! writes what they return; every transition has a unit test below.
//!
//! An upgrade alternates: the pending cluster's capacity grows by maxSurge (while the total is
//! at most 100), traffic follows it by stepSize per interval up to that capacity, then the
//! active cluster's capacity shrinks by maxSurge; complete when the active capacity is 0 and
//! the pending cluster has all traffic. A rollback runs the same steps the other way.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::rayservice::{
    ClusterUpgradeOptions, RayService, RayServiceClusterStatus, RayServiceUpgradeType,
};
use crate::validation::feature_gates::{FeatureGates, gates};

/// The options of an incremental upgrade, when the RayService asks for one and the gate is on.
pub fn options<'a>(
    service: &'a RayService,
    feature_gates: &FeatureGates,
) -> Option<&'a ClusterUpgradeOptions> {
    let strategy = service.spec.upgrade_strategy.as_ref()?;
    (strategy.type_ == Some(RayServiceUpgradeType::NewClusterWithIncrementalUpgrade)
        && feature_gates.enabled(gates::RAY_SERVICE_INCREMENTAL_UPGRADE))
    .then_some(strategy.cluster_upgrade_options.as_ref())
    .flatten()
}

/// The traffic and capacity of both clusters, as the status records them (KubeRay's defaults
/// for unset values: the active cluster has everything, the pending one nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub active_capacity: i32,
    pub pending_capacity: i32,
    pub active_traffic: i32,
    pub pending_traffic: i32,
}

impl Split {
    pub fn of(active: &RayServiceClusterStatus, pending: &RayServiceClusterStatus) -> Split {
        Split {
            active_capacity: active.target_capacity.unwrap_or(100),
            pending_capacity: pending.target_capacity.unwrap_or(0),
            active_traffic: active.traffic_routed_percent.unwrap_or(100),
            pending_traffic: pending.traffic_routed_percent.unwrap_or(0),
        }
    }
}

/// Whether `interval` has passed since `last` (never migrated: yes).
fn interval_passed(last: Option<&Time>, interval: Duration, now: &Time) -> bool {
    match last {
        None => true,
        Some(last) => now
            .0
            .duration_since(last.0)
            .try_into()
            .is_ok_and(|elapsed: Duration| elapsed >= interval),
    }
}

/// The route's next (active, pending) weights (KubeRay's `calculateTrafficRoutedPercent`):
/// once per interval (timed from the last change of the cluster traffic grows on), stepSize
/// more traffic goes to the pending cluster while it is ready, never beyond its capacity; in a
/// rollback back to the active cluster, ready or not. Nothing moves once the receiving
/// cluster's traffic equals its capacity.
pub fn next_weights(
    split: Split,
    options: &ClusterUpgradeOptions,
    rolling_back: bool,
    pending_ready: bool,
    last_migrated: Option<&Time>,
    now: &Time,
) -> (i32, i32) {
    let (active, pending) = (split.active_traffic, split.pending_traffic);
    let settled = if rolling_back {
        active == split.active_capacity
    } else {
        pending == split.pending_capacity
    };
    let interval = Duration::from_secs(u64::try_from(options.interval_seconds).unwrap_or(0));
    if settled || !interval_passed(last_migrated, interval, now) {
        return (active, pending);
    }
    let step = options.step_size_percent.max(0);
    if rolling_back {
        let active = active
            .saturating_add(step)
            .min(100)
            .min(split.active_capacity);
        (active, 100 - active)
    } else if pending_ready {
        let pending = pending
            .saturating_add(step)
            .min(100)
            .min(split.pending_capacity);
        (100 - pending, pending)
    } else {
        (active, pending)
    }
}

/// Which cluster a capacity change is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Active,
    Pending,
}

/// The `target_capacity` changes of one pass, in order (KubeRay's
/// `reconcileServeTargetCapacity`, pending cluster first, then the active one on the updated
/// values). Upgrade: wait until traffic reached the pending capacity; then shrink the active
/// cluster while the total exceeds 100, else grow the pending one. Rollback: wait until the
/// active traffic reached its capacity; then shrink the pending cluster while the total
/// exceeds 100, else grow the active one. Nothing once the goal is reached.
pub fn capacity_changes(split: Split, max_surge: i32, rolling_back: bool) -> Vec<(Role, i32)> {
    let mut split = split;
    let mut changes = Vec::new();
    for role in [Role::Pending, Role::Active] {
        let done = if rolling_back {
            split.active_capacity == 100 && split.pending_capacity == 0
        } else {
            split.active_capacity == 0 && split.pending_capacity == 100
        };
        if done {
            break;
        }
        let total = split.active_capacity.saturating_add(split.pending_capacity);
        let goal = if rolling_back {
            if split.active_capacity != split.active_traffic {
                continue;
            }
            match role {
                Role::Pending if total > 100 => Some((split.pending_capacity - max_surge).max(0)),
                Role::Active if total <= 100 => {
                    Some(split.active_capacity.saturating_add(max_surge).min(100))
                }
                _ => None,
            }
        } else {
            if split.pending_capacity != split.pending_traffic {
                continue;
            }
            match role {
                Role::Active if total > 100 => Some((split.active_capacity - max_surge).max(0)),
                Role::Pending if total <= 100 => {
                    Some(split.pending_capacity.saturating_add(max_surge).min(100))
                }
                _ => None,
            }
        };
        if let Some(goal) = goal {
            match role {
                Role::Active => split.active_capacity = goal,
                Role::Pending => split.pending_capacity = goal,
            }
            changes.push((role, goal));
        }
    }
    changes
}

/// The upgrade is complete (the pending cluster is promoted): the active cluster has no
/// capacity left and the pending one all traffic.
pub fn upgrade_complete(split: Split) -> bool {
    split.active_capacity == 0 && split.pending_traffic == 100
}

/// The rollback is complete (the pending cluster is dropped): the active cluster is back at
/// full capacity and traffic, and the pending one drained, or its head is not ready (then
/// nothing can drain it).
pub fn rollback_complete(split: Split, pending_head_ready: bool) -> bool {
    split.active_capacity == 100
        && split.active_traffic == 100
        && (!pending_head_ready || (split.pending_capacity == 0 && split.pending_traffic == 0))
}

/// What a changed goal spec means during an upgrade (KubeRay's `reconcileRollbackState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rollback {
    /// Start rolling back, with why.
    Start(&'static str),
    /// The goal is the pending cluster's spec again: the rollback is cancelled.
    Cancel,
    /// Nothing changes.
    Keep,
}

pub fn rollback_decision(goal: &str, active: &str, pending: &str, rolling_back: bool) -> Rollback {
    if goal == active {
        if rolling_back {
            Rollback::Keep
        } else {
            Rollback::Start(
                "the spec was reverted to the active cluster's; traffic moves back to it",
            )
        }
    } else if goal == pending {
        if rolling_back {
            Rollback::Cancel
        } else {
            Rollback::Keep
        }
    } else if rolling_back {
        Rollback::Keep
    } else {
        Rollback::Start(
            "the spec changed again during the upgrade; traffic moves back to the active cluster before a new cluster is prepared",
        )
    }
}

/// Capacity a new pending cluster starts with: all of it on first start, none during an
/// upgrade.
pub fn initial_capacity(has_active: bool) -> i32 {
    if has_active { 0 } else { 100 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(step: i32, interval: i32, surge: i32) -> ClusterUpgradeOptions {
        ClusterUpgradeOptions {
            max_surge_percent: Some(surge),
            step_size_percent: step,
            interval_seconds: interval,
            gateway_class_name: "istio".into(),
        }
    }

    fn split(ac: i32, pc: i32, at: i32, pt: i32) -> Split {
        Split {
            active_capacity: ac,
            pending_capacity: pc,
            active_traffic: at,
            pending_traffic: pt,
        }
    }

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + seconds).unwrap())
    }

    #[test]
    fn unset_status_fields_default_to_all_on_the_active_cluster() {
        let s = Split::of(&Default::default(), &Default::default());
        assert_eq!(s, split(100, 0, 100, 0));
    }

    #[test]
    fn weights_move_by_step_up_to_the_pending_capacity_once_per_interval() {
        let o = options(10, 30, 20);
        let now = at(100);
        // Never migrated: moves at once, capped by the capacity (20).
        assert_eq!(
            next_weights(split(100, 20, 100, 0), &o, false, true, None, &now),
            (90, 10)
        );
        assert_eq!(
            next_weights(split(100, 20, 90, 10), &o, false, true, Some(&at(70)), &now),
            (80, 20),
            "30 s passed"
        );
        assert_eq!(
            next_weights(split(100, 20, 90, 10), &o, false, true, Some(&at(80)), &now),
            (90, 10),
            "only 20 s passed"
        );
        // At capacity: nothing moves.
        assert_eq!(
            next_weights(split(100, 20, 80, 20), &o, false, true, None, &now),
            (80, 20)
        );
        // A step larger than the room left stops at the capacity.
        assert_eq!(
            next_weights(split(100, 15, 90, 10), &o, false, true, None, &now),
            (85, 15)
        );
    }

    #[test]
    fn weights_wait_for_a_ready_pending_cluster_but_not_in_a_rollback() {
        let o = options(10, 1, 100);
        let now = at(0);
        assert_eq!(
            next_weights(split(100, 100, 100, 0), &o, false, false, None, &now),
            (100, 0)
        );
        assert_eq!(
            next_weights(split(60, 40, 60, 40), &o, true, false, None, &now),
            (60, 40),
            "active at its capacity"
        );
        assert_eq!(
            next_weights(split(80, 40, 60, 40), &o, true, false, None, &now),
            (70, 30)
        );
        assert_eq!(
            next_weights(split(100, 0, 95, 5), &o, true, false, None, &now),
            (100, 0)
        );
    }

    #[test]
    fn capacity_waits_for_traffic_then_grows_pending_or_shrinks_active() {
        // Traffic has not reached the pending capacity yet.
        assert_eq!(capacity_changes(split(100, 10, 100, 0), 10, false), vec![]);
        // Total 100: the pending cluster grows.
        assert_eq!(
            capacity_changes(split(100, 0, 100, 0), 10, false),
            vec![(Role::Pending, 10)]
        );
        // Total above 100 and traffic caught up: the active cluster shrinks.
        assert_eq!(
            capacity_changes(split(100, 10, 90, 10), 10, false),
            vec![(Role::Active, 90)]
        );
        assert_eq!(
            capacity_changes(split(90, 10, 90, 10), 10, false),
            vec![(Role::Pending, 20)]
        );
        // Bounds.
        assert_eq!(
            capacity_changes(split(5, 95, 5, 95), 10, false),
            vec![(Role::Pending, 100)]
        );
        assert_eq!(
            capacity_changes(split(5, 100, 0, 100), 10, false),
            vec![(Role::Active, 0)]
        );
        // Done.
        assert_eq!(capacity_changes(split(0, 100, 0, 100), 10, false), vec![]);
    }

    #[test]
    fn rollback_capacity_shrinks_pending_then_grows_active_in_one_pass() {
        // Active traffic must reach its capacity first.
        assert_eq!(capacity_changes(split(60, 50, 50, 50), 10, true), vec![]);
        // Total 110: pending down to 40, then the total is 100 so the active grows too.
        assert_eq!(
            capacity_changes(split(60, 50, 60, 40), 10, true),
            vec![(Role::Pending, 40), (Role::Active, 70)]
        );
        assert_eq!(capacity_changes(split(100, 0, 100, 0), 10, true), vec![]);
        assert_eq!(
            capacity_changes(split(95, 0, 95, 5), 10, true),
            vec![(Role::Active, 100)]
        );
    }

    #[test]
    fn a_whole_upgrade_ends_complete_after_alternating_steps() {
        let o = options(25, 1, 50);
        let mut s = split(100, 0, 100, 0);
        let mut passes = 0;
        while !upgrade_complete(s) {
            passes += 1;
            assert!(passes < 50, "the upgrade must finish: {s:?}");
            for (role, goal) in capacity_changes(s, 50, false) {
                match role {
                    Role::Active => s.active_capacity = goal,
                    Role::Pending => s.pending_capacity = goal,
                }
            }
            let (a, p) = next_weights(s, &o, false, true, None, &at(0));
            s.active_traffic = a;
            s.pending_traffic = p;
            assert!(s.pending_traffic <= s.pending_capacity, "{s:?}");
            assert!(s.active_capacity + s.pending_capacity <= 150, "{s:?}");
        }
        assert_eq!(s, split(0, 100, 0, 100));
    }

    #[test]
    fn a_whole_rollback_ends_complete() {
        let o = options(10, 1, 20);
        let mut s = split(60, 60, 40, 60);
        let mut passes = 0;
        while !rollback_complete(s, true) {
            passes += 1;
            assert!(passes < 50, "the rollback must finish: {s:?}");
            for (role, goal) in capacity_changes(s, 20, true) {
                match role {
                    Role::Active => s.active_capacity = goal,
                    Role::Pending => s.pending_capacity = goal,
                }
            }
            let (a, p) = next_weights(s, &o, true, false, None, &at(0));
            s.active_traffic = a;
            s.pending_traffic = p;
        }
        assert_eq!(s, split(100, 0, 100, 0));
    }

    #[test]
    fn completion_rules() {
        assert!(upgrade_complete(split(0, 100, 0, 100)));
        assert!(!upgrade_complete(split(10, 100, 0, 100)));
        assert!(!upgrade_complete(split(0, 100, 10, 90)));
        assert!(rollback_complete(split(100, 0, 100, 0), true));
        assert!(!rollback_complete(split(100, 10, 100, 0), true));
        assert!(
            rollback_complete(split(100, 10, 100, 0), false),
            "an unready pending head cannot drain"
        );
        assert!(!rollback_complete(split(100, 10, 90, 10), false));
    }

    #[test]
    fn rollback_starts_on_a_reverted_or_third_spec_and_is_cancelled_by_the_pending_spec() {
        assert!(matches!(
            rollback_decision("a", "a", "p", false),
            Rollback::Start(_)
        ));
        assert_eq!(rollback_decision("a", "a", "p", true), Rollback::Keep);
        assert_eq!(rollback_decision("p", "a", "p", false), Rollback::Keep);
        assert_eq!(rollback_decision("p", "a", "p", true), Rollback::Cancel);
        assert!(matches!(
            rollback_decision("x", "a", "p", false),
            Rollback::Start(_)
        ));
        assert_eq!(rollback_decision("x", "a", "p", true), Rollback::Keep);
    }

    #[test]
    fn a_first_cluster_starts_at_full_capacity_and_an_upgrade_at_none() {
        assert_eq!(initial_capacity(false), 100);
        assert_eq!(initial_capacity(true), 0);
    }
}
