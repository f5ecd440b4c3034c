//! What the plugin shows of a pipeline, computed from the object alone (no client): the
//! summary behind `get` (as a table row or as JSON/YAML) and the text of `rollout status`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde::Serialize;

use crate::api::servepipeline::{
    CanaryStatus, GateReadings, RolloutOutcome, RolloutStrategy, ServePipeline, VersionStatus,
    condition_types,
};

/// One pipeline as `get` shows it (and prints with `--output json|yaml`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PipelineSummary {
    pub namespace: String,
    pub name: String,
    /// The `Ready` condition's status (`True`, `False`, `Unknown`).
    pub ready: String,
    pub phase: String,
    /// Why it is not ready, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub strategy: String,
    /// The version that takes the traffic (the stable one during a canary).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<Version>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
    /// `Stable`, `Progressing` or `Finishing` (strategy Canary only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ray_service: Option<String>,
    /// How the last rollout ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last: Option<RolloutOutcome>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<Time>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Version {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub digest: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Canary {
    #[serde(flatten)]
    pub version: Version,
    pub step: i32,
    pub steps: i32,
    pub weight: i32,
    pub paused: bool,
    pub started_at: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readings: Option<GateReadings>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<String>,
}

fn version_of(v: &VersionStatus) -> Version {
    Version {
        version: v.version.clone(),
        digest: v.digest.clone(),
    }
}

fn canary_of(c: &CanaryStatus, paused: bool) -> Canary {
    Canary {
        version: version_of(&c.version),
        step: c.step,
        steps: c.steps,
        weight: c.weight,
        paused: paused || c.paused_at.is_some(),
        started_at: c.started_at.clone(),
        readings: c.readings.clone(),
        plan: c.plan.clone(),
    }
}

pub fn strategy_of(pipeline: &ServePipeline) -> RolloutStrategy {
    pipeline
        .spec
        .rollout
        .as_ref()
        .map(|r| r.strategy)
        .unwrap_or_default()
}

pub fn paused(pipeline: &ServePipeline) -> bool {
    pipeline
        .spec
        .rollout
        .as_ref()
        .and_then(|r| r.paused)
        .unwrap_or(false)
}

/// The summary of one pipeline.
pub fn summary(pipeline: &ServePipeline) -> PipelineSummary {
    let status = pipeline.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == condition_types::READY);
    let rollout = status.rollout.as_ref();
    let serving = match rollout.and_then(|r| r.stable.as_ref()) {
        Some(stable) => Some(version_of(stable)),
        // Strategy Immediate: the graph the status describes is the one served.
        None => status.source.as_ref().map(|s| Version {
            version: status.graph.as_ref().and_then(|g| g.version.clone()),
            digest: s.digest.clone(),
        }),
    };
    PipelineSummary {
        namespace: pipeline.namespace().unwrap_or_default(),
        name: pipeline.name_any(),
        ready: ready.map_or_else(|| "Unknown".to_owned(), |c| c.status.clone()),
        phase: status.phase.clone().unwrap_or_default(),
        reason: ready
            .filter(|c| c.status != "True")
            .map(|c| c.reason.clone()),
        strategy: format!("{:?}", strategy_of(pipeline)),
        serving,
        canary: rollout
            .and_then(|r| r.canary.as_ref())
            .map(|c| canary_of(c, paused(pipeline))),
        rollout: rollout.map(|r| r.phase.clone()),
        ray_service: status.ray_service_name.clone(),
        last: rollout.and_then(|r| r.last.clone()),
        created: pipeline.metadata.creation_timestamp.clone(),
    }
}

pub use crate::api::servepipeline::short_digest;

fn version_label(v: &Version) -> String {
    match &v.version {
        Some(version) => format!("{version} ({})", short_digest(&v.digest)),
        None => short_digest(&v.digest),
    }
}

/// A duration as kubectl prints ages: `45s`, `12m`, `3h`, `5d`.
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn seconds_since(now: &Time, then: &Time) -> i64 {
    now.0.as_second() - then.0.as_second()
}

/// The rows of `get`, aligned in columns like kubectl's.
pub fn table(rows: &[PipelineSummary], with_namespace: bool, now: &Time) -> String {
    let mut lines: Vec<Vec<String>> = Vec::with_capacity(rows.len() + 1);
    let mut header = vec![
        "NAME", "READY", "PHASE", "SERVING", "CANARY", "ROLLOUT", "AGE",
    ];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    lines.push(header.into_iter().map(str::to_owned).collect());
    for row in rows {
        let canary = row.canary.as_ref().map_or_else(
            || "-".to_owned(),
            |c| {
                format!(
                    "{} {}/{} {}%{}",
                    version_label(&c.version),
                    c.step,
                    c.steps,
                    c.weight,
                    if c.paused { " paused" } else { "" }
                )
            },
        );
        let mut line = vec![
            row.name.clone(),
            row.ready.clone(),
            if row.phase.is_empty() {
                "-".to_owned()
            } else {
                row.phase.clone()
            },
            row.serving
                .as_ref()
                .map_or_else(|| "-".to_owned(), version_label),
            canary,
            row.rollout.clone().unwrap_or_else(|| "-".to_owned()),
            row.created
                .as_ref()
                .map_or_else(|| "-".to_owned(), |t| age(seconds_since(now, t))),
        ];
        if with_namespace {
            line.insert(0, row.namespace.clone());
        }
        lines.push(line);
    }
    columns(&lines)
}

/// Left-aligned columns, three spaces apart, no trailing blanks.
pub fn columns(lines: &[Vec<String>]) -> String {
    let width = lines.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..width)
        .map(|i| {
            lines
                .iter()
                .filter_map(|l| l.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in lines {
        let mut text = String::new();
        for (i, cell) in line.iter().enumerate() {
            text.push_str(cell);
            if i + 1 < line.len() {
                let pad = widths[i].saturating_sub(cell.chars().count()) + 3;
                text.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

fn readings_line(r: &GateReadings) -> String {
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} ms"));
    format!(
        "canary {} requests, {} errors ({} retried on stable), latency {}; stable {} requests, latency {}",
        r.canary_requests,
        r.canary_errors,
        r.retried_on_stable,
        ms(r.canary_latency_ms),
        r.stable_requests,
        ms(r.stable_latency_ms)
    )
}

/// The text of `rollout status`.
pub fn rollout_text(pipeline: &ServePipeline, now: &Time) -> String {
    let s = summary(pipeline);
    let mut out = format!(
        "{}/{}: {} (strategy {}, Ready {}{})\n",
        s.namespace,
        s.name,
        s.rollout.as_deref().unwrap_or(if s.phase.is_empty() {
            "no status yet"
        } else {
            &s.phase
        }),
        s.strategy,
        s.ready,
        s.reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default()
    );
    if let Some(v) = &s.serving {
        out.push_str(&format!("  serving  {} {}\n", version_label(v), v.digest));
    }
    if let Some(c) = &s.canary {
        out.push_str(&format!(
            "  canary   {} {}: step {} of {}, {} % of requests, for {}{}\n",
            version_label(&c.version),
            c.version.digest,
            c.step,
            c.steps,
            c.weight,
            age(seconds_since(now, &c.started_at)),
            if c.paused { ", PAUSED" } else { "" }
        ));
        if let Some(r) = &c.readings {
            out.push_str(&format!("  gates    {}\n", readings_line(r)));
        }
        for line in &c.plan {
            out.push_str(&format!("  plan     {line}\n"));
        }
    }
    if let Some(last) = &s.last {
        out.push_str(&format!(
            "  last     {} {} ({}): {}: {}\n",
            last.result,
            last.version
                .clone()
                .unwrap_or_else(|| short_digest(&last.digest)),
            short_digest(&last.digest),
            last.reason,
            last.message
        ));
    }
    out
}

/// Where a rollout that `rollout status` waits on stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Still going (or not yet seen by the controller).
    Going,
    /// Done: the newest version serves.
    Done,
    /// Ended without the new version: rolled back or aborted (the message says how).
    Failed(String),
}

/// Whether the rollout `waiting_for` (the canary digest seen when the wait began, if any) is
/// over. Strategy Immediate: done once the controller saw this generation and is Ready and
/// up to date.
pub fn progress(pipeline: &ServePipeline, waiting_for: Option<&str>) -> Progress {
    let status = pipeline.status.clone().unwrap_or_default();
    let condition = |t: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.status.as_str())
    };
    let seen = status.observed_generation.is_some()
        && status.observed_generation == pipeline.metadata.generation;
    if let Some(rollout) = &status.rollout {
        if rollout.canary.is_some() {
            return Progress::Going;
        }
        if let Some(digest) = waiting_for
            && let Some(last) = rollout.last.as_ref().filter(|l| l.digest == digest)
        {
            return if last.result == crate::controllers::servepipeline::ROLLOUT_PROMOTED {
                Progress::Done
            } else {
                Progress::Failed(format!(
                    "{} ({}): {}",
                    last.result, last.reason, last.message
                ))
            };
        }
    }
    if seen
        && condition(condition_types::READY) == Some("True")
        && condition(condition_types::UP_TO_DATE) != Some("False")
    {
        Progress::Done
    } else {
        Progress::Going
    }
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
