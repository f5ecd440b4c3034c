//! Through a running operator: a refused source is named in the pipeline's condition.

use super::*;

// ---------------------------------------------------------------------------------------
// The operator: a refused source is named in the pipeline's condition.

/// `raypipe run` with its default policy (the test support allows the loopback unless told
/// otherwise; this test tells it the default) on the real API server.
#[tokio::test]
async fn the_operator_refuses_internal_sources_and_names_the_reason_in_the_condition() {
    use kube::api::{Api, PostParams};
    use raypipe::api::conditions;
    use raypipe::api::servepipeline::ServePipeline;

    let client = crate::support::client().await;
    let ns = crate::support::namespace(&client, "source-ssrf").await;
    let registry = Registry::start("ssrf-token").await;
    registry.put("g.pb", GRAPH.to_vec());
    let (stop_tx, operator) = crate::support::spawn_operator(
        client.clone(),
        vec![
            "--controllers=servepipeline".to_owned(),
            format!("--namespaces={ns}"),
            format!("--operator-namespace={ns}"),
            "--leader-election=false".to_owned(),
            "--admin-address=127.0.0.1:0".to_owned(),
            "--source-allowed-destinations=".to_owned(),
        ],
    );
    let port = registry.addr.port();
    let sources = [
        (
            "by-address",
            format!("http://127.0.0.1:{port}/g.pb"),
            "127.0.0.1",
        ),
        (
            "by-name",
            format!("http://localhost:{port}/g.pb"),
            "localhost",
        ),
        // Refused before any connection: nothing leaves the loopback.
        (
            "metadata",
            "http://169.254.169.254/latest/meta-data/g.pb".to_owned(),
            "169.254.169.254",
        ),
    ];
    let pipelines: Api<ServePipeline> = Api::namespaced(client.clone(), &ns);
    for (name, url, _) in &sources {
        let pipeline: ServePipeline = serde_json::from_value(serde_json::json!({
            "apiVersion": "raypipe.dev/v1alpha1", "kind": "ServePipeline",
            "metadata": {"name": name},
            "spec": {
                "source": {"url": url, "allowInsecureHttp": true},
                "rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
                    "template": {"spec": {"containers": [
                        {"name": "ray-head", "image": "rayproject/ray:2.52.0"}]}}}}
            }
        }))
        .expect("a ServePipeline");
        pipelines
            .create(&PostParams::default(), &pipeline)
            .await
            .expect("create the pipeline");
    }
    for (name, _, host) in &sources {
        let condition = crate::support::eventually(
            Duration::from_secs(60),
            &format!("{name}: SourceReady=False (DestinationNotAllowed)"),
            || {
                let pipelines = pipelines.clone();
                async move {
                    let pipeline = pipelines.get(name).await.ok()?;
                    let conds = pipeline.status?.conditions;
                    conditions::find(&conds, "SourceReady")
                        .filter(|c| c.status == "False" && c.reason == "DestinationNotAllowed")
                        .cloned()
                }
            },
        )
        .await;
        assert!(condition.message.contains(host), "{}", condition.message);
        assert!(
            condition.message.contains("--source-allowed-destinations"),
            "{}",
            condition.message
        );
    }
    assert_eq!(registry.counts().0, 0, "a refused source was contacted");
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(15), operator).await;
}
