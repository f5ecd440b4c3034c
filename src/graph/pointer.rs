//! RFC 6901 JSON Pointers, as used by edge `select`/`into`, split `sticky_key` and predicate
//! paths. The Python runtime implements exactly these rules (the predicate vectors exercise
//! them): "" is the whole value; each `/segment` selects an object member, or an array element
//! by a decimal index without leading zeros; `~1` is '/', `~0` is '~'; anything else does not
//! resolve.

use std::borrow::Cow;

/// Longest pointer accepted anywhere in a graph.
pub const MAX_POINTER_LEN: usize = 256;

/// Why a pointer is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PointerError {
    #[error("a JSON Pointer is empty or starts with '/'")]
    NoLeadingSlash,
    #[error("'~' at byte {0} must be followed by '0' or '1'")]
    BadEscape(usize),
    #[error("longer than {MAX_POINTER_LEN} characters ({0})")]
    TooLong(usize),
}

/// Checks the syntax of a pointer ("" is valid: the whole value).
pub fn check(pointer: &str) -> Result<(), PointerError> {
    if pointer.len() > MAX_POINTER_LEN {
        return Err(PointerError::TooLong(pointer.len()));
    }
    if pointer.is_empty() {
        return Ok(());
    }
    if !pointer.starts_with('/') {
        return Err(PointerError::NoLeadingSlash);
    }
    let bytes = pointer.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'~' && !matches!(bytes.get(i + 1), Some(b'0' | b'1')) {
            return Err(PointerError::BadEscape(i));
        }
    }
    Ok(())
}

/// The unescaped segments of a well-formed pointer ("" has none).
pub fn segments(pointer: &str) -> impl Iterator<Item = Cow<'_, str>> {
    pointer.split('/').skip(1).map(unescape)
}

/// The first segment, i.e. the scope key a predicate path reads.
pub fn first_segment(pointer: &str) -> Option<Cow<'_, str>> {
    segments(pointer).next()
}

fn unescape(segment: &str) -> Cow<'_, str> {
    if segment.contains('~') {
        Cow::Owned(segment.replace("~1", "/").replace("~0", "~"))
    } else {
        Cow::Borrowed(segment)
    }
}

/// Escapes one segment (the inverse of the unescaping above).
pub fn escape(segment: &str) -> Cow<'_, str> {
    if segment.contains(['~', '/']) {
        Cow::Owned(segment.replace('~', "~0").replace('/', "~1"))
    } else {
        Cow::Borrowed(segment)
    }
}

/// An array index: decimal digits, no leading zero unless it is "0".
fn array_index(segment: &str) -> Option<usize> {
    let digits_only = !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit());
    if !digits_only || (segment.len() > 1 && segment.starts_with('0')) {
        return None;
    }
    segment.parse().ok()
}

/// Resolves a pointer in a JSON value; `None` when it does not resolve (or is malformed).
pub fn resolve<'v>(value: &'v serde_json::Value, pointer: &str) -> Option<&'v serde_json::Value> {
    check(pointer).ok()?;
    let mut current = value;
    for segment in segments(pointer) {
        current = match current {
            serde_json::Value::Object(map) => map.get(segment.as_ref())?,
            serde_json::Value::Array(items) => items.get(array_index(&segment)?)?,
            _ => return None,
        };
    }
    Some(current)
}

/// Whether one pointer is a prefix of the other, segment by segment ("/a" and "/a/b" overlap,
/// "/a" and "/ab" do not): two writes at such pointers would clobber each other.
pub fn overlaps(a: &str, b: &str) -> bool {
    segments(a).zip(segments(b)).all(|(x, y)| x == y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn syntax() {
        assert_eq!(check(""), Ok(()));
        assert_eq!(check("/a/b~0~1"), Ok(()));
        assert_eq!(check("a"), Err(PointerError::NoLeadingSlash));
        assert_eq!(check("/a~2"), Err(PointerError::BadEscape(2)));
        assert_eq!(check("/a~"), Err(PointerError::BadEscape(2)));
        assert_eq!(
            check(&format!("/{}", "x".repeat(300))),
            Err(PointerError::TooLong(301))
        );
    }

    #[test]
    fn resolution_follows_rfc_6901() {
        let doc = json!({"a": {"b/c": [10, 20], "m~n": 1, "": 2}, "list": [0, 1, 2]});
        assert_eq!(resolve(&doc, ""), Some(&doc));
        assert_eq!(resolve(&doc, "/a/b~1c/1"), Some(&json!(20)));
        assert_eq!(resolve(&doc, "/a/m~0n"), Some(&json!(1)));
        assert_eq!(resolve(&doc, "/a/"), Some(&json!(2)));
        assert_eq!(resolve(&doc, "/list/01"), None);
        assert_eq!(resolve(&doc, "/list/-"), None);
        assert_eq!(resolve(&doc, "/list/+1"), None);
        assert_eq!(resolve(&doc, "/list/3"), None);
        assert_eq!(resolve(&doc, "/list/0/x"), None);
        assert_eq!(resolve(&doc, "nope"), None);
    }

    #[test]
    fn escape_round_trips() {
        for raw in ["plain", "a/b", "t~x", "~/~1"] {
            let escaped = format!("/{}", escape(raw));
            assert_eq!(first_segment(&escaped).as_deref(), Some(raw));
        }
    }

    #[test]
    fn overlap_is_by_segment() {
        assert!(overlaps("", "/a"));
        assert!(overlaps("/a", "/a/b"));
        assert!(overlaps("/a", "/a"));
        assert!(!overlaps("/a", "/ab"));
        assert!(!overlaps("/a/b", "/a/c"));
    }
}
