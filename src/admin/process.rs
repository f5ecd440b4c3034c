//! The operator's process metrics under the names every Prometheus client uses
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
//! `process_open_fds`, `process_max_fds`, `process_start_time_seconds`), read from Linux
//! `/proc/self` at scrape time. Elsewhere (or when a file cannot be read) the series it feeds is
//! left out rather than reported as zero.

use std::path::Path;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second in `/proc/<pid>/stat`: the kernel reports them in USER_HZ, which is
/// 100 on every architecture Linux exposes to user space (Prometheus' Go `procfs` assumes the
/// same).
const USER_HZ: f64 = 100.0;

/// What `/proc/self/stat` says about the process.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    /// Seconds after boot when the process started.
    started_after_boot: f64,
    virtual_memory_bytes: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may itself hold
/// spaces and parentheses, so fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let (_, after_name) = text.rsplit_once(')')?;
    // Field 3 (state) is index 0 here; utime is field 14, stime 15, starttime 22, vsize 23.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |number: usize| -> Option<u64> { fields.get(number.checked_sub(3)?)?.parse().ok() };
    let ticks = field(14)?.checked_add(field(15)?)?;
    Some(Stat {
        cpu_seconds: ticks as f64 / USER_HZ,
        started_after_boot: field(22)? as f64 / USER_HZ,
        virtual_memory_bytes: field(23)?,
    })
}

/// `VmRSS` of `/proc/<pid>/status` in bytes (the kernel writes it in kB; no page size needed).
fn parse_resident_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `btime` of `/proc/stat`: the boot time in seconds since the epoch.
fn parse_boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits` (`None` when unlimited).
fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// One scrape's worth of process numbers; each is `None` when it could not be read.
#[derive(Clone, Debug, Default, PartialEq)]
struct Sample {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<u64>,
    virtual_bytes: Option<u64>,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
    start_time_seconds: Option<f64>,
}

impl Sample {
    /// Reads the process' own files under `proc` (`/proc`).
    fn read(proc: &Path) -> Sample {
        let read = |path: &str| std::fs::read_to_string(proc.join(path)).ok();
        let stat = read("self/stat").as_deref().and_then(parse_stat);
        let boot = read("stat").as_deref().and_then(parse_boot_time);
        Sample {
            cpu_seconds: stat.map(|s| s.cpu_seconds),
            resident_bytes: read("self/status")
                .as_deref()
                .and_then(parse_resident_bytes),
            virtual_bytes: stat.map(|s| s.virtual_memory_bytes),
            open_fds: std::fs::read_dir(proc.join("self/fd"))
                .ok()
                .map(|entries| entries.count() as u64),
            max_fds: read("self/limits").as_deref().and_then(parse_max_fds),
            start_time_seconds: stat
                .zip(boot)
                .map(|(s, boot)| boot as f64 + s.started_after_boot),
        }
    }
}

/// Reads `/proc` at every scrape; keeps nothing between scrapes.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: Option<impl prometheus_client::encoding::EncodeGaugeValue>,
) -> Result<(), std::fmt::Error> {
    let Some(value) = value else { return Ok(()) };
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sample = Sample::read(Path::new("/proc"));
        if let Some(seconds) = sample.cpu_seconds {
            let counter = ConstCounter::new(seconds);
            counter.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                counter.metric_type(),
            )?)?;
        }
        gauge(
            &mut encoder,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            sample.resident_bytes,
        )?;
        gauge(
            &mut encoder,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            sample.virtual_bytes,
        )?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Number of open file descriptors",
            sample.open_fds,
        )?;
        gauge(
            &mut encoder,
            "process_max_fds",
            "Maximum number of open file descriptors",
            sample.max_fds,
        )?;
        gauge(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            sample.start_time_seconds,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name_even_when_it_has_spaces() {
        let text = "4242 (ray pipe) (x)) S 1 4242 4242 0 -1 4194560 9000 0 0 0 250 150 0 0 20 0 \
                    12 0 360000 123456789 3000 18446744073709551615";
        let stat = parse_stat(text).expect("parses");
        assert_eq!(stat.cpu_seconds, 4.0);
        assert_eq!(stat.started_after_boot, 3600.0);
        assert_eq!(stat.virtual_memory_bytes, 123_456_789);
        assert_eq!(parse_stat("4242 (cut short) S 1"), None);
        assert_eq!(parse_stat("no parentheses"), None);
    }

    #[test]
    fn status_limits_and_boot_time_are_parsed() {
        let status = "Name:\traypipe\nVmPeak:\t  99999 kB\nVmRSS:\t   14336 kB\nThreads:\t5\n";
        assert_eq!(parse_resident_bytes(status), Some(14336 * 1024));
        assert_eq!(parse_resident_bytes("Name:\tx\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1048576              1048576              files     \n";
        assert_eq!(parse_max_fds(limits), Some(1_048_576));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files"
            ),
            None
        );
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn a_missing_proc_leaves_every_series_out() {
        let empty = tempfile::tempdir().expect("a temporary directory");
        assert_eq!(Sample::read(empty.path()), Sample::default());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_measured() {
        let sample = Sample::read(Path::new("/proc"));
        assert!(sample.resident_bytes.is_some_and(|b| b > 0), "{sample:?}");
        assert!(sample.open_fds.is_some_and(|n| n >= 3), "{sample:?}");
        assert!(sample.max_fds.is_some(), "{sample:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs_f64();
        let started = sample.start_time_seconds.expect("a start time");
        assert!(
            started <= now + 1.0 && started > now - 86_400.0 * 365.0,
            "{started} vs {now}"
        );
    }
}
