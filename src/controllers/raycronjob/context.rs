//! What every reconcile of a RayCronJob shares.

use std::sync::Arc;

use crate::api::raycronjob::RayCronJob;
use crate::controllers::frame::run::{self, Frame};

use super::config::Config;

pub(super) struct Context {
    pub(super) client: kube::Client,
    pub(super) config: Config,
    pub(super) recorder: crate::k8s::EventRecorder,
    pub(super) frame: Frame<RayCronJob>,
}

impl run::Framed<RayCronJob> for Context {
    fn frame(&self) -> &Frame<RayCronJob> {
        &self.frame
    }
}

impl crate::controllers::frame::ReportPanic<RayCronJob> for Context {
    fn report_panic(
        &self,
        object: Arc<RayCronJob>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        crate::controllers::frame::panic_event(&self.recorder, object, message)
    }
}
