//! The status of a RayService: its conditions (pure): `Ready` and `UpgradeInProgress` with
//! KubeRay's reasons, messages that say what is being waited for, and the initializing
//! timeout; the per-cluster part; and `differs`, which the status stage writes by.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::conditions::{self, FALSE, TRUE, UNKNOWN};
use kube::ResourceExt;

use super::observed::ServeObservation;
use crate::api::raycluster::RayCluster;
use crate::api::rayservice::{
    RayServiceClusterStatus, RayServiceStatus, ServiceStatus, condition_reasons, condition_types,
};

/// What the conditions are computed from.
pub struct ConditionInputs<'a> {
    pub generation: Option<i64>,
    pub num_serve_endpoints: i32,
    pub active_cluster: Option<&'a str>,
    pub pending_cluster: Option<&'a str>,
    /// Why the RayService does not serve yet (or why the pending cluster is not taking over).
    pub waiting_for: Option<String>,
    /// `ray.io/initializing-timeout`.
    pub initializing_timeout: Option<Duration>,
    pub now: Time,
}

/// Sets `Ready`, `UpgradeInProgress` and `serviceStatus` on `status`. Returns true when the
/// initializing timeout has just expired (terminal: the caller deletes the clusters).
pub fn set_conditions(status: &mut RayServiceStatus, inputs: &ConditionInputs) -> bool {
    if conditions::find(&status.conditions, condition_types::READY).is_none() {
        for type_ in [condition_types::READY, condition_types::UPGRADE_IN_PROGRESS] {
            conditions::set_condition(
                &mut status.conditions,
                stamped(
                    inputs,
                    type_,
                    FALSE,
                    condition_reasons::INITIALIZING,
                    "the RayService is being initialized".to_owned(),
                ),
            );
        }
    }
    let previous_ready = conditions::find(&status.conditions, condition_types::READY).cloned();
    let (ready, timed_out) = ready_condition(previous_ready.as_ref(), inputs);
    let ready_true = ready.status == TRUE;
    let ready_reason = ready.reason.clone();
    conditions::set_condition(&mut status.conditions, ready);

    let upgrade = upgrade_condition(inputs, &ready_reason);
    conditions::set_condition(&mut status.conditions, upgrade);
    status.service_status = ready_true.then_some(ServiceStatus::Running);
    status.observed_generation = inputs.generation;
    timed_out
}

/// A condition stamped with this pass's generation and time.
fn stamped(
    inputs: &ConditionInputs,
    type_: &str,
    value: &str,
    reason: &str,
    message: String,
) -> Condition {
    conditions::condition(
        type_,
        value,
        reason,
        message,
        inputs.generation,
        inputs.now.clone(),
    )
}

/// The new `Ready` condition, and whether the initializing timeout has just expired.
fn ready_condition(previous: Option<&Condition>, inputs: &ConditionInputs) -> (Condition, bool) {
    if inputs.num_serve_endpoints > 0 {
        let ready = stamped(
            inputs,
            condition_types::READY,
            TRUE,
            condition_reasons::NON_ZERO_SERVE_ENDPOINTS,
            format!(
                "{} Pod(s) serve through the serve Service",
                inputs.num_serve_endpoints
            ),
        );
        return (ready, false);
    }
    let waiting = inputs
        .waiting_for
        .clone()
        .unwrap_or_else(|| "no Pod serves through the serve Service yet".to_owned());
    match previous {
        Some(c) if c.status == TRUE || c.reason == condition_reasons::ZERO_SERVE_ENDPOINTS => {
            let lost = stamped(
                inputs,
                condition_types::READY,
                FALSE,
                condition_reasons::ZERO_SERVE_ENDPOINTS,
                format!("no Pod serves through the serve Service: {waiting}"),
            );
            (lost, false)
        }
        Some(c) if c.reason == condition_reasons::INITIALIZING_TIMEOUT => (c.clone(), false),
        previous if initializing_expired(previous, inputs) => {
            let expired = stamped(
                inputs,
                condition_types::READY,
                FALSE,
                condition_reasons::INITIALIZING_TIMEOUT,
                format!(
                    "not ready within the initializing timeout ({}s); the clusters are deleted and the RayService stays failed (recreate it to retry). Last known: {waiting}",
                    inputs.initializing_timeout.unwrap_or_default().as_secs()
                ),
            );
            (expired, true)
        }
        _ => {
            let initializing = stamped(
                inputs,
                condition_types::READY,
                FALSE,
                condition_reasons::INITIALIZING,
                waiting,
            );
            (initializing, false)
        }
    }
}

/// Whether the RayService has been initializing for longer than its initializing timeout.
fn initializing_expired(previous: Option<&Condition>, inputs: &ConditionInputs) -> bool {
    match (previous, inputs.initializing_timeout) {
        (Some(c), Some(limit)) if c.reason == condition_reasons::INITIALIZING => {
            let since = c.last_transition_time.0;
            inputs
                .now
                .0
                .duration_since(since)
                .try_into()
                .is_ok_and(|elapsed: Duration| elapsed >= limit)
        }
        _ => false,
    }
}

/// The new `UpgradeInProgress` condition; `ready_reason` is the new `Ready` condition's.
fn upgrade_condition(inputs: &ConditionInputs, ready_reason: &str) -> Condition {
    match (inputs.active_cluster, inputs.pending_cluster) {
        (Some(active), Some(pending)) => stamped(
            inputs,
            condition_types::UPGRADE_IN_PROGRESS,
            TRUE,
            condition_reasons::BOTH_ACTIVE_PENDING_CLUSTERS_EXIST,
            match &inputs.waiting_for {
                Some(why) => format!(
                    "RayCluster {active} serves while {pending} is prepared; waiting: {why}"
                ),
                None => format!("RayCluster {active} serves while {pending} is prepared"),
            },
        ),
        (Some(active), None) => stamped(
            inputs,
            condition_types::UPGRADE_IN_PROGRESS,
            FALSE,
            condition_reasons::NO_PENDING_CLUSTER,
            format!("RayCluster {active} serves; no upgrade is running"),
        ),
        _ if ready_reason == condition_reasons::INITIALIZING
            || ready_reason == condition_reasons::INITIALIZING_TIMEOUT =>
        {
            stamped(
                inputs,
                condition_types::UPGRADE_IN_PROGRESS,
                FALSE,
                ready_reason,
                "the RayService is being initialized".to_owned(),
            )
        }
        _ => stamped(
            inputs,
            condition_types::UPGRADE_IN_PROGRESS,
            UNKNOWN,
            condition_reasons::NO_ACTIVE_CLUSTER,
            "no RayCluster is active".to_owned(),
        ),
    }
}

/// Sets a condition of the suspend state machine (and stamps the generation).
pub fn set(
    status: &mut RayServiceStatus,
    type_: &str,
    value: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Time,
) {
    conditions::set_condition(
        &mut status.conditions,
        conditions::condition(type_, value, reason, message, generation, now),
    );
}

/// True when condition `type_` is True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions::find(conditions, type_).is_some_and(|c| c.status == TRUE)
}

/// The reason of condition `type_`.
pub fn reason<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a str> {
    conditions::find(conditions, type_).map(|c| c.reason.as_str())
}

/// Whether two statuses differ in anything but `lastUpdateTime`.
pub fn differs(old: Option<&RayServiceStatus>, new: &RayServiceStatus) -> bool {
    match old {
        None => true,
        Some(old) => {
            let mut old = old.clone();
            old.last_update_time = new.last_update_time.clone();
            &old != new
        }
    }
}

pub(super) fn fill_cluster_status(
    out: &mut RayServiceClusterStatus,
    cluster: Option<&RayCluster>,
    obs: Option<&ServeObservation>,
) {
    match cluster {
        Some(cluster) => {
            out.ray_cluster_name = Some(cluster.name_any());
            out.ray_cluster_status = cluster.status.clone();
        }
        None => {
            out.ray_cluster_status = None;
            out.application_statuses = None;
        }
    }
    if let Some(apps) = obs.and_then(|o| o.apps.clone()) {
        out.application_statuses = (!apps.is_empty()).then_some(apps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn inputs(now: i64) -> ConditionInputs<'static> {
        ConditionInputs {
            generation: Some(1),
            num_serve_endpoints: 0,
            active_cluster: None,
            pending_cluster: None,
            waiting_for: Some("head Pod not ready".into()),
            initializing_timeout: None,
            now: at(now),
        }
    }

    fn get<'a>(status: &'a RayServiceStatus, type_: &str) -> &'a Condition {
        conditions::find(&status.conditions, type_).unwrap()
    }

    #[test]
    fn initializing_expires_only_past_the_limit_and_only_while_initializing() {
        let mut i = inputs(160);
        let started = |reason: &str| {
            conditions::condition(condition_types::READY, FALSE, reason, "", Some(1), at(100))
        };
        let initializing = started(condition_reasons::INITIALIZING);
        assert!(
            !initializing_expired(Some(&initializing), &i),
            "no limit set"
        );
        i.initializing_timeout = Some(Duration::from_secs(60));
        assert!(initializing_expired(Some(&initializing), &i));
        i.initializing_timeout = Some(Duration::from_secs(61));
        assert!(!initializing_expired(Some(&initializing), &i));
        i.initializing_timeout = Some(Duration::from_secs(1));
        let zero = started(condition_reasons::ZERO_SERVE_ENDPOINTS);
        assert!(!initializing_expired(Some(&zero), &i));
        assert!(!initializing_expired(None, &i));
    }

    #[test]
    fn a_new_service_is_initializing_and_says_what_it_waits_for() {
        let mut status = RayServiceStatus::default();
        assert!(!set_conditions(&mut status, &inputs(100)));
        let ready = get(&status, condition_types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            (FALSE, "Initializing")
        );
        assert_eq!(ready.message, "head Pod not ready");
        let upgrade = get(&status, condition_types::UPGRADE_IN_PROGRESS);
        assert_eq!(upgrade.reason, "Initializing");
        assert_eq!(status.service_status, None);
    }

    #[test]
    fn endpoints_make_it_ready_and_losing_them_is_zero_serve_endpoints() {
        let mut status = RayServiceStatus::default();
        let mut i = inputs(100);
        i.num_serve_endpoints = 2;
        i.active_cluster = Some("svc-abcde");
        set_conditions(&mut status, &i);
        let ready = get(&status, condition_types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            (TRUE, "NonZeroServeEndpoints")
        );
        assert_eq!(status.service_status, Some(ServiceStatus::Running));
        assert_eq!(
            get(&status, condition_types::UPGRADE_IN_PROGRESS).reason,
            "NoPendingCluster"
        );
        i.num_serve_endpoints = 0;
        set_conditions(&mut status, &i);
        let ready = get(&status, condition_types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            (FALSE, "ZeroServeEndpoints")
        );
        assert_eq!(status.service_status, None);
    }

    #[test]
    fn both_clusters_mean_an_upgrade_and_the_message_names_the_blocker() {
        let mut status = RayServiceStatus::default();
        let mut i = inputs(100);
        i.num_serve_endpoints = 1;
        i.active_cluster = Some("svc-a");
        i.pending_cluster = Some("svc-b");
        i.waiting_for = Some("application app is DEPLOYING".into());
        set_conditions(&mut status, &i);
        let upgrade = get(&status, condition_types::UPGRADE_IN_PROGRESS);
        assert_eq!(upgrade.status, TRUE);
        assert_eq!(upgrade.reason, "BothActivePendingClustersExist");
        assert!(upgrade.message.contains("DEPLOYING"), "{}", upgrade.message);
    }

    #[test]
    fn the_initializing_timeout_expires_once_and_stays() {
        let mut status = RayServiceStatus::default();
        let mut i = inputs(100);
        i.initializing_timeout = Some(Duration::from_secs(30));
        assert!(!set_conditions(&mut status, &i));
        i.now = at(129);
        assert!(!set_conditions(&mut status, &i));
        i.now = at(130);
        assert!(set_conditions(&mut status, &i));
        assert_eq!(
            get(&status, condition_types::READY).reason,
            "InitializingTimeout"
        );
        // Terminal: later passes keep it and do not report a fresh expiry.
        i.now = at(500);
        assert!(!set_conditions(&mut status, &i));
        assert_eq!(
            get(&status, condition_types::READY).reason,
            "InitializingTimeout"
        );
        assert_eq!(
            get(&status, condition_types::UPGRADE_IN_PROGRESS).reason,
            "InitializingTimeout"
        );
    }

    #[test]
    fn a_status_differing_only_in_update_time_is_not_written() {
        let mut a = RayServiceStatus::default();
        set_conditions(&mut a, &inputs(100));
        let mut b = a.clone();
        b.last_update_time = Some(at(200));
        assert!(!differs(Some(&a), &b));
        b.num_serve_endpoints = Some(1);
        assert!(differs(Some(&a), &b));
    }
}
