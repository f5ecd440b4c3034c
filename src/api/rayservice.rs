//! `ray.io/v1` RayService (stub; filled in field for field from KubeRay).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(group = "ray.io", version = "v1", kind = "RayService", namespaced)]
#[serde(rename_all = "camelCase")]
pub struct RayServiceSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
}

/// `spec.upgradeStrategy` (stub).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RayServiceUpgradeStrategy {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}
