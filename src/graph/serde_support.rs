//! Text form (YAML/JSON) of the generated protobuf types: what build.rs cannot derive.
//!
//! - enum fields as short names (`ANY` rather than `JOIN_MODE_ANY` or `1`);
//! - `JsonValue` / `JsonList` / `JsonObject` as plain JSON;
//! - `Node` with its oneof kind as one key beside the other fields (`model: {...}`), while
//!   unknown keys stay errors (serde's `flatten` would silently accept them);
//! - `Predicate` as a one-key map (`compare: {...}`) in YAML too (serde_yaml would use tags).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

use super::proto::{
    self, Compare, InputNode, JsonList, JsonObject, JsonValue, ModelNode, Node, OutputNode,
    Predicate, PredicateList, Quantified, Retry, Shadow, SplitNode, SwitchNode, json_value, node,
    predicate,
};

/// `skip_serializing_if` for every generated field: fields at their default are left out.
pub fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// A protobuf enum as seen by the text form.
pub trait TextEnum {
    /// Prefix of every value name (`JOIN_MODE_`), left out in the text form.
    const PREFIX: &'static str;
    /// Full proto name of a known value.
    fn name_of(value: i32) -> Option<&'static str>;
    /// Value of a full proto name.
    fn value_of(name: &str) -> Option<i32>;
}

/// The short text name of an enum value (`ANY`), or `None` for a value unknown to this build.
pub fn short_name<E: TextEnum>(value: i32) -> Option<&'static str> {
    E::name_of(value).map(|name| name.strip_prefix(E::PREFIX).unwrap_or(name))
}

fn serialize_enum<E: TextEnum, S: Serializer>(
    value: i32,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match short_name::<E>(value) {
        Some(name) => serializer.serialize_str(name),
        // A number from a newer writer: keep it, so decode -> YAML -> encode loses nothing.
        None => serializer.serialize_i32(value),
    }
}

fn parse_enum<E: TextEnum>(text: &str) -> Option<i32> {
    let upper = text.trim().to_ascii_uppercase();
    E::value_of(&upper).or_else(|| E::value_of(&format!("{}{upper}", E::PREFIX)))
}

struct EnumVisitor<E>(std::marker::PhantomData<E>);

impl<E: TextEnum> Visitor<'_> for EnumVisitor<E> {
    type Value = i32;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a {}* enum name", E::PREFIX)
    }

    fn visit_str<Err: de::Error>(self, text: &str) -> Result<i32, Err> {
        parse_enum::<E>(text).ok_or_else(|| {
            Err::custom(format_args!(
                "unknown value {text:?} (expected one of {})",
                known_names::<E>().join(", ")
            ))
        })
    }

    fn visit_i64<Err: de::Error>(self, value: i64) -> Result<i32, Err> {
        i32::try_from(value)
            .map_err(|_| Err::custom(format_args!("enum value {value} out of range")))
    }

    fn visit_u64<Err: de::Error>(self, value: u64) -> Result<i32, Err> {
        i32::try_from(value)
            .map_err(|_| Err::custom(format_args!("enum value {value} out of range")))
    }
}

fn known_names<E: TextEnum>() -> Vec<&'static str> {
    (0..64).filter_map(short_name::<E>).collect()
}

fn deserialize_enum<'de, E: TextEnum, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<i32, D::Error> {
    deserializer.deserialize_any(EnumVisitor::<E>(std::marker::PhantomData))
}

struct EnumSeq<'a, E>(&'a [i32], std::marker::PhantomData<E>);

impl<E: TextEnum> Serialize for EnumSeq<'_, E> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for value in self.0 {
            seq.serialize_element(&EnumItem::<E>(*value, std::marker::PhantomData))?;
        }
        seq.end()
    }
}

struct EnumItem<E>(i32, std::marker::PhantomData<E>);

impl<E: TextEnum> Serialize for EnumItem<E> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_enum::<E, S>(self.0, serializer)
    }
}

impl<'de, E: TextEnum> Deserialize<'de> for EnumItem<E> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_enum::<E, D>(deserializer).map(|v| EnumItem(v, std::marker::PhantomData))
    }
}

macro_rules! text_enums {
    ($($module:ident => $ty:ident, $prefix:literal;)*) => {
        $(
            impl TextEnum for proto::$ty {
                const PREFIX: &'static str = $prefix;
                fn name_of(value: i32) -> Option<&'static str> {
                    proto::$ty::try_from(value).ok().map(|v| v.as_str_name())
                }
                fn value_of(name: &str) -> Option<i32> {
                    proto::$ty::from_str_name(name).map(|v| v as i32)
                }
            }
        )*

        /// `#[serde(with = ...)]` modules named after each enum, used by the generated code.
        pub mod enums {
            $(
                pub mod $module {
                    use super::super::*;

                    pub fn serialize<S: Serializer>(value: &i32, serializer: S) -> Result<S::Ok, S::Error> {
                        serialize_enum::<proto::$ty, S>(*value, serializer)
                    }

                    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
                        deserialize_enum::<proto::$ty, D>(deserializer)
                    }

                    /// The same for repeated enum fields.
                    pub mod list {
                        use super::super::super::*;

                        pub fn serialize<S: Serializer>(values: &[i32], serializer: S) -> Result<S::Ok, S::Error> {
                            EnumSeq::<proto::$ty>(values, std::marker::PhantomData).serialize(serializer)
                        }

                        pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<i32>, D::Error> {
                            let items = Vec::<EnumItem<proto::$ty>>::deserialize(deserializer)?;
                            Ok(items.into_iter().map(|item| item.0).collect())
                        }
                    }
                }
            )*
        }
    };
}

text_enums! {
    join_mode => JoinMode, "JOIN_MODE_";
    on_error => OnError, "ON_ERROR_";
    call_style => CallStyle, "CALL_STYLE_";
    no_match => NoMatch, "NO_MATCH_";
    edge_mode => EdgeMode, "EDGE_MODE_";
    retry_on => RetryOn, "RETRY_ON_";
    op => Op, "OP_";
}

// ---------------------------------------------------------------------------------------------
// JSON values

impl JsonValue {
    /// JSON null.
    pub fn null() -> Self {
        JsonValue {
            kind: Some(json_value::Kind::NullValue(
                proto::NullValue::NullValue as i32,
            )),
        }
    }

    /// A JSON string.
    pub fn string(text: impl Into<String>) -> Self {
        JsonValue {
            kind: Some(json_value::Kind::StringValue(text.into())),
        }
    }

    /// A JSON integer.
    pub fn int(value: i64) -> Self {
        JsonValue {
            kind: Some(json_value::Kind::IntValue(value)),
        }
    }

    /// A JSON number with a fraction.
    pub fn number(value: f64) -> Self {
        JsonValue {
            kind: Some(json_value::Kind::NumberValue(value)),
        }
    }

    /// A JSON boolean.
    pub fn boolean(value: bool) -> Self {
        JsonValue {
            kind: Some(json_value::Kind::BoolValue(value)),
        }
    }

    /// A JSON array.
    pub fn list(values: Vec<JsonValue>) -> Self {
        JsonValue {
            kind: Some(json_value::Kind::ListValue(JsonList { values })),
        }
    }

    /// A JSON object.
    pub fn object(fields: BTreeMap<String, JsonValue>) -> Self {
        JsonValue {
            kind: Some(json_value::Kind::ObjectValue(JsonObject { fields })),
        }
    }

    /// The same value as a `serde_json::Value` (non-finite numbers become null, as in JSON).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match &self.kind {
            None | Some(json_value::Kind::NullValue(_)) => Value::Null,
            Some(json_value::Kind::BoolValue(b)) => Value::Bool(*b),
            Some(json_value::Kind::NumberValue(n)) => {
                serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
            }
            Some(json_value::Kind::IntValue(i)) => Value::Number((*i).into()),
            Some(json_value::Kind::StringValue(s)) => Value::String(s.clone()),
            Some(json_value::Kind::ListValue(list)) => {
                Value::Array(list.values.iter().map(JsonValue::to_json).collect())
            }
            Some(json_value::Kind::ObjectValue(object)) => Value::Object(
                object
                    .fields
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }
}

impl From<&serde_json::Value> for JsonValue {
    fn from(value: &serde_json::Value) -> Self {
        use serde_json::Value;
        match value {
            Value::Null => JsonValue::null(),
            Value::Bool(b) => JsonValue::boolean(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => JsonValue::int(i),
                None => JsonValue::number(n.as_f64().unwrap_or(f64::NAN)),
            },
            Value::String(s) => JsonValue::string(s.clone()),
            Value::Array(items) => JsonValue::list(items.iter().map(JsonValue::from).collect()),
            Value::Object(map) => JsonValue::object(
                map.iter()
                    .map(|(k, v)| (k.clone(), JsonValue::from(v)))
                    .collect(),
            ),
        }
    }
}

impl Serialize for JsonValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.kind {
            None | Some(json_value::Kind::NullValue(_)) => serializer.serialize_unit(),
            Some(json_value::Kind::BoolValue(b)) => serializer.serialize_bool(*b),
            Some(json_value::Kind::NumberValue(n)) => serializer.serialize_f64(*n),
            Some(json_value::Kind::IntValue(i)) => serializer.serialize_i64(*i),
            Some(json_value::Kind::StringValue(s)) => serializer.serialize_str(s),
            Some(json_value::Kind::ListValue(list)) => list.serialize(serializer),
            Some(json_value::Kind::ObjectValue(object)) => object.serialize(serializer),
        }
    }
}

impl Serialize for JsonList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.values.len()))?;
        for value in &self.values {
            seq.serialize_element(value)?;
        }
        seq.end()
    }
}

impl Serialize for JsonObject {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.fields.len()))?;
        for (key, value) in &self.fields {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

struct JsonValueVisitor;

impl<'de> Visitor<'de> for JsonValueVisitor {
    type Value = JsonValue;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<JsonValue, E> {
        Ok(JsonValue::null())
    }

    fn visit_none<E: de::Error>(self) -> Result<JsonValue, E> {
        Ok(JsonValue::null())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<JsonValue, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<JsonValue, E> {
        Ok(JsonValue::boolean(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<JsonValue, E> {
        Ok(JsonValue::int(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<JsonValue, E> {
        // Integers beyond i64 lose exactness, as they would in most JSON readers.
        Ok(i64::try_from(value).map_or_else(|_| JsonValue::number(value as f64), JsonValue::int))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<JsonValue, E> {
        Ok(JsonValue::number(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<JsonValue, E> {
        Ok(JsonValue::string(value))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<JsonValue, E> {
        Ok(JsonValue::string(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonValue, A::Error> {
        let mut values = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(value) = seq.next_element::<JsonValue>()? {
            values.push(value);
        }
        Ok(JsonValue::list(values))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonValue, A::Error> {
        let mut fields = BTreeMap::new();
        while let Some((key, value)) = map.next_entry::<String, JsonValue>()? {
            fields.insert(key, value);
        }
        Ok(JsonValue::object(fields))
    }
}

impl<'de> Deserialize<'de> for JsonValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonValueVisitor)
    }
}

impl<'de> Deserialize<'de> for JsonList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(JsonList {
            values: Vec::deserialize(deserializer)?,
        })
    }
}

impl<'de> Deserialize<'de> for JsonObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(JsonObject {
            fields: BTreeMap::deserialize(deserializer)?,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Node: the oneof kind as one key of the node.

/// For singular JSON value fields: a present key is a value, `null` included (`if_missing:
/// null` means "write null"), read exactly as inside lists so text null is always the same
/// `JsonValue::null()`.
pub fn present_json<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<JsonValue>, D::Error> {
    JsonValue::deserialize(deserializer).map(Some)
}

/// A key that is present counts as set, even when written as `input:` with no value (YAML null):
/// `- name: request\n  input:` must not silently become a node without a kind.
pub fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Some(
        Option::<T>::deserialize(deserializer)?.unwrap_or_default(),
    ))
}

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
struct NodeTextRef<'a, M: Serialize> {
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
fn node_text<'a, M: Serialize>(
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

// ---------------------------------------------------------------------------------------------
// The wiring view: what the graph runtime receives as the Serve application's `args`.

/// A graph serialized for the runtime: the text form without deployment options, descriptions,
/// route prefix, runtime environment and executor options (those are rendered elsewhere in the
/// Serve config, and keeping them out of `args` keeps a scaling change from rebuilding the
/// whole application). Reading it back gives a graph without those fields.
pub struct WiringText<'a>(pub &'a proto::PipelineGraph);

#[derive(Serialize)]
struct GraphWiringRef<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    version: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    ingress: &'a str,
    nodes: NodesWiring<'a>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    edges: &'a [proto::Edge],
    #[serde(skip_serializing_if = "is_default")]
    deadline_ms: u32,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    forward_headers: &'a [String],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: &'a BTreeMap<String, String>,
}

struct NodesWiring<'a>(&'a [Node]);

impl Serialize for NodesWiring<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for node in self.0 {
            seq.serialize_element(&node_text(node, true, ModelWiring))?;
        }
        seq.end()
    }
}

/// A model node without its deployment options.
struct ModelWiring<'a>(&'a ModelNode);

#[derive(Serialize)]
struct ModelWiringRef<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    import_path: &'a str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    init_args: &'a [JsonValue],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    init_kwargs: &'a BTreeMap<String, JsonValue>,
    #[serde(skip_serializing_if = "str::is_empty")]
    method: &'a str,
    #[serde(skip_serializing_if = "is_default", with = "enums::call_style")]
    call_style: i32,
}

impl Serialize for ModelWiring<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let ModelNode {
            import_path,
            init_args,
            init_kwargs,
            method,
            call_style,
            deployment: _,
        } = self.0;
        ModelWiringRef {
            import_path,
            init_args,
            init_kwargs,
            method,
            call_style: *call_style,
        }
        .serialize(serializer)
    }
}

impl Serialize for WiringText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Destructured without `..`: a new graph field fails to compile here until someone
        // decides whether the runtime needs it.
        let proto::PipelineGraph {
            name,
            version,
            ingress,
            route_prefix: _,
            runtime_env: _,
            nodes,
            edges,
            deadline_ms,
            forward_headers,
            labels,
            executor: _,
        } = self.0;
        GraphWiringRef {
            name,
            version,
            ingress,
            nodes: NodesWiring(nodes),
            edges,
            deadline_ms: *deadline_ms,
            forward_headers,
            labels,
        }
        .serialize(serializer)
    }
}

/// Whether two graphs have the same wiring (equal apart from what [`WiringText`] leaves out).
pub fn same_wiring(a: &proto::PipelineGraph, b: &proto::PipelineGraph) -> bool {
    a.name == b.name
        && a.version == b.version
        && a.ingress == b.ingress
        && a.deadline_ms == b.deadline_ms
        && a.forward_headers == b.forward_headers
        && a.labels == b.labels
        && a.edges == b.edges
        && a.nodes.len() == b.nodes.len()
        && a.nodes
            .iter()
            .zip(&b.nodes)
            .all(|(x, y)| same_node_wiring(x, y))
}

fn same_node_wiring(a: &Node, b: &Node) -> bool {
    // Listed without `..`: a new Node field fails to compile here until it is compared.
    let Node {
        name: _,
        description: _,
        kind: _,
        join: _,
        on_error: _,
        fallback_value: _,
        timeout_ms: _,
        retry: _,
        shadow: _,
        input_template: _,
    } = a;
    let kinds_match = match (&a.kind, &b.kind) {
        (Some(node::Kind::Model(x)), Some(node::Kind::Model(y))) => {
            x.import_path == y.import_path
                && x.init_args == y.init_args
                && x.init_kwargs == y.init_kwargs
                && x.method == y.method
                && x.call_style == y.call_style
        }
        (x, y) => x == y,
    };
    kinds_match
        && a.name == b.name
        && a.join == b.join
        && a.on_error == b.on_error
        && a.fallback_value == b.fallback_value
        && a.timeout_ms == b.timeout_ms
        && a.retry == b.retry
        && a.shadow == b.shadow
        && a.input_template == b.input_template
}

/// A graph read back from its wiring text: drops what the wiring leaves out.
pub fn into_wiring(mut graph: proto::PipelineGraph) -> proto::PipelineGraph {
    graph.route_prefix.clear();
    graph.runtime_env = None;
    graph.executor = None;
    for node in &mut graph.nodes {
        node.description.clear();
        if let Some(node::Kind::Model(model)) = &mut node.kind {
            model.deployment = None;
        }
    }
    graph
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

// ---------------------------------------------------------------------------------------------
// Predicate: exactly one key naming its form.

#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct PredicateText {
    compare: Option<Compare>,
    all_of: Option<PredicateList>,
    any_of: Option<PredicateList>,
    negate: Option<Box<Predicate>>,
    some: Option<Box<Quantified>>,
    every: Option<Box<Quantified>>,
}

impl Serialize for Predicate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(usize::from(self.p.is_some())))?;
        match &self.p {
            None => {}
            Some(predicate::P::Compare(c)) => map.serialize_entry("compare", c)?,
            Some(predicate::P::AllOf(l)) => map.serialize_entry("all_of", l)?,
            Some(predicate::P::AnyOf(l)) => map.serialize_entry("any_of", l)?,
            Some(predicate::P::Negate(p)) => map.serialize_entry("negate", p)?,
            Some(predicate::P::Some(q)) => map.serialize_entry("some", q)?,
            Some(predicate::P::Every(q)) => map.serialize_entry("every", q)?,
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Predicate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = PredicateText::deserialize(deserializer)?;
        let mut forms = Vec::new();
        if let Some(c) = text.compare {
            forms.push(("compare", predicate::P::Compare(c)));
        }
        if let Some(l) = text.all_of {
            forms.push(("all_of", predicate::P::AllOf(l)));
        }
        if let Some(l) = text.any_of {
            forms.push(("any_of", predicate::P::AnyOf(l)));
        }
        if let Some(p) = text.negate {
            forms.push(("negate", predicate::P::Negate(p)));
        }
        if let Some(q) = text.some {
            forms.push(("some", predicate::P::Some(q)));
        }
        if let Some(q) = text.every {
            forms.push(("every", predicate::P::Every(q)));
        }
        if forms.len() > 1 {
            let names: Vec<&str> = forms.iter().map(|(name, _)| *name).collect();
            return Err(de::Error::custom(format_args!(
                "a predicate has exactly one of compare, all_of, any_of, negate, some, every; this one has {}",
                names.join(", ")
            )));
        }
        // An empty predicate is left to validation, which names the edge.
        Ok(Predicate {
            p: forms.pop().map(|(_, p)| p),
        })
    }
}
