//! `raypipe history`: what a bucket written by the history collector and the operator's
//! recorder holds, for clusters and revisions that no longer exist. The bucket is named as for
//! the collector (`STORAGE_BACKEND` and its variables); access is whatever those credentials may
//! read. `raypipe history serve` offers the same over HTTP to whoever Kubernetes RBAC lets read
//! a namespace's pipelines or clusters, without handing out the bucket's credentials.

use std::io::Write;

use anyhow::Context;

use crate::config::flags::LogFormat;
use crate::history::api::{self, ApiConfig};
use crate::history::read::{Reader, SessionEntry};
use crate::history::revisions::{RevisionRecord, RevisionStore, RevisionSummary};
use crate::history::sink::Sink;
use crate::history::store;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum HistoryCommand {
    /// Every cluster session the bucket lists.
    Sessions(HistoryOutput),
    /// One session's events in time order (the newest session unless --session).
    Events(SessionArgs),
    /// One session's log files, or one file's text.
    Logs {
        #[command(flatten)]
        session: SessionArgs,
        /// A file as the listing names it (`<node>/<path>`); without it, the list.
        file: Option<String>,
    },
    /// Serve the history over HTTP or HTTPS (`/api/v1/...`): callers send a Kubernetes bearer
    /// token and read what RBAC lets them `get` (see docs/history.md).
    Serve(ServeArgs),
    /// A pipeline's revisions: when each was seen and served, how its rollout ended.
    Revisions(PipelineArgs),
    /// One revision of a pipeline: its timeline and the Ray clusters that served it (its Serve
    /// config too with --output json).
    Revision {
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// The revision id, as `raypipe history revisions` lists it.
        id: String,
    },
    /// Which revisions of a pipeline served at a time, and as what.
    Serving {
        #[command(flatten)]
        pipeline: PipelineArgs,
        /// An RFC 3339 time (`2026-12-01T14:02:00Z`); now when left out.
        #[arg(long)]
        at: Option<String>,
    },
}

#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address the API listens on.
    #[arg(
        long,
        env = "RAYPIPE_HISTORY_API_LISTEN",
        default_value = "127.0.0.1:8090"
    )]
    pub listen: std::net::SocketAddr,
    /// Prefix of every key in the bucket.
    #[arg(long, env = "STORAGE_ROOT_DIR", default_value = "")]
    pub root: String,
    /// An audience callers' tokens must be meant for (repeatable); none: the API server's own.
    #[arg(long = "audience")]
    pub audiences: Vec<String>,
    /// Serve HTTPS only, with this PEM certificate (chain); needs --tls-key-file. Both files
    /// are re-read every minute, so a renewed Secret is served without a restart.
    #[arg(
        long,
        env = "RAYPIPE_HISTORY_API_TLS_CERT_FILE",
        requires = "tls_key_file"
    )]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// The PEM private key of --tls-cert-file.
    #[arg(
        long,
        env = "RAYPIPE_HISTORY_API_TLS_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_key_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct PipelineArgs {
    /// The ServePipeline, as `namespace/name`.
    pub pipeline: String,
    #[command(flatten)]
    pub output: HistoryOutput,
}

impl PipelineArgs {
    fn names(&self) -> anyhow::Result<(&str, &str)> {
        self.pipeline
            .split_once('/')
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
            .with_context(|| format!("{:?}: name the pipeline as namespace/name", self.pipeline))
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct HistoryOutput {
    /// Prefix of every key in the bucket.
    #[arg(long, env = "STORAGE_ROOT_DIR", default_value = "")]
    pub root: String,
    #[arg(long, value_enum, default_value = "text")]
    pub output: Format,
}

#[derive(Debug, Clone, clap::Args)]
pub struct SessionArgs {
    /// The cluster, as `namespace/name`.
    pub cluster: String,
    /// A session name (`session_…`); the newest when left out.
    #[arg(long)]
    pub session: Option<String>,
    #[command(flatten)]
    pub output: HistoryOutput,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

fn sink(root: &str) -> anyhow::Result<Sink> {
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let store = store::from_env(&env).context("the history store")?;
    Ok(Sink::new(store, root))
}

fn reader(root: &str) -> anyhow::Result<Reader> {
    Ok(Reader::new(sink(root)?))
}

/// The pipeline's index, or an error that says there is none.
async fn index(
    args: &PipelineArgs,
) -> anyhow::Result<(RevisionStore, crate::history::revisions::PipelineIndex)> {
    let (namespace, name) = args.names()?;
    let revisions = RevisionStore::new(sink(&args.output.root)?);
    let index = revisions
        .index(namespace, name)
        .await?
        .with_context(|| format!("no history of pipeline {namespace}/{name} in the bucket"))?;
    Ok((revisions, index))
}

/// `stable 2026-12-01T10:00:00Z..2026-12-01T14:00:00Z, canary 2026-12-01T13:50:00Z..now`.
fn served_spans(revision: &RevisionSummary) -> String {
    if revision.served.is_empty() {
        return "-".to_owned();
    }
    revision
        .served
        .iter()
        .map(|s| {
            format!(
                "{} {}..{}",
                s.role,
                s.from,
                s.until.as_deref().unwrap_or("now")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn outcome(revision: &RevisionSummary) -> String {
    match &revision.outcome {
        Some(o) if o.reason.is_empty() => o.result.clone(),
        Some(o) => format!("{} ({})", o.result, o.reason),
        None => "-".to_owned(),
    }
}

/// A timeline entry's details as `key=value` pairs: whatever its kind holds, so a new kind
/// prints without a change here.
fn details(what: &serde_json::Value) -> (String, String) {
    let kind = what["kind"].as_str().unwrap_or("?").to_owned();
    let pairs = what
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != "kind" && k.as_str() != "at")
        .map(|(k, v)| match v {
            serde_json::Value::String(text) => format!("{k}={text}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ");
    (kind, pairs)
}

fn write_revision(out: &mut impl Write, record: &RevisionRecord) -> anyhow::Result<()> {
    writeln!(
        out,
        "# {}/{} revision {} ({})",
        record.namespace, record.name, record.id, record.digest
    )?;
    if let Some(version) = &record.version {
        writeln!(out, "# version {version}")?;
    }
    writeln!(out, "# first seen {}", record.first_seen)?;
    if let Some(service) = &record.ray_service {
        writeln!(out, "# RayService {service}")?;
    }
    if !record.ray_clusters.is_empty() {
        writeln!(out, "# Ray clusters {}", record.ray_clusters.join(", "))?;
    }
    for entry in &record.timeline {
        let (kind, pairs) = details(&serde_json::to_value(entry)?);
        writeln!(out, "{}\t{kind}\t{pairs}", entry.at)?;
    }
    if record.readings_dropped > 0 {
        writeln!(
            out,
            "# {} gate readings not kept (the timeline was full)",
            record.readings_dropped
        )?;
    }
    Ok(())
}

/// Runs the API until SIGINT or SIGTERM, with the client from `KUBECONFIG` or the in-cluster
/// config (its account needs `create` on tokenreviews and subjectaccessreviews).
async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    crate::startup::init_tracing(LogFormat::Text, "info");
    let config = kube::Config::infer()
        .await
        .context("reading the Kubernetes client configuration")?;
    let client =
        kube::Client::try_from(config).context("connecting to the Kubernetes API server")?;
    let config = ApiConfig {
        listen: args.listen,
        sink: sink(&args.root)?,
        audiences: args.audiences,
        tls: match (args.tls_cert_file, args.tls_key_file) {
            (Some(cert), Some(key)) => Some(api::ApiTls::new(cert, key)),
            // clap requires both or neither.
            _ => None,
        },
    };
    api::serve(client, config, crate::controllers::shutdown_signal()).await?;
    Ok(())
}

/// The session `args` names among those listed.
fn pick(sessions: Vec<SessionEntry>, args: &SessionArgs) -> anyhow::Result<SessionEntry> {
    let (namespace, cluster) = args
        .cluster
        .split_once('/')
        .with_context(|| format!("{:?}: name the cluster as namespace/name", args.cluster))?;
    let mut matching: Vec<SessionEntry> = sessions
        .into_iter()
        .filter(|s| s.namespace == namespace && s.cluster == cluster)
        .filter(|s| args.session.as_ref().is_none_or(|want| &s.session == want))
        .collect();
    // Session names carry their start time, so the last is the newest.
    matching.pop().with_context(|| match &args.session {
        Some(session) => format!("no session {session} of {namespace}/{cluster} in the bucket"),
        None => format!("no session of {namespace}/{cluster} in the bucket"),
    })
}

pub async fn run(command: HistoryCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        HistoryCommand::Sessions(output) => {
            let sessions = reader(&output.root)?.sessions().await?;
            match output.output {
                Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&sessions)?)?,
                Format::Text => {
                    writeln!(out, "NAMESPACE\tCLUSTER\tOWNER\tSESSION")?;
                    for s in sessions {
                        let owner = s
                            .owner_kind
                            .as_ref()
                            .zip(s.owner_name.as_ref())
                            .map(|(k, n)| format!("{k}/{n}"))
                            .unwrap_or_else(|| "-".into());
                        writeln!(
                            out,
                            "{}\t{}\t{owner}\t{}",
                            s.namespace, s.cluster, s.session
                        )?;
                    }
                }
            }
        }
        HistoryCommand::Events(args) => {
            let reader = reader(&args.output.root)?;
            let session = pick(reader.sessions().await?, &args)?;
            let timeline = reader.timeline(&session).await?;
            match args.output.output {
                Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&timeline)?)?,
                Format::Text => {
                    writeln!(
                        out,
                        "# {}/{} {}",
                        session.namespace, session.cluster, session.session
                    )?;
                    for e in timeline {
                        let node: String = e.node.chars().take(8).collect();
                        writeln!(
                            out,
                            "{}\t{}\t{node}\t{}",
                            e.timestamp, e.event_type, e.summary
                        )?;
                    }
                }
            }
        }
        HistoryCommand::Logs {
            session: args,
            file,
        } => {
            let reader = reader(&args.output.root)?;
            let session = pick(reader.sessions().await?, &args)?;
            match file {
                Some(file) => out.write_all(&reader.log(&session, &file).await?)?,
                None => {
                    let files = reader.log_files(&session).await?;
                    match args.output.output {
                        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&files)?)?,
                        Format::Text => {
                            for f in files {
                                writeln!(out, "{f}")?;
                            }
                        }
                    }
                }
            }
        }
        HistoryCommand::Serve(args) => serve(args).await?,
        HistoryCommand::Revisions(args) => {
            let (_, index) = index(&args).await?;
            match args.output.output {
                Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&index)?)?,
                Format::Text => {
                    if let Some(deleted) = &index.deleted_at {
                        writeln!(
                            out,
                            "# {}/{} deleted at {deleted}",
                            index.namespace, index.name
                        )?;
                    }
                    writeln!(out, "ID\tVERSION\tFIRST SEEN\tSERVED\tOUTCOME")?;
                    for r in &index.revisions {
                        writeln!(
                            out,
                            "{}\t{}\t{}\t{}\t{}",
                            r.id,
                            r.version.as_deref().unwrap_or("-"),
                            r.first_seen,
                            served_spans(r),
                            outcome(r)
                        )?;
                    }
                }
            }
        }
        HistoryCommand::Revision { pipeline, id } => {
            let (namespace, name) = pipeline.names()?;
            let revisions = RevisionStore::new(sink(&pipeline.output.root)?);
            let record = revisions
                .revision(namespace, name, &id)
                .await?
                .with_context(|| {
                    format!("no revision {id} of pipeline {namespace}/{name} in the bucket")
                })?;
            match pipeline.output.output {
                Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&record)?)?,
                Format::Text => write_revision(&mut out, &record)?,
            }
        }
        HistoryCommand::Serving { pipeline, at } => {
            let at = api::parse_at(at.as_deref())?;
            let (_, index) = index(&pipeline).await?;
            let answer = api::serving_answer(&index, &at);
            match pipeline.output.output {
                Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&answer)?)?,
                Format::Text => {
                    if answer.serving.is_empty() {
                        writeln!(
                            out,
                            "nothing of {}/{} served at {}",
                            answer.namespace, answer.name, answer.at
                        )?;
                    } else {
                        writeln!(
                            out,
                            "# {}/{} at {}",
                            answer.namespace, answer.name, answer.at
                        )?;
                        writeln!(out, "ROLE\tREVISION\tVERSION\tFROM\tUNTIL")?;
                        for s in &answer.serving {
                            writeln!(
                                out,
                                "{}\t{}\t{}\t{}\t{}",
                                s.role,
                                s.revision.id,
                                s.revision.version.as_deref().unwrap_or("-"),
                                s.span.from,
                                s.span.until.as_deref().unwrap_or("now")
                            )?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::revisions::{Happening, Outcome, ServedSpan, TimelineEntry};
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        command: HistoryCommand,
    }

    #[test]
    fn the_new_subcommands_parse() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.command);
        assert!(matches!(
            parse(&["h", "revision", "ml/demo", "000001-ab", "--output", "json"]),
            Ok(HistoryCommand::Revision { id, pipeline }) if id == "000001-ab" && pipeline.pipeline == "ml/demo"
        ));
        assert!(matches!(
            parse(&["h", "serving", "ml/demo", "--at", "2026-12-01T14:02:00Z"]),
            Ok(HistoryCommand::Serving { at: Some(_), .. })
        ));
        assert!(matches!(
            parse(&["h", "serve", "--listen", "127.0.0.1:0", "--audience", "a", "--audience", "b"]),
            Ok(HistoryCommand::Serve(ServeArgs { audiences, .. })) if audiences.len() == 2
        ));
        assert!(matches!(
            parse(&[
                "h",
                "serve",
                "--tls-cert-file",
                "c.pem",
                "--tls-key-file",
                "k.pem"
            ]),
            Ok(HistoryCommand::Serve(ServeArgs {
                tls_cert_file: Some(_),
                tls_key_file: Some(_),
                ..
            }))
        ));
        assert!(parse(&["h", "serve", "--tls-cert-file", "c.pem"]).is_err());
        assert!(parse(&["h", "serve", "--tls-key-file", "k.pem"]).is_err());
        assert!(matches!(
            parse(&["h", "revisions", "ml/demo"]),
            Ok(HistoryCommand::Revisions(_))
        ));
        assert!(parse(&["h", "sessions"]).is_ok());
    }

    #[test]
    fn revisions_print_their_spans_outcome_and_timeline() {
        let summary = RevisionSummary {
            served: vec![
                ServedSpan {
                    role: "canary".into(),
                    from: "t1".into(),
                    until: Some("t2".into()),
                },
                ServedSpan {
                    role: "stable".into(),
                    from: "t2".into(),
                    until: None,
                },
            ],
            outcome: Some(Outcome {
                result: "Promoted".into(),
                reason: "GatesPassed".into(),
                node: None,
                message: String::new(),
                at: "t2".into(),
            }),
            ..RevisionSummary::default()
        };
        assert_eq!(served_spans(&summary), "canary t1..t2, stable t2..now");
        assert_eq!(outcome(&summary), "Promoted (GatesPassed)");
        assert_eq!(served_spans(&RevisionSummary::default()), "-");

        let record = RevisionRecord {
            namespace: "ml".into(),
            name: "demo".into(),
            id: "000001-ab".into(),
            ray_clusters: vec!["demo-raycluster-x".into()],
            serve_config: Some(serde_json::json!({"applications": []})),
            timeline: vec![TimelineEntry {
                at: "2026-12-01T10:00:00Z".into(),
                what: Happening::Step {
                    step: 1,
                    steps: 3,
                    weight: 10,
                },
            }],
            ..RevisionRecord::default()
        };
        let mut text = Vec::new();
        let written = write_revision(&mut text, &record);
        assert!(written.is_ok(), "{written:?}");
        let text = String::from_utf8_lossy(&text);
        assert!(text.contains("# Ray clusters demo-raycluster-x"), "{text}");
        assert!(
            text.contains("2026-12-01T10:00:00Z\tstep\tstep=1 steps=3 weight=10"),
            "{text}"
        );
        // The Serve config is only in the JSON output.
        assert!(!text.contains("applications"), "{text}");
    }
}
