//! Where a fetch may connect (issue 14, class 7: SSRF). A `source.url` is tenant input, so by
//! default the fetcher only talks to public addresses; the operator's allow-list
//! (`--source-allowed-destinations`) admits networks and exact host names beyond that, such as
//! an in-cluster registry.
//!
//! The check runs on the address actually dialled: [`GuardedResolver`] resolves each host name
//! itself and hands reqwest only addresses it admitted, so a name that resolves differently the
//! next time (DNS rebinding) gains nothing. IP-literal hosts never reach a resolver, so the
//! fetcher checks them on the first URL and on every redirect hop ([`check_literal_host`]).
//!
//! Deliberate: a name that does not resolve is refused with the same error as a name that
//! resolves to a private address, so a tenant cannot probe which internal names exist.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Longest allow-list entry accepted (a DNS name is at most 253 characters).
const MAX_ENTRY_LEN: usize = 253;

/// An allow-list entry that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{entry:?} is not an allowed destination: expected a CIDR (10.0.0.0/8, fd00::/8), an IP \
     address, or an exact host name (registry.models.svc.cluster.local)"
)]
pub struct DestinationParseError {
    entry: String,
}

/// An IP network: an address and a prefix length. Host bits are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNetwork {
    address: IpAddr,
    prefix: u8,
}

impl IpNetwork {
    /// `None` when `prefix` is longer than the address.
    pub fn new(address: IpAddr, prefix: u8) -> Option<Self> {
        let bits = match address {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        (prefix <= bits).then_some(Self { address, prefix })
    }

    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.address, address) {
            (IpAddr::V4(network), IpAddr::V4(address)) => prefix_matches(
                u32::from(network).into(),
                u32::from(address).into(),
                32,
                self.prefix,
            ),
            (IpAddr::V6(network), IpAddr::V6(address)) => {
                prefix_matches(network.into(), address.into(), 128, self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_matches(network: u128, address: u128, bits: u8, prefix: u8) -> bool {
    if prefix == 0 {
        return true;
    }
    let shift = u32::from(bits.saturating_sub(prefix));
    network.checked_shr(shift) == address.checked_shr(shift)
}

impl FromStr for IpNetwork {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        match text.split_once('/') {
            Some((address, prefix)) => {
                let address: IpAddr = address.parse().map_err(|_| ())?;
                // Digits only: `u8::from_str` would also take "+8".
                if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(());
                }
                let prefix: u8 = prefix.parse().map_err(|_| ())?;
                IpNetwork::new(address, prefix).ok_or(())
            }
            None => {
                let address: IpAddr = text.parse().map_err(|_| ())?;
                let prefix = if address.is_ipv4() { 32 } else { 128 };
                Ok(IpNetwork { address, prefix })
            }
        }
    }
}

impl fmt::Display for IpNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// One allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedDestination {
    /// Any address in this network.
    Network(IpNetwork),
    /// This exact host name (lower case, no trailing dot), whatever it resolves to: for
    /// in-cluster registries whose DNS the operator's administrator controls.
    Host(String),
}

impl FromStr for AllowedDestination {
    type Err = DestinationParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let entry = text.trim();
        let error = || DestinationParseError {
            entry: entry.chars().take(MAX_ENTRY_LEN).collect(),
        };
        if let Ok(network) = entry.parse::<IpNetwork>() {
            return Ok(AllowedDestination::Network(network));
        }
        let host = normalise_host(entry);
        // A host name: DNS labels of letters, digits and hyphens. Anything with a '/' or ':'
        // was meant as a network and is wrong; wildcards are not offered on purpose.
        let valid = !host.is_empty()
            && host.len() <= MAX_ENTRY_LEN
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
            // All-numeric dotted text is a malformed address, not a name.
            && !host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        if valid {
            Ok(AllowedDestination::Host(host))
        } else {
            Err(error())
        }
    }
}

impl fmt::Display for AllowedDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowedDestination::Network(network) => network.fmt(f),
            AllowedDestination::Host(host) => f.write_str(host),
        }
    }
}

fn normalise_host(host: &str) -> String {
    host.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// Which destinations a fetch may connect to: public addresses, plus what the operator's
/// administrator allowed. The default allows nothing beyond public addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationPolicy {
    networks: Vec<IpNetwork>,
    hosts: Vec<String>,
}

impl DestinationPolicy {
    /// Public addresses only.
    pub fn public_only() -> Self {
        Self::default()
    }

    /// Public addresses and the loopback (`127.0.0.0/8,::1/128`): `raypipe dev` and tests,
    /// whose registries listen on 127.0.0.1.
    pub fn with_loopback() -> Self {
        Self::default().allowing([
            AllowedDestination::Network(IpNetwork {
                address: IpAddr::V4(Ipv4Addr::LOCALHOST),
                prefix: 8,
            }),
            AllowedDestination::Network(IpNetwork {
                address: IpAddr::V6(Ipv6Addr::LOCALHOST),
                prefix: 128,
            }),
        ])
    }

    /// This policy with `entries` allowed too.
    pub fn allowing(mut self, entries: impl IntoIterator<Item = AllowedDestination>) -> Self {
        for entry in entries {
            match entry {
                AllowedDestination::Network(network) => self.networks.push(network),
                AllowedDestination::Host(host) => self.hosts.push(host),
            }
        }
        self
    }

    /// A comma-separated list of CIDRs, IP addresses and host names (empty items ignored).
    pub fn parse_list(text: &str) -> Result<Self, DestinationParseError> {
        let entries = text
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(AllowedDestination::from_str)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::default().allowing(entries))
    }

    /// Whether `host` (a name, not an address) is allowed by name.
    pub fn admits_host_name(&self, host: &str) -> bool {
        let host = normalise_host(host);
        self.hosts.contains(&host)
    }

    /// Whether a connection to `address` is allowed: it is public, or in an allowed network.
    pub fn admits_address(&self, address: IpAddr) -> bool {
        let canonical = canonical(address);
        is_public(canonical)
            || self
                .networks
                .iter()
                .any(|network| network.contains(address) || network.contains(canonical))
    }

    /// The allow-list as given, for logs at start-up.
    pub fn allowed(&self) -> Vec<String> {
        self.networks
            .iter()
            .map(ToString::to_string)
            .chain(self.hosts.iter().cloned())
            .collect()
    }
}

impl FromStr for DestinationPolicy {
    type Err = DestinationParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse_list(text)
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) as the IPv4 address it reaches.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => address,
        },
        v4 => v4,
    }
}

/// Whether `address` is a globally reachable unicast address. Everything else — loopback,
/// private, shared (CGNAT), link-local (the cloud metadata service), documentation,
/// benchmarking, multicast, reserved, and IPv6 forms that embed such an IPv4 address — is not.
pub fn is_public(address: IpAddr) -> bool {
    match canonical(address) {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

/// IPv4 ranges that are not globally reachable (IANA special-purpose registry).
const NON_PUBLIC_V4: [(Ipv4Addr, u8); 15] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 0, 0, 0), 24),
    (Ipv4Addr::new(192, 0, 2, 0), 24),
    (Ipv4Addr::new(192, 88, 99, 0), 24),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(198, 18, 0, 0), 15),
    (Ipv4Addr::new(198, 51, 100, 0), 24),
    (Ipv4Addr::new(203, 0, 113, 0), 24),
    (Ipv4Addr::new(224, 0, 0, 0), 4),
    (Ipv4Addr::new(240, 0, 0, 0), 4),
];

fn is_public_v4(address: Ipv4Addr) -> bool {
    let address = u32::from(address);
    !NON_PUBLIC_V4.iter().any(|(network, prefix)| {
        prefix_matches(u32::from(*network).into(), address.into(), 32, *prefix)
    })
}

/// Inside global unicast (2000::/3), the ranges that are not globally reachable.
const NON_PUBLIC_V6_IN_GLOBAL: [(Ipv6Addr, u8); 4] = [
    // IETF protocol assignments: Teredo, benchmarking, ORCHID, …
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23),
    // Documentation.
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32),
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20),
    // SRv6 segment identifiers.
    (Ipv6Addr::new(0x5f00, 0, 0, 0, 0, 0, 0, 0), 16),
];

fn in_v6(network: Ipv6Addr, prefix: u8, address: Ipv6Addr) -> bool {
    prefix_matches(network.into(), address.into(), 128, prefix)
}

fn is_public_v6(address: Ipv6Addr) -> bool {
    let bits = u128::from(address);
    // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits.
    if in_v6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96, address) {
        return is_public_v4(Ipv4Addr::from((bits & 0xffff_ffff) as u32));
    }
    // 6to4 (2002::/16) reaches the IPv4 address in bits 16..48.
    if in_v6(Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16, address) {
        return is_public_v4(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32));
    }
    // Only global unicast can be public: this leaves out ::, ::1, IPv4-compatible and
    // IPv4-mapped forms, 64:ff9b:1::/48, discard-only, ULA (fc00::/7), link-local
    // (fe80::/10), site-local and multicast.
    in_v6(Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3, address)
        && !NON_PUBLIC_V6_IN_GLOBAL
            .iter()
            .any(|(network, prefix)| in_v6(*network, *prefix, address))
}

/// Raised (inside reqwest's error chain, or directly) for a destination the policy refuses.
/// It names only the host: which of the refusal's causes applied (a private address, no
/// address at all) is deliberately not told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DestinationRefused {
    pub(crate) host: String,
}

impl fmt::Display for DestinationRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is not an allowed destination", self.host)
    }
}

impl std::error::Error for DestinationRefused {}

/// The host as shown in messages: bounded and free of control characters.
fn shown_host(host: &str) -> String {
    host.chars()
        .filter(|c| !c.is_control())
        .take(MAX_ENTRY_LEN)
        .collect()
}

/// Refuses a URL whose host is an IP literal the policy does not admit (host names are left
/// to [`GuardedResolver`]).
pub(crate) fn check_literal_host(
    url: &Url,
    policy: &DestinationPolicy,
) -> Result<(), DestinationRefused> {
    let host = url.host_str().unwrap_or_default();
    // The URL parser has already turned every IPv4 spelling (2130706433, 0x7f.1) into
    // dotted decimal and put IPv6 in brackets, so what parses here is exactly what is dialled.
    let Ok(literal) = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    else {
        return Ok(());
    };
    if policy.admits_address(literal) {
        Ok(())
    } else {
        Err(DestinationRefused {
            host: shown_host(host),
        })
    }
}

/// A DNS resolver that resolves with the system's resolver and admits a name only when every
/// address it resolves to is admitted (or the name itself is allowed): reqwest then connects
/// to exactly the addresses checked here.
#[derive(Debug, Clone)]
pub(crate) struct GuardedResolver {
    policy: Arc<DestinationPolicy>,
}

impl GuardedResolver {
    pub(crate) fn new(policy: Arc<DestinationPolicy>) -> Self {
        Self { policy }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // Port 0: reqwest puts the URL's port (or the scheme's) in afterwards.
            let resolved = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map(Iterator::collect);
            admit_resolved(&policy, &host, resolved)
                .map(|addresses| Box::new(addresses.into_iter()) as Addrs)
        })
    }
}

/// The addresses to connect to for `host`, or the refusal. A name allowed by the allow-list
/// may fail honestly; any other failure looks like a refusal, so that whether an internal
/// name exists is not revealed.
fn admit_resolved(
    policy: &DestinationPolicy,
    host: &str,
    resolved: std::io::Result<Vec<SocketAddr>>,
) -> Result<Vec<SocketAddr>, Box<dyn std::error::Error + Send + Sync>> {
    let allowed_by_name = policy.admits_host_name(host);
    let refused = || {
        Box::new(DestinationRefused {
            host: shown_host(host),
        })
    };
    match resolved {
        Err(error) if allowed_by_name => Err(Box::new(error)),
        Err(_) => Err(refused()),
        Ok(addresses) if allowed_by_name => Ok(addresses),
        Ok(addresses)
            if !addresses.is_empty()
                && addresses
                    .iter()
                    .all(|address| policy.admits_address(address.ip())) =>
        {
            Ok(addresses)
        }
        Ok(_) => Err(refused()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test address")
    }

    #[test]
    fn every_non_public_ipv4_range_is_refused_at_both_edges() {
        let ranges = [
            ("0.0.0.0", "0.255.255.255"),
            ("10.0.0.0", "10.255.255.255"),
            ("100.64.0.0", "100.127.255.255"),
            ("127.0.0.0", "127.255.255.255"),
            ("169.254.0.0", "169.254.255.255"),
            ("172.16.0.0", "172.31.255.255"),
            ("192.0.0.0", "192.0.0.255"),
            ("192.0.2.0", "192.0.2.255"),
            ("192.88.99.0", "192.88.99.255"),
            ("192.168.0.0", "192.168.255.255"),
            ("198.18.0.0", "198.19.255.255"),
            ("198.51.100.0", "198.51.100.255"),
            ("203.0.113.0", "203.0.113.255"),
            ("224.0.0.0", "239.255.255.255"),
            ("240.0.0.0", "255.255.255.255"),
        ];
        for (first, last) in ranges {
            assert!(!is_public(ip(first)), "{first}");
            assert!(!is_public(ip(last)), "{last}");
        }
        for named in ["169.254.169.254", "127.0.0.1", "0.0.0.0", "100.100.100.200"] {
            assert!(!is_public(ip(named)), "{named}");
        }
    }

    #[test]
    fn addresses_just_outside_the_ranges_are_public() {
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001::1",
            "2001:200::1",
        ] {
            assert!(is_public(ip(public)), "{public}");
        }
    }

    #[test]
    fn non_public_ipv6_ranges_are_refused() {
        for address in [
            "::",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "fe80::1",
            "febf:ffff::1",
            "fec0::1",
            "ff02::1",
            "100::1",
            "2001::1",
            "2001:db8::1",
            "3fff::1",
            "5f00::1",
            "64:ff9b:1::1",
            "::a9fe:a9fe",
            "1000::1",
            "4000::1",
        ] {
            assert!(!is_public(ip(address)), "{address}");
        }
    }

    #[test]
    fn ipv6_forms_that_embed_ipv4_follow_the_embedded_address() {
        // IPv4-mapped.
        for refused in [
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.1.2.3",
            "::ffff:192.168.0.1",
            "::ffff:0.0.0.0",
            "::ffff:7f00:1",
        ] {
            assert!(!is_public(ip(refused)), "{refused}");
        }
        assert!(is_public(ip("::ffff:8.8.8.8")));
        // NAT64 and 6to4.
        assert!(!is_public(ip("64:ff9b::a9fe:a9fe")));
        assert!(!is_public(ip("64:ff9b::7f00:1")));
        assert!(is_public(ip("64:ff9b::808:808")));
        assert!(!is_public(ip("2002:a9fe:a9fe::1")));
        assert!(!is_public(ip("2002:0a00:0001::")));
        assert!(is_public(ip("2002:0808:0808::1")));
    }

    #[test]
    fn allow_list_admits_networks_and_mapped_forms_of_them() {
        let policy = DestinationPolicy::parse_list(" 10.0.0.0/8 , fd00::/8,,192.168.1.7").unwrap();
        assert!(policy.admits_address(ip("10.96.0.10")));
        assert!(policy.admits_address(ip("::ffff:10.96.0.10")));
        assert!(policy.admits_address(ip("fd00::5")));
        assert!(policy.admits_address(ip("192.168.1.7")));
        assert!(!policy.admits_address(ip("192.168.1.8")));
        assert!(!policy.admits_address(ip("169.254.169.254")));
        assert!(!policy.admits_address(ip("127.0.0.1")));
        assert!(policy.admits_address(ip("8.8.8.8")));
        assert!(DestinationPolicy::parse_list("").unwrap() == DestinationPolicy::public_only());
    }

    #[test]
    fn loopback_policy_admits_loopback_only() {
        let policy = DestinationPolicy::with_loopback();
        for admitted in ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"] {
            assert!(policy.admits_address(ip(admitted)), "{admitted}");
        }
        for refused in ["169.254.169.254", "10.0.0.1", "fe80::1", "0.0.0.0"] {
            assert!(!policy.admits_address(ip(refused)), "{refused}");
        }
    }

    #[test]
    fn host_names_are_matched_exactly() {
        let policy =
            DestinationPolicy::parse_list("Registry.Models.svc.cluster.local.,10.0.0.0/8").unwrap();
        assert!(policy.admits_host_name("registry.models.svc.cluster.local"));
        assert!(policy.admits_host_name("REGISTRY.models.svc.cluster.local."));
        assert!(!policy.admits_host_name("evil.registry.models.svc.cluster.local"));
        assert!(!policy.admits_host_name("models.svc.cluster.local"));
        assert_eq!(
            policy.allowed(),
            vec!["10.0.0.0/8", "registry.models.svc.cluster.local"]
        );
    }

    #[test]
    fn malformed_entries_are_refused() {
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "::1/129",
            "300.1.1.1",
            "10.1",
            "*.example.com",
            "http://registry",
            "-bad.example",
            "a..b",
            "host name",
        ] {
            assert!(bad.parse::<AllowedDestination>().is_err(), "{bad}");
        }
        let error = DestinationPolicy::parse_list("10.0.0.0/8,bad/x").unwrap_err();
        assert!(error.to_string().contains("bad/x"), "{error}");
    }

    #[test]
    fn networks_contain_their_edges_only() {
        let network: IpNetwork = "172.16.0.0/12".parse().unwrap();
        assert!(network.contains(ip("172.16.0.0")));
        assert!(network.contains(ip("172.31.255.255")));
        assert!(!network.contains(ip("172.32.0.0")));
        assert!(!network.contains(ip("::ffff:172.16.0.1")));
        let everything: IpNetwork = "0.0.0.0/0".parse().unwrap();
        assert!(everything.contains(ip("255.255.255.255")));
        let one: IpNetwork = "::1".parse().unwrap();
        assert!(one.contains(ip("::1")) && !one.contains(ip("::2")));
    }

    #[test]
    fn literal_hosts_are_checked_and_names_left_to_the_resolver() {
        let policy = DestinationPolicy::public_only();
        for refused in [
            "https://127.0.0.1:8443/g.pb",
            "https://169.254.169.254/latest/meta-data",
            "https://[::1]/g.pb",
            "https://[::ffff:127.0.0.1]/g.pb",
            "https://[fd00::1]/g.pb",
            // The URL parser normalises these to 127.0.0.1 and 169.254.169.254.
            "https://2130706433/g.pb",
            "https://0x7f.1/g.pb",
            "https://0251.0376.0251.0376/g.pb",
        ] {
            let url = Url::parse(refused).unwrap();
            let error = check_literal_host(&url, &policy).expect_err(refused);
            assert!(!error.host.is_empty());
        }
        for passed in [
            "https://8.8.8.8/g.pb",
            "https://localhost/g.pb",
            "https://registry.internal/",
        ] {
            assert!(check_literal_host(&Url::parse(passed).unwrap(), &policy).is_ok());
        }
    }

    #[tokio::test]
    async fn resolver_refuses_names_of_loopback_unless_allowed() {
        let refusing = GuardedResolver::new(Arc::new(DestinationPolicy::public_only()));
        let error = match refusing.resolve("localhost".parse().unwrap()).await {
            Ok(_) => panic!("localhost must be refused"),
            Err(error) => error,
        };
        assert!(
            error.downcast_ref::<DestinationRefused>().is_some(),
            "{error}"
        );
        let allowing = GuardedResolver::new(Arc::new(DestinationPolicy::with_loopback()));
        let addresses: Vec<SocketAddr> = allowing
            .resolve("localhost".parse().unwrap())
            .await
            .expect("loopback allowed")
            .collect();
        assert!(
            addresses.iter().all(|a| a.ip().is_loopback()),
            "{addresses:?}"
        );
        let by_name = GuardedResolver::new(Arc::new(
            DestinationPolicy::parse_list("localhost").unwrap(),
        ));
        assert!(by_name.resolve("localhost".parse().unwrap()).await.is_ok());
    }

    #[test]
    fn unresolvable_names_and_mixed_answers_look_like_any_other_refusal() {
        let policy = DestinationPolicy::public_only();
        let not_found = || {
            Err(std::io::Error::other(
                "failed to lookup address information",
            ))
        };
        let address = |text: &str| SocketAddr::new(ip(text), 0);
        let refusals = [
            admit_resolved(&policy, "registry.invalid", not_found()),
            admit_resolved(&policy, "empty.example", Ok(vec![])),
            admit_resolved(
                &policy,
                "meta.example",
                Ok(vec![address("169.254.169.254")]),
            ),
            // One bad address among good ones refuses the name: it is never dialled.
            admit_resolved(
                &policy,
                "mixed.example",
                Ok(vec![address("8.8.8.8"), address("10.0.0.1")]),
            ),
        ];
        for (refusal, host) in refusals.into_iter().zip([
            "registry.invalid",
            "empty.example",
            "meta.example",
            "mixed.example",
        ]) {
            let error = refusal.expect_err(host);
            let refused = error
                .downcast_ref::<DestinationRefused>()
                .expect("a refusal");
            assert_eq!(
                refused.to_string(),
                format!("{host} is not an allowed destination")
            );
        }
        assert!(admit_resolved(&policy, "public.example", Ok(vec![address("8.8.8.8")])).is_ok());
        // A name on the allow-list reports its real failure, and may resolve anywhere.
        let by_name = DestinationPolicy::parse_list("registry.models.svc").unwrap();
        let error = admit_resolved(&by_name, "registry.models.svc", not_found()).unwrap_err();
        assert!(error.downcast_ref::<DestinationRefused>().is_none());
        assert!(
            admit_resolved(
                &by_name,
                "registry.models.svc",
                Ok(vec![address("10.96.0.7")])
            )
            .is_ok()
        );
    }

    proptest::proptest! {
        /// Every IPv6 form that reaches an IPv4 address is judged like that address.
        #[test]
        fn embedded_ipv4_forms_are_judged_like_the_address(bits: u32) {
            let v4 = Ipv4Addr::from(bits);
            let public = is_public(IpAddr::V4(v4));
            let mapped = IpAddr::V6(v4.to_ipv6_mapped());
            let nat64 = IpAddr::V6(Ipv6Addr::from(
                (0x0064_ff9b_u128 << 96) | u128::from(bits),
            ));
            let six_to_four = IpAddr::V6(Ipv6Addr::from(
                (0x2002_u128 << 112) | (u128::from(bits) << 80) | 1,
            ));
            proptest::prop_assert_eq!(is_public(mapped), public);
            proptest::prop_assert_eq!(is_public(nat64), public);
            proptest::prop_assert_eq!(is_public(six_to_four), public);
            // The IPv4-compatible form (::a.b.c.d) is never dialled as IPv4: always refused.
            proptest::prop_assert!(!is_public(IpAddr::V6(v4.to_ipv6_compatible())));
        }

        /// A network contains exactly the addresses that share its first `prefix` bits.
        #[test]
        fn networks_contain_what_shares_their_prefix(network: u32, address: u32, prefix in 0u8..=32) {
            let net = IpNetwork::new(IpAddr::V4(Ipv4Addr::from(network)), prefix)
                .expect("valid prefix");
            let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix)) };
            proptest::prop_assert_eq!(
                net.contains(IpAddr::V4(Ipv4Addr::from(address))),
                network & mask == address & mask
            );
        }

        /// Whatever text an allow-list holds, parsing it never panics.
        #[test]
        fn allow_list_parsing_never_panics(text in ".{0,300}") {
            let _ = DestinationPolicy::parse_list(&text);
        }
    }
}
