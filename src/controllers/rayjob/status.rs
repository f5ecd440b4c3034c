//! Writing a RayJob's status: a server-side apply of the status subresource, only when it
//! differs from what the pass read. What the status says is decided by the stages and
//! `transitions`.

use super::*;

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
    let patch = serde_json::json!({
        "apiVersion": RayJob::api_version(&()),
        "kind": RayJob::kind(&()),
        "status": status,
    });
    ctx.jobs(job)
        .patch_status(
            &job.name_any(),
            &PatchParams::apply(field_managers::RAYJOB).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(kube_err("writing the RayJob status"))?;
    Ok(true)
}
