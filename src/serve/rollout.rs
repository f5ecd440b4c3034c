//! The Serve config of a pipeline with a canary policy: a router application that owns the
//! pipeline's route and one application per graph version, reachable by handle only.
//!
//! Why this shape: Serve hashes an application's `import_path`, `runtime_env` and `args` into the
//! code version of every deployment in it, so a new graph in `args` restarts the whole
//! application. Two versions therefore live in two applications, and the router's `args` never
//! change: weights and targets travel in its `user_config`, which Serve applies to running
//! replicas (`reconfigure`). The router (runtime/raypipe_runtime/router.py) measures each
//! version's own traffic; [`RouterStats`] reads what it reports. Applications that this module
//! does not render (the stable version after an operator restart) are carried verbatim as JSON.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::ServeConfig;

/// The router's application builder.
pub const ROUTER_IMPORT_PATH: &str = "raypipe_runtime.router:build";
/// Version of the router's `args`; constant, so Serve never restarts the router.
pub const ROUTER_ARGS_API_VERSION: &str = "raypipe.router.v1";
/// The router's ingress deployment.
pub const ROUTER_DEPLOYMENT: &str = "raypipe-router";
/// The deployment that sums the routers' counters.
pub const STATS_DEPLOYMENT: &str = "raypipe-rollout-stats";
/// Below the pipeline's route: the routers' counters as JSON (answered by the router itself).
pub const STATS_PATH: &str = "-/raypipe/rollout";
/// Hex digits of the graph digest in a version application's name.
pub const VERSION_DIGITS: usize = 12;
/// Longest application name a canary pipeline may have (a version application appends
/// `--` and [`VERSION_DIGITS`] hex digits and Serve names stay within 63 characters).
pub const MAX_BASE_NAME: usize = 63 - 2 - VERSION_DIGITS;

/// The name of the application of one graph version: `<base>--<12 hex of the digest>`.
pub fn version_application_name(base: &str, digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    let short: String = hex.chars().take(VERSION_DIGITS).collect();
    format!("{base}--{short}")
}

/// Where the router sends a share of requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteTarget {
    pub app: String,
    pub deployment: String,
    /// A label for headers and logs (the graph's version, else its short digest).
    pub version: String,
}

/// The canary target and its share in percent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryTarget {
    #[serde(flatten)]
    pub target: RouteTarget,
    pub weight: f64,
}

/// The router's `user_config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterConfig {
    /// Counters are kept per generation; a new one starts each step from zero.
    pub generation: String,
    pub stable: RouteTarget,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryTarget>,
    pub retry_on_stable: bool,
}

/// The router application for `name` on `route_prefix`, with the runtime's `py_modules`.
pub fn router_application(
    name: &str,
    route_prefix: &str,
    runtime_py_modules: &[String],
    config: &RouterConfig,
) -> Value {
    let mut app = json!({
        "name": name,
        "route_prefix": route_prefix,
        "import_path": ROUTER_IMPORT_PATH,
        "args": {"api_version": ROUTER_ARGS_API_VERSION},
        "deployments": [
            {"name": ROUTER_DEPLOYMENT, "user_config": config},
            {"name": STATS_DEPLOYMENT, "num_replicas": 1},
        ],
    });
    if !runtime_py_modules.is_empty() {
        app["runtime_env"] = json!({ "py_modules": runtime_py_modules });
    }
    app
}

/// One graph version as an application without a route: the single application of a rendered
/// config, renamed.
pub fn version_application(rendered: &ServeConfig, name: &str) -> Option<Value> {
    let app = rendered.applications.first()?;
    let mut value = serde_json::to_value(app).ok()?;
    value["name"] = Value::String(name.to_owned());
    // An explicit null: Serve's default for a missing route prefix is "/".
    value["route_prefix"] = Value::Null;
    Some(value)
}

/// The top-level options (everything but `applications`) of a rendered config.
pub fn rendered_options(rendered: &ServeConfig) -> Value {
    let mut value = serde_json::to_value(rendered).unwrap_or_else(|_| json!({}));
    if let Some(map) = value.as_object_mut() {
        map.remove("applications");
    }
    value
}

/// The whole config: top-level `options` (an object) with `applications`.
pub fn compose(options: Value, applications: Vec<Value>) -> Value {
    let mut config = if options.is_object() {
        options
    } else {
        json!({})
    };
    config["applications"] = Value::Array(applications);
    config
}

/// The applications of a Serve config (`serveConfigV2` YAML), by name; empty when unreadable.
pub fn applications_of(serve_config_yaml: &str) -> std::collections::BTreeMap<String, Value> {
    let parsed: Value = serde_yaml::from_str(serve_config_yaml).unwrap_or(Value::Null);
    parsed["applications"]
        .as_array()
        .map(|apps| {
            apps.iter()
                .filter_map(|app| Some((app["name"].as_str()?.to_owned(), app.clone())))
                .collect()
        })
        .unwrap_or_default()
}

/// The top-level options (everything but `applications`) of a Serve config YAML.
pub fn options_of(serve_config_yaml: &str) -> Value {
    let mut parsed: Value = serde_yaml::from_str(serve_config_yaml).unwrap_or(Value::Null);
    if let Some(map) = parsed.as_object_mut() {
        map.remove("applications");
        return parsed;
    }
    json!({})
}

/// One version's counters in one generation, as the router reports them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct VersionCounters {
    pub requests: u64,
    pub errors: u64,
    pub retried: u64,
    pub sum_ms: f64,
    /// Non-cumulative counts per bucket of [`RouterStats::bounds_ms`], plus an overflow bucket.
    pub buckets: Vec<u64>,
}

/// A router replica's latest report.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RouterReplica {
    /// `None` before the replica got a configuration.
    pub generation: Option<String>,
    pub age_s: f64,
    /// A configuration the replica refused (it keeps routing by its last good one).
    pub config_error: Option<String>,
}

/// What `GET <route>/-/raypipe/rollout` answers.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RouterStats {
    /// `None` before the answering router got a configuration.
    pub generation: Option<String>,
    pub bounds_ms: Vec<f64>,
    pub routers: std::collections::BTreeMap<String, RouterReplica>,
    pub stable: VersionCounters,
    pub canary: VersionCounters,
}

impl RouterStats {
    /// Whether every router that reported lately runs `generation` (and at least one did).
    pub fn all_routers_on(&self, generation: &str) -> bool {
        !self.routers.is_empty()
            && self
                .routers
                .values()
                .all(|r| r.generation.as_deref() == Some(generation))
    }
}

impl VersionCounters {
    /// The `percentile` (0..=100) latency in ms, interpolated linearly inside the bucket that
    /// holds that rank (as Prometheus' `histogram_quantile` does), so one request more or less
    /// does not jump a whole bucket; the overflow bucket reads as the largest bound. `None`
    /// without requests.
    pub fn percentile_ms(&self, bounds_ms: &[f64], percentile: f64) -> Option<f64> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (percentile.clamp(0.0, 100.0) / 100.0) * total as f64;
        let mut seen = 0u64;
        for (index, count) in self.buckets.iter().enumerate() {
            let before = seen;
            seen = seen.saturating_add(*count);
            if *count > 0 && seen as f64 >= rank {
                let Some(upper) = bounds_ms.get(index).copied() else {
                    return bounds_ms.last().copied();
                };
                let lower = index
                    .checked_sub(1)
                    .and_then(|i| bounds_ms.get(i).copied())
                    .unwrap_or(0.0);
                let within = ((rank - before as f64) / *count as f64).clamp(0.0, 1.0);
                return Some(lower + (upper - lower) * within);
            }
        }
        bounds_ms.last().copied()
    }
}

/// The [`latency_shift_z`] from which one version counts as slower than the other: one-sided
/// 99 % confidence.
pub const SIGNIFICANT_SHIFT_Z: f64 = 2.33;

/// How far `slower`'s latencies sit above `faster`'s, as the z score of a one-sided
/// Mann-Whitney U test over the two histograms (ties within a bucket count half, with the tie
/// correction of the variance). [`SIGNIFICANT_SHIFT_Z`] or more means `slower` is slower
/// with 99 % confidence; near 0 means the two are alike. `None` when either side is empty or
/// every request of both fell in one bucket. Why a rank test: a percentile of a few dozen
/// requests on a loaded machine moves by a bucket or two by chance, while a real regression
/// shifts the whole distribution.
pub fn latency_shift_z(slower: &VersionCounters, faster: &VersionCounters) -> Option<f64> {
    let buckets = slower.buckets.len().max(faster.buckets.len());
    let at = |c: &VersionCounters, i: usize| c.buckets.get(i).copied().unwrap_or(0) as f64;
    let n1: f64 = slower.buckets.iter().map(|&c| c as f64).sum();
    let n2: f64 = faster.buckets.iter().map(|&c| c as f64).sum();
    if n1 == 0.0 || n2 == 0.0 {
        return None;
    }
    // U counts the pairs (slower, faster) where the slower side's request took longer.
    let (mut u, mut faster_below, mut ties) = (0.0, 0.0, 0.0);
    for i in 0..buckets {
        let (s, f) = (at(slower, i), at(faster, i));
        u += s * (faster_below + f / 2.0);
        faster_below += f;
        let t = s + f;
        ties += t * t * t - t;
    }
    let n = n1 + n2;
    let variance = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    if !variance.is_finite() || variance <= 0.0 {
        return None;
    }
    Some((u - n1 * n2 / 2.0) / variance.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names_are_short_and_stable() {
        assert_eq!(
            version_application_name("pipe", "sha256:0123456789abcdef0123"),
            "pipe--0123456789ab"
        );
        assert_eq!(MAX_BASE_NAME, 49);
    }

    fn counters(buckets: Vec<u64>) -> VersionCounters {
        VersionCounters {
            requests: buckets.iter().sum(),
            buckets,
            ..Default::default()
        }
    }

    #[test]
    fn percentiles_are_interpolated_inside_their_bucket() {
        let bounds = vec![1.0, 2.0, 5.0, 10.0];
        let c = counters(vec![50, 40, 5, 4, 1]);
        assert_eq!(c.percentile_ms(&bounds, 50.0), Some(1.0));
        assert_eq!(c.percentile_ms(&bounds, 25.0), Some(0.5));
        assert_eq!(c.percentile_ms(&bounds, 70.0), Some(1.5));
        assert_eq!(c.percentile_ms(&bounds, 95.0), Some(5.0));
        assert_eq!(c.percentile_ms(&bounds, 97.0), Some(7.5));
        // The overflow bucket reads as the largest bound.
        assert_eq!(c.percentile_ms(&bounds, 100.0), Some(10.0));
        assert_eq!(
            counters(vec![0, 0, 0, 0, 3]).percentile_ms(&bounds, 50.0),
            Some(10.0)
        );
        // Empty buckets before the rank are skipped, not interpolated into.
        assert_eq!(
            counters(vec![0, 0, 4, 0, 0]).percentile_ms(&bounds, 0.0),
            Some(2.0)
        );
        assert_eq!(
            VersionCounters::default().percentile_ms(&bounds, 95.0),
            None
        );
    }

    #[test]
    fn the_shift_score_tells_a_slower_version_from_chance() {
        // Every canary request slower than every stable one: far beyond 99 % confidence.
        let slow = latency_shift_z(&counters(vec![0, 0, 20, 0]), &counters(vec![30, 0, 0, 0]));
        assert!(slow.unwrap() > 5.0, "{slow:?}");
        // The same distribution on both sides scores 0, whatever its size.
        let same = latency_shift_z(&counters(vec![5, 10, 5, 1]), &counters(vec![10, 20, 10, 2]));
        assert!(same.unwrap().abs() < 1e-9, "{same:?}");
        // A faster canary scores below 0 (the gate is one-sided).
        let faster = latency_shift_z(&counters(vec![20, 0, 0]), &counters(vec![0, 0, 20]));
        assert!(faster.unwrap() < -5.0);
        // Nothing to compare: an empty side, or everything in one bucket.
        assert_eq!(latency_shift_z(&counters(vec![]), &counters(vec![1])), None);
        assert_eq!(
            latency_shift_z(&counters(vec![0, 4]), &counters(vec![0, 9])),
            None
        );
        // Shaped like the CI run that rolled a good version back (its readings: stable p95
        // 300 ms from 23 requests, canary p95 500 ms from 49; the histograms themselves are
        // made up here): a few dozen requests each with the same body. Not a shift.
        let noisy = latency_shift_z(
            &counters(vec![0, 4, 20, 14, 8, 3]),
            &counters(vec![0, 3, 10, 7, 3, 0]),
        );
        assert!(noisy.unwrap() < SIGNIFICANT_SHIFT_Z, "{noisy:?}");
    }

    proptest::proptest! {
        #[test]
        fn the_shift_score_is_antisymmetric_and_percentiles_are_monotone(
            a in proptest::collection::vec(0u64..20, 0..10),
            b in proptest::collection::vec(0u64..20, 0..10),
        ) {
            let (a, b) = (counters(a), counters(b));
            match (latency_shift_z(&a, &b), latency_shift_z(&b, &a)) {
                (Some(x), Some(y)) => proptest::prop_assert!((x + y).abs() < 1e-9, "{x} {y}"),
                (x, y) => proptest::prop_assert_eq!(x, y),
            }
            let bounds: Vec<f64> = (1..=8).map(|b| f64::from(b) * 10.0).collect();
            let mut last = 0.0;
            for p in [0.0, 10.0, 50.0, 90.0, 95.0, 99.0, 100.0] {
                if let Some(v) = a.percentile_ms(&bounds, p) {
                    proptest::prop_assert!(v >= last && v <= 80.0, "p{} {} after {}", p, v, last);
                    last = v;
                }
            }
        }
    }

    #[test]
    fn the_router_application_never_changes_its_args() {
        let config = RouterConfig {
            generation: "g1".into(),
            stable: RouteTarget {
                app: "p--a".into(),
                deployment: "raypipe-executor".into(),
                version: "1".into(),
            },
            canary: None,
            retry_on_stable: true,
        };
        let mut other = config.clone();
        other.generation = "g2".into();
        other.canary = Some(CanaryTarget {
            target: other.stable.clone(),
            weight: 10.0,
        });
        let a = router_application("p", "/p", &[], &config);
        let b = router_application("p", "/p", &[], &other);
        assert_eq!(a["args"], b["args"]);
        assert_eq!(a["import_path"], b["import_path"]);
        assert_ne!(a["deployments"], b["deployments"]);
        assert_eq!(b["deployments"][0]["user_config"]["canary"]["weight"], 10.0);
        assert!(a.get("runtime_env").is_none());
    }

    #[test]
    fn applications_are_read_back_by_name() {
        let yaml = "http_options:\n  request_timeout_s: 30\napplications:\n- name: a\n  import_path: x:y\n- name: b\n  route_prefix: null\n  import_path: x:y\n";
        let apps = applications_of(yaml);
        assert_eq!(apps.keys().collect::<Vec<_>>(), vec!["a", "b"]);
        assert!(apps["b"]["route_prefix"].is_null());
        assert_eq!(
            options_of(yaml),
            json!({"http_options": {"request_timeout_s": 30}})
        );
        assert!(applications_of("not: [yaml").is_empty());
    }
}
