//! `kubectl raypipe`: see and steer pipelines without writing YAML. The `raypipe` binary is
//! the plugin when it runs under a name starting with `kubectl-raypipe` (krew installs it so;
//! a symlink does too), and `raypipe ctl` runs the same verbs.
//!
//! Reads go through the caller's kubeconfig and RBAC; the only writes are the pipeline's
//! `spec.rollout.paused` (pause, resume), its rollout-command annotation (promote, abort,
//! retry) and an Event recording who asked for what.

pub mod graph;
pub mod rollout;
pub mod session;
/// The summaries and texts `get` and `rollout status` print (shared with the console).
pub use crate::present::summary as view;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::api::servepipeline::ServePipeline;

/// The plugin's command line.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl raypipe",
    bin_name = "kubectl raypipe",
    version,
    about = "See and steer raypipe's ServePipelines: their versions, graphs and rollouts"
)]
pub struct PluginCli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub verb: Verb,
}

/// What every verb takes.
#[derive(Debug, Clone, clap::Args)]
pub struct GlobalArgs {
    /// The kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true, env = "KUBECONFIG", hide_env_values = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// How to print: a table or text for people, JSON or YAML for programs.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "text")]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
    Yaml,
}

#[derive(Debug, clap::Subcommand)]
pub enum Verb {
    /// List pipelines (or one) with the version serving, the canary and the rollout phase.
    Get {
        /// One pipeline; all in the namespace when left out.
        name: Option<String>,
        /// Pipelines of every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Draw a pipeline's graph as it runs: in the terminal, as SVG or as Graphviz DOT, each
    /// node marked with its Serve status.
    Graph(graph::GraphArgs),
    /// Follow and steer a canary rollout.
    #[command(subcommand)]
    Rollout(rollout::RolloutVerb),
    /// The last lines of each Serve replica's log that runs a node of the pipeline, read from
    /// Ray through a port-forward to the serving cluster's head.
    Logs(session::LogsArgs),
    /// Forward the serving cluster's Ray dashboard and Serve to local ports (127.0.0.1), until
    /// interrupted; each connection follows the serving cluster.
    Session(session::SessionArgs),
}

/// Whether the binary runs as the kubectl plugin (`kubectl-raypipe`, any extension).
pub fn invoked_as_plugin(argv0: &Path) -> bool {
    argv0
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("kubectl-raypipe") || n.starts_with("kubectl_raypipe"))
}

/// Runs the plugin's command line (`argv[0]` is the plugin's name).
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let cli = PluginCli::parse_from(argv);
    run_parsed(cli)
}

/// Runs parsed plugin arguments (also `raypipe ctl`).
pub fn run_parsed(cli: PluginCli) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A client for the chosen kubeconfig and context, and the namespace to use.
pub struct Target {
    pub client: kube::Client,
    pub namespace: String,
}

impl GlobalArgs {
    pub async fn target(&self) -> anyhow::Result<Target> {
        let options = kube::config::KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match &self.kubeconfig {
            // KUBECONFIG may list several files; kube reads the list when left to infer.
            Some(path) if !path.as_os_str().is_empty() && !path.to_string_lossy().contains(':') => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .context("loading the Kubernetes client configuration")?
            }
            _ if self.context.is_some() => kube::Config::from_kubeconfig(&options)
                .await
                .context("loading the Kubernetes client configuration")?,
            _ => kube::Config::infer()
                .await
                .context("loading the Kubernetes client configuration")?,
        };
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
        Ok(Target { client, namespace })
    }
}

async fn run(cli: PluginCli) -> anyhow::Result<ExitCode> {
    let global = cli.global;
    match cli.verb {
        Verb::Get {
            name,
            all_namespaces,
        } => get(&global, name, all_namespaces).await,
        Verb::Graph(args) => graph::run(&global, args).await,
        Verb::Rollout(verb) => rollout::run(&global, verb).await,
        Verb::Logs(args) => session::logs(&global, args).await,
        Verb::Session(args) => session::session(&global, args).await,
    }
}

/// Reads one pipeline, with an error that names it when it is not there.
pub async fn read_pipeline(api: &Api<ServePipeline>, name: &str) -> anyhow::Result<ServePipeline> {
    match api.get_opt(name).await {
        Ok(Some(p)) => Ok(p),
        Ok(None) => anyhow::bail!(
            "ServePipeline {name:?} not found in namespace {:?}",
            api.namespace().unwrap_or_default()
        ),
        Err(e) => Err(e).with_context(|| format!("reading ServePipeline {name:?}")),
    }
}

async fn get(
    global: &GlobalArgs,
    name: Option<String>,
    all_namespaces: bool,
) -> anyhow::Result<ExitCode> {
    let target = global.target().await?;
    let pipelines = match (&name, all_namespaces) {
        (Some(_), true) => anyhow::bail!("a name cannot be combined with --all-namespaces"),
        (Some(name), false) => {
            let api = Api::namespaced(target.client.clone(), &target.namespace);
            vec![read_pipeline(&api, name).await?]
        }
        (None, all) => {
            let api: Api<ServePipeline> = if all {
                Api::all(target.client.clone())
            } else {
                Api::namespaced(target.client.clone(), &target.namespace)
            };
            api.list(&ListParams::default())
                .await
                .context("listing ServePipelines")?
                .items
        }
    };
    let rows: Vec<view::PipelineSummary> = pipelines.iter().map(view::summary).collect();
    match global.output {
        Output::Text if rows.is_empty() => {
            eprintln!(
                "No ServePipelines found{}.",
                if all_namespaces {
                    String::new()
                } else {
                    format!(" in namespace {}", target.namespace)
                }
            );
        }
        Output::Text => print!("{}", view::table(&rows, all_namespaces, &crate::k8s::now())),
        // One pipeline named: the object itself; else a list, as kubectl does.
        _ if name.is_some() => print_structured(global.output, &rows[0])?,
        _ => print_structured(global.output, &serde_json::json!({"items": rows}))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints `value` as JSON or YAML (`Text` prints JSON too: callers handle text themselves).
pub fn print_structured<T: Serialize>(output: Output, value: &T) -> anyhow::Result<()> {
    let text = match output {
        Output::Yaml => serde_yaml::to_string(value)?,
        _ => serde_json::to_string_pretty(value)? + "\n",
    };
    print!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_plugin_command_line_is_consistent_and_named_as_kubectl_shows_it() {
        PluginCli::command().debug_assert();
        let help = PluginCli::command().render_help().to_string();
        assert!(help.contains("kubectl raypipe"), "{help}");
    }

    #[test]
    fn the_binary_is_the_plugin_under_krews_and_a_symlinks_names() {
        for name in [
            "kubectl-raypipe",
            "/usr/local/bin/kubectl-raypipe",
            "kubectl-raypipe.exe",
            "kubectl_raypipe",
        ] {
            assert!(invoked_as_plugin(Path::new(name)), "{name}");
        }
        for name in [
            "raypipe",
            "/bin/kubectl",
            "kubectl-ray",
            "raypipe-kubectl-raypipe",
        ] {
            assert!(!invoked_as_plugin(Path::new(name)), "{name}");
        }
    }

    #[test]
    fn output_and_namespace_flags_go_anywhere_on_the_line() {
        let cli = PluginCli::try_parse_from([
            "kubectl-raypipe",
            "rollout",
            "status",
            "demo",
            "-n",
            "team",
            "-o",
            "yaml",
        ])
        .unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("team"));
        assert_eq!(cli.global.output, Output::Yaml);
        let cli =
            PluginCli::try_parse_from(["kubectl-raypipe", "-o", "json", "get", "-A"]).unwrap();
        assert!(matches!(
            cli.verb,
            Verb::Get {
                all_namespaces: true,
                ..
            }
        ));
    }
}
