//! Reaching the Ray dashboard of a RayCluster from a controller: where it is (the head Service
//! named by the cluster spec, through a [`DashboardLocator`]) and with which token (clusters
//! with Ray token auth).

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;

use crate::api::raycluster::RayCluster;
use crate::controllers::raycluster::builders::service;
use crate::kuberay::keys::ports;
use crate::kuberay::names;
use crate::ray::{
    BearerToken, DashboardClientOptions, DashboardError, DashboardLocator, DashboardUrl,
    HeadService, RayDashboardClient,
};

/// The key of the auth token in its Secret.
pub const AUTH_TOKEN_KEY: &str = "auth_token";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Dashboard(#[from] DashboardError),
    #[error("reading Secret {namespace}/{name} for the Ray auth token: {source}")]
    TokenSecret {
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("Secret {namespace}/{name} has no key {AUTH_TOKEN_KEY} (the Ray auth token)")]
    TokenMissing { namespace: String, name: String },
}

/// The head Service of `cluster` as the locator needs it, from the spec alone (no API call).
pub fn head_service(cluster: &RayCluster) -> HeadService {
    let name = cluster.name_any();
    let port = service::head_ports(cluster)
        .get(ports::DASHBOARD_NAME)
        .and_then(|p| u16::try_from(*p).ok())
        .unwrap_or(crate::ray::DEFAULT_DASHBOARD_PORT);
    HeadService::new(
        cluster.namespace().unwrap_or_default(),
        names::head_service_name(&name, &cluster.spec),
        port,
    )
}

/// The dashboard URL of `cluster`.
pub fn locate(locator: &DashboardLocator, cluster: &RayCluster) -> Result<DashboardUrl, Error> {
    Ok(locator.locate(&head_service(cluster))?)
}

/// A dashboard client for `cluster`, with its Ray auth token when the cluster uses one.
pub async fn client_for(
    client: &kube::Client,
    locator: &DashboardLocator,
    options: &DashboardClientOptions,
    cluster: &RayCluster,
) -> Result<RayDashboardClient, Error> {
    let url = locate(locator, cluster)?;
    let mut options = options.clone();
    if crate::kuberay::spec::auth_enabled(&cluster.spec) {
        options.bearer_token = Some(read_token(client, cluster).await?);
    }
    Ok(RayDashboardClient::new(url, options)?)
}

/// Ray's auth token of `cluster`, from its Secret.
pub async fn read_token(client: &kube::Client, cluster: &RayCluster) -> Result<BearerToken, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster
        .spec
        .auth_options
        .as_ref()
        .and_then(|a| a.secret_name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| names::auth_secret_name(&cluster.name_any()));
    let secret = Api::<Secret>::namespaced(client.clone(), &namespace)
        .get(&name)
        .await
        .map_err(|source| Error::TokenSecret {
            namespace: namespace.clone(),
            name: name.clone(),
            source: Box::new(source),
        })?;
    let token = secret
        .data
        .as_ref()
        .and_then(|d| d.get(AUTH_TOKEN_KEY))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .filter(|t| !t.is_empty())
        .ok_or(Error::TokenMissing { namespace, name })?;
    Ok(BearerToken::new(token.trim().to_owned())?)
}
