//! The Job that deletes a GCS-FT cluster's storage namespace from Redis once the cluster is
//! deleted. It runs the head's image and environment (Redis address, credentials, namespace).

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use super::pod::{RAY_CONTAINER, head_pod};
use super::{BuildError, BuildOptions, env, has_env, shell_command};
use crate::api::raycluster::RayCluster;
use crate::kuberay::keys::{env as env_names, labels};
use crate::kuberay::names;

/// Seconds the cleanup may run; it is best effort.
pub const ACTIVE_DEADLINE_SECONDS: i64 = 300;

/// The cleanup script: connect to the first address of `RAY_REDIS_ADDRESS` (`redis://` assumed,
/// `rediss://` means TLS) and delete the storage namespace; exit 1 when Ray reports failure.
fn cleanup_script(with_username: bool) -> String {
    let username = if with_username {
        "username=os.getenv('REDIS_USERNAME', url.username), "
    } else {
        ""
    };
    format!(
        "echo \"Deleting this RayCluster's GCS storage namespace from Redis. To do it by hand and remove the finalizer, see https://docs.ray.io/en/master/cluster/kubernetes/user-guides/kuberay-gcs-ft.html\" && \
python -c \"import os, sys; \
from urllib.parse import urlparse; \
from ray._private.gcs_utils import cleanup_redis_storage; \
address = os.getenv('RAY_REDIS_ADDRESS', '').split(',')[0]; \
url = urlparse(address if '://' in address else 'redis://' + address); \
ok = cleanup_redis_storage(host=url.hostname, port=url.port, {username}password=os.getenv('REDIS_PASSWORD', url.password or ''), use_ssl=url.scheme == 'rediss', storage_namespace=os.getenv('RAY_external_storage_namespace')); \
sys.exit(0 if ok else 1)\""
    )
}

/// The Redis cleanup Job: the head Pod reduced to its Ray container, labelled
/// `ray.io/node-type: redis-cleanup`, never restarted, at most 5 minutes.
pub fn redis_cleanup_job(
    cluster: &RayCluster,
    options: &BuildOptions,
    spec_hash: &str,
) -> Result<Job, BuildError> {
    // KubeRay builds it from the head Pod before any batch scheduler sees that Pod.
    let unscheduled = BuildOptions {
        batch_scheduler: None,
        ..options.clone()
    };
    let head: Pod = head_pod(cluster, &unscheduled, spec_hash)?;
    let mut pod_labels = head.metadata.labels.clone().unwrap_or_default();
    pod_labels.insert(labels::NODE_TYPE.into(), labels::REDIS_CLEANUP.into());
    let pod_annotations = head.metadata.annotations.clone();
    let mut spec = head.spec.unwrap_or_default();
    spec.containers.truncate(RAY_CONTAINER + 1);
    let ray = &mut spec.containers[RAY_CONTAINER];
    let with_username = has_env(
        ray.env.as_deref().unwrap_or_default(),
        env_names::REDIS_USERNAME,
    );
    ray.command = Some(shell_command(options.login_shell, ""));
    ray.args = Some(vec![cleanup_script(with_username)]);
    // The Job runs no raylet or GCS: nothing to probe.
    ray.liveness_probe = None;
    ray.readiness_probe = None;
    // Give Redis a minute to answer before the cleanup gives up.
    let ray_env = ray.env.get_or_insert_with(Vec::new);
    ray_env.push(env("RAY_redis_db_connect_retries", "120"));
    ray_env.push(env("RAY_redis_db_connect_wait_milliseconds", "500"));
    // Small and fixed: the cleanup must not take the head's GPUs.
    ray.resources = Some(super::pod::sidecars::fixed_resources("200m", "256Mi"));
    spec.restart_policy = Some("Never".into());

    Ok(Job {
        metadata: ObjectMeta {
            name: Some(names::redis_cleanup_job_name(&cluster.name_any())),
            namespace: cluster.namespace(),
            labels: Some(pod_labels.clone()),
            annotations: pod_annotations.clone(),
            owner_references: Some(vec![crate::k8s::controller_owner_ref(cluster)?]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(ACTIVE_DEADLINE_SECONDS),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: pod_annotations,
                    ..Default::default()
                }),
                spec: Some(spec),
            },
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::raycluster::builders::test_cluster;
    use serde_json::json;

    fn ft_cluster(username: bool) -> RayCluster {
        let mut options = json!({"redisAddress": "redis:6379", "redisPassword": {"value": "pw"}});
        if username {
            options["redisUsername"] = json!({"value": "default"});
        }
        test_cluster(json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "c"},
            "spec": {"enableInTreeAutoscaling": true, "gcsFaultToleranceOptions": options, "headGroupSpec": {"template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.52.0", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]}}}}
        }))
    }

    #[test]
    fn cleanup_job_runs_only_the_ray_container_once() {
        let job =
            redis_cleanup_job(&ft_cluster(false), &BuildOptions::default(), "h").expect("builds");
        assert_eq!(job.metadata.name.as_deref(), Some("c-redis-cleanup"));
        let labels = job.metadata.labels.clone().expect("labels");
        assert_eq!(labels["ray.io/node-type"], "redis-cleanup");
        assert_eq!(labels["ray.io/cluster"], "c");
        assert_eq!(
            job.metadata.annotations.as_ref().expect("annotations")["ray.io/external-storage-namespace"],
            "uid-1"
        );
        assert_eq!(
            job.metadata.owner_references.as_ref().expect("owner")[0].kind,
            "RayCluster"
        );
        let spec = job.spec.expect("spec");
        assert_eq!(
            (spec.backoff_limit, spec.active_deadline_seconds),
            (Some(0), Some(300))
        );
        let template = spec.template;
        assert_eq!(
            template
                .metadata
                .as_ref()
                .and_then(|m| m.generate_name.clone()),
            None
        );
        let pod = template.spec.expect("pod spec");
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.containers.len(), 1, "no autoscaler sidecar");
        let ray = &pod.containers[0];
        assert!(ray.liveness_probe.is_none() && ray.readiness_probe.is_none());
        let args = &ray.args.as_ref().expect("args")[0];
        assert!(
            args.contains("cleanup_redis_storage(host=url.hostname, port=url.port, password="),
            "{args}"
        );
        assert!(!args.contains("username="));
        let env: Vec<_> = ray.env.iter().flatten().map(|e| e.name.clone()).collect();
        for name in [
            "RAY_REDIS_ADDRESS",
            "REDIS_PASSWORD",
            "RAY_external_storage_namespace",
            "RAY_redis_db_connect_retries",
        ] {
            assert!(env.contains(&name.to_owned()), "{name}");
        }
        let limits = ray
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .expect("limits");
        assert_eq!(limits.keys().collect::<Vec<_>>(), ["cpu", "memory"]);
    }

    #[test]
    fn cleanup_job_passes_the_username_when_there_is_one() {
        let job =
            redis_cleanup_job(&ft_cluster(true), &BuildOptions::default(), "h").expect("builds");
        let pod = job.spec.expect("spec").template.spec.expect("pod");
        let args = &pod.containers[0].args.as_ref().expect("args")[0];
        assert!(
            args.contains("username=os.getenv('REDIS_USERNAME', url.username), "),
            "{args}"
        );
    }
}
