//! KubeRay v1.7's gated RayCluster features against the real API server, with their gates on:
//! network isolation (NetworkPolicies), mTLS (cert-manager's CRDs from its Go module; the test
//! plays cert-manager, marking Certificates Ready and writing their Secrets, to exercise the
//! wait before Pods), embedded GCS fault tolerance (the PVC, bound to a PersistentVolume the
//! test makes) and the history server's collector. The project's samples for them
//! (`samples/ray-cluster.{network-policy,mtls,embedded-gcs}.yaml`, in the shape of KubeRay's
//! v1.7 samples) and KubeRay's own history-server sample are applied unchanged.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, PostParams};
use raypipe::controllers::raycluster::builders::{gcs_storage, mtls, network_policy};
use raypipe::kuberay::names::NodeType;
use raypipe::validation::feature_gates::{FeatureGates, gates};

use super::*;

/// KubeRay's samples of these features, should the shared sample set hold them: the
/// every-sample test leaves them out (they need gates and, for mTLS, cert-manager).
pub(super) const GATED_SAMPLES: [&str; 3] = [
    "ray-cluster.network-policy-deny-all.yaml",
    "ray-cluster.mtls.yaml",
    "ray-cluster.embedded-gcs-ft.yaml",
];

const CERT_MANAGER_MODULE: &str = "github.com/cert-manager/cert-manager";
const CERT_MANAGER_VERSION: &str = "v1.21.2";

async fn gated_fixture(prefix: &str) -> Fixture {
    let config = Config {
        concurrency: 4,
        feature_gates: FeatureGates::default()
            .with(gates::RAY_CLUSTER_NETWORK_POLICY, true)
            .with(gates::RAY_CLUSTER_MTLS, true)
            .with(gates::GCS_FAULT_TOLERANCE_EMBEDDED_STORAGE, true)
            .with(gates::RAY_CLUSTER_HISTORY_SERVER, true),
        build: gated_build_options(),
        ..Config::default()
    };
    fixture_with(prefix, config).await
}

/// A container's variables by name, with their literal values (empty for references).
fn literal_env(container: &k8s_openapi::api::core::v1::Container) -> BTreeMap<String, String> {
    container
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

/// The Pod builder's options of an operator with these gates.
fn gated_build_options() -> BuildOptions {
    BuildOptions {
        history_server: true,
        ..BuildOptions::default()
    }
}

/// KubeRay's own history-server sample, with the gate on: every Pod carries KubeRay's collector
/// sidecar sharing `/tmp/ray` with Ray, and the Ray container exports its events to it; the
/// builders' unit tests pin those Pods to what KubeRay v1.7's own code builds.
#[tokio::test]
async fn the_history_server_sample_gets_kuberays_collector_in_every_pod() {
    let f = gated_fixture("rc-history-on").await;
    let names = f
        .apply_file(&support::kuberay_samples_dir().join("ray-cluster.historyserver.yaml"))
        .await;
    assert_eq!(names, ["raycluster-historyserver"]);
    let name = &names[0];
    assert_realised_with(&f, name, &gated_build_options()).await;
    let pods = f.ray_pods(name).await;
    assert_eq!(pods.len(), 2, "a head and one worker");
    for pod in &pods {
        let role = label(pod, "ray.io/node-type");
        let spec = pod.spec.as_ref().expect("spec");
        let containers: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            containers[1], "ray-history-collector",
            "{role}: {containers:?}"
        );
        let collector = &spec.containers[1];
        let env = literal_env(collector);
        assert_eq!(
            env["RAY_ROLE"],
            if role == "head" { "Head" } else { "Worker" }
        );
        assert_eq!(env["RAY_CLUSTER_NAMESPACE"], f.ns);
        assert_eq!(env["STORAGE_BACKEND"], "GCS");
        assert_eq!(env["EVENTS_PORT"], "8084");
        let ray_env = literal_env(&spec.containers[0]);
        assert_eq!(
            ray_env["RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR"],
            "http://localhost:8084/v1/events"
        );
        for container in [&spec.containers[0], collector] {
            assert!(
                container
                    .volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.name == "ray-logs" && m.mount_path == "/tmp/ray"),
                "{role}/{}: /tmp/ray shared",
                container.name
            );
        }
    }
}

/// cert-manager's CRD files, from its Go module (the ordinary `go` client), cached beside the
/// control plane.
fn cert_manager_crd_files() -> Vec<std::path::PathBuf> {
    go_module_crd_files(
        CERT_MANAGER_MODULE,
        CERT_MANAGER_VERSION,
        "deploy/crds",
        "cert-manager.io_",
    )
}

/// Installs cert-manager's `cert-manager.io` CRDs (Issuer, Certificate, …) and waits until
/// they are served.
async fn install_cert_manager_crds(client: &kube::Client) {
    let files = tokio::task::spawn_blocking(cert_manager_crd_files)
        .await
        .expect("the CRD files");
    assert!(files.len() >= 2, "cert-manager CRDs: {files:?}");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in &files {
        for doc in documents(file) {
            let crd: CustomResourceDefinition =
                serde_json::from_value(doc).expect("a CustomResourceDefinition");
            let name = crd.metadata.name.clone().expect("a name");
            api.patch(
                &name,
                &PatchParams::apply("raycluster-test").force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap_or_else(|e| panic!("installing {name}: {e}"));
        }
    }
    eventually(WAIT, "cert-manager.io/v1 served", || async {
        client
            .list_api_group_resources("cert-manager.io/v1")
            .await
            .ok()
            .filter(|r| r.resources.iter().any(|r| r.kind == "Certificate"))
    })
    .await;
}

#[tokio::test]
async fn the_deny_all_sample_gets_kuberays_network_policies_and_they_follow_the_spec() {
    let f = gated_fixture("rc-netpol").await;
    let sample = project_sample("ray-cluster.network-policy.yaml");
    let names = f.apply_file(&sample).await;
    assert_eq!(names, ["raycluster-deny-all"]);
    let name = &names[0];
    assert_realised(&f, name).await;
    let cluster = f.cluster(name).await;
    let expected = network_policy::network_policies(&cluster).expect("builds");
    let policies: Api<NetworkPolicy> = f.api();
    for want in &expected {
        let have = policies.get(&want.name_any()).await.expect("the policy");
        assert_eq!(have.spec, want.spec, "{}", want.name_any());
        assert_eq!(have.metadata.labels, want.metadata.labels);
        assert_eq!(have.owner_references()[0].name, *name);
    }
    let names: Vec<String> = expected.iter().map(|p| p.name_any()).collect();
    assert_eq!(
        names,
        [
            "raycluster-deny-all-head",
            "raycluster-deny-all-workers-workergroup"
        ]
    );
    f.wait_event("CreatedNetworkPolicy").await;

    // Settled: neither the cluster nor its policies are written again.
    let settled = f.cluster(name).await;
    let head_policy = policies
        .get("raycluster-deny-all-head")
        .await
        .expect("head");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        f.cluster(name).await.resource_version(),
        settled.resource_version()
    );
    assert_eq!(
        policies
            .get("raycluster-deny-all-head")
            .await
            .expect("head")
            .resource_version(),
        head_policy.resource_version()
    );

    // A changed mode rewrites the policies; no networkPolicy removes them.
    // (Egress rules under DenyAllIngress would be refused, so they go too.)
    f.patch_spec(
        name,
        json!({"networkPolicy": {"mode": "DenyAllIngress", "head": null, "worker": null}}),
    )
    .await;
    eventually(WAIT, "the head policy restricts ingress only", || async {
        let head = policies.get("raycluster-deny-all-head").await.ok()?;
        (head.spec?.policy_types? == ["Ingress"]).then_some(())
    })
    .await;
    f.wait_event("UpdatedNetworkPolicy").await;
    f.patch_spec(name, json!({"networkPolicy": null})).await;
    eventually(WAIT, "the policies deleted", || async {
        let left = policies
            .list(&ListParams::default().labels(&format!("ray.io/cluster={name}")))
            .await
            .ok()?;
        left.items.is_empty().then_some(())
    })
    .await;
    f.wait_event("DeletedNetworkPolicy").await;
}

#[tokio::test]
async fn a_network_policy_name_someone_else_holds_is_a_collision() {
    let f = gated_fixture("rc-netpol-taken").await;
    f.apply(&json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "taken-head"},
        "spec": {"podSelector": {}}
    }))
    .await;
    let mut doc = documents(&project_sample("ray-cluster.network-policy.yaml")).remove(0);
    doc["metadata"]["name"] = json!("taken");
    let name = f.create_cluster(doc).await;
    let event = f.wait_event("NetworkPolicyNameCollision").await;
    assert!(
        event.message.unwrap_or_default().contains("taken-head"),
        "the event names the policy"
    );
    let policy: NetworkPolicy = f.api().get("taken-head").await.expect("still there");
    assert!(policy.owner_references().is_empty(), "left alone");
    assert!(
        f.ray_pods(&name).await.is_empty(),
        "no Pods without isolation"
    );
}

#[tokio::test]
async fn the_embedded_gcs_sample_gets_its_pvc_and_the_head_mounts_it() {
    let f = gated_fixture("rc-gcs-embedded").await;
    // No provisioner here: a PersistentVolume for the claim to bind to, so the head schedules.
    let pv_name = format!("{}-gcs", f.ns);
    let volumes: Api<PersistentVolume> = Api::all(f.client.clone());
    volumes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": pv_name},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "storageClassName": "", "hostPath": {"path": "/tmp/raypipe-gcs"},
                         "claimRef": {"namespace": f.ns, "name": "raycluster-embedded-gcs-ft-gcs-pvc"}}
            }))
            .expect("a PersistentVolume"),
        )
        .await
        .expect("create PV");
    let names = f
        .apply_file(&project_sample("ray-cluster.embedded-gcs.yaml"))
        .await;
    assert_eq!(names, ["raycluster-embedded-gcs-ft"]);
    let name = &names[0];
    assert_realised(&f, name).await;
    let cluster = f.cluster(name).await;
    let claims: Api<PersistentVolumeClaim> = f.api();
    let claim = claims
        .get("raycluster-embedded-gcs-ft-gcs-pvc")
        .await
        .expect("the PVC");
    let expected = gcs_storage::gcs_storage_pvc(&cluster)
        .expect("builds")
        .expect("a PVC");
    assert_eq!(claim.metadata.labels, expected.metadata.labels);
    assert_eq!(claim.owner_references()[0].name, *name);
    let spec = claim.spec.clone().expect("spec");
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    f.wait_event("CreatedPVC").await;
    let head = f
        .ray_pods(name)
        .await
        .into_iter()
        .find(|p| label(p, "ray.io/node-type") == "head")
        .expect("head");
    let head_spec = head.spec.expect("spec");
    let ray = &head_spec.containers[0];
    let env = literal_env(ray);
    assert_eq!(env["RAY_gcs_storage"], "rocksdb");
    assert_eq!(env["RAY_gcs_storage_path"], "/data/gcs");
    assert!(
        ray.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "gcs-storage" && m.mount_path == "/data/gcs")
    );
    assert!(head_spec.volumes.iter().flatten().any(|v| {
        v.name == "gcs-storage"
            && v.persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str())
                == Some("raycluster-embedded-gcs-ft-gcs-pvc")
    }));

    // Retain: the claim loses the cluster as owner and outlives it.
    f.patch_spec(
        name,
        json!({"gcsFaultToleranceOptions": {"backend": "rocksdb", "storage": {"size": "1Gi", "deletionPolicy": "Retain"}}}),
    )
    .await;
    eventually(WAIT, "the PVC no longer owned", || async {
        let claim = claims
            .get("raycluster-embedded-gcs-ft-gcs-pvc")
            .await
            .ok()?;
        claim.owner_references().is_empty().then_some(())
    })
    .await;
    volumes
        .delete(&pv_name, &DeleteParams::default())
        .await
        .expect("delete PV");
}

/// Plays cert-manager for the namespace: every Certificate is marked Ready at its generation
/// and its Secret written (with placeholder PEM data: kwok runs no Ray).
async fn issue_certificates(client: kube::Client, ns: String) {
    let certificates: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &mtls::certificate_resource());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    loop {
        for certificate in certificates
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            if mtls::certificate_ready(&certificate) {
                continue;
            }
            let Some(secret) = certificate.data["spec"]["secretName"].as_str() else {
                continue;
            };
            let data: BTreeMap<&str, String> = mtls::SECRET_KEYS
                .iter()
                .map(|k| {
                    (*k, {
                        use base64::Engine as _;
                        base64::engine::general_purpose::STANDARD.encode(format!("{k} of {secret}"))
                    })
                })
                .collect();
            let _ = secrets
                .patch(
                    secret,
                    &PatchParams::apply("fake-cert-manager").force(),
                    &Patch::Apply(json!({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": secret}, "type": "kubernetes.io/tls", "data": data})),
                )
                .await;
            let status = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
                "reason": "Ready", "message": "issued by the test",
                "observedGeneration": certificate.metadata.generation}]}});
            let _ = certificates
                .patch_status(
                    &certificate.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn the_mtls_sample_waits_for_its_certificates_then_runs_with_tls() {
    let f = gated_fixture("rc-mtls").await;
    install_cert_manager_crds(&f.client).await;
    let names = f.apply_file(&project_sample("ray-cluster.mtls.yaml")).await;
    assert_eq!(names, ["raycluster-mtls"]);
    let name = &names[0];

    // The PKI exists, but no Pod is made before cert-manager has issued the certificates.
    let certificates: Api<DynamicObject> =
        Api::namespaced_with(f.client.clone(), &f.ns, &mtls::certificate_resource());
    let issuers: Api<DynamicObject> =
        Api::namespaced_with(f.client.clone(), &f.ns, &mtls::issuer_resource());
    eventually(WAIT, "the head and worker Certificates", || async {
        let head = certificates
            .get_opt("ray-head-cert-raycluster-mtls")
            .await
            .ok()??;
        let worker = certificates
            .get_opt("ray-worker-cert-raycluster-mtls")
            .await
            .ok()??;
        Some((head, worker))
    })
    .await;
    for issuer in [
        "ray-selfsigned-issuer-raycluster-mtls",
        "ray-ca-issuer-raycluster-mtls",
    ] {
        let found = issuers.get(issuer).await.expect("the Issuer");
        assert_eq!(found.owner_references()[0].name, *name);
    }
    let ca = certificates
        .get("ray-ca-certificate-raycluster-mtls")
        .await
        .expect("the CA");
    assert_eq!(ca.data["spec"]["isCA"], true);
    f.wait_event("MTLSCertsNotReady").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        f.ray_pods(name).await.is_empty(),
        "no Pod before the certificates"
    );

    let issuer = tokio::spawn(issue_certificates(f.client.clone(), f.ns.clone()));
    assert_realised(&f, name).await;
    f.wait_event("MTLSPKIReady").await;
    let pods = f.ray_pods(name).await;
    for pod in &pods {
        let spec = pod.spec.clone().expect("spec");
        let node_type = label(pod, "ray.io/node-type");
        let inits: Vec<&str> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(inits.first(), Some(&"wait-for-tls-ip-san"), "{node_type}");
        let env: Vec<&str> = spec.containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .collect();
        for var in [
            "RAY_USE_TLS",
            "RAY_TLS_SERVER_CERT",
            "RAY_TLS_SERVER_KEY",
            "RAY_TLS_CA_CERT",
        ] {
            assert!(env.contains(&var), "{node_type}: {var} in {env:?}");
        }
        let secret = if node_type == "head" {
            "ray-head-secret-raycluster-mtls"
        } else {
            "ray-worker-secret-raycluster-mtls"
        };
        assert!(spec.volumes.iter().flatten().any(|v| {
            v.name == "ray-tls"
                && v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(secret)
        }));
    }

    // The certificates name the Pods' IPs; the Secrets go with their Certificates.
    for (node_type, certificate) in [
        (NodeType::Head, "ray-head-cert-raycluster-mtls"),
        (NodeType::Worker, "ray-worker-cert-raycluster-mtls"),
    ] {
        let ips: Vec<String> = pods
            .iter()
            .filter(|p| label(p, "ray.io/node-type") == node_type.as_str())
            .filter_map(|p| p.status.as_ref().and_then(|s| s.pod_ip.clone()))
            .collect();
        let cluster = f.cluster(name).await;
        let want =
            mtls::leaf_certificate(&cluster, node_type, &ips, "cluster.local").expect("builds");
        let have = eventually(WAIT, "the certificate names the Pod IPs", || async {
            let have = certificates.get(certificate).await.ok()?;
            (mtls::sans(&have) == mtls::sans(&want)).then_some(have)
        })
        .await;
        let secret: Secret = f
            .api()
            .get(
                have.data["spec"]["secretName"]
                    .as_str()
                    .expect("secretName"),
            )
            .await
            .expect("the Secret");
        assert!(
            secret
                .owner_references()
                .iter()
                .any(|o| o.kind == "Certificate" && o.name == certificate)
        );
    }

    // Settled: the cluster and its certificates are not written again.
    f.wait_ready(name).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let settled = f.cluster(name).await;
    let head_cert = certificates
        .get("ray-head-cert-raycluster-mtls")
        .await
        .expect("head cert");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        f.cluster(name).await.resource_version(),
        settled.resource_version()
    );
    assert_eq!(
        certificates
            .get("ray-head-cert-raycluster-mtls")
            .await
            .expect("head cert")
            .resource_version(),
        head_cert.resource_version()
    );
    issuer.abort();
}
