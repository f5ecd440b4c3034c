//! Process start-up, shared by every subcommand: the rustls crypto provider and the tracing
//! subscriber. `cli` calls it before anything else runs; nothing below `cli` calls up into it.

use crate::config::flags::LogFormat;

/// Installs ring as rustls' process-wide crypto provider (kube, reqwest and rcgen share it).
pub fn init_crypto() {
    crate::tls::install_crypto_provider();
}

/// The filter in effect: a non-empty, valid `RUST_LOG` overrides `--log-level`.
fn log_filter(log_level: &str, rust_log: Option<&str>) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    rust_log
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_new(log_level).ok())
        .unwrap_or_else(|| EnvFilter::new("info"))
}

/// Installs the tracing subscriber once, filtered by `log_level` (or `RUST_LOG` when set).
pub fn init_tracing(format: LogFormat, log_level: &str) {
    use tracing_subscriber::fmt;
    // RUST_LOG is the one variable read outside the flags: a debugging override by design.
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = log_filter(log_level, rust_log.as_deref());
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_overrides_the_log_level_unless_empty_or_broken() {
        assert_eq!(log_filter("warn", None).to_string(), "warn");
        assert_eq!(log_filter("warn", Some("debug")).to_string(), "debug");
        // An empty or broken RUST_LOG does not silence the operator: the flag applies.
        assert_eq!(log_filter("warn", Some(" ")).to_string(), "warn");
        assert_eq!(log_filter("warn", Some("x=[")).to_string(), "warn");
    }
}
