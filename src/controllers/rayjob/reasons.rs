//! KubeRay's Event reasons for RayJobs.

pub use crate::validation::rayjob::reasons::{INVALID_METADATA, INVALID_SPEC, INVALID_STATUS};
pub const CREATED_RAY_CLUSTER: &str = "CreatedRayCluster";
pub const DELETED_RAY_CLUSTER: &str = "DeletedRayCluster";
pub const UPDATED_RAY_CLUSTER: &str = "UpdatedRayCluster";
pub const FAILED_TO_CREATE_RAY_CLUSTER: &str = "FailedToCreateRayCluster";
pub const FAILED_TO_DELETE_RAY_CLUSTER: &str = "FailedToDeleteRayCluster";
pub const FAILED_TO_UPDATE_RAY_CLUSTER: &str = "FailedToUpdateRayCluster";
pub const RAY_CLUSTER_NOT_FOUND: &str = "RayClusterNotFound";
pub const CREATED_SUBMITTER: &str = "CreatedRayJobSubmitter";
pub const DELETED_SUBMITTER: &str = "DeletedRayJobSubmitter";
pub const FAILED_TO_CREATE_SUBMITTER: &str = "FailedToCreateRayJobSubmitter";
pub const FAILED_TO_DELETE_SUBMITTER: &str = "FailedToDeleteRayJobSubmitter";
pub use crate::kuberay::keys::reasons::{CREATED_SERVICE, FAILED_TO_CREATE_SERVICE};
pub const UPDATED_SERVICE: &str = "UpdatedService";
pub const FAILED_TO_UPDATE_SERVICE: &str = "FailedToUpdateService";
/// The batch scheduler refused the RayJob (or its PodGroup CRD is missing); not KubeRay's
/// (it only logs the error).
pub const BATCH_SCHEDULING_FAILED: &str = "BatchSchedulingFailed";
pub const BATCH_SCHEDULER_CLEANED_UP: &str = "BatchSchedulerCleanedUp";
pub const FAILED_TO_CLEANUP_BATCH_SCHEDULER: &str = "FailedToCleanupBatchScheduler";
