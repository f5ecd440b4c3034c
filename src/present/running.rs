//! The graph a pipeline runs, read back from its RayService's Serve config (pure): what runs
//! is what is drawn, each node marked with the Serve status the pipeline reports. Shared by
//! `kubectl raypipe graph|logs|session` and the console.

use std::collections::BTreeMap;

use anyhow::Context as _;
use serde::Serialize;
use serde_json::Value;

use crate::api::rayservice::RayService;
use crate::api::servepipeline::{ServePipeline, VersionStatus};
use crate::graph::draw::NodeMarks;
use crate::graph::proto::PipelineGraph;
use crate::serve::shared::WIRING_KEY;
/// A graph version as it runs.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningGraph {
    /// Its Serve application.
    pub application: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Serve's status per node (deployment), as the pipeline reports it.
    pub node_status: BTreeMap<String, String>,
    pub graph: PipelineGraph,
}

impl RunningGraph {
    pub fn marks(&self, pipeline: &str) -> NodeMarks {
        let label = match (&self.version, &self.digest) {
            (Some(v), Some(d)) => format!("{pipeline} {v} ({})", super::summary::short_digest(d)),
            (None, Some(d)) => format!("{pipeline} {}", super::summary::short_digest(d)),
            (Some(v), None) => format!("{pipeline} {v}"),
            (None, None) => pipeline.to_owned(),
        };
        NodeMarks {
            title: Some(label),
            status: self.node_status.clone(),
        }
    }
}

/// The graph JSON an application carries: in `args.graph` (one application per version), or
/// in its executor's `user_config` (shared nodes).
fn graph_json(application: &Value) -> Option<&Value> {
    let inline = &application["args"]["graph"];
    if inline.is_object() {
        return Some(inline);
    }
    application["deployments"]
        .as_array()?
        .iter()
        .map(|d| &d["user_config"][WIRING_KEY]["graph"])
        .find(|g| g.is_object())
}

/// The application of the version `which` names, with its digest and version when known.
fn chosen_application(
    pipeline: &ServePipeline,
    applications: &BTreeMap<String, Value>,
    which: &str,
) -> anyhow::Result<(String, Option<VersionStatus>)> {
    let name = pipeline.metadata.name.clone().unwrap_or_default();
    let rollout = pipeline.status.as_ref().and_then(|s| s.rollout.as_ref());
    let versions: Vec<VersionStatus> = rollout
        .map(|r| {
            r.stable
                .iter()
                .cloned()
                .chain(r.canary.iter().map(|c| c.version.clone()))
                .collect()
        })
        .unwrap_or_default();
    let found = match which {
        "stable" => rollout.and_then(|r| r.stable.clone()),
        "canary" => Some(
            rollout
                .and_then(|r| r.canary.as_ref())
                .map(|c| c.version.clone())
                .with_context(|| format!("ServePipeline {name} has no canary in progress"))?,
        ),
        digest => Some(
            versions
                .iter()
                .find(|v| v.digest == digest)
                .cloned()
                .with_context(|| {
                    format!(
                        "ServePipeline {name} runs no version {digest:?} (it runs {})",
                        if versions.is_empty() {
                            "no versioned graph".to_owned()
                        } else {
                            versions
                                .iter()
                                .map(|v| v.digest.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        }
                    )
                })?,
        ),
    };
    if let Some(version) = found {
        return Ok((version.application.clone(), Some(version)));
    }
    // Strategy Immediate: the one application that carries a graph.
    let application = applications
        .iter()
        .find(|(_, app)| graph_json(app).is_some())
        .map(|(n, _)| n.clone())
        .with_context(|| format!("the RayService of ServePipeline {name} carries no graph yet"))?;
    Ok((application, None))
}

/// The running graph of `pipeline` from its RayService's Serve config (pure).
pub fn running_graph(
    pipeline: &ServePipeline,
    rayservice: &RayService,
    which: &str,
) -> anyhow::Result<RunningGraph> {
    let yaml = rayservice.spec.serve_config_v2.clone().unwrap_or_default();
    let applications = crate::serve::rollout::applications_of(&yaml);
    let (application, version) = chosen_application(pipeline, &applications, which)?;
    let app = applications.get(&application).with_context(|| {
        format!("the Serve application {application} is not on the RayService (yet)")
    })?;
    let graph_value = graph_json(app)
        .with_context(|| format!("the Serve application {application} carries no graph"))?;
    let graph: PipelineGraph = serde_json::from_value(graph_value.clone())
        .with_context(|| format!("reading the graph of Serve application {application}"))?;
    let status = pipeline.status.clone().unwrap_or_default();
    let mut node_status = BTreeMap::new();
    if let Some(app_status) = status.applications.get(&application) {
        for (node, s) in &app_status.deployments {
            if let Some(text) = &s.status {
                node_status.insert(node.clone(), text.clone());
            }
        }
    }
    // Shared nodes: a node's replicas are its own application's.
    if let Some(map) = app["deployments"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|d| d["user_config"][WIRING_KEY]["node_applications"].as_object())
    {
        for (node, node_app) in map {
            let deployments = node_app
                .as_str()
                .and_then(|a| status.applications.get(a))
                .map(|s| &s.deployments);
            if let Some(text) = deployments
                .and_then(|d| d.get(node))
                .and_then(|s| s.status.clone())
            {
                node_status.insert(node.clone(), text);
            }
        }
    }
    let graph_version = (!graph.version.is_empty()).then(|| graph.version.clone());
    Ok(RunningGraph {
        application,
        digest: version
            .as_ref()
            .map(|v| v.digest.clone())
            .or_else(|| status.source.as_ref().map(|s| s.digest.clone())),
        version: version.and_then(|v| v.version).or(graph_version),
        node_status,
        graph,
    })
}

/// A pipeline and the RayService it owns, as read now.
/// The Serve application whose deployment of the same name runs each node of `running` (and
/// its executor): the version application's own deployments, and with shared nodes each
/// node's own application. Fused nodes run inside the executor and have none.
pub fn node_applications(
    rayservice: &RayService,
    running: &RunningGraph,
) -> BTreeMap<String, String> {
    let yaml = rayservice.spec.serve_config_v2.clone().unwrap_or_default();
    let applications = crate::serve::rollout::applications_of(&yaml);
    let mut out = BTreeMap::new();
    let Some(app) = applications.get(&running.application) else {
        return out;
    };
    for deployment in app["deployments"].as_array().into_iter().flatten() {
        if let Some(name) = deployment["name"].as_str() {
            out.insert(name.to_owned(), running.application.clone());
        }
        if let Some(map) = deployment["user_config"][WIRING_KEY]["node_applications"].as_object() {
            for (node, node_app) in map {
                if let Some(node_app) = node_app.as_str() {
                    out.insert(node.clone(), node_app.to_owned());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const DIGEST: &str = "sha256:3333333333333333333333333333333333333333333333333333333333333333";

    fn sequence() -> crate::graph::ValidatedGraph {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/graphs/sequence.pb");
        crate::graph::validate(crate::graph::decode(&std::fs::read(path).unwrap()).unwrap())
            .unwrap()
    }

    /// A RayService carrying `config` and a pipeline whose stable version is application `app`.
    fn objects(config: &Value, app: &str) -> (ServePipeline, RayService) {
        let rs: RayService = serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "demo"},
            "spec": {"serveConfigV2": serde_yaml::to_string(config).unwrap(),
                     "rayClusterConfig": {"headGroupSpec": {"template": {}}}}
        }))
        .unwrap();
        let pipeline: ServePipeline = serde_json::from_value(json!({
            "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline",
            "metadata": {"name": "demo", "namespace": "team"},
            "spec": {"source": {"url": "https://r.example/g.pb"},
                     "rayClusterConfig": {"headGroupSpec": {"template": {}}}},
            "status": {
                "rollout": {"phase": "Stable", "generation": "1.3.s",
                            "stable": {"digest": DIGEST, "version": "v7", "application": app}},
                "applications": {app: {"status": "RUNNING", "deployments": {
                    "raypipe-executor": {"status": "HEALTHY"}}}}
            }
        }))
        .unwrap();
        (pipeline, rs)
    }

    #[test]
    fn the_running_graph_is_read_back_from_either_layout_with_its_nodes_applications() {
        let rendered = crate::serve::render(
            &sequence(),
            &crate::serve::RenderOptions {
                application_name: Some("demo--333333333333".into()),
                ..Default::default()
            },
        )
        .unwrap();
        let inline = serde_json::to_value(&rendered).unwrap();
        let shared = crate::serve::shared::config_json(&rendered, "demo").unwrap();
        for (layout, config) in [("inline", inline), ("shared", shared)] {
            let (pipeline, rs) = objects(&config, "demo--333333333333");
            let running = running_graph(&pipeline, &rs, "stable").unwrap();
            assert_eq!(running.digest.as_deref(), Some(DIGEST), "{layout}");
            assert_eq!(running.version.as_deref(), Some("v7"));
            let names: Vec<&str> = running
                .graph
                .nodes
                .iter()
                .map(|n| n.name.as_str())
                .collect();
            assert!(
                names.contains(&"classify") && names.contains(&"preprocess"),
                "{layout}: {names:?}"
            );
            assert_eq!(
                running
                    .node_status
                    .get("raypipe-executor")
                    .map(String::as_str),
                Some("HEALTHY")
            );
            let apps = node_applications(&rs, &running);
            assert_eq!(
                apps.get("raypipe-executor").map(String::as_str),
                Some("demo--333333333333"),
                "{layout}"
            );
            let classify = apps.get("classify").expect("classify runs somewhere");
            match layout {
                "inline" => assert_eq!(classify, "demo--333333333333"),
                _ => assert!(
                    classify.starts_with("demo-") && classify != "demo--333333333333",
                    "{classify}"
                ),
            }
            let marks = running.marks("demo");
            assert_eq!(marks.title.as_deref(), Some("demo v7 (333333333333)"));
            // No canary: said so, naming the pipeline.
            let err = running_graph(&pipeline, &rs, "canary")
                .unwrap_err()
                .to_string();
            assert!(err.contains("demo has no canary in progress"), "{err}");
            let err = running_graph(&pipeline, &rs, "sha256:00")
                .unwrap_err()
                .to_string();
            assert!(err.contains("runs no version"), "{err}");
        }
    }
}
