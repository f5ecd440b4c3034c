//! `raypipe dev`'s local Ray heads: one per RayService, as on a cluster, where every RayService
//! has RayClusters of its own. Serve's REST API replaces a head's whole set of applications on
//! each push, so two RayServices sharing one head would keep replacing each other's
//! applications (seen: pushes alternating every 1–2 s, most requests failing). A RayService's
//! active and pending clusters share its head; RayClusters and RayJobs that no RayService owns
//! run on the first head. When a RayService is deleted, its applications are deleted from its
//! head (as its cluster would have gone) and the head serves the next RayService.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::api::RayService;
use crate::api::raycluster::RayCluster;
use crate::devenv::ray::{RayHead, RayHeadOptions};
use crate::ray::{DashboardLocator, DashboardUrl, HeadService};

/// Heads at most: each costs about 1 GiB once Serve runs on it.
pub const MAX_HEADS: usize = 3;
/// How often RayServices that are gone are looked for.
const RELEASE_PERIOD: Duration = Duration::from_secs(2);

/// A RayService: namespace and name.
type Owner = (String, String);

enum Slot {
    Starting,
    Ready(Arc<RayHead>),
    Failed(String),
}

struct Head {
    id: u64,
    slot: Slot,
    owner: Option<Owner>,
}

#[derive(Default)]
struct State {
    heads: Vec<Head>,
    next_id: u64,
    stopped: bool,
}

/// The heads, which RayService each serves, and the watches that say which RayServices exist.
#[derive(Clone)]
pub struct HeadPool {
    state: Arc<Mutex<State>>,
    options: RayHeadOptions,
    services: Store<RayService>,
    clusters: Store<RayCluster>,
    tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl HeadPool {
    /// A pool around `first` (already started); further heads start with `options`.
    pub fn new(client: &kube::Client, first: RayHead, options: RayHeadOptions) -> HeadPool {
        let (services, services_writer) = reflector::store();
        let (clusters, clusters_writer) = reflector::store();
        let watch_services = watcher(
            kube::Api::<RayService>::all(client.clone()),
            Default::default(),
        )
        .default_backoff()
        .reflect(services_writer)
        .for_each(|_| async {});
        let watch_clusters = watcher(
            kube::Api::<RayCluster>::all(client.clone()),
            Default::default(),
        )
        .default_backoff()
        .reflect(clusters_writer)
        .for_each(|_| async {});
        let state = State {
            heads: vec![Head {
                id: 0,
                slot: Slot::Ready(Arc::new(first)),
                owner: None,
            }],
            next_id: 1,
            stopped: false,
        };
        let pool = HeadPool {
            state: Arc::new(Mutex::new(state)),
            options,
            services,
            clusters,
            tasks: Arc::default(),
        };
        let releasing = pool.clone();
        pool.spawn(watch_services);
        pool.spawn(watch_clusters);
        pool.spawn(async move { releasing.release_loop().await });
        pool
    }

    /// Where the RayService controller finds each cluster's dashboard.
    pub fn dashboard_locator(&self) -> DashboardLocator {
        let pool = self.clone();
        DashboardLocator::explaining_resolver(move |head| pool.dashboard_of(head))
    }

    /// Where the canary controller reads a RayService's Serve proxy (`<name>-serve-svc`).
    pub fn serve_locator(&self) -> DashboardLocator {
        let pool = self.clone();
        DashboardLocator::explaining_resolver(move |service| pool.serve_of(service))
    }

    /// The Serve HTTP port of the head behind `dashboard` (`http_options` of pushed configs).
    pub fn serve_port(&self, dashboard: &DashboardUrl) -> Option<u16> {
        self.lock().heads.iter().find_map(|h| match &h.slot {
            Slot::Ready(head) if head.dashboard_url() == dashboard => Some(head.ports().serve_http),
            _ => None,
        })
    }

    /// Stops every head (and one still starting) and the watches.
    pub fn shutdown(&self) {
        let heads: Vec<Head> = {
            let mut state = self.lock();
            state.stopped = true;
            std::mem::take(&mut state.heads)
        };
        for task in std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner))
        {
            task.abort();
        }
        drop(heads);
    }

    fn dashboard_of(&self, head: &HeadService) -> Result<String, String> {
        let cluster = self
            .clusters
            .state()
            .into_iter()
            .find(|c| {
                c.namespace().as_deref() == Some(head.namespace.as_str())
                    && crate::kuberay::names::head_service_name(&c.name_any(), &c.spec) == head.name
            })
            .ok_or_else(|| {
                format!(
                    "raypipe dev has not seen the RayCluster behind head Service {}/{} yet",
                    head.namespace, head.name
                )
            })?;
        let owner = cluster
            .owner_references()
            .iter()
            .find(|r| r.kind == "RayService")
            .map(|r| (head.namespace.clone(), r.name.clone()));
        let ray = match owner {
            Some(owner) => self.head_for(&owner)?,
            None => self.first_head()?,
        };
        Ok(ray.dashboard_url().as_str().to_owned())
    }

    fn serve_of(&self, service: &HeadService) -> Result<String, String> {
        let name = service.name.strip_suffix("-serve-svc").ok_or_else(|| {
            format!(
                "{} is not a RayService's Serve Service (<name>-serve-svc)",
                service.name
            )
        })?;
        let ray = self.head_for(&(service.namespace.clone(), name.to_owned()))?;
        Ok(ray.serve_url())
    }

    fn first_head(&self) -> Result<Arc<RayHead>, String> {
        match self.lock().heads.first().map(|h| &h.slot) {
            Some(Slot::Ready(head)) => Ok(head.clone()),
            _ => Err("raypipe dev is stopping".to_owned()),
        }
    }

    /// The head serving `owner`: the one it has, else a free one, else a new one (started in
    /// the background; until it is up the answer says so and the controller retries).
    fn head_for(&self, owner: &Owner) -> Result<Arc<RayHead>, String> {
        let (namespace, name) = owner;
        let mut state = self.lock();
        if let Some(head) = state.heads.iter().find(|h| h.owner.as_ref() == Some(owner)) {
            return match &head.slot {
                Slot::Ready(ray) => Ok(ray.clone()),
                Slot::Starting => Err(format!(
                    "raypipe dev is starting a local Ray head for RayService {namespace}/{name}"
                )),
                Slot::Failed(why) => Err(why.clone()),
            };
        }
        if state.stopped {
            return Err("raypipe dev is stopping".to_owned());
        }
        let exists = self
            .services
            .get(&ObjectRef::new(name).within(namespace))
            .is_some();
        if !exists {
            return Err(format!(
                "raypipe dev has not seen RayService {namespace}/{name} yet"
            ));
        }
        if let Some(free) = state
            .heads
            .iter_mut()
            .find(|h| h.owner.is_none() && matches!(h.slot, Slot::Ready(_)))
        {
            free.owner = Some(owner.clone());
            if let Slot::Ready(ray) = &free.slot {
                announce(owner, ray);
                return Ok(ray.clone());
            }
        }
        if state.heads.len() >= MAX_HEADS {
            let busy: Vec<String> = state
                .heads
                .iter()
                .filter_map(|h| h.owner.as_ref().map(|(ns, n)| format!("{ns}/{n}")))
                .collect();
            return Err(format!(
                "raypipe dev runs at most {MAX_HEADS} local Ray heads and they serve RayServices {}; delete one of those to serve {namespace}/{name}",
                busy.join(", ")
            ));
        }
        let id = state.next_id;
        state.next_id += 1;
        state.heads.push(Head {
            id,
            slot: Slot::Starting,
            owner: Some(owner.clone()),
        });
        drop(state);
        eprintln!("raypipe dev: starting a local Ray head for RayService {namespace}/{name} …");
        let pool = self.clone();
        self.spawn(async move { pool.start_head(id).await });
        Err(format!(
            "raypipe dev is starting a local Ray head for RayService {namespace}/{name}"
        ))
    }

    async fn start_head(&self, id: u64) {
        let started = RayHead::start(self.options.clone()).await;
        let mut state = self.lock();
        let Some(head) = state.heads.iter_mut().find(|h| h.id == id) else {
            // Stopped meanwhile: dropping the head (after the lock) stops it.
            drop(state);
            drop(started);
            return;
        };
        match started {
            Ok(ray) => {
                let ray = Arc::new(ray);
                if let Some(owner) = &head.owner {
                    announce(owner, &ray);
                }
                head.slot = Slot::Ready(ray);
            }
            Err(error) => {
                head.slot = Slot::Failed(format!("the local Ray head did not start: {error}"));
            }
        }
    }

    /// Frees the heads of RayServices that are gone: their Serve applications are deleted (as
    /// their clusters would have gone) and the head waits for the next RayService.
    async fn release_loop(&self) {
        self.services.wait_until_ready().await.ok();
        let mut tick = tokio::time::interval(RELEASE_PERIOD);
        loop {
            tick.tick().await;
            for (owner, ray) in self.release_gone() {
                if let Ok(dashboard) = ray.client(Duration::from_secs(30))
                    && let Err(error) = dashboard.delete_serve_applications().await
                {
                    eprintln!(
                        "raypipe dev: deleting RayService {}/{}'s applications from its Ray head: {error}",
                        owner.0, owner.1
                    );
                }
                eprintln!(
                    "raypipe dev: RayService {}/{} is gone; its local Ray head ({}) is free",
                    owner.0,
                    owner.1,
                    ray.dashboard_url()
                );
            }
        }
    }

    fn release_gone(&self) -> Vec<(Owner, Arc<RayHead>)> {
        let mut state = self.lock();
        let mut released = Vec::new();
        state.heads.retain_mut(|head| {
            let Some((namespace, name)) = head.owner.clone() else {
                return true;
            };
            if self
                .services
                .get(&ObjectRef::new(&name).within(&namespace))
                .is_some()
            {
                return true;
            }
            head.owner = None;
            match &head.slot {
                Slot::Ready(ray) => {
                    released.push(((namespace, name), ray.clone()));
                    true
                }
                Slot::Starting => true,
                // A head that did not start is forgotten; the next RayService tries anew.
                Slot::Failed(_) => false,
            }
        });
        released
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Stops the pool's heads when dropped.
pub struct StopOnDrop(pub HeadPool);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        eprintln!("raypipe dev: stopping the local Ray heads …");
        self.0.shutdown();
    }
}

/// The line a user looks for: where this RayService's Serve answers.
fn announce((namespace, name): &Owner, ray: &RayHead) {
    println!(
        "raypipe dev: RayService {namespace}/{name} runs on the local Ray head with dashboard {} ; its Serve answers on {}",
        ray.dashboard_url(),
        ray.serve_url()
    );
}
