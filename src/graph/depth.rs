//! Message nesting depth of a decoded graph, counted as its protobuf encoding nests (and as
//! prost counts it when decoding: `PipelineGraph` is 1, each message field, list element and
//! map entry one more). Iterative, so the check itself cannot exhaust the stack; every other
//! recursive walk of a graph (JSON values, predicates, serde, rendering) runs only on graphs
//! this check passed, which bounds its depth.

use super::proto::{
    DeploymentOptions, JsonObject, JsonValue, PipelineGraph, Predicate, RuntimeEnv, json_value,
    node, predicate,
};

/// A part of the graph whose depth is not fixed by the schema.
enum Item<'a> {
    Json(&'a JsonValue),
    Object(&'a JsonObject),
    Predicate(&'a Predicate),
    Deployment(&'a DeploymentOptions),
    RuntimeEnv(&'a RuntimeEnv),
}

struct Walk<'a> {
    max: usize,
    deepest: usize,
    stack: Vec<(Item<'a>, usize)>,
}

impl<'a> Walk<'a> {
    /// A message at `level`: false when it is too deep.
    fn at(&mut self, level: usize) -> bool {
        self.deepest = self.deepest.max(level);
        level <= self.max
    }

    /// Walks one root item at `level` and everything under it.
    fn run(&mut self, root: Item<'a>, level: usize) -> bool {
        self.stack.clear();
        self.stack.push((root, level));
        while let Some((item, level)) = self.stack.pop() {
            if !self.at(level) {
                return false;
            }
            let ok = match item {
                Item::Json(value) => match &value.kind {
                    Some(json_value::Kind::ListValue(list)) => {
                        let ok = self.at(level + 1);
                        for value in &list.values {
                            self.stack.push((Item::Json(value), level + 2));
                        }
                        ok
                    }
                    Some(json_value::Kind::ObjectValue(object)) => {
                        self.stack.push((Item::Object(object), level + 1));
                        true
                    }
                    _ => true,
                },
                Item::Object(object) => {
                    let ok = object.fields.is_empty() || self.at(level + 1);
                    for value in object.fields.values() {
                        // A map value at its default is left out of the encoding.
                        if value.kind.is_some() {
                            self.stack.push((Item::Json(value), level + 2));
                        }
                    }
                    ok
                }
                Item::Predicate(predicate) => match &predicate.p {
                    None => true,
                    Some(predicate::P::Compare(compare)) => {
                        if let Some(value) = &compare.value {
                            self.stack.push((Item::Json(value), level + 2));
                        }
                        self.at(level + 1)
                    }
                    Some(predicate::P::AllOf(list) | predicate::P::AnyOf(list)) => {
                        for item in &list.items {
                            self.stack.push((Item::Predicate(item), level + 2));
                        }
                        self.at(level + 1)
                    }
                    Some(predicate::P::Negate(inner)) => {
                        self.stack.push((Item::Predicate(inner), level + 1));
                        true
                    }
                    Some(predicate::P::Some(q) | predicate::P::Every(q)) => {
                        if let Some(inner) = &q.inner {
                            self.stack.push((Item::Predicate(inner), level + 2));
                        }
                        self.at(level + 1)
                    }
                },
                Item::Deployment(options) => {
                    let mut ok = true;
                    if options.autoscaling_config.is_some() || options.logging_config.is_some() {
                        ok &= self.at(level + 1);
                    }
                    if let Some(user_config) = &options.user_config {
                        self.stack.push((Item::Object(user_config), level + 1));
                    }
                    if let Some(actor) = &options.ray_actor_options {
                        ok &= self.at(level + 1);
                        if !actor.resources.is_empty() || !actor.label_selector.is_empty() {
                            ok &= self.at(level + 2);
                        }
                        if let Some(env) = &actor.runtime_env {
                            self.stack.push((Item::RuntimeEnv(env), level + 2));
                        }
                    }
                    ok
                }
                Item::RuntimeEnv(env) => env.env_vars.is_empty() || self.at(level + 1),
            };
            if !ok {
                return false;
            }
        }
        true
    }
}

/// A message at a fixed `level`; `place` names it when it is too deep.
fn fixed(walk: &mut Walk<'_>, level: usize, place: &dyn Fn() -> String) -> Result<(), String> {
    if walk.at(level) { Ok(()) } else { Err(place()) }
}

/// An item and everything under it, from `level`.
fn rooted<'a>(
    walk: &mut Walk<'a>,
    item: Item<'a>,
    level: usize,
    place: &dyn Fn() -> String,
) -> Result<(), String> {
    if walk.run(item, level) {
        Ok(())
    } else {
        Err(place())
    }
}

/// The graph's nesting depth if it is at most `max`; otherwise `Err` with where the too-deep
/// value is (`nodes[3].input_template`).
pub(crate) fn check(graph: &PipelineGraph, max: usize) -> Result<usize, String> {
    let mut walk = Walk {
        max,
        deepest: 1,
        stack: Vec::new(),
    };
    if let Some(env) = &graph.runtime_env {
        rooted(&mut walk, Item::RuntimeEnv(env), 2, &|| {
            "runtime_env".into()
        })?;
    }
    if !graph.labels.is_empty() {
        fixed(&mut walk, 2, &|| "labels".into())?;
    }
    if let Some(executor) = &graph.executor {
        rooted(&mut walk, Item::Deployment(executor), 2, &|| {
            "executor".into()
        })?;
    }
    for (i, node) in graph.nodes.iter().enumerate() {
        let place = |field: &str| format!("nodes[{i}]{field}");
        fixed(&mut walk, 2, &|| place(""))?;
        if node.kind.is_some() {
            fixed(&mut walk, 3, &|| place(""))?;
        }
        if let Some(node::Kind::Model(model)) = &node.kind {
            for (j, arg) in model.init_args.iter().enumerate() {
                rooted(&mut walk, Item::Json(arg), 4, &|| {
                    place(&format!(".model.init_args[{j}]"))
                })?;
            }
            for (key, arg) in &model.init_kwargs {
                fixed(&mut walk, 4, &|| place(".model.init_kwargs"))?;
                if arg.kind.is_some() {
                    rooted(&mut walk, Item::Json(arg), 5, &|| {
                        place(&format!(".model.init_kwargs[{key:?}]"))
                    })?;
                }
            }
            if let Some(deployment) = &model.deployment {
                rooted(&mut walk, Item::Deployment(deployment), 4, &|| {
                    place(".model.deployment")
                })?;
            }
        }
        for (field, value) in [
            ("fallback_value", &node.fallback_value),
            ("input_template", &node.input_template),
        ] {
            if let Some(value) = value {
                rooted(&mut walk, Item::Json(value), 3, &|| {
                    place(&format!(".{field}"))
                })?;
            }
        }
        if node.retry.is_some() || node.shadow.is_some() {
            fixed(&mut walk, 3, &|| place(""))?;
        }
    }
    for (i, edge) in graph.edges.iter().enumerate() {
        let place = |field: &str| format!("edges[{i}]{field}");
        fixed(&mut walk, 2, &|| place(""))?;
        if let Some(tensors) = &edge.tensors {
            fixed(&mut walk, 3, &|| place(".tensors"))?;
            if !tensors.rename.is_empty() {
                fixed(&mut walk, 4, &|| place(".tensors.rename"))?;
            }
        }
        if let Some(value) = &edge.if_missing {
            rooted(&mut walk, Item::Json(value), 3, &|| place(".if_missing"))?;
        }
        if let Some(when) = &edge.when {
            rooted(&mut walk, Item::Predicate(when), 3, &|| place(".when"))?;
        }
    }
    Ok(walk.deepest)
}
