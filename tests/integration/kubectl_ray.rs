//! KubeRay's own kubectl plugin (`kubectl ray`, [`tools::KUBECTL_RAY_VERSION`]) against a
//! RayCluster that raypipe's RayCluster controller realises on the shared control plane (kwok
//! runs its Pods). What works is pinned by its output; what cannot work on kwok (Pod logs and
//! port-forwards need a kubelet, which kwok here does not serve) is pinned as the failure it
//! is. The findings are written up in `docs/kubectl-ray.md`.
//!
//! The plugin cannot be built from a Go module (see [`tools::kubectl_ray`]): without
//! `RAYPIPE_KUBECTL_RAY` or a cached binary the test says so and checks nothing.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use raypipe::api::RayCluster;
use raypipe::api::raycluster::ClusterState;
use serde_json::Value;

use crate::support::{self, eventually, fixture, tools};

const WAIT: Duration = Duration::from_secs(90);
/// The sample's RayCluster (one head of 1 CPU / 5Gi, group `workergroup` of 1 CPU / 1Gi
/// workers, replicas 1 in [1, 5]).
const SAMPLE: &str = "ray-cluster.sample.yaml";
const CLUSTER: &str = "raycluster-kuberay";
const GROUP: &str = "workergroup";

/// Runs `kubectl ray` against the shared control plane, in one namespace.
struct Plugin {
    binary: PathBuf,
    kubeconfig: PathBuf,
    /// The control plane's own `kubectl` first (`session` runs `kubectl port-forward`).
    path: OsString,
    /// Its discovery cache (`--cache-dir`), so nothing is written under `~/.kube`.
    cache: tempfile::TempDir,
    ns: String,
}

impl Plugin {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.binary);
        // The global flags first: after a `--` they would be the job's entrypoint.
        command
            .arg("--namespace")
            .arg(&self.ns)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PATH", &self.path)
            .stdin(Stdio::null());
        command
    }

    /// Runs it without blocking the test's runtime (the controllers under test run on it).
    async fn output(&self, args: &[&str]) -> Output {
        tokio::process::Command::from(self.command(args))
            .output()
            .await
            .unwrap_or_else(|e| panic!("kubectl ray {args:?} did not start: {e}"))
    }

    /// Standard output of a run that must succeed.
    async fn run(&self, args: &[&str]) -> String {
        let output = self.output(args).await;
        assert!(
            output.status.success(),
            "kubectl ray {args:?} failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The table a `get` prints, one map (upper-case column name → cell) per row.
    async fn table(&self, args: &[&str]) -> Vec<BTreeMap<String, String>> {
        let stdout = self.run(args).await;
        parse_table(&stdout).unwrap_or_else(|| panic!("kubectl ray {args:?}: no table:\n{stdout}"))
    }
}

/// Parses the kubectl table printer's output: cells start where their column's header starts
/// (headers are separated by at least two spaces; a header may hold one, `DESIRED WORKERS`).
fn parse_table(text: &str) -> Option<Vec<BTreeMap<String, String>>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next()?;
    let bytes = header.as_bytes();
    let starts: Vec<usize> = (0..bytes.len())
        .filter(|&i| {
            bytes[i] != b' ' && (i == 0 || (i >= 2 && bytes[i - 1] == b' ' && bytes[i - 2] == b' '))
        })
        .collect();
    let cell = |line: &str, n: usize| -> String {
        let from = starts[n].min(line.len());
        let to = starts.get(n + 1).map_or(line.len(), |&e| e.min(line.len()));
        line.get(from..to).unwrap_or_default().trim().to_owned()
    };
    let names: Vec<String> = (0..starts.len()).map(|n| cell(header, n)).collect();
    Some(
        lines
            .map(|line| {
                names
                    .iter()
                    .enumerate()
                    .map(|(n, name)| (name.clone(), cell(line, n)))
                    .collect()
            })
            .collect(),
    )
}

/// The row whose `column` is `value`.
fn row<'a>(
    rows: &'a [BTreeMap<String, String>],
    column: &str,
    value: &str,
) -> &'a BTreeMap<String, String> {
    rows.iter()
        .find(|r| r.get(column).map(String::as_str) == Some(value))
        .unwrap_or_else(|| panic!("no row with {column} = {value} in {rows:#?}"))
}

/// Asserts `row` has these cells (and whatever else).
fn assert_cells(row: &BTreeMap<String, String>, expected: &[(&str, &str)]) {
    for (column, value) in expected {
        assert_eq!(
            row.get(*column).map(String::as_str),
            Some(*value),
            "column {column} of {row:#?}"
        );
    }
}

/// The sample's RayCluster, read at test time from KubeRay's samples.
fn sample_cluster() -> Value {
    let path = support::kuberay_samples_dir().join(SAMPLE);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    raypipe::api::yaml::documents(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .find(|d| d["kind"] == "RayCluster")
        .expect("the sample holds a RayCluster")
}

/// Waits until the cluster is ready with `workers` available workers.
async fn wait_available(clusters: &Api<RayCluster>, workers: i32) -> RayCluster {
    eventually(
        WAIT,
        &format!("{CLUSTER}: ready with {workers} available workers"),
        || async move {
            let cluster = clusters.get_opt(CLUSTER).await.expect("get RayCluster")?;
            let status = cluster.status.as_ref()?;
            (status.state == Some(ClusterState::Ready)
                && status.available_worker_replicas == Some(workers))
            .then_some(cluster)
        },
    )
    .await
}

/// Starts `command` in a process group of its own and reads its standard output until a line
/// contains `wanted` (or `wait` passes), then kills the group (it and what it started): what it
/// printed, whether `wanted` came, and its standard error.
fn run_until(mut command: Command, wanted: &str, wait: Duration) -> (String, bool, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("the command starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + wait;
    let mut seen = String::new();
    let mut found = false;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(line) = rx.recv_timeout(left) else {
            break;
        };
        seen.push_str(&line);
        seen.push('\n');
        if line.contains(wanted) {
            found = true;
            break;
        }
    }
    // SAFETY: kill(2) on the process group this function created (its leader is not reaped yet).
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
    }
    let _ = child.wait();
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    (seen, found, stderr)
}

#[tokio::test]
#[ignore = "needs KubeRay's kubectl-ray v1.7.0, which no Go module proxy serves: build it from KubeRay's source and set RAYPIPE_KUBECTL_RAY (docs/kubectl-ray.md)"]
async fn kubectl_ray_lists_scales_and_reports_a_raycluster_raypipe_realises() {
    let binary = tools::kubectl_ray().unwrap_or_else(|| {
        panic!(
            "no kubectl-ray {}: set RAYPIPE_KUBECTL_RAY or put it in the cache (tools::kubectl_ray)",
            tools::KUBECTL_RAY_VERSION
        )
    });
    let plane = support::control_plane();
    let client = support::client().await;
    let ns = support::namespace(&client, "kubectl-ray").await;
    let mut stop = fixture::Stopper::default();
    fixture::spawn_raycluster_controller(&client, &ns, Default::default(), &mut stop);
    fixture::apply(&client, &ns, &sample_cluster(), "kubectl-ray-test").await;
    let clusters: Api<RayCluster> = Api::namespaced(client.clone(), &ns);
    wait_available(&clusters, 1).await;

    let mut path = OsString::new();
    if let Some(dir) = plane.binaries.kubectl.as_deref().and_then(Path::parent) {
        path.push(dir);
        path.push(":");
    }
    path.push(std::env::var_os("PATH").unwrap_or_default());
    let plugin = Plugin {
        binary: binary.to_owned(),
        kubeconfig: plane.kubeconfig.clone(),
        path,
        cache: tempfile::tempdir().expect("a temporary directory"),
        ns: ns.clone(),
    };

    // `get cluster`: a table only (no -o); the totals come from raypipe's status.
    let rows = plugin.table(&["get", "cluster"]).await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_cells(
        &rows[0],
        &[
            ("NAME", CLUSTER),
            ("NAMESPACE", &ns),
            ("DESIRED WORKERS", "1"),
            ("AVAILABLE WORKERS", "1"),
            ("CPUS", "2"),
            ("GPUS", "0"),
            ("TPUS", "0"),
            ("MEMORY", "6Gi"),
            ("CONDITION", "RayClusterProvisioned"),
            ("STATUS", "ready"),
        ],
    );
    // By name (a field selector on the custom resource), and an unknown name is an error.
    let without_age = |mut rows: Vec<BTreeMap<String, String>>| {
        rows.iter_mut().for_each(|r| {
            r.remove("AGE");
        });
        rows
    };
    assert_eq!(
        without_age(plugin.table(&["get", "cluster", CLUSTER]).await),
        without_age(rows)
    );
    let missing = plugin.output(&["get", "cluster", "no-such-cluster"]).await;
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains(&format!(
            "Ray cluster no-such-cluster not found in namespace {ns}"
        )),
        "{missing:?}"
    );

    // `get nodes`: raypipe's Pods, found by KubeRay's labels (ray.io/is-ray-node, ray.io/cluster,
    // ray.io/node-type, ray.io/group).
    let pods: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels(&format!("ray.io/cluster={CLUSTER}")))
        .await
        .expect("list Pods")
        .items;
    let pod_of = |node_type: &str| -> String {
        pods.iter()
            .find(|p| p.labels().get("ray.io/node-type").map(String::as_str) == Some(node_type))
            .unwrap_or_else(|| panic!("a {node_type} Pod"))
            .name_any()
    };
    let (head, worker) = (pod_of("head"), pod_of("worker"));
    let nodes = plugin
        .table(&["get", "nodes", "--ray-cluster", CLUSTER])
        .await;
    assert_eq!(nodes.len(), 2, "{nodes:#?}");
    assert_cells(
        row(&nodes, "NAME", &head),
        &[
            ("CPUS", "1"),
            ("GPUS", "0"),
            ("TPUS", "0"),
            ("MEMORY", "5Gi"),
            ("CLUSTER", CLUSTER),
            ("TYPE", "head"),
            ("WORKER GROUP", "headgroup"),
        ],
    );
    assert_cells(
        row(&nodes, "NAME", &worker),
        &[
            ("CPUS", "1"),
            ("MEMORY", "1Gi"),
            ("CLUSTER", CLUSTER),
            ("TYPE", "worker"),
            ("WORKER GROUP", GROUP),
        ],
    );
    // One node by its Pod's name.
    let one = plugin.table(&["get", "node", &worker]).await;
    assert_eq!(one.len(), 1, "{one:#?}");
    assert_eq!(one[0]["NAME"], worker);

    // `get workergroups`: spec from the RayCluster, readiness from raypipe's (kwok-run) Pods.
    let groups = plugin
        .table(&["get", "workergroups", "--ray-cluster", CLUSTER])
        .await;
    assert_eq!(groups.len(), 1, "{groups:#?}");
    let expected_group = |replicas: &'static str, cpus: &'static str, memory: &'static str| {
        [
            ("NAME", GROUP),
            ("MIN", "1"),
            ("MAX", "5"),
            ("REPLICAS", replicas),
            ("CPUS", cpus),
            ("GPUS", "0"),
            ("TPUS", "0"),
            ("MEMORY", memory),
            ("CLUSTER", CLUSTER),
        ]
    };
    assert_cells(&groups[0], &expected_group("1/1", "1", "1Gi"));

    // `scale cluster`: the plugin PUTs the whole RayCluster back (its Go types); raypipe's
    // controller then creates the workers and the plugin sees them ready.
    let scaled = plugin
        .run(&["scale", "cluster", CLUSTER, "-w", GROUP, "-r", "3"])
        .await;
    assert!(
        scaled.contains(&format!(
            "Updated worker group {GROUP} in Ray cluster {CLUSTER} in namespace {ns} \
             (Scaled Replicas: 1 to 3)"
        )),
        "{scaled}"
    );
    let cluster = wait_available(&clusters, 3).await;
    assert_eq!(
        cluster.spec.worker_group_specs.as_ref().expect("groups")[0].replicas,
        Some(3)
    );
    let groups = plugin
        .table(&["get", "workergroups", "--ray-cluster", CLUSTER])
        .await;
    assert_cells(&groups[0], &expected_group("3/3", "3", "3Gi"));
    let rows = plugin.table(&["get", "cluster", CLUSTER]).await;
    assert_cells(
        &rows[0],
        &[
            ("DESIRED WORKERS", "3"),
            ("AVAILABLE WORKERS", "3"),
            ("CPUS", "4"),
            ("MEMORY", "8Gi"),
        ],
    );
    assert_eq!(
        plugin
            .table(&["get", "nodes", "--ray-cluster", CLUSTER])
            .await
            .len(),
        4
    );

    // `create cluster --wait` returns once raypipe marks the new cluster RayClusterProvisioned;
    // `delete --yes` deletes it.
    let created = plugin
        .run(&[
            "create",
            "cluster",
            "made-by-plugin",
            "--worker-replicas",
            "1",
            "--wait",
            "--timeout",
            "60s",
        ])
        .await;
    assert!(
        created.contains("Ray cluster made-by-plugin is provisioned"),
        "{created}"
    );
    let groups = plugin
        .table(&["get", "workergroups", "--ray-cluster", "made-by-plugin"])
        .await;
    assert_cells(
        row(&groups, "NAME", "default-group"),
        &[("REPLICAS", "1/1"), ("CLUSTER", "made-by-plugin")],
    );
    let deleted = plugin.run(&["delete", "made-by-plugin", "--yes"]).await;
    assert!(
        deleted.contains("Deleted raycluster made-by-plugin"),
        "{deleted}"
    );
    assert_eq!(plugin.table(&["get", "cluster"]).await.len(), 1);

    // `log`: it finds raypipe's Pods, then reading a Pod's log needs the node's kubelet, which
    // kwok here does not serve: it fails at the first Pod, having downloaded nothing.
    let out_dir = tempfile::tempdir().expect("a temporary directory");
    let logs = plugin
        .output(&[
            "log",
            CLUSTER,
            "--node-type",
            "head",
            "--out-dir",
            &out_dir.path().display().to_string(),
        ])
        .await;
    let stderr = String::from_utf8_lossy(&logs.stderr);
    assert!(!logs.status.success(), "{logs:?}");
    assert!(
        stderr.contains(&format!("Error retrieving log for Ray cluster node {head}")),
        "{stderr}"
    );

    // `session`: it resolves the head Service raypipe made from the RayCluster's status, then
    // runs `kubectl port-forward`, which needs the kubelet too: it fails and retries (every
    // 3 s, forever), so the test stops it.
    let session = plugin.command(&["session", CLUSTER]);
    let (seen, failed, stderr) =
        tokio::task::spawn_blocking(move || run_until(session, "failed to port-forward", WAIT))
            .await
            .expect("the session runs");
    assert!(
        seen.contains(&format!("Forwarding ports to service {CLUSTER}-head-svc")),
        "{seen}\n{stderr}"
    );
    assert!(
        failed,
        "port-forward to a kwok Pod failed:\n{seen}\n{stderr}"
    );
}

#[test]
fn parse_table_reads_cells_by_header_offsets() {
    let text = "NAME   DESIRED WORKERS   CONDITION   STATUS\n\
                a      1                             ready\n\
                bb     22                Provisioned ready\n";
    let rows = parse_table(text).expect("a table");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["DESIRED WORKERS"], "1");
    assert_eq!(rows[0]["CONDITION"], "");
    assert_eq!(rows[1]["CONDITION"], "Provisioned");
    assert_eq!(rows[1]["STATUS"], "ready");
}
