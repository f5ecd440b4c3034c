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

mod modes;
mod samples;
mod services;

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
    fixture::spawn_raycluster_controller(&client, &ns, raycluster::Config::default(), &mut stop);
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
