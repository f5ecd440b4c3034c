//! [`ChildWriter::write`]: writes one child object of an owner (create-only or server-side
//! apply, never taking over someone else's object) and publishes on the owner the Event that
//! names the outcome. The controllers write their children this way, so a call site declares
//! only what differs: the object, how it is written and the words of its Events
//! ([`ChildEvents`]).

use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::Api;
use kube::runtime::events::EventType;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::k8s::{Created, EventRecorder, K8sError};

/// How a child is written.
#[derive(Debug, Clone, Copy)]
pub enum Mode<'a> {
    /// [`crate::k8s::create_owned`]: made once, an existing object is never written.
    Create,
    /// [`crate::k8s::apply_owned`], with what the caller already knows of the object.
    Apply { existing: Option<&'a ObjectMeta> },
}

/// What a successful [`ChildWriter::write`] did.
#[derive(Debug)]
pub enum Written<K> {
    /// Created now ([`Mode::Create`]).
    New(K),
    /// [`Mode::Create`] found the object already ours (an earlier pass made it); not written.
    AlreadyOurs(K),
    /// Server-side applied ([`Mode::Apply`]; created or updated).
    Applied(K),
}

impl<K> Written<K> {
    pub fn is_new(&self) -> bool {
        matches!(self, Written::New(_))
    }

    /// The object as the API server returned or holds it.
    pub fn into_object(self) -> K {
        match self {
            Written::New(k) | Written::AlreadyOurs(k) | Written::Applied(k) => k,
        }
    }
}

/// A reason and a message (for a failure, the text before `": {error}"`).
#[derive(Debug, Clone)]
struct Note<'a> {
    reason: &'a str,
    message: String,
}

/// How a conflict (an object of the name that the owner does not control) is reported.
#[derive(Debug, Clone)]
enum OnConflict<'a> {
    /// Like any other failure, under the failure's reason.
    AsFailure,
    /// Like any failure, but under the conflict's reason (`<Kind>Conflict`).
    ConflictReason,
    /// Under the conflict's reason, with this message prefix instead of the failure's.
    ConflictReasonAs(String),
    /// Under the conflict's reason and this action, with the error's text alone (it names the
    /// object and its controller), as the owner reports a conflict it finds by reading.
    Report { action: &'a str },
}

/// The Events of one child write, all on the owner and under one action. An outcome with no
/// Event declared publishes none.
#[derive(Debug, Clone)]
pub struct ChildEvents<'a> {
    action: &'a str,
    written: Option<Note<'a>>,
    already_ours_too: bool,
    failed: Option<Note<'a>>,
    conflict: OnConflict<'a>,
}

/// One Event to publish, as [`ChildEvents::for_outcome`] chose it.
#[derive(Debug, Clone)]
struct Chosen<'a> {
    type_: EventType,
    reason: &'a str,
    action: &'a str,
    message: String,
}

/// A write's outcome without the object, for the Event choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    New,
    AlreadyOurs,
    Applied,
}

impl<'a> ChildEvents<'a> {
    /// No Events yet, published under `action` (e.g. `CreateRayCluster`).
    pub fn new(action: &'a str) -> Self {
        ChildEvents {
            action,
            written: None,
            already_ours_too: false,
            failed: None,
            conflict: OnConflict::AsFailure,
        }
    }

    /// A Normal Event after a write (not after [`Written::AlreadyOurs`], see
    /// [`Self::already_ours_too`]).
    pub fn written(mut self, reason: &'a str, message: String) -> Self {
        self.written = Some(Note { reason, message });
        self
    }

    /// The [`Self::written`] Event also when a create found the object already ours.
    pub fn already_ours_too(mut self) -> Self {
        self.already_ours_too = true;
        self
    }

    /// A Warning Event when the write fails: `reason`, and `"{prefix}: {error}"`.
    pub fn failed(mut self, reason: &'a str, prefix: String) -> Self {
        self.failed = Some(Note {
            reason,
            message: prefix,
        });
        self
    }

    /// A conflict is reported as [`Self::failed`] but under its own reason (`<Kind>Conflict`).
    pub fn conflict_reason(mut self) -> Self {
        self.conflict = OnConflict::ConflictReason;
        self
    }

    /// A conflict is reported under its own reason with `"{prefix}: {error}"`.
    pub fn conflict_reason_as(mut self, prefix: String) -> Self {
        self.conflict = OnConflict::ConflictReasonAs(prefix);
        self
    }

    /// A conflict is reported under its own reason and `action`, with the error's text alone.
    pub fn conflict_report(mut self, action: &'a str) -> Self {
        self.conflict = OnConflict::Report { action };
        self
    }

    /// The Event for `outcome`, if one is declared. Pure.
    fn for_outcome(self, outcome: Result<Outcome, &K8sError>) -> Option<Chosen<'a>> {
        let action = self.action;
        let chosen = |type_, reason, message| Chosen {
            type_,
            reason,
            action,
            message,
        };
        match outcome {
            Ok(Outcome::AlreadyOurs) if !self.already_ours_too => None,
            Ok(_) => self
                .written
                .map(|n| chosen(EventType::Normal, n.reason, n.message)),
            Err(e) => match (e.conflict_reason(), self.conflict) {
                (Some(reason), OnConflict::Report { action }) => Some(Chosen {
                    type_: EventType::Warning,
                    reason,
                    action,
                    message: e.to_string(),
                }),
                (Some(reason), OnConflict::ConflictReasonAs(prefix)) => {
                    Some(chosen(EventType::Warning, reason, format!("{prefix}: {e}")))
                }
                (Some(reason), OnConflict::ConflictReason) => self
                    .failed
                    .map(|n| chosen(EventType::Warning, reason, format!("{}: {e}", n.message))),
                _ => self
                    .failed
                    .map(|n| chosen(EventType::Warning, n.reason, format!("{}: {e}", n.message))),
            },
        }
    }
}

/// Writes the children of one owner, reporting each write on the owner.
pub struct ChildWriter<'a, O> {
    recorder: &'a EventRecorder,
    owner: &'a O,
    field_manager: &'a str,
}

impl<'a, O: Resource<DynamicType = ()>> ChildWriter<'a, O> {
    /// Writes `owner`'s children under `field_manager`, with Events through `recorder`.
    pub fn new(recorder: &'a EventRecorder, owner: &'a O, field_manager: &'a str) -> Self {
        ChildWriter {
            recorder,
            owner,
            field_manager,
        }
    }

    /// Writes the child `desired` (whose controller reference names the owner) as `mode` says,
    /// then publishes on the owner the Event `events` declares for the outcome. The error is
    /// returned as it is, so the caller keeps its own error handling.
    pub async fn write<K>(
        &self,
        api: &Api<K>,
        desired: &K,
        mode: Mode<'_>,
        events: ChildEvents<'_>,
    ) -> Result<Written<K>, K8sError>
    where
        K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
    {
        let result = match mode {
            Mode::Create => crate::k8s::create_owned(api, desired, self.field_manager)
                .await
                .map(|created| match created {
                    Created::New(k) => Written::New(k),
                    Created::AlreadyOurs(k) => Written::AlreadyOurs(k),
                }),
            Mode::Apply { existing } => {
                crate::k8s::apply_owned(api, desired, existing, self.field_manager)
                    .await
                    .map(Written::Applied)
            }
        };
        let outcome = result.as_ref().map(|written| match written {
            Written::New(_) => Outcome::New,
            Written::AlreadyOurs(_) => Outcome::AlreadyOurs,
            Written::Applied(_) => Outcome::Applied,
        });
        if let Some(event) = events.for_outcome(outcome) {
            crate::k8s::publish_event(
                self.recorder,
                self.owner,
                event.type_,
                event.reason,
                event.action,
                event.message,
            )
            .await;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_owned() -> K8sError {
        K8sError::NotOwned {
            kind: "Service".into(),
            namespace: "team".into(),
            name: "web".into(),
            controller: Some("RayCluster/other".into()),
        }
    }

    fn other_failure() -> K8sError {
        K8sError::MissingMetadata {
            kind: "Service".into(),
            name: "web".into(),
            what: "controller ownerReference",
        }
    }

    fn events() -> ChildEvents<'static> {
        ChildEvents::new("Create")
            .written("CreatedService", "Created Service team/web".into())
            .failed(
                "FailedToCreateService",
                "Failed creating Service team/web".into(),
            )
    }

    fn event(type_: EventType, reason: &str, action: &str, message: &str) -> Option<String> {
        Some(format!("{type_:?} {reason} {action}: {message}"))
    }

    fn chosen(events: ChildEvents<'_>, outcome: Result<Outcome, &K8sError>) -> Option<String> {
        events
            .for_outcome(outcome)
            .map(|c| format!("{:?} {} {}: {}", c.type_, c.reason, c.action, c.message))
    }

    #[test]
    fn a_write_publishes_the_normal_event_and_already_ours_only_when_asked() {
        let created = event(
            EventType::Normal,
            "CreatedService",
            "Create",
            "Created Service team/web",
        );
        assert_eq!(chosen(events(), Ok(Outcome::New)), created);
        assert_eq!(chosen(events(), Ok(Outcome::Applied)), created);
        assert_eq!(chosen(events(), Ok(Outcome::AlreadyOurs)), None);
        assert_eq!(
            chosen(events().already_ours_too(), Ok(Outcome::AlreadyOurs)),
            created
        );
        assert_eq!(chosen(ChildEvents::new("Create"), Ok(Outcome::New)), None);
    }

    #[test]
    fn a_failure_publishes_the_warning_with_the_error_after_the_prefix() {
        let failure = other_failure();
        let expected = event(
            EventType::Warning,
            "FailedToCreateService",
            "Create",
            &format!("Failed creating Service team/web: {failure}"),
        );
        for events in [
            events(),
            events().conflict_reason(),
            events().conflict_reason_as("applying Service web failed".into()),
            events().conflict_report("CreateChild"),
        ] {
            // Only a conflict is told apart; any other failure is the declared Warning.
            assert_eq!(chosen(events, Err(&failure)), expected);
        }
        assert_eq!(
            chosen(ChildEvents::new("Create"), Err(&failure)),
            None,
            "no Warning declared, none published"
        );
    }

    #[test]
    fn a_conflict_is_reported_as_declared() {
        let conflict = not_owned();
        let text = conflict.to_string();
        assert_eq!(
            chosen(events(), Err(&conflict)),
            event(
                EventType::Warning,
                "FailedToCreateService",
                "Create",
                &format!("Failed creating Service team/web: {text}")
            )
        );
        assert_eq!(
            chosen(events().conflict_reason(), Err(&conflict)),
            event(
                EventType::Warning,
                "ServiceConflict",
                "Create",
                &format!("Failed creating Service team/web: {text}")
            )
        );
        assert_eq!(
            chosen(
                events().conflict_reason_as("applying Service web failed".into()),
                Err(&conflict)
            ),
            event(
                EventType::Warning,
                "ServiceConflict",
                "Create",
                &format!("applying Service web failed: {text}")
            )
        );
        assert_eq!(
            chosen(events().conflict_report("CreateChild"), Err(&conflict)),
            event(EventType::Warning, "ServiceConflict", "CreateChild", &text)
        );
        // A conflict report needs no failure Event declared (a RayCronJob publishes only it).
        assert_eq!(
            chosen(
                ChildEvents::new("CreateRayJob").conflict_report("CreateRayJob"),
                Err(&conflict)
            ),
            event(EventType::Warning, "ServiceConflict", "CreateRayJob", &text)
        );
    }
}
