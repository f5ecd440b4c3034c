//! Finding a Ray cluster's dashboard.
//!
//! In a cluster the operator dials the head Service by its DNS name,
//! `http://<head-svc>.<namespace>.svc.<cluster domain>:<dashboard port>` (the port is the head
//! Service's port named `dashboard`, as KubeRay does). Out of the cluster (`raypipe dev`, tests)
//! a [`DashboardLocator`] built from a template or a resolver function sends it somewhere else,
//! typically a Ray head on 127.0.0.1. A Service cluster IP is never used: from outside the
//! cluster it is not routable, and inside it the DNS name is the stable address.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use reqwest::Url;

use super::error::DashboardError;

/// The port name KubeRay gives the dashboard on the head Service.
pub const DASHBOARD_PORT_NAME: &str = "dashboard";
/// Ray's default dashboard port, used when the head Service has no port named `dashboard`.
pub const DEFAULT_DASHBOARD_PORT: u16 = 8265;
/// The cluster DNS domain unless `--cluster-domain` (KubeRay's `CLUSTER_DOMAIN`) says otherwise.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// The base URL of one Ray dashboard: `http(s)://host:port` plus an optional path prefix (for
/// instance the API server's Service proxy path). Never holds credentials, a query or a fragment.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DashboardUrl(Url);

impl DashboardUrl {
    pub fn parse(url: &str) -> Result<DashboardUrl, DashboardError> {
        let invalid = |problem: &str| DashboardError::InvalidUrl {
            url: url.to_owned(),
            problem: problem.to_owned(),
        };
        let parsed = Url::parse(url).map_err(|e| invalid(&e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid("the scheme must be http or https"));
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(invalid("it has no host"));
        }
        // Credentials in a URL end up in logs and error messages; the token has its own field.
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(DashboardError::InvalidUrl {
                url: "<redacted: the URL holds credentials>".to_owned(),
                problem: "credentials in the URL are not allowed; use the bearer token option"
                    .to_owned(),
            });
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(invalid("a query or fragment is not allowed in a base URL"));
        }
        Ok(DashboardUrl(parsed))
    }

    /// The URL of an API path below this base: `segments` are appended one by one (each is
    /// percent-encoded, so a job id cannot add path segments); an empty last segment yields
    /// the trailing slash several Ray endpoints require.
    pub fn join(&self, segments: &[&str]) -> Url {
        let mut url = self.0.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str().trim_end_matches('/')
    }

    /// Host and port, e.g. for logs.
    pub fn authority(&self) -> String {
        match self.0.port_or_known_default() {
            Some(port) => format!("{}:{port}", self.0.host_str().unwrap_or_default()),
            None => self.0.host_str().unwrap_or_default().to_owned(),
        }
    }
}

impl fmt::Display for DashboardUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for DashboardUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DashboardUrl({})", self.as_str())
    }
}

/// The head Service of a Ray cluster, as far as finding its dashboard needs it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HeadService {
    pub namespace: String,
    pub name: String,
    pub dashboard_port: u16,
}

impl HeadService {
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        dashboard_port: u16,
    ) -> HeadService {
        HeadService {
            namespace: namespace.into(),
            name: name.into(),
            dashboard_port,
        }
    }

    /// Reads namespace, name and the port named `dashboard` from a head Service object
    /// (Ray's default 8265 when no port has that name).
    pub fn from_service(service: &Service) -> Result<HeadService, DashboardError> {
        let namespace = service.metadata.namespace.clone().unwrap_or_default();
        let name = service.metadata.name.clone().unwrap_or_default();
        if name.is_empty() || namespace.is_empty() {
            return Err(DashboardError::NotLocated {
                namespace,
                service: name,
                problem: "the Service object has no name or namespace".to_owned(),
            });
        }
        let ports = service.spec.as_ref().and_then(|spec| spec.ports.as_ref());
        let dashboard_port = ports
            .and_then(|ports| {
                ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(DASHBOARD_PORT_NAME))
            })
            .map(|p| p.port);
        let dashboard_port = match dashboard_port {
            None => DEFAULT_DASHBOARD_PORT,
            Some(port) => u16::try_from(port).map_err(|_| DashboardError::NotLocated {
                namespace: namespace.clone(),
                service: name.clone(),
                problem: format!("its {DASHBOARD_PORT_NAME} port {port} is not a TCP port number"),
            })?,
        };
        Ok(HeadService {
            namespace,
            name,
            dashboard_port,
        })
    }
}

type Resolver = Arc<dyn Fn(&HeadService) -> Result<String, String> + Send + Sync>;

/// Turns a head Service into the dashboard URL to dial. Cheap to clone.
#[derive(Clone)]
pub struct DashboardLocator(Strategy);

#[derive(Clone)]
enum Strategy {
    InCluster { cluster_domain: String },
    Template(String),
    Fixed(DashboardUrl),
    Resolver(Resolver),
}

/// Placeholders a template may use.
const TEMPLATE_PLACEHOLDERS: [&str; 4] = ["namespace", "service", "port", "domain"];

impl DashboardLocator {
    /// The head Service's DNS name in `cluster.local` (the operator's settings pass the
    /// configured domain to [`DashboardLocator::in_cluster_with_domain`]).
    pub fn in_cluster() -> DashboardLocator {
        DashboardLocator::in_cluster_with_domain(DEFAULT_CLUSTER_DOMAIN)
    }

    pub fn in_cluster_with_domain(cluster_domain: impl Into<String>) -> DashboardLocator {
        let cluster_domain = cluster_domain.into().trim_matches('.').to_owned();
        DashboardLocator(Strategy::InCluster { cluster_domain })
    }

    /// A URL template with the placeholders `{namespace}`, `{service}`, `{port}` (the
    /// dashboard port) and `{domain}`, e.g.
    /// `http://127.0.0.1:8001/api/v1/namespaces/{namespace}/services/{service}:dashboard/proxy`
    /// (through `kubectl proxy`) or `http://127.0.0.1:8265` (one local Ray head for every
    /// cluster). Checked here, so a typo fails at start-up rather than at the first reconcile.
    pub fn template(template: impl Into<String>) -> Result<DashboardLocator, DashboardError> {
        let template = template.into();
        let sample = HeadService::new("namespace", "service", DEFAULT_DASHBOARD_PORT);
        DashboardUrl::parse(&render_template(
            &template,
            &sample,
            DEFAULT_CLUSTER_DOMAIN,
        )?)?;
        Ok(DashboardLocator(Strategy::Template(template)))
    }

    /// Every head Service maps to the same dashboard.
    pub fn fixed(url: &str) -> Result<DashboardLocator, DashboardError> {
        Ok(DashboardLocator(Strategy::Fixed(DashboardUrl::parse(url)?)))
    }

    /// A function that knows where each head's dashboard is (tests map clusters to the Ray
    /// heads they started). `None` means "unknown head": an error, never a fallback to DNS.
    pub fn resolver(
        resolve: impl Fn(&HeadService) -> Option<String> + Send + Sync + 'static,
    ) -> DashboardLocator {
        DashboardLocator::explaining_resolver(move |head| {
            resolve(head).ok_or_else(|| {
                "the configured dashboard resolver does not know this head".to_owned()
            })
        })
    }

    /// A resolver that says why it cannot name a head's dashboard yet (`raypipe dev` while
    /// it starts a Ray head for a RayService); the reason becomes the locate error.
    pub fn explaining_resolver(
        resolve: impl Fn(&HeadService) -> Result<String, String> + Send + Sync + 'static,
    ) -> DashboardLocator {
        DashboardLocator(Strategy::Resolver(Arc::new(resolve)))
    }

    pub fn locate(&self, head: &HeadService) -> Result<DashboardUrl, DashboardError> {
        let not_located = |problem: String| DashboardError::NotLocated {
            namespace: head.namespace.clone(),
            service: head.name.clone(),
            problem,
        };
        match &self.0 {
            Strategy::InCluster { cluster_domain } => DashboardUrl::parse(&format!(
                "http://{}.{}.svc.{cluster_domain}:{}",
                head.name, head.namespace, head.dashboard_port
            ))
            .map_err(|e| not_located(e.to_string())),
            Strategy::Template(template) => {
                DashboardUrl::parse(&render_template(template, head, DEFAULT_CLUSTER_DOMAIN)?)
                    .map_err(|e| not_located(e.to_string()))
            }
            Strategy::Fixed(url) => Ok(url.clone()),
            Strategy::Resolver(resolve) => match resolve(head) {
                Ok(url) => DashboardUrl::parse(&url).map_err(|e| not_located(e.to_string())),
                Err(why) => Err(not_located(why)),
            },
        }
    }
}

impl fmt::Debug for DashboardLocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Strategy::InCluster { cluster_domain } => {
                write!(f, "DashboardLocator::InCluster({cluster_domain})")
            }
            Strategy::Template(template) => write!(f, "DashboardLocator::Template({template})"),
            Strategy::Fixed(url) => write!(f, "DashboardLocator::Fixed({url})"),
            Strategy::Resolver(_) => f.write_str("DashboardLocator::Resolver"),
        }
    }
}

fn render_template(
    template: &str,
    head: &HeadService,
    domain: &str,
) -> Result<String, DashboardError> {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| DashboardError::InvalidUrl {
            url: template.to_owned(),
            problem: "unclosed '{' in the template".to_owned(),
        })?;
        match &after[..close] {
            "namespace" => out.push_str(&head.namespace),
            "service" => out.push_str(&head.name),
            "port" => out.push_str(&head.dashboard_port.to_string()),
            "domain" => out.push_str(domain),
            other => {
                return Err(DashboardError::InvalidUrl {
                    url: template.to_owned(),
                    problem: format!(
                        "unknown placeholder {{{other}}}; known: {}",
                        TEMPLATE_PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")
                    ),
                });
            }
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> HeadService {
        HeadService::new("team-a", "llm-raycluster-x7k2p-head-svc", 8265)
    }

    #[test]
    fn in_cluster_uses_the_service_dns_name_and_dashboard_port() {
        let url = DashboardLocator::in_cluster_with_domain("cluster.local")
            .locate(&head())
            .expect("located");
        assert_eq!(
            url.as_str(),
            "http://llm-raycluster-x7k2p-head-svc.team-a.svc.cluster.local:8265"
        );
        let custom = DashboardLocator::in_cluster_with_domain("corp.example.")
            .locate(&head())
            .expect("located");
        assert_eq!(
            custom.as_str(),
            "http://llm-raycluster-x7k2p-head-svc.team-a.svc.corp.example:8265"
        );
    }

    #[test]
    fn templates_fill_placeholders_and_reject_unknown_ones() {
        let locator = DashboardLocator::template(
            "http://127.0.0.1:8001/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy",
        )
        .expect("valid template");
        let url = locator.locate(&head()).expect("located");
        assert_eq!(
            url.join(&["api", "jobs", ""]).as_str(),
            "http://127.0.0.1:8001/api/v1/namespaces/team-a/services/llm-raycluster-x7k2p-head-svc:8265/proxy/api/jobs/"
        );
        let error =
            DashboardLocator::template("http://{host}:8265").expect_err("unknown placeholder");
        assert!(error.to_string().contains("{host}"), "{error}");
        assert!(DashboardLocator::template("http://{service:8265").is_err());
    }

    #[test]
    fn fixed_and_resolver_locators_point_out_of_the_cluster() {
        let fixed = DashboardLocator::fixed("http://127.0.0.1:40123/").expect("valid");
        assert_eq!(
            fixed.locate(&head()).expect("located").as_str(),
            "http://127.0.0.1:40123"
        );

        let resolver = DashboardLocator::resolver(|head| {
            (head.namespace == "team-a").then(|| "http://127.0.0.1:40124".to_owned())
        });
        assert_eq!(
            resolver.locate(&head()).expect("located").authority(),
            "127.0.0.1:40124"
        );
        let unknown = resolver
            .locate(&HeadService::new("other", "svc", 8265))
            .expect_err("unknown head is an error, not a DNS lookup");
        assert!(
            matches!(unknown, DashboardError::NotLocated { .. }),
            "{unknown}"
        );

        let starting =
            DashboardLocator::explaining_resolver(|_| Err("its head is starting".into()))
                .locate(&head())
                .expect_err("not located yet");
        assert!(
            starting.to_string().contains("its head is starting"),
            "{starting}"
        );
    }

    #[test]
    fn base_urls_with_credentials_queries_or_odd_schemes_are_refused() {
        let with_password =
            DashboardUrl::parse("http://user:s3cret@127.0.0.1:8265").expect_err("credentials");
        assert!(
            !with_password.to_string().contains("s3cret"),
            "{with_password}"
        );
        assert!(DashboardUrl::parse("http://127.0.0.1:8265/?x=1").is_err());
        assert!(DashboardUrl::parse("ftp://127.0.0.1").is_err());
        assert!(DashboardUrl::parse("not a url").is_err());
    }

    #[test]
    fn join_keeps_trailing_slashes_and_encodes_ids() {
        let base = DashboardUrl::parse("http://127.0.0.1:8265").expect("valid");
        assert_eq!(
            base.join(&["api", "serve", "applications", ""]).path(),
            "/api/serve/applications/"
        );
        assert_eq!(
            base.join(&["api", "jobs", "a/b c", "logs"]).path(),
            "/api/jobs/a%2Fb%20c/logs"
        );
    }

    #[test]
    fn head_service_from_a_service_object_uses_the_dashboard_port_by_name() {
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c-head-svc", "namespace": "ns"},
            "spec": {"ports": [{"name": "gcs-server", "port": 6379}, {"name": "dashboard", "port": 18265}]}
        }))
        .expect("a valid Service");
        assert_eq!(
            HeadService::from_service(&service).expect("head"),
            HeadService::new("ns", "c-head-svc", 18265)
        );

        let without: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c-head-svc", "namespace": "ns"}, "spec": {"ports": []}
        }))
        .expect("a valid Service");
        assert_eq!(
            HeadService::from_service(&without)
                .expect("head")
                .dashboard_port,
            DEFAULT_DASHBOARD_PORT
        );
    }
}
