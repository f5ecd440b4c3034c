//! Sending to the object store: the spool's ready files (each uploaded whole under its key,
//! then deleted, so a retried upload rewrites the same object and nothing is duplicated), and
//! the session logs Ray writes under its temp root.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::layout::ClusterIdentity;
use super::spool::files_under;

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("uploading {key}: {message}")]
    Upload { key: String, message: String },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The store and the root every key is under (`STORAGE_ROOT_DIR`).
#[derive(Clone)]
pub struct Sink {
    store: Arc<dyn ObjectStore>,
    root: String,
}

impl Sink {
    pub fn new(store: Arc<dyn ObjectStore>, root: &str) -> Sink {
        Sink {
            store,
            root: root.trim_matches('/').to_owned(),
        }
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The full key of `relative`.
    pub fn key(&self, relative: &str) -> object_store::path::Path {
        if self.root.is_empty() {
            object_store::path::Path::from(relative)
        } else {
            object_store::path::Path::from(format!("{}/{relative}", self.root))
        }
    }

    async fn put_file(&self, relative: &str, path: &Path) -> Result<u64, SinkError> {
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|source| SinkError::Read {
                path: path.to_owned(),
                source,
            })?;
        let len = bytes.len() as u64;
        self.store
            .put(&self.key(relative), PutPayload::from(bytes))
            .await
            .map_err(|e| SinkError::Upload {
                key: relative.to_owned(),
                message: e.to_string(),
            })?;
        Ok(len)
    }

    /// Uploads every ready file, oldest first, deleting each once stored; stops at the first
    /// failure (the sink is down: the rest waits for the next pass). How many were sent.
    pub async fn upload_ready(&self, ready: &Path, held: &AtomicU64) -> Result<usize, SinkError> {
        let keys = files_under(ready).map_err(|source| SinkError::Read {
            path: ready.to_owned(),
            source,
        })?;
        let mut sent = 0;
        for key in keys {
            let path = ready.join(&key);
            let len = self.put_file(&key, &path).await?;
            // Gone already only if a second uploader raced us; either way it is stored.
            let _ = tokio::fs::remove_file(&path).await;
            let _ = held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                Some(h.saturating_sub(len))
            });
            sent += 1;
        }
        Ok(sent)
    }
}

/// Ships the files under each session's `logs/` as they change (size or modification time), so
/// a session's logs outlive its Pod even if the collector is killed.
pub struct LogShipper {
    tmp_root: PathBuf,
    sent: HashMap<PathBuf, (u64, SystemTime)>,
}

impl LogShipper {
    pub fn new(tmp_root: PathBuf) -> Self {
        LogShipper {
            tmp_root,
            sent: HashMap::new(),
        }
    }

    /// The session directories under the temp root (`session_latest` is a link to one of them).
    pub fn session_names(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.tmp_root) else {
            return Vec::new();
        };
        let mut sessions: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| name.starts_with("session_") && super::layout::is_safe_part(name))
            .collect();
        sessions.sort();
        sessions
    }

    /// One pass: uploads what changed since the last; how many files. `node_of` names the node
    /// a session's logs are filed under.
    pub async fn ship(
        &mut self,
        sink: &Sink,
        identity: &ClusterIdentity,
        node_of: impl Fn(&str) -> String,
    ) -> Result<usize, SinkError> {
        let mut shipped = 0;
        for session in self.session_names() {
            let logs = self.tmp_root.join(&session).join("logs");
            let files = files_under(&logs).map_err(|source| SinkError::Read {
                path: logs.clone(),
                source,
            })?;
            let node = node_of(&session);
            for relative in files {
                let path = logs.join(&relative);
                let Ok(meta) = std::fs::metadata(&path) else {
                    continue;
                };
                let stamp = (
                    meta.len(),
                    meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                );
                if self.sent.get(&path) == Some(&stamp) {
                    continue;
                }
                sink.put_file(&identity.log_key(&session, &node, &relative), &path)
                    .await?;
                self.sent.insert(path, stamp);
                shipped += 1;
            }
        }
        Ok(shipped)
    }
}
