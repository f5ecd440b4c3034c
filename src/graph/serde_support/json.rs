//! Text form of `JsonValue`, `JsonList` and `JsonObject`: plain JSON (and YAML), converted
//! from and to `serde_json::Value`.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize, de};

use crate::graph::proto;
use crate::graph::proto::{JsonList, JsonObject, JsonValue, json_value};

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
