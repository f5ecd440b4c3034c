//! Graphs written directly in protobuf's wire form, for the hardening tests and the serve
//! fuzz harness: building a hostile structure (and dropping it) would itself recurse or
//! allocate as much as what is being tested.

/// Appends `value` as a base-128 varint.
pub(crate) fn push_varint(out: &mut Vec<u8>, mut value: usize) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends `content` as the body of a length-delimited field: its length, then the bytes.
pub(crate) fn push_len(out: &mut Vec<u8>, content: &[u8]) {
    push_varint(out, content.len());
    out.extend_from_slice(content);
}

/// A graph of one node, `name`, whose `input_template` is `depth` nested lists around the
/// integer 1.
pub(crate) fn nested_template_bytes(name: &str, depth: usize) -> Vec<u8> {
    let mut inner: Vec<u8> = vec![0x20, 0x02]; // JsonValue.int_value = 1
    for _ in 0..depth {
        let mut list = vec![0x0a]; // JsonList.values
        push_len(&mut list, &inner);
        let mut value = vec![0x32]; // JsonValue.list_value
        push_len(&mut value, &list);
        inner = value;
    }
    let mut node = vec![0x0a]; // Node.name
    push_len(&mut node, name.as_bytes());
    node.push(0x4a); // Node.input_template
    push_len(&mut node, &inner);
    let mut graph = vec![0x32]; // PipelineGraph.nodes
    push_len(&mut graph, &node);
    graph
}
