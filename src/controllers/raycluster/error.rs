//! The one error type of the RayCluster controller: what failed (with the `ReplicaFailure`
//! reason when a Pod could not be created or deleted, which the status shows), and the
//! category the shared reconcile frame counts it under.

use std::time::Duration;

use super::builders::BuildError;
use crate::controllers::frame::policy::ReconcileError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        /// The `ReplicaFailure` reason when a Pod could not be created or deleted.
        replica_failure: Option<&'static str>,
        // Boxed: kube::Error is large and this enum travels through every reconcile.
        #[source]
        source: Box<kube::Error>,
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
            Error::Kube { .. } | Error::Apply(_) => "apply",
            Error::Build(_) => "build",
            Error::Conflict(_) => "conflict",
            Error::InvalidStatus(_) => "status",
            Error::CacheNotReady(_) => "cache",
            Error::Panicked(_) => "panic",
        }
    }
}

impl Error {
    pub(super) fn kube(action: impl Into<String>, source: kube::Error) -> Error {
        Error::Kube {
            action: action.into(),
            replica_failure: None,
            source: Box::new(source),
        }
    }

    pub(super) fn replica(
        reason: &'static str,
        action: impl Into<String>,
        source: kube::Error,
    ) -> Error {
        Error::Kube {
            action: action.into(),
            replica_failure: Some(reason),
            source: Box::new(source),
        }
    }

    pub(super) fn replica_failure(&self) -> Option<&'static str> {
        match self {
            Error::Kube {
                replica_failure, ..
            } => *replica_failure,
            // An object in the way of a child blocks the cluster as a failed Pod would.
            Error::Apply(e) => e.conflict_reason(),
            _ => None,
        }
    }
}
