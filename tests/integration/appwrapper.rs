//! raypipe under Kueue's AppWrapper integration (`workload.codeflare.dev/appwrapper`): the
//! AppWrapper controller built from its Go module ([`APPWRAPPER_VERSION`]) runs beside the
//! shared real Kueue (see `support::kueue`). An AppWrapper in a queue is one Workload, sized
//! by the Pod templates it declares (`podSets`); on admission the AppWrapper controller creates
//! what it wraps, raypipe's controllers run it, and deleting the AppWrapper deletes it all.
//!
//! [`APPWRAPPER_VERSION`]: crate::support::tools::APPWRAPPER_VERSION

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use raypipe::api::raycluster::RayCluster;
use raypipe::api::rayservice::RayService;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::config::{ControllerKind, ControllerSettings};
use raypipe::kuberay::kueue::QUEUE_NAME_LABEL;
use serde_json::{Value, json};

use crate::support::e2e;
use crate::support::kueue::{self, APPWRAPPER_LABEL, condition_is};
use crate::support::{self, eventually};

const WAIT: Duration = Duration::from_secs(240);
/// The label Kueue puts into each admitted Pod template: the Workload's pod set.
const PODSET_LABEL: &str = "kueue.x-k8s.io/podset";

/// An AppWrapper `name` in LocalQueue `queue` wrapping `component`, whose Pod templates are
/// declared by `pod_sets` (`(path, replicas)`, paths relative to the component as AppWrapper
/// writes them: `template.spec…`).
fn appwrapper(name: &str, queue: &str, component: Value, pod_sets: &[(&str, i32)]) -> Value {
    let pod_sets: Vec<Value> = pod_sets
        .iter()
        .map(|(path, replicas)| json!({"path": path, "replicas": replicas}))
        .collect();
    json!({
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": name, "labels": {QUEUE_NAME_LABEL: queue}},
        "spec": {"components": [{"podSets": pod_sets, "template": component}]}
    })
}

async fn create_appwrapper(client: &kube::Client, ns: &str, object: Value) -> Value {
    let object = serde_json::from_value(object).expect("a valid AppWrapper");
    let created = kueue::appwrappers(client, ns)
        .create(&PostParams::default(), &object)
        .await
        .expect("create the AppWrapper");
    serde_json::to_value(created).expect("an AppWrapper serializes")
}

async fn get_appwrapper(client: &kube::Client, ns: &str, name: &str) -> Option<Value> {
    kueue::appwrappers(client, ns)
        .get_opt(name)
        .await
        .expect("read the AppWrapper")
        .map(|a| serde_json::to_value(a).expect("an AppWrapper serializes"))
}

/// The live Pods in `ns` matching `selector`.
async fn pods(client: &kube::Client, ns: &str, selector: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .expect("list Pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Waits until the AppWrapper's Workload is admitted; returns it.
async fn admitted_workload(client: &kube::Client, ns: &str, name: &str) -> Value {
    kueue::workload_where(client, ns, "AppWrapper", name, "admitted", |w| {
        condition_is(w, "Admitted", "True")
    })
    .await
}

/// Deletes the AppWrapper and waits until it is gone (its finalizer deletes what it wrapped
/// first), every Pod carrying its label is gone, and no admitted Workload of it remains.
async fn delete_and_wait(client: &kube::Client, ns: &str, name: &str) {
    kueue::appwrappers(client, ns)
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete the AppWrapper");
    eventually(
        WAIT,
        "the AppWrapper gone (its finalizer done)",
        || async move {
            get_appwrapper(client, ns, name)
                .await
                .is_none()
                .then_some(())
        },
    )
    .await;
    eventually(WAIT, "the wrapped objects' Pods gone", || async move {
        pods(client, ns, &format!("{APPWRAPPER_LABEL}={name}"))
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    eventually(
        WAIT,
        "no admitted Workload of the AppWrapper",
        || async move {
            match kueue::workload_of(client, ns, "AppWrapper", name).await {
                None => Some(()),
                Some(w) => (!condition_is(&w, "Admitted", "True")
                    || condition_is(&w, "Finished", "True"))
                .then_some(()),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn an_appwrapped_raycluster_waits_for_quota_then_runs() {
    kueue::appwrapper_controller();
    let client = kueue::client().await;
    let ns = support::namespace(&client, "aw-raycluster").await;
    // Less than the cluster needs (1.5 CPUs, 3Gi): it waits.
    kueue::queue(
        &client,
        &ns,
        "team",
        &ns,
        &[("cpu", "1"), ("memory", "2Gi")],
    )
    .await;
    let settings = ControllerSettings {
        namespaces: vec![ns.clone()],
        ..ControllerSettings::new(&[ControllerKind::Raycluster])
    };
    let _operator = e2e::Operator::start(client.clone(), settings);

    let container = |name: &str| {
        json!({"name": name, "image": "rayproject/ray:2.52.0",
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}})
    };
    // No queue label on the RayCluster: the AppWrapper is the workload.
    let cluster = json!({
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "wrapped"},
        "spec": {
            "headGroupSpec": {"rayStartParams": {},
                "template": {"spec": {"containers": [container("ray-head")]}}},
            "workerGroupSpecs": [{
                "groupName": "workers", "replicas": 2, "minReplicas": 2, "maxReplicas": 2,
                "rayStartParams": {},
                "template": {"spec": {"containers": [container("ray-worker")]}}
            }]
        }
    });
    let created = create_appwrapper(
        &client,
        &ns,
        appwrapper(
            "aw-cluster",
            "team",
            cluster,
            &[
                ("template.spec.headGroupSpec.template", 1),
                ("template.spec.workerGroupSpecs[0].template", 2),
            ],
        ),
    )
    .await;
    assert_eq!(
        created["spec"]["suspend"], true,
        "Kueue's webhook suspends a queued AppWrapper"
    );

    // Waiting: one Workload for the whole AppWrapper, sized by its declared pod sets, pending;
    // the AppWrapper stays suspended and nothing is created.
    let workload =
        kueue::workload_where(&client, &ns, "AppWrapper", "aw-cluster", "pending", |w| {
            condition_is(w, "QuotaReserved", "False")
        })
        .await;
    let counts: Vec<i64> = workload["spec"]["podSets"]
        .as_array()
        .expect("pod sets")
        .iter()
        .map(|p| p["count"].as_i64().unwrap_or(0))
        .collect();
    assert_eq!(counts, [1, 2], "{workload}");
    eprintln!(
        "appwrapper: pending: {}",
        kueue::condition(&workload, "QuotaReserved").unwrap()["message"]
    );
    let aw = eventually(WAIT, "the AppWrapper in phase Suspended", || {
        let (client, ns) = (&client, &ns);
        async move {
            get_appwrapper(client, ns, "aw-cluster")
                .await
                .filter(|a| a["status"]["phase"] == "Suspended")
        }
    })
    .await;
    assert_eq!(aw["spec"]["suspend"], true);
    assert!(
        kueue::ray_clusters(&client, &ns)
            .get_opt("wrapped")
            .await
            .unwrap()
            .is_none(),
        "no RayCluster before admission"
    );

    // Quota arrives: admitted, the AppWrapper controller creates the RayCluster, raypipe makes
    // its Pods (kwok runs them), each carrying the AppWrapper's label and Kueue's pod set.
    kueue::set_quota(&client, &ns, &[("cpu", "4"), ("memory", "8Gi")]).await;
    admitted_workload(&client, &ns, "aw-cluster").await;
    let cluster = eventually(WAIT, "the wrapped RayCluster created", || {
        let (client, ns) = (&client, &ns);
        async move {
            Api::<RayCluster>::namespaced(client.clone(), ns)
                .get_opt("wrapped")
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    let owner = cluster
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert!(
        owner.iter().any(|o| o.kind == "AppWrapper"
            && o.name == "aw-cluster"
            && o.controller == Some(true)),
        "{owner:?}"
    );
    assert!(!cluster.labels().contains_key(QUEUE_NAME_LABEL));
    assert_ne!(
        cluster.spec.suspend,
        Some(true),
        "Kueue leaves the child alone"
    );
    let running_pods = eventually(WAIT, "the cluster's three Pods running", || {
        let (client, ns) = (&client, &ns);
        async move {
            let found = pods(client, ns, "ray.io/cluster=wrapped").await;
            (found.len() == 3 && found.iter().all(running)).then_some(found)
        }
    })
    .await;
    for pod in &running_pods {
        let labels = pod.labels();
        assert_eq!(
            labels.get(APPWRAPPER_LABEL).map(String::as_str),
            Some("aw-cluster")
        );
        assert!(labels.contains_key(PODSET_LABEL), "{labels:?}");
    }
    // The AppWrapper controller counts them (by its label) as its Pods.
    eventually(WAIT, "the AppWrapper Running with its Pods ready", || {
        let (client, ns) = (&client, &ns);
        async move {
            get_appwrapper(client, ns, "aw-cluster").await.filter(|a| {
                a["status"]["phase"] == "Running" && condition_is(a, "PodsReady", "True")
            })
        }
    })
    .await;
    assert!(
        kueue::workloads(&client, &ns)
            .await
            .iter()
            .all(|w| w["metadata"]["ownerReferences"][0]["kind"] == "AppWrapper"),
        "one Workload, the AppWrapper's: none for the RayCluster"
    );

    // Deleting the AppWrapper deletes the cluster and its Pods, and frees the quota.
    delete_and_wait(&client, &ns, "aw-cluster").await;
    eventually(WAIT, "the wrapped RayCluster deleted", || {
        let (client, ns) = (&client, &ns);
        async move {
            kueue::ray_clusters(client, ns)
                .get_opt("wrapped")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn an_appwrapped_servepipeline_is_admitted_and_its_cluster_runs() {
    kueue::appwrapper_controller();
    let client = kueue::client().await;
    let ns = support::namespace(&client, "aw-pipeline").await;
    kueue::queue(
        &client,
        &ns,
        "team",
        &ns,
        &[("cpu", "4"), ("memory", "8Gi")],
    )
    .await;

    // The pipeline's source: a token-protected registry on the loopback.
    let token = raypipe::devenv::random_token().unwrap();
    let registry = raypipe::devenv::registry::Registry::start(&token).await;
    registry.put(e2e::GRAPH_PATH, e2e::ensemble("1"));
    crate::support::fixture::put_token_secret(&client, &ns, "registry-token", &token).await;
    // raypipe's controllers; dashboards and Serve on a closed loopback port (no Ray head: the
    // pipeline never gets Ready here, and nothing leaves 127.0.0.1).
    let settings = ControllerSettings {
        namespaces: vec![ns.clone()],
        fetcher: support::loopback_fetcher(),
        ray_dashboard_url: Some("http://127.0.0.1:1".into()),
        ray_serve_url: Some("http://127.0.0.1:1".into()),
        ..ControllerSettings::new(&[
            ControllerKind::Servepipeline,
            ControllerKind::Rayservice,
            ControllerKind::Raycluster,
        ])
    };
    let _operator = e2e::Operator::start(client.clone(), settings);

    // The ServePipeline carries no queue label: the AppWrapper is the workload.
    let mut pipeline = serde_json::to_value(crate::support::fixture::serving_pipeline(
        "wrapped",
        crate::support::fixture::token_source(
            &registry.url(e2e::GRAPH_PATH),
            json!({"refreshInterval": "1s"}),
        ),
        e2e::ROUTE,
        json!({"name": "ray-head", "image": "rayproject/ray:2.60.0",
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}),
    ))
    .unwrap();
    pipeline["spec"]["rayClusterConfig"]["workerGroupSpecs"] = json!([{
        "groupName": "workers", "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
        "rayStartParams": {},
        "template": {"spec": {"containers": [{"name": "ray-worker",
            "image": "rayproject/ray:2.60.0",
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}}
    }]);
    // As a user writes it: no status.
    if let Some(object) = pipeline.as_object_mut() {
        object.remove("status");
    }
    create_appwrapper(
        &client,
        &ns,
        appwrapper(
            "aw-pipeline",
            "team",
            pipeline,
            &[
                ("template.spec.rayClusterConfig.headGroupSpec.template", 1),
                (
                    "template.spec.rayClusterConfig.workerGroupSpecs[0].template",
                    1,
                ),
            ],
        ),
    )
    .await;

    // Admitted as one Workload of two pod sets; the AppWrapper controller creates the pipeline.
    let workload = admitted_workload(&client, &ns, "aw-pipeline").await;
    assert_eq!(
        workload["spec"]["podSets"].as_array().map(Vec::len),
        Some(2),
        "{workload}"
    );
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    let created = eventually(WAIT, "the wrapped ServePipeline created", || {
        let pipelines = &pipelines;
        async move { pipelines.get_opt("wrapped").await.ok().flatten() }
    })
    .await;
    assert!(
        created
            .owner_references()
            .iter()
            .any(|o| o.kind == "AppWrapper" && o.name == "aw-pipeline"),
        "{:?}",
        created.owner_references()
    );
    assert!(!created.labels().contains_key(QUEUE_NAME_LABEL));
    let head_labels = created
        .spec
        .ray_cluster_config
        .head_group_spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    assert_eq!(
        head_labels.get(APPWRAPPER_LABEL).map(String::as_str),
        Some("aw-pipeline"),
        "the AppWrapper controller labels the declared templates: {head_labels:?}"
    );

    // raypipe makes its RayService and cluster; Kueue leaves both alone (no queue label, and
    // no Workload of their own), and the head Pod runs with the injected labels.
    let rayservices: Api<RayService> = Api::namespaced(client.clone(), &ns);
    let rayservice = eventually(WAIT, "the pipeline's RayService", || {
        let rayservices = &rayservices;
        async move { rayservices.get_opt("wrapped").await.ok().flatten() }
    })
    .await;
    assert!(!rayservice.labels().contains_key(QUEUE_NAME_LABEL));
    let cluster = eventually(WAIT, "the pipeline's RayCluster", || {
        let (client, ns) = (&client, &ns);
        async move {
            Api::<RayCluster>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .next()
        }
    })
    .await;
    let cluster_name = cluster.name_any();
    assert!(
        !cluster.labels().contains_key(QUEUE_NAME_LABEL),
        "{:?}",
        cluster.labels()
    );
    assert_ne!(cluster.spec.suspend, Some(true), "Kueue leaves it alone");
    let head = eventually(WAIT, "the head Pod running", || {
        let (client, ns, cluster_name) = (&client, &ns, &cluster_name);
        async move {
            pods(
                client,
                ns,
                &format!("ray.io/cluster={cluster_name},ray.io/node-type=head"),
            )
            .await
            .into_iter()
            .find(running)
        }
    })
    .await;
    let labels = head.labels();
    assert_eq!(
        labels.get(APPWRAPPER_LABEL).map(String::as_str),
        Some("aw-pipeline"),
        "{labels:?}"
    );
    assert!(labels.contains_key(PODSET_LABEL), "{labels:?}");
    eventually(WAIT, "the worker Pod running", || {
        let (client, ns, cluster_name) = (&client, &ns, &cluster_name);
        async move {
            pods(
                client,
                ns,
                &format!("ray.io/cluster={cluster_name},ray.io/node-type=worker"),
            )
            .await
            .into_iter()
            .find(running)
        }
    })
    .await;
    // The AppWrapper controller finds both Pods by its label.
    eventually(WAIT, "the AppWrapper Running with its Pods ready", || {
        let (client, ns) = (&client, &ns);
        async move {
            get_appwrapper(client, ns, "aw-pipeline").await.filter(|a| {
                a["status"]["phase"] == "Running" && condition_is(a, "PodsReady", "True")
            })
        }
    })
    .await;
    let workloads = kueue::workloads(&client, &ns).await;
    assert_eq!(
        workloads.len(),
        1,
        "only the AppWrapper's Workload: {workloads:?}"
    );

    // Deleting the AppWrapper deletes the pipeline, its RayService and cluster, and the Pods.
    delete_and_wait(&client, &ns, "aw-pipeline").await;
    eventually(WAIT, "the pipeline, RayService and cluster deleted", || {
        let (client, ns, pipelines, rayservices) = (&client, &ns, &pipelines, &rayservices);
        async move {
            let clusters = Api::<RayCluster>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .ok()?;
            (pipelines.get_opt("wrapped").await.ok()?.is_none()
                && rayservices.get_opt("wrapped").await.ok()?.is_none()
                && clusters.items.is_empty())
            .then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn an_appwrapped_rayservice_is_admitted_and_its_cluster_runs() {
    kueue::appwrapper_controller();
    let client = kueue::client().await;
    let ns = support::namespace(&client, "aw-rayservice").await;
    kueue::queue(
        &client,
        &ns,
        "team",
        &ns,
        &[("cpu", "2"), ("memory", "4Gi")],
    )
    .await;
    // Dashboards and Serve on a closed loopback port: Serve never answers, nothing leaves
    // 127.0.0.1; the cluster and its Pods are what is checked.
    let settings = ControllerSettings {
        namespaces: vec![ns.clone()],
        ray_dashboard_url: Some("http://127.0.0.1:1".into()),
        ray_serve_url: Some("http://127.0.0.1:1".into()),
        ..ControllerSettings::new(&[ControllerKind::Rayservice, ControllerKind::Raycluster])
    };
    let _operator = e2e::Operator::start(client.clone(), settings);

    let rayservice = json!({
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "wrapped"},
        "spec": {
            "serveConfigV2": "applications: []\n",
            "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-head",
                    "image": "rayproject/ray:2.52.0",
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}]}}}}
        }
    });
    create_appwrapper(
        &client,
        &ns,
        appwrapper(
            "aw-service",
            "team",
            rayservice,
            &[("template.spec.rayClusterConfig.headGroupSpec.template", 1)],
        ),
    )
    .await;

    admitted_workload(&client, &ns, "aw-service").await;
    let rayservices: Api<RayService> = Api::namespaced(client.clone(), &ns);
    let created = eventually(WAIT, "the wrapped RayService created", || {
        let rayservices = &rayservices;
        async move { rayservices.get_opt("wrapped").await.ok().flatten() }
    })
    .await;
    assert!(
        created
            .owner_references()
            .iter()
            .any(|o| o.kind == "AppWrapper" && o.name == "aw-service"),
        "{:?}",
        created.owner_references()
    );
    assert_ne!(
        created.spec.ray_cluster_config.suspend,
        Some(true),
        "Kueue does not gate a RayService whose AppWrapper it admitted"
    );
    let cluster = eventually(WAIT, "the RayService's RayCluster", || {
        let (client, ns) = (&client, &ns);
        async move {
            Api::<RayCluster>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .next()
        }
    })
    .await;
    let cluster_name = cluster.name_any();
    assert!(!cluster.labels().contains_key(QUEUE_NAME_LABEL));
    let head = eventually(WAIT, "the head Pod running", || {
        let (client, ns, cluster_name) = (&client, &ns, &cluster_name);
        async move {
            pods(
                client,
                ns,
                &format!("ray.io/cluster={cluster_name},ray.io/node-type=head"),
            )
            .await
            .into_iter()
            .find(running)
        }
    })
    .await;
    assert_eq!(
        head.labels().get(APPWRAPPER_LABEL).map(String::as_str),
        Some("aw-service"),
        "{:?}",
        head.labels()
    );
    eventually(WAIT, "the AppWrapper Running with its Pod ready", || {
        let (client, ns) = (&client, &ns);
        async move {
            get_appwrapper(client, ns, "aw-service").await.filter(|a| {
                a["status"]["phase"] == "Running" && condition_is(a, "PodsReady", "True")
            })
        }
    })
    .await;
    let workloads = kueue::workloads(&client, &ns).await;
    assert_eq!(
        workloads.len(),
        1,
        "only the AppWrapper's Workload: {workloads:?}"
    );

    delete_and_wait(&client, &ns, "aw-service").await;
    eventually(WAIT, "the RayService and its cluster deleted", || {
        let (client, ns, rayservices) = (&client, &ns, &rayservices);
        async move {
            let clusters = Api::<RayCluster>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .ok()?;
            (rayservices.get_opt("wrapped").await.ok()?.is_none() && clusters.items.is_empty())
                .then_some(())
        }
    })
    .await;
}
