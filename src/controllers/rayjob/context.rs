//! What every reconcile of a RayJob shares.

use crate::api::rayjob::RayJob;
use crate::controllers::frame::run::Frame;

use super::config::Config;

pub struct Context {
    pub(super) client: kube::Client,
    pub(super) config: Config,
    pub(super) recorder: crate::k8s::EventRecorder,
    /// Span, metrics and the per-object backoff (3 s, 6 s, 12 s … up to 5 minutes by default).
    pub(super) frame: Frame<RayJob>,
}
