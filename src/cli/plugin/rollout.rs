//! `kubectl raypipe rollout status|pause|resume|promote|abort|retry`.
//!
//! Pause and resume set `spec.rollout.paused` (a GitOps tool that owns the spec should carry the
//! same field: the plugin says so when the pipeline is managed by one). Promote, abort and
//! retry write the rollout-command annotation naming the digest the caller saw, so the
//! command never acts on a later canary. Each request is recorded as an Event on the pipeline,
//! with the caller's user name where the API server tells it (SelfSubjectReview).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

use super::view::{self, Progress};
use super::{GlobalArgs, Output, print_structured, read_pipeline};
use crate::api::servepipeline::{
    ROLLOUT_COMMAND_ANNOTATION, RolloutCommand, RolloutStrategy, RolloutVerb as CommandVerb,
    ServePipeline,
};

/// The field manager of the plugin's writes, and the reporting controller of its Events.
pub const FIELD_MANAGER: &str = "kubectl-raypipe";

#[derive(Debug, clap::Subcommand)]
pub enum RolloutVerb {
    /// Show the rollout and, unless --watch=false, wait until it ends: exit 0 when the new
    /// version serves, 1 when it was rolled back or aborted.
    Status {
        name: String,
        /// Wait for the rollout in progress to end, printing each change.
        #[arg(short = 'w', long, default_value_t = true, action = clap::ArgAction::Set,
              num_args = 0..=1, default_missing_value = "true", require_equals = true)]
        watch: bool,
        /// Give up waiting after this long (`30s`, `10m`; 0: wait as long as it takes).
        #[arg(long, default_value = "0s")]
        timeout: String,
    },
    /// Hold the canary at its step (sets spec.rollout.paused); gates keep judging it.
    Pause { name: String },
    /// Let a paused canary go on from where it stood.
    Resume { name: String },
    /// Give the canary all traffic now, skipping its remaining steps.
    Promote { name: String },
    /// Roll the canary back now; its digest is not rolled out again until retried.
    Abort { name: String },
    /// Let a rolled-back or aborted digest be rolled out again (default: the last one).
    Retry {
        name: String,
        /// The digest (`sha256:…`) to retry.
        digest: Option<String>,
    },
}

pub async fn run(global: &GlobalArgs, verb: RolloutVerb) -> anyhow::Result<ExitCode> {
    let target = global.target().await?;
    let api: Api<ServePipeline> = Api::namespaced(target.client.clone(), &target.namespace);
    match verb {
        RolloutVerb::Status {
            name,
            watch,
            timeout,
        } => {
            let timeout = crate::validation::duration::parse_duration(&timeout)
                .map_err(|e| anyhow::anyhow!("--timeout {timeout:?}: {e}"))?;
            status(&api, global.output, &name, watch, timeout).await
        }
        RolloutVerb::Pause { name } => set_paused(&api, &target.client, &name, true).await,
        RolloutVerb::Resume { name } => set_paused(&api, &target.client, &name, false).await,
        RolloutVerb::Promote { name } => {
            command(&api, &target.client, &name, CommandVerb::Promote, None).await
        }
        RolloutVerb::Abort { name } => {
            command(&api, &target.client, &name, CommandVerb::Abort, None).await
        }
        RolloutVerb::Retry { name, digest } => {
            command(&api, &target.client, &name, CommandVerb::Retry, digest).await
        }
    }
}

fn print_status(output: Output, pipeline: &ServePipeline) -> anyhow::Result<()> {
    match output {
        Output::Text => {
            print!("{}", view::rollout_text(pipeline, &crate::k8s::now()));
            Ok(())
        }
        _ => print_structured(output, &view::summary(pipeline)),
    }
}

/// What changed between two looks, worth a line while waiting.
fn step_key(pipeline: &ServePipeline) -> String {
    let s = view::summary(pipeline);
    format!(
        "{:?} {:?} {:?} {}",
        s.rollout,
        s.canary
            .as_ref()
            .map(|c| (c.version.digest.clone(), c.step, c.weight, c.paused)),
        s.last.as_ref().map(|l| (l.digest.clone(), l.at.clone())),
        s.ready
    )
}

async fn status(
    api: &Api<ServePipeline>,
    output: Output,
    name: &str,
    watch: bool,
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let first = read_pipeline(api, name).await?;
    print_status(output, &first)?;
    let waiting_for = first
        .status
        .as_ref()
        .and_then(|s| s.rollout.as_ref())
        .and_then(|r| r.canary.as_ref())
        .map(|c| c.version.digest.clone());
    let verdict = |p: &ServePipeline| view::progress(p, waiting_for.as_deref());
    if !watch {
        return Ok(exit_of(&verdict(&first)));
    }
    let mut last_key = step_key(&first);
    let mut current = verdict(&first);
    if current != Progress::Going {
        return Ok(exit_of(&current));
    }
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut changes = watcher::watcher(api.clone(), config)
        .default_backoff()
        .boxed();
    let wait = async {
        while let Some(event) = changes.next().await {
            let pipeline = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                Ok(watcher::Event::Delete(_)) => {
                    anyhow::bail!("ServePipeline {name:?} was deleted")
                }
                Ok(_) => continue,
                // The watcher retries with backoff; say why once per error.
                Err(e) => {
                    eprintln!("warning: watching {name}: {e}");
                    continue;
                }
            };
            let key = step_key(&pipeline);
            if key != last_key {
                last_key = key;
                print_status(output, &pipeline)?;
            }
            current = verdict(&pipeline);
            if current != Progress::Going {
                return Ok(());
            }
        }
        Ok(())
    };
    if timeout.is_zero() {
        wait.await?;
    } else if tokio::time::timeout(timeout, wait).await.is_err() {
        eprintln!(
            "error: the rollout of {name} did not end within {}",
            crate::validation::duration::format_duration(timeout)
        );
        return Ok(ExitCode::FAILURE);
    } else if let Progress::Going = current {
        return Ok(ExitCode::FAILURE);
    }
    Ok(exit_of(&current))
}

fn exit_of(progress: &Progress) -> ExitCode {
    match progress {
        Progress::Failed(why) => {
            eprintln!("rollout did not complete: {why}");
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}

/// Refuses a rollout verb on a pipeline that has no canaries.
fn require_canary(pipeline: &ServePipeline, verb: &str) -> anyhow::Result<()> {
    if view::strategy_of(pipeline) != RolloutStrategy::Canary {
        anyhow::bail!(
            "ServePipeline {} uses rollout strategy Immediate: `{verb}` acts on canary rollouts (spec.rollout.strategy: Canary)",
            pipeline.name_any()
        );
    }
    Ok(())
}

/// A note for pipelines a GitOps tool applies: the spec change would be undone on its next sync.
fn gitops_note(pipeline: &ServePipeline) -> Option<&'static str> {
    let managed = pipeline.managed_fields().iter().any(|f| {
        f.manager.as_deref().is_some_and(|m| {
            m.starts_with("argocd") || m.starts_with("kustomize-controller") || m == "helm"
        })
    });
    managed.then_some(
        "note: a GitOps tool manages this pipeline; set spec.rollout.paused in its source too, or its next sync undoes this",
    )
}

async fn set_paused(
    api: &Api<ServePipeline>,
    client: &kube::Client,
    name: &str,
    paused: bool,
) -> anyhow::Result<ExitCode> {
    let pipeline = read_pipeline(api, name).await?;
    require_canary(&pipeline, if paused { "pause" } else { "resume" })?;
    let patch = serde_json::json!({"spec": {"rollout": {"paused": paused}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("setting spec.rollout.paused of {name}"))?;
    let (reason, what) = if paused {
        ("RolloutPauseRequested", "pause")
    } else {
        ("RolloutResumeRequested", "resume")
    };
    record(client, &pipeline, reason, what, None).await;
    let canary = pipeline
        .status
        .as_ref()
        .and_then(|s| s.rollout.as_ref())
        .and_then(|r| r.canary.as_ref());
    match (paused, canary) {
        (true, Some(c)) => println!(
            "servepipeline/{name} paused: canary {} holds at step {} of {} ({} %)",
            view::short_digest(&c.version.digest),
            c.step,
            c.steps,
            c.weight
        ),
        (true, None) => println!(
            "servepipeline/{name} paused: the next canary will hold at step 0 (no traffic)"
        ),
        (false, _) => println!("servepipeline/{name} resumed"),
    }
    if let Some(note) = gitops_note(&pipeline) {
        eprintln!("{note}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The digest a command names: the canary's (promote, abort), or for retry the one given or
/// the last remembered as failed.
fn command_digest(
    pipeline: &ServePipeline,
    verb: CommandVerb,
    given: Option<String>,
) -> anyhow::Result<String> {
    let name = pipeline.name_any();
    let rollout = pipeline.status.as_ref().and_then(|s| s.rollout.as_ref());
    match verb {
        CommandVerb::Promote | CommandVerb::Abort => rollout
            .and_then(|r| r.canary.as_ref())
            .map(|c| c.version.digest.clone())
            .with_context(|| format!("ServePipeline {name} has no canary in progress")),
        CommandVerb::Retry => {
            let failed = rollout
                .map(|r| r.failed_digests.clone())
                .unwrap_or_default();
            match given {
                Some(d) if failed.contains(&d) => Ok(d),
                Some(d) => anyhow::bail!(
                    "{d} is not remembered as rolled back or aborted by ServePipeline {name} (remembered: {})",
                    if failed.is_empty() {
                        "none".to_owned()
                    } else {
                        failed.join(", ")
                    }
                ),
                None => failed.last().cloned().with_context(|| {
                    format!("ServePipeline {name} remembers no rolled-back or aborted digest")
                }),
            }
        }
    }
}

async fn command(
    api: &Api<ServePipeline>,
    client: &kube::Client,
    name: &str,
    verb: CommandVerb,
    given: Option<String>,
) -> anyhow::Result<ExitCode> {
    let pipeline = read_pipeline(api, name).await?;
    require_canary(&pipeline, verb.as_str())?;
    let digest = command_digest(&pipeline, verb, given)?;
    let command = RolloutCommand { verb, digest };
    // Checked here so a typo never reaches the controller as a Warning.
    RolloutCommand::parse(&command.annotation()).map_err(|e| anyhow::anyhow!(e))?;
    let patch = serde_json::json!({"metadata": {"annotations": {
        ROLLOUT_COMMAND_ANNOTATION: command.annotation(),
    }}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("writing the {} command on {name}", verb.as_str()))?;
    let reason = match verb {
        CommandVerb::Promote => "RolloutPromoteRequested",
        CommandVerb::Abort => "RolloutAbortRequested",
        CommandVerb::Retry => "RolloutRetryRequested",
    };
    record(
        client,
        &pipeline,
        reason,
        verb.as_str(),
        Some(&command.digest),
    )
    .await;
    println!(
        "servepipeline/{name}: {} of {} requested; `kubectl raypipe rollout status {name}` follows it",
        verb.as_str(),
        command.digest
    );
    Ok(ExitCode::SUCCESS)
}

/// Records the request as an Event on the pipeline, naming the caller when the API server
/// says who it is. Best effort: a caller without `create events` still gets the action.
async fn record(
    client: &kube::Client,
    pipeline: &ServePipeline,
    reason: &str,
    what: &str,
    digest: Option<&str>,
) {
    let user = whoami(client).await;
    let note = format!(
        "{what}{} requested by {} with kubectl raypipe",
        digest.map(|d| format!(" of {d}")).unwrap_or_default(),
        user.as_deref().unwrap_or("an unknown user")
    );
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: None,
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Rollout".to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &pipeline.object_ref(&())).await {
        eprintln!("warning: the request was made but could not be recorded as an Event: {e}");
    }
}

/// The caller's user name, as the API server authenticated it.
async fn whoami(client: &kube::Client) -> Option<String> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = SelfSubjectReview::default();
    let answer = api.create(&PostParams::default(), &review).await.ok()?;
    answer.status?.user_info?.username
}
