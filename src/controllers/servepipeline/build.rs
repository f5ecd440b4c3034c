//! Pure builders for the ServePipeline controller: the desired RayService and the Serve config
//! (the status half is `conditions.rs`; both are tested here).
//! No client, no clock (time is passed in), no environment: unit-testable without a cluster.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::{Resource, ResourceExt};

use super::config::Config;
use crate::api::rayservice::{RayService, RayServiceSpec};
use crate::api::servepipeline::{ServePipeline, ServePipelineStatus};
use crate::k8s::{
    ANNOTATION_APPLIED_HASH, ANNOTATION_GRAPH_DIGEST, K8sError, LABEL_MANAGED_BY, LABEL_PIPELINE,
    MANAGED_BY,
};

pub use crate::validation::servepipeline::MAX_RAYSERVICE_NAME;

/// Phases shown in `kubectl get servepipelines`.
pub mod phases {
    pub const PENDING: &str = "Pending";
    pub const DEPLOYING: &str = "Deploying";
    pub const READY: &str = "Ready";
    pub const DEGRADED: &str = "Degraded";
    pub const FAILED: &str = "Failed";
    pub const SUSPENDED: &str = "Suspended";
}

/// Condition reasons the controller sets itself (source and graph reasons come from those modules).
pub mod reasons {
    pub const FETCHED: &str = "Fetched";
    pub const VALID: &str = "Valid";
    pub const NO_GRAPH: &str = "NoGraph";
    pub const SERVING: &str = "Serving";
    pub const SERVING_PREVIOUS_GRAPH: &str = "ServingPreviousGraph";
    pub const RAYSERVICE_NOT_READY: &str = "RayServiceNotReady";
    pub const SUSPENDED: &str = "Suspended";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    pub const SECRET_KEY_MISSING: &str = "SecretKeyMissing";
    pub const RENDER_FAILED: &str = "RenderFailed";
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// A RayService of the pipeline's name exists and the pipeline does not control it.
    pub const RAYSERVICE_CONFLICT: &str = "RayServiceConflict";
    pub const ROLLOUT_IN_PROGRESS: &str = "RolloutInProgress";
    /// Serve could not deploy (or keep healthy) what the RayService carries; whatever Serve
    /// still runs from before answers.
    pub const SERVE_DEPLOY_FAILED: &str = "ServeDeployFailed";
    pub const ROLLED_BACK: &str = "RolledBack";
    /// The code layer is not a usable archive (`pypackage::code::check`).
    pub const INVALID_CODE_LAYER: &str = "InvalidCodeLayer";
    /// The artifact has code, and the operator has no package server URL to serve it from.
    pub const CODE_NOT_SERVABLE: &str = "CodeNotServable";
}

/// The name of the RayService a pipeline owns: the pipeline's own name.
pub fn rayservice_name(pipeline: &ServePipeline) -> String {
    pipeline.name_any()
}

/// The RayService for a pipeline, carrying `serve_config_yaml`. Deterministic: equal inputs give
/// equal objects, and `raypipe.dev/applied-hash` summarises everything we set.
pub fn desired_rayservice(
    pipeline: &ServePipeline,
    serve_config_yaml: &str,
    graph_digest: &str,
) -> Result<RayService, K8sError> {
    desired_rayservice_annotated(pipeline, serve_config_yaml, graph_digest, BTreeMap::new())
}

/// [`desired_rayservice`] with more annotations (the shared nodes' retirements).
pub fn desired_rayservice_annotated(
    pipeline: &ServePipeline,
    serve_config_yaml: &str,
    graph_digest: &str,
    mut annotations: BTreeMap<String, String>,
) -> Result<RayService, K8sError> {
    let owner = crate::k8s::controller_owner_ref(pipeline)?;
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
    labels.insert(LABEL_PIPELINE.to_owned(), pipeline.name_any());
    let spec = RayServiceSpec {
        serve_config_v2: Some(serve_config_yaml.to_owned()),
        ray_cluster_config: with_serve_env_defaults(pipeline.spec.ray_cluster_config.clone()),
        upgrade_strategy: pipeline.spec.upgrade_strategy.clone(),
        suspend: pipeline.spec.suspend,
        ..Default::default()
    };
    annotations.insert(ANNOTATION_GRAPH_DIGEST.to_owned(), graph_digest.to_owned());
    annotations.extend(queue_annotations(pipeline));
    let mut rayservice = RayService {
        metadata: ObjectMeta {
            name: Some(rayservice_name(pipeline)),
            namespace: pipeline.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec,
        status: None,
    };
    let hash = crate::k8s::stable_hash(&(
        &rayservice.metadata.labels,
        &rayservice.metadata.annotations,
        &rayservice.spec,
    ));
    rayservice
        .meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_APPLIED_HASH.to_owned(), hash);
    Ok(rayservice)
}

/// A pipeline in a Kueue queue (its `kueue.x-k8s.io/queue-name` label) has each of its clusters
/// admitted on its own: the RayService asks for that by annotation and is not queued itself, so
/// a graph change stays an in-place Serve update on the admitted cluster, and a cluster change
/// waits for an admission of its own (for at most the rollout's progress deadline) while the
/// serving cluster goes on.
fn queue_annotations(pipeline: &ServePipeline) -> BTreeMap<String, String> {
    use crate::kuberay::kueue;
    let labels = pipeline.labels();
    let Some(queue) = kueue::queue_name(labels) else {
        return BTreeMap::new();
    };
    let mut annotations =
        BTreeMap::from([(kueue::CLUSTER_QUEUE_ANNOTATION.to_owned(), queue.to_owned())]);
    if let Some(priority) = labels
        .get(kueue::PRIORITY_CLASS_LABEL)
        .filter(|p| !p.is_empty())
    {
        annotations.insert(
            kueue::CLUSTER_PRIORITY_ANNOTATION.to_owned(),
            priority.clone(),
        );
    }
    if let Some(deadline) = pipeline
        .spec
        .rollout
        .as_ref()
        .and_then(|r| r.progress_deadline.clone())
    {
        annotations.insert(kueue::ADMISSION_TIMEOUT_ANNOTATION.to_owned(), deadline);
    }
    annotations
}

/// The cluster with [`crate::serve::SERVE_ENV_DEFAULTS`] in the Ray container (the first, as
/// KubeRay takes it) of the head and of every worker group, where that container's own `env`
/// does not name the variable: the user's value, "0" included, always wins. (A value from
/// `envFrom` cannot: Kubernetes lets an `env` entry override it, so turning the mode off
/// takes an `env` entry.)
fn with_serve_env_defaults(
    mut spec: crate::api::raycluster::RayClusterSpec,
) -> crate::api::raycluster::RayClusterSpec {
    let templates = std::iter::once(&mut spec.head_group_spec.template).chain(
        spec.worker_group_specs
            .iter_mut()
            .flatten()
            .map(|group| &mut group.template),
    );
    for template in templates {
        let Some(container) = template
            .spec
            .as_mut()
            .and_then(|pod| pod.containers.first_mut())
        else {
            continue;
        };
        let env = container.env.get_or_insert_with(Vec::new);
        for (name, value) in crate::serve::SERVE_ENV_DEFAULTS {
            if !env.iter().any(|var| var.name == *name) {
                env.push(k8s_openapi::api::core::v1::EnvVar {
                    name: (*name).to_string(),
                    value: Some((*value).to_string()),
                    value_from: None,
                });
            }
        }
    }
    spec
}

/// Whether `existing` already carries what `desired` would apply (so applying can be skipped).
pub fn is_up_to_date(existing: &RayService, desired: &RayService) -> bool {
    let hash = |rs: &RayService| rs.annotations().get(ANNOTATION_APPLIED_HASH).cloned();
    hash(existing).is_some() && hash(existing) == hash(desired)
}

/// The applied graph, as the status reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct AppliedGraph {
    pub digest: String,
    pub etag: Option<String>,
    pub size: u64,
    pub fetched_at: Time,
    pub nodes: usize,
    pub edges: usize,
    pub ingress: String,
    pub version: Option<String>,
    /// For an OCI source: tag, manifest digest and graph digest.
    pub oci: Option<crate::api::servepipeline::OciSourceStatus>,
}

/// The applied graph as a status describes it (`source` and `graph`), when it has both.
pub fn applied_from_status(status: &ServePipelineStatus) -> Option<AppliedGraph> {
    let (source, graph) = (status.source.as_ref()?, status.graph.as_ref()?);
    Some(AppliedGraph {
        digest: source.digest.clone(),
        etag: source.etag.clone(),
        size: u64::try_from(source.bytes).unwrap_or(0),
        fetched_at: source.fetched_at.clone()?,
        nodes: usize::try_from(graph.nodes).unwrap_or(0),
        edges: usize::try_from(graph.edges).unwrap_or(0),
        ingress: graph.ingress.clone(),
        version: graph.version.clone(),
        oci: source.oci.clone(),
    })
}

/// Renders the Serve config YAML for a pipeline's graph (and its code, served by the
/// operator, when the artifact had any).
pub fn render(
    pipeline: &ServePipeline,
    config: &Config,
    graph: &crate::graph::ValidatedGraph,
    applied: &AppliedGraph,
) -> Result<String, String> {
    let options = version_render_options(pipeline, config, applied);
    crate::serve::render(graph, &options)
        .map(|c| c.to_yaml())
        .map_err(|e| e.to_string())
}

/// The render options of one graph version: the pipeline's, plus the URI its code layer is
/// served under.
pub(super) fn version_render_options(
    pipeline: &ServePipeline,
    config: &Config,
    applied: &AppliedGraph,
) -> crate::serve::RenderOptions {
    let mut options = render_options(pipeline, config);
    options.code_py_modules = code_uri(config, applied).into_iter().collect();
    options
}

/// Where Ray fetches the code layer of `applied` (`<base>/code-<hex>.zip`), when it has one
/// and the operator serves code.
pub fn code_uri(config: &Config, applied: &AppliedGraph) -> Option<String> {
    let digest = applied.oci.as_ref()?.code_digest.as_deref()?;
    let hex = digest.strip_prefix("sha256:")?;
    Some(crate::pypackage::store::uri(
        config.code_base_url.as_deref()?,
        hex,
    ))
}

pub(super) fn render_options(
    pipeline: &ServePipeline,
    config: &Config,
) -> crate::serve::RenderOptions {
    let serve = pipeline.spec.serve.clone().unwrap_or_default();
    let mut options = crate::serve::RenderOptions {
        application_name: Some(
            serve
                .application_name
                .clone()
                .unwrap_or_else(|| pipeline.name_any()),
        ),
        route_prefix: serve.route_prefix.clone(),
        request_timeout_s: serve.request_timeout_s,
        keep_alive_timeout_s: serve.keep_alive_timeout_s,
        ..crate::serve::RenderOptions::default()
    };
    if let Some(import_path) = &config.runtime_import_path {
        options.runtime_import_path = import_path.clone();
    }
    if !config.runtime_py_modules.is_empty() {
        options.runtime_py_modules = config.runtime_py_modules.clone();
    }
    for (node, o) in &serve.deployment_overrides {
        options.node_overrides.insert(
            node.clone(),
            crate::serve::NodeOverride {
                num_replicas: o.num_replicas,
                max_ongoing_requests: o.max_ongoing_requests,
            },
        );
    }
    options
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kube::ResourceExt;

    use super::super::conditions::{Problem, StatusInputs, compute_status, panic_status};
    use super::{
        AppliedGraph, applied_from_status, desired_rayservice, is_up_to_date, phases, reasons,
    };
    use crate::api::conditions::{self, FALSE, TRUE, UNKNOWN};
    use crate::api::servepipeline::condition_types;
    use crate::api::servepipeline::{
        GraphSource, ServePipeline, ServePipelineSpec, ServePipelineStatus,
    };
    use crate::k8s::{LABEL_PIPELINE, whole_seconds};

    fn pipeline(name: &str) -> ServePipeline {
        let mut p = ServePipeline::new(
            name,
            ServePipelineSpec {
                source: GraphSource {
                    url: "https://127.0.0.1:1/g.pb".into(),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("uid-1".into());
        p.metadata.generation = Some(3);
        p
    }

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("valid time"))
    }

    fn applied() -> AppliedGraph {
        AppliedGraph {
            digest: "sha256:abc".into(),
            etag: Some("\"abc\"".into()),
            size: 42,
            fetched_at: at(100),
            nodes: 4,
            edges: 3,
            ingress: "request".into(),
            version: Some("1".into()),
            oci: None,
        }
    }

    /// The status `p` carries (computed when it was Ready).
    fn ok_up_to_date(p: &ServePipeline) -> ServePipelineStatus {
        p.status.clone().expect("a status")
    }

    fn cond<'a>(s: &'a ServePipelineStatus, t: &str) -> &'a Condition {
        conditions::find(&s.conditions, t).expect("condition present")
    }

    #[test]
    fn ray_containers_get_serve_env_defaults_unless_they_set_them() {
        use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, PodTemplateSpec};
        let template = |env: Option<Vec<EnvVar>>| PodTemplateSpec {
            spec: Some(PodSpec {
                containers: vec![
                    Container {
                        name: "ray".into(),
                        env,
                        ..Default::default()
                    },
                    Container {
                        name: "sidecar".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let off = EnvVar {
            name: "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH".into(),
            value: Some("4194304".into()),
            value_from: None,
        };
        let mut p = pipeline("sentiment");
        p.spec.ray_cluster_config.head_group_spec.template = template(None);
        p.spec.ray_cluster_config.worker_group_specs =
            Some(vec![crate::api::raycluster::WorkerGroupSpec {
                template: template(Some(vec![off.clone()])),
                ..Default::default()
            }]);
        let rs = desired_rayservice(&p, "applications: []\n", "sha256:abc").expect("builds");
        let env_of = |template: &PodTemplateSpec, index: usize| -> Vec<(String, String)> {
            template.spec.as_ref().unwrap().containers[index]
                .env
                .iter()
                .flatten()
                .map(|v| (v.name.clone(), v.value.clone().unwrap_or_default()))
                .collect()
        };
        let defaults: Vec<(String, String)> = crate::serve::SERVE_ENV_DEFAULTS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let cluster = &rs.spec.ray_cluster_config;
        assert_eq!(env_of(&cluster.head_group_spec.template, 0), defaults);
        assert!(
            env_of(&cluster.head_group_spec.template, 1).is_empty(),
            "only the Ray container"
        );
        let worker = &cluster.worker_group_specs.as_ref().unwrap()[0].template;
        // The user's own value stays; the other defaults are still added.
        let mut expected = vec![(
            "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH".to_string(),
            "4194304".to_string(),
        )];
        expected.extend(
            defaults
                .iter()
                .filter(|(k, _)| k != "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH")
                .cloned(),
        );
        assert_eq!(env_of(worker, 0), expected);
        assert!(expected.len() > 2, "more than one default is still added");
    }

    #[test]
    fn a_queued_pipeline_has_its_clusters_admitted_one_by_one_not_its_rayservice() {
        use crate::kuberay::kueue;
        let mut p = pipeline("sentiment");
        p.metadata.labels = Some(
            [
                (kueue::QUEUE_NAME_LABEL.to_owned(), "team-a".to_owned()),
                (kueue::PRIORITY_CLASS_LABEL.to_owned(), "serving".to_owned()),
            ]
            .into(),
        );
        p.spec.rollout =
            Some(serde_json::from_value(serde_json::json!({"progressDeadline": "5m"})).unwrap());
        let rs = desired_rayservice(&p, "applications: []\n", "sha256:abc").expect("builds");
        assert!(!rs.labels().contains_key(kueue::QUEUE_NAME_LABEL));
        assert_eq!(rs.annotations()[kueue::CLUSTER_QUEUE_ANNOTATION], "team-a");
        assert_eq!(
            rs.annotations()[kueue::CLUSTER_PRIORITY_ANNOTATION],
            "serving"
        );
        assert_eq!(rs.annotations()[kueue::ADMISSION_TIMEOUT_ANNOTATION], "5m");
        let plain =
            desired_rayservice(&pipeline("x"), "applications: []\n", "sha256:abc").expect("builds");
        assert!(
            !plain
                .annotations()
                .contains_key(kueue::CLUSTER_QUEUE_ANNOTATION)
        );
    }

    #[test]
    fn the_rayservice_is_owned_labelled_and_deterministic() {
        let p = pipeline("sentiment");
        let a = desired_rayservice(&p, "applications: []\n", "sha256:abc").expect("builds");
        let b = desired_rayservice(&p, "applications: []\n", "sha256:abc").expect("builds");
        assert_eq!(a, b);
        assert!(is_up_to_date(&a, &b));
        let owner = &a.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        assert_eq!(a.labels()[LABEL_PIPELINE], "sentiment");
        assert_eq!(
            a.spec.serve_config_v2.as_deref(),
            Some("applications: []\n")
        );
        let other = desired_rayservice(&p, "applications: [x]\n", "sha256:def").expect("builds");
        assert!(
            !is_up_to_date(&a, &other),
            "a new config changes the applied hash"
        );
    }

    #[test]
    fn the_applied_graph_is_read_back_from_the_status_it_wrote() {
        let p = pipeline("p");
        let status = compute_status(&StatusInputs {
            pipeline: &p,
            applied: Some(&applied()),
            problem: None,
            rayservice: None,
            rollout: None,
            newest: None,
            now: at(1),
        });
        assert_eq!(applied_from_status(&status), Some(applied()));
        assert_eq!(applied_from_status(&ServePipelineStatus::default()), None);
    }

    #[test]
    fn a_pipeline_without_uid_cannot_own_anything() {
        let mut p = pipeline("p");
        p.metadata.uid = None;
        assert!(desired_rayservice(&p, "", "").is_err());
    }

    #[test]
    fn status_before_any_graph_is_pending_and_unknown() {
        let p = pipeline("p");
        let s = compute_status(&StatusInputs {
            pipeline: &p,
            applied: None,
            problem: None,
            rayservice: None,
            rollout: None,
            newest: None,
            now: at(1),
        });
        assert_eq!(s.phase.as_deref(), Some(phases::PENDING));
        assert_eq!(cond(&s, condition_types::SOURCE_READY).status, UNKNOWN);
        assert_eq!(cond(&s, condition_types::GRAPH_VALID).status, UNKNOWN);
        assert_eq!(cond(&s, condition_types::READY).status, FALSE);
        assert_eq!(s.observed_generation, Some(3));
    }

    #[test]
    fn a_failed_first_fetch_is_failed_with_the_sources_reason() {
        let p = pipeline("p");
        let problem = Problem {
            condition: condition_types::SOURCE_READY,
            reason: "Unauthorized".into(),
            message: "401".into(),
        };
        let s = compute_status(&StatusInputs {
            pipeline: &p,
            applied: None,
            problem: Some(&problem),
            rayservice: None,
            rollout: None,
            newest: None,
            now: at(1),
        });
        assert_eq!(s.phase.as_deref(), Some(phases::FAILED));
        assert_eq!(
            cond(&s, condition_types::SOURCE_READY).reason,
            "Unauthorized"
        );
        assert_eq!(cond(&s, condition_types::READY).reason, "Unauthorized");
    }

    #[test]
    fn a_refused_new_graph_while_serving_is_degraded_but_ready() {
        let mut p = pipeline("p");
        let g = applied();
        let mut rs = desired_rayservice(&p, "", &g.digest).expect("builds");
        rs.status = Some(
            serde_json::from_value(serde_json::json!({
                "conditions": [{"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints",
                                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
            }))
            .expect("RayService status"),
        );
        let ok = compute_status(&StatusInputs {
            pipeline: &p,
            applied: Some(&g),
            problem: None,
            rayservice: Some(&rs),
            rollout: None,
            newest: None,
            now: at(5),
        });
        assert_eq!(ok.phase.as_deref(), Some(phases::READY));
        assert_eq!(cond(&ok, condition_types::GRAPH_VALID).status, TRUE);
        p.status = Some(ok);
        let problem = Problem {
            condition: condition_types::GRAPH_VALID,
            reason: "CycleDetected".into(),
            message: "cycle: a -> b -> a".into(),
        };
        let s = compute_status(&StatusInputs {
            pipeline: &p,
            applied: Some(&g),
            problem: Some(&problem),
            rayservice: Some(&rs),
            rollout: None,
            newest: None,
            now: at(9),
        });
        assert_eq!(s.phase.as_deref(), Some(phases::DEGRADED));
        let ready = cond(&s, condition_types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            (TRUE, reasons::SERVING_PREVIOUS_GRAPH)
        );
        assert_eq!(
            ready.last_transition_time,
            at(5),
            "Ready did not transition"
        );
        // What serves is not what was pushed: UpToDate says so (for GitOps health).
        let current = cond(&ok_up_to_date(&p), condition_types::UP_TO_DATE).clone();
        assert_eq!(current.status, TRUE, "{current:?}");
        let stale = cond(&s, condition_types::UP_TO_DATE);
        assert_eq!(
            (stale.status.as_str(), stale.reason.as_str()),
            (FALSE, "CycleDetected")
        );
        assert!(stale.message.contains("the previous one serves"));
        let graph = cond(&s, condition_types::GRAPH_VALID);
        assert_eq!(
            (graph.status.as_str(), graph.reason.as_str()),
            (FALSE, "CycleDetected")
        );
        assert_eq!(
            s.source.expect("source").digest,
            "sha256:abc",
            "status still describes what runs"
        );
    }

    #[test]
    fn a_graph_serve_failed_to_deploy_is_not_up_to_date() {
        let p = pipeline("p");
        let g = applied();
        let mut rs = desired_rayservice(&p, "", &g.digest).expect("builds");
        // What Serve reports when the new version's code cannot be imported: the RayService
        // stays Ready (the previous replicas answer), the application DEPLOY_FAILED.
        rs.status = Some(
            serde_json::from_value(serde_json::json!({
                "conditions": [{"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints",
                                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "activeServiceStatus": {"applicationStatuses": {"p": {
                    "status": "DEPLOY_FAILED",
                    "message": "Failed to download remote URI s3://models/v2.zip"
                }}}
            }))
            .expect("RayService status"),
        );
        let s = compute_status(&StatusInputs {
            pipeline: &p,
            applied: Some(&g),
            problem: None,
            rayservice: Some(&rs),
            rollout: None,
            newest: None,
            now: at(5),
        });
        let up_to_date = cond(&s, condition_types::UP_TO_DATE);
        assert_eq!(
            (up_to_date.status.as_str(), up_to_date.reason.as_str()),
            (FALSE, reasons::SERVE_DEPLOY_FAILED)
        );
        assert!(
            up_to_date.message.contains("DEPLOY_FAILED")
                && up_to_date.message.contains("s3://models/v2.zip"),
            "{}",
            up_to_date.message
        );
        assert_eq!(cond(&s, condition_types::READY).status, TRUE);
    }

    #[test]
    fn the_same_inputs_compute_the_same_status() {
        let mut p = pipeline("p");
        let g = applied();
        let first = compute_status(&StatusInputs {
            pipeline: &p,
            applied: Some(&g),
            problem: None,
            rayservice: None,
            rollout: None,
            newest: None,
            now: at(1),
        });
        p.status = Some(first.clone());
        let second = compute_status(&StatusInputs {
            pipeline: &p,
            applied: Some(&g),
            problem: None,
            rayservice: None,
            rollout: None,
            newest: None,
            now: at(99),
        });
        assert_eq!(
            first, second,
            "a later reconcile of an unchanged world writes nothing"
        );
    }

    /// The status survives the API server's round trip unchanged, so the next reconcile of an
    /// unchanged world sees no difference and writes nothing.
    #[test]
    fn a_status_read_back_from_the_api_server_compares_equal() {
        let now = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000)
            .expect("valid")
            .checked_add(k8s_openapi::jiff::SignedDuration::from_millis(123))
            .expect("valid");
        let mut p = pipeline("p");
        let mut g = applied();
        g.fetched_at = whole_seconds(now);
        let first = compute_status(&StatusInputs {
            pipeline: &p,
            applied: Some(&g),
            problem: None,
            rayservice: None,
            rollout: None,
            newest: None,
            now: whole_seconds(now),
        });
        let stored: ServePipelineStatus =
            serde_json::from_value(serde_json::to_value(&first).expect("json"))
                .expect("round trip");
        assert_eq!(stored, first, "whole-second times survive serialization");
        p.status = Some(stored);
        let later = whole_seconds(
            now.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(30))
                .expect("valid"),
        );
        let second = compute_status(&StatusInputs {
            pipeline: &p,
            applied: Some(&g),
            problem: None,
            rayservice: None,
            rollout: None,
            newest: None,
            now: later,
        });
        assert_eq!(p.status.as_ref(), Some(&second));
    }

    #[test]
    fn suspend_wins_over_everything_else() {
        let mut p = pipeline("p");
        p.spec.suspend = Some(true);
        let g = applied();
        let s = compute_status(&StatusInputs {
            pipeline: &p,
            applied: Some(&g),
            problem: None,
            rayservice: None,
            rollout: None,
            newest: None,
            now: at(1),
        });
        assert_eq!(s.phase.as_deref(), Some(phases::SUSPENDED));
        assert_eq!(cond(&s, condition_types::READY).reason, reasons::SUSPENDED);
    }

    #[test]
    fn a_contained_panic_sets_ready_false_with_its_own_reason() {
        let p = pipeline("p");
        let status = panic_status(
            &p,
            None,
            "index out of bounds",
            whole_seconds(k8s_openapi::jiff::Timestamp::now()),
        );
        let ready = cond(&status, condition_types::READY);
        assert_eq!(ready.status, FALSE);
        assert_eq!(ready.reason, "ReconcilePanicked");
        assert!(
            ready.message.contains("index out of bounds"),
            "{}",
            ready.message
        );
    }
}
