//! Serve losing what the operator pushed, noticed within a second or two.
//!
//! A settled RayService is reconciled every `steady_poll` (10 s), so when its head's Serve lost
//! the applications (Serve's controller restarted without its checkpoint, the head restarted, or
//! someone deleted them through the dashboard) requests failed for that long before the next
//! pass pushed the config again. Each settled RayService therefore gets a watch: a task that
//! asks the active cluster's dashboard for the applications every [`WATCH_INTERVAL`] and, as soon
//! as one the operator pushed is missing, wakes the RayService's reconcile (which pushes) and
//! ends. It reads, never writes, and holds no reconcile worker; a dashboard that does not answer
//! costs the watch's own task (the read is bounded by the dashboard client's timeout) and is
//! left to the reconcile's own checks. A watch no settled pass refreshed for a while ends by
//! itself (three steady polls: the RayService is no longer settled, or it went), and there is one
//! per RayService.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use crate::api::rayservice::RayService;
use crate::ray::{DashboardClient as _, RayDashboardClient};

/// How often a watch reads the applications.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

struct Watch {
    /// The dashboard's URL and the applications watched for: a pass that asks for the same
    /// keeps the running task.
    what: (String, BTreeSet<String>),
    refreshed: Arc<Mutex<Instant>>,
    task: tokio::task::AbortHandle,
}

/// One watch per settled RayService.
pub struct ServeWatches {
    watches: Mutex<HashMap<ObjectRef<RayService>, Watch>>,
    wake: mpsc::UnboundedSender<ObjectRef<RayService>>,
}

impl ServeWatches {
    /// The watches and the stream of RayServices to reconcile because Serve lost an application
    /// (give it to `Controller::reconcile_on`).
    pub fn new() -> (ServeWatches, BoxStream<'static, ObjectRef<RayService>>) {
        let (wake, woken) = mpsc::unbounded_channel();
        let woken = futures::stream::unfold(woken, |mut rx| async move {
            rx.recv().await.map(|key| (key, rx))
        })
        .boxed();
        (
            ServeWatches {
                watches: Mutex::default(),
                wake,
            },
            woken,
        )
    }

    /// Watches `applications` on `dashboard` for `key` (starting, refreshing or moving the
    /// watch) until no pass refreshed it for `idle_after`.
    pub fn watch(
        &self,
        key: &ObjectRef<RayService>,
        dashboard: &RayDashboardClient,
        applications: BTreeSet<String>,
        idle_after: Duration,
    ) {
        if applications.is_empty() {
            return self.unwatch(key);
        }
        let what = (dashboard.dashboard_url().as_str().to_owned(), applications);
        let mut watches = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(watch) = watches.get(key)
            && watch.what == what
            && !watch.task.is_finished()
        {
            *watch.refreshed.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
            return;
        }
        if let Some(old) = watches.remove(key) {
            old.task.abort();
        }
        watches.retain(|_, w| !w.task.is_finished());
        let refreshed = Arc::new(Mutex::new(Instant::now()));
        let task = tokio::spawn(watch_until_lost(
            key.clone(),
            dashboard.clone(),
            what.1.clone(),
            refreshed.clone(),
            idle_after,
            self.wake.clone(),
        ))
        .abort_handle();
        watches.insert(
            key.clone(),
            Watch {
                what,
                refreshed,
                task,
            },
        );
    }

    /// Ends `key`'s watch (not settled, or going).
    pub fn unwatch(&self, key: &ObjectRef<RayService>) {
        let mut watches = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(watch) = watches.remove(key) {
            watch.task.abort();
        }
    }
}

impl Drop for ServeWatches {
    fn drop(&mut self) {
        for watch in self
            .watches
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            watch.task.abort();
        }
    }
}

async fn watch_until_lost(
    key: ObjectRef<RayService>,
    dashboard: RayDashboardClient,
    applications: BTreeSet<String>,
    refreshed: Arc<Mutex<Instant>>,
    idle_after: Duration,
    wake: mpsc::UnboundedSender<ObjectRef<RayService>>,
) {
    loop {
        tokio::time::sleep(WATCH_INTERVAL).await;
        if refreshed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
            > idle_after
        {
            return;
        }
        let Ok(details) = dashboard.get_serve_applications().await else {
            continue;
        };
        if let Some(lost) = applications.iter().find(|name| lost(&details, name)) {
            tracing::info!(
                rayservice = %key,
                application = %lost,
                "Serve lost an application the operator pushed; reconciling now"
            );
            let _ = wake.send(key);
            return;
        }
    }
}

/// Whether Serve lost `application`: it does not know it, or is deleting it (someone deleted
/// Serve or the application; Serve shows it as DELETING for seconds before it is gone).
pub(super) fn lost(details: &crate::ray::ServeInstanceDetails, application: &str) -> bool {
    details
        .applications
        .get(application)
        .is_none_or(|app| app.status == Some(crate::ray::ApplicationStatus::Deleting))
}
