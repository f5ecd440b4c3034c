//! Pure builders for what a RayJob creates: its RayCluster, its head Service
//! `<rayjob>-head-svc`, the submitter Job (K8sJobMode) or container (SidecarMode) with the
//! cluster's token-auth environment, the `ray job submit` command and the HTTPMode submission.
//! No client: the same RayJob always builds the same objects.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, PodSpec, PodTemplateSpec, ResourceRequirements, Service,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::DynamicObject;

use super::error::Error;
use crate::api::RayCluster;
use crate::api::rayjob::{JobSubmissionMode, RayJob};
use crate::controllers::raycluster::builders::batch_scheduler::{self, BatchScheduler};
use crate::controllers::raycluster::builders::{BuildError, BuildOptions, pod::env_vars, service};
use crate::kuberay::keys::{annotations, labels, ports};
use crate::kuberay::names;
use crate::kuberay::spec::auth_enabled;
use crate::ray::JobSubmitRequest;
use crate::validation::pod::ray_container;
use crate::validation::rayjob::RayJobValues;

/// Label on the RayCluster made for a RayJob: the submission mode.
pub const JOB_SUBMISSION_MODE_LABEL: &str = "ray.io/job-submission-mode";
/// The submitter container's name (K8sJobMode Job and SidecarMode head container).
pub const SUBMITTER_CONTAINER: &str = "ray-job-submitter";
/// KubeRay's default number of retries of the submitter Job.
pub const DEFAULT_SUBMITTER_BACKOFF_LIMIT: i32 = 2;
/// Value of `ray.io/originated-from-crd` on everything a RayJob creates.
pub const ORIGINATED_FROM_RAYJOB: &str = "RayJob";

/// The submission mode, defaulted as the API server does (for the passes that run whether or
/// not the RayJob is valid; the others read `RayJobValues::mode`).
pub fn mode(job: &RayJob) -> JobSubmissionMode {
    crate::validation::rayjob::submission_mode(&job.spec)
}

/// The mode as written in the API (`HTTPMode`, …).
pub fn mode_str(mode: JobSubmissionMode) -> &'static str {
    match mode {
        JobSubmissionMode::K8sJobMode => "K8sJobMode",
        JobSubmissionMode::HttpMode => "HTTPMode",
        JobSubmissionMode::InteractiveMode => "InteractiveMode",
        JobSubmissionMode::SidecarMode => "SidecarMode",
    }
}

/// The cluster named by `clusterSelector` (`ray.io/cluster`), if the RayJob uses one (for
/// the passes that run whether or not the RayJob is valid, such as its deletion).
pub fn selected_cluster(job: &RayJob) -> Option<&str> {
    crate::validation::rayjob::selected_cluster(&job.spec)
}

/// `<rayjob>-<5 random>` through checkName, as KubeRay names generated clusters and job ids.
pub fn generated_name(job: &RayJob, suffix: &str) -> String {
    names::check_name(&format!("{}-{suffix}", job.name_any()))
}

/// The labels every object made for `job` carries.
fn origin_labels(job: &RayJob) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::ORIGINATED_FROM_CR_NAME.to_owned(), job.name_any()),
        (
            labels::ORIGINATED_FROM_CRD.to_owned(),
            ORIGINATED_FROM_RAYJOB.to_owned(),
        ),
    ])
}

/// The RayCluster for `job` (§3.3): a copy of `rayClusterSpec`, the RayJob's labels and
/// annotations plus the origin labels, owned by the RayJob. SidecarMode adds the submitter
/// container to the head and forbids head restarts.
pub fn ray_cluster(
    job: &RayJob,
    values: &RayJobValues,
    name: &str,
    job_id: &str,
) -> Result<RayCluster, Error> {
    let spec = job
        .spec
        .ray_cluster_spec
        .clone()
        .ok_or_else(|| Error::Invalid("the RayJob has no rayClusterSpec".into()))?;
    let mut cluster_labels = job.labels().clone();
    cluster_labels.extend(origin_labels(job));
    cluster_labels.insert(
        JOB_SUBMISSION_MODE_LABEL.to_owned(),
        mode_str(values.mode).to_owned(),
    );
    let mut cluster_annotations = job.annotations().clone();
    // kubectl's copy of the RayJob is no description of the cluster.
    cluster_annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    let mut cluster = RayCluster::new(name, spec);
    if values.mode == JobSubmissionMode::SidecarMode {
        cluster_annotations.insert(
            annotations::DISABLE_PROVISIONED_HEAD_RESTART.to_owned(),
            "true".to_owned(),
        );
        let container = sidecar_container(job, values, &cluster, job_id)?;
        let head = cluster
            .spec
            .head_group_spec
            .template
            .spec
            .get_or_insert_with(Default::default);
        head.containers.push(container);
        head.restart_policy = Some("Never".to_owned());
    }
    cluster.metadata = ObjectMeta {
        name: Some(name.to_owned()),
        namespace: job.namespace(),
        labels: Some(cluster_labels),
        annotations: (!cluster_annotations.is_empty()).then_some(cluster_annotations),
        owner_references: Some(vec![crate::k8s::controller_owner_ref(job)?]),
        ..Default::default()
    };
    Ok(cluster)
}

/// The submitter Pod's spec as the batch scheduler sizes it: the user's template, else the
/// default submitter container (the head's image, KubeRay's default resources).
fn submitter_spec(job: &RayJob) -> Option<PodSpec> {
    if let Some(template) = &job.spec.submitter_pod_template {
        return template.spec.clone();
    }
    let head_image = job
        .spec
        .ray_cluster_spec
        .as_ref()
        .and_then(|spec| ray_container(&spec.head_group_spec.template))
        .and_then(|c| c.image.clone());
    Some(PodSpec {
        containers: vec![Container {
            name: SUBMITTER_CONTAINER.to_owned(),
            image: head_image,
            resources: Some(default_resources()),
            ..Default::default()
        }],
        restart_policy: Some("Never".to_owned()),
        ..Default::default()
    })
}

/// What the batch scheduler is told of the RayJob as the parent of its cluster and submitter.
fn with_job_as_parent<T>(job: &RayJob, f: impl FnOnce(&batch_scheduler::Parent<'_>) -> T) -> T {
    let task_groups = || {
        let spec = job.spec.ray_cluster_spec.clone().unwrap_or_default();
        batch_scheduler::task_groups_json(&batch_scheduler::job_task_groups(
            &spec,
            submitter_spec(job).as_ref(),
        ))
    };
    f(&batch_scheduler::Parent {
        meta: &job.metadata,
        task_groups: &task_groups,
    })
}

/// KubeRay's batch scheduler metadata on the RayCluster of a K8sJobMode RayJob (labels and
/// annotations from the job; the cluster's own Pods then follow them). Other modes: none.
pub fn add_scheduler_metadata_to_cluster(
    job: &RayJob,
    mode: JobSubmissionMode,
    scheduler: BatchScheduler,
    cluster: &mut RayCluster,
) {
    if mode != JobSubmissionMode::K8sJobMode {
        return;
    }
    with_job_as_parent(job, |parent| {
        let child = batch_scheduler::Child {
            meta: &mut cluster.metadata,
            pod_spec: None,
        };
        // A cluster holds several task groups: it names none.
        batch_scheduler::add_child_metadata(scheduler, parent, child, "");
    });
}

/// KubeRay's batch scheduler metadata on the submitter Job's Pod template
/// (`submittergroup`).
pub fn add_scheduler_metadata_to_submitter(
    job: &RayJob,
    scheduler: BatchScheduler,
    submitter: &mut Job,
) {
    let Some(template) = submitter.spec.as_mut().map(|s| &mut s.template) else {
        return;
    };
    let meta = template.metadata.get_or_insert_with(Default::default);
    with_job_as_parent(job, |parent| {
        let child = batch_scheduler::Child {
            meta,
            pod_spec: template.spec.as_mut(),
        };
        batch_scheduler::add_child_metadata(
            scheduler,
            parent,
            child,
            batch_scheduler::SUBMITTER_GROUP,
        );
    });
}

/// Volcano's PodGroup for a RayJob, `ray-<rayjob>-pg`: the cluster's gang, with the
/// submitter's resources added (its Pod in K8sJobMode, its container in SidecarMode). A RayJob
/// on a selected cluster cannot be gang-scheduled, as in KubeRay.
pub fn volcano_pod_group(job: &RayJob, mode: JobSubmissionMode) -> Result<DynamicObject, Error> {
    let Some(cluster_spec) = &job.spec.ray_cluster_spec else {
        return Err(Error::Invalid(format!(
            "gang scheduling does not support RayJob {}/{} referencing an existing RayCluster",
            job.namespace().unwrap_or_default(),
            job.name_any()
        )));
    };
    let (members, mut resources) = batch_scheduler::gang_size(cluster_spec);
    let submitter = match mode {
        JobSubmissionMode::K8sJobMode => {
            batch_scheduler::pod_resources(submitter_spec(job).as_ref())
        }
        JobSubmissionMode::SidecarMode => batch_scheduler::pod_resources(Some(&PodSpec {
            containers: vec![Container {
                resources: Some(default_resources()),
                ..Default::default()
            }],
            ..Default::default()
        })),
        JobSubmissionMode::HttpMode | JobSubmissionMode::InteractiveMode => Default::default(),
    };
    batch_scheduler::add_resources(&mut resources, &submitter, 1);
    let owner = crate::k8s::controller_owner_ref(job)?;
    batch_scheduler::volcano_pod_group(&job.metadata, owner, members, &resources)
        .map_err(|e| Error::Invalid(e.to_string()))
}

/// Volcano's PodGroup for a RayJob that finished or was suspended: only what its cluster still
/// holds (nothing once the cluster is gone or going), so the queue gets the rest back.
pub fn released_volcano_pod_group(
    job: &RayJob,
    cluster: Option<&RayCluster>,
) -> Result<DynamicObject, Error> {
    let (members, resources) = cluster
        .map(|c| batch_scheduler::gang_size(&c.spec))
        .unwrap_or_default();
    let owner = crate::k8s::controller_owner_ref(job)?;
    batch_scheduler::volcano_pod_group(&job.metadata, owner, members, &resources)
        .map_err(|e| Error::Invalid(e.to_string()))
}

/// `host:port` of the cluster's dashboard, as KubeRay writes `status.dashboardURL`.
pub fn dashboard_url(service: &str, namespace: &str, domain: &str, port: u16) -> String {
    format!("{service}.{namespace}.svc.{domain}:{port}")
}

/// The HTTPMode submission (§8): zero or empty fields are left out.
pub fn submit_request(job: &RayJob, values: &RayJobValues, job_id: &str) -> JobSubmitRequest {
    let entrypoint = job.spec.entrypoint.clone().unwrap_or_default();
    JobSubmitRequest {
        entrypoint,
        submission_id: Some(job_id.to_owned()),
        runtime_env: values.runtime_env.clone(),
        metadata: job.spec.metadata.clone().filter(|m| !m.is_empty()),
        entrypoint_num_cpus: job.spec.entrypoint_num_cpus.filter(|n| *n > 0.0),
        entrypoint_num_gpus: job.spec.entrypoint_num_gpus.filter(|n| *n > 0.0),
        entrypoint_memory: None,
        entrypoint_resources: values
            .entrypoint_resources
            .clone()
            .filter(|r| !r.is_empty()),
    }
}

/// Go's `strconv.Quote` for the ASCII JSON the command carries.
fn go_quote(s: &str) -> String {
    // serde_json escapes `"` and `\` and control characters the way Go does for ASCII input.
    serde_json::to_string(s).unwrap_or_default()
}

/// The dashboard port named `dashboard` on the head's Ray container (default 8265).
fn head_dashboard_port(cluster: &RayCluster) -> i32 {
    ray_container(&cluster.spec.head_group_spec.template)
        .and_then(|c| c.ports.as_ref())
        .and_then(|ps| {
            ps.iter()
                .find(|p| p.name.as_deref() == Some(ports::DASHBOARD_NAME))
        })
        .map_or(ports::DASHBOARD, |p| p.container_port)
}

/// The RayJob's head Service `<rayjob>-head-svc` (KubeRay makes one for a cluster the RayJob
/// creates, none for a selected cluster): the cluster's head Service under the RayJob's name
/// and labels, controlled by the RayJob; its selector names the RayJob's current cluster.
pub fn head_service(
    job: &RayJob,
    cluster: &RayCluster,
    options: &BuildOptions,
) -> Result<Service, Error> {
    service::owner_head_service(job, ORIGINATED_FROM_RAYJOB, cluster, options).map_err(
        |e| match e {
            BuildError::Owner(e) => Error::K8s(e),
            other => Error::Invalid(other.to_string()),
        },
    )
}

/// The cluster's token-auth environment on a submitter container when the cluster uses token
/// auth (as KubeRay does): `RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN` from the cluster's token
/// Secret, by reference only, so the token never enters the RayJob's objects or logs.
fn add_token_auth_env(container: &mut Container, cluster: &RayCluster) {
    if auth_enabled(&cluster.spec) {
        env_vars::set_token_auth_env(
            &cluster.name_any(),
            container,
            cluster.spec.auth_options.as_ref(),
        );
    }
}

/// The submitter's shell command (§3.4), one string for `/bin/bash -ce --`.
pub fn submit_command(
    job: &RayJob,
    values: &RayJobValues,
    submission_mode: JobSubmissionMode,
    address: &str,
    health_url: &str,
    job_id: &str,
) -> Result<String, Error> {
    let check_status = submission_mode == JobSubmissionMode::K8sJobMode;
    let mut cmd: Vec<String> = vec![
        "until".into(),
        format!(
            "python -c \"import sys, urllib.request; r=urllib.request.urlopen(sys.argv[1], timeout=10); exit(0 if b'success' in r.read() else 1)\" \"{health_url}\""
        ),
        ">/dev/null".into(),
        "2>&1".into(),
        ";".into(),
        "do".into(),
        "echo".into(),
        go_quote(&format!(
            "Waiting for Ray Dashboard GCS to become healthy at {address} ..."
        )),
        ";".into(),
        "sleep".into(),
        "2".into(),
        ";".into(),
        "done".into(),
        ";".into(),
    ];
    if check_status {
        cmd.extend(
            [
                "if",
                "!",
                "ray",
                "job",
                "status",
                "--address",
                address,
                job_id,
                ">/dev/null",
                "2>&1",
                ";",
                "then",
            ]
            .map(String::from),
        );
    }
    cmd.extend(["ray", "job", "submit", "--address", address].map(String::from));
    if check_status {
        cmd.push("--no-wait".into());
    }
    if let Some(env) = &values.runtime_env {
        cmd.push("--runtime-env-json".into());
        cmd.push(go_quote(&env.to_string()));
    }
    if let Some(metadata) = job.spec.metadata.as_ref().filter(|m| !m.is_empty()) {
        cmd.push("--metadata-json".into());
        cmd.push(go_quote(
            &serde_json::to_string(metadata).unwrap_or_default(),
        ));
    }
    if !job_id.is_empty() {
        cmd.extend(["--submission-id".into(), job_id.to_owned()]);
    }
    if let Some(n) = job.spec.entrypoint_num_cpus.filter(|n| *n > 0.0) {
        cmd.extend(["--entrypoint-num-cpus".into(), format!("{n:.6}")]);
    }
    if let Some(n) = job.spec.entrypoint_num_gpus.filter(|n| *n > 0.0) {
        cmd.extend(["--entrypoint-num-gpus".into(), format!("{n:.6}")]);
    }
    if let Some(resources) = job
        .spec
        .entrypoint_resources
        .as_deref()
        .filter(|r| !r.trim().is_empty())
    {
        cmd.extend(["--entrypoint-resources".into(), go_quote(resources)]);
    }
    cmd.push("--".into());
    cmd.push(
        job.spec
            .entrypoint
            .clone()
            .unwrap_or_default()
            .trim()
            .to_owned(),
    );
    cmd.push(";".into());
    if check_status {
        cmd.extend(
            [
                "fi",
                ";",
                "ray",
                "job",
                "logs",
                "--address",
                address,
                "--follow",
                job_id,
            ]
            .map(String::from),
        );
    }
    Ok(cmd.join(" "))
}

/// The Ray image of the head (the default submitter image).
fn head_image(cluster: &RayCluster) -> String {
    ray_container(&cluster.spec.head_group_spec.template)
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

fn default_resources() -> ResourceRequirements {
    let q = |s: &str| Quantity(s.to_owned());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), q("500m")),
            ("memory".to_owned(), q("200Mi")),
        ])),
        limits: Some(BTreeMap::from([
            ("cpu".to_owned(), q("1")),
            ("memory".to_owned(), q("1Gi")),
        ])),
        ..Default::default()
    }
}

fn env(name: &str, value: &str) -> k8s_openapi::api::core::v1::EnvVar {
    k8s_openapi::api::core::v1::EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    }
}

/// The submitter container of SidecarMode: it shares the head's network, so it dials
/// 127.0.0.1.
fn sidecar_container(
    job: &RayJob,
    values: &RayJobValues,
    cluster: &RayCluster,
    job_id: &str,
) -> Result<Container, Error> {
    let port = head_dashboard_port(cluster);
    let address = format!("http://127.0.0.1:{port}");
    let health = format!("http://localhost:{port}/api/gcs_healthz");
    let command = submit_command(
        job,
        values,
        JobSubmissionMode::SidecarMode,
        &address,
        &health,
        job_id,
    )?;
    let mut container = Container {
        name: SUBMITTER_CONTAINER.to_owned(),
        image: Some(head_image(cluster)),
        command: Some(vec!["/bin/bash".into(), "-ce".into(), "--".into()]),
        args: Some(vec![command]),
        resources: Some(default_resources()),
        env: Some(vec![
            env("PYTHONUNBUFFERED", "1"),
            env("RAY_DASHBOARD_ADDRESS", ""),
            env("RAY_JOB_SUBMISSION_ID", job_id),
        ]),
        ..Default::default()
    };
    add_token_auth_env(&mut container, cluster);
    Ok(container)
}

/// The submitter Job of K8sJobMode (§3.4): named like the RayJob, owned by it, running
/// `ray job submit` against `dashboard_url` (host:port).
pub fn submitter_job(
    job: &RayJob,
    values: &RayJobValues,
    cluster: &RayCluster,
    dashboard_url: &str,
    job_id: &str,
) -> Result<Job, Error> {
    let mut job_labels = origin_labels(job);
    job_labels.insert(
        labels::CREATED_BY.to_owned(),
        labels::CREATED_BY_VALUE.to_owned(),
    );
    let mut template: PodTemplateSpec = match &job.spec.submitter_pod_template {
        Some(template) => template.clone(),
        None => PodTemplateSpec {
            metadata: None,
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![Container {
                    name: SUBMITTER_CONTAINER.to_owned(),
                    image: Some(head_image(cluster)),
                    resources: Some(default_resources()),
                    ..Default::default()
                }],
                restart_policy: Some("Never".to_owned()),
                ..Default::default()
            }),
        },
    };
    let meta = template.metadata.get_or_insert_with(Default::default);
    meta.labels
        .get_or_insert_with(Default::default)
        .extend(job_labels.clone());
    let address = format!("http://{dashboard_url}");
    let health = format!("{address}/api/gcs_healthz");
    let command = submit_command(
        job,
        values,
        JobSubmissionMode::K8sJobMode,
        &address,
        &health,
        job_id,
    )?;
    let spec = template
        .spec
        .as_mut()
        .ok_or_else(|| Error::Invalid("submitterPodTemplate has no spec".into()))?;
    let container = spec
        .containers
        .first_mut()
        .ok_or_else(|| Error::Invalid("submitterPodTemplate has no container".into()))?;
    if container.command.as_ref().is_none_or(Vec::is_empty) {
        container.command = Some(vec!["/bin/bash".into(), "-ce".into(), "--".into()]);
        container.args = Some(vec![command]);
    }
    let envs = container.env.get_or_insert_with(Vec::new);
    envs.push(env("PYTHONUNBUFFERED", "1"));
    envs.push(env("RAY_DASHBOARD_ADDRESS", dashboard_url));
    envs.push(env("RAY_JOB_SUBMISSION_ID", job_id));
    add_token_auth_env(container, cluster);
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(job.name_any()),
            namespace: job.namespace(),
            labels: Some(job_labels),
            owner_references: Some(vec![crate::k8s::controller_owner_ref(job)?]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(
                job.spec
                    .submitter_config
                    .as_ref()
                    .and_then(|c| c.backoff_limit)
                    .unwrap_or(DEFAULT_SUBMITTER_BACKOFF_LIMIT),
            ),
            template,
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::validation::feature_gates::FeatureGates;
    use crate::validation::problem::Problems;
    use crate::validation::rayjob::rayjob_spec;
    use crate::validation::validated::for_controller;
    use serde_json::json;

    /// What the rule book parses from `job` (the builders' tests need not satisfy every rule).
    fn values(job: &RayJob) -> RayJobValues {
        let mut problems = Problems::new("", "");
        let gates = FeatureGates::default();
        rayjob_spec(&job.spec, "spec", job.annotations(), &gates, &mut problems)
            .expect("the values parse")
    }

    pub(crate) fn job(extra: serde_json::Value) -> RayJob {
        crate::api::test_support::rayjob(extra)
    }

    #[test]
    fn cluster_copies_the_spec_and_carries_kuberays_labels() {
        let job = job(json!({"spec": {"submissionMode": "HTTPMode"}}));
        let cluster = ray_cluster(&job, &values(&job), "rj-abcde", "rj-x").expect("builds");
        let l = cluster.labels();
        assert_eq!(l["team"], "a");
        assert_eq!(l[labels::ORIGINATED_FROM_CR_NAME], "rj");
        assert_eq!(l[labels::ORIGINATED_FROM_CRD], "RayJob");
        assert_eq!(l[JOB_SUBMISSION_MODE_LABEL], "HTTPMode");
        assert_eq!(
            Some(&cluster.spec),
            job.spec.ray_cluster_spec.as_ref(),
            "spec is a plain copy"
        );
        let owner = &cluster.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("RayJob", Some(true))
        );
    }

    #[test]
    fn sidecar_mode_adds_the_submitter_to_the_head() {
        let job = job(json!({"spec": {"submissionMode": "SidecarMode"}}));
        let cluster = ray_cluster(&job, &values(&job), "rj-abcde", "rj-x").expect("builds");
        let head = cluster
            .spec
            .head_group_spec
            .template
            .spec
            .as_ref()
            .expect("spec");
        assert_eq!(head.restart_policy.as_deref(), Some("Never"));
        let submitter = &head.containers[1];
        assert_eq!(submitter.name, SUBMITTER_CONTAINER);
        let args = &submitter.args.as_ref().expect("args")[0];
        assert!(args.contains("--address http://127.0.0.1:8266"), "{args}");
        assert!(
            args.contains("http://localhost:8266/api/gcs_healthz"),
            "{args}"
        );
        assert!(!args.contains("--no-wait"), "{args}");
        assert_eq!(
            cluster.annotations()[annotations::DISABLE_PROVISIONED_HEAD_RESTART],
            "true"
        );
    }

    #[test]
    fn k8s_job_mode_command_matches_kuberay() {
        let job = job(json!({"spec": {
            "entrypoint": "echo no quote 'single quote' \"double quote\"",
            "runtimeEnvYAML": "test: test\n",
            "metadata": {"testKey": "testValue"},
            "entrypointNumCpus": 1.0, "entrypointNumGpus": 0.5,
            "entrypointResources": "{\"Custom_1\": 1, \"Custom_2\": 5.5}"
        }}));
        let a = "http://127.0.0.1:8265";
        let command = submit_command(
            &job,
            &values(&job),
            JobSubmissionMode::K8sJobMode,
            a,
            &format!("{a}/api/gcs_healthz"),
            "testJobId",
        )
        .expect("builds");
        let expected = format!(
            "until python -c \"import sys, urllib.request; r=urllib.request.urlopen(sys.argv[1], timeout=10); exit(0 if b'success' in r.read() else 1)\" \"{a}/api/gcs_healthz\" >/dev/null 2>&1 ; \
             do echo \"Waiting for Ray Dashboard GCS to become healthy at {a} ...\" ; sleep 2 ; done ; \
             if ! ray job status --address {a} testJobId >/dev/null 2>&1 ; then \
             ray job submit --address {a} --no-wait --runtime-env-json \"{{\\\"test\\\":\\\"test\\\"}}\" \
             --metadata-json \"{{\\\"testKey\\\":\\\"testValue\\\"}}\" --submission-id testJobId \
             --entrypoint-num-cpus 1.000000 --entrypoint-num-gpus 0.500000 \
             --entrypoint-resources \"{{\\\"Custom_1\\\": 1, \\\"Custom_2\\\": 5.5}}\" \
             -- echo no quote 'single quote' \"double quote\" ; fi ; ray job logs --address {a} --follow testJobId"
        );
        assert_eq!(command, expected);
    }

    #[test]
    fn head_service_is_the_clusters_under_the_rayjobs_name() {
        let job = job(json!({}));
        let mut cluster = ray_cluster(&job, &values(&job), "rj-abcde", "rj-x").expect("builds");
        cluster.metadata.uid = Some("cluster-uid".into());
        let svc = head_service(&job, &cluster, &BuildOptions::default()).expect("builds");
        assert_eq!(svc.name_any(), "rj-head-svc");
        assert_eq!(
            svc.labels(),
            &BTreeMap::from([
                (labels::ORIGINATED_FROM_CR_NAME.to_owned(), "rj".to_owned()),
                (labels::ORIGINATED_FROM_CRD.to_owned(), "RayJob".to_owned()),
                (labels::NODE_TYPE.to_owned(), "head".to_owned()),
                (labels::IDENTIFIER.to_owned(), "rj-head".to_owned()),
            ])
        );
        let cluster_svc = service::head_service(&cluster, &BuildOptions::default())
            .expect("the cluster's head Service");
        assert_eq!(svc.spec, cluster_svc.spec, "same ports, selector and type");
        let selector = svc.spec.as_ref().and_then(|s| s.selector.as_ref());
        assert_eq!(
            selector.map(|s| s[labels::CLUSTER].as_str()),
            Some("rj-abcde")
        );
        let owner = &svc.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("RayJob", "rj", Some(true))
        );
    }

    #[test]
    fn submitters_get_the_token_by_secret_reference_when_the_cluster_uses_token_auth() {
        let auth = json!({"spec": {"rayClusterSpec": {"authOptions": {"mode": "token"}}}});
        let token_env = |c: &Container| {
            let envs = c.env.clone().unwrap_or_default();
            let mode = envs
                .iter()
                .find(|e| e.name == "RAY_AUTH_MODE")
                .and_then(|e| e.value.clone());
            let secret = envs.iter().find(|e| e.name == "RAY_AUTH_TOKEN").map(|e| {
                assert_eq!(e.value, None, "never the token itself");
                let key = e
                    .value_from
                    .as_ref()
                    .and_then(|v| v.secret_key_ref.as_ref());
                key.map(|k| (k.name.clone(), k.key.clone()))
            });
            (mode, secret)
        };
        let mut with_auth = job(json!({}));
        let mut merged = serde_json::to_value(&with_auth).expect("json");
        merged["spec"]["rayClusterSpec"]["authOptions"] =
            auth["spec"]["rayClusterSpec"]["authOptions"].clone();
        with_auth = serde_json::from_value(merged).expect("a RayJob");
        let cluster =
            ray_cluster(&with_auth, &values(&with_auth), "rj-abcde", "rj-x").expect("builds");
        let submitter = submitter_job(
            &with_auth,
            &values(&with_auth),
            &cluster,
            "rj-abcde-head-svc.ns.svc:8265",
            "rj-x",
        )
        .expect("builds");
        let pod = submitter.spec.and_then(|s| s.template.spec).expect("pod");
        assert_eq!(
            token_env(&pod.containers[0]),
            (
                Some("token".to_owned()),
                Some(Some(("rj-abcde".to_owned(), "auth_token".to_owned())))
            )
        );
        let sidecar =
            sidecar_container(&with_auth, &values(&with_auth), &cluster, "rj-x").expect("builds");
        assert_eq!(token_env(&sidecar).0.as_deref(), Some("token"));

        // Without token auth, no auth environment.
        let plain = job(json!({}));
        let cluster = ray_cluster(&plain, &values(&plain), "rj-abcde", "rj-x").expect("builds");
        let submitter =
            submitter_job(&plain, &values(&plain), &cluster, "x:8265", "rj-x").expect("builds");
        let pod = submitter.spec.and_then(|s| s.template.spec).expect("pod");
        assert_eq!(token_env(&pod.containers[0]), (None, None));
    }

    #[test]
    fn submitter_job_has_kuberays_shape() {
        let job = job(json!({"spec": {"submitterConfig": {"backoffLimit": 5}}}));
        let cluster = ray_cluster(&job, &values(&job), "rj-abcde", "rj-x").expect("builds");
        let submitter = submitter_job(
            &job,
            &values(&job),
            &cluster,
            "rj-abcde-head-svc.ns.svc.cluster.local:8266",
            "rj-x",
        )
        .expect("builds");
        assert_eq!(submitter.name_any(), "rj");
        assert_eq!(submitter.labels()[labels::CREATED_BY], "kuberay-operator");
        let spec = submitter.spec.as_ref().expect("spec");
        assert_eq!(spec.backoff_limit, Some(5));
        let pod = spec.template.spec.as_ref().expect("pod spec");
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        let c = &pod.containers[0];
        assert_eq!(c.name, SUBMITTER_CONTAINER);
        assert_eq!(c.image.as_deref(), Some("rayproject/ray:2.52.0"));
        assert_eq!(
            c.command.as_deref(),
            Some(&["/bin/bash".to_owned(), "-ce".into(), "--".into()][..])
        );
        let env: Vec<(&str, &str)> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(
            env,
            [
                ("PYTHONUNBUFFERED", "1"),
                (
                    "RAY_DASHBOARD_ADDRESS",
                    "rj-abcde-head-svc.ns.svc.cluster.local:8266"
                ),
                ("RAY_JOB_SUBMISSION_ID", "rj-x")
            ]
        );
        let tl = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .expect("labels");
        assert_eq!(tl[labels::ORIGINATED_FROM_CRD], "RayJob");

        let custom = self::job(
            json!({"spec": {"submitterPodTemplate": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "mine", "image": "me", "command": ["sh", "-c", "true"]}]}}}}),
        );
        let submitter =
            submitter_job(&custom, &values(&custom), &cluster, "x:1", "id").expect("builds");
        let c = &submitter
            .spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod")
            .containers[0];
        assert_eq!(
            c.command.as_ref().map(|c| c[0].as_str()),
            Some("sh"),
            "a user command is kept"
        );
        assert_eq!(
            submitter.spec.as_ref().and_then(|s| s.backoff_limit),
            Some(2)
        );
    }

    #[test]
    fn http_submission_leaves_unset_fields_out() {
        let job = job(
            json!({"spec": {"runtimeEnvYAML": "env_vars:\n  A: b\n", "entrypointNumCpus": 0.0}}),
        );
        let request = submit_request(&job, &values(&job), "rj-x");
        assert_eq!(
            serde_json::to_value(&request).expect("json"),
            json!({"entrypoint": " python -c 'print(1)' ", "submission_id": "rj-x",
                   "runtime_env": {"env_vars": {"A": "b"}}})
        );
        let bad = self::job(json!({"spec": {"runtimeEnvYAML": "a: [b"}}));
        // A runtime environment that does not parse never reaches the builder.
        assert!(for_controller(&bad, &FeatureGates::default()).is_err());
    }
}
