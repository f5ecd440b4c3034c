//! Cron schedules as KubeRay (and batch/v1 CronJob) read them: robfig/cron's standard parser.
//! The one cron parser: the webhook's and the RayCronJob controller's rules call `parse`, and
//! the controller's scheduler (`controllers/raycronjob/schedule.rs`) computes the next run
//! from the parsed `Schedule`.
//!
//! - five fields: minute hour day-of-month month day-of-week; each a comma list of `*`, `?`,
//!   `n`, `a-b`, with an optional `/step` (`n/step` means `n-max/step`); month and weekday
//!   names (`JAN`, `mon`); weekday 0–6 with 0 = Sunday;
//! - descriptors `@yearly` `@annually` `@monthly` `@weekly` `@daily` `@midnight` `@hourly` and
//!   `@every <Go duration>`;
//! - an optional `CRON_TZ=<zone> ` or `TZ=<zone> ` prefix;
//! - day-of-month and day-of-week: when either field starts with `*` or `?` (without a step
//!   above 1) both must match, otherwise either may (cron's classic OR).

use k8s_openapi::jiff::tz::TimeZone;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("the schedule {schedule:?} is not a valid cron schedule: {problem}")]
    Invalid { schedule: String, problem: String },
    #[error("unknown time zone {0:?}")]
    UnknownTimeZone(String),
}

/// A parsed schedule (the zone prefix, if any, already applied).
#[derive(Clone, Debug)]
pub struct Schedule {
    pub(crate) kind: Kind,
    /// From a `CRON_TZ=`/`TZ=` prefix; otherwise the caller's zone applies.
    pub time_zone: Option<TimeZone>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Fields(Fields),
    /// `@every`: whole seconds, at least one.
    Every(i64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fields {
    pub(crate) minutes: u64,
    pub(crate) hours: u64,
    pub(crate) days: u64,
    pub(crate) months: u64,
    pub(crate) weekdays: u64,
    /// Day-of-month or day-of-week started with `*`/`?`: AND instead of OR.
    pub(crate) day_star: bool,
}

struct Bounds {
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
};
const DAY: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Bounds = Bounds {
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const WEEKDAY: Bounds = Bounds {
    min: 0,
    max: 6,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

/// Parses `text` (optionally prefixed by `CRON_TZ=`/`TZ=`).
pub fn parse(text: &str) -> Result<Schedule, ScheduleError> {
    let invalid = |problem: String| ScheduleError::Invalid {
        schedule: text.to_owned(),
        problem,
    };
    let mut rest = text.trim();
    let mut time_zone = None;
    if let Some(prefixed) = rest
        .strip_prefix("CRON_TZ=")
        .or_else(|| rest.strip_prefix("TZ="))
    {
        let (zone, after) = prefixed
            .split_once(char::is_whitespace)
            .ok_or_else(|| invalid("a time zone prefix must be followed by a schedule".into()))?;
        time_zone = Some(load_time_zone(zone)?);
        rest = after.trim();
    }
    let kind = if let Some(descriptor) = rest.strip_prefix('@') {
        descriptor_kind(descriptor).map_err(invalid)?
    } else {
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = fields[..] else {
            return Err(invalid(format!(
                "expected five fields (minute hour day-of-month month day-of-week), found {}",
                fields.len()
            )));
        };
        // Each problem names its field, so a person sees which of the five is wrong.
        let parse_field = |name: &str, text: &str, bounds: &Bounds| {
            field(text, bounds).map_err(|e| invalid(format!("{name} field {text:?}: {e}")))
        };
        let (days, dom_star) = parse_field("day of month", day, &DAY)?;
        let (weekdays, dow_star) = parse_field("day of week", weekday, &WEEKDAY)?;
        Kind::Fields(Fields {
            minutes: parse_field("minute", minute, &MINUTE)?.0,
            hours: parse_field("hour", hour, &HOUR)?.0,
            days,
            months: parse_field("month", month, &MONTH)?.0,
            weekdays,
            day_star: dom_star || dow_star,
        })
    };
    Ok(Schedule { kind, time_zone })
}

/// An IANA zone (or `UTC`, `Local`) from the system's tz database.
pub fn load_time_zone(name: &str) -> Result<TimeZone, ScheduleError> {
    match name {
        "" => Err(ScheduleError::UnknownTimeZone(String::new())),
        "Local" => Ok(TimeZone::system()),
        "UTC" => Ok(TimeZone::UTC),
        _ => TimeZone::get(name).map_err(|_| ScheduleError::UnknownTimeZone(name.to_owned())),
    }
}

fn descriptor_kind(descriptor: &str) -> Result<Kind, String> {
    let all = |b: &Bounds| bits(b.min, b.max, 1);
    let fields = |minutes: u64, hours: u64, days: u64, months: u64, weekdays: u64| {
        Kind::Fields(Fields {
            minutes,
            hours,
            days,
            months,
            weekdays,
            day_star: true,
        })
    };
    Ok(match descriptor {
        "yearly" | "annually" => fields(1, 1, 1 << 1, 1 << 1, all(&WEEKDAY)),
        "monthly" => fields(1, 1, 1 << 1, all(&MONTH), all(&WEEKDAY)),
        "weekly" => fields(1, 1, all(&DAY), all(&MONTH), 1),
        "daily" | "midnight" => fields(1, 1, all(&DAY), all(&MONTH), all(&WEEKDAY)),
        "hourly" => fields(1, all(&HOUR), all(&DAY), all(&MONTH), all(&WEEKDAY)),
        other => match other.strip_prefix("every ") {
            Some(duration) => {
                let seconds = go_duration_seconds(duration.trim())?;
                Kind::Every(seconds.max(1))
            }
            None => return Err(format!("unknown descriptor @{other}")),
        },
    })
}

/// A Go duration (`1h30m`, `90s`, `1.5h`), rounded down to whole seconds.
fn go_duration_seconds(text: &str) -> Result<i64, String> {
    crate::validation::parse_go_duration(text)
        .map(|nanos| nanos.div_euclid(1_000_000_000))
        .map_err(|e| e.to_string())
}

fn bits(min: u32, max: u32, step: u32) -> u64 {
    let mut b = 0u64;
    let mut i = min;
    while i <= max {
        b |= 1 << i;
        i += step;
    }
    b
}

/// One field: its bit set and whether it was a star.
fn field(text: &str, bounds: &Bounds) -> Result<(u64, bool), String> {
    let mut set = 0u64;
    let mut star = false;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => {
                let step: u32 = step.parse().map_err(|_| format!("bad step in {part:?}"))?;
                if step == 0 {
                    return Err(format!("step of zero in {part:?}"));
                }
                (range, Some(step))
            }
            None => (part, None),
        };
        let (start, end, part_star) = if range == "*" || range == "?" {
            (bounds.min, bounds.max, true)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a, bounds)?, value(b, bounds)?, false)
        } else {
            let v = value(range, bounds)?;
            // `n/step` means `n-max/step`.
            (v, if step.is_some() { bounds.max } else { v }, false)
        };
        if start > end {
            return Err(format!(
                "beginning of range ({start}) beyond end of range ({end}) in {part:?}"
            ));
        }
        let step = step.unwrap_or(1);
        // robfig: a star with a step above 1 no longer counts as a star.
        if part_star && step == 1 {
            star = true;
        }
        set |= bits(start, end, step);
    }
    Ok((set, star))
}

fn value(text: &str, bounds: &Bounds) -> Result<u32, String> {
    let lower = text.to_ascii_lowercase();
    let v = match bounds.names.iter().position(|n| *n == lower) {
        Some(i) => i as u32 + bounds.min,
        None => text
            .parse::<u32>()
            .map_err(|_| format!("{text:?} is not a number or a known name"))?,
    };
    if v < bounds.min || v > bounds.max {
        return Err(format!("{v} is outside {}-{}", bounds.min, bounds.max));
    }
    Ok(v)
}
