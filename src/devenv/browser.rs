//! A headless Chromium for tests that look at the web console as a user would: a screenshot
//! or the DOM after scripts ran, one browser run per call.
//!
//! Found in the ecosystem's order, like the other devenv tools: `RAYPIPE_CHROMIUM`, then
//! Debian's `chromium-headless-shell` or `chromium`, and only then an install of
//! `chromium-headless-shell` with apt (as root; one installer at a time per machine).
//!
//! Every run is cut off from everything but the loopback: no background services (updates,
//! safe browsing, sync, metrics upload), names other than `localhost` do not resolve, and any
//! other address (IP literals included) goes to a proxy on 127.0.0.1 that does not exist. Each
//! run has a fresh profile in a temp dir (so cookies last for exactly one run: enough for a
//! login made of redirects) and a hard timeout after which its whole process group is killed.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::binaries::cache_root;

/// The Debian package installed when no browser is found.
pub const PACKAGE: &str = "chromium-headless-shell";

/// An explicit browser binary; wins over everything else.
pub const ENV_VAR: &str = "RAYPIPE_CHROMIUM";

/// Binary names, best first: the headless shell is smaller and starts faster.
const NAMES: [&str; 2] = ["chromium-headless-shell", "chromium"];

/// Where Debian keeps the real binaries behind its `/usr/bin` shell wrappers. Preferred over
/// the wrappers: the wrapper `sh` does not `exec`, so a timeout would otherwise kill only it.
const DEBIAN_LIB_DIR: &str = "/usr/lib/chromium";

/// How many lines of Chromium's (noisy) stderr an error keeps.
const STDERR_TAIL_LINES: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    #[error(
        "no headless Chromium found: set {ENV_VAR} to a chromium or chromium-headless-shell binary, or install Debian's {PACKAGE} package (apt-get install {PACKAGE}); {why}"
    )]
    NotFound { why: String },
    #[error("{ENV_VAR}={0} is not an executable file")]
    ExplicitMissing(PathBuf),
    #[error("installing {PACKAGE} with `{command}` failed ({status}); last output lines:\n{tail}")]
    Install {
        command: String,
        status: String,
        tail: String,
    },
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("cannot start {binary}: {source}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{binary} ({what}) timed out after {timeout:?} and was killed; last stderr lines:\n{stderr}"
    )]
    TimedOut {
        binary: PathBuf,
        what: String,
        timeout: Duration,
        stderr: String,
    },
    #[error("{binary} ({what}) failed ({status}); last stderr lines:\n{stderr}")]
    Failed {
        binary: PathBuf,
        what: String,
        status: String,
        stderr: String,
    },
    #[error(
        "{binary} ({what}) exited cleanly but produced no output; last stderr lines:\n{stderr}"
    )]
    NoOutput {
        binary: PathBuf,
        what: String,
        stderr: String,
    },
}

/// A headless Chromium binary and how long one run of it may take.
#[derive(Clone, Debug)]
pub struct Browser {
    binary: PathBuf,
    timeout: Duration,
    virtual_time_budget: Duration,
}

/// Where [`Browser::find_or_install`] looks, in order. Read from the environment by
/// `from_env`; tests build one by hand.
#[derive(Clone, Debug, Default)]
pub struct Lookup {
    /// `RAYPIPE_CHROMIUM`.
    pub explicit: Option<PathBuf>,
    /// Candidate binaries, best first; the first executable one wins.
    pub candidates: Vec<PathBuf>,
}

impl Lookup {
    /// `RAYPIPE_CHROMIUM`; then for each name (headless shell first) Debian's real binary and
    /// the name on `PATH`.
    pub fn from_env() -> Lookup {
        let path_dirs: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect())
            .unwrap_or_default();
        let candidates = NAMES
            .iter()
            .flat_map(|name| {
                std::iter::once(Path::new(DEBIAN_LIB_DIR).join(name))
                    .chain(path_dirs.iter().map(move |dir| dir.join(name)))
            })
            .collect();
        Lookup {
            explicit: std::env::var_os(ENV_VAR)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            candidates,
        }
    }

    /// The explicit binary (an error when it is not executable), else the first executable
    /// candidate, else `None`.
    pub fn find(&self) -> Result<Option<PathBuf>, BrowserError> {
        if let Some(explicit) = &self.explicit {
            return if is_executable(explicit) {
                Ok(Some(explicit.clone()))
            } else {
                Err(BrowserError::ExplicitMissing(explicit.clone()))
            };
        }
        Ok(self.candidates.iter().find(|p| is_executable(p)).cloned())
    }
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Browser {
    /// The browser at `binary`, with the default timeout (60 s) and virtual-time budget (10 s).
    pub fn at(binary: impl Into<PathBuf>) -> Browser {
        Browser {
            binary: binary.into(),
            timeout: Duration::from_secs(60),
            virtual_time_budget: Duration::from_secs(10),
        }
    }

    /// A browser from [`Lookup::from_env`]; when there is none and we are root with apt-get,
    /// installs [`PACKAGE`] first (printing progress). Otherwise an error naming the package
    /// and [`ENV_VAR`].
    pub fn find_or_install() -> Result<Browser, BrowserError> {
        if let Some(binary) = Lookup::from_env().find()? {
            return Ok(Browser::at(binary));
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(BrowserError::NotFound {
                why: "not installing it: not running as root".into(),
            });
        }
        let Some(apt_get) = Lookup {
            explicit: None,
            candidates: path_candidates("apt-get"),
        }
        .find()?
        else {
            return Err(BrowserError::NotFound {
                why: "not installing it: apt-get is not on PATH".into(),
            });
        };
        install_with_apt(&apt_get)?;
        match Lookup::from_env().find()? {
            Some(binary) => Ok(Browser::at(binary)),
            None => Err(BrowserError::NotFound {
                why: format!("{PACKAGE} was installed but no binary of it was found"),
            }),
        }
    }

    /// The binary this browser runs.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The hard limit for one run; the whole process group is killed after it.
    pub fn with_timeout(mut self, timeout: Duration) -> Browser {
        self.timeout = timeout;
        self
    }

    /// Chromium's `--virtual-time-budget`: how much page time (timers, redirects, loads) a run
    /// lets pass before it takes the screenshot or dumps the DOM. Idle time is skipped, so a
    /// generous budget costs little real time.
    pub fn with_virtual_time_budget(mut self, budget: Duration) -> Browser {
        self.virtual_time_budget = budget;
        self
    }

    /// Loads `url` (following redirects, with cookies kept for the run) in a `width`×`height`
    /// window and writes a PNG screenshot of the viewport to `out`.
    pub fn screenshot(
        &self,
        url: &str,
        width: u32,
        height: u32,
        out: &Path,
    ) -> Result<(), BrowserError> {
        let out = std::path::absolute(out)
            .map_err(|e| BrowserError::Io(format!("resolve {}", out.display()), e))?;
        // A stale file from an earlier run must not pass for this run's screenshot.
        match std::fs::remove_file(&out) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(BrowserError::Io(format!("remove {}", out.display()), e)),
        }
        let what = format!("screenshot of {url}");
        let run = self.run(
            &what,
            &[
                format!("--window-size={width},{height}"),
                format!("--screenshot={}", out.display()),
            ],
            url,
        )?;
        if std::fs::metadata(&out).is_ok_and(|m| m.len() > 0) {
            Ok(())
        } else {
            Err(BrowserError::NoOutput {
                binary: self.binary.clone(),
                what,
                stderr: run.stderr_tail,
            })
        }
    }

    /// Loads `url` like [`Browser::screenshot`] and returns the serialised DOM (after scripts
    /// ran), as Chromium's `--dump-dom` prints it.
    pub fn dump_dom(&self, url: &str) -> Result<String, BrowserError> {
        let what = format!("DOM of {url}");
        let run = self.run(&what, &["--dump-dom".to_owned()], url)?;
        if run.stdout.trim().is_empty() {
            return Err(BrowserError::NoOutput {
                binary: self.binary.clone(),
                what,
                stderr: run.stderr_tail,
            });
        }
        Ok(run.stdout)
    }

    /// The flags of every run: headless, no sandbox (tests run as root), and nothing that
    /// talks to anything but the loopback.
    fn common_flags(&self, profile: &Path) -> Vec<String> {
        [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--mute-audio",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-domain-reliability",
            "--disable-client-side-phishing-detection",
            "--disable-breakpad",
            "--no-pings",
            "--metrics-recording-only",
            "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,AutofillServerCommunication,CertificateTransparencyComponentUpdater",
            // Only loopback names resolve; everything else fails before any DNS query.
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
            // IP literals bypass the resolver: send everything that is not loopback to a proxy
            // on the loopback discard port, where nothing listens, so it fails there.
            "--proxy-server=http://127.0.0.1:9",
            "--proxy-bypass-list=127.0.0.0/8;localhost;[::1]",
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([
            format!(
                "--virtual-time-budget={}",
                self.virtual_time_budget.as_millis()
            ),
            format!("--user-data-dir={}", profile.display()),
        ])
        .collect()
    }

    /// One browser run in a fresh temp dir (profile, HOME, caches, captured output), reaped
    /// together with every process it started.
    fn run(&self, what: &str, extra: &[String], url: &str) -> Result<RunOutput, BrowserError> {
        let dir = tempfile::Builder::new()
            .prefix("raypipe-chromium-")
            .tempdir()
            .map_err(|e| BrowserError::Io("create a temp dir for Chromium".into(), e))?;
        let profile = dir.path().join("profile");
        let stdout_path = dir.path().join("stdout");
        let stderr_path = dir.path().join("stderr");
        let create = |p: &Path| {
            File::create(p).map_err(|e| BrowserError::Io(format!("create {}", p.display()), e))
        };
        let mut cmd = Command::new(&self.binary);
        cmd.args(self.common_flags(&profile))
            .args(extra)
            .arg(url)
            // Nothing of the user's home (NSS database, caches, config) is read or written.
            .env("HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .env_remove("all_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("ALL_PROXY")
            .stdin(Stdio::null())
            // Files, not pipes: Chromium's stderr is chatty and a full pipe would stall it.
            .stdout(create(&stdout_path)?)
            .stderr(create(&stderr_path)?)
            // Its own process group, so a timeout kills the renderer and GPU processes too.
            .process_group(0);
        // SAFETY: only an async-signal-safe libc call between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // The calling thread waits for the run, so the browser dies with it.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| BrowserError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        let timed_out = !wait_exited_unreaped(child.id(), self.timeout);
        // The leader is exited but not reaped (or still running), so its pid, which is the
        // group id, cannot have been reused: killing the group reaches only this run.
        // SAFETY: signalling the process group of our own child.
        unsafe {
            libc::killpg(child.id() as libc::pid_t, libc::SIGKILL);
        }
        let status = child
            .wait()
            .map_err(|e| BrowserError::Io(format!("wait for {}", self.binary.display()), e))?;
        let stderr_tail = tail(
            &String::from_utf8_lossy(&std::fs::read(&stderr_path).unwrap_or_default()),
            STDERR_TAIL_LINES,
        );
        if timed_out {
            return Err(BrowserError::TimedOut {
                binary: self.binary.clone(),
                what: what.to_owned(),
                timeout: self.timeout,
                stderr: stderr_tail,
            });
        }
        if !status.success() {
            return Err(BrowserError::Failed {
                binary: self.binary.clone(),
                what: what.to_owned(),
                status: status.to_string(),
                stderr: stderr_tail,
            });
        }
        let stdout = std::fs::read(&stdout_path)
            .map_err(|e| BrowserError::Io(format!("read {}", stdout_path.display()), e))?;
        Ok(RunOutput {
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr_tail,
        })
    }
}

struct RunOutput {
    stdout: String,
    stderr_tail: String,
}

/// Waits up to `timeout` for child `pid` to exit, leaving it unreaped (a zombie keeps its pid
/// and so its process group id). True when it exited in time.
fn wait_exited_unreaped(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        // SAFETY: a zeroed siginfo_t is valid; waitid only writes to it.
        let exited = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let rc = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            // An error (no such child) means there is nothing left to wait for.
            rc != 0 || info.si_pid() != 0
        };
        if exited {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn path_candidates(name: &str) -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).collect())
        .unwrap_or_default()
}

/// Installs [`PACKAGE`] with apt, one installer per machine at a time (a lock file in
/// raypipe's cache): tests starting together would otherwise race for dpkg's lock. A failed
/// install is retried once after `apt-get update` (a stale package list is the usual cause).
fn install_with_apt(apt_get: &Path) -> Result<(), BrowserError> {
    let lock_dir = cache_root().join("browser");
    std::fs::create_dir_all(&lock_dir)
        .map_err(|e| BrowserError::Io(format!("create {}", lock_dir.display()), e))?;
    let lock_path = lock_dir.join(".lock");
    let lock = File::create(&lock_path)
        .map_err(|e| BrowserError::Io(format!("create {}", lock_path.display()), e))?;
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a file descriptor we own; released when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(BrowserError::Io(
            format!("lock {}", lock_path.display()),
            std::io::Error::last_os_error(),
        ));
    }
    // Another installer may have finished while we waited for the lock.
    if Lookup::from_env().find()?.is_some() {
        return Ok(());
    }
    eprintln!(
        "raypipe: installing {PACKAGE} with apt-get for the browser tests — once per machine"
    );
    let apt = |args: &[&str]| -> Result<(), BrowserError> {
        let command = format!("{} {}", apt_get.display(), args.join(" "));
        let output = Command::new(apt_get)
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| BrowserError::Io(format!("run {command}"), e))?;
        if output.status.success() {
            return Ok(());
        }
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        Err(BrowserError::Install {
            command,
            status: output.status.to_string(),
            tail: tail(&text, STDERR_TAIL_LINES),
        })
    };
    // Waits for dpkg's own lock too (another apt run on the machine, e.g. CI's setup).
    let install = [
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        "-o",
        "DPkg::Lock::Timeout=600",
        PACKAGE,
    ];
    apt(&install).or_else(|_| {
        apt(&["update", "-q", "-o", "DPkg::Lock::Timeout=600"])?;
        apt(&install)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 3), "");
    }

    fn executable(path: &Path) {
        std::fs::write(path, "#!/bin/sh\n").expect("write a stand-in binary");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .expect("make it executable");
    }

    #[test]
    fn the_explicit_binary_wins_and_must_exist() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (explicit, candidate) = (dir.path().join("mine"), dir.path().join("chromium"));
        executable(&explicit);
        executable(&candidate);
        let lookup = Lookup {
            explicit: Some(explicit.clone()),
            candidates: vec![candidate.clone()],
        };
        assert_eq!(lookup.find().expect("found"), Some(explicit.clone()));

        let missing = Lookup {
            explicit: Some(dir.path().join("absent")),
            candidates: vec![candidate],
        };
        let err = missing
            .find()
            .expect_err("a missing explicit binary is an error");
        assert!(err.to_string().contains(ENV_VAR), "{err}");
    }

    #[test]
    fn the_first_executable_candidate_wins() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (plain, first, second) = (
            dir.path().join("plain"),
            dir.path().join("first"),
            dir.path().join("second"),
        );
        std::fs::write(&plain, "not executable").expect("write");
        executable(&first);
        executable(&second);
        let lookup = Lookup {
            explicit: None,
            candidates: vec![dir.path().join("absent"), plain, first.clone(), second],
        };
        assert_eq!(lookup.find().expect("found"), Some(first));
        assert_eq!(Lookup::default().find().expect("no error"), None);
    }

    #[test]
    fn not_found_names_the_package_and_the_variable() {
        let err = BrowserError::NotFound {
            why: "not root".into(),
        }
        .to_string();
        assert!(err.contains(PACKAGE) && err.contains(ENV_VAR), "{err}");
    }

    /// A "browser" that starts a grandchild and hangs: the timeout must kill both, and the
    /// error must carry the end of its stderr.
    #[test]
    fn a_run_past_its_timeout_kills_the_whole_process_group() {
        let dir = tempfile::tempdir().expect("temp dir");
        let script = dir.path().join("hanging-browser");
        let pid_file = dir.path().join("grandchild.pid");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nfor i in $(seq 1 30); do echo noise $i >&2; done\necho last words >&2\nsleep 300 &\necho $! > {}\nwait\n",
                pid_file.display()
            ),
        )
        .expect("write the script");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .expect("make it executable");
        let browser = Browser::at(&script).with_timeout(Duration::from_secs(2));
        let started = Instant::now();
        let err = browser
            .dump_dom("http://127.0.0.1:9/")
            .expect_err("a hanging browser times out");
        assert!(started.elapsed() < Duration::from_secs(10));
        let message = err.to_string();
        assert!(matches!(err, BrowserError::TimedOut { .. }), "{message}");
        assert!(message.contains("hanging-browser"), "{message}");
        assert!(message.contains("last words"), "{message}");
        assert!(!message.contains("noise 5\n"), "only the tail: {message}");
        let grandchild: u32 = std::fs::read_to_string(&pid_file)
            .expect("the script wrote its child's pid")
            .trim()
            .parse()
            .expect("a pid");
        // Killed and reaped by init (or a subreaper) shortly after: wait for that.
        let gone = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    s.split(") ")
                        .nth(1)
                        .is_some_and(|rest| rest.starts_with('Z'))
                })
                .unwrap_or(true)
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !gone(grandchild) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(gone(grandchild), "the grandchild {grandchild} still runs");
    }

    #[test]
    fn a_failing_browser_reports_its_status_and_stderr() {
        let dir = tempfile::tempdir().expect("temp dir");
        let script = dir.path().join("broken-browser");
        std::fs::write(&script, "#!/bin/sh\necho cannot open display >&2\nexit 3\n")
            .expect("write the script");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .expect("make it executable");
        let err = Browser::at(&script)
            .screenshot("http://127.0.0.1:9/", 10, 10, &dir.path().join("out.png"))
            .expect_err("exit 3 is a failure");
        let message = err.to_string();
        assert!(matches!(err, BrowserError::Failed { .. }), "{message}");
        assert!(message.contains("broken-browser") && message.contains("cannot open display"));
    }

    // ---- with a real browser ----

    /// The machine's browser, installed if need be; `None` (the test is skipped, saying so)
    /// only when none can be had here (not root, no apt).
    fn real_browser() -> Option<Browser> {
        match Browser::find_or_install() {
            Ok(browser) => Some(browser),
            Err(BrowserError::NotFound { why }) => {
                eprintln!("skipped: no headless Chromium ({why})");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// A listener on a free loopback port, and the port.
    fn loopback_listener() -> (std::net::TcpListener, u16) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        (listener, port)
    }

    /// Serves `router` on `listener` from a runtime of its own, which lives (and serves) as
    /// long as the returned value.
    fn serve(listener: std::net::TcpListener, router: axum::Router) -> tokio::runtime::Runtime {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        listener.set_nonblocking(true).expect("non-blocking");
        rt.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            axum::serve(listener, router).await.expect("serve");
        });
        rt
    }

    const FILL: [u8; 3] = [0x2e, 0x7d, 0x32];

    #[test]
    fn a_screenshot_shows_the_svg_fill_and_the_dom_has_the_text() {
        let Some(browser) = real_browser() else {
            return;
        };
        let page = r##"<!doctype html><html><body style="margin:0;background:#ffffff">
<svg width="200" height="100" style="display:block"><rect x="0" y="0" width="200" height="100" fill="#2e7d32"/></svg>
<p id="caption">pipeline graph</p>
<script>document.getElementById("caption").textContent += " rendered";</script>
</body></html>"##;
        let router = axum::Router::new().route(
            "/",
            axum::routing::get(move || async move { axum::response::Html(page) }),
        );
        let (listener, port) = loopback_listener();
        let _server = serve(listener, router);
        let url = format!("http://127.0.0.1:{port}/");
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("shot.png");

        let cold = Instant::now();
        browser
            .screenshot(&url, 400, 300, &out)
            .expect("a screenshot");
        let cold = cold.elapsed();
        let warm = Instant::now();
        browser
            .screenshot(&url, 400, 300, &out)
            .expect("a screenshot");
        eprintln!(
            "screenshot took {cold:?} (first) and {:?} (second)",
            warm.elapsed()
        );

        let image = crate::devenv::png::decode(&std::fs::read(&out).expect("read the screenshot"))
            .expect("a PNG");
        assert_eq!((image.width, image.height), (400, 300));
        let info = &image;
        let pixel = |x: u32, y: u32| {
            let at = (y * info.width + x) as usize * 4;
            [image.rgba[at], image.rgba[at + 1], image.rgba[at + 2]]
        };
        let near = |p: [u8; 3], c: [u8; 3]| p.iter().zip(c).all(|(a, b)| a.abs_diff(b) <= 2);
        let (mut inside, mut outside) = (0, 0);
        for y in 0..info.height {
            for x in 0..info.width {
                if near(pixel(x, y), FILL) {
                    if x < 200 && y < 100 {
                        inside += 1;
                    } else {
                        outside += 1;
                    }
                }
            }
        }
        // The rectangle's interior at least (its edges may be anti-aliased), and nowhere else.
        assert!(
            inside >= 198 * 98,
            "only {inside} fill pixels in the rectangle"
        );
        assert_eq!(outside, 0, "fill colour outside the rectangle");
        assert!(
            near(pixel(300, 200), [255, 255, 255]),
            "{:?}",
            pixel(300, 200)
        );

        let dom = browser.dump_dom(&url).expect("the DOM");
        assert!(dom.contains("pipeline graph rendered"), "{dom}");
        assert!(dom.contains("#2e7d32"), "{dom}");
    }

    /// The console's login: a redirect to an identity provider on another port, which
    /// approves and redirects back; the console sets a cookie and redirects to the page, which
    /// shows the session only when the cookie came along. All within one run.
    #[test]
    fn a_login_made_of_redirects_keeps_its_cookie_within_one_run() {
        use axum::http::{HeaderMap, StatusCode, Uri, header};
        use axum::response::{Html, IntoResponse};
        use axum::routing::get;
        let Some(browser) = real_browser() else {
            return;
        };
        let (console_listener, console_port) = loopback_listener();
        let idp = axum::Router::new().route(
            "/authorize",
            get(move || async move {
                (
                    StatusCode::FOUND,
                    [(
                        header::LOCATION,
                        format!("http://127.0.0.1:{console_port}/callback?code=granted"),
                    )],
                )
            }),
        );
        let (idp_listener, idp_port) = loopback_listener();
        let _idp = serve(idp_listener, idp);
        let console = axum::Router::new()
            .route(
                "/login",
                get(move || async move {
                    (
                        StatusCode::FOUND,
                        [(
                            header::LOCATION,
                            format!("http://127.0.0.1:{idp_port}/authorize"),
                        )],
                    )
                }),
            )
            .route(
                "/callback",
                get(|uri: Uri| async move {
                    if uri.query() != Some("code=granted") {
                        return StatusCode::FORBIDDEN.into_response();
                    }
                    (
                        StatusCode::FOUND,
                        [
                            (
                                header::SET_COOKIE,
                                "session=s3cret; Path=/; HttpOnly; SameSite=Lax",
                            ),
                            (header::LOCATION, "/page"),
                        ],
                    )
                        .into_response()
                }),
            )
            .route(
                "/page",
                get(|headers: HeaderMap| async move {
                    let session = headers
                        .get_all(header::COOKIE)
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .flat_map(|v| v.split(';'))
                        .find_map(|kv| kv.trim().strip_prefix("session=").map(str::to_owned));
                    Html(match session {
                        Some(value) => format!("<p id=\"who\">signed in: {value}</p>"),
                        None => "<p id=\"who\">anonymous</p>".to_owned(),
                    })
                }),
            );
        let _console = serve(console_listener, console);

        let dom = browser
            .dump_dom(&format!("http://127.0.0.1:{console_port}/login"))
            .expect("the DOM after logging in");
        assert!(dom.contains("signed in: s3cret"), "{dom}");

        // A fresh run has a fresh profile: no cookie from the run before.
        let dom = browser
            .dump_dom(&format!("http://127.0.0.1:{console_port}/page"))
            .expect("the DOM");
        assert!(dom.contains("anonymous"), "{dom}");

        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("login.png");
        browser
            .screenshot(
                &format!("http://127.0.0.1:{console_port}/login"),
                320,
                200,
                &out,
            )
            .expect("a screenshot after logging in");
    }
}
