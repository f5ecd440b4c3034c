//! The status stage of a RayJob pass: written (by the frame's status stage) only when it differs
//! from what the pass read. What the status says is decided by the stages and `transitions`.

use crate::api::rayjob::RayJobStatus;
use crate::controllers::frame::pass::StatusWrite;

/// Whether `status` needs writing over `before`, the status the pass read fresh.
pub(super) fn status_write(before: &RayJobStatus, status: &RayJobStatus) -> StatusWrite {
    if before == status {
        StatusWrite::Skip
    } else {
        StatusWrite::Now
    }
}
