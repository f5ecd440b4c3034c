//! raypipe under a real Kueue (v0.17, its own control plane with kwok Nodes; see
//! `support::kueue`): a queued ServePipeline's clusters are admitted one by one, a second
//! pipeline waits for quota with Kueue's reason, an upgrade that cannot get quota gives up by
//! itself while the stable version keeps serving real Ray traffic, preemption and resume
//! converge, deletion frees quota, and RayJobs (and a RayCronJob's jobs) wait in the queue.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{EnvVar, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use raypipe::api::raycluster::RayCluster;
use raypipe::api::rayjob::JobDeploymentStatus;
use raypipe::api::servepipeline::ServePipeline;
use raypipe::config::{ControllerKind, ControllerSettings};
use raypipe::kuberay::kueue::{ABANDONED_SPEC_ANNOTATION, PRIORITY_CLASS_LABEL, QUEUE_NAME_LABEL};
use serde_json::{Value, json};

use crate::support::e2e::{self, E2e};
use crate::support::kueue::{self, condition_is};
use crate::support::{self, eventually, fixture};

const WAIT: Duration = Duration::from_secs(240);
/// What one pipeline's cluster asks for: the e2e head (cpu 1, memory 2Gi), no workers.
const ONE_CLUSTER: [(&str, &str); 2] = [("cpu", "1500m"), ("memory", "3Gi")];

fn admitted(p: &ServePipeline) -> Option<raypipe::api::conditions::Condition> {
    e2e::condition(p, "Admitted")
}

/// The pipeline's RayClusters, newest last.
async fn clusters_of(client: &kube::Client, ns: &str) -> Vec<RayCluster> {
    let mut clusters = Api::<RayCluster>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list RayClusters")
        .items;
    clusters.sort_by_key(|c| c.metadata.creation_timestamp.clone().map(|t| t.0));
    clusters
}

async fn pods_of(client: &kube::Client, ns: &str, cluster: &str) -> usize {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("ray.io/cluster={cluster}")))
        .await
        .expect("list Pods")
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .count()
}

/// A queued pipeline in a new namespace whose LocalQueue `team` feeds a ClusterQueue of
/// [`ONE_CLUSTER`]; Ready (so admitted) on return.
async fn queued_pipeline(prefix: &str, extra_labels: Value, spec: Value) -> E2e {
    let client = kueue::client().await;
    let ns = support::namespace(&client, prefix).await;
    kueue::queue(&client, &ns, "team", &ns, &ONE_CLUSTER).await;
    let mut labels = json!({QUEUE_NAME_LABEL: "team"});
    for (k, v) in extra_labels.as_object().cloned().unwrap_or_default() {
        labels[k] = v;
    }
    e2e::ready_pipeline_in(
        client,
        support::ray_head(),
        ns,
        spec,
        labels,
        Default::default(),
    )
    .await
}

/// A RayCluster `urgent` in LocalQueue `team` with the priority class `urgent-high` (cpu 1 and
/// memory 2Gi with its worker): what preempts lower-priority work in a queue of
/// [`ONE_CLUSTER`].
async fn start_urgent_work(client: &kube::Client, ns: &str) {
    let mut urgent = kueue::ray_cluster("urgent", "team", "500m", "1Gi");
    urgent
        .labels_mut()
        .insert(PRIORITY_CLASS_LABEL.to_owned(), "urgent-high".to_owned());
    kueue::ray_clusters(client, ns)
        .create(&PostParams::default(), &urgent)
        .await
        .expect("create the urgent cluster");
}

/// What Kueue and the controllers hold in `ns`, for a failure message: each Workload with its
/// priority and conditions, the RayServices' suspend, each RayCluster's suspend and Pods.
async fn queue_state(client: &kube::Client, ns: &str) -> String {
    let mut out = String::new();
    let workloads = kueue::workload_api(client, ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for w in workloads {
        let conditions: Vec<String> = w.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                format!(
                    "{}={} ({}: {})",
                    c["type"], c["status"], c["reason"], c["message"]
                )
            })
            .collect();
        out.push_str(&format!(
            "Workload {} owner {} priority {} {}: {}\n",
            w.name_any(),
            w.metadata
                .owner_references
                .as_ref()
                .and_then(|o| o.first())
                .map(|o| format!("{}/{}", o.kind, o.name))
                .unwrap_or_default(),
            w.data["spec"]["priorityClassName"],
            w.data["spec"]["priority"],
            conditions.join("; ")
        ));
    }
    let services = Api::<raypipe::api::rayservice::RayService>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for rs in services {
        out.push_str(&format!(
            "RayService {} suspend {:?} labels {:?} status {:?} conditions {:?}\n",
            rs.name_any(),
            rs.spec.ray_cluster_config.suspend,
            rs.labels(),
            rs.status.as_ref().map(|s| (
                &s.service_status,
                s.active_service_status
                    .as_ref()
                    .map(|a| &a.ray_cluster_name),
                s.pending_service_status
                    .as_ref()
                    .map(|a| &a.ray_cluster_name)
            )),
            rs.status.as_ref().map(|s| s
                .conditions
                .iter()
                .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                .collect::<Vec<_>>())
        ));
    }
    for c in clusters_of(client, ns).await {
        let pods = pods_of(client, ns, &c.name_any()).await;
        out.push_str(&format!(
            "RayCluster {} suspend {:?} pods {pods} labels {:?} written by {:?}\n",
            c.name_any(),
            c.spec.suspend,
            c.labels(),
            c.managed_fields()
                .iter()
                .map(|f| format!(
                    "{:?} {:?} {:?}",
                    f.manager,
                    f.operation,
                    f.time.as_ref().map(|t| t.0)
                ))
                .collect::<Vec<_>>()
        ));
    }
    out
}

/// Waits until the pipeline's `Admitted` condition satisfies `accept`; returns the pipeline.
async fn admitted_where(
    e2e: &E2e,
    name: &str,
    what: &str,
    accept: impl Fn(&raypipe::api::conditions::Condition) -> bool,
) -> ServePipeline {
    eventually(WAIT, what, || {
        let accept = &accept;
        async move {
            let p = e2e.pipelines.get(name).await.ok()?;
            admitted(&p).filter(|c| accept(c)).map(|_| p)
        }
    })
    .await
}

#[tokio::test]
async fn a_queued_pipeline_gives_up_an_unadmitted_upgrade_is_preempted_and_resumed_and_frees_its_quota()
 {
    let _serve = support::ray_serve_lock().await;
    let client = kueue::client().await;
    kueue::workload_priority_class(&client, "serving-low", 100).await;
    kueue::workload_priority_class(&client, "urgent-high", 1000).await;
    let e2e = queued_pipeline(
        "kueue-serve",
        json!({PRIORITY_CLASS_LABEL: "serving-low"}),
        json!({"rollout": {"strategy": "Immediate", "progressDeadline": "20s"}}),
    )
    .await;
    let (client, ns) = (e2e.client.clone(), e2e.namespace.clone());

    // Serving: its one cluster is admitted by Kueue, and the condition says so.
    let p = admitted_where(&e2e, e2e::PIPELINE, "the pipeline Admitted", |c| {
        c.status == "True"
    })
    .await;
    assert_eq!(admitted(&p).unwrap().reason, "Admitted");
    let serving = clusters_of(&client, &ns).await;
    let [serving] = &serving[..] else {
        panic!("one cluster: {serving:?}")
    };
    let serving_name = serving.name_any();
    assert_eq!(serving.labels()[QUEUE_NAME_LABEL], "team");
    let workload = kueue::workload_of(&client, &ns, "RayCluster", &serving_name)
        .await
        .expect("the serving cluster's Workload");
    assert!(condition_is(&workload, "Admitted", "True"), "{workload}");
    let rs = e2e.rayservices.get(e2e::PIPELINE).await.unwrap();
    assert!(
        !rs.labels().contains_key(QUEUE_NAME_LABEL),
        "the RayService is not queued itself"
    );

    // A cluster change needs a second cluster, and the queue has no quota for it: the upgrade
    // waits for admission (the stable version serving meanwhile), then gives up by itself.
    let traffic = e2e::Client::start(e2e.url.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut changed = e2e.pipeline().await;
    let head = &mut changed.spec.ray_cluster_config.head_group_spec.template;
    head.spec.as_mut().unwrap().containers[0]
        .env
        .get_or_insert_with(Vec::new)
        .push(EnvVar {
            name: "MODEL_CACHE".into(),
            value: Some("/tmp/cache".into()),
            value_from: None,
        });
    let changed_at = Instant::now();
    e2e.pipelines
        .replace(e2e::PIPELINE, &PostParams::default(), &changed)
        .await
        .expect("change the cluster");
    // (Until Kueue made the new cluster's Workload the reason is `NoWorkload`.)
    let waiting = admitted_where(&e2e, e2e::PIPELINE, "the upgrade waiting for quota", |c| {
        c.status == "False" && c.message.contains("keeps serving") && c.reason != "NoWorkload"
    })
    .await;
    let waiting = admitted(&waiting).unwrap();
    eprintln!("kueue: {}: {}", waiting.reason, waiting.message);
    assert_eq!(waiting.reason, "Pending", "Kueue's own reason");
    let upgrade_name = eventually(WAIT, "the upgrade's cluster, suspended", || {
        let (client, ns, serving_name) = (&client, &ns, &serving_name);
        async move {
            clusters_of(client, ns)
                .await
                .into_iter()
                .find(|c| c.name_any() != *serving_name && c.spec.suspend == Some(true))
                .map(|c| c.name_any())
        }
    })
    .await;
    assert_eq!(pods_of(&client, &ns, &upgrade_name).await, 0);
    let given_up_at = eventually(WAIT, "the unadmitted upgrade given up", || {
        let (client, ns) = (&client, &ns);
        async move {
            (!fixture::events_with_reason(client, ns, "UpgradeNotAdmitted")
                .await
                .is_empty())
            .then(Instant::now)
        }
    })
    .await;
    eventually(WAIT, "the upgrade's cluster deleted", || {
        let (client, ns, upgrade_name) = (&client, &ns, &upgrade_name);
        async move {
            (!clusters_of(client, ns)
                .await
                .iter()
                .any(|c| c.name_any() == *upgrade_name))
            .then_some(())
        }
    })
    .await;
    let rs = e2e.rayservices.get(e2e::PIPELINE).await.unwrap();
    assert!(rs.annotations().contains_key(ABANDONED_SPEC_ANNOTATION));
    let status = rs.status.clone().unwrap_or_default();
    assert_eq!(
        fixture::active_cluster_name(&status).as_deref(),
        Some(serving_name.as_str())
    );
    assert!(
        status
            .pending_service_status
            .as_ref()
            .and_then(|p| p.ray_cluster_name.as_ref())
            .is_none()
    );
    // It is not tried again, and the condition is back to the serving cluster's admission.
    admitted_where(&e2e, e2e::PIPELINE, "Admitted again", |c| {
        c.status == "True"
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(clusters_of(&client, &ns).await.len(), 1, "no new attempt");
    let (ok, failed) = traffic.stop().await;
    eprintln!(
        "kueue: upgrade given up {:.0}s after the change; traffic ok={ok} failed={failed}",
        given_up_at.duration_since(changed_at).as_secs_f64()
    );
    assert!(ok > 0, "requests were answered");
    assert_eq!(failed, 0, "the stable version served every request");

    // A higher-priority cluster needs the whole quota: Kueue preempts the pipeline's.
    start_urgent_work(&client, &ns).await;
    let p = admitted_where(&e2e, e2e::PIPELINE, "the pipeline preempted", |c| {
        c.status == "False"
    })
    .await;
    let condition = admitted(&p).unwrap();
    eprintln!("kueue: {}: {}", condition.reason, condition.message);
    assert_eq!(condition.reason, "Preempted", "{condition:?}");
    eventually(WAIT, "the preempted cluster's Pods gone", || {
        let (client, ns, serving) = (&client, &ns, &serving_name);
        async move {
            let cluster = Api::<RayCluster>::namespaced(client.clone(), ns)
                .get(serving)
                .await
                .ok()?;
            (cluster.spec.suspend == Some(true) && pods_of(client, ns, serving).await == 0)
                .then_some(())
        }
    })
    .await;
    eventually(WAIT, "a preempted pipeline not Ready", || {
        let e2e = &e2e;
        async move { (!e2e::is_true(&e2e.pipeline().await, "Ready")).then_some(()) }
    })
    .await;

    // The urgent work ends: the same cluster is admitted again and serves again.
    kueue::ray_clusters(&client, &ns)
        .delete("urgent", &DeleteParams::default())
        .await
        .expect("delete the urgent cluster");
    admitted_where(&e2e, e2e::PIPELINE, "admitted again", |c| {
        c.status == "True"
    })
    .await;
    eventually(WAIT, "the pipeline Ready again", || {
        let e2e = &e2e;
        async move { e2e::is_true(&e2e.pipeline().await, "Ready").then_some(()) }
    })
    .await;
    assert_eq!(
        clusters_of(&client, &ns)
            .await
            .iter()
            .filter(|c| c.name_any() != "urgent")
            .map(|c| c.name_any())
            .collect::<Vec<_>>(),
        std::slice::from_ref(&serving_name),
        "resumed in place, not replaced"
    );

    // A second pipeline in the same queue waits, with Kueue's reason and no Pod.
    let second = fixture::serving_pipeline(
        "second",
        fixture::token_source(
            &e2e.registry.url(e2e::GRAPH_PATH),
            json!({"refreshInterval": "1s"}),
        ),
        "/second",
        json!({"name": "ray-head", "image": "rayproject/ray:2.60.0",
            "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}),
    );
    let mut second = serde_json::to_value(&second).unwrap();
    second["metadata"]["labels"] = json!({QUEUE_NAME_LABEL: "team"});
    let second: ServePipeline = serde_json::from_value(second).unwrap();
    e2e.pipelines
        .create(&PostParams::default(), &second)
        .await
        .expect("create the second pipeline");
    let p = admitted_where(&e2e, "second", "the second pipeline waiting", |c| {
        c.status == "False" && c.reason != "NoWorkload"
    })
    .await;
    let condition = admitted(&p).unwrap();
    assert_eq!(condition.reason, "Pending", "{condition:?}");
    assert!(
        condition
            .message
            .starts_with("waiting for quota in LocalQueue team"),
        "{condition:?}"
    );
    let second_cluster = clusters_of(&client, &ns)
        .await
        .into_iter()
        .find(|c| c.name_any().starts_with("second"))
        .expect("the second pipeline's cluster");
    assert_eq!(second_cluster.spec.suspend, Some(true));
    assert_eq!(pods_of(&client, &ns, &second_cluster.name_any()).await, 0);

    // Deleting the first pipeline frees its quota: the second is admitted.
    e2e.pipelines
        .delete(e2e::PIPELINE, &DeleteParams::foreground())
        .await
        .expect("delete the first pipeline");
    admitted_where(&e2e, "second", "the second pipeline admitted", |c| {
        c.status == "True"
    })
    .await;
    let cluster = Api::<RayCluster>::namespaced(client.clone(), &ns)
        .get(&second_cluster.name_any())
        .await
        .unwrap();
    assert_eq!(cluster.spec.suspend, Some(false), "Kueue resumed it");
    eventually(WAIT, "the second cluster's head Pod", || {
        let (client, ns, name) = (&client, &ns, second_cluster.name_any());
        async move { (pods_of(client, ns, &name).await > 0).then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn a_queued_rayservice_is_admitted_as_a_whole_and_its_cluster_follows_kueue_both_ways() {
    let _serve = support::ray_serve_lock().await;
    let client = kueue::client().await;
    kueue::workload_priority_class(&client, "serving-low", 100).await;
    kueue::workload_priority_class(&client, "urgent-high", 1000).await;
    let fx =
        crate::rayservice::fixture_on(client.clone(), "kueue-rs", vec![support::ray_head()]).await;
    let ns = fx.ns.clone();
    // The echo service asks for cpu 2 and memory 3Gi (head and one worker).
    kueue::queue(
        &client,
        &ns,
        "team",
        &ns,
        &[("cpu", "2500m"), ("memory", "4Gi")],
    )
    .await;
    let mut service = crate::rayservice::echo_service("echo", "hello", "rayproject/ray:2.60.0");
    service["metadata"]["labels"] =
        json!({QUEUE_NAME_LABEL: "team", PRIORITY_CLASS_LABEL: "serving-low"});
    let service: raypipe::api::rayservice::RayService = serde_json::from_value(service).unwrap();
    let services: Api<raypipe::api::rayservice::RayService> = Api::namespaced(client.clone(), &ns);
    let created = services
        .create(&PostParams::default(), &service)
        .await
        .expect("create the RayService");
    assert_eq!(
        created.spec.ray_cluster_config.suspend,
        Some(true),
        "Kueue's webhook gates the RayService through rayClusterConfig.suspend"
    );
    let cluster_where = |what: &'static str, accept: fn(&RayCluster, usize) -> bool| {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            // Waits without `eventually`'s panic, so a timeout can say what Kueue and the
            // controllers left behind.
            let waited = tokio::time::timeout(
                WAIT,
                eventually(WAIT * 2, what, || {
                    let (client, ns) = (&client, &ns);
                    async move {
                        let cluster = clusters_of(client, ns)
                            .await
                            .into_iter()
                            .find(|c| c.name_any().starts_with("echo-"))?;
                        let pods = pods_of(client, ns, &cluster.name_any()).await;
                        accept(&cluster, pods).then_some(cluster.name_any())
                    }
                }),
            )
            .await;
            match waited {
                Ok(name) => name,
                Err(_) => panic!(
                    "timed out after {WAIT:?} waiting for {what}:\n{}",
                    queue_state(&client, &ns).await
                ),
            }
        }
    };
    // Admitted: the cluster made before admission (suspended) is resumed.
    let name = cluster_where(
        "the RayService's cluster resumed on admission",
        |c, pods| c.spec.suspend == Some(false) && pods > 0,
    )
    .await;
    let workload = kueue::workload_of(&client, &ns, "RayService", "echo")
        .await
        .expect("the RayService's Workload");
    assert!(condition_is(&workload, "Admitted", "True"), "{workload}");
    // Serving from that cluster (it is the active one) before anything preempts it.
    eventually(WAIT, "the RayService serving from its cluster", || {
        let (services, name) = (&services, &name);
        async move {
            let rs = services.get("echo").await.ok()?;
            let active = rs.status?.active_service_status?.ray_cluster_name?;
            (active == *name).then_some(())
        }
    })
    .await;

    // Preempted by higher-priority work: the cluster follows, its Pods go.
    start_urgent_work(&client, &ns).await;
    let preempted = cluster_where("the cluster suspended on preemption", |c, pods| {
        c.spec.suspend == Some(true) && pods == 0
    })
    .await;
    assert_eq!(preempted, name);

    // Quota back: the same cluster resumes.
    kueue::ray_clusters(&client, &ns)
        .delete("urgent", &DeleteParams::default())
        .await
        .expect("delete the urgent cluster");
    let resumed = cluster_where("the cluster resumed", |c, pods| {
        c.spec.suspend == Some(false) && pods > 0
    })
    .await;
    assert_eq!(resumed, name, "the same cluster, never replaced");
    assert_eq!(
        clusters_of(&client, &ns)
            .await
            .iter()
            .filter(|c| c.name_any().starts_with("echo-"))
            .count(),
        1
    );
}

#[tokio::test]
async fn rayjobs_and_a_raycronjobs_jobs_wait_in_the_queue_until_admitted() {
    let client = kueue::client().await;
    let ns = support::namespace(&client, "kueue-jobs").await;
    // No quota yet: nothing is admitted.
    kueue::queue(&client, &ns, "batch", &ns, &[("cpu", "0"), ("memory", "0")]).await;
    let settings = ControllerSettings {
        namespaces: vec![ns.clone()],
        ..ControllerSettings::new(&[ControllerKind::Raycluster, ControllerKind::Rayjob])
    };
    let _operator = e2e::Operator::start(client.clone(), settings);
    // The RayCronJob controller on a clock 60 times faster: a `* * * * *` job within seconds.
    let mut stop_cron = fixture::Stopper::default();
    tokio::spawn(raypipe::controllers::raycronjob::run(
        client.clone(),
        raypipe::controllers::raycronjob::Config {
            namespace: Some(ns.clone()),
            clock: std::sync::Arc::new(raypipe::controllers::raycronjob::FastClock::new(
                k8s_openapi::jiff::Timestamp::now(),
                60,
            )),
            ..Default::default()
        },
        stop_cron.signal(),
    ));
    let container = json!({"name": "ray-head", "image": "rayproject/ray:2.60.0",
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}});
    let job_spec = json!({
        "entrypoint": "python -c 'print(1)'",
        "shutdownAfterJobFinishes": true,
        "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {},
            "template": {"spec": {"containers": [container]}}}}
    });
    let job: raypipe::api::rayjob::RayJob = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": "train", "labels": {QUEUE_NAME_LABEL: "batch"}},
        "spec": job_spec
    }))
    .unwrap();
    let jobs: Api<raypipe::api::rayjob::RayJob> = Api::namespaced(client.clone(), &ns);
    let created = jobs
        .create(&PostParams::default(), &job)
        .await
        .expect("create the RayJob");
    assert_eq!(
        created.spec.suspend,
        Some(true),
        "Kueue's webhook suspends a queued RayJob"
    );
    let cron: raypipe::api::raycronjob::RayCronJob = serde_json::from_value(json!({
        "apiVersion": "ray.io/v1", "kind": "RayCronJob",
        "metadata": {"name": "nightly", "labels": {QUEUE_NAME_LABEL: "batch"}},
        "spec": {"schedule": "* * * * *", "jobTemplate": job_spec}
    }))
    .unwrap();
    Api::<raypipe::api::raycronjob::RayCronJob>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cron)
        .await
        .expect("create the RayCronJob");

    // Waiting: Suspended, no cluster, Kueue's Workload pending.
    eventually(WAIT, "the RayJob Suspended", || {
        let jobs = &jobs;
        async move {
            let job = jobs.get("train").await.ok()?;
            let status = job.status?;
            (status.job_deployment_status == Some(JobDeploymentStatus::Suspended)).then_some(())
        }
    })
    .await;
    let workload = kueue::workload_where(&client, &ns, "RayJob", "train", "pending", |w| {
        condition_is(w, "QuotaReserved", "False")
    })
    .await;
    assert!(!condition_is(&workload, "Admitted", "True"));
    // The cron's job carries the queue label, so Kueue holds it too.
    let cron_job = eventually(WAIT, "the RayCronJob's job", || {
        let jobs = &jobs;
        async move {
            jobs.list(&ListParams::default().labels("ray.io/cronjob-name=nightly"))
                .await
                .ok()?
                .items
                .into_iter()
                .next()
        }
    })
    .await;
    // One is enough (its clock ticks every second): the cron is suspended from here on.
    Api::<raypipe::api::raycronjob::RayCronJob>::namespaced(client.clone(), &ns)
        .patch(
            "nightly",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .expect("suspend the cron");
    assert_eq!(cron_job.labels()[QUEUE_NAME_LABEL], "batch");
    assert_eq!(
        cron_job.spec.suspend,
        Some(true),
        "Kueue holds the cron's job too"
    );
    assert!(
        clusters_of(&client, &ns).await.is_empty(),
        "no cluster before admission"
    );

    // Quota arrives: both are admitted, and their clusters made.
    kueue::set_quota(&client, &ns, &[("cpu", "8"), ("memory", "16Gi")]).await;
    for job in ["train".to_owned(), cron_job.name_any()] {
        eventually(
            WAIT,
            &format!("RayJob {job} admitted and its cluster made"),
            || {
                let (client, ns, jobs, job) = (&client, &ns, &jobs, &job);
                async move {
                    let found = jobs.get(job).await.ok()?;
                    let workload = kueue::workload_of(client, ns, "RayJob", job).await?;
                    // Kueue clears `suspend` on admission (false is omitted).
                    (found.spec.suspend != Some(true)
                        && condition_is(&workload, "QuotaReserved", "True")
                        && found.status?.ray_cluster_name.is_some())
                    .then_some(())
                }
            },
        )
        .await;
    }

    // Deleting the jobs frees the quota: no admitted Workload remains.
    jobs.delete_collection(&DeleteParams::foreground(), &ListParams::default())
        .await
        .expect("delete the jobs");
    Api::<raypipe::api::raycronjob::RayCronJob>::namespaced(client.clone(), &ns)
        .delete("nightly", &DeleteParams::default())
        .await
        .expect("delete the cron");
    eventually(WAIT, "no admitted Workload left", || {
        let (client, ns) = (&client, &ns);
        async move {
            let left = kueue::workloads(client, ns).await;
            (!left.iter().any(|w| {
                condition_is(w, "Admitted", "True") && !condition_is(w, "Finished", "True")
            }))
            .then_some(())
        }
    })
    .await;
}

/// One benchmark run: queued, seconds to admission, to a running head Pod, to `Ready`.
type Row = (bool, Option<f64>, Option<f64>, f64);

/// Benchmark (run with `--ignored`; results in BENCHMARKS.md): from a ServePipeline's creation
/// to its first answer's readiness (`Ready`), in a Kueue queue and outside one, alternating in
/// one run, three times each. For the queued one also when Kueue admitted its cluster (its
/// Workload's `Admitted`) and when the head Pod ran, polled every 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; results in BENCHMARKS.md"]
async fn bench_admission_to_serving() {
    let head = support::ray_head();
    let _serve = support::ray_serve_lock().await;
    let dashboard = head.client(Duration::from_secs(10)).unwrap();
    let mut rows: Vec<Row> = Vec::new();
    for _round in 0..3 {
        for queued in [false, true] {
            let client = kueue::client().await;
            let ns = support::namespace(&client, "bench-admission").await;
            kueue::queue(&client, &ns, "team", &ns, &ONE_CLUSTER).await;
            let labels = if queued {
                json!({QUEUE_NAME_LABEL: "team"})
            } else {
                json!({})
            };
            let started = Instant::now();
            let marks = tokio::spawn(first_admission_and_pod(client.clone(), ns.clone()));
            let e2e =
                e2e::ready_pipeline_in(client, head, ns, json!({}), labels, Default::default())
                    .await;
            let ready = started.elapsed().as_secs_f64();
            let (admitted, running) = marks.await.expect("the poller");
            let since = |t: Option<Instant>| t.map(|t| t.duration_since(started).as_secs_f64());
            rows.push((queued, since(admitted), since(running), ready));
            drop(e2e);
            tokio::time::sleep(Duration::from_secs(2)).await;
            dashboard
                .delete_serve_applications()
                .await
                .expect("DELETE serve applications");
        }
    }
    eprintln!("queued  admitted_s  head_pod_running_s  ready_s");
    for (queued, admitted, running, ready) in &rows {
        let show = |v: &Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
        eprintln!(
            "{queued:<6}  {:>10}  {:>18}  {ready:>7.2}",
            show(admitted),
            show(running)
        );
    }
    let median = |queued: bool, pick: fn(&Row) -> Option<f64>| {
        let mut values: Vec<f64> = rows
            .iter()
            .filter(|r| r.0 == queued)
            .filter_map(pick)
            .collect();
        values.sort_by(|a, b| a.total_cmp(b));
        values.get(values.len() / 2).copied()
    };
    for queued in [false, true] {
        eprintln!(
            "median queued={queued}: admitted {:?} s, head Pod running {:?} s, Ready {:?} s",
            median(queued, |r| r.1),
            median(queued, |r| r.2),
            median(queued, |r| Some(r.3)),
        );
    }
}

/// When (first seen) a RayCluster's Workload in `ns` was admitted, and a head Pod ran.
async fn first_admission_and_pod(
    client: kube::Client,
    ns: String,
) -> (Option<Instant>, Option<Instant>) {
    let (mut admitted, mut running) = (None, None);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let until = Instant::now() + WAIT;
    while running.is_none() && Instant::now() < until {
        if admitted.is_none()
            && kueue::workloads(&client, &ns)
                .await
                .iter()
                .any(|w| condition_is(w, "Admitted", "True"))
        {
            admitted = Some(Instant::now());
        }
        let heads = pods
            .list(&ListParams::default().labels("ray.io/node-type=head"))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        if heads
            .iter()
            .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        {
            running = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (admitted, running)
}
