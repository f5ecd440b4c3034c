//! The frame around each reconcile: [`Frame`] holds what is shared by every object of one
//! controller (metrics handles, the queue mirror, the retry policy, per-object failure counts);
//! [`reconciler`] and [`error_policy`] wrap the controller's own functions for
//! `kube::runtime::Controller::run`.
//!
//! How a controller adopts it:
//!
//! ```ignore
//! // In the controller's Context:
//! pub struct Context { frame: Frame<RayThing>, recorder: Recorder, .. }
//! impl frame::run::Framed<RayThing> for Context {
//!     fn frame(&self) -> &Frame<RayThing> { &self.frame }
//! }
//! impl frame::ReportPanic<RayThing> for Context { .. frame::panic_event(..) .. }
//! impl frame::policy::ReconcileError for Error { fn category(&self) -> &'static str { .. } }
//!
//! // In `run` (the watches are declared with `frame::watch::Watches`, which calls `drive`):
//! let frame = Frame::new("raything", &config.metrics);        // or Metrics::new() if none
//! let mut watches = Watches::new(&frame, &client, &config.namespace, &config.readiness);
//! watches.owns(Child::<Pod>::labelled(selector));
//! watches.run(Arc::new(Context { frame, .. }), shutdown).await;
//!
//! // Context implements frame::pass::Stages: the bare stages, no span, no metrics, no failure
//! // bookkeeping; `frame::pass::pass` runs them.
//! ```
//!
//! What every reconcile then gets, in order: the queue mark (`raypipe_reconcile_queue_depth`),
//! a timer (`raypipe_reconcile_total`, `_duration_seconds`, `_in_flight`, and
//! `raypipe_reconcile_errors_total{category=..}`), an `info` span `reconcile` with
//! `kind`, `namespace` and `name`, panic containment, and on success the reset of the object's
//! failure count. A failure goes through [`error_policy`]: count + 1, [`policy::decide`], one
//! `warn` line `"<Kind> reconcile failed"` with `namespace`, `name`, `error`, `retry_in`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::Instrument;

use super::memory::ObjectMemory;
use super::policy::{self, Backoff, ReconcileError};
use super::{ReportPanic, contain, contain_policy};

/// What one controller shares across its objects. Build it once in `run`, keep it in the
/// controller's `Context`, and expose it through [`Framed`].
pub struct Frame<K> {
    controller: &'static str,
    metrics: crate::admin::Metrics,
    queue: crate::admin::metrics::ReconcileQueue,
    backoff: Backoff,
    ceiling: Option<fn(&K) -> Option<Duration>>,
    failures: ObjectMemory<Streak>,
}

/// An object's run of failed reconciles.
#[derive(Default)]
struct Streak {
    failures: u32,
    /// The next successful pass does not end the streak (see [`Frame::keep_failures`]).
    held: bool,
}

impl<K: Resource> Frame<K> {
    /// `controller` is the fixed metrics label and log name (`raycluster`, `rayjob`, …).
    /// `metrics` is the process' registry handle (a detached `Metrics::new()` for a controller
    /// whose `Config` has none yet: its numbers are then recorded but not exported).
    pub fn new(controller: &'static str, metrics: &crate::admin::Metrics) -> Self {
        Frame {
            controller,
            metrics: metrics.clone(),
            queue: metrics.queue(controller),
            backoff: Backoff::default(),
            ceiling: None,
            failures: ObjectMemory::new(),
        }
    }

    /// Replaces the default backoff (2 s doubling to 5 minutes).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The longest a failed object may wait, read from the object (e.g. its refresh interval):
    /// caps transient backoff, and permanent errors requeue after it instead of waiting for a
    /// change. See [`policy::decide`].
    pub fn with_retry_ceiling(mut self, ceiling: fn(&K) -> Option<Duration>) -> Self {
        self.ceiling = Some(ceiling);
        self
    }

    /// The controller's fixed name (metrics label).
    pub fn controller(&self) -> &'static str {
        self.controller
    }

    pub fn metrics(&self) -> &crate::admin::Metrics {
        &self.metrics
    }

    /// The queue mirror: call `changed` / `owner_changed` from the watch streams; the frame
    /// calls `started` itself.
    pub fn queue(&self) -> &crate::admin::metrics::ReconcileQueue {
        &self.queue
    }

    /// Consecutive failures of `object` so far (0 after a success or for a new uid).
    pub fn failures(&self, object: &K) -> u32 {
        self.failures.peek(object, |s| s.failures).unwrap_or(0)
    }

    /// Called from a reconcile that returns `Ok` while the outcome is still decided elsewhere
    /// (a fetch running outside the reconcile): this `Ok` does not end the object's failure
    /// streak, so the backoff keeps growing when the awaited work fails again.
    pub fn keep_failures(&self, object: &K) {
        if self.failures(object) > 0 {
            self.failures.with(object, |s| s.held = true);
        }
    }

    /// Drops the failure count of a deleted object (call from the delete event).
    pub fn forget(&self, key: &super::memory::ObjectKey) {
        self.failures.forget(key);
    }

    /// Readiness tracking: the operator is not ready until `store` holds its first list.
    pub fn track_ready<S>(
        &self,
        readiness: &crate::admin::Readiness,
        store: kube::runtime::reflector::Store<S>,
    ) where
        S: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
        S::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        readiness.track_store(self.controller, store);
    }

    fn failed(&self, object: &K) -> u32 {
        self.failures.with(object, |s| {
            s.held = false;
            s.failures = s.failures.saturating_add(1);
            s.failures
        })
    }

    fn succeeded(&self, object: &K) {
        // Only an object that failed before has an entry; a success never creates one.
        if self.failures.peek(object, |s| s.failures > 0) == Some(true) {
            self.failures.with(object, |s| {
                if !std::mem::take(&mut s.held) {
                    s.failures = 0;
                }
            });
        }
    }
}

/// The controller's `Context` gives the frame access to its [`Frame`]. Together with
/// [`ReportPanic`] it is all [`reconciler`] and [`error_policy`] need.
pub trait Framed<K: Resource>: ReportPanic<K> + Send + Sync + 'static {
    fn frame(&self) -> &Frame<K>;

    /// An object was deleted: drops what is remembered of it (by default its failure count;
    /// a controller with memory of its own extends this). Called by [`super::watch::Watches`].
    fn forget(&self, key: &super::memory::ObjectKey) {
        self.frame().forget(key);
    }
}

/// Wraps `reconcile` (the bare stage sequence) for `Controller::run`: queue mark, metrics,
/// span, panic containment (see [`contain`]), and the failure-count reset on success.
pub fn reconciler<K, C, E, F, Fut>(
    reconcile: F,
) -> impl FnMut(Arc<K>, Arc<C>) -> BoxFuture<'static, Result<Action, E>>
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
    C: Framed<K>,
    E: ReconcileError,
    F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let reconcile = Arc::new(reconcile);
    move |object: Arc<K>, ctx: Arc<C>| {
        let frame = ctx.frame();
        let span = tracing::info_span!(
            "reconcile",
            kind = %K::kind(&()),
            namespace = %object.namespace().unwrap_or_default(),
            name = %object.name_any()
        );
        frame.queue.started(object.namespace(), &object.name_any());
        let timer = frame.metrics.reconcile_started(frame.controller);
        let inner = reconcile.clone();
        let run = span.in_scope(|| {
            contain(frame.controller, move |o: Arc<K>, c: Arc<C>| inner(o, c))(
                object.clone(),
                ctx.clone(),
            )
        });
        async move {
            let result = run.instrument(span).await;
            timer.finish(result.as_ref().err().map(E::category));
            if result.is_ok() {
                ctx.frame().succeeded(&object);
            }
            result
        }
        .boxed()
    }
}

/// The error policy for `Controller::run`: counts the object's failure, picks the retry with
/// [`policy::decide`] (the frame's backoff and retry ceiling), logs one warning, and is itself
/// panic-contained (see [`contain_policy`]).
pub fn error_policy<K, C, E>() -> impl Fn(Arc<K>, &E, Arc<C>) -> Action
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
    C: Framed<K>,
    E: ReconcileError,
{
    move |object: Arc<K>, error: &E, ctx: Arc<C>| {
        let controller = ctx.frame().controller;
        contain_policy(controller, |object: Arc<K>, error: &E, ctx: Arc<C>| {
            let frame = ctx.frame();
            let failures = frame.failed(&object);
            let ceiling = frame.ceiling.and_then(|c| c(&object));
            let retry = policy::decide(error, failures, frame.backoff, ceiling);
            tracing::warn!(
                namespace = %object.namespace().unwrap_or_default(),
                name = %object.name_any(),
                error = %error,
                retry_in = %retry,
                "{} reconcile failed",
                K::kind(&())
            );
            retry.action()
        })(object, error, ctx)
    }
}

/// Runs `controller` (its watches already set up) until its shutdown signal, with the framed
/// `reconcile` and the one [`error_policy`]. A failed loop item (a watch hiccup, an object that
/// left the cache) is logged at debug: kube-runtime retries those by itself.
pub async fn drive<K, C, E, F, Fut>(
    controller: kube::runtime::Controller<K>,
    reconcile: F,
    ctx: Arc<C>,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    C: Framed<K> + 'static,
    E: ReconcileError + 'static,
    F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    use futures::StreamExt;
    let controller_name = ctx.frame().controller;
    controller
        .run(reconciler(reconcile), error_policy(), ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, controller = controller_name, "reconcile loop");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::frame::policy::Retry;
    use crate::controllers::frame::policy::tests::TestError;
    use k8s_openapi::api::core::v1::ConfigMap;

    struct Ctx {
        frame: Frame<ConfigMap>,
    }

    impl ReportPanic<ConfigMap> for Ctx {
        fn report_panic(&self, _: Arc<ConfigMap>, _: String) -> BoxFuture<'static, ()> {
            async {}.boxed()
        }
    }

    impl Framed<ConfigMap> for Ctx {
        fn frame(&self) -> &Frame<ConfigMap> {
            &self.frame
        }
    }

    fn object(name: &str, uid: &str) -> Arc<ConfigMap> {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("team".into());
        cm.metadata.uid = Some(uid.into());
        Arc::new(cm)
    }

    /// Fails while the ConfigMap has a `fail` key (`input` makes the failure permanent).
    async fn reconcile(cm: Arc<ConfigMap>, _: Arc<Ctx>) -> Result<Action, TestError> {
        match cm
            .data
            .as_ref()
            .and_then(|d| d.get("fail"))
            .map(String::as_str)
        {
            Some("input") => Err(TestError::Input),
            Some("panic") => panic!("reconcile bug"),
            Some(_) => Err(TestError::Api),
            None => Ok(Action::await_change()),
        }
    }

    fn failing(cm: &Arc<ConfigMap>, how: &str) -> Arc<ConfigMap> {
        let mut cm = (**cm).clone();
        cm.data = Some([("fail".to_owned(), how.to_owned())].into());
        Arc::new(cm)
    }

    fn ctx(metrics: &crate::admin::Metrics) -> Arc<Ctx> {
        Arc::new(Ctx {
            frame: Frame::new("frametest", metrics),
        })
    }

    /// One pass as kube-runtime drives it: reconcile, then the error policy on failure.
    async fn pass(
        run: &mut impl FnMut(Arc<ConfigMap>, Arc<Ctx>) -> BoxFuture<'static, Result<Action, TestError>>,
        cm: &Arc<ConfigMap>,
        ctx: &Arc<Ctx>,
    ) -> Action {
        let policy = error_policy::<ConfigMap, Ctx, TestError>();
        match run(cm.clone(), ctx.clone()).await {
            Ok(action) => action,
            Err(e) => policy(cm.clone(), &e, ctx.clone()),
        }
    }

    #[tokio::test]
    async fn failures_back_off_per_object_and_a_success_resets_the_count() {
        let metrics = crate::admin::Metrics::new();
        let ctx = ctx(&metrics);
        let mut run = reconciler(reconcile);
        let a = object("a", "uid-a");
        let b = object("b", "uid-b");
        let secs = |s| Action::requeue(Duration::from_secs(s));
        assert_eq!(pass(&mut run, &failing(&a, "api"), &ctx).await, secs(2));
        assert_eq!(pass(&mut run, &failing(&a, "api"), &ctx).await, secs(4));
        assert_eq!(pass(&mut run, &failing(&a, "api"), &ctx).await, secs(8));
        // Another object's backoff starts at the beginning.
        assert_eq!(pass(&mut run, &failing(&b, "api"), &ctx).await, secs(2));
        assert_eq!(ctx.frame.failures(&a), 3);
        // A success resets; the next failure starts over.
        assert_eq!(pass(&mut run, &a, &ctx).await, Action::await_change());
        assert_eq!(ctx.frame.failures(&a), 0);
        assert_eq!(pass(&mut run, &failing(&a, "api"), &ctx).await, secs(2));
        // A permanent error waits for a change (and still counts).
        assert_eq!(
            pass(&mut run, &failing(&a, "input"), &ctx).await,
            Action::await_change()
        );
        assert_eq!(ctx.frame.failures(&a), 2);
        // A panic is a transient error of that object.
        assert_eq!(pass(&mut run, &failing(&a, "panic"), &ctx).await, secs(8));

        let text = metrics.encode().expect("encodes");
        for needle in [
            "raypipe_reconcile_errors_total{controller=\"frametest\",category=\"api\"} 5",
            "raypipe_reconcile_errors_total{controller=\"frametest\",category=\"input\"} 1",
            "raypipe_reconcile_errors_total{controller=\"frametest\",category=\"panic\"} 1",
            "raypipe_reconcile_total{controller=\"frametest\"} 8",
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
    }

    #[tokio::test]
    async fn a_held_success_does_not_end_the_failure_streak() {
        let ctx = ctx(&crate::admin::Metrics::new());
        let mut run = reconciler(reconcile);
        let a = object("a", "uid-a");
        let secs = |s| Action::requeue(Duration::from_secs(s));
        assert_eq!(pass(&mut run, &failing(&a, "api"), &ctx).await, secs(2));
        // A pass that only started a fetch: Ok, but the streak goes on.
        ctx.frame.keep_failures(&a);
        pass(&mut run, &a, &ctx).await;
        assert_eq!(ctx.frame.failures(&a), 1);
        assert_eq!(pass(&mut run, &failing(&a, "api"), &ctx).await, secs(4));
        // The hold lasts one pass only.
        ctx.frame.keep_failures(&a);
        pass(&mut run, &a, &ctx).await;
        pass(&mut run, &a, &ctx).await;
        assert_eq!(ctx.frame.failures(&a), 0);
    }

    #[tokio::test]
    async fn a_recreated_object_does_not_inherit_the_backoff() {
        let ctx = ctx(&crate::admin::Metrics::new());
        let mut run = reconciler(reconcile);
        let old = object("a", "uid-1");
        for _ in 0..4 {
            pass(&mut run, &failing(&old, "api"), &ctx).await;
        }
        assert_eq!(ctx.frame.failures(&old), 4);
        let new = object("a", "uid-2");
        assert_eq!(ctx.frame.failures(&new), 0);
        assert_eq!(
            pass(&mut run, &failing(&new, "api"), &ctx).await,
            Action::requeue(Duration::from_secs(2))
        );
    }

    #[tokio::test]
    async fn the_retry_ceiling_and_backoff_come_from_the_frame() {
        fn ceiling(cm: &ConfigMap) -> Option<Duration> {
            cm.labels()
                .get("refresh")
                .and_then(|s| s.parse().ok())
                .map(Duration::from_secs)
        }
        let ctx = Arc::new(Ctx {
            frame: Frame::new("frametest", &crate::admin::Metrics::new())
                .with_backoff(Backoff::starting_at(Duration::from_secs(5)))
                .with_retry_ceiling(ceiling),
        });
        let mut run = reconciler(reconcile);
        let mut cm = (*object("a", "uid")).clone();
        cm.metadata.labels = Some([("refresh".to_owned(), "7".to_owned())].into());
        let cm = Arc::new(cm);
        let secs = |s| Action::requeue(Duration::from_secs(s));
        assert_eq!(pass(&mut run, &failing(&cm, "api"), &ctx).await, secs(5));
        assert_eq!(pass(&mut run, &failing(&cm, "api"), &ctx).await, secs(7));
        assert_eq!(pass(&mut run, &failing(&cm, "input"), &ctx).await, secs(7));
        assert_eq!(Retry::After(Duration::from_secs(7)).action(), secs(7));
    }
}
