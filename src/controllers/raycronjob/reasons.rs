//! The Event and condition reasons of the RayCronJob controller.

pub const INVALID_SPEC: &str = "InvalidRayCronJobSpec";
pub const SUSPENDED: &str = "SuspendedRayCronJob";
/// raypipe's own (batch/v1 CronJob's reasons).
pub const CREATED_RAY_JOB: &str = "SuccessfulCreate";
pub const DELETED_RAY_JOB: &str = "SuccessfulDelete";
pub const JOB_ALREADY_ACTIVE: &str = "JobAlreadyActive";
