//! The console's HTML (pure): server-rendered pages with no script at all, so the Content
//! Security Policy can forbid every script and a hostile name in a pipeline or an Event can
//! only ever be text. Every value from Kubernetes passes through [`escape`]; the only markup
//! not built here is the graph's SVG, which `graph::draw` escapes itself.

use std::fmt::Write as _;

use super::view::{DrawnGraph, PipelineDetail, TimelineEntry};
use crate::api::servepipeline::GateReadings;
use crate::present::summary::PipelineSummary;

/// The Content-Security-Policy every page is sent with: no scripts, no frames, styles only
/// from the page itself, images only inline.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; \
     img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#202124;background:#fff}\
header{background:#174ea6;color:#fff;padding:10px 20px;display:flex;justify-content:space-between;align-items:center}\
header a{color:#fff;text-decoration:none;font-weight:600}\
main{padding:16px 20px;max-width:1200px}\
table{border-collapse:collapse;margin:8px 0 20px;min-width:50%}\
th,td{border-bottom:1px solid #dadce0;padding:4px 10px;text-align:left;vertical-align:top}\
th{background:#f1f3f4;font-weight:600}\
code{font:12px ui-monospace,monospace;background:#f1f3f4;padding:1px 4px;border-radius:3px}\
.True,.Good{color:#0d652d;font-weight:600}.False,.Bad{color:#a50e0e;font-weight:600}\
.Unknown,.Busy{color:#8a5a00;font-weight:600}\
.graph{border:1px solid #dadce0;border-radius:6px;padding:8px;margin:8px 0 20px;overflow:auto}\
.problem{color:#a50e0e}.muted{color:#5f6368}\
h1{font-size:20px}h2{font-size:16px;margin-top:24px}";

/// `text` safe as HTML text and attribute values (controls become spaces).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    crate::graph::draw::push_xml(&mut out, text);
    out
}

/// A path segment safe in a link (Kubernetes names are already, but nothing is assumed).
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The link of a pipeline's page.
pub fn pipeline_path(namespace: &str, name: &str) -> String {
    format!("/pipelines/{}/{}", segment(namespace), segment(name))
}

/// The link of a Ray cluster's dashboard through the console.
pub fn dashboard_path(namespace: &str, cluster: &str) -> String {
    format!("/dashboards/{}/{}/", segment(namespace), segment(cluster))
}

fn layout(title: &str, user: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\"><title>{title} · raypipe</title>\
         <style>{STYLE}</style></head><body><header><a href=\"/\">raypipe</a>\
         <span>{user} · <a href=\"/logout\">sign out</a></span></header><main>{body}</main>\
         </body></html>",
        title = escape(title),
        user = escape(user),
    )
}

fn version_cell(version: Option<&str>, digest: &str) -> String {
    let short = crate::api::servepipeline::short_digest(digest);
    match version {
        Some(v) => format!(
            "{} <code title=\"{}\">{}</code>",
            escape(v),
            escape(digest),
            escape(&short)
        ),
        None if digest.is_empty() => String::new(),
        None => format!(
            "<code title=\"{}\">{}</code>",
            escape(digest),
            escape(&short)
        ),
    }
}

/// The list of pipelines the caller may read.
pub fn pipelines_page(user: &str, pipelines: &[PipelineSummary]) -> String {
    let mut body = String::from("<h1>Pipelines</h1>");
    if pipelines.is_empty() {
        body.push_str("<p class=\"muted\">No pipeline you may read.</p>");
        return layout("Pipelines", user, &body);
    }
    body.push_str(
        "<table><tr><th>Namespace</th><th>Name</th><th>Ready</th><th>Phase</th>\
         <th>Serving</th><th>Canary</th><th>Rollout</th></tr>",
    );
    for p in pipelines {
        let serving = p
            .serving
            .as_ref()
            .map(|v| version_cell(v.version.as_deref(), &v.digest))
            .unwrap_or_default();
        let canary = p
            .canary
            .as_ref()
            .map(|c| {
                format!(
                    "{} step {}/{} at {} %{}",
                    version_cell(c.version.version.as_deref(), &c.version.digest),
                    c.step,
                    c.steps,
                    c.weight,
                    if c.paused { ", paused" } else { "" }
                )
            })
            .unwrap_or_default();
        let _ = write!(
            body,
            "<tr><td>{ns}</td><td><a href=\"{href}\">{name}</a></td>\
             <td class=\"{ready}\">{ready}</td><td>{phase}</td><td>{serving}</td>\
             <td>{canary}</td><td>{rollout}</td></tr>",
            ns = escape(&p.namespace),
            href = escape(&pipeline_path(&p.namespace, &p.name)),
            name = escape(&p.name),
            ready = escape(&p.ready),
            phase = escape(&p.phase),
            rollout = escape(p.rollout.as_deref().unwrap_or("")),
        );
    }
    body.push_str("</table>");
    layout("Pipelines", user, &body)
}

fn readings_text(r: &GateReadings) -> String {
    let mut text = format!(
        "canary {} requests, {} errors ({} retried on stable); stable {} requests",
        r.canary_requests, r.canary_errors, r.retried_on_stable, r.stable_requests
    );
    if let (Some(c), Some(s)) = (r.canary_latency_ms, r.stable_latency_ms) {
        let _ = write!(text, "; latency {c:.1} ms vs {s:.1} ms");
    }
    if let Some(z) = r.latency_shift_z {
        let _ = write!(text, " (shift z {z:.2})");
    }
    text
}

fn timeline_rows(entries: &[TimelineEntry]) -> String {
    let mut out = String::from(
        "<table class=\"timeline\"><tr><th>When</th><th>What</th><th>Detail</th>\
         <th>Gate readings</th></tr>",
    );
    for e in entries {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&e.at),
            escape(&e.what),
            escape(&e.message),
            e.readings
                .as_ref()
                .map(|r| escape(&readings_text(r)))
                .unwrap_or_default()
        );
    }
    out.push_str("</table>");
    out
}

fn graph_block(graph: &DrawnGraph) -> String {
    let mut out = format!("<h2>Graph ({})</h2>", escape(graph.which));
    match (&graph.svg, &graph.problem) {
        (Some(svg), _) => {
            let _ = write!(
                out,
                "<div class=\"graph\" id=\"graph-{}\">{svg}</div>",
                escape(graph.which)
            );
        }
        (None, problem) => {
            let _ = write!(
                out,
                "<p class=\"problem\">{}</p>",
                escape(problem.as_deref().unwrap_or("not drawn"))
            );
        }
    }
    out
}

fn metrics_block(detail: &PipelineDetail) -> String {
    if detail.metrics.is_empty() && detail.metrics_problem.is_none() {
        return String::new();
    }
    let mut out = String::from("<h2>Per node</h2>");
    for version in &detail.metrics {
        let _ = write!(
            out,
            "<p>{} ({}), last {}:</p><table class=\"metrics\" id=\"metrics-{}\"><tr>\
             <th>Node</th><th>Calls</th><th>Failed</th><th>Failure %</th><th>p95 ms</th></tr>",
            escape(version.role),
            escape(&version.application),
            escape(version.window),
            escape(version.role),
        );
        if version.nodes.is_empty() {
            out.push_str("<tr><td colspan=\"5\" class=\"muted\">no calls recorded</td></tr>");
        }
        for node in &version.nodes {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{:.0}</td><td>{:.0}</td><td>{}</td><td>{}</td></tr>",
                escape(&node.node),
                node.calls,
                node.failed,
                node.failure_rate
                    .map(|r| format!("{:.1}", r * 100.0))
                    .unwrap_or_default(),
                node.p95_ms.map(|p| format!("{p:.1}")).unwrap_or_default(),
            );
        }
        out.push_str("</table>");
    }
    if let Some(problem) = &detail.metrics_problem {
        let _ = write!(out, "<p class=\"problem\">{}</p>", escape(problem));
    }
    out
}

/// One pipeline's page.
pub fn pipeline_page(user: &str, detail: &PipelineDetail, history_url: Option<&str>) -> String {
    let s = &detail.summary;
    let mut body = format!(
        "<h1>{ns}/{name}</h1><p>Ready: <span class=\"{ready}\">{ready}</span> · phase {phase}\
         {reason} · strategy {strategy}</p>",
        ns = escape(&s.namespace),
        name = escape(&s.name),
        ready = escape(&s.ready),
        phase = escape(&s.phase),
        reason = s
            .reason
            .as_ref()
            .map(|r| format!(" ({})", escape(r)))
            .unwrap_or_default(),
        strategy = escape(&s.strategy),
    );
    body.push_str("<h2>Versions</h2>");
    if detail.versions.is_empty() {
        body.push_str("<p class=\"muted\">No version applied yet.</p>");
    } else {
        body.push_str(
            "<table class=\"versions\"><tr><th>Role</th><th>Version</th><th>Digest</th>\
             <th>Serve application</th><th>Weight</th></tr>",
        );
        for v in &detail.versions {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                escape(v.role),
                escape(v.version.as_deref().unwrap_or("")),
                escape(&v.digest),
                escape(&v.application),
                v.weight.map(|w| format!("{w} %")).unwrap_or_default()
            );
        }
        body.push_str("</table>");
    }
    if let Some(r) = &detail.readings {
        let _ = write!(
            body,
            "<p>This step's gate readings: {}</p>",
            escape(&readings_text(r))
        );
    }
    if !detail.plan.is_empty() {
        body.push_str("<h2>What the canary changes</h2><ul>");
        for line in &detail.plan {
            let _ = write!(body, "<li>{}</li>", escape(line));
        }
        body.push_str("</ul>");
    }
    for graph in &detail.graphs {
        body.push_str(&graph_block(graph));
    }
    body.push_str(&metrics_block(detail));
    body.push_str("<h2>Rollout</h2>");
    if detail.timeline.is_empty() {
        body.push_str("<p class=\"muted\">No rollout yet.</p>");
    } else {
        body.push_str(&timeline_rows(&detail.timeline));
    }
    body.push_str(
        "<h2>Conditions</h2><table><tr><th>Type</th><th>Status</th><th>Reason</th>\
         <th>Message</th></tr>",
    );
    for c in &detail.conditions {
        let _ = write!(
            body,
            "<tr><td>{}</td><td class=\"{st}\">{st}</td><td>{}</td><td>{}</td></tr>",
            escape(&c.type_),
            escape(&c.reason),
            escape(&c.message),
            st = escape(&c.status),
        );
    }
    body.push_str("</table><h2>Events</h2>");
    if detail.events.is_empty() {
        body.push_str("<p class=\"muted\">No Events.</p>");
    } else {
        body.push_str(
            "<table><tr><th>When</th><th>Type</th><th>Reason</th><th>Message</th>\
             <th>Count</th></tr>",
        );
        for e in &detail.events {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&e.at),
                escape(&e.type_),
                escape(&e.reason),
                escape(&e.message),
                e.count
            );
        }
        body.push_str("</table>");
    }
    body.push_str("<h2>More</h2><ul>");
    if let Some(cluster) = &detail.ray_cluster {
        let _ = write!(
            body,
            "<li><a href=\"{}\">Ray dashboard of {}</a></li>",
            escape(&dashboard_path(&s.namespace, cluster)),
            escape(cluster)
        );
    }
    if let Some(history) = history_url {
        let _ = write!(
            body,
            "<li><a href=\"{}/api/v1/namespaces/{}/pipelines/{}\">Revision history</a></li>",
            escape(history.trim_end_matches('/')),
            escape(&segment(&s.namespace)),
            escape(&segment(&s.name))
        );
    }
    let _ = write!(
        body,
        "<li><a href=\"/api/v1/namespaces/{}/pipelines/{}\">This page as JSON</a></li></ul>",
        escape(&segment(&s.namespace)),
        escape(&segment(&s.name))
    );
    layout(&format!("{}/{}", s.namespace, s.name), user, &body)
}

/// A page that says what went wrong (the status code travels with it).
pub fn problem_page(user: &str, title: &str, message: &str) -> String {
    layout(
        title,
        user,
        &format!(
            "<h1>{}</h1><p class=\"problem\">{}</p>",
            escape(title),
            escape(message)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_values_is_text() {
        assert_eq!(
            escape("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
        assert_eq!(pipeline_path("ml", "demo"), "/pipelines/ml/demo");
    }

    #[test]
    fn a_hostile_name_never_becomes_markup() {
        let summary = PipelineSummary {
            namespace: "ml".into(),
            name: "<img src=x onerror=alert(1)>".into(),
            ready: "True\"><script>".into(),
            phase: "Ready".into(),
            reason: None,
            strategy: "Canary".into(),
            serving: None,
            canary: None,
            rollout: None,
            ray_service: None,
            last: None,
            created: None,
        };
        let page = pipelines_page("alice<b>", &[summary]);
        assert!(!page.contains("<img"), "{page}");
        assert!(!page.contains("<script>"), "{page}");
        assert!(!page.contains("alice<b>"), "{page}");
        assert!(page.contains("&lt;img src=x onerror=alert(1)&gt;"));
    }
}
