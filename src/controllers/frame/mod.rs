//! The shared reconcile frame: what every controller runs inside, so that the five controllers
//! differ only in what they reconcile.
//!
//! - [`run`]: [`run::Frame`] (one per controller, kept in its `Context`) and the wrappers
//!   [`run::reconciler`] / [`run::error_policy`] handed to `Controller::run`. Together they give
//!   every reconcile a tracing span, the queue mark, timing and error metrics, panic
//!   containment, and ONE retry policy with per-object backoff.
//! - [`pass`]: [`pass::Stages`], the stages of one reconcile every controller implements
//!   (observe → validate → act → status → finish), and [`pass::pass`], which runs them in that
//!   order with one refusal policy and at most one status write.
//! - [`policy`]: the [`policy::ReconcileError`] trait each controller's `Error` implements
//!   (category, transience, an optional requeue hint) and the pure retry decision.
//! - [`failure`]: [`failure::KubeFailure`], a failed kube API call as every controller's `Error`
//!   holds it, with the one metric category of such failures.
//! - [`memory`]: [`memory::ObjectMemory`], per-object memory that starts afresh when the object's
//!   uid changes (a deleted and re-created object inherits nothing).
//! - [`refuse`]: [`refuse::refuse`], the one policy for a spec the rule book rejects.
//! - [`status`]: [`status::apply_status`], the one server-side apply of a status subresource.
//! - [`watch`]: [`watch::Watches`], the watch kit: a controller declares its watches (its own
//!   kind, owned children, caches, related objects) and the kit wires and runs them.
//! - [`children`]: [`children::ChildWriter`], a child object's write (create-only or
//!   server-side apply, never taking one over) with the Event that reports its outcome.
//! - This file: panic containment ([`contain`], [`contain_policy`], [`ReportPanic`]) and the
//!   controller-task [`Supervisor`].
//!
//! Panic containment: kube-runtime polls reconcile futures inside the controller's own task, so
//! without it a panic from one tenant's object unwinds the whole controller for every namespace
//! while the process (and `/healthz`) stays up; a panic in one object's reconcile (or in its
//! error policy) becomes an error for that object alone, and a controller task that ends before
//! shutdown marks the operator unhealthy instead of silently leaving its kind unreconciled. The
//! release profile keeps `panic = "unwind"` for this.

pub mod children;
pub mod failure;
pub mod memory;
pub mod pass;
pub mod policy;
pub mod refuse;
pub mod run;
pub mod status;
pub mod watch;

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::runtime::controller::Action;

/// A reconcile that panicked. Carries the panic's message, cut to a bounded length.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the reconcile panicked (a bug in raypipe; the object is retried with backoff): {message}")]
pub struct Panicked {
    pub message: String,
}

/// How long an object waits after its error policy itself panicked.
pub const POLICY_PANIC_REQUEUE: Duration = Duration::from_secs(300);

/// Longest panic message kept.
const MAX_PANIC_MESSAGE: usize = 512;

fn panic_message(payload: &(dyn Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".to_owned());
    crate::k8s::truncate(&text, MAX_PANIC_MESSAGE)
}

/// How a controller tells the owner of an object that its reconcile panicked (an Event, and a
/// condition where the kind has one). Called once per panic, after the panic was caught.
pub trait ReportPanic<K>: Send + Sync {
    fn report_panic(&self, object: Arc<K>, message: String) -> BoxFuture<'static, ()>;
}

/// The Warning Event every controller publishes for a contained panic.
pub const REASON_RECONCILE_PANICKED: &str = "ReconcilePanicked";

/// Publishes the [`REASON_RECONCILE_PANICKED`] Warning Event on `object`.
pub fn panic_event<K>(
    recorder: &crate::k8s::EventRecorder,
    object: Arc<K>,
    message: String,
) -> BoxFuture<'static, ()>
where
    K: kube::Resource<DynamicType = ()> + Send + Sync + 'static,
{
    let recorder = recorder.clone();
    async move {
        crate::k8s::publish_event(
            &recorder,
            &*object,
            kube::runtime::events::EventType::Warning,
            REASON_RECONCILE_PANICKED,
            "Reconcile",
            format!("the reconcile panicked (a raypipe bug; retried with backoff): {message}"),
        )
        .await;
    }
    .boxed()
}

/// Wraps a reconcile function so a panic becomes `Err(E::from(Panicked))` for that object.
pub fn contain<K, C, E, F, Fut>(
    controller: &'static str,
    reconcile: F,
) -> impl FnMut(Arc<K>, Arc<C>) -> BoxFuture<'static, Result<Action, E>>
where
    K: kube::Resource + Send + Sync + 'static,
    C: ReportPanic<K> + 'static,
    E: From<Panicked> + Send + 'static,
    F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    move |object: Arc<K>, ctx: Arc<C>| {
        let name = object_name(&*object);
        let (for_report, ctx_for_report) = (object.clone(), ctx.clone());
        // Building the future may panic too (it runs the function's synchronous prefix).
        let future = std::panic::catch_unwind(AssertUnwindSafe(|| reconcile(object, ctx)));
        async move {
            let outcome = match future {
                Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
                Err(payload) => Err(payload),
            };
            match outcome {
                Ok(result) => result,
                Err(payload) => {
                    let message = panic_message(&*payload);
                    tracing::error!(controller, object = %name, panic = %message, "reconcile panicked");
                    // The report must not take the controller down either.
                    let report = ctx_for_report.report_panic(for_report, message.clone());
                    if AssertUnwindSafe(report).catch_unwind().await.is_err() {
                        tracing::error!(controller, object = %name, "reporting a panic panicked");
                    }
                    Err(E::from(Panicked { message }))
                }
            }
        }
        .boxed()
    }
}

/// Wraps an error policy so that a panic in it requeues the object after
/// [`POLICY_PANIC_REQUEUE`] instead of unwinding the controller.
pub fn contain_policy<K, C, E, F>(
    controller: &'static str,
    policy: F,
) -> impl Fn(Arc<K>, &E, Arc<C>) -> Action
where
    K: kube::Resource,
    F: Fn(Arc<K>, &E, Arc<C>) -> Action,
{
    move |object: Arc<K>, error: &E, ctx: Arc<C>| {
        let name = object_name(&*object);
        std::panic::catch_unwind(AssertUnwindSafe(|| policy(object, error, ctx))).unwrap_or_else(
            |payload| {
                tracing::error!(
                    controller,
                    object = %name,
                    panic = %panic_message(&*payload),
                    "error policy panicked"
                );
                Action::requeue(POLICY_PANIC_REQUEUE)
            },
        )
    }
}

fn object_name<K: kube::Resource>(object: &K) -> String {
    let meta = object.meta();
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// Starts controller tasks under [`supervise`], all reporting to one health state.
#[derive(Clone)]
pub struct Supervisor {
    health: crate::admin::Readiness,
    shutting_down: tokio::sync::watch::Receiver<bool>,
}

impl Supervisor {
    pub fn new(
        health: crate::admin::Readiness,
        shutting_down: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        Supervisor {
            health,
            shutting_down,
        }
    }

    pub fn watch(
        &self,
        controller: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()> + Send + 'static {
        supervise(
            controller,
            self.health.clone(),
            self.shutting_down.clone(),
            task,
        )
    }
}

/// Runs a controller task and reports to `health` if it ends (returns or panics) before
/// `shutting_down` says the operator is stopping.
pub async fn supervise(
    controller: &'static str,
    health: crate::admin::Readiness,
    shutting_down: tokio::sync::watch::Receiver<bool>,
    task: impl Future<Output = ()> + Send + 'static,
) {
    let outcome = AssertUnwindSafe(task).catch_unwind().await;
    if *shutting_down.borrow() {
        return;
    }
    let why = match outcome {
        Ok(()) => "its watch stream ended".to_owned(),
        Err(payload) => format!("it panicked: {}", panic_message(&*payload)),
    };
    tracing::error!(controller, why, "controller stopped unexpectedly");
    health.controller_failed(controller, &why);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[derive(Debug, thiserror::Error)]
    enum TestError {
        #[error(transparent)]
        Panicked(#[from] Panicked),
    }

    /// Counts the panics reported, as a controller's context would publish them.
    #[derive(Default)]
    struct Reports(std::sync::Mutex<Vec<String>>);

    impl ReportPanic<ConfigMap> for Reports {
        fn report_panic(&self, object: Arc<ConfigMap>, message: String) -> BoxFuture<'static, ()> {
            self.0.lock().unwrap().push(format!(
                "{}: {message}",
                object.metadata.name.as_deref().unwrap_or("")
            ));
            async {}.boxed()
        }
    }

    fn object(name: &str) -> Arc<ConfigMap> {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("team".into());
        Arc::new(cm)
    }

    async fn reconcile(object: Arc<ConfigMap>, _ctx: Arc<Reports>) -> Result<Action, TestError> {
        tokio::task::yield_now().await;
        if object.metadata.name.as_deref() == Some("boom") {
            let values: Vec<u32> = Vec::new();
            let _ = values[object.metadata.name.as_ref().map_or(0, String::len)];
        }
        Ok(Action::await_change())
    }

    #[tokio::test]
    async fn a_panicking_reconcile_is_an_error_for_that_object_only() {
        let reports = Arc::new(Reports::default());
        let mut wrapped = contain("test", reconcile);
        let err = wrapped(object("boom"), reports.clone())
            .await
            .expect_err("the panic is an error");
        assert!(err.to_string().contains("index out of bounds"), "{err}");
        assert!(wrapped(object("fine"), reports.clone()).await.is_ok());
        let reported = reports.0.lock().unwrap().clone();
        assert_eq!(reported.len(), 1, "{reported:?}");
        assert!(
            reported[0].starts_with("boom: index out of bounds"),
            "{reported:?}"
        );
    }

    #[tokio::test]
    async fn a_panic_before_the_first_await_is_contained_too() {
        fn eager(
            object: Arc<ConfigMap>,
            _ctx: Arc<Reports>,
        ) -> futures::future::Ready<Result<Action, TestError>> {
            assert!(
                object.metadata.name.is_none(),
                "eager panic for {:?}",
                object.metadata.name
            );
            futures::future::ready(Ok(Action::await_change()))
        }
        let mut wrapped = contain("test", eager);
        let err = wrapped(object("x"), Arc::new(Reports::default()))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("eager panic"), "{err}");
    }

    #[test]
    fn a_panicking_error_policy_requeues_later() {
        let policy = contain_policy("test", |_: Arc<ConfigMap>, _: &TestError, _: Arc<()>| {
            panic!("policy bug")
        });
        let error = TestError::Panicked(Panicked {
            message: "x".into(),
        });
        assert_eq!(
            policy(object("x"), &error, Arc::new(())),
            Action::requeue(POLICY_PANIC_REQUEUE)
        );
    }

    #[tokio::test]
    async fn a_controller_task_that_ends_early_fails_health_but_not_at_shutdown() {
        let health = crate::admin::Readiness::new();
        let (stop, stopping) = tokio::sync::watch::channel(false);
        supervise("servepipeline", health.clone(), stopping.clone(), async {
            panic!("watch mapper bug")
        })
        .await;
        let failures = health.liveness_problems();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("servepipeline") && failures[0].contains("watch mapper bug"));
        assert!(!health.is_ready());

        let health = crate::admin::Readiness::new();
        stop.send(true).unwrap();
        supervise("raycluster", health.clone(), stopping, async {}).await;
        assert!(health.liveness_problems().is_empty());
    }
}
