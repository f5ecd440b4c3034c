//! The chart's user roles (`deploy/raypipe/templates/user-roles.yaml`) on the real API server:
//! kube-controller-manager's clusterrole-aggregation controller folds them into the built-in
//! `view`, `edit` and `admin` roles, so a user bound to `view` in a namespace reads the five
//! kinds there and writes nothing (and still reads no Secret), and a user bound to `edit`
//! creates ServePipelines and RayClusters (but not their status, which is the controller's).

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use raypipe::api::RayCluster;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::devenv::control_plane::{ControlPlane, ControlPlaneOptions};
use serde_json::{Value, json};

use crate::admin::{WAIT, pipeline};
use crate::support::{self, eventually};

/// (group, plural) of the five kinds.
const KINDS: [(&str, &str); 5] = [
    ("raypipe.dev", "servepipelines"),
    ("ray.io", "rayclusters"),
    ("ray.io", "rayservices"),
    ("ray.io", "rayjobs"),
    ("ray.io", "raycronjobs"),
];

fn user_roles(docs: &[Value]) -> Vec<&Value> {
    crate::deploy::of_kind(docs, "ClusterRole")
        .into_iter()
        .filter(|r| {
            let name = r["metadata"]["name"].as_str().unwrap_or_default();
            name.ends_with("-editor") || name.ends_with("-viewer")
        })
        .collect()
}

fn label(role: &Value, key: &str) -> Option<String> {
    role["metadata"]["labels"][key].as_str().map(str::to_owned)
}

#[test]
fn the_chart_renders_an_editor_and_a_viewer_per_kind_unless_turned_off() {
    let docs = crate::deploy::render("rp", "raypipe-system", &[]);
    let roles = user_roles(&docs);
    assert_eq!(roles.len(), 10, "{roles:#?}");
    for (group, plural) in KINDS {
        let kind = plural.trim_end_matches('s');
        let editor = roles
            .iter()
            .find(|r| r["metadata"]["name"] == format!("rp-raypipe-{kind}-editor"))
            .unwrap_or_else(|| panic!("no editor for {plural}"));
        let viewer = roles
            .iter()
            .find(|r| r["metadata"]["name"] == format!("rp-raypipe-{kind}-viewer"))
            .unwrap_or_else(|| panic!("no viewer for {plural}"));
        for key in ["aggregate-to-edit", "aggregate-to-admin"] {
            let key = format!("rbac.authorization.k8s.io/{key}");
            assert_eq!(label(editor, &key).as_deref(), Some("true"), "{editor}");
            assert_eq!(label(viewer, &key), None, "{viewer}");
        }
        let view = "rbac.authorization.k8s.io/aggregate-to-view";
        assert_eq!(label(viewer, view).as_deref(), Some("true"), "{viewer}");
        assert_eq!(label(editor, view), None, "{editor}");
        // Every rule of either role is about this kind, and the viewer only reads.
        for role in [editor, viewer] {
            for rule in role["rules"].as_array().expect("rules") {
                assert_eq!(rule["apiGroups"], json!([group]), "{role}");
                assert!(
                    rule["resources"]
                        .as_array()
                        .expect("resources")
                        .iter()
                        .all(|r| r == plural || *r == format!("{plural}/status")),
                    "{role}"
                );
            }
        }
        for rule in viewer["rules"].as_array().expect("rules") {
            assert_eq!(rule["verbs"], json!(["get", "list", "watch"]), "{viewer}");
        }
    }
    for off in ["userRoles.enabled=false", "rbacEnable=false"] {
        let docs = crate::deploy::render("rp", "raypipe-system", &[off]);
        assert!(
            user_roles(&docs).is_empty(),
            "{off} still renders user roles"
        );
    }
}

/// A client of `plane` that acts as `user` (the admin impersonates it).
async fn as_user(plane: &ControlPlane, user: &str) -> kube::Client {
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&plane.kubeconfig).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("a config");
    config.auth_info.impersonate = Some(user.to_owned());
    kube::Client::try_from(config).expect("a client")
}

fn resource(group: &str, plural: &str) -> ApiResource {
    let kind = match plural {
        "servepipelines" => "ServePipeline",
        "rayclusters" => "RayCluster",
        "rayservices" => "RayService",
        "rayjobs" => "RayJob",
        _ => "RayCronJob",
    };
    let version = if group == "ray.io" { "v1" } else { "v1alpha1" };
    ApiResource {
        group: group.to_owned(),
        version: version.to_owned(),
        api_version: format!("{group}/{version}"),
        kind: kind.to_owned(),
        plural: plural.to_owned(),
    }
}

/// Whether `client` may list every one of the five kinds in `ns`.
async fn lists_all_five(client: &kube::Client, ns: &str) -> bool {
    for (group, plural) in KINDS {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &resource(group, plural));
        if api.list(&ListParams::default()).await.is_err() {
            return false;
        }
    }
    true
}

fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) {
    match result {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{what}: {e:?}"),
        other => panic!("{what} was not forbidden: {other:?}"),
    }
}

fn raycluster(name: &str) -> RayCluster {
    serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
        "spec": {
            "rayVersion": "2.52.0",
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}}
        }
    }))
    .expect("a RayCluster")
}

fn binding(name: &str, cluster_role: &str, user: &str) -> RoleBinding {
    serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": cluster_role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))
    .expect("a RoleBinding")
}

#[tokio::test]
async fn view_and_edit_users_get_the_five_kinds_through_aggregation() {
    raypipe::startup::init_crypto();
    // A control plane of its own: aggregation is cluster-wide, so another test's chart roles
    // (any release aggregates into `view` and `edit` the same way) would grant the kinds before
    // ours exist and keep them after ours are gone. Aggregation needs the controller manager.
    let plane = tokio::task::spawn_blocking(|| {
        support::start_control_plane_with(ControlPlaneOptions {
            controller_manager: true,
            ..Default::default()
        })
    })
    .await
    .expect("the start-up thread did not panic")
    .expect("a control plane of its own");
    let client = plane.client().await.expect("a client");
    let ns = support::namespace(&client, "user-roles").await;
    // The release name is unique per run: the ClusterRoles carry it.
    let release = ns.clone();
    let (viewer, editor) = (format!("viewer-{ns}"), format!("editor-{ns}"));
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);
    for (name, role, user) in [("view", "view", &viewer), ("edit", "edit", &editor)] {
        bindings
            .create(&PostParams::default(), &binding(name, role, user))
            .await
            .expect("bind the built-in role");
    }
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    pipelines
        .create(&PostParams::default(), &pipeline("seen", None))
        .await
        .expect("create a pipeline");
    Api::<RayCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &raycluster("seen"))
        .await
        .expect("create a RayCluster");
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hidden"},
        "stringData": {"token": "not for viewers"}
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create a Secret");
    let as_viewer = as_user(&plane, &viewer).await;
    let as_editor = as_user(&plane, &editor).await;

    // Before the chart's roles exist the built-in roles know nothing of the five kinds.
    assert!(
        !lists_all_five(&as_viewer, &ns).await,
        "view granted the kinds before any role"
    );
    forbidden(
        Api::<ServePipeline>::namespaced(as_editor.clone(), &ns)
            .create(&PostParams::default(), &pipeline("early", None))
            .await,
        "creating a ServePipeline before the roles exist",
    );

    let docs = crate::deploy::render(&release, &ns, &[]);
    let roles = user_roles(&docs);
    assert_eq!(roles.len(), 10);
    let cluster_roles: Api<ClusterRole> = Api::all(client.clone());
    for role in &roles {
        let name = role["metadata"]["name"].as_str().expect("a name");
        cluster_roles
            .patch(
                name,
                &PatchParams::apply("raypipe-user-roles-test").force(),
                &Patch::Apply(role),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {name}: {e}"));
    }

    // The viewer: reads all five kinds once aggregation has run.
    eventually(
        WAIT,
        "view to be aggregated with the five kinds",
        || async { lists_all_five(&as_viewer, &ns).await.then_some(()) },
    )
    .await;
    let seen = Api::<ServePipeline>::namespaced(as_viewer.clone(), &ns)
        .get("seen")
        .await
        .expect("the viewer gets a pipeline");
    assert_eq!(seen.metadata.name.as_deref(), Some("seen"));
    Api::<RayCluster>::namespaced(as_viewer.clone(), &ns)
        .get("seen")
        .await
        .expect("the viewer gets a RayCluster");
    // … and writes nothing, and reads no Secret.
    let viewer_pipelines: Api<ServePipeline> = Api::namespaced(as_viewer.clone(), &ns);
    forbidden(
        viewer_pipelines
            .create(&PostParams::default(), &pipeline("by-viewer", None))
            .await,
        "the viewer creating a ServePipeline",
    );
    forbidden(
        viewer_pipelines
            .delete("seen", &DeleteParams::default())
            .await,
        "the viewer deleting a ServePipeline",
    );
    forbidden(
        Api::<RayCluster>::namespaced(as_viewer.clone(), &ns)
            .create(&PostParams::default(), &raycluster("by-viewer"))
            .await,
        "the viewer creating a RayCluster",
    );
    let viewer_secrets: Api<Secret> = Api::namespaced(as_viewer.clone(), &ns);
    forbidden(
        viewer_secrets.get("hidden").await,
        "the viewer reading a Secret",
    );
    forbidden(
        viewer_secrets.list(&ListParams::default()).await,
        "the viewer listing Secrets",
    );

    // The editor: creates, reads and deletes both, but does not write a status.
    eventually(
        WAIT,
        "edit to be aggregated with the five kinds",
        || async { lists_all_five(&as_editor, &ns).await.then_some(()) },
    )
    .await;
    let editor_pipelines: Api<ServePipeline> = Api::namespaced(as_editor.clone(), &ns);
    editor_pipelines
        .create(&PostParams::default(), &pipeline("by-editor", None))
        .await
        .expect("the editor creates a ServePipeline");
    let editor_clusters: Api<RayCluster> = Api::namespaced(as_editor.clone(), &ns);
    editor_clusters
        .create(&PostParams::default(), &raycluster("by-editor"))
        .await
        .expect("the editor creates a RayCluster");
    editor_clusters
        .get("by-editor")
        .await
        .expect("the editor reads its RayCluster");
    forbidden(
        editor_pipelines
            .patch_status(
                "by-editor",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Ready"}})),
            )
            .await,
        "the editor writing a ServePipeline's status",
    );
    editor_pipelines
        .delete("by-editor", &DeleteParams::default())
        .await
        .expect("the editor deletes its ServePipeline");

    // Removing the roles takes the kinds out of `view` again.
    for role in &roles {
        let name = role["metadata"]["name"].as_str().expect("a name");
        cluster_roles
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    }
    eventually(WAIT, "view to lose the five kinds", || async {
        (!lists_all_five(&as_viewer, &ns).await).then_some(())
    })
    .await;
}
