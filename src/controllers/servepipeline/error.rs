//! The ServePipeline controller's one error type and how the frame retries each kind.

use super::build::reasons;
use crate::controllers::frame::policy::{ReconcileError, Retry};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Apply(#[from] crate::k8s::K8sError),
    #[error("writing the status of {name}: {source}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
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
            Error::Read { .. } => "read",
            Error::Apply(_) => "apply",
            Error::Status { .. } => "status",
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
