//! What a RayCluster reconcile reads besides the cluster: the controller's context (client,
//! settings, event recorder, the trimmed Pod and Service caches, scale expectations) and what
//! it remembers per cluster between reconciles, kept in the frame's per-object memory so it
//! starts afresh when the UID changes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;

use super::config::Config;
use super::expectations::{ClusterKey, ScaleExpectations};
use crate::api::raycluster::{RayCluster, RayClusterStatus};
use crate::controllers::frame::memory::ObjectMemory;
use crate::controllers::frame::run;
use crate::controllers::frame::run::Frame;
use crate::k8s::index::ObjectIndex;

/// What the controller remembers about one cluster between reconciles. Lost on restart, which
/// costs one status write and one existence check per owned object.
#[derive(Default)]
pub(super) struct ClusterMemory {
    /// The status last written (or found written): the base of the next one, even before the
    /// cache shows it.
    pub(super) last_status: Option<RayClusterStatus>,
    /// When this process last wrote the status.
    pub(super) last_write: Option<Instant>,
    /// A computed status held back because it only moves provisioning along
    /// (`status::plan_write`), and since when: the base of the next one while it waits.
    pub(super) held_status: Option<(RayClusterStatus, Instant)>,
    /// Objects known to exist (kind/name → hash of what was desired, when checked), so that a
    /// settled cluster costs no API calls for them.
    pub(super) ensured: HashMap<String, (String, Instant)>,
}

pub struct Context {
    pub(super) client: kube::Client,
    pub(super) config: Config,
    pub(super) recorder: crate::k8s::EventRecorder,
    pub(super) pods: Store<Pod>,
    /// The cached Pods by namespace and cluster label: a cluster's Pods without a scan of all.
    pub(super) pod_index: ObjectIndex<Pod>,
    pub(super) services: Store<Service>,
    pub(super) service_index: ObjectIndex<Service>,
    pub(super) expectations: ScaleExpectations,
    /// Per cluster, reset when its uid changes (see `frame::memory`).
    pub(super) memory: ObjectMemory<ClusterMemory>,
    pub(super) frame: Frame<RayCluster>,
}

impl run::Framed<RayCluster> for Context {
    fn frame(&self) -> &Frame<RayCluster> {
        &self.frame
    }

    /// A deleted cluster: its scale expectations, memory and failure count go.
    fn forget(&self, key: &ClusterKey) {
        self.expectations.forget(key);
        self.memory.forget(key);
        self.frame.forget(key);
    }
}

impl crate::controllers::frame::ReportPanic<RayCluster> for Context {
    fn report_panic(
        &self,
        object: Arc<RayCluster>,
        message: String,
    ) -> futures::future::BoxFuture<'static, ()> {
        crate::controllers::frame::panic_event(&self.recorder, object, message)
    }
}

impl Context {
    pub(super) fn with_memory<T>(
        &self,
        cluster: &RayCluster,
        f: impl FnOnce(&mut ClusterMemory) -> T,
    ) -> T {
        self.memory.with(cluster, f)
    }

    pub(super) async fn event(
        &self,
        cluster: &RayCluster,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        crate::k8s::publish_event(&self.recorder, cluster, type_, reason, action, note).await;
    }

    pub(super) fn recently_ensured(&self, cluster: &RayCluster, object: &str, hash: &str) -> bool {
        let period = self.config.requeue_after;
        self.with_memory(cluster, |m| {
            m.ensured
                .get(object)
                .is_some_and(|(h, at)| h == hash && at.elapsed() < period)
        })
    }

    pub(super) fn remember_ensured(&self, cluster: &RayCluster, object: String, hash: String) {
        self.with_memory(cluster, |m| {
            m.ensured.insert(object, (hash, Instant::now()));
        });
    }
}
