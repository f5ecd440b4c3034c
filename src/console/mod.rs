//! The console (issue 35): a read-only web UI and JSON API of pipelines (their graphs drawn,
//! versions and digests, the rollout's timeline with the gates' readings, conditions and
//! Events), and each RayCluster's Ray dashboard behind the same sign-in. Who asks is
//! established by Kubernetes (TokenReview for bearer tokens) or by an OpenID Connect provider
//! (authorization code with PKCE, for browsers); what they see is what a SubjectAccessReview
//! lets them `get`. Off unless `--console-address` is set (the chart's `console.enabled`).

pub mod cookie;
pub mod metrics;
pub mod oidc;
mod page;
mod proxy;
mod server;
mod view;

pub use page::CONTENT_SECURITY_POLICY;
pub use proxy::{forwarded_headers, permission as dashboard_permission};
pub use server::{
    ConsoleConfig, ConsoleError, LOGIN_COOKIE, SESSION_COOKIE, SESSION_TTL, serve, serve_on,
};
pub use view::{PipelineDetail, detail};

use crate::config::flags::ConsoleArgs;
use crate::history::api::ApiTls;
use crate::ray::DashboardLocator;

/// Reads a secret file, trimming one trailing newline (Secrets written by hand often end in
/// one); the error names the file, never its content.
fn secret_file(path: &std::path::Path, what: &str) -> Result<Vec<u8>, ConsoleError> {
    let mut bytes = std::fs::read(path).map_err(|e| {
        ConsoleError::Settings(format!("reading the {what} from {}: {e}", path.display()))
    })?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    Ok(bytes)
}

/// The console's configuration from the operator's flags; `None` when it is off.
/// `dashboards`: where the controllers dial each head's dashboard (the same locator).
pub fn config_from_args(
    args: &ConsoleArgs,
    dashboards: Option<DashboardLocator>,
    namespaces: &[String],
) -> Result<Option<ConsoleConfig>, ConsoleError> {
    let Some(listen) = args.console_address else {
        return Ok(None);
    };
    let cookie_key = match &args.console_cookie_key_file {
        Some(path) => cookie::CookieKey::from_bytes(&secret_file(path, "console cookie key")?)
            .map_err(|e| {
                ConsoleError::Settings(format!("the cookie key in {}: {e}", path.display()))
            })?,
        None => {
            tracing::warn!(
                "no --console-cookie-key-file: browser sessions end when this process does and \
                 hold on this replica only"
            );
            cookie::CookieKey::generate().map_err(|e| ConsoleError::Settings(e.to_string()))?
        }
    };
    let oidc = match &args.console_oidc_issuer {
        None => None,
        Some(issuer) => {
            let redirect_url = args.console_oidc_redirect_url.clone().ok_or_else(|| {
                ConsoleError::Settings(
                    "--console-oidc-issuer needs --console-oidc-redirect-url \
                     (https://<console>/oauth2/callback)"
                        .into(),
                )
            })?;
            let client_secret = match &args.console_oidc_client_secret_file {
                Some(path) => Some(
                    String::from_utf8(secret_file(path, "OIDC client secret")?).map_err(|_| {
                        ConsoleError::Settings(format!(
                            "the OIDC client secret in {} is not UTF-8",
                            path.display()
                        ))
                    })?,
                ),
                None => None,
            };
            let settings = oidc::OidcSettings {
                client_secret,
                username_claim: args.console_oidc_username_claim.clone(),
                username_prefix: args.console_oidc_username_prefix.clone(),
                groups_claim: args.console_oidc_groups_claim.clone(),
                groups_prefix: args.console_oidc_groups_prefix.clone(),
                ..oidc::OidcSettings::new(issuer, &args.console_oidc_client_id, &redirect_url)
            };
            settings.validate()?;
            Some(settings)
        }
    };
    Ok(Some(ConsoleConfig {
        listen,
        tls: match (&args.console_tls_cert, &args.console_tls_key) {
            (Some(cert), Some(key)) => Some(ApiTls::new(cert.clone(), key.clone())),
            _ => None,
        },
        audiences: args.console_audiences.clone(),
        oidc,
        cookie_key,
        secure_cookies: args.console_secure_cookies,
        history_url: args.console_history_url.clone(),
        dashboards: dashboards.filter(|_| args.console_dashboards),
        namespaces: namespaces.to_vec(),
        prometheus: args
            .console_prometheus_url
            .clone()
            .map(|url| (url, args.console_prometheus_namespace_label.clone())),
    }))
}
