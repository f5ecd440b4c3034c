//! A linear pre-scan of YAML and JSON text that bounds flow nesting (`[`, `{`) before the text
//! reaches serde: serde_yaml's parser costs O(tokens x flow depth), so 100,000 nested flow
//! maps took 46 s, while the deepest graph the message depth limit admits nests only a few
//! dozen levels in text.
//!
//! JSON is scanned exactly (strings with escapes). For YAML the scan follows the parts of the
//! grammar that decide whether a bracket is structure: quoted scalars start only where a node
//! starts (after indentation, `- `, `? `, `: `, `[`, `{`, `,` or a `!tag`/`&anchor` property),
//! comments start at `#` after whitespace, block scalars (`|`, `>`) run while lines are
//! indented at least as deep as their first line. Where YAML would not treat a bracket as
//! structure the scan may still count an opening one (an over-count refuses, never admits).

/// Where the text nests too deep: 1-based line and column of the bracket that went past the
/// limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooDeep {
    pub line: usize,
    pub column: usize,
}

/// One more level of flow nesting, opened at 1-based `line` and `column`: the one place both
/// scans refuse text past `max_depth`.
fn open_bracket(
    depth: &mut usize,
    max_depth: usize,
    line: usize,
    column: usize,
) -> Result<(), TooDeep> {
    *depth += 1;
    if *depth > max_depth {
        return Err(TooDeep { line, column });
    }
    Ok(())
}

/// Checks JSON text: nesting of arrays and objects at most `max_depth`.
pub(crate) fn check_json(text: &str, max_depth: usize) -> Result<(), TooDeep> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let (mut line, mut line_start) = (1usize, 0usize);
    for (at, byte) in text.bytes().enumerate() {
        if byte == b'\n' {
            line += 1;
            line_start = at + 1;
        }
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => open_bracket(&mut depth, max_depth, line, at - line_start + 1)?,
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Checks YAML text: flow nesting at most `max_depth` (see the module header).
pub(crate) fn check_yaml(text: &str, max_depth: usize) -> Result<(), TooDeep> {
    let bytes = text.as_bytes();
    let end_of_line = |from: usize| {
        bytes[from..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(bytes.len(), |p| from + p)
    };
    let mut depth = 0usize;
    let (mut at, mut line, mut line_start) = (0usize, 1usize, 0usize);
    let mut at_line_start = true;
    let mut indent = 0usize;
    // A block scalar in progress: the indentation of the line that introduced it, and of its
    // content once its first non-blank line sets it.
    let mut block_scalar: Option<(usize, Option<usize>)> = None;
    // Whether a node (so possibly a quoted scalar) may start here. Within flow collections it
    // carries over line ends, since plain scalars continue on the next line.
    let mut node_start = true;
    let mut after_space = true;
    // The last token was a quoted scalar or a closed collection: in flow context a `:` right
    // after one is a value indicator even without a space (JSON style, `{"a":"b"}`).
    let mut json_like = false;
    while at < bytes.len() {
        if at_line_start {
            at_line_start = false;
            line_start = at;
            let line_end = end_of_line(at);
            let spaces = bytes[at..line_end]
                .iter()
                .take_while(|&&b| b == b' ')
                .count();
            let blank = bytes[at + spaces..line_end]
                .iter()
                .all(|b| b.is_ascii_whitespace());
            if let Some((parent, content)) = block_scalar {
                let inside = blank
                    || match content {
                        Some(content) => spaces >= content,
                        None => spaces > parent,
                    };
                if inside {
                    if !blank && content.is_none() {
                        block_scalar = Some((parent, Some(spaces)));
                    }
                    at = line_end;
                    continue;
                }
                block_scalar = None;
            }
            indent = spaces;
            at += spaces;
            if depth == 0 {
                node_start = true;
            }
            after_space = true;
            continue;
        }
        let byte = bytes[at];
        let next_is_space = matches!(bytes.get(at + 1), None | Some(b' ' | b'\t' | b'\n' | b'\r'));
        match byte {
            b'\n' => {
                line += 1;
                at_line_start = true;
            }
            b'#' if after_space => {
                at = end_of_line(at);
                continue;
            }
            b'\'' | b'"' if node_start => {
                // Skip the quoted scalar, possibly over several lines.
                let quote = byte;
                at += 1;
                while at < bytes.len() {
                    let b = bytes[at];
                    if b == b'\n' {
                        line += 1;
                        line_start = at + 1;
                    }
                    if quote == b'"' && b == b'\\' {
                        if bytes.get(at + 1) == Some(&b'\n') {
                            line += 1;
                            line_start = at + 2;
                        }
                        at += 2;
                        continue;
                    }
                    if b == quote {
                        if quote == b'\'' && bytes.get(at + 1) == Some(&b'\'') {
                            at += 2;
                            continue;
                        }
                        break;
                    }
                    at += 1;
                }
                node_start = false;
                after_space = false;
                json_like = true;
                at += 1;
                continue;
            }
            b'[' | b'{' => {
                open_bracket(&mut depth, max_depth, line, at - line_start + 1)?;
                node_start = true;
                after_space = false;
            }
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                node_start = false;
                after_space = false;
                json_like = true;
                at += 1;
                continue;
            }
            b',' if depth > 0 => {
                node_start = true;
                after_space = false;
            }
            b':' if next_is_space || (depth > 0 && json_like) => {
                node_start = true;
                after_space = false;
            }
            b'-' | b'?' if next_is_space => {
                node_start = true;
                after_space = false;
            }
            b'|' | b'>' if node_start && depth == 0 => {
                block_scalar = Some((indent, None));
                at = end_of_line(at);
                continue;
            }
            b'!' | b'&' if node_start => {
                // A tag or an anchor: the node starts after it.
                while at < bytes.len() && !matches!(bytes[at], b' ' | b'\t' | b'\n') {
                    at += 1;
                }
                continue;
            }
            b' ' | b'\t' | b'\r' => {
                after_space = true;
                at += 1;
                continue;
            }
            _ => {
                node_start = false;
                after_space = false;
            }
        }
        json_like = false;
        at += 1;
    }
    Ok(())
}
