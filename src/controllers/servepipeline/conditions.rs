//! The status half of the ServePipeline's pure builders: conditions, phase and the whole
//! status, computed from what a pass found (the graph that serves, the latest problem, the
//! RayService, the rollout). No client, no clock: `status.rs` writes what this computes.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use super::build::{AppliedGraph, phases, reasons};
use crate::api::conditions::{self, FALSE, TRUE, UNKNOWN};
use crate::api::rayservice::RayService;
use crate::api::servepipeline::{
    ApplicationStatus, GraphStatus, NodeStatus, RolloutStatus, ServePipeline, ServePipelineStatus,
    SourceStatus, condition_types,
};

/// Longest message from untrusted input (registry, graph, spec) that reaches a log line; the
/// conditions keep at most 2 KiB too.
pub const MAX_LOGGED_MESSAGE: usize = 2048;

/// A problem of the latest attempt: which condition it belongs to, reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub condition: &'static str,
    pub reason: String,
    pub message: String,
}

/// Everything the status is computed from.
pub struct StatusInputs<'a> {
    pub pipeline: &'a ServePipeline,
    /// The graph the RayService carries (or would, once applied).
    pub applied: Option<&'a AppliedGraph>,
    /// What went wrong in this reconcile, if anything.
    pub problem: Option<&'a Problem>,
    /// The RayService as last read or applied.
    pub rayservice: Option<&'a RayService>,
    /// The canary rollout's state (strategy `Canary`), as this pass decided it.
    pub rollout: Option<&'a RolloutStatus>,
    /// The newest valid graph the source offered (with a canary policy it may differ from
    /// `applied`, the one that serves).
    pub newest: Option<&'a AppliedGraph>,
    pub now: Time,
}

fn rayservice_ready(rs: &RayService) -> (bool, String) {
    let status = serde_json::to_value(&rs.status).unwrap_or_default();
    let ready_condition = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned();
    if let Some(c) = ready_condition {
        let ready = c["status"] == TRUE;
        let msg = c["message"].as_str().unwrap_or_default().to_owned();
        return (ready, msg);
    }
    (status["serviceStatus"] == "Running", String::new())
}

/// With a canary policy the pipeline serves when its router and its stable version run: a
/// canary still starting (or failing) leaves the RayService not Ready, not the pipeline.
fn canary_serving(rs: &RayService, rollout: &RolloutStatus) -> (bool, String) {
    let (rs_ready, rs_message) = rayservice_ready(rs);
    if rs_ready {
        return (true, rs_message);
    }
    let apps = applications_from(rs);
    let Some(stable) = &rollout.stable else {
        return (false, rs_message);
    };
    let running = |name: &str| {
        apps.get(name)
            .is_some_and(|a| a.status.as_deref() == Some("RUNNING"))
    };
    // The router is named like the versions without their `--<digest>` suffix.
    let router = stable
        .application
        .rsplit_once("--")
        .map_or(stable.application.as_str(), |(base, _)| base);
    if running(router) && running(&stable.application) {
        (true, String::new())
    } else {
        (false, rs_message)
    }
}

/// `UpToDate`: whether the graph serving is the newest the source offers. `Ready` stays True
/// while a previous graph serves (a refused push takes nothing down); this says that what
/// serves is not what was pushed, for GitOps tools and `kubectl wait`.
fn up_to_date<'a>(inputs: &'a StatusInputs<'_>, serving: bool) -> (&'static str, &'a str, String) {
    let problem = |c: &str| inputs.problem.filter(|p| p.condition == c);
    let label = |digest: &str, version: &Option<String>| {
        format!("{} ({digest})", version.as_deref().unwrap_or("unversioned"))
    };
    if let Some(p) = problem(condition_types::SOURCE_READY) {
        return (
            UNKNOWN,
            &p.reason,
            format!(
                "the source could not be read, so whether the serving graph is the newest is unknown: {}",
                p.message
            ),
        );
    }
    if let Some(p) = problem(condition_types::GRAPH_VALID) {
        return (
            FALSE,
            &p.reason,
            format!(
                "the newest graph was refused; the previous one serves: {}",
                p.message
            ),
        );
    }
    if let Some(rollout) = inputs.rollout {
        if let Some(c) = &rollout.canary {
            return (
                FALSE,
                reasons::ROLLOUT_IN_PROGRESS,
                format!(
                    "graph {} is being rolled out (step {} of {})",
                    label(&c.version.digest, &c.version.version),
                    c.step,
                    c.steps
                ),
            );
        }
        if let (Some(last), Some(newest)) = (&rollout.last, inputs.newest)
            && last.result == "RolledBack"
            && last.digest == newest.digest
        {
            return (
                FALSE,
                reasons::ROLLED_BACK,
                format!(
                    "the newest graph {} was rolled back ({}); the previous one serves",
                    label(&last.digest, &last.version),
                    last.reason
                ),
            );
        }
    }
    match inputs.applied {
        None => (FALSE, reasons::NO_GRAPH, "no graph serves yet".to_owned()),
        Some(g) if !serving => (
            FALSE,
            reasons::RAYSERVICE_NOT_READY,
            format!(
                "graph {} is applied; the RayService does not serve it yet",
                label(&g.digest, &g.version)
            ),
        ),
        Some(g) => match inputs
            .rayservice
            .filter(|_| inputs.rollout.is_none())
            .and_then(serve_failure)
        {
            Some(failure) => (
                FALSE,
                reasons::SERVE_DEPLOY_FAILED,
                format!(
                    "graph {} is applied and Serve did not deploy it; what Serve ran before still answers: {failure}",
                    label(&g.digest, &g.version)
                ),
            ),
            None => (
                TRUE,
                reasons::SERVING,
                format!("graph {} serves", label(&g.digest, &g.version)),
            ),
        },
    }
}

/// The first application Serve reports as failed to deploy or unhealthy, with Serve's words.
/// (With a canary policy the rollout judges its own version; this is for the newest graph
/// applied at once.)
fn serve_failure(rs: &RayService) -> Option<String> {
    applications_from(rs).into_iter().find_map(|(name, app)| {
        let status = app.status.as_deref()?;
        matches!(status, "DEPLOY_FAILED" | "UNHEALTHY").then(|| {
            crate::k8s::truncate(
                &format!(
                    "application {name} is {status}: {}",
                    app.message.as_deref().unwrap_or("no message")
                ),
                MAX_SERVE_MESSAGE,
            )
        })
    })
}

/// Serve's messages can carry a whole traceback; the condition keeps its start.
const MAX_SERVE_MESSAGE: usize = 600;

/// `Progressing` and `RolledBack` from the rollout's state.
fn rollout_conditions(
    conds: &mut Vec<Condition>,
    rollout: &RolloutStatus,
    cond: &dyn Fn(&str, &str, &str, String) -> Condition,
) {
    let label = |digest: &str, version: &Option<String>| {
        format!("{} ({digest})", version.as_deref().unwrap_or("unversioned"))
    };
    let progressing = match (&rollout.canary, &rollout.last) {
        (Some(c), _) => cond(
            condition_types::PROGRESSING,
            TRUE,
            "Canary",
            if c.step == 0 {
                format!(
                    "graph {} is starting beside the stable version, with no traffic yet",
                    label(&c.version.digest, &c.version.version)
                )
            } else {
                format!(
                    "graph {} answers {} % of requests (step {} of {})",
                    label(&c.version.digest, &c.version.version),
                    c.weight,
                    c.step,
                    c.steps
                )
            },
        ),
        (None, Some(last)) => cond(
            condition_types::PROGRESSING,
            FALSE,
            &last.result,
            format!(
                "graph {}: {}: {}",
                label(&last.digest, &last.version),
                last.reason,
                last.message
            ),
        ),
        (None, None) => cond(
            condition_types::PROGRESSING,
            FALSE,
            "Stable",
            "no rollout has run yet".to_owned(),
        ),
    };
    conditions::set_condition(conds, progressing);
    let rolled_back = match &rollout.last {
        Some(last) if last.result == "RolledBack" => cond(
            condition_types::ROLLED_BACK,
            TRUE,
            &last.reason,
            format!(
                "graph {} was rolled back{}: {}",
                label(&last.digest, &last.version),
                last.node
                    .as_deref()
                    .map(|n| format!(" (node {n})"))
                    .unwrap_or_default(),
                last.message
            ),
        ),
        _ => cond(
            condition_types::ROLLED_BACK,
            FALSE,
            "NotRolledBack",
            "the last rollout was not rolled back".to_owned(),
        ),
    };
    conditions::set_condition(conds, rolled_back);
}

/// Serve application statuses from the RayService's active (else pending) service status.
pub fn applications_from(rs: &RayService) -> BTreeMap<String, ApplicationStatus> {
    let status = serde_json::to_value(&rs.status).unwrap_or_default();
    let apps = status["activeServiceStatus"]["applicationStatuses"]
        .as_object()
        .or_else(|| status["pendingServiceStatus"]["applicationStatuses"].as_object());
    let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
    apps.map(|apps| {
        apps.iter()
            .map(|(name, app)| {
                let deployments = app["serveDeploymentStatuses"]
                    .as_object()
                    .map(|deps| {
                        deps.iter()
                            .map(|(d, s)| {
                                (
                                    d.clone(),
                                    NodeStatus {
                                        status: text(&s["status"]),
                                        message: text(&s["message"]),
                                    },
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                (
                    name.clone(),
                    ApplicationStatus {
                        status: text(&app["status"]),
                        message: text(&app["message"]),
                        deployments,
                    },
                )
            })
            .collect()
    })
    .unwrap_or_default()
}

/// Computes the pipeline's status. Conditions keep their transition times when their status
/// The status after a contained panic: `Ready` False with reason `ReconcilePanicked`, the
/// rest as it was (the RayService is not read: the reconcile that panicked did not finish).
pub fn panic_status(
    pipeline: &ServePipeline,
    applied: Option<&AppliedGraph>,
    message: &str,
    now: Time,
) -> ServePipelineStatus {
    let problem = Problem {
        condition: condition_types::READY,
        reason: crate::controllers::frame::REASON_RECONCILE_PANICKED.to_owned(),
        message: format!("the reconcile panicked (a raypipe bug; retried with backoff): {message}"),
    };
    compute_status(&StatusInputs {
        pipeline,
        applied,
        problem: Some(&problem),
        rayservice: None,
        rollout: pipeline.status.as_ref().and_then(|s| s.rollout.as_ref()),
        newest: applied,
        now,
    })
}

/// does not change, so an unchanged world computes an identical status (and costs no write).
pub fn compute_status(inputs: &StatusInputs<'_>) -> ServePipelineStatus {
    let pipeline = inputs.pipeline;
    let generation = pipeline.metadata.generation;
    let previous = pipeline.status.clone().unwrap_or_default();
    let mut conds: Vec<Condition> = previous.conditions.clone();
    let cond = |t: &str, s: &str, r: &str, m: String| {
        conditions::condition(t, s, r, m, generation, inputs.now.clone())
    };

    source_and_graph_conditions(inputs, &mut conds, &cond);

    // Ready and phase
    let suspended = pipeline.spec.suspend.unwrap_or(false);
    let (serving, rs_message) = match (inputs.rayservice, inputs.rollout) {
        (Some(rs), Some(rollout)) => canary_serving(rs, rollout),
        (Some(rs), None) => rayservice_ready(rs),
        (None, _) => (false, String::new()),
    };
    let (ready_status, ready_reason, ready_message, phase) =
        ready(inputs, suspended, serving, &rs_message);
    conditions::set_condition(
        &mut conds,
        cond(
            condition_types::READY,
            ready_status,
            &ready_reason,
            ready_message,
        ),
    );
    let (status, reason, message) = up_to_date(inputs, serving && !suspended);
    conditions::set_condition(
        &mut conds,
        cond(condition_types::UP_TO_DATE, status, reason, message),
    );
    match inputs.rollout {
        Some(rollout) => rollout_conditions(&mut conds, rollout, &cond),
        None => conds.retain(|c| {
            c.type_ != condition_types::PROGRESSING && c.type_ != condition_types::ROLLED_BACK
        }),
    }
    for c in &mut conds {
        c.message = crate::k8s::truncate(&c.message, 2048);
    }

    let (source, graph) = described(inputs, &previous);
    ServePipelineStatus {
        observed_generation: generation,
        phase: Some(phase.to_owned()),
        source,
        graph,
        ray_service_name: inputs
            .rayservice
            .map(|rs| rs.name_any())
            .or(previous.ray_service_name.clone()),
        applications: inputs.rayservice.map(applications_from).unwrap_or_default(),
        rollout: inputs.rollout.cloned(),
        conditions: conds,
    }
}

/// `Ready` (status, reason, message) and the phase.
fn ready(
    inputs: &StatusInputs<'_>,
    suspended: bool,
    serving: bool,
    rs_message: &str,
) -> (&'static str, String, String, &'static str) {
    let other_problem = inputs.problem.filter(|p| {
        p.condition != condition_types::SOURCE_READY && p.condition != condition_types::GRAPH_VALID
    });
    if suspended {
        (
            FALSE,
            reasons::SUSPENDED.to_owned(),
            "spec.suspend is true".to_owned(),
            phases::SUSPENDED,
        )
    } else if let Some(p) = other_problem {
        (
            FALSE,
            p.reason.clone(),
            p.message.clone(),
            if inputs.applied.is_some() {
                phases::DEGRADED
            } else {
                phases::FAILED
            },
        )
    } else if inputs.applied.is_none() {
        let (reason, message) = inputs
            .problem
            .map(|p| (p.reason.clone(), p.message.clone()))
            .unwrap_or_else(|| {
                (
                    reasons::NO_GRAPH.to_owned(),
                    "waiting for the first graph".to_owned(),
                )
            });
        let phase = if inputs.problem.is_some() {
            phases::FAILED
        } else {
            phases::PENDING
        };
        (FALSE, reason, message, phase)
    } else if !serving {
        let msg = if rs_message.is_empty() {
            "waiting for the RayService to become Ready".to_owned()
        } else {
            format!("RayService: {rs_message}")
        };
        let phase = if inputs.problem.is_some() {
            phases::DEGRADED
        } else {
            phases::DEPLOYING
        };
        (FALSE, reasons::RAYSERVICE_NOT_READY.to_owned(), msg, phase)
    } else if let Some(p) = inputs.problem {
        (
            TRUE,
            reasons::SERVING_PREVIOUS_GRAPH.to_owned(),
            format!(
                "serving the last good graph; the newest was refused: {}",
                p.message
            ),
            phases::DEGRADED,
        )
    } else {
        (
            TRUE,
            reasons::SERVING.to_owned(),
            "the RayService is serving the graph".to_owned(),
            phases::READY,
        )
    }
}

/// `SourceReady` and `GraphValid`.
fn source_and_graph_conditions(
    inputs: &StatusInputs<'_>,
    conds: &mut Vec<Condition>,
    cond: &impl Fn(&str, &str, &str, String) -> Condition,
) {
    let problem_for = |c: &str| inputs.problem.filter(|p| p.condition == c);

    // SourceReady
    if let Some(p) = problem_for(condition_types::SOURCE_READY) {
        conditions::set_condition(
            conds,
            cond(
                condition_types::SOURCE_READY,
                FALSE,
                &p.reason,
                p.message.clone(),
            ),
        );
    } else if problem_for(condition_types::GRAPH_VALID).is_some() {
        // The download worked; what it brought is refused, and GraphValid says why.
        conditions::set_condition(
            conds,
            cond(
                condition_types::SOURCE_READY,
                TRUE,
                reasons::FETCHED,
                "the registry served the latest graph; GraphValid says why it is refused".into(),
            ),
        );
    } else if let Some(g) = inputs.applied {
        conditions::set_condition(
            conds,
            cond(
                condition_types::SOURCE_READY,
                TRUE,
                reasons::FETCHED,
                format!("{} ({} bytes)", g.digest, g.size),
            ),
        );
    }
    // GraphValid
    if let Some(p) = problem_for(condition_types::GRAPH_VALID) {
        conditions::set_condition(
            conds,
            cond(
                condition_types::GRAPH_VALID,
                FALSE,
                &p.reason,
                p.message.clone(),
            ),
        );
    } else if let Some(g) = inputs.applied {
        if problem_for(condition_types::SOURCE_READY).is_none() {
            let msg = format!(
                "{} nodes, {} edges, ingress {}",
                g.nodes, g.edges, g.ingress
            );
            conditions::set_condition(
                conds,
                cond(condition_types::GRAPH_VALID, TRUE, reasons::VALID, msg),
            );
        }
    } else if conditions::find(conds, condition_types::GRAPH_VALID).is_none() {
        conditions::set_condition(
            conds,
            cond(
                condition_types::GRAPH_VALID,
                UNKNOWN,
                reasons::NO_GRAPH,
                "no graph has been fetched yet".into(),
            ),
        );
    }
    if conditions::find(conds, condition_types::SOURCE_READY).is_none() {
        conditions::set_condition(
            conds,
            cond(
                condition_types::SOURCE_READY,
                UNKNOWN,
                reasons::NO_GRAPH,
                "not fetched yet".into(),
            ),
        );
    }
}

/// The status's `source` and `graph`: the applied graph's, else what the status said.
fn described(
    inputs: &StatusInputs<'_>,
    previous: &ServePipelineStatus,
) -> (Option<SourceStatus>, Option<GraphStatus>) {
    match inputs.applied {
        Some(g) => (
            Some(SourceStatus {
                digest: g.digest.clone(),
                etag: g.etag.clone(),
                fetched_at: Some(g.fetched_at.clone()),
                bytes: i64::try_from(g.size).unwrap_or(i64::MAX),
                oci: g.oci.clone(),
            }),
            Some(GraphStatus {
                nodes: i32::try_from(g.nodes).unwrap_or(i32::MAX),
                edges: i32::try_from(g.edges).unwrap_or(i32::MAX),
                ingress: g.ingress.clone(),
                version: g.version.clone(),
            }),
        ),
        // Nothing applied by this process yet: keep what the status said (e.g. after a restart).
        None => (previous.source.clone(), previous.graph.clone()),
    }
}
