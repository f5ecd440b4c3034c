//! The RayCronJob controller's one error type.

use crate::controllers::frame::failure::K8S_ERROR_CATEGORY;
// Re-exported: the controller's files take the shared failure from beside `Error`.
pub(super) use crate::controllers::frame::failure::{KubeFailure, kube_err};
use crate::controllers::frame::policy::ReconcileError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] KubeFailure),
    #[error(transparent)]
    K8s(#[from] crate::k8s::K8sError),
    /// A bug: the reconcile panicked; contained to this object (see `controllers::frame`).
    #[error(transparent)]
    Panicked(#[from] crate::controllers::frame::Panicked),
}

impl ReconcileError for Error {
    fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => KubeFailure::CATEGORY,
            Error::K8s(_) => K8S_ERROR_CATEGORY,
            Error::Panicked(_) => "panic",
        }
    }
}
