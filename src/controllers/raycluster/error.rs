//! The one error type of the RayCluster controller: what failed (with the `ReplicaFailure`
//! reason when a Pod could not be created or deleted, which the status shows), and the
//! category the shared reconcile frame counts it under.

use std::time::Duration;

use super::builders::BuildError;
use crate::controllers::frame::failure::K8S_ERROR_CATEGORY;
// Re-exported: the controller's files take the shared failure from beside `Error`.
pub(super) use crate::controllers::frame::failure::KubeFailure;
use crate::controllers::frame::policy::ReconcileError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] KubeFailure),
    /// A Pod could not be created or deleted; `reason` is the `ReplicaFailure` reason.
    #[error("{failure}")]
    Replica {
        reason: &'static str,
        #[source]
        failure: KubeFailure,
    },
    #[error(transparent)]
    Apply(#[from] crate::k8s::K8sError),
    #[error(transparent)]
    Build(#[from] BuildError),
    /// Objects in the way: two head Pods, a Service of the same name owned by someone else.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    InvalidStatus(String),
    #[error("the Pod and Service caches did not sync within {0:?}")]
    CacheNotReady(Duration),
    /// A bug: the reconcile panicked; contained to this object (see `controllers::frame`).
    #[error(transparent)]
    Panicked(#[from] crate::controllers::frame::Panicked),
}

impl ReconcileError for Error {
    fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) | Error::Replica { .. } => KubeFailure::CATEGORY,
            Error::Apply(_) => K8S_ERROR_CATEGORY,
            Error::Build(_) => "build",
            Error::Conflict(_) => "conflict",
            Error::InvalidStatus(_) => "status",
            Error::CacheNotReady(_) => "cache",
            Error::Panicked(_) => "panic",
        }
    }
}

impl Error {
    pub(super) fn replica(
        reason: &'static str,
        action: impl Into<String>,
        source: kube::Error,
    ) -> Error {
        Error::Replica {
            reason,
            failure: KubeFailure::new(action, source),
        }
    }

    pub(super) fn replica_failure(&self) -> Option<&'static str> {
        match self {
            Error::Replica { reason, .. } => Some(reason),
            // An object in the way of a child blocks the cluster as a failed Pod would.
            Error::Apply(e) => e.conflict_reason(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden() -> kube::Error {
        crate::controllers::frame::failure::tests::api_error(403, "Forbidden")
    }

    #[test]
    fn a_failed_pod_carries_its_replica_failure_reason_and_the_same_message() {
        let replica = Error::replica("FailedCreateWorkerPod", "creating Pod w-1", forbidden());
        assert_eq!(replica.replica_failure(), Some("FailedCreateWorkerPod"));
        assert_eq!(
            replica.to_string(),
            format!("creating Pod w-1: {}", forbidden())
        );
        assert_eq!(replica.category(), KubeFailure::CATEGORY);

        let other = Error::from(KubeFailure::new("reading Secret s", forbidden()));
        assert_eq!(other.replica_failure(), None);
        assert_eq!(
            other.to_string(),
            format!("reading Secret s: {}", forbidden())
        );
        assert_eq!(other.category(), KubeFailure::CATEGORY);
    }

    #[test]
    fn an_object_in_the_way_is_a_replica_failure_counted_as_apply() {
        let conflict = Error::Apply(crate::k8s::K8sError::NotOwned {
            kind: "Service".into(),
            namespace: "team".into(),
            name: "c-head-svc".into(),
            controller: None,
        });
        assert_eq!(
            conflict.replica_failure(),
            Some(crate::k8s::conflict_reason("Service"))
        );
        assert_eq!(conflict.category(), K8S_ERROR_CATEGORY);
    }
}
