//! The apply stage of the gated features KubeRay v1.7 added: NetworkPolicies
//! (RayClusterNetworkPolicy), the cert-manager PKI of mTLS and the wait for its certificates
//! (RayClusterMTLS), and the embedded GCS store's PVC (GCSFaultToleranceEmbeddedStorage). Each
//! runs only with its gate on; what was checked is remembered, so a settled cluster makes no
//! writes (and few reads) for them.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::events::EventType;

use super::builders::{self, gcs_storage, mtls};
use super::cache::owned_by;
use super::context::Context;
use super::error::{Error, KubeFailure};
use super::status::Progress;
use crate::api::raycluster::RayCluster;
use crate::controllers::frame::children::{ChildEvents, ChildWriter, Mode};
use crate::k8s::field_managers;
use crate::kuberay::keys::{labels, reasons};
use crate::kuberay::names::{self, NodeType};
use crate::kuberay::spec::{gcs_ft_embedded, tls_enabled};
use crate::validation::feature_gates::gates;

fn gate(ctx: &Context, name: &str) -> bool {
    ctx.config.feature_gates.enabled(name)
}

/// The head and per-group NetworkPolicies: created, brought back when they drift, and those of
/// groups (or a `networkPolicy`) that went away deleted. A name someone else holds is a
/// `NetworkPolicyNameCollision`, left alone.
pub(super) async fn ensure_network_policies(
    cluster: &RayCluster,
    ctx: &Context,
) -> Result<(), Error> {
    if !gate(ctx, gates::RAY_CLUSTER_NETWORK_POLICY) {
        return Ok(());
    }
    let desired = builders::network_policy::network_policies(cluster)?;
    let memo_key = "NetworkPolicy/*";
    let hash = crate::k8s::stable_hash(&desired);
    if ctx.recently_ensured(cluster, memo_key, &hash) {
        return Ok(());
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &namespace);
    for policy in &desired {
        ensure_network_policy(cluster, ctx, &api, policy).await?;
    }
    let wanted: BTreeSet<String> = desired.iter().map(|p| p.name_any()).collect();
    let selector = format!("{}={}", labels::CLUSTER, cluster.name_any());
    let existing = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| KubeFailure::new("listing NetworkPolicies", e))?;
    for stale in existing
        .items
        .iter()
        .filter(|p| !wanted.contains(&p.name_any()) && owned_by(&p.metadata, cluster))
    {
        let name = stale.name_any();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                ctx.event(
                    cluster,
                    EventType::Normal,
                    reasons::DELETED_NETWORK_POLICY,
                    "Delete",
                    format!("Deleted NetworkPolicy {namespace}/{name}"),
                )
                .await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                ctx.event(
                    cluster,
                    EventType::Warning,
                    reasons::FAILED_TO_DELETE_NETWORK_POLICY,
                    "Delete",
                    format!("Failed to delete NetworkPolicy {namespace}/{name}: {e}"),
                )
                .await;
                return Err(KubeFailure::new(format!("deleting NetworkPolicy {name}"), e).into());
            }
        }
    }
    ctx.remember_ensured(cluster, memo_key.to_owned(), hash);
    Ok(())
}

async fn ensure_network_policy(
    cluster: &RayCluster,
    ctx: &Context,
    api: &Api<NetworkPolicy>,
    desired: &NetworkPolicy,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = desired.name_any();
    let existing = api
        .get_opt(&name)
        .await
        .map_err(|e| KubeFailure::new(format!("reading NetworkPolicy {name}"), e))?;
    let writer = ChildWriter::new(&ctx.recorder, cluster, field_managers::RAYCLUSTER);
    let Some(existing) = existing else {
        let events = ChildEvents::new("Create")
            .written(
                reasons::CREATED_NETWORK_POLICY,
                format!("Created NetworkPolicy {namespace}/{name}"),
            )
            .already_ours_too()
            .failed(
                reasons::FAILED_TO_CREATE_NETWORK_POLICY,
                format!("Failed to create NetworkPolicy {namespace}/{name}"),
            );
        writer.write(api, desired, Mode::Create, events).await?;
        return Ok(());
    };
    if !owned_by(&existing.metadata, cluster) {
        let message = format!(
            "NetworkPolicy {namespace}/{name} already exists and is not owned by this RayCluster, network isolation will not be applied. Rename the existing NetworkPolicy or use a different RayCluster name to avoid the collision"
        );
        ctx.event(
            cluster,
            EventType::Warning,
            reasons::NETWORK_POLICY_NAME_COLLISION,
            "Validate",
            message.clone(),
        )
        .await;
        return Err(Error::Conflict(message));
    }
    if existing.spec == desired.spec && existing.metadata.labels == desired.metadata.labels {
        return Ok(());
    }
    let events = ChildEvents::new("Update")
        .written(
            reasons::UPDATED_NETWORK_POLICY,
            format!("Updated NetworkPolicy {namespace}/{name}"),
        )
        .failed(
            reasons::FAILED_TO_UPDATE_NETWORK_POLICY,
            format!("Failed to update NetworkPolicy {namespace}/{name}"),
        );
    let mode = Mode::Apply {
        existing: Some(&existing.metadata),
    };
    writer.write(api, desired, mode, events).await?;
    Ok(())
}

/// The embedded GCS store's PVC: a user's claim must exist (a Warning says so, the head waits
/// for it); the operator's is created once and never resized or re-classed in place (a
/// Warning names the drift), and its controller reference follows `deletionPolicy`.
pub(super) async fn ensure_gcs_storage(cluster: &RayCluster, ctx: &Context) -> Result<(), Error> {
    if !gate(ctx, gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE) || !gcs_ft_embedded(&cluster.spec) {
        return Ok(());
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let name = names::gcs_storage_pvc_name(&cluster.name_any(), &cluster.spec);
    let desired = gcs_storage::gcs_storage_pvc(cluster)?;
    let memo_key = format!("PersistentVolumeClaim/{name}");
    let hash = crate::k8s::stable_hash(&desired);
    if ctx.recently_ensured(cluster, &memo_key, &hash) {
        return Ok(());
    }
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing = api
        .get_opt(&name)
        .await
        .map_err(|e| KubeFailure::new(format!("reading PersistentVolumeClaim {name}"), e))?;
    match (desired, existing) {
        (None, None) => {
            ctx.event(
                cluster,
                EventType::Warning,
                reasons::FAILED_TO_CREATE_PVC,
                "Validate",
                format!("gcsFaultToleranceOptions.storage.claimName {name:?} not found in namespace {namespace}; the head Pod will not start until it exists"),
            )
            .await;
            // Checked again on the next pass; the head is created and waits for the claim.
            return Ok(());
        }
        (None, Some(_)) => {}
        (Some(desired), None) => {
            let created = api
                .create(&PostParams::default(), &desired)
                .await
                .map_err(|e| {
                    Error::Kube(KubeFailure::new(
                        format!("creating PersistentVolumeClaim {name}"),
                        e,
                    ))
                });
            if let Err(e) = created {
                ctx.event(
                    cluster,
                    EventType::Warning,
                    reasons::FAILED_TO_CREATE_PVC,
                    "Create",
                    format!("Failed to create GCS storage PVC {namespace}/{name}, {e}"),
                )
                .await;
                return Err(e);
            }
            ctx.event(
                cluster,
                EventType::Normal,
                reasons::CREATED_PVC,
                "Create",
                format!("Created GCS storage PVC {namespace}/{name}"),
            )
            .await;
        }
        (Some(desired), Some(existing)) => {
            // A claim left by a same-named cluster with `Retain` is the documented way back to
            // its GCS state, so an existing claim is adopted as it is.
            if let Some(drift) = pvc_drift(&desired, &existing) {
                ctx.event(
                    cluster,
                    EventType::Warning,
                    reasons::FAILED_TO_CREATE_PVC,
                    "Update",
                    format!("GCS storage PVC {namespace}/{name} already exists and cannot be reconfigured in place ({drift}); delete the PVC to recreate it with the new settings"),
                )
                .await;
            }
            align_pvc_owner(cluster, &api, &existing).await?;
        }
    }
    ctx.remember_ensured(cluster, memo_key, hash);
    Ok(())
}

/// What differs between the operator's claim and the stored one (size, class when asked for,
/// access modes).
fn pvc_drift(desired: &PersistentVolumeClaim, existing: &PersistentVolumeClaim) -> Option<String> {
    let (want, have) = (
        desired.spec.clone()?,
        existing.spec.clone().unwrap_or_default(),
    );
    let size = |s: &k8s_openapi::api::core::v1::PersistentVolumeClaimSpec| {
        s.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.clone())
    };
    let mut drift = Vec::new();
    if size(&want) != size(&have) {
        drift.push(format!("size {:?} vs {:?}", size(&want), size(&have)));
    }
    // The API server fills in the default class; only a class asked for can drift.
    if want.storage_class_name.is_some() && want.storage_class_name != have.storage_class_name {
        drift.push("storageClassName".to_owned());
    }
    let modes = |m: &Option<Vec<String>>| {
        m.clone()
            .unwrap_or_default()
            .into_iter()
            .collect::<BTreeSet<_>>()
    };
    if modes(&want.access_modes) != modes(&have.access_modes) {
        drift.push("accessModes".to_owned());
    }
    (!drift.is_empty()).then(|| drift.join(", "))
}

/// `Retain` drops the cluster's controller reference from an existing claim; the default puts
/// it (back) on, so a change of policy applies to a claim already provisioned.
async fn align_pvc_owner(
    cluster: &RayCluster,
    api: &Api<PersistentVolumeClaim>,
    existing: &PersistentVolumeClaim,
) -> Result<(), Error> {
    let uid = cluster.uid().unwrap_or_default();
    let retain = gcs_storage::retained(cluster);
    let owned = owned_by(&existing.metadata, cluster);
    if retain != owned {
        return Ok(());
    }
    let mut references: Vec<OwnerReference> = existing
        .owner_references()
        .iter()
        .filter(|o| o.uid != uid)
        .cloned()
        .collect();
    if !retain {
        if crate::k8s::controller_of(&existing.metadata).is_some() {
            // Someone else controls it: leave it to them, as KubeRay would fail to here.
            return Ok(());
        }
        references.push(crate::k8s::controller_owner_ref(cluster)?);
    }
    let patch = serde_json::json!({"metadata": {
        "ownerReferences": references,
        "resourceVersion": existing.resource_version(),
    }});
    let name = existing.name_any();
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| {
            KubeFailure::new(
                format!("updating the owner of PersistentVolumeClaim {name}"),
                e,
            )
        })?;
    Ok(())
}

fn dynamic_api(ctx: &Context, namespace: &str, resource: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.client.clone(), namespace, resource)
}

/// IPs of the cluster's live Pods of a node type, from the cache.
fn pod_ips(cluster: &RayCluster, ctx: &Context, node_type: NodeType) -> Vec<String> {
    ctx.cluster_pods(cluster)
        .iter()
        .filter(|p| {
            p.labels().get(labels::NODE_TYPE).map(String::as_str) == Some(node_type.as_str())
        })
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.status.as_ref())
        .filter(|s| !matches!(s.phase.as_deref(), Some("Succeeded" | "Failed")))
        .filter_map(|s| s.pod_ip.clone())
        .collect()
}

/// The mTLS PKI: Issuers and the CA made once; the head and worker Certificates made, and
/// rewritten when the Pods' IPs change; cert-manager's Secrets given their Certificate as
/// owner, so they go with it. Without cert-manager the cluster is refused (no Pod could start).
pub(super) async fn ensure_mtls(cluster: &RayCluster, ctx: &Context) -> Result<Progress, Error> {
    if !gate(ctx, gates::RAY_CLUSTER_MTLS) || !tls_enabled(&cluster.spec) {
        return Ok(Progress::Done);
    }
    let domain = &ctx.config.build.cluster_domain;
    let head = mtls::leaf_certificate(
        cluster,
        NodeType::Head,
        &pod_ips(cluster, ctx, NodeType::Head),
        domain,
    )?;
    let worker = mtls::leaf_certificate(
        cluster,
        NodeType::Worker,
        &pod_ips(cluster, ctx, NodeType::Worker),
        domain,
    )?;
    let memo_key = "Certificate/*";
    let hash = crate::k8s::stable_hash(&(mtls::sans(&head), mtls::sans(&worker)));
    if ctx.recently_ensured(cluster, memo_key, &hash) {
        return Ok(Progress::Done);
    }
    let namespace = cluster.namespace().unwrap_or_default();
    if let Err(e) = ctx
        .client
        .list_api_group_resources("cert-manager.io/v1")
        .await
    {
        if matches!(&e, kube::Error::Api(s) if s.code == 404) {
            let message =
                "tlsOptions requires cert-manager, but cert-manager is not installed".to_owned();
            ctx.event(
                cluster,
                EventType::Warning,
                reasons::INVALID_SPEC,
                "Validate",
                message.clone(),
            )
            .await;
            // An error, so the frame backs off instead of repeating this every 2 s.
            return Err(Error::Conflict(message));
        }
        return Err(KubeFailure::new("discovering cert-manager.io/v1", e).into());
    }
    let result = async {
        for object in mtls::pki(cluster)? {
            create_if_absent(cluster, ctx, &namespace, &object).await?;
        }
        let mut secrets_owned = true;
        for desired in [&head, &worker] {
            let certificate = ensure_leaf(cluster, ctx, &namespace, desired).await?;
            secrets_owned &= own_secret(ctx, &namespace, &certificate).await?;
        }
        Ok::<bool, Error>(secrets_owned)
    }
    .await;
    match result {
        Err(e) => {
            ctx.event(
                cluster,
                EventType::Warning,
                reasons::MTLS_FAILED_TO_RECONCILE,
                "Reconcile",
                format!("Failed to reconcile mTLS: {e}"),
            )
            .await;
            Err(e)
        }
        // cert-manager has not written every Secret yet: look again soon.
        Ok(false) => Ok(Progress::Waiting(
            "cert-manager has not issued the mTLS Secrets".into(),
        )),
        Ok(true) => {
            ctx.remember_ensured(cluster, memo_key.to_owned(), hash);
            Ok(Progress::Done)
        }
    }
}

async fn create_if_absent(
    cluster: &RayCluster,
    ctx: &Context,
    namespace: &str,
    object: &DynamicObject,
) -> Result<DynamicObject, Error> {
    let resource = resource_of(object);
    let api = dynamic_api(ctx, namespace, &resource);
    let name = object.name_any();
    if let Some(found) = api
        .get_opt(&name)
        .await
        .map_err(|e| KubeFailure::new(format!("reading {} {name}", resource.kind), e))?
    {
        if !owned_by(&found.metadata, cluster) {
            let conflict = crate::k8s::K8sError::NotOwned {
                kind: resource.kind.clone(),
                namespace: namespace.to_owned(),
                name,
                controller: crate::k8s::controller_of(&found.metadata),
            };
            return Err(Error::Apply(conflict));
        }
        return Ok(found);
    }
    api.create(&PostParams::default(), object)
        .await
        .map_err(|e| KubeFailure::new(format!("creating {} {name}", resource.kind), e).into())
}

fn resource_of(object: &DynamicObject) -> ApiResource {
    match object.types.as_ref().map(|t| t.kind.as_str()) {
        Some("Issuer") => mtls::issuer_resource(),
        _ => mtls::certificate_resource(),
    }
}

/// A leaf Certificate: created, or rewritten when its SANs or labels differ.
async fn ensure_leaf(
    cluster: &RayCluster,
    ctx: &Context,
    namespace: &str,
    desired: &DynamicObject,
) -> Result<DynamicObject, Error> {
    let existing = create_if_absent(cluster, ctx, namespace, desired).await?;
    if mtls::sans(&existing) == mtls::sans(desired)
        && existing.metadata.labels == desired.metadata.labels
    {
        return Ok(existing);
    }
    let mut updated = existing.clone();
    updated.metadata.labels = desired.metadata.labels.clone();
    updated.data["spec"] = desired.data["spec"].clone();
    let name = desired.name_any();
    let api = dynamic_api(ctx, namespace, &mtls::certificate_resource());
    let written = api
        .replace(&name, &PostParams::default(), &updated)
        .await
        .map_err(|e| KubeFailure::new(format!("updating Certificate {name}"), e))?;
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::MTLS_CERTIFICATES_UPDATED,
        "Update",
        format!(
            "Updated certificate {name} SANs (IPs: {:?})",
            mtls::sans(desired).1
        ),
    )
    .await;
    Ok(written)
}

/// Gives cert-manager's Secret its Certificate as owner (once); `false` while it is missing.
async fn own_secret(
    ctx: &Context,
    namespace: &str,
    certificate: &DynamicObject,
) -> Result<bool, Error> {
    let Some(secret_name) = certificate.data["spec"]["secretName"].as_str() else {
        return Ok(false);
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(secret) = api
        .get_metadata_opt(secret_name)
        .await
        .map_err(|e| KubeFailure::new(format!("reading Secret {secret_name}"), e))?
    else {
        return Ok(false);
    };
    let uid = certificate.uid().unwrap_or_default();
    if secret.owner_references().iter().any(|o| o.uid == uid) {
        return Ok(true);
    }
    let mut references = secret.owner_references().to_vec();
    references.push(OwnerReference {
        api_version: "cert-manager.io/v1".into(),
        kind: "Certificate".into(),
        name: certificate.name_any(),
        uid,
        controller: None,
        block_owner_deletion: Some(true),
    });
    let patch = serde_json::json!({"metadata": {
        "ownerReferences": references,
        "resourceVersion": secret.resource_version(),
    }});
    api.patch(secret_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| KubeFailure::new(format!("setting the owner of Secret {secret_name}"), e))?;
    Ok(true)
}

/// Whether Pods may be created: both leaf Certificates Ready for their current generation and
/// both Secrets holding `tls.crt`, `tls.key` and `ca.crt` (KubeRay's check before every Pod
/// creation). `Some(why)` while not.
pub(super) async fn mtls_not_ready(
    cluster: &RayCluster,
    ctx: &Context,
) -> Result<Option<String>, Error> {
    if !gate(ctx, gates::RAY_CLUSTER_MTLS) || !tls_enabled(&cluster.spec) {
        return Ok(None);
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let certificates = dynamic_api(ctx, &namespace, &mtls::certificate_resource());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    for node_type in [NodeType::Head, NodeType::Worker] {
        let certificate_name = names::tls_certificate_name(&name, node_type);
        let certificate = certificates
            .get_opt(&certificate_name)
            .await
            .map_err(|e| KubeFailure::new(format!("reading Certificate {certificate_name}"), e))?;
        if !certificate.as_ref().is_some_and(mtls::certificate_ready) {
            return Ok(Some(format!(
                "certificate {certificate_name} is not ready at its current generation"
            )));
        }
        let secret_name = names::tls_secret_name(&name, node_type);
        let secret = secrets
            .get_opt(&secret_name)
            .await
            .map_err(|e| KubeFailure::new(format!("reading Secret {secret_name}"), e))?;
        let complete = secret.is_some_and(|s| {
            let data = s.data.unwrap_or_default();
            mtls::SECRET_KEYS
                .iter()
                .all(|k| data.get(*k).is_some_and(|v| !v.0.is_empty()))
        });
        if !complete {
            return Ok(Some(format!(
                "Secret {secret_name} does not hold tls.crt, tls.key and ca.crt yet"
            )));
        }
    }
    Ok(None)
}

/// Waits for the certificates before creating Pods, with KubeRay's Event while they are not
/// ready (once per state change, not on every pass).
pub(super) async fn wait_for_mtls(
    cluster: &RayCluster,
    ctx: &Context,
) -> Result<Option<String>, Error> {
    let not_ready = mtls_not_ready(cluster, ctx).await?;
    let state = if not_ready.is_some() {
        "waiting"
    } else {
        "ready"
    };
    let memo_key = "mTLS/state";
    if tls_enabled(&cluster.spec) && !ctx.recently_ensured(cluster, memo_key, state) {
        let (reason, note) = match not_ready {
            Some(_) => (
                reasons::MTLS_CERTS_NOT_READY,
                "Waiting for cert-manager to issue mTLS certificates",
            ),
            None => (
                reasons::MTLS_PKI_READY,
                "mTLS PKI is ready: CA, head, and worker certificates issued",
            ),
        };
        ctx.event(
            cluster,
            EventType::Normal,
            reason,
            "Reconcile",
            note.to_owned(),
        )
        .await;
        ctx.remember_ensured(cluster, memo_key.to_owned(), state.to_owned());
    }
    Ok(not_ready)
}
