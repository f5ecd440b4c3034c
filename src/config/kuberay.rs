//! KubeRay's environment switches as flags: each keeps its KubeRay environment name (so a
//! KubeRay Deployment's `env:` works unchanged), its KubeRay default, and the leniency of
//! KubeRay's parsing, and they share one `--help` group.
//!
//! Deliberate deviation kept from before (KubeRay reads these with `strings.ToLower(...) ==
//! "true"` and `strconv.Atoi`): a value that is not understood never fails start-up, it leaves
//! the switch at its default, exactly as KubeRay does. A flag is stricter only in that it needs
//! a value (`--enable-login-shell=true`).

use std::time::Duration;

use clap::ArgAction;

use crate::ray::DEFAULT_CLUSTER_DOMAIN;

/// The `--help` group of the switches.
pub const HELP_HEADING: &str = "KubeRay compatibility switches";

/// The KubeRay environment name of every switch (docs, the Helm chart's parity test).
pub fn environment_names() -> Vec<String> {
    use clap::Args;
    KubeRayArgs::augment_args(clap::Command::new("kuberay"))
        .get_arguments()
        .filter_map(|a| Some(a.get_env()?.to_string_lossy().into_owned()))
        .collect()
}

/// KubeRay's operator switches, read once at start-up.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
#[command(next_help_heading = HELP_HEADING)]
pub struct KubeRayArgs {
    /// The cluster DNS domain: Ray head Service addresses, the dashboard URL in RayJob status,
    /// the dashboard the operator dials. Empty: `cluster.local`.
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "")]
    pub cluster_domain: String,
    /// Seconds between re-checks of a settled RayCluster (KubeRay's name ends in `_ENV`).
    #[arg(
        long,
        env = "RAYCLUSTER_DEFAULT_REQUEUE_SECONDS_ENV",
        default_value = "300",
        value_parser = requeue_seconds
    )]
    pub raycluster_default_requeue_seconds: Duration,
    /// Scale down surplus worker Pods at random even with the autoscaler on.
    #[arg(long, env = "ENABLE_RANDOM_POD_DELETE", action = ArgAction::Set, default_value = "false", value_parser = only_true)]
    pub enable_random_pod_delete: bool,
    /// The Redis cleanup Job and its finalizer for GCS fault tolerant clusters.
    #[arg(long, env = "ENABLE_GCS_FT_REDIS_CLEANUP", action = ArgAction::Set, default_value = "true", value_parser = unless_false)]
    pub enable_gcs_ft_redis_cleanup: bool,
    /// The init container that makes workers wait for the GCS.
    #[arg(long, env = "ENABLE_INIT_CONTAINER_INJECTION", action = ArgAction::Set, default_value = "true", value_parser = unless_false)]
    pub enable_init_container_injection: bool,
    /// Default liveness and readiness probes on Ray containers.
    #[arg(long, env = "ENABLE_PROBES_INJECTION", action = ArgAction::Set, default_value = "true", value_parser = unless_false)]
    pub enable_probes_injection: bool,
    /// Run Ray container commands in a login shell (`bash -lc`).
    #[arg(long, env = "ENABLE_LOGIN_SHELL", action = ArgAction::Set, default_value = "false", value_parser = only_true)]
    pub enable_login_shell: bool,
    /// Name head Pods `<cluster>-head` instead of with a random suffix.
    #[arg(long, env = "ENABLE_DETERMINISTIC_HEAD_POD_NAME", action = ArgAction::Set, default_value = "false", value_parser = only_true)]
    pub enable_deterministic_head_pod_name: bool,
    /// Give head Services a cluster IP instead of making them headless.
    #[arg(long, env = "ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE", action = ArgAction::Set, default_value = "false", value_parser = only_true)]
    pub enable_ray_head_cluster_ip_service: bool,
    /// A RayService cluster spec change starts a new cluster unless its upgrade strategy says
    /// otherwise.
    #[arg(long, env = "ENABLE_ZERO_DOWNTIME", action = ArgAction::Set, default_value = "true", value_parser = unless_false)]
    pub enable_zero_downtime: bool,
    /// A finished RayJob's shutdown deletes the RayJob itself instead of its cluster.
    #[arg(long, env = "DELETE_RAYJOB_CR_AFTER_JOB_FINISHES", action = ArgAction::Set, default_value = "false", value_parser = only_true)]
    pub delete_rayjob_cr_after_job_finishes: bool,
    /// Seconds a Ray job's status may stay unreadable from the dashboard before the RayJob fails.
    #[arg(
        long,
        env = "RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS",
        default_value = "300",
        value_parser = timeout_seconds
    )]
    pub rayjob_status_check_timeout_seconds: Duration,
    /// Seconds a RayJob may stay Running after its Ray job ended before it is marked Complete or
    /// Failed.
    #[arg(
        long,
        env = "RAYJOB_DEPLOYMENT_STATUS_TRANSITION_GRACE_PERIOD_SECONDS",
        default_value = "300",
        value_parser = timeout_seconds
    )]
    pub rayjob_deployment_status_transition_grace_period_seconds: Duration,
}

/// KubeRay's defaults (what the flags give when nothing is set).
impl Default for KubeRayArgs {
    fn default() -> Self {
        KubeRayArgs {
            cluster_domain: String::new(),
            raycluster_default_requeue_seconds: KUBERAY_DEFAULT_SECONDS,
            enable_random_pod_delete: false,
            enable_gcs_ft_redis_cleanup: true,
            enable_init_container_injection: true,
            enable_probes_injection: true,
            enable_login_shell: false,
            enable_deterministic_head_pod_name: false,
            enable_ray_head_cluster_ip_service: false,
            enable_zero_downtime: true,
            delete_rayjob_cr_after_job_finishes: false,
            rayjob_status_check_timeout_seconds: KUBERAY_DEFAULT_SECONDS,
            rayjob_deployment_status_transition_grace_period_seconds: KUBERAY_DEFAULT_SECONDS,
        }
    }
}

/// The default of every seconds switch (KubeRay: 300 s each).
const KUBERAY_DEFAULT_SECONDS: Duration = Duration::from_secs(300);

/// On only for `true` in any case; anything else is off (KubeRay's default-off switches).
fn only_true(text: &str) -> Result<bool, std::convert::Infallible> {
    Ok(text.eq_ignore_ascii_case("true"))
}

/// Off only for `false` in any case; anything else is on (KubeRay's default-on switches).
fn unless_false(text: &str) -> Result<bool, std::convert::Infallible> {
    Ok(!text.eq_ignore_ascii_case("false"))
}

/// Whole seconds as the RayCluster controller always read them (untrimmed); anything else:
/// the default.
fn requeue_seconds(text: &str) -> Result<Duration, std::convert::Infallible> {
    Ok(text
        .parse::<u64>()
        .map_or(KUBERAY_DEFAULT_SECONDS, Duration::from_secs))
}

/// Whole seconds as the RayJob controller always read them (surrounding blanks allowed);
/// anything else: the default.
fn timeout_seconds(text: &str) -> Result<Duration, std::convert::Infallible> {
    requeue_seconds(text.trim())
}

impl KubeRayArgs {
    /// The domain the RayCluster builders write into head Service addresses: the value as
    /// given when non-empty (as the RayCluster controller always read it).
    pub fn raycluster_domain(&self) -> String {
        if self.cluster_domain.is_empty() {
            DEFAULT_CLUSTER_DOMAIN.to_owned()
        } else {
            self.cluster_domain.clone()
        }
    }

    /// The domain in RayJob status and the dashboard the operator dials: blanks and dots
    /// around it removed, `cluster.local` when nothing is left of it.
    pub fn dashboard_domain(&self) -> String {
        let domain = self.cluster_domain.trim();
        if domain.is_empty() {
            DEFAULT_CLUSTER_DOMAIN.to_owned()
        } else {
            domain.trim_matches('.').to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The switches alone, parsed as `raypipe run` parses them.
    #[derive(Debug, clap::Parser)]
    struct Switches {
        #[command(flatten)]
        kuberay: KubeRayArgs,
    }

    /// Environment variables are process-wide: the tests that set one run one at a time.
    static ENVIRONMENT: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The switches with `name=value` in the environment and no flags.
    fn from_environment(name: &str, value: &str) -> KubeRayArgs {
        use clap::Parser;
        let _serial = ENVIRONMENT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: only these tests set these variables, one at a time (the lock above); the
        // command reads them while it is built, inside the lock.
        unsafe { std::env::set_var(name, value) };
        let parsed = Switches::try_parse_from(["raypipe"]);
        // SAFETY: as above.
        unsafe { std::env::remove_var(name) };
        parsed.expect("the switches never refuse a value").kuberay
    }

    #[test]
    fn the_defaults_are_kuberays() {
        use clap::Parser;
        let _serial = ENVIRONMENT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let parsed = Switches::try_parse_from(["raypipe"]).expect("defaults parse");
        assert_eq!(parsed.kuberay, KubeRayArgs::default());
        assert_eq!(parsed.kuberay.raycluster_domain(), "cluster.local");
        assert_eq!(parsed.kuberay.dashboard_domain(), "cluster.local");
    }

    #[test]
    fn every_switch_has_an_environment_name() {
        let names = environment_names();
        assert_eq!(names.len(), 13, "{names:?}");
        assert!(names.iter().any(|n| n == "CLUSTER_DOMAIN"));
    }

    #[test]
    fn cluster_domain_env() {
        let set = from_environment("CLUSTER_DOMAIN", ".corp.example.");
        assert_eq!(set.raycluster_domain(), ".corp.example.");
        assert_eq!(set.dashboard_domain(), "corp.example");
        let empty = from_environment("CLUSTER_DOMAIN", "");
        assert_eq!(empty.raycluster_domain(), "cluster.local");
        assert_eq!(empty.dashboard_domain(), "cluster.local");
    }

    #[test]
    fn raycluster_default_requeue_seconds_env() {
        let name = "RAYCLUSTER_DEFAULT_REQUEUE_SECONDS_ENV";
        let set = from_environment(name, "30");
        assert_eq!(
            set.raycluster_default_requeue_seconds,
            Duration::from_secs(30)
        );
        for ignored in ["soon", " 30", "-1", ""] {
            let parsed = from_environment(name, ignored);
            assert_eq!(
                parsed.raycluster_default_requeue_seconds, KUBERAY_DEFAULT_SECONDS,
                "{ignored:?}"
            );
        }
    }

    /// A default-off switch: on for `true` in any case, off for anything else.
    fn assert_only_true(name: &str, field: fn(&KubeRayArgs) -> bool) {
        for on in ["true", "TRUE", "True"] {
            assert!(field(&from_environment(name, on)), "{name}={on}");
        }
        for off in ["false", "1", "yes", " true", ""] {
            assert!(!field(&from_environment(name, off)), "{name}={off:?}");
        }
    }

    /// A default-on switch: off for `false` in any case, on for anything else.
    fn assert_unless_false(name: &str, field: fn(&KubeRayArgs) -> bool) {
        for off in ["false", "FALSE", "False"] {
            assert!(!field(&from_environment(name, off)), "{name}={off}");
        }
        for on in ["true", "0", "no", " false", ""] {
            assert!(field(&from_environment(name, on)), "{name}={on:?}");
        }
    }

    #[test]
    fn enable_random_pod_delete_env() {
        assert_only_true("ENABLE_RANDOM_POD_DELETE", |k| k.enable_random_pod_delete);
    }

    #[test]
    fn enable_gcs_ft_redis_cleanup_env() {
        assert_unless_false("ENABLE_GCS_FT_REDIS_CLEANUP", |k| {
            k.enable_gcs_ft_redis_cleanup
        });
    }

    #[test]
    fn enable_init_container_injection_env() {
        assert_unless_false("ENABLE_INIT_CONTAINER_INJECTION", |k| {
            k.enable_init_container_injection
        });
    }

    #[test]
    fn enable_probes_injection_env() {
        assert_unless_false("ENABLE_PROBES_INJECTION", |k| k.enable_probes_injection);
    }

    #[test]
    fn enable_login_shell_env() {
        assert_only_true("ENABLE_LOGIN_SHELL", |k| k.enable_login_shell);
    }

    #[test]
    fn enable_deterministic_head_pod_name_env() {
        assert_only_true("ENABLE_DETERMINISTIC_HEAD_POD_NAME", |k| {
            k.enable_deterministic_head_pod_name
        });
    }

    #[test]
    fn enable_ray_head_cluster_ip_service_env() {
        assert_only_true("ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE", |k| {
            k.enable_ray_head_cluster_ip_service
        });
    }

    #[test]
    fn enable_zero_downtime_env() {
        assert_unless_false("ENABLE_ZERO_DOWNTIME", |k| k.enable_zero_downtime);
    }

    #[test]
    fn delete_rayjob_cr_after_job_finishes_env() {
        assert_only_true("DELETE_RAYJOB_CR_AFTER_JOB_FINISHES", |k| {
            k.delete_rayjob_cr_after_job_finishes
        });
    }

    /// A RayJob seconds switch: whole seconds, blanks allowed, anything else the default.
    fn assert_timeout_seconds(name: &str, field: fn(&KubeRayArgs) -> Duration) {
        assert_eq!(
            field(&from_environment(name, " 45 ")),
            Duration::from_secs(45)
        );
        for ignored in ["later", "-5", "1.5", ""] {
            assert_eq!(
                field(&from_environment(name, ignored)),
                KUBERAY_DEFAULT_SECONDS,
                "{name}={ignored:?}"
            );
        }
    }

    #[test]
    fn rayjob_status_check_timeout_seconds_env() {
        assert_timeout_seconds("RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS", |k| {
            k.rayjob_status_check_timeout_seconds
        });
    }

    #[test]
    fn rayjob_deployment_status_transition_grace_period_seconds_env() {
        assert_timeout_seconds(
            "RAYJOB_DEPLOYMENT_STATUS_TRANSITION_GRACE_PERIOD_SECONDS",
            |k| k.rayjob_deployment_status_transition_grace_period_seconds,
        );
    }

    #[test]
    fn flags_set_the_same_switches() {
        use clap::Parser;
        let _serial = ENVIRONMENT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let parsed = Switches::try_parse_from([
            "raypipe",
            "--cluster-domain=corp.example",
            "--enable-init-container-injection=false",
            "--enable-login-shell=TRUE",
            "--rayjob-status-check-timeout-seconds=60",
        ])
        .expect("flags parse")
        .kuberay;
        assert_eq!(parsed.cluster_domain, "corp.example");
        assert!(!parsed.enable_init_container_injection);
        assert!(parsed.enable_login_shell);
        assert_eq!(
            parsed.rayjob_status_check_timeout_seconds,
            Duration::from_secs(60)
        );
    }
}
