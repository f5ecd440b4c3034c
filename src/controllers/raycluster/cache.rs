//! What the RayCluster controller watches and reads from its caches: Pods and Services are
//! trimmed before they are cached (a few hundred bytes per Pod instead of its spec), and the
//! reconcile finds a cluster's Pods and head Service there, among the objects it controls.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus, Service};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::config::CACHE_SYNC_TIMEOUT;
use super::context::Context;
use super::error::Error;
use crate::api::raycluster::RayCluster;
use crate::kuberay::keys::labels;

/// Keeps what the controller reads of a Pod; the cache then holds a few hundred bytes per Pod
/// instead of its full spec.
pub(super) fn trim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.retain(|k, _| k.starts_with("ray.io/"));
    }
    if let Some(spec) = pod.spec.take() {
        pod.spec = Some(PodSpec {
            containers: spec
                .containers
                .into_iter()
                .take(1)
                .map(|c| Container {
                    name: c.name,
                    ..Default::default()
                })
                .collect(),
            restart_policy: spec.restart_policy,
            ..Default::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            phase: status.phase,
            conditions: status.conditions,
            container_statuses: status.container_statuses.map(|statuses| {
                statuses
                    .into_iter()
                    .map(|mut s| {
                        s.image = String::new();
                        s.image_id = String::new();
                        s.last_state = None;
                        s
                    })
                    .collect()
            }),
            pod_ip: status.pod_ip,
            reason: status.reason,
            message: status.message,
            ..Default::default()
        });
    }
}

pub(super) fn trim_service(service: &mut Service) {
    service.metadata.managed_fields = None;
    service.status = None;
}

impl Context {
    /// The first reconciles after start-up wait for the caches: an empty Pod cache would make
    /// every cluster look empty and get duplicate Pods.
    pub(super) async fn wait_for_caches(&self) -> Result<(), Error> {
        let ready = async {
            let _ = self.pods.wait_until_ready().await;
            let _ = self.services.wait_until_ready().await;
        };
        tokio::time::timeout(CACHE_SYNC_TIMEOUT, ready)
            .await
            .map_err(|_| Error::CacheNotReady(CACHE_SYNC_TIMEOUT))
    }

    /// The cluster's head and worker Pods in the cache (terminating ones included), found
    /// through the cluster-label index (a lookup, not a scan of every cached Pod).
    pub(super) fn cluster_pods(&self, cluster: &RayCluster) -> Vec<Arc<Pod>> {
        let namespace = cluster.namespace();
        let name = cluster.name_any();
        let uid = cluster.uid();
        let namespace_key = namespace.clone().unwrap_or_default();
        self.pod_index
            .find(&self.pods, &namespace_key, &name, |pod| {
                pod.namespace() == namespace
                    && pod.labels().get(labels::CLUSTER) == Some(&name)
                    && pod
                        .owner_references()
                        .iter()
                        .any(|o| Some(&o.uid) == uid.as_ref())
            })
    }

    pub(super) fn pod_in_cache(&self, namespace: &str, name: &str) -> bool {
        self.pods
            .get(&ObjectRef::new(name).within(namespace))
            .is_some()
    }

    pub(super) fn cached_service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.services.get(&ObjectRef::new(name).within(namespace))
    }

    /// The head Service in the cache, found by labels as KubeRay does, among the Services the
    /// cluster controls (anyone can copy the labels).
    pub(super) fn head_service(&self, cluster: &RayCluster) -> Result<Option<Arc<Service>>, Error> {
        let namespace = cluster.namespace();
        let name = cluster.name_any();
        let namespace_key = namespace.clone().unwrap_or_default();
        let found = self
            .service_index
            .find(&self.services, &namespace_key, &name, |s| {
                s.namespace() == namespace
                    && owned_by(&s.metadata, cluster)
                    && s.labels().get(labels::CLUSTER) == Some(&name)
                    && s.labels().get(labels::NODE_TYPE).map(String::as_str) == Some(labels::HEAD)
            });
        match found.len() {
            0 | 1 => Ok(found.into_iter().next()),
            n => Err(Error::Conflict(format!(
                "{n} head Services carry the labels of RayCluster {name}; delete the extra ones"
            ))),
        }
    }
}

/// Whether `cluster` is the controller (owner reference with `controller: true`) of `meta`:
/// only such objects are written, deleted or read as the cluster's own.
pub(super) fn owned_by(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    cluster: &RayCluster,
) -> bool {
    let uid = cluster.uid();
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::raycluster::status;

    #[test]
    fn trimmed_pods_keep_what_the_controller_reads() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "labels": {"ray.io/node-type": "head"},
                "annotations": {"ray.io/upgrade-strategy-recreate-hash": "h", "other": "x"},
                "managedFields": [{"manager": "m"}]},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "ray-head", "image": "i", "env": [{"name": "A", "value": "1"}]}, {"name": "side", "image": "i"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "ray-head", "image": "i", "imageID": "x", "ready": true, "restartCount": 0, "state": {"running": {}}}]}
        }))
        .expect("a Pod");
        trim_pod(&mut pod);
        assert!(pod.metadata.managed_fields.is_none());
        assert_eq!(pod.annotations().len(), 1);
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.containers.len(), 1);
        assert_eq!(spec.containers[0].name, "ray-head");
        assert!(spec.containers[0].env.is_none());
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert!(status::is_running_and_ready(&pod));
        assert_eq!(
            pod.status.and_then(|s| s.pod_ip).as_deref(),
            Some("10.0.0.1")
        );
    }
}
