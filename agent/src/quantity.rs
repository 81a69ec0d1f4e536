//! Kubernetes resource quantities (`500m`, `2Gi`, `1.5`, `100M`, `1e3`),
//! parsed exactly as the API server's `resource.Quantity` reads them.

use std::fmt;

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum QuantityError {
    #[error("empty quantity")]
    Empty,
    #[error(
        "`{0}` is not a quantity: expected a number with an optional suffix (Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E)"
    )]
    Invalid(String),
    #[error("`{0}` is too large")]
    Overflow(String),
}

/// A quantity held in thousandths of its unit (milli-units), which is exact
/// for every CPU and memory value the kubelet deals with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity {
    milli: i128,
}

impl Quantity {
    pub const ZERO: Quantity = Quantity { milli: 0 };

    pub fn from_units(units: i64) -> Quantity {
        Quantity { milli: units as i128 * 1000 }
    }

    pub fn from_milli(milli: i64) -> Quantity {
        Quantity { milli: milli as i128 }
    }

    /// The value rounded up to whole units (bytes, cores, counts), as
    /// `Quantity.Value()` does, saturating at i64.
    pub fn value(&self) -> i64 {
        let v = self.milli.div_euclid(1000) + i128::from(self.milli.rem_euclid(1000) != 0);
        v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    /// The value in thousandths, as `Quantity.MilliValue()`, saturating.
    pub fn milli_value(&self) -> i64 {
        self.milli.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    pub fn is_negative(&self) -> bool {
        self.milli < 0
    }

    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        s.parse()
    }
}

/// Sums and differences saturate instead of overflowing (at ±1.7e35 units,
/// far beyond any resource).
impl std::ops::Add for Quantity {
    type Output = Quantity;

    fn add(self, rhs: Quantity) -> Quantity {
        Quantity { milli: self.milli.saturating_add(rhs.milli) }
    }
}

impl std::ops::Sub for Quantity {
    type Output = Quantity;

    fn sub(self, rhs: Quantity) -> Quantity {
        Quantity { milli: self.milli.saturating_sub(rhs.milli) }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.milli % 1000 == 0 { write!(f, "{}", self.milli / 1000) } else { write!(f, "{}m", self.milli) }
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || QuantityError::Invalid(s.to_owned());
        let overflow = || QuantityError::Overflow(s.to_owned());
        let t = s.trim();
        if t.is_empty() {
            return Err(QuantityError::Empty);
        }
        let (negative, rest) = match t.as_bytes()[0] {
            b'-' => (true, &t[1..]),
            b'+' => (false, &t[1..]),
            _ => (false, t),
        };
        // The number: digits with an optional fraction.
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(num_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(invalid());
        }
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let digits = format!("{int_part}{frac_part}");
        // Leading zeros carry nothing; past 39 digits no i128 holds it
        // (the Display of the largest quantities has 39).
        let significant = digits.trim_start_matches('0');
        if significant.len() > 39 {
            return Err(overflow());
        }
        let mantissa: i128 = if significant.is_empty() { 0 } else { significant.parse().map_err(|_| overflow())? };
        let mut exp10: i32 = -(frac_part.len() as i32);
        let mut pow2: u32 = 0;
        match suffix {
            "" => {}
            "Ki" => pow2 = 10,
            "Mi" => pow2 = 20,
            "Gi" => pow2 = 30,
            "Ti" => pow2 = 40,
            "Pi" => pow2 = 50,
            "Ei" => pow2 = 60,
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            s if s.starts_with(['e', 'E']) => {
                let e: i32 = s[1..].parse().map_err(|_| invalid())?;
                if !(-30..=30).contains(&e) {
                    return Err(overflow());
                }
                exp10 += e;
            }
            _ => return Err(invalid()),
        }
        // milli = ceil(mantissa × 2^pow2 × 10^(exp10 + 3))
        let scaled = mantissa.checked_mul(1i128 << pow2).ok_or_else(overflow)?;
        let e = exp10 + 3;
        let milli = if e >= 0 {
            scaled.checked_mul(10i128.checked_pow(e as u32).ok_or_else(overflow)?).ok_or_else(overflow)?
        } else {
            let d = 10i128.checked_pow((-e) as u32).ok_or_else(overflow)?;
            scaled / d + i128::from(scaled % d != 0)
        };
        Ok(Quantity { milli: if negative { -milli } else { milli } })
    }
}

/// Formats a byte count the way `resource.Quantity` prints binary values:
/// the largest of Ki/Mi/Gi/Ti/Pi/Ei that divides it exactly, or plain bytes.
pub fn format_bytes(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".into();
    }
    let mut v = bytes;
    let mut i = 0;
    while i < SUFFIXES.len() && v.is_multiple_of(1024) {
        v /= 1024;
        i += 1;
    }
    if i == 0 { v.to_string() } else { format!("{v}{}", SUFFIXES[i - 1]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let cases: &[(&str, i64, i64)] = &[
            // (input, value(), milli_value())
            ("0", 0, 0),
            ("1", 1, 1000),
            ("500m", 1, 500),
            ("1.5", 2, 1500),
            ("0.5", 1, 500),
            ("100Mi", 100 << 20, (100 << 20) * 1000),
            ("2Gi", 2 << 30, (2i64 << 30) * 1000),
            ("1Ki", 1024, 1_024_000),
            ("1k", 1000, 1_000_000),
            ("128974848", 128_974_848, 128_974_848_000),
            ("129e6", 129_000_000, 129_000_000_000),
            ("129M", 129_000_000, 129_000_000_000),
            ("123Mi", 128_974_848, 128_974_848_000),
            ("1.5Gi", 1_610_612_736, 1_610_612_736_000),
            ("100n", 1, 1),
            ("1u", 1, 1),
            ("-1", -1, -1000),
            ("+2", 2, 2000),
            ("1E", 1_000_000_000_000_000_000, i64::MAX),
        ];
        for (input, value, milli) in cases {
            let q: Quantity = input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(q.value(), *value, "value of {input}");
            assert_eq!(q.milli_value(), *milli, "milli of {input}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        for bad in ["", " ", "Gi", "2Gx", "1.2.3", ".", "abc", "1 Gi", "--1", "1e", "1e99", "1KiB", "1i"] {
            assert!(bad.parse::<Quantity>().is_err(), "`{bad}` must be rejected");
        }
        assert_eq!(
            "99999999999999999999999999999999Ei".parse::<Quantity>(),
            Err(QuantityError::Overflow("99999999999999999999999999999999Ei".into()))
        );
        assert!(matches!("2Gx".parse::<Quantity>(), Err(QuantityError::Invalid(s)) if s == "2Gx"));
    }

    #[test]
    fn bytes_format_like_quantity() {
        for (b, s) in [
            (0, "0"),
            (1000, "1000"),
            (1024, "1Ki"),
            (72_824 * 1024, "72824Ki"),
            (500 << 20, "500Mi"),
            (3 << 30, "3Gi"),
        ] {
            assert_eq!(format_bytes(b), s);
        }
    }

    #[test]
    fn arithmetic() {
        let q = |s: &str| Quantity::parse(s).unwrap();
        assert_eq!(q("32Gi") - q("2Gi") - q("1Gi") - q("500Mi"), q("29196Mi"));
        assert_eq!(q("1") + q("500m"), q("1.5"));
        assert!((q("1") - q("2")).is_negative());
    }

    #[test]
    fn display_and_order() {
        assert_eq!(Quantity::parse("1500m").unwrap().to_string(), "1500m");
        assert_eq!(Quantity::parse("2k").unwrap().to_string(), "2000");
        assert!(Quantity::parse("1Gi").unwrap() > Quantity::parse("1G").unwrap());
    }
}
