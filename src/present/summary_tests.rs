//! The plugin's summaries and texts, on objects as the controller writes them.

use serde_json::json;

use super::*;

const STABLE: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const CANARY: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

fn pipeline(rollout: serde_json::Value) -> ServePipeline {
    serde_json::from_value(json!({
        "apiVersion": "raypipe.dev/v1alpha1",
        "kind": "ServePipeline",
        "metadata": {"name": "demo", "namespace": "team", "generation": 4,
                     "creationTimestamp": "2027-01-15T08:00:00Z"},
        "spec": {
            "source": {"url": "https://registry.example/g.pb"},
            "rayClusterConfig": {"headGroupSpec": {"template": {}}},
            "rollout": {"strategy": "Canary", "paused": true}
        },
        "status": {
            "observedGeneration": 4,
            "phase": "Ready",
            "rayServiceName": "demo",
            "source": {"digest": CANARY, "bytes": 10},
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Serving", "message": "",
                 "lastTransitionTime": "2027-01-15T08:00:00Z"},
                {"type": "UpToDate", "status": "False", "reason": "RolloutInProgress", "message": "",
                 "lastTransitionTime": "2027-01-15T08:00:00Z"}
            ],
            "rollout": rollout
        }
    }))
    .expect("a pipeline")
}

fn in_progress() -> ServePipeline {
    pipeline(json!({
        "phase": "Progressing",
        "generation": "7.222222222222.1",
        "stable": {"digest": STABLE, "version": "v1", "application": "demo--111111111111"},
        "canary": {"digest": CANARY, "version": "v2", "application": "demo--222222222222",
                   "step": 1, "steps": 2, "weight": 10,
                   "startedAt": "2027-01-15T08:00:00Z", "stepStartedAt": "2027-01-15T08:00:30Z",
                   "pausedAt": "2027-01-15T08:00:40Z",
                   "readings": {"canaryRequests": 40, "canaryErrors": 1, "retriedOnStable": 1,
                                "stableRequests": 360, "canaryLatencyMs": 12.5,
                                "stableLatencyMs": 11.0},
                   "plan": ["model_a: in place (num_replicas)"]}
    }))
}

#[test]
fn a_canary_in_progress_is_summarised_with_both_versions_and_the_hold() {
    let s = summary(&in_progress());
    assert_eq!((s.namespace.as_str(), s.name.as_str()), ("team", "demo"));
    assert_eq!(s.ready, "True");
    assert_eq!(s.reason, None, "a ready pipeline has no reason shown");
    assert_eq!(s.serving.as_ref().unwrap().digest, STABLE);
    let canary = s.canary.clone().unwrap();
    assert_eq!((canary.step, canary.steps, canary.weight), (1, 2, 10));
    assert!(canary.paused);
    assert_eq!(s.rollout.as_deref(), Some("Progressing"));
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["canary"]["digest"], CANARY);
    assert_eq!(json["serving"]["version"], "v1");
    assert_eq!(json["rayService"], "demo");
}

#[test]
fn the_table_lines_up_like_kubectls() {
    let rows = vec![summary(&in_progress())];
    let now = Time("2027-01-15T08:05:00Z".parse().unwrap());
    let text = table(&rows, false, &now);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].starts_with("NAME   READY   PHASE   SERVING"),
        "{text}"
    );
    assert!(lines[1].contains("v1 (111111111111)"), "{text}");
    assert!(
        lines[1].contains("v2 (222222222222) 1/2 10% paused"),
        "{text}"
    );
    assert!(lines[1].ends_with("5m"), "{text}");
    let col = lines[0].find("SERVING").unwrap();
    assert_eq!(&lines[1][col..col + 2], "v1", "columns align:\n{text}");
    let with_ns = table(&rows, true, &now);
    assert!(with_ns.starts_with("NAMESPACE   NAME"), "{with_ns}");
}

#[test]
fn rollout_text_shows_step_gates_plan_and_hold() {
    let now = Time("2027-01-15T08:02:00Z".parse().unwrap());
    let text = rollout_text(&in_progress(), &now);
    assert!(
        text.starts_with("team/demo: Progressing (strategy Canary, Ready True)"),
        "{text}"
    );
    assert!(
        text.contains("step 1 of 2, 10 % of requests, for 2m, PAUSED"),
        "{text}"
    );
    assert!(text.contains("canary 40 requests, 1 errors (1 retried on stable), latency 12.5 ms; stable 360 requests, latency 11.0 ms"), "{text}");
    assert!(
        text.contains("plan     model_a: in place (num_replicas)"),
        "{text}"
    );
}

#[test]
fn progress_waits_for_the_canary_seen_and_reads_how_it_ended() {
    assert_eq!(progress(&in_progress(), Some(CANARY)), Progress::Going);
    let ended = |result: &str| {
        pipeline(json!({
            "phase": "Stable", "generation": "8.1.s",
            "stable": {"digest": STABLE, "application": "demo--111111111111"},
            "last": {"digest": CANARY, "result": result, "reason": "ErrorRate",
                     "message": "3 of 20 failed", "at": "2027-01-15T08:03:00Z"}
        }))
    };
    assert_eq!(progress(&ended("Promoted"), Some(CANARY)), Progress::Done);
    let Progress::Failed(why) = progress(&ended("RolledBack"), Some(CANARY)) else {
        panic!("a rollback is a failed rollout")
    };
    assert!(
        why.contains("RolledBack (ErrorRate): 3 of 20 failed"),
        "{why}"
    );
    // Nothing was in progress when the wait began: a ready pipeline is done, whatever `last`
    // says (that ending is history), unless UpToDate is False.
    let mut p = ended("RolledBack");
    assert_eq!(progress(&p, None), Progress::Going, "UpToDate is False");
    p.status
        .as_mut()
        .unwrap()
        .conditions
        .retain(|c| c.type_ != "UpToDate");
    assert_eq!(progress(&p, None), Progress::Done);
    // A spec change the controller has not seen yet is not done.
    p.metadata.generation = Some(5);
    assert_eq!(progress(&p, None), Progress::Going);
}

#[test]
fn an_immediate_pipeline_serves_what_its_status_describes() {
    let mut p = pipeline(json!(null));
    p.spec.rollout = None;
    p.status.as_mut().unwrap().rollout = None;
    let s = summary(&p);
    assert_eq!(s.strategy, "Immediate");
    assert_eq!(s.serving.unwrap().digest, CANARY);
    assert!(s.canary.is_none() && s.rollout.is_none());
}

#[test]
fn ages_read_like_kubectls() {
    assert_eq!(age(-3), "0s");
    assert_eq!(age(59), "59s");
    assert_eq!(age(60), "1m");
    assert_eq!(age(7_200), "2h");
    assert_eq!(age(3 * 86_400 + 5), "3d");
    assert_eq!(short_digest(STABLE), "111111111111");
}
