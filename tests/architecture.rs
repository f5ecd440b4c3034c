//! The import graph between the library's top-level modules, checked from the source text:
//! every `crate::<module>` reference in `src/**/*.rs` (in `use` items and in paths, test modules
//! included) is an arrow from the module that holds the file to `<module>`. The arrows must form
//! no cycle and must follow [`LAYERS`]: they point down, never at `cli`, and within one layer only
//! where [`SAME_LAYER`] says so.
//!
//! Pure and fast: it reads files, nothing else. Comments and string literals are blanked out
//! before the scan (a doc comment that names `crate::serve::render` is not an import); `super::`
//! paths stay inside their own top-level module and are not followed. `src/lib.rs` and
//! `src/main.rs` are the roots and sit above every layer.
//!
//! Inside `src/controllers/`, the same scan between files (`super::`, `self::` and child paths
//! followed too): a controller's files import one way, its `mod.rs` on top.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The layer of every top-level module of `src/`, highest first. An arrow may point only to a
/// higher layer number; a module missing here fails the test, so a new module gets a line.
const LAYERS: &[(&str, u8)] = &[
    ("cli", 1),         // argument parsing and subcommands; nothing imports it
    ("startup", 2),     // tracing and the rustls crypto provider, set up once by the binary
    ("devenv", 2),      // the dev environment behind the `dev` feature (`raypipe dev`)
    ("console", 2),     // the web console and dashboard front, served beside the controllers
    ("config", 3),      // every setting; builds each controller's `Config`
    ("present", 3),     // how a pipeline looks to a person: summaries, the running graph
    ("controllers", 4), // the five reconcilers and their shared frame
    ("webhook", 4),     // admission: turns validation problems into an answer
    ("admin", 4),       // metrics, health and readiness server
    ("leader", 4),      // leader election
    ("source", 5),      // downloads a graph from a registry
    ("history", 5),     // collector, revision recorder, readers and API (object storage)
    ("ray", 5),         // the Ray dashboard client
    ("serve", 5),       // renders a validated graph into a Serve config
    ("graph", 5),       // the model graph: decode, validate
    ("pypackage", 5),   // the Python graph runtime package
    ("validation", 5),  // pure validation of every kind: one rule book each, two judges
    ("kuberay", 6),     // the shared Ray vocabulary: keys, names, quantities, spec predicates
    ("k8s", 7),         // Kubernetes helpers (apply, events, conditions, stable hashes)
    ("tls", 7),         // the rustls crypto provider, and serving TLS from certificate files
    ("api", 8),         // the custom resource types (lowest)
];

/// The arrows allowed between two modules of the same layer (all others within a layer fail).
const SAME_LAYER: &[(&str, &str)] = &[
    ("controllers", "admin"), // reconcile metrics and readiness are recorded in the admin server
    ("webhook", "admin"),     // admission metrics
    ("leader", "admin"),      // leadership is reported by the readiness endpoint
    ("console", "devenv"),    // its tests sign in at the dev environment's OpenID provider
    ("console", "startup"),   // its tests set up the rustls provider
    ("devenv", "startup"),    // the OpenID provider's tests set up the rustls provider
    ("serve", "graph"),       // renders a validated graph
    ("source", "graph"),      // bounds a download by the graph size limit
    ("validation", "source"), // validates a ServePipeline's source settings with its own rules
];

/// One `crate::<to>` reference found in `file` at `line`.
struct Arrow {
    from: String,
    to: String,
    file: PathBuf,
    line: usize,
}

#[test]
fn the_module_graph_follows_the_layers_and_has_no_cycles() {
    let arrows = arrows();
    assert!(
        arrows.len() > 100,
        "only {} arrows found: is the scan broken?",
        arrows.len()
    );
    let layers: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut problems = String::new();
    for arrow in &arrows {
        let (from, to) = (arrow.from.as_str(), arrow.to.as_str());
        let why = match (layers.get(from), layers.get(to)) {
            (Some(_), Some(_)) if to == "cli" => "nothing may import cli".to_string(),
            (Some(&high), Some(&low)) if low < high => {
                format!("points up, from layer {high} to layer {low}")
            }
            (Some(&layer), Some(&same)) if same == layer && !SAME_LAYER.contains(&(from, to)) => {
                format!("within layer {layer}, not in SAME_LAYER")
            }
            (Some(_), Some(_)) => continue,
            _ => "module missing from LAYERS".to_string(),
        };
        let _ = writeln!(
            problems,
            "src/{}:{}: {from} -> {to}: {why}",
            arrow.file.display(),
            arrow.line,
        );
    }
    for cycle in cycles(&arrows) {
        let _ = writeln!(problems, "cycle: {cycle}");
    }
    assert!(problems.is_empty(), "import graph violations:\n{problems}");
}

/// Inside `src/controllers/`, files import one way (issue 30 item 1): a controller's `mod.rs`
/// on top, its stages below, what they share (settings, error, context, observed data) at the
/// bottom. A circle between files is a problem, named with the arrows that make it.
#[test]
fn controller_files_import_one_way() {
    let arrows = controller_file_arrows();
    assert!(
        arrows.len() > 100,
        "only {} file arrows found: is the scan broken?",
        arrows.len()
    );
    let problems: Vec<String> = cycles(&arrows)
        .into_iter()
        .map(|group| format!("file cycle: {group}"))
        .collect();
    assert!(
        problems.is_empty(),
        "controller files:\n{}",
        problems.join("\n")
    );
}

/// The stages inside a controller keep their places (issue 30 item 1): only the folder's
/// `mod.rs` starts a pass (nothing else imports `reconcile.rs`), a pure builder never reaches
/// the writes (`apply.rs`, `serve.rs`, `status_write.rs`) or the pass, the shared frame knows
/// no controller, and only the frame's pass (and ServePipeline's panic report) reaches
/// `frame/status.rs`: every status goes out through the one status stage.
#[test]
fn stages_keep_their_places() {
    let folder = |file: &str| file.split('/').next().unwrap_or_default().to_owned();
    let name = |file: &str| file.rsplit('/').next().unwrap_or_default().to_owned();
    let is_builder = |file: &str| {
        name(file) == "build.rs" || file.split('/').nth(1).is_some_and(|d| d == "builders")
    };
    let mut problems = Vec::new();
    for arrow in controller_file_arrows() {
        let (from, to) = (arrow.from.as_str(), arrow.to.as_str());
        let at = format!("{}:{}", arrow.file.display(), arrow.line);
        if name(to) == "reconcile.rs" && from != format!("{}/mod.rs", folder(to)) {
            problems.push(format!("{at}: {from} imports the pass {to}"));
        }
        if is_builder(from)
            && ["apply.rs", "serve.rs", "status_write.rs", "reconcile.rs"]
                .contains(&name(to).as_str())
        {
            problems.push(format!("{at}: the builder {from} reaches {to}"));
        }
        if folder(from) == "frame" && folder(to) != "frame" {
            problems.push(format!("{at}: the frame imports the controller file {to}"));
        }
        // A status is written by the pass's status stage (and a panic report), nowhere else.
        if to == "frame/status.rs" && !["frame/pass.rs", "servepipeline/mod.rs"].contains(&from) {
            problems.push(format!(
                "{at}: {from} writes a status outside the status stage"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "stages out of place:\n{}",
        problems.join("\n")
    );
}

/// Arrows between the files of `src/controllers/` (named relative to it, e.g. `rayjob/apply.rs`):
/// every path in a file's non-test code that names an item of another file there, through
/// `crate::`, `super::`, `self::` or a child module's name, `use` groups included.
fn controller_file_arrows() -> Vec<Arrow> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let root = src.join("controllers");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let module_of = |file: &Path| -> Vec<String> {
        let relative = file
            .strip_prefix(&src)
            .expect("under src")
            .with_extension("");
        let mut parts: Vec<String> = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        parts
    };
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| {
            (
                module_of(f),
                f.strip_prefix(&root)
                    .expect("under controllers")
                    .to_path_buf(),
            )
        })
        .collect();
    let mut arrows = Vec::new();
    for file in &files {
        let me = module_of(file);
        let from = modules[&me].display().to_string();
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let text = blank(&text);
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (path, line) in paths(code) {
            if let Some(to) = resolve(&modules, &me, &path) {
                let to = to.display().to_string();
                if to != from {
                    arrows.push(Arrow {
                        from: from.clone(),
                        to,
                        file: PathBuf::from("controllers").join(&from),
                        line,
                    });
                }
            }
        }
    }
    arrows
}

/// The file of the deepest module `path` (as written in module `me`) names, if it is one of
/// `modules`.
fn resolve(
    modules: &BTreeMap<Vec<String>, PathBuf>,
    me: &[String],
    path: &[String],
) -> Option<PathBuf> {
    let (mut base, rest): (Vec<String>, &[String]) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (me.to_vec(), &path[1..]),
        "super" => {
            let mut base = me[..me.len().saturating_sub(1)].to_vec();
            let mut k = 1;
            while path.get(k).is_some_and(|s| s == "super") {
                base.pop();
                k += 1;
            }
            (base, &path[k..])
        }
        first => {
            let child: Vec<String> = me.iter().cloned().chain([first.to_string()]).collect();
            if !modules.contains_key(&child) {
                return None;
            }
            (me.to_vec(), path)
        }
    };
    let mut target = modules.get(&base).cloned();
    for segment in rest {
        base.push(segment.clone());
        if let Some(file) = modules.get(&base) {
            target = Some(file.clone());
        }
    }
    target
}

/// Every `a::b::c` path in a blanked text with its line; a `use a::{b, c::d}` group gives one
/// path per item (`a::b`, `a::c::d`, nested groups by their first name).
fn paths(text: &str) -> Vec<(Vec<String>, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = ident_char(chars.get(i))
            && !ident_char(i.checked_sub(1).and_then(|p| chars.get(p)))
            && !(i >= 1 && chars[i - 1] == ':');
        if !starts {
            i += 1;
            continue;
        }
        let mut segments = vec![ident(&chars, i)];
        let mut j = i + segments[0].chars().count();
        while chars.get(j) == Some(&':') && chars.get(j + 1) == Some(&':') {
            let k = skip_space(&chars, j + 2);
            if chars.get(k) == Some(&'{') {
                let (items, close) = group_items(&chars, k);
                for item in items {
                    let mut path = segments.clone();
                    path.extend(item);
                    found.push((path, line_of(&chars, k)));
                }
                j = close;
                break;
            }
            if !ident_char(chars.get(k)) {
                break;
            }
            let segment = ident(&chars, k);
            j = k + segment.chars().count();
            segments.push(segment);
        }
        if segments.len() > 1 {
            found.push((segments, line_of(&chars, i)));
        }
        i = j.max(i + 1);
    }
    found
}

/// The items of the `{...}` group opening at `open` (each item's leading `a::b` names; a nested
/// group by its prefix), and where the group closes.
fn group_items(chars: &[char], open: usize) -> (Vec<Vec<String>>, usize) {
    let mut items = Vec::new();
    let mut k = open + 1;
    loop {
        k = skip_space(chars, k);
        match chars.get(k) {
            None | Some('}') => break,
            Some(',') => {
                k += 1;
                continue;
            }
            _ => {}
        }
        let mut path = Vec::new();
        while ident_char(chars.get(k)) {
            let name = ident(chars, k);
            k += name.chars().count();
            if name != "self" {
                path.push(name);
            }
            let j = skip_space(chars, k);
            if chars.get(j) == Some(&':') && chars.get(j + 1) == Some(&':') {
                k = skip_space(chars, j + 2);
            } else {
                k = j;
                break;
            }
        }
        if !path.is_empty() {
            items.push(path);
        }
        // The rest of the item (`as x`, a nested group) up to the next `,` or the closing `}`.
        let mut depth = 0;
        while let Some(&c) = chars.get(k) {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => break,
                _ => {}
            }
            k += 1;
        }
        if chars.get(k) != Some(&',') {
            break;
        }
    }
    (items, k)
}

#[test]
fn the_file_scan_resolves_super_self_children_and_groups() {
    let modules: BTreeMap<Vec<String>, PathBuf> = [
        (
            vec!["controllers".to_string(), "job".to_string()],
            "job/mod.rs",
        ),
        (
            vec!["controllers".into(), "job".into(), "apply".into()],
            "job/apply.rs",
        ),
        (
            vec!["controllers".into(), "job".into(), "status".into()],
            "job/status.rs",
        ),
    ]
    .into_iter()
    .map(|(m, f)| (m, PathBuf::from(f)))
    .collect();
    let apply = ["controllers".to_string(), "job".into(), "apply".into()];
    let text = "use super::{Context, status::write};\nfn f() { super::status::x(); crate::controllers::job::apply::y(); }";
    let found: Vec<String> = paths(text)
        .into_iter()
        .filter_map(|(p, _)| resolve(&modules, &apply, &p))
        .map(|f| f.display().to_string())
        .collect();
    assert_eq!(
        found,
        [
            "job/mod.rs",
            "job/status.rs",
            "job/status.rs",
            "job/apply.rs"
        ]
    );
    let parent = ["controllers".to_string(), "job".into()];
    let from_mod: Vec<String> = paths("use apply::Applied; fn g() { status::h() }")
        .into_iter()
        .filter_map(|(p, _)| resolve(&modules, &parent, &p))
        .map(|f| f.display().to_string())
        .collect();
    assert_eq!(from_mod, ["job/apply.rs", "job/status.rs"]);
}

#[test]
fn the_scan_sees_paths_and_groups_but_not_comments_or_strings() {
    let text = "use crate::{graph::{self, X}, serve};\n\
                // crate::cli in a comment\n\
                /* crate::cli /* nested */ crate::cli */\n\
                let s = \"crate::cli\"; let r = r#\"crate::cli\"#; let c = '\"';\n\
                fn f<'a>(x: &'a str) { crate::k8s::apply(x) }\n";
    let found: Vec<(String, usize)> = references(&blank(text));
    assert_eq!(
        found,
        [("graph".into(), 1), ("serve".into(), 1), ("k8s".into(), 5)]
    );
}

/// Every arrow between two different top-level modules.
fn arrows() -> Vec<Arrow> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut arrows = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src");
        let first = relative
            .components()
            .next()
            .expect("a file name")
            .as_os_str()
            .to_string_lossy();
        let from = first.trim_end_matches(".rs").to_string();
        if from == "lib" || from == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|error| panic!("{}: {error}", file.display()));
        for (to, line) in references(&blank(&text)) {
            if to != from {
                arrows.push(Arrow {
                    from: from.clone(),
                    to,
                    file: relative.to_path_buf(),
                    line,
                });
            }
        }
    }
    arrows
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut paths: Vec<PathBuf> = entries.map(|entry| entry.expect("entry").path()).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            into.push(path);
        }
    }
}

/// The text with comments, string and character literals replaced by spaces (newlines kept, so
/// line numbers stay true).
fn blank(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank_to = |out: &mut String, from: usize, to: usize| {
        for &c in &chars[from..to.min(chars.len())] {
            out.push(if c == '\n' { '\n' } else { ' ' });
        }
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let end = if c == '/' && next == Some('/') {
            chars[i..]
                .iter()
                .position(|&c| c == '\n')
                .map_or(chars.len(), |n| i + n)
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            let mut j = i;
            while j < chars.len() {
                if chars[j] == '/' && chars.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if chars[j] == '*' && chars.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            j
        } else if c == 'r'
            && matches!(next, Some('"' | '#'))
            && !ident_char(chars.get(i.wrapping_sub(1)))
        {
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) == Some(&'"') {
                let closing: Vec<char> = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                let body = i + 2 + hashes;
                (body..chars.len())
                    .find(|&j| chars[j..].starts_with(&closing))
                    .map_or(chars.len(), |j| j + closing.len())
            } else {
                i
            }
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            j + 1
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), or else a lifetime, left alone.
            if next == Some('\\') {
                // The escaped character itself may be a quote ('\'').
                chars
                    .get(i + 3..)
                    .and_then(|rest| rest.iter().position(|&c| c == '\''))
                    .map_or(chars.len(), |n| i + 3 + n + 1)
            } else if chars.get(i + 2) == Some(&'\'') {
                i + 3
            } else {
                i
            }
        } else {
            i
        };
        if end > i {
            blank_to(&mut out, i, end);
            i = end;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// The top-level module of every `crate::<module>` path and `crate::{<module>, ...}` group in
/// a blanked text, with its line.
fn references(text: &str) -> Vec<(String, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(at) = find(&chars, i, "crate") {
        i = at + "crate".len();
        if ident_char(at.checked_sub(1).and_then(|p| chars.get(p))) || ident_char(chars.get(i)) {
            continue;
        }
        let j = skip_space(&chars, i);
        if !(chars.get(j) == Some(&':') && chars.get(j + 1) == Some(&':')) {
            continue;
        }
        let j = skip_space(&chars, j + 2);
        if chars.get(j) == Some(&'{') {
            // A group: the first name of each top-level item.
            let mut depth = 0;
            let mut item_start = true;
            let mut k = j;
            while k < chars.len() {
                match chars[k] {
                    '{' => {
                        depth += 1;
                        if depth == 1 {
                            item_start = true;
                        }
                    }
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if item_start && depth == 1 && ident_char(Some(&c)) => {
                        let name = ident(&chars, k);
                        k += name.chars().count() - 1;
                        if name != "self" {
                            found.push((name, line_of(&chars, k)));
                        }
                        item_start = false;
                    }
                    _ => {}
                }
                k += 1;
            }
            i = k;
        } else if ident_char(chars.get(j)) {
            found.push((ident(&chars, j), line_of(&chars, j)));
        }
    }
    found
}

fn find(chars: &[char], from: usize, word: &str) -> Option<usize> {
    let word: Vec<char> = word.chars().collect();
    (from..chars.len()).find(|&i| chars[i..].starts_with(&word))
}

fn skip_space(chars: &[char], mut i: usize) -> usize {
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    i
}

fn ident(chars: &[char], from: usize) -> String {
    chars[from..]
        .iter()
        .take_while(|c| ident_char(Some(c)))
        .collect()
}

fn line_of(chars: &[char], at: usize) -> usize {
    chars[..at].iter().filter(|&&c| c == '\n').count() + 1
}

/// Every group of modules that reach each other (a strongly connected group of two or more),
/// each with the arrows inside it and where the first of each is written.
fn cycles(arrows: &[Arrow]) -> Vec<String> {
    let mut first: BTreeMap<(&str, &str), &Arrow> = BTreeMap::new();
    for arrow in arrows {
        first
            .entry((arrow.from.as_str(), arrow.to.as_str()))
            .or_insert(arrow);
    }
    let modules: BTreeSet<&str> = first.keys().flat_map(|&(a, b)| [a, b]).collect();
    // Reachability by repeated widening: a few dozen modules, so the simple way is fast.
    let mut reach: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for &(from, to) in first.keys() {
        reach.entry(from).or_default().insert(to);
    }
    loop {
        let mut grew = false;
        for &module in &modules {
            let direct: Vec<&str> = reach.get(module).into_iter().flatten().copied().collect();
            let further: BTreeSet<&str> = direct
                .iter()
                .flat_map(|to| reach.get(to).into_iter().flatten().copied())
                .collect();
            let set = reach.entry(module).or_default();
            let before = set.len();
            set.extend(further);
            grew |= set.len() > before;
        }
        if !grew {
            break;
        }
    }
    let mut groups: Vec<String> = Vec::new();
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    for &module in &modules {
        if placed.contains(module) || !reach[module].contains(module) {
            continue;
        }
        let group: BTreeSet<&str> = modules
            .iter()
            .copied()
            .filter(|other| reach[module].contains(other) && reach[other].contains(module))
            .collect();
        placed.extend(&group);
        let inside: Vec<String> = first
            .iter()
            .filter(|((from, to), _)| group.contains(from) && group.contains(to))
            .map(|((from, to), arrow)| {
                format!(
                    "{from} -> {to} (src/{}:{})",
                    arrow.file.display(),
                    arrow.line
                )
            })
            .collect();
        groups.push(format!(
            "{} reach each other: {}",
            group.into_iter().collect::<Vec<_>>().join(", "),
            inside.join("; ")
        ));
    }
    groups
}
