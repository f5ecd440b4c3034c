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
use raypipe::controllers::raycluster::Config;
use raypipe::controllers::raycluster::builders::pod::{WorkerReplica, head_pod, worker_pod};
use raypipe::controllers::raycluster::builders::{BuildOptions, service};
use raypipe::controllers::raycluster::status::desired_workers;
use raypipe::kuberay::{names, spec::spec_hash};
use raypipe::validation::validated as validate;
use serde_json::{Value, json};

use crate::support::{self, assert_contains, eventually, fixture};

mod batch;
mod benchmark;
mod deletion;
mod foreign;
mod isolation;
mod samples;
mod scaling;
mod takeover;

const WAIT: Duration = Duration::from_secs(90);

struct Fixture {
    client: kube::Client,
    ns: String,
    /// Stops the test's controllers when the fixture is dropped.
    _stop: fixture::Stopper,
}

/// A namespace with a RayCluster controller watching only it.
async fn fixture(prefix: &str) -> Fixture {
    fixture_with(
        prefix,
        Config {
            concurrency: 4,
            ..Config::default()
        },
    )
    .await
}

/// A namespace with a RayCluster controller of `config` watching only it.
async fn fixture_with(prefix: &str, config: Config) -> Fixture {
    let client = support::client().await;
    let ns = support::namespace(&client, prefix).await;
    let mut stop = fixture::Stopper::default();
    fixture::spawn_raycluster_controller(&client, &ns, config, &mut stop);
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

/// The CRD files (`<prefix>*.yaml` in `crd_dir`) of a Go module at `version`, fetched with
/// the ordinary `go` client and cached beside the control plane's binaries.
fn go_module_crd_files(
    module: &str,
    version: &str,
    crd_dir: &str,
    prefix: &str,
) -> Vec<std::path::PathBuf> {
    let short = module.rsplit('/').next().unwrap_or(module);
    let dir = raypipe::devenv::binaries::cache_root()
        .join(short)
        .join(version);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let listed = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.retain(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".yaml"))
        });
        files.sort();
        files
    };
    if !listed(&dir).is_empty() {
        return listed(&dir);
    }
    let output = std::process::Command::new("go")
        .args(["mod", "download", "-json", &format!("{module}@{version}")])
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .current_dir(&dir)
        .output()
        .expect("the go client (installed with the control plane's toolchain)");
    let info: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "go mod download {module}: {e}: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let module_dir = std::path::PathBuf::from(info["Dir"].as_str().expect("the module's Dir"));
    for file in listed(&module_dir.join(crd_dir)) {
        // Copied then renamed: a test binary fetching at the same time never reads half a file.
        let target = dir.join(file.file_name().expect("a file name"));
        let partial = dir.join(format!(".partial-{}", std::process::id()));
        std::fs::copy(&file, &partial)
            .and_then(|_| std::fs::rename(&partial, &target))
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
    listed(&dir)
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
    assert_realised_with(f, name, &BuildOptions::default()).await;
}

/// [`assert_realised`] for an operator whose Pod builder has these options (its gates).
async fn assert_realised_with(f: &Fixture, name: &str, options: &BuildOptions) {
    let ready = f.wait_ready(name).await;
    let cluster = f.cluster(name).await;
    let pods = f.ray_pods(name).await;
    let heads: Vec<&Pod> = pods
        .iter()
        .filter(|p| label(p, "ray.io/node-type") == "head")
        .collect();
    assert_eq!(heads.len(), 1, "{name}: one head Pod");
    let head = heads[0];
    let expected = head_pod(&cluster, options, &spec_hash(&cluster.spec)).expect("head builds");
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
            let expected = worker_pod(&cluster, group, &replica, options).expect("worker builds");
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
    let expected = service::head_service(&cluster, options).expect("service builds");
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
