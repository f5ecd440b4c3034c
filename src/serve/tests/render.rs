//! Serve rendering tests.

use std::collections::BTreeSet;

use crate::graph::{ValidatedGraph, from_yaml, validate};
use crate::serve::*;

fn sample(name: &str) -> ValidatedGraph {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("samples/graphs")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    validate(from_yaml(&text).unwrap()).unwrap()
}

fn app(config: &ServeConfig) -> &Application {
    assert_eq!(config.applications.len(), 1);
    &config.applications[0]
}

fn deployment<'a>(config: &'a ServeConfig, name: &str) -> &'a Deployment {
    app(config)
        .deployments
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("no deployment {name}"))
}

#[test]
fn one_application_with_the_runtime_builder_and_the_graph_as_args() {
    let graph = sample("sequence.yaml");
    let config = render(&graph, &RenderOptions::default()).unwrap();
    let app = app(&config);
    assert_eq!(app.name, "sequence");
    assert_eq!(app.route_prefix.as_deref(), Some("/sequence"));
    assert_eq!(app.import_path, DEFAULT_RUNTIME_IMPORT_PATH);
    assert_eq!(app.args.api_version, RUNTIME_ARGS_API_VERSION);
    assert_eq!(app.args.executor_deployment, DEFAULT_EXECUTOR_DEPLOYMENT);
    assert_eq!(app.args.graph.graph().nodes.len(), 4);
    assert_eq!(app.args.graph.graph().edges, graph.graph().edges);
    let names: Vec<&str> = app.deployments.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["classify", "preprocess", "raypipe-executor"],
        "sorted, models plus the executor"
    );
    assert_eq!(config.http_options, None);
    assert_eq!(config.proxy_location, None);
}

#[test]
fn deployment_options_go_to_deployments_not_args() {
    let graph = sample("sequence.yaml");
    let config = render(&graph, &RenderOptions::default()).unwrap();
    let classify = deployment(&config, "classify");
    assert_eq!(classify.num_replicas, Some(NumReplicas::Count(1)));
    assert_eq!(classify.max_ongoing_requests, Some(16));
    assert!(classify.user_config.is_some());
    assert_eq!(
        classify.ray_actor_options.as_ref().unwrap().num_cpus,
        Some(0.1)
    );
    let args_yaml = serde_yaml::to_string(&app(&config).args).unwrap();
    // What the runtime reads back has no deployment options at all.
    let read: RuntimeArgs = serde_yaml::from_str(&args_yaml).unwrap();
    let args = read.graph.graph();
    assert!(args.route_prefix.is_empty() && args.runtime_env.is_none() && args.executor.is_none());
    for node in &args.nodes {
        if let Some(crate::graph::proto::node::Kind::Model(model)) = &node.kind {
            assert_eq!(model.deployment, None, "{}", node.name);
        }
    }
    assert_eq!(
        read,
        app(&config).args,
        "wiring equality ignores what is not written"
    );
    for absent in [
        "num_replicas",
        "user_config",
        "route_prefix",
        "runtime_env",
        "ray_actor_options",
        "description",
    ] {
        assert!(
            !args_yaml.contains(absent),
            "{absent} leaked into args:\n{args_yaml}"
        );
    }
    assert!(args_yaml.contains("import_path: samples.models:Classifier"));
    assert!(args_yaml.contains("retry_on:"));
}

#[test]
fn changing_only_deployment_options_leaves_args_unchanged() {
    // Ray rebuilds the whole application when `args` change; scaling a node must not.
    let graph = sample("ensemble.yaml");
    let before = render(&graph, &RenderOptions::default()).unwrap();
    let mut edited = graph.graph().clone();
    for node in &mut edited.nodes {
        if let Some(crate::graph::proto::node::Kind::Model(model)) = &mut node.kind {
            model
                .deployment
                .get_or_insert_with(Default::default)
                .max_ongoing_requests = Some(32);
        }
        node.description = "edited".into();
    }
    let after = render(&validate(edited).unwrap(), &RenderOptions::default()).unwrap();
    let text = |config: &ServeConfig| serde_yaml::to_string(&app(config).args).unwrap();
    assert_eq!(text(&before), text(&after));
    assert_ne!(app(&before).deployments, app(&after).deployments);
}

#[test]
fn model_nodes_get_a_bounded_queue_by_default() {
    let queued = |config: &ServeConfig, name: &str| deployment(config, name).max_queued_requests;
    let config = render(&sample("sequence.yaml"), &RenderOptions::default()).unwrap();
    // Serve's default concurrency (5) when the node sets none, else the node's own.
    assert_eq!(queued(&config, "preprocess"), Some(20));
    assert_eq!(queued(&config, "classify"), Some(64));
    assert_eq!(
        queued(&config, DEFAULT_EXECUTOR_DEPLOYMENT),
        Some(400),
        "the executor (which runs fused nodes) is bounded too: 4 × its concurrency of 100"
    );

    // An operator's max_ongoing_requests override moves the default with it.
    let mut opts = RenderOptions::default();
    opts.node_overrides.insert(
        "preprocess".into(),
        NodeOverride {
            num_replicas: None,
            max_ongoing_requests: Some(8),
        },
    );
    assert_eq!(
        queued(
            &render(&sample("sequence.yaml"), &opts).unwrap(),
            "preprocess"
        ),
        Some(32)
    );

    // The graph's own value wins, -1 (unbounded) included; huge concurrency saturates.
    let mut edited = sample("sequence.yaml").graph().clone();
    for node in &mut edited.nodes {
        if let Some(crate::graph::proto::node::Kind::Model(model)) = &mut node.kind {
            let options = model.deployment.get_or_insert_with(Default::default);
            match node.name.as_str() {
                "preprocess" => options.max_queued_requests = Some(-1),
                "classify" => options.max_ongoing_requests = Some(1_000_000_000),
                _ => {}
            }
        }
    }
    let config = render(&validate(edited).unwrap(), &RenderOptions::default()).unwrap();
    assert_eq!(queued(&config, "preprocess"), Some(-1));
    assert_eq!(queued(&config, "classify"), Some(i32::MAX));
    assert!(config.to_json().contains("\"max_queued_requests\":-1"));
}

#[test]
fn autoscaling_renders_as_auto() {
    let config = render(&sample("ensemble.yaml"), &RenderOptions::default()).unwrap();
    let model_a = deployment(&config, "model_a");
    assert_eq!(model_a.num_replicas, Some(NumReplicas::Auto));
    let autoscaling = model_a.autoscaling_config.as_ref().unwrap();
    assert_eq!(
        (autoscaling.min_replicas, autoscaling.max_replicas),
        (Some(1), Some(4))
    );
    assert_eq!(autoscaling.target_ongoing_requests, Some(4.0));
    assert!(config.to_yaml().contains("num_replicas: auto"));
}

#[test]
fn options_override_graph_values() {
    let graph = sample("ensemble.yaml");
    let mut opts = RenderOptions {
        application_name: Some("fraud".into()),
        route_prefix: Some("/fraud".into()),
        runtime_import_path: "rt.app:build".into(),
        runtime_py_modules: vec!["http://127.0.0.1:9000/runtime-abc.zip".into()],
        executor_deployment: "Executor".into(),
        request_timeout_s: Some(20.0),
        keep_alive_timeout_s: Some(30),
        http_host: Some("127.0.0.1".into()),
        http_port: Some(8123),
        proxy_location: Some(ProxyLocation::HeadOnly),
        ..RenderOptions::default()
    };
    opts.node_overrides.insert(
        "model_a".into(),
        NodeOverride {
            num_replicas: Some(3),
            max_ongoing_requests: Some(8),
        },
    );
    let config = render(&graph, &opts).unwrap();
    let app = app(&config);
    assert_eq!(app.name, "fraud");
    assert_eq!(app.route_prefix.as_deref(), Some("/fraud"));
    assert_eq!(app.import_path, "rt.app:build");
    assert_eq!(app.args.executor_deployment, "Executor");
    assert_eq!(
        app.runtime_env.as_ref().unwrap().py_modules,
        ["http://127.0.0.1:9000/runtime-abc.zip"]
    );
    let http = config.http_options.as_ref().unwrap();
    assert_eq!(
        (
            http.host.as_deref(),
            http.port,
            http.request_timeout_s,
            http.keep_alive_timeout_s
        ),
        (Some("127.0.0.1"), Some(8123), Some(20.0), Some(30))
    );
    assert_eq!(config.proxy_location, Some(ProxyLocation::HeadOnly));
    let model_a = deployment(&config, "model_a");
    assert_eq!(model_a.num_replicas, Some(NumReplicas::Count(3)));
    assert_eq!(
        model_a.autoscaling_config, None,
        "a pinned count turns autoscaling off"
    );
    assert_eq!(model_a.max_ongoing_requests, Some(8));
    assert!(deployment(&config, "Executor").ray_actor_options.is_some());
}

#[test]
fn runtime_env_merges_graph_and_runtime_without_duplicates() {
    let yaml = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/graphs/sequence.yaml"),
    )
    .unwrap();
    let yaml = format!(
        "{yaml}runtime_env:\n  py_modules: [\"https://models.example/m.zip\", \"http://rt/r.zip\"]\n  env_vars: {{MODE: fast}}\n  pip: [numpy]\n"
    );
    let graph = validate(from_yaml(&yaml).unwrap()).unwrap();
    let opts = RenderOptions {
        runtime_py_modules: vec!["http://rt/r.zip".into(), "http://rt/extra.zip".into()],
        ..RenderOptions::default()
    };
    let config = render(&graph, &opts).unwrap();
    let env = app(&config).runtime_env.as_ref().unwrap();
    assert_eq!(
        env.py_modules,
        [
            "https://models.example/m.zip",
            "http://rt/r.zip",
            "http://rt/extra.zip"
        ]
    );
    assert_eq!(env.env_vars.get("MODE").map(String::as_str), Some("fast"));
    assert_eq!(env.pip, ["numpy"]);
}

#[test]
fn a_deployments_own_py_modules_keep_the_applications() {
    let yaml = r#"
name: own-modules
ingress: request
runtime_env: {py_modules: ["https://models.example/graph.zip"]}
nodes:
  - {name: request, input: {}}
  - name: extra
    model:
      import_path: samples.models:M
      deployment:
        ray_actor_options: {runtime_env: {py_modules: ["s3://bucket/extra.zip", "http://rt/r.zip"]}}
  - name: plain
    model:
      import_path: samples.models:M
      deployment:
        ray_actor_options: {runtime_env: {env_vars: {A: b}}}
  - {name: response, output: {}}
edges:
  - {source: request, target: extra}
  - {source: extra, target: plain}
  - {source: plain, target: response}
executor: {ray_actor_options: {runtime_env: {py_modules: ["https://x/executor.zip"]}}}
"#;
    let graph = validate(from_yaml(yaml).unwrap()).unwrap();
    let opts = RenderOptions {
        code_py_modules: vec!["http://operator/code.zip".into()],
        runtime_py_modules: vec!["http://rt/r.zip".into()],
        ..RenderOptions::default()
    };
    let config = render(&graph, &opts).unwrap();
    let modules = |name: &str| {
        let env = deployment(&config, name)
            .ray_actor_options
            .as_ref()
            .and_then(|a| a.runtime_env.as_ref())
            .unwrap();
        (env.py_modules.clone(), env.env_vars.clone())
    };
    // Serve would replace the application's modules with these: the node's first, then the
    // graph's, the code layer and the runtime's, each once.
    assert_eq!(
        modules("extra").0,
        [
            "s3://bucket/extra.zip",
            "http://rt/r.zip",
            "https://models.example/graph.zip",
            "http://operator/code.zip"
        ]
    );
    assert_eq!(
        modules("raypipe-executor").0,
        [
            "https://x/executor.zip",
            "https://models.example/graph.zip",
            "http://operator/code.zip",
            "http://rt/r.zip"
        ]
    );
    // Without modules of its own a deployment inherits the application's (Serve merges env_vars).
    let (plain_modules, plain_vars) = modules("plain");
    assert!(plain_modules.is_empty(), "{plain_modules:?}");
    assert_eq!(plain_vars.get("A").map(String::as_str), Some("b"));
    assert_eq!(
        app(&config).runtime_env.as_ref().unwrap().py_modules,
        [
            "https://models.example/graph.zip",
            "http://operator/code.zip",
            "http://rt/r.zip"
        ]
    );
}

#[test]
fn rendering_is_deterministic() {
    for name in ["sequence.yaml", "ensemble.yaml", "switch-canary.yaml"] {
        let first = render(&sample(name), &RenderOptions::default())
            .unwrap()
            .to_yaml();
        let second = render(&sample(name), &RenderOptions::default())
            .unwrap()
            .to_yaml();
        assert_eq!(first, second, "{name}");
    }
}

#[test]
fn yaml_and_json_read_back() {
    let config = render(&sample("switch-canary.yaml"), &RenderOptions::default()).unwrap();
    assert_eq!(ServeConfig::from_yaml(&config.to_yaml()).unwrap(), config);
    let json: ServeConfig = serde_json::from_str(&config.to_json()).unwrap();
    assert_eq!(json, config);
}

/// Keys Ray 2.60's schema knows (reference/ray-serve-api.md §1): Ray silently drops anything
/// else, so a typo here would be a silent misconfiguration.
#[test]
fn only_keys_ray_knows_are_emitted() {
    const TOP: &[&str] = &[
        "proxy_location",
        "http_options",
        "grpc_options",
        "logging_config",
        "applications",
        "target_capacity",
    ];
    const HTTP: &[&str] = &[
        "host",
        "port",
        "root_path",
        "request_timeout_s",
        "keep_alive_timeout_s",
    ];
    const APP: &[&str] = &[
        "name",
        "route_prefix",
        "import_path",
        "runtime_env",
        "args",
        "deployments",
        "logging_config",
    ];
    const DEPLOYMENT: &[&str] = &[
        "name",
        "num_replicas",
        "max_ongoing_requests",
        "max_queued_requests",
        "user_config",
        "autoscaling_config",
        "graceful_shutdown_wait_loop_s",
        "graceful_shutdown_timeout_s",
        "health_check_period_s",
        "health_check_timeout_s",
        "ray_actor_options",
        "placement_group_bundles",
        "placement_group_strategy",
        "max_replicas_per_node",
        "logging_config",
    ];
    const ACTOR: &[&str] = &[
        "num_cpus",
        "num_gpus",
        "memory",
        "resources",
        "accelerator_type",
        "runtime_env",
        "label_selector",
    ];
    const AUTOSCALING: &[&str] = &[
        "min_replicas",
        "max_replicas",
        "initial_replicas",
        "target_ongoing_requests",
        "upscale_delay_s",
        "downscale_delay_s",
        "downscale_to_zero_delay_s",
        "upscaling_factor",
        "downscaling_factor",
        "look_back_period_s",
        "aggregation_function",
    ];
    const RUNTIME_ENV: &[&str] = &["working_dir", "py_modules", "pip", "env_vars"];
    const LOGGING: &[&str] = &["encoding", "log_level", "logs_dir", "enable_access_log"];

    fn keys(value: &serde_json::Value) -> BTreeSet<String> {
        value
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
    fn assert_known(value: &serde_json::Value, known: &[&str], what: &str) {
        for key in keys(value) {
            assert!(
                known.contains(&key.as_str()),
                "{what} has unknown key {key}"
            );
        }
    }

    // A graph that sets every option raypipe can render.
    let yaml = r#"
name: everything
ingress: request
route_prefix: /all
runtime_env: {working_dir: "https://x/w.zip", py_modules: ["https://x/m.zip"], pip: [numpy], env_vars: {A: b}}
nodes:
  - {name: request, input: {}}
  - name: m
    model:
      import_path: samples.models:M
      deployment:
        autoscaling_config: {min_replicas: 0, max_replicas: 5, initial_replicas: 1, target_ongoing_requests: 2, upscale_delay_s: 1,
          downscale_delay_s: 2, downscale_to_zero_delay_s: 3, upscaling_factor: 1.5, downscaling_factor: 0.5, look_back_period_s: 10,
          aggregation_function: max}
        max_ongoing_requests: 8
        max_queued_requests: -1
        user_config: {t: 1}
        health_check_period_s: 5
        health_check_timeout_s: 6
        graceful_shutdown_wait_loop_s: 1
        graceful_shutdown_timeout_s: 9
        max_replicas_per_node: 2
        ray_actor_options: {num_cpus: 0.5, num_gpus: 1, memory: 1024, resources: {tpu: 1}, accelerator_type: A100,
          runtime_env: {env_vars: {B: c}}, label_selector: {zone: a}}
        logging_config: {encoding: JSON, log_level: DEBUG, enable_access_log: false}
  - {name: response, output: {}}
edges:
  - {source: request, target: m}
  - {source: m, target: response}
executor: {num_replicas: 2}
"#;
    let graph = validate(from_yaml(yaml).unwrap()).unwrap();
    let opts = RenderOptions {
        request_timeout_s: Some(60.0),
        keep_alive_timeout_s: Some(5),
        http_host: Some("0.0.0.0".into()),
        http_port: Some(8000),
        proxy_location: Some(ProxyLocation::EveryNode),
        ..RenderOptions::default()
    };
    let config: serde_json::Value =
        serde_json::from_str(&render(&graph, &opts).unwrap().to_json()).unwrap();
    assert_known(&config, TOP, "the config");
    assert_known(&config["http_options"], HTTP, "http_options");
    for app in config["applications"].as_array().unwrap() {
        assert_known(app, APP, "an application");
        assert_known(&app["runtime_env"], RUNTIME_ENV, "runtime_env");
        for deployment in app["deployments"].as_array().unwrap() {
            assert_known(deployment, DEPLOYMENT, "a deployment");
            assert_known(
                &deployment["autoscaling_config"],
                AUTOSCALING,
                "autoscaling_config",
            );
            assert_known(&deployment["ray_actor_options"], ACTOR, "ray_actor_options");
            assert_known(
                &deployment["ray_actor_options"]["runtime_env"],
                RUNTIME_ENV,
                "actor runtime_env",
            );
            assert_known(&deployment["logging_config"], LOGGING, "logging_config");
        }
    }
    let m = &config["applications"][0]["deployments"][0];
    assert_eq!(m["name"], "m");
    assert_eq!(m["num_replicas"], "auto");
    assert_eq!(m["ray_actor_options"]["memory"], 1024);
    assert_eq!(keys(m).len(), 13, "every option rendered: {m}");
}

#[test]
fn invalid_options_are_refused_with_a_reason() {
    let graph = sample("ensemble.yaml");
    let override_ = |name: &str, o: NodeOverride| {
        let mut opts = RenderOptions::default();
        opts.node_overrides.insert(name.into(), o);
        opts
    };
    let cases: Vec<(RenderOptions, &str)> = vec![
        (
            RenderOptions {
                application_name: Some("bad name".into()),
                ..Default::default()
            },
            "InvalidApplicationName",
        ),
        (
            RenderOptions {
                application_name: Some(String::new()),
                ..Default::default()
            },
            "InvalidApplicationName",
        ),
        (
            RenderOptions {
                route_prefix: Some("api/".into()),
                ..Default::default()
            },
            "InvalidRoutePrefix",
        ),
        (
            RenderOptions {
                route_prefix: Some("/a/".into()),
                ..Default::default()
            },
            "InvalidRoutePrefix",
        ),
        (
            RenderOptions {
                runtime_import_path: "nomodule".into(),
                ..Default::default()
            },
            "InvalidRuntime",
        ),
        (
            RenderOptions {
                runtime_py_modules: vec!["/tmp/runtime.zip".into()],
                ..Default::default()
            },
            "InvalidRuntime",
        ),
        (
            RenderOptions {
                executor_deployment: "model_a".into(),
                ..Default::default()
            },
            "InvalidExecutorName",
        ),
        (
            RenderOptions {
                executor_deployment: "a#b".into(),
                ..Default::default()
            },
            "InvalidExecutorName",
        ),
        (
            RenderOptions {
                request_timeout_s: Some(5.0),
                ..Default::default()
            },
            "InvalidHttpOptions",
        ),
        (
            RenderOptions {
                request_timeout_s: Some(-1.0),
                ..Default::default()
            },
            "InvalidHttpOptions",
        ),
        (
            RenderOptions {
                keep_alive_timeout_s: Some(0),
                ..Default::default()
            },
            "InvalidHttpOptions",
        ),
        (
            RenderOptions {
                http_port: Some(0),
                ..Default::default()
            },
            "InvalidHttpOptions",
        ),
        (
            override_(
                "ghost",
                NodeOverride {
                    num_replicas: Some(1),
                    ..Default::default()
                },
            ),
            "InvalidOverride",
        ),
        (
            override_(
                "request",
                NodeOverride {
                    num_replicas: Some(1),
                    ..Default::default()
                },
            ),
            "InvalidOverride",
        ),
        (
            override_(
                "model_b",
                NodeOverride {
                    num_replicas: Some(0),
                    ..Default::default()
                },
            ),
            "InvalidOverride",
        ),
        (
            override_(
                "model_a",
                NodeOverride {
                    max_ongoing_requests: Some(2),
                    ..Default::default()
                },
            ),
            "InvalidOverride",
        ),
    ];
    for (opts, reason) in cases {
        let error = render(&graph, &opts).expect_err(&format!("{opts:?} accepted"));
        assert_eq!(error.reason(), reason, "{error}");
        assert!(!error.to_string().is_empty());
    }
}

#[test]
fn request_timeout_error_names_both_numbers() {
    let graph = sample("ensemble.yaml");
    let error = render(
        &graph,
        &RenderOptions {
            request_timeout_s: Some(5.0),
            ..Default::default()
        },
    )
    .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("5 s") && text.contains("15000 ms"), "{text}");
}

#[test]
fn default_application_name_and_route() {
    let yaml = "ingress: r\nnodes: [{name: r, input: {}}, {name: m, model: {import_path: a.b:C}}, {name: o, output: {}}]\nedges: [{source: r, target: m}, {source: m, target: o}]\n";
    let config = render(
        &validate(from_yaml(yaml).unwrap()).unwrap(),
        &RenderOptions::default(),
    )
    .unwrap();
    assert_eq!(app(&config).name, DEFAULT_APPLICATION_NAME);
    assert_eq!(app(&config).route_prefix.as_deref(), Some("/"));
    assert_eq!(app(&config).runtime_env, None);
    let executor = deployment(&config, DEFAULT_EXECUTOR_DEPLOYMENT);
    assert_eq!(
        executor,
        &Deployment {
            name: DEFAULT_EXECUTOR_DEPLOYMENT.into(),
            // The runtime's executor concurrency, written out, and a queue bounded like a
            // model node's: 4 × that.
            max_ongoing_requests: Some(EXECUTOR_MAX_ONGOING_REQUESTS),
            max_queued_requests: Some(400),
            ..Default::default()
        }
    );
}

/// The executor concurrency raypipe renders is the runtime's own default.
#[test]
fn the_rendered_executor_concurrency_is_the_runtimes_default() {
    let app_py = include_str!("../../../runtime/raypipe_runtime/app.py");
    assert!(
        app_py.contains(&format!(
            "\nEXECUTOR_MAX_ONGOING_REQUESTS = {EXECUTOR_MAX_ONGOING_REQUESTS}\n"
        )),
        "runtime/raypipe_runtime/app.py's EXECUTOR_MAX_ONGOING_REQUESTS differs"
    );
}

/// Every deployment a graph renders has a bounded queue unless the graph says otherwise, the
/// executor (which runs fused nodes) included; the graph's own setting wins, -1 included.
#[test]
fn every_rendered_deployment_has_a_bounded_queue_unless_the_graph_says_otherwise() {
    let graph = |executor: &str| {
        format!(
            "ingress: r\nnodes: [{{name: r, input: {{}}}}, {{name: m, model: {{import_path: a.b:C}}}}, {{name: o, output: {{}}}}]\nedges: [{{source: r, target: m}}, {{source: m, target: o}}]\n{executor}"
        )
    };
    for sample_name in ["sequence.yaml", "ensemble.yaml"] {
        let config = render(&sample(sample_name), &RenderOptions::default()).unwrap();
        for deployment in &app(&config).deployments {
            assert!(
                deployment.max_queued_requests.is_some_and(|q| q > 0),
                "{sample_name}: {} has no bounded queue",
                deployment.name
            );
        }
    }
    let queued = |executor: &str| {
        let config = render(
            &validate(from_yaml(&graph(executor)).unwrap()).unwrap(),
            &RenderOptions::default(),
        )
        .unwrap();
        deployment(&config, DEFAULT_EXECUTOR_DEPLOYMENT).max_queued_requests
    };
    assert_eq!(queued(""), Some(400));
    assert_eq!(queued("executor: {max_ongoing_requests: 50}"), Some(200));
    assert_eq!(queued("executor: {max_queued_requests: 7}"), Some(7));
    assert_eq!(queued("executor: {max_queued_requests: -1}"), Some(-1));
}

#[test]
fn unknown_keys_are_refused_when_reading() {
    let config = render(&sample("sequence.yaml"), &RenderOptions::default()).unwrap();
    let yaml = config.to_yaml().replace(
        "  deployments:\n",
        "  deployments:\n  - name: x\n    max_concurent_queries: 3\n",
    );
    assert!(ServeConfig::from_yaml(&yaml).is_err());
}
