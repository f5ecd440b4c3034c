//! The RayJob controller's one error type.

use crate::ray::DashboardError;

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
            Error::Kube { .. } | Error::K8s(_) => "apply",
            Error::Invalid(_) => "build",
            Error::ClusterNotFound(_) => "cluster",
            Error::Dashboard(_) => "dashboard",
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
