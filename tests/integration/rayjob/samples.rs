//! KubeRay's and raypipe's RayJob samples on the shared Ray head: HTTP mode, deletion rules,
//! an existing cluster, the sidecar submitter.

use super::*;

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
    // The Event follows the write it reports; a loaded machine may show the write first.
    eventually(WAIT, "the UpdatedRayCluster Event", || async {
        (!f.events("UpdatedRayCluster").await.is_empty()).then_some(())
    })
    .await;
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
