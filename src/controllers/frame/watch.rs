//! The watch kit: every controller's watches, declared instead of wired by hand.
//!
//! A controller says what it watches (its own kind, the children it owns, caches it reads,
//! other objects that concern it) and the kit gives each watch the same treatment: an `Api`
//! scoped to the operator's namespace, a label selector, the shared watch backoff, trimming
//! before anything is cached, an optional index, readiness tracking for every cache, and a
//! mark in the queue-depth metric for each object a change puts in line. The primary kind is
//! cached without managed fields, triggers only on changes its predicate calls relevant (status
//! writes never), and a deleted object is forgotten through [`super::run::Framed::forget`].
//!
//! ```ignore
//! let frame = Frame::new("raything", &config.metrics);
//! let mut watches = Watches::new(&frame, &client, &config.namespace, &config.readiness);
//! let pods = watches.owns_cached(Child::<Pod>::labelled(selector).trimmed(trim_pod));
//! watches.owns(Child::<Job>::labelled(other_selector));
//! let ctx = Arc::new(Context { frame, pods, .. });
//! watches.concurrency(config.concurrency).run(ctx, shutdown).await; // ctx: frame::pass::Stages
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use super::memory::key_of;
use super::pass::{Stages, Watchable, pass};
use super::run::drive;
use crate::admin::Readiness;
use crate::admin::metrics::ReconcileQueue;
use crate::k8s::index::ObjectIndex;

/// One watch of objects other than the controller's own kind: which ones (a label selector),
/// what of them is kept (a trim applied before caching), and an index to find them by.
pub struct Child<C: Watchable> {
    selector: Option<String>,
    trim: Option<fn(&mut C)>,
    index: Option<ObjectIndex<C>>,
}

impl<C: Watchable> Child<C> {
    /// The objects carrying these labels (a label selector such as `a=b,c`): only they reach
    /// the operator's memory.
    pub fn labelled(selector: impl Into<String>) -> Self {
        Child {
            selector: Some(selector.into()),
            trim: None,
            index: None,
        }
    }

    /// Every object of the kind in the operator's namespaces (for kinds that carry no labels
    /// of ours, watched as metadata only).
    pub fn every() -> Self {
        Child {
            selector: None,
            trim: None,
            index: None,
        }
    }

    /// Drops what the controller never reads before an object is cached.
    pub fn trimmed(mut self, trim: fn(&mut C)) -> Self {
        self.trim = Some(trim);
        self
    }

    /// Keeps `index` in step with the cache (it is applied to each event before the cache).
    pub fn indexed(mut self, index: ObjectIndex<C>) -> Self {
        self.index = Some(index);
        self
    }

    /// The raw event stream, trimmed and indexed, and cached by `writer` if one is given.
    fn events(
        self,
        api: Api<C>,
        writer: Option<reflector::store::Writer<C>>,
    ) -> BoxStream<'static, Result<watcher::Event<C>, watcher::Error>> {
        let config = match &self.selector {
            Some(selector) => watcher::Config::default().labels(selector),
            None => watcher::Config::default(),
        };
        let (trim, index) = (self.trim, self.index);
        let events = watcher(api, config)
            .backoff(crate::k8s::watch_backoff())
            .map_ok(move |mut event| {
                if let Some(trim) = trim {
                    event = event.modify(trim);
                }
                if let Some(index) = &index {
                    index.apply(&event);
                }
                event
            });
        match writer {
            Some(writer) => reflector::reflector(writer, events).boxed(),
            None => events.boxed(),
        }
    }
}

type Wiring<K> = Box<dyn FnOnce(Controller<K>) -> Controller<K> + Send>;

/// The watches of one controller whose own kind is `K`. Build it with [`Watches::new`], declare
/// the other watches, hand the stores to the controller's context, then [`Watches::run`].
pub struct Watches<K: Watchable> {
    client: kube::Client,
    namespace: Option<String>,
    controller: &'static str,
    readiness: Readiness,
    queue: ReconcileQueue,
    store: Store<K>,
    writer: reflector::store::Writer<K>,
    relevant: fn(&K) -> Option<u64>,
    wiring: Vec<Wiring<K>>,
    caches: Vec<BoxFuture<'static, ()>>,
    settings: controller::Config,
}

impl<K: Watchable> Watches<K> {
    /// The watches of `frame`'s controller in `namespace` (all namespaces when `None`). The
    /// operator is not ready until every cache declared here holds its first list.
    pub fn new(
        frame: &super::run::Frame<K>,
        client: &kube::Client,
        namespace: &Option<String>,
        readiness: &Readiness,
    ) -> Self {
        let (store, writer) = reflector::store();
        frame.track_ready(readiness, store.clone());
        Watches {
            client: client.clone(),
            namespace: namespace.clone(),
            controller: frame.controller(),
            readiness: readiness.clone(),
            queue: frame.queue().clone(),
            store,
            writer,
            relevant: crate::k8s::spec_or_metadata_changed::<K>,
            wiring: Vec::new(),
            caches: Vec::new(),
            settings: controller::Config::default(),
        }
    }

    /// The cache of the controller's own kind.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Which changes of `K` reconcile it (default: spec, labels, annotations, finalizers and
    /// deletion, see [`crate::k8s::spec_or_metadata_changed`]; status writes never do).
    pub fn relevant_when(&mut self, relevant: fn(&K) -> Option<u64>) -> &mut Self {
        self.relevant = relevant;
        self
    }

    /// How many objects reconcile at once (0: no limit, as `--concurrency` documents).
    pub fn concurrency(&mut self, concurrency: u16) -> &mut Self {
        self.settings = self.settings.clone().concurrency(concurrency);
        self
    }

    /// How long an object's triggers are gathered before it reconciles.
    pub fn debounce(&mut self, debounce: Duration) -> &mut Self {
        self.settings = self.settings.clone().debounce(debounce);
        self
    }

    fn api<C: Watchable>(&self) -> Api<C> {
        crate::k8s::scoped_api(&self.client, self.namespace.as_deref())
    }

    fn cached<C: Watchable>(
        &self,
        child: Child<C>,
    ) -> (
        Store<C>,
        BoxStream<'static, Result<watcher::Event<C>, watcher::Error>>,
    ) {
        let (store, writer) = reflector::store();
        self.readiness.track_store(self.controller, store.clone());
        (store, child.events(self.api(), Some(writer)))
    }

    /// Children of `K` (controlled by a `K`): a change to one reconciles its owner.
    pub fn owns<C: Watchable>(&mut self, child: Child<C>) -> &mut Self {
        let events = child.events(self.api(), None);
        self.own(events);
        self
    }

    /// Children of `K` the reconcile reads from a cache: as [`Watches::owns`], and the cache.
    pub fn owns_cached<C: Watchable>(&mut self, child: Child<C>) -> Store<C> {
        let (store, events) = self.cached(child);
        self.own(events);
        store
    }

    fn own<C: Watchable>(
        &mut self,
        events: BoxStream<'static, Result<watcher::Event<C>, watcher::Error>>,
    ) {
        let queue = self.queue.clone();
        let owner_kind = K::kind(&()).into_owned();
        let changed = events
            .touched_objects()
            .inspect_ok(move |child: &C| queue.owner_changed(child.meta(), &owner_kind));
        self.wiring
            .push(Box::new(move |controller| controller.owns_stream(changed)));
    }

    /// A cache the reconcile reads that reconciles nothing by itself.
    pub fn cache<C: Watchable>(&mut self, child: Child<C>) -> Store<C> {
        let (store, events) = self.cached(child);
        self.caches.push(events.for_each(|_| async {}).boxed());
        store
    }

    /// Other objects that concern some `K`s: `related` names them (it is given the cache of
    /// `K`); each change reconciles those. Returns the cache of the other objects.
    pub fn watches_cached<C, I>(
        &mut self,
        child: Child<C>,
        related: impl Fn(&C, &Store<K>) -> I + Send + Sync + 'static,
    ) -> Store<C>
    where
        C: Watchable,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        let (store, events) = self.cached(child);
        let (queue, owners) = (self.queue.clone(), self.store.clone());
        let mapper = move |changed: C| {
            let refs: Vec<ObjectRef<K>> = related(&changed, &owners).into_iter().collect();
            for r in &refs {
                queue.changed(r.namespace.clone(), r.name.clone());
            }
            refs
        };
        let changed = events.touched_objects();
        self.wiring.push(Box::new(move |controller| {
            controller.watches_stream(changed, mapper)
        }));
        store
    }

    /// Objects named by `trigger` (work that finished outside a reconcile) reconcile again.
    pub fn reconcile_on(
        &mut self,
        trigger: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    ) -> &mut Self {
        let queue = self.queue.clone();
        let trigger = trigger.inspect(move |r| queue.changed(r.namespace.clone(), r.name.clone()));
        self.wiring
            .push(Box::new(move |controller| controller.reconcile_on(trigger)));
        self
    }

    /// Runs the controller, each reconcile one [`pass`] over the context's stages, until
    /// `shutdown` completes; the caches that reconcile nothing stop with it.
    pub async fn run<C: Stages<K>>(
        self,
        ctx: Arc<C>,
        shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    ) {
        let api: Api<K> = self.api();
        let queue = self.queue;
        let forget = ctx.clone();
        let own = watcher(api, watcher::Config::default())
            .backoff(crate::k8s::watch_backoff())
            .modify(|object: &mut K| object.managed_fields_mut().clear())
            .map_ok(move |event| {
                // A deleted object is never reconciled again: what is remembered of it goes now.
                if let watcher::Event::Delete(object) = &event {
                    forget.forget(&key_of(object));
                }
                event
            })
            .reflect(self.writer)
            .applied_objects()
            .predicate_filter(self.relevant, Default::default())
            .inspect_ok(move |object: &K| queue.changed(object.namespace(), object.name_any()))
            .boxed();
        let mut controller =
            Controller::for_stream(own, self.store).trigger_backoff(crate::k8s::watch_backoff());
        for wire in self.wiring {
            controller = wire(controller);
        }
        let controller = controller
            .with_config(self.settings)
            .graceful_shutdown_on(shutdown);
        let caches: Vec<_> = self.caches.into_iter().map(tokio::spawn).collect();
        // Boxed: in a debug build the controller's future is large enough to overflow a test
        // thread's stack when kept inline in the caller's.
        Box::pin(drive(controller, pass::<K, C>, ctx)).await;
        for cache in caches {
            cache.abort();
        }
    }
}
