//! Kubernetes' own syntax rules for names and labels (DNS-1123/1035 labels, subdomains,
//! qualified names) and the name check every kind shares: written once, used by the rules of
//! every kind.

use super::problem::Problems;

pub(crate) fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(crate) fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
pub(crate) fn is_qualified_name_part(s: &str) -> bool {
    let bytes = s.as_bytes();
    !s.is_empty()
        && s.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A label key: optional DNS subdomain prefix and `/`, then a name part.
pub(crate) fn is_label_key(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(s),
    }
}

pub(crate) fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

pub(crate) fn check_name(kind: &str, name: &str, max: usize, problems: &mut Problems) {
    if name.len() > max {
        problems.push(format!(
            "metadata.name: {kind} names may have at most {max} characters (this one has {}), because child object names are derived from it",
            name.len()
        ));
    }
    if !is_dns1035_label(name) {
        problems.push(format!(
            "metadata.name: {name:?} is not a DNS-1035 label (lower-case letters, digits and '-', starting with a letter and ending with a letter or digit)"
        ));
    }
}

/// The name rule of a kind KubeRay's controller also checks: the webhook's words for each
/// problem, KubeRay's for the first (too long, else not a DNS-1035 label; `dns_hint` follows
/// that message, KubeRay words it per kind).
pub(crate) fn check_name_kuberay(
    kind: &str,
    name: &str,
    max: usize,
    dns_hint: &str,
    problems: &mut Problems,
) {
    let mut webhook = Problems::new("", "");
    check_name(kind, name, max, &mut webhook);
    let kuberay = if name.len() > max {
        Some(format!(
            "the {kind} name {name:?} is longer than {max} characters"
        ))
    } else if !is_dns1035_label(name) {
        Some(format!(
            "the {kind} name {name:?} is not a DNS-1035 label{dns_hint}"
        ))
    } else {
        None
    };
    problems.judged_all(
        "metadata.name",
        webhook.into_vec().into_iter().map(|p| p.message).collect(),
        kuberay,
    );
}
