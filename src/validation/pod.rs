//! Reading a Pod template the way the rules need it: its containers, the Ray container's
//! environment, the restart policy, and Ray version comparisons.

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec};

/// `major.minor.patch` of a Ray version such as `2.52.0` (a leading `v` and suffixes ignored).
pub(crate) fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let mut parts = text.trim().trim_start_matches('v').split('.');
    let mut next = || -> Option<u64> {
        let part = parts.next()?;
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let major = next()?;
    let minor = next().unwrap_or(0);
    let patch = next().unwrap_or(0);
    Some((major, minor, patch))
}

pub(crate) fn version_at_least(version: Option<&str>, minimum: (u64, u64, u64)) -> bool {
    version
        .and_then(parse_version)
        .is_some_and(|v| v >= minimum)
}

pub(crate) fn truthy(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true")
}

pub(crate) fn ray_container(template: &PodTemplateSpec) -> Option<&Container> {
    template.spec.as_ref().and_then(|s| s.containers.first())
}

pub(crate) fn containers(template: &PodTemplateSpec) -> &[Container] {
    template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
}

pub(crate) fn env_value<'a>(container: Option<&'a Container>, name: &str) -> Option<&'a str> {
    container?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)
        .map(|e| e.value.as_deref().unwrap_or_default())
}

pub(crate) fn has_env(container: Option<&Container>, name: &str) -> bool {
    env_value(container, name).is_some()
}

pub(crate) fn restart_policy_never_or_unset(template: &PodTemplateSpec) -> bool {
    template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .is_none_or(|p| p == "Never")
}
