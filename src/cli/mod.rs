//! The `raypipe` command line: `run`, `crds`, `dev`, `dag`.

pub mod dag;
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
    pub operator: crate::config::OperatorArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the tracing subscriber once; `RUST_LOG` filters (default `info`).
pub fn init_tracing(format: LogFormat) {
    use tracing_subscriber::{EnvFilter, fmt};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
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
            init_tracing(args.log_format);
            runtime_block_on(run::run(*args))
        }
        Command::Dev(args) => {
            init_tracing(LogFormat::Text);
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
    fn controllers_flag_parses_a_subset() {
        let cli =
            Cli::try_parse_from(["raypipe", "run", "--controllers", "servepipeline"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("expected run")
        };
        assert_eq!(args.controllers, vec![ControllerKind::Servepipeline]);
    }
}
