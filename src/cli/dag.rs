//! `raypipe dag …`: work with model graphs from the command line.
//!
//! Exit codes: 0 success; 1 the graph is invalid (every problem is listed); 2 the input could
//! not be read or parsed, or the options are wrong.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::graph::{self, Format, GraphError, ValidatedGraph, ValidationErrors, proto};
use crate::serve::shared::NodeLayout;
use crate::serve::{self, NodeOverride, RenderOptions};

/// Success.
pub const EXIT_OK: u8 = 0;
/// The graph is invalid.
pub const EXIT_INVALID: u8 = 1;
/// The input could not be read or parsed, or an option is wrong.
pub const EXIT_ERROR: u8 = 2;

#[derive(Debug, clap::Subcommand)]
pub enum DagCommand {
    /// Validate a graph (protobuf, YAML or JSON); exit non-zero with every error listed.
    Validate(ValidateArgs),
    /// Print the Ray Serve config (YAML, for RayService.spec.serveConfigV2) of a valid graph.
    Render(RenderArgs),
    /// Print a graph as Graphviz DOT (`raypipe dag dot g.yaml | dot -Tsvg > g.svg`).
    Dot(InputArgs),
    /// Draw a graph without Graphviz: as text for a terminal (default) or as a standalone SVG
    /// (`raypipe dag draw g.yaml --output svg > g.svg`).
    Draw(DrawArgs),
    /// Print the plan of going from graph OLD to graph NEW: per node unchanged, in place,
    /// restarted, added or removed, and the routing and graph-level changes. Exit 0 whether or
    /// not they differ.
    Diff(DiffArgs),
    /// Encode a graph as protobuf (what a registry serves).
    Encode(EncodeArgs),
    /// Print a graph (e.g. a protobuf file) as YAML or JSON.
    Decode(DecodeArgs),
    /// Validate a graph and push it to an OCI registry as a graph artifact; prints the
    /// manifest digest.
    #[command(after_help = super::oci::CREDENTIALS_HELP)]
    Push(super::oci::PushArgs),
    /// Pull a graph artifact from an OCI registry (tag or digest; both digests checked).
    #[command(after_help = super::oci::CREDENTIALS_HELP)]
    Pull(super::oci::PullArgs),
}

/// The graph to read.
#[derive(Debug, Clone, clap::Args)]
pub struct InputArgs {
    /// Graph file: protobuf (.pb), YAML (.yaml, .yml) or JSON (.json); `-` reads standard input.
    pub file: PathBuf,
    /// Format of FILE, when its extension does not say (default: guessed from the content).
    #[arg(long, value_enum)]
    pub format: Option<InputFormat>,
}

/// Input formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InputFormat {
    Protobuf,
    Yaml,
    Json,
}

impl From<InputFormat> for Format {
    fn from(format: InputFormat) -> Self {
        match format {
            InputFormat::Protobuf => Format::Protobuf,
            InputFormat::Yaml => Format::Yaml,
            InputFormat::Json => Format::Json,
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Print the result as JSON on standard output (problems with their reason codes).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RenderArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Serve application name (default: the graph's name).
    #[arg(long)]
    pub app_name: Option<String>,
    /// Route prefix (default: the graph's, else "/").
    #[arg(long)]
    pub route_prefix: Option<String>,
    /// Import path of the graph runtime's application builder.
    #[arg(long, default_value = serve::DEFAULT_RUNTIME_IMPORT_PATH)]
    pub runtime_import_path: String,
    /// URI of the graph runtime's package, added to py_modules (repeatable).
    #[arg(long = "runtime-py-module")]
    pub runtime_py_modules: Vec<String>,
    /// Name of the deployment that executes the graph.
    #[arg(long, default_value = serve::DEFAULT_EXECUTOR_DEPLOYMENT)]
    pub executor_deployment: String,
    /// http_options.request_timeout_s.
    #[arg(long)]
    pub request_timeout_s: Option<f64>,
    /// http_options.keep_alive_timeout_s.
    #[arg(long)]
    pub keep_alive_timeout_s: Option<i32>,
    /// http_options.host.
    #[arg(long)]
    pub http_host: Option<String>,
    /// http_options.port.
    #[arg(long)]
    pub http_port: Option<u16>,
    /// Pin a node's replicas: NODE=COUNT (repeatable).
    #[arg(long = "replicas", value_parser = parse_assignment)]
    pub replicas: Vec<(String, i32)>,
    /// Set a node's max_ongoing_requests: NODE=COUNT (repeatable).
    #[arg(long = "max-ongoing-requests", value_parser = parse_assignment)]
    pub max_ongoing_requests: Vec<(String, i32)>,
    /// Print JSON (the dashboard REST body) instead of YAML.
    #[arg(long)]
    pub json: bool,
    /// Lay the graph out with shared node applications (docs/design/shared-nodes.md): a
    /// version application with the executor, its wiring in the executor's user_config, and
    /// one application per model node named by a hash of what defines it.
    #[arg(long)]
    pub shared_nodes: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DrawArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// What to draw: text for a terminal, or an SVG document.
    #[arg(long, value_enum, default_value_t = DrawOutput::Text)]
    pub output: DrawOutput,
}

/// Output forms of `dag draw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DrawOutput {
    /// Layers, nodes and their out-edges as plain text (no colour codes).
    Text,
    /// A standalone SVG document.
    Svg,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DiffArgs {
    /// The graph running now: protobuf (.pb), YAML (.yaml, .yml) or JSON (.json); `-` reads
    /// standard input. The format comes from the extension, else from the content.
    pub old: PathBuf,
    /// The graph to go to, in any of the same forms.
    pub new: PathBuf,
    /// How to print the plan.
    #[arg(long, value_enum, default_value_t = DiffOutput::Text)]
    pub output: DiffOutput,
    /// How the operator lays the nodes out (its `--node-layout`): what restarts differs.
    #[arg(long, value_enum, default_value_t)]
    pub node_layout: NodeLayout,
    /// The code that runs with OLD (a package directory or a wheel, as `dag push --code` takes
    /// it); with --new-code, the plan says what the code change restarts.
    #[arg(long, value_name = "DIR|WHEEL")]
    pub old_code: Option<PathBuf>,
    /// The code to go to with NEW.
    #[arg(long, value_name = "DIR|WHEEL")]
    pub new_code: Option<PathBuf>,
}

/// Output forms of `dag diff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffOutput {
    /// A summary line and a table, for people.
    Text,
    /// The plan as JSON (camelCase keys), for programs.
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct EncodeArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Write here instead of standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Encode even when the graph is invalid (for test fixtures).
    #[arg(long)]
    pub allow_invalid: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DecodeArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Print JSON instead of YAML.
    #[arg(long)]
    pub json: bool,
}

fn parse_assignment(text: &str) -> Result<(String, i32), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("expected NODE=COUNT, got {text:?}"))?;
    let value = value
        .trim()
        .parse()
        .map_err(|e| format!("{value:?} is not a count: {e}"))?;
    Ok((name.trim().to_string(), value))
}

/// Why a command failed before it could judge the graph.
#[derive(Debug, thiserror::Error)]
pub enum DagError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Graph { path: String, source: GraphError },
    #[error(transparent)]
    Render(#[from] serve::RenderError),
    #[error("OLD and NEW cannot both be standard input")]
    BothStandardInput,
    #[error(transparent)]
    Oci(#[from] super::oci::OciCommandError),
    #[error(transparent)]
    Code(#[from] crate::pypackage::code::CodeError),
}

/// Runs a `raypipe dag` command on the process's standard output and error.
pub fn run(cmd: DagCommand) -> ExitCode {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    ExitCode::from(execute(cmd, &mut stdout.lock(), &mut stderr.lock()))
}

/// Runs a command with explicit output streams; returns the exit code.
pub fn execute(cmd: DagCommand, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let result = match cmd {
        DagCommand::Validate(args) => validate(&args, out, err),
        DagCommand::Render(args) => render(&args, out, err),
        DagCommand::Dot(args) => dot(&args, out),
        DagCommand::Draw(args) => draw(&args, out),
        DagCommand::Diff(args) => diff(&args, out, err),
        DagCommand::Encode(args) => encode(&args, out, err),
        DagCommand::Decode(args) => decode(&args, out),
        DagCommand::Push(args) => super::oci::push(&args, out, err),
        DagCommand::Pull(args) => super::oci::pull(&args, out, err),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            EXIT_ERROR
        }
    }
}

pub(super) fn display_path(path: &Path) -> String {
    if path == Path::new("-") {
        "standard input".to_string()
    } else {
        path.display().to_string()
    }
}

/// Reads and parses the input (format from the flag, else the extension, else the content).
pub fn read_graph(input: &InputArgs) -> Result<proto::PipelineGraph, DagError> {
    let path = display_path(&input.file);
    let read_error = |source| DagError::Read {
        path: path.clone(),
        source,
    };
    // At most one byte more than a graph may have: enough to tell that it is too large,
    // without reading (or allocating for) whatever size the file claims.
    let limit = graph::MAX_GRAPH_BYTES as u64 + 1;
    let mut bytes = Vec::new();
    if input.file == Path::new("-") {
        std::io::stdin()
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
    } else {
        std::fs::File::open(&input.file)
            .and_then(|file| file.take(limit).read_to_end(&mut bytes))
            .map_err(read_error)?;
    }
    let format = input
        .format
        .map(Format::from)
        .or_else(|| Format::from_path(&input.file))
        .unwrap_or_else(|| Format::sniff(&bytes));
    graph::load(&bytes, format).map_err(|source| DagError::Graph { path, source })
}

pub(super) fn write_problems(err: &mut dyn Write, path: &str, errors: &ValidationErrors) {
    let _ = writeln!(
        err,
        "{path}: invalid graph, {} problem{}:",
        errors.len(),
        if errors.len() == 1 { "" } else { "s" }
    );
    // Each line capped (names and cycles come from the input), and the list too: a graph
    // with 60,000 duplicate nodes must not print megabytes. `--json` lists every problem.
    for error in errors.errors().iter().take(MAX_LISTED_PROBLEMS) {
        let _ = writeln!(
            err,
            "  error[{}]: {}",
            error.reason(),
            graph::capped(error, graph::MAX_PROBLEM_BYTES)
        );
    }
    if errors.len() > MAX_LISTED_PROBLEMS {
        let _ = writeln!(
            err,
            "  ... and {} more (`raypipe dag validate --json` lists every one)",
            errors.len() - MAX_LISTED_PROBLEMS
        );
    }
}

/// Most problems printed one per line.
const MAX_LISTED_PROBLEMS: usize = 100;

fn validate(args: &ValidateArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<u8, DagError> {
    let path = display_path(&args.input.file);
    let parsed = read_graph(&args.input);
    if args.json {
        let report = match &parsed {
            Err(e) => {
                serde_json::json!({"valid": false, "errors": [{"reason": reason_of(e), "message": e.to_string()}]})
            }
            Ok(graph) => match graph::validate(graph.clone()) {
                Ok(valid) => summary_json(&valid),
                Err(errors) => serde_json::json!({
                    "valid": false,
                    "errors": errors.errors().iter().map(|e| serde_json::json!({"reason": e.reason(), "message": graph::capped(e, graph::MAX_PROBLEM_BYTES)})).collect::<Vec<_>>(),
                }),
            },
        };
        let _ = writeln!(out, "{report:#}");
        return Ok(match (&parsed, report["valid"].as_bool()) {
            (Err(_), _) => EXIT_ERROR,
            (Ok(_), Some(true)) => EXIT_OK,
            _ => EXIT_INVALID,
        });
    }
    match graph::validate(parsed?) {
        Ok(valid) => {
            let _ = writeln!(
                out,
                "{path}: valid graph {:?} version {:?}: {} nodes, {} edges, ingress {:?}, output {:?}, digest sha256:{}",
                valid.name(),
                valid.version(),
                valid.node_count(),
                valid.edge_count(),
                valid.ingress(),
                valid.output(),
                valid.digest()
            );
            Ok(EXIT_OK)
        }
        Err(errors) => {
            write_problems(err, &path, &errors);
            Ok(EXIT_INVALID)
        }
    }
}

fn reason_of(error: &DagError) -> &'static str {
    match error {
        DagError::Read { .. } => "ReadError",
        DagError::Write { .. } => "WriteError",
        DagError::Graph { source, .. } => source.reason(),
        DagError::Render(e) => e.reason(),
        DagError::BothStandardInput => "UsageError",
        DagError::Oci(_) => "RegistryError",
        DagError::Code(_) => "CodeError",
    }
}

fn summary_json(valid: &ValidatedGraph) -> serde_json::Value {
    serde_json::json!({
        "valid": true,
        "name": valid.name(),
        "version": valid.version(),
        "nodes": valid.node_count(),
        "edges": valid.edge_count(),
        "ingress": valid.ingress(),
        "output": valid.output(),
        "digest": format!("sha256:{}", valid.digest()),
        "topological_order": valid.topological_order().map(|n| n.name.as_str()).collect::<Vec<_>>(),
    })
}

/// Render options from the command line.
pub fn render_options(args: &RenderArgs) -> RenderOptions {
    let mut node_overrides: BTreeMap<String, NodeOverride> = BTreeMap::new();
    for (node, count) in &args.replicas {
        node_overrides.entry(node.clone()).or_default().num_replicas = Some(*count);
    }
    for (node, count) in &args.max_ongoing_requests {
        node_overrides
            .entry(node.clone())
            .or_default()
            .max_ongoing_requests = Some(*count);
    }
    RenderOptions {
        application_name: args.app_name.clone(),
        route_prefix: args.route_prefix.clone(),
        runtime_import_path: args.runtime_import_path.clone(),
        runtime_py_modules: args.runtime_py_modules.clone(),
        code_py_modules: Vec::new(),
        executor_deployment: args.executor_deployment.clone(),
        request_timeout_s: args.request_timeout_s,
        keep_alive_timeout_s: args.keep_alive_timeout_s,
        http_host: args.http_host.clone(),
        http_port: args.http_port,
        proxy_location: None,
        node_overrides,
    }
}

fn render(args: &RenderArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<u8, DagError> {
    let path = display_path(&args.input.file);
    let valid = match graph::validate(read_graph(&args.input)?) {
        Ok(valid) => valid,
        Err(errors) => {
            write_problems(err, &path, &errors);
            return Ok(EXIT_INVALID);
        }
    };
    let options = render_options(args);
    let config = serve::render(&valid, &options)?;
    let text = if args.shared_nodes {
        let base = config
            .applications
            .first()
            .map(|a| a.name.clone())
            .unwrap_or_default();
        let layout = serve::shared::config_json(&config, &base)?;
        if args.json {
            serde_json::to_string_pretty(&layout).unwrap_or_default() + "\n"
        } else {
            serde_yaml::to_string(&layout).unwrap_or_default()
        }
    } else if args.json {
        // The JSON body carries the same facts in `args.fused_nodes`.
        config.to_json() + "\n"
    } else {
        let plan = serve::fuse::plan(valid.graph(), options.node_overrides.keys());
        fusion_comment(&plan, &options.executor_deployment) + &config.to_yaml()
    };
    write_stdout(out, text.as_bytes())?;
    Ok(EXIT_OK)
}

/// YAML comment lines saying which model nodes fuse into the executor and why the others are
/// deployments of their own (nothing when the graph has no model node).
fn fusion_comment(plan: &serve::fuse::FusionPlan, executor: &str) -> String {
    let mut text = String::new();
    if !plan.fused.is_empty() {
        let names: Vec<&str> = plan.fused.iter().map(String::as_str).collect();
        text.push_str(&format!(
            "# fused into {executor} (in-process, no deployment of their own): {}\n",
            names.join(", ")
        ));
    }
    for (name, reason) in &plan.kept {
        text.push_str(&format!(
            "# own deployment: {name} ({})\n",
            reason.describe()
        ));
    }
    text
}

fn stdout_error(source: std::io::Error) -> DagError {
    DagError::Write {
        path: "standard output".into(),
        source,
    }
}

pub(super) fn write_stdout(out: &mut dyn Write, bytes: &[u8]) -> Result<(), DagError> {
    out.write_all(bytes).map_err(stdout_error)
}

fn dot(args: &InputArgs, out: &mut dyn Write) -> Result<u8, DagError> {
    let graph = read_graph(args)?;
    let plan = serve::fuse::plan(&graph, []);
    let fused = graph::dot::FusedInto {
        host: serve::DEFAULT_EXECUTOR_DEPLOYMENT,
        nodes: &plan.fused,
    };
    write_stdout(
        out,
        graph::dot::to_dot_fused(&graph, Some(fused)).as_bytes(),
    )?;
    Ok(EXIT_OK)
}

fn draw(args: &DrawArgs, out: &mut dyn Write) -> Result<u8, DagError> {
    let graph = read_graph(&args.input)?;
    let marks = graph::draw::NodeMarks::default();
    let text = match args.output {
        DrawOutput::Text => graph::draw::to_text(&graph, &marks),
        DrawOutput::Svg => graph::draw::to_svg(&graph, &marks),
    };
    write_stdout(out, text.as_bytes())?;
    Ok(EXIT_OK)
}

fn diff(args: &DiffArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<u8, DagError> {
    let stdin = Path::new("-");
    if args.old == stdin && args.new == stdin {
        return Err(DagError::BothStandardInput);
    }
    // Both files are read and validated before anything is printed, so one run lists the
    // problems of both.
    let mut graphs = Vec::with_capacity(2);
    for file in [&args.old, &args.new] {
        let input = InputArgs {
            file: file.clone(),
            format: None,
        };
        match graph::validate(read_graph(&input)?) {
            Ok(valid) => graphs.push(valid),
            Err(errors) => write_problems(err, &display_path(file), &errors),
        }
    }
    let [old, new] = graphs.as_slice() else {
        return Ok(EXIT_INVALID);
    };
    let mut plan = graph::diff::diff(old.graph(), new.graph());
    if args.old_code.is_some() || args.new_code.is_some() {
        let (old_code, new_code) = (code_files(&args.old_code)?, code_files(&args.new_code)?);
        plan = plan.with_code(&old_code, &new_code, new.graph());
    }
    // Counted as the default rendering deploys the new version (a ServePipeline's node
    // overrides are its own plan's business).
    let options = crate::serve::RenderOptions::default();
    if let Ok(rendered) = crate::serve::render(new, &options) {
        plan.starts = match args.node_layout {
            NodeLayout::Shared => {
                plan = plan.with_shared_nodes(old.graph(), new.graph());
                let old_rendered = crate::serve::render(old, &options).ok();
                crate::serve::shared::layout_starts(old_rendered.as_ref(), &rendered)
            }
            NodeLayout::Inline => Some(crate::serve::rollout_starts(&plan, &rendered)),
        };
    }
    let text = match args.output {
        DiffOutput::Text => plan.to_string(),
        DiffOutput::Json => {
            serde_json::to_string_pretty(&plan)
                .map_err(|e| stdout_error(std::io::Error::other(e)))?
                + "\n"
        }
    };
    write_stdout(out, text.as_bytes())?;
    Ok(EXIT_OK)
}

/// One side's code for `dag diff`: the layer `dag push --code` would push, its files hashed.
fn code_files(path: &Option<PathBuf>) -> Result<graph::diff::CodeFiles, DagError> {
    use sha2::Digest as _;
    let Some(path) = path else {
        return Ok(graph::diff::CodeFiles::default());
    };
    let package = crate::pypackage::code::pack(path)?;
    let summary = crate::pypackage::code::check(&package.bytes)?;
    let files = summary
        .files(&package.bytes)
        .into_iter()
        .map(|(name, bytes)| (name, hex::encode(sha2::Sha256::digest(bytes))))
        .collect();
    Ok(graph::diff::CodeFiles {
        digest: Some(format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(package.bytes.as_slice()))
        )),
        files,
    })
}

fn encode(args: &EncodeArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<u8, DagError> {
    let path = display_path(&args.input.file);
    let graph = read_graph(&args.input)?;
    if !args.allow_invalid
        && let Err(errors) = graph::validate(graph.clone())
    {
        write_problems(err, &path, &errors);
        let _ = writeln!(
            err,
            "nothing written (use --allow-invalid to encode it anyway)"
        );
        return Ok(EXIT_INVALID);
    }
    let bytes = graph::encode(&graph).map_err(|source| DagError::Graph { path, source })?;
    match &args.output {
        Some(file) => std::fs::write(file, &bytes).map_err(|source| DagError::Write {
            path: file.display().to_string(),
            source,
        })?,
        None => write_stdout(out, &bytes)?,
    }
    Ok(EXIT_OK)
}

fn decode(args: &DecodeArgs, out: &mut dyn Write) -> Result<u8, DagError> {
    let path = display_path(&args.input.file);
    let graph = read_graph(&args.input)?;
    let text = if args.json {
        graph::to_json(&graph).map(|t| t + "\n")
    } else {
        graph::to_yaml(&graph)
    }
    .map_err(|source| DagError::Graph { path, source })?;
    write_stdout(out, text.as_bytes())?;
    Ok(EXIT_OK)
}

#[cfg(test)]
#[path = "dag_tests.rs"]
mod tests;
