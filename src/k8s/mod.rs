//! Kubernetes helpers shared by every controller: server-side apply under fixed field managers,
//! owner references, labels, stable hashing, events.

use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

/// Label on every object raypipe creates.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "raypipe";
/// Label naming the ServePipeline an object belongs to.
pub const LABEL_PIPELINE: &str = "raypipe.dev/pipeline";
/// Annotation holding the hash of what raypipe last applied, so an unchanged desired state
/// costs no API write.
pub const ANNOTATION_APPLIED_HASH: &str = "raypipe.dev/applied-hash";
/// Annotation with the digest of the graph a RayService serves.
pub const ANNOTATION_GRAPH_DIGEST: &str = "raypipe.dev/graph-digest";

/// Field managers, one per controller, so `managedFields` tell who wrote what.
pub mod field_managers {
    pub const SERVEPIPELINE: &str = "raypipe-servepipeline";
    pub const RAYCLUSTER: &str = "raypipe-raycluster";
    pub const RAYSERVICE: &str = "raypipe-rayservice";
    pub const RAYJOB: &str = "raypipe-rayjob";
    pub const RAYCRONJOB: &str = "raypipe-raycronjob";
}

#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    #[error("{kind} {name} has no {what}")]
    MissingMetadata {
        kind: String,
        name: String,
        what: &'static str,
    },
    #[error("server-side apply of {kind} {namespace}/{name} failed: {source}")]
    Apply {
        kind: String,
        namespace: String,
        name: String,
        // Boxed: kube::Error is large, and this enum travels through every reconcile's Result.
        #[source]
        source: Box<kube::Error>,
    },
}

/// A controller owner reference to `owner`, with blockOwnerDeletion so that a foreground
/// deletion of the owner waits for its children.
pub fn controller_owner_ref<K: Resource<DynamicType = ()>>(
    owner: &K,
) -> Result<OwnerReference, K8sError> {
    let mut reference =
        owner
            .controller_owner_ref(&())
            .ok_or_else(|| K8sError::MissingMetadata {
                kind: K::kind(&()).into_owned(),
                name: owner.name_any(),
                what: "uid (it was not read from the API server)",
            })?;
    reference.block_owner_deletion = Some(true);
    Ok(reference)
}

/// A hex sha256 over the canonical JSON of `value`. serde_json orders object keys, so equal
/// values hash equal across processes and versions (unlike `DefaultHasher`).
pub fn stable_hash<T: Serialize>(value: &T) -> String {
    let json = serde_json::to_vec(&serde_json::to_value(value).unwrap_or(serde_json::Value::Null))
        .unwrap_or_default();
    hex::encode(Sha256::digest(&json))
}

/// Server-side applies `obj` (force: these fields are ours) under `field_manager`.
pub async fn apply<K>(api: &Api<K>, obj: &K, field_manager: &str) -> Result<K, K8sError>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
{
    let name = obj.name_any();
    api.patch(
        &name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(obj),
    )
    .await
    .map_err(|source| K8sError::Apply {
        kind: K::kind(&()).into_owned(),
        namespace: obj.namespace().unwrap_or_default(),
        name,
        source: Box::new(source),
    })
}

/// An event recorder for one controller.
pub fn recorder(client: kube::Client, controller: &str) -> Recorder {
    let reporter = Reporter {
        controller: controller.to_owned(),
        instance: std::env::var("POD_NAME").ok(),
    };
    Recorder::new(client, reporter)
}

/// Publishes an event; failures to publish are logged, never fatal for a reconcile.
pub async fn publish_event<K: Resource<DynamicType = ()>>(
    recorder: &Recorder,
    obj: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        // The Events API caps a note at 1 kB.
        note: Some(truncate(&note, 1000)),
        action: action.to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &obj.object_ref(&())).await {
        tracing::warn!(error = %e, reason, "publishing an event failed");
    }
}

/// Now, at the precision the API server stores metav1.Time (whole seconds): a time kept in
/// memory then compares equal to the stored copy, so an unchanged status is recognised and not
/// sent again.
pub fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    whole_seconds(k8s_openapi::jiff::Timestamp::now())
}

/// `t` truncated to whole seconds, as metav1.Time is serialized.
pub fn whole_seconds(
    t: k8s_openapi::jiff::Timestamp,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(t.as_second()).unwrap_or(t),
    )
}

/// Cuts `s` to at most `max` bytes on a char boundary, marking the cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// An API for `K` in `namespace`, or across all namespaces.
pub fn scoped_api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// A watch predicate: only the spec (generation), labels, annotations, finalizers and deletion
/// trigger a reconcile; status writes (the controller's own included) do not.
pub fn spec_or_metadata_changed<K: Resource>(obj: &K) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let meta = obj.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    Some(hasher.finish())
}

/// The backoff of every watch the controllers run, and of each controller's merged trigger
/// stream (kube pauses all of a controller's watches on an error from any one of them): 0.5 s
/// doubling to at most 5 s, back to 0.5 s with the next event. Not kube's default (0.8 s
/// doubling to 30 s with jitter up to twice that): a kube-apiserver restart makes each watch
/// fail several times in a row (refused connections, then `410 Expired` for the
/// resourceVersion it resumes from), and under the default a 10 s restart left controllers
/// blind to new objects for up to 2 minutes (the `faults` integration test measured 118 s and
/// 126 s). A watch is one request per attempt, so the short cap costs the apiserver little.
pub fn watch_backoff() -> WatchBackoff {
    WatchBackoff {
        next: WatchBackoff::INITIAL,
    }
}

/// See [`watch_backoff`].
#[derive(Clone, Debug)]
pub struct WatchBackoff {
    next: std::time::Duration,
}

impl WatchBackoff {
    pub const INITIAL: std::time::Duration = std::time::Duration::from_millis(500);
    pub const MAX: std::time::Duration = std::time::Duration::from_secs(5);
}

impl Iterator for WatchBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<std::time::Duration> {
        let wait = self.next;
        self.next = wait.saturating_mul(2).min(Self::MAX);
        Some(wait)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::INITIAL;
    }
}

/// The wait before retrying an object whose reconcile failed `failures` times in a row: 2 s,
/// 4 s, 8 s … capped at 5 minutes. Per object, so one failing object slows only itself.
pub fn failure_backoff(failures: u32) -> std::time::Duration {
    std::time::Duration::from_secs(2u64.saturating_pow(failures.clamp(1, 9)))
        .min(std::time::Duration::from_secs(300))
}

/// Five characters from Kubernetes' random-name alphabet (no vowels, no look-alikes).
pub fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    let mut value = hasher.finish();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(value % ALPHABET.len() as u64) as usize];
            value /= ALPHABET.len() as u64;
            c as char
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_hash_ignores_map_insertion_order() {
        let a = serde_json::json!({"b": 1, "a": [1, 2], "c": {"y": 1, "x": 2}});
        let mut m = serde_json::Map::new();
        m.insert("c".into(), serde_json::json!({"x": 2, "y": 1}));
        m.insert("a".into(), serde_json::json!([1, 2]));
        m.insert("b".into(), serde_json::json!(1));
        assert_eq!(stable_hash(&a), stable_hash(&serde_json::Value::Object(m)));
        assert_ne!(stable_hash(&a), stable_hash(&serde_json::json!({"b": 2})));
        assert_eq!(stable_hash(&a).len(), 64);
    }

    #[test]
    fn watch_backoff_is_capped_at_five_seconds_and_resets() {
        use kube::runtime::utils::Backoff;
        let ms = |b: &mut WatchBackoff, n: usize| -> Vec<u128> {
            b.take(n).map(|d| d.as_millis()).collect()
        };
        let mut backoff = watch_backoff();
        assert_eq!(
            ms(&mut backoff, 7),
            [500, 1000, 2000, 4000, 5000, 5000, 5000]
        );
        // Many more failures (a long outage) never wait longer.
        assert!(backoff.by_ref().take(1000).all(|d| d == WatchBackoff::MAX));
        backoff.reset();
        assert_eq!(ms(&mut backoff, 2), [500, 1000]);
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("short", 10), "short");
        let cut = truncate("ééééééééé", 8);
        assert!(cut.len() <= 8 && cut.ends_with("..."), "{cut}");
    }
}
