//! What every reconcile of the ServePipeline controller shares: clients, settings, the caches,
//! the per-pipeline memory and the lanes that run outside the reconcile workers.

use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;

use super::config::Config;
use super::fetches::FetchQueue;
use super::memory::{FetchResult, PipelineState};
use super::stats;
use crate::api::servepipeline::ServePipeline;
use crate::controllers::frame::memory::ObjectMemory;
use crate::controllers::frame::run::Frame;
use crate::source::Fetcher;

pub struct Context {
    pub(super) client: kube::Client,
    pub(super) fetcher: Fetcher,
    pub(super) recorder: crate::k8s::EventRecorder,
    pub(super) config: Config,
    pub(super) secrets: Store<PartialObjectMeta<Secret>>,
    /// Per pipeline, reset when its uid changes (see `frame::memory`).
    pub(super) state: ObjectMemory<Option<PipelineState>>,
    /// Per pipeline, the resourceVersion a status write of this controller was planned from,
    /// and when: until the cache moves past it, a pass would plan from the older copy.
    pub(super) status_written: ObjectMemory<Option<(String, std::time::Instant)>>,
    /// Per pipeline, the last ended rollout counted in the rollouts metric.
    pub(super) counted_rollout: ObjectMemory<Option<String>>,
    pub(super) frame: Frame<ServePipeline>,
    /// Fetches in flight, outside the reconcile workers.
    pub(super) fetches: FetchQueue<FetchResult>,
    /// The canary routers' counters, read outside the reconcile workers.
    pub(super) stats: stats::StatsReaders,
}
