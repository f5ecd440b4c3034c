//! Forgiving deserialisation for Ray's answers: Ray adds, renames and retypes fields between
//! releases, and one surprising field must not make a whole status response unreadable.
//! A field that is absent, `null` or of an unexpected type reads as "not set".

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// `Some(value)` when the field holds a `T`, `None` when it is null or holds something else.
pub(crate) fn option<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    if value.is_null() {
        // Otherwise an `Option<serde_json::Value>` field would read `null` as `Some(Null)`.
        return Ok(None);
    }
    Ok(serde_json::from_value(value).ok())
}

/// The collection when the field holds one, else an empty collection. Within a map or list,
/// entries that fail to read are skipped one by one rather than failing the collection.
pub(crate) fn map<'de, D, T>(
    deserializer: D,
) -> Result<std::collections::BTreeMap<String, T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    let serde_json::Value::Object(entries) = value else {
        return Ok(Default::default());
    };
    Ok(entries
        .into_iter()
        .filter_map(|(key, value)| serde_json::from_value(value).ok().map(|v| (key, v)))
        .collect())
}

/// Like [`map`], for lists.
pub(crate) fn list<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    let serde_json::Value::Array(items) = value else {
        return Ok(Vec::new());
    };
    Ok(items
        .into_iter()
        .filter_map(|item| serde_json::from_value(item).ok())
        .collect())
}

/// Declares a status enum read from Ray's upper-case strings, with an `Other` variant that
/// keeps values this version of raypipe does not know (Ray adds statuses over time).
macro_rules! ray_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(from = "String", into = "String")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
            /// A value this version of raypipe does not know, as Ray sent it.
            Other(String),
        }

        impl $name {
            /// The string Ray uses for this value.
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $text,)*
                    $name::Other(text) => text,
                }
            }
        }

        impl From<String> for $name {
            fn from(text: String) -> Self {
                match text.as_str() {
                    $($text => $name::$variant,)*
                    _ => $name::Other(text),
                }
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.as_str().to_owned()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub(crate) use ray_enum;
