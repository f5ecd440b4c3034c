//! The one way a controller writes the status of the object it reconciles: a forced
//! server-side apply of `{apiVersion, kind, status}` on the status subresource under the
//! controller's fixed field manager (`crate::k8s::field_managers`).
//!
//! Forced because the controller is the status' only writer; whole because every controller
//! computes the complete status (a field it leaves out is meant to be removed). Whether the
//! status changed at all is each controller's decision before calling this.

use kube::api::{Api, Patch, PatchParams};
use kube::core::NamespaceResourceScope;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Server-side applies `status` as the status of `object` (namespaced kinds). The caller maps
/// the error into its own `Error` (each controller names the write in its own words).
pub async fn apply_status<K, S>(
    client: &kube::Client,
    object: &K,
    field_manager: &str,
    status: &S,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    S: Serialize,
{
    let api: Api<K> = Api::namespaced(client.clone(), &object.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        &object.name_any(),
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
}
