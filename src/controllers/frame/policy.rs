//! The one error policy of every controller: what a failed reconcile waits for before the next
//! attempt, decided by the error's transience and the object's own count of consecutive
//! failures (so one failing object slows only itself).
//!
//! - Transient errors (API calls, conflicts, caches): retried after [`Backoff::after`] the
//!   object's failure count — 2 s, 4 s, 8 s … up to 5 minutes by default — capped by the
//!   object's retry ceiling when the controller sets one (a ServePipeline's refresh interval).
//! - Permanent errors (bad input only a change can fix): wait for a change, or requeue after
//!   the retry ceiling when there is one.
//! - An error may override both with [`ReconcileError::requeue_hint`].
//!
//! The count is reset by the first successful reconcile and by a new uid (see `run`).

use std::time::Duration;

use kube::runtime::controller::Action;

use super::Panicked;

/// What the frame needs to know of a controller's `Error`. Implement it on the controller's
/// error enum; `From<Panicked>` lets the frame turn a contained panic into that enum.
///
/// ```ignore
/// impl frame::policy::ReconcileError for Error {
///     fn category(&self) -> &'static str {
///         match self { Error::Kube(_) => KubeFailure::CATEGORY, Error::Panicked(_) => "panic", .. }
///     }
/// }
/// ```
pub trait ReconcileError: std::error::Error + From<Panicked> + Send + Sync + 'static {
    /// The `category` label of `raypipe_reconcile_errors_total`: a fixed string (never built from
    /// the error's text, so the label set stays bounded), e.g. `apply`, `build`, `panic`.
    fn category(&self) -> &'static str;

    /// Whether trying again without a change may succeed (default: yes). Permanent errors wait
    /// for a change to the object (or its retry ceiling) instead of backing off.
    fn is_transient(&self) -> bool {
        true
    }

    /// Overrides the policy for this error, e.g. `Some(Retry::OnChange)` for an invalid spec
    /// that nothing but a new spec can fix. Default: none.
    fn requeue_hint(&self) -> Option<Retry> {
        None
    }
}

/// When a failed object is reconciled again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// After this long (or earlier, when the object or something it owns changes).
    After(Duration),
    /// Only when the object or something it owns changes.
    OnChange,
}

impl Retry {
    pub fn action(self) -> Action {
        match self {
            Retry::After(wait) => Action::requeue(wait),
            Retry::OnChange => Action::await_change(),
        }
    }
}

impl std::fmt::Display for Retry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Retry::After(wait) => write!(f, "{wait:?}"),
            Retry::OnChange => f.write_str("on change"),
        }
    }
}

/// Exponential backoff per object: `first`, 2×`first`, 4×`first` … capped at `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    /// 2 s, 4 s, 8 s … up to 5 minutes (the RayCluster and RayService controllers').
    fn default() -> Self {
        Backoff {
            first: Duration::from_secs(2),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// Starting at `first` instead (RayJob: its 3 s requeue; RayCronJob: 5 s), same cap.
    pub fn starting_at(first: Duration) -> Self {
        Backoff {
            first,
            ..Backoff::default()
        }
    }

    /// The wait after `failures` consecutive failures (1 for the first; 0 is treated as 1).
    pub fn after(&self, failures: u32) -> Duration {
        // 2^20 × first is far above any cap; the exponent bound keeps the arithmetic safe.
        let doublings = failures.saturating_sub(1).min(20);
        self.first
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |wait| wait.min(self.max))
    }
}

/// The retry for `error` after the object's `failures`-th consecutive failure (pure).
/// `ceiling`: the longest the object may wait (none: transient errors back off to the cap,
/// permanent ones wait for a change).
pub fn decide<E: ReconcileError>(
    error: &E,
    failures: u32,
    backoff: Backoff,
    ceiling: Option<Duration>,
) -> Retry {
    if let Some(hint) = error.requeue_hint() {
        return hint;
    }
    if error.is_transient() {
        let wait = backoff.after(failures);
        // A ceiling under a second would spin; a second is the floor.
        Retry::After(ceiling.map_or(wait, |c| wait.min(c.max(Duration::from_secs(1)))))
    } else {
        ceiling.map_or(Retry::OnChange, Retry::After)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// An error of each kind the policy tells apart (shared with the frame's tests).
    #[derive(Debug, thiserror::Error)]
    pub(in crate::controllers::frame) enum TestError {
        #[error("api down")]
        Api,
        #[error("bad input")]
        Input,
        #[error("bad spec")]
        Spec,
        #[error(transparent)]
        Panicked(#[from] Panicked),
    }

    impl ReconcileError for TestError {
        fn category(&self) -> &'static str {
            match self {
                TestError::Api => "api",
                TestError::Input => "input",
                TestError::Spec => "spec",
                TestError::Panicked(_) => "panic",
            }
        }
        fn is_transient(&self) -> bool {
            !matches!(self, TestError::Input | TestError::Spec)
        }
        fn requeue_hint(&self) -> Option<Retry> {
            matches!(self, TestError::Spec).then_some(Retry::OnChange)
        }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn backoff_doubles_per_failure_up_to_the_cap() {
        let b = Backoff::default();
        let waits: Vec<Duration> = (0..=12).map(|n| b.after(n)).collect();
        assert_eq!(
            waits,
            [2, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300, 300].map(S)
        );
        assert_eq!(b.after(u32::MAX), S(300));
        // The same waits as the helper the controllers used before the frame.
        for n in 1..12 {
            assert_eq!(b.after(n), crate::k8s::failure_backoff(n), "{n}");
        }
        let rayjob = Backoff::starting_at(S(3));
        assert_eq!(
            (1..=9).map(|n| rayjob.after(n)).collect::<Vec<_>>(),
            [3, 6, 12, 24, 48, 96, 192, 300, 300].map(S)
        );
    }

    #[test]
    fn transient_errors_back_off_and_permanent_ones_wait_for_a_change() {
        let b = Backoff::default();
        assert_eq!(decide(&TestError::Api, 1, b, None), Retry::After(S(2)));
        assert_eq!(decide(&TestError::Api, 3, b, None), Retry::After(S(8)));
        assert_eq!(decide(&TestError::Input, 3, b, None), Retry::OnChange);
        let panicked = TestError::from(Panicked {
            message: "bug".into(),
        });
        assert_eq!(decide(&panicked, 2, b, None), Retry::After(S(4)));
    }

    #[test]
    fn the_ceiling_caps_transient_waits_and_times_permanent_ones() {
        let b = Backoff::default();
        assert_eq!(
            decide(&TestError::Api, 9, b, Some(S(30))),
            Retry::After(S(30))
        );
        assert_eq!(
            decide(&TestError::Api, 1, b, Some(S(30))),
            Retry::After(S(2))
        );
        assert_eq!(
            decide(&TestError::Api, 1, b, Some(Duration::ZERO)),
            Retry::After(S(1))
        );
        assert_eq!(
            decide(&TestError::Input, 1, b, Some(S(30))),
            Retry::After(S(30))
        );
    }

    #[test]
    fn a_hint_overrides_the_policy() {
        let b = Backoff::default();
        assert_eq!(decide(&TestError::Spec, 4, b, Some(S(30))), Retry::OnChange);
        assert_eq!(Retry::OnChange.action(), Action::await_change());
        assert_eq!(Retry::After(S(2)).action(), Action::requeue(S(2)));
        assert_eq!(Retry::After(S(2)).to_string(), "2s");
    }
}
