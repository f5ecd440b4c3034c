//! [`DashboardError`]: every way talking to a Ray dashboard can fail.
//!
//! Messages name the endpoint (method and URL) and quote what Ray answered, so a condition or
//! event built from them says what went wrong without a trip to the Ray logs. They never carry
//! the bearer token: it travels only in a header, and dashboard URLs with credentials in them
//! are refused.

use std::time::Duration;

use reqwest::StatusCode;

/// Error bodies longer than this are cut in the middle (see [`body_excerpt`]).
pub(crate) const MAX_ERROR_BODY_CHARS: usize = 4096;
/// How much of a cut body comes from its start; the rest comes from its end, where a Python
/// traceback puts the actual exception.
const ERROR_BODY_HEAD_CHARS: usize = 1024;

/// The text Ray puts in a 500 answer to a job submission whose id is taken.
pub(crate) const JOB_EXISTS_MARKER: &str = "Please use a different submission_id";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DashboardError {
    #[error("Ray dashboard URL {url:?} is not usable: {problem}")]
    InvalidUrl { url: String, problem: String },

    #[error("cannot find the Ray dashboard of head Service {namespace}/{service}: {problem}")]
    NotLocated {
        namespace: String,
        service: String,
        problem: String,
    },

    #[error(
        "the Ray bearer token is not usable: it is empty or holds whitespace, control or \
         non-ASCII characters"
    )]
    InvalidToken,

    #[error("invalid request to the Ray dashboard: {problem}")]
    InvalidRequest { problem: String },

    #[error("cannot set up the HTTP client for the Ray dashboard: {detail}")]
    ClientSetup { detail: String },

    #[error("cannot reach the Ray dashboard for {endpoint}: {detail}")]
    Unreachable { endpoint: String, detail: String },

    #[error("the Ray dashboard did not answer {endpoint} within {limit:?}")]
    Timeout { endpoint: String, limit: Duration },

    #[error("the connection to the Ray dashboard broke during {endpoint}: {detail}")]
    Transport { endpoint: String, detail: String },

    #[error("the Ray dashboard answered {endpoint} with HTTP {status}: {body}")]
    Status {
        endpoint: String,
        status: StatusCode,
        /// Ray's answer as it came (usually plain text: a pydantic error or a traceback),
        /// cut in the middle when long.
        body: String,
    },

    #[error("Ray job {submission_id:?} already exists ({endpoint} answered HTTP 500)")]
    JobAlreadyExists {
        endpoint: String,
        submission_id: String,
    },

    #[error(
        "the Ray dashboard's answer to {endpoint} is not what raypipe expects: {detail}; body: {body}"
    )]
    Decode {
        endpoint: String,
        detail: String,
        body: String,
    },

    #[error("not a usable Serve config: {problem}")]
    InvalidServeConfig { problem: String },
}

impl DashboardError {
    /// The HTTP status Ray answered with, if it answered at all.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            DashboardError::Status { status, .. } => Some(*status),
            DashboardError::JobAlreadyExists { .. } => Some(StatusCode::INTERNAL_SERVER_ERROR),
            _ => None,
        }
    }

    /// Ray answered 404: the job (or the endpoint) does not exist.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(StatusCode::NOT_FOUND)
    }

    /// No answer from the dashboard (down, unreachable, too slow): worth retrying later, and
    /// no reason to believe anything about the state of the Ray cluster.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            DashboardError::Unreachable { .. }
                | DashboardError::Timeout { .. }
                | DashboardError::Transport { .. }
        )
    }
}

/// `body` as a single string of at most about [`MAX_ERROR_BODY_CHARS`] characters: the start
/// and the end of a longer body, with a note of how much was left out in between.
pub(crate) fn body_excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let total = text.chars().count();
    if total <= MAX_ERROR_BODY_CHARS {
        return text.to_owned();
    }
    let tail_chars = MAX_ERROR_BODY_CHARS - ERROR_BODY_HEAD_CHARS;
    let head: String = text.chars().take(ERROR_BODY_HEAD_CHARS).collect();
    let tail: String = text.chars().skip(total - tail_chars).collect();
    let omitted = total - ERROR_BODY_HEAD_CHARS - tail_chars;
    format!("{head}\n[… {omitted} characters omitted …]\n{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_bodies_are_kept_verbatim_apart_from_surrounding_whitespace() {
        assert_eq!(
            body_excerpt(b"  1 validation error\n  detail\n"),
            "1 validation error\n  detail"
        );
    }

    #[test]
    fn long_bodies_keep_their_start_and_their_end() {
        let body = format!("START{}ValueError: the real cause", "x".repeat(20_000));
        let excerpt = body_excerpt(body.as_bytes());
        assert!(excerpt.starts_with("START"));
        assert!(excerpt.ends_with("ValueError: the real cause"));
        assert!(excerpt.contains("characters omitted"));
        assert!(excerpt.chars().count() < MAX_ERROR_BODY_CHARS + 100);
    }

    #[test]
    fn cuts_never_split_a_multibyte_character() {
        let body = "é".repeat(MAX_ERROR_BODY_CHARS * 2);
        let excerpt = body_excerpt(body.as_bytes());
        assert!(excerpt.starts_with('é') && excerpt.ends_with('é'));
    }

    #[test]
    fn not_found_and_unreachable_are_recognised() {
        let not_found = DashboardError::Status {
            endpoint: "GET http://127.0.0.1:8265/api/jobs/x".into(),
            status: StatusCode::NOT_FOUND,
            body: "Job x does not exist".into(),
        };
        assert!(not_found.is_not_found());
        assert!(!not_found.is_unreachable());
        let timeout = DashboardError::Timeout {
            endpoint: "GET x".into(),
            limit: Duration::from_secs(1),
        };
        assert!(timeout.is_unreachable());
        assert_eq!(timeout.status(), None);
    }
}
