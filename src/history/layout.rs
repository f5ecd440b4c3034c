//! Where history lives in a bucket: KubeRay v1.7's layout, so KubeRay's history server reads
//! what raypipe's collector writes. Every key is relative to the storage root
//! (`STORAGE_ROOT_DIR`):
//!
//! - `cluster-history/raycluster/<ns>/<cluster>/<session>/<node>/…` for a RayCluster, and
//!   `cluster-history/<rayjob|rayservice>/<ns>/<owner>/<cluster>/<session>/<node>/…` for one a
//!   RayJob or RayService made; under a node: `node_events/`, `job_events/<job>/` and `logs/`;
//! - `cluster-metadata/raycluster/<ns>_<cluster>/<session>` (or
//!   `cluster-metadata/<kind>/<ns>_<owner>_<cluster>/<session>`), an empty object whose presence
//!   lists the session.

use std::fmt;

/// Which cluster the collector serves, and who made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterIdentity {
    pub namespace: String,
    pub cluster: String,
    /// `RayJob` / `RayService` (any case) and its name, when one made the cluster.
    pub owner: Option<(String, String)>,
}

/// Events of one node are filed by category: node-level events, or those of one job.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    Node,
    Job(String),
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Category::Node => f.write_str("node_events"),
            Category::Job(job) => write!(f, "job_events/{job}"),
        }
    }
}

impl ClusterIdentity {
    /// `cluster-history/…/<cluster>`: the prefix of everything of this cluster.
    pub fn history_prefix(&self) -> String {
        match &self.owner {
            None => format!(
                "cluster-history/raycluster/{}/{}",
                self.namespace, self.cluster
            ),
            Some((kind, name)) => format!(
                "cluster-history/{}/{}/{name}/{}",
                kind.to_lowercase(),
                self.namespace,
                self.cluster
            ),
        }
    }

    /// The marker that lists `session` for this cluster.
    pub fn session_marker(&self, session: &str) -> String {
        match &self.owner {
            None => format!(
                "cluster-metadata/raycluster/{}_{}/{session}",
                self.namespace, self.cluster
            ),
            Some((kind, name)) => format!(
                "cluster-metadata/{}/{}_{name}_{}/{session}",
                kind.to_lowercase(),
                self.namespace,
                self.cluster
            ),
        }
    }

    /// The directory of one event file: `<prefix>/<session>/<node>/<category>`.
    pub fn events_dir(&self, session: &str, node: &str, category: &Category) -> String {
        format!("{}/{session}/{node}/{category}", self.history_prefix())
    }

    /// Where a log file (path relative to the session's `logs/`) goes.
    pub fn log_key(&self, session: &str, node: &str, relative: &str) -> String {
        format!("{}/{session}/{node}/logs/{relative}", self.history_prefix())
    }
}

/// An event file's name: `<node>-<YYYY-MM-DD-HH>-<unix nanos>.jsonl`, the hour in UTC. KubeRay's
/// history server picks event files by this shape.
pub fn event_file_name(node: &str, created: jiff::Timestamp) -> String {
    let hour = created.strftime("%Y-%m-%d-%H");
    format!("{node}-{hour}-{}.jsonl", created.as_nanosecond())
}

/// A session name Ray writes (`session_<date>_<time>_<usec>_<pid>`) is a safe path part; this
/// refuses anything that could leave its directory.
pub fn is_safe_part(part: &str) -> bool {
    !part.is_empty()
        && part != "."
        && part != ".."
        && part.len() <= 200
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(owner: Option<(&str, &str)>) -> ClusterIdentity {
        ClusterIdentity {
            namespace: "ml".into(),
            cluster: "demo-raycluster-x1".into(),
            owner: owner.map(|(k, n)| (k.into(), n.into())),
        }
    }

    #[test]
    fn keys_follow_kuberays_layout() {
        let plain = cluster(None);
        assert_eq!(
            plain.events_dir("session_1", "ab12", &Category::Node),
            "cluster-history/raycluster/ml/demo-raycluster-x1/session_1/ab12/node_events"
        );
        assert_eq!(
            plain.session_marker("session_1"),
            "cluster-metadata/raycluster/ml_demo-raycluster-x1/session_1"
        );
        let owned = cluster(Some(("RayService", "demo")));
        assert_eq!(
            owned.events_dir("session_1", "ab12", &Category::Job("01000000".into())),
            "cluster-history/rayservice/ml/demo/demo-raycluster-x1/session_1/ab12/job_events/01000000"
        );
        assert_eq!(
            owned.session_marker("session_1"),
            "cluster-metadata/rayservice/ml_demo_demo-raycluster-x1/session_1"
        );
        assert_eq!(
            owned.log_key("session_1", "ab12", "raylet.out"),
            "cluster-history/rayservice/ml/demo/demo-raycluster-x1/session_1/ab12/logs/raylet.out"
        );
    }

    #[test]
    fn event_file_names_carry_the_hour_and_match_kuberays_pattern() {
        let at: jiff::Timestamp = "2026-11-29T07:06:40.5Z".parse().expect("time");
        let name = event_file_name("ab12", at);
        assert_eq!(name, "ab12-2026-11-29-07-1795936000500000000.jsonl");
    }

    #[test]
    fn unsafe_path_parts_are_refused() {
        for bad in ["", ".", "..", "a/b", "a\\b", "session 1", "é"] {
            assert!(!is_safe_part(bad), "{bad:?}");
        }
        assert!(is_safe_part("session_2026-11-29_07-00-00_123456_4242"));
    }
}
