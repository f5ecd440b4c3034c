//! raypipe beside an existing KubeRay, as `docs/migrating-from-kuberay.md` recommends: KubeRay
//! v1.7.0's own CRDs (`../shared/kuberay-crds/`) on a control plane of their own, raypipe's
//! ServePipeline CRD beside them, and raypipe's chart installed with KubeRay v1.7.0's own chart
//! values file (`../shared/kuberay-chart/values.yaml`) and `controllers={servepipeline}`. Every
//! KubeRay sample, the gated ones included, is then admitted exactly as KubeRay's CRDs admit it,
//! while raypipe runs and after it stopped: raypipe judges none of KubeRay's kinds.

use std::path::PathBuf;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use raypipe::devenv::control_plane::{ControlPlane, ControlPlaneOptions};
use serde_json::Value;

use super::{InstalledOperator, free_port, helm_command, package_chart, repo};
use crate::support::tools::run;
use crate::support::{self, eventually};

fn shared() -> PathBuf {
    support::kuberay_samples_dir()
        .parent()
        .expect("the shared folder")
        .to_owned()
}

/// Server-side applies every CRD document in `file`, then waits until each is Established.
async fn install_crds(client: &kube::Client, documents: Vec<Value>) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for doc in documents {
        let name = doc["metadata"]["name"]
            .as_str()
            .expect("a CRD name")
            .to_owned();
        api.patch(
            &name,
            &PatchParams::apply("kuberay").force(),
            &Patch::Apply(&doc),
        )
        .await
        .unwrap_or_else(|e| panic!("install CRD {name}: {e}"));
        names.push(name);
    }
    for name in names {
        eventually(
            std::time::Duration::from_secs(60),
            &format!("{name} Established"),
            || async {
                let crd = api.get(&name).await.ok()?;
                crd.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            },
        )
        .await;
    }
}

/// Every KubeRay sample object, created in `ns` by the API server's admission alone: all of
/// them are admitted (as KubeRay's CRDs admit them); returns how many.
async fn every_sample_is_admitted(client: &kube::Client, ns: &str, round: &str) -> usize {
    let mut admitted = 0;
    for (file, doc) in support::yaml_documents(&support::kuberay_samples_dir()) {
        let Some((group, version)) = doc["apiVersion"].as_str().and_then(|v| v.split_once('/'))
        else {
            continue;
        };
        let kind = doc["kind"].as_str().expect("a kind");
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let api: Api<DynamicObject> = if group == "ray.io" {
            Api::namespaced_with(client.clone(), ns, &resource)
        } else {
            // The samples' helpers (ConfigMaps, Secrets, Redis, ...) are not what is judged here.
            continue;
        };
        let mut object: DynamicObject = serde_json::from_value(doc.clone()).expect("an object");
        let name = format!(
            "{round}-{}",
            object.metadata.name.clone().unwrap_or_default()
        );
        object.metadata.name = Some(name.clone());
        object.metadata.namespace = Some(ns.to_owned());
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| {
                panic!("{file}: {kind} {name} was refused beside KubeRay ({round}): {e}")
            });
        admitted += 1;
    }
    admitted
}

#[tokio::test]
async fn beside_kuberay_raypipe_judges_none_of_its_kinds_running_or_stopped() {
    raypipe::startup::init_crypto();
    let plane = ControlPlane::start(ControlPlaneOptions {
        install_crds: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .expect("a control plane of its own");
    let client = plane.client().await.expect("a client");

    // KubeRay v1.7.0's CRDs, and raypipe's own CRD only (the migration guide's step).
    let mut kuberay = Vec::new();
    for entry in std::fs::read_dir(shared().join("kuberay-crds")).expect("KubeRay's CRDs") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("a CRD file");
            kuberay.extend(raypipe::api::yaml::documents(&text).expect("YAML"));
        }
    }
    assert_eq!(
        kuberay.len(),
        4,
        "RayCluster, RayJob, RayService, RayCronJob"
    );
    install_crds(&client, kuberay).await;
    let ours = std::fs::read_to_string(repo().join("crds/servepipelines.raypipe.dev.yaml"))
        .expect("raypipe's ServePipeline CRD");
    install_crds(&client, raypipe::api::yaml::documents(&ours).expect("YAML")).await;

    // raypipe's chart with KubeRay's own values file, only the ServePipeline controller.
    let home = tempfile::tempdir().expect("helm's home");
    let chart = package_chart(home.path(), &repo().join("deploy/raypipe"), home.path());
    let namespace = "raypipe-system";
    let admin_port = free_port();
    let notes = run(helm_command(home.path(), &plane.kubeconfig)
        .args(["install", "raypipe"])
        .arg(&chart)
        .args([
            "--namespace",
            namespace,
            "--create-namespace",
            "--skip-crds",
        ])
        .arg("--values")
        .arg(shared().join("kuberay-chart/values.yaml"))
        .args(["--set", "controllers={servepipeline}"])
        .args(["--set", "image.repository=registry.example/raypipe"])
        .args(["--set", "image.tag=0.2.0"])
        .args(["--set", &format!("admin.port={admin_port}")])
        .args(["--set", &format!("webhook.port={}", free_port())]));
    // KubeRay's values that raypipe does not use are reported, not refused.
    for ignored in ["componentOverride", "operatorCommand (/manager)"] {
        assert!(notes.contains(ignored), "NOTES name {ignored}:\n{notes}");
    }
    // Those with raypipe's meaning are honoured: KubeRay's names for the same things.
    let container = super::installed_container(&client, namespace, "kuberay-operator").await;
    let args = super::container_args(&container);
    for expected in [
        "--controllers=servepipeline",
        "--concurrency=1",
        "--log-format=json",
        "--qps=100",
        "--burst=200",
        "--leader-election=true",
        "--kuberay-metrics",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    let gates = args
        .iter()
        .find_map(|a| a.strip_prefix("--feature-gates="))
        .expect("KubeRay's featureGates list becomes --feature-gates");
    for gate in [
        "RayClusterStatusConditions=true",
        "RayServiceIncrementalUpgrade=true",
        "RayCronJob=false",
        "RayClusterHistoryServer=false",
    ] {
        assert!(gates.contains(gate), "{gate} in {gates}");
    }
    let deployment =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), namespace)
            .get("kuberay-operator")
            .await
            .expect("the Deployment, named as KubeRay's fullnameOverride says");
    assert_eq!(
        deployment.spec.and_then(|s| s.replicas),
        Some(1),
        "KubeRay's replicas"
    );
    assert_eq!(
        container["image"], "registry.example/raypipe:0.2.0",
        "raypipe's image, not KubeRay's"
    );

    // The webhook covers ServePipelines only.
    let configuration = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get("kuberay-operator")
        .await
        .expect("the chart's webhook configuration");
    let rules: Vec<String> = configuration
        .webhooks
        .iter()
        .flatten()
        .flat_map(|w| w.rules.iter().flatten())
        .flat_map(|r| r.api_groups.iter().flatten().cloned())
        .collect();
    assert_eq!(
        rules,
        ["raypipe.dev"],
        "raypipe judges only its own kind beside KubeRay"
    );

    // raypipe running (with the ServiceAccount KubeRay's values name, under the chart's RBAC).
    let operator = InstalledOperator::start(
        &plane,
        &client,
        namespace,
        "kuberay-operator",
        "kuberay-operator",
        admin_port,
    )
    .await;
    let ns = "samples";
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns"),
        )
        .await
        .expect("a namespace");
    let running = every_sample_is_admitted(&client, ns, "running").await;
    assert!(
        running >= 14,
        "every KubeRay sample, gated ones included: {running}"
    );
    assert_eq!(operator.forbidden().await, 0.0);
    operator.stop().await;

    // raypipe stopped (its replicas down, its webhook unreachable): KubeRay's kinds stay writable.
    let stopped = every_sample_is_admitted(&client, ns, "stopped").await;
    assert_eq!(stopped, running);
}
