//! Child processes of a control plane: started with their output in a log file, stopped by their
//! own process ids (never by name), and killed by the kernel if raypipe itself dies.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::DevEnvError;

/// A started server process.
pub struct ManagedProcess {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// All spawns go through one thread that lives as long as the process: the kernel's
/// parent-death signal fires when the *thread* that forked exits, so forking from a short-lived
/// test thread would kill the control plane when that test ends.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("raypipe-testenv-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The channel lives in a static, so this thread only ends with the process.
            })
            .expect("the spawner thread starts");
        Mutex::new(tx)
    })
}

impl ManagedProcess {
    /// Starts `program args…` with stdout and stderr appended to `log`.
    pub fn start(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<ManagedProcess, DevEnvError> {
        Self::start_with_env(name, program, args, &[], log)
    }

    /// [`ManagedProcess::start`] with extra environment variables.
    pub fn start_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<ManagedProcess, DevEnvError> {
        let out = File::create(log)
            .map_err(|e| DevEnvError::Io(format!("create {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| DevEnvError::Io("dup log".into(), e))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // SAFETY: only async-signal-safe libc calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // Own process group: a Ctrl-C in the terminal reaches raypipe, which then stops
                // its children in order, instead of every child dying at once.
                libc::setpgid(0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let (tx, rx) = mpsc::channel();
        spawner()
            .lock()
            .map_err(|_| DevEnvError::Spawn(name.to_owned(), "spawner lock poisoned".into()))?
            .send((cmd, tx))
            .map_err(|_| DevEnvError::Spawn(name.to_owned(), "spawner thread gone".into()))?;
        let child = rx
            .recv()
            .map_err(|_| DevEnvError::Spawn(name.to_owned(), "spawner thread gone".into()))?
            .map_err(|e| {
                DevEnvError::Spawn(name.to_owned(), format!("{}: {e}", program.display()))
            })?;
        Ok(ManagedProcess {
            name: name.to_owned(),
            log: log.to_owned(),
            child,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(description)` when the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    /// The last lines of the log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// SIGTERM, then SIGKILL after `grace`; always reaps the child.
    pub fn stop(&mut self, grace: Duration) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: signalling our own child by its pid.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
