//! The chart's PrometheusRule (`deploy/raypipe/templates/prometheusrule.yaml`) checked by a real
//! Prometheus from Debian's package (`support::prometheus`): `promtool check rules` on the
//! rendered groups, `promtool test rules` with the unit tests in `tests/alerts/` (each alert
//! fires on its input and stays quiet on near misses), every series the alerts read is one the
//! operator exports, and a `prometheus` server on 127.0.0.1 that scrapes a real operator turns
//! two alerts pending from its real series.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use kube::api::{Api, PostParams};
use raypipe::api::servepipeline::ServePipeline;
use serde_json::{Value, json};

use crate::support::prometheus::{self, Server};
use crate::support::{self, eventually, fixture};

/// The rule groups (the PrometheusRule's `spec`) the chart renders for `release` in `namespace`.
fn rendered_rules(release: &str, namespace: &str) -> Value {
    let docs = crate::deploy::render(release, namespace, &["prometheusRule.enabled=true"]);
    let rules = crate::deploy::of_kind(&docs, "PrometheusRule");
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    rules[0]["spec"].clone()
}

fn alerts(groups: &Value) -> Vec<&Value> {
    groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules"))
        .collect()
}

/// Writes `groups` as a Prometheus rule file (JSON is YAML).
fn write_rules(dir: &Path, groups: &Value) {
    std::fs::write(dir.join("rules.yaml"), groups.to_string()).expect("write the rule file");
}

#[test]
fn the_rule_is_off_by_default_and_passes_promtool_check_and_its_unit_tests() {
    let defaults = crate::deploy::render("raypipe", "raypipe-system", &[]);
    assert!(crate::deploy::of_kind(&defaults, "PrometheusRule").is_empty());
    let labelled = crate::deploy::render(
        "raypipe",
        "raypipe-system",
        &[
            "prometheusRule.enabled=true",
            "prometheusRule.labels.release=kube-prometheus-stack",
        ],
    );
    let rule = crate::deploy::of_kind(&labelled, "PrometheusRule")[0];
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    assert_eq!(rule["metadata"]["namespace"], "raypipe-system");

    let dir = tempfile::tempdir().expect("a temp dir");
    let groups = rendered_rules("raypipe", "raypipe-system");
    write_rules(dir.path(), &groups);
    let (ok, output) = prometheus::run_promtool(dir.path(), &["check", "rules", "rules.yaml"]);
    assert!(ok, "promtool check rules:\n{output}");
    let names: BTreeSet<String> = alerts(&groups)
        .iter()
        .map(|a| a["alert"].as_str().expect("an alert name").to_owned())
        .collect();
    assert!(
        output.contains(&format!("SUCCESS: {} rules found", names.len())),
        "{output}"
    );

    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/alerts/raypipe.test.yaml");
    std::fs::copy(&tests, dir.path().join("raypipe.test.yaml")).expect("copy the unit tests");
    let (ok, output) =
        prometheus::run_promtool(dir.path(), &["test", "rules", "raypipe.test.yaml"]);
    assert!(ok, "promtool test rules:\n{output}");

    // Every alert has a case where it fires and one where it stays quiet.
    let cases: Value =
        serde_yaml::from_str(&std::fs::read_to_string(&tests).expect("read the unit tests"))
            .expect("the unit tests are YAML");
    let (mut fires, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for case in cases["tests"].as_array().expect("tests") {
        for check in case["alert_rule_test"].as_array().expect("alert_rule_test") {
            let name = check["alertname"].as_str().expect("alertname").to_owned();
            if check["exp_alerts"].as_array().is_some_and(|a| a.is_empty()) {
                quiet.insert(name);
            } else {
                fires.insert(name);
            }
        }
    }
    assert_eq!(fires, names, "alerts without a firing case");
    assert_eq!(quiet, names, "alerts without a quiet case");
}

#[tokio::test]
async fn every_series_the_alerts_read_is_one_the_operator_exports() {
    let exported = crate::deploy::operator_series().await;
    let groups = rendered_rules("raypipe", "raypipe-system");
    let mut unknown = Vec::new();
    for alert in alerts(&groups) {
        let expr = alert["expr"].as_str().expect("an expression");
        let names = crate::deploy::promql_metric_names(expr);
        assert!(!names.is_empty(), "{expr}");
        // `up` is the series Prometheus writes for every target it scrapes.
        unknown.extend(
            names
                .into_iter()
                .filter(|n| n != "up" && !exported.contains(n))
                .map(|n| format!("{}: {n}", alert["alert"])),
        );
    }
    assert!(
        unknown.is_empty(),
        "series the operator does not export: {unknown:?}"
    );
}

/// The alerts Prometheus reports (`/api/v1/alerts`) named `name`.
async fn alert_states(server: &Server, name: &str) -> Vec<Value> {
    server
        .api("alerts", &[])
        .await
        .and_then(|data| data["alerts"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a["labels"]["alertname"] == name)
        .collect()
}

#[tokio::test]
async fn a_real_prometheus_loads_the_rules_and_alerts_on_a_real_operators_series() {
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let ns = support::namespace(&client, "alerts").await;
    let admin = prometheus::free_loopback_address();
    let (stop_tx, operator) = support::spawn_operator(
        client.clone(),
        vec![
            "--controllers=servepipeline".to_owned(),
            format!("--namespaces={ns}"),
            format!("--operator-namespace={ns}"),
            format!("--admin-address={admin}"),
            "--lease-duration=6s".to_owned(),
            "--renew-deadline=4s".to_owned(),
            "--retry-period=500ms".to_owned(),
        ],
    );

    // The rules as the chart renders them for a release `raypipe` in this namespace, and a
    // scrape job named as the ServiceMonitor's would be (job = the metrics Service's name).
    let dir = tempfile::tempdir().expect("a temp dir");
    let groups = rendered_rules("raypipe", &ns);
    write_rules(dir.path(), &groups);
    let config = dir.path().join("prometheus.yml");
    let scrape = json!({
        // A debug build's /metrics on a loaded 2-core machine may take a second: allow two.
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [{
            "job_name": "raypipe-metrics",
            "static_configs": [{"targets": [admin.to_string()], "labels": {"namespace": ns}}]
        }]
    });
    std::fs::write(&config, scrape.to_string()).expect("write the configuration");
    let server = Server::start(dir.path(), &config);
    let selector = format!("job=\"raypipe-metrics\",namespace=\"{ns}\"");

    // The operator leads, and Prometheus reads it through the rules' own selector.
    let leader = format!("max by (namespace, job) (raypipe_leader{{{selector}}})");
    eventually(prometheus::WAIT, "Prometheus to see the leader", || async {
        let result = server.query(&leader).await?;
        (result.first()?["value"][1] == "1").then_some(())
    })
    .await;
    // Every rule evaluates without error, and nothing fires on a healthy operator (the down
    // alert is pending until the first scrape, while `up` does not exist yet).
    let rules = || async {
        let data = server.api("rules", &[]).await?;
        let rules: Vec<Value> = data["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = rules.len() == alerts(&groups).len()
            && rules.iter().all(|r| {
                r["lastEvaluation"]
                    .as_str()
                    .is_some_and(|t| !t.starts_with("0001"))
            });
        evaluated.then_some(rules)
    };
    for rule in eventually(prometheus::WAIT, "every rule to be evaluated", rules).await {
        assert_eq!(rule["health"], "ok", "{rule}\n{}", server.logs());
    }
    eventually(prometheus::WAIT, "every alert to be inactive", || async {
        rules()
            .await?
            .iter()
            .all(|r| r["state"] == "inactive")
            .then_some(())
    })
    .await;
    // The rollback alert's series is there from the start (at 0), so the first one counts.
    let rolled_back = server
        .query(&format!(
            "raypipe_pipeline_rollouts_total{{{selector},result=\"RolledBack\"}}"
        ))
        .await
        .expect("a query result");
    assert_eq!(rolled_back.len(), 1, "{rolled_back:?}");
    assert_eq!(rolled_back[0]["value"][1], "0");

    // A pipeline whose registry refuses connections: its fetches fail again and again, and the
    // alert goes pending (it fires after 30 minutes of that).
    fixture::put_token_secret(&client, &ns, "registry-token", "s3cret").await;
    let closed = prometheus::free_loopback_address();
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    pipelines
        .create(
            &PostParams::default(),
            &fixture::servepipeline(
                "unreachable",
                fixture::token_source(
                    &format!("http://{closed}/graphs/g.pb"),
                    json!({"refreshInterval": "1s"}),
                ),
            ),
        )
        .await
        .expect("create the pipeline");
    let pending = eventually(
        prometheus::WAIT,
        "RaypipeGraphFetchFailing to go pending",
        || async {
            alert_states(&server, "RaypipeGraphFetchFailing")
                .await
                .into_iter()
                .find(|a| a["state"] == "pending")
        },
    )
    .await;
    assert_eq!(pending["labels"]["namespace"], ns.as_str(), "{pending}");
    assert_eq!(pending["labels"]["severity"], "warning", "{pending}");
    assert!(
        pending["labels"]["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{pending}"
    );
    assert!(
        pending["annotations"]["description"]
            .as_str()
            .is_some_and(|d| d.contains(pending["labels"]["reason"].as_str().unwrap_or("?"))),
        "{pending}"
    );

    // The operator stops: its target goes down and the down alert goes pending.
    support::stop_operator(stop_tx, operator, Duration::from_secs(60)).await;
    let down = eventually(
        prometheus::WAIT,
        "RaypipeOperatorDown to go pending",
        || async {
            alert_states(&server, "RaypipeOperatorDown")
                .await
                .into_iter()
                .find(|a| a["state"] == "pending")
        },
    )
    .await;
    assert_eq!(down["labels"]["job"], "raypipe-metrics", "{down}");
    assert_eq!(down["labels"]["severity"], "critical", "{down}");
}
