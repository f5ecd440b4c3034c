//! A failed kube API call (read, list, create, delete, status write), as every controller's
//! `Error` holds it: one type and one metric category, so the five controllers cannot drift.

/// A kube API call that failed, and what the controller was doing (the start of the message).
#[derive(Debug, thiserror::Error)]
#[error("{action}: {source}")]
pub struct KubeFailure {
    pub action: String,
    // Boxed: kube::Error is large and every controller's Error travels through each reconcile.
    #[source]
    pub source: Box<kube::Error>,
}

impl KubeFailure {
    /// The `category` label of `raypipe_reconcile_errors_total` for a [`KubeFailure`].
    pub const CATEGORY: &'static str = "kube";

    pub fn new(action: impl Into<String>, source: kube::Error) -> KubeFailure {
        KubeFailure {
            action: action.into(),
            source: Box::new(source),
        }
    }
}

/// For `map_err`: turns the kube error into a [`KubeFailure`] doing `action`.
pub fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeFailure {
    let action = action.into();
    move |source| KubeFailure::new(action, source)
}

/// The `category` label of a [`crate::k8s::K8sError`] (a server-side apply that failed, an object
/// in the way, missing metadata) in every controller.
pub const K8S_ERROR_CATEGORY: &str = "apply";

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An API server's answer `code` with `reason` (shared with the controllers' error tests).
    pub(crate) fn api_error(code: u16, reason: &str) -> kube::Error {
        let message = format!("the server said {reason}");
        kube::Error::Api(
            kube::core::Status::failure(&message, reason)
                .with_code(code)
                .boxed(),
        )
    }

    fn not_found() -> kube::Error {
        api_error(404, "NotFound")
    }

    #[test]
    fn the_message_starts_with_the_action_and_the_source_is_the_kube_error() {
        let failure = kube_err("reading Pod x")(not_found());
        assert!(
            failure.to_string().starts_with("reading Pod x: "),
            "{failure}"
        );
        assert!(failure.to_string().contains("NotFound"), "{failure}");
        let source = std::error::Error::source(&failure).expect("a source");
        assert_eq!(source.to_string(), failure.source.to_string());
        assert_eq!(
            KubeFailure::new("reading Pod x", not_found()).to_string(),
            failure.to_string()
        );
    }
}
