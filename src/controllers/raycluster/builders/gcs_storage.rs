//! Embedded GCS fault tolerance (`gcsFaultToleranceOptions.backend: rocksdb`, gate
//! GCSFaultToleranceEmbeddedStorage), as KubeRay builds it: the PVC `<cluster>-gcs-pvc` (unless
//! the user names a claim), and on the head the RocksDB variables and the `gcs-storage` volume
//! mounted at `/data/gcs`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource,
    PodSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::{BuildError, env, has_env};
use crate::api::raycluster::{GcsEmbeddedStorage, GcsStorageDeletionPolicy, RayCluster};
use crate::kuberay::keys::{env as env_names, labels, volumes};
use crate::kuberay::names;
use crate::kuberay::spec::gcs_ft_embedded;

fn storage(cluster: &RayCluster) -> Option<&GcsEmbeddedStorage> {
    cluster
        .spec
        .gcs_fault_tolerance_options
        .as_ref()
        .and_then(|o| o.storage.as_ref())
}

/// `deletionPolicy: Retain`: the PVC (and the GCS state in it) outlives the cluster.
pub fn retained(cluster: &RayCluster) -> bool {
    storage(cluster).and_then(|s| s.deletion_policy) == Some(GcsStorageDeletionPolicy::Retain)
}

/// The claim the user named instead of letting the operator make one.
pub fn user_claim(cluster: &RayCluster) -> bool {
    storage(cluster)
        .and_then(|s| s.claim_name.as_deref())
        .is_some_and(|c| !c.is_empty())
}

/// The PVC the operator makes for the embedded store; `None` without the rocksdb backend or
/// when the user named a claim. Owned by the cluster unless `deletionPolicy: Retain`.
pub fn gcs_storage_pvc(cluster: &RayCluster) -> Result<Option<PersistentVolumeClaim>, BuildError> {
    if !gcs_ft_embedded(&cluster.spec) || user_claim(cluster) {
        return Ok(None);
    }
    let name = cluster.name_any();
    let storage = storage(cluster);
    let access_modes = storage
        .and_then(|s| s.access_modes.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| vec!["ReadWriteOnce".to_owned()]);
    let size = storage
        .and_then(|s| s.size.clone())
        .unwrap_or_else(|| Quantity(volumes::GCS_STORAGE_DEFAULT_SIZE.to_owned()));
    let owner_references = if retained(cluster) {
        None
    } else {
        Some(vec![crate::k8s::controller_owner_ref(cluster)?])
    };
    Ok(Some(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(names::gcs_storage_pvc_name(&name, &cluster.spec)),
            namespace: cluster.namespace(),
            labels: Some(BTreeMap::from([(labels::CLUSTER.to_owned(), name)])),
            owner_references,
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(access_modes),
            storage_class_name: storage.and_then(|s| s.storage_class_name.clone()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_owned(), size)])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }))
}

/// The head's side: `RAY_gcs_storage=rocksdb`, `RAY_gcs_storage_path=/data/gcs` (where unset),
/// and the claim mounted there (at `subPath` when given).
pub(super) fn configure_head(cluster: &RayCluster, spec: &mut PodSpec, ray: usize) {
    if !gcs_ft_embedded(&cluster.spec) {
        return;
    }
    let Some(container) = spec.containers.get_mut(ray) else {
        return;
    };
    set_env(
        container,
        env_names::RAY_GCS_STORAGE,
        volumes::GCS_STORAGE_ROCKSDB,
    );
    set_env(
        container,
        env_names::RAY_GCS_STORAGE_PATH,
        volumes::GCS_STORAGE_PATH,
    );
    container
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: volumes::GCS_STORAGE.to_owned(),
            mount_path: volumes::GCS_STORAGE_PATH.to_owned(),
            sub_path: storage(cluster)
                .and_then(|s| s.sub_path.clone())
                .filter(|p| !p.is_empty()),
            ..Default::default()
        });
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: volumes::GCS_STORAGE.to_owned(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: names::gcs_storage_pvc_name(&cluster.name_any(), &cluster.spec),
            read_only: None,
        }),
        ..Default::default()
    });
}

fn set_env(container: &mut Container, name: &str, value: &str) {
    if !has_env(container.env.as_deref().unwrap_or_default(), name) {
        container
            .env
            .get_or_insert_with(Vec::new)
            .push(env(name, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster(ft: serde_json::Value) -> RayCluster {
        super::super::test_cluster(json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "raycluster-embedded-gcs-ft"},
            "spec": {
                "gcsFaultToleranceOptions": ft,
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "i"}]}}}
            }
        }))
    }

    #[test]
    fn the_pvc_has_kuberays_shape_and_is_owned_unless_retained() {
        let pvc = gcs_storage_pvc(&cluster(
            json!({"backend": "rocksdb", "storage": {"size": "1Gi"}}),
        ))
        .expect("builds")
        .expect("a PVC");
        assert_eq!(
            serde_json::to_value(&pvc).expect("json"),
            json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": "raycluster-embedded-gcs-ft-gcs-pvc", "namespace": "ns",
                    "labels": {"ray.io/cluster": "raycluster-embedded-gcs-ft"},
                    "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster",
                        "name": "raycluster-embedded-gcs-ft", "uid": "uid-1",
                        "controller": true, "blockOwnerDeletion": true}]
                },
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
            })
        );
        let retained = gcs_storage_pvc(&cluster(json!({"backend": "rocksdb", "storage": {
            "deletionPolicy": "Retain", "storageClassName": "fast", "accessModes": ["ReadWriteOncePod"]}})))
        .expect("builds")
        .expect("a PVC");
        assert!(retained.metadata.owner_references.is_none());
        let spec = retained.spec.expect("spec");
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOncePod".to_owned()]));
        assert_eq!(
            spec.resources.and_then(|r| r.requests).expect("requests")["storage"],
            Quantity("1Gi".into())
        );
        let claimed = cluster(json!({"backend": "rocksdb", "storage": {"claimName": "mine"}}));
        assert!(gcs_storage_pvc(&claimed).expect("builds").is_none());
        assert!(
            gcs_storage_pvc(&cluster(json!({"redisAddress": "r:6379"})))
                .expect("builds")
                .is_none()
        );
    }

    #[test]
    fn the_head_gets_the_rocksdb_variables_and_the_claim() {
        let claimed = cluster(
            json!({"backend": "rocksdb", "storage": {"claimName": "mine", "subPath": "gcs"}}),
        );
        let mut spec = claimed
            .spec
            .head_group_spec
            .template
            .spec
            .clone()
            .expect("spec");
        configure_head(&claimed, &mut spec, 0);
        assert_eq!(
            serde_json::to_value(&spec).expect("json"),
            json!({
                "containers": [{"name": "ray-head", "image": "i",
                    "env": [{"name": "RAY_gcs_storage", "value": "rocksdb"},
                            {"name": "RAY_gcs_storage_path", "value": "/data/gcs"}],
                    "volumeMounts": [{"name": "gcs-storage", "mountPath": "/data/gcs", "subPath": "gcs"}]}],
                "volumes": [{"name": "gcs-storage", "persistentVolumeClaim": {"claimName": "mine"}}]
            })
        );
    }
}
