//! The strings KubeRay users and tools rely on: label and annotation keys, finalizer, env
//! names, default ports and Event reasons. They must match KubeRay byte for byte.

/// Labels set on (or read from) the objects of a RayCluster.
pub mod labels {
    pub const CLUSTER: &str = "ray.io/cluster";
    pub const NODE_TYPE: &str = "ray.io/node-type";
    pub const GROUP: &str = "ray.io/group";
    pub const IS_RAY_NODE: &str = "ray.io/is-ray-node";
    pub const IDENTIFIER: &str = "ray.io/identifier";
    pub const APP_NAME: &str = "app.kubernetes.io/name";
    pub const CREATED_BY: &str = "app.kubernetes.io/created-by";
    pub const ORIGINATED_FROM_CR_NAME: &str = "ray.io/originated-from-cr-name";
    pub const ORIGINATED_FROM_CRD: &str = "ray.io/originated-from-crd";
    pub const SERVE: &str = "ray.io/serve";
    pub const HEADLESS_WORKER_SVC: &str = "ray.io/headless-worker-svc";
    pub const REPLICA_NAME: &str = "ray.io/worker-group-replica-name";
    pub const REPLICA_INDEX: &str = "ray.io/worker-group-replica-index";
    pub const HOST_INDEX: &str = "ray.io/replica-host-index";

    /// Values.
    pub const APP_NAME_VALUE: &str = "kuberay";
    pub const CREATED_BY_VALUE: &str = "kuberay-operator";
    pub const HEAD: &str = "head";
    pub const WORKER: &str = "worker";
    pub const REDIS_CLEANUP: &str = "redis-cleanup";
    pub const HEAD_GROUP: &str = "headgroup";
    pub const YES: &str = "yes";
}

/// Annotations set on (or read from) a RayCluster and its head Pod.
pub mod annotations {
    pub const FT_ENABLED: &str = "ray.io/ft-enabled";
    pub const EXTERNAL_STORAGE_NAMESPACE: &str = "ray.io/external-storage-namespace";
    pub const GCS_FT_DELETION_TIMEOUT: &str = "ray.io/gcs-ft-deletion-timeout";
    pub const OVERWRITE_CONTAINER_CMD: &str = "ray.io/overwrite-container-cmd";
    pub const ENABLE_SERVE_SERVICE: &str = "ray.io/enable-serve-service";
    pub const DISABLE_PROVISIONED_HEAD_RESTART: &str = "ray.io/disable-provisioned-head-restart";
    pub const RECREATE_HASH: &str = "ray.io/upgrade-strategy-recreate-hash";
    pub const KUBERAY_VERSION: &str = "ray.io/kuberay-version";
    pub const INGRESS_CLASS: &str = "kubernetes.io/ingress.class";
    /// On a RayService: how long a new cluster may take to serve before it is replaced.
    pub const INITIALIZING_TIMEOUT: &str = "ray.io/initializing-timeout";
}

/// Finalizer that holds a GCS-FT RayCluster until its Redis storage namespace is cleaned up.
pub const GCS_FT_REDIS_CLEANUP_FINALIZER: &str = "ray.io/gcs-ft-redis-cleanup-finalizer";

/// The version written to `ray.io/kuberay-version` and Ray's usage tags. Not KubeRay's version:
/// a head Pod made by KubeRay and adopted by raypipe therefore keeps running (see Recreate).
pub const OPERATOR_VERSION: &str = concat!("raypipe-v", env!("CARGO_PKG_VERSION"));

/// Default ports and their names.
pub mod ports {
    pub const GCS_SERVER_NAME: &str = "gcs-server";
    pub const GCS_SERVER: i32 = 6379;
    pub const DASHBOARD_NAME: &str = "dashboard";
    pub const DASHBOARD: i32 = 8265;
    pub const CLIENT_NAME: &str = "client";
    pub const CLIENT: i32 = 10001;
    pub const SERVE_NAME: &str = "serve";
    pub const SERVE: i32 = 8000;
    pub const METRICS_NAME: &str = "metrics";
    pub const METRICS: i32 = 8080;
    pub const DASHBOARD_AGENT: i32 = 52365;
    /// appProtocol of every default head Service port.
    pub const APP_PROTOCOL: &str = "tcp";
}

/// Environment variables the operator sets.
pub mod env {
    pub const FQ_RAY_IP: &str = "FQ_RAY_IP";
    pub const RAY_IP: &str = "RAY_IP";
    pub const RAY_CLUSTER_NAME: &str = "RAY_CLUSTER_NAME";
    pub const RAY_CLUSTER_NAMESPACE: &str = "RAY_CLUSTER_NAMESPACE";
    pub const RAY_CLOUD_INSTANCE_ID: &str = "RAY_CLOUD_INSTANCE_ID";
    pub const RAY_NODE_TYPE_NAME: &str = "RAY_NODE_TYPE_NAME";
    pub const KUBERAY_GEN_RAY_START_CMD: &str = "KUBERAY_GEN_RAY_START_CMD";
    pub const KUBERAY_GEN_AUTOSCALER_START_CMD: &str = "KUBERAY_GEN_AUTOSCALER_START_CMD";
    pub const RAY_PORT: &str = "RAY_PORT";
    pub const RAY_ADDRESS: &str = "RAY_ADDRESS";
    pub const RAY_USAGE_STATS_KUBERAY_IN_USE: &str = "RAY_USAGE_STATS_KUBERAY_IN_USE";
    pub const RAY_USAGE_STATS_EXTRA_TAGS: &str = "RAY_USAGE_STATS_EXTRA_TAGS";
    pub const RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE: &str = "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE";
    pub const RAY_TIMEOUT_MS_TASK_WAIT_FOR_DEATH_INFO: &str =
        "RAY_timeout_ms_task_wait_for_death_info";
    pub const RAY_GCS_SERVER_REQUEST_TIMEOUT_SECONDS: &str =
        "RAY_gcs_server_request_timeout_seconds";
    pub const RAY_SERVE_KV_TIMEOUT_S: &str = "RAY_SERVE_KV_TIMEOUT_S";
    pub const RAY_ENABLE_AUTOSCALER_V2: &str = "RAY_enable_autoscaler_v2";
    pub const RAY_EXTERNAL_STORAGE_NAMESPACE: &str = "RAY_external_storage_namespace";
    pub const RAY_REDIS_ADDRESS: &str = "RAY_REDIS_ADDRESS";
    pub const REDIS_USERNAME: &str = "REDIS_USERNAME";
    pub const REDIS_PASSWORD: &str = "REDIS_PASSWORD";
    pub const RAY_GCS_RPC_SERVER_RECONNECT_TIMEOUT_S: &str =
        "RAY_gcs_rpc_server_reconnect_timeout_s";
    pub const RAY_AUTH_MODE: &str = "RAY_AUTH_MODE";
    pub const RAY_AUTH_TOKEN: &str = "RAY_AUTH_TOKEN";
    pub const RAY_ENABLE_K8S_TOKEN_AUTH: &str = "RAY_ENABLE_K8S_TOKEN_AUTH";
    pub const RAY_START_ULIMIT_OPEN_FILES: &str = "RAY_START_ULIMIT_OPEN_FILES";
    /// mTLS between Ray processes (gate RayClusterMTLS).
    pub const RAY_USE_TLS: &str = "RAY_USE_TLS";
    pub const RAY_TLS_SERVER_CERT: &str = "RAY_TLS_SERVER_CERT";
    pub const RAY_TLS_SERVER_KEY: &str = "RAY_TLS_SERVER_KEY";
    pub const RAY_TLS_CA_CERT: &str = "RAY_TLS_CA_CERT";
    /// Embedded GCS storage (gate GCSFaultToleranceEmbeddedStorage).
    pub const RAY_GCS_STORAGE: &str = "RAY_gcs_storage";
    pub const RAY_GCS_STORAGE_PATH: &str = "RAY_gcs_storage_path";
    /// Ray's event export to the history-server collector (gate RayClusterHistoryServer).
    pub const RAY_ENABLE_RAY_EVENT: &str = "RAY_enable_ray_event";
    pub const RAY_ENABLE_CORE_WORKER_RAY_EVENT_TO_AGGREGATOR: &str =
        "RAY_enable_core_worker_ray_event_to_aggregator";
    pub const RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR: &str =
        "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR";
    pub const RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES: &str =
        "RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES";
    pub const RAY_DASHBOARD_AGGREGATOR_AGENT_PUBLISHER_HTTP_ENDPOINT_EXPOSABLE_EVENT_TYPES: &str =
        "RAY_DASHBOARD_AGGREGATOR_AGENT_PUBLISHER_HTTP_ENDPOINT_EXPOSABLE_EVENT_TYPES";
}

/// The history-server collector sidecar (gate RayClusterHistoryServer): its container, the
/// variables the operator gives it (users may not set them) and the storage settings
/// validation reads from `collectorOptions.env`.
pub mod collector {
    pub const CONTAINER_NAME: &str = "ray-history-collector";
    /// The port the collector receives Ray's events on, and where Ray sends them.
    pub const EVENTS_PORT_VALUE: &str = "8084";
    pub const EVENTS_EXPORT_ADDR: &str = "http://localhost:8084/v1/events";
    pub const HEAD_DASHBOARD_ADDRESS: &str = "http://localhost:8265";
    /// The Ray event types exported to the collector unless the Ray container says otherwise.
    pub const EXPOSABLE_EVENT_TYPES: &str = "TASK_DEFINITION_EVENT,TASK_LIFECYCLE_EVENT,\
ACTOR_TASK_DEFINITION_EVENT,TASK_PROFILE_EVENT,DRIVER_JOB_DEFINITION_EVENT,\
DRIVER_JOB_LIFECYCLE_EVENT,ACTOR_DEFINITION_EVENT,ACTOR_LIFECYCLE_EVENT,NODE_DEFINITION_EVENT,\
NODE_LIFECYCLE_EVENT";

    pub const POD_IP: &str = "POD_IP";
    pub const RAY_ROLE: &str = "RAY_ROLE";
    pub const OWNER_KIND: &str = "OWNER_KIND";
    pub const OWNER_NAME: &str = "OWNER_NAME";
    pub const EVENTS_PORT: &str = "EVENTS_PORT";
    pub const RAY_DASHBOARD_ADDRESS: &str = "RAY_DASHBOARD_ADDRESS";
    /// Set by the operator; refused in `collectorOptions.env`.
    pub const MANAGED_ENV: [&str; 8] = [
        POD_IP,
        super::env::FQ_RAY_IP,
        super::env::RAY_CLUSTER_NAME,
        super::env::RAY_CLUSTER_NAMESPACE,
        RAY_ROLE,
        OWNER_KIND,
        OWNER_NAME,
        EVENTS_PORT,
    ];

    pub const STORAGE_BACKEND: &str = "STORAGE_BACKEND";
    pub const GCS_BUCKET: &str = "GCS_BUCKET";
    pub const S3_REGION: &str = "S3_REGION";
    pub const AZURE_STORAGE_AUTH_MODE: &str = "AZURE_STORAGE_AUTH_MODE";
    pub const AZURE_STORAGE_CONNECTION_STRING: &str = "AZURE_STORAGE_CONNECTION_STRING";
    pub const AZURE_STORAGE_ACCOUNT_URL: &str = "AZURE_STORAGE_ACCOUNT_URL";
    pub const OSS_BUCKET: &str = "OSS_BUCKET";
    pub const OSS_ENDPOINT: &str = "OSS_ENDPOINT";
    pub const OSS_REGION: &str = "OSS_REGION";
}

/// Volumes and paths the operator owns in Ray Pods for the gated features.
pub mod volumes {
    /// The cert-manager Secret of the Pod's node type, and where it is mounted.
    pub const RAY_TLS: &str = "ray-tls";
    pub const RAY_TLS_PATH: &str = "/etc/ray/tls";
    /// The PVC of the embedded RocksDB GCS store on the head, and where it is mounted.
    pub const GCS_STORAGE: &str = "gcs-storage";
    pub const GCS_STORAGE_PATH: &str = "/data/gcs";
    pub const GCS_STORAGE_ROCKSDB: &str = "rocksdb";
    pub const GCS_STORAGE_DEFAULT_SIZE: &str = "1Gi";
}

/// Event reasons (KubeRay's), so `kubectl get events` reads the same.
pub mod reasons {
    pub const CREATED_NETWORK_POLICY: &str = "CreatedNetworkPolicy";
    pub const UPDATED_NETWORK_POLICY: &str = "UpdatedNetworkPolicy";
    pub const DELETED_NETWORK_POLICY: &str = "DeletedNetworkPolicy";
    pub const FAILED_TO_CREATE_NETWORK_POLICY: &str = "FailedToCreateNetworkPolicy";
    pub const FAILED_TO_UPDATE_NETWORK_POLICY: &str = "FailedToUpdateNetworkPolicy";
    pub const FAILED_TO_DELETE_NETWORK_POLICY: &str = "FailedToDeleteNetworkPolicy";
    pub const NETWORK_POLICY_NAME_COLLISION: &str = "NetworkPolicyNameCollision";
    pub const CREATED_PVC: &str = "CreatedPVC";
    pub const FAILED_TO_CREATE_PVC: &str = "FailedToCreatePVC";
    pub const MTLS_PKI_READY: &str = "MTLSPKIReady";
    pub const MTLS_CERTS_NOT_READY: &str = "MTLSCertsNotReady";
    pub const MTLS_FAILED_TO_RECONCILE: &str = "MTLSFailedToReconcile";
    pub const MTLS_CERTIFICATES_UPDATED: &str = "MTLSCertificatesUpdated";
    pub const INVALID_SPEC: &str = "InvalidRayClusterSpec";
    pub const INVALID_METADATA: &str = "InvalidRayClusterMetadata";
    pub const INVALID_STATUS: &str = "InvalidRayClusterStatus";
    pub const CREATED_HEAD_POD: &str = "CreatedHeadPod";
    pub const FAILED_TO_CREATE_HEAD_POD: &str = "FailedToCreateHeadPod";
    pub const DELETED_HEAD_POD: &str = "DeletedHeadPod";
    pub const FAILED_TO_DELETE_HEAD_POD: &str = "FailedToDeleteHeadPod";
    pub const CREATED_WORKER_POD: &str = "CreatedWorkerPod";
    pub const FAILED_TO_CREATE_WORKER_POD: &str = "FailedToCreateWorkerPod";
    pub const DELETED_WORKER_POD: &str = "DeletedWorkerPod";
    pub const FAILED_TO_DELETE_WORKER_POD: &str = "FailedToDeleteWorkerPod";
    pub const FAILED_TO_DELETE_WORKER_POD_COLLECTION: &str = "FailedToDeleteWorkerPodCollection";
    pub const DELETED_POD: &str = "DeletedPod";
    pub const FAILED_TO_DELETE_POD_COLLECTION: &str = "FailedToDeletePodCollection";
    pub const CREATED_REDIS_CLEANUP_JOB: &str = "CreatedRedisCleanupJob";
    pub const FAILED_TO_CREATE_REDIS_CLEANUP_JOB: &str = "FailedToCreateRedisCleanupJob";
    pub const FORCE_DELETED_STUCK_CLUSTER: &str = "ForceDeletedStuckCluster";
    pub const CREATED_SERVICE: &str = "CreatedService";
    pub const FAILED_TO_CREATE_SERVICE: &str = "FailedToCreateService";
    pub const CREATED_INGRESS: &str = "CreatedIngress";
    pub const UPDATED_INGRESS: &str = "UpdatedIngress";
    pub const FAILED_TO_CREATE_INGRESS: &str = "FailedToCreateIngress";
    pub const FAILED_TO_UPDATE_INGRESS: &str = "FailedToUpdateIngress";
    pub const CREATED_SERVICE_ACCOUNT: &str = "CreatedServiceAccount";
    pub const FAILED_TO_CREATE_SERVICE_ACCOUNT: &str = "FailedToCreateServiceAccount";
    pub const AUTOSCALER_SERVICE_ACCOUNT_NOT_FOUND: &str = "AutoscalerServiceAccountNotFound";
    pub const CREATED_ROLE: &str = "CreatedRole";
    pub const FAILED_TO_CREATE_ROLE: &str = "FailedToCreateRole";
    pub const CREATED_ROLE_BINDING: &str = "CreatedRoleBinding";
    pub const FAILED_TO_CREATE_ROLE_BINDING: &str = "FailedToCreateRoleBinding";
    /// raypipe's own: the auth token Secret (KubeRay creates it silently).
    pub const CREATED_SECRET: &str = "CreatedSecret";
    pub const FAILED_TO_CREATE_SECRET: &str = "FailedToCreateSecret";
}
