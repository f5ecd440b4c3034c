//! What only raypipe knows, kept after the cluster is gone: one record per ServePipeline
//! revision (each graph digest the pipeline fetched), with the Serve config it went live with,
//! the Ray clusters that served it, and a timeline of what happened to it (rollout steps, gate
//! readings, the decision, Serve application and deployment transitions, conditions). Next to
//! the collector's layout, under `raypipe/pipelines/<ns>/<name>/`:
//!
//! - `index.json`: the pipeline and a summary per revision (when it was seen, when it served,
//!   how its rollout ended). One read answers "what served at 14:02" and lists the revisions.
//! - `revisions/<id>.json`: one revision's whole record; `<id>` is its sequence number
//!   (zero-padded, so keys sort in order) and the digest's first 12 hex digits.
//!
//! A cold revision opens with two reads whatever the number of revisions; the writer (the
//! recorder) writes a revision's record before the index that names it, and enforces each
//! pipeline's retention.

use serde::{Deserialize, Serialize};

use super::sink::Sink;
use crate::api::servepipeline::GateReadings;

/// Every pipeline's history is under this prefix (relative to the storage root).
pub const PIPELINES_PREFIX: &str = "raypipe/pipelines";

/// Revisions kept per pipeline when its spec says nothing (`spec.history.keepRevisions`).
pub const DEFAULT_KEEP_REVISIONS: usize = 100;

/// A timeline holds at most this many entries; past it, gate readings are counted, not kept
/// (steps, decisions and transitions always are, up to twice this).
pub const MAX_TIMELINE_ENTRIES: usize = 2_000;

#[derive(Debug, thiserror::Error)]
pub enum RevisionsError {
    #[error("reading {key}: {message}")]
    Get { key: String, message: String },
    #[error("writing {key}: {message}")]
    Put { key: String, message: String },
    #[error("deleting {key}: {message}")]
    Delete { key: String, message: String },
    #[error("listing {prefix}: {message}")]
    List { prefix: String, message: String },
    #[error("{key} is not a revision record raypipe can read: {message}")]
    Decode { key: String, message: String },
}

/// A pipeline's index: what it is and a summary per revision, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PipelineIndex {
    pub namespace: String,
    pub name: String,
    /// The UID of the object last seen (a pipeline deleted and made again keeps its history).
    #[serde(default)]
    pub uid: String,
    /// When the pipeline was seen deleted, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<String>,
    /// The next revision's sequence number.
    #[serde(default)]
    pub next_seq: u64,
    pub revisions: Vec<RevisionSummary>,
    /// Revisions retention removed so far.
    #[serde(default)]
    pub removed: u64,
}

/// One revision as the index lists it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionSummary {
    pub id: String,
    pub seq: u64,
    pub digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub first_seen: String,
    pub last_change: String,
    /// When it answered requests, and as what.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub served: Vec<ServedSpan>,
    /// How its rollout ended (`Promoted`, `RolledBack`, `Aborted`) and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

/// A time this revision answered requests: `stable` (all of them, or what a canary left) or
/// `canary` (a share).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServedSpan {
    pub role: String,
    pub from: String,
    /// Absent while it still serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub result: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub message: String,
    pub at: String,
}

/// One revision's whole record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub id: String,
    pub seq: u64,
    pub digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The pipeline's `metadata.generation` when the revision was first seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    pub first_seen: String,
    /// The RayService's Serve config (`serveConfigV2`, as JSON) when this revision first served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_config: Option<serde_json::Value>,
    /// The Ray clusters (RayService `activeServiceStatus` / `pendingServiceStatus`) that served
    /// it: their sessions' logs and events are under the collector's layout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ray_clusters: Vec<String>,
    /// The RayService those clusters belong to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_service: Option<String>,
    pub timeline: Vec<TimelineEntry>,
    /// Gate readings not kept once the timeline was full.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub readings_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One thing that happened to a revision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEntry {
    pub at: String,
    #[serde(flatten)]
    pub what: Happening,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Happening {
    /// The pipeline fetched this revision's graph.
    Seen {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
    },
    /// It started or stopped answering requests as `role`.
    Serving { role: String, serving: bool },
    /// A canary step began (step 0: its deployments start, no traffic yet).
    Step { step: i32, steps: i32, weight: i32 },
    /// The gates' readings during a step.
    Readings { step: i32, readings: GateReadings },
    /// How its rollout ended.
    Decision {
        result: String,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        readings: Option<GateReadings>,
    },
    /// The pipeline's phase while this revision was the newest.
    Phase { phase: String },
    /// A condition of the pipeline changed while this revision was the newest.
    Condition {
        #[serde(rename = "type")]
        type_: String,
        status: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reason: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        message: String,
    },
    /// Its Serve application's status changed.
    Application {
        application: String,
        status: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        message: String,
    },
    /// One of its Serve deployments (graph nodes) changed status.
    Deployment {
        application: String,
        deployment: String,
        status: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        message: String,
    },
    /// The pipeline was deleted (its history stays).
    Deleted,
}

/// The id of revision `seq` of `digest`: `000042-0123456789ab`.
pub fn revision_id(seq: u64, digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    let short: String = hex
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect();
    format!("{seq:06}-{short}")
}

/// `raypipe/pipelines/<ns>/<name>`.
pub fn pipeline_prefix(namespace: &str, name: &str) -> String {
    format!("{PIPELINES_PREFIX}/{namespace}/{name}")
}

pub fn index_key(namespace: &str, name: &str) -> String {
    format!("{}/index.json", pipeline_prefix(namespace, name))
}

pub fn revision_key(namespace: &str, name: &str, id: &str) -> String {
    format!("{}/revisions/{id}.json", pipeline_prefix(namespace, name))
}

/// Where `index.json` under [`PIPELINES_PREFIX`] names a pipeline: `(namespace, name)`.
pub fn parse_index_key(key: &str) -> Option<(String, String)> {
    let rest = key.strip_prefix(PIPELINES_PREFIX)?.strip_prefix('/')?;
    let [namespace, name, "index.json"] = rest.split('/').collect::<Vec<_>>()[..] else {
        return None;
    };
    Some((namespace.to_owned(), name.to_owned()))
}

/// Revisions that served (as stable or canary) at `at` (RFC 3339), newest first.
pub fn serving_at<'a>(
    index: &'a PipelineIndex,
    at: &jiff::Timestamp,
) -> Vec<(&'a RevisionSummary, &'a ServedSpan)> {
    let parse = |t: &str| t.parse::<jiff::Timestamp>().ok();
    let mut found: Vec<(&RevisionSummary, &ServedSpan)> = index
        .revisions
        .iter()
        .flat_map(|r| r.served.iter().map(move |s| (r, s)))
        .filter(|(_, span)| {
            let from = parse(&span.from);
            let until = span.until.as_deref().and_then(parse);
            from.is_some_and(|from| from <= *at) && until.is_none_or(|until| *at < until)
        })
        .collect();
    found.sort_by_key(|(r, _)| std::cmp::Reverse(r.seq));
    found
}

/// Per pipeline, how much history the writer keeps (`spec.history`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// The newest this many revisions.
    pub keep_revisions: usize,
    /// Revisions whose last change is older than this many days go, when set.
    pub keep_days: Option<u32>,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            keep_revisions: DEFAULT_KEEP_REVISIONS,
            keep_days: None,
        }
    }
}

/// The ids retention removes from `index` at `now`: beyond the newest `keep_revisions`, or
/// unchanged for longer than `keep_days`. Never one that still serves (an open span), nor the
/// newest revision (it may be waiting to serve).
pub fn expired(index: &PipelineIndex, retention: Retention, now: &jiff::Timestamp) -> Vec<String> {
    let newest = index.revisions.iter().map(|r| r.seq).max();
    let serving = |r: &RevisionSummary| r.served.iter().any(|s| s.until.is_none());
    let cutoff = retention.keep_days.and_then(|days| {
        now.checked_sub(jiff::SignedDuration::from_hours(i64::from(days) * 24))
            .ok()
    });
    let mut by_age: Vec<&RevisionSummary> = index.revisions.iter().collect();
    by_age.sort_by_key(|r| std::cmp::Reverse(r.seq));
    by_age
        .iter()
        .enumerate()
        .filter(|(rank, r)| {
            let too_many = *rank >= retention.keep_revisions.max(1);
            let too_old = cutoff.is_some_and(|cutoff| {
                r.last_change
                    .parse::<jiff::Timestamp>()
                    .is_ok_and(|t| t < cutoff)
            });
            (too_many || too_old) && !serving(r) && Some(r.seq) != newest
        })
        .map(|(_, r)| r.id.clone())
        .collect()
}

/// Reads and writes pipeline histories in a bucket.
#[derive(Clone)]
pub struct RevisionStore {
    sink: Sink,
}

impl RevisionStore {
    pub fn new(sink: Sink) -> RevisionStore {
        RevisionStore { sink }
    }

    /// The store the collector's variables name (`STORAGE_BACKEND`, …), under
    /// `STORAGE_ROOT_DIR`: the recorder writes where the collector and the readers look.
    pub fn from_env(
        env: &std::collections::BTreeMap<String, String>,
    ) -> Result<RevisionStore, super::store::StoreError> {
        let store = super::store::from_env(env)?;
        let root = env
            .get("STORAGE_ROOT_DIR")
            .map(String::as_str)
            .unwrap_or_default();
        Ok(RevisionStore::new(Sink::new(store, root)))
    }

    pub(super) async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, RevisionsError> {
        use object_store::ObjectStoreExt;
        let failed = |e: object_store::Error| RevisionsError::Get {
            key: key.to_owned(),
            message: e.to_string(),
        };
        let bytes = match self.sink.store().get(&self.sink.key(key)).await {
            Ok(found) => found.bytes().await.map_err(failed)?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(failed(e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| RevisionsError::Decode {
                key: key.to_owned(),
                message: e.to_string(),
            })
    }

    pub(super) async fn put_json<T: Serialize>(
        &self,
        key: &str,
        value: &T,
    ) -> Result<(), RevisionsError> {
        use object_store::ObjectStoreExt;
        let bytes = serde_json::to_vec(value).map_err(|e| RevisionsError::Put {
            key: key.to_owned(),
            message: e.to_string(),
        })?;
        self.sink
            .store()
            .put(&self.sink.key(key), bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| RevisionsError::Put {
                key: key.to_owned(),
                message: e.to_string(),
            })
    }

    /// The pipeline's index; `None` when nothing was recorded for it.
    pub async fn index(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PipelineIndex>, RevisionsError> {
        self.get_json(&index_key(namespace, name)).await
    }

    /// One revision's record; `None` when there is none (or retention removed it).
    pub async fn revision(
        &self,
        namespace: &str,
        name: &str,
        id: &str,
    ) -> Result<Option<RevisionRecord>, RevisionsError> {
        if !valid_id(id) {
            return Ok(None);
        }
        self.get_json(&revision_key(namespace, name, id)).await
    }

    /// Every pipeline with a history, sorted by namespace and name.
    pub async fn pipelines(&self) -> Result<Vec<(String, String)>, RevisionsError> {
        use futures::TryStreamExt;
        let prefix = self.sink.key(PIPELINES_PREFIX);
        let root = self.sink.key("").to_string();
        let listed: Vec<object_store::ObjectMeta> = self
            .sink
            .store()
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| RevisionsError::List {
                prefix: PIPELINES_PREFIX.to_owned(),
                message: e.to_string(),
            })?;
        let mut found: Vec<(String, String)> = listed
            .iter()
            .filter_map(|meta| {
                let key = meta.location.to_string();
                let relative = if root.is_empty() {
                    key.as_str()
                } else {
                    key.strip_prefix(&format!("{root}/"))?
                };
                parse_index_key(relative)
            })
            .collect();
        found.sort();
        found.dedup();
        Ok(found)
    }

    pub async fn put_index(&self, index: &PipelineIndex) -> Result<(), RevisionsError> {
        self.put_json(&index_key(&index.namespace, &index.name), index)
            .await
    }

    pub async fn put_revision(&self, record: &RevisionRecord) -> Result<(), RevisionsError> {
        self.put_json(
            &revision_key(&record.namespace, &record.name, &record.id),
            record,
        )
        .await
    }

    pub async fn delete_revision(
        &self,
        namespace: &str,
        name: &str,
        id: &str,
    ) -> Result<(), RevisionsError> {
        use object_store::ObjectStoreExt;
        let key = revision_key(namespace, name, id);
        match self.sink.store().delete(&self.sink.key(&key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(RevisionsError::Delete {
                key,
                message: e.to_string(),
            }),
        }
    }
}

/// Ids are `<digits>-<alphanumerics>`: anything else (a path, `..`) names no revision.
pub fn valid_id(id: &str) -> bool {
    id.split_once('-').is_some_and(|(seq, hex)| {
        !seq.is_empty()
            && seq.bytes().all(|b| b.is_ascii_digit())
            && !hex.is_empty()
            && hex.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(seq: u64, last_change: &str, served: Vec<ServedSpan>) -> RevisionSummary {
        RevisionSummary {
            id: revision_id(seq, &format!("sha256:{seq:064}")),
            seq,
            digest: format!("sha256:{seq:064}"),
            first_seen: last_change.to_owned(),
            last_change: last_change.to_owned(),
            served,
            ..RevisionSummary::default()
        }
    }

    fn span(role: &str, from: &str, until: Option<&str>) -> ServedSpan {
        ServedSpan {
            role: role.to_owned(),
            from: from.to_owned(),
            until: until.map(str::to_owned),
        }
    }

    #[test]
    fn ids_sort_by_sequence_and_only_well_formed_ones_are_read() {
        assert_eq!(
            revision_id(7, "sha256:0123456789abcdef"),
            "000007-0123456789ab"
        );
        assert!(revision_id(9, "sha256:ff") < revision_id(10, "sha256:00"));
        assert!(valid_id("000007-0123456789ab"));
        for bad in ["", "7", "-ab", "7-", "../x-1", "7-a/b", "7-a.json", "x7-ab"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn index_keys_name_their_pipeline() {
        assert_eq!(
            parse_index_key(&index_key("ml", "demo")),
            Some(("ml".into(), "demo".into()))
        );
        assert_eq!(
            parse_index_key(&revision_key("ml", "demo", "000001-ab")),
            None
        );
        assert_eq!(parse_index_key("raypipe/pipelines/ml/index.json"), None);
    }

    #[test]
    fn what_served_at_a_time_is_read_from_the_spans() {
        let index = PipelineIndex {
            revisions: vec![
                summary(
                    1,
                    "2026-12-01T10:00:00Z",
                    vec![span(
                        "stable",
                        "2026-12-01T10:00:00Z",
                        Some("2026-12-01T14:00:00Z"),
                    )],
                ),
                summary(
                    2,
                    "2026-12-01T14:10:00Z",
                    vec![
                        span(
                            "canary",
                            "2026-12-01T13:50:00Z",
                            Some("2026-12-01T14:00:00Z"),
                        ),
                        span("stable", "2026-12-01T14:00:00Z", None),
                    ],
                ),
                summary(
                    3,
                    "2026-12-01T14:01:00Z",
                    vec![span(
                        "canary",
                        "2026-12-01T14:01:00Z",
                        Some("2026-12-01T14:03:00Z"),
                    )],
                ),
            ],
            ..PipelineIndex::default()
        };
        let at = |t: &str| {
            serving_at(&index, &t.parse().unwrap())
                .iter()
                .map(|(r, s)| (r.seq, s.role.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(at("2026-12-01T09:00:00Z"), vec![]);
        assert_eq!(
            at("2026-12-01T13:55:00Z"),
            vec![(2, "canary".into()), (1, "stable".into())]
        );
        assert_eq!(
            at("2026-12-01T14:02:00Z"),
            vec![(3, "canary".into()), (2, "stable".into())]
        );
        assert_eq!(at("2026-12-01T14:03:00Z"), vec![(2, "stable".into())]);
        assert_eq!(at("2030-01-01T00:00:00Z"), vec![(2, "stable".into())]);
    }

    #[test]
    fn retention_keeps_the_newest_and_what_serves() {
        let old = "2026-01-01T00:00:00Z";
        let index = PipelineIndex {
            revisions: vec![
                summary(1, old, vec![span("stable", old, None)]),
                summary(2, old, vec![]),
                summary(3, old, vec![span("canary", old, Some(old))]),
                summary(4, "2026-12-01T00:00:00Z", vec![]),
                summary(5, old, vec![]),
            ],
            ..PipelineIndex::default()
        };
        let now: jiff::Timestamp = "2026-12-02T00:00:00Z".parse().unwrap();
        let ids = |v: Vec<String>| {
            v.iter()
                .map(|id| id[..6].parse::<u64>().unwrap())
                .collect::<Vec<_>>()
        };
        // By count: the newest two are 5 and 4; 1 still serves.
        let by_count = Retention {
            keep_revisions: 2,
            keep_days: None,
        };
        assert_eq!(ids(expired(&index, by_count, &now)), vec![3, 2]);
        // By age: everything unchanged for 30 days, except what serves and the newest (5).
        let by_age = Retention {
            keep_revisions: 100,
            keep_days: Some(30),
        };
        assert_eq!(ids(expired(&index, by_age, &now)), vec![3, 2]);
        // Nothing to remove.
        assert!(expired(&index, Retention::default(), &now).is_empty());
        // keep_revisions 0 is read as 1.
        let none = Retention {
            keep_revisions: 0,
            keep_days: None,
        };
        assert_eq!(ids(expired(&index, none, &now)), vec![4, 3, 2]);
    }

    #[test]
    fn records_round_trip_with_their_timeline_kinds() {
        let record = RevisionRecord {
            namespace: "ml".into(),
            name: "demo".into(),
            id: "000001-ab".into(),
            seq: 1,
            digest: "sha256:ab".into(),
            timeline: vec![
                TimelineEntry {
                    at: "2026-12-01T10:00:00Z".into(),
                    what: Happening::Step {
                        step: 1,
                        steps: 3,
                        weight: 10,
                    },
                },
                TimelineEntry {
                    at: "2026-12-01T10:01:00Z".into(),
                    what: Happening::Condition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        reason: String::new(),
                        message: String::new(),
                    },
                },
                TimelineEntry {
                    at: "2026-12-01T10:02:00Z".into(),
                    what: Happening::Deleted,
                },
            ],
            ..RevisionRecord::default()
        };
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(
            json["timeline"][0],
            serde_json::json!({"at": "2026-12-01T10:00:00Z", "kind": "step", "step": 1, "steps": 3, "weight": 10})
        );
        assert_eq!(json["timeline"][1]["type"], "Ready");
        assert_eq!(json["timeline"][2]["kind"], "deleted");
        let back: RevisionRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
    }
}
