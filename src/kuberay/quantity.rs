//! Kubernetes resource quantities (`500m`, `4Gi`, `1e3`) as exact numbers: enough of
//! `k8s.io/apimachinery/pkg/api/resource` for `ray start` flags and the status totals.
//!
//! A value is held in nano-units (10^-9) in an `i128`, which covers every quantity Kubernetes
//! accepts (up to exabytes) without rounding; finer values round up, as Kubernetes does.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// How a quantity is written; sums keep the format of their first non-zero term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `Ki`, `Mi`, … (powers of 1024).
    BinarySi,
    /// `m`, `k`, `M`, … or no suffix.
    DecimalSi,
    /// `1e3`.
    DecimalExponent,
}

/// An exact quantity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Amount {
    nanos: i128,
    format: Format,
}

impl Default for Amount {
    fn default() -> Self {
        Amount {
            nanos: 0,
            format: Format::DecimalSi,
        }
    }
}

impl Amount {
    /// Parses a quantity string; `None` when Kubernetes would refuse it.
    pub fn parse(text: &str) -> Option<Amount> {
        let text = text.trim();
        let number_end = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
            .unwrap_or(text.len());
        let (number, suffix) = text.split_at(number_end);
        let (multiplier_num, multiplier_den, format) = suffix_scale(suffix)?;
        let nanos = parse_decimal_nanos(number)?;
        // Round up what is finer than a nano-unit, as Kubernetes does.
        let scaled = nanos.checked_mul(multiplier_num)?;
        let value = div_ceil(scaled, multiplier_den);
        Some(Amount {
            nanos: value,
            format,
        })
    }

    /// Reads a [`Quantity`]; `None` when it does not parse.
    pub fn of(quantity: &Quantity) -> Option<Amount> {
        Amount::parse(&quantity.0)
    }

    /// The whole-number value rounded up (`500m` → 1), as `resource.Quantity.Value()`.
    pub fn ceil_units(self) -> i128 {
        div_ceil(self.nanos, NANOS_PER_UNIT)
    }

    /// The value as a float (for Ray's `--resources` JSON).
    pub fn as_f64(self) -> f64 {
        self.nanos as f64 / NANOS_PER_UNIT as f64
    }

    pub fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// `self + other`, in the format of the first non-zero term.
    pub fn plus(self, other: Amount) -> Amount {
        let format = if self.nanos == 0 {
            other.format
        } else {
            self.format
        };
        Amount {
            nanos: self.nanos.saturating_add(other.nanos),
            format,
        }
    }

    /// `self * factor`, in the same format.
    pub fn times(self, factor: i64) -> Amount {
        Amount {
            nanos: self.nanos.saturating_mul(i128::from(factor)),
            format: self.format,
        }
    }

    /// The canonical string Kubernetes would print: the largest suffix that keeps the value an
    /// exact integer (`1500m`, `2`, `6Gi`, `5368709120`).
    pub fn canonical(self) -> String {
        if self.nanos == 0 {
            return "0".to_owned();
        }
        let binary_eligible = self.format == Format::BinarySi
            && self.nanos % NANOS_PER_UNIT == 0
            && self.nanos.abs() >= 1024 * NANOS_PER_UNIT;
        if binary_eligible {
            let mut units = self.nanos / NANOS_PER_UNIT;
            let mut power = 0;
            while power < 6 && units % 1024 == 0 {
                units /= 1024;
                power += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
            return format!("{units}{suffix}");
        }
        // Decimal: strip zeros three at a time, from nano-units up to exa.
        let mut mantissa = self.nanos;
        let mut exponent = -9;
        while exponent < 18 && mantissa % 1000 == 0 {
            mantissa /= 1000;
            exponent += 3;
        }
        if self.format == Format::DecimalExponent {
            return if exponent == 0 {
                mantissa.to_string()
            } else {
                format!("{mantissa}e{exponent}")
            };
        }
        let suffix = match exponent {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            _ => "E",
        };
        format!("{mantissa}{suffix}")
    }

    /// As a [`Quantity`] in canonical form.
    pub fn to_quantity(self) -> Quantity {
        Quantity(self.canonical())
    }
}

/// (numerator, denominator, format): the suffix as a factor of the plain number.
fn suffix_scale(suffix: &str) -> Option<(i128, i128, Format)> {
    let pow10 = |e: u32| 10i128.pow(e);
    let decimal = |num: i128, den: i128| Some((num, den, Format::DecimalSi));
    match suffix {
        "" => decimal(1, 1),
        "n" => decimal(1, pow10(9)),
        "u" => decimal(1, pow10(6)),
        "m" => decimal(1, pow10(3)),
        "k" => decimal(pow10(3), 1),
        "M" => decimal(pow10(6), 1),
        "G" => decimal(pow10(9), 1),
        "T" => decimal(pow10(12), 1),
        "P" => decimal(pow10(15), 1),
        "E" => decimal(pow10(18), 1),
        "Ki" => Some((1024, 1, Format::BinarySi)),
        "Mi" => Some((1024i128.pow(2), 1, Format::BinarySi)),
        "Gi" => Some((1024i128.pow(3), 1, Format::BinarySi)),
        "Ti" => Some((1024i128.pow(4), 1, Format::BinarySi)),
        "Pi" => Some((1024i128.pow(5), 1, Format::BinarySi)),
        "Ei" => Some((1024i128.pow(6), 1, Format::BinarySi)),
        _ => {
            let exponent = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            let exponent: i32 = exponent.parse().ok()?;
            if !(-18..=18).contains(&exponent) {
                return None;
            }
            let (num, den) = if exponent >= 0 {
                (pow10(exponent.unsigned_abs()), 1)
            } else {
                (1, pow10(exponent.unsigned_abs()))
            };
            Some((num, den, Format::DecimalExponent))
        }
    }
}

/// A signed decimal number (`1`, `0.5`, `.5`, `+2`) in nano-units, rounding finer digits up.
fn parse_decimal_nanos(text: &str) -> Option<i128> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    if !whole
        .bytes()
        .chain(fraction.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: i128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let kept = &fraction[..fraction.len().min(9)];
    let mut fraction_nanos: i128 = if kept.is_empty() {
        0
    } else {
        kept.parse().ok()?
    };
    fraction_nanos *= 10i128.pow(9 - kept.len() as u32);
    if fraction[kept.len()..].bytes().any(|b| b != b'0') {
        fraction_nanos += 1;
    }
    let value = whole
        .checked_mul(NANOS_PER_UNIT)?
        .checked_add(fraction_nanos)?;
    Some(if negative { -value } else { value })
}

fn div_ceil(value: i128, divisor: i128) -> i128 {
    let quotient = value / divisor;
    if value % divisor > 0 {
        quotient + 1
    } else {
        quotient
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        Amount::parse(text).expect(text).canonical()
    }

    #[test]
    fn parses_every_suffix_kind() {
        assert_eq!(Amount::parse("500m").unwrap().ceil_units(), 1);
        assert_eq!(Amount::parse("1.5").unwrap().ceil_units(), 2);
        assert_eq!(Amount::parse("2").unwrap().ceil_units(), 2);
        assert_eq!(Amount::parse("5Gi").unwrap().ceil_units(), 5_368_709_120);
        assert_eq!(Amount::parse("1G").unwrap().ceil_units(), 1_000_000_000);
        assert_eq!(Amount::parse("1e3").unwrap().ceil_units(), 1000);
        assert_eq!(Amount::parse(".5").unwrap().as_f64(), 0.5);
        assert_eq!(Amount::parse("0").unwrap().ceil_units(), 0);
        for bad in ["", "abc", "1Qi", "1.2.3", "--1", "1e99"] {
            assert!(Amount::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn canonical_form_matches_kubernetes() {
        assert_eq!(canon("1"), "1");
        assert_eq!(canon("1000m"), "1");
        assert_eq!(canon("500m"), "500m");
        assert_eq!(canon("6144Mi"), "6Gi");
        assert_eq!(canon("1536Mi"), "1536Mi");
        assert_eq!(canon("512"), "512");
        assert_eq!(canon("1000"), "1k");
        assert_eq!(canon("1e3"), "1e3");
        assert_eq!(canon("0Gi"), "0");
    }

    #[test]
    fn sums_keep_the_first_non_zero_format() {
        let head = Amount::parse("5Gi").unwrap();
        let worker = Amount::parse("1Gi").unwrap().times(1);
        assert_eq!(head.plus(worker).canonical(), "6Gi");
        let cpu = Amount::default()
            .plus(Amount::parse("500m").unwrap())
            .plus(Amount::parse("1").unwrap());
        assert_eq!(cpu.canonical(), "1500m");
        let decimal_memory = Amount::parse("2G")
            .unwrap()
            .plus(Amount::parse("1Gi").unwrap());
        assert_eq!(decimal_memory.canonical(), "3073741824");
        assert_eq!(Amount::parse("1Gi").unwrap().times(0).canonical(), "0");
    }
}
