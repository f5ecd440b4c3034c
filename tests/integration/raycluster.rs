//! The RayCluster controller against a real API server, kube-controller-manager (garbage
//! collection, Jobs), kube-scheduler and kwok (Pods become Running and Ready; Job Pods
//! complete). Every test has its own namespace and its own namespace-scoped controller.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use raypipe::api::RayCluster;
use raypipe::api::conditions;
use raypipe::api::raycluster::ClusterState;
use raypipe::controllers::raycluster::builders::pod::{WorkerReplica, head_pod, worker_pod};
use raypipe::controllers::raycluster::builders::{BuildOptions, service};
use raypipe::controllers::raycluster::status::desired_workers;
use raypipe::controllers::raycluster::{self, Config, validate};
use raypipe::kuberay::{names, spec::spec_hash};
use serde_json::{Value, json};

use crate::support::{self, assert_contains, eventually, fixture};

const WAIT: Duration = Duration::from_secs(90);

struct Fixture {
    client: kube::Client,
    ns: String,
    /// Stops the test's controllers when the fixture is dropped.
    _stop: fixture::Stopper,
}

/// A namespace with a RayCluster controller watching only it.
async fn fixture(prefix: &str) -> Fixture {
    let client = support::client().await;
    let ns = support::namespace(&client, prefix).await;
    let mut stop = fixture::Stopper::default();
    let config = Config {
        namespace: Some(ns.clone()),
        concurrency: 4,
        ..Config::default()
    };
    tokio::spawn(raycluster::run(client.clone(), config, stop.signal()));
    Fixture {
        client,
        ns,
        _stop: stop,
    }
}

/// The YAML documents of a sample file.
fn documents(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    raypipe::api::yaml::documents(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn project_sample(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples")
        .join(name)
}

fn is_raycluster(doc: &Value) -> bool {
    doc["apiVersion"] == "ray.io/v1" && doc["kind"] == "RayCluster"
}

impl Fixture {
    fn clusters(&self) -> Api<RayCluster> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Server-side applies `doc` (any kind) into the namespace.
    async fn apply(&self, doc: &Value) {
        fixture::apply(&self.client, &self.ns, doc, "raycluster-test").await;
    }

    /// Applies a sample file: its companion objects (ConfigMaps, Secrets, Redis…) first, then
    /// its RayClusters, whose names are returned.
    async fn apply_file(&self, path: &std::path::Path) -> Vec<String> {
        let docs = documents(path);
        for doc in docs.iter().filter(|d| !is_raycluster(d)) {
            self.apply(doc).await;
        }
        let mut clusters = Vec::new();
        for doc in docs.iter().filter(|d| is_raycluster(d)) {
            self.apply(doc).await;
            clusters.push(doc["metadata"]["name"].as_str().expect("name").to_owned());
        }
        clusters
    }

    async fn create_cluster(&self, doc: Value) -> String {
        self.apply(&doc).await;
        doc["metadata"]["name"].as_str().expect("name").to_owned()
    }

    async fn cluster(&self, name: &str) -> RayCluster {
        self.clusters().get(name).await.expect("get RayCluster")
    }

    async fn wait_cluster(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&RayCluster) -> bool,
    ) -> RayCluster {
        let api = self.clusters();
        let check = &check;
        eventually(WAIT, &format!("{name}: {what}"), || {
            let api = api.clone();
            async move {
                let cluster = api.get_opt(name).await.expect("get RayCluster")?;
                check(&cluster).then_some(cluster)
            }
        })
        .await
    }

    async fn wait_ready(&self, name: &str) -> RayCluster {
        self.wait_cluster(name, "state ready", |c| {
            c.status.as_ref().and_then(|s| s.state) == Some(ClusterState::Ready)
        })
        .await
    }

    /// Every Pod of the cluster, terminating ones included.
    async fn ray_pods(&self, name: &str) -> Vec<Pod> {
        self.pods()
            .list(&ListParams::default().labels(&format!("ray.io/cluster={name}")))
            .await
            .expect("list Pods")
            .items
            .into_iter()
            .filter(|p| {
                let node_type = p
                    .labels()
                    .get("ray.io/node-type")
                    .cloned()
                    .unwrap_or_default();
                node_type == "head" || node_type == "worker"
            })
            .collect()
    }

    /// Live (not terminating) worker Pods, sorted by name.
    async fn workers(&self, name: &str) -> Vec<Pod> {
        let mut workers: Vec<Pod> = self
            .ray_pods(name)
            .await
            .into_iter()
            .filter(|p| p.labels().get("ray.io/node-type").map(String::as_str) == Some("worker"))
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        workers.sort_by_key(|p| p.name_any());
        workers
    }

    /// Waits until exactly `count` workers exist and nothing else of the cluster terminates.
    async fn wait_workers(&self, name: &str, count: usize) -> Vec<Pod> {
        eventually(
            WAIT,
            &format!("{name}: {count} worker Pods"),
            || async move {
                let all = self.ray_pods(name).await;
                let settled = all.iter().all(|p| p.metadata.deletion_timestamp.is_none());
                let workers = self.workers(name).await;
                (settled && workers.len() == count).then_some(workers)
            },
        )
        .await
    }

    async fn events(&self, reason: &str) -> Vec<Event> {
        fixture::events_with_reason(&self.client, &self.ns, reason).await
    }

    async fn wait_event(&self, reason: &str) -> Event {
        eventually(WAIT, &format!("an Event {reason}"), || async move {
            self.events(reason).await.into_iter().next()
        })
        .await
    }

    async fn patch_spec(&self, name: &str, spec: Value) {
        self.clusters()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": spec})),
            )
            .await
            .expect("patch RayCluster");
    }

    async fn patch_group(&self, name: &str, group: usize, fields: Value) {
        let cluster = self.cluster(name).await;
        let mut groups = serde_json::to_value(&cluster.spec.worker_group_specs).expect("json");
        for (k, v) in fields.as_object().cloned().unwrap_or_default() {
            groups[group][k] = v;
        }
        self.patch_spec(name, json!({"workerGroupSpecs": groups}))
            .await;
    }
}

fn condition(cluster: &RayCluster, type_: &str) -> (String, String) {
    let conditions = cluster
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    conditions::find(&conditions, type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default()
}

fn label<'a>(pod: &'a Pod, key: &str) -> &'a str {
    pod.labels()
        .get(key)
        .map(String::as_str)
        .unwrap_or_default()
}

/// The cluster is ready and its Pods and Services are exactly what the pure builders make (the
/// builders' own unit tests pin those to KubeRay's output).
async fn assert_realised(f: &Fixture, name: &str) {
    let ready = f.wait_ready(name).await;
    let cluster = f.cluster(name).await;
    let options = BuildOptions::default();
    let pods = f.ray_pods(name).await;
    let heads: Vec<&Pod> = pods
        .iter()
        .filter(|p| label(p, "ray.io/node-type") == "head")
        .collect();
    assert_eq!(heads.len(), 1, "{name}: one head Pod");
    let head = heads[0];
    let expected = head_pod(&cluster, &options, &spec_hash(&cluster.spec)).expect("head builds");
    assert_eq!(
        head.metadata.generate_name, expected.metadata.generate_name,
        "{name}"
    );
    assert!(head.name_any().starts_with(&format!("{name}-head-")));
    assert_eq!(
        head.metadata.labels, expected.metadata.labels,
        "{name}: head labels"
    );
    assert_contains(
        &json!(expected.metadata.annotations),
        &json!(head.metadata.annotations),
        &format!("{name} head annotations"),
    );
    assert_contains(
        &json!(expected.spec),
        &json!(head.spec),
        &format!("{name} head spec"),
    );
    let owner = &head.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("RayCluster", name, Some(true))
    );

    for group in cluster.spec.worker_group_specs.iter().flatten() {
        let members: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                label(p, "ray.io/node-type") == "worker"
                    && label(p, "ray.io/group") == group.group_name
            })
            .collect();
        assert_eq!(
            members.len() as i32,
            desired_workers(group),
            "{name}/{}: worker count",
            group.group_name
        );
        for pod in members {
            let replica = WorkerReplica {
                replica_name: pod
                    .labels()
                    .get("ray.io/worker-group-replica-name")
                    .cloned(),
                replica_index: label(pod, "ray.io/worker-group-replica-index")
                    .parse()
                    .expect("index"),
                host_index: pod
                    .labels()
                    .get("ray.io/replica-host-index")
                    .map_or(0, |v| v.parse().expect("host")),
            };
            let expected = worker_pod(&cluster, group, &replica, &options).expect("worker builds");
            assert!(
                pod.name_any()
                    .starts_with(&names::worker_pod_generate_name(name, &group.group_name))
            );
            assert_eq!(
                pod.metadata.labels, expected.metadata.labels,
                "{name}: worker labels"
            );
            assert_contains(
                &json!(expected.spec),
                &json!(pod.spec),
                &format!("{name} worker {}", pod.name_any()),
            );
        }
    }

    let head_service = f
        .services()
        .get(&names::head_service_name(name, &cluster.spec))
        .await
        .expect("the head Service exists");
    let expected = service::head_service(&cluster, &options).expect("service builds");
    let ports = |s: &Service| -> BTreeMap<String, i32> {
        s.spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .map(|p| (p.name.clone().unwrap_or_default(), p.port))
            .collect()
    };
    assert_eq!(
        ports(&head_service),
        ports(&expected),
        "{name}: head Service ports"
    );
    let spec = head_service.spec.clone().expect("spec");
    let expected_spec = expected.spec.clone().expect("spec");
    assert_eq!(spec.selector, expected_spec.selector);
    assert_eq!(
        spec.cluster_ip.as_deref() == Some("None"),
        expected_spec.cluster_ip.as_deref() == Some("None")
    );
    assert_eq!(head_service.owner_references()[0].name, name);

    let status = ready.status.clone().expect("status");
    let desired: i32 = cluster
        .spec
        .worker_group_specs
        .iter()
        .flatten()
        .map(desired_workers)
        .sum();
    assert_eq!(status.desired_worker_replicas, Some(desired));
    assert_eq!(status.ready_worker_replicas, Some(desired));
    assert_eq!(status.available_worker_replicas, Some(desired));
    assert_eq!(status.observed_generation, cluster.metadata.generation);
    assert!(status.desired_cpu.is_some() && status.desired_memory.is_some());
    assert_eq!(
        condition(&ready, "HeadPodReady"),
        ("True".into(), "HeadPodRunningAndReady".into())
    );
    assert_eq!(
        condition(&ready, "RayClusterProvisioned"),
        ("True".into(), "AllPodRunningAndReadyFirstTime".into())
    );
    assert_eq!(condition(&ready, "RayClusterSuspended").0, "False");
    assert!(conditions::find(&status.conditions, "ReplicaFailure").is_none());
    let head_info = status.head.expect("head info");
    assert_eq!(
        head_info.pod_name.as_deref(),
        Some(head.name_any().as_str())
    );
    let pod_ip = f
        .pods()
        .get(&head.name_any())
        .await
        .expect("head")
        .status
        .and_then(|s| s.pod_ip);
    assert!(pod_ip.is_some(), "kwok gives the head an IP");
    assert_eq!(head_info.pod_ip, pod_ip);
    assert_eq!(head_info.service_name, head_service.metadata.name);
    let endpoints = status.endpoints.expect("endpoints");
    for (port_name, port) in ports(&head_service) {
        assert_eq!(
            endpoints.get(&port_name),
            Some(&port.to_string()),
            "{name}: endpoint {port_name}"
        );
    }
}

#[tokio::test]
async fn every_kuberay_sample_cluster_is_realised_as_kuberay_would() {
    let dir = support::kuberay_samples_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("samples")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .filter(|p| documents(p).iter().any(is_raycluster))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "KubeRay's RayCluster samples: {files:?}");
    let checks = files.into_iter().map(|file| async move {
        let f = fixture("rc-kuberay").await;
        for name in f.apply_file(&file).await {
            assert_realised(&f, &name).await;
        }
    });
    futures::future::join_all(checks).await;
}

#[tokio::test]
async fn the_minimal_sample_has_kuberays_exact_command_env_probes_and_service() {
    let f = fixture("rc-exact").await;
    let names = f
        .apply_file(&support::kuberay_samples_dir().join("ray-cluster.sample.yaml"))
        .await;
    assert_eq!(names, ["raycluster-kuberay"]);
    f.wait_ready("raycluster-kuberay").await;
    let pods = f.ray_pods("raycluster-kuberay").await;
    let head = pods
        .iter()
        .find(|p| label(p, "ray.io/node-type") == "head")
        .expect("head");
    let ray = &head.spec.as_ref().expect("spec").containers[0];
    assert_eq!(
        ray.command.clone().unwrap_or_default(),
        ["/bin/bash", "-c", "--"]
    );
    assert_eq!(
        ray.args.clone().unwrap_or_default(),
        [
            "ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; ray start --head  --block  --dashboard-agent-listen-port=52365  --dashboard-host=0.0.0.0  --memory=5368709120  --metrics-export-port=8080  --num-cpus=1 "
        ]
    );
    let env: Vec<&str> = ray.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(
        env,
        [
            "RAY_CLUSTER_NAME",
            "RAY_CLUSTER_NAMESPACE",
            "RAY_CLOUD_INSTANCE_ID",
            "RAY_NODE_TYPE_NAME",
            "KUBERAY_GEN_RAY_START_CMD",
            "RAY_PORT",
            "RAY_ADDRESS",
            "RAY_USAGE_STATS_KUBERAY_IN_USE",
            "RAY_USAGE_STATS_EXTRA_TAGS",
            "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE"
        ]
    );
    let probe = ray.readiness_probe.clone().expect("readiness");
    assert_eq!(
        probe.exec.and_then(|e| e.command).unwrap_or_default(),
        [
            "bash",
            "-c",
            "wget --tries 1 -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep success && wget --tries 1 -T 10 -q -O- http://localhost:8265/api/gcs_healthz | grep success"
        ]
    );
    let labels = head.labels();
    assert_eq!(labels["ray.io/identifier"], "raycluster-kuberay-head");
    assert_eq!(labels["ray.io/group"], "headgroup");
    assert_eq!(labels["app.kubernetes.io/created-by"], "kuberay-operator");

    let worker = pods
        .iter()
        .find(|p| label(p, "ray.io/node-type") == "worker")
        .expect("worker");
    assert!(
        worker
            .name_any()
            .starts_with("raycluster-kuberay-workergroup-worker-")
    );
    let worker_spec = worker.spec.as_ref().expect("spec");
    assert_eq!(
        worker_spec.init_containers.as_ref().expect("init")[0].name,
        "wait-gcs-ready"
    );
    assert_eq!(
        worker_spec.containers[0].args.clone().unwrap_or_default(),
        [format!(
            "ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; ray start  --address=raycluster-kuberay-head-svc.{}.svc.cluster.local:6379  --block  --dashboard-agent-listen-port=52365  --memory=1073741824  --metrics-export-port=8080  --num-cpus=1 ",
            f.ns
        )]
    );
    assert_eq!(label(worker, "ray.io/worker-group-replica-index"), "0");

    let svc = f
        .services()
        .get("raycluster-kuberay-head-svc")
        .await
        .expect("head Service");
    let spec = svc.spec.expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.publish_not_ready_addresses, Some(true));
    let ports: Vec<(String, i32, String)> = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            (
                p.name.unwrap_or_default(),
                p.port,
                p.app_protocol.unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [
            ("client".to_owned(), 10001, "tcp".to_owned()),
            ("dashboard".into(), 8265, "tcp".into()),
            ("gcs-server".into(), 6379, "tcp".into()),
            ("metrics".into(), 8080, "tcp".into())
        ]
    );
    let status = f
        .cluster("raycluster-kuberay")
        .await
        .status
        .expect("status");
    assert_eq!(status.desired_cpu.map(|q| q.0), Some("2".into()));
    assert_eq!(status.desired_memory.map(|q| q.0), Some("6Gi".into()));
    assert_eq!(status.desired_gpu.map(|q| q.0), Some("0".into()));
    assert_eq!(
        (status.min_worker_replicas, status.max_worker_replicas),
        (Some(1), Some(5))
    );
    assert!(
        status
            .state_transition_times
            .expect("times")
            .contains_key("ready")
    );
    f.wait_event("CreatedHeadPod").await;
    f.wait_event("CreatedWorkerPod").await;
    f.wait_event("CreatedService").await;
}

#[tokio::test]
async fn project_samples_are_realised_with_autoscaler_rbac_ingress_and_multi_host_and_alpha_is_refused()
 {
    let f = fixture("rc-project").await;
    let names = f.apply_file(&project_sample("ray-cluster.yaml")).await;
    assert_eq!(
        names,
        [
            "raycluster-autoscaled",
            "raycluster-gcs-ft",
            "raycluster-alpha"
        ]
    );
    for name in &names {
        if validate::validate(&f.cluster(name).await).is_ok() {
            assert_realised(&f, name).await;
        }
    }

    // Autoscaler: sidecar, ServiceAccount, Role and RoleBinding owned by the cluster.
    let pods = f.ray_pods("raycluster-autoscaled").await;
    let head = pods
        .iter()
        .find(|p| label(p, "ray.io/node-type") == "head")
        .expect("head");
    let head_spec = head.spec.clone().expect("spec");
    assert_eq!(
        head_spec.service_account_name.as_deref(),
        Some("raycluster-autoscaled")
    );
    assert_eq!(head_spec.restart_policy.as_deref(), Some("Never"));
    let autoscaler = head_spec
        .containers
        .iter()
        .find(|c| c.name == "autoscaler")
        .expect("sidecar");
    assert_eq!(
        autoscaler.args.clone().unwrap_or_default(),
        ["echo starting the autoscaler; $KUBERAY_GEN_AUTOSCALER_START_CMD"]
    );
    let sa = f
        .api::<ServiceAccount>()
        .get("raycluster-autoscaled")
        .await
        .expect("ServiceAccount");
    let role = f
        .api::<Role>()
        .get("raycluster-autoscaled")
        .await
        .expect("Role");
    let binding = f
        .api::<RoleBinding>()
        .get("raycluster-autoscaled")
        .await
        .expect("RoleBinding");
    for owners in [
        sa.owner_references(),
        role.owner_references(),
        binding.owner_references(),
    ] {
        assert_eq!(owners[0].name, "raycluster-autoscaled");
    }
    assert_eq!(
        binding.subjects.expect("subjects")[0].name,
        "raycluster-autoscaled"
    );
    let env: Vec<&str> = head_spec.containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert!(
        env.starts_with(&[
            "RAY_enable_autoscaler_v2",
            "RAY_AUTH_MODE",
            "RAY_AUTH_TOKEN"
        ]),
        "{env:?}"
    );
    let args = &head_spec.containers[0].args.clone().expect("args")[0];
    assert!(
        args.contains(" --no-monitor ")
            && args.contains(" --num-cpus=0 ")
            && args.contains(" --labels=example.com/node-role=head "),
        "{args}"
    );

    // Custom head Service, Ingress, headless Service for the multi-host group.
    let custom = f
        .services()
        .get("raycluster-autoscaled-head")
        .await
        .expect("custom head Service");
    assert_eq!(custom.labels()["example.com/exposed"], "dashboard");
    assert_eq!(custom.annotations()["example.com/team"], "ml-platform");
    assert_ne!(
        custom.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()),
        Some("None")
    );
    let ingress = f
        .api::<Ingress>()
        .get("raycluster-autoscaled-head-ingress")
        .await
        .expect("Ingress");
    let backend = &ingress.spec.expect("spec").rules.expect("rules")[0]
        .http
        .clone()
        .expect("http")
        .paths[0]
        .backend;
    assert_eq!(
        backend.service.as_ref().map(|s| s.name.as_str()),
        Some("raycluster-autoscaled-head")
    );
    let headless = f
        .services()
        .get("raycluster-autoscaled-headless")
        .await
        .expect("headless Service");
    assert_eq!(
        headless.spec.and_then(|s| s.cluster_ip).as_deref(),
        Some("None")
    );
    let multi: Vec<&Pod> = pods
        .iter()
        .filter(|p| label(p, "ray.io/group") == "multi-host")
        .collect();
    assert_eq!(multi.len(), 2);
    assert_eq!(
        label(multi[0], "ray.io/worker-group-replica-name"),
        label(multi[1], "ray.io/worker-group-replica-name")
    );
    let mut hosts: Vec<&str> = multi
        .iter()
        .map(|p| label(p, "ray.io/replica-host-index"))
        .collect();
    hosts.sort();
    assert_eq!(hosts, ["0", "1"]);

    // GCS fault tolerance: finalizer and Redis wiring on the head.
    let ft = f.cluster("raycluster-gcs-ft").await;
    assert!(
        ft.finalizers()
            .contains(&"ray.io/gcs-ft-redis-cleanup-finalizer".to_owned())
    );
    let ft_head = f
        .ray_pods("raycluster-gcs-ft")
        .await
        .into_iter()
        .find(|p| label(p, "ray.io/node-type") == "head")
        .expect("head");
    assert_eq!(
        ft_head.annotations()["ray.io/external-storage-namespace"],
        "raycluster-gcs-ft"
    );
    let ft_env: Vec<String> = ft_head.spec.expect("spec").containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| e.name.clone())
        .collect();
    assert_eq!(
        ft_env[..4],
        [
            "RAY_external_storage_namespace",
            "RAY_REDIS_ADDRESS",
            "REDIS_USERNAME",
            "REDIS_PASSWORD"
        ]
    );

    // The alpha cluster needs feature gates: refused, with a Warning and nothing created.
    let refused = f.wait_event("InvalidRayClusterSpec").await;
    assert_eq!(
        refused.involved_object.name.as_deref(),
        Some("raycluster-alpha")
    );
    assert!(f.ray_pods("raycluster-alpha").await.is_empty());
    assert!(
        f.cluster("raycluster-alpha").await.status.is_none(),
        "no status for a refused cluster"
    );
}

/// A small cluster without autoscaling: `replicas` workers of group `workers`.
fn small_cluster(name: &str, replicas: i32, extra_spec: Value) -> Value {
    let mut doc = json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
        "spec": {
            "rayVersion": "2.52.0",
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
                "name": "ray-head", "image": "rayproject/ray:2.52.0",
                "resources": {"limits": {"cpu": "1", "memory": "2Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}}}]}}},
            "workerGroupSpecs": [{"groupName": "workers", "replicas": replicas, "minReplicas": 0, "maxReplicas": 5,
                "rayStartParams": {}, "template": {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.52.0",
                    "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}}]
        }
    });
    for (k, v) in extra_spec.as_object().cloned().unwrap_or_default() {
        doc["spec"][k] = v;
    }
    doc
}

#[tokio::test]
async fn scaling_follows_replicas_and_workers_to_delete_removes_exactly_the_named_pods() {
    let f = fixture("rc-scale").await;
    let name = f.create_cluster(small_cluster("scale", 1, json!({}))).await;
    f.wait_ready(&name).await;

    f.patch_group(&name, 0, json!({"replicas": 3})).await;
    let workers = f.wait_workers(&name, 3).await;
    let mut indices: Vec<&str> = workers
        .iter()
        .map(|p| label(p, "ray.io/worker-group-replica-index"))
        .collect();
    indices.sort();
    assert_eq!(indices, ["0", "1", "2"]);
    f.wait_cluster(&name, "3 ready workers", |c| {
        c.status.as_ref().and_then(|s| s.ready_worker_replicas) == Some(3)
    })
    .await;

    // Above maxReplicas: clamped.
    f.patch_group(&name, 0, json!({"replicas": 9})).await;
    f.wait_workers(&name, 5).await;
    f.patch_group(&name, 0, json!({"replicas": 3})).await;
    let workers = f.wait_workers(&name, 3).await;

    let doomed: Vec<String> = workers[..2].iter().map(|p| p.name_any()).collect();
    let survivor = workers[2].name_any();
    f.patch_group(
        &name,
        0,
        json!({"replicas": 1, "scaleStrategy": {"workersToDelete": doomed}}),
    )
    .await;
    let left = f.wait_workers(&name, 1).await;
    assert_eq!(left[0].name_any(), survivor, "exactly the named Pods went");
    let cluster = f.cluster(&name).await;
    let group = &cluster.spec.worker_group_specs.expect("groups")[0];
    assert_eq!(
        group
            .scale_strategy
            .as_ref()
            .and_then(|s| s.workers_to_delete.as_ref())
            .map(Vec::len),
        Some(2),
        "workersToDelete belongs to the autoscaler: never cleared"
    );
    // The list stays; Pods of that name are gone, so nothing more happens.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(f.workers(&name).await.len(), 1);
    f.wait_event("DeletedWorkerPod").await;

    f.patch_group(
        &name,
        0,
        json!({"replicas": 0, "scaleStrategy": {"workersToDelete": []}}),
    )
    .await;
    f.wait_workers(&name, 0).await;
    f.wait_cluster(&name, "no desired workers", |c| {
        c.status.as_ref().and_then(|s| s.desired_worker_replicas) == Some(0)
    })
    .await;
}

#[tokio::test]
async fn a_deleted_or_failed_worker_is_replaced_and_a_settled_cluster_is_quiet() {
    let f = fixture("rc-replace").await;
    let name = f
        .create_cluster(small_cluster("replace", 2, json!({})))
        .await;
    f.wait_ready(&name).await;
    let before = f.wait_workers(&name, 2).await;

    // A settled cluster writes nothing: our status writes do not trigger further passes.
    let settled = f.cluster(&name).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let later = f.cluster(&name).await;
    assert_eq!(
        later.resource_version(),
        settled.resource_version(),
        "no status churn: {}\n---\n{}",
        serde_json::to_string_pretty(&settled).unwrap_or_default(),
        serde_json::to_string_pretty(&later).unwrap_or_default()
    );

    let victim = before[0].name_any();
    f.pods()
        .delete(&victim, &DeleteParams::default())
        .await
        .expect("delete worker");
    let after = eventually(WAIT, "a replacement worker", || async {
        let workers = f.workers(&name).await;
        (workers.len() == 2 && workers.iter().all(|p| p.name_any() != victim)).then_some(workers)
    })
    .await;
    assert!(after.iter().any(|p| p.name_any() == before[1].name_any()));

    // A Pod that failed for good is deleted and replaced.
    let failed = after[0].name_any();
    f.pods()
        .patch_status(
            &failed,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": "Failed"}})),
        )
        .await
        .expect("mark failed");
    eventually(WAIT, "the failed worker to be replaced", || async {
        let workers = f.workers(&name).await;
        (workers.len() == 2 && workers.iter().all(|p| p.name_any() != failed)).then_some(())
    })
    .await;
    f.wait_event("DeletedWorkerPod").await;

    // A lost head is created again; the head conditions follow it.
    let head = f
        .ray_pods(&name)
        .await
        .into_iter()
        .find(|p| label(p, "ray.io/node-type") == "head")
        .expect("head");
    f.pods()
        .delete(&head.name_any(), &DeleteParams::default())
        .await
        .expect("delete head");
    let old_head = head.name_any();
    let cluster = f
        .wait_cluster(&name, "a new ready head", |c| {
            let head = c.status.as_ref().and_then(|s| s.head.as_ref());
            let pod_name = head.and_then(|h| h.pod_name.as_deref());
            pod_name.is_some_and(|n| n != old_head) && condition(c, "HeadPodReady").0 == "True"
        })
        .await;
    assert_eq!(
        condition(&cluster, "RayClusterProvisioned").0,
        "True",
        "Provisioned stays True"
    );
}

#[tokio::test]
async fn suspend_deletes_every_pod_and_resume_brings_them_back() {
    let f = fixture("rc-suspend").await;
    let name = f.create_cluster(small_cluster("pause", 1, json!({}))).await;
    f.wait_ready(&name).await;

    f.patch_spec(&name, json!({"suspend": true})).await;
    let suspended = f
        .wait_cluster(&name, "Suspended", |c| {
            condition(c, "RayClusterSuspended").0 == "True"
        })
        .await;
    assert!(f.ray_pods(&name).await.is_empty());
    assert_eq!(
        suspended.status.as_ref().and_then(|s| s.state),
        Some(ClusterState::Suspended)
    );
    assert_eq!(condition(&suspended, "RayClusterSuspending").0, "False");
    assert_eq!(
        condition(&suspended, "RayClusterProvisioned"),
        ("False".into(), "RayClusterPodsProvisioning".into())
    );
    assert_eq!(
        condition(&suspended, "HeadPodReady"),
        ("False".into(), "HeadPodNotFound".into())
    );
    f.wait_event("DeletedPod").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        f.ray_pods(&name).await.is_empty(),
        "nothing comes back while suspended"
    );

    f.patch_spec(&name, json!({"suspend": false})).await;
    let resumed = f
        .wait_cluster(&name, "Provisioned again", |c| {
            condition(c, "RayClusterProvisioned").0 == "True"
        })
        .await;
    assert_eq!(condition(&resumed, "RayClusterSuspended").0, "False");
    f.wait_workers(&name, 1).await;
}

#[tokio::test]
async fn gcs_ft_cleanup_job_runs_on_delete_then_the_finalizer_goes() {
    let f = fixture("rc-gcsft").await;
    let names = f
        .apply_file(&support::kuberay_samples_dir().join("ray-cluster.external-redis.yaml"))
        .await;
    let name = names[0].clone();
    let ready = f.wait_ready(&name).await;
    assert!(
        ready
            .finalizers()
            .contains(&"ray.io/gcs-ft-redis-cleanup-finalizer".to_owned())
    );
    let uid = ready.uid().expect("uid");

    f.clusters()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    let jobs = f.api::<Job>();
    let job = eventually(WAIT, "the Redis cleanup Job", || {
        let jobs = jobs.clone();
        async move {
            jobs.get_opt("raycluster-external-redis-redis-cleanup")
                .await
                .expect("get Job")
        }
    })
    .await;
    assert_eq!(job.labels()["ray.io/node-type"], "redis-cleanup");
    let template = job.spec.clone().expect("spec").template;
    let container = &template.spec.expect("pod").containers[0];
    let env: Vec<&str> = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert!(
        env.contains(&"RAY_REDIS_ADDRESS") && env.contains(&"REDIS_PASSWORD"),
        "{env:?}"
    );
    assert_eq!(
        container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "RAY_external_storage_namespace")
            .and_then(|e| e.value.clone()),
        Some(uid)
    );
    f.wait_event("CreatedRedisCleanupJob").await;
    // kube-controller-manager runs the Job, kwok completes its Pod, the finalizer goes.
    eventually(WAIT, "the RayCluster to be gone", || async {
        f.clusters()
            .get_opt(&name)
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        f.events("ForceDeletedStuckCluster").await.is_empty(),
        "the cleanup finished in time"
    );
}

#[tokio::test]
async fn gcs_ft_deletion_never_hangs_on_a_stuck_head_pod() {
    let f = fixture("rc-stuck").await;
    let mut doc = small_cluster(
        "stuck",
        0,
        json!({"gcsFaultToleranceOptions": {"redisAddress": "127.0.0.1:1"}}),
    );
    doc["metadata"]["annotations"] = json!({"ray.io/gcs-ft-deletion-timeout": "4"});
    let name = f.create_cluster(doc).await;
    f.wait_ready(&name).await;
    let head = f.ray_pods(&name).await.into_iter().next().expect("head");
    // A finalizer nobody removes: the head Pod stays Terminating.
    f.pods()
        .patch(
            &head.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": ["raypipe.dev/test-hold"]}})),
        )
        .await
        .expect("hold the head");

    f.clusters()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    let event = f.wait_event("ForceDeletedStuckCluster").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    eventually(WAIT, "the RayCluster to be gone", || async {
        f.clusters()
            .get_opt(&name)
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    f.pods()
        .patch(
            &head.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release the head");
}

#[tokio::test]
async fn deleting_a_cluster_removes_what_it_owned() {
    let f = fixture("rc-gc").await;
    let mut doc = small_cluster("owned", 1, json!({}));
    doc["metadata"]["annotations"] = json!({"ray.io/enable-serve-service": "true"});
    doc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"] = json!([{"name": "serve", "containerPort": 8000}, {"name": "dashboard", "containerPort": 8265}]);
    let name = f.create_cluster(doc).await;
    f.wait_ready(&name).await;
    let serve = f
        .services()
        .get("owned-serve-svc")
        .await
        .expect("serve Service");
    assert_eq!(serve.labels()["ray.io/serve"], "owned-serve");
    assert_eq!(
        serve.spec.and_then(|s| s.selector).expect("selector"),
        BTreeMap::from([("ray.io/cluster".to_owned(), name.clone())])
    );

    f.clusters()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    eventually(WAIT, "Pods and Services garbage-collected", || async {
        let pods = f.ray_pods(&name).await;
        let services = f
            .services()
            .list(&ListParams::default())
            .await
            .expect("list")
            .items;
        (pods.is_empty() && services.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn clusters_of_another_manager_are_left_alone_and_recreate_replaces_every_pod() {
    let f = fixture("rc-misc").await;
    let mut kueue = small_cluster("kueue", 1, json!({}));
    kueue["spec"]["managedBy"] = json!("kueue.x-k8s.io/multikueue");
    let kueue = f.create_cluster(kueue).await;

    let name = f
        .create_cluster(small_cluster(
            "recreate",
            1,
            json!({"upgradeStrategy": {"type": "Recreate"}}),
        ))
        .await;
    f.wait_ready(&name).await;
    let before: Vec<String> = f
        .ray_pods(&name)
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    f.patch_spec(&name, json!({"rayVersion": "2.52.1"})).await;
    eventually(WAIT, "all Pods recreated", || async {
        let pods = f.ray_pods(&name).await;
        let fresh = pods.len() == 2
            && pods.iter().all(|p| {
                p.metadata.deletion_timestamp.is_none() && !before.contains(&p.name_any())
            });
        fresh.then_some(())
    })
    .await;

    assert!(
        f.ray_pods(&kueue).await.is_empty(),
        "managedBy another controller: untouched"
    );
    assert!(f.cluster(&kueue).await.status.is_none());
}

#[tokio::test]
async fn a_pod_the_api_server_refuses_sets_replica_failure_until_it_can_be_created() {
    let f = fixture("rc-quota").await;
    f.apply(&json!({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "one-pod"},
        "spec": {"hard": {"pods": "1"}}
    }))
    .await;
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> = f.api();
    eventually(WAIT, "the quota to be counted", || {
        let quotas = quotas.clone();
        async move {
            let quota = quotas.get("one-pod").await.expect("get quota");
            quota.status.and_then(|s| s.hard).map(|_| ())
        }
    })
    .await;

    let name = f.create_cluster(small_cluster("quota", 1, json!({}))).await;
    let failing = f
        .wait_cluster(&name, "ReplicaFailure", |c| {
            condition(c, "ReplicaFailure") == ("True".into(), "FailedCreateWorkerPod".into())
        })
        .await;
    assert_ne!(
        failing.status.as_ref().and_then(|s| s.state),
        Some(ClusterState::Ready)
    );
    f.wait_event("FailedToCreateWorkerPod").await;

    quotas
        .delete("one-pod", &DeleteParams::default())
        .await
        .expect("delete quota");
    let ready = f.wait_ready(&name).await;
    let conditions = ready.status.map(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions::find(&conditions, "ReplicaFailure").is_none(),
        "removed after a clean pass"
    );
}

/// `apiserver_request_total` summed by `verb resource/subresource`, from the API server's
/// metrics.
async fn api_requests(client: &kube::Client) -> BTreeMap<String, f64> {
    let text = client
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("a static request"),
        )
        .await
        .expect("API server metrics");
    let mut totals = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label_value = |key: &str| {
            labels
                .split(&format!("{key}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let key = format!(
            "{} {}/{}",
            label_value("verb"),
            label_value("resource"),
            label_value("subresource")
        );
        *totals.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    totals
}

fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The scale measurement of issue 4: N RayClusters (one head, three workers each) until all are
/// ready; prints the time, the test process' resident memory growth (the controller and its
/// caches; the control plane runs in other processes) and the API requests by kind.
/// `RAYPIPE_RAYCLUSTER_BENCH_CLUSTERS=1000 cargo test --test integration raycluster::scale -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: minutes of load on the local control plane"]
async fn scale_benchmark() {
    let clusters: usize = std::env::var("RAYPIPE_RAYCLUSTER_BENCH_CLUSTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let f = fixture("rc-bench").await;
    let doc = |i: usize| {
        let mut doc = small_cluster(&format!("bench-{i}"), 3, json!({}));
        // Small Pods: a thousand clusters must fit on kwok's one fake Node (1000 CPU, 1 TiB).
        let small = json!({"limits": {"cpu": "100m", "memory": "128Mi"}});
        doc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"] =
            small.clone();
        doc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"] =
            small;
        doc
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = resident_kib();
    let requests_before = api_requests(&f.client).await;
    let started = std::time::Instant::now();
    let api = f.clusters();
    use futures::StreamExt as _;
    futures::stream::iter(0..clusters)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            let doc = doc(i);
            async move {
                let cluster: RayCluster = serde_json::from_value(doc).expect("a RayCluster");
                api.create(&kube::api::PostParams::default(), &cluster)
                    .await
                    .expect("create RayCluster");
            }
        })
        .await;
    let created = started.elapsed();
    let mut last_report = std::time::Instant::now();
    loop {
        let list = api.list(&ListParams::default()).await.expect("list");
        let ready = list
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.state) == Some(ClusterState::Ready))
            .count();
        if ready == clusters {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            println!("{:?}: {ready}/{clusters} ready", started.elapsed());
            last_report = std::time::Instant::now();
        }
        assert!(started.elapsed() < Duration::from_secs(3600), "timed out");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_ready = started.elapsed();
    // Settle, then measure the idle controller.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_after = resident_kib();
    let requests_after = api_requests(&f.client).await;
    let pods = clusters * 4;
    println!("clusters: {clusters}, pods: {pods}");
    println!("created in {created:?}; all ready after {all_ready:?}");
    println!(
        "resident memory: {rss_before} KiB before, {rss_after} KiB after ({:.3} MiB per managed Pod)",
        (rss_after.saturating_sub(rss_before)) as f64 / 1024.0 / pods as f64
    );
    println!("API requests during the run (all clients), per cluster:");
    for (key, after) in &requests_after {
        let delta = after - requests_before.get(key).copied().unwrap_or(0.0);
        if delta >= clusters as f64 / 10.0 {
            println!("  {key:40} {:8.2}", delta / clusters as f64);
        }
    }
}

/// What "left exactly as it was" means for an object someone else owns.
fn untouched_parts<K: Resource + serde::Serialize>(object: &K) -> Value {
    let mut value = serde_json::to_value(object).expect("json");
    // The status is the API server's (a Pod's phase moves on its own); the rest is the owner's.
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
    }
    value
}

/// Issue 14, class 6: a Service of the head Service's name made by someone else is reported
/// (ServiceConflict in ReplicaFailure and a Warning event) and never written; a Service that
/// merely copies the head Service's labels is not taken for the head Service. Once the
/// foreign Service is gone the cluster makes its own.
#[tokio::test]
async fn a_foreign_service_of_a_childs_name_is_reported_and_never_taken_over() {
    let f = fixture("rc-foreign-svc").await;
    let services = f.services();
    for (name, labels) in [
        ("squat-head-svc", json!({"team": "other"})),
        (
            "lookalike",
            json!({"ray.io/cluster": "squat", "ray.io/node-type": "head", "team": "other"}),
        ),
    ] {
        let service: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "labels": labels, "annotations": {"owner": "other team"}},
            "spec": {"selector": {"app": "other"}, "ports": [{"name": "http", "port": 80}]}
        }))
        .expect("a Service");
        services
            .patch(
                name,
                &PatchParams::apply("other-team"),
                &Patch::Apply(&service),
            )
            .await
            .expect("the other team applies its Service");
    }
    let before_squat = untouched_parts(&services.get("squat-head-svc").await.expect("get"));
    let before_lookalike = untouched_parts(&services.get("lookalike").await.expect("get"));

    let name = f.create_cluster(small_cluster("squat", 0, json!({}))).await;
    let cluster = f
        .wait_cluster(&name, "ReplicaFailure ServiceConflict", |c| {
            condition(c, "ReplicaFailure") == ("True".into(), "ServiceConflict".into())
        })
        .await;
    let message = cluster
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, "ReplicaFailure"))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains("squat-head-svc"), "{message}");
    let event = f.wait_event("ServiceConflict").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        untouched_parts(&services.get("squat-head-svc").await.expect("get")),
        before_squat,
        "the foreign Service was modified"
    );

    services
        .delete("squat-head-svc", &DeleteParams::default())
        .await
        .expect("the other team deletes its Service");
    let ours = eventually(WAIT, "the cluster's own head Service", || {
        let services = services.clone();
        async move {
            services
                .get_opt("squat-head-svc")
                .await
                .expect("get")
                .filter(|s| !s.owner_references().is_empty())
        }
    })
    .await;
    assert_eq!(ours.owner_references()[0].kind, "RayCluster");
    assert_eq!(ours.owner_references()[0].controller, Some(true));
    assert_eq!(
        untouched_parts(&services.get("lookalike").await.expect("get")),
        before_lookalike,
        "the look-alike Service was modified"
    );
}

/// Issue 14, class 6: a Pod someone else made with the cluster's labels is neither counted as
/// the cluster's nor deleted when the cluster deletes all its Pods (suspension).
#[tokio::test]
async fn a_foreign_pod_with_the_clusters_labels_is_neither_adopted_nor_deleted() {
    let f = fixture("rc-foreign-pod").await;
    let name = f.create_cluster(small_cluster("host", 1, json!({}))).await;
    f.wait_ready(&name).await;
    let impostor: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "impostor", "labels": {
            "ray.io/cluster": name, "ray.io/node-type": "worker", "ray.io/group": "workers"}},
        "spec": {"containers": [{"name": "c", "image": "example/other:1"}]}
    }))
    .expect("a Pod");
    f.pods()
        .patch(
            "impostor",
            &PatchParams::apply("other-team"),
            &Patch::Apply(&impostor),
        )
        .await
        .expect("the other team creates its Pod");
    // The scheduler and kwok bind and run it (nodeName, status): only what we could have
    // changed is compared.
    let ours_to_keep = |p: &Pod| {
        json!({
            "uid": p.metadata.uid, "labels": p.metadata.labels,
            "annotations": p.metadata.annotations, "ownerReferences": p.metadata.owner_references,
            "containers": p.spec.as_ref().map(|s| &s.containers),
        })
    };
    let before = ours_to_keep(&f.pods().get("impostor").await.expect("get"));
    let owned = |pods: Vec<Pod>| -> Vec<Pod> {
        pods.into_iter()
            .filter(|p| !p.owner_references().is_empty())
            .collect()
    };

    f.patch_spec(&name, json!({"suspend": true})).await;
    f.wait_cluster(&name, "Suspended", |c| {
        condition(c, "RayClusterSuspended").0 == "True"
    })
    .await;
    assert!(owned(f.ray_pods(&name).await).is_empty());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = f
        .pods()
        .get_opt("impostor")
        .await
        .expect("get")
        .expect("the foreign Pod survives the suspension");
    assert!(after.metadata.deletion_timestamp.is_none());
    assert_eq!(ours_to_keep(&after), before, "the foreign Pod was modified");
}
