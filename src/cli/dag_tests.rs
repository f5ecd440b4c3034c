//! Unit tests of the `raypipe dag` commands (`dag.rs`), kept beside it so the module reads as code.

use super::*;
use crate::cli::{Cli, Command};
use clap::Parser;

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("samples/graphs")
        .join(name)
}

fn input(file: PathBuf) -> InputArgs {
    InputArgs { file, format: None }
}

/// Runs a command line (`dag ...`) and returns (exit code, stdout, stderr).
fn run_line(args: &[&str]) -> (u8, Vec<u8>, String) {
    let mut line = vec!["raypipe", "dag"];
    line.extend_from_slice(args);
    let cli = Cli::try_parse_from(line).unwrap_or_else(|e| panic!("{e}"));
    let Command::Dag(cmd) = cli.command else {
        panic!("not a dag command")
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = execute(cmd, &mut out, &mut err);
    (code, out, String::from_utf8(err).unwrap())
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap()
}

const INVALID: &str = r#"
name: broken
ingress: request
nodes:
  - {name: request, input: {}}
  - {name: a, model: {import_path: "samples.models:A", deployment: {num_replicas: -1}}}
  - {name: a, model: {import_path: "samples.models:A"}}
  - {name: b, model: {import_path: "nomodule"}}
  - {name: response, output: {}}
edges:
  - {source: request, target: a}
  - {source: a, target: b}
  - {source: b, target: a}
  - {source: b, target: response}
  - {source: b, target: ghost}
"#;

fn invalid_file(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("broken.yaml");
    std::fs::write(&path, INVALID).unwrap();
    path
}

#[test]
fn validate_accepts_every_sample_in_every_format() {
    for name in [
        "sequence.yaml",
        "sequence.pb",
        "ensemble.yaml",
        "ensemble.pb",
        "switch-canary.yaml",
        "switch-canary.pb",
    ] {
        let path = sample(name);
        let (code, out, err) = run_line(&["validate", path.to_str().unwrap()]);
        assert_eq!(code, EXIT_OK, "{name}: {err}");
        let out = text(out);
        assert!(
            out.contains("valid graph") && out.contains("digest sha256:"),
            "{out}"
        );
    }
}

#[test]
fn validate_lists_every_problem_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = invalid_file(&dir);
    let (code, out, err) = run_line(&["validate", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_INVALID);
    assert!(out.is_empty());
    let expected = graph::validate(graph::from_yaml(INVALID).unwrap()).unwrap_err();
    assert!(expected.len() >= 4, "{expected}");
    let problem_lines: Vec<&str> = err
        .lines()
        .filter(|l| l.trim_start().starts_with("error["))
        .collect();
    assert_eq!(problem_lines.len(), expected.len(), "{err}");
    for reason in [
        "DuplicateNode",
        "InvalidOptions",
        "InvalidImportPath",
        "UnknownNode",
    ] {
        assert!(
            err.contains(&format!("error[{reason}]")),
            "{reason} missing:\n{err}"
        );
    }
    assert!(
        err.contains(&format!("{} problems", expected.len())),
        "{err}"
    );
}

#[test]
fn validate_json_reports_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let path = invalid_file(&dir);
    let (code, out, _) = run_line(&["validate", "--json", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_INVALID);
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(report["valid"], false);
    let reasons: Vec<&str> = report["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert!(reasons.contains(&"DuplicateNode"), "{reasons:?}");

    let (code, out, _) = run_line(&[
        "validate",
        "--json",
        sample("ensemble.yaml").to_str().unwrap(),
    ]);
    assert_eq!(code, EXIT_OK);
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(report["valid"], true);
    assert_eq!(report["nodes"], 6);
    assert_eq!(report["ingress"], "request");
    assert_eq!(report["topological_order"][0], "request");
}

#[test]
fn unreadable_input_is_exit_two() {
    let (code, _, err) = run_line(&["validate", "/nonexistent/graph.yaml"]);
    assert_eq!(code, EXIT_ERROR);
    assert!(err.contains("cannot read /nonexistent/graph.yaml"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "nodes: {oops").unwrap();
    let (code, _, err) = run_line(&["validate", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_ERROR);
    assert!(err.contains("not a valid YAML graph"), "{err}");
    let (code, out, _) = run_line(&["validate", "--json", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_ERROR);
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(report["errors"][0]["reason"], "ParseError");
}

#[test]
fn render_prints_a_serve_config() {
    let path = sample("ensemble.yaml");
    let (code, out, err) = run_line(&[
        "render",
        path.to_str().unwrap(),
        "--runtime-py-module",
        "http://127.0.0.1:8080/runtime.zip",
        "--replicas",
        "model_b=3",
        "--max-ongoing-requests",
        "combine=7",
        "--request-timeout-s",
        "30",
    ]);
    assert_eq!(code, EXIT_OK, "{err}");
    let config = serve::ServeConfig::from_yaml(&text(out)).unwrap();
    let app = &config.applications[0];
    assert_eq!(
        app.runtime_env.as_ref().unwrap().py_modules,
        ["http://127.0.0.1:8080/runtime.zip"]
    );
    let model_b = app
        .deployments
        .iter()
        .find(|d| d.name == "model_b")
        .unwrap();
    assert_eq!(model_b.num_replicas, Some(serve::NumReplicas::Count(3)));
    let combine = app
        .deployments
        .iter()
        .find(|d| d.name == "combine")
        .unwrap();
    assert_eq!(combine.max_ongoing_requests, Some(7));

    let (code, out, _) = run_line(&["render", "--json", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK);
    let _: serve::ServeConfig = serde_json::from_slice(&out).unwrap();
}

#[test]
fn render_lays_out_shared_node_applications_on_request() {
    let sample = sample("ensemble.yaml");
    let (code, out, err) = run_line(&[
        "render",
        "--json",
        "--shared-nodes",
        sample.to_str().unwrap(),
    ]);
    assert_eq!(code, EXIT_OK, "{err}");
    let config: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let apps = config["applications"].as_array().unwrap();
    // The version application and one per model node (preprocess, model_a, model_b, combine).
    assert_eq!(apps.len(), 5);
    assert_eq!(apps[0]["route_prefix"], "/ensemble");
    assert!(apps[1..].iter().all(serve::shared::is_node_application));
    let (code, out, _) = run_line(&["render", "--shared-nodes", sample.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK);
    assert!(text(out).contains("import_path: raypipe_runtime.node_app:build"));
}

#[test]
fn render_refuses_invalid_graphs_and_options() {
    let dir = tempfile::tempdir().unwrap();
    let path = invalid_file(&dir);
    let (code, out, err) = run_line(&["render", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_INVALID);
    assert!(
        out.is_empty() && err.contains("error[DuplicateNode]"),
        "{err}"
    );
    let (code, _, err) = run_line(&[
        "render",
        sample("sequence.yaml").to_str().unwrap(),
        "--route-prefix",
        "nope",
    ]);
    assert_eq!(code, EXIT_ERROR);
    assert!(err.contains("route prefix \"nope\""), "{err}");
    assert!(
        Cli::try_parse_from(["raypipe", "dag", "render", "x.yaml", "--replicas", "oops"]).is_err()
    );
}

#[test]
fn dot_draws_the_graph() {
    let (code, out, _) = run_line(&["dot", sample("switch-canary.pb").to_str().unwrap()]);
    assert_eq!(code, EXIT_OK);
    let dot = text(out);
    assert!(dot.starts_with("digraph \"switch-canary\" {"), "{dot}");
    assert!(
        dot.contains("\"tier\" -> \"premium\" [label=\"when /request/tier == \\\"gold\\\"\"]"),
        "{dot}"
    );
    assert!(dot.contains("90 (90%)") && dot.contains("default"), "{dot}");
    assert!(dot.trim_end().ends_with('}'));
    // Every node of the sample has deployment options: nothing is fused.
    assert!(!dot.contains("cluster_fused"), "{dot}");
}

#[test]
fn draw_prints_text_by_default_and_svg_on_request() {
    let path = sample("switch-canary.pb");
    let (code, out, err) = run_line(&["draw", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK, "{err}");
    let drawing = text(out);
    assert!(
        drawing.starts_with("switch-canary 1\n[0] request (ingress)\n"),
        "{drawing}"
    );
    assert!(
        drawing.contains("─▶ premium  (when /request/tier == \"gold\")"),
        "{drawing}"
    );
    assert!(
        drawing.contains("90 (90%)") && drawing.contains("default"),
        "{drawing}"
    );
    assert!(!drawing.contains('\u{1b}'));

    let (code, out, err) = run_line(&["draw", path.to_str().unwrap(), "--output", "svg"]);
    assert_eq!(code, EXIT_OK, "{err}");
    let svg = text(out);
    assert!(
        svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "{svg}"
    );
    assert!(svg.contains("data-node=\"premium\""), "{svg}");
    assert!(svg.trim_end().ends_with("</svg>"));

    // The input format flag still applies to the input.
    let (code, out, _) = run_line(&[
        "draw",
        sample("sequence.yaml").to_str().unwrap(),
        "--format",
        "yaml",
    ]);
    assert_eq!(code, EXIT_OK);
    assert!(text(out).contains("(ingress)"));

    // Invalid graphs are drawn too; unreadable input is an error.
    let dir = tempfile::tempdir().unwrap();
    let (code, out, _) = run_line(&["draw", invalid_file(&dir).to_str().unwrap()]);
    assert_eq!(code, EXIT_OK);
    assert!(text(out).contains("─▶ ghost  (unknown node)"));
    let missing = dir.path().join("missing.yaml");
    let (code, _, err) = run_line(&["draw", missing.to_str().unwrap()]);
    assert_eq!(code, EXIT_ERROR);
    assert!(err.contains("cannot read"), "{err}");
    assert!(Cli::try_parse_from(["raypipe", "dag", "draw", "g.yaml", "--output", "png"]).is_err());
}

/// A chain whose middle node has resources of its own: the other two fuse.
fn fusable_chain(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("chain.yaml");
    std::fs::write(
            &path,
            "name: chain\ningress: request\nnodes:\n\
             - {name: request, input: {}}\n\
             - {name: a, model: {import_path: 'm:A'}}\n\
             - {name: b, model: {import_path: 'm:B', deployment: {ray_actor_options: {num_gpus: 1}}}}\n\
             - {name: c, model: {import_path: 'm:C', fuse: false}}\n\
             - {name: d, model: {import_path: 'm:D'}}\n\
             - {name: response, output: {}}\n\
             edges:\n\
             - {source: request, target: a}\n- {source: a, target: b}\n- {source: b, target: c}\n\
             - {source: c, target: d}\n- {source: d, target: response}\n",
        )
        .unwrap();
    path
}

#[test]
fn render_and_dot_show_the_fused_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let path = fusable_chain(&dir);
    let (code, out, err) = run_line(&["render", path.to_str().unwrap(), "--replicas", "d=2"]);
    assert_eq!(code, EXIT_OK, "{err}");
    let yaml = text(out);
    assert!(
        yaml.starts_with(
            "# fused into raypipe-executor (in-process, no deployment of their own): a\n"
        ),
        "{yaml}"
    );
    assert!(
        yaml.contains("# own deployment: b (it has deployment options of its own)\n"),
        "{yaml}"
    );
    assert!(
        yaml.contains("# own deployment: c (the node turns fusion off (model.fuse: false))\n"),
        "{yaml}"
    );
    assert!(
        yaml.contains("# own deployment: d (the operator overrides its deployment)\n"),
        "{yaml}"
    );
    let config = serve::ServeConfig::from_yaml(&yaml).unwrap();
    let app = &config.applications[0];
    assert_eq!(app.args.fused_nodes, ["a"]);
    let names: Vec<&str> = app.deployments.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["b", "c", "d", "raypipe-executor"]);

    let (code, out, _) = run_line(&["dot", path.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK);
    let dot = text(out);
    let cluster = dot
        .split("subgraph \"cluster_fused\" {")
        .nth(1)
        .expect("a fused cluster");
    let cluster = cluster.split('}').next().unwrap();
    assert!(
        cluster.contains("raypipe-executor (fused: in-process in each of its replicas)"),
        "{dot}"
    );
    assert!(
        cluster.contains("\"a\";") && cluster.contains("\"d\";"),
        "{dot}"
    );
    assert!(
        !cluster.contains("\"b\";") && !cluster.contains("\"c\";"),
        "{dot}"
    );
}

#[test]
fn encode_matches_the_sample_protobuf() {
    let (code, out, err) = run_line(&["encode", sample("sequence.yaml").to_str().unwrap()]);
    assert_eq!(code, EXIT_OK, "{err}");
    assert_eq!(out, std::fs::read(sample("sequence.pb")).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("out.pb");
    let (code, out, _) = run_line(&[
        "encode",
        sample("ensemble.yaml").to_str().unwrap(),
        "-o",
        target.to_str().unwrap(),
    ]);
    assert_eq!(code, EXIT_OK);
    assert!(out.is_empty());
    assert_eq!(
        std::fs::read(&target).unwrap(),
        std::fs::read(sample("ensemble.pb")).unwrap()
    );
}

#[test]
fn encode_refuses_invalid_graphs_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = invalid_file(&dir);
    let target = dir.path().join("broken.pb");
    let (code, _, err) = run_line(&[
        "encode",
        path.to_str().unwrap(),
        "-o",
        target.to_str().unwrap(),
    ]);
    assert_eq!(code, EXIT_INVALID);
    assert!(!target.exists() && err.contains("nothing written"), "{err}");
    let (code, _, _) = run_line(&[
        "encode",
        "--allow-invalid",
        path.to_str().unwrap(),
        "-o",
        target.to_str().unwrap(),
    ]);
    assert_eq!(code, EXIT_OK);
    let decoded = graph::decode(&std::fs::read(&target).unwrap()).unwrap();
    assert_eq!(decoded, graph::from_yaml(INVALID).unwrap());
}

#[test]
fn decode_prints_yaml_or_json_that_reads_back() {
    let original = graph::decode(&std::fs::read(sample("switch-canary.pb")).unwrap()).unwrap();
    let (code, out, _) = run_line(&["decode", sample("switch-canary.pb").to_str().unwrap()]);
    assert_eq!(code, EXIT_OK);
    assert_eq!(graph::from_yaml(&text(out)).unwrap(), original);
    let (code, out, _) = run_line(&[
        "decode",
        "--json",
        sample("switch-canary.pb").to_str().unwrap(),
    ]);
    assert_eq!(code, EXIT_OK);
    assert_eq!(graph::from_json(&text(out)).unwrap(), original);
}

#[test]
fn format_comes_from_the_flag_the_extension_or_the_content() {
    let dir = tempfile::tempdir().unwrap();
    let no_extension = dir.path().join("graph");
    std::fs::copy(sample("ensemble.pb"), &no_extension).unwrap();
    let graph = read_graph(&input(no_extension.clone())).unwrap();
    assert_eq!(graph.name, "ensemble");
    std::fs::copy(sample("ensemble.yaml"), &no_extension).unwrap();
    assert_eq!(
        read_graph(&input(no_extension.clone())).unwrap().name,
        "ensemble"
    );
    let forced = InputArgs {
        file: no_extension,
        format: Some(InputFormat::Protobuf),
    };
    assert!(matches!(read_graph(&forced), Err(DagError::Graph { .. })));
}

/// switch-canary.yaml in a temp dir, edited: a canary weight, a replica count, a new
/// version and one more constructor argument.
fn edited_switch_canary(dir: &tempfile::TempDir) -> PathBuf {
    let original = std::fs::read_to_string(sample("switch-canary.yaml")).unwrap();
    let edited = original
            .replace("version: \"1\"", "version: \"2\"")
            .replace(
                "{source: canary, target: candidate, weight: 10}",
                "{source: canary, target: candidate, weight: 30}",
            )
            .replace("label: premium", "label: premium\n        threshold: 0.5")
            .replacen(
                "      deployment:\n        ray_actor_options:\n          num_cpus: 0.1\n    on_error",
                "      deployment:\n        num_replicas: 2\n        ray_actor_options:\n          num_cpus: 0.1\n    on_error",
                1,
            );
    assert_ne!(edited, original);
    let path = dir.path().join("switch-canary-v2.yaml");
    std::fs::write(&path, edited).unwrap();
    path
}

#[test]
fn diff_prints_the_plan_of_two_graph_files() {
    let dir = tempfile::tempdir().unwrap();
    let new = edited_switch_canary(&dir);
    // OLD as protobuf, NEW as YAML: any form `render` reads.
    let old = sample("switch-canary.pb");
    let (code, out, err) = run_line(&["diff", old.to_str().unwrap(), new.to_str().unwrap()]);
    assert_eq!(code, EXIT_OK, "{err}");
    let plan = text(out);
    assert!(
            plan.starts_with(
                "6 unchanged, 1 in place, 1 restarted, 0 added, 0 removed, 1 routing change, 1 graph change\n"
            ),
            "{plan}"
        );
    for line in [
        // Shared node applications: the version and the weight are wiring, applied in place;
        // premium's application starts (with a canary, the canary's executor too).
        "starts: 1 replica with strategy Immediate, 2 replicas with Canary",
        "candidate  model   in place   model.deployment.num_replicas",
        "premium    model   restarted  model.init_kwargs",
        "  edge canary -> candidate: weight 10 (10%) -> 30 (25%)",
        "  version: \"1\" -> \"2\"",
    ] {
        assert!(plan.lines().any(|l| l == line), "{line:?} missing:\n{plan}");
    }

    let (code, out, _) = run_line(&[
        "diff",
        "--output",
        "json",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    assert_eq!(code, EXIT_OK);
    let mut plan: graph::diff::GraphDiff = serde_json::from_slice(&out).unwrap();
    let (old_graph, new_graph) = (
        read_graph(&input(old.clone())).unwrap(),
        read_graph(&input(new.clone())).unwrap(),
    );
    let expected = graph::diff::diff(&old_graph, &new_graph);
    let starts = plan
        .starts
        .take()
        .expect("the plan counts what the rollout starts");
    assert_eq!((starts.immediate.replicas, starts.canary.replicas), (1, 2));
    assert_eq!(
        plan,
        expected.clone().with_shared_nodes(&old_graph, &new_graph)
    );
    assert!(!plan.restarts_all_replicas);

    // The inline layout: the version changed (wiring, in the application's args), so
    // everything restarts.
    let (code, out, _) = run_line(&[
        "diff",
        "--node-layout",
        "inline",
        "--output",
        "json",
        old.to_str().unwrap(),
        new.to_str().unwrap(),
    ]);
    assert_eq!(code, EXIT_OK);
    let mut plan: graph::diff::GraphDiff = serde_json::from_slice(&out).unwrap();
    let starts = plan.starts.take().expect("counted");
    assert_eq!(starts.canary, starts.immediate);
    assert_eq!(plan, expected);
    assert!(plan.restarts_all_replicas);
}

#[test]
fn diff_of_the_same_graph_in_two_forms_is_no_changes() {
    let (code, out, err) = run_line(&[
        "diff",
        sample("sequence.yaml").to_str().unwrap(),
        sample("sequence.pb").to_str().unwrap(),
    ]);
    assert_eq!(
        (code, text(out).as_str()),
        (EXIT_OK, "no changes\n"),
        "{err}"
    );
    assert!(err.is_empty());
}

#[test]
fn diff_validates_both_graphs_first() {
    let dir = tempfile::tempdir().unwrap();
    let broken = invalid_file(&dir);
    let (code, out, err) = run_line(&["diff", broken.to_str().unwrap(), broken.to_str().unwrap()]);
    assert_eq!(code, EXIT_INVALID);
    assert!(out.is_empty());
    // Both named, each with its problems.
    let header = format!("{}: invalid graph", broken.display());
    assert_eq!(err.matches(&header).count(), 2, "{err}");
    assert!(err.contains("error[DuplicateNode]"), "{err}");

    let (code, out, err) = run_line(&[
        "diff",
        sample("sequence.yaml").to_str().unwrap(),
        "/nonexistent/new.yaml",
    ]);
    assert_eq!(code, EXIT_ERROR);
    assert!(
        out.is_empty() && err.contains("cannot read /nonexistent/new.yaml"),
        "{err}"
    );
    let (code, _, err) = run_line(&["diff", "-", "-"]);
    assert_eq!(code, EXIT_ERROR);
    assert!(err.contains("cannot both be standard input"), "{err}");
    assert!(
        Cli::try_parse_from([
            "raypipe", "dag", "diff", "a.yaml", "b.yaml", "--output", "xml"
        ])
        .is_err()
    );
}

#[test]
fn render_options_collect_overrides() {
    let cli = Cli::try_parse_from([
        "raypipe",
        "dag",
        "render",
        "g.yaml",
        "--replicas",
        "a=2",
        "--max-ongoing-requests",
        "a=9",
        "--replicas",
        "b=1",
    ])
    .unwrap();
    let Command::Dag(DagCommand::Render(args)) = cli.command else {
        panic!()
    };
    let opts = render_options(&args);
    assert_eq!(
        opts.node_overrides["a"],
        NodeOverride {
            num_replicas: Some(2),
            max_ongoing_requests: Some(9)
        }
    );
    assert_eq!(opts.node_overrides["b"].num_replicas, Some(1));
    assert_eq!(opts.runtime_import_path, serve::DEFAULT_RUNTIME_IMPORT_PATH);
}
