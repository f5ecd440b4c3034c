//! The ServePipeline controller's one error type and how the frame retries each kind.

use super::build::reasons;
use crate::controllers::frame::failure::K8S_ERROR_CATEGORY;
// Re-exported: the controller's files take the shared failure from beside `Error`.
pub(super) use crate::controllers::frame::failure::KubeFailure;
use crate::controllers::frame::policy::{ReconcileError, Retry};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading an object ("reading X: ...") or writing the status ("writing the status of N: ...").
    #[error(transparent)]
    Kube(#[from] KubeFailure),
    #[error(transparent)]
    Apply(#[from] crate::k8s::K8sError),
    /// A problem with the pipeline's input (source, graph, spec); already in its status.
    #[error("{reason}: {message}")]
    Input {
        reason: String,
        message: String,
        transient: bool,
    },
    /// A bug: the reconcile panicked; contained to this object (see `controllers::frame`).
    #[error(transparent)]
    Panicked(#[from] crate::controllers::frame::Panicked),
}

impl ReconcileError for Error {
    fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => KubeFailure::CATEGORY,
            Error::Apply(_) => K8S_ERROR_CATEGORY,
            Error::Input { .. } => "input",
            Error::Panicked(_) => "panic",
        }
    }

    /// Transient failures are retried with backoff (capped by the refresh interval, the
    /// frame's retry ceiling); others wait for a change (or the refresh).
    fn is_transient(&self) -> bool {
        match self {
            Error::Input { transient, .. } => *transient,
            _ => true,
        }
    }

    /// Nothing but a new spec fixes an invalid spec.
    fn requeue_hint(&self) -> Option<Retry> {
        matches!(self, Error::Input { reason, .. } if reason == reasons::INVALID_SPEC)
            .then_some(Retry::OnChange)
    }
}
