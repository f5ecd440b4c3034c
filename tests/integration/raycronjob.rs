//! The RayCronJob controller against a real API server, with a clock that runs 60 times faster
//! than real time: a `* * * * *` schedule ticks about once a second. No RayJob controller runs
//! here; the test finishes RayJobs by writing their status, as the RayJob controller would.

use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use raypipe::api::RayCronJob;
use raypipe::api::rayjob::RayJob;
use raypipe::controllers::raycronjob::{
    self, CRONJOB_NAME_LABEL, Config, FastClock, SCHEDULED_TIMESTAMP_ANNOTATION,
};
use serde_json::json;

use crate::support::{self, eventually, fixture};

const WAIT: Duration = Duration::from_secs(30);

fn cron_doc(name: &str, spec: serde_json::Value) -> RayCronJob {
    let mut doc = json!({
        "apiVersion": "ray.io/v1", "kind": "RayCronJob",
        "metadata": {"name": name},
        "spec": {"schedule": "* * * * *", "jobTemplate": {
            "entrypoint": "python -c 'print(1)'",
            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}}}}}
    });
    for (k, v) in spec.as_object().expect("object") {
        doc["spec"][k] = v.clone();
    }
    serde_json::from_value(doc).expect("a RayCronJob")
}

async fn owned_jobs(jobs: &Api<RayJob>, cron: &str) -> Vec<RayJob> {
    let mut items = jobs
        .list(&ListParams::default().labels(&format!("{CRONJOB_NAME_LABEL}={cron}")))
        .await
        .expect("list RayJobs")
        .items;
    items.retain(|j| j.metadata.deletion_timestamp.is_none());
    items.sort_by_key(|j| j.name_any());
    items
}

async fn finish(jobs: &Api<RayJob>, name: &str, deployment: &str) {
    let patch = json!({"apiVersion": "ray.io/v1", "kind": "RayJob",
        "status": {"jobDeploymentStatus": deployment}});
    jobs.patch_status(
        name,
        &PatchParams::apply("raycronjob-test").force(),
        &Patch::Apply(&patch),
    )
    .await
    .expect("write RayJob status");
}

/// A fresh namespace with a RayCronJob controller watching it on a clock that runs 60 times
/// faster from now; the controller stops when the `Stopper` is dropped.
async fn controller_on_fast_clock(prefix: &str) -> (kube::Client, String, fixture::Stopper) {
    controller_on_clock(
        prefix,
        FastClock::new(k8s_openapi::jiff::Timestamp::now(), 60),
    )
    .await
}

/// A fresh namespace with a RayCronJob controller watching it on `clock`.
async fn controller_on_clock(
    prefix: &str,
    clock: FastClock,
) -> (kube::Client, String, fixture::Stopper) {
    let client = support::client().await;
    let ns = support::namespace(&client, prefix).await;
    let mut stop = fixture::Stopper::default();
    tokio::spawn(raycronjob::run(
        client.clone(),
        Config {
            namespace: Some(ns.clone()),
            clock: std::sync::Arc::new(clock),
            ..Config::default()
        },
        stop.signal(),
    ));
    (client, ns, stop)
}

#[tokio::test]
async fn creates_rayjobs_on_schedule_honours_forbid_and_replace_and_prunes_history() {
    let (client, ns, stop) = controller_on_fast_clock("raycronjob").await;
    let crons: Api<RayCronJob> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<RayJob> = Api::namespaced(client.clone(), &ns);
    crons
        .create(
            &Default::default(),
            &cron_doc(
                "ticker",
                json!({"concurrencyPolicy": "Forbid", "successfulJobsHistoryLimit": 1, "failedJobsHistoryLimit": 0}),
            ),
        )
        .await
        .expect("create RayCronJob");

    // The first tick creates one RayJob from the template, labelled and owned.
    let first = eventually(WAIT, "the first RayJob", || async {
        owned_jobs(&jobs, "ticker").await.into_iter().next()
    })
    .await;
    let cron = crons.get("ticker").await.expect("get");
    assert_eq!(first.spec, cron.spec.job_template);
    assert_eq!(first.owner_references()[0].uid, cron.uid().expect("uid"));
    let tick = first.annotations()[SCHEDULED_TIMESTAMP_ANNOTATION].clone();
    assert_eq!(
        first.name_any(),
        format!(
            "ticker-{}",
            tick.parse::<k8s_openapi::jiff::Timestamp>()
                .expect("RFC 3339")
                .as_second()
                / 60
        )
    );
    let status = eventually(WAIT, "the status", || async {
        crons
            .get("ticker")
            .await
            .expect("get")
            .status
            .filter(|s| s.active.is_some())
    })
    .await;
    assert_eq!(
        status.last_schedule_time.map(|t| t.0.to_string()),
        Some(tick)
    );
    assert_eq!(
        status.active.expect("active")[0].name.as_deref(),
        Some(first.name_any().as_str())
    );

    // Forbid: while it is active, ticks pass (about three in three seconds) without a new job.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(owned_jobs(&jobs, "ticker").await.len(), 1);
    let skipped = Api::<Event>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("JobAlreadyActive"))
        .count();
    assert!(skipped >= 1, "skipped ticks are reported");

    // Once it finishes, the next tick runs; history keeps one success and no failure.
    finish(&jobs, &first.name_any(), "Complete").await;
    let second = eventually(WAIT, "a second RayJob", || async {
        owned_jobs(&jobs, "ticker")
            .await
            .into_iter()
            .find(|j| j.name_any() != first.name_any())
    })
    .await;
    finish(&jobs, &second.name_any(), "Failed").await;
    let third = eventually(WAIT, "a third RayJob", || async {
        let all = owned_jobs(&jobs, "ticker").await;
        all.into_iter()
            .find(|j| j.name_any() != first.name_any() && j.name_any() != second.name_any())
    })
    .await;
    finish(&jobs, &third.name_any(), "Complete").await;
    eventually(WAIT, "history pruned to the newest success", || async {
        let names: Vec<String> = owned_jobs(&jobs, "ticker")
            .await
            .iter()
            .map(|j| j.name_any())
            .collect();
        (!names.contains(&first.name_any())
            && !names.contains(&second.name_any())
            && names.contains(&third.name_any()))
        .then_some(())
    })
    .await;

    // Replace: the active RayJob is deleted when the next tick starts a new one.
    let active = eventually(WAIT, "an active RayJob", || async {
        owned_jobs(&jobs, "ticker").await.into_iter().find(|j| {
            j.status
                .as_ref()
                .and_then(|s| s.job_deployment_status)
                .is_none()
        })
    })
    .await;
    crons
        .patch(
            "ticker",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"concurrencyPolicy": "Replace"}})),
        )
        .await
        .expect("switch to Replace");
    eventually(WAIT, "the active RayJob to be replaced", || async {
        let all = owned_jobs(&jobs, "ticker").await;
        let replaced = !all.iter().any(|j| j.name_any() == active.name_any());
        let newer = all.iter().any(|j| j.name_any() > active.name_any());
        (replaced && newer).then_some(())
    })
    .await;

    // Suspend: no more RayJobs.
    crons
        .patch(
            "ticker",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .expect("suspend");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = owned_jobs(&jobs, "ticker").await.len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        owned_jobs(&jobs, "ticker").await.len(),
        before,
        "suspended: no new RayJobs"
    );
    drop(stop);
}

#[tokio::test]
async fn the_kuberay_sample_schedules_in_its_time_zone_and_invalid_ones_are_refused() {
    let (client, ns, stop) = controller_on_fast_clock("raycronjob-sample").await;
    let crons: Api<RayCronJob> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<RayJob> = Api::namespaced(client.clone(), &ns);
    let (_, doc) = support::yaml_documents(&support::kuberay_samples_dir())
        .into_iter()
        .find(|(_, d)| d["kind"] == "RayCronJob")
        .expect("KubeRay's RayCronJob sample");
    let sample: RayCronJob = serde_json::from_value(doc).expect("sample");
    let name = sample.name_any();
    crons
        .create(&Default::default(), &sample)
        .await
        .expect("create the sample unchanged");
    let job = eventually(WAIT, "the sample's first RayJob", || async {
        owned_jobs(&jobs, &name).await.into_iter().next()
    })
    .await;
    assert_eq!(job.spec.ttl_seconds_after_finished, Some(600));

    let bad = cron_doc("bad-zone", json!({"schedule": "CRON_TZ=UTC * * * * *"}));
    crons
        .create(&Default::default(), &bad)
        .await
        .expect("the API server accepts it");
    eventually(WAIT, "an InvalidRayCronJobSpec event", || async {
        Api::<Event>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("InvalidRayCronJobSpec")
                    && e.involved_object.name.as_deref() == Some("bad-zone")
            })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(owned_jobs(&jobs, "bad-zone").await.is_empty());
    drop(stop);
}

/// Issue 14, class 6: a RayJob of the name the next tick would create, made by someone else
/// (even with the RayCronJob's label), is reported (RayJobConflict), never written and never
/// listed as the RayCronJob's active job.
#[tokio::test]
async fn a_foreign_rayjob_of_a_ticks_name_is_reported_and_never_taken_over() {
    // A clock 10 minutes ahead, 10 s into a minute, at real speed: the tick due when the
    // RayCronJob is first seen is that minute's, so its RayJob's name is known in advance.
    let minute = (k8s_openapi::jiff::Timestamp::now().as_second() + 600).div_euclid(60) * 60;
    let origin = k8s_openapi::jiff::Timestamp::from_second(minute + 10).expect("a time");
    let taken = format!("squat-{}", minute / 60);
    let (client, ns, stop) =
        controller_on_clock("raycronjob-foreign", FastClock::new(origin, 1)).await;
    let jobs: Api<RayJob> = Api::namespaced(client.clone(), &ns);
    let foreign: RayJob = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": taken, "labels": {CRONJOB_NAME_LABEL: "squat", "team": "other"}},
        "spec": {"entrypoint": "python -c 'print(2)'",
            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "example/other:1"}]}}}}}
    }))
    .expect("a RayJob");
    jobs.patch(
        &taken,
        &PatchParams::apply("other-team"),
        &Patch::Apply(&foreign),
    )
    .await
    .expect("the other team applies its RayJob");
    let before = serde_json::to_value(jobs.get(&taken).await.expect("get")).expect("json");

    let crons: Api<RayCronJob> = Api::namespaced(client.clone(), &ns);
    crons
        .create(&Default::default(), &cron_doc("squat", json!({})))
        .await
        .expect("create RayCronJob");
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let event = eventually(WAIT, "a RayJobConflict event", || {
        let events = events.clone();
        async move {
            events
                .list(&ListParams::default())
                .await
                .expect("events")
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("RayJobConflict"))
        }
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event
            .message
            .as_deref()
            .unwrap_or_default()
            .contains(&taken),
        "{:?}",
        event.message
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = serde_json::to_value(jobs.get(&taken).await.expect("get")).expect("json");
    assert_eq!(after, before, "the foreign RayJob was modified");
    let active = crons
        .get("squat")
        .await
        .expect("get")
        .status
        .and_then(|s| s.active)
        .unwrap_or_default();
    assert!(
        active
            .iter()
            .all(|r| r.name.as_deref() != Some(taken.as_str())),
        "the foreign RayJob is listed as active: {active:?}"
    );
    drop(stop);
}
