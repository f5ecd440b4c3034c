//! Docker credential helpers for `raypipe dag push`/`pull`: `docker-credential-<name> get`,
//! the server address on standard input, `{"ServerURL", "Username", "Secret"}` on standard
//! output (`source::oci::docker_config` reads it). Only the command line runs helpers: they are
//! the user's own programs, named by the user's own Docker config; the operator never runs
//! anything a Secret names.
//!
//! Bounded like everything else: the answer is read up to [`MAX_ANSWER_BYTES`], and a helper
//! that has not answered within [`HELPER_TIMEOUT`] is killed (some ask for a passphrase, so the
//! wait is generous). Messages name the program and never quote its answer, which may hold
//! the secret; a failing helper's own message (standard output, else standard error) is
//! quoted shortened, because it says why (a locked keychain, a missing GPG key).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::source::oci::RegistryCredentials;
use crate::source::oci::docker_config::{
    HELPER_NOT_FOUND_MESSAGE, HelperAnswer, parse_helper_answer,
};

/// Longest a helper may take to answer.
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest answer read (an answer is a few hundred bytes; identity tokens a few KiB).
const MAX_ANSWER_BYTES: u64 = 64 * 1024;
/// Longest part of a failing helper's message quoted.
const MAX_MESSAGE_CHARS: usize = 200;

/// Why a credential helper gave no credentials.
#[derive(Debug, thiserror::Error)]
pub enum CredentialHelperError {
    #[error(
        "the Docker config ({setting}) names the credential helper {program}, which is not \
         installed (not found on PATH)"
    )]
    NotInstalled {
        program: String,
        setting: &'static str,
    },
    #[error("cannot run the credential helper {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("the credential helper {program} failed ({status}){message}")]
    Failed {
        program: String,
        status: String,
        /// `: <its message>` when it printed one.
        message: String,
    },
    #[error("the credential helper {program} did not answer within {}s", timeout.as_secs())]
    TimedOut { program: String, timeout: Duration },
    #[error("the credential helper {program} answered more than {MAX_ANSWER_BYTES} bytes")]
    TooLarge { program: String },
    #[error("the credential helper {program} answered something unusable: {problem}")]
    Unusable { program: String, problem: String },
}

/// Runs `program get` with `server` on its standard input, waiting at most `timeout`.
/// `Ok(None)`: the helper holds nothing for `server`.
pub fn get(
    program: &OsStr,
    setting: &'static str,
    server: &str,
    timeout: Duration,
) -> Result<Option<RegistryCredentials>, CredentialHelperError> {
    let shown = program.to_string_lossy().into_owned();
    let mut child = Command::new(program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => CredentialHelperError::NotInstalled {
                program: shown.clone(),
                setting,
            },
            _ => CredentialHelperError::Spawn {
                program: shown.clone(),
                source,
            },
        })?;
    // A helper that exits without reading its input closes the pipe: its exit status then
    // tells what happened, so a write error is not an error of its own.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(server.as_bytes());
    }
    let capped = |pipe: Option<Box<dyn Read + Send>>| {
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = (&mut pipe)
                    .take(MAX_ANSWER_BYTES + 1)
                    .read_to_end(&mut bytes);
                // Past the cap, drain without keeping, so the helper is not blocked writing.
                let _ = std::io::copy(&mut pipe, &mut std::io::sink());
            }
            let _ = sender.send(bytes);
        });
        receiver
    };
    let stdout = capped(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = capped(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CredentialHelperError::TimedOut {
                    program: shown,
                    timeout,
                });
            }
        }
    };
    // The pipes close when the helper ends (unless it left a child holding them: then what
    // arrived within a second is what there is).
    let grace = Duration::from_secs(1);
    let out = stdout.recv_timeout(grace).unwrap_or_default();
    let err = stderr.recv_timeout(grace).unwrap_or_default();
    if out.len() as u64 > MAX_ANSWER_BYTES {
        return Err(CredentialHelperError::TooLarge { program: shown });
    }
    if !status.success() {
        let message = first_line(&out).or_else(|| first_line(&err));
        if message.as_deref() == Some(HELPER_NOT_FOUND_MESSAGE) {
            return Ok(None);
        }
        return Err(CredentialHelperError::Failed {
            program: shown,
            status: status.to_string(),
            message: message.map(|m| format!(": {m}")).unwrap_or_default(),
        });
    }
    match parse_helper_answer(&out) {
        Ok(HelperAnswer::Found(credentials)) => Ok(Some(credentials)),
        Ok(HelperAnswer::NotFound) => Ok(None),
        Err(problem) => Err(CredentialHelperError::Unusable {
            program: shown,
            problem: problem.0,
        }),
    }
}

/// The first non-empty line of a helper's message, shortened, without control characters.
fn first_line(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    let line = text.lines().map(str::trim).find(|line| !line.is_empty())?;
    Some(
        line.chars()
            .filter(|c| !c.is_control())
            .take(MAX_MESSAGE_CHARS)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A helper script in a temporary directory; returns the directory (kept alive) and path.
    fn helper(body: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("docker-credential-test");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write helper");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        (dir, path)
    }

    fn run(
        body: &str,
        timeout: Duration,
    ) -> Result<Option<RegistryCredentials>, CredentialHelperError> {
        let (_dir, path) = helper(body);
        get(path.as_os_str(), "credsStore", "r.example:5000", timeout)
    }

    #[test]
    fn the_helper_gets_the_server_and_its_answer_is_used() {
        // The script answers only for the server it is asked about, and only to `get`.
        let body = r#"[ "$1" = get ] || exit 3
read -r server
[ "$server" = "r.example:5000" ] || { echo "asked for $server"; exit 1; }
printf '{"ServerURL":"%s","Username":"u","Secret":"s3cret"}' "$server""#;
        assert_eq!(
            run(body, HELPER_TIMEOUT).expect("answers"),
            Some(RegistryCredentials::basic("u", "s3cret"))
        );
        let token = r#"printf '{"ServerURL":"x","Username":"<token>","Secret":"refresh"}'"#;
        assert_eq!(
            run(token, HELPER_TIMEOUT).expect("answers"),
            Some(RegistryCredentials::IdentityToken(
                crate::source::oci::Secret::new("refresh")
            ))
        );
    }

    #[test]
    fn not_found_is_no_credentials_and_failures_name_the_helper() {
        let missing = format!("echo '{HELPER_NOT_FOUND_MESSAGE}'; exit 1");
        assert_eq!(run(&missing, HELPER_TIMEOUT).expect("not found"), None);

        let failing = run(
            "echo 'gpg: decryption failed: No secret key' >&2; exit 4",
            HELPER_TIMEOUT,
        )
        .expect_err("fails");
        let shown = failing.to_string();
        assert!(
            shown.contains("docker-credential-test") && shown.contains("decryption failed"),
            "{shown}"
        );

        let garbage = run("echo 'Secret=hunter2'", HELPER_TIMEOUT).expect_err("garbage");
        let shown = garbage.to_string();
        assert!(!shown.contains("hunter2"), "{shown}");

        let slow = run("sleep 5", Duration::from_millis(200)).expect_err("too slow");
        assert!(
            matches!(slow, CredentialHelperError::TimedOut { .. }),
            "{slow}"
        );

        let huge = run("head -c 200000 /dev/zero", HELPER_TIMEOUT).expect_err("too large");
        assert!(
            matches!(huge, CredentialHelperError::TooLarge { .. }),
            "{huge}"
        );

        let absent = get(
            OsStr::new("docker-credential-raypipe-absent-helper"),
            "credHelpers",
            "r.example",
            HELPER_TIMEOUT,
        )
        .expect_err("not installed");
        let shown = absent.to_string();
        assert!(
            shown.contains("docker-credential-raypipe-absent-helper")
                && shown.contains("credHelpers")
                && shown.contains("not installed"),
            "{shown}"
        );
    }
}
