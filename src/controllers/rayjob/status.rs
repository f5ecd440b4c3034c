//! Writing a RayJob's status: the frame's server-side apply of the status subresource, only
//! when it differs from what the pass read. What the status says is decided by the stages and
//! `transitions`.

use super::context::Context;
use super::error::{Error, kube_err};
use crate::api::rayjob::{RayJob, RayJobStatus};
use crate::k8s::field_managers;

/// Writes the status when it differs from what was read (server-side apply of the status).
/// Returns whether it wrote.
pub(super) async fn write_status(
    job: &RayJob,
    ctx: &Context,
    before: &RayJobStatus,
    status: &RayJobStatus,
) -> Result<bool, Error> {
    if before == status {
        return Ok(false);
    }
    crate::controllers::frame::status::apply_status(
        &ctx.client,
        job,
        field_managers::RAYJOB,
        status,
    )
    .await
    .map_err(kube_err("writing the RayJob status"))?;
    Ok(true)
}
