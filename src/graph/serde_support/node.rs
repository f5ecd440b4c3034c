//! Text form of `Node`: its oneof kind as one key beside the other fields (`model: {...}`),
//! unknown keys refused (serde's `flatten` would silently accept them). The runtime's view of a
//! node (`wiring`) is the same text without its description.

use serde::de::Deserializer;
use serde::ser::Serializer;
use serde::{Deserialize, Serialize, de};

use crate::graph::proto::{
    InputNode, JsonValue, ModelNode, Node, OutputNode, Retry, Shadow, SplitNode, SwitchNode, node,
};

use super::{enums, is_default, present, present_json};

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct NodeText {
    name: String,
    description: String,
    #[serde(deserialize_with = "present")]
    input: Option<InputNode>,
    #[serde(deserialize_with = "present")]
    model: Option<ModelNode>,
    #[serde(deserialize_with = "present")]
    switch: Option<SwitchNode>,
    #[serde(deserialize_with = "present")]
    split: Option<SplitNode>,
    #[serde(deserialize_with = "present")]
    output: Option<OutputNode>,
    #[serde(with = "enums::join_mode")]
    join: i32,
    #[serde(with = "enums::on_error")]
    on_error: i32,
    #[serde(deserialize_with = "present_json")]
    fallback_value: Option<JsonValue>,
    timeout_ms: u32,
    retry: Option<Retry>,
    #[serde(deserialize_with = "present")]
    shadow: Option<Shadow>,
    #[serde(deserialize_with = "present_json")]
    input_template: Option<JsonValue>,
}

#[derive(Serialize)]
pub(super) struct NodeTextRef<'a, M: Serialize> {
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    input: Option<&'a InputNode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<M>,
    #[serde(skip_serializing_if = "Option::is_none")]
    switch: Option<&'a SwitchNode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    split: Option<&'a SplitNode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a OutputNode>,
    #[serde(skip_serializing_if = "is_default", with = "enums::join_mode")]
    join: i32,
    #[serde(skip_serializing_if = "is_default", with = "enums::on_error")]
    on_error: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback_value: Option<&'a JsonValue>,
    #[serde(skip_serializing_if = "is_default")]
    timeout_ms: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry: Option<&'a Retry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shadow: Option<&'a Shadow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_template: Option<&'a JsonValue>,
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        node_text(self, false, |model| model).serialize(serializer)
    }
}

/// The text view of a node; for the runtime (`wiring`) without its description.
pub(super) fn node_text<'a, M: Serialize>(
    node: &'a Node,
    wiring: bool,
    model_view: impl FnOnce(&'a ModelNode) -> M,
) -> NodeTextRef<'a, M> {
    // Destructured without `..`: a new Node field fails to compile here until it has a text
    // form.
    let Node {
        name,
        description,
        kind,
        join,
        on_error,
        fallback_value,
        timeout_ms,
        retry,
        shadow,
        input_template,
    } = node;
    let mut text = NodeTextRef {
        name,
        description: if wiring { "" } else { description },
        input: None,
        model: None,
        switch: None,
        split: None,
        output: None,
        join: *join,
        on_error: *on_error,
        fallback_value: fallback_value.as_ref(),
        timeout_ms: *timeout_ms,
        retry: retry.as_ref(),
        shadow: shadow.as_ref(),
        input_template: input_template.as_ref(),
    };
    match kind {
        Some(node::Kind::Input(k)) => text.input = Some(k),
        Some(node::Kind::Model(k)) => text.model = Some(model_view(k)),
        Some(node::Kind::Switch(k)) => text.switch = Some(k),
        Some(node::Kind::Split(k)) => text.split = Some(k),
        Some(node::Kind::Output(k)) => text.output = Some(k),
        None => {}
    }
    text
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = NodeText::deserialize(deserializer)?;
        let mut kinds = Vec::new();
        if let Some(k) = text.input {
            kinds.push(("input", node::Kind::Input(k)));
        }
        if let Some(k) = text.model {
            kinds.push(("model", node::Kind::Model(k)));
        }
        if let Some(k) = text.switch {
            kinds.push(("switch", node::Kind::Switch(k)));
        }
        if let Some(k) = text.split {
            kinds.push(("split", node::Kind::Split(k)));
        }
        if let Some(k) = text.output {
            kinds.push(("output", node::Kind::Output(k)));
        }
        if kinds.len() > 1 {
            let names: Vec<&str> = kinds.iter().map(|(name, _)| *name).collect();
            return Err(de::Error::custom(format_args!(
                "node {:?} has several kinds ({}); a node is exactly one of input, model, switch, split, output",
                text.name,
                names.join(", ")
            )));
        }
        // No kind at all is left to validation, which names the node and says what to add.
        let kind = kinds.pop().map(|(_, kind)| kind);
        Ok(Node {
            name: text.name,
            description: text.description,
            kind,
            join: text.join,
            on_error: text.on_error,
            fallback_value: text.fallback_value,
            timeout_ms: text.timeout_ms,
            retry: text.retry,
            shadow: text.shadow,
            input_template: text.input_template,
        })
    }
}
