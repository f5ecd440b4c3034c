//! The processes of a head, found and identified through `/proc`: the run directory (and
//! cleaning up after heads whose test process died), the processes a `ray start` spawned,
//! the sockets they listen on, and stopping them by pid and start time so that a recycled pid
//! is never signalled.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::devenv::DevEnvError;
use crate::devenv::process::ManagedProcess;

/// Unix socket paths (`<temp dir>/session_<date>_<pid>/sockets/plasma_store`) must stay under
/// 108 bytes, so the temp dir must be short.
const MAX_TEMP_ROOT_LEN: usize = 40;

/// Stops one node (the head or a worker node) by pid: SIGTERM to its `ray start` (Ray then
/// stops what it started), then SIGKILL for anything of it still alive (orphaned agents,
/// workers in their own process groups).
pub(super) fn stop_node(mut process: ManagedProcess, root_pid: u32, dir: &Path) {
    // Listed before the root goes: orphans are re-parented and lose the link to it.
    let mut leftovers: BTreeSet<ProcessIdentity> = own_processes(root_pid).into_iter().collect();
    process.stop(Duration::from_secs(15));
    leftovers.extend(ray_processes_in_group(root_pid, dir));
    kill_and_wait(&leftovers, Duration::from_secs(5));
}

/// A short temp root: `$TMPDIR` when short enough for Ray's socket paths, else `/tmp`.
pub(super) fn temp_root() -> PathBuf {
    let tmp = std::env::temp_dir();
    if tmp.as_os_str().len() <= MAX_TEMP_ROOT_LEN {
        tmp
    } else {
        PathBuf::from("/tmp")
    }
}

/// A fresh `rp-ray-<our pid>-<n>` directory, after cleaning up after heads whose test process
/// died without stopping them.
pub(super) fn run_dir() -> Result<PathBuf, DevEnvError> {
    crate::devenv::fresh_run_dir(&temp_root(), "rp-ray-", clean_up_abandoned_head)
}

/// Kills what is left of a head whose owner is gone (see [`ray_processes_in_group`]), then
/// removes its directory.
pub(super) fn clean_up_abandoned_head(dir: &Path) {
    // `ray-start.pid` (the head) and `ray-worker-<n>.pid` (its worker nodes).
    let roots: Vec<u32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.starts_with("ray-") && name.ends_with(".pid")
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
        .filter_map(|pid| pid.trim().parse::<u32>().ok())
        .collect();
    for root in roots {
        let abandoned: BTreeSet<ProcessIdentity> =
            ray_processes_in_group(root, dir).into_iter().collect();
        kill_and_wait(&abandoned, Duration::from_secs(5));
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `(address, socket inode)` of each listening socket in a `/proc/net/tcp{,6}` table.
pub(super) fn listening_sockets(table: &str) -> Vec<(std::net::SocketAddr, u64)> {
    const LISTEN: &str = "0A";
    let text = std::fs::read_to_string(table).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(3) != Some(&LISTEN) {
                return None;
            }
            let (host, port) = fields.get(1)?.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            let inode = fields.get(9)?.parse().ok()?;
            Some((std::net::SocketAddr::new(parse_proc_ip(host)?, port), inode))
        })
        .collect()
}

/// The kernel prints addresses as 32-bit words in host (little-endian) byte order.
pub(super) fn parse_proc_ip(hex: &str) -> Option<std::net::IpAddr> {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect::<Option<_>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    match bytes.len() {
        4 => Some(std::net::IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(std::net::IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// A process, identified so that a recycled pid is never mistaken for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ProcessIdentity {
    pub(super) pid: u32,
    pub(super) start_time: u64,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct ProcessInfo {
    pid: u32,
    ppid: u32,
    pgrp: u32,
    start_time: u64,
    zombie: bool,
}

impl ProcessInfo {
    fn identity(&self) -> ProcessIdentity {
        ProcessIdentity {
            pid: self.pid,
            start_time: self.start_time,
        }
    }
}

pub(super) fn process_info(pid: u32) -> Option<ProcessInfo> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `comm` (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 3 (state), 4 (ppid), 5 (pgrp) and 22 (starttime) of proc(5), counted from 3.
    Some(ProcessInfo {
        pid,
        zombie: *fields.first()? == "Z",
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

pub(super) fn all_processes() -> Vec<ProcessInfo> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(process_info)
        .collect()
}

/// `root`, its descendants, and the members of its process group (Ray's agents keep the group
/// after being orphaned; its workers have their own groups but are the raylet's children).
/// Only meaningful while `root` runs: afterwards its pid may be recycled.
pub(super) fn own_processes(root: u32) -> Vec<ProcessIdentity> {
    let processes = all_processes();
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for p in &processes {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut own: BTreeSet<u32> = processes
        .iter()
        .filter(|p| p.pgrp == root)
        .map(|p| p.pid)
        .collect();
    own.insert(root);
    let mut frontier: Vec<u32> = own.iter().copied().collect();
    while let Some(pid) = frontier.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if own.insert(child) {
                frontier.push(child);
            }
        }
    }
    processes
        .iter()
        .filter(|p| own.contains(&p.pid) && !p.zombie)
        .map(ProcessInfo::identity)
        .collect()
}

/// Ray processes left in the process group of a `ray start` that has ended: group members
/// with a `ray::…` title or the head's directory on their command line. (The group id stays
/// reserved while members exist, but checking that they are Ray's costs little.)
pub(super) fn ray_processes_in_group(root: u32, dir: &Path) -> Vec<ProcessIdentity> {
    let dir_text = dir.display().to_string();
    all_processes()
        .into_iter()
        .filter(|p| p.pgrp == root && !p.zombie)
        .filter(|p| {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.pid)).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            cmdline.starts_with("ray::") || cmdline.contains(&dir_text)
        })
        .map(|p| p.identity())
        .collect()
}

pub(super) fn is_alive(process: &ProcessIdentity) -> bool {
    process_info(process.pid)
        .is_some_and(|info| info.start_time == process.start_time && !info.zombie)
}

/// SIGKILL for each process still alive (same pid *and* start time), then waits up to `grace`
/// for them to disappear.
pub(super) fn kill_and_wait(processes: &BTreeSet<ProcessIdentity>, grace: Duration) {
    for process in processes.iter().filter(|p| is_alive(p)) {
        let Ok(pid) = libc::pid_t::try_from(process.pid) else {
            continue;
        };
        // SAFETY: signalling a process this head started, checked by start time just above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    let deadline = Instant::now() + grace;
    while processes.iter().any(is_alive) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devenv::ray::LOOPBACK;
    use std::net::TcpListener;

    #[test]
    fn own_processes_include_the_root_and_its_descendants() {
        let own = own_processes(std::process::id());
        assert!(own.iter().any(|p| p.pid == std::process::id()));
        let me = process_info(std::process::id()).expect("this process");
        assert!(is_alive(&me.identity()));
        assert!(!is_alive(&ProcessIdentity {
            pid: me.pid,
            start_time: me.start_time + 1
        }));
    }

    #[test]
    fn proc_net_addresses_are_decoded() {
        assert_eq!(
            parse_proc_ip("0100007F"),
            Some("127.0.0.1".parse().expect("ip"))
        );
        assert_eq!(
            parse_proc_ip("00000000"),
            Some("0.0.0.0".parse().expect("ip"))
        );
        assert_eq!(
            parse_proc_ip("0000000000000000FFFF00000100007F"),
            Some("::ffff:127.0.0.1".parse().expect("ip"))
        );
        assert_eq!(
            parse_proc_ip("00000000000000000000000001000000"),
            Some("::1".parse().expect("ip"))
        );
        let listener = TcpListener::bind((LOOPBACK, 0)).expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert!(
            listening_sockets("/proc/net/tcp")
                .iter()
                .any(|(a, _)| a.port() == port && a.ip().is_loopback())
        );
    }

    #[test]
    fn the_temp_root_is_short_enough_for_unix_sockets() {
        assert!(temp_root().as_os_str().len() <= MAX_TEMP_ROOT_LEN);
    }
}
