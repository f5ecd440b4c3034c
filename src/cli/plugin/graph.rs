//! `kubectl raypipe graph`: the graph a pipeline runs, read back from its RayService's Serve
//! config (no registry access, no credentials: what runs is what is drawn), each node marked
//! with the Serve status the pipeline reports.

use std::process::ExitCode;

use anyhow::Context as _;
use kube::api::Api;

use super::{GlobalArgs, Output, print_structured, read_pipeline};
use crate::api::rayservice::RayService;
use crate::api::servepipeline::ServePipeline;
pub use crate::present::running::{RunningGraph, node_applications, running_graph};

#[derive(Debug, Clone, clap::Args)]
pub struct GraphArgs {
    pub name: String,
    /// Which version: `stable` (the one serving), `canary`, or a digest (`sha256:…`).
    #[arg(long = "version", default_value = "stable")]
    pub which: String,
    /// The drawing with `--output text`: for the terminal, SVG, or Graphviz DOT.
    #[arg(long, value_enum, default_value = "text")]
    pub format: DrawFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DrawFormat {
    Text,
    Svg,
    Dot,
}

pub async fn pipeline_and_rayservice(
    target: &super::Target,
    name: &str,
) -> anyhow::Result<(ServePipeline, RayService)> {
    let pipelines: Api<ServePipeline> = Api::namespaced(target.client.clone(), &target.namespace);
    let pipeline = read_pipeline(&pipelines, name).await?;
    let rs_name = pipeline
        .status
        .as_ref()
        .and_then(|s| s.ray_service_name.clone())
        .with_context(|| format!("ServePipeline {name} has no RayService yet"))?;
    let services: Api<RayService> = Api::namespaced(target.client.clone(), &target.namespace);
    let rayservice = services
        .get(&rs_name)
        .await
        .with_context(|| format!("reading RayService {rs_name}"))?;
    Ok((pipeline, rayservice))
}

pub async fn run(global: &GlobalArgs, args: GraphArgs) -> anyhow::Result<ExitCode> {
    let target = global.target().await?;
    let (pipeline, rayservice) = pipeline_and_rayservice(&target, &args.name).await?;
    let running = running_graph(&pipeline, &rayservice, &args.which)?;
    match global.output {
        Output::Text => {
            let marks = running.marks(&args.name);
            let text = match args.format {
                DrawFormat::Text => crate::graph::draw::to_text(&running.graph, &marks),
                DrawFormat::Svg => crate::graph::draw::to_svg(&running.graph, &marks),
                DrawFormat::Dot => crate::graph::dot::to_dot(&running.graph),
            };
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
        }
        output => print_structured(output, &running)?,
    }
    Ok(ExitCode::SUCCESS)
}
