//! `raypipe dag …`: work with model graphs from the command line (filled in by the model-graph work).

use std::process::ExitCode;

#[derive(Debug, clap::Subcommand)]
pub enum DagCommand {
    /// Validate a graph (protobuf, YAML or JSON); exit non-zero with every error listed.
    Validate { file: std::path::PathBuf },
}

pub fn run(cmd: DagCommand) -> ExitCode {
    match cmd {
        DagCommand::Validate { file } => {
            eprintln!("not implemented yet: {}", file.display());
            ExitCode::FAILURE
        }
    }
}
