//! Each controller's `Config` built from the operator's settings: the one place where flags,
//! KubeRay's switches and the `--config` file meet the controllers (which read neither the
//! environment nor the command line).

use crate::controllers::{self, raycluster, raycronjob, rayjob, rayservice, servepipeline};
use crate::ray::{DashboardError, DashboardLocator};

use super::{ControllerKind, ControllerSettings};
use crate::validation::feature_gates::gates;

impl ControllerSettings {
    /// Every controller instance to start: one per enabled kind and watched namespace (or one
    /// for all namespaces), each with its complete `Config`.
    pub fn plan(&self) -> Result<controllers::Plan, DashboardError> {
        let running = self.running_controllers();
        let mut instances = Vec::new();
        for kind in &running {
            for namespace in self.scopes() {
                instances.push(self.instance(*kind, namespace)?);
            }
        }
        let records_pipelines = running.contains(&ControllerKind::Servepipeline);
        Ok(controllers::Plan {
            instances,
            crds: ControllerKind::needed_crds(&running),
            readiness: self.readiness.clone(),
            history: self
                .history
                .clone()
                .filter(|_| records_pipelines)
                .map(|config| (config, self.namespaces.clone())),
        })
    }

    /// The chosen controllers that run: the RayCronJob controller only under its feature gate,
    /// as in KubeRay (the webhook then refuses RayCronJobs, which nothing would schedule).
    pub fn running_controllers(&self) -> Vec<ControllerKind> {
        let cron_gate = self.feature_gates.enabled(gates::RAY_CRON_JOB);
        if !cron_gate && self.controllers.contains(&ControllerKind::Raycronjob) {
            tracing::info!(
                "the {} feature gate is off: the RayCronJob controller does not run",
                gates::RAY_CRON_JOB
            );
        }
        self.controllers
            .iter()
            .copied()
            .filter(|kind| *kind != ControllerKind::Raycronjob || cron_gate)
            .collect()
    }

    fn instance(
        &self,
        kind: ControllerKind,
        namespace: Option<String>,
    ) -> Result<controllers::Instance, DashboardError> {
        Ok(match kind {
            ControllerKind::Servepipeline => {
                controllers::Instance::Servepipeline(self.servepipeline(namespace)?)
            }
            ControllerKind::Raycluster => {
                controllers::Instance::Raycluster(self.raycluster(namespace))
            }
            ControllerKind::Rayservice => {
                controllers::Instance::Rayservice(self.rayservice(namespace)?)
            }
            ControllerKind::Rayjob => controllers::Instance::Rayjob(self.rayjob(namespace)?),
            ControllerKind::Raycronjob => {
                controllers::Instance::Raycronjob(self.raycronjob(namespace))
            }
        })
    }

    pub fn servepipeline(
        &self,
        namespace: Option<String>,
    ) -> Result<servepipeline::Config, DashboardError> {
        Ok(servepipeline::Config {
            namespace,
            runtime_import_path: self.runtime_import_path.clone(),
            runtime_py_modules: self.runtime_py_modules.clone(),
            concurrency: self.concurrency,
            metrics: self.metrics.clone(),
            readiness: self.readiness.clone(),
            fetcher: self.fetcher.clone(),
            fetch_slots: self.fetch_slots.clone(),
            code_store: self.code_store.clone(),
            code_base_url: self.code_base_url.clone(),
            serve: Some(match &self.serve_locator_override {
                Some(locator) => locator.clone(),
                None => self.serve_locator()?,
            }),
            rollout_poll: None,
            node_layout: self.node_layout,
        })
    }

    /// Where the canary controller reads a RayService's Serve proxy: the `ray_serve_url`
    /// template when set, else the `<name>-serve-svc` Service's DNS name in the cluster domain.
    pub fn serve_locator(&self) -> Result<DashboardLocator, DashboardError> {
        match self.ray_serve_url.as_deref().map(str::trim) {
            Some(template) if !template.is_empty() => DashboardLocator::template(template),
            _ => Ok(DashboardLocator::in_cluster_with_domain(
                self.kuberay.dashboard_domain(),
            )),
        }
    }

    /// The RayCluster Pod builder's options from KubeRay's switches (the `--config` file's
    /// Pod defaults are added for the RayCluster controller only, as before).
    fn cluster_build_options(&self) -> raycluster::builders::BuildOptions {
        let switches = &self.kuberay;
        raycluster::builders::BuildOptions {
            init_container_injection: switches.enable_init_container_injection,
            probes_injection: switches.enable_probes_injection,
            login_shell: switches.enable_login_shell,
            deterministic_head_pod_name: switches.enable_deterministic_head_pod_name,
            head_cluster_ip_service: switches.enable_ray_head_cluster_ip_service,
            cluster_domain: switches.raycluster_domain(),
            history_server: self
                .feature_gates
                .enabled(gates::RAY_CLUSTER_HISTORY_SERVER),
            batch_scheduler: self.batch_scheduler,
            ..Default::default()
        }
    }

    pub fn raycluster(&self, namespace: Option<String>) -> raycluster::Config {
        let switches = &self.kuberay;
        let mut build = self.cluster_build_options();
        self.configuration.apply_to(&mut build);
        raycluster::Config {
            namespace,
            concurrency: self.concurrency,
            metrics: self.metrics.clone(),
            readiness: self.readiness.clone(),
            requeue_after: switches.raycluster_default_requeue_seconds,
            random_pod_delete: switches.enable_random_pod_delete,
            gcs_ft_redis_cleanup: switches.enable_gcs_ft_redis_cleanup,
            feature_gates: self.feature_gates.clone(),
            build,
            ..raycluster::Config::default()
        }
    }

    /// The caller's RayService settings when given (`raypipe dev`, tests), else the flags'.
    pub fn rayservice(
        &self,
        namespace: Option<String>,
    ) -> Result<rayservice::Config, DashboardError> {
        let base = match &self.rayservice {
            Some(config) => config.clone(),
            None => rayservice::Config {
                dashboard: self.dashboard_locator()?,
                runtime_env_mirrors: self.runtime_env_mirrors.clone(),
                zero_downtime: self.kuberay.enable_zero_downtime,
                build: self.cluster_build_options(),
                feature_gates: self.feature_gates.clone(),
                ..rayservice::Config::default()
            },
        };
        Ok(rayservice::Config {
            namespace,
            concurrency: self.concurrency,
            metrics: self.metrics.clone(),
            readiness: self.readiness.clone(),
            ..base
        })
    }

    pub fn rayjob(&self, namespace: Option<String>) -> Result<rayjob::Config, DashboardError> {
        let switches = &self.kuberay;
        Ok(rayjob::Config {
            namespace,
            concurrency: self.concurrency,
            locator: self.dashboard_locator()?,
            feature_gates: self.feature_gates.clone(),
            build: self.cluster_build_options(),
            cluster_domain: switches.dashboard_domain(),
            delete_rayjob_after_finish: switches.delete_rayjob_cr_after_job_finishes,
            status_check_timeout: switches.rayjob_status_check_timeout_seconds,
            transition_grace_period: switches
                .rayjob_deployment_status_transition_grace_period_seconds,
            metrics: self.metrics.clone(),
            readiness: self.readiness.clone(),
            ..rayjob::Config::default()
        })
    }

    pub fn raycronjob(&self, namespace: Option<String>) -> raycronjob::Config {
        raycronjob::Config {
            namespace,
            concurrency: self.concurrency,
            metrics: self.metrics.clone(),
            readiness: self.readiness.clone(),
            feature_gates: self.feature_gates.clone(),
            ..raycronjob::Config::default()
        }
    }

    /// Where controllers dial a head Service's dashboard: the `ray_dashboard_url` template when
    /// set, else the Service's DNS name in the cluster domain.
    pub fn dashboard_locator(&self) -> Result<DashboardLocator, DashboardError> {
        match self.ray_dashboard_url.as_deref().map(str::trim) {
            Some(template) if !template.is_empty() => DashboardLocator::template(template),
            _ => Ok(DashboardLocator::in_cluster_with_domain(
                self.kuberay.dashboard_domain(),
            )),
        }
    }

    /// `None` (all namespaces) or each watched namespace.
    pub fn scopes(&self) -> Vec<Option<String>> {
        if self.namespaces.is_empty() {
            vec![None]
        } else {
            self.namespaces.iter().cloned().map(Some).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn every_controller() -> ControllerSettings {
        ControllerSettings::new(<ControllerKind as clap::ValueEnum>::value_variants())
    }

    #[test]
    fn default_settings_build_kuberays_defaults() {
        let settings = every_controller();
        let cluster = settings.raycluster(None);
        let defaults = raycluster::Config::default();
        assert_eq!(cluster.requeue_after, defaults.requeue_after);
        assert_eq!(cluster.gcs_ft_redis_cleanup, defaults.gcs_ft_redis_cleanup);
        assert_eq!(cluster.random_pod_delete, defaults.random_pod_delete);
        assert_eq!(
            format!("{:?}", cluster.build),
            format!("{:?}", defaults.build)
        );
        let job = settings.rayjob(None).expect("in-cluster locator");
        assert_eq!(job.cluster_domain, "cluster.local");
        assert!(job.feature_gates.enabled(gates::RAY_JOB_DELETION_POLICY));
        assert_eq!(job.status_check_timeout, Duration::from_secs(300));
        assert!(settings.rayservice(None).expect("rayservice").zero_downtime);
    }

    #[test]
    fn switches_reach_the_controllers_that_read_them() {
        let mut settings = every_controller();
        settings.namespaces = vec!["a".into(), "b".into()];
        settings.concurrency = 7;
        settings.kuberay.cluster_domain = "corp.example.".into();
        settings.kuberay.enable_init_container_injection = false;
        settings.kuberay.enable_zero_downtime = false;
        settings.kuberay.delete_rayjob_cr_after_job_finishes = true;
        settings.kuberay.raycluster_default_requeue_seconds = Duration::from_secs(30);
        settings.configuration.default_pod_labels =
            [("team".to_owned(), "ml".to_owned())].into_iter().collect();
        let volcano = Some(raycluster::builders::batch_scheduler::BatchScheduler::Volcano);
        settings.batch_scheduler = volcano;

        let cluster = settings.raycluster(Some("a".into()));
        assert_eq!(cluster.build.batch_scheduler, volcano);
        assert_eq!(cluster.namespace.as_deref(), Some("a"));
        assert_eq!(cluster.concurrency, 7);
        assert_eq!(cluster.requeue_after, Duration::from_secs(30));
        assert!(!cluster.build.init_container_injection);
        assert_eq!(cluster.build.cluster_domain, "corp.example.");
        assert_eq!(cluster.build.default_pod_labels["team"], "ml");

        let service = settings.rayservice(None).expect("rayservice");
        assert!(!service.zero_downtime);
        assert!(!service.build.init_container_injection);
        // The configuration file's Pod defaults are the RayCluster controller's only.
        assert!(service.build.default_pod_labels.is_empty());

        let job = settings.rayjob(None).expect("rayjob");
        // The RayJob controller makes the job's PodGroup and labels its cluster and submitter.
        assert_eq!(job.build.batch_scheduler, volcano);
        assert_eq!(job.cluster_domain, "corp.example");
        assert!(job.delete_rayjob_after_finish);
        assert_eq!(
            format!("{:?}", job.locator),
            "DashboardLocator::InCluster(corp.example)"
        );

        let plan = settings.plan().expect("a plan");
        // Four kinds in two namespaces: RayCronJob's gate is off by default.
        assert_eq!(plan.instances.len(), 8);
        assert!(!plan.crds.contains(&"raycronjobs.ray.io".to_owned()));
        settings.feature_gates = settings
            .feature_gates
            .clone()
            .with(gates::RAY_CRON_JOB, true);
        let plan = settings.plan().expect("a plan");
        assert_eq!(plan.instances.len(), 10);
        assert!(plan.crds.contains(&"raycronjobs.ray.io".to_owned()));
        assert!(plan.crds.contains(&"servepipelines.raypipe.dev".to_owned()));
    }

    #[test]
    fn a_dashboard_template_replaces_the_in_cluster_locator() {
        let mut settings = every_controller();
        settings.ray_dashboard_url = Some(" http://127.0.0.1:8265 ".into());
        assert_eq!(
            format!("{:?}", settings.dashboard_locator().expect("template")),
            "DashboardLocator::Template(http://127.0.0.1:8265)"
        );
        settings.ray_dashboard_url = Some("http://{nope}".into());
        assert!(settings.plan().is_err());
    }
}
