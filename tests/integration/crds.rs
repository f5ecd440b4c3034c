//! The CRDs on a real kube-apiserver: installed and Established, every kind created, read and
//! its status written through the status subresource, every sample accepted without losing a
//! field, invalid objects rejected with the API server's own error.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::{ApiResource, pinned_kind};
use serde_json::{Value, json};

use crate::support;

fn head_group() -> Value {
    json!({
        "rayStartParams": {},
        "template": {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}
    })
}

/// A minimal valid object of each kind, and a status to write for it.
fn minimal_objects() -> Vec<(Value, Value)> {
    vec![
        (
            json!({"apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline", "metadata": {"name": "minimal"},
                   "spec": {"source": {"url": "https://127.0.0.1:1/g.pb"}, "rayClusterConfig": {"headGroupSpec": head_group()}}}),
            json!({"phase": "Ready", "observedGeneration": 1, "graph": {"nodes": 3, "edges": 2, "ingress": "entry"}}),
        ),
        (
            json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "minimal"},
                   "spec": {"headGroupSpec": head_group()}}),
            json!({"state": "ready", "readyWorkerReplicas": 0}),
        ),
        (
            json!({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "minimal"},
                   "spec": {"entrypoint": "python -c 'print(1)'", "rayClusterSpec": {"headGroupSpec": head_group()}}}),
            json!({"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}),
        ),
        (
            json!({"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "minimal"},
                   "spec": {"rayClusterConfig": {"headGroupSpec": head_group()}}}),
            json!({"serviceStatus": "Running", "numServeEndpoints": 1}),
        ),
        (
            json!({"apiVersion": "ray.io/v1", "kind": "RayCronJob", "metadata": {"name": "minimal"},
                   "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"entrypoint": "python -c 'print(1)'",
                            "rayClusterSpec": {"headGroupSpec": head_group()}}}}),
            json!({"lastScheduleTime": "2026-01-01T00:00:00Z"}),
        ),
    ]
}

async fn resource_for(client: &kube::Client, obj: &Value) -> ApiResource {
    let api_version = obj["apiVersion"].as_str().expect("apiVersion");
    let kind = obj["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, _caps) = pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("the API server does not serve {api_version} {kind}: {e}"));
    resource
}

async fn create(
    client: &kube::Client,
    ns: &str,
    obj: &Value,
) -> Result<DynamicObject, kube::Error> {
    let resource = resource_for(client, obj).await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let dynamic: DynamicObject = serde_json::from_value(obj.clone()).expect("a Kubernetes object");
    api.create(&PostParams::default(), &dynamic).await
}

#[tokio::test]
async fn all_crds_are_installed_and_established() {
    let client = support::client().await;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in raypipe::api::crds() {
        let name = crd.metadata.name.clone().expect("CRD name");
        let installed = api
            .get(&name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let conditions = installed
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default();
        assert!(
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"),
            "{name} is not Established: {conditions:?}"
        );
    }
    raypipe::api::check_crds_installed(&client)
        .await
        .expect("the operator's pre-flight check passes");
}

#[tokio::test]
async fn every_kind_is_created_read_and_its_status_written_through_the_subresource() {
    let client = support::client().await;
    let ns = support::namespace(&client, "crud").await;
    for (obj, status) in minimal_objects() {
        let kind = obj["kind"].as_str().expect("kind").to_owned();
        let resource = resource_for(&client, &obj).await;
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
        create(&client, &ns, &obj)
            .await
            .unwrap_or_else(|e| panic!("create {kind}: {e}"));

        let patch = json!({"apiVersion": obj["apiVersion"], "kind": kind, "status": status});
        api.patch_status("minimal", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("write {kind} status: {e}"));
        let read = api
            .get("minimal")
            .await
            .unwrap_or_else(|e| panic!("read {kind}: {e}"));
        let read = serde_json::to_value(&read).expect("serializable");
        support::assert_contains(&status, &read["status"], &format!("{kind}.status"));
        support::assert_contains(&obj["spec"], &read["spec"], &format!("{kind}.spec"));

        // With a status subresource, a write to the main resource cannot change status.
        let main_patch = json!({"status": {"reason": "written-through-main-resource"}});
        api.patch(
            "minimal",
            &PatchParams::default(),
            &Patch::Merge(&main_patch),
        )
        .await
        .unwrap_or_else(|e| panic!("patch {kind}: {e}"));
        let read =
            serde_json::to_value(api.get("minimal").await.expect("read")).expect("serializable");
        assert!(
            read["status"].get("reason").is_none(),
            "{kind}: status changed through the main resource"
        );
    }
}

#[tokio::test]
async fn typed_clients_read_what_the_api_server_stores() {
    let client = support::client().await;
    let ns = support::namespace(&client, "typed").await;
    for (obj, _) in minimal_objects() {
        create(&client, &ns, &obj).await.expect("create");
    }
    use raypipe::api::{RayCluster, RayCronJob, RayJob, RayService, ServePipeline};
    let pipeline = Api::<ServePipeline>::namespaced(client.clone(), &ns)
        .get("minimal")
        .await
        .expect("ServePipeline");
    assert_eq!(pipeline.spec.source.url, "https://127.0.0.1:1/g.pb");
    Api::<RayCluster>::namespaced(client.clone(), &ns)
        .get("minimal")
        .await
        .expect("RayCluster");
    Api::<RayJob>::namespaced(client.clone(), &ns)
        .get("minimal")
        .await
        .expect("RayJob");
    Api::<RayService>::namespaced(client.clone(), &ns)
        .get("minimal")
        .await
        .expect("RayService");
    Api::<RayCronJob>::namespaced(client.clone(), &ns)
        .get("minimal")
        .await
        .expect("RayCronJob");
}

/// Creates every document of every file in `dir` in a fresh namespace and checks that what the
/// API server stored contains every field of the document (nothing pruned by our schemas).
async fn assert_samples_accepted(dir: &std::path::Path, prefix: &str) -> usize {
    let client = support::client().await;
    let docs = support::yaml_documents(dir);
    assert!(!docs.is_empty(), "no samples in {}", dir.display());
    let mut count = 0;
    for (i, (file, doc)) in docs.iter().enumerate() {
        // One namespace per file would be tidier, but names repeat across files: use one per doc.
        let ns = support::namespace(&client, &format!("{prefix}{i}")).await;
        let mut doc = doc.clone();
        doc["metadata"]["namespace"] = json!(ns);
        let kind = doc["kind"].as_str().unwrap_or("?").to_owned();
        let created = create(&client, &ns, &doc)
            .await
            .unwrap_or_else(|e| panic!("{file}: the API server rejected {kind}: {e}"));
        let stored = serde_json::to_value(&created).expect("serializable");
        for section in ["spec", "data", "stringData"] {
            if let Some(expected) = doc.get(section)
                && section != "stringData"
            {
                support::assert_contains(
                    expected,
                    &stored[section],
                    &format!("{file} {kind}.{section}"),
                );
            }
        }
        count += 1;
    }
    count
}

#[tokio::test]
async fn every_kuberay_sample_is_accepted_without_losing_a_field() {
    let n = assert_samples_accepted(&support::kuberay_samples_dir(), "kuberay").await;
    assert!(
        n >= 9,
        "expected at least the 9 KubeRay sample objects, created {n}"
    );
}

#[tokio::test]
async fn every_project_sample_is_accepted_without_losing_a_field() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples");
    let n = assert_samples_accepted(&dir, "sample").await;
    assert!(n >= 2, "expected the project's samples, created {n}");
}

fn expect_invalid(result: Result<DynamicObject, kube::Error>, must_mention: &[&str]) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "expected 422 Invalid, got {status:?}");
            for needle in must_mention {
                assert!(
                    status.message.contains(needle),
                    "error does not mention {needle:?}: {}",
                    status.message
                );
            }
        }
        Err(other) => panic!("expected the API server to reject the object, got {other}"),
        Ok(obj) => panic!(
            "the API server accepted an invalid object: {:?}",
            obj.metadata.name
        ),
    }
}

#[tokio::test]
async fn invalid_objects_are_rejected_with_the_api_servers_error() {
    let client = support::client().await;
    let ns = support::namespace(&client, "invalid").await;

    let missing_head = json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "no-head"}, "spec": {}});
    expect_invalid(
        create(&client, &ns, &missing_head).await,
        &["headGroupSpec", "Required"],
    );

    let wrong_type = json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "wrong-type"},
        "spec": {"headGroupSpec": head_group(), "workerGroupSpecs": [{"groupName": "g", "replicas": "three",
                 "template": {"spec": {"containers": [{"name": "w", "image": "rayproject/ray:2.52.0"}]}}}]}});
    expect_invalid(create(&client, &ns, &wrong_type).await, &["replicas"]);

    let no_source = json!({"apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline", "metadata": {"name": "no-source"},
        "spec": {"rayClusterConfig": {"headGroupSpec": head_group()}}});
    expect_invalid(
        create(&client, &ns, &no_source).await,
        &["source", "Required"],
    );

    let bad_interval = json!({"apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline", "metadata": {"name": "bad-interval"},
        "spec": {"source": {"url": "https://127.0.0.1:1/g.pb", "refreshInterval": "every day"},
                 "rayClusterConfig": {"headGroupSpec": head_group()}}});
    expect_invalid(
        create(&client, &ns, &bad_interval).await,
        &["refreshInterval"],
    );

    let bad_url = json!({"apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline", "metadata": {"name": "bad-url"},
        "spec": {"source": {"url": "ftp://registry/g.pb"}, "rayClusterConfig": {"headGroupSpec": head_group()}}});
    expect_invalid(create(&client, &ns, &bad_url).await, &["url"]);
}
