//! The scale benchmark: API requests and resident memory while many clusters reconcile.

use super::*;

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

/// Ready clusters, read in pages: the test process is what is measured, so its own reads must
/// not hold ten thousand clusters at once.
async fn count_ready(api: &Api<RayCluster>) -> usize {
    let mut ready = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.expect("list");
        ready += page
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.state) == Some(ClusterState::Ready))
            .count();
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return ready,
        }
    }
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

fn resident_kib() -> u64 {
    status_kib("VmRSS:")
}

/// A `/proc/self/status` line's value in KiB (`VmRSS:` now, `VmHWM:` the peak).
fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The scale measurement of issue 4: N RayClusters (one head, three workers each) until all are
/// ready; prints the time, the test process' resident memory growth (the controller and its
/// caches; the control plane runs in other processes) and the API requests by kind.
/// `RAYPIPE_RAYCLUSTER_BENCH_CLUSTERS=1000 cargo test --test integration raycluster::scale -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: minutes of load on the local control plane"]
async fn scale_benchmark() {
    let clusters: usize = std::env::var("RAYPIPE_RAYCLUSTER_BENCH_CLUSTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let f = fixture("rc-bench").await;
    let doc = |i: usize| {
        let mut doc = small_cluster(&format!("bench-{i}"), 3, json!({}));
        // Small Pods: ten thousand clusters must fit on kwok's one fake Node (1000 CPU, 1 TiB).
        let small = json!({"limits": {"cpu": "20m", "memory": "16Mi"}});
        doc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"] =
            small.clone();
        doc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"] =
            small;
        doc
    };
    add_fake_nodes(&f.client, clusters).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = resident_kib();
    let requests_before = api_requests(&f.client).await;
    let started = std::time::Instant::now();
    let api = f.clusters();
    use futures::StreamExt as _;
    futures::stream::iter(0..clusters)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            let doc = doc(i);
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
        let ready = count_ready(&api).await;
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
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let all_ready = started.elapsed();
    // Settle, then measure the idle controller.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_after = resident_kib();
    let requests_after = api_requests(&f.client).await;
    let pods = clusters * 4;
    println!("clusters: {clusters}, pods: {pods}");
    println!("created in {created:?}; all ready after {all_ready:?}");
    println!(
        "resident memory: {rss_before} KiB before, {rss_after} KiB after ({:.3} MiB per managed Pod)",
        (rss_after.saturating_sub(rss_before)) as f64 / 1024.0 / pods as f64
    );
    println!("peak resident memory: {} KiB", status_kib("VmHWM:"));
    println!("API requests during the run (all clients), per cluster:");
    for (key, after) in &requests_after {
        let delta = after - requests_before.get(key).copied().unwrap_or(0.0);
        if delta >= clusters as f64 / 10.0 {
            println!("  {key:40} {:8.2}", delta / clusters as f64);
        }
    }
}
