//! The scale benchmark: API requests and resident memory while many clusters reconcile.

use super::*;
use raypipe::devenv::control_plane::ControlPlane;

/// `apiserver_request_total` summed by `verb resource/subresource`, from the API server's
/// metrics.
async fn api_requests(client: &kube::Client) -> BTreeMap<String, f64> {
    let text = client
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("a static request"),
        )
        .await
        .expect("API server metrics");
    let mut totals = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label_value = |key: &str| {
            labels
                .split(&format!("{key}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let key = format!(
            "{} {}/{}",
            label_value("verb"),
            label_value("resource"),
            label_value("subresource")
        );
        *totals.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    totals
}

/// How many objects of `api` pass `counted`, read in pages of 500: the test process is what is
/// measured, so its own reads must not hold ten thousand clusters (or forty thousand Pods) at
/// once.
async fn count_paged<K>(api: &Api<K>, counted: impl Fn(&K) -> bool) -> usize
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut count = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.expect("list");
        count += page.items.iter().filter(|object| counted(object)).count();
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return count,
        }
    }
}

/// Ready clusters.
async fn count_ready(api: &Api<RayCluster>) -> usize {
    count_paged(api, |c| {
        c.status.as_ref().and_then(|s| s.state) == Some(ClusterState::Ready)
    })
    .await
}

/// More kwok Nodes for large runs: every worker Pod's `wait-gcs-ready` init container asks for
/// 256 MiB (as KubeRay's does), so one fake Node (1 TiB) holds about 1,300 clusters.
async fn add_fake_nodes(client: &kube::Client, clusters: usize) {
    for i in 1..clusters.div_ceil(1000) {
        raypipe::devenv::control_plane::create_kwok_node(client, &format!("kwok-node-{i}"))
            .await
            .expect("create a fake Node");
    }
}

/// CPU seconds (user + system) used so far by this test process (`raypipe`: the controller
/// and the test's client) and by each control-plane process, by name, from `/proc/*/stat`.
fn cpu_seconds() -> BTreeMap<String, f64> {
    const PARTS: &[&str] = &[
        "etcd",
        "kube-apiserver",
        "kube-scheduler",
        "kube-controller",
        "kwok",
    ];
    let own = std::process::id().to_string();
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ...`: the name may hold spaces, so split at the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let name = if pid == own {
            "raypipe (test process)"
        } else if let Some(part) = PARTS.iter().find(|p| comm.starts_with(**p)) {
            part
        } else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after `state`.
        let ticks: f64 = fields
            .get(11..13)
            .into_iter()
            .flatten()
            .filter_map(|v| v.parse::<f64>().ok())
            .sum();
        *out.entry(name.to_owned()).or_insert(0.0) += ticks / 100.0;
    }
    out
}

/// CPU seconds by process between two [`cpu_seconds`] readings, one line.
fn cpu_used(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> String {
    after
        .iter()
        .map(|(name, s)| {
            format!(
                "{name} {:.0} s",
                s - before.get(name).copied().unwrap_or(0.0)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Pods in `ns` whose Ready condition is true.
async fn count_ready_pods(client: &kube::Client, ns: &str) -> usize {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    count_paged(&api, |p| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    })
    .await
}

/// The control plane's own ceiling for the same Pods: the Pods raypipe's builders make for
/// `clusters` clusters of `doc`, created straight by this process (no operator, owner
/// references dropped) in a namespace of their own, 32 at a time, until all are Ready
/// (scheduler and kwok do the rest, as for raypipe's Pods). With `head_services`, each
/// cluster's head Service is created straight beside its head Pod too: the like-for-like
/// bound, since a Service per cluster costs the scheduler and kube-controller-manager work per
/// Pod. Returns the time to all Ready.
async fn pod_ceiling(
    client: &kube::Client,
    clusters: usize,
    doc: impl Fn(usize) -> Value,
    head_services: bool,
) -> Duration {
    let prefix = if head_services {
        "rc-ceiling-svc"
    } else {
        "rc-ceiling"
    };
    let ns = support::namespace(client, prefix).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let options = BuildOptions::default();
    let bare = |mut pod: Pod, name: String| {
        pod.metadata.owner_references = None;
        pod.metadata.generate_name = None;
        pod.metadata.name = Some(name);
        pod.metadata.namespace = Some(ns.clone());
        pod
    };
    let started = std::time::Instant::now();
    use futures::StreamExt as _;
    futures::stream::iter(0..clusters)
        .flat_map(|i| futures::stream::iter((0..4).map(move |member| (i, member))))
        .for_each_concurrent(32, |(i, member)| {
            let mut cluster: RayCluster = serde_json::from_value(doc(i)).expect("a RayCluster");
            cluster.metadata.namespace = Some(ns.clone());
            // The builders' owner reference needs a uid; it is dropped again below.
            cluster.metadata.uid = Some(format!("ceiling-{i}"));
            let pod = if member == 0 {
                head_pod(&cluster, &options, &spec_hash(&cluster.spec)).expect("head builds")
            } else {
                let group = &cluster.spec.worker_group_specs.as_ref().expect("workers")[0];
                let replica = WorkerReplica {
                    replica_name: None,
                    replica_index: member - 1,
                    host_index: 0,
                };
                worker_pod(&cluster, group, &replica, &options).expect("worker builds")
            };
            let service = (head_services && member == 0).then(|| {
                let mut service =
                    service::head_service(&cluster, &options).expect("head Service builds");
                service.metadata.owner_references = None;
                service.metadata.namespace = Some(ns.clone());
                service
            });
            let pod = bare(pod, format!("ceiling-{i}-{member}"));
            let (pods, services) = (pods.clone(), services.clone());
            async move {
                if let Some(service) = service {
                    services
                        .create(&kube::api::PostParams::default(), &service)
                        .await
                        .expect("create Service");
                }
                pods.create(&kube::api::PostParams::default(), &pod)
                    .await
                    .expect("create Pod");
            }
        })
        .await;
    let mut last_report = std::time::Instant::now();
    loop {
        let ready = count_ready_pods(client, &ns).await;
        if ready == clusters * 4 {
            return started.elapsed();
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            println!(
                "ceiling {:?}: {ready}/{} Pods ready",
                started.elapsed(),
                clusters * 4
            );
            last_report = std::time::Instant::now();
        }
        assert!(
            started.elapsed() < Duration::from_secs(4 * 3600),
            "timed out"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A control plane of its own for one phase of the benchmark: every phase starts on an empty
/// cluster, and the CPU read per process is that phase's alone.
fn fresh_control_plane() -> ControlPlane {
    support::start_control_plane().expect("a control plane for the phase starts")
}

/// Stops a phase's control plane (its processes, with their grace period) off the async
/// workers.
fn stop_control_plane(plane: ControlPlane) {
    tokio::task::block_in_place(move || drop(plane));
}

/// The clusters of the benchmark: one head and three workers, with small Pods so that ten
/// thousand clusters fit on few fake Nodes (1000 CPU, 1 TiB each).
fn bench_cluster(i: usize) -> Value {
    let mut doc = small_cluster(&format!("bench-{i}"), 3, json!({}));
    let small = json!({"limits": {"cpu": "20m", "memory": "16Mi"}});
    doc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"] = small.clone();
    doc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"] = small;
    doc
}

/// The operator binary the raypipe phase runs: `RAYPIPE_BENCH_BINARY`, else the release build
/// the image ships (`cargo build --release --no-default-features`), built here if need be.
fn release_binary() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("RAYPIPE_BENCH_BINARY") {
        return path.into();
    }
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = std::process::Command::new("cargo")
        .args([
            "build",
            "--release",
            "--locked",
            "--no-default-features",
            "--bin",
            "raypipe",
        ])
        .current_dir(repo)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "the release build failed");
    repo.join("target/release/raypipe")
}

/// `/proc/<pid>/stat`'s user + system CPU seconds and `/proc/<pid>/status`' peak resident KiB.
fn process_usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let cpu = stat
        .rfind(')')
        .map(|close| {
            stat[close + 2..]
                .split(' ')
                .skip(11)
                .take(2)
                .filter_map(|v| v.parse::<f64>().ok())
                .sum::<f64>()
                / 100.0
        })
        .unwrap_or(0.0);
    (cpu, status_kib(pid, "VmHWM:"))
}

/// A `/proc/<pid>/status` line's value in KiB (`VmRSS:` now, `VmHWM:` the peak).
fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The value at quantile `q` of sorted `values`.
fn quantile(values: &[Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    let index = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len()) - 1;
    values[index]
}

/// raypipe's phase: the release binary with its default flags (the client's `--qps 100
/// --burst 200`, `--concurrency`, Events on a budget of their own) as its own process, only the
/// RayCluster controller; N RayClusters created 16 at a time until all are ready. Each
/// cluster's ready time is taken from a watch; prints the median, the 90th percentile and all,
/// the operator's CPU and peak memory, and the API requests per cluster.
async fn raypipe_phase(clusters: usize, flags: &[String]) -> Duration {
    let binary = release_binary();
    let plane = fresh_control_plane();
    let client = plane.client().await.expect("a client for the phase");
    let ns = support::namespace(&client, "rc-bench").await;
    add_fake_nodes(&client, clusters).await;
    let log = std::fs::File::create(std::env::temp_dir().join("raypipe-bench-operator.log"))
        .expect("a log file");
    let operator = std::process::Command::new(&binary)
        .args([
            "run",
            "--controllers=raycluster",
            "--leader-election=false",
            "--webhook=false",
        ])
        .arg(format!("--namespaces={ns}"))
        .arg("--admin-address=127.0.0.1:0")
        .arg("--log-level=warn")
        .args(flags)
        .env("KUBECONFIG", &plane.kubeconfig)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("the release binary starts");
    let mut operator = KillOnDrop(operator);
    let pid = operator.0.id();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_before = status_kib(pid, "VmRSS:");
    let requests_before = api_requests(&client).await;
    let cpu_before = cpu_seconds();
    let (operator_cpu_before, _) = process_usage(pid);
    let api: Api<RayCluster> = Api::namespaced(client.clone(), &ns);

    // Each cluster's first moment of `ready`, from a watch.
    let started = std::time::Instant::now();
    let ready_at = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<String, Duration>::new()));
    let watch = {
        let (api, ready_at) = (api.clone(), ready_at.clone());
        tokio::spawn(async move {
            use futures::TryStreamExt as _;
            use kube::runtime::{WatchStreamExt as _, watcher};
            let stream = watcher(api, watcher::Config::default()).applied_objects();
            futures::pin_mut!(stream);
            while let Ok(Some(cluster)) = stream.try_next().await {
                if cluster.status.as_ref().and_then(|s| s.state) == Some(ClusterState::Ready) {
                    ready_at
                        .lock()
                        .expect("lock")
                        .entry(cluster.name_any())
                        .or_insert_with(|| started.elapsed());
                }
            }
        })
    };
    use futures::StreamExt as _;
    futures::stream::iter(0..clusters)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            let doc = bench_cluster(i);
            async move {
                let cluster: RayCluster = serde_json::from_value(doc).expect("a RayCluster");
                api.create(&kube::api::PostParams::default(), &cluster)
                    .await
                    .expect("create RayCluster");
            }
        })
        .await;
    let created = started.elapsed();
    let mut last_report = std::time::Instant::now();
    loop {
        let ready = ready_at.lock().expect("lock").len();
        if ready == clusters {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            println!("{:?}: {ready}/{clusters} ready", started.elapsed());
            last_report = std::time::Instant::now();
        }
        assert!(
            started.elapsed() < Duration::from_secs(4 * 3600),
            "timed out"
        );
        assert!(
            operator
                .0
                .try_wait()
                .expect("the operator's status")
                .is_none(),
            "the operator exited"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    watch.abort();
    let mut times: Vec<Duration> = ready_at.lock().expect("lock").values().copied().collect();
    times.sort();
    let all_ready = *times.last().expect("clusters");
    assert_eq!(
        count_ready(&api).await,
        clusters,
        "the watch and a list agree"
    );
    let cpu_ready = cpu_seconds();
    let (operator_cpu, _) = process_usage(pid);
    // Settle, then measure the idle operator.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (_, peak) = process_usage(pid);
    let rss_after = status_kib(pid, "VmRSS:");
    let requests_after = api_requests(&client).await;
    let pods = clusters * 4;
    println!(
        "operator: {} (RayCluster controller only; flags beyond the defaults: {flags:?})",
        binary.display()
    );
    println!("clusters: {clusters}, pods: {pods}");
    println!("created in {created:?}");
    println!(
        "cluster ready since the start: median {:?}, p90 {:?}, all {all_ready:?}",
        quantile(&times, 0.5),
        quantile(&times, 0.9)
    );
    println!(
        "operator CPU until all ready: {:.1} s; peak resident memory {:.1} MiB; resident {rss_before} KiB before, {rss_after} KiB after ({:.3} MiB per managed Pod)",
        operator_cpu - operator_cpu_before,
        peak as f64 / 1024.0,
        (rss_after.saturating_sub(rss_before)) as f64 / 1024.0 / pods as f64
    );
    println!("API requests during the run (all clients), per cluster:");
    let mut total = 0.0;
    for (key, after) in &requests_after {
        let delta = after - requests_before.get(key).copied().unwrap_or(0.0);
        if delta >= clusters as f64 / 10.0 {
            println!("  {key:40} {:8.2}", delta / clusters as f64);
        }
        if !key.starts_with("LIST") && !key.starts_with("WATCH") && !key.starts_with("GET") {
            total += delta;
        }
    }
    println!(
        "  writes per cluster (all clients): {:.2}",
        total / clusters as f64
    );
    println!("CPU until all ready: {}", cpu_used(&cpu_before, &cpu_ready));
    drop(operator);
    stop_control_plane(plane);
    all_ready
}

/// A child process killed when dropped, so a failed benchmark leaves no operator behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A ceiling's phase ([`pod_ceiling`]) on a control plane of its own; returns the time to all
/// Pods Ready.
async fn ceiling_phase(clusters: usize, head_services: bool, what: &str) -> Duration {
    let plane = fresh_control_plane();
    let client = plane.client().await.expect("a client for the phase");
    add_fake_nodes(&client, clusters).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu_before = cpu_seconds();
    let ceiling = pod_ceiling(&client, clusters, bench_cluster, head_services).await;
    println!(
        "CPU of the ceiling run ({what}): {}",
        cpu_used(&cpu_before, &cpu_seconds())
    );
    stop_control_plane(plane);
    ceiling
}

/// The scale measurement of issues 4 and 18: N RayClusters (one head, three workers each) until
/// all are ready, with the controller at its production concurrency; prints the time, the test
/// process' resident memory growth (the controller and its caches; the control plane runs in
/// other processes) and the API requests by kind. Then the ceilings, in the same run: the same
/// 4·N Pods created straight, without an operator ([`pod_ceiling`]), alone and with each
/// cluster's head Service (the like-for-like bound), and raypipe's share of each. Every phase
/// has a fresh control plane of its own, so none runs on a cluster the one before filled.
/// `RAYPIPE_RAYCLUSTER_BENCH_CLUSTERS=1000 cargo test --test integration raycluster::benchmark -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: minutes of load on local control planes"]
async fn scale_benchmark() {
    let clusters: usize = std::env::var("RAYPIPE_RAYCLUSTER_BENCH_CLUSTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    // `RAYPIPE_RAYCLUSTER_BENCH_CEILINGS=false`: raypipe's phase only (e.g. to compare two
    // builds of the controller).
    let ceilings = std::env::var("RAYPIPE_RAYCLUSTER_BENCH_CEILINGS").as_deref() != Ok("false");
    let all_ready = raypipe_phase(clusters, &[]).await;
    // `RAYPIPE_BENCH_COMPARE_FLAGS="--qps=400 --burst=800"`: raypipe once more with these flags,
    // in the same run (does the client's rate limit still set the pace?).
    if let Ok(flags) = std::env::var("RAYPIPE_BENCH_COMPARE_FLAGS") {
        let flags: Vec<String> = flags.split_whitespace().map(str::to_owned).collect();
        let compared = raypipe_phase(clusters, &flags).await;
        println!("with {flags:?}: all ready after {compared:?} (defaults: {all_ready:?})");
    }
    if ceilings {
        // The like-for-like bound: the same Pods and each cluster's headless head Service, as
        // every Ray operator makes them.
        let what = "Pods and headless head Services";
        let ceiling = ceiling_phase(clusters, true, what).await;
        println!(
            "ceiling: the same {what} created straight, all {} Pods Ready after {ceiling:?}; raypipe reached {:.0} % of this ceiling's rate",
            clusters * 4,
            100.0 * ceiling.as_secs_f64() / all_ready.as_secs_f64()
        );
    }
}
