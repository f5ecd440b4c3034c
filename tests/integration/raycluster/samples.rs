//! KubeRay's and raypipe's sample RayClusters realised as KubeRay would (Pods, Services,
//! commands, probes, autoscaler RBAC, Ingress, multi-host); the alpha API refused.

use super::*;

#[tokio::test]
async fn every_kuberay_sample_cluster_is_realised_as_kuberay_would() {
    let dir = support::kuberay_samples_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("samples")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .filter(|p| documents(p).iter().any(is_raycluster))
        .filter(|p| {
            // Those need gates (and cert-manager): `isolation` runs them, the history server's
            // with its gate on; with the gate off (the default) it is refused (below).
            !super::isolation::GATED_SAMPLES
                .iter()
                .chain([&HISTORY_SERVER_SAMPLE])
                .any(|g| p.file_name().is_some_and(|n| n == *g))
        })
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

/// KubeRay's sample of a cluster whose logs and events its history server collects.
const HISTORY_SERVER_SAMPLE: &str = "ray-cluster.historyserver.yaml";

/// The history-server sample needs the alpha gate `RayClusterHistoryServer`, off by default in
/// KubeRay and raypipe: refused as KubeRay refuses it with the gate off, naming the gate, with a
/// Warning, and nothing created (`isolation` realises it with the gate on).
#[tokio::test]
async fn the_history_server_sample_is_refused_naming_its_gate() {
    let f = fixture("rc-history").await;
    let names = f
        .apply_file(&support::kuberay_samples_dir().join(HISTORY_SERVER_SAMPLE))
        .await;
    assert_eq!(names, ["raycluster-historyserver"]);
    let refused = f.wait_event("InvalidRayClusterSpec").await;
    assert_eq!(
        refused.involved_object.name.as_deref(),
        Some("raycluster-historyserver")
    );
    let note = refused.message.clone().unwrap_or_default();
    assert!(
        note.contains("historyServerOptions") && note.contains("RayClusterHistoryServer"),
        "{note}"
    );
    assert!(f.ray_pods("raycluster-historyserver").await.is_empty());
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
        if validate::for_controller(&f.cluster(name).await, &Default::default()).is_ok() {
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
