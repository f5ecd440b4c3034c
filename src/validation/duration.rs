//! Go durations (`time.ParseDuration`): `300ms`, `1.5h`, `1h30m`, `-2m`, `0`. The one parser of
//! the crate: ServePipeline's `refreshInterval`/`timeout`, `ray.io/initializing-timeout`, cron
//! `@every`, and the operator's own flags all read durations through it.
//!
//! Every input is untrusted (a CRD pattern admits `99999999999999999999h`), so the arithmetic is
//! integer and checked: a value beyond Go's range (±292 years, i64 nanoseconds) is an error,
//! never a panic or a silent wrap. Deliberate differences from Go: a fraction is exact integer
//! arithmetic over its first 18 digits (Go rounds through a float, so the two can differ by a
//! nanosecond there), and text past [`MAX_DURATION_TEXT`] bytes is refused, so a parse costs a
//! bounded amount of work.

use std::time::Duration;

/// Longest duration text accepted; real durations are a few bytes long.
pub const MAX_DURATION_TEXT: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("an empty string is not a duration (write e.g. 30s, 5m or 1h30m)")]
    Empty,
    #[error("{0:?} is longer than {MAX_DURATION_TEXT} characters")]
    TooLong(String),
    #[error("{0:?} is not a duration like 300ms, 30s, 5m or 1h30m")]
    Syntax(String),
    #[error("{text:?} has the unit {unit:?}; use ns, us, ms, s, m or h")]
    UnknownUnit { text: String, unit: String },
    #[error("{0:?} is too large: a duration is at most 2562047h (about 292 years)")]
    Overflow(String),
    #[error("{0:?} is negative; a positive duration is required")]
    Negative(String),
    #[error("{text:?} is shorter than the minimum of {min}")]
    BelowMinimum { text: String, min: String },
    #[error("{text:?} is longer than the maximum of {max}")]
    AboveMaximum { text: String, max: String },
}

const NANOS_PER: [(&str, u64); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("\u{b5}s", 1_000),  // µ (micro sign), as Go accepts
    ("\u{3bc}s", 1_000), // μ (Greek mu), as Go accepts
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a Go duration into signed nanoseconds, exactly where Go's `time.ParseDuration`
/// succeeds (within [`MAX_DURATION_TEXT`]), and fails where it fails.
pub fn parse_go_duration(text: &str) -> Result<i64, DurationError> {
    let original = text;
    if text.len() > MAX_DURATION_TEXT {
        return Err(DurationError::TooLong(crate::k8s::truncate(
            text,
            MAX_DURATION_TEXT,
        )));
    }
    let syntax = || DurationError::Syntax(original.to_owned());
    let overflow = || DurationError::Overflow(original.to_owned());
    let mut rest = text;
    let negative = rest.starts_with('-');
    if let Some(stripped) = rest.strip_prefix(['-', '+']) {
        rest = stripped;
    }
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(if original.is_empty() {
            DurationError::Empty
        } else {
            syntax()
        });
    }
    // Go's limit: |d| <= 1<<63 - 1 (positive) or 1<<63 (negative).
    let limit: u64 = if negative { 1 << 63 } else { (1 << 63) - 1 };
    let mut total: u64 = 0;
    while !rest.is_empty() {
        // The integer part.
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let mut whole: u64 = 0;
        for digit in rest[..int_len].bytes() {
            whole = whole
                .checked_mul(10)
                .and_then(|w| w.checked_add(u64::from(digit - b'0')))
                .filter(|w| *w <= limit)
                .ok_or_else(overflow)?;
        }
        rest = &rest[int_len..];
        // The fraction: digits beyond what a u64 scale holds add nothing at ns precision.
        let (mut fraction, mut scale, mut frac_len) = (0u64, 1u64, 0usize);
        if let Some(after_dot) = rest.strip_prefix('.') {
            frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            for digit in after_dot[..frac_len].bytes() {
                if scale <= u64::MAX / 10 / 10 {
                    fraction = fraction * 10 + u64::from(digit - b'0');
                    scale *= 10;
                }
            }
            rest = &after_dot[frac_len..];
        } else if int_len == 0 {
            return Err(syntax());
        }
        if int_len == 0 && frac_len == 0 {
            return Err(syntax()); // "." alone
        }
        let unit_len = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        if unit.is_empty() {
            return Err(syntax()); // Go: "missing unit in duration"
        }
        let per = NANOS_PER
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, n)| *n)
            .ok_or_else(|| DurationError::UnknownUnit {
                text: crate::k8s::truncate(original, MAX_DURATION_TEXT),
                unit: unit.to_owned(),
            })?;
        rest = &rest[unit_len..];
        let whole_nanos = whole
            .checked_mul(per)
            .filter(|v| *v <= limit)
            .ok_or_else(overflow)?;
        // fraction/scale < 1, so this is < per and fits; u128 keeps the product exact.
        let fraction_nanos = (u128::from(fraction) * u128::from(per) / u128::from(scale)) as u64;
        total = total
            .checked_add(whole_nanos)
            .and_then(|t| t.checked_add(fraction_nanos))
            .filter(|t| *t <= limit)
            .ok_or_else(overflow)?;
    }
    Ok(if negative {
        // total <= 1<<63 here; 1<<63 itself is i64::MIN.
        0i64.wrapping_sub_unsigned(total)
    } else {
        total as i64
    })
}

/// A non-negative Go duration as a [`Duration`].
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let nanos = parse_go_duration(text)?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| DurationError::Negative(text.to_owned()))
}

/// A Go duration within `[min, max]`.
pub fn parse_bounded(text: &str, min: Duration, max: Duration) -> Result<Duration, DurationError> {
    let value = parse_duration(text)?;
    if value < min {
        return Err(DurationError::BelowMinimum {
            text: text.to_owned(),
            min: format_duration(min),
        });
    }
    if value > max {
        return Err(DurationError::AboveMaximum {
            text: text.to_owned(),
            max: format_duration(max),
        });
    }
    Ok(value)
}

/// KubeRay's form for `ray.io/initializing-timeout`: whole seconds (`600`) or a Go duration
/// (`10m`), positive.
pub fn parse_seconds_or_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    let value = match text.parse::<i64>() {
        Ok(seconds) => u64::try_from(seconds)
            .map(Duration::from_secs)
            .map_err(|_| DurationError::Negative(text.to_owned()))?,
        Err(_) => parse_duration(text)?,
    };
    if value.is_zero() {
        return Err(DurationError::BelowMinimum {
            text: text.to_owned(),
            min: "1ns".to_owned(),
        });
    }
    Ok(value)
}

/// Writes `d` the way a person would set it: `90s`, `2m`, `250ms`, `1h`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NS: i64 = 1;
    const US: i64 = 1_000;
    const MS: i64 = 1_000_000;
    const S: i64 = 1_000_000_000;
    const M: i64 = 60 * S;
    const H: i64 = 60 * M;

    #[test]
    fn accepts_what_go_accepts() {
        // Cases from Go's documented grammar, checked by hand against time.ParseDuration.
        for (text, nanos) in [
            ("0", 0),
            ("-0", 0),
            ("+0", 0),
            ("5s", 5 * S),
            ("30s", 30 * S),
            ("1478s", 1478 * S),
            ("-5s", -5 * S),
            ("+5s", 5 * S),
            ("5.0s", 5 * S),
            ("5.6s", 5 * S + 600 * MS),
            ("5.s", 5 * S),
            (".5s", 500 * MS),
            ("1.0s", S),
            ("1.004s", S + 4 * MS),
            ("100.00100s", 100 * S + MS),
            ("10ns", 10 * NS),
            ("11us", 11 * US),
            ("12\u{b5}s", 12 * US),
            ("12\u{3bc}s", 12 * US),
            ("13ms", 13 * MS),
            ("14s", 14 * S),
            ("15m", 15 * M),
            ("16h", 16 * H),
            ("3h30m", 3 * H + 30 * M),
            ("10.5s4m", 4 * M + 10 * S + 500 * MS),
            ("-2m3.4s", -(2 * M + 3 * S + 400 * MS)),
            (
                "1h2m3s4ms5us6ns",
                H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS,
            ),
            ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS),
            ("52763797000ns", 52_763_797_000 * NS),
            ("9007199254740993ns", 9_007_199_254_740_993),
            ("9223372036854775807ns", i64::MAX),
            ("9223372036854775.807us", i64::MAX),
            ("9223372036s854ms775us807ns", i64::MAX),
            ("-9223372036854775808ns", i64::MIN),
            ("-2562047h47m16.854775808s", i64::MIN),
            ("0.100000000000000000000h", 6 * M),
            (
                "0.830103483285477580700h",
                49 * M + 48 * S + 372_539_827 * NS,
            ),
        ] {
            assert_eq!(parse_go_duration(text), Ok(nanos), "{text}");
        }
    }

    #[test]
    fn refuses_what_go_refuses_and_everything_out_of_range() {
        for text in [
            "", "3", "-", "s", ".", "-.", ".s", "+.s", "1d", "1sm", "5 s", " 5s", "5s ", "1h-1m",
        ] {
            assert!(parse_go_duration(text).is_err(), "{text:?} must be refused");
        }
        for text in [
            "9223372036854775808ns",
            "-9223372036854775809ns",
            "99999999999999999999h",
            "2562048h",
            "9223372036854775807ns1ns",
            "2562047h47m16.854775808s",
            "18446744073709551616s",
        ] {
            assert_eq!(
                parse_go_duration(text),
                Err(DurationError::Overflow(text.to_owned())),
                "{text}"
            );
        }
        assert!(matches!(
            parse_go_duration(&"1".repeat(100)),
            Err(DurationError::TooLong(_))
        ));
        assert!(matches!(
            parse_go_duration("5d"),
            Err(DurationError::UnknownUnit { unit, .. }) if unit == "d"
        ));
    }

    #[test]
    fn bounded_and_unsigned_forms_name_the_limit() {
        let min = Duration::from_secs(1);
        let max = Duration::from_secs(120);
        assert_eq!(parse_bounded("90s", min, max), Ok(Duration::from_secs(90)));
        assert_eq!(
            parse_bounded("0s", min, max).unwrap_err().to_string(),
            "\"0s\" is shorter than the minimum of 1s"
        );
        assert_eq!(
            parse_bounded("3m", min, max).unwrap_err().to_string(),
            "\"3m\" is longer than the maximum of 2m"
        );
        assert!(matches!(
            parse_duration("-1s"),
            Err(DurationError::Negative(_))
        ));
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }

    #[test]
    fn seconds_or_duration_is_kuberays_annotation_form() {
        assert_eq!(
            parse_seconds_or_duration("600"),
            Ok(Duration::from_secs(600))
        );
        assert_eq!(
            parse_seconds_or_duration(" 10m "),
            Ok(Duration::from_secs(600))
        );
        assert!(parse_seconds_or_duration("0").is_err());
        assert!(parse_seconds_or_duration("-5").is_err());
        assert!(parse_seconds_or_duration("0s").is_err());
        assert!(matches!(
            parse_seconds_or_duration("99999999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever the text, parsing ends in a value or an error, never a panic.
        #[test]
        fn never_panics(text in "[-+]?([0-9.]{0,25}(ns|us|ms|s|m|h|d|µs)?){0,4}") {
            let _ = parse_go_duration(&text);
        }

        /// Writing a value in whole units of each kind and parsing it gives it back.
        #[test]
        fn sums_of_segments_are_exact(h in 0i64..2_000_000, m in 0i64..60, s in 0i64..60, ms in 0i64..1000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            prop_assert_eq!(parse_go_duration(&text), Ok(h * H + m * M + s * S + ms * MS));
        }

        /// Huge numbers with any unit are an overflow error, not a panic or a wrap.
        #[test]
        fn huge_values_overflow_cleanly(digits in "[1-9][0-9]{19,40}", unit in "(ns|us|ms|s|m|h)") {
            let text = format!("{digits}{unit}");
            prop_assert_eq!(parse_go_duration(&text), Err(DurationError::Overflow(text.clone())));
        }
    }
}
