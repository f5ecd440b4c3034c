//! Per-node calls, failures and latency on a pipeline's page, from the graph runtime's own
//! metrics (`ray_raypipe_node_requests_total`, `ray_raypipe_node_latency_ms_bucket`, which
//! Ray's metrics agent exports and the user's Prometheus scrapes) through the Prometheus HTTP
//! API. The console keeps no metrics of its own: without `--console-prometheus-url` the page
//! says where to look instead.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// The window the page sums over.
pub const WINDOW: &str = "5m";
/// How long one query may take before the page is shown without it.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Answers larger than this are refused (a page has a few dozen nodes).
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// Outcomes that are not calls (engine.OUTCOMES: a skipped node was never called).
const NOT_CALLS: [&str; 1] = ["skipped"];
/// Outcomes of calls that failed (answered by a fallback or not at all).
const FAILED: [&str; 4] = ["error", "timeout", "fallback", "shadow_failed"];

/// One node of one version over [`WINDOW`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeMetrics {
    pub node: String,
    pub calls: f64,
    pub failed: f64,
    /// `failed / calls`, when there were calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_rate: Option<f64>,
    /// The 95th percentile of its call time, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p95_ms: Option<f64>,
}

/// The nodes of one version (one Serve application).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionMetrics {
    pub role: &'static str,
    pub application: String,
    pub window: &'static str,
    pub nodes: Vec<NodeMetrics>,
}

/// One sample of an instant vector: its labels and value.
pub type Sample = (BTreeMap<String, String>, f64);

/// `text` as a PromQL string literal's content.
fn promql_string(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The label matchers of one version: its Serve application and, when the scrape adds one,
/// its namespace.
pub fn selector(namespace_label: &str, namespace: &str, application: &str) -> String {
    let mut matchers = vec![format!("application=\"{}\"", promql_string(application))];
    if !namespace_label.is_empty() {
        matchers.push(format!(
            "{namespace_label}=\"{}\"",
            promql_string(namespace)
        ));
    }
    format!("{{{}}}", matchers.join(","))
}

/// The two queries of one version: calls by node and outcome, and p95 latency by node.
pub fn queries(selector: &str) -> (String, String) {
    (
        format!(
            "sum by (node, outcome) (increase(ray_raypipe_node_requests_total{selector}[{WINDOW}]))"
        ),
        format!(
            "histogram_quantile(0.95, sum by (node, le) (rate(ray_raypipe_node_latency_ms_bucket{selector}[{WINDOW}])))"
        ),
    )
}

/// The per-node rows from the two answers (pure), sorted by node.
pub fn node_rows(calls: &[Sample], latency: &[Sample]) -> Vec<NodeMetrics> {
    let mut rows: BTreeMap<String, NodeMetrics> = BTreeMap::new();
    for (labels, value) in calls {
        let (Some(node), Some(outcome)) = (labels.get("node"), labels.get("outcome")) else {
            continue;
        };
        if NOT_CALLS.contains(&outcome.as_str()) || !value.is_finite() {
            continue;
        }
        let row = rows.entry(node.clone()).or_insert_with(|| NodeMetrics {
            node: node.clone(),
            calls: 0.0,
            failed: 0.0,
            failure_rate: None,
            p95_ms: None,
        });
        row.calls += value;
        if FAILED.contains(&outcome.as_str()) {
            row.failed += value;
        }
    }
    for (labels, value) in latency {
        if let Some(row) = labels.get("node").and_then(|n| rows.get_mut(n))
            && value.is_finite()
        {
            row.p95_ms = Some(*value);
        }
    }
    rows.into_values()
        .map(|mut row| {
            row.failure_rate = (row.calls > 0.0).then(|| row.failed / row.calls);
            row
        })
        .collect()
}

/// A Prometheus to ask.
#[derive(Clone, Debug)]
pub struct Prometheus {
    base: reqwest::Url,
    namespace_label: String,
    http: reqwest::Client,
}

impl Prometheus {
    /// `url`: the server's base URL (`http://prometheus.monitoring:9090`); `namespace_label`:
    /// the label the scrape puts the Pod's namespace in (empty: none).
    pub fn new(url: &str, namespace_label: &str, http: reqwest::Client) -> Result<Self, String> {
        let base = reqwest::Url::parse(url.trim_end_matches('/'))
            .map_err(|e| format!("the Prometheus URL {url:?}: {e}"))?;
        if !matches!(base.scheme(), "http" | "https")
            || !base.username().is_empty()
            || base.password().is_some()
        {
            return Err(format!(
                "the Prometheus URL {url:?} must be http(s) without credentials"
            ));
        }
        Ok(Prometheus {
            base,
            namespace_label: namespace_label.to_owned(),
            http,
        })
    }

    async fn query(&self, expr: &str) -> Result<Vec<Sample>, String> {
        let mut url = self.base.clone();
        url.set_path(&format!(
            "{}/api/v1/query",
            url.path().trim_end_matches('/')
        ));
        url.query_pairs_mut().append_pair("query", expr);
        let response = self
            .http
            .get(url)
            .timeout(QUERY_TIMEOUT)
            .send()
            .await
            .map_err(|e| format!("Prometheus did not answer: {}", e.without_url()))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("reading Prometheus' answer: {}", e.without_url()))?;
        if bytes.len() > MAX_ANSWER_BYTES {
            return Err("Prometheus' answer is too large".into());
        }
        let answer: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|_| format!("Prometheus answered {status} with no JSON"))?;
        if answer["status"] != "success" {
            let error: String = answer["error"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(200)
                .collect();
            return Err(format!("Prometheus refused the query ({status}): {error}"));
        }
        Ok(answer["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|sample| {
                let labels: BTreeMap<String, String> = sample["metric"]
                    .as_object()?
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect();
                let value = sample["value"][1].as_str()?.parse::<f64>().ok()?;
                Some((labels, value))
            })
            .collect())
    }

    /// The nodes of the Serve application `application` of a pipeline in `namespace`.
    pub async fn version(
        &self,
        namespace: &str,
        role: &'static str,
        application: &str,
    ) -> Result<VersionMetrics, String> {
        let selector = selector(&self.namespace_label, namespace, application);
        let (calls, latency) = queries(&selector);
        let (calls, latency) =
            futures::future::join(self.query(&calls), self.query(&latency)).await;
        Ok(VersionMetrics {
            role,
            application: application.to_owned(),
            window: WINDOW,
            nodes: node_rows(&calls?, &latency?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pairs: &[(&str, &str)], value: f64) -> Sample {
        (
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            value,
        )
    }

    #[test]
    fn rows_count_calls_failures_and_latency_per_node() {
        let calls = [
            sample(&[("node", "a"), ("outcome", "ok")], 90.0),
            sample(&[("node", "a"), ("outcome", "error")], 6.0),
            sample(&[("node", "a"), ("outcome", "timeout")], 4.0),
            sample(&[("node", "b"), ("outcome", "ok")], 50.0),
            sample(&[("node", "b"), ("outcome", "skipped")], 50.0),
            sample(&[("node", "c"), ("outcome", "skipped")], 10.0),
            sample(&[("outcome", "ok")], 1.0),
        ];
        let latency = [
            sample(&[("node", "a")], 12.5),
            sample(&[("node", "b")], f64::NAN),
        ];
        let rows = node_rows(&calls, &latency);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows[0].node, "a");
        assert_eq!((rows[0].calls, rows[0].failed), (100.0, 10.0));
        assert_eq!(rows[0].failure_rate, Some(0.1));
        assert_eq!(rows[0].p95_ms, Some(12.5));
        assert_eq!(
            (rows[1].calls, rows[1].failed, rows[1].p95_ms),
            (50.0, 0.0, None)
        );
    }

    #[test]
    fn selectors_quote_their_values_and_name_the_namespace_when_asked() {
        assert_eq!(
            selector("namespace", "ml", "demo--abc"),
            r#"{application="demo--abc",namespace="ml"}"#
        );
        assert_eq!(selector("", "ml", r#"a"b\"#), r#"{application="a\"b\\"}"#);
        let (calls, latency) = queries("{x=\"y\"}");
        assert!(calls.contains("ray_raypipe_node_requests_total{x=\"y\"}[5m]"));
        assert!(latency.starts_with("histogram_quantile(0.95"));
        crate::startup::init_crypto();
        let http = reqwest::Client::new();
        assert!(Prometheus::new("ftp://x", "", http.clone()).is_err());
        assert!(Prometheus::new("http://u:p@x", "", http.clone()).is_err());
        assert!(Prometheus::new("http://127.0.0.1:9090/", "namespace", http).is_ok());
    }
}
