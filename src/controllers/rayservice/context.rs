//! What a pass reads besides the RayService: what the controller remembers per RayService
//! between passes (last status written, Serve pushes, deletion deadlines, applied Services),
//! kept in the frame's per-object memory so it starts afresh when the UID changes (failure
//! counts are the frame's), and the caches of owned clusters, Services and head Pods.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use super::config::Config;
use super::error::Error;
use super::serve_watch;
use crate::api::raycluster::RayCluster;
use crate::api::rayservice::{RayService, RayServiceStatus};
use crate::controllers::frame::memory::ObjectKey;
use crate::controllers::frame::memory::ObjectMemory;
use crate::controllers::frame::run::{Frame, Framed};
use crate::k8s::index::ObjectIndex;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;

pub struct Context {
    pub(super) client: kube::Client,
    pub(super) config: Config,
    pub(super) recorder: crate::k8s::EventRecorder,
    pub(super) clusters: Store<RayCluster>,
    /// The cached clusters by controlling RayService: a service's clusters without a scan.
    pub(super) cluster_index: ObjectIndex<RayCluster>,
    pub(super) services: Store<Service>,
    pub(super) head_pods: Store<Pod>,
    /// The cached head Pods by cluster label.
    pub(super) head_pod_index: ObjectIndex<Pod>,
    pub(super) memory: ObjectMemory<ServiceMemory>,
    pub(super) frame: Frame<RayService>,
    /// Settled RayServices' Serve, watched for lost applications (outside the workers).
    pub(super) serve_watches: serve_watch::ServeWatches,
}

/// What a Serve config push left behind, per cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Pushed {
    pub(super) config_hash: String,
    /// The head's Ray session when it was pushed (a new session is a restarted head).
    pub(super) session: Option<String>,
    /// What was pushed: an incremental upgrade re-pushes it with another `target_capacity`
    /// to the cluster whose config is held.
    pub(super) config: serde_json::Value,
}

#[derive(Default)]
pub(super) struct ServiceMemory {
    pub(super) last_status: Option<RayServiceStatus>,
    pub(super) pushed: HashMap<String, Pushed>,
    /// Clusters no longer active or pending, and when they may be deleted.
    pub(super) deletion_due: HashMap<String, Instant>,
    /// Services applied (name → hash of what was applied).
    pub(super) applied_services: HashMap<String, String>,
}

impl Context {
    pub(super) fn with_memory<T>(
        &self,
        service: &RayService,
        f: impl FnOnce(&mut ServiceMemory) -> T,
    ) -> T {
        self.memory.with(service, f)
    }
}

impl Context {
    pub(super) async fn event(
        &self,
        service: &RayService,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        crate::k8s::publish_event(&self.recorder, service, type_, reason, action, note).await;
    }

    pub(super) async fn wait_for_caches(&self) -> Result<(), Error> {
        const LIMIT: Duration = Duration::from_secs(60);
        let ready = async {
            let _ = self.clusters.wait_until_ready().await;
            let _ = self.services.wait_until_ready().await;
            let _ = self.head_pods.wait_until_ready().await;
        };
        tokio::time::timeout(LIMIT, ready)
            .await
            .map_err(|_| Error::CacheNotReady(LIMIT))
    }

    /// The RayClusters this RayService owns, found through the controller index (a lookup,
    /// not a scan of every cached cluster).
    pub(super) fn owned_clusters(&self, service: &RayService) -> Vec<Arc<RayCluster>> {
        let namespace = service.namespace();
        let Some(uid) = service.uid() else {
            return Vec::new();
        };
        self.cluster_index.find(
            &self.clusters,
            namespace.as_deref().unwrap_or_default(),
            &uid,
            |c| {
                c.namespace() == namespace
                    && c.owner_references()
                        .iter()
                        .any(|o| o.controller == Some(true) && o.uid == uid)
            },
        )
    }

    pub(super) fn cached_service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.services.get(&ObjectRef::new(name).within(namespace))
    }
}

impl Framed<RayService> for Context {
    fn frame(&self) -> &Frame<RayService> {
        &self.frame
    }

    /// A deleted RayService: its memory, its failure count and its Serve watch go.
    fn forget(&self, key: &ObjectKey) {
        self.memory.forget(key);
        self.frame.forget(key);
        self.serve_watches
            .unwatch(&kube::runtime::reflector::ObjectRef::new(&key.1).within(&key.0));
    }
}
