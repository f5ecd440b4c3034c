//! The `raypipe` command line: `run`, `crds`, `dev`, `dag`. It composes the flags `config`
//! defines into subcommands and calls `startup` (crypto provider, tracing) before anything
//! else runs.

pub mod collector;
pub mod credential_helper;
pub mod dag;
#[cfg(feature = "dev")]
pub mod dev;
pub mod history;
pub mod oci;
pub mod plugin;
pub mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::flags::{ControllerListArgs, LogFormat, LogLevelArgs, OperatorArgs};
use crate::startup;

#[derive(Debug, Parser)]
#[command(
    name = "raypipe",
    version,
    about = "A Kubernetes operator for model-serving pipelines on Ray"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the enabled controllers against the cluster in KUBECONFIG / in-cluster config.
    Run(Box<RunArgs>),
    /// Print every CustomResourceDefinition raypipe serves, as multi-document YAML.
    Crds {
        /// Write one file per CRD into this directory instead (how `crds/` is generated).
        #[arg(long)]
        out_dir: Option<std::path::PathBuf>,
    },
    /// Start a local control plane on 127.0.0.1, install the CRDs and run the controllers.
    #[cfg(feature = "dev")]
    Dev(dev::DevArgs),
    /// Validate, render, draw, encode and decode model graphs.
    #[command(subcommand)]
    Dag(dag::DagCommand),
    /// Run the history collector sidecar: Ray's events and session logs to object storage,
    /// in KubeRay's collector protocol and bucket layout.
    Collector(Box<collector::CollectorArgs>),
    /// Read history back after the cluster is gone: pipeline revisions (what served when, each
    /// rollout's timeline), cluster sessions, their events and logs; or serve it over HTTP.
    #[command(subcommand)]
    History(history::HistoryCommand),
    /// The `kubectl raypipe` plugin's verbs (get, graph, rollout), for when it is not
    /// installed as `kubectl-raypipe`.
    Ctl(Box<plugin::PluginCli>),
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub controllers: ControllerListArgs,
    /// Log format.
    #[arg(long, env = "RAYPIPE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub log_level: LogLevelArgs,
    #[command(flatten)]
    pub operator: OperatorArgs,
}

pub fn main() -> ExitCode {
    startup::init_crypto();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args
        .first()
        .is_some_and(|argv0| plugin::invoked_as_plugin(std::path::Path::new(argv0)))
    {
        return plugin::main(args);
    }
    let argv = with_default_command(std::env::args_os().collect(), |name| {
        std::env::var_os(name).is_some_and(|v| !v.is_empty())
    });
    let cli = Cli::parse_from(argv);
    match cli.command {
        Command::Crds { out_dir: None } => {
            print!("{}", crate::api::crds_yaml());
            ExitCode::SUCCESS
        }
        Command::Crds { out_dir: Some(dir) } => match crate::api::write_crd_files(&dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: writing CRDs to {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        },
        Command::Dag(cmd) => dag::run(cmd),
        Command::Ctl(cli) => plugin::run_parsed(*cli),
        Command::History(command) => runtime_block_on(history::run(command)),
        Command::Collector(args) => {
            startup::init_tracing(LogFormat::Json, "info");
            runtime_block_on(collector::run_collector(*args))
        }
        Command::Run(args) => {
            startup::init_tracing(args.log_format, &args.log_level.log_level);
            runtime_block_on(run::run(*args))
        }
        #[cfg(feature = "dev")]
        Command::Dev(args) => {
            startup::init_tracing(LogFormat::Text, &args.log_level.log_level);
            runtime_block_on(dev::run(args))
        }
    }
}

/// The subcommand when none is given (the release image has no default arguments): the
/// history collector where KubeRay's collector variables are set (the operator puts
/// `EVENTS_PORT` and `RAY_CLUSTER_NAME` in the collector sidecar, never in its own Pod), else the
/// operator. So `collectorOptions.image` can name raypipe's image, which has no way to pass
/// arguments.
fn with_default_command(
    mut argv: Vec<std::ffi::OsString>,
    has_env: impl Fn(&str) -> bool,
) -> Vec<std::ffi::OsString> {
    if argv.len() == 1 {
        let sidecar = has_env("EVENTS_PORT") && has_env("RAY_CLUSTER_NAME");
        argv.push(if sidecar { "collector" } else { "run" }.into());
    }
    argv
}

/// The stack of each runtime worker. Polling a watch of a RayCronJob decodes the object inside
/// kube-runtime's watcher state machine, whose frame in a debug build holds dozens of copies of
/// the kind: measured with gdb at 2.09 MB of stack (the 2 MiB default overflowed). Only the
/// pages touched are ever backed by memory.
const WORKER_STACK_BYTES: usize = 8 * 1024 * 1024;

fn runtime_block_on(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(WORKER_STACK_BYTES)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    use crate::config::ControllerKind;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn without_arguments_the_environment_picks_the_operator_or_the_collector() {
        let argv = |args: &[&str]| -> Vec<std::ffi::OsString> {
            args.iter().map(|a| (*a).into()).collect()
        };
        let sidecar = |name: &str| matches!(name, "EVENTS_PORT" | "RAY_CLUSTER_NAME");
        let nothing = |_: &str| false;
        assert_eq!(
            with_default_command(argv(&["raypipe"]), nothing),
            argv(&["raypipe", "run"])
        );
        assert_eq!(
            with_default_command(argv(&["raypipe"]), sidecar),
            argv(&["raypipe", "collector"])
        );
        // Half of the collector's variables is not a collector.
        assert_eq!(
            with_default_command(argv(&["raypipe"]), |n| n == "EVENTS_PORT"),
            argv(&["raypipe", "run"])
        );
        // Arguments given are never changed.
        assert_eq!(
            with_default_command(argv(&["raypipe", "dag", "--help"]), sidecar),
            argv(&["raypipe", "dag", "--help"])
        );
        let cli =
            Cli::try_parse_from(with_default_command(argv(&["raypipe"]), nothing)).expect("parses");
        assert!(matches!(cli.command, Command::Run(_)));
    }

    #[test]
    fn log_level_is_a_flag_for_run_and_dev_and_rust_log_overrides_it() {
        let cli = Cli::try_parse_from(["raypipe", "run", "--log-level", "debug"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(args.log_level.log_level, "debug");
        #[cfg(feature = "dev")]
        {
            let cli = Cli::try_parse_from(["raypipe", "dev", "--log-level", "warn,raypipe=trace"])
                .unwrap();
            let Command::Dev(args) = cli.command else {
                panic!("expected dev")
            };
            assert_eq!(args.log_level.log_level, "warn,raypipe=trace");
        }
        assert!(Cli::try_parse_from(["raypipe", "run", "--log-level", "loud=["]).is_err());
    }

    #[test]
    fn every_run_flag_has_an_environment_twin() {
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("a run subcommand");
        let missing: Vec<String> = run
            .get_arguments()
            .filter(|a| a.get_long().is_some_and(|l| l != "help" && l != "version"))
            .filter(|a| a.get_env().is_none())
            .map(|a| a.get_id().to_string())
            .collect();
        assert!(missing.is_empty(), "flags without an env twin: {missing:?}");
    }

    #[test]
    fn kuberay_switches_are_one_help_group_of_run() {
        use crate::config::kuberay;
        let cli = Cli::command();
        let run = cli.find_subcommand("run").expect("a run subcommand");
        let mut group: Vec<String> = run
            .get_arguments()
            .filter(|a| a.get_help_heading() == Some(kuberay::HELP_HEADING))
            .filter_map(|a| Some(a.get_env()?.to_string_lossy().into_owned()))
            .collect();
        let mut switches = kuberay::environment_names();
        group.sort();
        switches.sort();
        assert_eq!(group, switches);
        // The operator's own flags keep the default group.
        let admin = run
            .get_arguments()
            .find(|a| a.get_long() == Some("admin-address"))
            .expect("--admin-address");
        assert_eq!(admin.get_help_heading(), None);
    }

    #[test]
    fn controllers_flag_parses_a_subset() {
        let cli =
            Cli::try_parse_from(["raypipe", "run", "--controllers", "servepipeline"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(
            args.controllers.controllers,
            vec![ControllerKind::Servepipeline]
        );
    }
}
