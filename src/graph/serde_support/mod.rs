//! Text form (YAML/JSON) of the generated protobuf types: what build.rs cannot derive.
//!
//! - enum fields as short names (`ANY` rather than `JOIN_MODE_ANY` or `1`);
//! - `JsonValue` / `JsonList` / `JsonObject` as plain JSON;
//! - `Node` with its oneof kind as one key beside the other fields (`model: {...}`), while
//!   unknown keys stay errors (serde's `flatten` would silently accept them);
//! - `Predicate` as a one-key map (`compare: {...}`) in YAML too (serde_yaml would use tags).
//!
//! This file holds the enum names and the field helpers the generated code names
//! (`crate::graph::serde_support::...` in build.rs); each type's text form is in its own file
//! (`json`, `node`, `predicate`), and the runtime's view of a graph in [`wiring`].

mod json;
mod node;
mod predicate;
pub mod wiring;

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

use super::proto::{self, JsonValue};

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
