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

fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
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
        // Small Pods: a thousand clusters must fit on kwok's one fake Node (1000 CPU, 1 TiB).
        let small = json!({"limits": {"cpu": "100m", "memory": "128Mi"}});
        doc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"] =
            small.clone();
        doc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"] =
            small;
        doc
    };
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
        let list = api.list(&ListParams::default()).await.expect("list");
        let ready = list
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.state) == Some(ClusterState::Ready))
            .count();
        if ready == clusters {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            println!("{:?}: {ready}/{clusters} ready", started.elapsed());
            last_report = std::time::Instant::now();
        }
        assert!(started.elapsed() < Duration::from_secs(3600), "timed out");
        tokio::time::sleep(Duration::from_millis(500)).await;
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
    println!("API requests during the run (all clients), per cluster:");
    for (key, after) in &requests_after {
        let delta = after - requests_before.get(key).copied().unwrap_or(0.0);
        if delta >= clusters as f64 / 10.0 {
            println!("  {key:40} {:8.2}", delta / clusters as f64);
        }
    }
}
