//! `raypipe history`: what a bucket written by the history collector holds, for clusters that
//! no longer exist. The bucket is named as for the collector (`STORAGE_BACKEND` and its
//! variables); access is whatever those credentials may read.

use std::io::Write;

use anyhow::Context;

use crate::history::read::{Reader, SessionEntry};
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

fn reader(root: &str) -> anyhow::Result<Reader> {
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let store = store::from_env(&env).context("the history store")?;
    Ok(Reader::new(Sink::new(store, root)))
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
    }
    Ok(())
}
