//! Talking to Ray clusters through the Ray dashboard's REST API: Serve applications
//! (declarative PUT/GET, DELETE), Jobs (submit, status, logs, stop, delete) and the version.
//!
//! - [`DashboardClient`] is what controllers use; [`RayDashboardClient`] implements it with
//!   reqwest (short timeouts, errors quoting Ray's answer, optional bearer token).
//! - [`DashboardLocator`] finds a cluster's dashboard: the head Service's DNS name in the
//!   cluster, or an override (template, fixed URL, resolver) for a Ray head on 127.0.0.1.
//!
//! Provisioning Ray and starting local Ray heads (tests, `raypipe dev`) lives in
//! `crate::devenv::ray`, behind the `dev` feature.

mod client;
mod error;
mod jobs;
mod lenient;
mod locate;
mod serve;
mod transport;

pub use client::{
    BearerToken, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, DashboardClient,
    DashboardClientOptions, DashboardFuture, RayDashboardClient, RayVersion, TOKEN_HEADER,
};
pub use error::DashboardError;
pub use jobs::{JobDetails, JobStatus, JobSubmitRequest};
pub use locate::{
    DASHBOARD_PORT_NAME, DEFAULT_CLUSTER_DOMAIN, DEFAULT_DASHBOARD_PORT, DashboardLocator,
    DashboardUrl, HeadService,
};
pub use serve::{
    ApplicationDetails, ApplicationStatus, DeploymentDetails, DeploymentStatus, HttpOptions,
    ProxyDetails, ProxyStatus, ReplicaDetails, ReplicaState, ServeInstanceDetails,
    serve_config_yaml_to_json,
};
