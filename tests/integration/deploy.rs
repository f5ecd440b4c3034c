//! The Helm chart under deploy/: rendered with the real `helm` (found or built from its Go
//! module once per machine, like the control-plane binaries), every object server-side applied
//! with dryRun=All against the real API server; the namespace-scoped RBAC applied for real and
//! shown to be enough for the operator there and nothing elsewhere. The container recipe is
//! checked for well-formedness (no engine runs here).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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
use crate::support::{self, eventually};

const HELM_VERSION: &str = "v3.22.0";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `helm`: `$RAYPIPE_HELM`, else on `PATH`, else the version-keyed cache, else built there from
/// its Go module with the ordinary `go` client (the first run on a machine takes minutes).
fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        if let Some(path) = std::env::var_os("RAYPIPE_HELM") {
            return PathBuf::from(path);
        }
        if Command::new("helm")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return PathBuf::from("helm");
        }
        let dir = raypipe::testenv::binaries::cache_root()
            .join("helm")
            .join(HELM_VERSION);
        let binary = dir.join("helm");
        if binary.exists() {
            return binary;
        }
        eprintln!(
            "building helm {HELM_VERSION} into {} (once per machine) …",
            dir.display()
        );
        std::fs::create_dir_all(&dir).expect("create the helm cache directory");
        let output = Command::new("go")
            .args([
                "install",
                "-trimpath",
                "-ldflags=-s",
                &format!("helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"),
            ])
            .env("GOBIN", &dir)
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0")
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap_or_else(|e| {
                panic!("helm is not installed and `go` cannot run ({e}); set RAYPIPE_HELM")
            });
        assert!(
            output.status.success() && binary.exists(),
            "building helm failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        binary
    })
}

/// `helm template` of the chart, as YAML documents.
fn render(release: &str, namespace: &str, values: &[&str]) -> Vec<Value> {
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

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// Server-side applies `doc` (dry run or for real) through discovery.
async fn apply(client: &kube::Client, doc: &Value, dry_run: bool) -> Result<(), String> {
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
    raypipe::cli::init_crypto();
    let client = support::client().await;
    let release_ns = support::namespace(&client, "chart").await;
    let watched = support::namespace(&client, "chart-watched").await;

    let all = render("rp", &release_ns, &["serviceMonitor.enabled=true"]);
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

    // Every object is accepted by the API server (ServiceMonitor's CRD is not installed here).
    for (label, docs) in [("all", &all), ("scoped", &scoped), ("minimal", &minimal)] {
        for doc in docs.iter().filter(|d| d["kind"] != "ServiceMonitor") {
            if let Err(e) = apply(&client, doc, true).await {
                panic!("{label}: {e}");
            }
        }
    }
}

#[tokio::test]
async fn the_namespace_scoped_rbac_is_enough_for_the_operator_and_no_more() {
    raypipe::cli::init_crypto();
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

    let _ = stop_tx.send(());
    let result = tokio::time::timeout(WAIT, operator)
        .await
        .expect("the operator stops")
        .expect("the operator task ran");
    assert!(result.is_ok(), "{result:?}");

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
