//! The RayService controller's one error type.

use std::time::Duration;

use crate::controllers::raycluster::builders::BuildError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(transparent)]
    Apply(#[from] crate::k8s::K8sError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("the RayCluster and Service caches did not sync within {0:?}")]
    CacheNotReady(Duration),
    /// A bug: the reconcile panicked; contained to this object (see `controllers::frame`).
    #[error(transparent)]
    Panicked(#[from] crate::controllers::frame::Panicked),
}

impl crate::controllers::frame::policy::ReconcileError for Error {
    /// The `category` label of the reconcile error metric.
    fn category(&self) -> &'static str {
        match self {
            Error::Kube { .. } | Error::Apply(_) => "apply",
            Error::Build(_) => "build",
            Error::CacheNotReady(_) => "cache",
            Error::Panicked(_) => "panic",
        }
    }
}

impl Error {
    pub(super) fn kube(action: impl Into<String>, source: kube::Error) -> Error {
        Error::Kube {
            action: action.into(),
            source: Box::new(source),
        }
    }
}
