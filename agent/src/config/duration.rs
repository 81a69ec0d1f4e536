//! Go's duration syntax (`time.ParseDuration` / `Duration.String`), which
//! the kubelet uses for every duration in flags and config files.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurationError {
    /// Not Go duration syntax.
    Invalid,
    /// Well-formed but below zero.
    Negative,
}

const NS: u128 = 1;
const US: u128 = 1_000;
const MS: u128 = 1_000_000;
const S: u128 = 1_000_000_000;

fn unit(u: &str) -> Option<u128> {
    Some(match u {
        "ns" => NS,
        "us" | "\u{b5}s" | "\u{3bc}s" => US,
        "ms" => MS,
        "s" => S,
        "m" => 60 * S,
        "h" => 3600 * S,
        _ => return None,
    })
}

/// Parses `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` or `0`, as `time.ParseDuration`.
/// Durations are never negative here: every kubelet duration that takes a
/// sign rejects it.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(DurationError::Invalid);
    }
    // Total in nanoseconds; u128 cannot overflow on any input that Go accepts
    // (Go caps at i64), and the cap is applied below.
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (int_digits, after_int) = rest.split_at(int_end);
        let (frac_digits, after_number) = match after_int.strip_prefix('.') {
            Some(r) => {
                let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
                r.split_at(end)
            }
            None => ("", after_int),
        };
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(DurationError::Invalid);
        }
        let unit_end = after_number.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(after_number.len());
        let (unit_name, next) = after_number.split_at(unit_end);
        let scale = unit(unit_name).ok_or(DurationError::Invalid)?;
        let int: u128 =
            if int_digits.is_empty() { 0 } else { int_digits.parse().map_err(|_| DurationError::Invalid)? };
        total =
            total.checked_add(int.checked_mul(scale).ok_or(DurationError::Invalid)?).ok_or(DurationError::Invalid)?;
        // The fraction, truncated to nanoseconds as Go does.
        let mut frac_value: u128 = 0;
        let mut frac_scale: u128 = 1;
        for d in frac_digits.bytes().take(20) {
            frac_value = frac_value * 10 + u128::from(d - b'0');
            frac_scale *= 10;
        }
        total += frac_value * scale / frac_scale;
        if total > i64::MAX as u128 {
            return Err(DurationError::Invalid);
        }
        rest = next;
    }
    if negative && total > 0 {
        return Err(DurationError::Negative);
    }
    Ok(Duration::from_nanos(total as u64))
}

/// Formats as Go's `Duration.String()`: `0s`, `500ms`, `10s`, `1m30s`,
/// `2h0m0s`, `1.5s`.
pub fn format(d: Duration) -> String {
    let n = d.as_nanos();
    if n == 0 {
        return "0s".to_owned();
    }
    if n < S {
        let (suffix, prec) = if n < US {
            ("ns", 0)
        } else if n < MS {
            ("\u{b5}s", 3)
        } else {
            ("ms", 6)
        };
        return format!("{}{suffix}", with_fraction(n, prec));
    }
    let secs = n / S;
    let seconds = format!("{}{}", secs % 60, fraction(n % S, 9));
    let minutes = secs / 60;
    if minutes == 0 {
        return format!("{seconds}s");
    }
    let hours = minutes / 60;
    if hours == 0 {
        return format!("{}m{seconds}s", minutes % 60);
    }
    format!("{hours}h{}m{seconds}s", minutes % 60)
}

/// `v / 10^prec` with its fraction, trailing zeros dropped.
fn with_fraction(v: u128, prec: u32) -> String {
    let p = 10u128.pow(prec);
    format!("{}{}", v / p, fraction(v % p, prec))
}

/// `.ddd` for `rem / 10^prec`, trailing zeros dropped; empty when zero.
fn fraction(rem: u128, prec: u32) -> String {
    if rem == 0 {
        return String::new();
    }
    let digits = format!("{rem:0width$}", width = prec as usize);
    format!(".{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_syntax() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("0s", 0),
            ("-0s", 0),
            ("+5s", 5_000_000_000),
            ("10s", 10_000_000_000),
            ("1m30s", 90_000_000_000),
            ("2h", 7_200_000_000_000),
            ("500ms", 500_000_000),
            ("1.5s", 1_500_000_000),
            (".5s", 500_000_000),
            ("5.s", 5_000_000_000),
            ("1h2m3s4ms5us6ns", 3_723_004_005_006),
            ("1\u{b5}s", 1_000),
            ("1\u{3bc}s", 1_000),
            ("100ns", 100),
            ("1.0000000009s", 1_000_000_000),
            ("2562047h47m16.854775807s", i64::MAX as u64),
        ];
        for (input, nanos) in cases {
            assert_eq!(parse(input), Ok(Duration::from_nanos(*nanos)), "{input}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        for bad in ["", "1", "s", ".s", "1x", "1 s", "1S", "10", "1m 30s", "-", "1.2.3s", "2562047h47m16.854775808s"] {
            assert_eq!(parse(bad), Err(DurationError::Invalid), "`{bad}`");
        }
        for neg in ["-1s", "-1m30s", "-0.5ms"] {
            assert_eq!(parse(neg), Err(DurationError::Negative), "`{neg}`");
        }
    }

    #[test]
    fn formats_like_go() {
        let cases: &[(u64, &str)] = &[
            (0, "0s"),
            (1, "1ns"),
            (1_500, "1.5\u{b5}s"),
            (100_000_000, "100ms"),
            (1_500_000_000, "1.5s"),
            (10_000_000_000, "10s"),
            (60_000_000_000, "1m0s"),
            (90_000_000_000, "1m30s"),
            (300_000_000_000, "5m0s"),
            (7_200_000_000_000, "2h0m0s"),
            (14_400_000_000_000, "4h0m0s"),
            (3_723_500_000_000, "1h2m3.5s"),
        ];
        for (nanos, want) in cases {
            let d = Duration::from_nanos(*nanos);
            assert_eq!(format(d), *want);
            assert_eq!(parse(want), Ok(d), "round trip {want}");
        }
    }
}
