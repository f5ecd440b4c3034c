//! Model graph benchmark: decode + validate + render at 10, 1,000 and 100,000 nodes, and the
//! peak memory of that pipeline.
//!
//! `cargo bench --bench graph` (add `-- --quick` for a short run). Before the timings, the
//! bench re-runs itself once per size as a child process that reads only the encoded graph and
//! reports its resident-set growth (`VmRSS` before, `VmHWM` after, from /proc/self/status), so
//! the figure is the pipeline's own peak, not the generator's.
//!
//! The synthetic graph is shaped like a real pipeline, only longer: layers of models, each fed
//! by one to three models of the layer before (joins write under their source's name), a
//! switch with two branches merged by a join-ANY node every 50 layers, deployment options and
//! init arguments on every model.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use raypipe::graph::proto::{
    AutoscalingConfig, Compare, DeploymentOptions, Edge, InputNode, JsonValue, ModelNode, Node, Op,
    OutputNode, PipelineGraph, Predicate, RayActorOptions, SwitchNode, node, predicate,
};
use raypipe::graph::{decode, encode, validate};
use raypipe::serve::{RenderOptions, render};

const SIZES: [usize; 3] = [10, 1_000, 100_000];
const PROBE_ENV: &str = "RAYPIPE_BENCH_MEMORY_PROBE";

/// Deterministic pseudo-random numbers (no dependency needed for a fixed workload).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % bound.max(1)
    }
}

fn model(name: String, rng: &mut Lcg) -> Node {
    let autoscale = rng.next(4) == 0;
    let deployment = DeploymentOptions {
        num_replicas: (!autoscale).then_some(1 + rng.next(3) as i32),
        autoscaling_config: autoscale.then(|| AutoscalingConfig {
            min_replicas: Some(1),
            max_replicas: Some(8),
            target_ongoing_requests: Some(2.0),
            ..Default::default()
        }),
        max_ongoing_requests: Some(8),
        ray_actor_options: Some(RayActorOptions {
            num_cpus: Some(0.5),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut kwargs = BTreeMap::new();
    kwargs.insert("threshold".to_string(), JsonValue::number(0.5));
    kwargs.insert("label".to_string(), JsonValue::string(name.clone()));
    Node {
        name,
        kind: Some(node::Kind::Model(ModelNode {
            import_path: "samples.models:Classifier".into(),
            init_kwargs: kwargs,
            deployment: Some(Box::new(deployment)),
            ..Default::default()
        })),
        timeout_ms: 1_000,
        ..Default::default()
    }
}

fn edge(source: &str, target: &str) -> Edge {
    Edge {
        source: source.into(),
        target: target.into(),
        into: format!("/{source}"),
        ..Default::default()
    }
}

/// A valid graph of about `n` nodes.
fn synthetic(n: usize) -> PipelineGraph {
    let mut rng = Lcg(0x5eed);
    let width = ((n as f64).sqrt() as usize).clamp(1, 100);
    let mut nodes = vec![Node {
        name: "request".into(),
        kind: Some(node::Kind::Input(InputNode {})),
        ..Default::default()
    }];
    let mut edges = Vec::new();
    let mut previous = vec!["request".to_string()];
    let mut layer = 0;
    // One node is kept for the output.
    let remaining = |nodes: &Vec<Node>| n.max(3).saturating_sub(nodes.len() + 1);
    while remaining(&nodes) > 0 {
        layer += 1;
        if layer % 50 == 0 && previous.len() > 1 && remaining(&nodes) > 5 {
            // switch -> (a | b) -> merge (join ANY), fed by the first node of the last layer.
            let [s, a, b, m] = ["switch", "a", "b", "merge"].map(|k| format!("l{layer}-{k}"));
            nodes.push(Node {
                name: s.clone(),
                kind: Some(node::Kind::Switch(SwitchNode::default())),
                ..Default::default()
            });
            nodes.push(model(a.clone(), &mut rng));
            nodes.push(model(b.clone(), &mut rng));
            let mut merge = model(m.clone(), &mut rng);
            merge.join = 1;
            nodes.push(merge);
            edges.push(Edge {
                source: previous[0].clone(),
                target: s.clone(),
                ..Default::default()
            });
            let case = Compare {
                path: "/request/tier".into(),
                op: Op::Eq as i32,
                value: Some(JsonValue::string("gold")),
            };
            edges.push(Edge {
                source: s.clone(),
                target: a.clone(),
                when: Some(Box::new(Predicate {
                    p: Some(predicate::P::Compare(case)),
                })),
                ..Default::default()
            });
            edges.push(Edge {
                source: s,
                target: b.clone(),
                ..Default::default()
            });
            edges.push(Edge {
                source: a,
                target: m.clone(),
                ..Default::default()
            });
            edges.push(Edge {
                source: b,
                target: m.clone(),
                ..Default::default()
            });
            previous[0] = m;
        }
        let layer_width = width.min(remaining(&nodes));
        let mut current = Vec::with_capacity(layer_width);
        let mut read = vec![false; previous.len()];
        for i in 0..layer_width {
            let name = format!("l{layer}-m{i}");
            let fan_in = 1 + rng.next(3).min(previous.len() - 1);
            let first = rng.next(previous.len());
            for k in 0..fan_in {
                let source = (first + k) % previous.len();
                read[source] = true;
                edges.push(edge(&previous[source], &name));
            }
            nodes.push(model(name.clone(), &mut rng));
            current.push(name);
        }
        // Nodes of the last layer that nobody reads would be dead ends: feed them forward.
        for (i, name) in previous.iter().enumerate() {
            if !read[i] {
                edges.push(edge(name, &current[i % current.len()]));
            }
        }
        previous = current;
    }
    nodes.push(Node {
        name: "response".into(),
        kind: Some(node::Kind::Output(OutputNode {})),
        ..Default::default()
    });
    for name in &previous {
        edges.push(edge(name, "response"));
    }
    PipelineGraph {
        name: "synthetic".into(),
        version: "1".into(),
        ingress: "request".into(),
        route_prefix: "/synthetic".into(),
        nodes,
        edges,
        deadline_ms: 30_000,
        ..Default::default()
    }
}

/// decode + validate + render: what the controller does with fetched bytes.
fn pipeline(bytes: &[u8], opts: &RenderOptions) -> raypipe::serve::ServeConfig {
    let graph = decode(bytes).expect("the synthetic graph decodes");
    let valid = validate(graph).expect("the synthetic graph is valid");
    render(&valid, opts).expect("the synthetic graph renders")
}

fn status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Child side: read the encoded graph, run the pipeline (and the YAML), print the RSS growth.
fn probe(path: &str) {
    let bytes = std::fs::read(path).expect("probe input");
    let before = status_kb("VmRSS:");
    let config = pipeline(&bytes, &RenderOptions::default());
    let after_render = status_kb("VmHWM:");
    let yaml = config.to_yaml();
    let after_yaml = status_kb("VmHWM:");
    println!("{before} {after_render} {after_yaml} {}", yaml.len());
}

fn memory_report() {
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    eprintln!("peak memory (child process per size; RSS growth over the process's baseline):");
    eprintln!(
        "{:>8} {:>8} {:>12} {:>24} {:>24} {:>12}",
        "nodes",
        "edges",
        "protobuf",
        "decode+validate+render",
        "... + serveConfigV2 YAML",
        "YAML size"
    );
    for n in SIZES {
        let graph = synthetic(n);
        let bytes = encode(&graph).expect("a synthetic graph encodes");
        let path =
            std::env::temp_dir().join(format!("raypipe-bench-{n}-{}.pb", std::process::id()));
        if std::fs::write(&path, &bytes).is_err() {
            return;
        }
        let output = std::process::Command::new(&exe)
            .env(PROBE_ENV, &path)
            .output();
        let _ = std::fs::remove_file(&path);
        let Ok(output) = output else { return };
        let text = String::from_utf8_lossy(&output.stdout);
        let numbers: Vec<u64> = text
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        if let [before, render, yaml, yaml_len] = numbers[..] {
            eprintln!(
                "{:>8} {:>8} {:>9} KiB {:>20} KiB {:>20} KiB {:>8} KiB",
                graph.nodes.len(),
                graph.edges.len(),
                bytes.len() / 1024,
                render.saturating_sub(before),
                yaml.saturating_sub(before),
                yaml_len / 1024
            );
        }
    }
}

fn bench(c: &mut Criterion) {
    let opts = RenderOptions::default();
    let mut group = c.benchmark_group("graph");
    for n in SIZES {
        let graph = synthetic(n);
        let bytes = encode(&graph).expect("a synthetic graph encodes");
        let nodes = graph.nodes.len() as u64;
        group.throughput(Throughput::Elements(nodes));
        if n >= 100_000 {
            group
                .sample_size(10)
                .warm_up_time(Duration::from_secs(1))
                .measurement_time(Duration::from_secs(8));
        } else {
            group
                .sample_size(50)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(3));
        }
        group.bench_with_input(BenchmarkId::new("decode", n), &bytes, |b, bytes| {
            b.iter(|| decode(black_box(bytes)))
        });
        group.bench_with_input(BenchmarkId::new("validate", n), &graph, |b, graph| {
            b.iter_batched(
                || graph.clone(),
                |g| validate(black_box(g)),
                criterion::BatchSize::LargeInput,
            )
        });
        let valid = validate(graph.clone()).expect("the synthetic graph is valid");
        group.bench_with_input(BenchmarkId::new("render", n), &valid, |b, valid| {
            b.iter(|| render(black_box(valid), &opts))
        });
        group.bench_with_input(
            BenchmarkId::new("decode_validate_render", n),
            &bytes,
            |b, bytes| b.iter(|| pipeline(black_box(bytes), &opts)),
        );
        let config = render(&valid, &opts).expect("the synthetic graph renders");
        group.bench_with_input(BenchmarkId::new("to_yaml", n), &config, |b, config| {
            b.iter(|| black_box(config).to_yaml())
        });
    }
    group.finish();
}

fn main() {
    if let Ok(path) = std::env::var(PROBE_ENV) {
        probe(&path);
        return;
    }
    memory_report();
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
}
