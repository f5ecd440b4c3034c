//! A team's own model code as the code layer of a graph artifact (issue 31): built from a
//! Python package directory or a wheel by `raypipe dag push --code`, checked by the operator
//! before it is served to Ray, extracted by `raypipe dag pull --code-dir`.
//!
//! The layer is exactly the zip Ray loads through `runtime_env.py_modules`: every entry under
//! one top-level directory (Ray strips it, so the package directories land on `sys.path`),
//! entries stored (not compressed), sorted, with fixed timestamps, so the same files always
//! give the same bytes and so the same digest. Stored entries also mean that what a zip
//! unpacks to is never larger than the layer itself: no decompression bomb can reach a Ray
//! node, whatever the archive claims.
//!
//! Everything read here is hostile: the archive's sizes, offsets, counts and names are
//! checked against the bytes actually there before anything is allocated for them, names
//! must be relative paths without `..` (no traversal), and symbolic links are refused.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use super::PythonPackage;

/// Largest code layer anything accepts (the CLI builds, the operator serves); a pipeline's
/// `source.maxCodeBytes` is at most this.
pub const MAX_CODE_BYTES: u64 = 1024 * 1024 * 1024;
/// Default `source.maxCodeBytes`.
pub const DEFAULT_MAX_CODE_BYTES: u64 = 64 * 1024 * 1024;
/// Most entries (files and directories) a code layer may hold.
pub const MAX_ENTRIES: usize = 10_000;
/// Longest entry name, in bytes.
pub const MAX_NAME_BYTES: usize = 512;
/// Most directory levels of an entry name.
const MAX_DEPTH: usize = 32;

const LOCAL_HEADER: u32 = 0x0403_4b50;
const CENTRAL_HEADER: u32 = 0x0201_4b50;
const END_OF_CENTRAL_DIRECTORY: u32 = 0x0605_4b50;
const METHOD_STORED: u16 = 0;
const METHOD_DEFLATED: u16 = 8;
const FLAG_ENCRYPTED: u16 = 1;
const S_IFMT: u32 = 0o170_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFREG: u32 = 0o100_000;
const S_IFDIR: u32 = 0o040_000;

/// Why code could not be packed, checked or extracted.
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a Python package: {problem}")]
    NotAPackage { path: String, problem: String },
    #[error("{path} holds more than {limit} files")]
    TooManyFiles { path: String, limit: usize },
    #[error("{path} holds more than {limit} bytes of code")]
    TooLarge { path: String, limit: u64 },
    #[error("{path} is a symbolic link: copy the file into the package instead")]
    Symlink { path: String },
    /// A malformed or unsafe archive (the operator's `InvalidCodeLayer`).
    #[error("the code archive is not usable: {0}")]
    Archive(String),
}

impl CodeError {
    fn archive(problem: impl Into<String>) -> CodeError {
        CodeError::Archive(problem.into())
    }
}

/// One entry of a checked archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The full name in the archive (`<wrapper>/pkg/mod.py`; directories end in `/`).
    pub name: String,
    /// Where its data starts and how long it is (within the archive's bytes).
    pub offset: usize,
    pub len: usize,
    /// Compressed with deflate (wheels only; code layers are always stored).
    pub deflated: bool,
    /// The size it inflates to, as declared (equal to `len` when stored).
    pub size: u64,
}

impl Entry {
    pub fn is_dir(&self) -> bool {
        self.name.ends_with('/')
    }
}

/// What a checked code layer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeSummary {
    /// The top-level directory Ray strips.
    pub wrapper: String,
    /// The names under it that land on `sys.path` (packages, modules, `.dist-info`).
    pub modules: Vec<String>,
    pub files: usize,
    pub entries: Vec<Entry>,
}

impl CodeSummary {
    /// The files (not directories) as (path below the wrapper, bytes).
    pub fn files<'a>(&self, archive: &'a [u8]) -> Vec<(String, &'a [u8])> {
        self.entries
            .iter()
            .filter(|e| !e.is_dir())
            .map(|e| {
                let below = e.name[self.wrapper.len() + 1..].to_owned();
                (below, &archive[e.offset..e.offset + e.len])
            })
            .collect()
    }
}

/// Checks a code layer: a well-formed zip of stored entries, safe names, no links, every
/// entry under one top-level directory, at least one file.
pub fn check(archive: &[u8]) -> Result<CodeSummary, CodeError> {
    let entries = read_entries(archive, false)?;
    let mut wrapper: Option<&str> = None;
    let mut modules = std::collections::BTreeSet::new();
    let mut files = 0;
    for entry in &entries {
        let (top, rest) = entry.name.split_once('/').ok_or_else(|| {
            CodeError::archive(format!(
                "{:?} is not inside a top-level directory",
                entry.name
            ))
        })?;
        match wrapper {
            None => wrapper = Some(top),
            Some(w) if w != top => {
                return Err(CodeError::archive(format!(
                    "entries sit under more than one top-level directory ({w:?}, {top:?}): Ray \
                     strips exactly one"
                )));
            }
            Some(_) => {}
        }
        if let Some(module) = rest.split('/').next().filter(|m| !m.is_empty()) {
            modules.insert(module.to_owned());
        }
        if !entry.is_dir() {
            files += 1;
        }
    }
    let wrapper = wrapper.unwrap_or_default().to_owned();
    if files == 0 {
        return Err(CodeError::archive("it holds no file"));
    }
    Ok(CodeSummary {
        wrapper,
        modules: modules.into_iter().collect(),
        files,
        entries,
    })
}

/// Extracts a code layer's files into `dir` (created; it must not exist or be empty), below
/// the top-level directory (`dir/<package>/…`). Returns the number of files written.
pub fn extract(archive: &[u8], dir: &Path) -> Result<usize, CodeError> {
    let summary = check(archive)?;
    let shown = dir.display().to_string();
    let write_error = |source| CodeError::Write {
        path: shown.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(write_error)?;
    if std::fs::read_dir(dir)
        .map_err(write_error)?
        .next()
        .is_some()
    {
        return Err(CodeError::Write {
            path: shown.clone(),
            source: std::io::Error::other("the directory is not empty"),
        });
    }
    let mut written = 0;
    for (path, bytes) in summary.files(archive) {
        // Names were checked: relative, no `..`, no empty or `.` components.
        let target: PathBuf = dir.join(&path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(write_error)?;
        }
        // `create_new` never follows or replaces anything already there.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&target)
            .map_err(|source| CodeError::Write {
                path: target.display().to_string(),
                source,
            })?;
        std::io::Write::write_all(&mut file, bytes).map_err(|source| CodeError::Write {
            path: target.display().to_string(),
            source,
        })?;
        written += 1;
    }
    Ok(written)
}

/// Packs `path` as a code layer: a package directory (it holds `__init__.py`; its name is
/// the import name) or a wheel (`.whl`: its contents, without `*.data/`).
pub fn pack(path: &Path) -> Result<PythonPackage, CodeError> {
    let shown = path.display().to_string();
    let meta = std::fs::symlink_metadata(path).map_err(|source| CodeError::Read {
        path: shown.clone(),
        source,
    })?;
    if meta.is_dir() {
        pack_dir(path)
    } else if path.extension().is_some_and(|e| e == "whl") {
        pack_wheel(path)
    } else {
        Err(CodeError::NotAPackage {
            path: shown,
            problem: "give a package directory (with __init__.py) or a wheel (.whl)".into(),
        })
    }
}

fn pack_dir(dir: &Path) -> Result<PythonPackage, CodeError> {
    let shown = dir.display().to_string();
    let not_a_package = |problem: String| CodeError::NotAPackage {
        path: shown.clone(),
        problem,
    };
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    if !is_identifier(&name) {
        return Err(not_a_package(format!(
            "its name {name:?} is not a Python identifier (it is the import name)"
        )));
    }
    if !dir.join("__init__.py").is_file() {
        return Err(not_a_package("it has no __init__.py".into()));
    }
    let mut files = Vec::new();
    let mut total = 0u64;
    collect(dir, dir, &mut files, &mut total)?;
    let files: Vec<(String, Vec<u8>)> = files
        .into_iter()
        .map(|(rel, bytes)| (format!("{name}/{rel}"), bytes))
        .collect();
    Ok(PythonPackage::from_files(&name, &files))
}

/// Every file below `dir`, bounded in count and bytes; hidden files, `__pycache__` and
/// compiled `.pyc` files left out (they depend on the machine, not the code).
fn collect(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(String, Vec<u8>)>,
    total: &mut u64,
) -> Result<(), CodeError> {
    let read_error = |path: &Path, source| CodeError::Read {
        path: path.display().to_string(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(|e| read_error(dir, e))? {
        let entry = entry.map_err(|e| read_error(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "__pycache__" || name.ends_with(".pyc") {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| read_error(&path, e))?;
        if kind.is_symlink() {
            return Err(CodeError::Symlink {
                path: path.display().to_string(),
            });
        }
        if kind.is_dir() {
            collect(root, &path, out, total)?;
            continue;
        }
        if out.len() >= MAX_ENTRIES {
            return Err(CodeError::TooManyFiles {
                path: root.display().to_string(),
                limit: MAX_ENTRIES,
            });
        }
        let size = entry.metadata().map_err(|e| read_error(&path, e))?.len();
        *total = total.saturating_add(size);
        if *total > MAX_CODE_BYTES {
            return Err(CodeError::TooLarge {
                path: root.display().to_string(),
                limit: MAX_CODE_BYTES,
            });
        }
        let rel = path
            .strip_prefix(root)
            .map_err(|e| read_error(&path, std::io::Error::other(e)))?
            .to_string_lossy()
            .replace('\\', "/");
        check_name(&rel)?;
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .and_then(|f| f.take(size + 1).read_to_end(&mut bytes))
            .map_err(|e| read_error(&path, e))?;
        out.push((rel, bytes));
    }
    Ok(())
}

fn pack_wheel(path: &Path) -> Result<PythonPackage, CodeError> {
    let shown = path.display().to_string();
    let mut archive = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CODE_BYTES + 1).read_to_end(&mut archive))
        .map_err(|source| CodeError::Read {
            path: shown.clone(),
            source,
        })?;
    if archive.len() as u64 > MAX_CODE_BYTES {
        return Err(CodeError::TooLarge {
            path: shown,
            limit: MAX_CODE_BYTES,
        });
    }
    // `name-version-…whl`: the distribution name names the wrapper directory.
    let stem = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name: String = stem
        .split('-')
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let name = if name.is_empty() {
        "wheel".to_owned()
    } else {
        name
    };
    let mut files = Vec::new();
    let mut total = 0u64;
    for entry in read_entries(&archive, true)? {
        let top = entry.name.split('/').next().unwrap_or_default();
        // `.data/` holds scripts and headers an installer places elsewhere.
        if entry.is_dir() || top.ends_with(".data") {
            continue;
        }
        total = total.saturating_add(entry.size);
        if total > MAX_CODE_BYTES {
            return Err(CodeError::TooLarge {
                path: shown,
                limit: MAX_CODE_BYTES,
            });
        }
        let data = &archive[entry.offset..entry.offset + entry.len];
        let bytes = if entry.deflated {
            inflate(data, entry.size, &entry.name)?
        } else {
            data.to_vec()
        };
        files.push((entry.name, bytes));
    }
    if files.is_empty() {
        return Err(CodeError::NotAPackage {
            path: shown,
            problem: "the wheel holds no file".into(),
        });
    }
    Ok(PythonPackage::from_files(&name, &files))
}

/// Inflates one wheel entry to exactly its declared size (never more).
fn inflate(data: &[u8], size: u64, name: &str) -> Result<Vec<u8>, CodeError> {
    let mut out = Vec::new();
    flate2::read::DeflateDecoder::new(data)
        .take(size + 1)
        .read_to_end(&mut out)
        .map_err(|e| CodeError::archive(format!("{name:?} does not inflate: {e}")))?;
    if out.len() as u64 != size {
        return Err(CodeError::archive(format!(
            "{name:?} inflates to {} bytes, not the {size} it declares",
            out.len()
        )));
    }
    Ok(out)
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A safe relative name: not empty, bounded, no NUL, backslash or control characters, no
/// absolute path, no `.`/`..`/empty components (a directory's trailing `/` aside).
fn check_name(name: &str) -> Result<(), CodeError> {
    let bad = |why: &str| {
        CodeError::archive(format!(
            "entry name {:?} {why}",
            name.chars().take(100).collect::<String>()
        ))
    };
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(bad("is empty or too long"));
    }
    if name.chars().any(|c| c.is_control() || c == '\\') {
        return Err(bad("holds a control character or a backslash"));
    }
    let trimmed = name.strip_suffix('/').unwrap_or(name);
    if trimmed.starts_with('/') {
        return Err(bad("is absolute"));
    }
    let parts: Vec<&str> = trimmed.split('/').collect();
    if parts.len() > MAX_DEPTH {
        return Err(bad("is nested too deeply"));
    }
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return Err(bad("has an empty, '.' or '..' component"));
    }
    // Belt and braces: the platform's own reading of the path must agree.
    if Path::new(trimmed)
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(bad("is not a plain relative path"));
    }
    Ok(())
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// Reads and checks the central directory and each entry's local header. `allow_deflate`:
/// a wheel (deflated entries inflated later, to their declared size); a code layer must be
/// stored.
fn read_entries(archive: &[u8], allow_deflate: bool) -> Result<Vec<Entry>, CodeError> {
    let truncated = || CodeError::archive("it is truncated or not a zip archive");
    if archive.len() < 22 {
        return Err(truncated());
    }
    // The end record sits in the last 22 bytes plus at most a 64 KiB comment.
    let earliest = archive.len().saturating_sub(22 + 0xFFFF);
    let end = (earliest..=archive.len() - 22)
        .rev()
        .find(|&at| {
            u32_at(archive, at) == Some(END_OF_CENTRAL_DIRECTORY)
                && u16_at(archive, at + 20).map(usize::from) == Some(archive.len() - at - 22)
        })
        .ok_or_else(truncated)?;
    let disk = u16_at(archive, end + 4).ok_or_else(truncated)?;
    let cd_disk = u16_at(archive, end + 6).ok_or_else(truncated)?;
    let here = u16_at(archive, end + 8).ok_or_else(truncated)?;
    let count = u16_at(archive, end + 10).ok_or_else(truncated)?;
    let cd_size = u32_at(archive, end + 12).ok_or_else(truncated)?;
    let cd_offset = u32_at(archive, end + 16).ok_or_else(truncated)?;
    if disk != 0 || cd_disk != 0 || here != count {
        return Err(CodeError::archive("it spans several disks"));
    }
    if count == u16::MAX || cd_size == u32::MAX || cd_offset == u32::MAX {
        return Err(CodeError::archive("ZIP64 archives are not accepted"));
    }
    let count = usize::from(count);
    if count > MAX_ENTRIES {
        return Err(CodeError::archive(format!(
            "it has {count} entries, more than {MAX_ENTRIES}"
        )));
    }
    let (cd_offset, cd_size) = (cd_offset as usize, cd_size as usize);
    if cd_offset.checked_add(cd_size) != Some(end) {
        return Err(CodeError::archive(
            "its central directory does not end where the end record starts",
        ));
    }
    // Each central record takes at least 46 bytes: a count the directory cannot hold is a lie.
    if count.saturating_mul(46) > cd_size {
        return Err(truncated());
    }
    let mut entries = Vec::with_capacity(count);
    let mut names = std::collections::HashSet::with_capacity(count);
    let mut at = cd_offset;
    for _ in 0..count {
        if u32_at(archive, at) != Some(CENTRAL_HEADER) {
            return Err(truncated());
        }
        let made_by = u16_at(archive, at + 4).ok_or_else(truncated)?;
        let flags = u16_at(archive, at + 8).ok_or_else(truncated)?;
        let method = u16_at(archive, at + 10).ok_or_else(truncated)?;
        let compressed = u32_at(archive, at + 20).ok_or_else(truncated)? as usize;
        let size = u32_at(archive, at + 24).ok_or_else(truncated)?;
        let name_len = usize::from(u16_at(archive, at + 28).ok_or_else(truncated)?);
        let extra_len = usize::from(u16_at(archive, at + 30).ok_or_else(truncated)?);
        let comment_len = usize::from(u16_at(archive, at + 32).ok_or_else(truncated)?);
        let attributes = u32_at(archive, at + 38).ok_or_else(truncated)?;
        let local = u32_at(archive, at + 42).ok_or_else(truncated)? as usize;
        let name_bytes = archive
            .get(at + 46..at + 46 + name_len)
            .ok_or_else(truncated)?;
        let next = at + 46 + name_len + extra_len + comment_len;
        if next > end {
            return Err(truncated());
        }
        at = next;
        let name = std::str::from_utf8(name_bytes)
            .map_err(|_| CodeError::archive("an entry name is not UTF-8"))?
            .to_owned();
        check_name(&name)?;
        if !names.insert(name.clone()) {
            return Err(CodeError::archive(format!("{name:?} appears twice")));
        }
        if flags & FLAG_ENCRYPTED != 0 {
            return Err(CodeError::archive(format!("{name:?} is encrypted")));
        }
        let deflated = match method {
            METHOD_STORED => false,
            METHOD_DEFLATED if allow_deflate => true,
            other => {
                return Err(CodeError::archive(format!(
                    "{name:?} uses compression method {other}; a code layer's entries are \
                     stored (push it with `raypipe dag push --code`)"
                )));
            }
        };
        if !deflated && compressed as u64 != u64::from(size) {
            return Err(CodeError::archive(format!(
                "{name:?} is stored but declares two different sizes"
            )));
        }
        // Unix file types (made by Unix: the mode is in the attributes' high half).
        if made_by >> 8 == 3 {
            let kind = (attributes >> 16) & S_IFMT;
            if kind == S_IFLNK {
                return Err(CodeError::archive(format!("{name:?} is a symbolic link")));
            }
            if kind != 0 && kind != S_IFREG && kind != S_IFDIR {
                return Err(CodeError::archive(format!(
                    "{name:?} is not a regular file or directory"
                )));
            }
        }
        if name.ends_with('/') && size != 0 {
            return Err(CodeError::archive(format!(
                "the directory {name:?} has content"
            )));
        }
        // The local header must agree with the central one, and its data lie before the
        // central directory.
        if u32_at(archive, local) != Some(LOCAL_HEADER) {
            return Err(CodeError::archive(format!(
                "{name:?} has no local header where the directory says"
            )));
        }
        let local_name_len = usize::from(u16_at(archive, local + 26).ok_or_else(truncated)?);
        let local_extra_len = usize::from(u16_at(archive, local + 28).ok_or_else(truncated)?);
        if archive.get(local + 30..local + 30 + local_name_len) != Some(name_bytes) {
            return Err(CodeError::archive(format!(
                "{name:?}: the local header names another file"
            )));
        }
        let offset = local + 30 + local_name_len + local_extra_len;
        if offset
            .checked_add(compressed)
            .is_none_or(|data_end| data_end > cd_offset)
        {
            return Err(truncated());
        }
        entries.push(Entry {
            name,
            offset,
            len: compressed,
            deflated,
            size: u64::from(size),
        });
    }
    // No two entries may share bytes (overlapping entries are how zip bombs multiply).
    let mut spans: Vec<(usize, usize)> = entries.iter().map(|e| (e.offset, e.len)).collect();
    spans.sort_unstable();
    if spans
        .windows(2)
        .any(|pair| pair[0].0 + pair[0].1 > pair[1].0.saturating_sub(30))
    {
        return Err(CodeError::archive("two entries overlap"));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pypackage::stored_zip;

    fn layer(files: &[(&str, &[u8])]) -> Vec<u8> {
        let files: Vec<(String, Vec<u8>)> = files
            .iter()
            .map(|(n, b)| ((*n).to_owned(), b.to_vec()))
            .collect();
        PythonPackage::from_files("team", &files).bytes.to_vec()
    }

    #[test]
    fn a_packed_layer_checks_and_lists_its_modules() {
        let bytes = layer(&[("team/__init__.py", b""), ("team/models.py", b"X = 1\n")]);
        let summary = check(&bytes).expect("valid");
        assert_eq!(summary.modules, vec!["team".to_owned()]);
        assert_eq!(summary.files, 2);
        assert!(summary.wrapper.starts_with("team-"));
        let files = summary.files(&bytes);
        assert_eq!(files[1], ("team/models.py".to_owned(), &b"X = 1\n"[..]));
    }

    #[test]
    fn hostile_names_are_refused() {
        for name in [
            "w/../etc/passwd",
            "/abs/x.py",
            "w//x.py",
            "w/./x.py",
            "w/a\\b.py",
            "w/a\u{0}b",
            "..",
        ] {
            let zip = stored_zip(&[(name.to_owned(), b"x".as_slice())]);
            assert!(
                matches!(check(&zip), Err(CodeError::Archive(_))),
                "{name:?} must be refused"
            );
        }
    }

    #[test]
    fn entries_outside_one_wrapper_links_and_compression_are_refused() {
        let two = stored_zip(&[
            ("a/x.py".to_owned(), b"x".as_slice()),
            ("b/y.py".to_owned(), b"y".as_slice()),
        ]);
        assert!(check(&two).is_err());
        let top = stored_zip(&[("x.py".to_owned(), b"x".as_slice())]);
        assert!(check(&top).is_err());
        // A symbolic link: the mode in the central directory's external attributes.
        let mut link = stored_zip(&[("w/l".to_owned(), b"/etc/passwd".as_slice())]);
        let cd = link.len() - 22 - (46 + 3);
        link[cd + 38..cd + 42].copy_from_slice(&(0o120_777u32 << 16).to_le_bytes());
        assert!(matches!(check(&link), Err(CodeError::Archive(m)) if m.contains("symbolic")));
        // A deflated entry (method 8) in a code layer.
        let mut deflated = stored_zip(&[("w/x.py".to_owned(), b"x".as_slice())]);
        deflated[8] = 8;
        let cd = deflated.len() - 22 - (46 + 6);
        deflated[cd + 10] = 8;
        assert!(matches!(check(&deflated), Err(CodeError::Archive(m)) if m.contains("method 8")));
    }

    #[test]
    fn lying_sizes_counts_and_offsets_are_refused_without_allocating_for_them() {
        let good = layer(&[("team/__init__.py", b"print(1)\n")]);
        // A count far beyond what the directory can hold.
        let mut many = good.clone();
        let end = many.len() - 22;
        many[end + 8..end + 10].copy_from_slice(&9_000u16.to_le_bytes());
        many[end + 10..end + 12].copy_from_slice(&9_000u16.to_le_bytes());
        assert!(check(&many).is_err());
        // A size running past the data.
        let mut long = good.clone();
        let cd = u32_at(&long, end + 16).unwrap() as usize;
        long[cd + 20..cd + 28].copy_from_slice(&[0xff, 0xff, 0xff, 0x0f, 0xff, 0xff, 0xff, 0x0f]);
        assert!(check(&long).is_err());
        // Truncated and garbage input.
        assert!(check(&good[..good.len() - 1]).is_err());
        assert!(check(b"not a zip at all, not even close........").is_err());
        assert!(check(b"").is_err());
    }

    #[test]
    fn packing_a_directory_is_reproducible_and_extracts_to_the_same_files() {
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join("team_models");
        std::fs::create_dir_all(package.join("sub/__pycache__")).unwrap();
        std::fs::write(package.join("__init__.py"), b"").unwrap();
        std::fs::write(package.join("sub/m.py"), b"Y = 2\n").unwrap();
        std::fs::write(package.join("sub/__pycache__/m.cpython-311.pyc"), b"junk").unwrap();
        std::fs::write(package.join(".hidden"), b"junk").unwrap();
        let a = pack(&package).expect("packed");
        // Other timestamps, same content: the same bytes.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(package.join("sub/m.py"), b"Y = 2\n").unwrap();
        let b = pack(&package).expect("packed again");
        assert_eq!(a.bytes, b.bytes);
        let summary = check(&a.bytes).expect("valid");
        assert_eq!(summary.modules, vec!["team_models".to_owned()]);
        assert_eq!(summary.files, 2, "hidden files and caches are left out");
        let out = dir.path().join("out");
        assert_eq!(extract(&a.bytes, &out).unwrap(), 2);
        assert_eq!(
            std::fs::read(out.join("team_models/sub/m.py")).unwrap(),
            b"Y = 2\n"
        );
        // Never into a directory that holds something.
        assert!(extract(&a.bytes, &out).is_err());
        // Not a package: no __init__.py, or a name Python cannot import.
        std::fs::remove_file(package.join("__init__.py")).unwrap();
        assert!(matches!(pack(&package), Err(CodeError::NotAPackage { .. })));
        let odd = dir.path().join("not-an-identifier");
        std::fs::create_dir_all(&odd).unwrap();
        std::fs::write(odd.join("__init__.py"), b"").unwrap();
        assert!(matches!(pack(&odd), Err(CodeError::NotAPackage { .. })));
    }

    #[test]
    fn symbolic_links_in_a_package_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join("pkg");
        std::fs::create_dir_all(&package).unwrap();
        std::fs::write(package.join("__init__.py"), b"").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", package.join("secrets.py")).unwrap();
        assert!(matches!(pack(&package), Err(CodeError::Symlink { .. })));
    }

    #[test]
    fn a_wheel_is_repacked_stored_without_its_data_directory() {
        use std::io::Write as _;
        // A wheel as pip builds it: deflated entries.
        let content = b"def f():\n    return 42\n".repeat(20);
        let mut deflated = Vec::new();
        let mut encoder =
            flate2::write::DeflateEncoder::new(&mut deflated, flate2::Compression::default());
        encoder.write_all(&content).unwrap();
        encoder.finish().unwrap();
        let mut zip = stored_zip(&[
            ("wpkg/__init__.py".to_owned(), deflated.as_slice()),
            (
                "wpkg-1.0.data/scripts/tool".to_owned(),
                b"#!/bin/sh".as_slice(),
            ),
        ]);
        // Turn the first entry into a deflated one of the real size.
        let first_local = 0;
        zip[first_local + 8] = 8;
        zip[first_local + 22..first_local + 26]
            .copy_from_slice(&(content.len() as u32).to_le_bytes());
        let end = zip.len() - 22;
        let cd = u32_at(&zip, end + 16).unwrap() as usize;
        zip[cd + 10] = 8;
        zip[cd + 24..cd + 28].copy_from_slice(&(content.len() as u32).to_le_bytes());
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("wpkg-1.0-py3-none-any.whl");
        std::fs::write(&wheel, &zip).unwrap();
        let package = pack(&wheel).expect("a wheel packs");
        let summary = check(&package.bytes).expect("stored and valid");
        assert_eq!(summary.modules, vec!["wpkg".to_owned()]);
        let files = summary.files(&package.bytes);
        assert_eq!(
            files,
            vec![("wpkg/__init__.py".to_owned(), content.as_slice())]
        );
    }
}
