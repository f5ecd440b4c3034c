//! Submission modes and job lifecycle: the K8s Job submitter, retries up to the backoff
//! limit, the active deadline, suspend and resume, a silent dashboard.

use super::*;

/// A small RayJob on a one-Pod cluster.
pub(super) fn small_job(name: &str, spec: Value) -> Value {
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
