//! The Event reasons of RayService: KubeRay's, and raypipe's own where marked.

pub const INVALID_SPEC: &str = "InvalidRayServiceSpec";
pub const INITIALIZING_TIMEOUT: &str = "RayServiceInitializingTimeout";
pub const UPDATED_HEAD_POD_SERVE_LABEL: &str = "UpdatedHeadPodServeLabel";
pub const FAILED_TO_UPDATE_HEAD_POD_SERVE_LABEL: &str = "FailedToUpdateHeadPodServeLabel";
pub const UPDATED_SERVE_APPLICATIONS: &str = "UpdatedServeApplications";
pub const FAILED_TO_UPDATE_SERVE_APPLICATIONS: &str = "FailedToUpdateServeApplications";
pub const CREATED_RAY_CLUSTER: &str = "CreatedRayCluster";
pub const FAILED_TO_CREATE_RAY_CLUSTER: &str = "FailedToCreateRayCluster";
pub const UPDATED_RAY_CLUSTER: &str = "UpdatedRayCluster";
pub const FAILED_TO_UPDATE_RAY_CLUSTER: &str = "FailedToUpdateRayCluster";
pub const DELETED_RAY_CLUSTER: &str = "DeletedRayCluster";
pub const FAILED_TO_DELETE_RAY_CLUSTER: &str = "FailedToDeleteRayCluster";
pub const CREATED_SERVICE: &str = "CreatedService";
pub const UPDATED_SERVICE: &str = "UpdatedService";
pub const FAILED_TO_CREATE_SERVICE: &str = "FailedToCreateService";
pub const DELETED_SERVICE: &str = "DeletedService";
pub const FAILED_TO_DELETE_SERVICE: &str = "FailedToDeleteService";
// NewClusterWithIncrementalUpgrade.
pub const CREATED_GATEWAY: &str = "CreatedGateway";
pub const UPDATED_GATEWAY: &str = "UpdatedGateway";
pub const FAILED_TO_CREATE_GATEWAY: &str = "FailedToCreateGateway";
pub const FAILED_TO_UPDATE_GATEWAY: &str = "FailedToUpdateGateway";
pub const DELETED_GATEWAY: &str = "DeletedGateway";
pub const FAILED_TO_DELETE_GATEWAY: &str = "FailedToDeleteGateway";
pub const CREATED_HTTP_ROUTE: &str = "CreatedHTTPRoute";
pub const UPDATED_HTTP_ROUTE: &str = "UpdatedHTTPRoute";
pub const FAILED_TO_CREATE_HTTP_ROUTE: &str = "FailedToCreateHTTPRoute";
pub const FAILED_TO_UPDATE_HTTP_ROUTE: &str = "FailedToUpdateHTTPRoute";
pub const DELETED_HTTP_ROUTE: &str = "DeletedHTTPRoute";
pub const FAILED_TO_DELETE_HTTP_ROUTE: &str = "FailedToDeleteHTTPRoute";
pub const UPDATED_SERVE_TARGET_CAPACITY: &str = "UpdatedServeTargetCapacity";
pub const FAILED_TO_UPDATE_TARGET_CAPACITY: &str = "FailedToUpdateTargetCapacity";
pub const ROLLBACK_IMPOSSIBLE: &str = "RollbackImpossible";
// raypipe's own: an upgrade's cluster that Kueue did not admit in time (per-cluster admission).
pub const UPGRADE_NOT_ADMITTED: &str = "UpgradeNotAdmitted";
