//! Leader election against the real API server: only the leader reconciles; a leader that
//! stops cleanly hands over within one retry period, a crashed one after the lease expires;
//! never two leaders at once. Once in-process (fine-grained observation), once with two
//! `raypipe run` processes and SIGTERM.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use raypipe::admin::Metrics;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::config::ControllerKind;
use raypipe::config::ControllerSettings;
use raypipe::leader::{LeaderElector, LeaseSettings};

use crate::admin::{WAIT, get, pipeline, sample};
use crate::support::{self, eventually};

const LEASE_DURATION: Duration = Duration::from_secs(6);
const RENEW_DEADLINE: Duration = Duration::from_secs(4);
const RETRY_PERIOD: Duration = Duration::from_millis(500);
const LEASE: &str = "raypipe-leader";

const RECONCILES: &str = "raypipe_reconcile_total{controller=\"servepipeline\"}";

fn reconciles(metrics: &Metrics) -> f64 {
    sample(&metrics.encode().expect("metrics encode"), RECONCILES).unwrap_or(0.0)
}

/// One operator replica in this process: a leader elector that runs a ServePipeline
/// controller for `ns`.
struct Replica {
    identity: String,
    metrics: Metrics,
    leading: tokio::sync::watch::Receiver<bool>,
    /// Cleared when the replica is stopped or crashed; the overlap monitor ignores it then.
    alive: Arc<AtomicBool>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), raypipe::leader::LeaderError>>,
}

impl Replica {
    fn start(client: &kube::Client, ns: &str, identity: &str) -> Replica {
        let metrics = Metrics::new();
        let elector = LeaderElector::new(
            client.clone(),
            LeaseSettings {
                namespace: ns.to_owned(),
                name: LEASE.to_owned(),
                identity: identity.to_owned(),
                lease_duration: LEASE_DURATION,
                renew_deadline: RENEW_DEADLINE,
                retry_period: RETRY_PERIOD,
            },
        )
        .expect("valid lease settings")
        .with_metrics(metrics.clone());
        let leading = elector.subscribe();
        let settings = ControllerSettings {
            namespaces: vec![ns.to_owned()],
            metrics: metrics.clone(),
            ..ControllerSettings::new(&[ControllerKind::Servepipeline])
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let controller_client = client.clone();
        let task = tokio::spawn(elector.run(
            async move {
                let _ = rx.await;
            },
            move |stop| async move {
                let plan = settings.plan()?;
                raypipe::controllers::run(controller_client, plan, stop.stopped()).await
            },
        ));
        Replica {
            identity: identity.to_owned(),
            metrics,
            leading,
            alive: Arc::new(AtomicBool::new(true)),
            shutdown: Some(tx),
            task,
        }
    }

    fn is_leading(&self) -> bool {
        self.alive.load(Ordering::SeqCst) && *self.leading.borrow()
    }
}

/// What the overlap monitor watches of one replica: identity, leadership, liveness.
type Watched = (String, tokio::sync::watch::Receiver<bool>, Arc<AtomicBool>);

/// Samples every replica's leadership every 10 ms and records any moment with two leaders.
fn watch_for_overlap(
    replicas: Arc<Mutex<Vec<Watched>>>,
) -> (Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let overlaps = Arc::new(Mutex::new(Vec::new()));
    let found = overlaps.clone();
    let task = tokio::spawn(async move {
        loop {
            let leaders: Vec<String> = replicas
                .lock()
                .expect("replica list")
                .iter()
                .filter(|(_, leading, alive)| alive.load(Ordering::SeqCst) && *leading.borrow())
                .map(|(id, _, _)| id.clone())
                .collect();
            if leaders.len() > 1 {
                found.lock().expect("overlaps").push(leaders.join(" and "));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    (overlaps, task)
}

async fn lease_holder(client: &kube::Client, ns: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn only_the_leader_reconciles_and_leadership_moves_on_stop_and_on_crash() {
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let ns = support::namespace(&client, "leader").await;
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);

    let mut a = Replica::start(&client, &ns, "replica-a");
    let mut b = Replica::start(&client, &ns, "replica-b");
    let monitored = Arc::new(Mutex::new(vec![
        (a.identity.clone(), a.leading.clone(), a.alive.clone()),
        (b.identity.clone(), b.leading.clone(), b.alive.clone()),
    ]));
    let (overlaps, monitor) = watch_for_overlap(monitored.clone());

    eventually(WAIT, "one replica to lead", || async {
        (a.is_leading() || b.is_leading()).then_some(())
    })
    .await;
    let (leader, follower) = if a.is_leading() {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    assert_eq!(
        lease_holder(&client, &ns).await.as_deref(),
        Some(leader.identity.as_str())
    );

    pipelines
        .create(&PostParams::default(), &pipeline("first", None))
        .await
        .expect("create a pipeline");
    eventually(WAIT, "the leader to reconcile it", || async {
        (reconciles(&leader.metrics) >= 1.0).then_some(())
    })
    .await;
    eventually(WAIT, "the pipeline to get a status", || async {
        pipelines.get("first").await.ok()?.status
    })
    .await;
    assert_eq!(
        reconciles(&follower.metrics),
        0.0,
        "the follower must not reconcile"
    );
    assert!(!follower.is_leading());

    // Clean stop: the leader releases the lease and the follower takes over at its next retry,
    // well before the lease would have expired.
    let stopped_at = Instant::now();
    let _ = leader.shutdown.take().expect("running").send(());
    let result = tokio::time::timeout(WAIT, &mut leader.task)
        .await
        .expect("the leader stops")
        .expect("the leader task ran");
    assert!(result.is_ok(), "{result:?}");
    leader.alive.store(false, Ordering::SeqCst);
    eventually(WAIT, "the follower to lead", || async {
        follower.is_leading().then_some(())
    })
    .await;
    let handover = stopped_at.elapsed();
    assert!(
        handover < LEASE_DURATION,
        "hand-over after a clean stop took {handover:?}, not less than the lease duration"
    );
    assert_eq!(
        lease_holder(&client, &ns).await.as_deref(),
        Some(follower.identity.as_str())
    );
    let old_leader_count = reconciles(&leader.metrics);

    // The new leader reconciles what changes now.
    let mut changed = pipeline("first", None);
    changed.spec.source.url = "http://registry.invalid/changed.pb".into();
    pipelines
        .patch(
            "first",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&changed),
        )
        .await
        .expect("change the pipeline");
    eventually(WAIT, "the new leader to reconcile", || async {
        (reconciles(&follower.metrics) >= 1.0).then_some(())
    })
    .await;
    assert_eq!(reconciles(&leader.metrics), old_leader_count);

    // Crash: the task is aborted, nothing is released. A newcomer must wait for the lease to
    // expire (measured from when it first sees the lease).
    follower.alive.store(false, Ordering::SeqCst);
    follower.task.abort();
    let crashed_at = Instant::now();
    let c = Replica::start(&client, &ns, "replica-c");
    monitored.lock().expect("replica list").push((
        c.identity.clone(),
        c.leading.clone(),
        c.alive.clone(),
    ));
    eventually(WAIT, "the newcomer to lead", || async {
        c.is_leading().then_some(())
    })
    .await;
    let takeover = crashed_at.elapsed();
    assert!(
        takeover >= LEASE_DURATION - RETRY_PERIOD,
        "the newcomer took the lease after {takeover:?}, before it could have expired"
    );
    assert!(
        takeover < LEASE_DURATION * 3,
        "takeover after a crash took {takeover:?}"
    );
    pipelines
        .create(&PostParams::default(), &pipeline("second", None))
        .await
        .expect("create another pipeline");
    eventually(WAIT, "the newcomer to reconcile", || async {
        (reconciles(&c.metrics) >= 1.0).then_some(())
    })
    .await;

    monitor.abort();
    let overlaps = overlaps.lock().expect("overlaps").clone();
    assert!(overlaps.is_empty(), "two leaders at once: {overlaps:?}");
    c.alive.store(false, Ordering::SeqCst);
    c.task.abort();
}

fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
}

/// A `raypipe run` child process, killed (by its pid) if the test ends early.
struct Operator {
    child: std::process::Child,
    admin: SocketAddr,
    log: std::path::PathBuf,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Operator {
    fn start(ns: &str, name: &str) -> Operator {
        let plane = support::control_plane();
        let admin = free_address();
        let log = plane.dir.join(format!("{ns}-{name}.log"));
        let stderr = std::fs::File::create(&log).expect("a log file");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_raypipe"))
            .args([
                "run",
                "--controllers=servepipeline",
                &format!("--namespaces={ns}"),
                &format!("--operator-namespace={ns}"),
                &format!("--leader-election-identity={name}"),
                "--lease-duration=6s",
                "--renew-deadline=4s",
                "--retry-period=500ms",
                &format!("--admin-address={admin}"),
                "--log-format=json",
            ])
            .env("KUBECONFIG", &plane.kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start raypipe run");
        Operator { child, admin, log }
    }

    async fn metrics(&self) -> Option<String> {
        get(self.admin, "/metrics").await.map(|(_, body)| body)
    }

    async fn is_leading(&self) -> bool {
        self.metrics()
            .await
            .and_then(|m| sample(&m, "raypipe_leader"))
            == Some(1.0)
    }

    async fn reconciles(&self) -> f64 {
        self.metrics()
            .await
            .and_then(|m| sample(&m, RECONCILES))
            .unwrap_or(0.0)
    }

    fn terminate(&self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: signals the child this test started, by its own pid.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "SIGTERM to {pid}");
    }
}

#[tokio::test]
async fn two_operator_processes_hand_over_on_sigterm() {
    raypipe::startup::init_crypto();
    let client = support::client().await;
    let ns = support::namespace(&client, "leader-proc").await;
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);

    let first = Operator::start(&ns, "first");
    let second = Operator::start(&ns, "second");
    for op in [&first, &second] {
        eventually(WAIT, "each replica to be ready", || async {
            get(op.admin, "/readyz").await.filter(|(s, _)| *s == 200)
        })
        .await;
    }
    let leader_is_first = eventually(WAIT, "one process to lead", || async {
        match (first.is_leading().await, second.is_leading().await) {
            (true, false) => Some(true),
            (false, true) => Some(false),
            _ => None,
        }
    })
    .await;
    let (mut leader, follower, follower_name) = if leader_is_first {
        (first, second, "second")
    } else {
        (second, first, "first")
    };

    pipelines
        .create(&PostParams::default(), &pipeline("proc", None))
        .await
        .expect("create a pipeline");
    eventually(WAIT, "the leading process to reconcile", || async {
        (leader.reconciles().await >= 1.0).then_some(())
    })
    .await;
    assert_eq!(follower.reconciles().await, 0.0, "the follower reconciled");

    let stopped_at = Instant::now();
    leader.terminate();
    let status = eventually(WAIT, "the leader to exit", || {
        let exited = leader.child.try_wait().expect("wait for the child");
        async move { exited }
    })
    .await;
    assert!(
        status.success(),
        "SIGTERM must end in a clean exit: {status}"
    );
    eventually(WAIT, "the other process to lead", || async {
        follower.is_leading().await.then_some(())
    })
    .await;
    assert!(
        stopped_at.elapsed() < LEASE_DURATION,
        "hand-over took {:?}",
        stopped_at.elapsed()
    );
    let holder = lease_holder(&client, &ns).await.unwrap_or_default();
    assert!(holder.starts_with(&format!("{follower_name}-")), "{holder}");

    let mut changed = pipeline("proc", None);
    changed.spec.source.url = "http://registry.invalid/changed.pb".into();
    pipelines
        .patch(
            "proc",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&changed),
        )
        .await
        .expect("change the pipeline");
    eventually(WAIT, "the new leader to reconcile", || async {
        (follower.reconciles().await >= 1.0).then_some(())
    })
    .await;

    // Logs are JSON lines, and the reconcile span carries the object's identity.
    let log = std::fs::read_to_string(&leader.log).expect("the leader's log");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("released the leader lease"))),
        "the leader logged its release: {log}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["span"]["kind"] == "ServePipeline" && l["span"]["namespace"] == ns.as_str()),
        "a reconcile span with the namespace: {log}"
    );
}
