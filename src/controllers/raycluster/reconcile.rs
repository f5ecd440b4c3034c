//! The stages of one RayCluster pass, as the frame runs them (`controllers::frame::pass`):
//! observe (caches) → validate → act (finalizer, then build and apply the children: `apply`,
//! from the pure `builders`) → status (`status_write`) → finish. A deleted cluster goes to
//! `deletion`.

use std::sync::Arc;

use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::config::SHORT_REQUEUE;
use super::context::Context;
use super::error::Error;
use super::status::{Outcome, StatusWrite};
use super::{apply, deletion, status_write};
use crate::api::raycluster::{AutoscalerVersion, RayCluster, RayClusterStatus};
use crate::controllers::frame::pass::{Acted, Flow, Stages};
use crate::kuberay::keys::reasons;
use crate::validation::problem::Problem;
use crate::validation::validated::Validated;

/// What a RayCluster pass reads.
pub struct Seen {
    cluster: Arc<RayCluster>,
    /// The status the pass builds on: one held back, else the last written (this controller's
    /// memory first: the cache may not show it yet), else the cache's.
    base_status: Option<RayClusterStatus>,
}

/// What the act stage did.
pub enum Applied {
    /// The pass ended early (the cleanup finalizer was just added).
    Stopped(Action),
    /// The children were applied.
    Children(Outcome),
}

impl Stages<RayCluster> for Context {
    type Observed = Seen;
    type Valid = Validated<RayCluster>;
    type Status = RayClusterStatus;
    type Applied = Applied;
    type Error = Error;
    const FIELD_MANAGER: &'static str = crate::k8s::field_managers::RAYCLUSTER;

    fn kube(&self) -> (&kube::Client, &crate::k8s::EventRecorder) {
        (&self.client, &self.recorder)
    }

    async fn observe(
        self: &Arc<Self>,
        cluster: Arc<RayCluster>,
    ) -> Result<Flow<RayCluster, Seen>, Error> {
        self.wait_for_caches().await?;
        if crate::kuberay::spec::managed_elsewhere(cluster.spec.managed_by.as_deref()) {
            // Another controller (e.g. Kueue MultiKueue) owns this cluster.
            return Ok(Flow::Done(Action::await_change()));
        }
        if cluster.meta().deletion_timestamp.is_some() {
            return Ok(Flow::Deleting(cluster));
        }
        let base_status = self
            .with_memory(&cluster, |m| {
                m.held_status
                    .as_ref()
                    .map(|(held, _)| held.clone())
                    .or_else(|| m.last_status.clone())
            })
            .or_else(|| cluster.status.clone());
        Ok(Flow::Go(Seen {
            cluster,
            base_status,
        }))
    }

    fn object(seen: &Seen) -> &RayCluster {
        &seen.cluster
    }

    async fn finalize(&self, cluster: Arc<RayCluster>) -> Result<Action, Error> {
        deletion::finalize(&cluster, self).await
    }

    fn validate(&self, seen: &Seen) -> Result<Validated<RayCluster>, Problem> {
        crate::validation::validated::for_controller(&*seen.cluster, &self.config.feature_gates)
    }

    /// A refused cluster gets the Event and nothing is written; an invalid status also fails
    /// the pass (KubeRay's error for it).
    fn refused(&self, _: &Seen, problem: &Problem) -> Result<Option<RayClusterStatus>, Error> {
        if problem.reason == reasons::INVALID_STATUS {
            return Err(Error::InvalidStatus(problem.message.clone()));
        }
        Ok(None)
    }

    async fn act(
        self: &Arc<Self>,
        seen: &Seen,
        _: Validated<RayCluster>,
    ) -> Acted<RayClusterStatus, Applied, Error> {
        let (cluster, base_status) = (&*seen.cluster, seen.base_status.as_ref());
        warn_autoscaler_v1_restart_policy(cluster, self).await;
        match apply::ensure_cleanup_finalizer(cluster, self).await {
            Ok(None) => {}
            Ok(Some(action)) => {
                return Acted {
                    status: None,
                    result: Ok(Applied::Stopped(action)),
                };
            }
            Err(e) => return Acted::failed(e),
        }
        let outcome = apply::apply_children(cluster, self, base_status).await;
        Acted {
            status: Some(status_write::compute(cluster, self, base_status, &outcome)),
            result: outcome.map(Applied::Children),
        }
    }

    fn plan_write(&self, seen: &Seen, status: &RayClusterStatus) -> StatusWrite {
        status_write::plan(self, &seen.cluster, status)
    }

    fn remember(&self, seen: &Seen, status: RayClusterStatus, write: StatusWrite) {
        status_write::remember(self, &seen.cluster, status, write);
    }

    /// A clean, settled cluster is looked at on the steady interval; a changed status or an
    /// unfinished step (suspension moves this way) soon; a held status when it is due.
    async fn finish(
        &self,
        _: &Seen,
        applied: Result<Applied, Error>,
        write: StatusWrite,
    ) -> Result<Action, Error> {
        let outcome = match applied? {
            Applied::Stopped(action) => return Ok(action),
            Applied::Children(outcome) => outcome,
        };
        let next = match (&outcome, write) {
            (Outcome::Clean, StatusWrite::Skip) => self.config.requeue_after,
            (_, StatusWrite::Hold(rest)) => rest.min(SHORT_REQUEUE),
            _ => SHORT_REQUEUE,
        };
        Ok(Action::requeue(next))
    }
}

/// KubeRay warns (and goes on) when autoscaler v1 meets worker Pods that restart containers.
async fn warn_autoscaler_v1_restart_policy(cluster: &RayCluster, ctx: &Context) {
    if !crate::kuberay::spec::autoscaling_enabled(&cluster.spec)
        || crate::kuberay::spec::autoscaler_version(&cluster.spec) != Some(AutoscalerVersion::V1)
    {
        return;
    }
    let groups: Vec<&str> = cluster
        .spec
        .worker_group_specs
        .iter()
        .flatten()
        .filter(|g| {
            g.template
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref())
                .is_some_and(|p| !p.is_empty() && p != "Never")
        })
        .map(|g| g.group_name.as_str())
        .collect();
    if !groups.is_empty() {
        let note = format!(
            "restartPolicy for worker groups [{}] should be Never or unset when using autoscaler V1",
            groups.join(", ")
        );
        ctx.event(
            cluster,
            EventType::Warning,
            reasons::INVALID_SPEC,
            "Validate",
            note,
        )
        .await;
    }
}
