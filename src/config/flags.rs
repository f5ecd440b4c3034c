//! The operator's own flags (`raypipe run`), each with a `RAYPIPE_` environment twin: scope,
//! controller tuning, leader election, admin and webhook servers, graph sources, the
//! Kubernetes client and logging. `cli` composes them into subcommands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::ArgAction;

use super::ControllerKind;
use super::file::OperatorConfiguration;
use super::kuberay::KubeRayArgs;
use crate::validation::feature_gates::FeatureGates;

fn duration(text: &str) -> Result<Duration, String> {
    crate::validation::parse_duration(text).map_err(|e| e.to_string())
}

/// Every flag of `raypipe run` beyond the controller list and the log format.
#[derive(Debug, Clone, clap::Args)]
pub struct OperatorArgs {
    #[command(flatten)]
    pub scope: ScopeArgs,
    #[command(flatten)]
    pub tuning: ControllerArgs,
    #[command(flatten)]
    pub leader: LeaderElectionArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    #[command(flatten)]
    pub webhook: WebhookArgs,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub console: ConsoleArgs,
    /// A KubeRay operator configuration file (`config.ray.io/v1alpha1` `Configuration`): raypipe
    /// reads the fields KubeRay only takes from that file (`defaultContainerEnvs`,
    /// `defaultPodLabels`, `defaultPodAnnotations`, `headSidecarContainers`,
    /// `workerSidecarContainers`); everything else is set with flags.
    #[arg(long = "config", env = "RAYPIPE_CONFIG", value_parser = super::file::operator_configuration_file)]
    pub configuration: Option<OperatorConfiguration>,
    /// Last: it opens its own `--help` group.
    #[command(flatten)]
    pub kuberay: KubeRayArgs,
}

/// Requests the operator's Kubernetes client may send (KubeRay's `--qps`/`--burst`, as
/// client-go's token bucket: `burst` at once, `qps` on average).
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Average requests per second to the API server; 0: no limit.
    #[arg(long, env = "RAYPIPE_QPS", default_value_t = 100.0)]
    pub qps: f64,
    /// Requests that may be sent at once above the average.
    #[arg(long, env = "RAYPIPE_BURST", default_value_t = 200)]
    pub burst: u32,
}

impl ClientArgs {
    /// `(requests, per period)` for a fixed-window limiter with the same average and burst;
    /// `None` when unlimited (or nonsensical values, which the flags refuse anyway).
    pub fn rate(&self) -> Option<(u64, Duration)> {
        if !(self.qps.is_finite() && self.qps > 0.0) || self.burst == 0 {
            return None;
        }
        let period = Duration::try_from_secs_f64(f64::from(self.burst) / self.qps).ok()?;
        (!period.is_zero()).then_some((u64::from(self.burst), period))
    }
}

/// How graphs are fetched from registries (untrusted: see the source module).
#[derive(Debug, Clone, clap::Args)]
pub struct SourceArgs {
    /// Destinations graph fetches may reach besides public addresses (comma separated): CIDRs
    /// (`10.0.0.0/8`, `fd00::/8`), IP addresses, or exact host names whose DNS you control
    /// (`registry.models.svc.cluster.local`). Loopback, link-local (cloud metadata), private
    /// and cluster-internal addresses are refused unless listed here.
    #[arg(long, env = "RAYPIPE_SOURCE_ALLOWED_DESTINATIONS", default_value = "")]
    pub source_allowed_destinations: crate::source::DestinationPolicy,
    /// Memory all graphs being fetched, decoded and validated may occupy together, as a byte
    /// quantity (`256Mi`, `1Gi`); fetches past it wait, then fail with MemoryBudgetExhausted.
    /// Keep it well below the operator's memory limit.
    #[arg(
        long,
        env = "RAYPIPE_GRAPH_MEMORY_BUDGET",
        default_value = "256Mi",
        value_parser = byte_quantity
    )]
    pub graph_memory_budget: u64,
    /// Memory the code layers of graph artifacts (`raypipe dag push --code`) that the operator
    /// serves to Ray may occupy together, as a byte quantity. Past it the least recently used
    /// layers' bytes are dropped (and pulled again by digest when a Ray node asks); a layer
    /// larger than this is refused (CodeTooLarge). Graph and code budgets together stay well
    /// below the operator's memory limit.
    #[arg(
        long,
        env = "RAYPIPE_CODE_MEMORY_BUDGET",
        default_value = "128Mi",
        value_parser = byte_quantity
    )]
    pub code_memory_budget: u64,
}

impl SourceArgs {
    /// The one fetcher every ServePipeline controller instance shares (so the memory budget is
    /// operator-wide).
    pub fn fetcher(&self) -> crate::source::Fetcher {
        crate::source::Fetcher::with_options(crate::source::FetcherOptions {
            allowed_destinations: self.source_allowed_destinations.clone(),
            graph_memory_budget: self.graph_memory_budget,
            ..Default::default()
        })
    }
}

/// A byte quantity in Kubernetes notation (`256Mi`, `1G`, `1048576`), at least 1 KiB.
fn byte_quantity(text: &str) -> Result<u64, String> {
    let amount = crate::kuberay::quantity::Amount::parse(text)
        .ok_or_else(|| format!("{text:?} is not a byte quantity such as 256Mi or 1Gi"))?;
    let bytes = u64::try_from(amount.ceil_units())
        .map_err(|_| format!("{text:?} is not a positive byte quantity"))?;
    if bytes < 1024 {
        return Err(format!("{text:?} is less than 1Ki"));
    }
    Ok(bytes)
}

#[derive(Debug, Clone, clap::Args)]
pub struct ScopeArgs {
    /// Namespaces to watch (comma separated); unset: all namespaces.
    #[arg(long, env = "RAYPIPE_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// The namespace raypipe runs in (leader Lease, webhook certificate Secret); default: the
    /// service account's namespace in a Pod, else `default`.
    #[arg(long, env = "RAYPIPE_OPERATOR_NAMESPACE")]
    pub operator_namespace: Option<String>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// Reconciliations each controller runs at once (0: no limit).
    #[arg(long, env = "RAYPIPE_CONCURRENCY", default_value_t = 4)]
    pub concurrency: u16,
    /// Ray dashboard URL template used instead of the head Service's DNS name (running outside
    /// the cluster); `{service}`, `{namespace}`, `{port}` and `{domain}` are filled in.
    #[arg(long, env = "RAYPIPE_RAY_DASHBOARD_URL")]
    pub ray_dashboard_url: Option<String>,
    /// Serve proxy URL template used instead of the `<rayservice>-serve-svc` Service's DNS name
    /// (canary rollouts read their routers' counters there); `{service}`, `{namespace}`,
    /// `{port}` and `{domain}` are filled in.
    #[arg(long, env = "RAYPIPE_RAY_SERVE_URL")]
    pub ray_serve_url: Option<String>,
    /// Import path of the graph runtime's application builder.
    #[arg(long, env = "RAYPIPE_RUNTIME_IMPORT_PATH")]
    pub runtime_import_path: Option<String>,
    /// `py_modules` URIs that deliver the graph runtime to Ray (comma separated).
    #[arg(long, env = "RAYPIPE_RUNTIME_PY_MODULES", value_delimiter = ',')]
    pub runtime_py_modules: Vec<String>,
    /// Where Ray nodes reach this operator's package server (the admin port's `/packages`),
    /// e.g. `http://raypipe.raypipe-system.svc:8080/packages`. When set, the graph runtime
    /// built into raypipe is added to every pipeline's `py_modules`, so Ray needs no custom
    /// image for it.
    #[arg(long, env = "RAYPIPE_RUNTIME_BASE_URL")]
    pub runtime_base_url: Option<String>,
    /// `runtime_env` URI rewrites for RayService Serve configs, `FROM=TO` (comma separated):
    /// a `working_dir` or `py_modules` URI starting with FROM is fetched from TO instead, e.g.
    /// `https://github.com/=https://mirror.example.internal/github/` in an air-gapped cluster.
    #[arg(long, env = "RAYPIPE_RUNTIME_ENV_MIRRORS", value_delimiter = ',', value_parser = parse_mirror)]
    pub runtime_env_mirrors: Vec<(String, String)>,
    /// Feature gates, `Name=true,Other=false` (KubeRay's names and defaults).
    #[arg(long, env = "RAYPIPE_FEATURE_GATES", default_value = "")]
    pub feature_gates: FeatureGates,
    /// How pipelines' model nodes are laid out in Serve: `shared` (each node an application
    /// keyed by its content, shared by every graph version that uses it; a change restarts
    /// only the nodes it changes) or `inline` (every node inside its version's application).
    #[arg(long, env = "RAYPIPE_NODE_LAYOUT", value_enum, default_value_t)]
    pub node_layout: crate::serve::shared::NodeLayout,
    /// KubeRay's `--batch-scheduler`: `volcano`, `yunikorn`, `kai-scheduler` or
    /// `scheduler-plugins` gang-schedules Ray Pods (scheduler name, labels, PodGroups as
    /// KubeRay v1.7 writes them).
    #[arg(
        long,
        env = "RAYPIPE_BATCH_SCHEDULER",
        value_enum,
        conflicts_with = "enable_batch_scheduler"
    )]
    pub batch_scheduler:
        Option<crate::controllers::raycluster::builders::batch_scheduler::BatchScheduler>,
    /// KubeRay's deprecated `--enable-batch-scheduler`: the same as `--batch-scheduler volcano`.
    #[arg(long, env = "RAYPIPE_ENABLE_BATCH_SCHEDULER", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub enable_batch_scheduler: bool,
    /// Record each ServePipeline revision's history (graph digest, Serve config, rollout steps,
    /// gate readings, decisions, Serve transitions) in object storage, configured by the
    /// collector's variables (`STORAGE_BACKEND`, `STORAGE_ROOT_DIR`, …; docs/history.md).
    #[arg(long, env = "RAYPIPE_RECORD_HISTORY", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub record_history: bool,
    /// Revisions kept per pipeline when its `spec.history.keepRevisions` is not set.
    #[arg(long, env = "RAYPIPE_HISTORY_KEEP_REVISIONS", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub history_keep_revisions: u32,
    /// Days a revision is kept unchanged when its pipeline's `spec.history.keepDays` is not
    /// set (default: kept by count only).
    #[arg(long, env = "RAYPIPE_HISTORY_KEEP_DAYS", value_parser = clap::value_parser!(u32).range(1..=36_500))]
    pub history_keep_days: Option<u32>,
}

impl ControllerArgs {
    /// The batch scheduler the flags choose (the deprecated switch means Volcano).
    pub fn chosen_batch_scheduler(
        &self,
    ) -> Option<crate::controllers::raycluster::builders::batch_scheduler::BatchScheduler> {
        use crate::controllers::raycluster::builders::batch_scheduler::BatchScheduler;
        self.batch_scheduler.or(self
            .enable_batch_scheduler
            .then_some(BatchScheduler::Volcano))
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct LeaderElectionArgs {
    /// Run the controllers only while holding the leader Lease (needed with 2+ replicas).
    #[arg(long, env = "RAYPIPE_LEADER_ELECTION", action = ArgAction::Set, default_value_t = true)]
    pub leader_election: bool,
    /// Name of the Lease (in the operator namespace).
    #[arg(
        long,
        env = "RAYPIPE_LEADER_ELECTION_ID",
        default_value = "raypipe-leader"
    )]
    pub leader_election_id: String,
    /// This replica's identity in the Lease (a random suffix is added); default: the host name.
    #[arg(long, env = "RAYPIPE_LEADER_ELECTION_IDENTITY")]
    pub leader_election_identity: Option<String>,
    /// How long others wait after the leader's last renewal before taking over.
    #[arg(long, env = "RAYPIPE_LEASE_DURATION", value_parser = duration, default_value = "15s")]
    pub lease_duration: Duration,
    /// How long the leader retries renewing before it stops its controllers.
    #[arg(long, env = "RAYPIPE_RENEW_DEADLINE", value_parser = duration, default_value = "10s")]
    pub renew_deadline: Duration,
    /// Pause between attempts to acquire or renew the Lease.
    #[arg(long, env = "RAYPIPE_RETRY_PERIOD", value_parser = duration, default_value = "2s")]
    pub retry_period: Duration,
}

#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    /// Address of the admin server (`/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "RAYPIPE_ADMIN_ADDRESS", default_value = "0.0.0.0:8080")]
    pub admin_address: SocketAddr,
    /// Also export KubeRay's metrics (`kuberay_cluster_info`, `kuberay_job_*`,
    /// `kuberay_service_*`, and the controller-runtime series KubeRay's dashboard reads) under
    /// KubeRay's names and labels. Off by default: their labels name every object.
    #[arg(long, env = "RAYPIPE_KUBERAY_METRICS", action = ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub kuberay_metrics: bool,
}

impl AdminArgs {
    /// The metrics registry these flags ask for.
    pub fn metrics(&self) -> crate::admin::Metrics {
        crate::admin::Metrics::with_options(crate::admin::MetricsOptions {
            kuberay: self.kuberay_metrics,
        })
    }
}

/// The console (docs/console.md): off unless `--console-address` is set.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsoleArgs {
    /// Serve the console (web UI, JSON API, dashboard front) on this address.
    #[arg(long, env = "RAYPIPE_CONSOLE_ADDRESS")]
    pub console_address: Option<SocketAddr>,
    /// The console's TLS certificate and key (PEM files, re-read when they change); unset:
    /// plain HTTP, for a TLS-terminating ingress in front.
    #[arg(long, env = "RAYPIPE_CONSOLE_TLS_CERT", requires = "console_tls_key")]
    pub console_tls_cert: Option<PathBuf>,
    #[arg(long, env = "RAYPIPE_CONSOLE_TLS_KEY", requires = "console_tls_cert")]
    pub console_tls_key: Option<PathBuf>,
    /// A file holding at least 32 bytes that seal the browser sessions' cookies (a Secret's
    /// key), so sessions survive restarts and hold on every replica; unset: a random key per
    /// process (sessions end with it).
    #[arg(long, env = "RAYPIPE_CONSOLE_COOKIE_KEY_FILE")]
    pub console_cookie_key_file: Option<PathBuf>,
    /// Mark cookies `Secure`: the console is reached over HTTPS (here or at an ingress).
    #[arg(long, env = "RAYPIPE_CONSOLE_SECURE_COOKIES", action = ArgAction::Set, default_value_t = true)]
    pub console_secure_cookies: bool,
    /// Audiences bearer tokens must be meant for (comma separated); unset: the API server's.
    #[arg(long, env = "RAYPIPE_CONSOLE_AUDIENCES", value_delimiter = ',')]
    pub console_audiences: Vec<String>,
    /// The history API's base URL, linked from each pipeline's page.
    #[arg(long, env = "RAYPIPE_CONSOLE_HISTORY_URL")]
    pub console_history_url: Option<String>,
    /// A Prometheus that scrapes the Ray Pods: each pipeline page shows its nodes' calls,
    /// failures and p95 latency from the graph runtime's metrics; unset: no metrics.
    #[arg(long, env = "RAYPIPE_CONSOLE_PROMETHEUS_URL")]
    pub console_prometheus_url: Option<String>,
    /// The label that scrape puts the Pod's namespace in (empty: none).
    #[arg(
        long,
        env = "RAYPIPE_CONSOLE_PROMETHEUS_NAMESPACE_LABEL",
        default_value = "namespace"
    )]
    pub console_prometheus_namespace_label: String,
    /// Put each RayCluster's Ray dashboard behind the console at `/dashboards/<ns>/<name>/`.
    #[arg(long, env = "RAYPIPE_CONSOLE_DASHBOARDS", action = ArgAction::Set, default_value_t = true)]
    pub console_dashboards: bool,
    /// OpenID Connect issuer for browser sign-in (authorization code with PKCE); unset: bearer
    /// tokens only. Use the API server's `--oidc-issuer-url`, so the identities match.
    #[arg(long, env = "RAYPIPE_CONSOLE_OIDC_ISSUER")]
    pub console_oidc_issuer: Option<String>,
    #[arg(
        long,
        env = "RAYPIPE_CONSOLE_OIDC_CLIENT_ID",
        default_value = "raypipe-console"
    )]
    pub console_oidc_client_id: String,
    /// A file holding the client secret (confidential clients); unset: a public client.
    #[arg(long, env = "RAYPIPE_CONSOLE_OIDC_CLIENT_SECRET_FILE")]
    pub console_oidc_client_secret_file: Option<PathBuf>,
    /// Where the provider sends the browser back: `https://<console>/oauth2/callback`.
    #[arg(long, env = "RAYPIPE_CONSOLE_OIDC_REDIRECT_URL")]
    pub console_oidc_redirect_url: Option<String>,
    /// As the API server's `--oidc-username-claim`.
    #[arg(
        long,
        env = "RAYPIPE_CONSOLE_OIDC_USERNAME_CLAIM",
        default_value = "email"
    )]
    pub console_oidc_username_claim: String,
    /// As the API server's `--oidc-username-prefix`.
    #[arg(long, env = "RAYPIPE_CONSOLE_OIDC_USERNAME_PREFIX", default_value = "")]
    pub console_oidc_username_prefix: String,
    /// As the API server's `--oidc-groups-claim`.
    #[arg(
        long,
        env = "RAYPIPE_CONSOLE_OIDC_GROUPS_CLAIM",
        default_value = "groups"
    )]
    pub console_oidc_groups_claim: String,
    /// As the API server's `--oidc-groups-prefix`.
    #[arg(long, env = "RAYPIPE_CONSOLE_OIDC_GROUPS_PREFIX", default_value = "")]
    pub console_oidc_groups_prefix: String,
}

#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Serve the validating admission webhook.
    #[arg(long, env = "RAYPIPE_WEBHOOK", action = ArgAction::Set, default_value_t = false)]
    pub webhook: bool,
    /// Address of the webhook's HTTPS server.
    #[arg(long, env = "RAYPIPE_WEBHOOK_ADDRESS", default_value = "0.0.0.0:9443")]
    pub webhook_address: SocketAddr,
    /// Directory with `tls.crt`, `tls.key` (and `ca.crt`), e.g. a mounted cert-manager Secret;
    /// re-read when it changes. Unset: the operator generates a certificate.
    #[arg(long, env = "RAYPIPE_WEBHOOK_CERT_DIR")]
    pub webhook_cert_dir: Option<PathBuf>,
    /// Secret (in the operator namespace) where the generated certificate is kept, so every
    /// replica serves the same one.
    #[arg(
        long,
        env = "RAYPIPE_WEBHOOK_CERT_SECRET",
        default_value = "raypipe-webhook-cert"
    )]
    pub webhook_cert_secret: String,
    /// Service in front of the webhook: the generated certificate covers its DNS names.
    #[arg(
        long,
        env = "RAYPIPE_WEBHOOK_SERVICE",
        default_value = "raypipe-webhook"
    )]
    pub webhook_service: String,
    /// ValidatingWebhookConfiguration whose CA bundle the operator fills in with the generated
    /// CA (the Helm chart installs it without one).
    #[arg(long, env = "RAYPIPE_WEBHOOK_CONFIGURATION")]
    pub webhook_configuration: Option<String>,
}

/// The namespace of the service account mounted into a Pod, if any.
fn pod_namespace() -> Option<String> {
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "raypipe".to_owned())
}

impl ScopeArgs {
    pub fn operator_namespace(&self) -> String {
        self.operator_namespace
            .clone()
            .or_else(pod_namespace)
            .unwrap_or_else(|| "default".to_owned())
    }

    /// The namespaces to watch, sorted and without duplicates; empty means all.
    pub fn watched_namespaces(&self) -> Vec<String> {
        let mut namespaces: Vec<String> = self
            .namespaces
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        namespaces.sort();
        namespaces.dedup();
        namespaces
    }
}

impl LeaderElectionArgs {
    /// The Lease settings, with a unique identity.
    pub fn lease_settings(&self, namespace: &str) -> crate::leader::LeaseSettings {
        let base = self
            .leader_election_identity
            .clone()
            .unwrap_or_else(host_name);
        crate::leader::LeaseSettings {
            namespace: namespace.to_owned(),
            name: self.leader_election_id.clone(),
            identity: crate::leader::unique_identity(&base),
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
    }
}

/// `FROM=TO`: both sides non-empty URI prefixes.
fn parse_mirror(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((from, to)) if !from.trim().is_empty() && !to.trim().is_empty() => {
            Ok((from.trim().to_owned(), to.trim().to_owned()))
        }
        _ => Err(format!(
            "{text:?} is not FROM=TO (two URI prefixes, e.g. https://github.com/=https://mirror.internal/github/)"
        )),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `--controllers`, shared by `run` and `dev`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerListArgs {
    /// Controllers to run (comma separated).
    #[arg(
        long,
        env = "RAYPIPE_CONTROLLERS",
        value_delimiter = ',',
        default_value = "servepipeline,raycluster,rayservice,rayjob,raycronjob"
    )]
    pub controllers: Vec<ControllerKind>,
}

/// `--log-level`, shared by `run` and `dev`.
#[derive(Debug, Clone, clap::Args)]
pub struct LogLevelArgs {
    /// What to log: a level (error, warn, info, debug, trace) or filter directives such as
    /// `info,raypipe=debug`. `RUST_LOG`, when set, takes precedence (for debugging a deployment
    /// without changing its flags).
    #[arg(long, env = "RAYPIPE_LOG_LEVEL", default_value = "info", value_parser = parse_log_level)]
    pub log_level: String,
}

fn parse_log_level(value: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(value)
        .map(|_| value.to_owned())
        .map_err(|e| format!("not a log level or filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operator's flags alone, as `raypipe run` parses them.
    #[derive(Debug, clap::Parser)]
    struct Operator {
        #[command(flatten)]
        operator: OperatorArgs,
    }

    pub(crate) fn parse_operator_args(args: &[&str]) -> Result<OperatorArgs, clap::Error> {
        use clap::Parser;
        let argv = std::iter::once("raypipe").chain(args.iter().copied());
        Operator::try_parse_from(argv).map(|parsed| parsed.operator)
    }
    #[test]
    fn mirrors_are_from_equals_to_pairs() {
        assert_eq!(
            parse_mirror("https://github.com/=http://127.0.0.1:9/gh/"),
            Ok((
                "https://github.com/".to_owned(),
                "http://127.0.0.1:9/gh/".to_owned()
            ))
        );
        for bad in ["https://github.com/", "=x", "x=", ""] {
            assert!(parse_mirror(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn run_elects_a_leader_unless_told_not_to() {
        let parse =
            |args: &[&str]| -> OperatorArgs { parse_operator_args(args).expect("valid flags") };
        let defaults = parse(&[]);
        assert!(defaults.leader.leader_election);
        assert_eq!(defaults.leader.lease_duration, Duration::from_secs(15));
        assert!(!defaults.webhook.webhook);
        assert!(!defaults.admin.kuberay_metrics);
        assert!(parse(&["--kuberay-metrics"]).admin.kuberay_metrics);
        assert!(parse(&["--kuberay-metrics=true"]).admin.kuberay_metrics);
        assert!(!parse(&["--kuberay-metrics=false"]).admin.kuberay_metrics);
        assert!(defaults.scope.watched_namespaces().is_empty());
        let custom = parse(&[
            "--leader-election=false",
            "--namespaces=a,b",
            "--retry-period=500ms",
            "--feature-gates=RayCronJob=true",
        ]);
        assert!(!custom.leader.leader_election);
        assert_eq!(custom.scope.watched_namespaces(), vec!["a", "b"]);
        assert_eq!(custom.leader.retry_period, Duration::from_millis(500));
        assert!(
            custom
                .tuning
                .feature_gates
                .enabled(crate::validation::feature_gates::gates::RAY_CRON_JOB)
        );
        let lease = custom.leader.lease_settings("ops");
        assert_eq!(lease.namespace, "ops");
        assert!(lease.check().is_ok());
    }

    #[test]
    fn source_settings_default_to_public_only_and_256_mib() {
        let parse = |args: &[&str]| parse_operator_args(args).map(|operator| operator.source);
        let defaults = parse(&[]).expect("defaults parse");
        assert_eq!(defaults.graph_memory_budget, 256 * 1024 * 1024);
        assert_eq!(
            defaults.source_allowed_destinations,
            crate::source::DestinationPolicy::public_only()
        );
        let custom = parse(&[
            "--graph-memory-budget=1Gi",
            "--source-allowed-destinations=10.0.0.0/8, registry.models.svc,fd00::/8",
        ])
        .expect("custom parse");
        assert_eq!(custom.graph_memory_budget, 1 << 30);
        let allowed = &custom.source_allowed_destinations;
        assert!(allowed.admits_address("10.1.2.3".parse().expect("ip")));
        assert!(allowed.admits_host_name("registry.models.svc"));
        assert!(!allowed.admits_address("169.254.169.254".parse().expect("ip")));
        assert_eq!(custom.fetcher().memory_budget().total_bytes(), 1 << 30);
        for bad in [
            "--graph-memory-budget=lots",
            "--graph-memory-budget=-1Mi",
            "--graph-memory-budget=10",
            "--source-allowed-destinations=10.0.0.0/99",
        ] {
            assert!(parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn scope_lists_are_normalised() {
        let scope = ScopeArgs {
            namespaces: vec!["b".into(), " a ".into(), "b".into(), String::new()],
            operator_namespace: Some("ops".into()),
        };
        assert_eq!(scope.watched_namespaces(), vec!["a", "b"]);
        assert_eq!(scope.operator_namespace(), "ops");
    }

    #[test]
    fn client_rate_matches_kuberays_qps_and_burst() {
        let rate = |qps: f64, burst: u32| ClientArgs { qps, burst }.rate();
        assert_eq!(rate(100.0, 200), Some((200, Duration::from_secs(2))));
        assert_eq!(rate(50.0, 10), Some((10, Duration::from_millis(200))));
        assert_eq!(rate(0.0, 200), None);
        assert_eq!(rate(f64::NAN, 200), None);
        assert_eq!(rate(100.0, 0), None);
    }

    #[test]
    fn batch_scheduler_flags_are_kuberays() {
        use crate::controllers::raycluster::builders::batch_scheduler::BatchScheduler;
        let chosen =
            |args: &[&str]| parse_operator_args(args).map(|a| a.tuning.chosen_batch_scheduler());
        assert_eq!(chosen(&[]).expect("parses"), None);
        for (name, scheduler) in [
            ("volcano", BatchScheduler::Volcano),
            ("yunikorn", BatchScheduler::YuniKorn),
            ("kai-scheduler", BatchScheduler::KaiScheduler),
            ("scheduler-plugins", BatchScheduler::SchedulerPlugins),
        ] {
            assert_eq!(
                chosen(&["--batch-scheduler", name]).expect("parses"),
                Some(scheduler)
            );
            assert_eq!(scheduler.flag_name(), name);
        }
        // The deprecated switch means Volcano; both together are refused, as KubeRay does.
        assert_eq!(
            chosen(&["--enable-batch-scheduler"]).expect("parses"),
            Some(BatchScheduler::Volcano)
        );
        assert!(chosen(&["--enable-batch-scheduler", "--batch-scheduler", "yunikorn"]).is_err());
        assert!(chosen(&["--batch-scheduler", "slurm"]).is_err());
    }
}
