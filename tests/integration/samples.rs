//! The project's own samples (`samples/`), as `raypipe dev` tells a newcomer to apply them
//! (`kubectl apply --server-side -f samples/`): every Ray or raypipe object there has a
//! documented end state, written in its file, and a test that drives it there against the real
//! control plane (and Ray where it must run). This module holds the inventory that ties each
//! sample to its test, the samples no other module runs, and the templates beside them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use raypipe::api::RayCronJob;
use raypipe::api::rayjob::RayJob;
use raypipe::controllers::raycronjob::{
    self, CRONJOB_NAME_LABEL, Config, FastClock, SCHEDULED_TIMESTAMP_ANNOTATION,
};

use crate::support::{self, eventually};

fn samples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("samples")
}

/// Where each sample ends and which test shows it. `state` must appear in the sample's file
/// (the file says plainly what it reaches); `test` must be a test of this binary.
struct Documented {
    file: &'static str,
    name: &'static str,
    state: &'static str,
    test: &'static str,
}

const DOCUMENTED: &[Documented] = &[
    Documented {
        file: "servepipeline.yaml",
        name: "demo",
        state: "Ready",
        test: "dev_starts_a_working_control_plane_and_ctrl_c_stops_everything",
    },
    Documented {
        file: "ray-cluster.yaml",
        name: "raycluster-autoscaled",
        state: "Ready",
        test: "project_samples_are_realised_with_autoscaler_rbac_ingress_and_multi_host_and_alpha_is_refused",
    },
    Documented {
        file: "ray-cluster.yaml",
        name: "raycluster-gcs-ft",
        state: "Ready",
        test: "project_samples_are_realised_with_autoscaler_rbac_ingress_and_multi_host_and_alpha_is_refused",
    },
    Documented {
        file: "ray-cluster.yaml",
        name: "raycluster-alpha",
        state: "Refused",
        test: "project_samples_are_realised_with_autoscaler_rbac_ingress_and_multi_host_and_alpha_is_refused",
    },
    Documented {
        file: "ray-cluster.network-policy.yaml",
        name: "raycluster-deny-all",
        state: "Ready",
        test: "the_deny_all_sample_gets_kuberays_network_policies_and_they_follow_the_spec",
    },
    Documented {
        file: "ray-cluster.mtls.yaml",
        name: "raycluster-mtls",
        state: "Ready",
        test: "the_mtls_sample_waits_for_its_certificates_then_runs_with_tls",
    },
    Documented {
        file: "ray-cluster.embedded-gcs.yaml",
        name: "raycluster-embedded-gcs-ft",
        state: "Ready",
        test: "the_embedded_gcs_sample_gets_its_pvc_and_the_head_mounts_it",
    },
    Documented {
        file: "ray-job.yaml",
        name: "rayjob-staged-cleanup",
        state: "Complete",
        test: "raypipe_sample_runs_and_its_deletion_rules_suspend_the_workers",
    },
    Documented {
        file: "ray-job.yaml",
        name: "rayjob-existing-cluster",
        state: "Complete",
        test: "raypipe_sample_on_an_existing_cluster_runs_there_and_leaves_the_cluster_alone",
    },
    Documented {
        file: "ray-job.yaml",
        name: "rayjob-sidecar",
        state: "Complete",
        test: "raypipe_sidecar_sample_submits_from_the_head_and_its_cluster_goes_after_the_ttl",
    },
    Documented {
        file: "ray-cronjob.yaml",
        name: "raycronjob-nightly",
        state: "Scheduled",
        test: "the_nightly_cronjob_sample_starts_its_rayjob_at_0230_berlin_time",
    },
];

/// Samples whose end state needs what no test here may use, with what they need; their files
/// must say so.
const NOT_RUN_HERE: &[(&str, &str, &str)] = &[
    (
        "ray-service.yaml",
        "rayservice-calc",
        "github.com/ray-project/test_dag",
    ),
    (
        "ray-service.yaml",
        "rayservice-incremental",
        "github.com/ray-project/test_dag",
    ),
];

const KINDS: &[&str] = &[
    "ServePipeline",
    "RayCluster",
    "RayJob",
    "RayService",
    "RayCronJob",
];

/// Every `.rs` file under `tests/integration`, sub-modules (`source/`, `raycluster/`…) included.
fn test_sources() -> String {
    fn read_all(dir: &Path, sources: &mut String) {
        for entry in std::fs::read_dir(dir).expect("the test sources").flatten() {
            let path = entry.path();
            if path.is_dir() {
                read_all(&path, sources);
            } else if path.extension().is_some_and(|x| x == "rs") {
                sources.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    let mut sources = String::new();
    read_all(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration"),
        &mut sources,
    );
    sources
}

#[test]
fn every_sample_has_a_documented_state_and_a_test_that_reaches_it() {
    let sources = test_sources();
    let mut seen = Vec::new();
    for (file, doc) in support::yaml_documents(&samples_dir()) {
        let kind = doc["kind"].as_str().unwrap_or_default();
        if !KINDS.contains(&kind) {
            continue;
        }
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let text = std::fs::read_to_string(samples_dir().join(&file)).expect("readable");
        if let Some(entry) = DOCUMENTED.iter().find(|d| d.file == file && d.name == name) {
            assert!(
                text.contains(entry.state),
                "{file} does not say that {name} ends {}",
                entry.state
            );
            assert!(
                sources.contains(&format!("async fn {}(", entry.test))
                    || sources.contains(&format!("fn {}(", entry.test)),
                "{kind} {name}: no test {}",
                entry.test
            );
        } else if let Some((_, _, needs)) = NOT_RUN_HERE
            .iter()
            .find(|(f, n, _)| *f == file && *n == name)
        {
            assert!(
                text.contains(needs),
                "{file} does not say that {name} needs {needs}"
            );
        } else {
            panic!("{file}: {kind} {name} has no documented state and no test");
        }
        seen.push((file.clone(), name.to_owned()));
    }
    for d in DOCUMENTED {
        assert!(
            seen.iter().any(|(f, n)| f == d.file && n == d.name),
            "{} {} is listed but not in samples/",
            d.file,
            d.name
        );
    }
}

/// The templates under `samples/templates/` (kept out of `kubectl apply -f samples/` because
/// they need your registry) are accepted by the API server as they are.
#[tokio::test]
async fn the_templates_are_valid_objects_for_the_api_server() {
    let client = support::client().await;
    let ns = support::namespace(&client, "sample-templates").await;
    let docs = support::yaml_documents(&samples_dir().join("templates"));
    assert!(
        docs.iter().any(|(_, d)| d["kind"] == "ServePipeline"),
        "the full ServePipeline template"
    );
    for (file, doc) in docs {
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let kind = doc["kind"].as_str().unwrap_or_default();
        let (resource, _) =
            kube::discovery::pinned_kind(&client, &GroupVersionKind::gvk(group, version, kind))
                .await
                .unwrap_or_else(|e| panic!("{file}: {kind}: {e}"));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let applied = api
            .patch(
                name,
                &PatchParams::apply("samples-test").dry_run(),
                &Patch::Apply(&doc),
            )
            .await
            .unwrap_or_else(|e| panic!("{file}: {kind} {name} refused: {e}"));
        if kind == "ServePipeline" {
            support::assert_contains(&doc["spec"], &applied.data["spec"], "spec");
        }
    }
}

/// `samples/ray-cronjob.yaml` runs nightly at 02:30 in Europe/Berlin. The controller's clock is
/// set to ten seconds before the next such tick and runs 60 times faster: the sample's first
/// RayJob must carry that tick. The tick lies after the real now because the controller counts
/// ticks from the RayCronJob's creationTimestamp, which the apiserver stamps in real time.
#[tokio::test]
async fn the_nightly_cronjob_sample_starts_its_rayjob_at_0230_berlin_time() {
    let client = support::client().await;
    let ns = support::namespace(&client, "sample-cronjob").await;
    let tick = next_berlin_0230_after(k8s_openapi::jiff::Timestamp::now());
    let origin = tick - k8s_openapi::jiff::SignedDuration::from_secs(10);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(raycronjob::run(
        client.clone(),
        Config {
            namespace: Some(ns.clone()),
            clock: std::sync::Arc::new(FastClock::new(origin, 60)),
            ..Config::default()
        },
        async move {
            let _ = rx.await;
        },
    ));
    let (_, doc) = support::yaml_documents(&samples_dir())
        .into_iter()
        .find(|(f, d)| f == "ray-cronjob.yaml" && d["kind"] == "RayCronJob")
        .expect("the RayCronJob sample");
    let sample: RayCronJob = serde_json::from_value(doc).expect("a RayCronJob");
    let name = sample.name_any();
    let crons: Api<RayCronJob> = Api::namespaced(client.clone(), &ns);
    crons
        .create(&Default::default(), &sample)
        .await
        .expect("the sample is created unchanged");
    let jobs: Api<RayJob> = Api::namespaced(client.clone(), &ns);
    let job = eventually(
        Duration::from_secs(60),
        "the sample's first RayJob",
        || async {
            jobs.list(
                &kube::api::ListParams::default().labels(&format!("{CRONJOB_NAME_LABEL}={name}")),
            )
            .await
            .expect("list RayJobs")
            .items
            .into_iter()
            .next()
        },
    )
    .await;
    let scheduled = job
        .annotations()
        .get(SCHEDULED_TIMESTAMP_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    let scheduled: k8s_openapi::jiff::Timestamp = scheduled
        .parse()
        .unwrap_or_else(|e| panic!("{SCHEDULED_TIMESTAMP_ANNOTATION} {scheduled:?}: {e}"));
    assert_eq!(scheduled, tick);
    assert_eq!(job.spec.ttl_seconds_after_finished, Some(300));
    let _ = tx.send(());
}

/// The first 02:30 Europe/Berlin wall-clock time after `now` (counting from tomorrow, so it is
/// always later than any creationTimestamp the apiserver stamps during the test), skipping a
/// day on which 02:30 falls into the spring-forward gap.
fn next_berlin_0230_after(now: k8s_openapi::jiff::Timestamp) -> k8s_openapi::jiff::Timestamp {
    use k8s_openapi::jiff::civil::time;
    use k8s_openapi::jiff::tz::TimeZone;
    let berlin = TimeZone::get("Europe/Berlin").expect("the tz database knows Europe/Berlin");
    let mut day = now.to_zoned(berlin.clone()).date();
    loop {
        day = day.tomorrow().expect("a later day");
        let zoned = day
            .to_datetime(time(2, 30, 0, 0))
            .to_zoned(berlin.clone())
            .expect("a zoned time");
        if zoned.time() == time(2, 30, 0, 0) {
            return zoned.timestamp();
        }
    }
}
