//! Graph validation, fields and nodes: the graph-level fields (version, deadline, route prefix,
//! headers, labels), each node by kind with its deployment options and retry policy, and
//! finding the one ingress and the one output.

use crate::graph::errors::{Location, ValidationError};
use crate::graph::proto::{
    CallStyle, DeploymentOptions, JoinMode, JsonValue, NoMatch, Node, OnError, RetryOn, json_value,
    node,
};
use crate::graph::{options, pointer};

use super::{
    Checker, MAX_DEADLINE_MS, MAX_HEADERS, MAX_RETRY_ATTEMPTS, MAX_VERSION_LEN, NONE,
    check_node_name, check_route_prefix, effective_deadline, is_dns_label, is_http_token_byte,
    json_value_is_finite, kind_article,
};

impl<'g, 'e> Checker<'g, 'e> {
    // -- graph-level fields --------------------------------------------------------------------

    pub(super) fn check_graph_fields(&mut self) {
        let graph = self.graph;
        if !graph.name.is_empty() && !is_dns_label(&graph.name) {
            self.push(ValidationError::InvalidGraphName {
                name: graph.name.clone(),
            });
        }
        if graph.version.len() > MAX_VERSION_LEN {
            self.push(ValidationError::InvalidVersion {
                version: graph.version.chars().take(32).collect::<String>() + "...",
                problem: "is longer than 128 characters",
            });
        } else if graph.version.chars().any(char::is_control) {
            self.push(ValidationError::InvalidVersion {
                version: graph.version.clone(),
                problem: "contains control characters",
            });
        }
        if !graph.route_prefix.is_empty()
            && let Err(problem) = check_route_prefix(&graph.route_prefix)
        {
            self.push(ValidationError::InvalidRoutePrefix {
                prefix: graph.route_prefix.clone(),
                problem,
            });
        }
        if let Some(env) = &graph.runtime_env {
            for problem in options::runtime_env_problems(env) {
                self.push(ValidationError::InvalidRuntimeEnv {
                    location: Location::Graph,
                    problem,
                });
            }
        }
        if graph.deadline_ms > MAX_DEADLINE_MS {
            self.push(ValidationError::DeadlineTooLong {
                deadline_ms: graph.deadline_ms,
                limit: MAX_DEADLINE_MS,
            });
        }
        if graph.forward_headers.len() > MAX_HEADERS {
            self.push(ValidationError::LimitExceeded {
                what: "forward_headers",
                count: graph.forward_headers.len(),
                limit: MAX_HEADERS,
            });
        }
        for header in &graph.forward_headers {
            if header.is_empty() || !header.bytes().all(is_http_token_byte) {
                self.push(ValidationError::InvalidOption {
                    location: Location::Graph,
                    field: "forward_headers".into(),
                    problem: format!("has {header:?}, which is not an HTTP header name"),
                });
            }
        }
        if graph.labels.len() > MAX_HEADERS {
            self.push(ValidationError::LimitExceeded {
                what: "labels",
                count: graph.labels.len(),
                limit: MAX_HEADERS,
            });
        }
        if let Some(executor) = &graph.executor {
            let mut found = Vec::new();
            options::check_deployment(executor, &mut found);
            for (field, problem) in found {
                self.push(option_error(Location::Executor, field, problem));
            }
        }
    }

    // -- nodes -----------------------------------------------------------------------------------

    pub(super) fn index_nodes(&mut self) {
        let graph = self.graph;
        for (index, node) in graph.nodes.iter().enumerate() {
            if let Err(problem) = check_node_name(&node.name) {
                self.push(ValidationError::InvalidNodeName {
                    index,
                    name: node.name.clone(),
                    problem,
                });
            }
            match self.names.get(node.name.as_str()) {
                Some(&first) => {
                    self.duplicate[index] = true;
                    self.errors.push(ValidationError::DuplicateNode {
                        name: node.name.clone(),
                        index,
                        first_index: first as usize,
                    });
                }
                None => {
                    self.names.insert(node.name.as_str(), index as u32);
                }
            }
        }
    }

    pub(super) fn check_nodes(&mut self) {
        let graph = self.graph;
        let deadline = effective_deadline(graph);
        for node in &graph.nodes {
            let name = &node.name;
            let location = || Location::Node(name.clone());
            let Some(kind) = &node.kind else {
                self.push(ValidationError::MissingKind { node: name.clone() });
                continue;
            };
            self.check_enum::<JoinMode>(location, "join", node.join);
            self.check_enum::<OnError>(location, "on_error", node.on_error);

            // Settings that mean nothing for this kind of node are mistakes worth reporting.
            let kind_name = kind_article(&node.kind);
            let ineffective = |field: &'static str| ValidationError::IneffectiveSetting {
                node: name.clone(),
                kind: kind_name,
                field,
            };
            let is_input = matches!(kind, node::Kind::Input(_));
            let is_output = matches!(kind, node::Kind::Output(_));
            let is_model = matches!(kind, node::Kind::Model(_));
            let mut found = Vec::new();
            if is_input && node.join != JoinMode::All as i32 {
                found.push(ineffective("join"));
            }
            if (is_input || is_output) && node.on_error != OnError::Fail as i32 {
                found.push(ineffective("on_error"));
            }
            if (is_input || is_output) && node.fallback_value.is_some() {
                found.push(ineffective("fallback_value"));
            }
            if !is_model && node.timeout_ms != 0 {
                found.push(ineffective("timeout_ms"));
            }
            if !is_model && node.retry.is_some() {
                found.push(ineffective("retry"));
            }
            if !is_model && node.shadow.is_some() {
                found.push(ineffective("shadow"));
            }
            if is_input && node.input_template.is_some() {
                found.push(ineffective("input_template"));
            }
            self.errors.extend(found);

            if !is_input && !is_output {
                let fallback = node.on_error == OnError::Fallback as i32;
                match (fallback, node.fallback_value.is_some()) {
                    (true, false) => {
                        self.push(ValidationError::FallbackWithoutValue { node: name.clone() })
                    }
                    (false, true) => {
                        self.push(ValidationError::FallbackValueUnused { node: name.clone() })
                    }
                    _ => {}
                }
            }
            if let Some(value) = &node.fallback_value {
                self.check_finite(location, || "fallback_value".into(), value);
            }
            if let Some(value) = &node.input_template {
                self.check_finite(location, || "input_template".into(), value);
            }
            if is_model && node.timeout_ms > deadline {
                self.push(ValidationError::TimeoutOverDeadline {
                    node: name.clone(),
                    timeout_ms: node.timeout_ms,
                    deadline_ms: deadline,
                });
            }
            if let (true, Some(shadow)) = (is_model, &node.shadow)
                && let Some(percent) = shadow.sample_percent
                && !(1..=100).contains(&percent)
            {
                self.push(ValidationError::InvalidShadowSample {
                    node: name.clone(),
                    percent,
                });
            }
            if let (true, Some(retry)) = (is_model, &node.retry) {
                self.check_retry(name, retry);
            }

            match kind {
                node::Kind::Model(model) => self.check_model(name, node, model),
                node::Kind::Switch(switch) => {
                    self.check_enum::<NoMatch>(location, "switch.on_no_match", switch.on_no_match)
                }
                node::Kind::Split(split) => {
                    if let Err(problem) = pointer::check(&split.sticky_key) {
                        self.push(ValidationError::InvalidPointer {
                            location: location(),
                            field: "split.sticky_key",
                            pointer: split.sticky_key.clone(),
                            problem,
                        });
                    }
                }
                node::Kind::Input(_) | node::Kind::Output(_) => {}
            }
        }
    }

    pub(super) fn check_model(
        &mut self,
        name: &str,
        node: &Node,
        model: &crate::graph::proto::ModelNode,
    ) {
        if let Err(problem) = options::check_import_path(&model.import_path) {
            self.push(ValidationError::InvalidImportPath {
                node: name.to_string(),
                path: model.import_path.clone(),
                problem,
            });
        }
        let location = || Location::Node(name.to_string());
        self.check_enum::<CallStyle>(location, "model.call_style", model.call_style);
        if !model.method.is_empty() && !options::is_python_identifier(&model.method) {
            self.push(option_error(
                Location::Node(name.to_string()),
                "model.method".into(),
                format!("{:?} is not a Python method name", model.method),
            ));
        }
        for (i, arg) in model.init_args.iter().enumerate() {
            self.check_finite(location, || format!("model.init_args[{i}]"), arg);
        }
        for (key, arg) in &model.init_kwargs {
            if !options::is_python_identifier(key) {
                self.push(option_error(
                    Location::Node(name.to_string()),
                    "model.init_kwargs".into(),
                    format!("has the key {key:?}, which is not a Python identifier"),
                ));
            }
            self.check_finite(location, || format!("model.init_kwargs.{key}"), arg);
        }
        if model.call_style == CallStyle::Kwargs as i32
            && let Some(template) = &node.input_template
        {
            let keys_ok = match &template.kind {
                Some(json_value::Kind::ObjectValue(object)) => object
                    .fields
                    .keys()
                    .all(|k| options::is_python_identifier(k)),
                _ => false,
            };
            if !keys_ok {
                self.push(option_error(
                        Location::Node(name.to_string()),
                        "input_template".into(),
                        "must be an object whose keys are Python identifiers, because the node is called with keyword arguments".into(),
                    ));
            }
        }
        if let Some(deployment) = &model.deployment {
            let mut found = Vec::new();
            options::check_deployment(deployment, &mut found);
            // `found` stays empty (no allocation) for valid options.
            for (field, problem) in found {
                self.push(option_error(
                    Location::Node(name.to_string()),
                    format!("deployment.{field}"),
                    problem,
                ));
            }
        }
        // `fuse: true` asks for something the graph cannot give; saying so beats a node that
        // silently stays a deployment (or silently stays unfused).
        if model.fuse == Some(true) {
            let has_options = model
                .deployment
                .as_deref()
                .is_some_and(|options| *options != DeploymentOptions::default());
            let problem = if has_options {
                Some(
                    "is true, but the node has deployment options of its own; a fused node runs inside the executor's replicas and takes none: remove the options or `fuse: true`",
                )
            } else if self.graph.fuse == Some(false) {
                Some(
                    "is true, but the graph turns fusion off (fuse: false at the top): remove one of the two",
                )
            } else {
                None
            };
            if let Some(problem) = problem {
                self.push(option_error(
                    Location::Node(name.to_string()),
                    "model.fuse".into(),
                    problem.into(),
                ));
            }
        }
    }

    pub(super) fn check_retry(&mut self, name: &str, retry: &crate::graph::proto::Retry) {
        let node = name.to_string();
        if retry.attempts > MAX_RETRY_ATTEMPTS {
            self.push(ValidationError::InvalidRetry {
                node: node.clone(),
                problem: format!(
                    "attempts is {}, more than the limit of {MAX_RETRY_ATTEMPTS}",
                    retry.attempts
                ),
            });
        }
        let initial = if retry.initial_backoff_ms == 0 {
            50
        } else {
            retry.initial_backoff_ms
        };
        let max = if retry.max_backoff_ms == 0 {
            2000
        } else {
            retry.max_backoff_ms
        };
        if max < initial {
            self.push(ValidationError::InvalidRetry {
                node: node.clone(),
                problem: format!(
                    "max_backoff_ms ({max}) is less than initial_backoff_ms ({initial})"
                ),
            });
        }
        for &class in &retry.retry_on {
            match RetryOn::try_from(class) {
                Ok(RetryOn::Unspecified) => self.push(ValidationError::InvalidRetry {
                    node: node.clone(),
                    problem: "retry_on lists UNSPECIFIED; name UNAVAILABLE, BACKPRESSURE, TIMEOUT or APP_ERROR".into(),
                }),
                Ok(_) => {}
                Err(_) => self.push(ValidationError::UnknownEnumValue {
                    location: Location::Node(node.clone()),
                    field: "retry.retry_on",
                    value: class,
                }),
            }
        }
        if retry.attempts > 1 && retry.retry_on.is_empty() {
            self.push(ValidationError::InvalidRetry {
                node,
                problem: format!(
                    "allows {} attempts but retry_on is empty, so no failure would be retried; list the failure classes to retry",
                    retry.attempts
                ),
            });
        }
    }

    /// Lazy location (and field): the happy path of a 100,000-node graph allocates nothing.
    pub(super) fn check_enum<E: TryFrom<i32>>(
        &mut self,
        location: impl FnOnce() -> Location,
        field: &'static str,
        value: i32,
    ) {
        if E::try_from(value).is_err() {
            self.push(ValidationError::UnknownEnumValue {
                location: location(),
                field,
                value,
            });
        }
    }

    pub(super) fn check_finite(
        &mut self,
        location: impl FnOnce() -> Location,
        field: impl FnOnce() -> String,
        value: &JsonValue,
    ) {
        if !json_value_is_finite(value) {
            self.push(ValidationError::InvalidValue {
                location: location(),
                field: field(),
            });
        }
    }

    pub(super) fn find_ingress_and_output(&mut self) {
        let graph = self.graph;
        let inputs: Vec<u32> = (0..graph.nodes.len() as u32)
            .filter(|&i| matches!(self.node_kind(i), Some(node::Kind::Input(_))))
            .collect();
        if graph.ingress.is_empty() {
            let candidate = (inputs.len() == 1).then(|| self.node_name(inputs[0]).to_string());
            self.push(ValidationError::IngressUnset { candidate });
        } else {
            match self.names.get(graph.ingress.as_str()).copied() {
                None => self.push(ValidationError::IngressUnknown {
                    name: graph.ingress.clone(),
                }),
                Some(index) => match self.node_kind(index) {
                    Some(node::Kind::Input(_)) => self.ingress = index,
                    other => self.push(ValidationError::IngressNotInput {
                        name: graph.ingress.clone(),
                        kind: kind_article(other),
                    }),
                },
            }
        }
        for &input in &inputs {
            let is_ingress = self.node_name(input) == graph.ingress;
            if !is_ingress && !graph.ingress.is_empty() {
                self.push(ValidationError::ExtraInput {
                    node: self.node_name(input).to_string(),
                    ingress: graph.ingress.clone(),
                });
            }
        }
        for index in 0..graph.nodes.len() as u32 {
            if !matches!(self.node_kind(index), Some(node::Kind::Output(_))) {
                continue;
            }
            if self.output == NONE {
                self.output = index;
            } else {
                self.push(ValidationError::ExtraOutput {
                    node: self.node_name(index).to_string(),
                    first: self.node_name(self.output).to_string(),
                });
            }
        }
        if self.output == NONE {
            self.push(ValidationError::MissingOutput);
        }
    }
}

pub(super) fn option_error(location: Location, field: String, problem: String) -> ValidationError {
    ValidationError::InvalidOption {
        location,
        field,
        problem,
    }
}
