//! A second control plane whose kwok also runs its kubelet-like server, so the API server's
//! Pod `portforward` and `log` subresources work for the Pods kwok "runs": a port of such a Pod
//! forwards to a real process on 127.0.0.1 (a `PortForward` object says which), and its log is
//! a file on this machine (a `Logs` object says which).

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use raypipe::devenv::control_plane::{ControlPlane, ControlPlaneOptions, KWOK_NODE};

/// The kwok-server control plane every test in this binary shares: like the shared one
/// (`super::control_plane`, raypipe's CRDs included) plus kwok's server and its `PortForward`,
/// `ClusterPortForward`, `Logs` and `ClusterLogs` CRDs. Started by the first test that asks
/// (blocking that test's thread while it starts, like `control_plane`); a failed start is
/// remembered and fails every later caller with the same message.
pub fn kwok_server_plane() -> &'static ControlPlane {
    static PLANE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
    let plane = PLANE.get_or_init(|| {
        super::start_control_plane_with(ControlPlaneOptions {
            kwok_server: true,
            ..ControlPlaneOptions::full()
        })
    });
    match plane {
        Ok(plane) => plane,
        Err(e) => panic!("the kwok-server control plane failed to start: {e}"),
    }
}

/// A client (admin) of [`kwok_server_plane`] for the current test's runtime.
pub async fn kwok_server_client() -> kube::Client {
    kwok_server_plane()
        .client()
        .await
        .expect("a client for the kwok-server control plane")
}

fn kwok_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "kwok.x-k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "kwok.x-k8s.io/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Creates Pod `name` in `ns` bound to kwok's Node (no scheduling), with one container `main`
/// declaring `ports`, and waits until kwok reports it Running. Returns the Pod.
pub async fn create_running_pod(client: &kube::Client, ns: &str, name: &str, ports: &[u16]) -> Pod {
    let ports: Vec<_> = ports
        .iter()
        .map(|port| serde_json::json!({"containerPort": port}))
        .collect();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": KWOK_NODE,
            "containers": [{"name": "main", "image": "kwok.invalid/none", "ports": ports}]
        }
    }))
    .expect("a valid Pod");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create Pod {ns}/{name}: {e}"));
    super::eventually(
        Duration::from_secs(60),
        &format!("Pod {ns}/{name} to be Running"),
        || {
            let pods = pods.clone();
            async move {
                let pod = pods.get(name).await.ok()?;
                let phase = pod.status.as_ref()?.phase.as_deref()?;
                (phase == "Running").then_some(pod)
            }
        },
    )
    .await
}

/// Makes port `pod_port` of Pod `ns/pod` forward to 127.0.0.1:`local_target_port`, by adding
/// that forward to the Pod's `PortForward` (named like the Pod; created when missing, so a Pod
/// may forward several ports), and returns once kwok's server knows it: a port-forward through
/// the API server is answered by the target from then on. The check opens (and closes at once)
/// one connection to the target when it listens.
pub async fn forward_pod_port(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    pod_port: u16,
    local_target_port: u16,
) {
    let forwards: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &kwok_resource("PortForward", "portforwards"),
    );
    let forward = serde_json::json!({
        "ports": [pod_port],
        "target": {"address": "127.0.0.1", "port": local_target_port}
    });
    let existing = forwards
        .get_opt(pod)
        .await
        .unwrap_or_else(|e| panic!("get PortForward {ns}/{pod}: {e}"));
    match existing {
        Some(mut object) => {
            let list = object.data["spec"]["forwards"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut kept: Vec<_> = list
                .into_iter()
                .filter(|f| f["ports"] != serde_json::json!([pod_port]))
                .collect();
            kept.push(forward);
            object.data["spec"]["forwards"] = serde_json::Value::Array(kept);
            forwards
                .replace(pod, &PostParams::default(), &object)
                .await
                .unwrap_or_else(|e| panic!("update PortForward {ns}/{pod}: {e}"));
        }
        None => {
            let object: DynamicObject = serde_json::from_value(serde_json::json!({
                "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "kind": "PortForward",
                "metadata": {"name": pod, "namespace": ns},
                "spec": {"forwards": [forward]}
            }))
            .expect("a valid PortForward");
            forwards
                .create(&PostParams::default(), &object)
                .await
                .unwrap_or_else(|e| panic!("create PortForward {ns}/{pod}: {e}"));
        }
    }
    wait_until_forwarded(client, ns, pod, pod_port, local_target_port).await;
}

/// kwok learns of `PortForward` objects from a watch and reports none back, so this asks it:
/// until it knows the forward, a port-forward ends with kwok's "no forward found" error. With
/// the forward known, there is no error (or only one dialling the target, which may not listen
/// yet).
async fn wait_until_forwarded(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    pod_port: u16,
    local_target_port: u16,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        match pods.portforward(pod, &[pod_port]).await {
            Ok(mut forwarder) => {
                let stream = forwarder.take_stream(pod_port);
                let error = forwarder.take_error(pod_port).expect("an error channel");
                let outcome = tokio::time::timeout(Duration::from_millis(500), error).await;
                drop(stream);
                forwarder.abort();
                match outcome {
                    // Quiet for half a second: kwok dialled the target and tunnels.
                    Err(_) => return,
                    Ok(Some(message))
                        if !message.contains("no forward found")
                            && !message.contains("forward not found") =>
                    {
                        return;
                    }
                    Ok(message) => last = format!("{message:?}"),
                }
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "kwok did not take up the forward of {ns}/{pod}:{pod_port} to 127.0.0.1:{local_target_port} \
         within 30 s; last answer: {last}"
    );
}

/// Makes the log of every container of Pod `ns/pod` (`kubectl logs`, `Api::<Pod>::logs`) the
/// file `log_file`, by creating the Pod's `Logs` object (named like the Pod). kwok reads the
/// file as a CRI container log — lines of `<RFC 3339 time> stdout|stderr F <text>` — and
/// refuses plain text ("unsupported log format"); [`cri_log`] writes that format. With
/// `follow`, a followed log (`follow=true`) streams lines appended later. Returns once kwok
/// serves it.
pub async fn serve_pod_log(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    log_file: &Path,
    follow: bool,
) {
    let logs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &kwok_resource("Logs", "logs"));
    let object: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": pod, "namespace": ns},
        "spec": {"logs": [{"logsFile": log_file.display().to_string(), "follow": follow}]}
    }))
    .expect("a valid Logs");
    logs.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create Logs {ns}/{pod}: {e}"));
    // Until kwok's watch delivers it, the log request fails ("no logs found").
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    super::eventually(
        Duration::from_secs(30),
        &format!("kwok to serve the log of {ns}/{pod}"),
        || {
            let pods = pods.clone();
            async move {
                let params = kube::api::LogParams {
                    limit_bytes: Some(1),
                    ..Default::default()
                };
                pods.logs(pod, &params).await.ok().map(|_| ())
            }
        },
    )
    .await;
}

/// `text` as a CRI container log (what kwok's `Logs` files must hold): each line as
/// `<now, RFC 3339> stdout F <line>`.
pub fn cri_log(text: &str) -> String {
    let now = jiff::Timestamp::now();
    text.lines()
        .map(|line| format!("{now} stdout F {line}\n"))
        .collect()
}
