//! `--batch-scheduler` against the real API server: the PodGroup a cluster (and a RayJob) gets
//! under Volcano and a cluster under scheduler-plugins (KubeRay v1.7's fields, the owner reference the garbage
//! collector removes it by), the Pods' scheduler name, labels and annotations, and a clear Warning while the
//! PodGroup CRD is missing. The builders' unit tests pin Pods and PodGroups to what KubeRay's
//! own plugins make (`tests/fixtures/kuberay-pods/batch-*.json`).
//!
//! CRDs: scheduler-plugins' own, from its Go module (`sigs.k8s.io/scheduler-plugins`, the
//! version KubeRay v1.7 builds with). Volcano's Go module of types (`volcano.sh/apis`) ships no
//! CRD manifest and `volcano.sh/volcano` (which does) is not served by the Go module proxy, so
//! the Volcano PodGroup CRD here is a minimal one of ours: the same group, version, kind and
//! scope, with an open schema. No scheduler runs; the Pods stay Pending, which is all a batch
//! scheduler would see of them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject};
use raypipe::api::rayjob::RayJob;
use raypipe::controllers::raycluster::builders::batch_scheduler::BatchScheduler;

use super::*;

const SCHEDULER_PLUGINS_MODULE: &str = "sigs.k8s.io/scheduler-plugins";
const SCHEDULER_PLUGINS_VERSION: &str = "v0.33.5";
const VOLCANO_CRD: &str = "podgroups.scheduling.volcano.sh";

async fn scheduler_fixture(prefix: &str, scheduler: BatchScheduler) -> Fixture {
    let config = Config {
        concurrency: 4,
        build: BuildOptions {
            batch_scheduler: Some(scheduler),
            ..BuildOptions::default()
        },
        ..Config::default()
    };
    fixture_with(prefix, config).await
}

fn pod_group_api(f: &Fixture, scheduler: BatchScheduler) -> Api<DynamicObject> {
    let resource: ApiResource = scheduler.pod_group_resource().expect("a PodGroup kind");
    Api::namespaced_with(f.client.clone(), &f.ns, &resource)
}

/// A fixed-size cluster (head and two workers) with the labels the schedulers read.
fn gang_cluster(name: &str) -> Value {
    let mut doc = small_cluster(name, 2, json!({}));
    doc["metadata"]["labels"] = json!({
        "volcano.sh/queue-name": "research",
        "ray.io/priority-class-name": "high-priority",
        "ray.io/gang-scheduling-enabled": "true",
    });
    doc["metadata"]["annotations"] = json!({"team": "research"});
    doc
}

async fn install_crd(client: &kube::Client, crd: &CustomResourceDefinition, group_version: &str) {
    let name = crd.metadata.name.clone().expect("a name");
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply("raycluster-test").force(),
            &Patch::Apply(crd),
        )
        .await
        .unwrap_or_else(|e| panic!("installing {name}: {e}"));
    eventually(
        WAIT,
        &format!("{group_version} PodGroup served"),
        || async {
            client
                .list_api_group_resources(group_version)
                .await
                .ok()
                .filter(|r| r.resources.iter().any(|r| r.kind == "PodGroup"))
        },
    )
    .await;
}

/// The Volcano PodGroup CRD this test stands in for Volcano's (see the module comment).
fn volcano_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": VOLCANO_CRD},
        "spec": {
            "group": "scheduling.volcano.sh",
            "names": {"kind": "PodGroup", "listKind": "PodGroupList", "plural": "podgroups",
                      "singular": "podgroup", "shortNames": ["pg", "podgroup-v1beta1"]},
            "scope": "Namespaced",
            "versions": [{"name": "v1beta1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]
        }
    }))
    .expect("a CustomResourceDefinition")
}

/// The Volcano CRD gone, so the test starts without it even on a reused control plane.
async fn remove_volcano_crd(client: &kube::Client) {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let _ = api.delete(VOLCANO_CRD, &DeleteParams::default()).await;
    eventually(WAIT, "the Volcano CRD removed", || async {
        let gone = matches!(api.get_opt(VOLCANO_CRD).await, Ok(None));
        let unserved = client
            .list_api_group_resources("scheduling.volcano.sh/v1beta1")
            .await
            .is_err();
        (gone && unserved).then_some(())
    })
    .await;
}

/// Every Pod of the cluster: Volcano's scheduler, the queue and priority labels, and the
/// PodGroup and task annotations.
fn assert_volcano_pods(pods: &[Pod], group_name: &str) {
    assert_eq!(pods.len(), 3, "a head and two workers");
    for pod in pods {
        let role = label(pod, "ray.io/group");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.scheduler_name.as_deref(), Some("volcano"), "{role}");
        assert_eq!(label(pod, "volcano.sh/queue-name"), "research", "{role}");
        assert_eq!(
            label(pod, "ray.io/priority-class-name"),
            "high-priority",
            "{role}"
        );
        let annotations = pod.annotations();
        assert_eq!(annotations["scheduling.k8s.io/group-name"], group_name);
        assert_eq!(annotations["volcano.sh/task-spec"], role);
    }
}

#[tokio::test]
async fn volcano_pod_groups_of_a_cluster_and_a_rayjob_and_a_warning_without_the_crd() {
    let f = scheduler_fixture("rc-volcano", BatchScheduler::Volcano).await;
    remove_volcano_crd(&f.client).await;

    // Without the CRD: a Warning naming it, and no Pods (they would wait for a PodGroup).
    let name = f.create_cluster(gang_cluster("gang")).await;
    let warning = f.wait_event("BatchSchedulerCRDMissing").await;
    let note = warning.message.unwrap_or_default();
    assert!(note.contains(VOLCANO_CRD), "{note}");
    assert!(f.ray_pods(&name).await.is_empty());

    // With it: the PodGroup, then the Pods.
    install_crd(&f.client, &volcano_crd(), "scheduling.volcano.sh/v1beta1").await;
    let groups = pod_group_api(&f, BatchScheduler::Volcano);
    let group = eventually(WAIT, "the Volcano PodGroup", || async {
        groups.get_opt("ray-gang-pg").await.ok().flatten()
    })
    .await;
    assert_eq!(
        group.data["spec"],
        json!({"minMember": 3, "queue": "research", "priorityClassName": "high-priority",
               "minResources": {"cpu": "3", "memory": "4Gi"}})
    );
    assert_eq!(group.data["status"], json!({"phase": "Pending"}));
    assert_eq!(group.annotations()["team"], "research");
    let cluster = f.cluster(&name).await;
    let owner = &group.owner_references()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str(),
            owner.controller
        ),
        (
            "RayCluster",
            name.as_str(),
            cluster.uid().expect("a uid").as_str(),
            Some(true)
        )
    );
    f.wait_workers(&name, 2).await;
    assert_volcano_pods(&f.ray_pods(&name).await, "ray-gang-pg");

    // A bigger cluster resizes the PodGroup.
    f.patch_group(&name, 0, json!({"replicas": 3})).await;
    eventually(WAIT, "the PodGroup resized", || async {
        let group = groups.get("ray-gang-pg").await.ok()?;
        (group.data["spec"]["minMember"] == json!(4)
            && group.data["spec"]["minResources"] == json!({"cpu": "4", "memory": "5Gi"}))
        .then_some(())
    })
    .await;

    // Deleting the cluster leaves the PodGroup to the garbage collector through that controller
    // reference (waiting for it here would wait for its 30 s discovery of the new CRD).

    // Here, not in a test of its own: the Volcano CRD is removed above.
    a_rayjob_gets_its_own_volcano_pod_group(&f).await;
}

/// A K8sJobMode RayJob: a PodGroup of its own (cluster and submitter), its cluster and Pods
/// pointing at it, and the PodGroup emptied when the job is suspended. Its cluster never
/// becomes ready (no scheduler runs), so the job stays Initializing until then.
async fn a_rayjob_gets_its_own_volcano_pod_group(f: &Fixture) {
    let mut stop = fixture::Stopper::default();
    tokio::spawn(raypipe::controllers::rayjob::run(
        f.client.clone(),
        raypipe::controllers::rayjob::Config {
            namespace: Some(f.ns.clone()),
            requeue: Duration::from_secs(1),
            build: BuildOptions {
                batch_scheduler: Some(BatchScheduler::Volcano),
                ..BuildOptions::default()
            },
            ..raypipe::controllers::rayjob::Config::default()
        },
        stop.signal(),
    ));
    let cluster_spec = small_cluster("unused", 1, json!({}))["spec"].clone();
    f.apply(&json!({
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": "nightly", "labels": {"volcano.sh/queue-name": "batch"}},
        "spec": {"entrypoint": "python -c 'print(1)'", "submissionMode": "K8sJobMode",
                 "shutdownAfterJobFinishes": true, "rayClusterSpec": cluster_spec}
    }))
    .await;
    let groups = pod_group_api(f, BatchScheduler::Volcano);
    let group = eventually(WAIT, "the RayJob's PodGroup", || async {
        groups.get_opt("ray-nightly-pg").await.ok().flatten()
    })
    .await;
    // The head and one worker, and the default submitter's 500m / 200Mi.
    assert_eq!(
        group.data["spec"],
        json!({"minMember": 2, "queue": "batch",
               "minResources": {"cpu": "2500m", "memory": "3272Mi"}})
    );
    let owner = &group.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("RayJob", "nightly")
    );
    let cluster = eventually(WAIT, "the RayJob's RayCluster", || async {
        f.clusters()
            .list(&ListParams::default().labels("ray.io/originated-from-cr-name=nightly"))
            .await
            .ok()?
            .items
            .into_iter()
            .next()
    })
    .await;
    let name = cluster.name_any();
    assert_eq!(
        cluster.annotations()["scheduling.k8s.io/group-name"],
        "ray-nightly-pg"
    );
    assert_eq!(cluster.labels()["volcano.sh/queue-name"], "batch");
    let pods = f.wait_workers(&name, 1).await;
    assert_eq!(
        pods[0].annotations()["scheduling.k8s.io/group-name"],
        "ray-nightly-pg"
    );
    // The job's PodGroup is the only one: its cluster gets none of its own.
    assert!(matches!(
        groups.get_opt(&format!("ray-{name}-pg")).await,
        Ok(None)
    ));

    // Suspended: the cluster goes, and the PodGroup gives its resources back.
    f.client_jobs()
        .patch(
            "nightly",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .expect("suspend the RayJob");
    eventually(WAIT, "the RayJob's PodGroup emptied", || async {
        let group = groups.get("ray-nightly-pg").await.ok()?;
        (group.data["spec"] == json!({"queue": "batch", "minResources": {}})).then_some(())
    })
    .await;
    f.wait_event("BatchSchedulerCleanedUp").await;
}

#[tokio::test]
async fn scheduler_plugins_gets_its_pod_group_from_its_own_crd() {
    let files = tokio::task::spawn_blocking(|| {
        go_module_crd_files(
            SCHEDULER_PLUGINS_MODULE,
            SCHEDULER_PLUGINS_VERSION,
            "config/crd/bases",
            "scheduling.x-k8s.io_podgroups",
        )
    })
    .await
    .expect("the CRD files");
    assert_eq!(files.len(), 1, "scheduler-plugins' PodGroup CRD: {files:?}");
    let crd: CustomResourceDefinition =
        serde_json::from_value(documents(&files[0]).remove(0)).expect("a CRD");
    let f = scheduler_fixture("rc-coscheduling", BatchScheduler::SchedulerPlugins).await;
    install_crd(&f.client, &crd, "scheduling.x-k8s.io/v1alpha1").await;

    // Only a cluster that asks for gang scheduling gets a PodGroup (and the Pod label).
    let plain = f.create_cluster(small_cluster("plain", 1, json!({}))).await;
    let name = f.create_cluster(gang_cluster("gang")).await;
    f.wait_workers(&name, 2).await;
    f.wait_workers(&plain, 1).await;
    let groups = pod_group_api(&f, BatchScheduler::SchedulerPlugins);
    let group = groups.get(&name).await.expect("the PodGroup");
    assert_eq!(group.data["spec"]["minMember"], json!(3));
    assert_eq!(
        group.data["spec"]["minResources"],
        json!({"cpu": "3", "memory": "4Gi"})
    );
    let cluster = f.cluster(&name).await;
    let owner = &group.owner_references()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.uid.as_str(),
            owner.controller
        ),
        (
            "ray.io/v1",
            "RayCluster",
            cluster.uid().expect("a uid").as_str(),
            None
        )
    );
    assert!(matches!(groups.get_opt(&plain).await, Ok(None)));
    for pod in f.ray_pods(&name).await {
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(
            spec.scheduler_name.as_deref(),
            Some("scheduler-plugins-scheduler")
        );
        assert_eq!(label(&pod, "scheduling.x-k8s.io/pod-group"), name);
    }
    for pod in f.ray_pods(&plain).await {
        assert!(!pod.labels().contains_key("scheduling.x-k8s.io/pod-group"));
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()),
            Some("scheduler-plugins-scheduler")
        );
    }
}

impl Fixture {
    fn client_jobs(&self) -> Api<RayJob> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
}
