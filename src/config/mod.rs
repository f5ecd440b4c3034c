//! Operator configuration: every setting of `raypipe run` (clap flags, each with an
//! environment twin, KubeRay's switches under their KubeRay names), parsed once at start-up
//! into immutable settings, and each controller's `Config` built from them. Nothing below this
//! module reads the environment or the command line.
//!
//! - `flags`: the operator's own flags (scope, tuning, leader election, admin, webhook, source,
//!   client, logging).
//! - `kuberay`: KubeRay's environment switches as flags, in one `--help` group.
//! - `file`: KubeRay's `--config` operator `Configuration` file.
//! - here: [`ControllerSettings`], what the controllers are started with;
//! - `build`: each controller's `Config` (and the dashboard locator) built from it.

pub mod build;
pub mod file;
pub mod flags;
pub mod kuberay;

use crate::admin::{Metrics, Readiness};
use crate::validation::feature_gates::FeatureGates;
use file::OperatorConfiguration;
use flags::{ControllerArgs, OperatorArgs};
use kuberay::KubeRayArgs;

/// Which controllers to run; each can be switched off, e.g. to run only the ServePipeline
/// controller beside an existing KubeRay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum ControllerKind {
    Servepipeline,
    Raycluster,
    Rayservice,
    Rayjob,
    Raycronjob,
}

impl ControllerKind {
    /// The CRDs this controller reads or writes.
    pub fn crd_names(self) -> &'static [&'static str] {
        match self {
            ControllerKind::Servepipeline => &["servepipelines.raypipe.dev", "rayservices.ray.io"],
            ControllerKind::Raycluster => &["rayclusters.ray.io"],
            ControllerKind::Rayservice => &["rayservices.ray.io", "rayclusters.ray.io"],
            ControllerKind::Rayjob => &["rayjobs.ray.io", "rayclusters.ray.io"],
            ControllerKind::Raycronjob => &["raycronjobs.ray.io", "rayjobs.ray.io"],
        }
    }

    /// The CRDs `controllers` need together, sorted, each once.
    pub fn needed_crds(controllers: &[ControllerKind]) -> Vec<String> {
        let mut needed: Vec<String> = controllers
            .iter()
            .flat_map(|c| c.crd_names())
            .map(|n| (*n).to_owned())
            .collect();
        needed.sort();
        needed.dedup();
        needed
    }
}

/// What the controllers are started with: settings plus the shared metrics and readiness.
#[derive(Clone, Debug)]
pub struct ControllerSettings {
    pub controllers: Vec<ControllerKind>,
    /// Namespaces to watch; empty: all. One controller instance runs per namespace.
    pub namespaces: Vec<String>,
    pub concurrency: u16,
    pub ray_dashboard_url: Option<String>,
    /// Template of a RayService's Serve proxy URL (see [`flags::ControllerArgs`]).
    pub ray_serve_url: Option<String>,
    /// Where the canary controller reads a RayService's Serve proxy when the caller decides it
    /// (`raypipe dev`: each RayService's own local Ray head); wins over `ray_serve_url`.
    pub serve_locator_override: Option<crate::ray::DashboardLocator>,
    pub runtime_import_path: Option<String>,
    pub runtime_py_modules: Vec<String>,
    pub runtime_env_mirrors: Vec<(String, String)>,
    pub feature_gates: FeatureGates,
    pub metrics: Metrics,
    pub readiness: Readiness,
    /// The RayService controller's settings when the caller decides them (`raypipe dev`,
    /// tests: dashboards and Serve on 127.0.0.1); `None`: from the flags.
    pub rayservice: Option<crate::controllers::rayservice::Config>,
    /// KubeRay's configuration-file-only Pod defaults (`--config`).
    pub configuration: OperatorConfiguration,
    /// KubeRay's environment switches (`--cluster-domain`, `--enable-...`).
    pub kuberay: KubeRayArgs,
    /// Fetches graphs for every ServePipeline controller instance: its destination policy and
    /// its memory budget are operator-wide.
    pub fetcher: crate::source::Fetcher,
    /// The fetch slots every ServePipeline controller instance shares, so one namespace per
    /// instance (`--namespaces`) still means one operator-wide bound and one fair share per host.
    pub fetch_slots: crate::controllers::servepipeline::FetchSlots,
    /// The code layers served to Ray (operator-wide; the package server shares it), and where
    /// Ray nodes reach the package server (`--runtime-base-url`): without it, graph artifacts
    /// with a code layer are refused (CodeNotServable).
    pub code_store: crate::pypackage::CodeStore,
    pub code_base_url: Option<String>,
    /// How pipelines' model nodes are laid out in Serve (`--node-layout`).
    pub node_layout: crate::serve::shared::NodeLayout,
    /// KubeRay's `--batch-scheduler` (or `--enable-batch-scheduler`: Volcano).
    pub batch_scheduler:
        Option<crate::controllers::raycluster::builders::batch_scheduler::BatchScheduler>,
    /// Where ServePipeline revisions are recorded (`--record-history`); `None`: nowhere.
    pub history: Option<crate::history::recorder::RecorderConfig>,
}

impl ControllerSettings {
    /// `controllers` on all namespaces, everything else at its default.
    pub fn new(controllers: &[ControllerKind]) -> ControllerSettings {
        ControllerSettings {
            controllers: controllers.to_vec(),
            namespaces: Vec::new(),
            concurrency: 4,
            ray_dashboard_url: None,
            ray_serve_url: None,
            serve_locator_override: None,
            runtime_import_path: None,
            runtime_py_modules: Vec::new(),
            runtime_env_mirrors: Vec::new(),
            feature_gates: FeatureGates::default(),
            metrics: Metrics::new(),
            readiness: Readiness::new(),
            rayservice: None,
            configuration: OperatorConfiguration::default(),
            kuberay: KubeRayArgs::default(),
            // Public registries only; `raypipe dev` and tests allow the loopback explicitly.
            fetcher: crate::source::Fetcher::default(),
            fetch_slots: Default::default(),
            code_store: crate::pypackage::CodeStore::default(),
            code_base_url: None,
            node_layout: Default::default(),
            batch_scheduler: None,
            history: None,
        }
    }

    pub fn from_args(
        controllers: &[ControllerKind],
        args: &OperatorArgs,
        metrics: Metrics,
        readiness: Readiness,
    ) -> ControllerSettings {
        let batch_scheduler = args.tuning.chosen_batch_scheduler();
        let ControllerArgs {
            concurrency,
            ray_dashboard_url,
            ray_serve_url,
            runtime_import_path,
            mut runtime_py_modules,
            runtime_base_url,
            runtime_env_mirrors,
            feature_gates,
            node_layout,
            batch_scheduler: _,
            enable_batch_scheduler: _,
            // The store is built where its errors can stop the start (`raypipe run`).
            record_history: _,
            history_keep_revisions: _,
            history_keep_days: _,
        } = args.tuning.clone();
        let code_base_url = runtime_base_url
            .as_deref()
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .map(str::to_owned);
        if let Some(base) = &code_base_url {
            runtime_py_modules.push(crate::pypackage::uri(base, &crate::pypackage::runtime()));
        }
        ControllerSettings {
            controllers: controllers.to_vec(),
            namespaces: args.scope.watched_namespaces(),
            concurrency,
            ray_dashboard_url,
            ray_serve_url,
            serve_locator_override: None,
            runtime_import_path,
            runtime_py_modules,
            runtime_env_mirrors,
            feature_gates,
            metrics,
            readiness,
            rayservice: None,
            configuration: args.configuration.clone().unwrap_or_default(),
            kuberay: args.kuberay.clone(),
            fetcher: args.source.fetcher(),
            fetch_slots: Default::default(),
            code_store: crate::pypackage::CodeStore::new(args.source.code_memory_budget),
            code_base_url,
            node_layout,
            batch_scheduler,
            history: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_crd_a_controller_needs_is_one_raypipe_serves() {
        let served: Vec<String> = crate::api::crds()
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        for kind in <ControllerKind as clap::ValueEnum>::value_variants() {
            for name in kind.crd_names() {
                assert!(
                    served.iter().any(|s| s == name),
                    "{kind:?} needs {name}, which raypipe does not serve"
                );
            }
        }
    }
}
