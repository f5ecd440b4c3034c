//! The builders' one error: on its own, so a builder that also defines a type the options name
//! (the batch scheduler) imports it without a cycle through `mod.rs`.

use crate::k8s::K8sError;

/// Why an object could not be built from a cluster that passed validation.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0} has no container")]
    NoContainer(String),
    #[error(
        "the head container has no port named 'serve' or 'serve-*', so the serve Service cannot be made"
    )]
    NoServePort,
    #[error(transparent)]
    Owner(#[from] K8sError),
    /// The batch scheduler's labels on the cluster cannot be turned into its PodGroup.
    #[error("{0}")]
    BatchScheduler(String),
}
