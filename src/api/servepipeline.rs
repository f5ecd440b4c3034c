//! `raypipe.dev/v1alpha1` ServePipeline: a model graph in a registry, served on Ray.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::raycluster::RayClusterSpec;
use super::rayservice::RayServiceUpgradeStrategy;

/// The first 12 hex digits of a digest (`sha256:0123456789ab…` → `0123456789ab`): how
/// versions are named in Events, application names and the plugin's tables.
pub fn short_digest(digest: &str) -> String {
    digest
        .strip_prefix("sha256:")
        .unwrap_or(digest)
        .chars()
        .take(12)
        .collect()
}

/// A one-shot command to the pipeline's canary, as `<verb> <digest>` (`promote sha256:…`):
/// naming the digest binds the command to the canary its writer saw, so it never acts on a
/// later one. The controller removes the annotation once it has acted on it (or found it
/// does not apply, with a Warning Event).
pub const ROLLOUT_COMMAND_ANNOTATION: &str = "raypipe.dev/rollout-command";

/// What [`ROLLOUT_COMMAND_ANNOTATION`] asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutVerb {
    /// The canary takes all traffic now, skipping its remaining steps (once it runs).
    Promote,
    /// The canary leaves now; its digest is remembered like a rolled-back one.
    Abort,
    /// A digest remembered as rolled back or aborted may be rolled out again.
    Retry,
}

impl RolloutVerb {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutVerb::Promote => "promote",
            RolloutVerb::Abort => "abort",
            RolloutVerb::Retry => "retry",
        }
    }
}

/// A parsed rollout command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutCommand {
    pub verb: RolloutVerb,
    pub digest: String,
}

impl RolloutCommand {
    /// The annotation's value.
    pub fn annotation(&self) -> String {
        format!("{} {}", self.verb.as_str(), self.digest)
    }

    /// Parses an annotation value; the error says what is wrong with it.
    pub fn parse(value: &str) -> Result<RolloutCommand, String> {
        let mut words = value.split_whitespace();
        let (Some(verb), Some(digest), None) = (words.next(), words.next(), words.next()) else {
            return Err("expected \"<promote|abort|retry> sha256:<hex>\"".to_owned());
        };
        let verb = match verb {
            "promote" => RolloutVerb::Promote,
            "abort" => RolloutVerb::Abort,
            "retry" => RolloutVerb::Retry,
            _ => return Err("the verb must be promote, abort or retry".to_owned()),
        };
        let hex = digest.strip_prefix("sha256:").unwrap_or_default();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("the digest must be sha256: and 64 hex digits".to_owned());
        }
        Ok(RolloutCommand {
            verb,
            digest: digest.to_owned(),
        })
    }
}

/// A model graph (a protobuf DAG) fetched from a registry and served as one Ray Serve
/// application on a RayService that this pipeline owns.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "raypipe.dev",
    version = "v1alpha1",
    kind = "ServePipeline",
    namespaced,
    shortname = "spl",
    category = "raypipe",
    status = "ServePipelineStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".status.graph.nodes"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.graph.version"}"#,
    printcolumn = r#"{"name":"RayService","type":"string","jsonPath":".status.rayServiceName"}"#,
    printcolumn = r#"{"name":"Rollout","type":"string","jsonPath":".status.rollout.phase"}"#,
    printcolumn = r#"{"name":"Canary","type":"string","jsonPath":".status.rollout.canary.version"}"#,
    printcolumn = r#"{"name":"Weight","type":"integer","jsonPath":".status.rollout.canary.weight"}"#,
    printcolumn = r#"{"name":"Digest","type":"string","priority":1,"jsonPath":".status.source.digest"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ServePipelineSpec {
    /// Where the model graph lives.
    pub source: GraphSource,
    /// The RayCluster the pipeline runs on; passed unchanged to the RayService.
    pub ray_cluster_config: RayClusterSpec,
    /// Defaults for the rendered Serve application.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<ServeOptions>,
    /// Passed to the RayService (`NewCluster`, `None`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_strategy: Option<RayServiceUpgradeStrategy>,
    /// Suspends the RayService (its cluster is deleted; the pipeline keeps its state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// How a new graph version goes out: at once (default) or as a canary judged on its own
    /// traffic and rolled back by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutPolicy>,
    /// How much of this pipeline's history the operator keeps when it records history
    /// (`raypipe run --record-history`): the operator's defaults when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<HistoryPolicy>,
}

/// Retention of a pipeline's revision records, enforced by the operator that writes them. A
/// revision that still serves, and the newest one, are always kept.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HistoryPolicy {
    /// Keep the newest this many revisions (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub keep_revisions: Option<i32>,
    /// Remove revisions unchanged for longer than this many days (default: kept by count only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 36500))]
    pub keep_days: Option<i32>,
}

/// How a new graph version replaces the serving one.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPolicy {
    /// `Immediate` (the new Serve config replaces the old one in one step) or `Canary` (the new
    /// version runs beside the serving one and takes traffic step by step).
    #[serde(default)]
    pub strategy: RolloutStrategy,
    /// Canary steps in order; after the last one the new version takes all traffic. Default:
    /// 10 % for 30s, then 50 % for 30s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub steps: Vec<RolloutStep>,
    /// What a canary's own traffic must show at every step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gates: Option<RolloutGates>,
    /// A canary not promoted this long after it started is rolled back (default `10m`,
    /// between `10s` and `24h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"), length(max = 64))]
    pub progress_deadline: Option<String>,
    /// A request the canary fails (status 5xx) is sent again to the stable version, so clients
    /// see no failure from a bad canary (default true; counted as `retriedOnStable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on_stable: Option<bool>,
    /// A step whose window ends with fewer than `gates.minRequests` canary requests moves on
    /// anyway (default false: it waits for evidence, and the deadline rolls it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote_without_traffic: Option<bool>,
    /// Hold the canary where it is: it takes no further step and is not promoted, and the
    /// progress deadline stops counting until this is false again. Gates still judge the
    /// traffic it takes, so a failing canary is still rolled back. A new graph still starts its
    /// canary, at step 0 (no traffic). `kubectl raypipe rollout pause|resume` sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum RolloutStrategy {
    #[default]
    Immediate,
    Canary,
}

/// One canary step: the share of requests the new version answers, and for how long that share
/// is observed before the next step.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStep {
    /// Percent of requests sent to the new version (1 to 100).
    #[schemars(range(min = 1, max = 100))]
    pub weight: i32,
    /// How long the step is observed (default `30s`, between `1s` and `24h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"), length(max = 64))]
    pub pause: Option<String>,
}

/// Limits judged on the canary's own requests in each step.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutGates {
    /// Largest share of canary requests that may fail (status 5xx), 0 to 1 (default 0.05).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub max_error_rate: Option<f64>,
    /// The latency percentile compared: 50, 90, 95 (default) or 99.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_percentile: Option<i32>,
    /// Largest canary/stable ratio of that percentile (default 1.5, at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1.0, max = 100.0))]
    pub max_latency_ratio: Option<f64>,
    /// A canary slower than stable by less than this many milliseconds passes the latency
    /// gate whatever the ratio (default 10: a few milliseconds are noise, not a regression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 600000.0))]
    pub latency_tolerance_ms: Option<f64>,
    /// Canary requests a step needs before it is judged (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub min_requests: Option<i64>,
}

/// A model graph at an HTTP(S) address (`url`) or in an OCI registry (`oci`): exactly one.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GraphSource {
    /// HTTPS address of the protobuf graph. `http://` only with `allowInsecureHttp`. Empty
    /// when `oci` is set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(regex(pattern = r"^(https?://[^\s]+)?$"))]
    pub url: String,
    /// The graph as an OCI artifact (pushed with `raypipe dag push`):
    /// `registry.example/team/graph:tag`, `…@sha256:<hex>`, or both (the digest is fetched).
    /// The registry host is always explicit (no default registry, no implicit `:latest`). A
    /// tag is polled every `refreshInterval` with the manifest digest as the change signal; a
    /// digest never changes and is fetched once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub oci: Option<String>,
    /// Secret with the registry credentials for `oci`. Key `.dockerconfigjson` (a
    /// `kubernetes.io/dockerconfigjson` Secret, as image pulls use): the entry for the
    /// registry host, `auth` or `username`/`password`, used in the registry's token flow. Any
    /// other key: a registry token sent as `Authorization: Bearer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretKeySelector>,
    /// Require a cosign signature over the manifest digest (only with `oci`); an artifact not
    /// signed as required is refused and the running version stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<SourceVerification>,
    /// Secret (in the pipeline's namespace) holding the bearer token sent as
    /// `Authorization: Bearer <token>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_secret_ref: Option<SecretKeySelector>,
    /// Pin: the hex sha256 of the graph; anything else is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(sha256:)?[0-9a-f]{64}$"))]
    pub sha256: Option<String>,
    /// How often to look for a new version (a duration such as `30s`, `5m`, `1h`); the
    /// request carries the last ETag, so an unchanged graph costs one 304. Unset: fetched only
    /// when the pipeline or its Secret changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Between `1s` and `24h`.
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"), length(max = 64))]
    pub refresh_interval: Option<String>,
    /// Secret (in the pipeline's namespace) with PEM CA certificates to trust for this source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle_secret_ref: Option<SecretKeySelector>,
    /// Total time allowed for one download (default `30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Between `1s` and `2m`.
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"), length(max = 64))]
    pub timeout: Option<String>,
    /// Largest graph accepted, in bytes (default 16 MiB, at most 64 MiB); enforced while
    /// downloading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 67108864))]
    pub max_bytes: Option<i64>,
    /// Allows a plain `http://` URL (the token then travels unencrypted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_insecure_http: Option<bool>,
    /// Largest code layer accepted from an `oci` artifact (`raypipe dag push --code`), in bytes
    /// (default 64 MiB, at most 1 GiB); checked against the manifest before it is downloaded.
    /// The operator's `--code-memory-budget` bounds what all served layers hold together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1073741824))]
    pub max_code_bytes: Option<i64>,
}

/// How the signature of an OCI graph is verified. Exactly one way: today a public key; a
/// `keyless` identity (Fulcio certificate issuer and subject, Rekor) is the planned sibling
/// field.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SourceVerification {
    /// Secret key holding the PEM public key (ECDSA P-256, as `cosign generate-key-pair`
    /// writes to `cosign.pub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key_secret_ref: Option<SecretKeySelector>,
}

/// A key in a Secret of the pipeline's own namespace.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct SecretKeySelector {
    pub name: String,
    pub key: String,
}

/// Defaults for the rendered Serve application; the graph's own values win where it sets them,
/// except `deploymentOverrides`, which a platform team uses to resize a running pipeline.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServeOptions {
    /// Serve application name (default: the pipeline's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_name: Option<String>,
    /// Route prefix, e.g. `/sentiment` (default: the graph's, else `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_prefix: Option<String>,
    /// End-to-end request timeout at the Serve proxy, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_s: Option<f64>,
    /// Keep-alive timeout of the Serve proxy, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_alive_timeout_s: Option<i32>,
    /// Per-node overrides, keyed by node name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deployment_overrides: BTreeMap<String, DeploymentOverride>,
}

/// Overrides for one node's Serve deployment.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub num_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_ongoing_requests: Option<i32>,
}

/// What the controller observed and did.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServePipelineStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Pending`, `Deploying`, `Ready`, `Degraded` (serving the last good graph while a newer
    /// one is refused), `Failed` (no good graph yet) or `Suspended`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The graph currently applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceStatus>,
    /// Shape of the graph currently applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphStatus>,
    /// The RayService this pipeline owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_service_name: Option<String>,
    /// Serve application status, copied from the RayService, keyed by application name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub applications: BTreeMap<String, ApplicationStatus>,
    /// The rollout of graph versions (strategy `Canary`): what serves, what is being tried, and
    /// how the last attempt ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// `SourceReady`, `GraphValid`, `Ready`, `UpToDate`; with a canary policy also
    /// `Progressing` and `RolledBack`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    /// `sha256:<hex>` of the graph applied; for an OCI artifact with a code layer, of its
    /// manifest (which pins graph and code, and names the version in a rollout).
    pub digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched_at: Option<Time>,
    pub bytes: i64,
    /// For an OCI source: what the reference resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciSourceStatus>,
}

/// The OCI artifact applied.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OciSourceStatus {
    /// The tag polled (absent for a digest reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// `sha256:<hex>` of the manifest applied; a new digest behind the tag is a new version.
    pub manifest_digest: String,
    /// `sha256:<hex>` of the graph layer (equal to `digest` unless the artifact has code).
    pub graph_digest: String,
    /// `sha256:<hex>` of the code layer (`raypipe dag push --code`), served to Ray by this
    /// digest. With code, `digest` is the manifest digest: the one digest that pins both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_digest: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GraphStatus {
    pub nodes: i32,
    pub edges: i32,
    pub ingress: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Per node: the Serve deployment's status.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub deployments: BTreeMap<String, NodeStatus>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A canary rollout's state. It lives here and in the RayService's Serve config (never only in
/// the operator's memory), so a restarted operator resumes at the same step.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// `Stable` (nothing being rolled out), `Progressing`, or `Finishing` (a version is being
    /// retired once every router took the new weights).
    pub phase: String,
    /// The version answering requests: the last good graph.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable: Option<VersionStatus>,
    /// The version being rolled out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryStatus>,
    /// A Serve application kept until every router stopped sending it requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retiring: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retiring_since: Option<Time>,
    /// The routers' configuration generation (their counters are kept per generation).
    pub generation: String,
    /// How the last rollout ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<RolloutOutcome>,
    /// Digests rolled back: not tried again until the registry serves different bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_digests: Vec<String>,
}

/// One graph version on the cluster.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VersionStatus {
    /// `sha256:<hex>` of the graph.
    pub digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Its Serve application.
    pub application: String,
}

/// The version being rolled out and where it stands.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanaryStatus {
    #[serde(flatten)]
    pub version: VersionStatus,
    /// 0 while its deployments start (no traffic), then 1..=steps.
    pub step: i32,
    pub steps: i32,
    /// Percent of requests it answers now.
    pub weight: i32,
    pub started_at: Time,
    pub step_started_at: Time,
    /// The gates' readings for the current step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readings: Option<GateReadings>,
    /// What the new version changes, per node (as `raypipe dag diff` prints it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<String>,
    /// Since when the canary is held by `rollout.paused` (its clocks stand still meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<Time>,
}

/// What the routers measured in the current step.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GateReadings {
    pub canary_requests: i64,
    pub canary_errors: i64,
    /// Canary failures answered by the stable version instead.
    pub retried_on_stable: i64,
    pub stable_requests: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_latency_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_latency_ms: Option<f64>,
    /// How far the canary's latencies sit above stable's over the step: the z score of a
    /// Mann-Whitney rank test on the two histograms. The latency gate fails a canary only when
    /// this is at least 2.33 (slower with 99 % confidence) as well as over the ratio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_shift_z: Option<f64>,
}

/// How a rollout ended.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutOutcome {
    pub digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `Promoted`, `RolledBack` or `Aborted`.
    pub result: String,
    /// Why: `Promoted`, `ErrorRate`, `Latency`, `DeploymentFailed`, `ProgressDeadlineExceeded`,
    /// `NoTraffic`, `Reverted`, `Superseded`, `Suspended`, `StrategyChanged`.
    pub reason: String,
    /// The Serve deployment (graph node) that failed, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub message: String,
    pub at: Time,
    /// The gates' readings of the last step it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readings: Option<GateReadings>,
}

/// Condition types.
pub mod condition_types {
    pub const SOURCE_READY: &str = "SourceReady";
    pub const GRAPH_VALID: &str = "GraphValid";
    pub const READY: &str = "Ready";
    /// True while a canary rollout runs.
    pub const PROGRESSING: &str = "Progressing";
    /// True after a rollout was rolled back (until a later one is promoted).
    pub const ROLLED_BACK: &str = "RolledBack";
    /// True when the graph serving is the newest valid one the source offers (False while a
    /// refused, rolled-back or still rolling-out version is newer; Unknown when the source
    /// cannot be read). `Ready` stays True meanwhile: the previous graph serves.
    pub const UP_TO_DATE: &str = "UpToDate";
    /// Only for a pipeline in a Kueue queue: True while its clusters hold quota; False, with
    /// Kueue's reason (`Pending`, `Preempted`, …), while one waits for it.
    pub const ADMITTED: &str = "Admitted";
}

/// A list of metav1.Conditions as a list-map keyed by `type`, so server-side apply merges
/// conditions per type.
pub fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    let map = schema.ensure_object();
    map.insert("x-kubernetes-list-type".into(), "map".into());
    map.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema
}
