//! Who a caller is and what it may do, as Kubernetes says: a TokenReview turns a bearer token
//! into a [`Caller`], a SubjectAccessReview answers whether that caller has a [`Permission`].
//! Shared by the history API and the console, so both decide alike. Answers are cached for a
//! few seconds under a SHA-256 ([`CallerKey`]) of the token or of the signed-in identity, never
//! the token itself, so a page of calls costs one review and a revoked right stops working
//! within seconds.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::{HeaderMap, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

/// How long a review's answer is reused: short, so a revoked token or a removed RoleBinding
/// stops working within seconds, yet long enough that a page of calls costs one review.
pub const REVIEW_TTL: Duration = Duration::from_secs(10);
/// Cached answers kept at most (per cache): a flood of distinct tokens cannot grow memory.
const CACHE_CAPACITY: usize = 10_000;
/// How long one TokenReview or SubjectAccessReview may take before the request fails.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a caller could not be reviewed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// No usable bearer token, or Kubernetes did not accept it. The text never holds the token.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// Kubernetes could not be asked (down, timed out, or the server's own account lacks the
    /// right to create reviews); the details are logged, not answered.
    #[error("Kubernetes could not review the request; try again later")]
    Unavailable,
}

/// A permission one request needs: `verb` on `group`/`resource` in `namespace`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Permission {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    /// Empty for the resource itself.
    pub subresource: &'static str,
    pub namespace: String,
}

impl Permission {
    pub fn new(
        verb: &'static str,
        group: &'static str,
        resource: &'static str,
        namespace: &str,
    ) -> Permission {
        Permission {
            verb,
            group,
            resource,
            subresource: "",
            namespace: namespace.to_owned(),
        }
    }

    /// The same permission on a subresource (`rayclusters/proxy`, say).
    pub fn on_subresource(self, subresource: &'static str) -> Permission {
        Permission {
            subresource,
            ..self
        }
    }

    /// Reading a namespace's pipeline history.
    pub fn pipelines(namespace: &str) -> Permission {
        Permission {
            verb: "get",
            group: "raypipe.dev",
            resource: "servepipelines",
            subresource: "",
            namespace: namespace.to_owned(),
        }
    }

    /// Reading a namespace's Ray cluster sessions.
    pub fn clusters(namespace: &str) -> Permission {
        Permission {
            verb: "get",
            group: "ray.io",
            resource: "rayclusters",
            subresource: "",
            namespace: namespace.to_owned(),
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, ReviewError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or(ReviewError::Unauthenticated(
            "send a Kubernetes bearer token: Authorization: Bearer <token>",
        ))?;
    let text = value.to_str().map_err(|_| {
        ReviewError::Unauthenticated("the Authorization header is not a bearer token")
    })?;
    let (scheme, token) = text
        .trim()
        .split_once(' ')
        .ok_or(ReviewError::Unauthenticated(
            "the Authorization header is not a bearer token",
        ))?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(ReviewError::Unauthenticated(
            "the Authorization header is not a bearer token",
        ));
    }
    Ok(token)
}

/// What the caches key a caller by: a SHA-256, so no token is kept in memory past its request.
pub type CallerKey = [u8; 32];
/// The history API's name for it.
pub type TokenKey = CallerKey;

/// The key of a bearer token.
pub fn token_key(token: &str) -> CallerKey {
    Sha256::digest(token.as_bytes()).into()
}

/// The key of an identity that signed in some other way (the console's OpenID Connect
/// sessions): a different prefix, so it can never equal a token's key.
pub fn identity_key(caller: &Caller) -> CallerKey {
    let mut hash = Sha256::new();
    hash.update(b"identity\0");
    hash.update(caller.username.as_bytes());
    for group in &caller.groups {
        hash.update(b"\0");
        hash.update(group.as_bytes());
    }
    hash.finalize().into()
}

/// Answers kept for `ttl`, at most `capacity` of them. Time is passed in, so it is tested
/// without waiting.
pub struct TtlCache<K, V> {
    ttl: Duration,
    capacity: usize,
    entries: HashMap<K, (Instant, V)>,
}

impl<K: Hash + Eq, V: Clone> TtlCache<K, V> {
    pub fn new(ttl: Duration, capacity: usize) -> TtlCache<K, V> {
        TtlCache {
            ttl,
            capacity: capacity.max(1),
            entries: HashMap::new(),
        }
    }

    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(at, _)| now.saturating_duration_since(*at) < self.ttl)
            .map(|(_, value)| value.clone())
    }

    pub fn insert(&mut self, key: K, value: V, now: Instant) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            let ttl = self.ttl;
            self.entries
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            // Still full of fresh answers (a flood of distinct tokens): start over rather than
            // grow; the cost is a few repeated reviews.
            if self.entries.len() >= self.capacity {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (now, value));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Who a token belongs to, as the TokenReview said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub username: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a TokenReview's status means: the caller, or why not.
pub fn caller_of(review: &TokenReview) -> Option<Caller> {
    let status = review.status.as_ref()?;
    if status.authenticated != Some(true) {
        return None;
    }
    let user = status.user.as_ref()?;
    let username = user.username.clone().filter(|u| !u.is_empty())?;
    Some(Caller {
        username,
        uid: user.uid.clone(),
        groups: user.groups.clone().unwrap_or_default(),
        extra: user.extra.clone().unwrap_or_default(),
    })
}

/// The SubjectAccessReview that asks whether `caller` has `permission`.
pub fn access_review(caller: &Caller, permission: &Permission) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(caller.username.clone()),
            uid: caller.uid.clone(),
            groups: Some(caller.groups.clone()),
            extra: Some(caller.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(permission.verb.to_owned()),
                group: Some(permission.group.to_owned()),
                resource: Some(permission.resource.to_owned()),
                subresource: (!permission.subresource.is_empty())
                    .then(|| permission.subresource.to_owned()),
                namespace: Some(permission.namespace.clone()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// A cache lock that a panicking holder poisoned is still a valid cache.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reviews callers against one API server, with both caches. Shared by reference.
pub struct Reviewer {
    client: kube::Client,
    audiences: Vec<String>,
    /// Token → the caller (`None`: Kubernetes refused the token).
    identities: Mutex<TtlCache<CallerKey, Option<Caller>>>,
    /// (caller, permission) → allowed.
    decisions: Mutex<TtlCache<(CallerKey, Permission), bool>>,
}

impl Reviewer {
    /// `audiences`: those the tokens must be meant for (TokenReview `audiences`); empty: the
    /// API server's own.
    pub fn new(client: kube::Client, audiences: Vec<String>) -> Reviewer {
        Reviewer {
            client,
            audiences,
            identities: Mutex::new(TtlCache::new(REVIEW_TTL, CACHE_CAPACITY)),
            decisions: Mutex::new(TtlCache::new(REVIEW_TTL, CACHE_CAPACITY)),
        }
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Who `token` belongs to, as a TokenReview says (cached under `key`, its hash).
    pub async fn authenticate(&self, token: &str, key: CallerKey) -> Result<Caller, ReviewError> {
        let cached = lock(&self.identities).get(&key, Instant::now());
        let caller = match cached {
            Some(caller) => caller,
            None => {
                let review = TokenReview {
                    spec: TokenReviewSpec {
                        token: token.to_owned(),
                        audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
                    },
                    ..TokenReview::default()
                };
                let api: Api<TokenReview> = Api::all(self.client.clone());
                let answer = tokio::time::timeout(
                    REVIEW_TIMEOUT,
                    api.create(&PostParams::default(), &review),
                )
                .await;
                let reviewed = match answer {
                    Ok(Ok(reviewed)) => reviewed,
                    Ok(Err(e)) => {
                        // kube's error holds the API server's status message, not the request.
                        tracing::warn!(error = %e, "TokenReview failed");
                        return Err(ReviewError::Unavailable);
                    }
                    Err(_) => {
                        tracing::warn!("TokenReview timed out");
                        return Err(ReviewError::Unavailable);
                    }
                };
                let caller = caller_of(&reviewed);
                lock(&self.identities).insert(key, caller.clone(), Instant::now());
                caller
            }
        };
        caller.ok_or(ReviewError::Unauthenticated(
            "Kubernetes did not accept the bearer token",
        ))
    }

    /// Whether `caller` (cached under `key`) has `permission`, as a SubjectAccessReview says.
    pub async fn allowed(
        &self,
        caller: &Caller,
        key: CallerKey,
        permission: &Permission,
    ) -> Result<bool, ReviewError> {
        let cache_key = (key, permission.clone());
        if let Some(allowed) = lock(&self.decisions).get(&cache_key, Instant::now()) {
            return Ok(allowed);
        }
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = tokio::time::timeout(
            REVIEW_TIMEOUT,
            api.create(&PostParams::default(), &access_review(caller, permission)),
        )
        .await;
        let allowed = match answer {
            Ok(Ok(reviewed)) => reviewed.status.is_some_and(|s| s.allowed),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "SubjectAccessReview failed");
                return Err(ReviewError::Unavailable);
            }
            Err(_) => {
                tracing::warn!("SubjectAccessReview timed out");
                return Err(ReviewError::Unavailable);
            }
        };
        lock(&self.decisions).insert(cache_key, allowed, Instant::now());
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};

    #[test]
    fn only_bearer_tokens_are_taken_and_errors_never_hold_them() {
        let headers = |value: &str| {
            let mut headers = HeaderMap::new();
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(header::AUTHORIZATION, value);
            }
            headers
        };
        assert_eq!(bearer_token(&headers("Bearer s3cr3t")).ok(), Some("s3cr3t"));
        assert_eq!(
            bearer_token(&headers("bearer  s3cr3t ")).ok(),
            Some("s3cr3t")
        );
        for bad in ["", "Basic s3cr3t", "Bearer", "Bearer   ", "s3cr3t"] {
            let error = bearer_token(&headers(bad)).err();
            let error = error.unwrap_or_else(|| panic!("{bad:?} was taken"));
            assert!(matches!(error, ReviewError::Unauthenticated(_)));
            assert!(!error.to_string().contains("s3cr3t"), "{error}");
        }
    }

    #[test]
    fn token_keys_are_digests_not_tokens() {
        let key = token_key("s3cr3t");
        assert_eq!(key, token_key("s3cr3t"));
        assert_ne!(key, token_key("s3cr3u"));
        assert!(!hex::encode(key).contains(&hex::encode("s3cr3t")));
    }

    #[test]
    fn cached_answers_expire_and_the_cache_stays_bounded() {
        let start = Instant::now();
        let mut cache: TtlCache<u32, bool> = TtlCache::new(Duration::from_secs(10), 3);
        cache.insert(1, true, start);
        assert_eq!(cache.get(&1, start + Duration::from_secs(9)), Some(true));
        assert_eq!(cache.get(&1, start + Duration::from_secs(10)), None);
        assert_eq!(cache.get(&2, start), None);
        cache.insert(2, false, start);
        cache.insert(3, true, start + Duration::from_secs(5));
        // Full: the expired answers (1 and 2) make room for a fourth.
        cache.insert(4, true, start + Duration::from_secs(12));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&3, start + Duration::from_secs(12)), Some(true));
        // Full of fresh answers: start over rather than grow.
        cache.insert(5, true, start + Duration::from_secs(12));
        cache.insert(6, true, start + Duration::from_secs(12));
        assert!(cache.len() <= 3, "{}", cache.len());
        assert_eq!(cache.get(&6, start + Duration::from_secs(12)), Some(true));
        // Replacing an entry never evicts.
        cache.insert(6, false, start + Duration::from_secs(13));
        assert_eq!(cache.get(&6, start + Duration::from_secs(13)), Some(false));
    }

    #[test]
    fn a_review_names_the_caller_only_when_authenticated() {
        let review = |authenticated: Option<bool>, username: Option<&str>| TokenReview {
            status: Some(TokenReviewStatus {
                authenticated,
                user: Some(UserInfo {
                    username: username.map(str::to_owned),
                    uid: Some("u-1".into()),
                    groups: Some(vec!["system:serviceaccounts".into()]),
                    extra: Some(BTreeMap::from([("k".into(), vec!["v".into()])])),
                }),
                ..TokenReviewStatus::default()
            }),
            ..TokenReview::default()
        };
        let caller = caller_of(&review(Some(true), Some("system:serviceaccount:a:reader")));
        assert_eq!(
            caller.as_ref().map(|c| c.username.as_str()),
            Some("system:serviceaccount:a:reader")
        );
        assert_eq!(caller_of(&review(Some(false), Some("x"))), None);
        assert_eq!(caller_of(&review(None, Some("x"))), None);
        assert_eq!(caller_of(&review(Some(true), None)), None);
        assert_eq!(caller_of(&TokenReview::default()), None);

        let Some(caller) = caller else {
            panic!("authenticated")
        };
        let sar = access_review(&caller, &Permission::pipelines("tenant-a"));
        let attributes = sar.spec.resource_attributes.unwrap_or_default();
        assert_eq!(
            sar.spec.user.as_deref(),
            Some("system:serviceaccount:a:reader")
        );
        assert_eq!(sar.spec.uid.as_deref(), Some("u-1"));
        assert_eq!(
            sar.spec.groups,
            Some(vec!["system:serviceaccounts".to_owned()])
        );
        assert_eq!(sar.spec.extra.map(|e| e.len()), Some(1));
        assert_eq!(attributes.verb.as_deref(), Some("get"));
        assert_eq!(attributes.group.as_deref(), Some("raypipe.dev"));
        assert_eq!(attributes.resource.as_deref(), Some("servepipelines"));
        assert_eq!(attributes.namespace.as_deref(), Some("tenant-a"));
        assert_eq!(attributes.subresource, None);
        let proxy = access_review(
            &caller,
            &Permission::new("create", "ray.io", "rayclusters", "tenant-a").on_subresource("proxy"),
        );
        let attributes = proxy.spec.resource_attributes.unwrap_or_default();
        assert_eq!(attributes.subresource.as_deref(), Some("proxy"));
        assert_eq!(attributes.verb.as_deref(), Some("create"));
        // A signed-in identity's key can never be a token's.
        assert_ne!(identity_key(&caller), token_key(&caller.username));
    }
}
