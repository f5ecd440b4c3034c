//! A queued pipeline's admission (its `kueue.x-k8s.io/queue-name` label): each of its clusters is
//! a Kueue Workload of its own, and the `Admitted` condition says, with Kueue's reason and
//! message, whether the serving cluster and an upgrade's cluster hold quota or wait for it.
//! Read only for pipelines in a queue; Kueue's API is read as JSON, so raypipe runs the same
//! where Kueue is not installed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};

use super::context::Context;
use crate::api::conditions::{self, Condition, FALSE, TRUE, UNKNOWN};
use crate::api::rayservice::RayService;
use crate::api::servepipeline::{ServePipeline, condition_types};
use crate::kuberay::kueue::{self, Admission};

/// What the Workloads of a queued pipeline's clusters say.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Reading {
    pub queue: String,
    /// The cluster that serves (or will serve first) and its admission.
    pub serving: Option<(String, Admission)>,
    /// An upgrade's new cluster and its admission.
    pub upgrade: Option<(String, Admission)>,
    /// Kueue's Workloads could not be read (not installed, or not allowed).
    pub unreadable: Option<String>,
}

fn workload_resource() -> ApiResource {
    ApiResource {
        group: kueue::GROUP.to_owned(),
        version: kueue::WORKLOAD_VERSION.to_owned(),
        api_version: format!("{}/{}", kueue::GROUP, kueue::WORKLOAD_VERSION),
        kind: "Workload".to_owned(),
        plural: "workloads".to_owned(),
    }
}

/// Reads the Workloads of the RayService's clusters; `None` for a pipeline not in a queue.
pub(super) async fn read(
    pipeline: &ServePipeline,
    ctx: &Context,
    existing: Option<&RayService>,
) -> Option<Reading> {
    let queue = kueue::queue_name(pipeline.labels())?.to_owned();
    let status = existing.and_then(|rs| rs.status.as_ref());
    let cluster = |s: Option<&crate::api::rayservice::RayServiceClusterStatus>| {
        s.and_then(|s| s.ray_cluster_name.clone())
            .filter(|n| !n.is_empty())
    };
    let active = cluster(status.and_then(|s| s.active_service_status.as_ref()));
    let pending = cluster(status.and_then(|s| s.pending_service_status.as_ref()));
    let mut reading = Reading {
        queue,
        serving: None,
        upgrade: None,
        unreadable: None,
    };
    if active.is_none() && pending.is_none() {
        return Some(reading);
    }
    let namespace = pipeline.namespace().unwrap_or_default();
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &namespace, &workload_resource());
    let workloads = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => {
            reading.unreadable = Some(crate::k8s::truncate(&e.to_string(), 300));
            return Some(reading);
        }
    };
    let admission_of = |name: &str| {
        let mut found: Vec<Admission> = workloads
            .iter()
            .filter_map(|w| serde_json::to_value(w).ok())
            .filter(|w| kueue::workload_owner(w, "RayCluster").as_deref() == Some(name))
            .map(|w| kueue::admission(&w))
            .filter(|a| *a != Admission::Finished)
            .collect();
        found.pop().unwrap_or_else(|| Admission::Waiting {
            reason: "NoWorkload".to_owned(),
            message: format!(
                "Kueue has made no Workload for RayCluster {name} yet (is Kueue running with its \
                 ray.io/raycluster integration?)"
            ),
        })
    };
    match (active, pending) {
        (Some(active), pending) => {
            reading.serving = Some((active.clone(), admission_of(&active)));
            reading.upgrade = pending.map(|p| {
                let a = admission_of(&p);
                (p, a)
            });
        }
        (None, Some(pending)) => {
            reading.serving = Some((pending.clone(), admission_of(&pending)));
        }
        (None, None) => {}
    }
    Some(reading)
}

/// The `Admitted` condition of a reading (pure).
pub(super) fn condition(reading: &Reading, generation: Option<i64>, now: Time) -> Condition {
    let queue = &reading.queue;
    let make = |status: &str, reason: &str, message: String| {
        conditions::condition(
            condition_types::ADMITTED,
            status,
            reason,
            message,
            generation,
            now.clone(),
        )
    };
    if let Some(error) = &reading.unreadable {
        return make(
            UNKNOWN,
            "WorkloadsUnreadable",
            format!("Kueue's Workloads cannot be read for LocalQueue {queue}: {error}"),
        );
    }
    let Some((serving, serving_admission)) = &reading.serving else {
        return make(
            UNKNOWN,
            "NoCluster",
            format!("no RayCluster to admit yet in LocalQueue {queue}"),
        );
    };
    match (serving_admission, &reading.upgrade) {
        (Admission::Waiting { reason, message }, _) => make(
            FALSE,
            reason,
            format!("waiting for quota in LocalQueue {queue}: RayCluster {serving}: {message}"),
        ),
        (_, Some((upgrade, Admission::Waiting { reason, message }))) => make(
            FALSE,
            reason,
            format!(
                "the upgrade's RayCluster {upgrade} is waiting for quota in LocalQueue {queue} \
                 ({message}); RayCluster {serving} keeps serving"
            ),
        ),
        _ => make(
            TRUE,
            "Admitted",
            format!("RayCluster {serving} is admitted by Kueue in LocalQueue {queue}"),
        ),
    }
}

/// Sets (or, for a pipeline not in a queue, removes) the `Admitted` condition.
pub(super) fn record(
    conditions_list: &mut Vec<Condition>,
    reading: Option<&Reading>,
    generation: Option<i64>,
    now: Time,
) {
    match reading {
        Some(reading) => {
            conditions::set_condition(conditions_list, condition(reading, generation, now))
        }
        None => conditions_list.retain(|c| c.type_ != condition_types::ADMITTED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(reason: &str) -> Admission {
        Admission::Waiting {
            reason: reason.to_owned(),
            message: "couldn't assign flavors to pod set head: insufficient unused quota for cpu"
                .to_owned(),
        }
    }

    fn reading(serving: Option<(&str, Admission)>, upgrade: Option<(&str, Admission)>) -> Reading {
        Reading {
            queue: "team-a".into(),
            serving: serving.map(|(n, a)| (n.to_owned(), a)),
            upgrade: upgrade.map(|(n, a)| (n.to_owned(), a)),
            unreadable: None,
        }
    }

    fn at() -> Time {
        Time("2026-12-02T08:00:00Z".parse().unwrap())
    }

    #[test]
    fn a_waiting_serving_cluster_is_not_admitted_with_kueues_reason() {
        let c = condition(
            &reading(Some(("demo-a", waiting("Pending"))), None),
            Some(3),
            at(),
        );
        assert_eq!((c.status.as_str(), c.reason.as_str()), (FALSE, "Pending"));
        assert!(
            c.message
                .starts_with("waiting for quota in LocalQueue team-a: RayCluster demo-a")
        );
        assert!(c.message.contains("insufficient unused quota"));
        assert_eq!(c.observed_generation, Some(3));
        let preempted = condition(
            &reading(Some(("demo-a", waiting("Preempted"))), None),
            None,
            at(),
        );
        assert_eq!(preempted.reason, "Preempted");
    }

    #[test]
    fn an_upgrade_waiting_for_quota_says_the_serving_cluster_goes_on() {
        let c = condition(
            &reading(
                Some(("demo-a", Admission::Admitted)),
                Some(("demo-b", waiting("Pending"))),
            ),
            None,
            at(),
        );
        assert_eq!(c.status, FALSE);
        assert!(c.message.contains("RayCluster demo-b is waiting for quota"));
        assert!(c.message.ends_with("RayCluster demo-a keeps serving"));
    }

    #[test]
    fn admitted_unknown_and_removed() {
        let ok = condition(
            &reading(Some(("demo-a", Admission::Admitted)), None),
            None,
            at(),
        );
        assert_eq!((ok.status.as_str(), ok.reason.as_str()), (TRUE, "Admitted"));
        let none = condition(&reading(None, None), None, at());
        assert_eq!(none.status, UNKNOWN);
        let mut list = vec![ok];
        record(&mut list, None, None, at());
        assert!(list.is_empty());
    }
}
