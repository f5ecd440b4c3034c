//! Python packages Ray loads through `runtime_env.py_modules` / `working_dir` URIs: a zip per
//! package, content-addressed so Ray (which caches packages by URI) fetches a changed package
//! again, and served over HTTP by the operator.
//!
//! Ray strips a zip's single top-level directory, so a module `m` sits at `<wrapper>/m/…`.
//! The zips are "stored" (not compressed): the runtime is a few dozen kB of Python and a
//! byte-for-byte reproducible archive needs no compression library.
//!
//! A team's own code travels the same way (issue 31): [`code`] packs, checks and extracts the
//! code layer of a graph artifact, and [`store`] holds the verified layers the package server
//! hands to Ray by digest.

pub mod code;
pub mod store;

pub use store::CodeStore;

use std::path::Path;
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};

/// The graph runtime's sources, embedded at build time (see build.rs).
const RUNTIME_FILES: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/runtime_files.rs"));

/// One zipped package and the name it is served under.
#[derive(Clone, Debug)]
pub struct PythonPackage {
    /// `<name>-<first 16 hex digits of the sha256>.zip`.
    pub file_name: String,
    pub sha256: String,
    pub bytes: Arc<Vec<u8>>,
}

impl PythonPackage {
    /// Zips `files` (paths relative to the package root, e.g. `raypipe_runtime/app.py`) under a
    /// wrapper directory named after the content.
    pub fn from_files(name: &str, files: &[(String, Vec<u8>)]) -> PythonPackage {
        let mut sorted: Vec<&(String, Vec<u8>)> = files.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut hasher = Sha256::new();
        for (path, bytes) in &sorted {
            hasher.update((path.len() as u64).to_le_bytes());
            hasher.update(path.as_bytes());
            hasher.update((bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        }
        let sha256 = hex::encode(hasher.finalize());
        let wrapper = format!("{name}-{}", &sha256[..16]);
        let entries: Vec<(String, &[u8])> = sorted
            .iter()
            .map(|(path, bytes)| (format!("{wrapper}/{path}"), bytes.as_slice()))
            .collect();
        PythonPackage {
            file_name: format!("{wrapper}.zip"),
            sha256,
            bytes: Arc::new(stored_zip(&entries)),
        }
    }

    /// Every file under `dir` (hidden files and `__pycache__` left out) as package `module`.
    pub fn from_dir(dir: &Path, module: &str) -> std::io::Result<PythonPackage> {
        let mut files = Vec::new();
        collect(dir, dir, &mut files)?;
        let files: Vec<(String, Vec<u8>)> = files
            .into_iter()
            .map(|(rel, bytes)| (format!("{module}/{rel}"), bytes))
            .collect();
        Ok(PythonPackage::from_files(module, &files))
    }

    /// The files of `dir` at the zip's top level (a `working_dir`).
    pub fn working_dir(dir: &Path, name: &str) -> std::io::Result<PythonPackage> {
        let mut files = Vec::new();
        collect(dir, dir, &mut files)?;
        Ok(PythonPackage::from_files(name, &files))
    }
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "__pycache__" {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            collect(root, &path, out)?;
        } else {
            let rel = path
                .strip_prefix(root)
                .map_err(std::io::Error::other)?
                .to_string_lossy()
                .replace('\\', "/");
            out.push((rel, std::fs::read(&path)?));
        }
    }
    Ok(())
}

/// The graph runtime (`raypipe_runtime`) as built into this binary. Zipped on first use and
/// kept (the admin server serves it only when Ray nodes fetch it through `--runtime-base-url`,
/// so an operator that never needs it never builds it); clones share the bytes.
pub fn runtime() -> PythonPackage {
    static RUNTIME: OnceLock<PythonPackage> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let files: Vec<(String, Vec<u8>)> = RUNTIME_FILES
                .iter()
                .map(|(path, bytes)| (format!("raypipe_runtime/{path}"), bytes.to_vec()))
                .collect();
            PythonPackage::from_files("raypipe_runtime", &files)
        })
        .clone()
}

/// The URI of `package` under `base_url` (e.g. `http://raypipe.ns.svc:8080/packages`).
pub fn uri(base_url: &str, package: &PythonPackage) -> String {
    format!("{}/{}", base_url.trim_end_matches('/'), package.file_name)
}

/// Routes `GET /packages/<file name>` to the packages' bytes (immutable: cache forever).
pub fn router(packages: Vec<PythonPackage>) -> axum::Router {
    let packages = Arc::new(packages);
    routes(move || packages.clone(), None)
}

/// [`router`], plus the code layers of `code` (`/packages/code-<sha256 hex>.zip`).
pub fn router_with_code(packages: Vec<PythonPackage>, code: CodeStore) -> axum::Router {
    let packages = Arc::new(packages);
    routes(move || packages.clone(), Some(code))
}

/// Like [`router`], but the packages are built by `build` on the first request only; code
/// layers from `code` when given.
pub fn lazy_router(build: fn() -> Vec<PythonPackage>, code: Option<CodeStore>) -> axum::Router {
    let packages = Arc::new(OnceLock::<Arc<Vec<PythonPackage>>>::new());
    routes(
        move || packages.get_or_init(|| Arc::new(build())).clone(),
        code,
    )
}

fn routes(
    packages: impl Fn() -> Arc<Vec<PythonPackage>> + Clone + Send + Sync + 'static,
    code: Option<CodeStore>,
) -> axum::Router {
    use axum::extract::Path as UrlPath;
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let zip = |bytes: bytes::Bytes| {
        (
            [
                (header::CONTENT_TYPE, "application/zip"),
                (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
            ],
            bytes,
        )
            .into_response()
    };
    axum::Router::new().route(
        "/packages/{file}",
        axum::routing::get(move |UrlPath(file): UrlPath<String>| {
            let packages = packages();
            let code = code.clone();
            async move {
                if let Some(p) = packages.iter().find(|p| p.file_name == file) {
                    return zip(bytes::Bytes::from(p.bytes.as_ref().clone()));
                }
                let layer = store::digest_of_file_name(&file);
                match (code, layer) {
                    (Some(code), Some(hex)) => match code.fetch(hex, store::LOAD_WAIT).await {
                        Some(bytes) => zip(bytes),
                        // Known but not pullable now: Ray retries a replica that failed to
                        // set up its runtime_env.
                        None if code.knows(hex) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "the code layer cannot be pulled from its registry now\n",
                        )
                            .into_response(),
                        None => (StatusCode::NOT_FOUND, "no such package\n").into_response(),
                    },
                    _ => (StatusCode::NOT_FOUND, "no such package\n").into_response(),
                }
            }
        }),
    )
}

/// A zip archive of `entries` without compression, with fixed timestamps (1980-01-01), so the
/// same files always give the same bytes.
pub fn stored_zip(entries: &[(String, &[u8])]) -> Vec<u8> {
    const DOS_TIME: u16 = 0;
    const DOS_DATE: u16 = (1 << 5) | 1; // 1980-01-01
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in entries {
        let crc = crc32(data);
        let offset = out.len() as u32;
        let size = data.len() as u32;
        let name_bytes = name.as_bytes();
        // Local file header.
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&20u16.to_le_bytes()); // version needed
        out.extend_from_slice(&(1u16 << 11).to_le_bytes()); // UTF-8 names
        out.extend_from_slice(&0u16.to_le_bytes()); // stored
        out.extend_from_slice(&DOS_TIME.to_le_bytes());
        out.extend_from_slice(&DOS_DATE.to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&(name_bytes.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes()); // extra
        out.extend_from_slice(name_bytes);
        out.extend_from_slice(data);
        // Central directory entry.
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&((3u16 << 8) | 20).to_le_bytes()); // made by: Unix
        central.extend_from_slice(&20u16.to_le_bytes());
        central.extend_from_slice(&(1u16 << 11).to_le_bytes());
        central.extend_from_slice(&0u16.to_le_bytes());
        central.extend_from_slice(&DOS_TIME.to_le_bytes());
        central.extend_from_slice(&DOS_DATE.to_le_bytes());
        central.extend_from_slice(&crc.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&size.to_le_bytes());
        central.extend_from_slice(&(name_bytes.len() as u16).to_le_bytes());
        central.extend_from_slice(&0u16.to_le_bytes()); // extra
        central.extend_from_slice(&0u16.to_le_bytes()); // comment
        central.extend_from_slice(&0u16.to_le_bytes()); // disk
        central.extend_from_slice(&0u16.to_le_bytes()); // internal attributes
        central.extend_from_slice(&(0o100644u32 << 16).to_le_bytes()); // -rw-r--r--
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name_bytes);
    }
    let central_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&central_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// CRC-32 (IEEE), as zip needs it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn packages_are_content_addressed_and_reproducible() {
        let files = vec![
            ("m/__init__.py".to_owned(), b"x = 1\n".to_vec()),
            ("m/a.py".to_owned(), b"y = 2\n".to_vec()),
        ];
        let a = PythonPackage::from_files("m", &files);
        let mut reversed = files.clone();
        reversed.reverse();
        let b = PythonPackage::from_files("m", &reversed);
        assert_eq!(a.file_name, b.file_name);
        assert_eq!(a.bytes, b.bytes);
        let mut changed = files.clone();
        changed[1].1 = b"y = 3\n".to_vec();
        let c = PythonPackage::from_files("m", &changed);
        assert_ne!(a.file_name, c.file_name);
        assert!(a.file_name.starts_with("m-") && a.file_name.ends_with(".zip"));
    }

    #[test]
    fn the_zip_lists_every_file_under_one_wrapper_directory() {
        let files = vec![("m/__init__.py".to_owned(), b"x = 1\n".to_vec())];
        let package = PythonPackage::from_files("m", &files);
        let bytes = package.bytes.as_ref();
        // End of central directory: one entry; the local header names the wrapped path.
        let eocd = &bytes[bytes.len() - 22..];
        assert_eq!(&eocd[..4], &0x0605_4b50u32.to_le_bytes());
        assert_eq!(u16::from_le_bytes([eocd[10], eocd[11]]), 1);
        let wrapper = package.file_name.trim_end_matches(".zip");
        let name_len = u16::from_le_bytes([bytes[26], bytes[27]]) as usize;
        assert_eq!(
            std::str::from_utf8(&bytes[30..30 + name_len]).unwrap(),
            format!("{wrapper}/m/__init__.py")
        );
    }

    #[tokio::test]
    async fn the_router_serves_each_package_by_its_file_name_only() {
        use tower::ServiceExt;
        let package = runtime();
        let app = router(vec![package.clone()]);
        let get = |path: String| {
            axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let response = app
            .clone()
            .oneshot(get(format!("/packages/{}", package.file_name)))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(body.as_ref(), package.bytes.as_slice());
        let missing = app
            .oneshot(get("/packages/raypipe_runtime-0000.zip".to_owned()))
            .await
            .unwrap();
        assert_eq!(missing.status(), 404);
        assert_eq!(
            uri("http://op.ns.svc:8080/packages/", &package),
            format!("http://op.ns.svc:8080/packages/{}", package.file_name)
        );
    }

    #[test]
    fn the_embedded_runtime_has_its_builder() {
        assert!(
            RUNTIME_FILES.iter().any(|(p, _)| *p == "app.py"),
            "{:?}",
            RUNTIME_FILES.iter().map(|(p, _)| p).collect::<Vec<_>>()
        );
        assert!(runtime().file_name.starts_with("raypipe_runtime-"));
    }

    /// build.rs embeds the package's `*.py` by listing its directory, so a new module travels
    /// to Ray without being named anywhere (and nothing of runtime/ outside it, such as
    /// pyproject.toml).
    #[test]
    fn the_embedded_runtime_is_every_module_of_the_package() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("runtime/raypipe_runtime");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("the runtime's directory")
            .map(|e| {
                e.expect("a directory entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name.ends_with(".py"))
            .collect();
        on_disk.sort();
        let embedded: Vec<String> = RUNTIME_FILES.iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(embedded, on_disk);
        for module in ["engine.py", "scheduler.py", "node_call.py", "assembly.py"] {
            assert!(
                embedded.iter().any(|p| p == module),
                "{module} is not embedded"
            );
        }
    }

    #[test]
    fn the_runtime_metadata_carries_raypipe_version() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("runtime/pyproject.toml");
        let pyproject = std::fs::read_to_string(&path).expect("runtime/pyproject.toml");
        let line = format!("version = \"{}\"", env!("CARGO_PKG_VERSION"));
        assert!(
            pyproject.lines().any(|l| l == line),
            "{} should say `{line}` (raypipe's version, Cargo.toml)",
            path.display()
        );
    }
}
