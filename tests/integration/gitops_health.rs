//! The Argo CD and Flux health checks for ServePipelines agree, branch by branch, on statuses
//! of the shape the controller writes (the controller-written ones are checked in
//! `servepipeline.rs` and `rollout.rs`). Both are run by the libraries the tools use: gopher-lua
//! for `deploy/argocd/servepipeline-health.lua`, cel-go in Flux's environment for
//! `deploy/flux/kustomization.yaml`.

use serde_json::{Value, json};

use crate::support::{argocd, flux};

fn condition(kind: &str, status: &str, reason: &str) -> Value {
    json!({"type": kind, "status": status, "reason": reason, "message": format!("{kind} {reason}"),
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

fn pipeline(generation: i64, suspend: bool, status: Option<Value>) -> Value {
    let mut object = json!({
        "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline",
        "metadata": {"name": "p", "namespace": "ns", "generation": generation},
        "spec": {"source": {"url": "https://registry.example/g.pb"}, "suspend": suspend},
    });
    if let Some(status) = status {
        object["status"] = status;
    }
    object
}

fn status(phase: &str, conditions: Vec<Value>) -> Option<Value> {
    Some(json!({"observedGeneration": 1, "phase": phase, "conditions": conditions}))
}

#[test]
fn argocd_and_flux_give_the_same_verdict_on_every_branch() {
    let ready = |s: &str, r: &str| condition("Ready", s, r);
    let up_to_date = |s: &str, r: &str| condition("UpToDate", s, r);
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "deploying",
            pipeline(
                1,
                false,
                status("Deploying", vec![ready("False", "RayServiceNotReady")]),
            ),
            "Progressing",
        ),
        (
            "no graph yet",
            pipeline(1, false, status("Pending", vec![ready("False", "NoGraph")])),
            "Progressing",
        ),
        (
            "no good graph (wrong token)",
            pipeline(
                1,
                false,
                status("Failed", vec![ready("False", "Unauthorized")]),
            ),
            "Degraded",
        ),
        (
            "serving the newest graph",
            pipeline(
                1,
                false,
                status(
                    "Ready",
                    vec![ready("True", "Serving"), up_to_date("True", "Serving")],
                ),
            ),
            "Healthy",
        ),
        (
            "a refused push: the previous graph serves",
            pipeline(
                1,
                false,
                status(
                    "Degraded",
                    vec![
                        ready("True", "ServingPreviousGraph"),
                        up_to_date("False", "GraphInvalid"),
                    ],
                ),
            ),
            "Degraded",
        ),
        (
            "a canary under way",
            pipeline(
                1,
                false,
                status(
                    "Ready",
                    vec![
                        ready("True", "Serving"),
                        condition("Progressing", "True", "RolloutStep"),
                        up_to_date("False", "RolloutInProgress"),
                    ],
                ),
            ),
            "Progressing",
        ),
        (
            "a canary rolled back",
            pipeline(
                1,
                false,
                status(
                    "Ready",
                    vec![
                        ready("True", "Serving"),
                        condition("Progressing", "False", "RolledBack"),
                        condition("RolledBack", "True", "ErrorRate"),
                        up_to_date("False", "RolledBack"),
                    ],
                ),
            ),
            "Degraded",
        ),
        (
            "the RayService of a new graph not ready yet",
            pipeline(
                1,
                false,
                status(
                    "Ready",
                    vec![
                        ready("True", "Serving"),
                        up_to_date("False", "RayServiceNotReady"),
                    ],
                ),
            ),
            "Progressing",
        ),
        (
            "a new spec not yet seen",
            pipeline(
                2,
                false,
                status(
                    "Ready",
                    vec![ready("True", "Serving"), up_to_date("True", "Serving")],
                ),
            ),
            "Progressing",
        ),
        (
            "suspended",
            pipeline(
                1,
                true,
                status("Suspended", vec![ready("False", "Suspended")]),
            ),
            "Suspended",
        ),
        (
            "suspended before any status",
            pipeline(1, true, None),
            "Suspended",
        ),
    ];
    for (case, object, expected) in cases {
        let (argocd_status, message) = argocd::health(&object);
        assert_eq!(argocd_status, expected, "{case}: Argo CD said {message}");
        let (flux_status, message) = flux::health(&object);
        assert_eq!(
            flux_status,
            flux::flux_status_for(expected),
            "{case}: Flux said {message}"
        );
    }
}

/// The one place they differ: before the controller writes any status, Argo CD's script says
/// Progressing, while Flux's expressions cannot be evaluated (they read `status`) and Flux
/// reports Unknown, which keeps the Kustomization waiting just the same.
#[test]
fn before_any_status_argocd_waits_as_progressing_and_flux_as_unknown() {
    let fresh = pipeline(1, false, None);
    assert_eq!(argocd::health(&fresh).0, "Progressing");
    let (status, message) = flux::health(&fresh);
    assert_eq!(status, "Unknown", "{message}");
    assert!(message.contains("status"), "{message}");
}
