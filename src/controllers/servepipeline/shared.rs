//! Shared node applications in a pipeline's RayService (docs/design/shared-nodes.md), pure:
//! which node applications a Serve config carries beside its version applications, and in
//! which order an Immediate rollout switches an executor to new nodes so that no request meets
//! a node that is not running yet or already gone.
//!
//! A node application stays in the config while a live version application's executor names
//! it, and, after the executor was switched away from it, for the longest graph deadline plus
//! [`RETIRE_GRACE`] (requests that started on the old wiring still call it). Those retirement
//! times live in an annotation of the RayService, so a restarted operator keeps them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::conditions::applications_from;
use crate::api::rayservice::RayService;
use crate::api::servepipeline::ApplicationStatus;
use crate::serve::rollout::applications_of;
use crate::serve::shared::{SharedLayout, WIRING_KEY, is_node_application, node_map};

/// Annotation of the RayService: the node applications kept for requests that started on a
/// previous wiring, each with the time it may go (JSON: name → RFC 3339).
pub const ANNOTATION_RETIRING: &str = "raypipe.dev/retiring-node-applications";
/// Kept beyond the longest graph deadline after a switch: the RayService controller pushes the
/// new wiring to Serve and Serve reconfigures every executor replica in this time.
pub const RETIRE_GRACE: Duration = Duration::from_secs(30);
/// Serve's status of an application that runs.
const RUNNING: &str = "RUNNING";

/// One Immediate step with shared nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct ImmediateStep {
    /// The applications to write: a version application first, then node applications.
    pub applications: Vec<Value>,
    /// Node applications kept after a switch, with the time each may go (RFC 3339).
    pub retiring: BTreeMap<String, String>,
    /// The executor still runs the previous wiring while the new nodes start.
    pub staging: bool,
    /// Starting or retiring nodes: look again soon.
    pub active: bool,
}

/// The next Immediate step towards `layout` from the RayService as read.
pub fn immediate_step(
    layout: &SharedLayout,
    existing: Option<&RayService>,
    now: &Time,
) -> ImmediateStep {
    let yaml = existing
        .and_then(|rs| rs.spec.serve_config_v2.clone())
        .unwrap_or_default();
    let current = applications_of(&yaml);
    let serve = existing.map(applications_from).unwrap_or_default();
    let running = |name: &str| {
        serve
            .get(name)
            .is_some_and(|a| a.status.as_deref() == Some(RUNNING))
    };
    let wanted: BTreeSet<&String> = layout.nodes.keys().collect();
    // Whatever answers now (a version application, a canary's router and versions, an inline
    // application), and the node applications it names.
    let serving: Vec<&Value> = current
        .values()
        .filter(|app| !is_node_application(app))
        .collect();
    let named: BTreeSet<String> = serving
        .iter()
        .flat_map(|app| node_map(app).into_values())
        .collect();
    let recorded = retiring_of(existing);
    let mut retiring = still_retiring(&recorded, &current, &wanted, now);
    let starting = wanted.iter().any(|app| !running(app));
    let unchanged = serving.len() == 1 && serving[0] == &layout.version;
    // Staging protects traffic: only worth it while something that answers runs.
    let answering = serving
        .iter()
        .any(|app| app["name"].as_str().is_some_and(&running));
    if starting && answering && !unchanged {
        // Stage: what answers stays exactly as it is while the new nodes start beside it.
        let nodes = with_carried(layout, named.iter().chain(retiring.keys()), &current);
        return ImmediateStep {
            applications: serving.into_iter().cloned().chain(nodes).collect(),
            retiring,
            staging: true,
            active: true,
        };
    }
    // Switch: the new wiring; the nodes the previous one named stay until their time passes
    // (while it answered: without traffic there is no request in flight to finish).
    let until = later(now, hold(&serving, &layout.version));
    for app in named.into_iter().filter(|_| answering) {
        if !wanted.contains(&app) && current.contains_key(&app) && !recorded.contains_key(&app) {
            retiring.insert(app, until.clone());
        }
    }
    let nodes = with_carried(layout, retiring.keys(), &current);
    let applications = std::iter::once(layout.version.clone())
        .chain(nodes)
        .collect();
    ImmediateStep {
        active: !retiring.is_empty(),
        applications,
        retiring,
        staging: false,
    }
}

/// The recorded retirements whose node is still carried, not wanted again, and whose time has
/// not passed. An annotation edited by hand never keeps a node longer than the longest hold.
fn still_retiring(
    recorded: &BTreeMap<String, String>,
    current: &BTreeMap<String, Value>,
    wanted: &BTreeSet<&String>,
    now: &Time,
) -> BTreeMap<String, String> {
    let latest = later(now, longest_hold());
    recorded
        .iter()
        .filter(|(app, until)| {
            current.contains_key(*app) && !wanted.contains(app) && !passed(until, now)
        })
        .map(|(app, until)| {
            let bounded = if passed(&latest, &time_of(until)) {
                latest.clone()
            } else {
                until.clone()
            };
            (app.clone(), bounded)
        })
        .collect()
}

/// The layout's node applications, plus the named ones the RayService carries, by name.
fn with_carried<'a>(
    layout: &SharedLayout,
    names: impl IntoIterator<Item = &'a String>,
    current: &BTreeMap<String, Value>,
) -> impl Iterator<Item = Value> {
    let mut nodes = layout.nodes.clone();
    for app in names {
        if let Some(found) = current.get(app) {
            nodes.entry(app.clone()).or_insert_with(|| found.clone());
        }
    }
    nodes.into_values()
}

/// The retirements the RayService's annotation records (unreadable: none).
pub fn retiring_of(existing: Option<&RayService>) -> BTreeMap<String, String> {
    existing
        .and_then(|rs| rs.metadata.annotations.as_ref()?.get(ANNOTATION_RETIRING))
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// How long a node application the previous wiring named is kept: the longest deadline of the
/// graphs that served and the new one, plus [`RETIRE_GRACE`].
fn hold(serving: &[&Value], new: &Value) -> Duration {
    let deadline = |version: &Value| {
        version["deployments"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["user_config"][WIRING_KEY]["graph"]["deadline_ms"].as_u64())
            .max()
            .unwrap_or(crate::graph::DEFAULT_DEADLINE_MS.into())
    };
    let longest = serving
        .iter()
        .map(|app| deadline(app))
        .fold(deadline(new), u64::max);
    Duration::from_millis(longest) + RETIRE_GRACE
}

/// The longest any node is kept: the longest deadline a graph may have, plus the grace.
fn longest_hold() -> Duration {
    Duration::from_millis(crate::graph::MAX_DEADLINE_MS.into()) + RETIRE_GRACE
}

/// `until` as a time (unreadable: the epoch, so it counts as passed).
fn time_of(until: &str) -> Time {
    Time(until.parse::<Timestamp>().unwrap_or(Timestamp::UNIX_EPOCH))
}

fn later(now: &Time, by: Duration) -> String {
    let by = SignedDuration::try_from(by).unwrap_or(SignedDuration::MAX);
    now.0.checked_add(by).unwrap_or(Timestamp::MAX).to_string()
}

/// Whether `until` has passed at `now`; an unreadable time has.
fn passed(until: &str, now: &Time) -> bool {
    until.parse::<Timestamp>().map_or(true, |t| t <= now.0)
}

/// The node applications the given version applications name, in name order: rendered ones
/// first, else as the RayService carries them. `Err` names one that is in neither.
pub fn node_applications(
    versions: &[Value],
    rendered: &BTreeMap<String, Value>,
    current: &BTreeMap<String, Value>,
) -> Result<Vec<Value>, String> {
    let named: BTreeSet<String> = versions
        .iter()
        .flat_map(|v| node_map(v).into_values())
        .collect();
    named
        .into_iter()
        .map(|app| {
            rendered
                .get(&app)
                .or_else(|| current.get(&app))
                .cloned()
                .ok_or_else(|| {
                    format!("the node application {app} is not on the RayService and its graph is not in memory")
                })
        })
        .collect()
}

/// A version application re-laid out (a spec edit, an upgrade from the inline layout) is
/// staged like an Immediate change: while its new form names node applications that do not
/// run yet and the form the RayService carries runs, the carried form stays and those nodes
/// start beside it. Returns the version applications to write and the nodes to start beside.
pub fn stage_versions(
    versions: &[Value],
    current: &BTreeMap<String, Value>,
    serve: &BTreeMap<String, ApplicationStatus>,
) -> (Vec<Value>, BTreeSet<String>) {
    let running = |name: &str| {
        serve
            .get(name)
            .is_some_and(|a| a.status.as_deref() == Some(RUNNING))
    };
    let mut starting = BTreeSet::new();
    let written = versions
        .iter()
        .map(|app| {
            let name = app["name"].as_str().unwrap_or_default();
            let Some(carried) = current.get(name).filter(|old| *old != app && running(name)) else {
                return app.clone();
            };
            let new_nodes: Vec<String> = node_map(app)
                .into_values()
                .filter(|node| !running(node))
                .collect();
            if new_nodes.is_empty() {
                return app.clone();
            }
            starting.extend(new_nodes);
            carried.clone()
        })
        .collect();
    (written, starting)
}

/// Folds each version application's node applications into its own status: their
/// deployments join its own (each named after its node, so a failure names the node), and a
/// version runs only when its executor and every node it names run. Otherwise it takes the
/// status (and a message naming the node) of the first node that does not run; a node that
/// Serve does not report yet counts as deploying.
pub fn fold_node_statuses<'a>(
    serve: &mut BTreeMap<String, ApplicationStatus>,
    versions: impl IntoIterator<Item = (&'a str, &'a Value)>,
) {
    for (name, version) in versions {
        if !serve.contains_key(name) {
            continue;
        }
        let nodes: Vec<(String, String, Option<ApplicationStatus>)> = node_map(version)
            .into_iter()
            .map(|(node, app)| {
                let status = serve.get(&app).cloned();
                (node, app, status)
            })
            .collect();
        let own = serve.get_mut(name).expect("present above");
        let blocking = nodes.iter().find_map(|(node, app, status)| {
            let state = status.as_ref().and_then(|s| s.status.clone());
            (state.as_deref() != Some(RUNNING)).then(|| {
                let state = state.unwrap_or_else(|| "DEPLOYING".to_owned());
                let detail = status.as_ref().and_then(|s| s.message.clone());
                let message = match detail {
                    Some(d) if !d.is_empty() => {
                        format!("node {node} (application {app}) is {state}: {d}")
                    }
                    _ => format!("node {node} (application {app}) is {state}"),
                };
                (state, message)
            })
        });
        for (_, _, status) in nodes {
            own.deployments
                .extend(status.map(|s| s.deployments).unwrap_or_default());
        }
        if own.status.as_deref() == Some(RUNNING)
            && let Some((state, message)) = blocking
        {
            own.status = Some(state);
            own.message = Some(message);
        }
    }
}

#[cfg(test)]
#[path = "shared_tests.rs"]
mod tests;
