//! The objects a RayCluster owns besides its Pods: the autoscaler's RBAC objects, the head
//! Ingress, the auth Secret and the Services. Each is checked once and then remembered, so a
//! settled cluster costs no API calls for them.

use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::Api;
use kube::core::NamespaceResourceScope;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::builders;
use super::cache::owned_by;
use super::context::Context;
use super::error::{Error, KubeFailure};
use crate::api::raycluster::RayCluster;
use crate::controllers::frame::children::{ChildEvents, ChildWriter, Mode};
use crate::k8s::field_managers;
use crate::kuberay::keys::{annotations, reasons};
use crate::kuberay::names;

/// A random token for the auth Secret: 32 bytes from the kernel, base64.
pub(super) fn random_token() -> std::io::Result<String> {
    use base64::Engine as _;
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Creates `desired` when it does not exist (a create-only server-side apply, so a retry after
/// a lost response is harmless and a name someone else took meanwhile is not taken over).
/// Existing objects are left as they are, as KubeRay does; one of that name the cluster does
/// not control is reported as a conflict. The check is remembered, so a settled cluster costs
/// no API call.
async fn ensure_exists<K>(
    cluster: &RayCluster,
    ctx: &Context,
    desired: &K,
    created: &str,
    failed: &str,
) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug,
{
    let kind = K::kind(&()).into_owned();
    let name = desired.name_any();
    let memo_key = format!("{kind}/{name}");
    let hash = crate::k8s::stable_hash(desired);
    if ctx.recently_ensured(cluster, &memo_key, &hash) {
        return Ok(());
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing = api
        .get_opt(&name)
        .await
        .map_err(|e| KubeFailure::new(format!("reading {kind} {name}"), e))?;
    if let Some(existing) = &existing {
        if let Err(conflict) =
            crate::k8s::check_controlled_by(existing, &cluster.uid().unwrap_or_default())
        {
            return Err(report_conflict(cluster, ctx, conflict).await);
        }
    } else {
        let events = ChildEvents::new("Create")
            .written(created, format!("Created {kind} {namespace}/{name}"))
            .already_ours_too()
            .failed(failed, format!("Failed creating {kind} {namespace}/{name}"))
            .conflict_report(CONFLICT_ACTION);
        writer(cluster, ctx)
            .write(&api, desired, Mode::Create, events)
            .await?;
    }
    ctx.remember_ensured(cluster, memo_key, hash);
    Ok(())
}

/// Writes the cluster's children, with their Events on it.
fn writer<'a>(cluster: &'a RayCluster, ctx: &'a Context) -> ChildWriter<'a, RayCluster> {
    ChildWriter::new(&ctx.recorder, cluster, field_managers::RAYCLUSTER)
}

/// The action of the Warning that names someone else's object of a child's name.
const CONFLICT_ACTION: &str = "Create";

/// A Warning event naming an object of a child's name that the cluster does not control (and
/// which is left as it is); the error ends the pass and shows in the ReplicaFailure condition.
async fn report_conflict(
    cluster: &RayCluster,
    ctx: &Context,
    conflict: crate::k8s::K8sError,
) -> Error {
    ctx.event(
        cluster,
        EventType::Warning,
        conflict.conflict_reason().unwrap_or("ObjectConflict"),
        CONFLICT_ACTION,
        conflict.to_string(),
    )
    .await;
    Error::Apply(conflict)
}

pub(super) async fn ensure_autoscaler_rbac(
    cluster: &RayCluster,
    ctx: &Context,
) -> Result<(), Error> {
    let account = builders::objects::autoscaler_service_account(cluster)?;
    if names::user_named_service_account(&cluster.spec) {
        // A ServiceAccount the user named is theirs to create (KubeRay issue 1123).
        let name = account.name_any();
        let api: Api<ServiceAccount> =
            Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
        let memo_key = format!("ServiceAccount/{name}");
        if !ctx.recently_ensured(cluster, &memo_key, "") {
            let found = api
                .get_opt(&name)
                .await
                .map_err(|e| KubeFailure::new(format!("reading ServiceAccount {name}"), e))?;
            if found.is_none() {
                let message = format!(
                    "the head Pod names ServiceAccount {name}, which does not exist; create it (the operator only makes one it names itself)"
                );
                ctx.event(
                    cluster,
                    EventType::Warning,
                    reasons::AUTOSCALER_SERVICE_ACCOUNT_NOT_FOUND,
                    "Validate",
                    message.clone(),
                )
                .await;
                return Err(Error::Conflict(message));
            }
            ctx.remember_ensured(cluster, memo_key, String::new());
        }
    } else {
        ensure_exists(
            cluster,
            ctx,
            &account,
            reasons::CREATED_SERVICE_ACCOUNT,
            reasons::FAILED_TO_CREATE_SERVICE_ACCOUNT,
        )
        .await?;
    }
    let role: Role = builders::objects::autoscaler_role(cluster)?;
    ensure_exists(
        cluster,
        ctx,
        &role,
        reasons::CREATED_ROLE,
        reasons::FAILED_TO_CREATE_ROLE,
    )
    .await?;
    let binding: RoleBinding = builders::objects::autoscaler_role_binding(cluster)?;
    ensure_exists(
        cluster,
        ctx,
        &binding,
        reasons::CREATED_ROLE_BINDING,
        reasons::FAILED_TO_CREATE_ROLE_BINDING,
    )
    .await
}

pub(super) async fn ensure_auth_secret(cluster: &RayCluster, ctx: &Context) -> Result<(), Error> {
    let name = names::auth_secret_name(&cluster.name_any());
    let memo_key = format!("Secret/{name}");
    if ctx.recently_ensured(cluster, &memo_key, "") {
        return Ok(());
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    // Never re-applied: a second apply would replace the token the Pods already use.
    let existing = api
        .get_metadata_opt(&name)
        .await
        .map_err(|e| KubeFailure::new(format!("reading Secret {name}"), e))?;
    if let Some(existing) = &existing {
        // Someone else's Secret of that name would hand its token to our Pods.
        if let Err(conflict) =
            crate::k8s::check_controlled_by(existing, &cluster.uid().unwrap_or_default())
        {
            return Err(report_conflict(cluster, ctx, conflict).await);
        }
    } else {
        let token = random_token()
            .map_err(|e| Error::Conflict(format!("no random token for Secret {name}: {e}")))?;
        let secret = builders::objects::auth_secret(cluster, &token)?;
        let events = ChildEvents::new("Create")
            .written(
                reasons::CREATED_SECRET,
                format!("Created Secret {namespace}/{name}"),
            )
            .failed(
                reasons::FAILED_TO_CREATE_SECRET,
                format!("Failed creating Secret {namespace}/{name}"),
            )
            .conflict_report(CONFLICT_ACTION);
        writer(cluster, ctx)
            .write(&api, &secret, Mode::Create, events)
            .await?;
    }
    ctx.remember_ensured(cluster, memo_key, String::new());
    Ok(())
}

/// Creates the head Ingress, or brings ours back to the desired labels, annotations and spec;
/// an Ingress of that name owned by someone else is left alone (with a Warning).
pub(super) async fn ensure_ingress(cluster: &RayCluster, ctx: &Context) -> Result<(), Error> {
    let mut desired = builders::objects::head_ingress(cluster)?;
    let name = desired.name_any();
    let memo_key = format!("Ingress/{name}");
    let hash = crate::k8s::stable_hash(&desired);
    if ctx.recently_ensured(cluster, &memo_key, &hash) {
        return Ok(());
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let api: Api<Ingress> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing = api
        .get_opt(&name)
        .await
        .map_err(|e| KubeFailure::new(format!("reading Ingress {name}"), e))?;
    match existing {
        None => {
            let events = ChildEvents::new("Create")
                .written(
                    reasons::CREATED_INGRESS,
                    format!("Created Ingress {namespace}/{name}"),
                )
                .failed(
                    reasons::FAILED_TO_CREATE_INGRESS,
                    format!("Failed creating Ingress {namespace}/{name}"),
                )
                .conflict_report(CONFLICT_ACTION);
            // An apply, not a create: one already ours (the read raced our own create) is
            // brought to the desired state too.
            let mode = Mode::Apply { existing: None };
            writer(cluster, ctx)
                .write(&api, &desired, mode, events)
                .await?;
        }
        Some(existing) if !owned_by(&existing.metadata, cluster) => {
            // Left alone, with a Warning; the cluster itself still works without it.
            let conflict = crate::k8s::K8sError::NotOwned {
                kind: "Ingress".to_owned(),
                namespace: namespace.clone(),
                name: name.clone(),
                controller: crate::k8s::controller_of(&existing.metadata),
            };
            ctx.event(
                cluster,
                EventType::Warning,
                crate::k8s::conflict_reason("Ingress"),
                "Create",
                conflict.to_string(),
            )
            .await;
        }
        Some(existing) => {
            let existing_spec = existing.spec.clone().unwrap_or_default();
            if let Some(spec) = desired.spec.as_mut()
                && spec.ingress_class_name.is_none()
            {
                // Keep a class the API server defaulted: clearing it would fight the defaulter.
                spec.ingress_class_name = existing_spec.ingress_class_name.clone();
            }
            let drifted = existing.metadata.labels != desired.metadata.labels
                || existing.metadata.annotations.clone().unwrap_or_default()
                    != desired.metadata.annotations.clone().unwrap_or_default()
                || Some(existing_spec) != desired.spec;
            if drifted {
                let events = ChildEvents::new("Update")
                    .written(
                        reasons::UPDATED_INGRESS,
                        format!("Updated Ingress {namespace}/{name}"),
                    )
                    .failed(
                        reasons::FAILED_TO_UPDATE_INGRESS,
                        format!("Failed updating Ingress {namespace}/{name}"),
                    );
                let mode = Mode::Apply {
                    existing: Some(&existing.metadata),
                };
                writer(cluster, ctx)
                    .write(&api, &desired, mode, events)
                    .await?;
            }
        }
    }
    ctx.remember_ensured(cluster, memo_key, hash);
    Ok(())
}

/// Head, headless worker and serve Services: made once, like KubeRay, and never updated (a
/// head Service's type and cluster IP cannot change in place).
pub(super) async fn ensure_services(cluster: &RayCluster, ctx: &Context) -> Result<(), Error> {
    let name = cluster.name_any();
    let namespace = cluster.namespace().unwrap_or_default();
    if ctx.head_service(cluster)?.is_none() {
        let desired = builders::service::head_service(cluster, &ctx.config.build)?;
        create_service(cluster, ctx, &desired).await?;
    }
    // A cached Service of the name that is not ours does not count: create_service reports it.
    let ours = |service_name: &str| {
        ctx.cached_service(&namespace, service_name)
            .is_some_and(|s| owned_by(&s.metadata, cluster))
    };
    if let Some(desired) = builders::service::headless_worker_service(cluster)?
        && !ours(&names::headless_service_name(&name))
    {
        create_service(cluster, ctx, &desired).await?;
    }
    let serve_requested = cluster
        .annotations()
        .get(annotations::ENABLE_SERVE_SERVICE)
        .is_some_and(|v| v == "true");
    if serve_requested && !ours(&names::serve_service_name(&name)) {
        let desired = builders::service::serve_service(cluster)?;
        create_service(cluster, ctx, &desired).await?;
    }
    Ok(())
}

/// Creates a Service missing from the cache: one create-only apply, as KubeRay makes one
/// create. A Service of that name that exists already is read back by `create_owned` and never
/// taken over; one that is ours (the cache lagging behind our own creation) is not written.
/// No memo: a Service deleted by hand is made again on the next pass, as KubeRay does.
async fn create_service(
    cluster: &RayCluster,
    ctx: &Context,
    desired: &Service,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = desired.name_any();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    let events = ChildEvents::new("Create")
        .written(
            reasons::CREATED_SERVICE,
            format!("Created Service {namespace}/{name}"),
        )
        .failed(
            reasons::FAILED_TO_CREATE_SERVICE,
            format!("Failed creating Service {namespace}/{name}"),
        )
        .conflict_report(CONFLICT_ACTION);
    writer(cluster, ctx)
        .write(&api, desired, Mode::Create, events)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_suffixes_use_the_kubernetes_alphabet() {
        let a = super::super::pods::random_suffix();
        assert_eq!(a.len(), 5);
        assert!(
            a.bytes()
                .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b))
        );
        assert_ne!(a, super::super::pods::random_suffix());
        assert_eq!(random_token().expect("urandom").len(), 44);
    }
}
