//! The chart's `history` values, rendered by the real `helm` from the packaged chart: off, they
//! render nothing of history; `history.record` gives the operator its flags and the storage
//! variables; `history.api.enabled` adds the `history-api` container, its Service port and the
//! review permissions its authentication needs; either without a `STORAGE_BACKEND` entry fails
//! the render with the chart's message.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};

use super::{helm_command, package_chart, repo};

/// The release's namespace and name in every render.
const NAMESPACE: &str = "raypipe-system";
const RELEASE: &str = "rp";

/// The packaged chart, with helm's state kept in `home`.
struct Chart {
    home: tempfile::TempDir,
    archive: PathBuf,
}

impl Chart {
    fn packaged() -> Chart {
        let home = tempfile::tempdir().expect("a helm home");
        let out = home.path().join("charts");
        std::fs::create_dir_all(&out).expect("a directory for the archive");
        let archive = package_chart(home.path(), &repo().join("deploy/raypipe"), &out);
        Chart { home, archive }
    }

    /// `helm template` with `values` (YAML) as a values file: the rendered documents, or helm's
    /// error output when the render fails.
    fn template(&self, values: &str) -> Result<Vec<Value>, String> {
        let file = self.home.path().join("values.yaml");
        std::fs::write(&file, values).expect("write the values file");
        let output = helm_command(self.home.path(), Path::new("/nonexistent"))
            .args(["template", RELEASE])
            .arg(&self.archive)
            .args(["--namespace", NAMESPACE, "--values"])
            .arg(&file)
            .output()
            .expect("run helm");
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        let text = String::from_utf8(output.stdout).expect("helm prints UTF-8");
        Ok(serde_yaml::Deserializer::from_str(&text)
            .map(|doc| Value::deserialize(doc).expect("helm renders YAML"))
            .filter(|doc| !doc.is_null())
            .collect())
    }

    fn render(&self, values: &str) -> Vec<Value> {
        self.template(values)
            .unwrap_or_else(|e| panic!("helm template failed:\n{e}\nvalues:\n{values}"))
    }
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    of_kind(docs, kind)
        .into_iter()
        .find(|d| d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the chart renders {kind} {name}"))
}

fn containers(docs: &[Value]) -> Vec<Value> {
    named(docs, "Deployment", "rp-raypipe")["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("the Deployment has containers")
        .clone()
}

fn container<'a>(containers: &'a [Value], name: &str) -> Option<&'a Value> {
    containers.iter().find(|c| c["name"] == name)
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().expect("strings").to_owned())
        .collect()
}

fn env_names(container: &Value) -> Vec<String> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["name"].as_str().expect("env name").to_owned())
        .collect()
}

/// The rules of every ClusterRole and Role the chart renders, each with its role's name.
fn rules(docs: &[Value]) -> Vec<(String, Value)> {
    docs.iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .flat_map(|role| {
            let name = role["metadata"]["name"].as_str().unwrap_or_default();
            role["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |rule| (name.to_owned(), rule.clone()))
        })
        .collect()
}

fn grants(rules: &[(String, Value)], group: &str, resource: &str) -> Vec<(String, Value)> {
    rules
        .iter()
        .filter(|(_, r)| {
            strings(&r["apiGroups"]).iter().any(|g| g == group)
                && strings(&r["resources"]).iter().any(|x| x == resource)
        })
        .cloned()
        .collect()
}

/// `raypipe ARGS` parses as the binary would parse it.
fn parses(args: &[String]) -> Result<raypipe::cli::Command, String> {
    <raypipe::cli::Cli as clap::Parser>::try_parse_from(
        std::iter::once("raypipe".to_owned()).chain(args.iter().cloned()),
    )
    .map(|cli| cli.command)
    .map_err(|e| e.to_string())
}

const LOCAL_STORAGE: &str = r#"
  storageEnv:
  - name: STORAGE_BACKEND
    value: local
  - name: RAYPIPE_HISTORY_LOCAL_DIR
    value: /var/lib/raypipe-history
  - name: AWS_SECRET_ACCESS_KEY
    valueFrom:
      secretKeyRef: {name: history-s3, key: secret-access-key}
"#;

fn storage_env() -> Vec<Value> {
    vec![
        json!({"name": "STORAGE_BACKEND", "value": "local"}),
        json!({"name": "RAYPIPE_HISTORY_LOCAL_DIR", "value": "/var/lib/raypipe-history"}),
        json!({"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {
            "secretKeyRef": {"name": "history-s3", "key": "secret-access-key"}}}),
    ]
}

#[test]
fn history_values_render_the_recorder_the_api_and_their_permissions() {
    let chart = Chart::packaged();

    // Defaults: nothing of history anywhere.
    let defaults = chart.render("{}");
    let text = serde_json::to_string(&defaults).expect("JSON");
    for word in [
        "history",
        "STORAGE_BACKEND",
        "tokenreviews",
        "subjectaccessreviews",
    ] {
        assert!(!text.contains(word), "the default render mentions {word:?}");
    }
    let default_containers = containers(&defaults);
    assert_eq!(default_containers.len(), 1, "only the operator container");
    assert_eq!(default_containers[0]["name"], "raypipe");

    // history.record: the flags and the storage variables, in the operator container only.
    let recorded = chart.render(&format!(
        "history:\n  record: true\n  keepRevisions: 25\n  keepDays: 30\n{LOCAL_STORAGE}"
    ));
    let recorded_containers = containers(&recorded);
    assert_eq!(
        recorded_containers.len(),
        1,
        "no history-api without api.enabled"
    );
    let operator = &recorded_containers[0];
    assert_eq!(
        operator["name"], "raypipe",
        "the operator container stays first"
    );
    let args = strings(&operator["args"]);
    for flag in [
        "--record-history",
        "--history-keep-revisions=25",
        "--history-keep-days=30",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
    }
    let env = operator["env"].as_array().expect("env");
    for entry in storage_env() {
        assert!(
            env.contains(&entry),
            "{entry} in the operator's env {env:?}"
        );
    }
    let raypipe::cli::Command::Run(run) = parses(&args).expect("the operator's args parse") else {
        panic!("the operator container runs `raypipe run`");
    };
    assert!(run.operator.tuning.record_history);
    assert_eq!(run.operator.tuning.history_keep_revisions, 25);
    assert_eq!(run.operator.tuning.history_keep_days, Some(30));
    assert!(
        of_kind(&recorded, "Service")
            .iter()
            .all(|s| s["metadata"]["name"] != "rp-raypipe-history")
    );
    assert!(grants(&rules(&recorded), "authentication.k8s.io", "tokenreviews").is_empty());

    // keepDays null: by count only, and the default count.
    let by_count = chart.render(&format!("history:\n  record: true\n{LOCAL_STORAGE}"));
    let args = strings(&containers(&by_count)[0]["args"]);
    assert!(
        args.iter().any(|a| a == "--history-keep-revisions=100"),
        "{args:?}"
    );
    assert!(
        !args.iter().any(|a| a.starts_with("--history-keep-days")),
        "{args:?}"
    );

    // history.api.enabled (without record): the container, its port, the Service and the
    // review permissions; the operator container gets neither the flags nor the storage.
    let served = chart.render(&format!(
        "history:\n  api:\n    enabled: true\n    port: 8091\n{LOCAL_STORAGE}"
    ));
    let served_containers = containers(&served);
    let operator = &served_containers[0];
    assert_eq!(operator["name"], "raypipe");
    assert!(
        !strings(&operator["args"])
            .iter()
            .any(|a| a.contains("history"))
    );
    assert!(!env_names(operator).iter().any(|n| n == "STORAGE_BACKEND"));
    let api = container(&served_containers, "history-api").expect("a history-api container");
    assert_eq!(api["image"], operator["image"], "the operator's image");
    assert_eq!(api["imagePullPolicy"], operator["imagePullPolicy"]);
    let api_args = strings(&api["args"]);
    assert_eq!(api_args[..2], ["history", "serve"]);
    assert!(
        api_args
            .windows(2)
            .any(|w| w == ["--listen", "0.0.0.0:8091"])
            || api_args.iter().any(|a| a == "--listen=0.0.0.0:8091"),
        "{api_args:?}"
    );
    assert_eq!(api["env"], json!(storage_env()));
    assert_eq!(
        api["ports"],
        json!([{"name": "history-api", "containerPort": 8091, "protocol": "TCP"}])
    );
    assert_eq!(api["readinessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(api["readinessProbe"]["httpGet"]["port"], "history-api");
    assert_eq!(api["securityContext"], operator["securityContext"]);
    assert_eq!(api["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(api["resources"], operator["resources"]);
    let raypipe::cli::Command::History(raypipe::cli::history::HistoryCommand::Serve(serve)) =
        parses(&api_args).expect("the history-api container's args parse")
    else {
        panic!("the history-api container runs `raypipe history serve`");
    };
    assert_eq!(serve.listen, ([0, 0, 0, 0], 8091).into());
    // No TLS Secret: plain HTTP, nothing mounted.
    assert_eq!(serve.tls_cert_file, None);
    assert!(api.get("volumeMounts").is_none(), "{api}");
    assert!(
        api["readinessProbe"]["httpGet"].get("scheme").is_none(),
        "{api}"
    );

    let service = named(&served, "Service", "rp-raypipe-history");
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "history-api", "port": 8091, "targetPort": "history-api", "protocol": "TCP"}])
    );
    let pod_labels =
        &named(&served, "Deployment", "rp-raypipe")["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().expect("a selector") {
        assert_eq!(
            &pod_labels[key], value,
            "the Service selects the operator Pods"
        );
    }

    let served_rules = rules(&served);
    for (group, resource) in [
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ] {
        let granted = grants(&served_rules, group, resource);
        assert_eq!(granted.len(), 1, "{resource}: {granted:?}");
        let (role, rule) = &granted[0];
        assert_eq!(strings(&rule["verbs"]), ["create"], "{resource}: {rule}");
        assert!(rule.get("resourceNames").is_none(), "{resource}: {rule}");
        // The role is bound to the chart's ServiceAccount, which the history-api container runs as.
        let bound = of_kind(&served, "ClusterRoleBinding").into_iter().any(|b| {
            b["roleRef"]["name"] == role.as_str()
                && b["subjects"].as_array().into_iter().flatten().any(|s| {
                    s["kind"] == "ServiceAccount"
                        && s["name"] == "rp-raypipe"
                        && s["namespace"] == NAMESPACE
                })
        });
        assert!(
            bound,
            "{role} is bound cluster-wide to the chart's ServiceAccount"
        );
    }
    assert_eq!(
        named(&served, "Deployment", "rp-raypipe")["spec"]["template"]["spec"]["serviceAccountName"],
        "rp-raypipe"
    );

    // Both at once, with the API's default port.
    let both = chart.render(&format!(
        "history:\n  record: true\n  api:\n    enabled: true\n{LOCAL_STORAGE}"
    ));
    let both_containers = containers(&both);
    assert_eq!(
        both_containers
            .iter()
            .map(|c| c["name"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["raypipe", "history-api"]
    );
    assert_eq!(both_containers[1]["ports"][0]["containerPort"], 8090);
    assert!(strings(&both_containers[0]["args"]).contains(&"--record-history".to_owned()));

    // history.api.tls.secretName: the Secret mounted read-only into history-api alone, its
    // files passed as flags, and the probe over HTTPS.
    let secured = chart.render(&format!(
        "history:\n  api:\n    enabled: true\n    tls:\n      secretName: history-api-cert\n{LOCAL_STORAGE}"
    ));
    let secured_containers = containers(&secured);
    let operator = &secured_containers[0];
    assert!(
        !serde_json::to_string(operator)
            .expect("JSON")
            .contains("history-api-tls"),
        "the operator container mounts nothing of the API's: {operator}"
    );
    let api = container(&secured_containers, "history-api").expect("a history-api container");
    let api_args = strings(&api["args"]);
    let raypipe::cli::Command::History(raypipe::cli::history::HistoryCommand::Serve(serve)) =
        parses(&api_args).expect("the TLS args parse")
    else {
        panic!("the history-api container runs `raypipe history serve`");
    };
    assert_eq!(
        serve.tls_cert_file.as_deref(),
        Some(Path::new("/etc/raypipe/history-api-tls/tls.crt"))
    );
    assert_eq!(
        serve.tls_key_file.as_deref(),
        Some(Path::new("/etc/raypipe/history-api-tls/tls.key"))
    );
    assert_eq!(
        api["volumeMounts"],
        json!([{"name": "history-api-tls", "mountPath": "/etc/raypipe/history-api-tls", "readOnly": true}])
    );
    assert_eq!(api["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
    assert_eq!(api["readinessProbe"]["httpGet"]["port"], "history-api");
    let volumes =
        &named(&secured, "Deployment", "rp-raypipe")["spec"]["template"]["spec"]["volumes"];
    assert!(
        volumes.as_array().into_iter().flatten().any(|v| *v
            == json!({"name": "history-api-tls", "secret": {"secretName": "history-api-cert"}})),
        "{volumes}"
    );
    // A Secret without the API: nothing of it rendered.
    let unserved = chart.render("history:\n  api:\n    tls:\n      secretName: history-api-cert\n");
    assert!(
        !serde_json::to_string(&unserved)
            .expect("JSON")
            .contains("history-api"),
        "a TLS Secret alone rendered the API"
    );

    // Without a STORAGE_BACKEND entry, either fails with the chart's message.
    let no_backend = "  storageEnv:\n  - name: S3_BUCKET\n    value: ray-history\n";
    for (values, named_value) in [
        ("history:\n  record: true\n".to_owned(), "history.record"),
        (
            format!("history:\n  record: true\n{no_backend}"),
            "history.record",
        ),
        (
            format!("history:\n  api:\n    enabled: true\n{no_backend}"),
            "history.api.enabled",
        ),
    ] {
        let error = chart
            .template(&values)
            .err()
            .unwrap_or_else(|| panic!("rendered without STORAGE_BACKEND:\n{values}"));
        assert!(
            error.contains(&format!(
                "{named_value} set, but history.storageEnv has no STORAGE_BACKEND entry"
            )),
            "{error}"
        );
    }

    // The schema keeps refusing what it does not know, and keepRevisions below 1.
    for values in [
        "history:\n  recrod: true\n",
        "history:\n  keepRevisions: 0\n",
        "history:\n  api:\n    enabled: true\n    port: 0\n",
        "history:\n  api:\n    tls:\n      secret: history-api-cert\n",
    ] {
        assert!(
            chart.template(values).is_err(),
            "the schema accepted:\n{values}"
        );
    }
}
