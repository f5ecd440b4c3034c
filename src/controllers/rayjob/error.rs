//! The RayJob controller's one error type.

use crate::controllers::frame::failure::{K8S_ERROR_CATEGORY, KubeFailure};
// Re-exported: the controller's files take the shared failure from beside `Error`.
pub(super) use crate::controllers::frame::failure::kube_err;
use crate::ray::DashboardError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] KubeFailure),
    #[error(transparent)]
    K8s(#[from] crate::k8s::K8sError),
    /// The RayJob cannot be built into objects (caught by validation first, normally).
    #[error("{0}")]
    Invalid(String),
    #[error("RayCluster {0} selected by clusterSelector does not exist")]
    ClusterNotFound(String),
    #[error(transparent)]
    Dashboard(#[from] DashboardError),
    /// A bug: the reconcile panicked; contained to this object (see `controllers::frame`).
    #[error(transparent)]
    Panicked(#[from] crate::controllers::frame::Panicked),
}

impl crate::controllers::frame::policy::ReconcileError for Error {
    /// The `category` label of the reconcile error metric. Every error is retried with backoff.
    fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => KubeFailure::CATEGORY,
            Error::K8s(_) => K8S_ERROR_CATEGORY,
            Error::Invalid(_) => "build",
            Error::ClusterNotFound(_) => "cluster",
            Error::Dashboard(_) => "dashboard",
            Error::Panicked(_) => "panic",
        }
    }
}
