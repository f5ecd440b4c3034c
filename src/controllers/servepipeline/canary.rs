//! The canary strategy (`rollout.strategy: Canary`), pure: renders the newest graph (and the
//! stable one with today's spec) as version applications, lets [`rollout::decide`] take one
//! step on the routers' counters the observe stage read, and composes the RayService carrying
//! the router and the version applications. No client, no clock: the caller passes both in.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde_json::Value;

use super::build;
use super::conditions::{self, Problem};
use super::config::Config;
use super::desired::Desired;
use super::memory::GoodGraph;
use super::rollout::{self, Announcement, Inputs, Newest, Policy};
use super::shared;
use crate::api::rayservice::RayService;
use crate::api::servepipeline::{
    ROLLOUT_COMMAND_ANNOTATION, RolloutCommand, RolloutStatus, ServePipeline, condition_types,
};
use crate::k8s::K8sError;
use crate::serve::ServeConfig;
use crate::serve::rollout::{
    RouterStats, applications_of, compose, options_of, rendered_options, router_application,
    version_application, version_application_name,
};
use crate::serve::shared::{NodeLayout, split};

/// Lines of the plan kept in the status.
const MAX_PLAN_LINES: usize = 12;

/// Everything one canary step is planned from.
pub(super) struct CanaryInputs<'a> {
    pub pipeline: &'a ServePipeline,
    pub config: &'a Config,
    pub policy: &'a Policy,
    /// The newest valid graph, and the stable version's graph while it is in memory.
    pub newest: Option<&'a GoodGraph>,
    pub stable: Option<&'a GoodGraph>,
    /// The RayService on the cluster, as read.
    pub existing: Option<&'a RayService>,
    /// The routers' counters as the pipeline's reader last read them.
    pub stats: Option<&'a RouterStats>,
    pub now: &'a Time,
}

/// One canary step, planned.
pub(super) struct CanaryPlan {
    pub desired: Desired,
    /// The rollout as this step decided it.
    pub rollout: RolloutStatus,
    /// The rollout to keep when the write is refused: nothing changed on the cluster.
    pub rollout_if_refused: RolloutStatus,
    /// A step or a retirement is under way: reconcile again soon.
    pub active: bool,
    /// The step's Events, published before the write.
    pub events: Vec<Announcement>,
    /// A rollout this step ended, counted once the RayService carries the outcome.
    pub ended: Option<(&'static str, String)>,
    /// The pipeline's rollout command was acted on or refused: its annotation can go.
    pub command_consumed: bool,
}

/// The pipeline's rollout command: parsed, or a Warning naming what is wrong with it (such a
/// command is consumed: it can never apply).
pub(super) fn rollout_command(
    pipeline: &ServePipeline,
) -> (Option<RolloutCommand>, Option<Announcement>) {
    let Some(text) = pipeline.annotations().get(ROLLOUT_COMMAND_ANNOTATION) else {
        return (None, None);
    };
    match RolloutCommand::parse(text) {
        Ok(command) => (Some(command), None),
        Err(problem) => (
            None,
            Some(Announcement {
                warning: true,
                reason: "RolloutCommandInvalid",
                message: format!(
                    "annotation {ROLLOUT_COMMAND_ANNOTATION} {:?}: {problem}",
                    crate::k8s::truncate(text, 100)
                ),
            }),
        ),
    }
}

/// The route of the pipeline's router: the newest graph's (as rendering decides it), else the
/// one the RayService's router has, else `/`. The observe stage reads the routers' counters
/// under it.
pub(super) fn route_prefix(
    pipeline: &ServePipeline,
    config: &Config,
    newest: Option<&GoodGraph>,
    existing: Option<&RayService>,
) -> String {
    let options = build::render_options(pipeline, config);
    if let Some(g) = newest {
        let from_graph = &g.graph.graph().route_prefix;
        return options
            .route_prefix
            .clone()
            .or_else(|| (!from_graph.is_empty()).then(|| from_graph.clone()))
            .unwrap_or_else(|| "/".to_owned());
    }
    let yaml = existing
        .and_then(|rs| rs.spec.serve_config_v2.clone())
        .unwrap_or_default();
    applications_of(&yaml)
        .get(&application_base(pipeline, config))
        .and_then(|router| router["route_prefix"].as_str())
        .map_or_else(|| "/".to_owned(), str::to_owned)
}

/// The router application's name; version applications are named after it.
fn application_base(pipeline: &ServePipeline, config: &Config) -> String {
    build::render_options(pipeline, config)
        .application_name
        .unwrap_or_else(|| pipeline.name_any())
}

/// The newest graph rendered as a version application, with the route and top-level options
/// of its config (`None` for each when there is no newest graph), and its node applications
/// (shared nodes).
struct Rendered {
    newest: Option<Newest>,
    route_prefix: Option<String>,
    top_level: Option<Value>,
    nodes: BTreeMap<String, Value>,
}

/// One rendered graph version as an application without a route named `name`, and, with
/// shared nodes, the node applications it names (named after `base`).
fn as_version(
    rendered: &ServeConfig,
    name: &str,
    base: &str,
    layout: NodeLayout,
) -> Result<(Value, BTreeMap<String, Value>), String> {
    match layout {
        NodeLayout::Inline => version_application(rendered, name)
            .map(|app| (app, BTreeMap::new()))
            .ok_or_else(|| "the graph rendered no application".to_owned()),
        NodeLayout::Shared => {
            let layout = split(rendered, base).map_err(|e| e.to_string())?;
            let mut app = layout.version;
            app["name"] = Value::String(name.to_owned());
            // An explicit null: Serve's default for a missing route prefix is "/".
            app["route_prefix"] = Value::Null;
            Ok((app, layout.nodes))
        }
    }
}

fn render_newest(inputs: &CanaryInputs<'_>, base: &str) -> Result<Rendered, String> {
    let Some(g) = inputs.newest else {
        return Ok(Rendered {
            newest: None,
            route_prefix: None,
            top_level: None,
            nodes: BTreeMap::new(),
        });
    };
    let options = build::version_render_options(inputs.pipeline, inputs.config, &g.applied);
    let rendered = crate::serve::render(&g.graph, &options).map_err(|e| e.to_string())?;
    let name = version_application_name(base, &g.applied.digest);
    let layout = inputs.config.node_layout;
    let (application, nodes) = as_version(&rendered, &name, base, layout)?;
    let stable_rendered = inputs
        .stable
        .filter(|old| old.applied.digest != g.applied.digest)
        .and_then(|old| {
            let options =
                build::version_render_options(inputs.pipeline, inputs.config, &old.applied);
            crate::serve::render(&old.graph, &options).ok()
        });
    Ok(Rendered {
        newest: Some(Newest {
            digest: g.applied.digest.clone(),
            version: g.applied.version.clone(),
            application,
            plan: change_plan(
                inputs.stable,
                g,
                &rendered,
                stable_rendered.as_ref(),
                layout,
            ),
        }),
        route_prefix: rendered
            .applications
            .first()
            .and_then(|a| a.route_prefix.clone()),
        top_level: Some(rendered_options(&rendered)),
        nodes,
    })
}

/// The stable graph with today's spec, when it is in memory (a spec edit reaches both
/// versions).
fn render_stable(
    inputs: &CanaryInputs<'_>,
    previous: Option<&RolloutStatus>,
    newest: Option<&Newest>,
    base: &str,
) -> Option<(Newest, BTreeMap<String, Value>)> {
    let stable_digest = previous
        .and_then(|r| r.stable.as_ref())
        .map(|s| s.digest.as_str());
    let g = inputs
        .stable
        .filter(|g| Some(g.applied.digest.as_str()) == stable_digest)
        .filter(|g| newest.is_none_or(|n| n.digest != g.applied.digest))?;
    let options = build::version_render_options(inputs.pipeline, inputs.config, &g.applied);
    let rendered = crate::serve::render(&g.graph, &options).ok()?;
    let name = version_application_name(base, &g.applied.digest);
    let (application, nodes) =
        as_version(&rendered, &name, base, inputs.config.node_layout).ok()?;
    let newest = Newest {
        digest: g.applied.digest.clone(),
        version: g.applied.version.clone(),
        application,
        plan: Vec::new(),
    };
    Some((newest, nodes))
}

/// One rollout step for the pipeline.
pub(super) fn plan(inputs: &CanaryInputs<'_>) -> Result<CanaryPlan, K8sError> {
    let pipeline = inputs.pipeline;
    let previous = pipeline.status.as_ref().and_then(|s| s.rollout.clone());
    let kept = previous.clone().unwrap_or_else(|| RolloutStatus {
        phase: rollout::phases::STABLE.to_owned(),
        ..Default::default()
    });
    let options = build::render_options(pipeline, inputs.config);
    let base = application_base(pipeline, inputs.config);
    let existing_yaml = inputs
        .existing
        .and_then(|rs| rs.spec.serve_config_v2.clone())
        .unwrap_or_default();
    let current = applications_of(&existing_yaml);
    let rendered = match render_newest(inputs, &base) {
        Ok(rendered) => rendered,
        Err(message) => {
            return Ok(CanaryPlan {
                desired: Desired::render_failed(message),
                rollout: kept.clone(),
                rollout_if_refused: kept,
                active: false,
                events: Vec::new(),
                ended: None,
                command_consumed: false,
            });
        }
    };
    let (stable_rendered, stable_nodes) =
        match render_stable(inputs, previous.as_ref(), rendered.newest.as_ref(), &base) {
            Some((newest, nodes)) => (Some(newest), nodes),
            None => (None, BTreeMap::new()),
        };
    let mut serve = inputs
        .existing
        .map(conditions::applications_from)
        .unwrap_or_default();
    // A version runs only when every node application it names runs too.
    let versions = current
        .iter()
        .map(|(name, app)| (name.as_str(), app))
        .chain(
            [rendered.newest.as_ref(), stable_rendered.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|n| Some((n.application["name"].as_str()?, &n.application))),
        );
    shared::fold_node_statuses(&mut serve, versions);
    let (command, invalid_command) = rollout_command(pipeline);
    let decision = rollout::decide(&Inputs {
        policy: inputs.policy,
        previous: previous.as_ref(),
        base: &base,
        executor: &options.executor_deployment,
        newest: rendered.newest.as_ref(),
        stable_rendered: stable_rendered.as_ref(),
        current: &current,
        serve: &serve,
        stats: inputs.stats,
        suspended: pipeline.spec.suspend.unwrap_or(false),
        paused: pipeline
            .spec
            .rollout
            .as_ref()
            .and_then(|r| r.paused)
            .unwrap_or(false),
        command: command.as_ref(),
        now: inputs.now,
    });
    let mut rendered_nodes = rendered.nodes;
    rendered_nodes.extend(stable_nodes);
    let carried_statuses = inputs
        .existing
        .map(conditions::applications_from)
        .unwrap_or_default();
    let (versions, starting) =
        shared::stage_versions(&decision.applications, &current, &carried_statuses);
    let nodes = shared::node_applications(&versions, &rendered_nodes, &current).map(|named| {
        let mut by_name: BTreeMap<String, Value> = named
            .into_iter()
            .map(|app| (app["name"].as_str().unwrap_or_default().to_owned(), app))
            .collect();
        for app in &starting {
            if let Some(node) = rendered_nodes.get(app) {
                by_name.entry(app.clone()).or_insert_with(|| node.clone());
            }
        }
        by_name.into_values().collect::<Vec<_>>()
    });
    let missing = decision
        .missing
        .clone()
        .or_else(|| nodes.as_ref().err().cloned());
    let desired = match (&decision.router, &missing) {
        (Some(router), None) => {
            let route_prefix = if rendered.newest.is_some() {
                rendered.route_prefix
            } else {
                router_route(&current, &base)
            }
            .unwrap_or_else(|| "/".to_owned());
            let mut applications = vec![router_application(
                &base,
                &route_prefix,
                &options.runtime_py_modules,
                router,
            )];
            applications.extend(versions.iter().cloned());
            applications.extend(nodes.unwrap_or_default());
            let top_level = rendered
                .top_level
                .unwrap_or_else(|| options_of(&existing_yaml));
            let yaml = serde_yaml::to_string(&compose(top_level, applications)).unwrap_or_default();
            let stable_digest = decision
                .status
                .stable
                .as_ref()
                .map(|s| s.digest.clone())
                .unwrap_or_default();
            Desired::Write(Box::new(build::desired_rayservice(
                pipeline,
                &yaml,
                &stable_digest,
            )?))
        }
        _ => Desired::Refuse {
            problem: Problem {
                condition: condition_types::READY,
                reason: "RolloutStateLost".to_owned(),
                message: missing.unwrap_or_else(|| "no graph version to serve yet".to_owned()),
            },
            transient: true,
        },
    };
    let mut events = decision.events;
    events.extend(invalid_command.clone());
    Ok(CanaryPlan {
        desired,
        ended: rollout::newly_ended(previous.as_ref(), &decision.status),
        rollout_if_refused: previous.unwrap_or_else(|| decision.status.clone()),
        rollout: decision.status,
        active: decision.active || !starting.is_empty(),
        events,
        command_consumed: decision.command_consumed || invalid_command.is_some(),
    })
}

/// The route the RayService's router has now.
fn router_route(current: &BTreeMap<String, Value>, base: &str) -> Option<String> {
    current
        .get(base)
        .and_then(|router| router["route_prefix"].as_str())
        .map(str::to_owned)
}

/// What the new graph changes against the stable one, one line per change.
fn change_plan(
    stable: Option<&GoodGraph>,
    newest: &GoodGraph,
    rendered: &ServeConfig,
    stable_rendered: Option<&ServeConfig>,
    layout: NodeLayout,
) -> Vec<String> {
    match stable {
        Some(old) if old.applied.digest != newest.applied.digest => {
            let code = |g: &GoodGraph| g.applied.oci.as_ref().and_then(|o| o.code_digest.clone());
            let (old_code, new_code) = (code(old), code(newest));
            let plan = crate::graph::diff::diff(old.graph.graph(), newest.graph.graph());
            let shared_starts = (layout == NodeLayout::Shared)
                .then(|| crate::serve::shared::layout_starts(stable_rendered, rendered))
                .flatten();
            let mut lines = plan.lines(MAX_PLAN_LINES - 2);
            if old_code != new_code {
                let name = |digest: Option<String>| digest.unwrap_or_else(|| "none".to_owned());
                lines.push(format!(
                    "code layer: {} → {}",
                    name(old_code),
                    name(new_code)
                ));
            }
            match shared_starts {
                Some(starts) => lines.push(format!(
                    "the canary shares every unchanged node with the stable version: it starts {} (its executor and the nodes whose key changed)",
                    starts.canary
                )),
                None => {
                    // Serve shares no deployment between applications: per-node "in place" or
                    // "unchanged" describes the graph change, not what the canary deploys.
                    let starts = crate::serve::rollout_starts(&plan, rendered).canary;
                    lines.push(format!(
                        "the canary is its own Serve application: every node of it starts new replicas ({starts} in all), and the stable version keeps its own"
                    ));
                }
            }
            lines
        }
        _ => Vec::new(),
    }
}
