//! The code layers the operator serves to Ray (issue 31), by digest: `GET
//! /packages/code-<sha256 hex>.zip` on the package server, the URI the rendered `runtime_env`
//! names.
//!
//! Only verified bytes go in (their sha256 must be the key), and the bytes held are bounded
//! by an operator-wide budget (`--code-memory-budget`): inserting past it drops the least
//! recently used layers' bytes. A layer is not forgotten when its bytes are dropped, or when
//! the operator restarts: the ServePipeline controller registers, for every code layer its
//! RayServices name, a [`CodeLoader`] that pulls it again by its pinned manifest digest (with
//! the pipeline's credentials and signature key). A Ray node asking for a layer whose bytes
//! are not held waits for that pull; a layer nobody registered is a 404, so the package server
//! never pulls anything a pipeline does not use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};

/// Default `--code-memory-budget`.
pub const DEFAULT_CODE_MEMORY_BUDGET: u64 = 128 * 1024 * 1024;
/// Longest a Ray node's request waits for a layer being pulled again.
pub const LOAD_WAIT: Duration = Duration::from_secs(120);

/// Pulls one code layer again (its sha256 is checked by the store).
pub trait CodeLoader: Send + Sync {
    fn load(&self) -> BoxFuture<'static, Result<Bytes, String>>;
}

/// Why a layer was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the code layer is {size} bytes, more than the operator's code memory budget of {budget} \
         bytes (--code-memory-budget)"
    )]
    LargerThanBudget { size: u64, budget: u64 },
    #[error("the bytes have digest sha256:{actual}, not sha256:{expected}")]
    DigestMismatch { expected: String, actual: String },
    #[error("{0:?} is not a sha256 hex digest")]
    InvalidDigest(String),
}

#[derive(Default)]
struct Slot {
    bytes: Option<Bytes>,
    last_used: u64,
    loader: Option<Arc<dyn CodeLoader>>,
    /// A pull in flight: done when the sender drops or sends.
    loading: Option<tokio::sync::watch::Receiver<bool>>,
    last_error: Option<String>,
}

#[derive(Default)]
struct Inner {
    slots: HashMap<String, Slot>,
    held: u64,
    clock: u64,
}

/// Operator-wide; clones share it.
#[derive(Clone)]
pub struct CodeStore {
    inner: Arc<Mutex<Inner>>,
    budget: u64,
}

impl Default for CodeStore {
    fn default() -> Self {
        CodeStore::new(DEFAULT_CODE_MEMORY_BUDGET)
    }
}

impl std::fmt::Debug for CodeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (layers, held) = self.with(|inner| (inner.slots.len(), inner.held));
        f.debug_struct("CodeStore")
            .field("budget", &self.budget)
            .field("layers", &layers)
            .field("held", &held)
            .finish()
    }
}

/// The file name a layer is served under.
pub fn file_name(hex: &str) -> String {
    format!("code-{hex}.zip")
}

/// The URI of a layer under `base_url` (the package server, as Ray nodes reach it).
pub fn uri(base_url: &str, hex: &str) -> String {
    format!("{}/{}", base_url.trim_end_matches('/'), file_name(hex))
}

/// The digest a served file name stands for (`code-<64 hex>.zip`).
pub fn digest_of_file_name(file: &str) -> Option<&str> {
    let hex = file.strip_prefix("code-")?.strip_suffix(".zip")?;
    is_hex_digest(hex).then_some(hex)
}

/// The layer digests among `uris` (those that name a served code layer).
pub fn digests_in<'a>(uris: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    uris.into_iter()
        .filter_map(|uri| digest_of_file_name(uri.rsplit('/').next()?))
        .map(str::to_owned)
        .collect()
}

fn is_hex_digest(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl CodeStore {
    pub fn new(budget: u64) -> CodeStore {
        CodeStore {
            inner: Arc::new(Mutex::new(Inner::default())),
            budget,
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        // A poisoned lock only means another thread panicked mid-update of plain data.
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut inner)
    }

    /// Whether `size` bytes could ever be held.
    pub fn admits(&self, size: u64) -> Result<(), StoreError> {
        if size > self.budget {
            return Err(StoreError::LargerThanBudget {
                size,
                budget: self.budget,
            });
        }
        Ok(())
    }

    /// Takes verified bytes of layer `hex`, dropping the least recently used other layers'
    /// bytes while the budget would be exceeded.
    pub fn insert(&self, hex: &str, bytes: Bytes) -> Result<(), StoreError> {
        if !is_hex_digest(hex) {
            return Err(StoreError::InvalidDigest(hex.chars().take(80).collect()));
        }
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != hex {
            return Err(StoreError::DigestMismatch {
                expected: hex.to_owned(),
                actual,
            });
        }
        let size = bytes.len() as u64;
        self.admits(size)?;
        self.with(|inner| {
            if inner.slots.get(hex).is_some_and(|s| s.bytes.is_some()) {
                touch(inner, hex);
                return;
            }
            while inner.held + size > self.budget {
                let victim = inner
                    .slots
                    .iter()
                    .filter(|(key, slot)| slot.bytes.is_some() && key.as_str() != hex)
                    .min_by_key(|(_, slot)| slot.last_used)
                    .map(|(key, _)| key.clone());
                let Some(victim) = victim else { break };
                if let Some(dropped) = inner.slots.get_mut(&victim).and_then(|s| s.bytes.take()) {
                    inner.held -= dropped.len() as u64;
                    tracing::info!(layer = %victim, bytes = dropped.len(), "code layer dropped from memory (pulled again when asked for)");
                }
            }
            inner.held += size;
            let slot = inner.slots.entry(hex.to_owned()).or_default();
            slot.bytes = Some(bytes);
            slot.last_error = None;
            touch(inner, hex);
        });
        Ok(())
    }

    /// Remembers how to pull layer `hex` again (the newest registration wins).
    pub fn register(&self, hex: &str, loader: Arc<dyn CodeLoader>) {
        if !is_hex_digest(hex) {
            return;
        }
        self.with(|inner| {
            inner.slots.entry(hex.to_owned()).or_default().loader = Some(loader);
        });
    }

    /// Whether the bytes of layer `hex` are held now.
    pub fn holds(&self, hex: &str) -> bool {
        self.with(|inner| inner.slots.get(hex).is_some_and(|s| s.bytes.is_some()))
    }

    /// Whether layer `hex` is known (held or registered).
    pub fn knows(&self, hex: &str) -> bool {
        self.with(|inner| inner.slots.contains_key(hex))
    }

    /// Bytes held in all.
    pub fn held_bytes(&self) -> u64 {
        self.with(|inner| inner.held)
    }

    /// The last failure to pull layer `hex` again, if its bytes are still missing.
    pub fn last_error(&self, hex: &str) -> Option<String> {
        self.with(|inner| inner.slots.get(hex).and_then(|s| s.last_error.clone()))
    }

    /// The bytes of layer `hex` when held.
    pub fn get(&self, hex: &str) -> Option<Bytes> {
        self.with(|inner| {
            let bytes = inner.slots.get(hex)?.bytes.clone()?;
            touch(inner, hex);
            Some(bytes)
        })
    }

    /// Starts pulling layer `hex` again when its bytes are missing and a loader is registered
    /// (at most one pull per layer at a time); returns what to wait on, if anything.
    pub fn ensure(&self, hex: &str) -> Option<tokio::sync::watch::Receiver<bool>> {
        enum Next {
            Wait(tokio::sync::watch::Receiver<bool>),
            Start(Arc<dyn CodeLoader>, tokio::sync::watch::Sender<bool>),
        }
        let next = self.with(|inner| {
            let slot = inner.slots.get_mut(hex)?;
            if slot.bytes.is_some() {
                return None;
            }
            if let Some(loading) = &slot.loading {
                return Some(Next::Wait(loading.clone()));
            }
            let loader = slot.loader.clone()?;
            let (tx, rx) = tokio::sync::watch::channel(false);
            slot.loading = Some(rx);
            Some(Next::Start(loader, tx))
        })?;
        let (loader, tx) = match next {
            Next::Wait(rx) => return Some(rx),
            Next::Start(loader, tx) => (loader, tx),
        };
        let rx = tx.subscribe();
        let store = self.clone();
        let hex = hex.to_owned();
        tokio::spawn(async move {
            let outcome = match loader.load().await {
                Ok(bytes) => store.insert(&hex, bytes).map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            if let Err(problem) = &outcome {
                tracing::warn!(layer = %hex, error = %problem, "pulling a code layer again failed");
            }
            store.with(|inner| {
                if let Some(slot) = inner.slots.get_mut(&hex) {
                    slot.loading = None;
                    slot.last_error = outcome.err();
                }
            });
            let _ = tx.send(true);
        });
        Some(rx)
    }

    /// The bytes of layer `hex`: held, or pulled again (waiting up to `wait`); `None` for a
    /// layer nobody registered, or one that could not be pulled in time.
    pub async fn fetch(&self, hex: &str, wait: Duration) -> Option<Bytes> {
        if let Some(bytes) = self.get(hex) {
            return Some(bytes);
        }
        let Some(mut done) = self.ensure(hex) else {
            return self.get(hex);
        };
        let _ = tokio::time::timeout(wait, done.wait_for(|finished| *finished)).await;
        self.get(hex)
    }
}

fn touch(inner: &mut Inner, hex: &str) {
    inner.clock += 1;
    let now = inner.clock;
    if let Some(slot) = inner.slots.get_mut(hex) {
        slot.last_used = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn digest(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    struct Counting {
        bytes: Bytes,
        calls: Arc<AtomicUsize>,
    }

    impl CodeLoader for Counting {
        fn load(&self) -> BoxFuture<'static, Result<Bytes, String>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let bytes = self.bytes.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(bytes)
            })
        }
    }

    #[test]
    fn only_bytes_with_the_right_digest_go_in() {
        let store = CodeStore::new(100);
        let a = Bytes::from_static(b"layer a");
        assert!(matches!(
            store.insert(&digest(b"other"), a.clone()),
            Err(StoreError::DigestMismatch { .. })
        ));
        assert!(store.insert("not-hex", a.clone()).is_err());
        store.insert(&digest(b"layer a"), a.clone()).expect("fits");
        assert_eq!(store.get(&digest(b"layer a")), Some(a));
        assert_eq!(store.held_bytes(), 7);
    }

    #[test]
    fn the_budget_drops_the_least_recently_used_bytes_and_refuses_what_never_fits() {
        let store = CodeStore::new(20);
        let (a, b, c) = (
            Bytes::from(vec![1u8; 8]),
            Bytes::from(vec![2u8; 8]),
            Bytes::from(vec![3u8; 8]),
        );
        store.insert(&digest(&a), a.clone()).unwrap();
        store.insert(&digest(&b), b.clone()).unwrap();
        // `a` used after `b`: `b` is the least recently used.
        store.get(&digest(&a));
        store.insert(&digest(&c), c.clone()).unwrap();
        assert!(store.holds(&digest(&a)) && store.holds(&digest(&c)));
        assert!(!store.holds(&digest(&b)) && store.knows(&digest(&b)));
        assert_eq!(store.held_bytes(), 16);
        let big = Bytes::from(vec![4u8; 21]);
        assert!(matches!(
            store.insert(&digest(&big), big),
            Err(StoreError::LargerThanBudget {
                size: 21,
                budget: 20
            })
        ));
    }

    #[tokio::test]
    async fn a_registered_layer_is_pulled_again_once_for_concurrent_askers() {
        let store = CodeStore::new(100);
        let bytes = Bytes::from_static(b"the code");
        let hex = digest(&bytes);
        assert_eq!(
            store.fetch(&hex, Duration::from_secs(1)).await,
            None,
            "unknown: nothing"
        );
        let calls = Arc::new(AtomicUsize::new(0));
        store.register(
            &hex,
            Arc::new(Counting {
                bytes: bytes.clone(),
                calls: calls.clone(),
            }),
        );
        let (x, y) = tokio::join!(
            store.fetch(&hex, Duration::from_secs(5)),
            store.fetch(&hex, Duration::from_secs(5))
        );
        assert_eq!((x, y), (Some(bytes.clone()), Some(bytes)));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_loader_that_brings_other_bytes_is_not_believed() {
        let store = CodeStore::new(100);
        let hex = digest(b"expected");
        let calls = Arc::new(AtomicUsize::new(0));
        store.register(
            &hex,
            Arc::new(Counting {
                bytes: Bytes::from_static(b"tampered"),
                calls,
            }),
        );
        assert_eq!(store.fetch(&hex, Duration::from_secs(5)).await, None);
        assert!(store.last_error(&hex).is_some_and(|e| e.contains("digest")));
    }

    #[test]
    fn file_names_carry_the_digest() {
        let hex = digest(b"x");
        assert_eq!(digest_of_file_name(&file_name(&hex)), Some(hex.as_str()));
        assert_eq!(digest_of_file_name("code-abc.zip"), None);
        assert_eq!(digest_of_file_name("raypipe_runtime-0123.zip"), None);
        let uris = [
            "http://op:8080/packages/raypipe_runtime-0123456789abcdef.zip".to_owned(),
            uri("http://op:8080/packages/", &hex),
        ];
        assert_eq!(digests_in(uris.iter().map(String::as_str)), vec![hex]);
    }
}
