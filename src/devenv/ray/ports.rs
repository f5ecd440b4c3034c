//! The loopback ports of a head and its worker nodes: distinct free listener ports, and for
//! each node a block of worker ports outside the kernel's ephemeral range, so nothing the
//! kernel hands out later falls into it and parallel test processes do not collide.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

use super::LOOPBACK;
use crate::devenv::DevEnvError;

/// Ports reserved for Ray's worker processes (one per worker; a test head runs a few dozen).
const WORKER_PORT_COUNT: u16 = 100;

/// Every port a head listens on (all on 127.0.0.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RayHeadPorts {
    pub gcs: u16,
    pub dashboard: u16,
    pub dashboard_agent_http: u16,
    pub dashboard_agent_grpc: u16,
    pub runtime_env_agent: u16,
    pub metrics_export: u16,
    pub client_server: u16,
    pub node_manager: u16,
    pub object_manager: u16,
    /// Serve binds it when the first config naming it is deployed (see
    /// [`RayHead::bind_serve_to_loopback`]).
    pub serve_http: u16,
    pub min_worker: u16,
    pub max_worker: u16,
}

impl RayHeadPorts {
    /// The listener ports (the worker range left out).
    pub fn listeners(&self) -> Vec<u16> {
        vec![
            self.gcs,
            self.dashboard,
            self.dashboard_agent_http,
            self.dashboard_agent_grpc,
            self.runtime_env_agent,
            self.metrics_export,
            self.client_server,
            self.node_manager,
            self.object_manager,
            self.serve_http,
        ]
    }
}

/// Every port an extra worker node listens on (all on 127.0.0.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RayWorkerNodePorts {
    pub node_manager: u16,
    pub object_manager: u16,
    pub dashboard_agent_http: u16,
    pub dashboard_agent_grpc: u16,
    pub runtime_env_agent: u16,
    pub metrics_export: u16,
    pub min_worker: u16,
    pub max_worker: u16,
}

impl RayWorkerNodePorts {
    /// The listener ports (the worker range left out).
    pub fn listeners(&self) -> Vec<u16> {
        vec![
            self.node_manager,
            self.object_manager,
            self.dashboard_agent_http,
            self.dashboard_agent_grpc,
            self.runtime_env_agent,
            self.metrics_export,
        ]
    }
}

/// Free loopback ports for every listener, and a worker port range that none of them (nor
/// anything the kernel hands out later) falls into.
pub(super) fn pick_ports() -> Result<RayHeadPorts, DevEnvError> {
    let (min_worker, max_worker) = pick_worker_port_range(&[])?;
    let ports = free_ports(10, &[], (min_worker, max_worker))?;
    Ok(RayHeadPorts {
        gcs: ports[0],
        dashboard: ports[1],
        dashboard_agent_http: ports[2],
        dashboard_agent_grpc: ports[3],
        runtime_env_agent: ports[4],
        metrics_export: ports[5],
        client_server: ports[6],
        node_manager: ports[7],
        object_manager: ports[8],
        serve_http: ports[9],
        min_worker,
        max_worker,
    })
}

/// Ports for a worker node: none in `taken` (ports of the head and earlier nodes, some of
/// them not bound yet, like Serve's) nor in any of `worker_ranges`, and a worker range of its
/// own.
pub(super) fn pick_worker_node_ports(
    taken: &[u16],
    worker_ranges: &[(u16, u16)],
) -> Result<RayWorkerNodePorts, DevEnvError> {
    let (min_worker, max_worker) = pick_worker_port_range(worker_ranges)?;
    let mut ranges = worker_ranges.to_vec();
    ranges.push((min_worker, max_worker));
    let ports = free_ports(6, taken, (min_worker, max_worker))?;
    let ports: Vec<u16> = ports
        .into_iter()
        .filter(|p| !ranges.iter().any(|(lo, hi)| (lo..=hi).contains(&p)))
        .collect();
    if ports.len() < 6 {
        // Ports outside this node's range that fell into another node's: rare, try again.
        return pick_worker_node_ports(taken, worker_ranges);
    }
    Ok(RayWorkerNodePorts {
        node_manager: ports[0],
        object_manager: ports[1],
        dashboard_agent_http: ports[2],
        dashboard_agent_grpc: ports[3],
        runtime_env_agent: ports[4],
        metrics_export: ports[5],
        min_worker,
        max_worker,
    })
}

/// `count` distinct free loopback ports, none in `taken` nor in `worker_range`.
pub(super) fn free_ports(
    count: usize,
    taken: &[u16],
    (min_worker, max_worker): (u16, u16),
) -> Result<Vec<u16>, DevEnvError> {
    // Listeners stay open until all ports are chosen, so the kernel hands out distinct ones.
    let mut held: Vec<TcpListener> = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < count {
        let listener = TcpListener::bind((LOOPBACK, 0))
            .map_err(|e| DevEnvError::Io("bind 127.0.0.1:0".into(), e))?;
        let port = listener
            .local_addr()
            .map_err(|e| DevEnvError::Io("local_addr".into(), e))?
            .port();
        held.push(listener);
        if !(min_worker..=max_worker).contains(&port) && !taken.contains(&port) {
            ports.push(port);
        }
    }
    Ok(ports)
}

/// The kernel's ephemeral port range (`bind(0)` ports and outgoing connections).
pub(super) fn ephemeral_port_range() -> (u16, u16) {
    let text =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut bounds = text
        .split_whitespace()
        .filter_map(|n| n.parse::<u16>().ok());
    match (bounds.next(), bounds.next()) {
        (Some(low), Some(high)) if low <= high => (low, high),
        _ => (32768, 60999),
    }
}

/// A block of [`WORKER_PORT_COUNT`] ports outside the ephemeral range that are free now and
/// overlap none of `avoid`. The start depends on our pid and a counter, so heads of parallel
/// test processes differ.
pub(super) fn pick_worker_port_range(avoid: &[(u16, u16)]) -> Result<(u16, u16), DevEnvError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let (ephemeral_low, ephemeral_high) = ephemeral_port_range();
    let below = (
        20_000u32,
        u32::from(ephemeral_low).saturating_sub(u32::from(WORKER_PORT_COUNT)),
    );
    let above = (
        u32::from(ephemeral_high) + 1,
        65_535 - u32::from(WORKER_PORT_COUNT),
    );
    let (low, high) = if below.1 > below.0 { below } else { above };
    if high <= low {
        return Err(DevEnvError::Spawn(
            "ray".into(),
            "no room for worker ports outside the ephemeral port range".into(),
        ));
    }
    let blocks = (high - low) / u32::from(WORKER_PORT_COUNT);
    let seed = std::process::id().wrapping_mul(7919);
    for _ in 0..64 {
        let attempt = COUNTER.fetch_add(1, Ordering::Relaxed);
        let block = seed.wrapping_add(attempt.wrapping_mul(31)) % blocks.max(1);
        let start = low + block * u32::from(WORKER_PORT_COUNT);
        let (Ok(first), Ok(last)) = (
            u16::try_from(start),
            u16::try_from(start + u32::from(WORKER_PORT_COUNT) - 1),
        ) else {
            continue;
        };
        let overlaps = avoid.iter().any(|&(lo, hi)| first <= hi && lo <= last);
        if !overlaps && (first..=last).all(|port| TcpListener::bind((LOOPBACK, port)).is_ok()) {
            return Ok((first, last));
        }
    }
    Err(DevEnvError::Spawn(
        "ray".into(),
        format!("no free block of {WORKER_PORT_COUNT} worker ports found"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn ports_are_distinct_and_outside_the_worker_range() {
        let ports = pick_ports().expect("ports");
        let listeners = ports.listeners();
        let distinct: BTreeSet<u16> = listeners.iter().copied().collect();
        assert_eq!(distinct.len(), listeners.len(), "{ports:?}");
        assert_eq!(ports.max_worker - ports.min_worker + 1, WORKER_PORT_COUNT);
        assert!(
            listeners
                .iter()
                .all(|p| !(ports.min_worker..=ports.max_worker).contains(p)),
            "{ports:?}"
        );
    }
}
