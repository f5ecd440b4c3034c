//! A linear pre-scan of a protobuf `PipelineGraph` that bounds what decoding it would cost,
//! before `prost` allocates anything: the byte size, the node and edge counts (the top-level
//! repeated fields), the message nesting depth (counted as prost counts it, so the limit is the
//! same for every form), and an upper bound of the memory the decoded graph takes.
//!
//! The scan walks the wire format with an explicit stack (no recursion) and knows the schema of
//! `proto/raypipe/v1/pipeline.proto` (a table below; a test checks it against prost's own
//! decoding). Unknown fields are skipped as prost skips them. The memory bound counts, for each
//! decoded message, string and list element, its Rust size, doubled for list and map entries
//! (a `Vec` grown one push at a time holds up to twice its length).
//!
//! Deliberate deviation: groups (proto2 wire types 3 and 4, which prost would skip inside
//! unknown fields) are refused; nothing writes them into a proto3 graph.

use std::mem::size_of;

use super::proto;

/// What the scan found in a graph that passed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireSummary {
    /// Entries of `PipelineGraph.nodes`.
    pub nodes: usize,
    /// Entries of `PipelineGraph.edges`.
    pub edges: usize,
    /// Deepest message nesting (`PipelineGraph` itself is 1).
    pub depth: usize,
    /// Upper bound of the heap and inline memory of the decoded `PipelineGraph` (bytes).
    pub decoded_bytes: usize,
}

/// Why the scan refused the bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("malformed protobuf at byte {offset}: {problem}")]
    Malformed {
        offset: usize,
        problem: &'static str,
    },
}

/// What a field holds, for the scan.
#[derive(Clone, Copy)]
enum Field {
    /// A message (`repeated` or not).
    Message(Msg, bool),
    /// A map whose entries are this message.
    Map(Msg),
    /// A string or bytes (`repeated` or not).
    Text(bool),
    /// A repeated scalar (packed or not) of this element size.
    Scalars(usize),
    /// A singular scalar.
    Scalar,
}

/// The messages of the schema, map entries included.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Msg {
    PipelineGraph,
    Node,
    Empty,
    ModelNode,
    SwitchNode,
    SplitNode,
    Shadow,
    Retry,
    Edge,
    TensorSelect,
    Predicate,
    PredicateList,
    Compare,
    Quantified,
    JsonValue,
    JsonList,
    JsonObject,
    DeploymentOptions,
    AutoscalingConfig,
    RayActorOptions,
    RuntimeEnv,
    LoggingConfig,
    /// `map<string, string>` entry.
    StringEntry,
    /// `map<string, JsonValue>` entry.
    JsonEntry,
    /// `map<string, double>` entry.
    DoubleEntry,
}

impl Msg {
    /// The Rust size of the decoded message (for map entries: key plus value).
    fn size(self) -> usize {
        match self {
            Msg::PipelineGraph => size_of::<proto::PipelineGraph>(),
            Msg::Node => size_of::<proto::Node>(),
            Msg::Empty => 0,
            Msg::ModelNode => size_of::<proto::ModelNode>(),
            Msg::SwitchNode => size_of::<proto::SwitchNode>(),
            Msg::SplitNode => size_of::<proto::SplitNode>(),
            Msg::Shadow => size_of::<proto::Shadow>(),
            Msg::Retry => size_of::<proto::Retry>(),
            Msg::Edge => size_of::<proto::Edge>(),
            Msg::TensorSelect => size_of::<proto::TensorSelect>(),
            Msg::Predicate => size_of::<proto::Predicate>(),
            Msg::PredicateList => size_of::<proto::PredicateList>(),
            Msg::Compare => size_of::<proto::Compare>(),
            Msg::Quantified => size_of::<proto::Quantified>(),
            Msg::JsonValue => size_of::<proto::JsonValue>(),
            Msg::JsonList => size_of::<proto::JsonList>(),
            Msg::JsonObject => size_of::<proto::JsonObject>(),
            Msg::DeploymentOptions => size_of::<proto::DeploymentOptions>(),
            Msg::AutoscalingConfig => size_of::<proto::AutoscalingConfig>(),
            Msg::RayActorOptions => size_of::<proto::RayActorOptions>(),
            Msg::RuntimeEnv => size_of::<proto::RuntimeEnv>(),
            Msg::LoggingConfig => size_of::<proto::LoggingConfig>(),
            Msg::StringEntry => 2 * size_of::<String>(),
            Msg::JsonEntry => size_of::<String>() + size_of::<proto::JsonValue>(),
            Msg::DoubleEntry => size_of::<String>() + size_of::<f64>(),
        }
    }

    /// The field with this number, with its name (for paths in messages).
    fn field(self, number: u32) -> (&'static str, Field) {
        use Field::*;
        match (self, number) {
            (Msg::PipelineGraph, 1..=4) => ("", Text(false)),
            (Msg::PipelineGraph, 5) => ("runtime_env", Message(Msg::RuntimeEnv, false)),
            (Msg::PipelineGraph, 6) => ("nodes", Message(Msg::Node, true)),
            (Msg::PipelineGraph, 7) => ("edges", Message(Msg::Edge, true)),
            (Msg::PipelineGraph, 9) => ("", Text(true)),
            (Msg::PipelineGraph, 10) => ("labels", Map(Msg::StringEntry)),
            (Msg::PipelineGraph, 11) => ("executor", Message(Msg::DeploymentOptions, false)),
            (Msg::Node, 1 | 2) => ("", Text(false)),
            (Msg::Node, 5) => ("fallback_value", Message(Msg::JsonValue, false)),
            (Msg::Node, 7) => ("retry", Message(Msg::Retry, false)),
            (Msg::Node, 8) => ("shadow", Message(Msg::Shadow, false)),
            (Msg::Node, 9) => ("input_template", Message(Msg::JsonValue, false)),
            (Msg::Node, 10 | 14) => ("", Message(Msg::Empty, false)),
            (Msg::Node, 11) => ("model", Message(Msg::ModelNode, false)),
            (Msg::Node, 12) => ("switch", Message(Msg::SwitchNode, false)),
            (Msg::Node, 13) => ("split", Message(Msg::SplitNode, false)),
            (Msg::ModelNode, 1 | 4) => ("", Text(false)),
            (Msg::ModelNode, 2) => ("init_args", Message(Msg::JsonValue, true)),
            (Msg::ModelNode, 3) => ("init_kwargs", Map(Msg::JsonEntry)),
            (Msg::ModelNode, 6) => ("deployment", Message(Msg::DeploymentOptions, false)),
            (Msg::SplitNode, 1) => ("", Text(false)),
            (Msg::Retry, 4) => ("", Scalars(size_of::<i32>())),
            (Msg::Edge, 1 | 2 | 4 | 6) => ("", Text(false)),
            (Msg::Edge, 5) => ("tensors", Message(Msg::TensorSelect, false)),
            (Msg::Edge, 8) => ("if_missing", Message(Msg::JsonValue, false)),
            (Msg::Edge, 9) => ("when", Message(Msg::Predicate, false)),
            (Msg::TensorSelect, 1) => ("", Text(true)),
            (Msg::TensorSelect, 2) => ("rename", Map(Msg::StringEntry)),
            (Msg::Predicate, 1) => ("compare", Message(Msg::Compare, false)),
            (Msg::Predicate, 2) => ("all_of", Message(Msg::PredicateList, false)),
            (Msg::Predicate, 3) => ("any_of", Message(Msg::PredicateList, false)),
            (Msg::Predicate, 4) => ("negate", Message(Msg::Predicate, false)),
            (Msg::Predicate, 5) => ("some", Message(Msg::Quantified, false)),
            (Msg::Predicate, 6) => ("every", Message(Msg::Quantified, false)),
            (Msg::PredicateList, 1) => ("items", Message(Msg::Predicate, true)),
            (Msg::Compare, 1) => ("", Text(false)),
            (Msg::Compare, 3) => ("value", Message(Msg::JsonValue, false)),
            (Msg::Quantified, 1) => ("", Text(false)),
            (Msg::Quantified, 2) => ("inner", Message(Msg::Predicate, false)),
            (Msg::JsonValue, 5) => ("", Text(false)),
            (Msg::JsonValue, 6) => ("list_value", Message(Msg::JsonList, false)),
            (Msg::JsonValue, 7) => ("object_value", Message(Msg::JsonObject, false)),
            (Msg::JsonList, 1) => ("values", Message(Msg::JsonValue, true)),
            (Msg::JsonObject, 1) => ("fields", Map(Msg::JsonEntry)),
            (Msg::DeploymentOptions, 2) => {
                ("autoscaling_config", Message(Msg::AutoscalingConfig, false))
            }
            (Msg::DeploymentOptions, 5) => ("user_config", Message(Msg::JsonObject, false)),
            (Msg::DeploymentOptions, 10) => {
                ("ray_actor_options", Message(Msg::RayActorOptions, false))
            }
            (Msg::DeploymentOptions, 12) => ("logging_config", Message(Msg::LoggingConfig, false)),
            (Msg::AutoscalingConfig, 11) => ("", Text(false)),
            (Msg::RayActorOptions, 4) => ("resources", Map(Msg::DoubleEntry)),
            (Msg::RayActorOptions, 5) => ("", Text(false)),
            (Msg::RayActorOptions, 6) => ("runtime_env", Message(Msg::RuntimeEnv, false)),
            (Msg::RayActorOptions, 7) => ("label_selector", Map(Msg::StringEntry)),
            (Msg::RuntimeEnv, 1) => ("", Text(false)),
            (Msg::RuntimeEnv, 2 | 3) => ("", Text(true)),
            (Msg::RuntimeEnv, 4) => ("env_vars", Map(Msg::StringEntry)),
            (Msg::LoggingConfig, 1 | 2) => ("", Text(false)),
            (Msg::StringEntry, 1 | 2) | (Msg::JsonEntry, 1) | (Msg::DoubleEntry, 1) => {
                ("", Text(false))
            }
            (Msg::JsonEntry, 2) => ("value", Message(Msg::JsonValue, false)),
            _ => ("", Scalar),
        }
    }
}

/// Where the scan refused, and why: the caller turns these into `GraphError`s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    Malformed(WireError),
    /// More entries of a top-level list than the limit allows (counted so far).
    TooMany {
        what: &'static str,
        count: usize,
        limit: usize,
    },
    /// Nesting deeper than the limit, at this path.
    TooDeep {
        path: String,
        limit: usize,
    },
    /// The decoded graph would take more memory than the limit.
    TooCostly {
        at_least: usize,
        limit: usize,
    },
}

struct Frame {
    msg: Msg,
    /// Offset where this message's bytes end.
    end: usize,
    /// Field name and, for top-level lists, the entry's index (for the path of messages).
    name: &'static str,
    index: Option<usize>,
}

fn malformed(offset: usize, problem: &'static str) -> Refusal {
    Refusal::Malformed(WireError::Malformed { offset, problem })
}

fn read_varint(bytes: &[u8], at: &mut usize) -> Result<u64, Refusal> {
    let start = *at;
    let mut value = 0u64;
    for shift in 0..10 {
        let Some(&byte) = bytes.get(*at) else {
            return Err(malformed(start, "truncated varint"));
        };
        *at += 1;
        value |= u64::from(byte & 0x7f) << (7 * shift);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(malformed(start, "varint longer than 10 bytes"))
}

/// Scans `bytes` as a `PipelineGraph`; see the module header. Linear in `bytes.len()`, with
/// memory proportional to the nesting depth (at most `max_depth` frames).
pub(crate) fn scan(
    bytes: &[u8],
    max_nodes: usize,
    max_edges: usize,
    max_depth: usize,
    max_decoded_bytes: usize,
) -> Result<WireSummary, Refusal> {
    let mut summary = WireSummary {
        depth: 1,
        decoded_bytes: Msg::PipelineGraph.size(),
        ..WireSummary::default()
    };
    let mut stack = vec![Frame {
        msg: Msg::PipelineGraph,
        end: bytes.len(),
        name: "",
        index: None,
    }];
    let mut at = 0usize;
    let path = |stack: &[Frame]| {
        let mut text = String::new();
        for frame in stack.iter().skip(1) {
            if text.len() > 200 {
                text.push_str(".…");
                break;
            }
            if !text.is_empty() {
                text.push('.');
            }
            text.push_str(frame.name);
            if let Some(index) = frame.index {
                text.push_str(&format!("[{index}]"));
            }
        }
        text
    };
    loop {
        // Close every message that ends here.
        while let Some(frame) = stack.last() {
            if at < frame.end {
                break;
            }
            if at > frame.end {
                return Err(malformed(at, "a field runs past the end of its message"));
            }
            if stack.len() == 1 {
                return Ok(summary);
            }
            stack.pop();
        }
        let Some(frame) = stack.last() else {
            return Ok(summary);
        };
        let msg = frame.msg;
        let key_at = at;
        let key = read_varint(bytes, &mut at)?;
        let number =
            u32::try_from(key >> 3).map_err(|_| malformed(key_at, "field number too large"))?;
        if number == 0 {
            return Err(malformed(key_at, "field number 0"));
        }
        let (name, field) = msg.field(number);
        match key & 7 {
            0 => {
                read_varint(bytes, &mut at)?;
                if let Field::Scalars(size) = field {
                    summary.decoded_bytes = summary.decoded_bytes.saturating_add(2 * size);
                }
            }
            1 | 5 => {
                let width = if key & 7 == 1 { 8 } else { 4 };
                at = at
                    .checked_add(width)
                    .filter(|&end| end <= bytes.len())
                    .ok_or_else(|| malformed(key_at, "truncated fixed-width field"))?;
            }
            2 => {
                let length = read_varint(bytes, &mut at)?;
                let end = usize::try_from(length)
                    .ok()
                    .and_then(|length| at.checked_add(length))
                    .filter(|&end| end <= stack.last().map_or(bytes.len(), |f| f.end))
                    .ok_or_else(|| malformed(key_at, "length runs past the end of its message"))?;
                let length = end - at;
                let cost = match field {
                    Field::Message(child, repeated) => {
                        let mut index = None;
                        if msg == Msg::PipelineGraph && number == 6 {
                            index = Some(summary.nodes);
                            summary.nodes += 1;
                            if summary.nodes > max_nodes {
                                return Err(Refusal::TooMany {
                                    what: "nodes",
                                    count: summary.nodes,
                                    limit: max_nodes,
                                });
                            }
                        } else if msg == Msg::PipelineGraph && number == 7 {
                            index = Some(summary.edges);
                            summary.edges += 1;
                            if summary.edges > max_edges {
                                return Err(Refusal::TooMany {
                                    what: "edges",
                                    count: summary.edges,
                                    limit: max_edges,
                                });
                            }
                        }
                        stack.push(Frame {
                            msg: child,
                            end,
                            name,
                            index,
                        });
                        summary.depth = summary.depth.max(stack.len());
                        if stack.len() > max_depth {
                            return Err(Refusal::TooDeep {
                                path: path(&stack),
                                limit: max_depth,
                            });
                        }
                        // The message is inline in its parent unless it is a list element (or
                        // boxed, as recursive fields are): count it either way.
                        if repeated {
                            2 * child.size()
                        } else {
                            child.size()
                        }
                    }
                    Field::Map(entry) => {
                        stack.push(Frame {
                            msg: entry,
                            end,
                            name,
                            index: None,
                        });
                        summary.depth = summary.depth.max(stack.len());
                        if stack.len() > max_depth {
                            return Err(Refusal::TooDeep {
                                path: path(&stack),
                                limit: max_depth,
                            });
                        }
                        // A B-tree holds its entries in nodes that are at least half full.
                        2 * entry.size()
                    }
                    Field::Text(repeated) => {
                        at = end;
                        length + if repeated { 2 * size_of::<String>() } else { 0 }
                    }
                    Field::Scalars(size) => {
                        at = end;
                        // Packed: at least one byte per element.
                        length.saturating_mul(2 * size)
                    }
                    Field::Scalar => {
                        at = end;
                        0
                    }
                };
                summary.decoded_bytes = summary.decoded_bytes.saturating_add(cost);
                if summary.decoded_bytes > max_decoded_bytes {
                    return Err(Refusal::TooCostly {
                        at_least: summary.decoded_bytes,
                        limit: max_decoded_bytes,
                    });
                }
            }
            _ => return Err(malformed(key_at, "group or invalid wire type")),
        }
    }
}
