//! The pass: the stages of one reconcile, which every controller implements ([`Stages`]) and the
//! frame runs in one order ([`pass`]):
//!
//! 1. **observe** — reads only: the object (from the cache, or fresh where a stale read would
//!    decide wrongly) and what the pass needs besides. It may end the pass early ([`Flow`]): the
//!    object is another controller's, gone, or being deleted (then [`Stages::finalize`] runs).
//! 2. **validate** — pure: the kind's rule book with the feature gates. A refused spec gets the
//!    one policy of [`super::refuse`] (a Warning Event, then wait for a change), and
//!    [`Stages::refused`] may record it in the status.
//! 3. **act** — the kind's build (pure) and apply (its only writes, in the order it owns). It
//!    returns the status it computed ([`Acted`]).
//! 4. **status** — the frame writes the status at most once per pass: the kind says whether it
//!    changed ([`Stages::plan_write`]), the frame stamps and server-side applies it under the
//!    kind's field manager and hands it back to be remembered.
//! 5. **finish** — what the pass returns: when to look again, or the error the frame's retry
//!    policy takes.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::core::NamespaceResourceScope;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::failure::KubeFailure;
use super::policy::ReconcileError;
use super::refuse::refuse;
use super::run::Framed;
use crate::validation::problem::Problem;

/// What a kind the frame watches and reconciles needs to be: namespaced, typed and cacheable.
pub trait Watchable:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<T> Watchable for T where
    T: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// Whether the pass goes on after the observe stage.
pub enum Flow<K, O> {
    /// Go on with what was observed.
    Go(O),
    /// The object is being deleted: [`Stages::finalize`] runs instead of the pass.
    Deleting(Arc<K>),
    /// Nothing to do now (another controller manages the object, it is gone, the cache is
    /// behind): the pass ends with this action.
    Done(Action),
}

/// What the act stage leaves for the status and finish stages.
pub struct Acted<S, A, E> {
    /// The status the pass computed; `None` when the pass stopped before knowing it (nothing is
    /// written then).
    pub status: Option<S>,
    /// What the act stage did, for [`Stages::finish`], or why it failed.
    pub result: Result<A, E>,
}

impl<S, A, E> Acted<S, A, E> {
    /// The act stage failed before it had a status.
    pub fn failed(error: E) -> Self {
        Acted {
            status: None,
            result: Err(error),
        }
    }
}

/// What the status stage does with a computed status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusWrite {
    /// Nothing new: the API server has it, or this controller wrote it moments ago.
    Skip,
    /// Write it now.
    Now,
    /// Only progress changed: write it after this long, unless something weightier comes first
    /// (the next pass recomputes it).
    Hold(Duration),
}

/// The stages one controller implements for its kind `K`; [`pass`] runs them.
pub trait Stages<K: Watchable>: Framed<K> + Sized {
    /// What the observe stage read.
    type Observed: Send + Sync;
    /// The values the rule book parsed on the way (durations, modes, schedules).
    type Valid: Send;
    /// The kind's status.
    type Status: Serialize + Send + Sync;
    /// What the act stage hands to [`Stages::finish`].
    type Applied: Send;
    /// The controller's error.
    type Error: ReconcileError + From<KubeFailure>;

    /// The field manager of the status writes.
    const FIELD_MANAGER: &'static str;

    /// The client of the status writes and the recorder of the refusal Events.
    fn kube(&self) -> (&kube::Client, &crate::k8s::EventRecorder);

    /// The observe stage (reads only). The controller's context comes as its `Arc`, for the
    /// work a stage hands to a task of its own (ServePipeline's source lane).
    fn observe(
        self: &Arc<Self>,
        object: Arc<K>,
    ) -> impl Future<Output = Result<Flow<K, Self::Observed>, Self::Error>> + Send;

    /// The object the pass is about, as observed.
    fn object(observed: &Self::Observed) -> &K;

    /// A deleted object's cleanup (by default nothing: the garbage collector takes the children).
    fn finalize(&self, object: Arc<K>) -> impl Future<Output = Result<Action, Self::Error>> + Send {
        let _ = object;
        async { Ok(Action::await_change()) }
    }

    /// The validate stage (pure): the first problem, in KubeRay's order and words.
    fn validate(&self, observed: &Self::Observed) -> Result<Self::Valid, Problem>;

    /// The status recording a refused spec (pure), if the kind has one; an error fails the pass
    /// instead (after the Event).
    fn refused(
        &self,
        observed: &Self::Observed,
        problem: &Problem,
    ) -> Result<Option<Self::Status>, Self::Error> {
        let _ = (observed, problem);
        Ok(None)
    }

    /// The act stage: build (pure) and apply.
    fn act(
        self: &Arc<Self>,
        observed: &Self::Observed,
        valid: Self::Valid,
    ) -> impl Future<Output = Acted<Self::Status, Self::Applied, Self::Error>> + Send;

    /// Whether `status` needs writing (pure: the kind's own comparison with what was written).
    fn plan_write(&self, observed: &Self::Observed, status: &Self::Status) -> StatusWrite;

    /// Marks a status about to be written (a kind's last-update time).
    fn stamp(&self, status: &mut Self::Status) {
        let _ = status;
    }

    /// Keeps the status the status stage decided on (written, held or skipped) for the next
    /// pass, which may run before the cache shows it.
    fn remember(&self, observed: &Self::Observed, status: Self::Status, write: StatusWrite) {
        let _ = (observed, status, write);
    }

    /// The finish stage: the pass's answer from what the act stage did and what the status stage
    /// wrote (Events that follow a written status go here).
    fn finish(
        &self,
        observed: &Self::Observed,
        applied: Result<Self::Applied, Self::Error>,
        write: StatusWrite,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send;
}

/// One pass over `object`: observe → validate (or refuse) → act → status → finish.
pub async fn pass<K: Watchable, S: Stages<K>>(
    object: Arc<K>,
    stages: Arc<S>,
) -> Result<Action, S::Error> {
    let observed = match stages.observe(object).await? {
        Flow::Go(observed) => observed,
        Flow::Deleting(object) => return stages.finalize(object).await,
        Flow::Done(action) => return Ok(action),
    };
    let acted = match stages.validate(&observed) {
        Ok(valid) => stages.act(&observed, valid).await,
        Err(problem) => {
            let object = S::object(&observed);
            let wait = refuse(stages.kube().1, object, problem.reason, &problem.message).await;
            let status = stages.refused(&observed, &problem)?;
            return match status {
                Some(status) => write_status(&*stages, &observed, status)
                    .await
                    .map(|_| wait),
                None => Ok(wait),
            };
        }
    };
    let write = match acted.status {
        Some(status) => write_status(&*stages, &observed, status).await?,
        None => StatusWrite::Skip,
    };
    stages.finish(&observed, acted.result, write).await
}

/// The status stage: plans the write, stamps and server-side applies the status when it is due
/// now, and hands it back to the kind to remember.
async fn write_status<K: Watchable, S: Stages<K>>(
    stages: &S,
    observed: &S::Observed,
    mut status: S::Status,
) -> Result<StatusWrite, S::Error> {
    let write = stages.plan_write(observed, &status);
    if write == StatusWrite::Now {
        stages.stamp(&mut status);
        let object = S::object(observed);
        super::status::apply_status(stages.kube().0, object, S::FIELD_MANAGER, &status)
            .await
            .map_err(|e| {
                KubeFailure::new(
                    format!(
                        "writing the status of {} {}",
                        K::kind(&()),
                        object.name_any()
                    ),
                    e,
                )
            })?;
    }
    stages.remember(observed, status, write);
    Ok(write)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::FutureExt;
    use futures::future::BoxFuture;
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;
    use crate::controllers::frame::run::Frame;
    use crate::controllers::frame::{Panicked, ReportPanic};

    #[derive(Debug, thiserror::Error)]
    enum TestError {
        #[error(transparent)]
        Kube(#[from] KubeFailure),
        #[error("act failed")]
        Act,
        #[error("refused and failed")]
        Refused,
        #[error(transparent)]
        Panicked(#[from] Panicked),
    }

    impl ReconcileError for TestError {
        fn category(&self) -> &'static str {
            "test"
        }
    }

    /// What a scripted pass does at each stage.
    #[derive(Clone, Copy)]
    enum Observe {
        Go,
        Deleting,
        Done,
    }

    #[derive(Clone, Copy)]
    enum Validate {
        Ok,
        Refuse { with_status: bool, fail: bool },
    }

    #[derive(Clone, Copy)]
    enum Act {
        Status(StatusWrite),
        NoStatusFailed,
    }

    struct Script {
        frame: Frame<ConfigMap>,
        client: kube::Client,
        recorder: crate::k8s::EventRecorder,
        observe: Observe,
        validate: Validate,
        act: Act,
        /// The stages in the order they ran, with what they were given.
        calls: Mutex<Vec<String>>,
    }

    impl Script {
        fn new(observe: Observe, validate: Validate, act: Act) -> Arc<Script> {
            // Nothing listens there: an Event or a write fails at once, on loopback.
            let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
            let client = kube::Client::try_from(config).unwrap();
            Arc::new(Script {
                frame: Frame::new("passtest", &crate::admin::Metrics::new()),
                recorder: crate::k8s::recorder(client.clone(), "passtest"),
                client,
                observe,
                validate,
                act,
                calls: Mutex::new(Vec::new()),
            })
        }

        fn call(&self, what: impl Into<String>) {
            self.calls.lock().unwrap().push(what.into());
        }

        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl ReportPanic<ConfigMap> for Script {
        fn report_panic(&self, _: Arc<ConfigMap>, _: String) -> BoxFuture<'static, ()> {
            async {}.boxed()
        }
    }

    impl Framed<ConfigMap> for Script {
        fn frame(&self) -> &Frame<ConfigMap> {
            &self.frame
        }
    }

    impl Stages<ConfigMap> for Script {
        type Observed = Arc<ConfigMap>;
        type Valid = u32;
        type Status = String;
        type Applied = u32;
        type Error = TestError;
        const FIELD_MANAGER: &'static str = "passtest";

        fn kube(&self) -> (&kube::Client, &crate::k8s::EventRecorder) {
            (&self.client, &self.recorder)
        }

        async fn observe(
            self: &Arc<Self>,
            object: Arc<ConfigMap>,
        ) -> Result<Flow<ConfigMap, Arc<ConfigMap>>, TestError> {
            self.call("observe");
            Ok(match self.observe {
                Observe::Go => Flow::Go(object),
                Observe::Deleting => Flow::Deleting(object),
                Observe::Done => Flow::Done(Action::requeue(Duration::from_secs(7))),
            })
        }

        fn object(observed: &Arc<ConfigMap>) -> &ConfigMap {
            observed
        }

        async fn finalize(&self, _: Arc<ConfigMap>) -> Result<Action, TestError> {
            self.call("finalize");
            Ok(Action::requeue(Duration::from_secs(3)))
        }

        fn validate(&self, _: &Arc<ConfigMap>) -> Result<u32, Problem> {
            self.call("validate");
            match self.validate {
                Validate::Ok => Ok(41),
                Validate::Refuse { .. } => Err(Problem::new("spec", "InvalidSpec", "no good")),
            }
        }

        fn refused(
            &self,
            _: &Arc<ConfigMap>,
            problem: &Problem,
        ) -> Result<Option<String>, TestError> {
            self.call(format!("refused {}", problem.message));
            match self.validate {
                Validate::Refuse { fail: true, .. } => Err(TestError::Refused),
                Validate::Refuse {
                    with_status: true, ..
                } => Ok(Some("refused".into())),
                _ => Ok(None),
            }
        }

        async fn act(
            self: &Arc<Self>,
            _: &Arc<ConfigMap>,
            valid: u32,
        ) -> Acted<String, u32, TestError> {
            self.call(format!("act {valid}"));
            match self.act {
                Act::Status(_) => Acted {
                    status: Some("acted".into()),
                    result: Ok(valid + 1),
                },
                Act::NoStatusFailed => Acted::failed(TestError::Act),
            }
        }

        fn plan_write(&self, _: &Arc<ConfigMap>, status: &String) -> StatusWrite {
            self.call(format!("plan {status}"));
            match self.act {
                Act::Status(write) => write,
                Act::NoStatusFailed => StatusWrite::Now,
            }
        }

        fn stamp(&self, status: &mut String) {
            self.call(format!("stamp {status}"));
        }

        fn remember(&self, _: &Arc<ConfigMap>, status: String, write: StatusWrite) {
            self.call(format!("remember {status} {write:?}"));
        }

        async fn finish(
            &self,
            _: &Arc<ConfigMap>,
            applied: Result<u32, TestError>,
            write: StatusWrite,
        ) -> Result<Action, TestError> {
            self.call(format!(
                "finish {} {write:?}",
                applied.as_ref().map_or(0, |a| *a)
            ));
            applied.map(|a| Action::requeue(Duration::from_secs(a.into())))
        }
    }

    fn object() -> Arc<ConfigMap> {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("one".into());
        cm.metadata.namespace = Some("team".into());
        Arc::new(cm)
    }

    #[tokio::test]
    async fn a_pass_runs_the_stages_in_order_and_skips_an_unchanged_status() {
        let script = Script::new(Observe::Go, Validate::Ok, Act::Status(StatusWrite::Skip));
        let action = pass(object(), script.clone()).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(42)));
        assert_eq!(
            script.calls(),
            [
                "observe",
                "validate",
                "act 41",
                "plan acted",
                "remember acted Skip",
                "finish 42 Skip"
            ]
        );
    }

    #[tokio::test]
    async fn a_held_status_is_remembered_and_not_written() {
        let hold = StatusWrite::Hold(Duration::from_secs(2));
        let script = Script::new(Observe::Go, Validate::Ok, Act::Status(hold));
        pass(object(), script.clone()).await.unwrap();
        assert_eq!(
            script.calls()[3..],
            [
                "plan acted",
                "remember acted Hold(2s)",
                "finish 42 Hold(2s)"
            ]
        );
    }

    #[tokio::test]
    async fn observe_can_end_the_pass_or_hand_a_deleted_object_to_finalize() {
        let done = Script::new(Observe::Done, Validate::Ok, Act::Status(StatusWrite::Skip));
        let action = pass(object(), done.clone()).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(7)));
        assert_eq!(done.calls(), ["observe"]);

        let deleting = Script::new(
            Observe::Deleting,
            Validate::Ok,
            Act::Status(StatusWrite::Now),
        );
        let action = pass(object(), deleting.clone()).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(3)));
        assert_eq!(deleting.calls(), ["observe", "finalize"]);
    }

    #[tokio::test]
    async fn a_refused_spec_waits_for_a_change_and_never_acts() {
        let refuse = Validate::Refuse {
            with_status: false,
            fail: false,
        };
        let script = Script::new(Observe::Go, refuse, Act::Status(StatusWrite::Now));
        let action = pass(object(), script.clone()).await.unwrap();
        assert_eq!(action, Action::await_change());
        assert_eq!(script.calls(), ["observe", "validate", "refused no good"]);

        let failing = Validate::Refuse {
            with_status: false,
            fail: true,
        };
        let script = Script::new(Observe::Go, failing, Act::Status(StatusWrite::Now));
        let error = pass(object(), script.clone()).await.unwrap_err();
        assert!(matches!(error, TestError::Refused), "{error}");
        assert_eq!(script.calls(), ["observe", "validate", "refused no good"]);
    }

    #[tokio::test]
    async fn a_refusal_recorded_in_the_status_goes_through_the_status_stage() {
        let refuse = Validate::Refuse {
            with_status: true,
            fail: false,
        };
        let script = Script::new(Observe::Go, refuse, Act::Status(StatusWrite::Skip));
        assert_eq!(
            pass(object(), script.clone()).await.unwrap(),
            Action::await_change()
        );
        assert_eq!(
            script.calls()[2..],
            ["refused no good", "plan refused", "remember refused Skip"]
        );
    }

    #[tokio::test]
    async fn a_failed_act_without_a_status_writes_nothing_and_finish_sees_the_error() {
        let script = Script::new(Observe::Go, Validate::Ok, Act::NoStatusFailed);
        let error = pass(object(), script.clone()).await.unwrap_err();
        assert!(matches!(error, TestError::Act), "{error}");
        assert_eq!(
            script.calls(),
            ["observe", "validate", "act 41", "finish 0 Skip"]
        );
    }

    #[tokio::test]
    async fn a_failed_status_write_fails_the_pass_before_remember_and_finish() {
        let script = Script::new(Observe::Go, Validate::Ok, Act::Status(StatusWrite::Now));
        let error = pass(object(), script.clone()).await.unwrap_err();
        assert!(
            error
                .to_string()
                .contains("writing the status of ConfigMap one"),
            "{error}"
        );
        assert_eq!(script.calls()[2..], ["act 41", "plan acted", "stamp acted"]);
    }
}
