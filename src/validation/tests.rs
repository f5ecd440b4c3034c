//! The admission rules of every kind, against the samples and against KubeRay's cases.

use serde_json::{Value, json};

use super::feature_gates::FeatureGates;
use super::k8s_names::is_label_key;
use super::problem::Judge;
use super::raycronjob::{is_time_zone_name, schedule_problem};
use super::rayservice::MAX_SERVE_CONFIG_BYTES;
use super::validated::{for_controller, for_webhook};
use super::{raycluster, raycronjob, rayjob, servepipeline};

/// The messages only: the rules' text is what these tests pin.
fn messages(problems: Vec<super::problem::Problem>) -> Vec<String> {
    problems.into_iter().map(|p| p.message).collect()
}

/// `Ok` when the cron parser and the admission extras accept `schedule`.
fn check_cron_schedule(schedule: &str) -> Result<(), String> {
    schedule_problem(schedule).map_or(Ok(()), Err)
}

/// KubeRay's defaults, with the RayCronJob controller on (off, every RayCronJob is refused;
/// `feature_gates::agreement` covers that).
fn gates() -> FeatureGates {
    FeatureGates::default().with(super::feature_gates::gates::RAY_CRON_JOB, true)
}

/// What `samples/ray-cluster.yaml`'s alpha cluster says the operator must run with.
fn sample_gates() -> FeatureGates {
    FeatureGates::parse(SAMPLE_GATES).expect("known gates")
}

const SAMPLE_GATES: &str = "GCSFaultToleranceEmbeddedStorage=true,RayClusterHistoryServer=true,RayClusterNetworkPolicy=true,RayClusterMTLS=true,RayCronJob=true";

/// Every object of `kind` in the `*.yaml` files of `dir`, as (file, document).
fn samples(dir: &std::path::Path) -> Vec<(String, Value)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("sample directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(&file).expect("readable sample");
            let name = file.display().to_string();
            crate::api::yaml::documents(&text)
                .expect("YAML")
                .into_iter()
                .map(move |doc| (name.clone(), doc))
        })
        .collect()
}

fn problems_of(doc: &Value) -> Option<Vec<String>> {
    problems_with(doc, &gates())
}

fn problems_with(doc: &Value, gates: &FeatureGates) -> Option<Vec<String>> {
    let gates = gates.clone();
    let kind = doc["kind"].as_str()?;
    let parse = |d: &Value| d.clone();
    Some(messages(match kind {
        "RayCluster" => for_webhook(
            &serde_json::from_value::<crate::api::RayCluster>(parse(doc)).expect("RayCluster"),
            &gates,
        ),
        "RayJob" => for_webhook(
            &serde_json::from_value::<crate::api::RayJob>(parse(doc)).expect("RayJob"),
            &gates,
        ),
        "RayService" => for_webhook(
            &serde_json::from_value::<crate::api::RayService>(parse(doc)).expect("RayService"),
            &gates,
        ),
        "RayCronJob" => for_webhook(
            &serde_json::from_value::<crate::api::RayCronJob>(parse(doc)).expect("RayCronJob"),
            &gates,
        ),
        "ServePipeline" => servepipeline::validate(
            &serde_json::from_value(parse(doc)).expect("ServePipeline"),
            &gates,
        ),
        _ => return None,
    }))
}

#[test]
fn every_sample_passes_every_rule() {
    let own = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples");
    let mut checked = 0;
    for dir in [own, crate::api::yaml::kuberay_samples_dir()] {
        for (file, doc) in samples(&dir) {
            if let Some(problems) = problems_with(&doc, &sample_gates()) {
                assert!(
                    problems.is_empty(),
                    "{file}: {} {} was refused: {problems:#?}",
                    doc["kind"],
                    doc["metadata"]["name"]
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "only {checked} sample objects found");
}

fn container() -> Value {
    json!({"name": "ray", "image": "rayproject/ray:2.52.0"})
}

fn cluster_spec() -> Value {
    json!({
        "rayVersion": "2.52.0",
        "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [container()]}}},
        "workerGroupSpecs": [
            {"groupName": "small", "replicas": 1, "minReplicas": 1, "maxReplicas": 3,
             "template": {"spec": {"containers": [container()]}}}
        ]
    })
}

fn object(kind: &str, name: &str, spec: Value) -> Value {
    let api_version = if kind == "ServePipeline" {
        "raypipe.dev/v1alpha1"
    } else {
        "ray.io/v1"
    };
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": "ns"}, "spec": spec})
}

/// Applies `change` to a valid object of `kind` and asserts a problem mentions `expected`.
fn assert_refused(kind: &str, name: &str, change: impl FnOnce(&mut Value), expected: &str) {
    let spec = match kind {
        "RayCluster" => cluster_spec(),
        "RayService" => {
            json!({"rayClusterConfig": cluster_spec(), "serveConfigV2": "applications: []\n"})
        }
        "RayJob" => json!({"entrypoint": "python job.py", "rayClusterSpec": cluster_spec()}),
        "RayCronJob" => {
            json!({"schedule": "*/5 * * * *", "jobTemplate": {"entrypoint": "python job.py", "rayClusterSpec": cluster_spec()}})
        }
        "ServePipeline" => {
            json!({"source": {"url": "https://registry.example/g.pb"}, "rayClusterConfig": cluster_spec()})
        }
        other => panic!("no template for {other}"),
    };
    let valid = object(kind, "ok", spec);
    assert_eq!(
        problems_of(&valid).expect("a known kind"),
        Vec::<String>::new(),
        "the unchanged {kind} must pass"
    );
    let mut invalid = valid;
    invalid["metadata"]["name"] = json!(name);
    change(&mut invalid);
    let problems = problems_of(&invalid).expect("a known kind");
    assert!(
        problems.iter().any(|p| p.contains(expected)),
        "expected a problem containing {expected:?}, got {problems:#?}"
    );
}

#[test]
fn cluster_rules_from_kuberay() {
    let worker = |v: &mut Value| v["spec"]["workerGroupSpecs"][0].clone();
    assert_refused(
        "RayCluster",
        "c",
        |v| {
            let w = worker(v);
            v["spec"]["workerGroupSpecs"]
                .as_array_mut()
                .expect("list")
                .push(w);
        },
        "duplicate worker group name \"small\"",
    );
    assert_refused(
        "RayCluster",
        "c",
        |v| v["spec"]["headGroupSpec"]["template"]["spec"]["containers"] = json!([]),
        "the head Pod needs at least one container",
    );
    assert_refused(
        "RayCluster",
        "c",
        |v| v["spec"]["workerGroupSpecs"][0]["minReplicas"] = json!(5),
        "minReplicas (5) must not exceed maxReplicas (3)",
    );
    assert_refused(
        "RayCluster",
        "c",
        |v| {
            v["spec"]["workerGroupSpecs"][0]["resources"] = json!({"CPU": "1"});
            v["spec"]["workerGroupSpecs"][0]["rayStartParams"] = json!({"num-cpus": "1"});
        },
        "resources and rayStartParams \"num-cpus\" cannot both be set",
    );
    assert_refused(
        "RayCluster",
        "c",
        |v| v["spec"]["workerGroupSpecs"][0]["labels"] = json!({"bad key!": "x"}),
        "is not a valid label key",
    );
    assert_refused(
        "RayCluster",
        "c",
        |v| v["spec"]["workerGroupSpecs"][0]["idleTimeoutSeconds"] = json!(60),
        "idleTimeoutSeconds needs autoscaler v2",
    );
    assert_refused(
        "RayCluster",
        "c",
        |v| {
            v["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"] =
                json!([{"name": "RAY_REDIS_ADDRESS", "value": "redis:6379"}])
        },
        "needs GCS fault tolerance",
    );
    assert_refused(
        "RayCluster",
        "c",
        |v| {
            v["metadata"]["annotations"] = json!({"ray.io/ft-enabled": "true"});
            v["spec"]["gcsFaultToleranceOptions"] = json!({"redisAddress": "redis:6379"});
        },
        "cannot be used with spec.gcsFaultToleranceOptions",
    );
    assert_refused(
        "RayCluster",
        "c",
        |v| v["spec"]["networkPolicy"] = json!({"mode": "DenyAll"}),
        "needs the RayClusterNetworkPolicy feature gate",
    );
    assert_refused(
        "RayCluster",
        "c",
        |v| {
            v["spec"]["rayVersion"] = json!("2.50.0");
            v["spec"]["authOptions"] = json!({"mode": "token"});
        },
        "mode token needs rayVersion 2.52.0 or later",
    );
    assert_refused(
        "RayCluster",
        "a-name-that-is-fifty-four-characters-long-abcdefghijkl",
        |_| {},
        "at most 53 characters",
    );
    assert_refused("RayCluster", "Bad_Name", |_| {}, "is not a DNS-1035 label");
}

#[test]
fn rayservice_rules_from_kuberay_and_ours() {
    let long = "a".repeat(48);
    assert_refused("RayService", &long, |_| {}, "at most 47 characters");
    assert_refused(
        "RayService",
        "s",
        |v| v["metadata"]["annotations"] = json!({"ray.io/initializing-timeout": "soon"}),
        "write a positive duration",
    );
    assert_refused(
        "RayService",
        "s",
        |v| v["spec"]["rayClusterConfig"]["upgradeStrategy"] = json!({"type": "Recreate"}),
        "upgradeStrategy is not allowed on a RayCluster created by a RayService",
    );
    assert_refused(
        "RayService",
        "s",
        |v| v["spec"]["upgradeStrategy"] = json!({"type": "NewClusterWithIncrementalUpgrade"}),
        "clusterUpgradeOptions is required",
    );
    assert_refused(
        "RayService",
        "s",
        |v| v["spec"]["serveConfigV2"] = json!("x".repeat(MAX_SERVE_CONFIG_BYTES + 1)),
        "at most 1048576 fit in one object",
    );
    assert_refused(
        "RayService",
        "s",
        |v| {
            v["spec"]["rayClusterConfig"]["headGroupSpec"]["headService"] =
                json!({"metadata": {"name": "mine"}})
        },
        "headService.metadata.name must be empty",
    );
    assert_refused(
        "RayService",
        "s",
        |v| v["metadata"]["annotations"] = json!({"raypipe.dev/gateway": "a/b/c"}),
        "is not a Gateway reference",
    );
    for gateway in ["edge", "infra/edge"] {
        let mut v = object(
            "RayService",
            "s",
            json!({"rayClusterConfig": cluster_spec()}),
        );
        v["metadata"]["annotations"] = json!({"raypipe.dev/gateway": gateway});
        assert_eq!(problems_of(&v), Some(vec![]), "{gateway}");
    }
    // Go durations and plain seconds are both accepted.
    for timeout in ["30m", "1h30m", "600"] {
        let mut v = object(
            "RayService",
            "s",
            json!({"rayClusterConfig": cluster_spec()}),
        );
        v["metadata"]["annotations"] = json!({"ray.io/initializing-timeout": timeout});
        assert_eq!(problems_of(&v), Some(vec![]), "{timeout}");
    }
}

#[test]
fn rayjob_and_raycronjob_rules_from_kuberay() {
    assert_refused(
        "RayJob",
        "j",
        |v| v["spec"]["suspend"] = json!(true),
        "suspend needs shutdownAfterJobFinishes",
    );
    assert_refused(
        "RayJob",
        "j",
        |v| v["spec"]["ttlSecondsAfterFinished"] = json!(10),
        "ttlSecondsAfterFinished needs shutdownAfterJobFinishes",
    );
    assert_refused(
        "RayJob",
        "j",
        |v| {
            v["spec"]
                .as_object_mut()
                .expect("map")
                .remove("rayClusterSpec");
        },
        "set rayClusterSpec (a new cluster) or clusterSelector",
    );
    assert_refused(
        "RayJob",
        "j",
        |v| v["spec"]["runtimeEnvYAML"] = json!("pip: [unclosed"),
        "runtimeEnvYAML is not valid YAML",
    );
    assert_refused(
        "RayJob",
        "j",
        |v| {
            v["spec"]["submissionMode"] = json!("InteractiveMode");
            v["spec"]["backoffLimit"] = json!(2);
        },
        "backoffLimit must be 0 or unset in InteractiveMode",
    );
    assert_refused(
        "RayJob",
        "j",
        |v| {
            v["spec"]["deletionStrategy"] = json!({"deletionRules": [
                {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 10}},
                {"policy": "DeleteWorkers", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 60}}
            ]});
        },
        "DeleteWorkers (after 60s) must not come later than DeleteCluster (after 10s)",
    );
    assert_refused(
        "RayCronJob",
        "c",
        |v| v["spec"]["schedule"] = json!("CRON_TZ=UTC */5 * * * *"),
        "must not contain TZ",
    );
    assert_refused(
        "RayCronJob",
        "c",
        |v| v["spec"]["schedule"] = json!("61 * * * *"),
        "minute field \"61\": 61 is outside 0-59",
    );
    assert_refused(
        "RayCronJob",
        "a-cron-job-name-longer-than-36-chars1",
        |_| {},
        "at most 36 characters",
    );
    assert_refused(
        "RayCronJob",
        "c",
        |v| v["spec"]["jobTemplate"]["suspend"] = json!(true),
        "spec.jobTemplate.suspend needs shutdownAfterJobFinishes",
    );
}

#[test]
fn servepipeline_rules_reuse_the_controllers_checks() {
    assert_refused(
        "ServePipeline",
        "p",
        |v| v["spec"]["source"]["refreshInterval"] = json!("500ms"),
        "source.refreshInterval: \"500ms\" is shorter than the minimum of 1s",
    );
    assert_refused(
        "ServePipeline",
        "p",
        |v| v["spec"]["source"]["url"] = json!("http://registry.example/g.pb"),
        "source.url uses plain http://",
    );
    assert_refused(
        "ServePipeline",
        &"p".repeat(48),
        |_| {},
        "may have at most 47",
    );
    assert_refused(
        "ServePipeline",
        "p",
        |v| v["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = json!(-1),
        "spec.rayClusterConfig.workerGroupSpecs[0].maxReplicas must not be negative",
    );
}

#[test]
fn cron_schedules_and_durations() {
    for ok in [
        "*/5 * * * *",
        "0 9 * * MON-FRI",
        "15,45 0-6/2 1 JAN,jul 0",
        "@hourly",
        "@every 1h30m",
    ] {
        assert!(check_cron_schedule(ok).is_ok(), "{ok}");
    }
    for bad in [
        "* * * *",
        "0 24 * * *",
        "5-1 * * * *",
        "*/0 * * * *",
        "@fortnightly",
    ] {
        assert!(check_cron_schedule(bad).is_err(), "{bad}");
    }
    // Durations the crate's one Go-duration parser refuses are refused here too, by name.
    assert!(check_cron_schedule("@every 30").is_err());
    assert!(check_cron_schedule("@every 0s").is_err());
    assert!(
        check_cron_schedule("@every 99999999999999999999h")
            .unwrap_err()
            .contains("too large")
    );
    assert!(is_label_key("ray.io/accelerator-type"));
    assert!(!is_label_key("/x"));
    assert!(is_time_zone_name("America/Argentina/Buenos_Aires"));
    assert!(!is_time_zone_name("../etc/passwd"));
}

/// One rule, one definition: the duplicate-group rule of the RayCluster book reaches the
/// webhook (every problem, led by the field) and the controller (KubeRay's first problem, in
/// its words) from the same `Problems::both` call, for a RayCluster and for the cluster inside
/// a RayJob.
#[test]
fn one_rule_reaches_the_webhook_and_the_controller() {
    let mut spec = cluster_spec();
    let group = spec["workerGroupSpecs"][0].clone();
    spec["workerGroupSpecs"] = json!([group.clone(), group]);
    let cluster: crate::api::RayCluster =
        serde_json::from_value(object("RayCluster", "c", spec.clone())).expect("RayCluster");
    let gates = gates();

    let problems = raycluster::validate(&cluster, &gates)
        .err()
        .expect("a duplicate group is refused");
    let webhook = problems.webhook();
    assert_eq!(webhook.len(), 1, "{webhook:?}");
    assert_eq!(webhook[0].field, "spec.workerGroupSpecs[1].groupName");
    assert!(webhook[0].message.contains("duplicate worker group name"));
    let controller = problems
        .first_for_controller()
        .expect("the controller refuses it");
    assert_eq!(controller.field, webhook[0].field, "one rule, one field");
    assert_eq!(controller.reason, webhook[0].reason);
    assert_eq!(
        controller.message,
        "worker group name \"small\" is used more than once"
    );
    // The entry points each judge uses agree with the book.
    assert_eq!(
        messages(for_webhook(&cluster, &gates)),
        [webhook[0].message.clone()]
    );
    assert_eq!(
        for_controller(&cluster, &gates).err().map(|p| p.message),
        Some(controller.message.clone())
    );

    // The same definition judges the cluster a RayJob makes.
    let job: crate::api::RayJob = serde_json::from_value(object(
        "RayJob",
        "j",
        json!({"entrypoint": "python job.py", "rayClusterSpec": spec}),
    ))
    .expect("RayJob");
    let problems = rayjob::validate(&job, &gates).err().expect("refused");
    assert_eq!(
        problems.webhook()[0].field,
        "spec.rayClusterSpec.workerGroupSpecs[1].groupName"
    );
    assert_eq!(
        problems.first_for_controller().map(|p| p.message.as_str()),
        Some("worker group name \"small\" is used more than once")
    );
    assert_eq!(
        problems.first_for_controller().map(|p| p.reason),
        Some(rayjob::reasons::INVALID_SPEC)
    );
}

/// Where KubeRay's webhook and controller differ, the rule is tagged, not written twice: the
/// controller alone reads the status and a worker group without replica bounds.
#[test]
fn tagged_rules_reach_only_their_judge() {
    let gates = gates();
    let mut unbounded = cluster_spec();
    unbounded["workerGroupSpecs"][0]
        .as_object_mut()
        .expect("a group")
        .remove("maxReplicas");
    let cluster: crate::api::RayCluster =
        serde_json::from_value(object("RayCluster", "c", unbounded)).expect("RayCluster");
    let problems = raycluster::validate(&cluster, &gates)
        .err()
        .expect("refused");
    assert!(
        problems.is_clear_for(Judge::Webhook),
        "{:?}",
        problems.webhook()
    );
    assert!(
        problems
            .first_for_controller()
            .is_some_and(|p| p.message.contains("must set minReplicas and maxReplicas"))
    );
    assert!(for_webhook(&cluster, &gates).is_empty());
}

/// The history server's collector, with the gate on: each of KubeRay's rules, the first
/// problem in KubeRay's words for the controller, and every problem for the webhook.
#[test]
fn the_history_collector_is_judged_with_kuberays_rules_and_words() {
    let on = gates().with(
        super::feature_gates::gates::RAY_CLUSTER_HISTORY_SERVER,
        true,
    );
    let verdict = |history: Value, head_extra: Option<Value>| {
        let mut spec = cluster_spec();
        spec["historyServerOptions"] = history;
        if let Some(extra) = head_extra {
            spec["headGroupSpec"]["template"]["spec"]["containers"]
                .as_array_mut()
                .expect("containers")
                .push(extra);
        }
        let cluster: crate::api::RayCluster =
            serde_json::from_value(object("RayCluster", "c", spec)).expect("RayCluster");
        match raycluster::validate(&cluster, &on) {
            Ok(_) => (None, Vec::new()),
            Err(problems) => (
                problems.first_for_controller().map(|p| p.message.clone()),
                messages(problems.into_vec()),
            ),
        }
    };
    let collector = |env: Value| json!({"collectorOptions": {"image": "collector:1", "env": env}});
    let var = |name: &str, value: &str| json!({"name": name, "value": value});
    let secret = |name: &str| json!({"name": name, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}});

    let accepted = [
        json!([var("STORAGE_BACKEND", "GCS"), var("GCS_BUCKET", "b")]),
        json!([var("STORAGE_BACKEND", "s3"), var("S3_REGION", "eu-west-1")]),
        json!([
            var("STORAGE_BACKEND", "AzureBlob"),
            secret("AZURE_STORAGE_CONNECTION_STRING")
        ]),
        json!([
            var("STORAGE_BACKEND", "AZUREBLOB"),
            var("AZURE_STORAGE_AUTH_MODE", " Workload_Identity "),
            var("AZURE_STORAGE_ACCOUNT_URL", "https://a")
        ]),
        json!([
            var("STORAGE_BACKEND", "ALIYUNOSS"),
            var("OSS_BUCKET", "b"),
            var("OSS_ENDPOINT", "e"),
            var("OSS_REGION", "r")
        ]),
        // A backend KubeRay does not know is the collector's to refuse.
        json!([var("STORAGE_BACKEND", "localfs")]),
    ];
    for env in accepted {
        assert_eq!(
            verdict(collector(env.clone()), None),
            (None, Vec::new()),
            "{env}"
        );
    }

    let refused: Vec<(Value, Option<Value>, &str, &str)> = vec![
        (
            json!({}),
            None,
            "historyServerOptions.collectorOptions must be set",
            "spec.historyServerOptions.collectorOptions is required",
        ),
        (
            json!({"collectorOptions": {"env": [var("STORAGE_BACKEND", "GCS"), var("GCS_BUCKET", "b")]}}),
            None,
            "historyServerOptions.collectorOptions.image must be set",
            "collectorOptions.image is required",
        ),
        (
            collector(json!([
                var("STORAGE_BACKEND", "GCS"),
                var("GCS_BUCKET", "b"),
                var("EVENTS_PORT", "1")
            ])),
            None,
            "historyServerOptions.collectorOptions.env must not contain EVENTS_PORT: it is managed by KubeRay and injected automatically into the collector container",
            "collectorOptions.env must not set EVENTS_PORT",
        ),
        (
            collector(json!([secret("STORAGE_BACKEND")])),
            None,
            "STORAGE_BACKEND environment variable must be set with a literal string value in historyServerOptions.collectorOptions.env",
            "must set STORAGE_BACKEND with a literal value",
        ),
        (
            collector(json!([
                var("STORAGE_BACKEND", "gcs"),
                var("GCS_BUCKET", "")
            ])),
            None,
            "GCS_BUCKET environment variable must be set when STORAGE_BACKEND is GCS",
            "must set GCS_BUCKET",
        ),
        (
            collector(json!([var("STORAGE_BACKEND", "S3"), var("S3_BUCKET", "b")])),
            None,
            "S3_REGION environment variable must be set when STORAGE_BACKEND is S3",
            "must set S3_REGION",
        ),
        (
            collector(json!([
                var("STORAGE_BACKEND", "AZUREBLOB"),
                var("AZURE_STORAGE_AUTH_MODE", "connection_string"),
                var("AZURE_STORAGE_ACCOUNT_URL", "https://a")
            ])),
            None,
            "AZURE_STORAGE_CONNECTION_STRING environment variable must be set when STORAGE_BACKEND is AZUREBLOB and AZURE_STORAGE_AUTH_MODE is connection_string",
            "must set AZURE_STORAGE_CONNECTION_STRING",
        ),
        (
            collector(json!([
                var("STORAGE_BACKEND", "AZUREBLOB"),
                var("AZURE_STORAGE_AUTH_MODE", "default")
            ])),
            None,
            "AZURE_STORAGE_ACCOUNT_URL environment variable must be set when STORAGE_BACKEND is AZUREBLOB and AZURE_STORAGE_AUTH_MODE is default",
            "must set AZURE_STORAGE_ACCOUNT_URL",
        ),
        (
            collector(json!([var("STORAGE_BACKEND", "AZUREBLOB")])),
            None,
            "either AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_URL environment variable must be set when STORAGE_BACKEND is AZUREBLOB",
            "must set AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_ACCOUNT_URL",
        ),
        (
            collector(json!([
                var("STORAGE_BACKEND", "ALIYUNOSS"),
                var("OSS_BUCKET", "b"),
                var("OSS_REGION", "r")
            ])),
            None,
            "OSS_ENDPOINT environment variable must be set when STORAGE_BACKEND is ALIYUNOSS",
            "must set OSS_ENDPOINT",
        ),
        (
            collector(json!([
                var("STORAGE_BACKEND", "GCS"),
                var("GCS_BUCKET", "b")
            ])),
            Some(json!({"name": "ray-history-collector", "image": "mine"})),
            "head pod template must not define a container with name 'ray-history-collector' when history server collector options are enabled",
            "spec.headGroupSpec.template must not have a container named ray-history-collector",
        ),
    ];
    for (history, head_extra, kuberay, webhook) in refused {
        let (controller, admission) = verdict(history.clone(), head_extra);
        assert_eq!(controller.as_deref(), Some(kuberay), "{history}");
        assert!(
            admission.iter().any(|m| m.contains(webhook)),
            "{history}: {admission:?}"
        );
    }

    // The webhook lists every problem; the controller, like KubeRay, the first.
    let (controller, admission) = verdict(
        json!({"collectorOptions": {"env": [var("POD_IP", "x"), var("OWNER_NAME", "y")]}}),
        None,
    );
    assert_eq!(
        controller.as_deref(),
        Some("historyServerOptions.collectorOptions.image must be set")
    );
    assert_eq!(admission.len(), 4, "{admission:?}");
}

/// What the controllers act on is what the book parsed: RayJob's mode, selected cluster,
/// runtime environment and entrypoint resources; RayCronJob's schedule and zone; RayService's
/// initializing timeout.
#[test]
fn validated_objects_carry_the_parsed_values() {
    let gates = gates();
    let job: crate::api::RayJob = serde_json::from_value(object(
        "RayJob",
        "j",
        json!({"entrypoint": "python job.py", "submissionMode": "HTTPMode",
            "clusterSelector": {"ray.io/cluster": "shared"},
            "runtimeEnvYAML": "env_vars:\n  A: b\n",
            "entrypointResources": "{\"Custom\": 1.5}"}),
    ))
    .expect("RayJob");
    let valid = rayjob::validate(&job, &gates).expect("valid");
    assert_eq!(valid.mode, crate::api::rayjob::JobSubmissionMode::HttpMode);
    assert_eq!(valid.selected_cluster.as_deref(), Some("shared"));
    assert_eq!(valid.runtime_env, Some(json!({"env_vars": {"A": "b"}})));
    assert_eq!(
        valid.entrypoint_resources,
        Some(std::collections::BTreeMap::from([(
            "Custom".to_owned(),
            1.5
        )]))
    );

    let cron: crate::api::RayCronJob = serde_json::from_value(object(
        "RayCronJob",
        "cj",
        json!({"schedule": "*/5 * * * *", "timeZone": "Europe/Paris",
            "jobTemplate": {"entrypoint": "python job.py", "rayClusterSpec": cluster_spec()}}),
    ))
    .expect("RayCronJob");
    let valid = raycronjob::validate(&cron, &gates).expect("valid");
    assert_eq!(valid.zone.iana_name(), Some("Europe/Paris"));
    assert!(valid.schedule.time_zone.is_none());

    let mut service = object(
        "RayService",
        "s",
        json!({"rayClusterConfig": cluster_spec(), "serveConfigV2": "applications: []\n"}),
    );
    service["metadata"]["annotations"] = json!({"ray.io/initializing-timeout": "90s"});
    let service: crate::api::RayService = serde_json::from_value(service).expect("RayService");
    let valid = super::rayservice::validate(&service, &gates).expect("valid");
    assert_eq!(
        valid.initializing_timeout,
        Some(std::time::Duration::from_secs(90))
    );
}
