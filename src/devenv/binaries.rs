//! Finding the control-plane binaries, following the ecosystem's order: explicit paths, then
//! `KUBEBUILDER_ASSETS` (what setup-envtest fills), then raypipe's version-keyed cache, and only
//! then a build from the Go modules by the embedded `provision.sh`. The CNCF distribution
//! registry (the real OCI registry of the OCI source tests) follows the same order with its own
//! script, `distribution.sh`: `RAYPIPE_DISTRIBUTION_REGISTRY`, the cache, then a build.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::DevEnvError;

/// The provisioning script, embedded so `raypipe dev` works from any directory.
pub const PROVISION_SCRIPT: &str = include_str!("provision.sh");

/// Versions the script builds; part of the cache key.
pub const KUBE_VERSION: &str = "1.36.3";
pub const ETCD_VERSION: &str = "3.6.16";
pub const KWOK_VERSION: &str = "0.8.0";

/// The OCI registry build script, embedded like [`PROVISION_SCRIPT`].
pub const DISTRIBUTION_SCRIPT: &str = include_str!("distribution.sh");

/// The distribution registry version `distribution.sh` builds; part of its cache key.
pub const DISTRIBUTION_VERSION: &str = "3.1.2";

/// Paths of the binaries one control plane runs.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: Option<PathBuf>,
    pub kube_scheduler: Option<PathBuf>,
    pub kubectl: Option<PathBuf>,
    pub kwok: Option<PathBuf>,
    /// Directory of kwok Stage configs (node initialise/heartbeat, pod ready/complete/delete).
    pub kwok_stages: Option<PathBuf>,
}

/// raypipe's cache root: `$RAYPIPE_CACHE_DIR`, else `$XDG_CACHE_HOME/raypipe`, else `~/.cache/raypipe`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("RAYPIPE_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("raypipe");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("raypipe")
}

/// The version-keyed directory `provision.sh` fills.
pub fn cache_dir() -> PathBuf {
    cache_root().join("k8s").join(format!(
        "v{KUBE_VERSION}-etcd{ETCD_VERSION}-kwok{KWOK_VERSION}"
    ))
}

fn optional(dir: &Path, name: &str) -> Option<PathBuf> {
    let p = dir.join(name);
    p.is_file().then_some(p)
}

fn from_dir(dir: &Path) -> Option<Binaries> {
    let etcd = optional(dir, "etcd")?;
    let kube_apiserver = optional(dir, "kube-apiserver")?;
    let stages = dir.join("kwok-stages");
    Some(Binaries {
        etcd,
        kube_apiserver,
        kube_controller_manager: optional(dir, "kube-controller-manager"),
        kube_scheduler: optional(dir, "kube-scheduler"),
        kubectl: optional(dir, "kubectl"),
        kwok: optional(dir, "kwok"),
        kwok_stages: stages.is_dir().then_some(stages),
    })
}

/// Where `Binaries::locate` looks, in order. Read from the environment by `from_env`; tests
/// build one by hand (an empty cache, no envtest variables) to exercise the cold path.
#[derive(Clone, Debug, Default)]
pub struct Lookup {
    /// The `TEST_ASSET_*` paths, when both kube-apiserver and etcd are set.
    pub explicit: Option<Binaries>,
    /// `RAYPIPE_K8S_BIN_DIR`, then `KUBEBUILDER_ASSETS`.
    pub dirs: Vec<PathBuf>,
    /// The version-keyed cache that provisioning fills.
    pub cache: PathBuf,
}

impl Lookup {
    pub fn from_env() -> Lookup {
        let var = |name: &str| std::env::var_os(name).map(PathBuf::from);
        let explicit = match (var("TEST_ASSET_KUBE_APISERVER"), var("TEST_ASSET_ETCD")) {
            (Some(kube_apiserver), Some(etcd)) => Some(Binaries {
                etcd,
                kube_apiserver,
                kube_controller_manager: var("TEST_ASSET_KUBE_CONTROLLER_MANAGER"),
                kube_scheduler: var("TEST_ASSET_KUBE_SCHEDULER"),
                kubectl: var("TEST_ASSET_KUBECTL"),
                kwok: var("TEST_ASSET_KWOK"),
                kwok_stages: var("TEST_ASSET_KWOK_STAGES"),
            }),
            _ => None,
        };
        Lookup {
            explicit,
            dirs: ["RAYPIPE_K8S_BIN_DIR", "KUBEBUILDER_ASSETS"]
                .into_iter()
                .filter_map(var)
                .collect(),
            cache: cache_dir(),
        }
    }

    /// The first complete set of binaries in lookup order; when there is none, `provision`
    /// fills the cache (the first run on a machine) and the cache must then be complete.
    /// `need_full` asks for controller-manager, scheduler and kwok too.
    pub fn locate(
        &self,
        need_full: bool,
        provision: impl FnOnce(&Path) -> Result<(), DevEnvError>,
    ) -> Result<Binaries, DevEnvError> {
        let complete = |b: &Binaries| {
            !need_full
                || (b.kube_controller_manager.is_some()
                    && b.kube_scheduler.is_some()
                    && b.kwok.is_some()
                    && b.kwok_stages.is_some())
        };
        if let Some(b) = self.explicit.as_ref().filter(|b| complete(b)) {
            return Ok(b.clone());
        }
        if let Some(b) = self
            .dirs
            .iter()
            .filter_map(|dir| from_dir(dir))
            .find(|b| complete(b))
        {
            return Ok(b);
        }
        // The stage configs are the last thing provisioning writes: without them the cache is
        // a build that was interrupted, so build again (the script keeps what is done).
        if let Some(b) = from_dir(&self.cache).filter(|b| complete(b) && b.kwok_stages.is_some()) {
            return Ok(b);
        }
        provision(&self.cache)?;
        from_dir(&self.cache).filter(complete).ok_or_else(|| {
            DevEnvError::Provision(format!(
                "{} is incomplete after provisioning",
                self.cache.display()
            ))
        })
    }
}

impl Binaries {
    /// Looks the binaries up (explicit `TEST_ASSET_*` paths, then `RAYPIPE_K8S_BIN_DIR` and
    /// `KUBEBUILDER_ASSETS`, then the cache); builds them into the cache (printing progress)
    /// when nothing suitable is found. `need_full` asks for controller-manager, scheduler and
    /// kwok too.
    pub fn locate(need_full: bool) -> Result<Binaries, DevEnvError> {
        Lookup::from_env().locate(need_full, provision)
    }
}

/// Runs the embedded provisioning script into `dir`, streaming its progress to stderr.
pub fn provision(dir: &Path) -> Result<(), DevEnvError> {
    eprintln!(
        "raypipe: building the Kubernetes control plane (v{KUBE_VERSION}, etcd v{ETCD_VERSION}, kwok v{KWOK_VERSION}) into {} — the first time takes ~10-30 minutes, later runs reuse it",
        dir.display()
    );
    run_embedded_script(
        "provision.sh",
        PROVISION_SCRIPT,
        dir,
        &[
            ("KUBE_VERSION", KUBE_VERSION),
            ("ETCD_VERSION", ETCD_VERSION),
            ("KWOK_VERSION", KWOK_VERSION),
        ],
    )
}

/// The version-keyed directory `distribution.sh` fills.
pub fn distribution_cache_dir() -> PathBuf {
    cache_root()
        .join("registry")
        .join(format!("v{DISTRIBUTION_VERSION}"))
}

/// The distribution registry binary: `$RAYPIPE_DISTRIBUTION_REGISTRY`, else the cache, else
/// built into the cache by the embedded `distribution.sh` (printing progress; needs Go).
pub fn distribution_registry() -> Result<PathBuf, DevEnvError> {
    if let Some(explicit) = std::env::var_os("RAYPIPE_DISTRIBUTION_REGISTRY") {
        return Ok(PathBuf::from(explicit));
    }
    locate_distribution(&distribution_cache_dir(), |dir| {
        eprintln!(
            "raypipe: building the distribution registry v{DISTRIBUTION_VERSION} into {} — once per machine",
            dir.display()
        );
        run_embedded_script(
            "distribution.sh",
            DISTRIBUTION_SCRIPT,
            dir,
            &[("DISTRIBUTION_VERSION", DISTRIBUTION_VERSION)],
        )
    })
}

/// `<cache>/registry` when present, else what `build` leaves there.
fn locate_distribution(
    cache: &Path,
    build: impl FnOnce(&Path) -> Result<(), DevEnvError>,
) -> Result<PathBuf, DevEnvError> {
    let binary = cache.join("registry");
    if binary.is_file() {
        return Ok(binary);
    }
    build(cache)?;
    if binary.is_file() {
        Ok(binary)
    } else {
        Err(DevEnvError::Provision(format!(
            "{} is missing after building the registry",
            binary.display()
        )))
    }
}

/// Runs a script embedded in the binary with `bash -c`, with `target` as its one argument and
/// raypipe's cache root in `RAYPIPE_CACHE_DIR`; its progress goes to stderr.
pub fn run_embedded_script(
    name: &str,
    script: &str,
    target: &Path,
    env: &[(&str, &str)],
) -> Result<(), DevEnvError> {
    let status = Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg(name)
        .arg(target)
        .envs(env.iter().copied())
        .env("RAYPIPE_CACHE_DIR", cache_root())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| DevEnvError::Provision(format!("cannot run bash: {e}")))?;
    if !status.success() {
        return Err(DevEnvError::Provision(format!(
            "{name} failed ({status}); see its output above"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod script_tests {
    use super::*;
    use std::cell::Cell;

    /// What provisioning leaves behind: empty files stand in for the binaries (nothing runs
    /// them here).
    fn fill(dir: &Path, names: &[&str]) {
        std::fs::create_dir_all(dir.join("kwok-stages")).expect("create the cache");
        for name in names {
            std::fs::write(dir.join(name), b"").expect("write a stand-in binary");
        }
    }

    const FULL: &[&str] = &[
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "kwok",
    ];

    /// The cold path a fresh machine takes, cheap enough for every CI run: nothing cached, no
    /// envtest variables, so the provisioner runs once, into the cache, and its result is used.
    #[test]
    fn a_cold_cache_is_provisioned_once_and_then_used() {
        let root = tempfile::tempdir().expect("tempdir");
        let lookup = Lookup {
            cache: root.path().join("k8s").join("v-test"),
            ..Lookup::default()
        };
        let calls = Cell::new(0);
        let binaries = lookup
            .locate(true, |dir| {
                calls.set(calls.get() + 1);
                fill(dir, FULL);
                Ok(())
            })
            .expect("provisioned binaries are found");
        assert_eq!(calls.get(), 1);
        assert_eq!(binaries.kube_apiserver, lookup.cache.join("kube-apiserver"));
        assert_eq!(binaries.kwok_stages, Some(lookup.cache.join("kwok-stages")));

        // Warm: the provisioner is not asked again.
        lookup
            .locate(true, |_| panic!("a warm cache is not provisioned again"))
            .expect("the cache is used");
    }

    #[test]
    fn a_provisioning_that_leaves_the_cache_incomplete_is_an_error_naming_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let lookup = Lookup {
            cache: root.path().join("cache"),
            ..Lookup::default()
        };
        let err = lookup
            .locate(true, |dir| {
                fill(dir, &["etcd", "kube-apiserver"]);
                Ok(())
            })
            .expect_err("no kwok, no controller-manager");
        assert!(
            err.to_string()
                .contains(&lookup.cache.display().to_string()),
            "{err}"
        );

        // Binaries without the stage configs are an interrupted build: provision again (and
        // report that provisioning's own error).
        let interrupted = Lookup {
            cache: root.path().join("interrupted"),
            ..Lookup::default()
        };
        std::fs::create_dir_all(&interrupted.cache).expect("create the cache");
        for name in ["etcd", "kube-apiserver"] {
            std::fs::write(interrupted.cache.join(name), b"").expect("write a stand-in");
        }
        let failed = interrupted
            .locate(false, |_| Err(DevEnvError::Provision("no go".into())))
            .map(|_| ());
        assert!(matches!(failed, Err(DevEnvError::Provision(m)) if m == "no go"));
    }

    #[test]
    fn envtest_directories_come_before_the_cache_and_partial_ones_are_skipped() {
        let root = tempfile::tempdir().expect("tempdir");
        let minimal = root.path().join("envtest");
        fill(&minimal, &["etcd", "kube-apiserver"]);
        let lookup = Lookup {
            dirs: vec![minimal.clone()],
            cache: root.path().join("cache"),
            ..Lookup::default()
        };
        let found = lookup
            .locate(false, |_| panic!("envtest binaries are enough"))
            .expect("found in KUBEBUILDER_ASSETS");
        assert_eq!(found.etcd, minimal.join("etcd"));
        // kwok is not in an envtest directory: a full control plane builds the cache instead.
        let found = lookup
            .locate(true, |dir| {
                fill(dir, FULL);
                Ok(())
            })
            .expect("provisioned");
        assert_eq!(found.etcd, lookup.cache.join("etcd"));
    }

    #[test]
    fn the_registry_binary_is_built_once_into_its_cache_then_reused() {
        let root = tempfile::tempdir().expect("tempdir");
        let cache = root.path().join("registry").join("v-test");
        let calls = Cell::new(0);
        let found = locate_distribution(&cache, |dir| {
            calls.set(calls.get() + 1);
            fill(dir, &["registry"]);
            Ok(())
        })
        .expect("built");
        assert_eq!((found, calls.get()), (cache.join("registry"), 1));
        locate_distribution(&cache, |_| panic!("a warm cache is not built again"))
            .expect("the cache is used");

        let empty = root.path().join("empty");
        let err = locate_distribution(&empty, |_| Ok(())).expect_err("nothing was built");
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn embedded_scripts_get_their_argument_environment_and_exit_status() {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = r#"test -d "$1" && [ -n "$RAYPIPE_CACHE_DIR" ] && [ "$GREETING" = hello ]"#;
        run_embedded_script("check.sh", script, dir.path(), &[("GREETING", "hello")])
            .expect("the script succeeds");
        let err = run_embedded_script("check.sh", script, dir.path(), &[("GREETING", "bye")])
            .expect_err("the script fails");
        assert!(err.to_string().contains("check.sh failed"), "{err}");
    }
}
