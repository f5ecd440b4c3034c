//! Kubernetes helpers shared by every controller: server-side apply under fixed field managers,
//! owner references, labels, stable hashing, events.
//!
//! The one rule for children: a controller writes only objects it controls (an ownerReference
//! with `controller: true` and its uid). [`apply_owned`] is how every controller writes a child;
//! an object of the same name that someone else made is reported ([`K8sError::NotOwned`]) and
//! never modified, not even by a race between our check and our write.

use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
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
pub mod events;
pub mod index;
pub mod review;

pub use events::{Clients, EventRecorder};

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
    /// An object of the name we need exists and we do not control it: left exactly as it is.
    #[error(
        "{kind} {namespace}/{name} already exists and is {}; it is left untouched (rename or delete it)",
        controller.as_deref().map_or_else(|| "not controlled by anyone".to_owned(), |c| format!("controlled by {c}"))
    )]
    NotOwned {
        kind: String,
        namespace: String,
        name: String,
        /// `Kind/name` of its controller, if it has one (never any of its content).
        controller: Option<String>,
    },
}

impl K8sError {
    /// The error is a name conflict with an object we do not own.
    pub fn is_not_owned(&self) -> bool {
        matches!(self, K8sError::NotOwned { .. })
    }

    /// For a [`K8sError::NotOwned`], the condition and event reason naming the conflict.
    pub fn conflict_reason(&self) -> Option<&'static str> {
        match self {
            K8sError::NotOwned { kind, .. } => Some(conflict_reason(kind)),
            _ => None,
        }
    }
}

/// The reason reported when an object of kind `kind` that a controller needs is someone
/// else's: `<Kind>Conflict` (KubeRay has no such reason).
pub fn conflict_reason(kind: &str) -> &'static str {
    match kind {
        "RayService" => "RayServiceConflict",
        "RayCluster" => "RayClusterConflict",
        "RayJob" => "RayJobConflict",
        "Service" => "ServiceConflict",
        "Ingress" => "IngressConflict",
        "Route" => "RouteConflict",
        "ServiceAccount" => "ServiceAccountConflict",
        "Role" => "RoleConflict",
        "RoleBinding" => "RoleBindingConflict",
        "Secret" => "SecretConflict",
        "Job" => "JobConflict",
        "Pod" => "PodConflict",
        _ => "ObjectConflict",
    }
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

/// Whether `meta` names `owner_uid` as its controller (an empty uid matches nothing).
pub fn is_controlled_by(meta: &ObjectMeta, owner_uid: &str) -> bool {
    !owner_uid.is_empty()
        && meta
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.uid == owner_uid)
}

/// `Kind/name` of the controller `meta` names, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<String> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| format!("{}/{}", o.kind, o.name))
}

/// `Ok` when `existing` is controlled by `owner_uid`, else [`K8sError::NotOwned`].
pub fn check_controlled_by<K: Resource<DynamicType = ()>>(
    existing: &K,
    owner_uid: &str,
) -> Result<(), K8sError> {
    if is_controlled_by(existing.meta(), owner_uid) {
        return Ok(());
    }
    Err(K8sError::NotOwned {
        kind: K::kind(&()).into_owned(),
        namespace: existing.namespace().unwrap_or_default(),
        name: existing.name_any(),
        controller: controller_of(existing.meta()),
    })
}

/// The uid of the controller `desired` names: the owner on whose behalf it is written.
fn desired_controller_uid<K: Resource<DynamicType = ()>>(desired: &K) -> Result<String, K8sError> {
    desired
        .meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
        .ok_or_else(|| K8sError::MissingMetadata {
            kind: K::kind(&()).into_owned(),
            name: desired.name_any(),
            what: "controller ownerReference",
        })
}

/// Writes a child `desired` (which names its controller in its ownerReferences) only if that
/// controller owns it. `existing` is what the caller already knows of the object of that name
/// (from its cache or a read it made anyway), so an apply costs no extra read:
///
/// - known and controlled by the owner: server-side apply, with `metadata.uid` set to the known
///   uid as a precondition, so an object deleted and re-made by someone else meanwhile is
///   refused by the API server instead of being taken over;
/// - known and not controlled by the owner: no request, [`K8sError::NotOwned`];
/// - not known: [`create_owned`]; if the name turns out to be ours already (the cache lagged),
///   it is applied as above.
pub async fn apply_owned<K>(
    api: &Api<K>,
    desired: &K,
    existing: Option<&ObjectMeta>,
    field_manager: &str,
) -> Result<K, K8sError>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
{
    let existing_meta = match existing {
        Some(meta) => meta.clone(),
        None => match create_owned(api, desired, field_manager).await? {
            Created::New(created) => return Ok(created),
            Created::AlreadyOurs(found) => found.meta().clone(),
        },
    };
    let owner_uid = desired_controller_uid(desired)?;
    if !is_controlled_by(&existing_meta, &owner_uid) {
        return Err(K8sError::NotOwned {
            kind: K::kind(&()).into_owned(),
            namespace: desired.namespace().unwrap_or_default(),
            name: desired.name_any(),
            controller: controller_of(&existing_meta),
        });
    }
    let mut guarded = desired.clone();
    // The API server refuses an apply whose uid differs from the stored object's (422), and
    // one with a uid when no object exists (409): either way nothing is written.
    guarded.meta_mut().uid = existing_meta.uid.clone();
    apply(api, &guarded, field_manager).await
}

/// What [`create_owned`] found or made.
#[derive(Debug)]
pub enum Created<K> {
    /// Created now.
    New(K),
    /// An object of that name exists and the owner controls it (an earlier pass made it); it
    /// was not written.
    AlreadyOurs(K),
}

/// Creates the child `desired` if its name is free; never writes an existing object. An
/// existing object is read once: ours gives [`Created::AlreadyOurs`], anyone else's
/// [`K8sError::NotOwned`]. For children made once and never updated (and the first step of
/// [`apply_owned`]).
pub async fn create_owned<K>(
    api: &Api<K>,
    desired: &K,
    field_manager: &str,
) -> Result<Created<K>, K8sError>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
{
    let owner_uid = desired_controller_uid(desired)?;
    let refused = match create_only(api, desired, field_manager).await {
        Ok(created) => return Ok(Created::New(created)),
        Err(e) if is_conflict(&e) => e,
        Err(e) => return Err(apply_error(desired, e)),
    };
    match api.get_opt(&desired.name_any()).await {
        Ok(Some(found)) if is_controlled_by(found.meta(), &owner_uid) => {
            Ok(Created::AlreadyOurs(found))
        }
        Ok(Some(found)) => Err(K8sError::NotOwned {
            kind: K::kind(&()).into_owned(),
            namespace: desired.namespace().unwrap_or_default(),
            name: desired.name_any(),
            controller: controller_of(found.meta()),
        }),
        // Gone again meanwhile: the next reconcile creates it.
        Ok(None) => Err(apply_error(desired, refused)),
        Err(read) => Err(apply_error(desired, read)),
    }
}

/// Creates `desired` by server-side apply, or fails with a conflict if an object of that name
/// exists. The apply carries `metadata.resourceVersion`, which makes it conditional: the API
/// server compares it with a stored object's and answers 409 Conflict on a mismatch, while a
/// name that is free is created (the version is then ignored). Server-side apply rather than
/// POST so the object's fields belong to `field_manager`'s Apply entry from the start: later
/// applies can then drop fields (a POST would leave them owned by an Update entry for good).
async fn create_only<K>(api: &Api<K>, desired: &K, field_manager: &str) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
{
    let mut conditional = desired.clone();
    conditional.meta_mut().resource_version = Some(CREATE_ONLY_RESOURCE_VERSION.to_owned());
    api.patch(
        &desired.name_any(),
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&conditional),
    )
    .await
}

/// A resource version no stored object has (etcd revisions start above it once anything is
/// stored), so it matches nothing that exists.
const CREATE_ONLY_RESOURCE_VERSION: &str = "1";

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn apply_error<K: Resource<DynamicType = ()>>(desired: &K, source: kube::Error) -> K8sError {
    K8sError::Apply {
        kind: K::kind(&()).into_owned(),
        namespace: desired.namespace().unwrap_or_default(),
        name: desired.name_any(),
        source: Box::new(source),
    }
}

/// Server-side applies `obj` (force: these fields are ours) under `field_manager`. Only for
/// objects known to be ours (the owner itself, its status); children go through [`apply_owned`].
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

/// An event recorder for one controller, publishing with `client` (the events client).
pub fn recorder(client: kube::Client, controller: &str) -> EventRecorder {
    EventRecorder::new(client, controller)
}

/// Publishes an event; failures to publish are logged, never fatal for a reconcile.
pub async fn publish_event<K: Resource<DynamicType = ()>>(
    recorder: &EventRecorder,
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

/// Untrusted text cut to at most `max` bytes on a char boundary, marked with `…` when cut: for
/// quoting input back in errors, logs, events and conditions without letting it grow them.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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
    #[test]
    fn truncate_keeps_short_text_and_bounds_long_text_on_char_boundaries() {
        assert_eq!(super::truncate("short", 10), "short");
        for max in 0..20 {
            let out = super::truncate("ééééééééééééééé", max);
            assert!(out.len() <= max.max('…'.len_utf8()), "{max}: {out}");
        }
    }

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

    fn meta_with(owners: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(serde_json::json!({
            "name": "svc", "namespace": "ns", "uid": "child-uid",
            "labels": {"secret-looking": "content"},
            "ownerReferences": owners
        }))
        .expect("ObjectMeta")
    }

    fn owner(uid: &str, controller: Option<bool>) -> serde_json::Value {
        serde_json::json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "team-a",
            "uid": uid, "controller": controller})
    }

    #[test]
    fn only_a_controller_reference_with_the_owners_uid_counts_as_ownership() {
        assert!(is_controlled_by(
            &meta_with(serde_json::json!([owner("u1", Some(true))])),
            "u1"
        ));
        // A plain (non-controller) reference, someone else's controller, or none: not ours.
        for owners in [
            serde_json::json!([owner("u1", Some(false))]),
            serde_json::json!([owner("u1", None)]),
            serde_json::json!([owner("u2", Some(true))]),
            serde_json::json!([]),
            serde_json::Value::Null,
        ] {
            assert!(
                !is_controlled_by(&meta_with(owners.clone()), "u1"),
                "{owners}"
            );
        }
        // An owner not read from the API server (no uid) owns nothing.
        assert!(!is_controlled_by(
            &meta_with(serde_json::json!([owner("", Some(true))])),
            ""
        ));
    }

    #[test]
    fn a_conflict_names_the_object_and_its_controller_and_nothing_of_its_content() {
        let mut service = k8s_openapi::api::core::v1::Service {
            metadata: meta_with(serde_json::json!([owner("u2", Some(true))])),
            ..Default::default()
        };
        let err = check_controlled_by(&service, "u1").expect_err("not ours");
        assert_eq!(err.conflict_reason(), Some("ServiceConflict"));
        let text = err.to_string();
        assert!(text.contains("Service ns/svc"), "{text}");
        assert!(text.contains("RayCluster/team-a"), "{text}");
        assert!(
            !text.contains("content") && !text.contains("child-uid"),
            "{text}"
        );

        service.metadata.owner_references = None;
        let err = check_controlled_by(&service, "u1").expect_err("not ours");
        assert!(
            err.to_string().contains("not controlled by anyone"),
            "{err}"
        );
        assert!(check_controlled_by(&service, "u1").is_err());

        service.metadata = meta_with(serde_json::json!([owner("u1", Some(true))]));
        assert!(check_controlled_by(&service, "u1").is_ok());
    }

    #[test]
    fn conflict_reasons_are_named_after_the_kind() {
        assert_eq!(conflict_reason("RayService"), "RayServiceConflict");
        assert_eq!(conflict_reason("RayCluster"), "RayClusterConflict");
        assert_eq!(conflict_reason("RayJob"), "RayJobConflict");
        assert_eq!(conflict_reason("Job"), "JobConflict");
        assert_eq!(conflict_reason("Unheard"), "ObjectConflict");
        let other = K8sError::MissingMetadata {
            kind: "Pod".into(),
            name: "p".into(),
            what: "uid",
        };
        assert_eq!(other.conflict_reason(), None);
        assert!(!other.is_not_owned());
    }

    #[test]
    fn a_desired_child_must_name_its_controller() {
        let mut service = k8s_openapi::api::core::v1::Service {
            metadata: meta_with(serde_json::json!([owner("u1", Some(false))])),
            ..Default::default()
        };
        assert!(matches!(
            desired_controller_uid(&service),
            Err(K8sError::MissingMetadata { .. })
        ));
        service.metadata = meta_with(serde_json::json!([owner("u1", Some(true))]));
        assert_eq!(desired_controller_uid(&service).expect("uid"), "u1");
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
        assert!(cut.len() <= 8 && cut.ends_with('…'), "{cut}");
    }
}
