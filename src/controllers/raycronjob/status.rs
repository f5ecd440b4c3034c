//! The status stage of a RayCronJob pass: `active` and `lastScheduleTime` from what the apply
//! stage left, written (server-side apply) only when it changed.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt};

use super::apply::Applied;
use crate::api::raycronjob::{RayCronJob, RayCronJobStatus};
use crate::api::rayjob::RayJob;
use crate::controllers::frame::pass::StatusWrite;

/// The status after this pass (pure).
pub(super) fn desired(cron: &RayCronJob, applied: Applied) -> RayCronJobStatus {
    let namespace = cron.namespace().unwrap_or_default();
    let mut status = cron.status.clone().unwrap_or_default();
    if let Some(tick) = applied.scheduled {
        status.last_schedule_time = Some(crate::k8s::whole_seconds(tick));
    }
    let mut active = applied.active;
    active.sort();
    status.active = (!active.is_empty()).then(|| {
        active
            .iter()
            .map(|name| ObjectReference {
                api_version: Some(RayJob::api_version(&()).into_owned()),
                kind: Some(RayJob::kind(&()).into_owned()),
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            })
            .collect()
    });
    status
}

/// Whether `status` needs writing: not when the RayCronJob already shows it.
pub(super) fn plan_write(cron: &RayCronJob, status: &RayCronJobStatus) -> StatusWrite {
    if cron.status.as_ref() == Some(status)
        || (cron.status.is_none() && *status == RayCronJobStatus::default())
    {
        StatusWrite::Skip
    } else {
        StatusWrite::Now
    }
}
