//! Storage quantities (`64Mi`, `1G`, `1.5Gi`, `100e6`) as bytes, and
//! bytes written back as the API server writes a `resource.Quantity` made
//! with `BinarySI` (what the external-provisioner and -resizer put in a
//! PV's capacity): `64Mi` when it is a whole number of a binary unit,
//! plain bytes otherwise.

/// The bytes a quantity stands for, rounded up as `Quantity.Value()`
/// rounds; None for text that is not a quantity.
pub fn parse_bytes(q: &str) -> Option<u128> {
    let q = q.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+')).unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    if !whole.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    // number = mantissa / 10^frac_digits
    let mantissa: u128 = format!("{whole}{frac}").parse().ok()?;
    let mut denominator: u128 = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    let (mut multiplier, divide): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "m" => (1, 1_000),
        "u" => (1, 1_000_000),
        "n" => (1, 1_000_000_000),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().ok()?;
            let p = 10u128.checked_pow(exp.unsigned_abs())?;
            if exp >= 0 { (p, 1) } else { (1, p) }
        }
        _ => return None,
    };
    denominator = denominator.checked_mul(divide)?;
    multiplier = mantissa.checked_mul(multiplier)?;
    Some(multiplier.div_ceil(denominator))
}

/// Bytes as a BinarySI quantity: `128Mi`, `1Gi`, `1500`.
pub fn format_bytes(bytes: u128) -> String {
    if bytes == 0 {
        return "0".into();
    }
    for (shift, suffix) in [(60, "Ei"), (50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
        let unit = 1u128 << shift;
        if bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// A quantity in JSON (a string, or a bare number as some clients send it).
pub fn value_bytes(v: &serde_json::Value) -> Option<u128> {
    match v {
        serde_json::Value::String(s) => parse_bytes(s),
        serde_json::Value::Number(n) => n.as_u64().map(u128::from),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_the_api_server_reads_them() {
        for (q, want) in [
            ("64Mi", 64 << 20),
            ("1Gi", 1 << 30),
            ("1G", 1_000_000_000),
            ("1.5Gi", 3 << 29),
            ("100M", 100_000_000),
            ("129e6", 129_000_000),
            ("1500", 1500),
            ("0.5", 1),
            ("1500m", 2),
            ("+2Ki", 2048),
        ] {
            assert_eq!(parse_bytes(q), Some(want), "{q}");
        }
        for bad in ["", "Mi", "1X", "1.2.3", "-1", "abc"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn bytes_format_as_binary_si() {
        assert_eq!(format_bytes(64 << 20), "64Mi");
        assert_eq!(format_bytes(1 << 30), "1Gi");
        assert_eq!(format_bytes(3 << 29), "1536Mi");
        assert_eq!(format_bytes(1500), "1500");
        assert_eq!(format_bytes(0), "0");
        assert_eq!(parse_bytes(&format_bytes(123_456_789)), Some(123_456_789));
    }
}
