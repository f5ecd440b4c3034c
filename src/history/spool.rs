//! The collector's local spool: events are appended to JSONL files on the Pod's disk before any
//! upload, so a sink that is down or slow loses nothing. A file is open per (session, node,
//! category), so events of two sessions interleaving never split each other's files; a file is
//! closed ("ready") when it is old or large enough, and the uploader takes it from there.
//!
//! On disk, `active/<key>` is being written and `ready/<key>` waits for upload, where `<key>`
//! is the object's key under the storage root: a restart moves what was active to ready, so a
//! crash loses at most what the kernel had not written.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::event::Event;
use super::layout::{Category, ClusterIdentity, event_file_name};

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("the spool holds {held} bytes, at its cap of {cap}: waiting for uploads")]
    Full { held: u64, cap: u64 },
    #[error("spool file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Limits of the spool.
#[derive(Clone, Debug)]
pub struct SpoolConfig {
    pub dir: PathBuf,
    /// A file is closed for upload this long after it was opened.
    pub rotate_after: Duration,
    /// … or once it holds this many bytes.
    pub max_file_bytes: u64,
    /// New events are refused (503, Ray retries) while the spool holds this many bytes.
    pub max_disk_bytes: u64,
}

/// What one batch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Filed {
    pub written: usize,
    pub duplicates: usize,
}

struct ActiveFile {
    key: String,
    file: std::fs::File,
    opened: Instant,
    bytes: u64,
}

type FileKey = (String, String, Category);

/// Event ids seen lately, to drop the copies Ray sends when an answer came after its timeout.
struct RecentIds {
    order: VecDeque<String>,
    set: HashSet<String>,
    capacity: usize,
}

impl RecentIds {
    fn new(capacity: usize) -> Self {
        RecentIds {
            order: VecDeque::new(),
            set: HashSet::new(),
            capacity,
        }
    }

    /// `false` when `id` was seen already.
    fn insert(&mut self, id: &str) -> bool {
        if self.set.contains(id) {
            return false;
        }
        if self.order.len() == self.capacity
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        self.order.push_back(id.to_owned());
        self.set.insert(id.to_owned());
        true
    }
}

pub struct Spool {
    config: SpoolConfig,
    identity: ClusterIdentity,
    /// Files events go to when they name no node (older Rays).
    fallback_node: String,
    active: BTreeMap<FileKey, ActiveFile>,
    recent: RecentIds,
    marked: BTreeSet<String>,
    /// The node each session's events came from first: where that session's logs are filed.
    nodes: BTreeMap<String, String>,
    /// Bytes in `active/` and `ready/`, shared with the uploader, which subtracts what it sent.
    held: Arc<AtomicU64>,
}

impl Spool {
    /// Opens the spool in `config.dir`; what a previous run left active is made ready.
    pub fn open(
        config: SpoolConfig,
        identity: ClusterIdentity,
        fallback_node: String,
    ) -> Result<Spool, SpoolError> {
        let active = config.dir.join("active");
        let ready = config.dir.join("ready");
        for dir in [&active, &ready] {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        for key in files_under(&active).map_err(io(&active))? {
            move_file(&active.join(&key), &ready.join(&key))?;
        }
        let held = files_under(&ready)
            .map_err(io(&ready))?
            .iter()
            .filter_map(|key| std::fs::metadata(ready.join(key)).ok())
            .map(|m| m.len())
            .sum();
        Ok(Spool {
            config,
            identity,
            fallback_node,
            active: BTreeMap::new(),
            recent: RecentIds::new(100_000),
            marked: BTreeSet::new(),
            nodes: BTreeMap::new(),
            held: Arc::new(AtomicU64::new(held)),
        })
    }

    /// The byte count the uploader lowers as it sends files.
    pub fn held(&self) -> Arc<AtomicU64> {
        self.held.clone()
    }

    pub fn ready_dir(&self) -> PathBuf {
        self.config.dir.join("ready")
    }

    /// The node whose logs `session` are filed under.
    pub fn node_of(&self, session: &str) -> String {
        self.nodes
            .get(session)
            .or_else(|| self.nodes.values().next_back())
            .cloned()
            .unwrap_or_else(|| self.fallback_node.clone())
    }

    /// Appends a batch, each event to its file, and flushes; refused whole while the spool is
    /// at its cap, so Ray keeps the batch and sends it again.
    pub fn accept(&mut self, events: Vec<Event>) -> Result<Filed, SpoolError> {
        let held = self.held.load(Ordering::Relaxed);
        if held >= self.config.max_disk_bytes {
            return Err(SpoolError::Full {
                held,
                cap: self.config.max_disk_bytes,
            });
        }
        let mut filed = Filed::default();
        let mut touched = BTreeSet::new();
        for event in events {
            if let Some(id) = &event.id
                && !self.recent.insert(id)
            {
                filed.duplicates += 1;
                continue;
            }
            let node = event
                .node
                .clone()
                .unwrap_or_else(|| self.fallback_node.clone());
            self.nodes
                .entry(event.session.clone())
                .or_insert_with(|| node.clone());
            self.mark_session(&event.session)?;
            let key = (event.session.clone(), node, event.category.clone());
            let active_dir = self.config.dir.join("active");
            let file = self.file_for(&key)?;
            let mut line = event.line.into_bytes();
            line.push(b'\n');
            let path = active_dir.join(&file.key);
            file.file.write_all(&line).map_err(io(&path))?;
            file.bytes += line.len() as u64;
            self.held.fetch_add(line.len() as u64, Ordering::Relaxed);
            filed.written += 1;
            touched.insert(key);
        }
        for key in touched {
            let Some(file) = self.active.get_mut(&key) else {
                continue;
            };
            let path = self.config.dir.join("active").join(&file.key);
            file.file.flush().map_err(io(&path))?;
            if file.bytes >= self.config.max_file_bytes {
                self.close(&key)?;
            }
        }
        Ok(filed)
    }

    /// Closes the files opened at least `rotate_after` ago; how many.
    pub fn rotate_due(&mut self) -> Result<usize, SpoolError> {
        let due: Vec<FileKey> = self
            .active
            .iter()
            .filter(|(_, f)| f.opened.elapsed() >= self.config.rotate_after)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &due {
            self.close(key)?;
        }
        Ok(due.len())
    }

    /// Closes every open file (shutdown).
    pub fn rotate_all(&mut self) -> Result<usize, SpoolError> {
        let all: Vec<FileKey> = self.active.keys().cloned().collect();
        for key in &all {
            self.close(key)?;
        }
        Ok(all.len())
    }

    /// The session's marker goes out with the first event of the session (not at shutdown), so
    /// a collector that dies still leaves the session listed.
    fn mark_session(&mut self, session: &str) -> Result<(), SpoolError> {
        if self.marked.contains(session) {
            return Ok(());
        }
        let path = self.ready_dir().join(self.identity.session_marker(session));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, b"").map_err(io(&path))?;
        self.marked.insert(session.to_owned());
        Ok(())
    }

    fn file_for(&mut self, key: &FileKey) -> Result<&mut ActiveFile, SpoolError> {
        if !self.active.contains_key(key) {
            let (session, node, category) = key;
            // Unique even for two files of one key opened in the same nanosecond.
            let mut now = jiff::Timestamp::now();
            let dir = self.identity.events_dir(session, node, category);
            let mut object_key = format!("{dir}/{}", event_file_name(node, now));
            while self.config.dir.join("active").join(&object_key).exists()
                || self.ready_dir().join(&object_key).exists()
            {
                now = now
                    .checked_add(jiff::SignedDuration::from_nanos(1))
                    .unwrap_or(now);
                object_key = format!("{dir}/{}", event_file_name(node, now));
            }
            let path = self.config.dir.join("active").join(&object_key);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            let file = std::fs::OpenOptions::new()
                .create_new(true)
                .append(true)
                .open(&path)
                .map_err(io(&path))?;
            self.active.insert(
                key.clone(),
                ActiveFile {
                    key: object_key,
                    file,
                    opened: Instant::now(),
                    bytes: 0,
                },
            );
        }
        Ok(self.active.get_mut(key).expect("inserted above"))
    }

    fn close(&mut self, key: &FileKey) -> Result<(), SpoolError> {
        let Some(file) = self.active.remove(key) else {
            return Ok(());
        };
        let from = self.config.dir.join("active").join(&file.key);
        file.file.sync_data().map_err(io(&from))?;
        drop(file.file);
        move_file(&from, &self.ready_dir().join(&file.key))
    }
}

fn move_file(from: &Path, to: &Path) -> Result<(), SpoolError> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    std::fs::rename(from, to).map_err(io(from))
}

/// Every regular file under `root`, as a `/`-joined path relative to it, sorted (oldest event
/// files first, since their names carry their creation time after the same prefix).
pub fn files_under(root: &Path) -> std::io::Result<Vec<String>> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                pending.push(entry.path());
            } else if kind.is_file()
                && let Ok(relative) = entry.path().strip_prefix(root)
            {
                let parts: Vec<String> = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                found.push(parts.join("/"));
            }
        }
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::event::parse_batch;
    use serde_json::json;

    fn identity() -> ClusterIdentity {
        ClusterIdentity {
            namespace: "ml".into(),
            cluster: "c1".into(),
            owner: None,
        }
    }

    fn config(dir: &Path) -> SpoolConfig {
        SpoolConfig {
            dir: dir.to_owned(),
            rotate_after: Duration::from_secs(300),
            max_file_bytes: 1 << 20,
            max_disk_bytes: 1 << 30,
        }
    }

    fn events(session: &str, ids: &[&str]) -> Vec<Event> {
        let batch: Vec<serde_json::Value> = ids
            .iter()
            .map(|id| {
                json!({"eventId": id, "eventType": "NODE_LIFECYCLE_EVENT", "nodeId": "q6urqw==",
                       "timestamp": "2026-11-29T07:06:40Z", "sessionName": session})
            })
            .collect();
        parse_batch(json!(batch).to_string().as_bytes())
            .expect("array")
            .into_iter()
            .map(|e| e.expect("valid"))
            .collect()
    }

    #[test]
    fn interleaved_sessions_keep_their_own_files_and_duplicates_are_dropped() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut spool =
            Spool::open(config(dir.path()), identity(), "fallback".into()).expect("open");
        let mut batch = events("session_a", &["1", "2"]);
        batch.extend(events("session_b", &["3"]));
        batch.extend(events("session_a", &["4", "1"]));
        assert_eq!(
            spool.accept(batch).expect("filed"),
            Filed {
                written: 4,
                duplicates: 1
            }
        );
        assert_eq!(spool.rotate_all().expect("rotated"), 2);
        let ready = files_under(&spool.ready_dir()).expect("list");
        let a: Vec<&String> = ready
            .iter()
            .filter(|k| k.contains("/session_a/abababab/node_events/abababab-"))
            .collect();
        let b: Vec<&String> = ready.iter().filter(|k| k.contains("/session_b/")).collect();
        assert_eq!((a.len(), b.len()), (1, 1), "{ready:?}");
        let lines = std::fs::read_to_string(spool.ready_dir().join(a[0])).expect("read");
        let ids: Vec<String> = lines
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).expect("JSON")["eventId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        assert_eq!(ids, ["1", "2", "4"]);
        // Each session is listed as soon as its first event arrived.
        assert!(ready.contains(&"cluster-metadata/raycluster/ml_c1/session_a".to_owned()));
        assert!(ready.contains(&"cluster-metadata/raycluster/ml_c1/session_b".to_owned()));
        assert_eq!(spool.node_of("session_b"), "abababab");
    }

    #[test]
    fn a_restart_makes_active_files_ready_and_a_full_spool_refuses() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut small = config(dir.path());
        small.max_disk_bytes = 10;
        {
            let mut spool = Spool::open(small.clone(), identity(), "n".into()).expect("open");
            spool.accept(events("session_a", &["1"])).expect("filed");
            // Not rotated: the process "dies" here.
        }
        let mut spool = Spool::open(small, identity(), "n".into()).expect("reopen");
        let ready = files_under(&spool.ready_dir()).expect("list");
        assert!(ready.iter().any(|k| k.ends_with(".jsonl")), "{ready:?}");
        assert!(
            files_under(&dir.path().join("active"))
                .expect("list")
                .is_empty()
        );
        match spool.accept(events("session_a", &["2"])) {
            Err(SpoolError::Full { cap: 10, .. }) => {}
            other => panic!("expected Full, got {other:?}"),
        }
    }

    #[test]
    fn files_close_when_large_or_old() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut tiny = config(dir.path());
        tiny.max_file_bytes = 1;
        let mut spool = Spool::open(tiny, identity(), "n".into()).expect("open");
        spool.accept(events("session_a", &["1"])).expect("filed");
        spool.accept(events("session_a", &["2"])).expect("filed");
        let events_ready = |spool: &Spool| {
            files_under(&spool.ready_dir())
                .expect("list")
                .into_iter()
                .filter(|k| k.ends_with(".jsonl"))
                .count()
        };
        assert_eq!(events_ready(&spool), 2, "each file closed at its size cap");

        let mut aged = config(dir.path());
        aged.rotate_after = Duration::ZERO;
        let mut spool = Spool::open(aged, identity(), "n".into()).expect("open");
        spool.accept(events("session_a", &["3"])).expect("filed");
        assert_eq!(spool.rotate_due().expect("rotate"), 1);
        assert_eq!(events_ready(&spool), 3);
    }
}
