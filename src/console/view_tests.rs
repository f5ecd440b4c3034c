use super::*;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

fn time(text: &str) -> Time {
    Time(text.parse().expect("a timestamp"))
}

fn canary_pipeline() -> ServePipeline {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "raypipe.dev/v1alpha1",
        "kind": "ServePipeline",
        "metadata": {"name": "demo", "namespace": "ml"},
        "spec": {"source": {"url": "http://127.0.0.1/g.pb"},
                 "rayClusterConfig": {"headGroupSpec": {"template": {}}},
                 "rollout": {"strategy": "Canary", "steps": [{"weight": 30}]}},
        "status": {
            "phase": "Ready",
            "conditions": [{"type": "Ready", "status": "True", "reason": "Serving",
                            "message": "ok", "lastTransitionTime": "2026-12-02T10:00:00Z"}],
            "rollout": {
                "phase": "Progressing",
                "generation": "g1",
                "stable": {"digest": "sha256:aaaa", "version": "1", "application": "demo-aaaa"},
                "canary": {"digest": "sha256:bbbb", "version": "2", "application": "demo-bbbb",
                           "step": 1, "steps": 2, "weight": 30,
                           "startedAt": "2026-12-02T10:01:00Z",
                           "stepStartedAt": "2026-12-02T10:02:00Z",
                           "readings": {"canaryRequests": 12, "canaryErrors": 1,
                                        "retriedOnStable": 1, "stableRequests": 30},
                           "plan": ["model_a: args changed"]},
                "last": {"digest": "sha256:9999", "version": "0", "result": "Promoted",
                         "reason": "Promoted", "message": "all steps passed",
                         "at": "2026-12-02T09:00:00Z"}
            }
        }
    }))
    .expect("a ServePipeline")
}

fn event(reason: &str, at: &str, message: &str) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(format!("demo.{reason}")),
            namespace: Some("ml".into()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some("ServePipeline".into()),
            name: Some("demo".into()),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Normal".into()),
        last_timestamp: Some(time(at)),
        ..Event::default()
    }
}

#[test]
fn versions_carry_roles_digests_and_weights() {
    let rows = versions(&canary_pipeline());
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[0].role, rows[0].digest.as_str(), rows[0].weight),
        ("stable", "sha256:aaaa", Some(70))
    );
    assert_eq!(
        (rows[1].role, rows[1].digest.as_str(), rows[1].weight),
        ("canary", "sha256:bbbb", Some(30))
    );
}

#[test]
fn the_timeline_orders_events_outcome_and_the_current_step() {
    let pipeline = canary_pipeline();
    let events = event_rows(&[
        event("RolloutStarted", "2026-12-02T10:01:00Z", "rolling out 2"),
        event(
            "SourceFetched",
            "2026-12-02T10:00:30Z",
            "not a rollout event",
        ),
        event("RolloutStepped", "2026-12-02T10:02:00Z", "step 1"),
    ]);
    // Newest first in the Events table.
    assert_eq!(events[0].reason, "RolloutStepped");
    let timeline = timeline(&pipeline, &events);
    let whats: Vec<&str> = timeline.iter().map(|e| e.what.as_str()).collect();
    assert_eq!(
        whats,
        [
            "Promoted (Promoted)",
            "RolloutStarted",
            "RolloutStepped",
            "Step 1/2 at 30 %"
        ]
    );
    let current = timeline.last().expect("the current step");
    assert_eq!(
        current.readings.as_ref().map(|r| r.canary_requests),
        Some(12)
    );
}

#[test]
fn without_a_rayservice_the_graph_says_why() {
    let detail = detail(&canary_pipeline(), None, &[]);
    assert_eq!(detail.graphs.len(), 2, "stable and canary");
    assert!(detail.graphs.iter().all(|g| g.svg.is_none()));
    assert!(
        detail.graphs[0]
            .problem
            .as_deref()
            .is_some_and(|p| p.contains("no RayService")),
        "{:?}",
        detail.graphs[0]
    );
    assert_eq!(detail.plan, ["model_a: args changed"]);
    assert_eq!(detail.conditions[0].type_, "Ready");
    let json = serde_json::to_value(&detail).expect("serialises");
    assert_eq!(json["name"], "demo");
    assert_eq!(json["versions"][1]["role"], "canary");
}

#[test]
fn events_are_capped_newest_first() {
    let many: Vec<Event> = (0..EVENTS_SHOWN + 10)
        .map(|i| {
            event(
                &format!("R{i:03}"),
                &format!("2026-12-02T10:{:02}:{:02}Z", i / 60, i % 60),
                "m",
            )
        })
        .collect();
    let rows = event_rows(&many);
    assert_eq!(rows.len(), EVENTS_SHOWN);
    assert_eq!(rows[0].reason, format!("R{:03}", EVENTS_SHOWN + 9));
}
