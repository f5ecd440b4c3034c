//! The Helm chart under deploy/: rendered with the real `helm` (found or built from its Go
//! module once per machine, like the control-plane binaries), every object server-side applied
//! with dryRun=All against the real API server; the namespace-scoped RBAC applied for real and
//! shown to be enough for the operator there and nothing elsewhere. The container recipe is
//! checked for well-formedness (no engine runs here). The monitoring options (Grafana dashboards,
//! PodMonitor, ServiceMonitor) are checked against what the code exports and labels.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::discovery::Scope;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::webhook::WebhookKind;
use raypipe::webhook::registration::{self, Endpoint, FailurePolicy, Selectors};
use serde_json::{Value, json};

use crate::admin::{WAIT, pipeline};
use crate::support::tools::helm;
use crate::support::{self, eventually};

pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `helm template` of the chart, as YAML documents.
pub(crate) fn render(release: &str, namespace: &str, values: &[&str]) -> Vec<Value> {
    let mut command = Command::new(helm());
    command
        .args(["template", release])
        .arg(repo().join("deploy/raypipe"))
        .args(["--namespace", namespace, "--include-crds"]);
    for value in values {
        command.args(["--set", value]);
    }
    let output = command.output().expect("run helm");
    assert!(
        output.status.success(),
        "helm template failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    raypipe::api::yaml::documents(&String::from_utf8_lossy(&output.stdout))
        .expect("helm renders YAML")
}

pub(crate) fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The chart's operator container.
pub(crate) fn operator_container(docs: &[Value]) -> &Value {
    let deployment = of_kind(docs, "Deployment")
        .into_iter()
        .next()
        .expect("the chart renders a Deployment");
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

/// `raypipe` followed by the arguments of the chart's operator container.
pub(crate) fn operator_command(docs: &[Value]) -> Vec<String> {
    let args = operator_container(docs)["args"]
        .as_array()
        .expect("the container has args");
    std::iter::once("raypipe".to_owned())
        .chain(args.iter().filter_map(|a| a.as_str().map(str::to_owned)))
        .collect()
}

/// The chart's operator container env entries with a literal value, as `--flag=value` for the
/// `raypipe run` flag whose environment twin has that name (how `raypipe run` reads them).
fn operator_env_as_flags(docs: &[Value]) -> Vec<String> {
    use clap::CommandFactory;
    let cli = raypipe::cli::Cli::command();
    let run = cli.find_subcommand("run").expect("a run subcommand");
    let env = operator_container(docs)["env"]
        .as_array()
        .expect("the container has env");
    env.iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .map(|(name, value)| {
            let flag = run
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|env| env == name))
                .and_then(|a| a.get_long())
                .unwrap_or_else(|| panic!("{name} is no `raypipe run` flag's environment name"));
            format!("--{flag}={value}")
        })
        .collect()
}

/// Server-side applies `doc` (dry run or for real) through discovery.
pub(crate) async fn apply(client: &kube::Client, doc: &Value, dry_run: bool) -> Result<(), String> {
    let (group, version) = match doc["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .split_once('/')
    {
        Some((g, v)) => (g.to_owned(), v.to_owned()),
        None => (
            String::new(),
            doc["apiVersion"].as_str().unwrap_or_default().to_owned(),
        ),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, doc["kind"].as_str().unwrap_or_default());
    let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|e| format!("discovery of {gvk:?}: {e}"))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            doc["metadata"]["namespace"].as_str().unwrap_or("default"),
            &resource,
        ),
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    let mut params = PatchParams::apply("raypipe-chart-test").force();
    if dry_run {
        params = params.dry_run();
    }
    api.patch(name, &params, &Patch::Apply(doc))
        .await
        .map(|_| ())
        .map_err(|e| format!("{} {name}: {e}", doc["kind"]))
}

#[tokio::test]
async fn the_chart_renders_and_every_object_passes_a_server_side_dry_run() {
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let release_ns = support::namespace(&client, "chart").await;
    let watched = support::namespace(&client, "chart-watched").await;

    let all = render(
        "rp",
        &release_ns,
        &[
            "serviceMonitor.enabled=true",
            "podMonitor.enabled=true",
            "grafanaDashboards.enabled=true",
        ],
    );
    let scoped = render(
        "rp",
        &release_ns,
        &[
            &format!("watchNamespaces={{{release_ns},{watched}}}"),
            "controllers={servepipeline}",
            "webhook.certificate.mode=secret",
            "webhook.certificate.caBundle=Q0E=",
        ],
    );
    let minimal = render(
        "rp",
        &release_ns,
        &[
            "webhook.enabled=false",
            "leaderElection.enabled=false",
            "replicaCount=1",
        ],
    );

    // Every flag the chart passes is one `raypipe run` accepts, with the value it was given.
    let tuned = render(
        "rp",
        &release_ns,
        &[
            "logLevel=info\\,raypipe=debug",
            "priorityClassName=system-cluster-critical",
            "livenessProbe.periodSeconds=30",
            "podSecurityContext.runAsUser=65532",
        ],
    );
    let Ok(raypipe::cli::Cli {
        command: raypipe::cli::Command::Run(run),
    }) = <raypipe::cli::Cli as clap::Parser>::try_parse_from(operator_command(&tuned))
    else {
        panic!(
            "the chart's arguments do not parse: {:?}",
            operator_command(&tuned)
        )
    };
    assert_eq!(run.log_level.log_level, "info,raypipe=debug");
    // KubeRay's value names for the Pod's priority, security contexts and probe timings.
    let pod = &of_kind(&tuned, "Deployment")[0]["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let container = &pod["containers"][0];
    assert_eq!(container["livenessProbe"]["periodSeconds"], 30);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    // rbacEnable=false: no RBAC at all; crNamespacedRbacEnable=false: no RoleBindings in the
    // watched namespaces, the operator's own Role stays (GitOps installs).
    let is_rbac = |d: &&Value| {
        ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
            .iter()
            .any(|k| d["kind"] == *k)
    };
    let no_rbac = render("rp", &release_ns, &["rbacEnable=false"]);
    assert!(!no_rbac.iter().any(|d| is_rbac(&d)));
    let gitops = render(
        "rp",
        &release_ns,
        &[
            &format!("watchNamespaces={{{watched}}}"),
            "crNamespacedRbacEnable=false",
        ],
    );
    assert!(
        !of_kind(&gitops, "RoleBinding")
            .iter()
            .any(|b| b["roleRef"]["name"] == "rp-raypipe-controllers")
    );
    assert!(
        of_kind(&gitops, "Role")
            .iter()
            .any(|r| r["metadata"]["name"] == "rp-raypipe-operator")
    );
    // The autoscaler's Role grants pods/resize, so the operator must hold it (RBAC escalation
    // prevention); see under_the_charts_rbac_the_raycluster_controller_sets_up_an_autoscaled_cluster.
    let controllers = of_kind(&all, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "rp-raypipe-controllers")
        .expect("the controllers' ClusterRole");
    assert!(
        controllers["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .any(|r| r["resources"] == json!(["pods/resize"]) && r["verbs"] == json!(["patch"]))
    );
    // values.schema.json refuses a misspelt value.
    let mut typo = Command::new(helm());
    typo.args(["template", "rp"])
        .arg(repo().join("deploy/raypipe"))
        .args(["--set", "logLevl=debug"]);
    let output = typo.output().expect("run helm");
    assert!(!output.status.success(), "a misspelt value was accepted");
    for docs in [&all, &scoped, &minimal] {
        <raypipe::cli::Cli as clap::Parser>::try_parse_from(operator_command(docs))
            .unwrap_or_else(|e| panic!("the chart's arguments do not parse: {e}"));
    }

    // The CRDs are exactly raypipe's.
    let mut crd_names: Vec<String> = of_kind(&all, "CustomResourceDefinition")
        .iter()
        .map(|c| {
            c["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    crd_names.sort();
    let mut expected: Vec<String> = raypipe::api::crds()
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    expected.sort();
    assert_eq!(crd_names, expected);
    assert_eq!(of_kind(&all, "ServiceMonitor").len(), 1);

    // All namespaces: the controllers' ClusterRole is bound cluster-wide.
    let bound_cluster_wide = |docs: &[Value]| {
        of_kind(docs, "ClusterRoleBinding")
            .iter()
            .any(|b| b["roleRef"]["name"] == "rp-raypipe-controllers")
    };
    assert!(bound_cluster_wide(&all));
    assert!(
        of_kind(&all, "RoleBinding")
            .iter()
            .all(|b| b["roleRef"]["name"] != "rp-raypipe-controllers")
    );
    // A list of namespaces: bound there only, and the webhook only sees them.
    assert!(!bound_cluster_wide(&scoped));
    let mut bound_in: Vec<&str> = of_kind(&scoped, "RoleBinding")
        .iter()
        .filter(|b| b["roleRef"]["name"] == "rp-raypipe-controllers")
        .filter_map(|b| b["metadata"]["namespace"].as_str())
        .collect();
    bound_in.sort();
    let mut wanted = vec![release_ns.as_str(), watched.as_str()];
    wanted.sort();
    assert_eq!(bound_in, wanted);
    // Only what the ServePipeline controller needs: no Pods, no Ray clusters.
    let controller_role = of_kind(&scoped, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "rp-raypipe-controllers")
        .expect("the controllers' ClusterRole");
    let resources: Vec<String> = controller_role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .flat_map(|r| r["resources"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect();
    let grants = |resource: &str| resources.iter().any(|r| r == resource);
    assert!(grants("servepipelines/status"), "{resources:?}");
    assert!(!grants("pods"), "{resources:?}");
    assert!(!grants("rayclusters"), "{resources:?}");

    // The chart's webhooks are the operator's own (names, paths, rules, policy).
    let built = registration::validating_webhook_configuration(
        "rp-raypipe",
        &Endpoint::Service {
            namespace: release_ns.clone(),
            name: "rp-raypipe-webhook".into(),
            port: 443,
        },
        "",
        &Selectors::default(),
        FailurePolicy::Fail,
        &WebhookKind::ALL,
    );
    let built = serde_json::to_value(&built).expect("serialises");
    let rendered = of_kind(&all, "ValidatingWebhookConfiguration")
        .into_iter()
        .next()
        .expect("a webhook configuration")
        .clone();
    for (want, got) in built["webhooks"]
        .as_array()
        .expect("webhooks")
        .iter()
        .zip(rendered["webhooks"].as_array().expect("webhooks"))
    {
        for field in [
            "name",
            "rules",
            "failurePolicy",
            "sideEffects",
            "admissionReviewVersions",
        ] {
            assert_eq!(want[field], got[field], "{field} of {}", want["name"]);
        }
        assert_eq!(
            want["clientConfig"]["service"],
            got["clientConfig"]["service"]
        );
    }
    let scoped_webhook = of_kind(&scoped, "ValidatingWebhookConfiguration")[0].clone();
    assert_eq!(
        scoped_webhook["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"],
        json!(wanted)
    );

    // Every object is accepted by the API server (prometheus-operator's CRDs are not installed
    // here).
    for (label, docs) in [
        ("all", &all),
        ("scoped", &scoped),
        ("minimal", &minimal),
        ("tuned", &tuned),
        ("gitops", &gitops),
    ] {
        for doc in docs
            .iter()
            .filter(|d| d["kind"] != "ServiceMonitor" && d["kind"] != "PodMonitor")
        {
            if let Err(e) = apply(&client, doc, true).await {
                panic!("{label}: {e}");
            }
        }
    }
}

#[tokio::test]
async fn the_namespace_scoped_rbac_is_enough_for_the_operator_and_no_more() {
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let operator_ns = support::namespace(&client, "rbac-op").await;
    let watched = support::namespace(&client, "rbac-watched").await;
    let unwatched = support::namespace(&client, "rbac-other").await;
    // The release name is unique per run: the cluster-scoped objects carry it.
    let release = operator_ns.clone();

    let docs = render(
        &release,
        &operator_ns,
        &[
            &format!("watchNamespaces={{{watched}}}"),
            "controllers={servepipeline}",
            // A webhook here would point the API server at a Service IP; it is tested by URL.
            "webhook.enabled=false",
        ],
    );
    let rbac_kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    for doc in docs
        .iter()
        .filter(|d| rbac_kinds.iter().any(|k| d["kind"] == *k))
    {
        apply(&client, doc, false).await.expect("apply the RBAC");
    }
    let service_account = format!("{release}-raypipe");

    // The operator, as its service account.
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&support::control_plane().kubeconfig)
            .expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("a config");
    config.auth_info.impersonate = Some(format!(
        "system:serviceaccount:{operator_ns}:{service_account}"
    ));
    let operator_client = kube::Client::try_from(config).expect("a client");

    let (stop_tx, operator) = support::spawn_operator(
        operator_client.clone(),
        vec![
            "--controllers=servepipeline".to_owned(),
            format!("--namespaces={watched}"),
            format!("--operator-namespace={operator_ns}"),
            "--admin-address=127.0.0.1:0".to_owned(),
            "--lease-duration=6s".to_owned(),
            "--renew-deadline=4s".to_owned(),
            "--retry-period=500ms".to_owned(),
        ],
    );

    // It leads with a Lease in its own namespace and reconciles the watched namespace.
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &watched);
    pipelines
        .create(&PostParams::default(), &pipeline("scoped", None))
        .await
        .expect("create a pipeline");
    let status = eventually(WAIT, "the operator to write the status", || async {
        pipelines.get("scoped").await.ok()?.status
    })
    .await;
    assert_eq!(status.phase.as_deref(), Some("Failed"), "{status:?}");
    let lease = Api::<Lease>::namespaced(client.clone(), &operator_ns)
        .get("raypipe-leader")
        .await
        .expect("the operator's Lease");
    assert!(lease.spec.and_then(|s| s.holder_identity).is_some());

    // Nothing beyond: another namespace, or all namespaces, is forbidden to it.
    for api in [
        Api::<ServePipeline>::namespaced(operator_client.clone(), &unwatched),
        Api::<ServePipeline>::all(operator_client.clone()),
    ] {
        match api.list(&Default::default()).await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
            other => panic!("listing outside the watched namespace was not forbidden: {other:?}"),
        }
    }
    match Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
        operator_client.clone(),
        &operator_ns,
    )
    .list(&Default::default())
    .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403),
        other => panic!("the operator can list Secrets in its own namespace: {other:?}"),
    }

    crate::support::stop_operator(stop_tx, operator, WAIT).await;

    for doc in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "ClusterRoleBinding")
    {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let _ = if doc["kind"] == "ClusterRole" {
            Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
                .delete(name, &DeleteParams::default())
                .await
                .map(|_| ())
        } else {
            Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
                .delete(name, &DeleteParams::default())
                .await
                .map(|_| ())
        };
    }
}

/// Every KubeRay switch of `raypipe run` is one chart value under `kuberay.`, set in the
/// Deployment under its KubeRay environment name; the chart's defaults are the flags' defaults
/// and a value set in the chart is the value the operator parses.
/// KubeRay's `batchScheduler` values: `name` (or the deprecated `enabled`, Volcano) becomes
/// `--batch-scheduler`, and the operator may write that scheduler's PodGroups; both together
/// are refused at render time, as KubeRay's operator refuses them at start.
#[test]
fn kuberays_batch_scheduler_values_become_the_flag_and_podgroup_rbac() {
    let podgroup_groups = |docs: &[Value]| -> Vec<String> {
        of_kind(docs, "ClusterRole")
            .iter()
            .flat_map(|role| role["rules"].as_array().cloned().unwrap_or_default())
            .filter(|rule| {
                rule["resources"]
                    .as_array()
                    .is_some_and(|r| r.contains(&json!("podgroups")))
            })
            .flat_map(|rule| rule["apiGroups"].as_array().cloned().unwrap_or_default())
            .filter_map(|g| g.as_str().map(str::to_owned))
            .collect()
    };
    let plain = render("r", "ops", &[]);
    assert!(
        !operator_command(&plain)
            .iter()
            .any(|a| a.contains("batch-scheduler"))
    );
    assert!(podgroup_groups(&plain).is_empty());
    for (values, flag, group) in [
        (
            "batchScheduler.name=volcano",
            "--batch-scheduler=volcano",
            Some("scheduling.volcano.sh"),
        ),
        (
            "batchScheduler.enabled=true",
            "--enable-batch-scheduler",
            Some("scheduling.volcano.sh"),
        ),
        (
            "batchScheduler.name=scheduler-plugins",
            "--batch-scheduler=scheduler-plugins",
            Some("scheduling.x-k8s.io"),
        ),
        (
            "batchScheduler.name=yunikorn",
            "--batch-scheduler=yunikorn",
            None,
        ),
        (
            "batchScheduler.name=kai-scheduler",
            "--batch-scheduler=kai-scheduler",
            None,
        ),
    ] {
        let docs = render("r", "ops", &[values]);
        let command = operator_command(&docs);
        assert!(command.iter().any(|a| a == flag), "{values}: {command:?}");
        assert!(
            <raypipe::cli::Cli as clap::Parser>::try_parse_from(&command).is_ok(),
            "{values}: the arguments parse"
        );
        assert_eq!(
            podgroup_groups(&docs),
            group.into_iter().map(str::to_owned).collect::<Vec<_>>(),
            "{values}"
        );
    }
    let both = Command::new(helm())
        .args(["template", "r"])
        .arg(repo().join("deploy/raypipe"))
        .args([
            "--set",
            "batchScheduler.enabled=true",
            "--set",
            "batchScheduler.name=yunikorn",
        ])
        .output()
        .expect("run helm");
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("not both"));
}

#[test]
fn every_kuberay_switch_is_a_chart_value_under_its_environment_name() {
    let parse = |docs: &[Value]| {
        let argv = operator_command(docs)
            .into_iter()
            .chain(operator_env_as_flags(docs));
        match <raypipe::cli::Cli as clap::Parser>::try_parse_from(argv) {
            Ok(raypipe::cli::Cli {
                command: raypipe::cli::Command::Run(run),
            }) => run.operator.kuberay,
            other => panic!("the chart's arguments and env do not parse: {other:?}"),
        }
    };
    let defaults = render("rp", "raypipe-system", &[]);
    let container = operator_container(&defaults);
    for name in raypipe::config::kuberay::environment_names() {
        assert!(
            container["env"]
                .as_array()
                .expect("env")
                .iter()
                .any(|e| e["name"] == name),
            "the chart does not set {name}"
        );
    }
    assert_eq!(
        parse(&defaults),
        raypipe::config::kuberay::KubeRayArgs::default()
    );

    let tuned = parse(&render(
        "rp",
        "raypipe-system",
        &[
            "kuberay.clusterDomain=corp.example",
            "kuberay.rayClusterDefaultRequeueSeconds=30",
            "kuberay.enableRandomPodDelete=true",
            "kuberay.enableGcsFtRedisCleanup=false",
            "kuberay.enableInitContainerInjection=false",
            "kuberay.enableProbesInjection=false",
            "kuberay.enableLoginShell=true",
            "kuberay.enableDeterministicHeadPodName=true",
            "kuberay.enableRayHeadClusterIpService=true",
            "kuberay.enableZeroDowntime=false",
            "kuberay.deleteRayJobCrAfterJobFinishes=true",
            "kuberay.rayJobStatusCheckTimeoutSeconds=60",
            "kuberay.rayJobDeploymentStatusTransitionGracePeriodSeconds=90",
        ],
    ));
    let seconds = std::time::Duration::from_secs;
    assert_eq!(
        tuned,
        raypipe::config::kuberay::KubeRayArgs {
            cluster_domain: "corp.example".to_owned(),
            raycluster_default_requeue_seconds: seconds(30),
            enable_random_pod_delete: true,
            enable_gcs_ft_redis_cleanup: false,
            enable_init_container_injection: false,
            enable_probes_injection: false,
            enable_login_shell: true,
            enable_deterministic_head_pod_name: true,
            enable_ray_head_cluster_ip_service: true,
            enable_zero_downtime: false,
            delete_rayjob_cr_after_job_finishes: true,
            rayjob_status_check_timeout_seconds: seconds(60),
            rayjob_deployment_status_transition_grace_period_seconds: seconds(90),
        }
    );
    // The schema refuses a misspelt switch.
    let output = Command::new(helm())
        .args(["template", "rp"])
        .arg(repo().join("deploy/raypipe"))
        .args(["--set", "kuberay.enableZeroDowntme=false"])
        .output()
        .expect("run helm");
    assert!(!output.status.success(), "a misspelt switch was accepted");
}

#[test]
fn the_container_recipe_is_well_formed() {
    const INSTRUCTIONS: [&str; 18] = [
        "FROM",
        "RUN",
        "CMD",
        "LABEL",
        "EXPOSE",
        "ENV",
        "ADD",
        "COPY",
        "ENTRYPOINT",
        "VOLUME",
        "USER",
        "WORKDIR",
        "ARG",
        "ONBUILD",
        "STOPSIGNAL",
        "HEALTHCHECK",
        "SHELL",
        "MAINTAINER",
    ];
    let path = repo().join("deploy/Containerfile");
    let text = std::fs::read_to_string(&path).expect("deploy/Containerfile");
    // Join continuation lines, drop comments and blank lines.
    let mut instructions: Vec<String> = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if pending.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(start) => {
                pending.push_str(start);
                pending.push(' ');
            }
            None => {
                pending.push_str(trimmed);
                instructions.push(std::mem::take(&mut pending));
            }
        }
    }
    assert!(pending.is_empty(), "a continuation line ends the file");
    let mut stages: Vec<String> = Vec::new();
    let mut final_user = None;
    let mut entrypoint = None;
    for (i, instruction) in instructions.iter().enumerate() {
        let (keyword, rest) = instruction
            .split_once(' ')
            .unwrap_or((instruction.as_str(), ""));
        assert!(
            INSTRUCTIONS.contains(&keyword),
            "{keyword:?} is not an instruction: {instruction}"
        );
        if i == 0 {
            assert!(
                keyword == "FROM" || keyword == "ARG",
                "must start with FROM: {instruction}"
            );
        }
        match keyword {
            "FROM" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                assert!(
                    words.len() == 1 || (words.len() == 3 && words[1].eq_ignore_ascii_case("AS")),
                    "FROM image [AS name]: {instruction}"
                );
                stages.push(words.get(2).map(|s| (*s).to_owned()).unwrap_or_default());
                final_user = None;
            }
            "COPY" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                if let Some(stage) = words.iter().find_map(|w| w.strip_prefix("--from=")) {
                    assert!(
                        stages[..stages.len() - 1].iter().any(|s| s == stage),
                        "COPY --from={stage} names no earlier stage"
                    );
                } else {
                    for source in &words[..words.len() - 1] {
                        assert!(
                            repo().join(source).exists(),
                            "COPY source {source} is not in the repository"
                        );
                    }
                }
            }
            "USER" => final_user = Some(rest.to_owned()),
            "ENTRYPOINT" | "CMD" => {
                let value: Vec<String> = serde_json::from_str(rest)
                    .unwrap_or_else(|e| panic!("{keyword} must be a JSON array ({e}): {rest}"));
                if keyword == "ENTRYPOINT" {
                    entrypoint = Some(value);
                }
            }
            _ => {}
        }
    }
    assert!(stages.len() >= 2, "a build stage and a runtime stage");
    let user = final_user.expect("the runtime stage sets USER");
    let uid: u32 = user
        .split(':')
        .next()
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("USER must be numeric for runAsNonRoot: {user}"));
    assert_ne!(uid, 0, "the image must not run as root");
    assert_eq!(
        entrypoint.expect("an ENTRYPOINT"),
        vec!["/usr/local/bin/raypipe".to_owned()]
    );
}

/// A cluster where KubeRay once stored `ray.io/v1alpha1` objects lists v1alpha1 in its CRDs'
/// `status.storedVersions`, and the API server refuses a CRD that drops a stored version. raypipe's
/// CRDs keep v1alpha1 listed (neither served nor stored), so they take over KubeRay's CRDs there
/// (`kubectl apply --server-side --force-conflicts -f crds/`), the old objects stay readable
/// through v1, and v1alpha1 itself is no longer served. Runs on a control plane of its own: the
/// shared one already has raypipe's CRDs.
#[tokio::test]
async fn raypipes_crds_replace_kuberays_where_v1alpha1_objects_were_stored() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinition, CustomResourceValidation, JSONSchemaProps,
    };
    use kube::CustomResourceExt;
    use raypipe::api::RayCluster;
    use raypipe::devenv::control_plane::{ControlPlane, ControlPlaneOptions};

    raypipe::startup::init_crypto();
    let plane = ControlPlane::start(ControlPlaneOptions {
        install_crds: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .expect("a control plane of its own");
    let client = plane.client().await.expect("client");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = "rayclusters.ray.io";

    // KubeRay's CRD as an older release installed it: v1alpha1 stored, v1 served beside it.
    let mut kuberay = RayCluster::crd();
    let mut alpha = kuberay.spec.versions[0].clone();
    alpha.name = "v1alpha1".into();
    alpha.storage = true;
    alpha.schema = Some(CustomResourceValidation {
        open_api_v3_schema: Some(JSONSchemaProps {
            type_: Some("object".into()),
            x_kubernetes_preserve_unknown_fields: Some(true),
            ..Default::default()
        }),
    });
    kuberay.spec.versions[0].storage = false;
    kuberay.spec.versions.insert(0, alpha);
    crds.patch(
        name,
        &PatchParams::apply("helm").force(),
        &Patch::Apply(&kuberay),
    )
    .await
    .expect("KubeRay's CRD");
    let alpha_api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &kube::api::ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("ray.io", "v1alpha1", "RayCluster"),
            "rayclusters",
        ),
    );
    let old: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1alpha1", "kind": "RayCluster",
        "metadata": {"name": "stored-by-kuberay", "namespace": "default"},
        "spec": {"rayVersion": "2.52.0", "headGroupSpec": {"rayStartParams": {}, "template": {
            "spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}}}
    }))
    .expect("an object");
    eventually(WAIT, "v1alpha1 to be served by KubeRay's CRD", || async {
        alpha_api.create(&PostParams::default(), &old).await.ok()
    })
    .await;
    let stored = crds
        .get(name)
        .await
        .expect("the CRD")
        .status
        .and_then(|s| s.stored_versions)
        .unwrap_or_default();
    assert!(stored.iter().any(|v| v == "v1alpha1"), "{stored:?}");

    // What raypipe's CRD was before (v1 only) is refused there, as issue 15 reports.
    let force = PatchParams::apply(raypipe::devenv::control_plane::CRD_FIELD_MANAGER).force();
    match crds
        .patch(name, &force, &Patch::Apply(&RayCluster::crd()))
        .await
    {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(e.message.contains("storedVersions"), "{}", e.message);
        }
        other => panic!("a CRD without v1alpha1 was accepted: {other:?}"),
    }
    // raypipe's CRD (what `crds/` and the chart hold) takes over.
    let ours = raypipe::api::crds()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .expect("raypipe's RayCluster CRD");
    raypipe::devenv::control_plane::install_crds(&client, std::slice::from_ref(&ours), WAIT)
        .await
        .expect("raypipe's CRD replaces KubeRay's");
    let read: RayCluster = eventually(WAIT, "the old object through v1", || async {
        Api::<RayCluster>::namespaced(client.clone(), "default")
            .get_opt("stored-by-kuberay")
            .await
            .ok()
            .flatten()
    })
    .await;
    assert_eq!(read.spec.ray_version.as_deref(), Some("2.52.0"));
    eventually(WAIT, "v1alpha1 to be no longer served", || async {
        match alpha_api.get("stored-by-kuberay").await {
            Err(kube::Error::Api(e)) if e.code == 404 => Some(()),
            _ => None,
        }
    })
    .await;
    // The shipped files are the generated CRDs.
    let shipped = std::fs::read_to_string(repo().join("crds").join(format!("{name}.yaml")))
        .expect("crds/ holds the CRD");
    let shipped: CustomResourceDefinition = serde_yaml::from_str(&shipped).expect("a CRD");
    assert_eq!(shipped.spec.versions, ours.spec.versions);
}

/// The RayCluster controller, as the chart's ServiceAccount with the chart's RBAC, sets up an
/// autoscaled cluster: its autoscaler Role grants `pods/resize`, and the API server's
/// escalation check lets the operator create that Role only if it holds `pods/resize` itself
/// (which the chart did not grant before).
#[tokio::test]
async fn under_the_charts_rbac_the_raycluster_controller_sets_up_an_autoscaled_cluster() {
    use k8s_openapi::api::rbac::v1::Role;
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let operator_ns = support::namespace(&client, "rbac-rc-op").await;
    let watched = support::namespace(&client, "rbac-rc-watched").await;
    let release = operator_ns.clone();
    let docs = render(
        &release,
        &operator_ns,
        &[
            &format!("watchNamespaces={{{watched}}}"),
            "controllers={raycluster}",
            "webhook.enabled=false",
        ],
    );
    for doc in docs.iter().filter(|d| {
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ]
        .iter()
        .any(|k| d["kind"] == *k)
    }) {
        apply(&client, doc, false).await.expect("apply the RBAC");
    }
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&support::control_plane().kubeconfig)
            .expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("a config");
    config.auth_info.impersonate = Some(format!(
        "system:serviceaccount:{operator_ns}:{release}-raypipe"
    ));
    let operator_client = kube::Client::try_from(config).expect("a client");
    let (stop_tx, operator) = support::spawn_operator(
        operator_client,
        vec![
            "--controllers=raycluster".to_owned(),
            format!("--namespaces={watched}"),
            format!("--operator-namespace={operator_ns}"),
            "--admin-address=127.0.0.1:0".to_owned(),
            "--leader-election=false".to_owned(),
        ],
    );
    let cluster = json!({
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": "autoscaled", "namespace": watched},
        "spec": {
            "rayVersion": "2.52.0",
            "enableInTreeAutoscaling": true,
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}},
            "workerGroupSpecs": [{"groupName": "workers", "replicas": 0, "minReplicas": 0,
                "maxReplicas": 2, "rayStartParams": {}, "template": {"spec": {"containers": [
                    {"name": "ray-worker", "image": "rayproject/ray:2.52.0"}]}}}]
        }
    });
    apply(&client, &cluster, false)
        .await
        .expect("create the cluster");
    let roles: Api<Role> = Api::namespaced(client.clone(), &watched);
    let role = eventually(WAIT, "the autoscaler's Role", || async {
        roles
            .list(&Default::default())
            .await
            .expect("list Roles")
            .items
            .into_iter()
            .find(|r| {
                r.rules.iter().flatten().any(|rule| {
                    rule.resources
                        .iter()
                        .flatten()
                        .any(|res| res == "pods/resize")
                })
            })
    })
    .await;
    assert!(
        role.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "RayCluster" && o.name == "autoscaled"),
        "{role:?}"
    );
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(WAIT, operator).await;
}

/// The names a query uses for the samples of a metric family of `kind` (OpenMetrics `# TYPE`).
fn sample_names(family: &str, kind: &str) -> Vec<String> {
    match kind {
        "counter" => vec![format!("{family}_total")],
        "histogram" => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|suffix| format!("{family}{suffix}"))
            .collect(),
        _ => vec![family.to_owned()],
    }
}

/// Every sample name the operator's registry exports (the KubeRay-compatible set included),
/// from its own exposition after one sample of each kind was recorded (a labelled family shows
/// no `# TYPE` line before its first sample).
pub(crate) async fn operator_series() -> BTreeSet<String> {
    use raypipe::admin::kube_requests::KubeRequestMetricsLayer;
    use raypipe::admin::metrics::{FetchOutcome, Metrics, MetricsOptions};
    use std::time::Duration;
    use tower::{Layer, ServiceExt};
    let metrics = Metrics::with_options(MetricsOptions { kuberay: true });
    let took = Duration::from_millis(5);
    metrics
        .reconcile_started("servepipeline")
        .finish(Some("kube"));
    let _queue = metrics.queue("servepipeline");
    metrics.pipeline_update_stage("render", took);
    metrics.graph_fetched(FetchOutcome::Fetched, took);
    metrics.graph_fetch_failed("Unauthorized", took);
    metrics.admission_reviewed("RayCluster", true);
    let api_server =
        tower::service_fn(|_: http::Request<()>| async { http::Response::builder().body(()) });
    let request = http::Request::get("/api/v1/namespaces/ns/pods")
        .body(())
        .expect("a request");
    KubeRequestMetricsLayer::new(&metrics)
        .layer(api_server)
        .oneshot(request)
        .await
        .expect("an answer");
    let text = metrics.encode().expect("the registry encodes");
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.split_once(' '))
        .flat_map(|(family, kind)| sample_names(family, kind))
        .collect()
}

/// Every sample name the graph runtime exports through Ray: the names
/// `runtime/raypipe_runtime/metrics.py` gives its `counter(…)` and `histogram(…)` calls, with the
/// `ray_` prefix Ray's metrics agent adds.
fn runtime_series() -> BTreeSet<String> {
    let source = std::fs::read_to_string(repo().join("runtime/raypipe_runtime/metrics.py"))
        .expect("read the runtime's metrics module");
    // Calls may span lines (ruff formats them): look for them with all white space removed.
    let compact: String = source.split_whitespace().collect();
    let mut names = BTreeSet::new();
    for line in source.lines() {
        let Some((constant, value)) = line.split_once(" = \"") else {
            continue;
        };
        let Some(family) = value.strip_suffix('"') else {
            continue;
        };
        for kind in ["counter", "histogram"] {
            if compact.contains(&format!("{kind}({constant},")) {
                names.extend(sample_names(&format!("ray_{family}"), kind));
            }
        }
    }
    names
}

/// The metric names a PromQL expression reads: identifiers outside label matchers, ranges,
/// strings and grouping lists (`by (…)`, `on (…)`, …) that are neither a function, a keyword
/// nor a Grafana variable (`$name`, `${name}`).
pub(crate) fn promql_metric_names(expr: &str) -> Vec<String> {
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    // Aggregations may put their grouping before the parenthesis (`sum by (le) (…)`).
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "group_left",
        "group_right",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    // The index after the bracket that closes the one at `start`, skipping strings.
    let skip_group = |start: usize| {
        let (open, close) = match chars[start] {
            '{' => ('{', '}'),
            '[' => ('[', ']'),
            _ => ('(', ')'),
        };
        let (mut depth, mut i, mut quote) = (0usize, start, None);
        while i < chars.len() {
            let c = chars[i];
            match quote {
                Some(_) if c == '\\' => i += 1,
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == '"' || c == '\'' || c == '`' => quote = Some(c),
                None if c == open => depth += 1,
                None if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                None => {}
            }
            i += 1;
        }
        chars.len()
    };
    let mut names = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' || c == '[' || c == '"' || c == '\'' || c == '`' {
            i = if c == '{' || c == '[' {
                skip_group(i)
            } else {
                let end = chars[i + 1..].iter().position(|&q| q == c);
                end.map_or(chars.len(), |e| i + e + 2)
            };
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                i = skip_group(i);
            }
            while i < chars.len() && is_name_char(chars[i]) {
                i += 1;
            }
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (is_name_char(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if is_name_char(c) {
            let start = i;
            while i < chars.len() && is_name_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let called = chars.get(next) == Some(&'(');
            if called && GROUPING.contains(&word.as_str()) {
                i = skip_group(next);
            } else if !called && !KEYWORDS.contains(&word.as_str()) {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn promql_metric_names_are_found_outside_matchers_ranges_and_grouping() {
    let expr = "histogram_quantile(0.95, sum by (graph, le) (rate(a_bucket{graph=~\"$graph\", \
                x=\"}{by\"}[$__rate_interval]))) / on (graph) group_left ${factor} * b offset 5m \
                or sum without (node) (c:recorded)";
    assert_eq!(promql_metric_names(expr), ["a_bucket", "b", "c:recorded"]);
}

/// The PromQL of a dashboard: every panel target, and the series each `label_values(…)`
/// template variable reads.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let mut queries: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if variable["type"] == "query" {
            let query = variable["query"]["query"].as_str().expect("a query");
            let series = query
                .strip_prefix("label_values(")
                .and_then(|q| q.rsplit_once(','))
                .map(|(series, _label)| series.to_owned())
                .unwrap_or_else(|| panic!("{query} is no label_values query"));
            queries.push(series);
        }
    }
    queries
}

/// Whether a Kubernetes label selector (matchLabels, matchExpressions) selects `labels`.
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let match_labels = selector["matchLabels"].as_object().into_iter().flatten();
    let by_label = match_labels
        .into_iter()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten();
    let by_expression = expressions.into_iter().all(|e| {
        let value = e["key"].as_str().and_then(|k| labels.get(k));
        let listed = |v: &String| {
            e["values"]
                .as_array()
                .is_some_and(|vs| vs.iter().any(|x| x == v.as_str()))
        };
        match e["operator"].as_str() {
            Some("In") => value.is_some_and(listed),
            Some("NotIn") => !value.is_some_and(listed),
            Some("Exists") => value.is_some(),
            Some("DoesNotExist") => value.is_none(),
            other => panic!("unknown selector operator {other:?}"),
        }
    });
    by_label && by_expression
}

#[tokio::test]
async fn the_monitoring_options_render_dashboards_of_real_series_and_select_raypipes_ray_pods() {
    use raypipe::controllers::raycluster::builders::pod::pod_labels;
    use raypipe::kuberay::keys::{labels, ports};
    use raypipe::kuberay::names::NodeType;

    // Defaults: none of it.
    let defaults = render("rp", "ops", &[]);
    for kind in ["PodMonitor", "ServiceMonitor"] {
        assert!(of_kind(&defaults, kind).is_empty(), "{kind} by default");
    }
    assert!(
        !of_kind(&defaults, "ConfigMap")
            .iter()
            .any(|c| !c["metadata"]["labels"]["grafana_dashboard"].is_null()),
        "dashboards by default"
    );

    let docs = render(
        "rp",
        "ops",
        &[
            "grafanaDashboards.enabled=true",
            "grafanaDashboards.namespace=monitoring",
            "grafanaDashboards.label=team_dashboard",
            "grafanaDashboards.labelValue=yes",
            "grafanaDashboards.folderAnnotation=dashboards/folder",
            "grafanaDashboards.folder=Model serving",
            "podMonitor.enabled=true",
            "serviceMonitor.enabled=true",
        ],
    );

    // Dashboards: one ConfigMap each, in the sidecar's convention.
    let dashboards: Vec<Value> = of_kind(&docs, "ConfigMap")
        .into_iter()
        .filter(|c| c["metadata"]["labels"]["team_dashboard"] == "yes")
        .flat_map(|c| {
            assert_eq!(c["metadata"]["namespace"], "monitoring");
            assert_eq!(
                c["metadata"]["annotations"]["dashboards/folder"],
                "Model serving"
            );
            let data = c["data"].as_object().expect("data");
            assert_eq!(data.len(), 1, "one dashboard per ConfigMap");
            data.iter()
                .map(|(file, json)| {
                    assert!(file.ends_with(".json"), "{file}");
                    serde_json::from_str(json.as_str().expect("text"))
                        .unwrap_or_else(|e| panic!("{file} is no JSON: {e}"))
                })
                .collect::<Vec<Value>>()
        })
        .collect();
    let mut titles: Vec<&str> = dashboards
        .iter()
        .filter_map(|d| d["title"].as_str())
        .collect();
    titles.sort();
    assert_eq!(titles, ["raypipe operator", "raypipe pipelines"]);

    let operator = operator_series().await;
    let runtime = runtime_series();
    assert!(operator.contains("raypipe_reconcile_total"), "{operator:?}");
    assert!(
        operator.contains("process_cpu_seconds_total"),
        "{operator:?}"
    );
    assert_eq!(runtime.len(), 8, "{runtime:?}");
    let mut used = BTreeSet::new();
    for dashboard in &dashboards {
        let title = &dashboard["title"];
        // A Prometheus data source chosen on the dashboard, used by every panel and query.
        let variables = dashboard["templating"]["list"]
            .as_array()
            .expect("variables");
        assert!(
            variables
                .iter()
                .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
            "{title}"
        );
        for panel in dashboard["panels"].as_array().expect("panels") {
            if panel["type"] != "row" {
                assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
            }
        }
        for query in dashboard_queries(dashboard) {
            let names = promql_metric_names(&query);
            assert!(!names.is_empty(), "{title}: no series in {query}");
            for name in names {
                assert!(
                    operator.contains(&name) || runtime.contains(&name),
                    "{title}: {name} is exported by neither the operator nor the runtime ({query})"
                );
                used.insert(name);
            }
        }
    }
    // The pipelines dashboard shows every runtime family; it selects by namespace, graph and
    // version.
    for family in [
        "ray_raypipe_node_requests_total",
        "ray_raypipe_node_latency_ms_bucket",
        "ray_raypipe_graph_overhead_ms_bucket",
        "ray_raypipe_graph_requests_total",
    ] {
        assert!(used.contains(family), "no dashboard shows {family}");
    }
    let pipelines = dashboards
        .iter()
        .find(|d| d["title"] == "raypipe pipelines")
        .expect("the pipelines dashboard");
    for name in ["namespace", "graph", "version"] {
        assert!(
            pipelines["templating"]["list"]
                .as_array()
                .expect("variables")
                .iter()
                .any(|v| v["name"] == name),
            "no {name} variable"
        );
    }

    // The PodMonitor selects the head and worker Pods raypipe builds, in every namespace, on
    // their metrics port; not the Redis cleanup Job's Pod.
    let monitors = of_kind(&docs, "PodMonitor");
    assert_eq!(monitors.len(), 1);
    let spec = &monitors[0]["spec"];
    assert_eq!(spec["namespaceSelector"], json!({"any": true}));
    assert_eq!(spec["podMetricsEndpoints"][0]["port"], ports::METRICS_NAME);
    for node_type in [NodeType::Head, NodeType::Worker] {
        let pod = pod_labels(node_type, "c", "g", BTreeMap::new());
        assert!(selects(&spec["selector"], &pod), "{pod:?}");
    }
    let cleanup = BTreeMap::from([
        (
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        ),
        (
            labels::NODE_TYPE.to_owned(),
            labels::REDIS_CLEANUP.to_owned(),
        ),
    ]);
    assert!(!selects(&spec["selector"], &cleanup));
    let listed = render(
        "rp",
        "ops",
        &[
            "podMonitor.enabled=true",
            "podMonitor.namespaceSelector.any=null",
            "podMonitor.namespaceSelector.matchNames={team-a}",
        ],
    );
    assert_eq!(
        of_kind(&listed, "PodMonitor")[0]["spec"]["namespaceSelector"],
        json!({"matchNames": ["team-a"]})
    );
    // The ServiceMonitor keeps the series' own labels (kuberay_* carry namespace and name).
    let service_monitor = of_kind(&docs, "ServiceMonitor");
    assert_eq!(
        service_monitor[0]["spec"]["endpoints"][0]["honorLabels"],
        true
    );
}

#[test]
fn the_console_is_off_by_default_and_one_value_turns_it_on() {
    let rules_of = |docs: &[Value], role: &str| -> Vec<Value> {
        of_kind(docs, "ClusterRole")
            .into_iter()
            .find(|r| r["metadata"]["name"] == role)
            .unwrap_or_else(|| panic!("no ClusterRole {role}"))["rules"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let has = |list: &Value, item: &str| list.as_array().is_some_and(|l| l.contains(&json!(item)));
    let granting = |rules: &[Value], group: &str, resource: &str, verb: &str| {
        rules
            .iter()
            .filter(|r| {
                has(&r["apiGroups"], group)
                    && has(&r["resources"], resource)
                    && has(&r["verbs"], verb)
            })
            .count()
    };
    let reviews = |docs: &[Value]| {
        let cluster = rules_of(docs, "rp-raypipe-cluster");
        (
            granting(&cluster, "authentication.k8s.io", "tokenreviews", "create"),
            granting(
                &cluster,
                "authorization.k8s.io",
                "subjectaccessreviews",
                "create",
            ),
        )
    };
    let console_service = |docs: &[Value]| {
        of_kind(docs, "Service")
            .into_iter()
            .find(|s| s["metadata"]["name"] == "rp-raypipe-console")
            .cloned()
    };
    let proxy_roles = |docs: &[Value]| -> Vec<String> {
        of_kind(docs, "ClusterRole")
            .into_iter()
            .filter(|r| {
                r["rules"].as_array().is_some_and(|rules| {
                    rules
                        .iter()
                        .any(|rule| has(&rule["resources"], "rayclusters/proxy"))
                })
            })
            .filter_map(|r| r["metadata"]["name"].as_str().map(str::to_owned))
            .collect()
    };
    let console_args = |docs: &[Value]| match <raypipe::cli::Cli as clap::Parser>::try_parse_from(
        operator_command(docs),
    ) {
        Ok(raypipe::cli::Cli {
            command: raypipe::cli::Command::Run(run),
        }) => run.operator.console,
        other => panic!("the chart's arguments do not parse: {other:?}"),
    };
    let named = |list: &Value, name: &str| -> Value {
        list.as_array()
            .and_then(|l| l.iter().find(|e| e["name"] == name).cloned())
            .unwrap_or(Value::Null)
    };

    // Off by default: no flag, no Service, no port, no reviews, no proxy grant.
    let defaults = render("rp", "ops", &[]);
    let command = operator_command(&defaults);
    assert!(
        !command.iter().any(|a| a.starts_with("--console")),
        "{command:?}"
    );
    assert!(console_args(&defaults).console_address.is_none());
    assert!(console_service(&defaults).is_none());
    assert!(named(&operator_container(&defaults)["ports"], "console").is_null());
    assert_eq!(reviews(&defaults), (0, 0));
    assert!(proxy_roles(&defaults).is_empty());
    // The history API alone still grants the reviews; with the console too, once each.
    let history = [
        "history.api.enabled=true",
        "history.storageEnv[0].name=STORAGE_BACKEND",
        "history.storageEnv[0].value=s3",
    ];
    assert_eq!(reviews(&render("rp", "ops", &history)), (1, 1));
    let both: Vec<&str> = history
        .iter()
        .copied()
        .chain(["console.enabled=true"])
        .collect();
    assert_eq!(reviews(&render("rp", "ops", &both)), (1, 1));

    // One value turns it on: plain HTTP on 8081, bearer tokens only, the dashboard front.
    let on = render("rp", "ops", &["console.enabled=true"]);
    let args = console_args(&on);
    assert_eq!(
        args.console_address,
        Some("0.0.0.0:8081".parse().expect("an address"))
    );
    assert!(args.console_tls_cert.is_none() && args.console_cookie_key_file.is_none());
    assert!(args.console_oidc_issuer.is_none());
    assert!(args.console_secure_cookies && args.console_dashboards);
    assert!(args.console_audiences.is_empty() && args.console_history_url.is_none());
    let port = named(&operator_container(&on)["ports"], "console");
    assert_eq!(port["containerPort"], 8081);
    let service = console_service(&on).expect("the console Service");
    assert_eq!(service["spec"]["ports"][0]["port"], 8081);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "console");
    assert_eq!(
        service["spec"]["selector"],
        of_kind(&on, "Deployment")[0]["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(reviews(&on), (1, 1));
    // The console lists Events (core group), which no controller does.
    let controllers = rules_of(&on, "rp-raypipe-controllers");
    assert_eq!(granting(&controllers, "", "events", "list"), 1);
    // The dashboard front: every verb on rayclusters/proxy in the RayCluster editor (aggregated
    // into edit and admin), none in any viewer (as Kubernetes' services/proxy).
    assert_eq!(proxy_roles(&on), ["rp-raypipe-raycluster-editor"]);
    let editor = rules_of(&on, "rp-raypipe-raycluster-editor");
    for verb in ["get", "create", "update", "patch", "delete"] {
        assert_eq!(
            granting(&editor, "ray.io", "rayclusters/proxy", verb),
            1,
            "{verb}"
        );
    }
    // With the ServePipeline controller alone, the console still may read RayClusters (for the
    // dashboard front) and their auth token Secrets.
    let alone = render(
        "rp",
        "ops",
        &["console.enabled=true", "controllers={servepipeline}"],
    );
    let controllers = rules_of(&alone, "rp-raypipe-controllers");
    assert!(granting(&controllers, "ray.io", "rayclusters", "get") >= 1);
    assert!(granting(&controllers, "", "secrets", "get") >= 1);
    // Without the dashboard front: no proxy grant.
    let no_front = render(
        "rp",
        "ops",
        &["console.enabled=true", "console.dashboards=false"],
    );
    assert!(!console_args(&no_front).console_dashboards);
    assert!(proxy_roles(&no_front).is_empty());

    // Everything set: TLS, a sealed-cookie key, browser sign-in with a confidential client.
    let full = render(
        "rp",
        "ops",
        &[
            "console.enabled=true",
            "console.port=9443",
            "webhook.port=9444",
            "console.tls.secretName=console-tls",
            "console.cookieKeySecret=console-cookie",
            "console.secureCookies=true",
            "console.historyUrl=https://history.example.com",
            "console.prometheusUrl=http://prometheus.monitoring:9090",
            "console.prometheusNamespaceLabel=kubernetes_namespace",
            "console.audiences={raypipe\\,kubernetes}",
            "console.oidc.issuer=https://dex.example.com",
            "console.oidc.clientId=raypipe",
            "console.oidc.clientSecretSecret=console-oidc",
            "console.oidc.redirectUrl=https://raypipe.example.com/oauth2/callback",
            "console.oidc.usernameClaim=sub",
            "console.oidc.usernamePrefix=oidc:",
            "console.oidc.groupsPrefix=oidc:",
        ],
    );
    let args = console_args(&full);
    assert_eq!(
        args.console_address,
        Some("0.0.0.0:9443".parse().expect("an address"))
    );
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    assert_eq!(
        path(&args.console_tls_cert).as_deref(),
        Some("/etc/raypipe/console-tls/tls.crt")
    );
    assert_eq!(
        path(&args.console_tls_key).as_deref(),
        Some("/etc/raypipe/console-tls/tls.key")
    );
    assert_eq!(
        path(&args.console_cookie_key_file).as_deref(),
        Some("/etc/raypipe/console-cookie/cookie-key")
    );
    assert_eq!(
        path(&args.console_oidc_client_secret_file).as_deref(),
        Some("/etc/raypipe/console-oidc/client-secret")
    );
    assert_eq!(args.console_audiences, ["raypipe", "kubernetes"]);
    assert_eq!(
        args.console_history_url.as_deref(),
        Some("https://history.example.com")
    );
    assert_eq!(
        args.console_prometheus_url.as_deref(),
        Some("http://prometheus.monitoring:9090")
    );
    assert_eq!(
        args.console_prometheus_namespace_label,
        "kubernetes_namespace"
    );
    assert_eq!(
        args.console_oidc_issuer.as_deref(),
        Some("https://dex.example.com")
    );
    assert_eq!(args.console_oidc_client_id, "raypipe");
    assert_eq!(
        args.console_oidc_redirect_url.as_deref(),
        Some("https://raypipe.example.com/oauth2/callback")
    );
    assert_eq!(args.console_oidc_username_claim, "sub");
    assert_eq!(args.console_oidc_username_prefix, "oidc:");
    assert_eq!(args.console_oidc_groups_claim, "groups");
    assert_eq!(args.console_oidc_groups_prefix, "oidc:");
    // Each Secret is mounted read-only where its flag points, with only the key it needs.
    let container = operator_container(&full);
    let pod = &of_kind(&full, "Deployment")[0]["spec"]["template"]["spec"];
    for (volume, secret, dir, keys) in [
        (
            "console-tls",
            "console-tls",
            "/etc/raypipe/console-tls",
            &["tls.crt", "tls.key"][..],
        ),
        (
            "console-cookie",
            "console-cookie",
            "/etc/raypipe/console-cookie",
            &["cookie-key"][..],
        ),
        (
            "console-oidc",
            "console-oidc",
            "/etc/raypipe/console-oidc",
            &["client-secret"][..],
        ),
    ] {
        let mount = named(&container["volumeMounts"], volume);
        assert_eq!(mount["mountPath"], dir, "{volume}");
        assert_eq!(mount["readOnly"], true, "{volume}");
        let source = &named(&pod["volumes"], volume)["secret"];
        assert_eq!(source["secretName"], secret, "{volume}");
        let items: Vec<&str> = source["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|i| i["key"].as_str())
            .collect();
        assert_eq!(items, keys, "{volume}");
    }
    let service = console_service(&full).expect("the console Service");
    assert_eq!(service["spec"]["ports"][0]["port"], 9443);
    assert_eq!(service["spec"]["ports"][0]["name"], "https");
    // The rendered settings are ones the console starts with (the mounted files stand in).
    let dir = std::env::temp_dir().join(format!("raypipe-console-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let cookie_key = dir.join("cookie-key");
    let client_secret = dir.join("client-secret");
    std::fs::write(
        &cookie_key,
        "c2VhbGVkLWNvb2tpZXMtbmVlZC0zMi1ieXRlcy1vci1tb3JlCg==\n",
    )
    .expect("write the cookie key");
    std::fs::write(&client_secret, "s3cr3t\n").expect("write the client secret");
    let mut started = args.clone();
    started.console_cookie_key_file = Some(cookie_key);
    started.console_oidc_client_secret_file = Some(client_secret);
    let config = raypipe::console::config_from_args(&started, None, &[])
        .unwrap_or_else(|e| panic!("the console refuses the chart's settings: {e}"))
        .expect("the console is on");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(config.tls.is_some() && config.secure_cookies);
    let oidc = config.oidc.expect("browser sign-in");
    assert_eq!(oidc.client_secret.as_deref(), Some("s3cr3t"));

    // Refused: browser sign-in without a redirect URL or a cookie key; a port already taken.
    for (values, says) in [
        (
            &[
                "console.enabled=true",
                "console.oidc.issuer=https://dex.example.com",
                "console.cookieKeySecret=k",
            ][..],
            "redirectUrl",
        ),
        (
            &[
                "console.enabled=true",
                "console.oidc.issuer=https://dex.example.com",
                "console.oidc.redirectUrl=https://raypipe.example.com/oauth2/callback",
            ][..],
            "cookieKeySecret",
        ),
        (
            &["console.enabled=true", "console.port=8080"][..],
            "console.port",
        ),
        (&["console.enabeld=true"][..], "schema"),
    ] {
        let mut command = Command::new(helm());
        command
            .args(["template", "rp"])
            .arg(repo().join("deploy/raypipe"));
        for value in values {
            command.args(["--set", value]);
        }
        let output = command.output().expect("run helm");
        assert!(!output.status.success(), "{values:?} was accepted");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{values:?}: {stderr}");
    }
}
