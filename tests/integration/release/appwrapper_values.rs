//! The chart's `appWrapper` values, rendered by the real `helm`: off by default; on, a
//! ClusterRole with exactly what Kueue's AppWrapper controller needs to run wrapped
//! ServePipelines and RayServices (create, delete, get, list, watch), bound to the controller's
//! ServiceAccount; nothing without `rbacEnable`.

use serde_json::{Value, json};

use crate::deploy::{of_kind, render};

const ROLE: &str = "rp-raypipe-appwrapper";

fn named<'a>(docs: &'a [Value], kind: &str) -> Option<&'a Value> {
    of_kind(docs, kind)
        .into_iter()
        .find(|d| d["metadata"]["name"] == ROLE)
}

#[test]
fn the_appwrapper_role_is_off_by_default_and_binds_the_controllers_service_account() {
    for values in [
        &[][..],
        &["appWrapper.enabled=false"][..],
        &["appWrapper.enabled=true", "rbacEnable=false"][..],
    ] {
        let docs = render("rp", "raypipe-system", values);
        assert!(named(&docs, "ClusterRole").is_none(), "{values:?}");
        assert!(named(&docs, "ClusterRoleBinding").is_none(), "{values:?}");
    }

    let docs = render("rp", "raypipe-system", &["appWrapper.enabled=true"]);
    let role = named(&docs, "ClusterRole").expect("the AppWrapper ClusterRole");
    let verbs = json!(["create", "delete", "get", "list", "watch"]);
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": ["raypipe.dev"], "resources": ["servepipelines"], "verbs": verbs},
            {"apiGroups": ["ray.io"], "resources": ["rayservices"], "verbs": verbs}
        ]),
        "{role}"
    );
    let binding = named(&docs, "ClusterRoleBinding").expect("its binding");
    assert_eq!(binding["roleRef"]["name"], ROLE);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "appwrapper-controller-manager",
            "namespace": "appwrapper-system"}])
    );

    // Another install of the controller: its ServiceAccount.
    let docs = render(
        "rp",
        "raypipe-system",
        &[
            "appWrapper.enabled=true",
            "appWrapper.serviceAccount.name=aw",
            "appWrapper.serviceAccount.namespace=batch-system",
        ],
    );
    let binding = named(&docs, "ClusterRoleBinding").expect("its binding");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "aw", "namespace": "batch-system"}])
    );
}
