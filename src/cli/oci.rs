//! `raypipe dag push GRAPH REF` and `raypipe dag pull REF`: graphs as OCI artifacts in the
//! registries teams already run (`src/source/oci/`: the artifact's layout, the upload, the
//! pull with both digests checked, the registry token flow).
//!
//! Credentials, first found wins ([`CREDENTIALS_HELP`], shown by `--help`): `--username` with
//! `--password-stdin`; else what `docker login` left in the Docker config file
//! (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`), read in Docker's order
//! (`source::oci::docker_config`): a credential helper (`credHelpers`, `credsStore`; run by
//! `credential_helper`), else the `auths` entry; else anonymous.
//! Plain HTTP only with `--plain-http` (as oras has it): credentials then cross unencrypted.
//! The command line is the operator's own tool, so any destination is allowed (the SSRF rules
//! guard tenant-controlled `source.oci`, not this).
//!
//! Exit codes as every `raypipe dag` command: 0 success; 1 the graph is invalid (nothing was
//! pushed); 2 anything else (options, files, the registry).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use super::credential_helper;
use super::dag::{self, DagError, EXIT_INVALID, EXIT_OK, InputArgs};
use crate::graph::{self, Format};
use crate::source::oci::docker_config::Lookup;
use crate::source::oci::push::{CodeLayer, GraphArtifact, PushError, PushRequest};
use crate::source::oci::{DockerConfig, OciOutcome, OciReference, OciRequest, RegistryCredentials};
use crate::source::{AllowedDestination, DestinationPolicy, IpNetwork};
use crate::source::{Fetcher, FetcherOptions, SourceError};

/// The credentials part of `raypipe dag push --help` and `pull --help`.
pub const CREDENTIALS_HELP: &str = "\
Credentials, first found wins:
  1. --username with --password-stdin.
  2. The Docker config file ($DOCKER_CONFIG/config.json, else ~/.docker/config.json), in
     Docker's order:
     a. credHelpers.<registry>, else credsStore: runs `docker-credential-<name> get` (found on
        PATH); a helper that is not installed or fails is an error naming it;
     b. else auths.<registry>: registrytoken (sent to the registry as is), else identitytoken
        (an OAuth2 refresh token, as ACR, GCR and Docker Desktop logins write: exchanged at the
        registry's token endpoint), else username and password, else auth.
     Docker Hub entries are found under https://index.docker.io/v1/.
  3. Anonymous (with a note on standard error when the config or the helper had nothing
     usable for the registry).
--plain-http only for a registry without TLS: credentials then cross unencrypted.";

/// Longest a push or pull may take.
const TIMEOUT: Duration = Duration::from_secs(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest password read from standard input.
const MAX_PASSWORD_BYTES: u64 = 64 * 1024;

/// How to reach and authenticate to the registry.
#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// Registry user name (with --password-stdin); default: the Docker config (see below).
    #[arg(long, short = 'u', requires = "password_stdin")]
    pub username: Option<String>,
    /// Read the password (or access token) from standard input.
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
    /// Talk plain HTTP to the registry and its token endpoint (a local registry).
    #[arg(long)]
    pub plain_http: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct PushArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Where to push: REGISTRY/REPOSITORY:TAG (e.g. 127.0.0.1:8788/samples/fraud:v2).
    pub reference: String,
    /// The graph's own Python code, added as a code layer: a package directory (with
    /// __init__.py; its name is the import name) or a wheel (.whl). The same files always give
    /// the same layer, and the manifest digest (and a signature over it) pins graph and code.
    /// The operator serves it to Ray by digest.
    #[arg(long, value_name = "DIR|WHEEL")]
    pub code: Option<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct PullArgs {
    /// What to pull: REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST.
    pub reference: String,
    /// Write the graph here (default: standard output).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Format to write: protobuf (as stored), yaml or json.
    #[arg(long, value_enum, default_value_t = dag::InputFormat::Protobuf)]
    pub format: dag::InputFormat,
    /// Extract the artifact's code layer here (a new or empty directory), as Ray sees it: the
    /// package directories at its top.
    #[arg(long, value_name = "DIR")]
    pub code_dir: Option<PathBuf>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// Why a push or pull failed (the graph being invalid is not one of these: exit 1).
#[derive(Debug, thiserror::Error)]
pub enum OciCommandError {
    #[error(transparent)]
    Reference(#[from] crate::source::oci::ReferenceError),
    #[error("cannot read the password from standard input: {0}")]
    Password(std::io::Error),
    #[error("the password on standard input is empty")]
    EmptyPassword,
    #[error(transparent)]
    CredentialHelper(#[from] super::credential_helper::CredentialHelperError),
    #[error("cannot read {path}: {source}")]
    DockerConfig {
        path: String,
        source: std::io::Error,
    },
    #[error("push to {reference}: {source}")]
    Push {
        reference: String,
        source: PushError,
    },
    #[error("pull {reference}: {source}")]
    Pull {
        reference: String,
        source: SourceError,
    },
    #[error("{reference} holds a graph that does not decode: {problem}")]
    NotAGraph { reference: String, problem: String },
    #[error(transparent)]
    Code(#[from] crate::pypackage::code::CodeError),
    #[error("{reference} has no code layer to extract (push it with --code)")]
    NoCode { reference: String },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// The Docker config file: `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker").join("config.json"))
}

/// The credentials to use for `registry`, as the module header orders them.
fn credentials(
    args: &RegistryArgs,
    registry: &str,
    err: &mut dyn Write,
) -> Result<RegistryCredentials, OciCommandError> {
    if let Some(username) = &args.username {
        let mut password = String::new();
        std::io::stdin()
            .take(MAX_PASSWORD_BYTES)
            .read_to_string(&mut password)
            .map_err(OciCommandError::Password)?;
        // `echo pw | raypipe …` ends it with a newline that is not part of the password.
        let password = password.trim_end_matches(['\n', '\r']);
        if password.is_empty() {
            return Err(OciCommandError::EmptyPassword);
        }
        return Ok(RegistryCredentials::basic(username, password));
    }
    let Some(path) = docker_config_path() else {
        return Ok(RegistryCredentials::Anonymous);
    };
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(RegistryCredentials::Anonymous);
        }
        Err(source) => {
            return Err(OciCommandError::DockerConfig {
                path: path.display().to_string(),
                source,
            });
        }
    };
    let note = |problem: &dyn std::fmt::Display, err: &mut dyn Write| {
        // No entry (or an unusable one) is not fatal: the registry may allow anonymous
        // access, and if not its answer says so.
        let _ = writeln!(
            err,
            "note: no credentials from {}: {problem}; going on anonymously",
            path.display()
        );
        Ok(RegistryCredentials::Anonymous)
    };
    let lookup = DockerConfig::parse(&bytes).and_then(|config| config.lookup(registry));
    match lookup {
        Ok(Lookup::Credentials(credentials)) => Ok(credentials),
        Ok(Lookup::Helper(helper)) => {
            let program = helper.program();
            match credential_helper::get(
                OsStr::new(&program),
                helper.setting,
                &helper.server,
                credential_helper::HELPER_TIMEOUT,
            )? {
                Some(credentials) => Ok(credentials),
                None => note(
                    &format!("{program} holds no credentials for {}", helper.server),
                    err,
                ),
            }
        }
        Err(problem) => note(&problem, err),
    }
}

/// A fetcher that may connect anywhere (see the module header); it honours `HTTPS_PROXY` like
/// other command-line tools.
fn fetcher() -> Fetcher {
    let everywhere = [
        IpNetwork::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        IpNetwork::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
    ]
    .into_iter()
    .flatten()
    .map(AllowedDestination::Network);
    Fetcher::with_options(FetcherOptions {
        allowed_destinations: DestinationPolicy::public_only().allowing(everywhere),
        ..FetcherOptions::default()
    })
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> Result<T, OciCommandError> {
    crate::startup::init_crypto();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(OciCommandError::Runtime)?;
    Ok(runtime.block_on(future))
}

/// `raypipe dag push`: validate, then upload; prints the manifest digest on standard output.
pub fn push(args: &PushArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<u8, DagError> {
    let reference: OciReference = args
        .reference
        .parse()
        .map_err(|e| DagError::Oci(OciCommandError::Reference(e)))?;
    let graph = dag::read_graph(&args.input)?;
    let path = dag::display_path(&args.input.file);
    let valid = match graph::validate(graph.clone()) {
        Ok(valid) => valid,
        Err(errors) => {
            dag::write_problems(err, &path, &errors);
            let _ = writeln!(err, "nothing pushed");
            return Ok(EXIT_INVALID);
        }
    };
    let bytes = graph::encode(&graph).map_err(|source| DagError::Graph {
        path: path.clone(),
        source,
    })?;
    let push_error = |source| {
        DagError::Oci(OciCommandError::Push {
            reference: reference.to_string(),
            source,
        })
    };
    let code = match &args.code {
        Some(path) => {
            let package = crate::pypackage::code::pack(path).map_err(OciCommandError::Code)?;
            // The layer as the operator will judge it (a layer it refuses is not pushed).
            let summary =
                crate::pypackage::code::check(&package.bytes).map_err(OciCommandError::Code)?;
            Some(CodeLayer {
                bytes: bytes::Bytes::from(package.bytes.as_ref().clone()),
                title: package.file_name.clone(),
                modules: summary.modules,
            })
        }
        None => None,
    };
    let artifact =
        GraphArtifact::with_code(bytes, valid.name(), valid.version(), code).map_err(push_error)?;
    let credentials = credentials(&args.registry, reference.registry(), err)?;
    let pushed = block_on(async {
        fetcher()
            .push_oci(&PushRequest {
                reference: &reference,
                credentials: &credentials,
                artifact: &artifact,
                allow_insecure_http: args.registry.plain_http,
                ca_bundle_pem: None,
                connect_timeout: CONNECT_TIMEOUT,
                timeout: TIMEOUT,
            })
            .await
    })?
    .map_err(push_error)?;
    let code_note = match (&pushed.code_digest, &artifact.code) {
        (Some(digest), Some((bytes, _))) => format!(", code {digest} ({} bytes)", bytes.len()),
        _ => String::new(),
    };
    let _ = writeln!(
        err,
        "pushed graph {:?} version {:?} to {reference}: manifest {}, graph {}{code_note} ({} of {} blobs already there)",
        valid.name(),
        valid.version(),
        pushed.manifest_digest,
        pushed.graph_digest,
        pushed.blobs_skipped,
        pushed.blobs,
    );
    dag::write_stdout(out, format!("{}\n", pushed.manifest_digest).as_bytes())?;
    Ok(EXIT_OK)
}

/// `raypipe dag pull`: the graph of a tag or digest, both digests checked.
pub fn pull(args: &PullArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<u8, DagError> {
    let reference: OciReference = args
        .reference
        .parse()
        .map_err(|e| DagError::Oci(OciCommandError::Reference(e)))?;
    let credentials = credentials(&args.registry, reference.registry(), err)?;
    let outcome = block_on(async {
        fetcher()
            .pull_oci(&OciRequest {
                allow_insecure_http: args.registry.plain_http,
                // The command line takes any code layer raypipe could have pushed.
                max_code_bytes: crate::source::MAX_MAX_CODE_BYTES,
                ..OciRequest::new(&reference, &credentials)
            })
            .await
    })?
    .map_err(|source| {
        DagError::Oci(OciCommandError::Pull {
            reference: reference.to_string(),
            source,
        })
    })?;
    let OciOutcome::Fetched {
        bytes,
        manifest_digest,
        graph_digest,
        code,
        ..
    } = outcome
    else {
        // No previous digest was given, so the fetch side never answers "unchanged".
        return Ok(dag::EXIT_ERROR);
    };
    let not_a_graph = |problem: String| {
        DagError::Oci(OciCommandError::NotAGraph {
            reference: reference.to_string(),
            problem,
        })
    };
    let graph =
        graph::load(bytes.bytes(), Format::Protobuf).map_err(|e| not_a_graph(e.to_string()))?;
    let written = match args.format {
        dag::InputFormat::Protobuf => bytes.bytes().to_vec(),
        dag::InputFormat::Yaml => graph::to_yaml(&graph)
            .map_err(|e| not_a_graph(e.to_string()))?
            .into_bytes(),
        dag::InputFormat::Json => {
            (graph::to_json(&graph).map_err(|e| not_a_graph(e.to_string()))? + "\n").into_bytes()
        }
    };
    match &args.output {
        Some(file) => std::fs::write(file, &written).map_err(|source| DagError::Write {
            path: file.display().to_string(),
            source,
        })?,
        None => dag::write_stdout(out, &written)?,
    }
    let code_note = match &code {
        Some(code) => format!(", code {} ({} bytes)", code.digest, code.size),
        None => String::new(),
    };
    let _ = writeln!(
        err,
        "pulled {reference}: manifest {manifest_digest}, graph {graph_digest} ({} bytes){code_note}",
        bytes.bytes().len()
    );
    match (&args.code_dir, &code) {
        (Some(dir), Some(code)) => {
            let files = crate::pypackage::code::extract(code.bytes.bytes(), dir)
                .map_err(OciCommandError::Code)?;
            let _ = writeln!(
                err,
                "extracted {files} files of the code layer into {}",
                dir.display()
            );
        }
        (Some(_), None) => {
            return Err(DagError::Oci(OciCommandError::NoCode {
                reference: reference.to_string(),
            }));
        }
        (None, Some(_)) => {
            let _ = writeln!(
                err,
                "note: the artifact has a code layer; --code-dir DIR extracts it"
            );
        }
        (None, None) => {}
    }
    Ok(EXIT_OK)
}
