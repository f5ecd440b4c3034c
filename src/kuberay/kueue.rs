//! What raypipe and Kueue agree on: the labels that put an object in a queue, the annotations a
//! ServePipeline uses to have each of its clusters admitted on its own, and the reading of a
//! Kueue Workload's conditions. Kueue itself is never imported: its API is read as JSON.

use std::collections::BTreeMap;

use serde_json::Value;

/// Kueue's label naming the LocalQueue an object is admitted through.
pub const QUEUE_NAME_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Kueue's label naming the WorkloadPriorityClass of an object's Workload.
pub const PRIORITY_CLASS_LABEL: &str = "kueue.x-k8s.io/priority-class";
/// The labels that carry over from an owner to what is admitted for it.
pub const QUEUE_LABELS: [&str; 2] = [QUEUE_NAME_LABEL, PRIORITY_CLASS_LABEL];

/// On a RayService: each RayCluster it creates is its own Kueue workload in this LocalQueue
/// (the RayService itself is not queued). A ServePipeline in a queue sets it, so a cluster an
/// upgrade needs is admitted on its own quota instead of running on the serving one's.
pub const CLUSTER_QUEUE_ANNOTATION: &str = "raypipe.dev/cluster-queue-name";
/// On a RayService: the priority class of the clusters [`CLUSTER_QUEUE_ANNOTATION`] queues.
pub const CLUSTER_PRIORITY_ANNOTATION: &str = "raypipe.dev/cluster-priority-class";
/// On a RayService: how long a new cluster of an upgrade may wait for admission before the
/// upgrade is given up (a Go duration, e.g. `10m`; default [`DEFAULT_ADMISSION_TIMEOUT`]).
pub const ADMISSION_TIMEOUT_ANNOTATION: &str = "raypipe.dev/cluster-admission-timeout";
/// On a RayService: the replacement hash of a cluster spec whose upgrade was given up for want
/// of quota; that spec is not tried again until it changes (or the annotation is removed).
pub const ABANDONED_SPEC_ANNOTATION: &str = "raypipe.dev/upgrade-not-admitted";
/// How long a new cluster waits for admission by default.
pub const DEFAULT_ADMISSION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Kueue's API group and the version raypipe reads Workloads at.
pub const GROUP: &str = "kueue.x-k8s.io";
pub const WORKLOAD_VERSION: &str = "v1beta2";

/// The queue labels among `labels` (empty when the object is not in a queue).
pub fn queue_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    QUEUE_LABELS
        .iter()
        .filter_map(|key| {
            labels
                .get(*key)
                .filter(|v| !v.is_empty())
                .map(|v| ((*key).to_owned(), v.clone()))
        })
        .collect()
}

/// The LocalQueue `labels` put an object in.
pub fn queue_name(labels: &BTreeMap<String, String>) -> Option<&str> {
    labels
        .get(QUEUE_NAME_LABEL)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

/// The labels a RayService's clusters get for per-cluster admission
/// ([`CLUSTER_QUEUE_ANNOTATION`]): empty when the RayService does not ask for it.
pub fn cluster_queue_labels(annotations: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let Some(queue) = annotations
        .get(CLUSTER_QUEUE_ANNOTATION)
        .filter(|v| !v.is_empty())
    else {
        return BTreeMap::new();
    };
    let mut labels = BTreeMap::from([(QUEUE_NAME_LABEL.to_owned(), queue.clone())]);
    if let Some(priority) = annotations
        .get(CLUSTER_PRIORITY_ANNOTATION)
        .filter(|v| !v.is_empty())
    {
        labels.insert(PRIORITY_CLASS_LABEL.to_owned(), priority.clone());
    }
    labels
}

/// `spec` without what Kueue writes into its Pod templates on admission (labels and annotations
/// under `kueue.x-k8s.io/`: the Workload, the queues, the pod set), so admission never reads as
/// a changed spec. (Node selectors of a flavor are not told apart from the user's.)
pub fn without_admission_marks(
    mut spec: crate::api::raycluster::RayClusterSpec,
) -> crate::api::raycluster::RayClusterSpec {
    let strip = |template: &mut k8s_openapi::api::core::v1::PodTemplateSpec| {
        if let Some(meta) = template.metadata.as_mut() {
            for map in [meta.labels.as_mut(), meta.annotations.as_mut()]
                .into_iter()
                .flatten()
            {
                map.retain(|key, _| !key.starts_with("kueue.x-k8s.io/"));
            }
            // What Kueue hands back after taking its marks out: empty maps, or an empty
            // `metadata`, mean the same as none.
            if meta.labels.as_ref().is_some_and(|m| m.is_empty()) {
                meta.labels = None;
            }
            if meta.annotations.as_ref().is_some_and(|m| m.is_empty()) {
                meta.annotations = None;
            }
        }
        if template
            .metadata
            .as_ref()
            .is_some_and(|m| *m == Default::default())
        {
            template.metadata = None;
        }
    };
    strip(&mut spec.head_group_spec.template);
    for group in spec.worker_group_specs.iter_mut().flatten() {
        strip(&mut group.template);
    }
    spec
}

/// Where a Workload stands, from its conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Quota reserved and admitted: the workload may run.
    Admitted,
    /// Waiting: Kueue's reason and message (e.g. `Pending`, "couldn't assign flavors …"), or
    /// evicted (`Preempted`, `InactiveWorkload`, …) and waiting again.
    Waiting { reason: String, message: String },
    /// Finished (its owner completed or was deleted).
    Finished,
}

fn condition<'a>(workload: &'a Value, type_: &str) -> Option<&'a Value> {
    workload["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn is_true(c: Option<&Value>) -> bool {
    c.is_some_and(|c| c["status"] == "True")
}

fn text(c: &Value, key: &str) -> String {
    c[key].as_str().unwrap_or_default().to_owned()
}

/// Reads a Workload's conditions (Kueue's `Finished`, `Evicted`, `Admitted`, `QuotaReserved`).
/// An eviction wins over a stale `Admitted`: Kueue sets `Evicted` first and takes admission
/// away after the job stopped.
pub fn admission(workload: &Value) -> Admission {
    if is_true(condition(workload, "Finished")) {
        return Admission::Finished;
    }
    if let Some(evicted) = condition(workload, "Evicted").filter(|c| c["status"] == "True") {
        return Admission::Waiting {
            reason: text(evicted, "reason"),
            message: text(evicted, "message"),
        };
    }
    if is_true(condition(workload, "Admitted")) {
        return Admission::Admitted;
    }
    match condition(workload, "QuotaReserved") {
        Some(c) => Admission::Waiting {
            reason: text(c, "reason"),
            message: text(c, "message"),
        },
        None => Admission::Waiting {
            reason: "Pending".to_owned(),
            message: "the Workload has no QuotaReserved condition yet".to_owned(),
        },
    }
}

/// The name of the object that owns a Workload as its controller (Kueue sets exactly one).
pub fn workload_owner(workload: &Value, kind: &str) -> Option<String> {
    workload["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["kind"] == kind && o["controller"] == true)
        .and_then(|o| o["name"].as_str())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn workload(conditions: Value) -> Value {
        json!({"metadata": {"ownerReferences": [
            {"kind": "RayCluster", "name": "demo-abcde", "controller": true}
        ]}, "status": {"conditions": conditions}})
    }

    #[test]
    fn kueues_admission_marks_are_not_a_spec_change() {
        let spec: crate::api::raycluster::RayClusterSpec = serde_json::from_value(json!({
            "headGroupSpec": {"template": {
                "metadata": {"labels": {"app": "x", "kueue.x-k8s.io/podset": "head"},
                             "annotations": {"kueue.x-k8s.io/workload": "w"}},
                "spec": {"containers": [{"name": "ray-head", "image": "ray"}]}}}
        }))
        .unwrap();
        let clean = without_admission_marks(spec);
        let meta = clean.head_group_spec.template.metadata.unwrap();
        assert_eq!(meta.labels.unwrap().len(), 1);
        assert!(meta.annotations.is_none(), "an emptied map is no map");
        // A template Kueue hands back with an empty `metadata` is the one without it.
        let bare = |metadata: serde_json::Value| -> crate::api::raycluster::RayClusterSpec {
            let mut template =
                json!({"spec": {"containers": [{"name": "ray-head", "image": "ray"}]}});
            if !metadata.is_null() {
                template["metadata"] = metadata;
            }
            serde_json::from_value(json!({"headGroupSpec": {"template": template}})).unwrap()
        };
        let none = without_admission_marks(bare(serde_json::Value::Null));
        for handed_back in [
            json!({}),
            json!({"labels": {}}),
            json!({"labels": {"kueue.x-k8s.io/podset": "head"}, "annotations": {}}),
        ] {
            assert_eq!(
                without_admission_marks(bare(handed_back.clone())),
                none,
                "{handed_back}"
            );
        }
    }

    #[test]
    fn queue_labels_are_taken_only_when_set() {
        let labels = BTreeMap::from([
            (QUEUE_NAME_LABEL.to_owned(), "team-a".to_owned()),
            (PRIORITY_CLASS_LABEL.to_owned(), String::new()),
            ("app".to_owned(), "x".to_owned()),
        ]);
        assert_eq!(
            queue_labels(&labels),
            BTreeMap::from([(QUEUE_NAME_LABEL.to_owned(), "team-a".to_owned())])
        );
        assert_eq!(queue_name(&labels), Some("team-a"));
        assert_eq!(queue_name(&BTreeMap::new()), None);
    }

    #[test]
    fn per_cluster_admission_labels_come_from_the_annotations() {
        let annotations = BTreeMap::from([
            (CLUSTER_QUEUE_ANNOTATION.to_owned(), "team-a".to_owned()),
            (CLUSTER_PRIORITY_ANNOTATION.to_owned(), "serving".to_owned()),
        ]);
        let labels = cluster_queue_labels(&annotations);
        assert_eq!(labels[QUEUE_NAME_LABEL], "team-a");
        assert_eq!(labels[PRIORITY_CLASS_LABEL], "serving");
        assert!(cluster_queue_labels(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn a_workload_reads_as_admitted_waiting_or_finished() {
        let admitted = workload(json!([
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted"}
        ]));
        assert_eq!(admission(&admitted), Admission::Admitted);
        let pending = workload(json!([
            {"type": "QuotaReserved", "status": "False", "reason": "Pending",
             "message": "couldn't assign flavors to pod set head: insufficient unused quota"}
        ]));
        assert_eq!(
            admission(&pending),
            Admission::Waiting {
                reason: "Pending".into(),
                message: "couldn't assign flavors to pod set head: insufficient unused quota"
                    .into()
            }
        );
        let preempted = workload(json!([
            {"type": "Admitted", "status": "True", "reason": "Admitted"},
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a workload"}
        ]));
        assert!(
            matches!(admission(&preempted), Admission::Waiting { reason, .. } if reason == "Preempted")
        );
        let finished = workload(json!([{"type": "Finished", "status": "True"}]));
        assert_eq!(admission(&finished), Admission::Finished);
        assert!(matches!(
            admission(&workload(json!([]))),
            Admission::Waiting { .. }
        ));
        assert_eq!(
            workload_owner(&pending, "RayCluster").as_deref(),
            Some("demo-abcde")
        );
        assert_eq!(workload_owner(&pending, "RayJob"), None);
    }
}
