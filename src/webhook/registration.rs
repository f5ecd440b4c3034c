//! The ValidatingWebhookConfiguration that sends our kinds to the webhook, and keeping its CA
//! bundle current when the operator generates the certificate.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::{WebhookError, WebhookKind};

/// Field manager for configurations the operator applies itself.
pub const FIELD_MANAGER: &str = "raypipe-webhook";

/// Where the API server sends reviews.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// `https://host:port` (no trailing slash); each kind's path is appended. Tests use
    /// `https://127.0.0.1:PORT`, so the API server never dials a cluster IP.
    Url(String),
    /// An in-cluster Service (the Helm chart's way).
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
}

/// Which requests are sent at all (besides the kinds).
#[derive(Clone, Debug, Default)]
pub struct Selectors {
    pub namespace_selector: Option<LabelSelector>,
    pub object_selector: Option<LabelSelector>,
}

/// `Fail` rejects requests while the webhook cannot be reached (KubeRay's choice; a broken
/// object never slips through); `Ignore` admits them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FailurePolicy {
    Fail,
    Ignore,
}

impl FailurePolicy {
    fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

/// One webhook per kind, for CREATE and UPDATE of the main resource (not `/status`).
pub fn validating_webhook_configuration(
    name: &str,
    endpoint: &Endpoint,
    ca_bundle_pem: &str,
    selectors: &Selectors,
    failure_policy: FailurePolicy,
    kinds: &[WebhookKind],
) -> ValidatingWebhookConfiguration {
    let webhooks = kinds
        .iter()
        .map(|kind| {
            let client_config = match endpoint {
                Endpoint::Url(base) => WebhookClientConfig {
                    url: Some(format!("{}{}", base.trim_end_matches('/'), kind.path())),
                    ca_bundle: Some(ByteString(ca_bundle_pem.as_bytes().to_vec())),
                    service: None,
                },
                Endpoint::Service {
                    namespace,
                    name,
                    port,
                } => WebhookClientConfig {
                    url: None,
                    ca_bundle: (!ca_bundle_pem.is_empty())
                        .then(|| ByteString(ca_bundle_pem.as_bytes().to_vec())),
                    service: Some(ServiceReference {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        path: Some(kind.path()),
                        port: Some(*port),
                    }),
                },
            };
            ValidatingWebhook {
                name: kind.webhook_name(),
                admission_review_versions: vec!["v1".to_owned()],
                client_config,
                failure_policy: Some(failure_policy.as_str().to_owned()),
                match_policy: Some("Equivalent".to_owned()),
                namespace_selector: selectors.namespace_selector.clone(),
                object_selector: selectors.object_selector.clone(),
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(vec![kind.group().to_owned()]),
                    api_versions: Some(vec![kind.version().to_owned()]),
                    operations: Some(vec!["CREATE".to_owned(), "UPDATE".to_owned()]),
                    resources: Some(vec![kind.plural().to_owned()]),
                    scope: Some("Namespaced".to_owned()),
                }]),
                side_effects: "None".to_owned(),
                timeout_seconds: Some(10),
                match_conditions: None,
            }
        })
        .collect();
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                [(
                    crate::k8s::LABEL_MANAGED_BY.to_owned(),
                    crate::k8s::MANAGED_BY.to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        webhooks: Some(webhooks),
    }
}

/// Server-side applies `configuration` (the operator registering itself).
pub async fn apply(
    client: &kube::Client,
    configuration: &ValidatingWebhookConfiguration,
) -> Result<ValidatingWebhookConfiguration, WebhookError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let name = configuration.metadata.name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(configuration),
    )
    .await
    .map_err(|e| WebhookError::kube(format!("applying ValidatingWebhookConfiguration {name}"), e))
}

/// Writes `ca_pem` into every webhook of the configuration `name` (installed by Helm without a
/// CA bundle, since only the operator knows the CA it generated). A no-op when already there.
pub async fn inject_ca_bundle(
    client: &kube::Client,
    name: &str,
    ca_pem: &str,
) -> Result<(), WebhookError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let what = format!("ValidatingWebhookConfiguration {name}");
    for _ in 0..5 {
        let mut configuration = api
            .get(name)
            .await
            .map_err(|e| WebhookError::kube(format!("reading {what}"), e))?;
        let bundle = ByteString(ca_pem.as_bytes().to_vec());
        let mut changed = false;
        for webhook in configuration.webhooks.iter_mut().flatten() {
            if webhook.client_config.ca_bundle.as_ref() != Some(&bundle) {
                webhook.client_config.ca_bundle = Some(bundle.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(());
        }
        match api
            .replace(name, &PostParams::default(), &configuration)
            .await
        {
            Ok(_) => {
                tracing::info!(configuration = name, "wrote the webhook CA bundle");
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(WebhookError::kube(format!("updating {what}"), e)),
        }
    }
    Err(WebhookError::Certificate(format!(
        "{what} kept changing while its CA bundle was being written"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_endpoints_get_one_webhook_per_kind_with_its_path() {
        let config = validating_webhook_configuration(
            "raypipe",
            &Endpoint::Url("https://127.0.0.1:9443/".into()),
            "PEM",
            &Selectors::default(),
            FailurePolicy::Fail,
            &WebhookKind::ALL,
        );
        let webhooks = config.webhooks.expect("webhooks");
        assert_eq!(webhooks.len(), 5);
        let cluster = webhooks
            .iter()
            .find(|w| w.name == "validate.rayclusters.ray.io")
            .expect("a RayCluster webhook");
        assert_eq!(
            cluster.client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/validate-ray-io-v1-raycluster")
        );
        assert_eq!(cluster.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(cluster.side_effects, "None");
    }

    #[test]
    fn service_endpoints_leave_the_bundle_for_injection() {
        let config = validating_webhook_configuration(
            "raypipe",
            &Endpoint::Service {
                namespace: "raypipe-system".into(),
                name: "raypipe-webhook".into(),
                port: 443,
            },
            "",
            &Selectors::default(),
            FailurePolicy::Ignore,
            &[WebhookKind::ServePipeline],
        );
        let webhook = &config.webhooks.expect("webhooks")[0];
        assert!(webhook.client_config.ca_bundle.is_none());
        let service = webhook.client_config.service.as_ref().expect("a service");
        assert_eq!(
            service.path.as_deref(),
            Some("/validate-raypipe-dev-v1alpha1-servepipeline")
        );
    }
}
