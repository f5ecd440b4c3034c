//! The chart as users install it: packaged and installed with the real `helm`, then the operator
//! run with the installed Deployment's arguments and the chart ServiceAccount's own token (not
//! the admin's), for each `controllers` subset a platform team may choose. Each enabled
//! controller reconciles a sample, and the operator's request metrics must show no request
//! the chart's RBAC refused: a verb the code uses and the chart does not grant fails here.
//! Then `helm upgrade` from the previous chart version and `helm uninstall`, and what stays.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use super::{InstalledOperator, free_port, helm_command, package_chart, repo, select_no_namespace};
use crate::support::tools::run;
use crate::support::{self, eventually};

/// Generous: these run beside the whole suite on two cores.
const WAIT: Duration = Duration::from_secs(180);

/// The chart's version before this release (the commit whose chart users have installed).
const PREVIOUS_CHART_COMMIT: &str = "8a25d27";

fn ray(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("ray.io", "v1", kind))
}

/// KubeRay's sample `file` (its first document).
fn kuberay_sample(file: &str) -> Value {
    support::yaml_documents(&support::kuberay_samples_dir())
        .into_iter()
        .find(|(name, _)| name == file)
        .map(|(_, doc)| doc)
        .unwrap_or_else(|| panic!("KubeRay's sample {file}"))
}

async fn apply(client: &kube::Client, ns: &str, kind: &str, object: &Value) -> String {
    let name = object["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_owned();
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ray(kind))
        .patch(
            &name,
            &PatchParams::apply("release-test"),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|e| panic!("create {kind} {name}: {e}"));
    name
}

async fn get(client: &kube::Client, ns: &str, kind: &str, name: &str) -> Option<Value> {
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ray(kind))
        .get(name)
        .await
        .ok()
        .map(|o| serde_json::to_value(o).expect("JSON"))
}

/// The RayClusters of `ns` owned by the object `owner_uid`.
async fn owned_clusters(client: &kube::Client, ns: &str, owner_uid: &str) -> Vec<Value> {
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ray("RayCluster"))
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|o| serde_json::to_value(o).expect("JSON"))
        .filter(|c| {
            c["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|r| r["uid"] == owner_uid))
        })
        .collect()
}

/// A release of the chart in `dir` (or an archive), scoped to one watched namespace so it meets
/// no other test's objects, with free admin and webhook ports.
struct Release {
    name: String,
    namespace: String,
    watched: String,
    admin_port: u16,
    home: tempfile::TempDir,
}

impl Release {
    async fn new(client: &kube::Client, prefix: &str) -> Release {
        let namespace = support::namespace(client, &format!("{prefix}-op")).await;
        let watched = support::namespace(client, prefix).await;
        Release {
            // Unique per run: the cluster-scoped objects carry it.
            name: namespace.clone(),
            namespace,
            watched,
            admin_port: free_port(),
            home: tempfile::tempdir().expect("helm's home"),
        }
    }

    fn helm(&self) -> Command {
        helm_command(self.home.path(), &support::control_plane().kubeconfig)
    }

    /// `helm install|upgrade` of `chart` with the scoping values and `values`; helm's output.
    fn install(&self, verb: &str, chart: &Path, values: &[String]) -> String {
        let mut command = self.helm();
        command
            .args([verb, &self.name])
            .arg(chart)
            .args(["--namespace", &self.namespace])
            .args(["--set", &format!("watchNamespaces={{{}}}", self.watched)])
            .args(["--set", "replicaCount=1"])
            .args(["--set", &format!("admin.port={}", self.admin_port)])
            .args(["--set", &format!("webhook.port={}", free_port())])
            // Leader election on: the chart's Lease rules are part of what is tested.
            .args(["--set", "leaderElection.enabled=true"]);
        for value in values {
            command.args(["--set", value]);
        }
        run(&mut command)
    }

    fn deployment(&self) -> String {
        format!("{}-raypipe", self.name)
    }

    async fn operator(&self, client: &kube::Client) -> InstalledOperator {
        InstalledOperator::start(
            support::control_plane(),
            client,
            &self.namespace,
            &self.deployment(),
            &self.deployment(),
            self.admin_port,
        )
        .await
    }

    /// Removes what the chart made cluster-wide (namespaces go with the test run).
    fn uninstall(&self) {
        run(self
            .helm()
            .args(["uninstall", &self.name, "--namespace", &self.namespace]));
    }
}

/// The chart packaged from the repository, as `helm package` makes it for a release.
fn packaged_chart(home: &Path) -> std::path::PathBuf {
    package_chart(home, &repo().join("deploy/raypipe"), home)
}

/// Installs the chart with `controllers`, runs its operator under the chart's RBAC, lets
/// `exercise` create samples in the watched namespace and wait for them, then checks that no
/// request was forbidden.
async fn under_the_charts_rbac<F, Fut>(
    prefix: &str,
    controllers: &[&str],
    extra: &[&str],
    exercise: F,
) where
    F: FnOnce(kube::Client, String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let release = Release::new(&client, prefix).await;
    let chart = packaged_chart(release.home.path());
    let mut values = vec![
        format!("controllers={{{}}}", controllers.join(",")),
        // Graph registries and Ray dashboards are on the loopback here; in a cluster these are
        // an in-cluster registry's CIDR and the head Services' DNS names.
        "sourceAllowedDestinations={127.0.0.0/8}".to_owned(),
        "rayDashboardUrl=http://127.0.0.1:9/{service}".to_owned(),
    ];
    values.extend(extra.iter().map(|v| (*v).to_owned()));
    let notes = release.install("install", &chart, &values);
    assert!(notes.contains("Controllers: "), "{notes}");

    // The webhook covers exactly the enabled kinds.
    let configuration = Api::<
        k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
    >::all(client.clone())
    .get(&release.deployment())
    .await
    .expect("the chart's webhook configuration");
    let mut resources: Vec<String> = configuration
        .webhooks
        .iter()
        .flatten()
        .flat_map(|w| w.rules.iter().flatten())
        .flat_map(|r| r.resources.iter().flatten().cloned())
        .collect();
    resources.sort();
    let mut expected: Vec<String> = controllers.iter().map(|c| format!("{c}s")).collect();
    expected.sort();
    assert_eq!(
        resources, expected,
        "webhooks only for the controllers that run"
    );

    let operator = release.operator(&client).await;
    eventually(
        WAIT,
        "the operator to write the webhook CA bundle",
        || async {
            let c = Api::<
                k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
            >::all(client.clone())
            .get(&release.deployment())
            .await
            .ok()?;
            c.webhooks?
                .iter()
                .all(|w| w.client_config.ca_bundle.is_some())
                .then_some(())
        },
    )
    .await;
    select_no_namespace(&client, &release.deployment()).await;

    exercise(client.clone(), release.watched.clone()).await;

    assert_eq!(
        operator.forbidden().await,
        0.0,
        "the operator made requests the chart's RBAC refuses ({controllers:?})"
    );
    operator.stop().await;
    release.uninstall();
}

async fn a_raycluster_is_ready(client: &kube::Client, ns: &str) {
    let name = apply(
        client,
        ns,
        "RayCluster",
        &kuberay_sample("ray-cluster.sample.yaml"),
    )
    .await;
    eventually(WAIT, "KubeRay's RayCluster sample to be ready", || async {
        let cluster = get(client, ns, "RayCluster", &name).await?;
        (cluster["status"]["state"] == "ready").then_some(())
    })
    .await;
}

#[tokio::test]
async fn only_the_raycluster_controller_runs_under_the_charts_rbac() {
    under_the_charts_rbac("chart-rc", &["raycluster"], &[], |client, ns| async move {
        a_raycluster_is_ready(&client, &ns).await;
    })
    .await;
}

#[tokio::test]
async fn rayservice_and_raycluster_run_under_the_charts_rbac() {
    under_the_charts_rbac(
        "chart-rs",
        &["rayservice", "raycluster"],
        &[],
        |client, ns| async move {
            let name = apply(
                &client,
                &ns,
                "RayService",
                &kuberay_sample("ray-service.sample.yaml"),
            )
            .await;
            let service = eventually(WAIT, "the RayService's status", || async {
                let service = get(&client, &ns, "RayService", &name).await?;
                service["status"]["observedGeneration"]
                    .as_i64()
                    .map(|_| service)
            })
            .await;
            let uid = service["metadata"]["uid"].as_str().expect("uid").to_owned();
            eventually(WAIT, "the RayService's cluster to be ready", || async {
                let clusters = owned_clusters(&client, &ns, &uid).await;
                clusters
                    .iter()
                    .any(|c| c["status"]["state"] == "ready")
                    .then_some(())
            })
            .await;
        },
    )
    .await;
}

#[tokio::test]
async fn rayjob_and_raycluster_run_under_the_charts_rbac() {
    under_the_charts_rbac(
        "chart-rj",
        &["rayjob", "raycluster"],
        &[],
        |client, ns| async move {
            let name = apply(
                &client,
                &ns,
                "RayJob",
                &kuberay_sample("ray-job.sample.yaml"),
            )
            .await;
            let job = eventually(WAIT, "the RayJob's cluster", || async {
                let job = get(&client, &ns, "RayJob", &name).await?;
                job["status"]["rayClusterName"].as_str()?;
                Some(job)
            })
            .await;
            let uid = job["metadata"]["uid"].as_str().expect("uid").to_owned();
            eventually(
                WAIT,
                "the RayJob's cluster to be ready and its submitter Job",
                || async {
                    let ready = owned_clusters(&client, &ns, &uid)
                        .await
                        .iter()
                        .any(|c| c["status"]["state"] == "ready");
                    let submitter = Api::<Job>::namespaced(client.clone(), &ns)
                        .get_opt(&name)
                        .await
                        .ok()
                        .flatten();
                    (ready && submitter.is_some()).then_some(())
                },
            )
            .await;
        },
    )
    .await;
}

#[tokio::test]
async fn raycronjob_rayjob_and_raycluster_run_under_the_charts_rbac() {
    under_the_charts_rbac(
        "chart-rcj",
        &["raycronjob", "rayjob", "raycluster"],
        &["featureGates=RayCronJob=true"],
        |client, ns| async move {
            // KubeRay's sample runs every minute: the first RayJob comes within one.
            let name = apply(
                &client,
                &ns,
                "RayCronJob",
                &kuberay_sample("ray-cronjob.sample.yaml"),
            )
            .await;
            let cron = get(&client, &ns, "RayCronJob", &name)
                .await
                .expect("the RayCronJob");
            let uid = cron["metadata"]["uid"].as_str().expect("uid").to_owned();
            eventually(
                Duration::from_secs(150),
                "the RayCronJob's first RayJob and its cluster",
                || async {
                    let jobs =
                        Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &ray("RayJob"))
                            .list(&ListParams::default())
                            .await
                            .ok()?;
                    let job = jobs.items.into_iter().find(|j| {
                        j.metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .any(|r| r.uid == uid)
                    })?;
                    let job_uid = job.metadata.uid.clone()?;
                    (!owned_clusters(&client, &ns, &job_uid).await.is_empty()).then_some(())
                },
            )
            .await;
        },
    )
    .await;
}

/// A ServePipeline whose graph is in the token-auth registry, with a dockerconfigjson Secret:
/// the controller reads the Secret, fetches, and creates the RayService.
async fn a_pipeline_serves_from_the_registry(client: &kube::Client, ns: &str) {
    use k8s_openapi::ByteString;
    use kube::api::PostParams;
    use raypipe::api::servepipeline::ServePipeline;
    use raypipe::source::oci::manifest::GRAPH_LAYER_MEDIA_TYPE;

    use crate::support::oci::{PASSWORD, USER, token_registry};

    let registry = &token_registry().registry;
    let repository = format!("chart/{ns}");
    crate::source::oci::push(
        &repository,
        "v1",
        GRAPH_LAYER_MEDIA_TYPE,
        &crate::support::e2e::ensemble("1"),
    )
    .await;
    let host = registry.reference("").trim_end_matches('/').to_owned();
    let docker_config = json!({"auths": {host: {"username": USER, "password": PASSWORD}}});
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some("registry".into()),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/dockerconfigjson".into()),
                data: Some(
                    [(
                        ".dockerconfigjson".to_owned(),
                        ByteString(docker_config.to_string().into_bytes()),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
        )
        .await
        .expect("the registry Secret");
    let pipeline: ServePipeline = serde_json::from_value(json!({
        "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline",
        "metadata": {"name": "charted"},
        "spec": {
            "source": {
                "oci": registry.reference(&format!("{repository}:v1")),
                "credentialsSecretRef": {"name": "registry", "key": ".dockerconfigjson"},
                "allowInsecureHttp": true
            },
            "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
                "template": {"spec": {"containers": [
                    {"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}}}
        }
    }))
    .expect("a ServePipeline");
    Api::<ServePipeline>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pipeline)
        .await
        .expect("create the pipeline");
    eventually(WAIT, "the pipeline's RayService", || async {
        get(client, ns, "RayService", "charted").await
    })
    .await;
}

#[tokio::test]
async fn only_the_servepipeline_controller_runs_under_the_charts_rbac() {
    under_the_charts_rbac(
        "chart-sp",
        &["servepipeline"],
        &[],
        |client, ns| async move {
            a_pipeline_serves_from_the_registry(&client, &ns).await;
        },
    )
    .await;
}

#[tokio::test]
async fn all_five_controllers_run_under_the_charts_rbac() {
    under_the_charts_rbac(
        "chart-all",
        &[
            "servepipeline",
            "raycluster",
            "rayservice",
            "rayjob",
            "raycronjob",
        ],
        &["featureGates=RayCronJob=true"],
        |client, ns| async move {
            a_pipeline_serves_from_the_registry(&client, &ns).await;
            a_raycluster_is_ready(&client, &ns).await;
            // The pipeline's RayService, reconciled by the RayService controller into a cluster.
            let service = get(&client, &ns, "RayService", "charted")
                .await
                .expect("the RayService");
            let uid = service["metadata"]["uid"].as_str().expect("uid").to_owned();
            eventually(WAIT, "the pipeline's RayCluster", || async {
                (!owned_clusters(&client, &ns, &uid).await.is_empty()).then_some(())
            })
            .await;
        },
    )
    .await;
}

/// The previous chart version installed, a workload running, then `helm upgrade` to this one:
/// the Deployment's selector (immutable) still matches, the operator runs under the new RBAC
/// and the workload is untouched. Then `helm uninstall`: the CRDs, the workload and the webhook
/// certificate Secret stay; the chart's own objects go.
#[tokio::test]
async fn the_chart_upgrades_from_the_previous_version_and_uninstall_keeps_crds_and_workloads() {
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let release = Release::new(&client, "chart-up").await;
    let home = release.home.path();

    // The previous chart, from the repository's history.
    let previous = home.join("previous");
    std::fs::create_dir_all(&previous).expect("a directory");
    let archive = Command::new("git")
        .args([
            "archive",
            "--format=tar",
            PREVIOUS_CHART_COMMIT,
            "deploy/raypipe",
            "crds",
        ])
        .current_dir(repo())
        .output()
        .expect("git runs");
    assert!(
        archive.status.success(),
        "the previous chart is read from commit {PREVIOUS_CHART_COMMIT} (a clone with history): {}",
        String::from_utf8_lossy(&archive.stderr)
    );
    let mut untar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&previous)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("tar");
    std::io::Write::write_all(untar.stdin.as_mut().expect("stdin"), &archive.stdout)
        .expect("untar");
    drop(untar.stdin.take());
    assert!(untar.wait().expect("tar").success());
    let old_chart = package_chart(home, &previous.join("deploy/raypipe"), home);
    let new_chart = packaged_chart(home);
    assert_ne!(
        old_chart.file_name(),
        new_chart.file_name(),
        "this release's chart has a version of its own"
    );

    let values = [
        "controllers={raycluster}".to_owned(),
        "rayDashboardUrl=http://127.0.0.1:9/{service}".to_owned(),
    ];
    release.install("install", &old_chart, &values);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &release.namespace);
    let before = deployments
        .get(&release.deployment())
        .await
        .expect("the Deployment");
    let operator = release.operator(&client).await;
    select_no_namespace(&client, &release.deployment()).await;
    let cluster = apply(
        &client,
        &release.watched,
        "RayCluster",
        &kuberay_sample("ray-cluster.sample.yaml"),
    )
    .await;
    eventually(
        WAIT,
        "the cluster ready under the previous chart",
        || async {
            let c = get(&client, &release.watched, "RayCluster", &cluster).await?;
            (c["status"]["state"] == "ready").then_some(())
        },
    )
    .await;
    let cluster_uid = get(&client, &release.watched, "RayCluster", &cluster)
        .await
        .expect("the cluster")["metadata"]["uid"]
        .clone();
    operator.stop().await;

    let output = release.install("upgrade", &new_chart, &values);
    assert!(output.contains("STATUS: deployed"), "{output}");
    let after = deployments
        .get(&release.deployment())
        .await
        .expect("the Deployment");
    assert_eq!(
        before.spec.as_ref().map(|s| &s.selector),
        after.spec.as_ref().map(|s| &s.selector),
        "the Deployment's selector is immutable"
    );
    let webhooks =
        Api::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>::all(
            client.clone(),
        )
        .get(&release.deployment())
        .await
        .expect("the webhook configuration")
        .webhooks
        .unwrap_or_default();
    assert_eq!(
        webhooks.len(),
        1,
        "after the upgrade only the RayCluster webhook is left"
    );
    let operator = release.operator(&client).await;
    select_no_namespace(&client, &release.deployment()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = get(&client, &release.watched, "RayCluster", &cluster)
        .await
        .expect("the cluster");
    assert_eq!(
        kept["metadata"]["uid"], cluster_uid,
        "the upgrade left the workload alone"
    );
    assert_eq!(kept["status"]["state"], "ready");
    assert_eq!(operator.forbidden().await, 0.0);
    operator.stop().await;

    let output = run(release.helm().args([
        "uninstall",
        &release.name,
        "--namespace",
        &release.namespace,
    ]));
    assert!(output.contains("uninstalled"), "{output}");
    assert!(
        deployments
            .get_opt(&release.deployment())
            .await
            .expect("get")
            .is_none(),
        "the Deployment goes"
    );
    for crd in [
        "servepipelines.raypipe.dev",
        "rayclusters.ray.io",
        "rayservices.ray.io",
        "rayjobs.ray.io",
        "raycronjobs.ray.io",
    ] {
        Api::<CustomResourceDefinition>::all(client.clone())
            .get(crd)
            .await
            .unwrap_or_else(|e| panic!("{crd} stays after uninstall: {e}"));
    }
    let kept = get(&client, &release.watched, "RayCluster", &cluster)
        .await
        .expect("the cluster stays");
    assert_eq!(kept["metadata"]["uid"], cluster_uid);
    Api::<Secret>::namespaced(client.clone(), &release.namespace)
        .get(&format!("{}-webhook-cert", release.deployment()))
        .await
        .expect("the webhook certificate Secret is kept (helm.sh/resource-policy: keep)");
}
