//! The RayCronJob controller's one error type.

use crate::controllers::frame::policy::ReconcileError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error(transparent)]
    K8s(#[from] crate::k8s::K8sError),
    /// A bug: the reconcile panicked; contained to this object (see `controllers::frame`).
    #[error(transparent)]
    Panicked(#[from] crate::controllers::frame::Panicked),
}

impl ReconcileError for Error {
    fn category(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::K8s(_) => "apply",
            Error::Panicked(_) => "panic",
        }
    }
}

pub(super) fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube {
        action,
        source: Box::new(source),
    }
}
