//! The Serve part of the dashboard API: what `GET /api/serve/applications/` answers, and the
//! YAML → JSON step between a RayService's `serveConfigV2` and `PUT /api/serve/applications/`
//! (the REST API only takes JSON; YAML gets a 500 with a Python traceback).
//!
//! Every response field is optional and unknown fields are ignored: Ray omits unset fields and
//! adds new ones in most releases.

use std::collections::BTreeMap;

use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::client::RayDashboardClient;
use super::error::DashboardError;
use super::lenient::{self, ray_enum};

ray_enum! {
    /// Status of one Serve application.
    ApplicationStatus {
        NotStarted = "NOT_STARTED",
        Deploying = "DEPLOYING",
        DeployFailed = "DEPLOY_FAILED",
        Running = "RUNNING",
        Unhealthy = "UNHEALTHY",
        Deleting = "DELETING",
    }
}

impl ApplicationStatus {
    /// The application is broken (build/import failed, replicas keep failing, or health checks
    /// fail): its `message` says why.
    pub fn is_failed(&self) -> bool {
        matches!(
            self,
            ApplicationStatus::DeployFailed | ApplicationStatus::Unhealthy
        )
    }

    /// Serve is still working on it.
    pub fn is_in_progress(&self) -> bool {
        matches!(
            self,
            ApplicationStatus::NotStarted
                | ApplicationStatus::Deploying
                | ApplicationStatus::Deleting
        )
    }
}

ray_enum! {
    /// Status of one deployment inside an application.
    DeploymentStatus {
        Updating = "UPDATING",
        Healthy = "HEALTHY",
        Unhealthy = "UNHEALTHY",
        DeployFailed = "DEPLOY_FAILED",
        Upscaling = "UPSCALING",
        Downscaling = "DOWNSCALING",
    }
}

ray_enum! {
    /// State of one replica actor.
    ReplicaState {
        Starting = "STARTING",
        Updating = "UPDATING",
        Recovering = "RECOVERING",
        Running = "RUNNING",
        Stopping = "STOPPING",
        Stopped = "STOPPED",
        PendingMigration = "PENDING_MIGRATION",
    }
}

ray_enum! {
    /// Status of a Serve HTTP proxy.
    ProxyStatus {
        Starting = "STARTING",
        Healthy = "HEALTHY",
        Unhealthy = "UNHEALTHY",
        Draining = "DRAINING",
        Drained = "DRAINED",
    }
}

/// `GET /api/serve/applications/` (Ray's `ServeInstanceDetails`). When Serve is not running,
/// every field is empty.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServeInstanceDetails {
    /// Application name → details. Only applications that exist are listed.
    #[serde(deserialize_with = "lenient::map")]
    pub applications: BTreeMap<String, ApplicationDetails>,
    #[serde(deserialize_with = "lenient::option")]
    pub proxy_location: Option<String>,
    /// The options Serve's HTTP proxies actually run with (fixed when Serve first started).
    #[serde(deserialize_with = "lenient::option")]
    pub http_options: Option<HttpOptions>,
    /// Node id → proxy.
    #[serde(deserialize_with = "lenient::map")]
    pub proxies: BTreeMap<String, ProxyDetails>,
    #[serde(deserialize_with = "lenient::option")]
    pub target_capacity: Option<f64>,
    /// The Serve controller actor; empty when Serve is not running.
    #[serde(deserialize_with = "lenient::option")]
    pub controller_info: Option<serde_json::Value>,
}

impl ServeInstanceDetails {
    /// KubeRay's readiness rule: at least one application, and every application RUNNING.
    pub fn all_applications_running(&self) -> bool {
        !self.applications.is_empty()
            && self
                .applications
                .values()
                .all(|app| app.status == Some(ApplicationStatus::Running))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HttpOptions {
    #[serde(deserialize_with = "lenient::option")]
    pub host: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub port: Option<u16>,
    #[serde(deserialize_with = "lenient::option")]
    pub root_path: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProxyDetails {
    #[serde(deserialize_with = "lenient::option")]
    pub node_id: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub node_ip: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub actor_name: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub status: Option<ProxyStatus>,
}

/// One application (`applications.<name>`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApplicationDetails {
    #[serde(deserialize_with = "lenient::option")]
    pub name: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub status: Option<ApplicationStatus>,
    /// Empty when all is well; the full Python traceback for `DEPLOY_FAILED`.
    #[serde(deserialize_with = "lenient::option")]
    pub message: Option<String>,
    /// Unix seconds of the last PUT that touched this application.
    #[serde(deserialize_with = "lenient::option")]
    pub last_deployed_time_s: Option<f64>,
    /// `None` while building, after a failed build, or when not exposed over HTTP.
    #[serde(deserialize_with = "lenient::option")]
    pub route_prefix: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub docs_path: Option<String>,
    /// `declarative`, `imperative` or `unknown`.
    #[serde(deserialize_with = "lenient::option")]
    pub source: Option<String>,
    /// Echo of the submitted application entry (only the fields that were set).
    #[serde(deserialize_with = "lenient::option")]
    pub deployed_app_config: Option<serde_json::Value>,
    /// Deployment name → details; empty until the application is built.
    #[serde(deserialize_with = "lenient::map")]
    pub deployments: BTreeMap<String, DeploymentDetails>,
}

/// One deployment (`applications.<app>.deployments.<name>`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeploymentDetails {
    #[serde(deserialize_with = "lenient::option")]
    pub name: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub status: Option<DeploymentStatus>,
    /// Why the status is what it is, e.g. `CONFIG_UPDATE_COMPLETED`, `REPLICA_STARTUP_FAILED`.
    #[serde(deserialize_with = "lenient::option")]
    pub status_trigger: Option<String>,
    /// E.g. a scheduling delay ("taken more than 30s to be scheduled …") or a health-check failure.
    #[serde(deserialize_with = "lenient::option")]
    pub message: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub target_num_replicas: Option<u32>,
    /// Per replica, e.g. `{"CPU": 0.1}`.
    #[serde(deserialize_with = "lenient::map")]
    pub required_resources: BTreeMap<String, f64>,
    #[serde(deserialize_with = "lenient::list")]
    pub replicas: Vec<ReplicaDetails>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReplicaDetails {
    #[serde(deserialize_with = "lenient::option")]
    pub replica_id: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub state: Option<ReplicaState>,
    #[serde(deserialize_with = "lenient::option")]
    pub pid: Option<u32>,
    #[serde(deserialize_with = "lenient::option")]
    pub actor_name: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub node_id: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub node_ip: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub start_time_s: Option<f64>,
    #[serde(deserialize_with = "lenient::option")]
    pub log_file_path: Option<String>,
}

/// Converts a Serve config written as YAML (a RayService's `serveConfigV2`) into the JSON
/// object `PUT /api/serve/applications/` takes. The document must be a single mapping.
///
/// YAML is read as YAML 1.2: `yes`/`on` stay strings (KubeRay's Go parser reads them as
/// booleans), so booleans must be written `true`/`false`.
pub fn serve_config_yaml_to_json(yaml: &str) -> Result<serde_json::Value, DashboardError> {
    let value: serde_json::Value =
        serde_yaml::from_str(yaml).map_err(|e| DashboardError::InvalidServeConfig {
            problem: format!("not valid YAML: {e}"),
        })?;
    match value {
        serde_json::Value::Object(_) => Ok(value),
        serde_json::Value::Null => Err(DashboardError::InvalidServeConfig {
            problem: "the config is empty".to_owned(),
        }),
        other => Err(DashboardError::InvalidServeConfig {
            problem: format!(
                "expected a mapping with `applications`, found {}",
                json_kind(&other)
            ),
        }),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "nothing",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}

/// The Serve API calls (`/api/serve/applications/`).
impl RayDashboardClient {
    pub async fn get_serve_applications(&self) -> Result<ServeInstanceDetails, DashboardError> {
        // The trailing slash matters: without it Ray answers 404.
        self.call(
            Method::GET,
            &["api", "serve", "applications", ""],
            Some(("api_type", "declarative")),
            None,
        )
        .await?
        .into_success()?
        .decode()
    }

    pub async fn put_serve_applications(
        &self,
        config: &serde_json::Value,
    ) -> Result<(), DashboardError> {
        if !config.is_object() {
            return Err(DashboardError::InvalidServeConfig {
                problem: "the config must be a JSON object with `applications`".to_owned(),
            });
        }
        let body = serde_json::to_vec(config).map_err(|e| DashboardError::InvalidServeConfig {
            problem: e.to_string(),
        })?;
        self.call(
            Method::PUT,
            &["api", "serve", "applications", ""],
            None,
            Some(body),
        )
        .await?
        .into_success()?;
        Ok(())
    }

    pub async fn delete_serve_applications(&self) -> Result<(), DashboardError> {
        self.call(
            Method::DELETE,
            &["api", "serve", "applications", ""],
            None,
            None,
        )
        .await?
        .into_success()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The trimmed Ray 2.60 answer from the reference notes, plus fields this code does not
    /// model (which must be ignored).
    const OBSERVED: &str = r#"{"controller_info": {"actor_name": "SERVE_CONTROLLER_ACTOR", "node_id": "75858f", "log_file_path": "/serve/controller_16567.log"},
 "proxy_location": "HeadOnly",
 "http_options": {"host": "127.0.0.1", "port": 8010, "root_path": "", "request_timeout_s": null, "keep_alive_timeout_s": 90},
 "proxies": {"75858f": {"actor_name": "SERVE_PROXY_ACTOR-75858f", "status": "HEALTHY"}},
 "applications": {"graph1": {"name": "graph1", "route_prefix": "/g1", "docs_path": null, "status": "RUNNING", "message": "",
   "last_deployed_time_s": 1795315045.2, "source": "declarative", "external_scaler_enabled": false,
   "deployed_app_config": {"name": "graph1", "route_prefix": "/g1", "import_path": "dagapp:build", "args": {"fa": 5}},
   "deployment_topology": {"ingress_deployment": "Ingress", "nodes": {"Ingress": {"is_ingress": true, "outbound_deployments": [{"name": "model_a", "app_name": "graph1"}]}}},
   "deployments": {"model_a": {"name": "model_a", "status": "HEALTHY", "status_trigger": "CONFIG_UPDATE_COMPLETED", "message": "",
     "target_num_replicas": 1, "required_resources": {"CPU": 0.1},
     "replicas": [{"replica_id": "8onxirft", "state": "RUNNING", "pid": 25615, "start_time_s": 1795315047.9}]}}}},
 "target_capacity": null, "restores_unset_config_options": true}"#;

    #[test]
    fn reads_an_observed_ray_answer() {
        let details: ServeInstanceDetails = serde_json::from_str(OBSERVED).expect("decodes");
        assert!(details.all_applications_running());
        assert_eq!(details.proxy_location.as_deref(), Some("HeadOnly"));
        assert_eq!(
            details.http_options.as_ref().and_then(|o| o.port),
            Some(8010)
        );
        assert_eq!(details.proxies["75858f"].status, Some(ProxyStatus::Healthy));
        let app = &details.applications["graph1"];
        assert_eq!(app.status, Some(ApplicationStatus::Running));
        assert_eq!(app.route_prefix.as_deref(), Some("/g1"));
        assert_eq!(app.docs_path, None);
        let deployment = &app.deployments["model_a"];
        assert_eq!(deployment.status, Some(DeploymentStatus::Healthy));
        assert_eq!(deployment.required_resources["CPU"], 0.1);
        assert_eq!(deployment.replicas[0].state, Some(ReplicaState::Running));
        assert_eq!(deployment.replicas[0].pid, Some(25615));
    }

    #[test]
    fn serve_not_running_reads_as_empty() {
        let details: ServeInstanceDetails = serde_json::from_str(
            r#"{"controller_info": {}, "proxies": {}, "applications": {}, "target_capacity": null}"#,
        )
        .expect("decodes");
        assert!(details.applications.is_empty());
        assert!(!details.all_applications_running());
        assert_eq!(details.target_capacity, None);
        let deleting: ApplicationDetails =
            serde_json::from_value(json!({"status": "DELETING", "deployed_app_config": null}))
                .expect("decodes");
        assert_eq!(deleting.deployed_app_config, None);
        let nothing: ServeInstanceDetails = serde_json::from_str("{}").expect("decodes");
        assert_eq!(nothing, ServeInstanceDetails::default());
    }

    #[test]
    fn unexpected_types_and_values_do_not_break_the_rest() {
        let details: ServeInstanceDetails = serde_json::from_value(json!({
            "applications": {
                "a": {"status": "SOME_FUTURE_STATUS", "message": 42, "deployments": null,
                      "last_deployed_time_s": "yesterday"},
                "b": {"status": "DEPLOY_FAILED", "message": "Traceback …\nModuleNotFoundError: No module named 'x'",
                      "deployments": {"d": {"status": "UPDATING", "replicas": [{"state": "STARTING"}, "junk"],
                                            "target_num_replicas": -3}}},
                "c": "not an object"
            },
            "proxies": [],
            "http_options": "odd"
        }))
        .expect("decodes");
        let a = &details.applications["a"];
        assert_eq!(
            a.status,
            Some(ApplicationStatus::Other("SOME_FUTURE_STATUS".into()))
        );
        assert_eq!(a.message, None);
        assert_eq!(a.last_deployed_time_s, None);
        assert!(a.deployments.is_empty());
        let b = &details.applications["b"];
        assert!(b.status.as_ref().is_some_and(ApplicationStatus::is_failed));
        assert!(
            b.message
                .as_deref()
                .is_some_and(|m| m.contains("ModuleNotFoundError"))
        );
        assert_eq!(b.deployments["d"].replicas.len(), 1);
        assert_eq!(b.deployments["d"].target_num_replicas, None);
        assert!(!details.applications.contains_key("c"));
        assert!(details.proxies.is_empty());
        assert_eq!(details.http_options, None);
    }

    #[test]
    fn statuses_round_trip_through_their_ray_names() {
        for status in [
            "NOT_STARTED",
            "DEPLOYING",
            "DEPLOY_FAILED",
            "RUNNING",
            "UNHEALTHY",
            "DELETING",
            "NEW",
        ] {
            let parsed = ApplicationStatus::from(status.to_owned());
            assert_eq!(parsed.as_str(), status);
            assert_eq!(
                serde_json::to_value(&parsed).expect("serialises"),
                json!(status)
            );
        }
        assert!(ApplicationStatus::Deploying.is_in_progress());
        assert!(
            !ApplicationStatus::Running.is_in_progress() && !ApplicationStatus::Running.is_failed()
        );
    }

    #[test]
    fn yaml_serve_configs_become_json_objects() {
        let yaml = r#"
proxy_location: HeadOnly
http_options:
  host: 127.0.0.1
  port: 8000
applications:
  - name: fraud
    route_prefix: /fraud
    import_path: opgraph.runtime:build_app
    runtime_env:
      env_vars: {GRAPH_ID: "007", ENABLED: "true"}
    deployments:
      - name: model_a
        num_replicas: auto
        max_ongoing_requests: 16
        ray_actor_options: {num_cpus: 0.1, memory: 4294967296}
        user_config: {threshold: 0.7}
"#;
        let json = serve_config_yaml_to_json(yaml).expect("converts");
        assert_eq!(
            json,
            json!({
                "proxy_location": "HeadOnly",
                "http_options": {"host": "127.0.0.1", "port": 8000},
                "applications": [{
                    "name": "fraud", "route_prefix": "/fraud", "import_path": "opgraph.runtime:build_app",
                    "runtime_env": {"env_vars": {"GRAPH_ID": "007", "ENABLED": "true"}},
                    "deployments": [{"name": "model_a", "num_replicas": "auto", "max_ongoing_requests": 16,
                                     "ray_actor_options": {"num_cpus": 0.1, "memory": 4294967296_u64},
                                     "user_config": {"threshold": 0.7}}]
                }]
            })
        );
    }

    #[test]
    fn yaml_that_is_not_one_mapping_is_refused() {
        for (yaml, expected) in [
            ("", "empty"),
            ("- a\n- b\n", "a list"),
            ("just text", "a string"),
            ("applications: [\n", "not valid YAML"),
            (
                "applications: []\n---\napplications: []\n",
                "not valid YAML",
            ),
        ] {
            let error = serve_config_yaml_to_json(yaml).expect_err(yaml);
            assert!(error.to_string().contains(expected), "{yaml:?}: {error}");
        }
    }
}
