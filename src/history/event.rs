//! Ray's events as its dashboard agent posts them (`POST /v1/events`, a JSON array of
//! protobuf-JSON `RayEvent`s): only what filing needs is read (id, session, node, type, the job
//! of the payload); the event itself is kept as sent.

use base64::Engine;
use serde_json::Value;

use super::layout::{Category, is_safe_part};

/// One event, ready to file.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// `eventId` as sent (deduplication: Ray resends a batch whose answer came late).
    pub id: Option<String>,
    pub session: String,
    /// The emitting node, as lowercase hex; `None` when the event has none.
    pub node: Option<String>,
    pub category: Category,
    /// The event as one JSON line.
    pub line: String,
}

/// Why an event was not filed (the batch is still accepted: refusing it would make Ray resend it
/// forever and block the node's stream behind it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("an event is not a JSON object")]
    NotAnObject,
    #[error("an event has no sessionName, or one that is not a plain name")]
    BadSession,
    #[error("an event has no RFC 3339 timestamp")]
    BadTimestamp,
}

/// The payloads that carry the job an event belongs to.
const JOB_PAYLOADS: [&str; 7] = [
    "driverJobDefinitionEvent",
    "driverJobLifecycleEvent",
    "taskDefinitionEvent",
    "taskLifecycleEvent",
    "taskProfileEvents",
    "actorTaskDefinitionEvent",
    "actorDefinitionEvent",
];

/// A batch body: a JSON array of events. `Err` only when the body is not an array at all.
pub fn parse_batch(body: &[u8]) -> Result<Vec<Result<Event, Rejected>>, serde_json::Error> {
    let items: Vec<Value> = serde_json::from_slice(body)?;
    Ok(items.into_iter().map(parse_event).collect())
}

fn parse_event(value: Value) -> Result<Event, Rejected> {
    let object = value.as_object().ok_or(Rejected::NotAnObject)?;
    let text = |key: &str| object.get(key).and_then(Value::as_str);
    let session = text("sessionName")
        .filter(|s| is_safe_part(s))
        .ok_or(Rejected::BadSession)?
        .to_owned();
    text("timestamp")
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .ok_or(Rejected::BadTimestamp)?;
    let node = text("nodeId").and_then(id_hex);
    let event_type = text("eventType").unwrap_or_default();
    let job = if matches!(event_type, "NODE_DEFINITION_EVENT" | "NODE_LIFECYCLE_EVENT") {
        None
    } else {
        JOB_PAYLOADS
            .iter()
            .filter_map(|payload| object.get(*payload)?.get("jobId")?.as_str())
            .find_map(id_hex)
    };
    Ok(Event {
        id: text("eventId").map(str::to_owned),
        session,
        node,
        category: job.map_or(Category::Node, Category::Job),
        line: value.to_string(),
    })
}

/// A Ray ID as lowercase hex. Protobuf-JSON sends bytes as base64; an ID already in hex (as
/// KubeRay's collector also accepts) is kept. `None` for an empty or unreadable ID.
pub fn id_hex(id: &str) -> Option<String> {
    if id.is_empty() {
        return None;
    }
    if id.len().is_multiple_of(2) && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Some(id.to_ascii_lowercase());
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(id).ok()?;
    (!bytes.is_empty()).then(|| hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(extra: Value) -> Value {
        let mut base = json!({
            "eventId": "obLD1OX2BxgpOktc", "sourceType": "CORE_WORKER",
            "timestamp": "2026-11-29T07:06:40.123456789Z", "severity": "INFO",
            "sessionName": "session_2026-11-29_07-00-00_123456_4242",
            "nodeId": "q6urqw=="
        });
        crate::api::test_support::json_merge(&mut base, extra);
        base
    }

    #[test]
    fn events_are_filed_by_their_own_session_node_and_job() {
        let body = json!([
            event(json!({"eventType": "TASK_DEFINITION_EVENT",
                         "taskDefinitionEvent": {"taskId": "ERER", "jobId": "AQAAAA=="}})),
            event(json!({"eventType": "NODE_LIFECYCLE_EVENT", "nodeLifecycleEvent": {}})),
            event(json!({"eventType": "ACTOR_LIFECYCLE_EVENT", "actorLifecycleEvent": {}})),
            event(json!({"eventType": "DRIVER_JOB_LIFECYCLE_EVENT",
                         "driverJobLifecycleEvent": {"jobId": "02000000"}})),
        ]);
        let parsed: Vec<Event> = parse_batch(body.to_string().as_bytes())
            .expect("an array")
            .into_iter()
            .map(|e| e.expect("valid"))
            .collect();
        let categories: Vec<&Category> = parsed.iter().map(|e| &e.category).collect();
        assert_eq!(
            categories,
            [
                &Category::Job("01000000".into()),
                &Category::Node,
                &Category::Node,
                &Category::Job("02000000".into()),
            ]
        );
        assert_eq!(parsed[0].node.as_deref(), Some("abababab"));
        assert_eq!(parsed[0].session, "session_2026-11-29_07-00-00_123456_4242");
        let line: Value = serde_json::from_str(&parsed[0].line).expect("JSON");
        assert_eq!(line["taskDefinitionEvent"]["taskId"], "ERER");
    }

    #[test]
    fn bad_events_are_named_and_a_non_array_is_an_error() {
        let body = json!([
            42,
            event(json!({"sessionName": "../etc"})),
            event(json!({"timestamp": "yesterday"})),
        ]);
        let verdicts: Vec<Result<Event, Rejected>> =
            parse_batch(body.to_string().as_bytes()).expect("an array");
        assert_eq!(
            verdicts.into_iter().map(|v| v.err()).collect::<Vec<_>>(),
            [
                Some(Rejected::NotAnObject),
                Some(Rejected::BadSession),
                Some(Rejected::BadTimestamp)
            ]
        );
        assert!(parse_batch(b"{\"events\": []}").is_err());
    }
}
