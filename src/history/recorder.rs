//! The recorder: watches ServePipelines and writes each revision's record
//! ([`super::revisions`]) as its status moves. Reading the status (not hooking the reconciler)
//! keeps one source of truth: what the record says is what the pipeline said, in order. What a
//! status does not hold (the Serve config, the Ray clusters) is read from the RayService when a
//! revision starts serving.
//!
//! [`changes`] is pure: from the last sighting and this one it updates the index (new
//! revisions, serving spans, outcomes) and says what to append to which revision's timeline.
//! The writer loads records only when they change, writes a record before the index that names
//! it, enforces retention, and retries what failed on the next tick. A failing store never
//! stops a controller: the recorder logs, keeps what it has, and tries again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::Api;
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};

use super::revisions::{
    Happening, MAX_TIMELINE_ENTRIES, Outcome, PipelineIndex, Retention, RevisionRecord,
    RevisionStore, RevisionSummary, ServedSpan, TimelineEntry, expired, revision_id,
};
use crate::api::rayservice::RayService;
use crate::api::servepipeline::{GateReadings, ServePipeline};

/// Gate readings are recorded at most this often per revision (and at every step and decision).
const READINGS_EVERY: Duration = Duration::from_secs(10);
/// How often changed records are written.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// What the recorder runs with.
#[derive(Clone)]
pub struct RecorderConfig {
    pub store: RevisionStore,
    /// When a pipeline's `spec.history` says nothing.
    pub default_retention: Retention,
}

impl std::fmt::Debug for RecorderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The store's settings may hold credentials: only the retention is shown.
        f.debug_struct("RecorderConfig")
            .field("default_retention", &self.default_retention)
            .finish_non_exhaustive()
    }
}

/// What the recorder reads of a ServePipeline; the last one is kept in the index so a
/// restarted operator compares with what was recorded, not with nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sighting {
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The graph applied (`status.source.digest`) and its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<(String, Option<String>)>,
    /// With a canary policy: the stable version's digest, version and application.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable: Option<(String, Option<String>, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanarySighting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<LastOutcome>,
    /// Whether the pipeline has a rollout status (canary policy).
    #[serde(default)]
    pub rolls_out: bool,
    /// Type → (status, reason, message).
    #[serde(default)]
    pub conditions: BTreeMap<String, (String, String, String)>,
    /// Application → (status, message, deployment → (status, message)).
    #[serde(default)]
    pub applications: BTreeMap<String, AppSighting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_service: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppSighting {
    pub status: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub deployments: BTreeMap<String, (String, String)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanarySighting {
    pub digest: String,
    #[serde(default)]
    pub version: Option<String>,
    pub application: String,
    pub step: i32,
    pub steps: i32,
    pub weight: i32,
    #[serde(default)]
    pub readings: Option<GateReadings>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastOutcome {
    pub digest: String,
    #[serde(default)]
    pub version: Option<String>,
    pub result: String,
    pub reason: String,
    #[serde(default)]
    pub node: Option<String>,
    pub message: String,
    pub at: String,
    #[serde(default)]
    pub readings: Option<GateReadings>,
}

impl Sighting {
    pub fn of(pipeline: &ServePipeline) -> Sighting {
        let status = pipeline.status.clone().unwrap_or_default();
        let rollout = status.rollout.as_ref();
        Sighting {
            uid: pipeline.metadata.uid.clone().unwrap_or_default(),
            generation: pipeline.metadata.generation,
            phase: status.phase.clone(),
            source: status.source.as_ref().map(|s| {
                (
                    s.digest.clone(),
                    status.graph.as_ref().and_then(|g| g.version.clone()),
                )
            }),
            stable: rollout
                .and_then(|r| r.stable.as_ref())
                .map(|v| (v.digest.clone(), v.version.clone(), v.application.clone())),
            canary: rollout
                .and_then(|r| r.canary.as_ref())
                .map(|c| CanarySighting {
                    digest: c.version.digest.clone(),
                    version: c.version.version.clone(),
                    application: c.version.application.clone(),
                    step: c.step,
                    steps: c.steps,
                    weight: c.weight,
                    readings: c.readings.clone(),
                }),
            last: rollout.and_then(|r| r.last.as_ref()).map(|l| LastOutcome {
                digest: l.digest.clone(),
                version: l.version.clone(),
                result: l.result.clone(),
                reason: l.reason.clone(),
                node: l.node.clone(),
                message: l.message.clone(),
                at: l.at.0.to_string(),
                readings: l.readings.clone(),
            }),
            rolls_out: rollout.is_some(),
            conditions: status
                .conditions
                .iter()
                .map(|c| {
                    (
                        c.type_.clone(),
                        (c.status.clone(), c.reason.clone(), c.message.clone()),
                    )
                })
                .collect(),
            applications: status
                .applications
                .iter()
                .map(|(name, app)| {
                    (
                        name.clone(),
                        AppSighting {
                            status: app.status.clone().unwrap_or_default(),
                            message: app.message.clone().unwrap_or_default(),
                            deployments: app
                                .deployments
                                .iter()
                                .map(|(d, s)| {
                                    (
                                        d.clone(),
                                        (
                                            s.status.clone().unwrap_or_default(),
                                            s.message.clone().unwrap_or_default(),
                                        ),
                                    )
                                })
                                .collect(),
                        },
                    )
                })
                .collect(),
            ray_service: status.ray_service_name.clone(),
        }
    }

    /// The newest revision: the canary's, else the graph applied, else the stable one.
    fn current(&self) -> Option<&str> {
        self.canary
            .as_ref()
            .map(|c| c.digest.as_str())
            .or(self.source.as_ref().map(|s| s.0.as_str()))
            .or(self.stable.as_ref().map(|s| s.0.as_str()))
    }

    /// Digest → role of each revision answering requests now; `None` while that cannot be told
    /// (an Immediate pipeline deploying: what served keeps serving until it is replaced).
    fn serving(&self) -> Option<BTreeMap<String, String>> {
        let mut serving = BTreeMap::new();
        let phase = self.phase.as_deref().unwrap_or_default();
        if phase == "Suspended" {
            return Some(serving);
        }
        if self.rolls_out {
            if let Some((digest, ..)) = &self.stable {
                serving.insert(digest.clone(), "stable".to_owned());
            }
            if let Some(canary) = self.canary.as_ref().filter(|c| c.weight > 0) {
                serving.insert(canary.digest.clone(), "canary".to_owned());
            }
            return Some(serving);
        }
        match phase {
            "Ready" | "Degraded" => {
                if let Some((digest, _)) = &self.source {
                    serving.insert(digest.clone(), "stable".to_owned());
                }
                Some(serving)
            }
            "Failed" | "Pending" => Some(serving),
            _ => None,
        }
    }

    /// The digest an application's transitions belong to.
    fn application_owner(&self, application: &str) -> Option<&str> {
        if let Some(canary) = self
            .canary
            .as_ref()
            .filter(|c| c.application == application)
        {
            return Some(&canary.digest);
        }
        if let Some((digest, _, app)) = &self.stable
            && app == application
        {
            return Some(digest);
        }
        self.stable
            .as_ref()
            .map(|s| s.0.as_str())
            .filter(|_| self.canary.is_none())
            .or(self.current())
    }

    fn version_of(&self, digest: &str) -> Option<String> {
        if let Some(c) = self.canary.as_ref().filter(|c| c.digest == digest) {
            return c.version.clone();
        }
        if let Some((_, version, _)) = self.stable.as_ref().filter(|s| s.0 == digest) {
            return version.clone();
        }
        if let Some((_, version)) = self.source.as_ref().filter(|s| s.0 == digest) {
            return version.clone();
        }
        self.last
            .as_ref()
            .filter(|l| l.digest == digest)
            .and_then(|l| l.version.clone())
    }
}

/// A pipeline's recorded state between sightings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecorderState {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<Sighting>,
    /// Revision id → when its readings were last recorded.
    #[serde(default)]
    pub readings_at: BTreeMap<String, String>,
}

/// What one sighting appends: (revision id, happening), in order.
pub type Appends = Vec<(String, Happening)>;

/// Compares `now` with `state.last`, updates `index` (new revisions, spans, outcome, last
/// change) and returns what each revision's timeline gains. `at` is this sighting's time.
pub fn changes(
    index: &mut PipelineIndex,
    state: &mut RecorderState,
    now: &Sighting,
    at: &jiff::Timestamp,
) -> Appends {
    let at_text = at.to_string();
    let prev = state.last.clone().unwrap_or_default();
    let mut appends: Appends = Vec::new();
    index.uid.clone_from(&now.uid);
    index.deleted_at = None;

    // Every digest this sighting names has a revision.
    let named = [
        now.source.as_ref().map(|s| s.0.clone()),
        now.stable.as_ref().map(|s| s.0.clone()),
        now.canary.as_ref().map(|c| c.digest.clone()),
        now.last.as_ref().map(|l| l.digest.clone()),
    ];
    let mut ids: HashMap<String, String> = index
        .revisions
        .iter()
        .map(|r| (r.digest.clone(), r.id.clone()))
        .collect();
    for digest in named.into_iter().flatten() {
        if ids.contains_key(&digest) {
            continue;
        }
        let seq = index.next_seq.max(1);
        index.next_seq = seq + 1;
        let id = revision_id(seq, &digest);
        index.revisions.push(RevisionSummary {
            id: id.clone(),
            seq,
            digest: digest.clone(),
            version: now.version_of(&digest),
            first_seen: at_text.clone(),
            last_change: at_text.clone(),
            ..RevisionSummary::default()
        });
        ids.insert(digest.clone(), id.clone());
        appends.push((id, Happening::Seen { source: None }));
    }
    let id_of = |digest: &str| ids.get(digest).cloned();

    // Serving: spans close and open.
    if let Some(serving) = now.serving() {
        let before = prev.serving().unwrap_or_else(|| open_spans(index));
        for (digest, role) in &before {
            if serving.get(digest) != Some(role)
                && let Some(id) = id_of(digest)
            {
                close_span(index, &id, role, &at_text);
                appends.push((
                    id,
                    Happening::Serving {
                        role: role.clone(),
                        serving: false,
                    },
                ));
            }
        }
        for (digest, role) in &serving {
            let open = index
                .revisions
                .iter()
                .find(|r| &r.digest == digest)
                .is_some_and(|r| {
                    r.served
                        .iter()
                        .any(|s| &s.role == role && s.until.is_none())
                });
            if !open && let Some(id) = id_of(digest) {
                if let Some(summary) = index.revisions.iter_mut().find(|r| r.id == id) {
                    summary.served.push(ServedSpan {
                        role: role.clone(),
                        from: at_text.clone(),
                        until: None,
                    });
                }
                appends.push((
                    id,
                    Happening::Serving {
                        role: role.clone(),
                        serving: true,
                    },
                ));
            }
        }
    }

    // A canary's steps and readings.
    if let Some(canary) = &now.canary
        && let Some(id) = id_of(&canary.digest)
    {
        let moved = prev.canary.as_ref().is_none_or(|p| {
            p.digest != canary.digest || p.step != canary.step || p.steps != canary.steps
        });
        if moved {
            appends.push((
                id.clone(),
                Happening::Step {
                    step: canary.step,
                    steps: canary.steps,
                    weight: canary.weight,
                },
            ));
        }
        if let Some(readings) = &canary.readings {
            let changed = prev
                .canary
                .as_ref()
                .filter(|p| p.digest == canary.digest)
                .and_then(|p| p.readings.as_ref())
                != Some(readings);
            let due = moved
                || state.readings_at.get(&id).is_none_or(|last| {
                    last.parse::<jiff::Timestamp>().is_ok_and(|last| {
                        at.duration_since(last)
                            >= jiff::SignedDuration::try_from(READINGS_EVERY).unwrap_or_default()
                    })
                });
            if changed && due {
                state.readings_at.insert(id.clone(), at_text.clone());
                appends.push((
                    id,
                    Happening::Readings {
                        step: canary.step,
                        readings: readings.clone(),
                    },
                ));
            }
        }
    }

    // How a rollout ended.
    let mut decided: Option<String> = None;
    if let Some(last) = &now.last
        && prev.last.as_ref() != Some(last)
        && prev.last.as_ref().is_none_or(|p| {
            (p.digest.as_str(), p.at.as_str()) != (last.digest.as_str(), last.at.as_str())
        })
        && let Some(id) = id_of(&last.digest)
    {
        if let Some(summary) = index.revisions.iter_mut().find(|r| r.id == id) {
            summary.outcome = Some(Outcome {
                result: last.result.clone(),
                reason: last.reason.clone(),
                node: last.node.clone(),
                message: last.message.clone(),
                at: last.at.clone(),
            });
        }
        decided = Some(id.clone());
        appends.push((
            id,
            Happening::Decision {
                result: last.result.clone(),
                reason: last.reason.clone(),
                node: last.node.clone(),
                message: last.message.clone(),
                readings: last.readings.clone(),
            },
        ));
    }

    // The pipeline's phase and conditions belong to its newest revision; those that change with
    // a decision (RolledBack, Progressing) to the revision decided on.
    if let Some(current) = decided.or_else(|| now.current().and_then(id_of)) {
        if now.phase != prev.phase
            && let Some(phase) = &now.phase
        {
            appends.push((
                current.clone(),
                Happening::Phase {
                    phase: phase.clone(),
                },
            ));
        }
        for (type_, (status, reason, message)) in &now.conditions {
            let changed = prev
                .conditions
                .get(type_)
                .is_none_or(|(s, r, _)| s != status || r != reason);
            if changed {
                appends.push((
                    current.clone(),
                    Happening::Condition {
                        type_: type_.clone(),
                        status: status.clone(),
                        reason: reason.clone(),
                        message: message.clone(),
                    },
                ));
            }
        }
    }

    // Serve applications and deployments, each with the revision it runs.
    for (application, app) in &now.applications {
        let Some(owner) = now.application_owner(application).and_then(id_of) else {
            continue;
        };
        let before = prev.applications.get(application);
        if before.is_none_or(|b| b.status != app.status) && !app.status.is_empty() {
            appends.push((
                owner.clone(),
                Happening::Application {
                    application: application.clone(),
                    status: app.status.clone(),
                    message: app.message.clone(),
                },
            ));
        }
        for (deployment, (status, message)) in &app.deployments {
            let was = before.and_then(|b| b.deployments.get(deployment));
            if was.is_none_or(|(s, _)| s != status) && !status.is_empty() {
                appends.push((
                    owner.clone(),
                    Happening::Deployment {
                        application: application.clone(),
                        deployment: deployment.clone(),
                        status: status.clone(),
                        message: message.clone(),
                    },
                ));
            }
        }
    }

    let touched: BTreeSet<&String> = appends.iter().map(|(id, _)| id).collect();
    for summary in &mut index.revisions {
        if touched.contains(&summary.id) {
            summary.last_change.clone_from(&at_text);
            if summary.version.is_none() {
                summary.version = now.version_of(&summary.digest);
            }
        }
    }
    state.last = Some(now.clone());
    appends
}

/// The pipeline was deleted: every open span closes, the newest revision notes it.
pub fn deleted(
    index: &mut PipelineIndex,
    state: &mut RecorderState,
    at: &jiff::Timestamp,
) -> Appends {
    let at_text = at.to_string();
    let mut appends = Vec::new();
    for (digest, role) in open_spans(index) {
        if let Some(id) = index
            .revisions
            .iter()
            .find(|r| r.digest == digest)
            .map(|r| r.id.clone())
        {
            close_span(index, &id, &role, &at_text);
            appends.push((
                id,
                Happening::Serving {
                    role,
                    serving: false,
                },
            ));
        }
    }
    if let Some(newest) = index
        .revisions
        .iter()
        .max_by_key(|r| r.seq)
        .map(|r| r.id.clone())
    {
        appends.push((newest, Happening::Deleted));
    }
    index.deleted_at = Some(at_text);
    state.last = None;
    appends
}

fn open_spans(index: &PipelineIndex) -> BTreeMap<String, String> {
    index
        .revisions
        .iter()
        .flat_map(|r| {
            r.served
                .iter()
                .filter(|s| s.until.is_none())
                .map(|s| (r.digest.clone(), s.role.clone()))
        })
        .collect()
}

fn close_span(index: &mut PipelineIndex, id: &str, role: &str, at: &str) {
    if let Some(summary) = index.revisions.iter_mut().find(|r| r.id == id) {
        for span in summary
            .served
            .iter_mut()
            .filter(|s| s.role == role && s.until.is_none())
        {
            span.until = Some(at.to_owned());
        }
    }
}

/// Appends `what` to `record`, keeping the timeline bounded: past [`MAX_TIMELINE_ENTRIES`] gate
/// readings are counted instead, past twice that everything is.
pub fn append(record: &mut RevisionRecord, at: &str, what: Happening) {
    let len = record.timeline.len();
    let is_reading = matches!(what, Happening::Readings { .. });
    if (is_reading && len >= MAX_TIMELINE_ENTRIES) || len >= 2 * MAX_TIMELINE_ENTRIES {
        record.readings_dropped += 1;
        return;
    }
    record.timeline.push(TimelineEntry {
        at: at.to_owned(),
        what,
    });
}

/// The index and the records of one pipeline, as the writer holds them.
#[derive(Default)]
struct PipelineHistory {
    index: PipelineIndex,
    state: RecorderState,
    records: HashMap<String, RevisionRecord>,
    dirty_records: BTreeSet<String>,
    dirty_index: bool,
    retention: Retention,
    /// Revisions that started serving and wait for their Serve config and clusters.
    needs_rayservice: BTreeSet<String>,
}

/// The index object carries the recorder's state next to the index.
#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredIndex {
    #[serde(flatten)]
    index: PipelineIndex,
    #[serde(default)]
    recorder: RecorderState,
}

#[derive(Debug, thiserror::Error)]
pub enum RecorderError {
    #[error(transparent)]
    Store(#[from] super::revisions::RevisionsError),
}

/// Runs the recorder until `shutdown`: watches ServePipelines in `namespaces` (all when empty)
/// and writes their history. Never returns an error: what fails is logged and retried.
pub async fn run(
    client: kube::Client,
    config: RecorderConfig,
    namespaces: Vec<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let mut streams = Vec::new();
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.into_iter().map(Some).collect()
    };
    for scope in scopes {
        let api: Api<ServePipeline> = match &scope {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        streams.push(
            kube::runtime::WatchStreamExt::default_backoff(watcher(
                api,
                watcher::Config::default(),
            ))
            .boxed(),
        );
    }
    let mut events = futures::stream::select_all(streams);
    let mut recorder = Recorder {
        client,
        config,
        pipelines: HashMap::new(),
    };
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let shutdown = shutdown.fuse();
    futures::pin_mut!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            event = events.next() => match event {
                Some(Ok(event)) => {
                    // A bug in here must not stop the operator: the event is logged and dropped.
                    let handled = std::panic::AssertUnwindSafe(recorder.handle(event)).catch_unwind().await;
                    if handled.is_err() {
                        tracing::error!("the history recorder failed on an event; it goes on");
                    }
                }
                Some(Err(error)) => tracing::warn!(%error, "watching ServePipelines for history"),
                None => break,
            },
            _ = tick.tick() => {
                let flushed = std::panic::AssertUnwindSafe(recorder.flush()).catch_unwind().await;
                if flushed.is_err() {
                    tracing::error!("the history recorder failed writing; it goes on");
                }
            }
        }
    }
    // What changed last is written before the operator stops.
    let _ = tokio::time::timeout(Duration::from_secs(5), recorder.flush()).await;
}

struct Recorder {
    client: kube::Client,
    config: RecorderConfig,
    pipelines: HashMap<(String, String), PipelineHistory>,
}

impl Recorder {
    async fn handle(&mut self, event: watcher::Event<ServePipeline>) {
        match event {
            watcher::Event::Apply(pipeline) | watcher::Event::InitApply(pipeline) => {
                self.sighted(&pipeline).await;
            }
            watcher::Event::Delete(pipeline) => self.gone(&pipeline).await,
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// The history of `namespace/name`, read from the store the first time.
    async fn history(&mut self, namespace: &str, name: &str) -> Option<&mut PipelineHistory> {
        let key = (namespace.to_owned(), name.to_owned());
        if !self.pipelines.contains_key(&key) {
            let stored = match self.config.store.get_stored_index(namespace, name).await {
                Ok(stored) => stored,
                Err(error) => {
                    // Nothing is recorded on top of a history that could not be read; the next
                    // sighting tries again.
                    tracing::warn!(%error, namespace, name, "reading a pipeline's history");
                    return None;
                }
            };
            let (index, state) = match stored {
                Some(stored) => (stored.index, stored.recorder),
                None => (
                    PipelineIndex {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                        next_seq: 1,
                        ..PipelineIndex::default()
                    },
                    RecorderState::default(),
                ),
            };
            self.pipelines.insert(
                key.clone(),
                PipelineHistory {
                    index,
                    state,
                    retention: self.config.default_retention,
                    ..PipelineHistory::default()
                },
            );
        }
        self.pipelines.get_mut(&key)
    }

    async fn sighted(&mut self, pipeline: &ServePipeline) {
        let (Some(namespace), Some(name)) = (
            pipeline.metadata.namespace.as_deref(),
            pipeline.metadata.name.as_deref(),
        ) else {
            return;
        };
        let sighting = Sighting::of(pipeline);
        let retention = retention_of(pipeline, self.config.default_retention);
        let Some(history) = self.history(namespace, name).await else {
            return;
        };
        history.retention = retention;
        if history.state.last.as_ref() == Some(&sighting) {
            return;
        }
        let now = now_to_the_millisecond();
        let appends = changes(&mut history.index, &mut history.state, &sighting, &now);
        history.dirty_index = true;
        for (id, what) in &appends {
            if matches!(what, Happening::Serving { serving: true, .. }) {
                history.needs_rayservice.insert(id.clone());
            }
        }
        let rayservice = sighting.ray_service.clone();
        self.append_all(namespace, name, appends, &now, &sighting)
            .await;
        self.fill_from_rayservice(namespace, name, rayservice.as_deref())
            .await;
    }

    async fn gone(&mut self, pipeline: &ServePipeline) {
        let (Some(namespace), Some(name)) = (
            pipeline.metadata.namespace.as_deref(),
            pipeline.metadata.name.as_deref(),
        ) else {
            return;
        };
        let Some(history) = self.history(namespace, name).await else {
            return;
        };
        let now = now_to_the_millisecond();
        let appends = deleted(&mut history.index, &mut history.state, &now);
        history.dirty_index = true;
        self.append_all(namespace, name, appends, &now, &Sighting::default())
            .await;
    }

    async fn append_all(
        &mut self,
        namespace: &str,
        name: &str,
        appends: Appends,
        at: &jiff::Timestamp,
        sighting: &Sighting,
    ) {
        let store = self.config.store.clone();
        let key = (namespace.to_owned(), name.to_owned());
        let Some(history) = self.pipelines.get_mut(&key) else {
            return;
        };
        let at_text = at.to_string();
        for (id, what) in appends {
            if !history.records.contains_key(&id) {
                let loaded = match store.revision(namespace, name, &id).await {
                    Ok(found) => found,
                    Err(error) => {
                        tracing::warn!(%error, namespace, name, revision = %id, "reading a revision record");
                        None
                    }
                };
                let record = loaded.unwrap_or_else(|| {
                    let summary = history.index.revisions.iter().find(|r| r.id == id);
                    RevisionRecord {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                        uid: history.index.uid.clone(),
                        id: id.clone(),
                        seq: summary.map(|s| s.seq).unwrap_or_default(),
                        digest: summary.map(|s| s.digest.clone()).unwrap_or_default(),
                        version: summary.and_then(|s| s.version.clone()),
                        generation: sighting.generation,
                        first_seen: at_text.clone(),
                        ..RevisionRecord::default()
                    }
                });
                history.records.insert(id.clone(), record);
            }
            if let Some(record) = history.records.get_mut(&id) {
                if record.version.is_none() {
                    record.version = sighting.version_of(&record.digest);
                }
                append(record, &at_text, what);
                history.dirty_records.insert(id);
            }
        }
    }

    /// A revision that started serving gets the RayService's Serve config (the first time) and
    /// the Ray clusters serving now.
    async fn fill_from_rayservice(
        &mut self,
        namespace: &str,
        name: &str,
        rayservice: Option<&str>,
    ) {
        let key = (namespace.to_owned(), name.to_owned());
        let Some(rayservice_name) = rayservice else {
            return;
        };
        let waiting = self
            .pipelines
            .get(&key)
            .is_some_and(|h| !h.needs_rayservice.is_empty());
        if !waiting {
            return;
        }
        let api: Api<RayService> = Api::namespaced(self.client.clone(), namespace);
        let found = match api.get_opt(rayservice_name).await {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(%error, namespace, rayservice = rayservice_name, "reading a RayService for history");
                return;
            }
        };
        let Some(history) = self.pipelines.get_mut(&key) else {
            return;
        };
        let Some(found) = found else {
            history.needs_rayservice.clear();
            return;
        };
        let serve_config = found
            .spec
            .serve_config_v2
            .as_deref()
            .and_then(|text| serde_yaml::from_str::<serde_json::Value>(text).ok());
        let clusters: Vec<String> = found
            .status
            .iter()
            .flat_map(|s| {
                [
                    s.active_service_status.as_ref(),
                    s.pending_service_status.as_ref(),
                ]
            })
            .flatten()
            .filter_map(|s| s.ray_cluster_name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        for id in std::mem::take(&mut history.needs_rayservice) {
            if let Some(record) = history.records.get_mut(&id) {
                if record.serve_config.is_none() {
                    record.serve_config.clone_from(&serve_config);
                }
                record.ray_service = Some(rayservice_name.to_owned());
                for cluster in &clusters {
                    if !record.ray_clusters.contains(cluster) {
                        record.ray_clusters.push(cluster.clone());
                    }
                }
                history.dirty_records.insert(id);
            }
        }
    }

    /// Writes what changed: records first, then retention, then the index naming them.
    async fn flush(&mut self) {
        let store = self.config.store.clone();
        let now = jiff::Timestamp::now();
        for ((namespace, name), history) in &mut self.pipelines {
            if !history.dirty_index && history.dirty_records.is_empty() {
                continue;
            }
            let mut failed = false;
            for id in history.dirty_records.clone() {
                let Some(record) = history.records.get(&id) else {
                    history.dirty_records.remove(&id);
                    continue;
                };
                match store.put_revision(record).await {
                    Ok(()) => {
                        history.dirty_records.remove(&id);
                    }
                    Err(error) => {
                        tracing::warn!(%error, namespace, name, revision = %id, "writing a revision record; retried");
                        failed = true;
                    }
                }
            }
            if failed {
                continue;
            }
            for id in expired(&history.index, history.retention, &now) {
                match store.delete_revision(namespace, name, &id).await {
                    Ok(()) => {
                        history.index.revisions.retain(|r| r.id != id);
                        history.index.removed += 1;
                        history.records.remove(&id);
                        history.state.readings_at.remove(&id);
                    }
                    Err(error) => {
                        tracing::warn!(%error, namespace, name, revision = %id, "removing an expired revision; retried");
                    }
                }
            }
            let stored = StoredIndex {
                index: history.index.clone(),
                recorder: history.state.clone(),
            };
            match store
                .put_stored_index(&stored.index, &stored.recorder)
                .await
            {
                Ok(()) => history.dirty_index = false,
                Err(error) => {
                    tracing::warn!(%error, namespace, name, "writing a pipeline's history index; retried");
                }
            }
            // Records of revisions that no longer change need not stay in memory.
            let open: BTreeSet<String> = history
                .index
                .revisions
                .iter()
                .filter(|r| r.served.iter().any(|s| s.until.is_none()))
                .map(|r| r.id.clone())
                .chain(
                    history
                        .index
                        .revisions
                        .iter()
                        .max_by_key(|r| r.seq)
                        .map(|r| r.id.clone()),
                )
                .collect();
            let dirty = history.dirty_records.clone();
            history
                .records
                .retain(|id, _| open.contains(id) || dirty.contains(id));
        }
    }
}

/// Now, to the millisecond: a person reads these times, and a status is not written more often.
fn now_to_the_millisecond() -> jiff::Timestamp {
    let now = jiff::Timestamp::now();
    now.round(jiff::Unit::Millisecond).unwrap_or(now)
}

/// `spec.history` of `pipeline`, else the operator's default.
pub fn retention_of(pipeline: &ServePipeline, default: Retention) -> Retention {
    let Some(policy) = pipeline.spec.history.as_ref() else {
        return default;
    };
    Retention {
        keep_revisions: policy
            .keep_revisions
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0)
            .unwrap_or(default.keep_revisions),
        keep_days: policy
            .keep_days
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0)
            .or(default.keep_days),
    }
}

impl RevisionStore {
    /// The index with the recorder's state next to it.
    async fn get_stored_index(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<StoredIndex>, super::revisions::RevisionsError> {
        self.get_json(&super::revisions::index_key(namespace, name))
            .await
    }

    async fn put_stored_index(
        &self,
        index: &PipelineIndex,
        recorder: &RecorderState,
    ) -> Result<(), super::revisions::RevisionsError> {
        #[derive(Serialize)]
        struct Borrowed<'a> {
            #[serde(flatten)]
            index: &'a PipelineIndex,
            recorder: &'a RecorderState,
        }
        self.put_json(
            &super::revisions::index_key(&index.namespace, &index.name),
            &Borrowed { index, recorder },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::servepipeline::GateReadings;

    fn t(second: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_796_000_000 + second).unwrap()
    }

    fn stable_only(digest: &str, version: &str) -> Sighting {
        Sighting {
            uid: "uid-1".into(),
            phase: Some("Ready".into()),
            source: Some((digest.into(), Some(version.into()))),
            stable: Some((digest.into(), Some(version.into()), "demo-v1".into())),
            rolls_out: true,
            conditions: [(
                "Ready".to_owned(),
                ("True".to_owned(), "Serving".to_owned(), String::new()),
            )]
            .into(),
            applications: [(
                "demo-v1".to_owned(),
                AppSighting {
                    status: "RUNNING".into(),
                    message: String::new(),
                    deployments: [("model_a".to_owned(), ("HEALTHY".to_owned(), String::new()))]
                        .into(),
                },
            )]
            .into(),
            ..Sighting::default()
        }
    }

    fn with_canary(mut s: Sighting, step: i32, weight: i32, requests: i64) -> Sighting {
        s.phase = Some("Deploying".into());
        s.canary = Some(CanarySighting {
            digest: "sha256:bbbb".into(),
            version: Some("2".into()),
            application: "demo-v2".into(),
            step,
            steps: 2,
            weight,
            readings: (requests > 0).then(|| GateReadings {
                canary_requests: requests,
                canary_errors: requests / 2,
                ..GateReadings::default()
            }),
        });
        s.applications.insert(
            "demo-v2".into(),
            AppSighting {
                status: if step == 0 { "DEPLOYING" } else { "RUNNING" }.into(),
                ..AppSighting::default()
            },
        );
        s
    }

    fn kinds(appends: &Appends) -> Vec<(String, String)> {
        appends
            .iter()
            .map(|(id, what)| {
                let json = serde_json::to_value(what).unwrap();
                (
                    id[..6].to_owned(),
                    json["kind"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn a_canary_rolled_back_by_its_gates_leaves_its_whole_story() {
        let mut index = PipelineIndex::default();
        let mut state = RecorderState::default();
        let v1 = stable_only("sha256:aaaa", "1");

        let first = changes(&mut index, &mut state, &v1, &t(0));
        assert_eq!(index.revisions.len(), 1);
        assert_eq!(index.revisions[0].id, "000001-aaaa");
        assert_eq!(index.revisions[0].version.as_deref(), Some("1"));
        assert!(kinds(&first).contains(&("000001".into(), "seen".into())));
        assert!(kinds(&first).contains(&("000001".into(), "serving".into())));
        assert!(kinds(&first).contains(&("000001".into(), "deployment".into())));

        // The same sighting again adds nothing.
        assert!(changes(&mut index, &mut state, &v1, &t(1)).is_empty());

        // v2 starts as a canary: a new revision, its step, its application deploying.
        let starting = changes(
            &mut index,
            &mut state,
            &with_canary(v1.clone(), 0, 0, 0),
            &t(10),
        );
        assert_eq!(index.revisions.len(), 2);
        let k = kinds(&starting);
        assert!(k.contains(&("000002".into(), "seen".into())), "{k:?}");
        assert!(k.contains(&("000002".into(), "step".into())), "{k:?}");
        assert!(
            k.contains(&("000002".into(), "application".into())),
            "{k:?}"
        );
        assert!(k.contains(&("000002".into(), "phase".into())), "{k:?}");
        assert!(
            !k.iter().any(|(id, _)| id == "000001"),
            "v1 is untouched: {k:?}"
        );

        // Step 1 takes traffic: it serves as a canary; readings come at most every 10 s.
        let step1 = changes(
            &mut index,
            &mut state,
            &with_canary(v1.clone(), 1, 10, 4),
            &t(20),
        );
        assert!(kinds(&step1).contains(&("000002".into(), "serving".into())));
        assert!(kinds(&step1).contains(&("000002".into(), "readings".into())));
        let soon = changes(
            &mut index,
            &mut state,
            &with_canary(v1.clone(), 1, 10, 6),
            &t(25),
        );
        assert!(soon.is_empty(), "{:?}", kinds(&soon));
        let later = changes(
            &mut index,
            &mut state,
            &with_canary(v1.clone(), 1, 10, 8),
            &t(31),
        );
        assert_eq!(
            kinds(&later),
            vec![("000002".to_owned(), "readings".to_owned())]
        );

        // Rolled back: the decision with its readings, the canary span closes, v1 serves on.
        let mut rolled_back = v1.clone();
        rolled_back.last = Some(LastOutcome {
            digest: "sha256:bbbb".into(),
            version: Some("2".into()),
            result: "RolledBack".into(),
            reason: "ErrorRate".into(),
            node: Some("model_a".into()),
            message: "error rate 50% over 10%".into(),
            at: t(40).to_string(),
            readings: Some(GateReadings {
                canary_requests: 8,
                canary_errors: 4,
                ..GateReadings::default()
            }),
        });
        rolled_back.conditions.insert(
            "RolledBack".into(),
            ("True".into(), "ErrorRate".into(), "…".into()),
        );
        let end = changes(&mut index, &mut state, &rolled_back, &t(40));
        let k = kinds(&end);
        assert!(k.contains(&("000002".into(), "decision".into())), "{k:?}");
        assert!(
            k.contains(&("000002".into(), "condition".into())),
            "RolledBack is about v2: {k:?}"
        );
        assert!(k.contains(&("000002".into(), "serving".into())), "{k:?}");
        let v2 = &index.revisions[1];
        assert_eq!(
            v2.outcome.as_ref().map(|o| o.reason.as_str()),
            Some("ErrorRate")
        );
        assert_eq!(v2.served.len(), 1);
        assert_eq!(v2.served[0].role, "canary");
        assert_eq!(
            v2.served[0].until.as_deref(),
            Some(t(40).to_string().as_str())
        );
        let v1_spans = &index.revisions[0].served;
        assert_eq!(v1_spans.len(), 1);
        assert!(
            v1_spans[0].until.is_none(),
            "the stable version never stopped serving"
        );

        // What served at the canary's step 1: both; after the decision: v1 only.
        let at = |s: i64| {
            super::super::revisions::serving_at(&index, &t(s))
                .iter()
                .map(|(r, span)| (r.seq, span.role.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(at(30), vec![(2, "canary".into()), (1, "stable".into())]);
        assert_eq!(at(45), vec![(1, "stable".into())]);

        // Deleted: the open span closes; the newest revision says so.
        let gone = deleted(&mut index, &mut state, &t(50));
        assert_eq!(
            kinds(&gone),
            vec![
                ("000001".to_owned(), "serving".to_owned()),
                ("000002".to_owned(), "deleted".to_owned())
            ]
        );
        assert!(index.deleted_at.is_some());
    }

    #[test]
    fn an_immediate_pipeline_serves_its_applied_graph_once_ready() {
        let mut index = PipelineIndex::default();
        let mut state = RecorderState::default();
        let mut v1 = stable_only("sha256:aaaa", "1");
        v1.rolls_out = false;
        v1.stable = None;
        changes(&mut index, &mut state, &v1, &t(0));
        // v2 applied: while deploying, v1 still serves.
        let mut v2 = v1.clone();
        v2.source = Some(("sha256:bbbb".into(), Some("2".into())));
        v2.phase = Some("Deploying".into());
        changes(&mut index, &mut state, &v2, &t(10));
        assert!(index.revisions[0].served[0].until.is_none());
        assert!(index.revisions[1].served.is_empty());
        v2.phase = Some("Ready".into());
        changes(&mut index, &mut state, &v2, &t(20));
        assert_eq!(
            index.revisions[0].served[0].until.as_deref(),
            Some(t(20).to_string().as_str())
        );
        assert_eq!(index.revisions[1].served[0].from, t(20).to_string());
    }

    #[test]
    fn a_full_timeline_counts_readings_instead_of_keeping_them() {
        let mut record = RevisionRecord::default();
        let reading = || Happening::Readings {
            step: 1,
            readings: GateReadings::default(),
        };
        for _ in 0..MAX_TIMELINE_ENTRIES {
            append(&mut record, "t", reading());
        }
        append(&mut record, "t", reading());
        assert_eq!(
            (record.timeline.len(), record.readings_dropped),
            (MAX_TIMELINE_ENTRIES, 1)
        );
        append(
            &mut record,
            "t",
            Happening::Phase {
                phase: "Ready".into(),
            },
        );
        assert_eq!(record.timeline.len(), MAX_TIMELINE_ENTRIES + 1);
    }

    #[test]
    fn retention_comes_from_the_spec_else_the_operator() {
        let default = Retention {
            keep_revisions: 100,
            keep_days: Some(30),
        };
        let mut pipeline = ServePipeline::new("p", Default::default());
        assert_eq!(retention_of(&pipeline, default), default);
        pipeline.spec.history = Some(crate::api::servepipeline::HistoryPolicy {
            keep_revisions: Some(5),
            keep_days: None,
        });
        assert_eq!(
            retention_of(&pipeline, default),
            Retention {
                keep_revisions: 5,
                keep_days: Some(30)
            }
        );
    }
}
