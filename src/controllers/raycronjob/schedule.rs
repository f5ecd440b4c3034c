//! When a RayCronJob runs next: the civil-time walk over a parsed cron schedule (parsing
//! itself is `validation::cron`, shared with the webhook).
//!
//! Times are civil times in the schedule's zone; a time skipped by a DST change runs at the
//! first instant after the gap, a repeated one runs once.

use k8s_openapi::jiff::civil::{Date, DateTime};
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{SignedDuration, Timestamp, ToSpan};

use crate::validation::cron::{Fields, Kind, Schedule};

impl Schedule {
    /// The first tick strictly after `after`, in the schedule's own zone or else `zone`.
    /// `None` when nothing matches within five years (e.g. `0 0 30 2 *`).
    pub fn next(&self, after: Timestamp, zone: &TimeZone) -> Option<Timestamp> {
        let zone = self.time_zone.as_ref().unwrap_or(zone);
        match &self.kind {
            Kind::Every(seconds) => {
                let truncated = Timestamp::from_second(after.as_second()).ok()?;
                truncated
                    .checked_add(SignedDuration::from_secs(*seconds))
                    .ok()
            }
            Kind::Fields(f) => f.next(after, zone),
        }
    }
}

impl Fields {
    fn day_matches(&self, date: Date) -> bool {
        let dom = self.days & (1 << date.day()) != 0;
        let dow = self.weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        if self.day_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    fn next(&self, after: Timestamp, zone: &TimeZone) -> Option<Timestamp> {
        let local = after.to_zoned(zone.clone()).datetime();
        // The next whole minute after `after`.
        let mut t = local
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        let limit = local.year().saturating_add(5);
        while t.year() <= limit {
            if self.months & (1 << t.month()) == 0 {
                t = first_of_next_month(t)?;
                continue;
            }
            if !self.day_matches(t.date()) {
                t = t.date().tomorrow().ok()?.to_datetime(midnight());
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = t
                    .with()
                    .minute(0)
                    .build()
                    .ok()?
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            if self.minutes & (1 << t.minute()) == 0 {
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            let at = zone.to_ambiguous_timestamp(t).compatible().ok()?;
            if at > after {
                return Some(at);
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }
}

fn midnight() -> k8s_openapi::jiff::civil::Time {
    k8s_openapi::jiff::civil::Time::midnight()
}

fn first_of_next_month(t: DateTime) -> Option<DateTime> {
    let first = t.date().first_of_month().checked_add(1.month()).ok()?;
    Some(first.to_datetime(midnight()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::cron::{ScheduleError, parse};
    use proptest::prelude::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn next_utc(schedule: &str, after: &str) -> Option<Timestamp> {
        parse(schedule)
            .expect("valid")
            .next(ts(after), &TimeZone::UTC)
    }

    #[test]
    fn standard_fields_steps_ranges_and_names() {
        assert_eq!(
            next_utc("* * * * *", "2026-01-01T00:00:30Z"),
            Some(ts("2026-01-01T00:01:00Z"))
        );
        assert_eq!(
            next_utc("* * * * *", "2026-01-01T00:01:00Z"),
            Some(ts("2026-01-01T00:02:00Z")),
            "strictly after"
        );
        assert_eq!(
            next_utc("*/15 * * * *", "2026-01-01T00:16:00Z"),
            Some(ts("2026-01-01T00:30:00Z"))
        );
        assert_eq!(
            next_utc("5/20 * * * *", "2026-01-01T00:26:00Z"),
            Some(ts("2026-01-01T00:45:00Z"))
        );
        assert_eq!(
            next_utc("0 9-17/4 * * MON-fri", "2026-01-02T17:00:00Z"),
            Some(ts("2026-01-05T09:00:00Z")),
            "9, 13 and 17 on a Friday; then Monday"
        );
        assert_eq!(
            next_utc("30 2 1 jan,JUL *", "2026-02-01T00:00:00Z"),
            Some(ts("2026-07-01T02:30:00Z"))
        );
        assert_eq!(
            next_utc("0 0 29 2 *", "2026-03-01T00:00:00Z"),
            Some(ts("2028-02-29T00:00:00Z"))
        );
        assert_eq!(next_utc("0 0 30 2 *", "2026-03-01T00:00:00Z"), None);
    }

    #[test]
    fn day_of_month_and_weekday_combine_like_cron() {
        // Both restricted: either matches (the 13th or any Friday).
        assert_eq!(
            next_utc("0 0 13 * 5", "2026-01-01T00:00:00Z"),
            Some(ts("2026-01-02T00:00:00Z"))
        );
        // One is a star: both must match (a Friday that is the 13th).
        assert_eq!(
            next_utc("0 0 13 * *", "2026-01-01T00:00:00Z"),
            Some(ts("2026-01-13T00:00:00Z"))
        );
        assert_eq!(
            next_utc("0 0 ? * 5", "2026-01-01T00:00:00Z"),
            Some(ts("2026-01-02T00:00:00Z"))
        );
        // `*/2` is no star: OR semantics with the weekday.
        assert_eq!(
            next_utc("0 0 */2 * 1", "2026-01-01T00:00:00Z"),
            Some(ts("2026-01-03T00:00:00Z"))
        );
    }

    #[test]
    fn descriptors_and_every() {
        assert_eq!(
            next_utc("@hourly", "2026-01-01T00:00:00Z"),
            Some(ts("2026-01-01T01:00:00Z"))
        );
        assert_eq!(
            next_utc("@daily", "2026-01-01T10:00:00Z"),
            Some(ts("2026-01-02T00:00:00Z"))
        );
        assert_eq!(
            next_utc("@midnight", "2026-01-01T10:00:00Z"),
            Some(ts("2026-01-02T00:00:00Z"))
        );
        assert_eq!(
            next_utc("@weekly", "2026-01-01T10:00:00Z"),
            Some(ts("2026-01-04T00:00:00Z")),
            "Sunday"
        );
        assert_eq!(
            next_utc("@monthly", "2026-01-15T00:00:00Z"),
            Some(ts("2026-02-01T00:00:00Z"))
        );
        assert_eq!(
            next_utc("@yearly", "2026-01-15T00:00:00Z"),
            Some(ts("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            next_utc("@annually", "2026-01-15T00:00:00Z"),
            Some(ts("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            next_utc("@every 1h30m", "2026-01-01T00:00:10.5Z"),
            Some(ts("2026-01-01T01:30:10Z"))
        );
    }

    #[test]
    fn zones_from_prefix_or_caller() {
        let berlin = TimeZone::get("Europe/Berlin").expect("tzdb");
        assert_eq!(
            parse("0 9 * * *")
                .expect("valid")
                .next(ts("2026-01-01T00:00:00Z"), &berlin),
            Some(ts("2026-01-01T08:00:00Z"))
        );
        for prefixed in [
            "CRON_TZ=America/New_York 0 9 * * *",
            "TZ=America/New_York 0 9 * * *",
        ] {
            let s = parse(prefixed).expect("valid");
            assert_eq!(
                s.next(ts("2026-01-01T00:00:00Z"), &berlin),
                Some(ts("2026-01-01T14:00:00Z")),
                "{prefixed}"
            );
        }
        // DST: 02:30 does not exist in Berlin on 2026-03-29; the job runs right after the gap.
        assert_eq!(
            parse("30 2 * * *")
                .expect("valid")
                .next(ts("2026-03-28T12:00:00Z"), &berlin),
            Some(ts("2026-03-29T01:30:00Z"))
        );
        assert!(matches!(
            parse("TZ=Mars/Olympus 0 9 * * *"),
            Err(ScheduleError::UnknownTimeZone(_))
        ));
    }

    #[test]
    fn refuses_what_robfig_refuses() {
        for bad in [
            "",
            "* * * *",
            "* * * * * *",
            "60 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "* * * 13 *",
            "* * * * 7",
            "*/0 * * * *",
            "5-1 * * * *",
            "@fortnightly",
            "@every",
            "@every 5x",
            "a * * * *",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    fn field_strategy(min: u32, max: u32) -> impl Strategy<Value = String> {
        prop_oneof![
            Just("*".to_owned()),
            (min..=max).prop_map(|v| v.to_string()),
            (min..=max, min..=max).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
            (1u32..=(max - min + 1)).prop_map(|s| format!("*/{s}")),
            proptest::collection::vec(min..=max, 1..4).prop_map(|v| v
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")),
        ]
    }

    fn schedule_strategy() -> impl Strategy<Value = String> {
        (
            field_strategy(0, 59),
            field_strategy(0, 23),
            field_strategy(1, 28),
            field_strategy(1, 12),
            field_strategy(0, 6),
        )
            .prop_map(|(a, b, c, d, e)| format!("{a} {b} {c} {d} {e}"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// The next tick is later, on a whole minute, matches the fields, and no minute in
        /// between matches (checked minute by minute over the first two days).
        #[test]
        fn next_is_the_first_matching_minute(
            text in schedule_strategy(),
            start in 1_700_000_000i64..1_900_000_000i64,
        ) {
            let schedule = parse(&text).expect("generated schedules are valid");
            let Kind::Fields(fields) = &schedule.kind else { unreachable!() };
            let after = Timestamp::from_second(start).expect("in range");
            let matches = |t: Timestamp| {
                let dt = t.to_zoned(TimeZone::UTC).datetime();
                fields.months & (1 << dt.month()) != 0
                    && fields.day_matches(dt.date())
                    && fields.hours & (1 << dt.hour()) != 0
                    && fields.minutes & (1 << dt.minute()) != 0
            };
            let next = schedule.next(after, &TimeZone::UTC);
            if let Some(next) = next {
                prop_assert!(next > after);
                prop_assert_eq!(next.as_second() % 60, 0);
                prop_assert_eq!(next.subsec_nanosecond(), 0);
                prop_assert!(matches(next), "{} does not match {}", next, text);
            }
            let mut t = Timestamp::from_second(start - start % 60 + 60).expect("in range");
            let horizon = Timestamp::from_second(start + 2 * 86_400).expect("in range");
            while t < horizon && next.is_none_or(|n| t < n) {
                prop_assert!(!matches(t), "{} matches {} before the computed next {:?}", t, text, next);
                t = t.checked_add(SignedDuration::from_secs(60)).expect("in range");
            }
        }

        /// Ticks strictly increase, so a controller walking them always makes progress.
        #[test]
        fn ticks_increase(text in schedule_strategy(), start in 1_700_000_000i64..1_900_000_000i64) {
            let schedule = parse(&text).expect("valid");
            let mut t = Timestamp::from_second(start).expect("in range");
            for _ in 0..5 {
                match schedule.next(t, &TimeZone::UTC) {
                    Some(n) => { prop_assert!(n > t); t = n; }
                    None => break,
                }
            }
        }
    }
}
