//! The Immediate steps with shared nodes (stage, switch, retire) and the canary's node
//! applications, on the sample ensemble and its successor with one changed node.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::{
    ANNOTATION_RETIRING, fold_node_statuses, immediate_step, node_applications, retiring_of,
    stage_versions,
};
use crate::api::rayservice::RayService;
use crate::api::servepipeline::{ApplicationStatus, NodeStatus};
use crate::serve::rollout::compose;
use crate::serve::shared::{SharedLayout, node_map, split};

fn at(second: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + second).unwrap())
}

fn layout(sample: &str) -> SharedLayout {
    let path = format!(
        "{}/samples/graphs/{sample}.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let graph = crate::graph::from_yaml(&std::fs::read_to_string(path).unwrap()).unwrap();
    let valid = crate::graph::validate(graph).unwrap();
    let rendered = crate::serve::render(&valid, &Default::default()).unwrap();
    split(&rendered, "ensemble").unwrap()
}

/// A RayService carrying `applications`, each with the given Serve status, and annotations.
fn rayservice(
    applications: &[Value],
    statuses: &[(&str, &str)],
    annotations: BTreeMap<String, String>,
) -> RayService {
    let yaml = serde_yaml::to_string(&compose(json!({}), applications.to_vec())).unwrap();
    let apps: serde_json::Map<String, Value> = statuses
        .iter()
        .map(|(name, status)| ((*name).to_owned(), json!({"status": status})))
        .collect();
    let mut rs = RayService::new("p", Default::default());
    rs.spec.serve_config_v2 = Some(yaml);
    rs.metadata.annotations = Some(annotations);
    rs.status = Some(
        serde_json::from_value(json!({"activeServiceStatus": {"applicationStatuses": apps}}))
            .unwrap(),
    );
    rs
}

fn names(applications: &[Value]) -> Vec<String> {
    applications
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect()
}

fn all_running(layout: &SharedLayout) -> Vec<(&str, &str)> {
    std::iter::once("ensemble")
        .chain(layout.nodes.keys().map(String::as_str))
        .map(|n| (n, "RUNNING"))
        .collect()
}

#[test]
fn a_first_deployment_writes_everything_at_once() {
    let v1 = layout("ensemble");
    let step = immediate_step(&v1, None, &at(0));
    assert!(!step.staging && !step.active && step.retiring.is_empty());
    assert_eq!(step.applications, v1.applications());
}

#[test]
fn a_changed_node_starts_beside_the_serving_wiring_then_the_old_one_retires() {
    let (v1, v2) = (layout("ensemble"), layout("ensemble-v2"));
    let (old_b, new_b) = (
        &node_map(&v1.version)["model_b"],
        &node_map(&v2.version)["model_b"],
    );
    let serving = rayservice(&v1.applications(), &all_running(&v1), BTreeMap::new());

    // 1. Stage: the serving version application as it is, its nodes, and the new node.
    let staged = immediate_step(&v2, Some(&serving), &at(0));
    assert!(staged.staging && staged.active);
    assert_eq!(staged.applications[0], v1.version);
    let mut expected: Vec<String> = v1.nodes.keys().cloned().collect();
    expected.push(new_b.clone());
    expected.sort();
    assert_eq!(names(&staged.applications[1..]), expected);

    // Still staging while the new node deploys.
    let mut statuses = all_running(&v1);
    statuses.push((new_b, "DEPLOYING"));
    let deploying = rayservice(&staged.applications, &statuses, BTreeMap::new());
    assert!(immediate_step(&v2, Some(&deploying), &at(5)).staging);

    // 2. Switch once it runs: the new wiring, and the old node kept for the deadline + 30 s.
    statuses.pop();
    statuses.push((new_b, "RUNNING"));
    let started = rayservice(&staged.applications, &statuses, BTreeMap::new());
    let switched = immediate_step(&v2, Some(&started), &at(10));
    assert!(!switched.staging && switched.active);
    assert_eq!(switched.applications[0], v2.version);
    assert!(names(&switched.applications).contains(old_b));
    // ensemble's deadline is 15 s: kept until 10 + 15 + 30.
    assert_eq!(
        switched.retiring,
        BTreeMap::from([(old_b.clone(), at(55).0.to_string())])
    );

    // 3. The annotation keeps it across passes (and operator restarts) until its time.
    let annotations = BTreeMap::from([(
        ANNOTATION_RETIRING.to_owned(),
        serde_json::to_string(&switched.retiring).unwrap(),
    )]);
    let mut statuses = all_running(&v2);
    statuses.push((old_b, "RUNNING"));
    let retiring = rayservice(&switched.applications, &statuses, annotations);
    assert_eq!(retiring_of(Some(&retiring)), switched.retiring);
    let kept = immediate_step(&v2, Some(&retiring), &at(54));
    assert!(names(&kept.applications).contains(old_b) && kept.active);
    let gone = immediate_step(&v2, Some(&retiring), &at(55));
    assert_eq!(gone.applications, v2.applications());
    assert!(!gone.active && gone.retiring.is_empty());
}

#[test]
fn with_nothing_running_there_is_no_traffic_to_protect_and_no_stage() {
    // No Serve status at all (nothing reports yet), or the serving version failed.
    let (v1, v2) = (layout("ensemble"), layout("ensemble-v2"));
    for statuses in [vec![], vec![("ensemble", "DEPLOY_FAILED")]] {
        let rs = rayservice(&v1.applications(), &statuses, BTreeMap::new());
        let step = immediate_step(&v2, Some(&rs), &at(0));
        assert!(!step.staging, "{statuses:?}");
        // Nor a request in flight: the old node goes at once.
        assert!(step.retiring.is_empty() && !step.active, "{statuses:?}");
        assert_eq!(step.applications, v2.applications());
    }
}

#[test]
fn a_wiring_change_switches_at_once_and_retires_nothing() {
    let v1 = layout("ensemble");
    let mut wired = v1.clone();
    wired.version["deployments"][0]["user_config"]["raypipe"]["graph"]["version"] = json!("1w");
    let serving = rayservice(&v1.applications(), &all_running(&v1), BTreeMap::new());
    let step = immediate_step(&wired, Some(&serving), &at(0));
    assert!(!step.staging && !step.active);
    assert_eq!(step.applications, wired.applications());
}

#[test]
fn a_revert_within_the_retirement_reuses_the_running_node() {
    let (v1, v2) = (layout("ensemble"), layout("ensemble-v2"));
    let old_b = &node_map(&v1.version)["model_b"];
    // v2 serves; v1's model_b is still retiring (and running).
    let mut applications = v2.applications();
    applications.push(v1.nodes[old_b].clone());
    let mut statuses = all_running(&v2);
    statuses.push((old_b, "RUNNING"));
    let annotations = BTreeMap::from([(
        ANNOTATION_RETIRING.to_owned(),
        json!({old_b.as_str(): at(100).0.to_string()}).to_string(),
    )]);
    let rs = rayservice(&applications, &statuses, annotations);
    let back = immediate_step(&v1, Some(&rs), &at(0));
    assert!(!back.staging, "nothing to start: v1's model_b still runs");
    assert_eq!(back.applications[0], v1.version);
    assert!(!back.retiring.contains_key(old_b));
}

#[test]
fn versions_carry_the_nodes_they_name_and_a_lost_one_is_named() {
    let (v1, v2) = (layout("ensemble"), layout("ensemble-v2"));
    let current: BTreeMap<String, Value> = v1.nodes.clone();
    let versions = [v1.version.clone(), v2.version.clone()];
    let nodes = node_applications(&versions, &v2.nodes, &current).unwrap();
    // Four nodes each, three shared: five applications.
    assert_eq!(nodes.len(), 5);
    let lost = node_applications(&versions, &BTreeMap::new(), &current).unwrap_err();
    assert!(lost.contains(&node_map(&v2.version)["model_b"]), "{lost}");
}

#[test]
fn a_version_runs_only_when_its_nodes_run() {
    let v2 = layout("ensemble-v2");
    let new_b = node_map(&v2.version)["model_b"].clone();
    let mut serve: BTreeMap<String, ApplicationStatus> = BTreeMap::new();
    let running = || ApplicationStatus {
        status: Some("RUNNING".into()),
        ..Default::default()
    };
    serve.insert("ensemble--bbbb".into(), running());
    for app in v2.nodes.keys().filter(|a| **a != new_b) {
        serve.insert(app.clone(), running());
    }
    fold_node_statuses(&mut serve, [("ensemble--bbbb", &v2.version)]);
    let folded = &serve["ensemble--bbbb"];
    assert_eq!(folded.status.as_deref(), Some("DEPLOYING"));
    assert!(
        folded.message.as_deref().unwrap().contains("node model_b"),
        "{folded:?}"
    );
    // A node that fails to deploy is named by its deployment, as in one application.
    serve.insert(
        new_b.clone(),
        ApplicationStatus {
            status: Some("DEPLOY_FAILED".into()),
            deployments: BTreeMap::from([(
                "model_b".to_owned(),
                NodeStatus {
                    status: Some("DEPLOY_FAILED".into()),
                    message: Some("boom".into()),
                },
            )]),
            ..Default::default()
        },
    );
    fold_node_statuses(&mut serve, [("ensemble--bbbb", &v2.version)]);
    let folded = &serve["ensemble--bbbb"];
    assert_eq!(
        folded.deployments["model_b"].status.as_deref(),
        Some("DEPLOY_FAILED")
    );
    serve.insert(new_b, running());
    serve.insert("ensemble--bbbb".into(), running());
    fold_node_statuses(&mut serve, [("ensemble--bbbb", &v2.version)]);
    assert_eq!(serve["ensemble--bbbb"].status.as_deref(), Some("RUNNING"));
}

#[test]
fn whatever_serves_stays_as_it_is_while_the_new_nodes_start() {
    // A canary's router and version (or an inline application) serve; the pipeline moves to
    // Immediate with shared nodes.
    let v1 = layout("ensemble");
    let router = json!({"name": "ensemble", "route_prefix": "/ensemble",
                        "import_path": "raypipe_runtime.router:build", "args": {}});
    let inline = json!({"name": "ensemble--aaaaaaaaaaaa", "route_prefix": null,
                        "import_path": "raypipe_runtime.app:build", "args": {"graph": {}}});
    let statuses = [
        ("ensemble", "RUNNING"),
        ("ensemble--aaaaaaaaaaaa", "RUNNING"),
    ];
    let rs = rayservice(
        &[router.clone(), inline.clone()],
        &statuses,
        BTreeMap::new(),
    );
    let staged = immediate_step(&v1, Some(&rs), &at(0));
    assert!(staged.staging);
    assert_eq!(staged.applications[..2], [router, inline]);
    assert_eq!(
        names(&staged.applications[2..]),
        v1.nodes.keys().cloned().collect::<Vec<_>>()
    );
}

#[test]
fn a_retirement_edited_by_hand_is_bounded() {
    let (v1, v2) = (layout("ensemble"), layout("ensemble-v2"));
    let old_b = &node_map(&v1.version)["model_b"];
    let mut applications = v2.applications();
    applications.push(v1.nodes[old_b].clone());
    let statuses = all_running(&v2);
    let edited = |until: &str| {
        let annotations = BTreeMap::from([(
            ANNOTATION_RETIRING.to_owned(),
            json!({old_b.as_str(): until}).to_string(),
        )]);
        immediate_step(
            &v2,
            Some(&rayservice(&applications, &statuses, annotations)),
            &at(0),
        )
    };
    // A year ahead: kept no longer than the longest deadline (1 h) plus 30 s.
    let far = edited(&at(365 * 24 * 3600).0.to_string());
    assert_eq!(far.retiring[old_b], at(3600 + 30).0.to_string());
    // Not a time: gone at once.
    let garbage = edited("soon");
    assert!(garbage.retiring.is_empty());
    assert_eq!(garbage.applications, v2.applications());
}

#[test]
fn a_re_laid_out_version_keeps_its_carried_form_until_its_new_nodes_run() {
    // The stable version as the inline layout carried it, re-rendered with shared nodes.
    let v1 = layout("ensemble");
    let inline = json!({"name": "ensemble--aaaaaaaaaaaa", "route_prefix": null,
                        "import_path": "raypipe_runtime.app:build", "args": {"graph": {}}});
    let mut shared_form = v1.version.clone();
    shared_form["name"] = json!("ensemble--aaaaaaaaaaaa");
    let current = BTreeMap::from([("ensemble--aaaaaaaaaaaa".to_owned(), inline.clone())]);
    let status = |pairs: &[(&str, &str)]| -> BTreeMap<String, ApplicationStatus> {
        pairs
            .iter()
            .map(|(n, s)| {
                let status = ApplicationStatus {
                    status: Some((*s).into()),
                    ..Default::default()
                };
                ((*n).to_owned(), status)
            })
            .collect()
    };
    let carried_runs = status(&[("ensemble--aaaaaaaaaaaa", "RUNNING")]);
    let (written, starting) =
        stage_versions(std::slice::from_ref(&shared_form), &current, &carried_runs);
    assert_eq!(written, vec![inline.clone()]);
    assert_eq!(starting, v1.nodes.keys().cloned().collect());

    // Once the new nodes run, the new form is written.
    let mut all = vec![("ensemble--aaaaaaaaaaaa", "RUNNING")];
    all.extend(v1.nodes.keys().map(|n| (n.as_str(), "RUNNING")));
    let (written, starting) =
        stage_versions(std::slice::from_ref(&shared_form), &current, &status(&all));
    assert_eq!(written, vec![shared_form.clone()]);
    assert!(starting.is_empty());

    // A version that is new, or whose carried form does not run, is written at once.
    let (written, _) = stage_versions(
        std::slice::from_ref(&shared_form),
        &BTreeMap::new(),
        &carried_runs,
    );
    assert_eq!(written, vec![shared_form.clone()]);
    let (written, _) = stage_versions(
        std::slice::from_ref(&shared_form),
        &current,
        &BTreeMap::new(),
    );
    assert_eq!(written, vec![shared_form]);
}
