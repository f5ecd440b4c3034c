//! The RayService controller's one error type.

use std::time::Duration;

use crate::controllers::frame::failure::K8S_ERROR_CATEGORY;
// Re-exported: the controller's files take the shared failure from beside `Error`.
pub(super) use crate::controllers::frame::failure::KubeFailure;
use crate::controllers::raycluster::builders::BuildError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] KubeFailure),
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
            Error::Kube(_) => KubeFailure::CATEGORY,
            Error::Apply(_) => K8S_ERROR_CATEGORY,
            Error::Build(_) => "build",
            Error::CacheNotReady(_) => "cache",
            Error::Panicked(_) => "panic",
        }
    }
}
