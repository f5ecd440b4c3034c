//! The objects a RayCluster owns besides its Pods: the autoscaler's RBAC objects, the head
//! Ingress, the auth Secret and the Services. Each is checked once and then remembered, so a
//! settled cluster costs no API calls for them.

use super::*;

/// A random token for the auth Secret: 32 bytes from the kernel, base64.
pub(super) fn random_token() -> std::io::Result<String> {
    use base64::Engine as _;
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Creates `desired` when it does not exist (server-side apply, so a retry after a lost
/// response is harmless). Existing objects are left as they are, as KubeRay does. The check
/// is remembered, so a settled cluster costs no API call.
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
        .map_err(|e| Error::kube(format!("reading {kind} {name}"), e))?;
    if existing.is_none() {
        if let Err(e) = crate::k8s::apply(&api, desired, field_managers::RAYCLUSTER).await {
            ctx.event(
                cluster,
                EventType::Warning,
                failed,
                "Create",
                format!("Failed creating {kind} {namespace}/{name}: {e}"),
            )
            .await;
            return Err(e.into());
        }
        ctx.event(
            cluster,
            EventType::Normal,
            created,
            "Create",
            format!("Created {kind} {namespace}/{name}"),
        )
        .await;
    }
    ctx.remember_ensured(cluster, memo_key, hash);
    Ok(())
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
                .map_err(|e| Error::kube(format!("reading ServiceAccount {name}"), e))?;
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
        .map_err(|e| Error::kube(format!("reading Secret {name}"), e))?;
    if existing.is_none() {
        let token = random_token()
            .map_err(|e| Error::Conflict(format!("no random token for Secret {name}: {e}")))?;
        let secret = builders::objects::auth_secret(cluster, &token)?;
        if let Err(e) = api.create(&PostParams::default(), &secret).await {
            let conflict = matches!(&e, kube::Error::Api(s) if s.code == 409);
            if !conflict {
                ctx.event(
                    cluster,
                    EventType::Warning,
                    reasons::FAILED_TO_CREATE_SECRET,
                    "Create",
                    format!("Failed creating Secret {namespace}/{name}: {e}"),
                )
                .await;
                return Err(Error::kube(format!("creating Secret {name}"), e));
            }
        } else {
            ctx.event(
                cluster,
                EventType::Normal,
                reasons::CREATED_SECRET,
                "Create",
                format!("Created Secret {namespace}/{name}"),
            )
            .await;
        }
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
        .map_err(|e| Error::kube(format!("reading Ingress {name}"), e))?;
    match existing {
        None => {
            if let Err(e) = crate::k8s::apply(&api, &desired, field_managers::RAYCLUSTER).await {
                ctx.event(
                    cluster,
                    EventType::Warning,
                    reasons::FAILED_TO_CREATE_INGRESS,
                    "Create",
                    format!("Failed creating Ingress {namespace}/{name}: {e}"),
                )
                .await;
                return Err(e.into());
            }
            ctx.event(
                cluster,
                EventType::Normal,
                reasons::CREATED_INGRESS,
                "Create",
                format!("Created Ingress {namespace}/{name}"),
            )
            .await;
        }
        Some(existing) if !owned_by(&existing.metadata, cluster) => {
            ctx.event(
                cluster,
                EventType::Warning,
                reasons::FAILED_TO_CREATE_INGRESS,
                "Create",
                format!("Ingress {namespace}/{name} already exists and is not owned by this RayCluster; not modifying it"),
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
                if let Err(e) = crate::k8s::apply(&api, &desired, field_managers::RAYCLUSTER).await
                {
                    ctx.event(
                        cluster,
                        EventType::Warning,
                        reasons::FAILED_TO_UPDATE_INGRESS,
                        "Update",
                        format!("Failed updating Ingress {namespace}/{name}: {e}"),
                    )
                    .await;
                    return Err(e.into());
                }
                ctx.event(
                    cluster,
                    EventType::Normal,
                    reasons::UPDATED_INGRESS,
                    "Update",
                    format!("Updated Ingress {namespace}/{name}"),
                )
                .await;
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
    if let Some(desired) = builders::service::headless_worker_service(cluster)?
        && ctx
            .cached_service(&namespace, &names::headless_service_name(&name))
            .is_none()
    {
        create_service(cluster, ctx, &desired).await?;
    }
    let serve_requested = cluster
        .annotations()
        .get(annotations::ENABLE_SERVE_SERVICE)
        .is_some_and(|v| v == "true");
    if serve_requested
        && ctx
            .cached_service(&namespace, &names::serve_service_name(&name))
            .is_none()
    {
        let desired = builders::service::serve_service(cluster)?;
        create_service(cluster, ctx, &desired).await?;
    }
    Ok(())
}

/// Creates a Service missing from the cache. The cache may lag behind our own creation, so the
/// API server is asked first; a Service of that name that is not ours is never taken over.
async fn create_service(
    cluster: &RayCluster,
    ctx: &Context,
    desired: &Service,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = desired.name_any();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing = api
        .get_metadata_opt(&name)
        .await
        .map_err(|e| Error::kube(format!("reading Service {name}"), e))?;
    match existing {
        Some(existing) if owned_by(&existing.metadata, cluster) => Ok(()),
        Some(_) => {
            let message = format!(
                "Service {namespace}/{name} exists and is not owned by RayCluster {}; rename or delete it",
                cluster.name_any()
            );
            ctx.event(
                cluster,
                EventType::Warning,
                reasons::FAILED_TO_CREATE_SERVICE,
                "Create",
                message.clone(),
            )
            .await;
            Err(Error::Conflict(message))
        }
        None => {
            if let Err(e) = crate::k8s::apply(&api, desired, field_managers::RAYCLUSTER).await {
                ctx.event(
                    cluster,
                    EventType::Warning,
                    reasons::FAILED_TO_CREATE_SERVICE,
                    "Create",
                    format!("Failed creating Service {namespace}/{name}: {e}"),
                )
                .await;
                return Err(e.into());
            }
            ctx.event(
                cluster,
                EventType::Normal,
                reasons::CREATED_SERVICE,
                "Create",
                format!("Created Service {namespace}/{name}"),
            )
            .await;
            Ok(())
        }
    }
}
