//! ServePipeline spec rules the CRD schema cannot express: name length, the URL scheme against
//! `allowInsecureHttp`, and bounded durations and sizes. The controller and the webhook both
//! call [`validate_spec`]; the controller reads durations only through [`validated`] (once per
//! reconcile) and [`source_timing`], so a value that passed here is the value it uses, and
//! nothing out of bounds reaches a timer.

use std::time::Duration;

use kube::ResourceExt;

use super::duration::{format_duration, parse_bounded};
use super::feature_gates::FeatureGates;
use super::k8s_names::is_dns1035_label;
use super::problem::{Problem, Problems};
use super::raycluster::{ClusterContext, raycluster_spec};
use super::rayservice::{no_head_service_name, no_k8s_token_auth, upgrade_strategy};
use crate::api::servepipeline::{GraphSource, RolloutPolicy, RolloutStrategy, ServePipeline};

/// KubeRay's limit for RayService names (it appends suffixes to derive child names); a
/// pipeline's RayService takes the pipeline's name.
pub const MAX_RAYSERVICE_NAME: usize = super::rayservice::MAX_RAYSERVICE_NAME;
/// The Event and condition reason of a refused ServePipeline spec.
pub const INVALID_SPEC: &str = "InvalidSpec";
/// Longest Serve application name with a Canary rollout (see `serve::rollout::MAX_BASE_NAME`).
pub const MAX_CANARY_APPLICATION_NAME: usize = 49;
/// `source.refreshInterval`: polling faster than once a second is a load on the registry, not
/// a feature; slower than daily is better served by a change to the pipeline.
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(1);
pub const MAX_REFRESH_INTERVAL: Duration = Duration::from_secs(24 * 3600);
/// `source.timeout`: one fetch, retries included. The ceiling keeps a slow registry from
/// holding a fetch slot for long.
pub const MIN_FETCH_TIMEOUT: Duration = Duration::from_secs(1);
pub const MAX_FETCH_TIMEOUT: Duration = crate::source::MAX_FETCH_TIMEOUT;
/// `source.maxBytes` ceiling: the largest graph the operator accepts (a 100,000-node graph,
/// the node limit, encodes to well under this); the fetcher clamps to the same value.
pub const MAX_GRAPH_BYTES: i64 = crate::source::MAX_MAX_BYTES as i64;

/// The source's timing, from a spec that passed [`validate_spec`]; values out of bounds (an
/// object the webhook did not see) fall back to the defaults instead of reaching a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceTiming {
    /// `None`: fetch only when the pipeline or its Secrets change.
    pub refresh_interval: Option<Duration>,
    pub timeout: Duration,
}

pub fn source_timing(source: &GraphSource) -> SourceTiming {
    SourceTiming {
        refresh_interval: source
            .refresh_interval
            .as_deref()
            .and_then(|v| parse_bounded(v, MIN_REFRESH_INTERVAL, MAX_REFRESH_INTERVAL).ok()),
        timeout: source
            .timeout
            .as_deref()
            .and_then(|v| parse_bounded(v, MIN_FETCH_TIMEOUT, MAX_FETCH_TIMEOUT).ok())
            .unwrap_or(crate::source::DEFAULT_TIMEOUT),
    }
}

/// `rollout.steps[].pause` and `rollout.progressDeadline`: bounds and the defaults for what
/// the spec leaves out.
pub const MIN_STEP_PAUSE: Duration = Duration::from_secs(1);
pub const MIN_PROGRESS_DEADLINE: Duration = Duration::from_secs(10);
pub const MAX_ROLLOUT_DURATION: Duration = Duration::from_secs(86_400);
pub const DEFAULT_STEP_PAUSE: Duration = Duration::from_secs(30);
pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(600);

/// A rollout policy's durations, parsed and bounded; unset or out of bounds (an object the
/// webhook did not see): the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutTiming {
    /// One pause per `steps[]` entry, in order.
    pub step_pauses: Vec<Duration>,
    pub progress_deadline: Duration,
}

pub fn rollout_timing(rollout: &RolloutPolicy) -> RolloutTiming {
    let bounded = |text: Option<&str>, min: Duration, default: Duration| {
        text.and_then(|t| parse_bounded(t, min, MAX_ROLLOUT_DURATION).ok())
            .unwrap_or(default)
    };
    RolloutTiming {
        step_pauses: rollout
            .steps
            .iter()
            .map(|s| bounded(s.pause.as_deref(), MIN_STEP_PAUSE, DEFAULT_STEP_PAUSE))
            .collect(),
        progress_deadline: bounded(
            rollout.progress_deadline.as_deref(),
            MIN_PROGRESS_DEADLINE,
            DEFAULT_PROGRESS_DEADLINE,
        ),
    }
}

/// A ServePipeline spec checked by [`validate_spec`], with every duration parsed once: the
/// controller reads these values and never a duration string. Values out of bounds fall back
/// to the defaults, so even a refused spec has timings that are safe to use.
#[derive(Debug, Clone, PartialEq)]
pub struct Validated {
    pub source: SourceTiming,
    /// `None` without a rollout policy.
    pub rollout: Option<RolloutTiming>,
    /// Every problem of the spec; empty when it is valid.
    pub problems: Vec<Problem>,
}

impl Validated {
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks the spec and parses its durations.
pub fn validated(pipeline: &ServePipeline) -> Validated {
    Validated {
        source: source_timing(&pipeline.spec.source),
        rollout: pipeline.spec.rollout.as_ref().map(rollout_timing),
        problems: validate_spec(pipeline),
    }
}

/// A pipeline in a Kueue queue: Kueue alone decides when its clusters run (a `suspend` of the
/// user's would fight it), and Kueue admits a fixed size (its webhook refuses in-tree
/// autoscaling without workload slicing, and at most 7 worker groups).
fn queue_problems(pipeline: &ServePipeline, refuse: &mut impl FnMut(&str, String)) {
    let Some(queue) = crate::kuberay::kueue::queue_name(pipeline.labels()) else {
        return;
    };
    let cluster = &pipeline.spec.ray_cluster_config;
    if cluster.suspend.is_some() {
        refuse(
            "spec.rayClusterConfig.suspend",
            format!(
                "rayClusterConfig.suspend cannot be set on a pipeline in Kueue queue {queue:?}: \
                 Kueue suspends and resumes its clusters; use spec.suspend to stop the pipeline"
            ),
        );
    }
    if cluster.enable_in_tree_autoscaling == Some(true) {
        refuse(
            "spec.rayClusterConfig.enableInTreeAutoscaling",
            format!(
                "in-tree autoscaling cannot be used on a pipeline in Kueue queue {queue:?}: Kueue \
                 admits a cluster of a fixed size"
            ),
        );
    }
    let groups = cluster.worker_group_specs.as_ref().map_or(0, Vec::len);
    if groups > 7 {
        refuse(
            "spec.rayClusterConfig.workerGroupSpecs",
            format!(
                "a pipeline in Kueue queue {queue:?} may have at most 7 worker groups (Kueue admits \
                 at most 8 pod sets, the head being one); it has {groups}"
            ),
        );
    }
}

/// Every problem of the spec, each naming its field; empty when it is valid.
pub fn validate_spec(pipeline: &ServePipeline) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut refuse = |field: &str, message: String| {
        problems.push(Problem::new(field, INVALID_SPEC, message));
    };
    let name = pipeline.name_any();
    if name.len() > MAX_RAYSERVICE_NAME {
        refuse(
            "metadata.name",
            format!(
                "the pipeline name {:?} has {} characters; the RayService it owns takes its name and may have at most {MAX_RAYSERVICE_NAME}",
                crate::k8s::truncate(&name, 80),
                name.len()
            ),
        );
    }
    let source = &pipeline.spec.source;
    if source.url.starts_with("http://") && !source.allow_insecure_http.unwrap_or(false) {
        refuse(
            "spec.source.url",
            "source.url uses plain http://; use https://, or set source.allowInsecureHttp: true"
                .to_owned(),
        );
    }
    for (field, value, min, max) in [
        (
            "source.refreshInterval",
            &source.refresh_interval,
            MIN_REFRESH_INTERVAL,
            MAX_REFRESH_INTERVAL,
        ),
        (
            "source.timeout",
            &source.timeout,
            MIN_FETCH_TIMEOUT,
            MAX_FETCH_TIMEOUT,
        ),
    ] {
        if let Some(v) = value
            && let Err(e) = parse_bounded(v, min, max)
        {
            refuse(
                &format!("spec.{field}"),
                format!(
                    "{field}: {e} (allowed: {} to {})",
                    format_duration(min),
                    format_duration(max)
                ),
            );
        }
    }
    source_kind_problems(source, &mut refuse);
    queue_problems(pipeline, &mut refuse);
    if let Some(rollout) = &pipeline.spec.rollout {
        rollout_problems(pipeline, rollout, &mut refuse);
    }
    if let Some(max_bytes) = source.max_bytes
        && !(1..=MAX_GRAPH_BYTES).contains(&max_bytes)
    {
        refuse(
            "spec.source.maxBytes",
            format!("source.maxBytes: {max_bytes} is outside 1 to {MAX_GRAPH_BYTES} (64 MiB)"),
        );
    }
    let max_code = crate::source::MAX_MAX_CODE_BYTES as i64;
    if let Some(max_code_bytes) = source.max_code_bytes
        && !(1..=max_code).contains(&max_code_bytes)
    {
        refuse(
            "spec.source.maxCodeBytes",
            format!("source.maxCodeBytes: {max_code_bytes} is outside 1 to {max_code} (1 GiB)"),
        );
    }
    problems
}

/// `source.url` or `source.oci`, exactly one, and the fields that belong to each.
fn source_kind_problems(source: &GraphSource, refuse: &mut impl FnMut(&str, String)) {
    match (&source.oci, source.url.is_empty()) {
        (None, true) => refuse(
            "spec.source",
            "set source.url (a graph at an HTTPS address) or source.oci (an OCI artifact)"
                .to_owned(),
        ),
        (Some(_), false) => refuse(
            "spec.source",
            "source.url and source.oci are both set; set exactly one".to_owned(),
        ),
        (Some(reference), true) => {
            if let Err(error) = reference.parse::<crate::source::oci::OciReference>() {
                refuse("spec.source.oci", format!("source.oci: {}", error.problem));
            }
            for (field, set) in [
                (
                    "bearerTokenSecretRef",
                    source.bearer_token_secret_ref.is_some(),
                ),
                ("sha256", source.sha256.is_some()),
            ] {
                if set {
                    refuse(
                        &format!("spec.source.{field}"),
                        format!(
                            "source.{field} applies to source.url only; with source.oci use \
                             credentialsSecretRef and a @sha256: digest in the reference"
                        ),
                    );
                }
            }
        }
        (None, false) => {
            for (field, set) in [
                (
                    "credentialsSecretRef",
                    source.credentials_secret_ref.is_some(),
                ),
                ("verify", source.verify.is_some()),
            ] {
                if set {
                    refuse(
                        &format!("spec.source.{field}"),
                        format!("source.{field} applies to source.oci only"),
                    );
                }
            }
        }
    }
    if let Some(verify) = &source.verify
        && verify.public_key_secret_ref.is_none()
    {
        refuse(
            "spec.source.verify.publicKeySecretRef",
            "source.verify needs publicKeySecretRef (the only verification supported so far)"
                .to_owned(),
        );
    }
}

/// The canary policy: bounded durations and weights, and an application name short enough for
/// the version applications named after it.
fn rollout_problems(
    pipeline: &ServePipeline,
    rollout: &RolloutPolicy,
    refuse: &mut dyn FnMut(&str, String),
) {
    if rollout.strategy == RolloutStrategy::Canary {
        let name = pipeline
            .spec
            .serve
            .as_ref()
            .and_then(|s| s.application_name.clone())
            .unwrap_or_else(|| pipeline.name_any());
        if name.len() > MAX_CANARY_APPLICATION_NAME {
            refuse(
                "spec.serve.applicationName",
                format!(
                    "the Serve application name {:?} has {} characters; with a Canary rollout each graph version gets an application named after it, so it may have at most {MAX_CANARY_APPLICATION_NAME}",
                    crate::k8s::truncate(&name, 80),
                    name.len()
                ),
            );
        }
    }
    let day = MAX_ROLLOUT_DURATION;
    let mut duration = |field: String, value: &Option<String>, min: Duration| {
        if let Some(v) = value
            && let Err(e) = parse_bounded(v, min, day)
        {
            refuse(
                &field,
                format!(
                    "{field}: {e} (allowed: {} to {})",
                    format_duration(min),
                    format_duration(day)
                ),
            );
        }
    };
    duration(
        "spec.rollout.progressDeadline".into(),
        &rollout.progress_deadline,
        MIN_PROGRESS_DEADLINE,
    );
    for (i, step) in rollout.steps.iter().enumerate() {
        duration(
            format!("spec.rollout.steps[{i}].pause"),
            &step.pause,
            MIN_STEP_PAUSE,
        );
    }
    for (i, step) in rollout.steps.iter().enumerate() {
        if !(1..=100).contains(&step.weight) {
            refuse(
                &format!("spec.rollout.steps[{i}].weight"),
                format!("weight {} is outside 1 to 100 (percent)", step.weight),
            );
        }
    }
    if let Some(gates) = &rollout.gates {
        if let Some(p) = gates.latency_percentile
            && ![50, 90, 95, 99].contains(&p)
        {
            refuse(
                "spec.rollout.gates.latencyPercentile",
                format!("latencyPercentile {p} is not one of 50, 90, 95, 99"),
            );
        }
        if let Some(r) = gates.max_error_rate
            && !(0.0..=1.0).contains(&r)
        {
            refuse(
                "spec.rollout.gates.maxErrorRate",
                format!("maxErrorRate {r} is outside 0 to 1"),
            );
        }
        if let Some(r) = gates.max_latency_ratio
            && !(r.is_finite() && r >= 1.0)
        {
            refuse(
                "spec.rollout.gates.maxLatencyRatio",
                format!("maxLatencyRatio {r} is below 1"),
            );
        }
        if let Some(n) = gates.min_requests
            && n < 1
        {
            refuse(
                "spec.rollout.gates.minRequests",
                format!("minRequests {n} is below 1"),
            );
        }
    }
}

/// Our own rules (the controller's `validate_spec`: name length, plain http, durations) plus
/// the RayService rules its RayService would face, so a pipeline that could never run is
/// refused when it is written rather than after its graph was downloaded.
pub fn validate(pipeline: &ServePipeline, feature_gates: &FeatureGates) -> Vec<Problem> {
    let mut problems = Problems::new(INVALID_SPEC, INVALID_SPEC);
    let name = pipeline.name_any();
    if !is_dns1035_label(&name) {
        problems.push(format!(
            "metadata.name: {name:?} is not a DNS-1035 label; the RayService it owns takes this name"
        ));
    }
    let cluster = &pipeline.spec.ray_cluster_config;
    let cluster_path = "spec.rayClusterConfig";
    no_k8s_token_auth(cluster, cluster_path, &mut problems);
    no_head_service_name(cluster, cluster_path, &mut problems);
    raycluster_spec(
        cluster,
        &ClusterContext {
            path: cluster_path,
            created_by: Some("RayService"),
            annotations: pipeline.annotations(),
        },
        feature_gates,
        &mut problems,
    );
    upgrade_strategy(
        pipeline.spec.upgrade_strategy.as_ref(),
        cluster,
        "spec",
        feature_gates,
        &mut problems,
    );
    let mut found = validate_spec(pipeline);
    found.extend(problems.into_vec());
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::servepipeline::ServePipelineSpec;

    /// The messages of [`validate_spec`], `Ok` when there are none.
    fn spec_messages(p: &ServePipeline) -> Result<(), Vec<String>> {
        let problems = validate_spec(p);
        if problems.is_empty() {
            return Ok(());
        }
        Err(problems.into_iter().map(|p| p.message).collect())
    }

    fn pipeline(name: &str, source: GraphSource) -> ServePipeline {
        let mut p = ServePipeline::new(
            name,
            ServePipelineSpec {
                source,
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("team".into());
        p
    }

    #[test]
    fn a_queued_pipeline_leaves_suspend_to_kueue_and_keeps_a_fixed_size() {
        let mut p = pipeline("demo", source(None, None));
        p.spec.ray_cluster_config.suspend = Some(false);
        p.spec.ray_cluster_config.enable_in_tree_autoscaling = Some(true);
        assert_eq!(spec_messages(&p), Ok(()), "outside a queue both are fine");
        p.metadata.labels = Some(
            [(
                crate::kuberay::kueue::QUEUE_NAME_LABEL.to_owned(),
                "team-a".to_owned(),
            )]
            .into(),
        );
        let messages = spec_messages(&p).unwrap_err();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[0].starts_with(
            "rayClusterConfig.suspend cannot be set on a pipeline in Kueue queue \"team-a\""
        ));
        assert!(messages[1].starts_with("in-tree autoscaling cannot be used"));
    }

    fn source(refresh: Option<&str>, timeout: Option<&str>) -> GraphSource {
        GraphSource {
            url: "https://registry.example/g.pb".into(),
            refresh_interval: refresh.map(str::to_owned),
            timeout: timeout.map(str::to_owned),
            ..Default::default()
        }
    }

    #[test]
    fn durations_the_crd_pattern_admits_are_bounded_not_panics() {
        // The input: admitted by the CRD pattern, and a panic in Duration::from_secs_f64.
        for huge in [
            "99999999999999999999h",
            "9999999999999999999.9h",
            "2562048h",
        ] {
            let p = pipeline("p", source(Some(huge), Some(huge)));
            let problems = spec_messages(&p).unwrap_err();
            assert_eq!(problems.len(), 2, "{problems:?}");
            assert!(
                problems[0].starts_with("source.refreshInterval:"),
                "{problems:?}"
            );
            assert!(problems[1].contains("too large"), "{problems:?}");
            let timing = source_timing(&p.spec.source);
            assert_eq!(timing.refresh_interval, None);
            assert_eq!(timing.timeout, crate::source::DEFAULT_TIMEOUT);
        }
        // Zero polls in a hot loop: refused, and never used.
        let p = pipeline("p", source(Some("0s"), Some("0s")));
        let problems = spec_messages(&p).unwrap_err();
        assert!(
            problems[0].contains("shorter than the minimum of 1s"),
            "{problems:?}"
        );
        assert_eq!(source_timing(&p.spec.source).refresh_interval, None);
        // A timeout past the ceiling.
        let p = pipeline("p", source(None, Some("10m")));
        assert!(spec_messages(&p).unwrap_err()[0].contains("longer than the maximum of 2m"));
    }

    #[test]
    fn valid_timing_is_used_as_written() {
        let p = pipeline("p", source(Some("1h30m"), Some("45s")));
        assert_eq!(spec_messages(&p), Ok(()));
        assert_eq!(
            source_timing(&p.spec.source),
            SourceTiming {
                refresh_interval: Some(Duration::from_secs(5400)),
                timeout: Duration::from_secs(45),
            }
        );
    }

    #[test]
    fn every_problem_is_listed() {
        let mut s = source(Some("100ms"), Some("soon"));
        s.url = "http://127.0.0.1/g.pb".into();
        s.max_bytes = Some(1 << 40);
        let problems = spec_messages(&pipeline(&"x".repeat(48), s)).unwrap_err();
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(problems[0].contains("48 characters"));
        assert!(problems[1].contains("allowInsecureHttp"));
        assert!(problems[2].contains("source.refreshInterval"));
        assert!(problems[3].contains("source.timeout"));
        assert!(problems[4].contains("source.maxBytes"));
        let mut s = source(None, None);
        s.url = "http://127.0.0.1/g.pb".into();
        s.allow_insecure_http = Some(true);
        assert_eq!(spec_messages(&pipeline("ok", s)), Ok(()));
    }

    #[test]
    fn exactly_one_of_url_and_oci_with_the_fields_of_each() {
        use crate::api::servepipeline::{SecretKeySelector, SourceVerification};
        let secret = || SecretKeySelector {
            name: "s".into(),
            key: "k".into(),
        };
        let oci = |reference: &str| GraphSource {
            oci: Some(reference.into()),
            ..Default::default()
        };
        assert_eq!(
            spec_messages(&pipeline("ok", oci("registry.example/team/g:v1"))),
            Ok(())
        );
        let verified = GraphSource {
            credentials_secret_ref: Some(secret()),
            verify: Some(SourceVerification {
                public_key_secret_ref: Some(secret()),
            }),
            ..oci("registry.example/team/g:v1")
        };
        assert_eq!(spec_messages(&pipeline("ok", verified)), Ok(()));

        let neither = spec_messages(&pipeline("p", GraphSource::default())).unwrap_err();
        assert!(neither[0].contains("set source.url"), "{neither:?}");
        let both = GraphSource {
            url: "https://r.example/g.pb".into(),
            ..oci("registry.example/g:v1")
        };
        let problems = spec_messages(&pipeline("p", both)).unwrap_err();
        assert!(problems[0].contains("both set"), "{problems:?}");
        let no_registry = spec_messages(&pipeline("p", oci("team/g:v1"))).unwrap_err();
        assert!(no_registry[0].starts_with("source.oci:"), "{no_registry:?}");
        assert!(no_registry[0].contains("registry"), "{no_registry:?}");

        let url_fields_on_oci = GraphSource {
            bearer_token_secret_ref: Some(secret()),
            sha256: Some("a".repeat(64)),
            ..oci("registry.example/g:v1")
        };
        let problems = spec_messages(&pipeline("p", url_fields_on_oci)).unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        let oci_fields_on_url = GraphSource {
            credentials_secret_ref: Some(secret()),
            verify: Some(SourceVerification::default()),
            ..source(None, None)
        };
        let problems = spec_messages(&pipeline("p", oci_fields_on_url)).unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[2].contains("publicKeySecretRef"), "{problems:?}");
    }

    #[test]
    fn a_canary_policy_is_bounded() {
        use crate::api::servepipeline::{RolloutGates, RolloutStep, ServeOptions};
        let mut p = pipeline("ok", source(None, None));
        p.spec.serve = Some(ServeOptions {
            application_name: Some("a".repeat(50)),
            ..Default::default()
        });
        p.spec.rollout = Some(RolloutPolicy {
            strategy: RolloutStrategy::Canary,
            steps: vec![RolloutStep {
                weight: 0,
                pause: Some("0s".into()),
            }],
            progress_deadline: Some("1s".into()),
            gates: Some(RolloutGates {
                latency_percentile: Some(97),
                max_error_rate: Some(1.5),
                max_latency_ratio: Some(0.9),
                min_requests: Some(0),
                ..Default::default()
            }),
            ..Default::default()
        });
        let problems = spec_messages(&p).unwrap_err();
        let expected = [
            "50 characters",
            "progressDeadline",
            "steps[0].pause",
            "weight 0",
            "latencyPercentile 97",
            "maxErrorRate 1.5",
            "maxLatencyRatio 0.9",
            "minRequests 0",
        ];
        assert_eq!(problems.len(), expected.len(), "{problems:?}");
        for (problem, text) in problems.iter().zip(expected) {
            assert!(problem.contains(text), "{problem:?} should name {text:?}");
        }
        // The same application name is fine without a canary (no version applications).
        p.spec.rollout = None;
        assert_eq!(spec_messages(&p), Ok(()));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Durations as a hostile tenant writes them: CRD-shaped ones with huge numbers, and
        /// anything else.
        fn duration_text() -> impl Strategy<Value = Option<String>> {
            prop_oneof![
                Just(None),
                "([0-9]{1,30}(\\.[0-9]{0,30})?(ms|s|m|h)){1,4}".prop_map(Some),
                ".{0,80}".prop_map(Some),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Whatever the spec, validation answers without panicking, and the timing the
            /// controller uses is always within the bounds (never 0 s, never past the ceiling).
            #[test]
            fn any_spec_is_judged_and_timing_stays_bounded(
                name in "[a-z][a-z0-9-]{0,70}",
                url in prop_oneof![Just("https://r.example/g.pb".to_owned()), ".{0,100}"],
                refresh in duration_text(),
                timeout in duration_text(),
                max_bytes in proptest::option::of(any::<i64>()),
                insecure in proptest::option::of(any::<bool>()),
            ) {
                let p = pipeline(&name, GraphSource {
                    url,
                    refresh_interval: refresh,
                    timeout,
                    max_bytes,
                    allow_insecure_http: insecure,
                    ..Default::default()
                });
                let verdict = spec_messages(&p);
                let timing = source_timing(&p.spec.source);
                if let Some(r) = timing.refresh_interval {
                    prop_assert!((MIN_REFRESH_INTERVAL..=MAX_REFRESH_INTERVAL).contains(&r));
                }
                prop_assert!(timing.timeout >= MIN_FETCH_TIMEOUT && timing.timeout <= MAX_FETCH_TIMEOUT);
                if let Err(problems) = verdict {
                    prop_assert!(!problems.is_empty());
                    for problem in problems {
                        prop_assert!(problem.len() <= 1024, "{problem}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_crd_carries_the_same_bounds() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(ServePipeline::crd()).expect("CRD as JSON");
        let source = crd
            .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/source/properties")
            .expect("source schema");
        assert_eq!(
            source["maxBytes"]["maximum"].as_f64(),
            Some(MAX_GRAPH_BYTES as f64)
        );
        for field in ["timeout", "refreshInterval"] {
            assert_eq!(
                source[field]["maxLength"].as_u64(),
                Some(crate::validation::duration::MAX_DURATION_TEXT as u64),
                "{field}"
            );
        }
    }
}
