//! Reading history back: which clusters and sessions a bucket lists (KubeRay's
//! `cluster-metadata/` markers), the events of one session as a timeline, and its logs. Used by
//! `raypipe history`; the keys are the collector's ([`super::layout`]).

use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::Serialize;
use serde_json::Value;

use super::layout::ClusterIdentity;
use super::sink::Sink;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("listing {prefix}: {message}")]
    List { prefix: String, message: String },
    #[error("reading {key}: {message}")]
    Get { key: String, message: String },
}

/// One session of one cluster, as its marker names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct SessionEntry {
    pub namespace: String,
    pub cluster: String,
    /// `rayjob` / `rayservice` and its name, when one made the cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_name: Option<String>,
    pub session: String,
}

impl SessionEntry {
    pub fn identity(&self) -> ClusterIdentity {
        ClusterIdentity {
            namespace: self.namespace.clone(),
            cluster: self.cluster.clone(),
            owner: self.owner_kind.clone().zip(self.owner_name.clone()),
        }
    }
}

/// A marker key (relative to the root) as a session: `cluster-metadata/<kind>/<ns>_[<owner>_]
/// <cluster>/<session>`. Kubernetes names hold no `_`, so the parts split cleanly.
pub fn parse_marker(key: &str) -> Option<SessionEntry> {
    let rest = key.strip_prefix("cluster-metadata/")?;
    let [kind, names, session] = rest.split('/').collect::<Vec<_>>()[..] else {
        return None;
    };
    let parts: Vec<&str> = names.split('_').collect();
    let (namespace, owner, cluster) = match (kind, parts.as_slice()) {
        ("raycluster", [ns, cluster]) => (ns, None, cluster),
        ("rayjob" | "rayservice", [ns, owner, cluster]) => (ns, Some(*owner), cluster),
        _ => return None,
    };
    Some(SessionEntry {
        namespace: (*namespace).to_owned(),
        cluster: (*cluster).to_owned(),
        owner_kind: owner.map(|_| kind.to_owned()),
        owner_name: owner.map(str::to_owned),
        session: session.to_owned(),
    })
}

/// One event on a session's timeline.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEntry {
    pub timestamp: String,
    pub event_type: String,
    /// The node directory the event was filed under.
    pub node: String,
    /// The job (hex) for job events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// A line a person reads: the task, actor or job and the state it reached.
    pub summary: String,
}

/// What a person wants from an event: the payload's name or id and its last state.
pub fn summarize(event: &Value) -> String {
    let Some((_, payload)) = event
        .as_object()
        .into_iter()
        .flatten()
        .find(|(k, v)| k.ends_with("Event") && k.as_str() != "eventType" && v.is_object())
        .or_else(|| {
            event
                .as_object()
                .into_iter()
                .flatten()
                .find(|(k, _)| k.as_str() == "taskProfileEvents")
        })
    else {
        return event["message"].as_str().unwrap_or_default().to_owned();
    };
    let text = |key: &str| {
        payload
            .get(key)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    let name = text("taskName")
        .or_else(|| text("actorName"))
        .or_else(|| text("className"))
        .or_else(|| text("entrypoint"))
        .or_else(|| text("nodeIpAddress"));
    let id = ["taskId", "actorId", "jobId", "nodeId"]
        .iter()
        .find_map(|k| text(k).and_then(super::event::id_hex).map(|h| (*k, h)));
    let state = payload
        .get("stateTransitions")
        .and_then(Value::as_array)
        .and_then(|t| t.last())
        .and_then(|t| t.get("state"))
        .and_then(Value::as_str);
    let mut parts = Vec::new();
    if let Some(name) = name {
        parts.push(name.to_owned());
    }
    if let Some((key, hex)) = id {
        let short: String = hex.chars().take(12).collect();
        parts.push(format!("{}={short}", key.trim_end_matches("Id")));
    }
    if let Some(state) = state {
        parts.push(format!("-> {state}"));
    }
    parts.join(" ")
}

/// Reads a bucket written by the collector.
pub struct Reader {
    sink: Sink,
}

impl Reader {
    pub fn new(sink: Sink) -> Reader {
        Reader { sink }
    }

    fn store(&self) -> &dyn ObjectStore {
        self.sink.store().as_ref()
    }

    /// Keys (relative to the root) under `prefix`, sorted.
    async fn keys(&self, prefix: &str) -> Result<Vec<String>, ReadError> {
        let full = self.sink.key(prefix);
        let root = self.sink.key("");
        let listed: Vec<object_store::ObjectMeta> = self
            .store()
            .list(Some(&full))
            .try_collect()
            .await
            .map_err(|e| ReadError::List {
                prefix: prefix.to_owned(),
                message: e.to_string(),
            })?;
        let mut keys: Vec<String> = listed
            .into_iter()
            .map(|m| {
                let key = m.location.to_string();
                let root = root.to_string();
                key.strip_prefix(&format!("{root}/"))
                    .map(str::to_owned)
                    .unwrap_or(key)
            })
            .collect();
        keys.sort();
        Ok(keys)
    }

    async fn get(&self, key: &str) -> Result<Vec<u8>, ReadError> {
        let failed = |e: object_store::Error| ReadError::Get {
            key: key.to_owned(),
            message: e.to_string(),
        };
        let found = self
            .store()
            .get(&self.sink.key(key))
            .await
            .map_err(failed)?;
        Ok(found.bytes().await.map_err(failed)?.to_vec())
    }

    /// Every session the bucket lists, sorted by namespace, cluster and session.
    pub async fn sessions(&self) -> Result<Vec<SessionEntry>, ReadError> {
        let mut sessions: Vec<SessionEntry> = self
            .keys("cluster-metadata")
            .await?
            .iter()
            .filter_map(|k| parse_marker(k))
            .collect();
        sessions.sort();
        Ok(sessions)
    }

    /// The session's events in time order (every node, every job).
    pub async fn timeline(&self, session: &SessionEntry) -> Result<Vec<TimelineEntry>, ReadError> {
        let prefix = format!(
            "{}/{}",
            session.identity().history_prefix(),
            session.session
        );
        let mut timeline = Vec::new();
        for key in self.keys(&prefix).await? {
            let Some(relative) = key.strip_prefix(&format!("{prefix}/")) else {
                continue;
            };
            let parts: Vec<&str> = relative.split('/').collect();
            let (node, job) = match parts.as_slice() {
                [node, "node_events", file] if file.ends_with(".jsonl") => (*node, None),
                [node, "job_events", job, file] if file.ends_with(".jsonl") => (*node, Some(*job)),
                _ => continue,
            };
            let bytes = self.get(&key).await?;
            for line in String::from_utf8_lossy(&bytes).lines() {
                let Ok(event) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                timeline.push(TimelineEntry {
                    timestamp: event["timestamp"].as_str().unwrap_or_default().to_owned(),
                    event_type: event["eventType"].as_str().unwrap_or_default().to_owned(),
                    node: node.to_owned(),
                    job: job.map(str::to_owned),
                    summary: summarize(&event),
                });
            }
        }
        // RFC 3339 in UTC sorts as text only at equal precision: order by the parsed time.
        timeline.sort_by_key(|e| {
            e.timestamp
                .parse::<jiff::Timestamp>()
                .map(|t| t.as_nanosecond())
                .unwrap_or_default()
        });
        Ok(timeline)
    }

    /// The session's log files, as `<node>/<path>`.
    pub async fn log_files(&self, session: &SessionEntry) -> Result<Vec<String>, ReadError> {
        let prefix = format!(
            "{}/{}",
            session.identity().history_prefix(),
            session.session
        );
        Ok(self
            .keys(&prefix)
            .await?
            .iter()
            .filter_map(|k| {
                let relative = k.strip_prefix(&format!("{prefix}/"))?;
                let (node, rest) = relative.split_once('/')?;
                let path = rest.strip_prefix("logs/")?;
                Some(format!("{node}/{path}"))
            })
            .collect())
    }

    /// One log file, named as [`Reader::log_files`] lists it.
    pub async fn log(&self, session: &SessionEntry, file: &str) -> Result<Vec<u8>, ReadError> {
        let (node, path) = file.split_once('/').unwrap_or(("", file));
        self.get(&session.identity().log_key(&session.session, node, path))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn markers_parse_back_to_their_sessions() {
        let plain = parse_marker("cluster-metadata/raycluster/ml_c1/session_1").expect("parses");
        assert_eq!(
            (plain.namespace.as_str(), plain.cluster.as_str()),
            ("ml", "c1")
        );
        assert_eq!(plain.owner_kind, None);
        let owned = parse_marker("cluster-metadata/rayservice/ml_demo_demo-raycluster-x/session_2")
            .expect("parses");
        assert_eq!(owned.owner_name.as_deref(), Some("demo"));
        assert_eq!(owned.cluster, "demo-raycluster-x");
        let identity = owned.identity();
        assert_eq!(
            identity.session_marker("session_2"),
            "cluster-metadata/rayservice/ml_demo_demo-raycluster-x/session_2"
        );
        for bad in [
            "cluster-metadata/raycluster/ml/session_1",
            "cluster-metadata/rayjob/ml_c1/session_1",
            "cluster-history/raycluster/ml_c1/session_1",
            "cluster-metadata/other/ml_c1/session_1",
        ] {
            assert_eq!(parse_marker(bad), None, "{bad}");
        }
    }

    #[test]
    fn summaries_name_the_thing_and_its_last_state() {
        let task = json!({"eventType": "TASK_LIFECYCLE_EVENT", "taskLifecycleEvent": {
            "taskId": "ERERERE=", "jobId": "AQAAAA==",
            "stateTransitions": [{"state": "RUNNING"}, {"state": "FINISHED"}]}});
        assert_eq!(summarize(&task), "task=1111111111 -> FINISHED");
        let actor = json!({"eventType": "ACTOR_DEFINITION_EVENT", "actorDefinitionEvent": {
            "actorId": "qrs=", "className": "Counter", "jobId": "AQAAAA=="}});
        assert_eq!(summarize(&actor), "Counter actor=aabb");
    }
}
