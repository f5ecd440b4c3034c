//! The containers raypipe adds next to Ray's: the autoscaler sidecar of the head (with the
//! template's overrides) and the worker init container that waits for the GCS.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::super::{env, field_env, shell_command};
use super::{AUTOSCALER_CONTAINER_NAME, WAIT_GCS_READY_CONTAINER_NAME};
use crate::api::raycluster::AutoscalerOptions;
use crate::kuberay::keys::{env as env_names, labels};

pub(in crate::controllers::raycluster::builders) fn fixed_resources(
    cpu: &str,
    memory: &str,
) -> ResourceRequirements {
    let list = BTreeMap::from([
        ("cpu".to_owned(), Quantity(cpu.to_owned())),
        ("memory".to_owned(), Quantity(memory.to_owned())),
    ]);
    ResourceRequirements {
        limits: Some(list.clone()),
        requests: Some(list),
        ..Default::default()
    }
}

/// The autoscaler command; also exported as `KUBERAY_GEN_AUTOSCALER_START_CMD` so custom args
/// can run it.
pub const AUTOSCALER_START_COMMAND: &str = "ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) --cluster-namespace $(RAY_CLUSTER_NAMESPACE)";

pub(super) fn autoscaler_container(image: String, login_shell: bool) -> Container {
    let cluster_label = format!("metadata.labels['{}']", labels::CLUSTER);
    Container {
        name: AUTOSCALER_CONTAINER_NAME.into(),
        image: Some(image),
        image_pull_policy: Some("IfNotPresent".into()),
        env: Some(vec![
            field_env(env_names::RAY_CLUSTER_NAME, &cluster_label),
            field_env(env_names::RAY_CLUSTER_NAMESPACE, "metadata.namespace"),
            field_env("RAY_HEAD_POD_NAME", "metadata.name"),
            env("KUBERAY_CRD_VER", "v1"),
            env(
                env_names::KUBERAY_GEN_AUTOSCALER_START_CMD,
                AUTOSCALER_START_COMMAND,
            ),
        ]),
        command: Some(shell_command(login_shell, "")),
        args: Some(vec![AUTOSCALER_START_COMMAND.into()]),
        resources: Some(fixed_resources("500m", "512Mi")),
        ..Default::default()
    }
}

pub(super) fn merge_autoscaler_overrides(container: &mut Container, options: &AutoscalerOptions) {
    if let Some(resources) = &options.resources {
        container.resources = Some(resources.clone());
    }
    if let Some(image) = &options.image {
        container.image = Some(image.clone());
    }
    if let Some(policy) = &options.image_pull_policy {
        container.image_pull_policy = Some(policy.clone());
    }
    if let Some(extra) = options.env.as_ref().filter(|e| !e.is_empty()) {
        container
            .env
            .get_or_insert_with(Vec::new)
            .extend(extra.iter().cloned());
    }
    if let Some(extra) = options.env_from.as_ref().filter(|e| !e.is_empty()) {
        container
            .env_from
            .get_or_insert_with(Vec::new)
            .extend(extra.iter().cloned());
    }
    if let Some(extra) = options.volume_mounts.as_ref().filter(|e| !e.is_empty()) {
        container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .extend(extra.iter().cloned());
    }
    if let Some(context) = &options.security_context {
        container.security_context = Some(context.clone());
    }
    if let Some(command) = options.command.as_ref().filter(|c| !c.is_empty()) {
        container.command = Some(command.clone());
    }
    if let Some(args) = options.args.as_ref().filter(|a| !a.is_empty()) {
        container.args = Some(args.clone());
    }
}

/// The init container that holds a worker until the head's GCS answers `ray health-check`.
/// It shares the Ray container's image, security context, environment and mounts (TLS settings
/// may live there).
pub(super) fn wait_gcs_ready_container(
    ray: &Container,
    head_fqdn: &str,
    head_port: &str,
    login_shell: bool,
) -> Container {
    let address = format!("{head_fqdn}:{head_port}");
    // Quiet for two minutes (the head is usually still starting), then show the check's output.
    let script = format!(
        r#"
SECONDS=0
while true; do
  if (( SECONDS <= 120 )); then
    if ray health-check --address {address} > /dev/null 2>&1; then
      echo "GCS is ready."
      break
    fi
    echo "$SECONDS seconds elapsed: waiting for the GCS at {address}."
  else
    if ray health-check --address {address}; then
      echo "GCS is ready; errors printed above can be ignored."
      break
    fi
    echo "$SECONDS seconds elapsed: still waiting for the GCS at {address}. Troubleshooting: https://docs.ray.io/en/master/cluster/kubernetes/troubleshooting.html"
  fi
  sleep 5
done
"#
    );
    Container {
        name: WAIT_GCS_READY_CONTAINER_NAME.into(),
        image: ray.image.clone(),
        image_pull_policy: ray.image_pull_policy.clone(),
        command: Some(shell_command(login_shell, "")),
        args: Some(vec![script]),
        security_context: ray.security_context.clone(),
        env: ray.env.clone(),
        volume_mounts: ray.volume_mounts.clone(),
        // Fixed and small: a ResourceQuota needs init containers to declare resources, and the
        // Ray container's GPUs must not be requested twice.
        resources: Some(fixed_resources("200m", "256Mi")),
        ..Default::default()
    }
}
