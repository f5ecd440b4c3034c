//! The `raypipe` command line: `run`, `crds`, `dev`, `dag`.

pub mod dag;
#[cfg(feature = "dev")]
pub mod dev;
pub mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

/// Which controllers to run; each can be switched off, e.g. to run only the ServePipeline
/// controller beside an existing KubeRay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ControllerKind {
    Servepipeline,
    Raycluster,
    Rayservice,
    Rayjob,
    Raycronjob,
}

impl ControllerKind {
    /// The CRDs this controller reads or writes.
    pub fn crd_names(self) -> &'static [&'static str] {
        match self {
            ControllerKind::Servepipeline => &["servepipelines.raypipe.dev", "rayservices.ray.io"],
            ControllerKind::Raycluster => &["rayclusters.ray.io"],
            ControllerKind::Rayservice => &["rayservices.ray.io", "rayclusters.ray.io"],
            ControllerKind::Rayjob => &["rayjobs.ray.io", "rayclusters.ray.io"],
            ControllerKind::Raycronjob => &["raycronjobs.ray.io", "rayjobs.ray.io"],
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Controllers to run (comma separated).
    #[arg(
        long,
        env = "RAYPIPE_CONTROLLERS",
        value_delimiter = ',',
        default_value = "servepipeline,raycluster,rayservice,rayjob,raycronjob"
    )]
    pub controllers: Vec<ControllerKind>,
    /// Log format.
    #[arg(long, env = "RAYPIPE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub log_level: LogLevelArgs,
    #[command(flatten)]
    pub operator: crate::config::OperatorArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `--log-level`, shared by `run` and `dev`.
#[derive(Debug, Clone, clap::Args)]
pub struct LogLevelArgs {
    /// What to log: a level (error, warn, info, debug, trace) or filter directives such as
    /// `info,raypipe=debug`. `RUST_LOG`, when set, takes precedence (for debugging a deployment
    /// without changing its flags).
    #[arg(long, env = "RAYPIPE_LOG_LEVEL", default_value = "info", value_parser = parse_log_level)]
    pub log_level: String,
}

fn parse_log_level(value: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(value)
        .map(|_| value.to_owned())
        .map_err(|e| format!("not a log level or filter: {e}"))
}

/// The filter in effect: a non-empty, valid `RUST_LOG` overrides `--log-level`.
fn log_filter(log_level: &str, rust_log: Option<&str>) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    rust_log
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_new(log_level).ok())
        .unwrap_or_else(|| EnvFilter::new("info"))
}

/// Installs the tracing subscriber once, filtered by `log_level` (or `RUST_LOG` when set).
pub fn init_tracing(format: LogFormat, log_level: &str) {
    use tracing_subscriber::fmt;
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = log_filter(log_level, rust_log.as_deref());
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Installs ring as rustls' process-wide crypto provider (kube, reqwest and rcgen share it).
pub fn init_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub fn main() -> ExitCode {
    init_crypto();
    let cli = Cli::parse();
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
        Command::Run(args) => {
            init_tracing(args.log_format, &args.log_level.log_level);
            runtime_block_on(run::run(*args))
        }
        #[cfg(feature = "dev")]
        Command::Dev(args) => {
            init_tracing(LogFormat::Text, &args.log_level.log_level);
            runtime_block_on(dev::run(args))
        }
    }
}

fn runtime_block_on(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
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

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_crd_a_controller_needs_is_one_raypipe_serves() {
        let served: Vec<String> = crate::api::crds()
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        for kind in <ControllerKind as clap::ValueEnum>::value_variants() {
            for name in kind.crd_names() {
                assert!(
                    served.iter().any(|s| s == name),
                    "{kind:?} needs {name}, which raypipe does not serve"
                );
            }
        }
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

        assert_eq!(log_filter("warn", None).to_string(), "warn");
        assert_eq!(log_filter("warn", Some("debug")).to_string(), "debug");
        // An empty or broken RUST_LOG does not silence the operator: the flag applies.
        assert_eq!(log_filter("warn", Some(" ")).to_string(), "warn");
        assert_eq!(log_filter("warn", Some("x=[")).to_string(), "warn");
    }

    #[test]
    fn controllers_flag_parses_a_subset() {
        let cli =
            Cli::try_parse_from(["raypipe", "run", "--controllers", "servepipeline"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(args.controllers, vec![ControllerKind::Servepipeline]);
    }
}
