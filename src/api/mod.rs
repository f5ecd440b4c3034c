//! The CRD types: one file per kind. These types are the only source of `crds/*.yaml`.

pub mod conditions;
pub mod raycluster;
pub mod raycronjob;
pub mod rayjob;
pub mod rayservice;
pub mod servepipeline;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use raycluster::RayCluster;
pub use raycronjob::RayCronJob;
pub use rayjob::RayJob;
pub use rayservice::RayService;
pub use servepipeline::ServePipeline;

/// Every CRD raypipe serves, in a fixed order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        ServePipeline::crd(),
        RayCluster::crd(),
        RayJob::crd(),
        RayService::crd(),
        RayCronJob::crd(),
    ]
}

/// The file in `crds/` that holds a CRD: `<plural>.<group>.yaml`.
pub fn crd_file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

/// One CRD as YAML, as written to `crds/`.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> String {
    serde_yaml::to_string(crd).expect("a CRD always serializes")
}

/// Every CRD as one multi-document YAML stream (`raypipe crds`).
pub fn crds_yaml() -> String {
    crds()
        .iter()
        .map(|crd| format!("---\n{}", crd_yaml(crd)))
        .collect()
}

/// Fails with a clear message when one of raypipe's CRDs is not installed and Established.
pub async fn check_crds_installed(client: &kube::Client) -> anyhow::Result<()> {
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    for crd in crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let installed = api.get_opt(&name).await?;
        let established = installed
            .as_ref()
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
        if !established {
            anyhow::bail!(
                "CRD {name} is not installed or not Established; install them with `raypipe crds | kubectl apply --server-side -f -`"
            );
        }
    }
    Ok(())
}
