//! Unit tests of the head and worker Pod builders (labels, command, env, probes, volumes,
//! sidecars), one KubeRay behaviour per test.

use super::*;
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::sidecars::AUTOSCALER_START_COMMAND;
use crate::api::raycluster::AutoscalerOptions;
use crate::controllers::raycluster::builders::test_cluster as cluster;
use crate::kuberay::spec::ray_version_at_least;

fn sample() -> RayCluster {
    cluster(json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "raycluster-kuberay"},
        "spec": {
            "rayVersion": "2.52.0",
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
                "name": "ray-head", "image": "rayproject/ray:2.52.0",
                "resources": {"limits": {"cpu": "1", "memory": "5Gi"}, "requests": {"cpu": "1", "memory": "5Gi"}},
                "ports": [{"containerPort": 6379, "name": "gcs-server"}, {"containerPort": 8265, "name": "dashboard"}, {"containerPort": 10001, "name": "client"}]
            }]}}},
            "workerGroupSpecs": [{"groupName": "workergroup", "replicas": 1, "minReplicas": 1, "maxReplicas": 5, "rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.52.0",
                    "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}}]}}}]
        }
    }))
}

fn env_of(container: &Container) -> Vec<(String, Value)> {
    container
        .env
        .iter()
        .flatten()
        .map(|e| {
            let v = match (&e.value, &e.value_from) {
                (Some(v), _) => json!(v),
                (None, Some(from)) => serde_json::to_value(from).expect("json"),
                (None, None) => Value::Null,
            };
            (e.name.clone(), v)
        })
        .collect()
}

fn names_of(container: &Container) -> Vec<String> {
    env_of(container).into_iter().map(|(n, _)| n).collect()
}

#[test]
fn head_pod_of_the_kuberay_sample() {
    let pod = head_pod(&sample(), &BuildOptions::default(), "hash").expect("builds");
    let meta = &pod.metadata;
    assert_eq!(
        meta.generate_name.as_deref(),
        Some("raycluster-kuberay-head-")
    );
    assert_eq!(meta.name, None);
    assert_eq!(meta.namespace.as_deref(), Some("ns"));
    let labels = meta.labels.clone().unwrap_or_default();
    assert_eq!(
        serde_json::to_value(&labels).expect("json"),
        json!({
            "app.kubernetes.io/created-by": "kuberay-operator",
            "app.kubernetes.io/name": "kuberay",
            "ray.io/cluster": "raycluster-kuberay",
            "ray.io/group": "headgroup",
            "ray.io/identifier": "raycluster-kuberay-head",
            "ray.io/is-ray-node": "yes",
            "ray.io/node-type": "head"
        })
    );
    let annotations = meta.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("ray.io/ft-enabled").map(String::as_str),
        Some("false")
    );
    assert_eq!(
        annotations
            .get("ray.io/upgrade-strategy-recreate-hash")
            .map(String::as_str),
        Some("hash")
    );
    assert_eq!(
        annotations
            .get("ray.io/kuberay-version")
            .map(String::as_str),
        Some(keys::OPERATOR_VERSION)
    );
    let owner = &meta.owner_references.as_ref().expect("owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("RayCluster", "uid-1", Some(true))
    );

    let spec = pod.spec.expect("spec");
    let ray = &spec.containers[0];
    assert_eq!(
        ray.command.as_deref(),
        Some(&["/bin/bash".to_owned(), "-c".into(), "--".into()][..])
    );
    let expected_start = "ray start --head  --block  --dashboard-agent-listen-port=52365  --dashboard-host=0.0.0.0  --memory=5368709120  --metrics-export-port=8080  --num-cpus=1 ";
    assert_eq!(
        ray.args.as_deref(),
        Some(
            &[format!(
                "ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {expected_start}"
            )][..]
        )
    );
    let ports: Vec<_> = ray
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap_or_default(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        [
            ("gcs-server".to_owned(), 6379),
            ("dashboard".into(), 8265),
            ("client".into(), 10001),
            ("metrics".into(), 8080)
        ]
    );
    assert_eq!(
        env_of(ray),
        vec![
            (
                "RAY_CLUSTER_NAME".to_owned(),
                json!({"fieldRef": {"fieldPath": "metadata.labels['ray.io/cluster']"}})
            ),
            (
                "RAY_CLUSTER_NAMESPACE".into(),
                json!({"fieldRef": {"fieldPath": "metadata.namespace"}})
            ),
            (
                "RAY_CLOUD_INSTANCE_ID".into(),
                json!({"fieldRef": {"fieldPath": "metadata.name"}})
            ),
            (
                "RAY_NODE_TYPE_NAME".into(),
                json!({"fieldRef": {"fieldPath": "metadata.labels['ray.io/group']"}})
            ),
            ("KUBERAY_GEN_RAY_START_CMD".into(), json!(expected_start)),
            ("RAY_PORT".into(), json!("6379")),
            ("RAY_ADDRESS".into(), json!("127.0.0.1:6379")),
            ("RAY_USAGE_STATS_KUBERAY_IN_USE".into(), json!("1")),
            (
                "RAY_USAGE_STATS_EXTRA_TAGS".into(),
                json!(format!(
                    "kuberay_version={};kuberay_crd=RayCluster",
                    keys::OPERATOR_VERSION
                ))
            ),
            ("RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE".into(), json!("1")),
        ]
    );
    let liveness = ray.liveness_probe.as_ref().expect("liveness");
    assert_eq!(
        serde_json::to_value(liveness).expect("json"),
        json!({
            "exec": {"command": ["bash", "-c", "wget --tries 1 -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep success && wget --tries 1 -T 10 -q -O- http://localhost:8265/api/gcs_healthz | grep success"]},
            "initialDelaySeconds": 30, "timeoutSeconds": 5, "periodSeconds": 5, "successThreshold": 1, "failureThreshold": 120
        })
    );
    let readiness = ray.readiness_probe.as_ref().expect("readiness");
    assert_eq!(
        (
            readiness.initial_delay_seconds,
            readiness.failure_threshold,
            readiness.timeout_seconds
        ),
        (Some(10), Some(10), Some(5))
    );
    assert_eq!(
        serde_json::to_value(&spec.volumes).expect("json"),
        json!([{"name": "shared-mem", "emptyDir": {"medium": "Memory", "sizeLimit": "5Gi"}}])
    );
    assert_eq!(
        ray.volume_mounts.as_ref().map(|m| m[0].mount_path.as_str()),
        Some("/dev/shm")
    );
    assert!(
        spec.init_containers.is_none(),
        "no init container on the head"
    );
}

#[test]
fn worker_pod_of_the_kuberay_sample() {
    let cluster = sample();
    let group = &cluster.spec.worker_group_specs.as_ref().expect("groups")[0];
    let replica = WorkerReplica {
        replica_index: 3,
        ..Default::default()
    };
    let pod = worker_pod(&cluster, group, &replica, &BuildOptions::default()).expect("builds");
    assert_eq!(
        pod.metadata.generate_name.as_deref(),
        Some("raycluster-kuberay-workergroup-worker-")
    );
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("ray.io/node-type").map(String::as_str),
        Some("worker")
    );
    assert_eq!(
        labels.get("ray.io/group").map(String::as_str),
        Some("workergroup")
    );
    assert_eq!(
        labels.get("ray.io/identifier").map(String::as_str),
        Some("raycluster-kuberay-worker")
    );
    assert_eq!(
        labels
            .get("ray.io/worker-group-replica-index")
            .map(String::as_str),
        Some("3")
    );
    assert!(!labels.contains_key("ray.io/worker-group-replica-name"));
    assert!(
        !pod.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .contains_key("ray.io/ft-enabled")
    );

    let spec = pod.spec.expect("spec");
    let fqdn = "raycluster-kuberay-head-svc.ns.svc.cluster.local";
    let expected_start = format!(
        "ray start  --address={fqdn}:6379  --block  --dashboard-agent-listen-port=52365  --memory=1073741824  --metrics-export-port=8080  --num-cpus=1 "
    );
    let ray = &spec.containers[0];
    assert_eq!(
        ray.args.as_deref(),
        Some(
            &[format!(
                "ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {expected_start}"
            )][..]
        )
    );
    assert_eq!(
        names_of(ray),
        [
            "FQ_RAY_IP",
            "RAY_IP",
            "RAY_CLUSTER_NAME",
            "RAY_CLUSTER_NAMESPACE",
            "RAY_CLOUD_INSTANCE_ID",
            "RAY_NODE_TYPE_NAME",
            "KUBERAY_GEN_RAY_START_CMD",
            "RAY_PORT",
            "RAY_ADDRESS",
            "RAY_USAGE_STATS_KUBERAY_IN_USE",
            "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE"
        ]
    );
    let env = env_of(ray);
    assert!(env.contains(&("RAY_IP".into(), json!("raycluster-kuberay-head-svc"))));
    assert!(env.contains(&("RAY_ADDRESS".into(), json!(format!("{fqdn}:6379")))));
    let probe = ray.readiness_probe.as_ref().expect("readiness");
    assert_eq!(probe.timeout_seconds, Some(2));
    assert_eq!(
        probe.exec.as_ref().and_then(|e| e.command.clone()),
        Some(vec!["bash".into(), "-c".into(), "wget --tries 1 -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep success".into()])
    );
    let init = &spec.init_containers.as_ref().expect("init")[0];
    assert_eq!(init.name, "wait-gcs-ready");
    assert_eq!(init.image.as_deref(), Some("rayproject/ray:2.52.0"));
    assert!(
        init.args.as_ref().expect("args")[0]
            .contains(&format!("ray health-check --address {fqdn}:6379"))
    );
    assert_eq!(names_of(init), ["FQ_RAY_IP", "RAY_IP"]);
    assert_eq!(
        init.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("cpu"))
            .map(|q| q.0.as_str()),
        Some("200m")
    );
}

#[test]
fn user_command_runs_before_ray_start_unless_it_starts_ray_itself() {
    let mut cluster = sample();
    let head = cluster
        .spec
        .head_group_spec
        .template
        .spec
        .as_mut()
        .expect("spec");
    head.containers[0].command = Some(vec!["echo".into(), "hello".into()]);
    let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
    let args = pod.spec.expect("spec").containers[0]
        .args
        .clone()
        .expect("args");
    assert!(
        args[0].starts_with(" echo  hello  && ulimit -n"),
        "{}",
        args[0]
    );

    let head = cluster
        .spec
        .head_group_spec
        .template
        .spec
        .as_mut()
        .expect("spec");
    head.containers[0].command = Some(vec!["ray start --head --block".into()]);
    let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
    let ray = &pod.spec.expect("spec").containers[0];
    assert_eq!(ray.command, Some(vec!["ray start --head --block".into()]));
    assert_eq!(ray.args, None);
    assert!(names_of(ray).contains(&"KUBERAY_GEN_RAY_START_CMD".into()));
}

#[test]
fn overwrite_annotation_keeps_the_user_command() {
    let mut cluster = sample();
    cluster.metadata.annotations = Some(BTreeMap::from([(
        annotations::OVERWRITE_CONTAINER_CMD.into(),
        "True".into(),
    )]));
    let head = cluster
        .spec
        .head_group_spec
        .template
        .spec
        .as_mut()
        .expect("spec");
    head.containers[0].args = Some(vec!["$KUBERAY_GEN_RAY_START_CMD".into()]);
    let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
    assert_eq!(
        pod.metadata
            .annotations
            .expect("annotations")
            .get(annotations::OVERWRITE_CONTAINER_CMD)
            .map(String::as_str),
        Some("true")
    );
    let ray = &pod.spec.expect("spec").containers[0];
    assert_eq!(ray.args, Some(vec!["$KUBERAY_GEN_RAY_START_CMD".into()]));
    assert_eq!(ray.command, None);
}

#[test]
fn labels_cannot_override_identity_but_can_override_the_rest() {
    let user = BTreeMap::from([
        ("ray.io/cluster".to_owned(), "other".to_owned()),
        ("ray.io/node-type".to_owned(), "worker".to_owned()),
        ("ray.io/group".to_owned(), "x".to_owned()),
        ("app.kubernetes.io/name".to_owned(), "mine".to_owned()),
        ("team".to_owned(), "a".to_owned()),
    ]);
    let labels = pod_labels(NodeType::Head, "c", "headgroup", user);
    assert_eq!(labels["ray.io/cluster"], "c");
    assert_eq!(labels["ray.io/node-type"], "head");
    assert_eq!(labels["ray.io/group"], "headgroup");
    assert_eq!(labels["app.kubernetes.io/name"], "mine");
    assert_eq!(labels["team"], "a");
}

#[test]
fn autoscaler_sidecar_and_v2_settings() {
    let mut cluster = sample();
    cluster.spec.enable_in_tree_autoscaling = Some(true);
    cluster.spec.autoscaler_options = Some(AutoscalerOptions {
        version: Some(AutoscalerVersion::V2),
        env: Some(vec![env("AUTOSCALER_UPDATE_INTERVAL_S", "10")]),
        command: Some(vec!["/bin/bash".into(), "-lc".into(), "--".into()]),
        ..Default::default()
    });
    let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
    let spec = pod.spec.expect("spec");
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some("raycluster-kuberay")
    );
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    let ray = &spec.containers[0];
    assert!(ray.args.as_ref().expect("args")[0].contains(" --no-monitor "));
    assert_eq!(names_of(ray)[0], "RAY_enable_autoscaler_v2");
    let autoscaler = &spec.containers[1];
    assert_eq!(autoscaler.name, "autoscaler");
    assert_eq!(autoscaler.image.as_deref(), Some("rayproject/ray:2.52.0"));
    assert_eq!(
        autoscaler.command.as_deref(),
        Some(&["/bin/bash".to_owned(), "-lc".into(), "--".into()][..])
    );
    assert_eq!(
        autoscaler.args.as_deref(),
        Some(&[AUTOSCALER_START_COMMAND.to_owned()][..])
    );
    assert_eq!(
        names_of(autoscaler),
        [
            "RAY_CLUSTER_NAME",
            "RAY_CLUSTER_NAMESPACE",
            "RAY_HEAD_POD_NAME",
            "KUBERAY_CRD_VER",
            "KUBERAY_GEN_AUTOSCALER_START_CMD",
            "AUTOSCALER_UPDATE_INTERVAL_S"
        ]
    );
    // Both containers share the log directory.
    for c in &spec.containers {
        assert!(
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == "/tmp/ray" && m.name == "ray-logs"),
            "{}",
            c.name
        );
    }
    let group = &cluster.spec.worker_group_specs.as_ref().expect("groups")[0];
    let worker = worker_pod(
        &cluster,
        group,
        &WorkerReplica::default(),
        &BuildOptions::default(),
    )
    .expect("builds");
    assert_eq!(
        worker.spec.expect("spec").restart_policy.as_deref(),
        Some("Never")
    );
}

#[test]
fn redis_fault_tolerance_wiring() {
    let mut cluster = sample();
    cluster.spec.gcs_fault_tolerance_options = Some(
        serde_json::from_value(json!({
            "redisAddress": "redis:6379",
            "redisUsername": {"value": "default"},
            "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "redis", "key": "password"}}}
        }))
        .expect("options"),
    );
    let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
    let annotations = pod.metadata.annotations.clone().expect("annotations");
    assert_eq!(annotations["ray.io/ft-enabled"], "true");
    assert_eq!(annotations["ray.io/external-storage-namespace"], "uid-1");
    let ray = &pod.spec.expect("spec").containers[0];
    let env = env_of(ray);
    assert_eq!(
        env[0],
        ("RAY_external_storage_namespace".into(), json!("uid-1"))
    );
    assert_eq!(env[1], ("RAY_REDIS_ADDRESS".into(), json!("redis:6379")));
    assert_eq!(env[2], ("REDIS_USERNAME".into(), json!("default")));
    assert_eq!(
        env[3],
        (
            "REDIS_PASSWORD".into(),
            json!({"secretKeyRef": {"name": "redis", "key": "password"}})
        )
    );
    let args = &ray.args.as_ref().expect("args")[0];
    assert!(
        args.contains(" --redis-password=$REDIS_PASSWORD  --redis-username=$REDIS_USERNAME "),
        "{args}"
    );

    let group = &cluster.spec.worker_group_specs.as_ref().expect("groups")[0];
    let worker = worker_pod(
        &cluster,
        group,
        &WorkerReplica::default(),
        &BuildOptions::default(),
    )
    .expect("builds");
    let worker_env = names_of(&worker.spec.expect("spec").containers[0]);
    assert_eq!(worker_env[0], "RAY_gcs_rpc_server_reconnect_timeout_s");
    assert!(!worker_env.contains(&"RAY_REDIS_ADDRESS".to_owned()));
}

#[test]
fn token_auth_env_on_ray_autoscaler_and_init_containers() {
    let mut cluster = sample();
    cluster.spec.enable_in_tree_autoscaling = Some(true);
    cluster.spec.auth_options =
        Some(serde_json::from_value(json!({"mode": "token"})).expect("auth"));
    let token = json!({"secretKeyRef": {"name": "raycluster-kuberay", "key": "auth_token"}});
    let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
    for container in &pod.spec.expect("spec").containers {
        let env = env_of(container);
        assert!(
            env.contains(&("RAY_AUTH_MODE".into(), json!("token"))),
            "{}",
            container.name
        );
        assert!(
            env.contains(&("RAY_AUTH_TOKEN".into(), token.clone())),
            "{}",
            container.name
        );
    }
    let group = &cluster.spec.worker_group_specs.as_ref().expect("groups")[0];
    let worker = worker_pod(
        &cluster,
        group,
        &WorkerReplica::default(),
        &BuildOptions::default(),
    )
    .expect("builds");
    let init = &worker.spec.expect("spec").init_containers.expect("init")[0];
    assert_eq!(
        names_of(init),
        ["RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "FQ_RAY_IP", "RAY_IP"]
    );
}

#[test]
fn multi_host_labels_and_group_resources() {
    let mut cluster = sample();
    let group = &mut cluster.spec.worker_group_specs.as_mut().expect("groups")[0];
    group.num_of_hosts = Some(2);
    group.resources = Some(BTreeMap::from([
        ("CPU".into(), "1".into()),
        ("batch_slot".into(), "4".into()),
    ]));
    group.labels = Some(BTreeMap::from([("example.com/role".into(), "cpu".into())]));
    let group = group.clone();
    let replica = WorkerReplica {
        replica_name: Some("workergroup-abcde".into()),
        replica_index: 1,
        host_index: 1,
    };
    let pod = worker_pod(&cluster, &group, &replica, &BuildOptions::default()).expect("builds");
    let labels = pod.metadata.labels.expect("labels");
    assert_eq!(
        labels["ray.io/worker-group-replica-name"],
        "workergroup-abcde"
    );
    assert_eq!(labels["ray.io/worker-group-replica-index"], "1");
    assert_eq!(labels["ray.io/replica-host-index"], "1");
    assert_eq!(labels["example.com/role"], "cpu");
    let args = &pod.spec.expect("spec").containers[0]
        .args
        .clone()
        .expect("args")[0];
    assert!(args.contains(" --labels=example.com/role=cpu "), "{args}");
    assert!(
        args.contains(" --resources='{\"batch_slot\":4}' "),
        "{args}"
    );
    assert!(args.contains(" --num-cpus=1 "), "{args}");
}

#[test]
fn http_probes_from_ray_2_53_and_rayservice_worker_readiness() {
    let mut cluster = sample();
    cluster.spec.ray_version = Some("2.53.0".into());
    let pod = head_pod(&cluster, &BuildOptions::default(), "h").expect("builds");
    let probe = pod.spec.expect("spec").containers[0]
        .liveness_probe
        .clone()
        .expect("probe");
    assert_eq!(
        probe.http_get.as_ref().and_then(|h| h.path.as_deref()),
        Some("/api/healthz")
    );
    assert_eq!(
        probe.http_get.map(|h| h.port),
        Some(IntOrString::Int(52365))
    );

    cluster.metadata.labels = Some(BTreeMap::from([(
        "ray.io/originated-from-crd".into(),
        "RayService".into(),
    )]));
    let group = cluster.spec.worker_group_specs.as_ref().expect("groups")[0].clone();
    let worker = worker_pod(
        &cluster,
        &group,
        &WorkerReplica::default(),
        &BuildOptions::default(),
    )
    .expect("builds");
    assert_eq!(
        worker.metadata.labels.expect("labels")["ray.io/serve"],
        "true"
    );
    let ray = &worker.spec.expect("spec").containers[0];
    let readiness = ray.readiness_probe.as_ref().expect("readiness");
    assert_eq!(readiness.failure_threshold, Some(1));
    let command = readiness
        .exec
        .as_ref()
        .and_then(|e| e.command.clone())
        .expect("exec");
    assert!(
        command[2].ends_with(
            "&& wget --tries 1 -T 10 -q -O- http://localhost:8000/-/healthz | grep success"
        ),
        "{}",
        command[2]
    );
    assert!(names_of(ray).contains(&"RAY_SERVE_KV_TIMEOUT_S".into()));
    assert!(ray_version_at_least("v2.60", (2, 53, 0)));
    assert!(!ray_version_at_least("nightly", (2, 53, 0)));
    assert!(!ray_version_at_least("2.52.9", (2, 53, 0)));
}

#[test]
fn user_probes_and_shm_mounts_are_kept() {
    let mut cluster = sample();
    let head = cluster
        .spec
        .head_group_spec
        .template
        .spec
        .as_mut()
        .expect("spec");
    head.containers[0].readiness_probe = Some(Probe {
        period_seconds: Some(99),
        ..Default::default()
    });
    head.containers[0].volume_mounts = Some(vec![VolumeMount {
        name: "mine".into(),
        mount_path: "/dev/shm".into(),
        ..Default::default()
    }]);
    let options = BuildOptions {
        probes_injection: true,
        ..Default::default()
    };
    let pod = head_pod(&cluster, &options, "h").expect("builds");
    let spec = pod.spec.expect("spec");
    assert_eq!(
        spec.containers[0]
            .readiness_probe
            .as_ref()
            .and_then(|p| p.period_seconds),
        Some(99)
    );
    assert!(spec.containers[0].liveness_probe.is_some());
    assert!(
        spec.volumes.is_none(),
        "no shared-mem volume when /dev/shm is mounted"
    );

    let off = BuildOptions {
        probes_injection: false,
        init_container_injection: false,
        ..Default::default()
    };
    let group = cluster.spec.worker_group_specs.as_ref().expect("groups")[0].clone();
    let worker = worker_pod(&cluster, &group, &WorkerReplica::default(), &off).expect("builds");
    let spec = worker.spec.expect("spec");
    assert!(spec.init_containers.is_none());
    assert!(spec.containers[0].liveness_probe.is_none());
}

#[test]
fn deterministic_head_name_and_operator_defaults() {
    let options = BuildOptions {
        deterministic_head_pod_name: true,
        default_pod_labels: BTreeMap::from([
            ("ray.io/cluster".into(), "x".into()),
            ("team".into(), "t".into()),
        ]),
        default_container_envs: vec![env("EXTRA", "1")],
        ..Default::default()
    };
    let pod = head_pod(&sample(), &options, "h").expect("builds");
    assert_eq!(
        pod.metadata.name.as_deref(),
        Some("raycluster-kuberay-head")
    );
    assert_eq!(pod.metadata.generate_name, None);
    let labels = pod.metadata.labels.expect("labels");
    assert_eq!(
        labels["ray.io/cluster"], "raycluster-kuberay",
        "defaults never replace"
    );
    assert_eq!(labels["team"], "t");
    assert_eq!(names_of(&pod.spec.expect("spec").containers[0])[0], "EXTRA");
}
