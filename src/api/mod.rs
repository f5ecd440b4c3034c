//! The CRD types: one file per kind. These types are the only source of `crds/*.yaml`.

pub mod conditions;
pub mod raycluster;
pub mod raycronjob;
pub mod rayjob;
pub mod rayservice;
pub(crate) mod schema;
pub mod servepipeline;
#[cfg(test)]
pub(crate) mod test_support;
pub mod yaml;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
#[cfg(test)]
use serde::Deserialize;

pub use raycluster::RayCluster;
pub use raycronjob::RayCronJob;
pub use rayjob::RayJob;
pub use rayservice::RayService;
pub use servepipeline::ServePipeline;

/// Every CRD raypipe serves, in a fixed order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        ServePipeline::crd(),
        with_retired_v1alpha1(RayCluster::crd()),
        with_retired_v1alpha1(RayJob::crd()),
        with_retired_v1alpha1(RayService::crd()),
        RayCronJob::crd(),
    ]
}

/// The version KubeRay served before `v1`, kept in raypipe's CRDs but not served.
pub const RETIRED_RAY_VERSION: &str = "v1alpha1";

/// Lists `ray.io/v1alpha1` as a version that is neither served nor stored. A cluster where
/// KubeRay once stored v1alpha1 objects has it in the CRD's `status.storedVersions`, and the
/// API server refuses a CRD that drops a stored version; listing it lets raypipe's CRDs replace
/// KubeRay's there. Not serving it is deliberate: KubeRay's v1alpha1 differs from v1 in a few
/// fields, and without a conversion webhook a v1alpha1 write would lose them silently; a request
/// for v1alpha1 gets "no matches for kind … in version ray.io/v1alpha1" instead. Objects stored as
/// v1alpha1 stay readable through v1 (see docs/migrating-from-kuberay.md).
fn with_retired_v1alpha1(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionVersion, CustomResourceValidation, JSONSchemaProps,
    };
    crd.spec.versions.push(CustomResourceDefinitionVersion {
        name: RETIRED_RAY_VERSION.to_owned(),
        served: false,
        storage: false,
        deprecated: Some(true),
        deprecation_warning: Some(format!(
            "{}/{RETIRED_RAY_VERSION} is not served by raypipe; use {}/v1",
            crd.spec.group, crd.spec.group
        )),
        schema: Some(CustomResourceValidation {
            open_api_v3_schema: Some(JSONSchemaProps {
                type_: Some("object".to_owned()),
                x_kubernetes_preserve_unknown_fields: Some(true),
                ..Default::default()
            }),
        }),
        ..Default::default()
    });
    crd
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

/// Writes every CRD to `dir/<plural>.<group>.yaml`.
pub fn write_crd_files(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for crd in crds() {
        std::fs::write(dir.join(crd_file_name(&crd)), crd_yaml(&crd))?;
    }
    Ok(())
}

/// Fails with a clear message when one of raypipe's CRDs is not installed and Established.
pub async fn check_crds_installed(client: &kube::Client) -> anyhow::Result<()> {
    let names: Vec<String> = crds()
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    check_named_crds_installed(client, &names).await
}

/// Like [`check_crds_installed`], for the named CRDs only (e.g. those one controller needs, when
/// raypipe runs beside an existing KubeRay that owns the `ray.io` CRDs).
pub async fn check_named_crds_installed(
    client: &kube::Client,
    names: &[String],
) -> anyhow::Result<()> {
    use kube::Resource as _;
    // Only the status is read: a full `CustomResourceDefinition` carries the OpenAPI schema
    // (hundreds of kB of JSON for a kind embedding a pod template), which decodes into several
    // MB of `JSONSchemaProps` that the allocator then keeps for the life of the process.
    let request = kube::core::Request::new(CustomResourceDefinition::url_path(&(), None));
    for name in names {
        let installed = match client
            .request::<CrdStatusOnly>(request.get(name, &Default::default())?)
            .await
        {
            Ok(crd) => Some(crd),
            Err(kube::Error::Api(status)) if status.is_not_found() => None,
            Err(e) => return Err(e.into()),
        };
        if !installed.is_some_and(|crd| crd.is_established()) {
            anyhow::bail!(
                "CRD {name} is not installed or not Established; install them with `raypipe crds | kubectl apply --server-side -f -`"
            );
        }
    }
    Ok(())
}

/// The part of a `CustomResourceDefinition` that [`check_named_crds_installed`] reads; serde
/// skips everything else without allocating.
#[derive(serde::Deserialize)]
struct CrdStatusOnly {
    status: Option<CrdStatusConditions>,
}

#[derive(serde::Deserialize)]
struct CrdStatusConditions {
    conditions: Option<Vec<CrdCondition>>,
}

#[derive(serde::Deserialize)]
struct CrdCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

impl CrdStatusOnly {
    fn is_established(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crd_check_reads_the_established_condition_of_a_full_crd() {
        let mut crd = serde_json::to_value(RayCluster::crd()).expect("a CRD serializes");
        let parse = |v: &serde_json::Value| {
            serde_json::from_str::<CrdStatusOnly>(&v.to_string())
                .expect("a CRD decodes")
                .is_established()
        };
        assert!(!parse(&crd), "no status yet");
        crd["status"] = serde_json::json!({"conditions": [
            {"type": "NamesAccepted", "status": "True"},
            {"type": "Established", "status": "False"}
        ]});
        assert!(!parse(&crd));
        crd["status"]["conditions"][1]["status"] = "True".into();
        assert!(parse(&crd));
        crd["status"] = serde_json::json!({"conditions": null});
        assert!(!parse(&crd));
    }

    /// `crds/` must be exactly what the types generate. To regenerate after changing a type:
    /// `cargo run -- crds --out-dir crds`.
    #[test]
    fn crds_directory_matches_the_types() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
        let mut expected_files: Vec<String> = crds().iter().map(crd_file_name).collect();
        expected_files.sort();
        let mut present: Vec<String> = std::fs::read_dir(&dir)
            .expect("crds/ exists")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".yaml"))
            .collect();
        present.sort();
        assert_eq!(
            present, expected_files,
            "crds/ holds other files than the types generate"
        );
        for crd in crds() {
            let file = dir.join(crd_file_name(&crd));
            let on_disk = std::fs::read_to_string(&file).expect("CRD file is readable");
            assert!(
                on_disk == crd_yaml(&crd),
                "{} drifted from the Rust types; run `cargo run -- crds --out-dir crds`",
                file.display()
            );
        }
    }

    #[test]
    fn every_crd_has_a_status_subresource_and_one_served_storage_version() {
        for crd in crds() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            // KubeRay's v1alpha1 stays listed for the kinds that had it, neither served nor
            // stored (see `with_retired_v1alpha1`); every other version is served and stored.
            let (retired, live): (Vec<_>, Vec<_>) = crd
                .spec
                .versions
                .iter()
                .partition(|v| v.name == RETIRED_RAY_VERSION && crd.spec.group == "ray.io");
            let had_v1alpha1 = ["rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io"];
            assert_eq!(
                retired.len(),
                usize::from(had_v1alpha1.contains(&name.as_str())),
                "{name}"
            );
            assert!(retired.iter().all(|v| !v.served && !v.storage), "{name}");
            assert_eq!(live.len(), 1, "{name}");
            let v = live[0];
            assert!(v.served && v.storage, "{name}");
            assert!(
                v.subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some(),
                "{name} lacks the status subresource"
            );
        }
    }

    #[test]
    fn crds_yaml_is_one_document_per_kind() {
        let docs: Vec<CustomResourceDefinition> = serde_yaml::Deserializer::from_str(&crds_yaml())
            .map(|d| CustomResourceDefinition::deserialize(d).expect("each document is a CRD"))
            .collect();
        let kinds: Vec<String> = docs.iter().map(|c| c.spec.names.kind.clone()).collect();
        assert_eq!(
            kinds,
            [
                "ServePipeline",
                "RayCluster",
                "RayJob",
                "RayService",
                "RayCronJob"
            ]
        );
    }
}
