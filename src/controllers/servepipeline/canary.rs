//! The apply stage of a pipeline with strategy `Canary`: renders the newest graph as a version
//! application, takes the routers' counters its reader last read (`stats`), lets the pure
//! [`rollout::decide`] take one step, and server-side applies the RayService carrying the router
//! and the version applications. The rollout's state goes to the status; the Events of the step
//! are published here.

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::apply::{self, Applied};
use super::build;
use super::conditions;
use super::conditions::Problem;
use super::rollout::{self, Inputs, Newest, Policy};
use super::stats::Target;
use super::{Context, Error, GoodGraph, now};
use crate::api::rayservice::RayService;
use crate::api::servepipeline::{RolloutStatus, ServePipeline, condition_types};
use crate::serve::rollout::{
    STATS_PATH, applications_of, compose, options_of, rendered_options, router_application,
    version_application, version_application_name,
};

/// Lines of the plan kept in the status.
const MAX_PLAN_LINES: usize = 12;

/// The Serve port KubeRay gives the `<rayservice>-serve-svc` Service.
pub const SERVE_PORT: u16 = 8000;

/// What the canary apply stage did.
pub(super) struct CanaryApplied {
    pub applied: Applied,
    pub rollout: RolloutStatus,
    /// A step or a retirement is under way: reconcile again soon.
    pub active: bool,
}

/// One rollout step for `pipeline`.
pub(super) async fn apply(
    pipeline: &ServePipeline,
    ctx: &Context,
    rs_api: &Api<RayService>,
    existing: Option<&RayService>,
    newest_graph: Option<&GoodGraph>,
    stable_graph: Option<&GoodGraph>,
) -> Result<CanaryApplied, Error> {
    let policy = Policy::from_spec(&pipeline.spec.rollout.clone().unwrap_or_default());
    let previous = pipeline.status.as_ref().and_then(|s| s.rollout.clone());
    let options = build::render_options(pipeline, &ctx.config);
    let base = options
        .application_name
        .clone()
        .unwrap_or_else(|| pipeline.name_any());
    let existing_yaml = existing
        .and_then(|rs| rs.spec.serve_config_v2.clone())
        .unwrap_or_default();
    let current = applications_of(&existing_yaml);

    let refused = |message: String, rollout: Option<RolloutStatus>| CanaryApplied {
        applied: apply::render_failed(message),
        active: false,
        rollout: rollout.unwrap_or_else(|| RolloutStatus {
            phase: rollout::phases::STABLE.to_owned(),
            ..Default::default()
        }),
    };

    // The newest graph as a version application, with the route and top-level options.
    let mut route_prefix = current
        .get(&base)
        .and_then(|router| router["route_prefix"].as_str())
        .map(str::to_owned);
    let mut top_level = options_of(&existing_yaml);
    let newest = match newest_graph {
        None => None,
        Some(g) => match crate::serve::render(
            &g.graph,
            &build::version_render_options(pipeline, &ctx.config, &g.applied),
        ) {
            Err(e) => return Ok(refused(e.to_string(), previous)),
            Ok(rendered) => {
                let name = version_application_name(&base, &g.applied.digest);
                let Some(application) = version_application(&rendered, &name) else {
                    return Ok(refused(
                        "the graph rendered no application".into(),
                        previous,
                    ));
                };
                route_prefix = rendered
                    .applications
                    .first()
                    .and_then(|a| a.route_prefix.clone());
                top_level = rendered_options(&rendered);
                Some(Newest {
                    digest: g.applied.digest.clone(),
                    version: g.applied.version.clone(),
                    application,
                    plan: plan(stable_graph, g),
                })
            }
        },
    };
    let route_prefix = route_prefix.unwrap_or_else(|| "/".to_owned());
    // The stable graph with today's spec (a spec edit reaches both versions).
    let stable_digest = previous
        .as_ref()
        .and_then(|r| r.stable.as_ref())
        .map(|s| s.digest.as_str());
    let stable_rendered = stable_graph
        .filter(|g| Some(g.applied.digest.as_str()) == stable_digest)
        .filter(|g| newest.as_ref().is_none_or(|n| n.digest != g.applied.digest))
        .and_then(|g| {
            let rendered = crate::serve::render(
                &g.graph,
                &build::version_render_options(pipeline, &ctx.config, &g.applied),
            )
            .ok()?;
            let name = version_application_name(&base, &g.applied.digest);
            Some(Newest {
                digest: g.applied.digest.clone(),
                version: g.applied.version.clone(),
                application: version_application(&rendered, &name)?,
                plan: Vec::new(),
            })
        });

    let serve = existing
        .map(conditions::applications_from)
        .unwrap_or_default();
    // The routers' counters as the pipeline's reader last read them (`stats`): never a wait.
    let key = kube::runtime::reflector::ObjectRef::from_obj(pipeline);
    let stats = match &previous {
        Some(r) if r.canary.is_some() || r.retiring.is_some() => {
            stats_target(ctx, pipeline, &route_prefix, &r.generation)
                .and_then(|target| ctx.stats.latest(&key, target))
        }
        _ => {
            ctx.stats.stop(&key);
            None
        }
    };
    let now = now();
    let decision = rollout::decide(&Inputs {
        policy: &policy,
        previous: previous.as_ref(),
        base: &base,
        executor: &options.executor_deployment,
        newest: newest.as_ref(),
        stable_rendered: stable_rendered.as_ref(),
        current: &current,
        serve: &serve,
        stats: stats.as_ref(),
        suspended: pipeline.spec.suspend.unwrap_or(false),
        now: &now,
    });
    for event in &decision.events {
        let kind = if event.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        crate::k8s::publish_event(
            &ctx.recorder,
            pipeline,
            kind,
            event.reason,
            "Rollout",
            event.message.clone(),
        )
        .await;
    }
    let active = decision.active;
    let (Some(router), None) = (&decision.router, &decision.missing) else {
        let message = decision
            .missing
            .clone()
            .unwrap_or_else(|| "no graph version to serve yet".to_owned());
        return Ok(CanaryApplied {
            applied: Applied::Refused {
                problem: Problem {
                    condition: condition_types::READY,
                    reason: "RolloutStateLost".to_owned(),
                    message,
                },
                transient: true,
                not_ours: false,
            },
            rollout: decision.status,
            active,
        });
    };
    let mut applications = vec![router_application(
        &base,
        &route_prefix,
        &options.runtime_py_modules,
        router,
    )];
    applications.extend(decision.applications.iter().cloned());
    let config = compose(top_level, applications);
    let yaml = serde_yaml::to_string(&config).unwrap_or_default();
    let stable_digest = decision
        .status
        .stable
        .as_ref()
        .map(|s| s.digest.clone())
        .unwrap_or_default();
    let desired = build::desired_rayservice(pipeline, &yaml, &stable_digest)?;
    let applied = apply::write(rs_api, existing, &desired).await;
    if matches!(applied, Applied::Refused { .. }) {
        // Nothing changed on the cluster: the rollout stays where it was.
        return Ok(CanaryApplied {
            applied,
            rollout: previous.unwrap_or(decision.status),
            active: true,
        });
    }
    // Counted once the RayService carries the outcome (a rollback took effect on the cluster),
    // and once per rollout: a reconcile on a cached status that predates our own status write
    // decides the same ending again.
    if let Some((result, rollout_key)) = rollout::newly_ended(previous.as_ref(), &decision.status) {
        let first_time = ctx.counted_rollout.with(pipeline, |counted| {
            let first = counted.as_deref() != Some(rollout_key.as_str());
            *counted = Some(rollout_key);
            first
        });
        if first_time {
            ctx.config.metrics.pipeline_rollout_ended(result);
        }
    }
    Ok(CanaryApplied {
        applied,
        rollout: decision.status,
        active,
    })
}

/// What the new graph changes against the stable one, one line per change.
fn plan(stable: Option<&GoodGraph>, newest: &GoodGraph) -> Vec<String> {
    match stable {
        Some(old) if old.applied.digest != newest.applied.digest => {
            let code = |g: &GoodGraph| g.applied.oci.as_ref().and_then(|o| o.code_digest.clone());
            let (old_code, new_code) = (code(old), code(newest));
            let mut lines = crate::graph::diff::diff(old.graph.graph(), newest.graph.graph())
                .lines(MAX_PLAN_LINES - 2);
            if old_code != new_code {
                let name = |digest: Option<String>| digest.unwrap_or_else(|| "none".to_owned());
                lines.push(format!(
                    "code layer: {} → {}",
                    name(old_code),
                    name(new_code)
                ));
            }
            // Serve shares no deployment between applications: per-node "in place" or
            // "unchanged" describes the graph change, not what the canary deploys.
            lines.push(
                "the canary is its own Serve application: every node of it starts new replicas, and the stable version keeps its own".to_owned(),
            );
            lines
        }
        _ => Vec::new(),
    }
}

/// Where the routers' counters of `pipeline` are read: through the Serve proxy of its
/// RayService (`<name>-serve-svc`, or `--ray-serve-url`). `None` when no URL can be made (the
/// gates then wait, and the deadline still counts).
fn stats_target(
    ctx: &Context,
    pipeline: &ServePipeline,
    route_prefix: &str,
    generation: &str,
) -> Option<Target> {
    let namespace = pipeline.namespace().unwrap_or_default();
    let service = crate::ray::HeadService::new(
        namespace,
        format!("{}-serve-svc", build::rayservice_name(pipeline)),
        SERVE_PORT,
    );
    let base = ctx.config.serve_locator().locate(&service).ok()?;
    let mut path: Vec<String> = route_prefix
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    path.extend(STATS_PATH.split('/').map(str::to_owned));
    Some(Target {
        base_url: base.as_str().to_owned(),
        path,
        generation: generation.to_owned(),
    })
}
