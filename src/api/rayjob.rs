//! `ray.io/v1` RayJob (stub; filled in field for field from KubeRay).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(group = "ray.io", version = "v1", kind = "RayJob", namespaced)]
#[serde(rename_all = "camelCase")]
pub struct RayJobSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
}
