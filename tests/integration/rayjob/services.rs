//! What a RayJob keeps beside its cluster: its head Service `<rayjob>-head-svc` (KubeRay's
//! shape, re-pointed when the job moves to a new cluster) and, when the cluster uses token
//! auth, the token on the submitter by Secret reference.

use k8s_openapi::api::core::v1::Service;

use super::modes::small_job;
use super::*;

async fn service(f: &Fixture, name: &str) -> Option<Service> {
    Api::<Service>::namespaced(f.client.clone(), &f.ns)
        .get_opt(name)
        .await
        .expect("get Service")
}

fn selected_cluster(service: &Service) -> Option<String> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .and_then(|s| s.get("ray.io/cluster").cloned())
}

#[tokio::test]
async fn a_rayjob_gets_its_head_service_and_the_token_by_reference() {
    let f = fixture("rayjob-svc").await;

    // K8sJobMode on a token-auth cluster: the submitter gets the cluster's token Secret.
    let mut authed = small_job(
        "authed",
        json!({"entrypoint": "python -c \"print('authed')\""}),
    );
    authed["spec"]["rayClusterSpec"]["authOptions"] = json!({"mode": "token"});
    f.apply(&authed).await;
    let submitter: Job = eventually(WAIT, "the submitter Job", || async {
        Api::<Job>::namespaced(f.client.clone(), &f.ns)
            .get_opt("authed")
            .await
            .expect("get Job")
    })
    .await;
    let cluster = f
        .job("authed")
        .await
        .status
        .and_then(|s| s.ray_cluster_name)
        .expect("a cluster name");
    let container = submitter
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers[0].clone())
        .expect("the submitter container");
    let env = container.env.unwrap_or_default();
    let mode = env.iter().find(|e| e.name == "RAY_AUTH_MODE");
    assert_eq!(mode.and_then(|e| e.value.as_deref()), Some("token"));
    let token = env
        .iter()
        .find(|e| e.name == "RAY_AUTH_TOKEN")
        .expect("RAY_AUTH_TOKEN");
    assert_eq!(token.value, None, "the token itself is never written");
    let reference = token
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .expect("a Secret reference");
    assert_eq!(
        (reference.name.as_str(), reference.key.as_str()),
        (cluster.as_str(), "auth_token")
    );
    // The Secret it names is the one the RayCluster controller made.
    eventually(WAIT, "the cluster's auth Secret", || async {
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(f.client.clone(), &f.ns)
            .get_opt(&cluster)
            .await
            .expect("get Secret")
    })
    .await;

    // The head Service: KubeRay's name, labels and owner, the cluster's ports and selector.
    let head = eventually(WAIT, "authed-head-svc", || service(&f, "authed-head-svc")).await;
    let labels = head.labels();
    assert_eq!(labels["ray.io/originated-from-cr-name"], "authed");
    assert_eq!(labels["ray.io/originated-from-crd"], "RayJob");
    assert_eq!(labels["ray.io/node-type"], "head");
    assert_eq!(labels["ray.io/identifier"], "authed-head");
    let owner = &head.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("RayJob", "authed", Some(true))
    );
    let cluster_head = service(&f, &format!("{cluster}-head-svc"))
        .await
        .expect("the cluster's head Service");
    let ports = |s: &Service| {
        s.spec
            .as_ref()
            .and_then(|s| s.ports.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.name, p.port))
            .collect::<Vec<_>>()
    };
    assert_eq!(ports(&head), ports(&cluster_head));
    assert_eq!(
        head.spec.as_ref().and_then(|s| s.selector.clone()),
        cluster_head.spec.as_ref().and_then(|s| s.selector.clone())
    );
    assert_eq!(selected_cluster(&head).as_deref(), Some(cluster.as_str()));

    // HTTPMode, suspended and resumed: a new cluster, and the same Service now selects it.
    f.apply(&small_job(
        "moving",
        json!({"submissionMode": "HTTPMode", "shutdownAfterJobFinishes": true,
               "entrypoint": "python -c \"import time; time.sleep(4); print('moved')\""}),
    ))
    .await;
    f.wait_for("moving", JobDeploymentStatus::Running, WAIT)
        .await;
    let first = eventually(WAIT, "moving-head-svc", || service(&f, "moving-head-svc")).await;
    let first_cluster = selected_cluster(&first).expect("a selected cluster");
    f.set_suspend("moving", true).await;
    f.wait_for("moving", JobDeploymentStatus::Suspended, WAIT)
        .await;
    f.set_suspend("moving", false).await;
    let done = f
        .wait_for("moving", JobDeploymentStatus::Complete, WAIT)
        .await;
    let second_cluster = done
        .status
        .clone()
        .and_then(|s| s.ray_cluster_name)
        .expect("a cluster");
    assert_ne!(second_cluster, first_cluster, "a new cluster");
    let moved = service(&f, "moving-head-svc")
        .await
        .expect("the head Service");
    assert_eq!(selected_cluster(&moved), Some(second_cluster));
    assert_eq!(moved.uid(), first.uid(), "updated in place, not re-made");
    assert_eq!(
        moved.spec.as_ref().and_then(|s| s.cluster_ip.clone()),
        first.spec.as_ref().and_then(|s| s.cluster_ip.clone())
    );
    assert!(!f.events("UpdatedService").await.is_empty());
    assert_ray_job_succeeded(&done).await;
}
