//! The RayJob controller against a real API server, kube-controller-manager, kwok (Pods become
//! Running and Ready; Job Pods complete) and a real Ray head on 127.0.0.1, which stands in for
//! every RayCluster's head: the dashboard locator maps this test namespace's head Services to
//! it. Every test has its own namespace and its own namespace-scoped RayCluster and RayJob
//! controllers.
//!
//! The KubeRay samples run `python /home/ray/samples/sample_code.py`, a file a Pod gets from a
//! ConfigMap volume. The shared Ray head runs in a private mount namespace where a test
//! directory is bind-mounted at `/home/ray/samples` (see `support::ray_head`); the tests write
//! the ConfigMap's data, read back from the API server, into that directory. So the job really
//! runs the sample's code, with the sample's runtime environment (pip installs included).

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, ContainerState, ContainerStateTerminated, Event, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use raypipe::api::RayCluster;
use raypipe::api::rayjob::{JobDeploymentStatus, JobFailedReason, JobStatus, RayJob};
use raypipe::controllers::{raycluster, rayjob};
use raypipe::ray::{DashboardError, DashboardLocator, JobSubmitRequest, RayDashboardClient};
use serde_json::{Value, json};

use crate::support::{self, eventually, fixture};

/// The sample jobs install two pip packages into a fresh runtime environment first.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(300);
const WAIT: Duration = Duration::from_secs(90);

struct Fixture {
    client: kube::Client,
    ns: String,
    /// Stops the test's controllers when the fixture is dropped.
    _stop: fixture::Stopper,
}

/// A namespace with a RayCluster and a RayJob controller watching only it; the RayJob
/// controller's dashboard locator sends this namespace's head Services (the RayJob controller
/// locates nothing else; custom names such as `headService.metadata.name` included) to the
/// test Ray head.
async fn fixture(prefix: &str) -> Fixture {
    fixture_with(prefix, 4).await
}

/// Dashboards of clusters whose name starts with `silent-` point at a port that accepts
/// connections and never answers (a hung head).
async fn fixture_with(prefix: &str, concurrency: u16) -> Fixture {
    let head = support::ray_head();
    let client = support::client().await;
    let ns = support::namespace(&client, prefix).await;
    let mut stop = fixture::Stopper::default();
    tokio::spawn(raycluster::run(
        client.clone(),
        raycluster::Config {
            namespace: Some(ns.clone()),
            ..raycluster::Config::default()
        },
        stop.signal(),
    ));
    let url = head.dashboard_url().to_string();
    let silent = silent_dashboard();
    let mine = ns.clone();
    let locator = DashboardLocator::resolver(move |service| {
        if service.namespace != mine {
            return None;
        }
        Some(if service.name.starts_with("silent-") {
            silent.clone()
        } else {
            url.clone()
        })
    });
    tokio::spawn(rayjob::run(
        client.clone(),
        rayjob::Config {
            namespace: Some(ns.clone()),
            locator,
            concurrency,
            requeue: Duration::from_secs(1),
            ..rayjob::Config::default()
        },
        stop.signal(),
    ));
    Fixture {
        client,
        ns,
        _stop: stop,
    }
}

/// A listener that is never accepted from: connections succeed, requests hang.
fn silent_dashboard() -> String {
    static LISTENER: std::sync::OnceLock<std::net::TcpListener> = std::sync::OnceLock::new();
    let listener = LISTENER
        .get_or_init(|| std::net::TcpListener::bind("127.0.0.1:0").expect("bind a silent port"));
    format!("http://{}", listener.local_addr().expect("address"))
}

fn dashboard() -> RayDashboardClient {
    support::ray_head()
        .client(Duration::from_secs(30))
        .expect("a dashboard client")
}

fn documents(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    raypipe::api::yaml::documents(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

impl Fixture {
    fn jobs(&self) -> Api<RayJob> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
    fn clusters(&self) -> Api<RayCluster> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn apply(&self, doc: &Value) {
        fixture::apply(&self.client, &self.ns, doc, "rayjob-test").await;
    }

    async fn job(&self, name: &str) -> RayJob {
        self.jobs().get(name).await.expect("get RayJob")
    }

    /// Waits until the RayJob's deployment status is `want` (any terminal status that is not
    /// `want` fails at once, with the status in the message).
    async fn wait_for(&self, name: &str, want: JobDeploymentStatus, timeout: Duration) -> RayJob {
        eventually(
            timeout,
            &format!("RayJob {name} to be {want:?}"),
            || async {
                let job = self.job(name).await;
                let status = job.status.clone().unwrap_or_default();
                match status.job_deployment_status {
                    Some(s) if s == want => Some(job),
                    Some(s) if s.is_terminal() => {
                        panic!("RayJob {name} ended {s:?}, not {want:?}: {status:?}")
                    }
                    _ => None,
                }
            },
        )
        .await
    }

    async fn events(&self, reason: &str) -> Vec<Event> {
        fixture::events_with_reason(&self.client, &self.ns, reason).await
    }

    async fn set_suspend(&self, name: &str, suspend: bool) {
        self.jobs()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"suspend": suspend}})),
            )
            .await
            .expect("patch suspend");
    }
}

/// Writes every key of a ConfigMap, as stored by the API server, into the samples directory
/// the Ray head sees as `/home/ray/samples`.
async fn mount_config_map(f: &Fixture, name: &str) {
    let cm = Api::<ConfigMap>::namespaced(f.client.clone(), &f.ns)
        .get(name)
        .await
        .expect("the sample's ConfigMap");
    let dir = support::ray_samples_dir();
    for (key, value) in cm.data.unwrap_or_default() {
        std::fs::write(dir.join(&key), value).expect("write a ConfigMap key");
    }
}

/// Applies a sample file: the ConfigMaps unchanged (and their data made visible to the Ray
/// head), then its RayJobs with one change, `submissionMode: HTTPMode` (kwok runs no
/// containers, so a K8sJobMode submitter Pod could not run `ray job submit`). Returns the
/// RayJob names.
async fn apply_sample(f: &Fixture, path: &std::path::Path, only: Option<&str>) -> Vec<String> {
    let docs = documents(path);
    for doc in docs.iter().filter(|d| d["kind"] == "ConfigMap") {
        f.apply(doc).await;
        mount_config_map(f, doc["metadata"]["name"].as_str().expect("name")).await;
    }
    let mut names = Vec::new();
    for doc in docs.iter().filter(|d| d["kind"] == "RayJob") {
        let name = doc["metadata"]["name"].as_str().expect("name").to_owned();
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let mut doc = doc.clone();
        doc["spec"]["submissionMode"] = json!("HTTPMode");
        f.apply(&doc).await;
        names.push(name);
    }
    names
}

/// Checks on the Ray head that the RayJob's Ray job ran and succeeded; returns its logs.
async fn assert_ray_job_succeeded(job: &RayJob) -> String {
    let status = job.status.clone().expect("status");
    assert_eq!(status.job_status, Some(JobStatus::Succeeded), "{status:?}");
    assert_eq!(status.succeeded, Some(1));
    assert_eq!(status.failed, Some(0));
    let job_id = status.job_id.expect("a job id");
    assert!(
        job_id.starts_with(&format!("{}-", job.name_any())),
        "{job_id}"
    );
    let details = dashboard()
        .get_job(&job_id)
        .await
        .expect("the Ray job exists");
    assert!(
        matches!(details.status, Some(raypipe::ray::JobStatus::Succeeded)),
        "{details:?}"
    );
    assert!(status.end_time.is_some() && status.start_time.is_some());
    let info = status.ray_job_info.expect("rayJobInfo");
    assert!(info.start_time.is_some() && info.end_time.is_some());
    dashboard().get_job_logs(&job_id).await.expect("logs")
}

#[tokio::test]
async fn kuberay_samples_run_to_complete_through_http_mode() {
    let f = fixture("rayjob-samples").await;
    let samples = support::kuberay_samples_dir();
    let mut names = apply_sample(&f, &samples.join("ray-job.sample.yaml"), None).await;
    names.extend(apply_sample(&f, &samples.join("ray-job.shutdown.yaml"), None).await);
    assert_eq!(names, ["rayjob-sample", "rayjob-sample-shutdown"]);

    let done = futures::future::join_all(
        names
            .iter()
            .map(|n| f.wait_for(n, JobDeploymentStatus::Complete, SAMPLE_TIMEOUT)),
    )
    .await;
    for job in &done {
        let logs = assert_ray_job_succeeded(job).await;
        // The sample's own output: the Counter actor saw the runtime env's variable.
        assert!(logs.contains("test_counter got 5"), "{logs}");
        let status = job.status.clone().expect("status");
        let cluster = status.ray_cluster_name.expect("cluster name");
        assert!(
            status
                .dashboard_url
                .as_deref()
                .is_some_and(|u| u == format!("{cluster}-head-svc.{}.svc.cluster.local:8265", f.ns)),
            "{:?}",
            status.dashboard_url
        );
        assert!(job.finalizers().iter().any(|x| x == rayjob::FINALIZER));
    }
    // No shutdown: the cluster stays. Shutdown after 10 s: the cluster goes.
    let kept = done[0]
        .status
        .clone()
        .and_then(|s| s.ray_cluster_name)
        .expect("name");
    let shut = done[1]
        .status
        .clone()
        .and_then(|s| s.ray_cluster_name)
        .expect("name");
    eventually(
        WAIT,
        "the shutdown sample's RayCluster to be deleted",
        || async {
            f.clusters()
                .get_opt(&shut)
                .await
                .expect("get")
                .is_none()
                .then_some(())
        },
    )
    .await;
    let end = done[1]
        .status
        .clone()
        .and_then(|s| s.end_time)
        .expect("endTime")
        .0;
    let waited = k8s_openapi::jiff::Timestamp::now().duration_since(end);
    assert!(
        waited.as_secs() >= 10,
        "deleted only {waited:?} after the end, TTL is 10 s"
    );
    assert!(f.clusters().get_opt(&kept).await.expect("get").is_some());
    assert!(!f.events("DeletedRayCluster").await.is_empty());
    assert_eq!(f.events("CreatedRayCluster").await.len(), 2);
}

#[tokio::test]
async fn raypipe_sample_runs_and_its_deletion_rules_suspend_the_workers() {
    let f = fixture("rayjob-own-sample").await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/ray-job.yaml");
    let names = apply_sample(&f, &path, Some("rayjob-staged-cleanup")).await;
    assert_eq!(names, ["rayjob-staged-cleanup"]);
    let job = f
        .wait_for(
            "rayjob-staged-cleanup",
            JobDeploymentStatus::Complete,
            SAMPLE_TIMEOUT,
        )
        .await;
    let logs = assert_ray_job_succeeded(&job).await;
    assert!(logs.contains("hello from raypipe"), "{logs}");
    let details = dashboard()
        .get_job(
            job.status
                .as_ref()
                .and_then(|s| s.job_id.as_deref())
                .expect("id"),
        )
        .await
        .expect("job");
    assert_eq!(
        details
            .metadata
            .as_ref()
            .and_then(|m| m.get("team"))
            .map(String::as_str),
        Some("ml-platform")
    );
    // deletionRules: DeleteWorkers at once on SUCCEEDED (DeleteCluster only after 60 s).
    let cluster = job
        .status
        .and_then(|s| s.ray_cluster_name)
        .expect("cluster");
    eventually(WAIT, "the worker groups to be suspended", || async {
        let c = f
            .clusters()
            .get(&cluster)
            .await
            .expect("the cluster stays for 60 s");
        c.spec
            .worker_group_specs
            .iter()
            .flatten()
            .all(|g| g.suspend == Some(true))
            .then_some(())
    })
    .await;
    assert!(!f.events("UpdatedRayCluster").await.is_empty());
}

/// A file of the project's own `samples/`.
fn own_sample(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples")
        .join(file)
}

/// The `kind` document named `name` of a sample file, as written there.
fn sample_doc(path: &std::path::Path, kind: &str, name: &str) -> Value {
    documents(path)
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{}: no {kind} {name}", path.display()))
}

impl Fixture {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn head_pod(&self, cluster: &str) -> Pod {
        let selector = format!("ray.io/cluster={cluster},ray.io/node-type=head");
        eventually(WAIT, &format!("the head Pod of {cluster}"), || async {
            self.pods()
                .list(&ListParams::default().labels(&selector))
                .await
                .expect("list Pods")
                .items
                .into_iter()
                .next()
        })
        .await
    }

    /// kwok runs no containers: this is the kubelet reporting that the head's sidecar
    /// submitter exited 0 (its blocking `ray job submit` returns when the Ray job ends).
    async fn sidecar_exited(&self, pod: &str) {
        eventually(
            WAIT,
            "the sidecar submitter to be reported exited",
            || async {
                let mut head = self.pods().get(pod).await.expect("the head Pod");
                let statuses = head.status.as_mut()?.container_statuses.as_mut()?;
                let submitter = statuses
                    .iter_mut()
                    .find(|c| c.name == "ray-job-submitter")?;
                let started = submitter
                    .state
                    .as_ref()
                    .and_then(|s| s.running.as_ref())
                    .and_then(|r| r.started_at.clone());
                submitter.ready = false;
                submitter.started = Some(false);
                submitter.state = Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 0,
                        reason: Some("Completed".into()),
                        started_at: started,
                        finished_at: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
                // A conflict with kwok's own status write is retried.
                self.pods()
                    .replace_status(pod, &PostParams::default(), &head)
                    .await
                    .ok()
            },
        )
        .await;
    }
}

#[tokio::test]
async fn raypipe_sample_on_an_existing_cluster_runs_there_and_leaves_the_cluster_alone() {
    let f = fixture("rayjob-existing").await;
    // The cluster it selects is raycluster-autoscaled of samples/ray-cluster.yaml (token auth:
    // its Secret comes too); the three documents are applied as written.
    let cluster_file = own_sample("ray-cluster.yaml");
    f.apply(&sample_doc(
        &cluster_file,
        "Secret",
        "raycluster-autoscaled-auth",
    ))
    .await;
    f.apply(&sample_doc(
        &cluster_file,
        "RayCluster",
        "raycluster-autoscaled",
    ))
    .await;
    let doc = sample_doc(
        &own_sample("ray-job.yaml"),
        "RayJob",
        "rayjob-existing-cluster",
    );
    assert_eq!(doc["spec"]["submissionMode"], "HTTPMode");
    f.apply(&doc).await;

    let job = f
        .wait_for(
            "rayjob-existing-cluster",
            JobDeploymentStatus::Complete,
            SAMPLE_TIMEOUT,
        )
        .await;
    let logs = assert_ray_job_succeeded(&job).await;
    // print(ray.nodes()): the live head node, as the job's driver saw it.
    assert!(
        logs.contains("'NodeID'") && logs.contains("'Alive': True"),
        "{logs}"
    );
    let status = job.status.clone().expect("status");
    assert_eq!(status.job_id.as_deref(), Some("rayjob-existing-cluster-1"));
    let details = dashboard()
        .get_job("rayjob-existing-cluster-1")
        .await
        .expect("the Ray job under the sample's jobId");
    assert_eq!(
        details.entrypoint.as_deref(),
        doc["spec"]["entrypoint"].as_str()
    );
    assert_eq!(
        status.ray_cluster_name.as_deref(),
        Some("raycluster-autoscaled")
    );
    // The dashboard behind the cluster's custom head Service (headService.metadata.name).
    assert_eq!(
        status.dashboard_url,
        Some(format!(
            "raycluster-autoscaled-head.{}.svc.cluster.local:8265",
            f.ns
        ))
    );
    assert!(
        status
            .ray_cluster_status
            .and_then(|s| s.state)
            .is_some_and(|s| s == raypipe::api::raycluster::ClusterState::Ready)
    );

    // Nothing was created for the job: the selected cluster is the only one.
    let names = || async {
        f.clusters()
            .list(&ListParams::default())
            .await
            .expect("list RayClusters")
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>()
    };
    assert_eq!(names().await, ["raycluster-autoscaled"]);
    assert!(f.events("CreatedRayCluster").await.is_empty());

    // onSuccess DeleteSelf (TTL 0) is accepted with a clusterSelector, but KubeRay runs no
    // cleanup for a RayJob on an existing cluster: after a few passes the RayJob is still there.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let kept = f.job("rayjob-existing-cluster").await;
    assert_eq!(
        kept.status.and_then(|s| s.job_deployment_status),
        Some(JobDeploymentStatus::Complete)
    );
    // The cluster survives the job, untouched: not deleted, no worker group suspended, not
    // owned by the RayJob, still ready.
    let survives = |cluster: RayCluster| {
        assert!(cluster.meta().deletion_timestamp.is_none());
        assert!(cluster.owner_references().is_empty());
        assert!(
            cluster
                .spec
                .worker_group_specs
                .iter()
                .flatten()
                .all(|g| g.suspend != Some(true)),
            "{:?}",
            cluster.spec.worker_group_specs
        );
        assert_eq!(
            cluster.status.and_then(|s| s.state),
            Some(raypipe::api::raycluster::ClusterState::Ready)
        );
    };
    survives(
        f.clusters()
            .get("raycluster-autoscaled")
            .await
            .expect("get"),
    );
    for reason in ["DeletedRayCluster", "UpdatedRayCluster"] {
        assert!(f.events(reason).await.is_empty(), "{reason}");
    }

    // Deleting the RayJob (its finalizer is let go) leaves the cluster and its head as well.
    let head = f.head_pod("raycluster-autoscaled").await;
    f.jobs()
        .delete("rayjob-existing-cluster", &DeleteParams::default())
        .await
        .expect("delete the RayJob");
    eventually(WAIT, "the RayJob to be gone", || async {
        f.jobs()
            .get_opt("rayjob-existing-cluster")
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    survives(
        f.clusters()
            .get("raycluster-autoscaled")
            .await
            .expect("get"),
    );
    assert_eq!(names().await, ["raycluster-autoscaled"]);
    let still = f.pods().get(&head.name_any()).await.expect("the head Pod");
    assert_eq!(still.uid(), head.uid());
    assert!(still.meta().deletion_timestamp.is_none());
}

#[tokio::test]
async fn raypipe_sidecar_sample_submits_from_the_head_and_its_cluster_goes_after_the_ttl() {
    let f = fixture("rayjob-sidecar").await;
    let doc = sample_doc(&own_sample("ray-job.yaml"), "RayJob", "rayjob-sidecar");
    assert_eq!(doc["spec"]["submissionMode"], "SidecarMode");
    assert_eq!(doc["spec"]["shutdownAfterJobFinishes"], true);
    let entrypoint = doc["spec"]["entrypoint"]
        .as_str()
        .expect("entrypoint")
        .to_owned();
    let ttl = doc["spec"]["ttlSecondsAfterFinished"]
        .as_u64()
        .expect("ttlSecondsAfterFinished");
    f.apply(&doc).await;

    let (job_id, cluster) = eventually(WAIT, "a job id and a cluster name", || async {
        let status = f.job("rayjob-sidecar").await.status?;
        Some((status.job_id?, status.ray_cluster_name?))
    })
    .await;
    assert!(job_id.starts_with("rayjob-sidecar-"), "{job_id}");

    // The cluster made for the job: the submitter on its head, head restarts off (§3.3).
    // (The name is chosen one pass before the cluster is created.)
    let rc = eventually(WAIT, "the job's RayCluster", || async {
        f.clusters()
            .get_opt(&cluster)
            .await
            .expect("get RayCluster")
    })
    .await;
    assert_eq!(
        rc.annotations()
            .get("ray.io/disable-provisioned-head-restart")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(rc.labels()["ray.io/job-submission-mode"], "SidecarMode");
    let owner = &rc.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("RayJob", "rayjob-sidecar", Some(true))
    );

    // The head Pod carries the sidecar submitter exactly as §3.4 describes it.
    let head = f.head_pod(&cluster).await;
    let spec = head.spec.clone().expect("pod spec");
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["ray-head", "ray-job-submitter"]);
    let c = &spec.containers[1];
    assert_eq!(c.image.as_deref(), Some("rayproject/ray:2.52.0"));
    assert_eq!(
        c.command.clone().unwrap_or_default(),
        ["/bin/bash", "-ce", "--"]
    );
    let args = c.args.clone().unwrap_or_default();
    assert_eq!(args.len(), 1);
    // The head's dashboard on loopback (no port named dashboard: 8265), one blocking submit
    // (no status check, no --no-wait, no log follow: the container is never restarted).
    let expected = format!(
        " \"http://localhost:8265/api/gcs_healthz\" >/dev/null 2>&1 ; do echo \"Waiting for Ray Dashboard GCS to become healthy at http://127.0.0.1:8265 ...\" ; sleep 2 ; done ; ray job submit --address http://127.0.0.1:8265 --submission-id {job_id} -- {entrypoint} ;"
    );
    assert!(
        args[0].starts_with("until python -c ") && args[0].ends_with(&expected),
        "{}\n---\n{expected}",
        args[0]
    );
    let env: Vec<(String, String)> = c
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect();
    assert_eq!(
        env,
        [
            ("PYTHONUNBUFFERED".to_owned(), "1".to_owned()),
            // Not known when the cluster is made.
            ("RAY_DASHBOARD_ADDRESS".to_owned(), String::new()),
            ("RAY_JOB_SUBMISSION_ID".to_owned(), job_id.clone())
        ]
    );
    let resources = c.resources.clone().expect("resources");
    let quantities = |m: Option<std::collections::BTreeMap<String, Quantity>>| {
        m.unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        quantities(resources.requests),
        [
            ("cpu".to_owned(), "500m".to_owned()),
            ("memory".to_owned(), "200Mi".to_owned())
        ]
    );
    assert_eq!(
        quantities(resources.limits),
        [
            ("cpu".to_owned(), "1".to_owned()),
            ("memory".to_owned(), "1Gi".to_owned())
        ]
    );

    // kwok runs no containers: the test does what the sidecar would, submitting the
    // entrypoint under the RayJob's job id once the dashboard answers.
    f.wait_for("rayjob-sidecar", JobDeploymentStatus::Running, WAIT)
        .await;
    // (A head that has just started may refuse submissions until its job agent is up; the
    // sidecar's wait loop would still be waiting then.)
    let request = JobSubmitRequest::new(entrypoint.as_str()).with_submission_id(&job_id);
    eventually(
        WAIT,
        "the dashboard to take the sidecar's submission",
        || async {
            match dashboard().submit_job(&request).await {
                Ok(_) | Err(DashboardError::JobAlreadyExists { .. }) => Some(()),
                Err(e) => {
                    eprintln!("submitting as the sidecar would: {e}");
                    None
                }
            }
        },
    )
    .await;
    // The Ray job ends while the sidecar still runs: the RayJob waits for its submitter.
    let ended = eventually(
        SAMPLE_TIMEOUT,
        "the RayJob to see the Ray job SUCCEEDED",
        || async {
            let status = f.job("rayjob-sidecar").await.status?;
            (status.job_status == Some(JobStatus::Succeeded)).then_some(status)
        },
    )
    .await;
    assert_eq!(
        ended.job_deployment_status,
        Some(JobDeploymentStatus::Running),
        "the sidecar has not exited yet: {ended:?}"
    );
    f.sidecar_exited(&head.name_any()).await;

    let job = f
        .wait_for("rayjob-sidecar", JobDeploymentStatus::Complete, WAIT)
        .await;
    let logs = assert_ray_job_succeeded(&job).await;
    assert!(logs.contains("45"), "sum(range(10)): {logs}");
    assert_eq!(
        job.status.as_ref().and_then(|s| s.reason),
        None,
        "Complete through the submitter, not the grace period"
    );

    // shutdownAfterJobFinishes: the cluster goes ttlSecondsAfterFinished after the end, the
    // RayJob stays.
    assert!(f.clusters().get_opt(&cluster).await.expect("get").is_some());
    eventually(
        Duration::from_secs(ttl) + WAIT,
        "the sidecar job's RayCluster to be deleted",
        || async {
            f.clusters()
                .get_opt(&cluster)
                .await
                .expect("get")
                .is_none()
                .then_some(())
        },
    )
    .await;
    let end = job
        .status
        .as_ref()
        .and_then(|s| s.end_time.clone())
        .expect("endTime")
        .0;
    let waited = k8s_openapi::jiff::Timestamp::now().duration_since(end);
    assert!(
        waited.as_secs() >= i64::try_from(ttl).expect("ttl"),
        "deleted only {waited:?} after the end, TTL is {ttl} s"
    );
    // The event is published after the delete returns: it may trail the cluster's going.
    eventually(WAIT, "a DeletedRayCluster event", || async {
        (!f.events("DeletedRayCluster").await.is_empty()).then_some(())
    })
    .await;
    let kept = f.job("rayjob-sidecar").await;
    assert_eq!(
        kept.status.and_then(|s| s.job_deployment_status),
        Some(JobDeploymentStatus::Complete)
    );
}

/// A small RayJob on a one-Pod cluster.
fn small_job(name: &str, spec: Value) -> Value {
    let mut doc = json!({
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "rayClusterSpec": {
                "rayVersion": "2.52.0",
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
                    "name": "ray-head", "image": "rayproject/ray:2.52.0",
                    "ports": [{"name": "dashboard", "containerPort": 8265}],
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}
                }]}}}
            }
        }
    });
    for (k, v) in spec.as_object().expect("object") {
        doc["spec"][k] = v.clone();
    }
    doc
}

#[tokio::test]
async fn k8s_job_mode_creates_the_submitter_job_kuberay_describes() {
    let f = fixture("rayjob-k8sjob").await;
    f.apply(&small_job(
        "k8s-mode",
        json!({"entrypoint": "python -c \"print('from the submitter')\"", "metadata": {"k": "v"}}),
    ))
    .await;
    // kwok runs no containers: the test does what the submitter container would, submitting
    // the entrypoint under the RayJob's job id as soon as the id is known.
    let job_id = eventually(WAIT, "a job id", || async {
        f.job("k8s-mode").await.status.and_then(|s| s.job_id)
    })
    .await;
    dashboard()
        .submit_job(
            &JobSubmitRequest::new("python -c \"print('from the submitter')\"")
                .with_submission_id(&job_id),
        )
        .await
        .expect("submitted as the submitter would");

    let submitter: Job = eventually(WAIT, "the submitter Job", || async {
        Api::<Job>::namespaced(f.client.clone(), &f.ns)
            .get_opt("k8s-mode")
            .await
            .expect("get Job")
    })
    .await;
    let job = f.job("k8s-mode").await;
    let cluster = job
        .status
        .clone()
        .and_then(|s| s.ray_cluster_name)
        .expect("cluster");
    let address = format!("{cluster}-head-svc.{}.svc.cluster.local:8265", f.ns);
    let labels = submitter.labels();
    assert_eq!(labels["ray.io/originated-from-cr-name"], "k8s-mode");
    assert_eq!(labels["ray.io/originated-from-crd"], "RayJob");
    assert_eq!(labels["app.kubernetes.io/created-by"], "kuberay-operator");
    let owner = &submitter.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("RayJob", "k8s-mode", Some(true))
    );
    let spec = submitter.spec.as_ref().expect("spec");
    assert_eq!(spec.backoff_limit, Some(2));
    let template_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    assert_eq!(
        template_labels
            .get("app.kubernetes.io/created-by")
            .map(String::as_str),
        Some("kuberay-operator")
    );
    let pod = spec.template.spec.as_ref().expect("pod spec");
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    let c = &pod.containers[0];
    assert_eq!(c.name, "ray-job-submitter");
    assert_eq!(c.image.as_deref(), Some("rayproject/ray:2.52.0"));
    assert_eq!(
        c.command.clone().unwrap_or_default(),
        ["/bin/bash", "-ce", "--"]
    );
    let args = c.args.clone().unwrap_or_default();
    assert_eq!(args.len(), 1);
    let expected_submit = format!(
        "if ! ray job status --address http://{address} {job_id} >/dev/null 2>&1 ; then ray job submit --address http://{address} --no-wait --metadata-json \"{{\\\"k\\\":\\\"v\\\"}}\" --submission-id {job_id} -- python -c \"print('from the submitter')\" ; fi ; ray job logs --address http://{address} --follow {job_id}"
    );
    assert!(
        args[0].ends_with(&expected_submit),
        "{}\n---\n{expected_submit}",
        args[0]
    );
    assert!(args[0].starts_with("until python -c"), "{}", args[0]);
    let env: Vec<(String, String)> = c
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect();
    assert_eq!(
        env,
        [
            ("PYTHONUNBUFFERED".to_owned(), "1".to_owned()),
            ("RAY_DASHBOARD_ADDRESS".to_owned(), address.clone()),
            ("RAY_JOB_SUBMISSION_ID".to_owned(), job_id.clone())
        ]
    );
    let resources = c.resources.clone().expect("resources");
    assert_eq!(resources.requests.expect("requests")["cpu"].0, "500m");
    assert_eq!(resources.limits.expect("limits")["memory"].0, "1Gi");

    // kwok completes the Job's Pod; with the Ray job SUCCEEDED the RayJob is Complete.
    let job = f
        .wait_for("k8s-mode", JobDeploymentStatus::Complete, WAIT)
        .await;
    assert_eq!(
        job.status.and_then(|s| s.job_status),
        Some(JobStatus::Succeeded)
    );
    assert_eq!(f.events("CreatedRayJobSubmitter").await.len(), 1);
}

#[tokio::test]
async fn a_failing_entrypoint_is_retried_up_to_the_backoff_limit_then_fails() {
    let f = fixture("rayjob-retry").await;
    f.apply(&small_job(
        "flaky",
        json!({"submissionMode": "HTTPMode", "backoffLimit": 1,
               "entrypoint": "python -c \"import sys; print('attempt'); sys.exit(3)\""}),
    ))
    .await;
    let job_ids = std::sync::Mutex::new((
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    ));
    let (ids, fr) = (&job_ids, &f);
    let job = eventually(
        SAMPLE_TIMEOUT,
        "RayJob flaky to fail for good",
        || async move {
            let job = fr.job("flaky").await;
            let status = job.status.clone().unwrap_or_default();
            let mut seen = ids.lock().expect("ids");
            if let Some(id) = &status.job_id {
                seen.0.insert(id.clone());
            }
            if let Some(cluster) = &status.ray_cluster_name {
                seen.1.insert(cluster.clone());
            }
            drop(seen);
            (status.job_deployment_status == Some(JobDeploymentStatus::Failed)).then_some(job)
        },
    )
    .await;
    let (job_ids, clusters) = job_ids.into_inner().expect("ids");
    let status = job.status.expect("status");
    assert_eq!(status.failed, Some(2), "one run and one retry: {status:?}");
    assert_eq!(status.succeeded, Some(0));
    assert_eq!(status.reason, Some(JobFailedReason::AppFailed));
    assert_eq!(status.job_status, Some(JobStatus::Failed));
    assert_eq!(
        job_ids.len(),
        2,
        "each attempt has its own Ray job: {job_ids:?}"
    );
    for id in &job_ids {
        let details = dashboard()
            .get_job(id)
            .await
            .expect("the attempt ran on Ray");
        assert_eq!(details.driver_exit_code, Some(3), "{details:?}");
    }
    // Each attempt ran on a new cluster; the first was deleted before the retry.
    // (Events of one reason are aggregated into a series, so the clusters are counted.)
    assert_eq!(clusters.len(), 2, "{clusters:?}");
    let left: Vec<String> = f
        .clusters()
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(clusters.contains(&left[0]));
}

#[tokio::test]
async fn active_deadline_fails_a_job_that_runs_too_long_without_retrying() {
    let f = fixture("rayjob-deadline").await;
    f.apply(&small_job(
        "slow",
        json!({"submissionMode": "HTTPMode", "backoffLimit": 2, "activeDeadlineSeconds": 10,
               "entrypoint": "python -c \"import time; time.sleep(120)\""}),
    ))
    .await;
    let job_id = eventually(WAIT, "the Ray job to be RUNNING", || async {
        let status = f.job("slow").await.status.unwrap_or_default();
        (status.job_status == Some(JobStatus::Running))
            .then_some(status.job_id)
            .flatten()
    })
    .await;
    let job = f.wait_for("slow", JobDeploymentStatus::Failed, WAIT).await;
    let status = job.status.expect("status");
    assert_eq!(status.reason, Some(JobFailedReason::DeadlineExceeded));
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("activeDeadlineSeconds")),
        "{status:?}"
    );
    assert_eq!(status.failed, Some(1), "a deadline is not retried");
    let took = status
        .end_time
        .expect("end")
        .0
        .duration_since(status.start_time.expect("start").0);
    assert!(took.as_secs() >= 10 && took.as_secs() < 40, "{took:?}");
    let _ = dashboard().stop_job(&job_id).await;
}

#[tokio::test]
async fn suspend_deletes_the_cluster_and_resume_runs_the_job_again() {
    let f = fixture("rayjob-suspend").await;
    f.apply(&small_job(
        "pausable",
        json!({"submissionMode": "HTTPMode", "shutdownAfterJobFinishes": true,
               "entrypoint": "python -c \"import time; time.sleep(4); print('resumed run')\""}),
    ))
    .await;
    let first = f
        .wait_for("pausable", JobDeploymentStatus::Running, WAIT)
        .await;
    let first = first.status.expect("status");
    let first_cluster = first.ray_cluster_name.clone().expect("cluster");
    f.set_suspend("pausable", true).await;
    let suspended = f
        .wait_for("pausable", JobDeploymentStatus::Suspended, WAIT)
        .await;
    let status = suspended.status.expect("status");
    assert_eq!(
        (status.ray_cluster_name, status.job_id, status.dashboard_url),
        (None, None, None)
    );
    assert!(
        f.clusters()
            .get_opt(&first_cluster)
            .await
            .expect("get")
            .is_none()
    );

    f.set_suspend("pausable", false).await;
    let done = f
        .wait_for("pausable", JobDeploymentStatus::Complete, WAIT)
        .await;
    let status = done.status.clone().expect("status");
    assert_ne!(
        status.ray_cluster_name.as_deref(),
        Some(first_cluster.as_str()),
        "a new cluster"
    );
    let logs = assert_ray_job_succeeded(&done).await;
    assert!(logs.contains("resumed run"), "{logs}");
    if let Some(id) = first.job_id {
        let _ = dashboard().stop_job(&id).await;
    }
}

#[tokio::test]
async fn a_silent_dashboard_stalls_only_its_own_rayjob() {
    // One reconcile at a time: a dashboard call that never returned would starve the others.
    let f = fixture_with("rayjob-silent-head", 1).await;
    f.apply(&small_job(
        "silent-head",
        json!({"submissionMode": "HTTPMode", "entrypoint": "python -c 'print(1)'"}),
    ))
    .await;
    f.apply(&small_job(
        "healthy",
        json!({"submissionMode": "HTTPMode", "entrypoint": "python -c \"print('healthy')\""}),
    ))
    .await;
    let healthy = f
        .wait_for("healthy", JobDeploymentStatus::Complete, WAIT)
        .await;
    assert_ray_job_succeeded(&healthy).await;
    // The other keeps trying: Running, with the status-check timer started.
    let stuck = eventually(WAIT, "the silent dashboard to be noticed", || async {
        let status = f.job("silent-head").await.status.unwrap_or_default();
        status
            .job_status_check_failure_start_time
            .is_some()
            .then_some(status)
    })
    .await;
    assert_eq!(
        stuck.job_deployment_status,
        Some(JobDeploymentStatus::Running)
    );
    assert_eq!(stuck.job_status, None);
}
