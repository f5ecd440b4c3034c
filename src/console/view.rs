//! What the console shows of a pipeline, built from what Kubernetes holds (pure): the summary
//! `kubectl raypipe get` prints, the versions with their digests, the graph drawn with Serve's
//! status per node, the rollout's timeline with the gates' readings, the conditions and the
//! Events. The same value answers the JSON API and fills the HTML page, so the two never
//! disagree.

use k8s_openapi::api::core::v1::Event;
use kube::ResourceExt;
use serde::Serialize;

use crate::api::rayservice::RayService;
use crate::api::servepipeline::{GateReadings, RolloutOutcome, ServePipeline};
use crate::graph::draw::to_svg;
use crate::present::running::running_graph;
use crate::present::summary::{PipelineSummary, summary};

/// Events kept per pipeline page: the newest.
pub const EVENTS_SHOWN: usize = 50;

/// Event reasons that mark a rollout's steps (the timeline shows these, oldest first).
const ROLLOUT_REASONS: [&str; 12] = [
    "RolloutStarted",
    "RolloutStepped",
    "RolloutPromoted",
    "RolloutRolledBack",
    "RolloutAborted",
    "RolloutPaused",
    "RolloutResumed",
    "RolloutRetry",
    "RolloutCommandIgnored",
    "RolloutCommandInvalid",
    "RolloutRequested",
    "RolloutSuperseded",
];

/// One graph version on the cluster, and its part in the rollout.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionRow {
    /// `stable`, `canary` or `retiring`.
    pub role: &'static str,
    pub digest: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub application: String,
    /// Percent of requests it answers (stable: the rest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

/// One moment of the rollout.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEntry {
    pub at: String,
    pub what: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readings: Option<GateReadings>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionRow {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventRow {
    pub at: String,
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub count: i32,
}

/// A graph as drawn, or why it cannot be.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DrawnGraph {
    /// `stable` or `canary`.
    pub which: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Serve's status per node.
    pub nodes: std::collections::BTreeMap<String, String>,
    /// The Serve application that runs it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub application: Option<String>,
}

/// Everything the pipeline page shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PipelineDetail {
    #[serde(flatten)]
    pub summary: PipelineSummary,
    pub versions: Vec<VersionRow>,
    /// The current step's readings, while a canary runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readings: Option<GateReadings>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<String>,
    pub timeline: Vec<TimelineEntry>,
    pub graphs: Vec<DrawnGraph>,
    pub conditions: Vec<ConditionRow>,
    pub events: Vec<EventRow>,
    /// Calls, failures and latency per node of each version, from Prometheus (when the
    /// console has one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<super::metrics::VersionMetrics>,
    /// Why the metrics are missing, when they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_problem: Option<String>,
    /// The RayCluster serving the pipeline (for the dashboard link), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ray_cluster: Option<String>,
}

/// The versions the rollout status names.
pub fn versions(pipeline: &ServePipeline) -> Vec<VersionRow> {
    let Some(rollout) = pipeline.status.as_ref().and_then(|s| s.rollout.as_ref()) else {
        return pipeline
            .status
            .as_ref()
            .and_then(|s| s.source.as_ref())
            .map(|source| VersionRow {
                role: "stable",
                digest: source.digest.clone(),
                version: pipeline
                    .status
                    .as_ref()
                    .and_then(|s| s.graph.as_ref())
                    .and_then(|g| g.version.clone()),
                application: String::new(),
                weight: Some(100),
            })
            .into_iter()
            .collect();
    };
    let canary_weight = rollout.canary.as_ref().map_or(0, |c| c.weight);
    let mut rows = Vec::new();
    if let Some(stable) = &rollout.stable {
        rows.push(VersionRow {
            role: "stable",
            digest: stable.digest.clone(),
            version: stable.version.clone(),
            application: stable.application.clone(),
            weight: Some(100 - canary_weight),
        });
    }
    if let Some(canary) = &rollout.canary {
        rows.push(VersionRow {
            role: "canary",
            digest: canary.version.digest.clone(),
            version: canary.version.version.clone(),
            application: canary.version.application.clone(),
            weight: Some(canary.weight),
        });
    }
    if let Some(retiring) = &rollout.retiring {
        rows.push(VersionRow {
            role: "retiring",
            digest: String::new(),
            version: None,
            application: retiring.clone(),
            weight: Some(0),
        });
    }
    rows
}

fn event_time(event: &Event) -> String {
    event
        .event_time
        .as_ref()
        .map(|t| t.0.to_string())
        .or_else(|| event.last_timestamp.as_ref().map(|t| t.0.to_string()))
        .or_else(|| event.first_timestamp.as_ref().map(|t| t.0.to_string()))
        .or_else(|| {
            event
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
        })
        .unwrap_or_default()
}

/// The Events, newest first, at most [`EVENTS_SHOWN`].
pub fn event_rows(events: &[Event]) -> Vec<EventRow> {
    let mut rows: Vec<EventRow> = events
        .iter()
        .map(|e| EventRow {
            at: event_time(e),
            type_: e.type_.clone().unwrap_or_default(),
            reason: e.reason.clone().unwrap_or_default(),
            message: e.message.clone().unwrap_or_default(),
            count: e.count.unwrap_or(1),
        })
        .collect();
    // RFC 3339 in UTC sorts as text; the name breaks ties deterministically.
    rows.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| a.reason.cmp(&b.reason)));
    rows.truncate(EVENTS_SHOWN);
    rows
}

fn outcome_entry(outcome: &RolloutOutcome) -> TimelineEntry {
    let version = outcome
        .version
        .clone()
        .unwrap_or_else(|| crate::api::servepipeline::short_digest(&outcome.digest));
    TimelineEntry {
        at: outcome.at.0.to_string(),
        what: format!("{} ({})", outcome.result, outcome.reason),
        message: format!("{version}: {}", outcome.message),
        readings: outcome.readings.clone(),
    }
}

/// The rollout's moments, oldest first: its Events, the last outcome (with the readings of its
/// last step) and, while a canary runs, where it stands now.
pub fn timeline(pipeline: &ServePipeline, events: &[EventRow]) -> Vec<TimelineEntry> {
    let mut entries: Vec<TimelineEntry> = events
        .iter()
        .filter(|e| ROLLOUT_REASONS.contains(&e.reason.as_str()))
        .map(|e| TimelineEntry {
            at: e.at.clone(),
            what: e.reason.clone(),
            message: e.message.clone(),
            readings: None,
        })
        .collect();
    let rollout = pipeline.status.as_ref().and_then(|s| s.rollout.as_ref());
    if let Some(last) = rollout.and_then(|r| r.last.as_ref()) {
        entries.push(outcome_entry(last));
    }
    if let Some(canary) = rollout.and_then(|r| r.canary.as_ref()) {
        entries.push(TimelineEntry {
            at: canary.step_started_at.0.to_string(),
            what: format!(
                "Step {}/{} at {} %{}",
                canary.step,
                canary.steps,
                canary.weight,
                if canary.paused_at.is_some() {
                    ", paused"
                } else {
                    ""
                }
            ),
            message: format!(
                "canary {} since {}",
                canary.version.version.clone().unwrap_or_else(|| {
                    crate::api::servepipeline::short_digest(&canary.version.digest)
                }),
                canary.started_at.0
            ),
            readings: canary.readings.clone(),
        });
    }
    entries.sort_by(|a, b| a.at.cmp(&b.at));
    entries
}

/// The graphs drawn: the stable one, and the canary's while one runs.
pub fn graphs(pipeline: &ServePipeline, rayservice: Option<&RayService>) -> Vec<DrawnGraph> {
    let name = pipeline.name_any();
    let has_canary = pipeline
        .status
        .as_ref()
        .and_then(|s| s.rollout.as_ref())
        .is_some_and(|r| r.canary.is_some());
    let which: &[&'static str] = if has_canary {
        &["stable", "canary"]
    } else {
        &["stable"]
    };
    which
        .iter()
        .map(|which| {
            let Some(rayservice) = rayservice else {
                return DrawnGraph {
                    which,
                    svg: None,
                    problem: Some(format!("ServePipeline {name} has no RayService yet")),
                    nodes: Default::default(),
                    application: None,
                };
            };
            match running_graph(pipeline, rayservice, which) {
                Ok(running) => DrawnGraph {
                    which,
                    svg: Some(to_svg(&running.graph, &running.marks(&name))),
                    problem: None,
                    nodes: running.node_status,
                    application: Some(running.application),
                },
                Err(e) => DrawnGraph {
                    which,
                    svg: None,
                    problem: Some(format!("{e:#}")),
                    nodes: Default::default(),
                    application: None,
                },
            }
        })
        .collect()
}

/// The whole page's content.
pub fn detail(
    pipeline: &ServePipeline,
    rayservice: Option<&RayService>,
    events: &[Event],
) -> PipelineDetail {
    let status = pipeline.status.clone().unwrap_or_default();
    let events = event_rows(events);
    let canary = status.rollout.as_ref().and_then(|r| r.canary.as_ref());
    let graphs = graphs(pipeline, rayservice);
    let mut versions = versions(pipeline);
    // Strategy Immediate: the status names no application; the one carrying the graph runs it.
    for version in versions.iter_mut().filter(|v| v.application.is_empty()) {
        if let Some(application) = graphs
            .iter()
            .find(|g| g.which == version.role)
            .and_then(|g| g.application.clone())
        {
            version.application = application;
        }
    }
    PipelineDetail {
        summary: summary(pipeline),
        versions,
        readings: canary.and_then(|c| c.readings.clone()),
        plan: canary.map(|c| c.plan.clone()).unwrap_or_default(),
        timeline: timeline(pipeline, &events),
        graphs,
        conditions: status
            .conditions
            .iter()
            .map(|c| ConditionRow {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
            .collect(),
        events,
        metrics: Vec::new(),
        metrics_problem: None,
        ray_cluster: rayservice
            .and_then(|rs| rs.status.as_ref())
            .and_then(|s| s.active_service_status.as_ref())
            .and_then(|a| a.ray_cluster_name.clone())
            .filter(|n| !n.is_empty()),
    }
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
