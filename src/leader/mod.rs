//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several replicas only one
//! runs the controllers.
//!
//! The protocol is client-go's: a candidate takes the Lease when it is free (no holder — a
//! leader that stopped cleanly clears it, so hand-over takes one retry period) or when its
//! record has not changed for `leaseDurationSeconds` as measured by the candidate's own clock
//! (so clocks need not agree). Every write carries the `resourceVersion` it read, so of two
//! candidates racing for the Lease exactly one wins. The leader renews every retry period and
//! gives up — stopping its controllers at once — when it has not renewed for `renew_deadline`,
//! which is shorter than the lease duration: it stops before anyone else may start.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::admin::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("invalid leader election settings: {0}")]
    InvalidSettings(String),
    #[error(
        "lost the leader lease {namespace}/{name}: not renewed for {renew_deadline:?}; the controllers were stopped"
    )]
    Lost {
        namespace: String,
        name: String,
        renew_deadline: Duration,
    },
    #[error("the controllers failed while leading: {0:#}")]
    Controllers(#[source] anyhow::Error),
}

/// Where the Lease lives, who we are, and the timing (client-go's defaults are 15 s / 10 s / 2 s).
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// Unique per replica (the Pod name, plus a random suffix).
    pub identity: String,
    /// How long others wait after the leader's last renewal before taking over.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops leading.
    pub renew_deadline: Duration,
    /// Pause between two attempts to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// The timing must leave the leader time to stop before anyone else may start.
    pub fn check(&self) -> Result<(), LeaderError> {
        let invalid = |m: &str| Err(LeaderError::InvalidSettings(m.to_owned()));
        if self.name.is_empty() || self.namespace.is_empty() || self.identity.is_empty() {
            return invalid("the lease name, namespace and identity must not be empty");
        }
        if self.lease_duration < Duration::from_secs(1) {
            return invalid("the lease duration must be at least 1s (Leases count whole seconds)");
        }
        if self.renew_deadline >= self.lease_duration {
            return invalid("the renew deadline must be shorter than the lease duration");
        }
        // Room for at least one retry (with its jitter) before the deadline.
        if self.retry_period.mul_f64(1.2) >= self.renew_deadline {
            return invalid(
                "the retry period (plus 20% jitter) must be shorter than the renew deadline",
            );
        }
        Ok(())
    }

    fn lease_duration_seconds(&self) -> i32 {
        // Rounded up: others must never wait less than we assume.
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// A random-enough suffix for identities and jitter, without a random-number crate: the
/// standard library seeds each `RandomState` from the OS.
fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish()
}

/// `<base>-<random hex>`: two replicas never share an identity, even with equal host names.
pub fn unique_identity(base: &str) -> String {
    format!("{base}-{:06x}", random_u64() & 0xff_ffff)
}

/// The last Lease record seen, and when (by our clock) it last changed.
struct Observed {
    resource_version: Option<String>,
    holder: Option<String>,
    lease_duration: Duration,
    changed_at: Instant,
}

pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
    observed: Option<Observed>,
    leading: watch::Sender<bool>,
    metrics: Option<Metrics>,
}

/// What a lease write attempt found.
enum Attempt {
    /// We hold the Lease (acquired or renewed).
    Held,
    /// Someone else holds it (or won a race).
    HeldByOther(Option<String>),
}

impl LeaderElector {
    pub fn new(
        client: kube::Client,
        settings: LeaseSettings,
    ) -> Result<LeaderElector, LeaderError> {
        settings.check()?;
        let (leading, _) = watch::channel(false);
        Ok(LeaderElector {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            observed: None,
            leading,
            metrics: None,
        })
    }

    /// Also reports leadership as the `raypipe_leader` gauge.
    pub fn with_metrics(mut self, metrics: Metrics) -> LeaderElector {
        self.metrics = Some(metrics);
        self
    }

    /// Follows whether this replica leads right now.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    pub fn identity(&self) -> &str {
        &self.settings.identity
    }

    fn set_leading(&self, leading: bool) {
        self.leading.send_replace(leading);
        if let Some(m) = &self.metrics {
            m.set_leader(leading);
        }
    }

    fn jittered_retry(&self) -> Duration {
        // Up to +20%, so replicas started together do not hit the API server in lockstep.
        let fraction = (random_u64() % 1000) as f64 / 5000.0;
        self.settings.retry_period.mul_f64(1.0 + fraction)
    }

    /// Waits to become leader, then runs `lead` until `shutdown` completes.
    ///
    /// `lead` receives a future that completes when it should stop gracefully; the Lease keeps
    /// being renewed until `lead` returns, then it is released (holder cleared), so another
    /// replica takes over within one retry period. If renewing fails for `renew_deadline`, the
    /// `lead` future is dropped at once (whatever it spawned must stop with it) and
    /// [`LeaderError::Lost`] is returned: the process should exit and start afresh.
    pub async fn run<F, Fut>(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
        lead: F,
    ) -> Result<(), LeaderError>
    where
        F: FnOnce(StopSignal) -> Fut,
        Fut: Future<Output = anyhow::Result<()>> + Send,
    {
        tokio::pin!(shutdown);
        info!(
            identity = %self.settings.identity,
            lease = %format!("{}/{}", self.settings.namespace, self.settings.name),
            "waiting to become leader"
        );
        // Candidate: try now, then every retry period.
        let mut last_renewed;
        loop {
            let sent = Instant::now();
            match tokio::time::timeout(self.settings.renew_deadline, self.try_acquire_or_renew())
                .await
            {
                Ok(Ok(Attempt::Held)) => {
                    last_renewed = sent;
                    break;
                }
                Ok(Ok(Attempt::HeldByOther(_))) => {}
                Ok(Err(e)) => warn!(error = %e, "could not read or write the leader lease"),
                Err(_) => warn!("the leader lease request timed out"),
            }
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tokio::time::sleep(self.jittered_retry()) => {}
            }
        }
        info!(identity = %self.settings.identity, "became leader; starting the controllers");
        self.set_leading(true);

        let (stop_tx, stop_rx) = watch::channel(false);
        let leading = lead(StopSignal(stop_rx));
        tokio::pin!(leading);
        let mut renew = tokio::time::interval(self.settings.retry_period);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        renew.tick().await; // the first tick is immediate; we just acquired
        let mut stopping = false;
        loop {
            tokio::select! {
                result = &mut leading => {
                    self.set_leading(false);
                    self.release().await;
                    return result.map_err(LeaderError::Controllers);
                }
                _ = &mut shutdown, if !stopping => {
                    info!("stopping the controllers before releasing the leader lease");
                    stopping = true;
                    let _ = stop_tx.send(true);
                }
                _ = renew.tick() => {
                    let sent = Instant::now();
                    let remaining = self
                        .settings
                        .renew_deadline
                        .saturating_sub(last_renewed.elapsed());
                    let outcome = tokio::time::timeout(remaining, self.try_acquire_or_renew()).await;
                    match outcome {
                        Ok(Ok(Attempt::Held)) => last_renewed = sent,
                        Ok(Ok(Attempt::HeldByOther(holder))) => {
                            warn!(holder = ?holder, "another replica holds the leader lease");
                            return Err(self.lost());
                        }
                        Ok(Err(e)) => warn!(error = %e, "renewing the leader lease failed"),
                        Err(_) => warn!("renewing the leader lease timed out"),
                    }
                    if last_renewed.elapsed() >= self.settings.renew_deadline {
                        return Err(self.lost());
                    }
                }
            }
        }
    }

    fn lost(&self) -> LeaderError {
        self.set_leading(false);
        warn!(identity = %self.settings.identity, "lost the leader lease; stopping the controllers");
        LeaderError::Lost {
            namespace: self.settings.namespace.clone(),
            name: self.settings.name.clone(),
            renew_deadline: self.settings.renew_deadline,
        }
    }

    fn observe(&mut self, lease: &Lease) {
        let resource_version = lease.metadata.resource_version.clone();
        let spec = lease.spec.clone().unwrap_or_default();
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|o| o.resource_version != resource_version);
        if changed {
            self.observed = Some(Observed {
                resource_version,
                holder: spec.holder_identity.filter(|h| !h.is_empty()),
                lease_duration: Duration::from_secs(
                    u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
                ),
                changed_at: Instant::now(),
            });
        }
    }

    fn now() -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::now())
    }

    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let me = self.settings.identity.clone();
        let Some(current) = self.api.get_opt(&self.settings.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(self.settings.lease_duration_seconds()),
                    acquire_time: Some(Self::now()),
                    renew_time: Some(Self::now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(Attempt::Held)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::HeldByOther(None)),
                Err(e) => Err(e),
            };
        };
        self.observe(&current);
        let observed = self.observed.as_ref();
        let holder = observed.and_then(|o| o.holder.clone());
        let ours = holder.as_deref() == Some(me.as_str());
        let expired = observed.is_none_or(|o| o.changed_at.elapsed() >= o.lease_duration);
        if !ours && holder.is_some() && !expired {
            return Ok(Attempt::HeldByOther(holder));
        }
        let mut spec = current.spec.clone().unwrap_or_default();
        if !ours {
            spec.acquire_time = Some(Self::now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(me);
        spec.lease_duration_seconds = Some(self.settings.lease_duration_seconds());
        spec.renew_time = Some(Self::now());
        let mut desired = current;
        desired.spec = Some(spec);
        // `replace` sends our resourceVersion: a concurrent writer makes this fail with 409.
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &desired)
            .await
        {
            Ok(written) => {
                self.observe(&written);
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::HeldByOther(holder)),
            Err(e) => Err(e),
        }
    }

    /// Clears the holder so a waiting replica takes over at its next retry. Best effort: if
    /// it fails, the others take over when the lease expires.
    async fn release(&mut self) {
        let result = async {
            let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
                return Ok(());
            };
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(Self::now());
            self.api
                .replace(&self.settings.name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        };
        match tokio::time::timeout(self.settings.renew_deadline, result).await {
            Ok(Ok(())) => info!(identity = %self.settings.identity, "released the leader lease"),
            Ok(Err(e)) => warn!(error = %e, "releasing the leader lease failed; it will expire"),
            Err(_) => warn!("releasing the leader lease timed out; it will expire"),
        }
    }
}

/// Completes when the leader should stop its controllers gracefully.
pub struct StopSignal(watch::Receiver<bool>);

impl StopSignal {
    pub async fn stopped(mut self) {
        // An error means the elector is gone: stop as well.
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(lease: u64, renew: u64, retry_ms: u64) -> LeaseSettings {
        LeaseSettings {
            namespace: "default".into(),
            name: "raypipe-leader".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_millis(retry_ms),
        }
    }

    #[test]
    fn timing_must_let_the_leader_stop_before_others_start() {
        assert!(settings(15, 10, 2000).check().is_ok());
        assert!(settings(10, 10, 2000).check().is_err());
        assert!(settings(15, 2, 2000).check().is_err());
        let mut s = settings(15, 10, 2000);
        s.identity.clear();
        assert!(s.check().is_err());
    }

    #[test]
    fn identities_differ_and_durations_round_up() {
        assert_ne!(unique_identity("pod"), unique_identity("pod"));
        let mut s = settings(15, 10, 2000);
        s.lease_duration = Duration::from_millis(4500);
        assert_eq!(s.lease_duration_seconds(), 5);
    }
}
