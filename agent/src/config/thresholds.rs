//! Eviction threshold statements, as the kubelet's ParseThresholdConfig
//! reads evictionHard, evictionSoft, evictionSoftGracePeriod and
//! evictionMinimumReclaim. Pure: each function takes the strings and
//! returns values or a message (the caller adds where it came from).

use std::{collections::BTreeMap, time::Duration};

use super::{duration, values::quantity_problem};
use crate::{
    eviction::signal::{EvictionSignal, EvictionThreshold, ThresholdValue},
    quantity::Quantity,
};

/// The kubelet's Linux default hard thresholds, as the config file would
/// spell them: the one table of defaults ([`default_hard_thresholds`]
/// reads it).
pub const DEFAULT_EVICTION_HARD: [(&str, &str); 4] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];

/// [`DEFAULT_EVICTION_HARD`] as thresholds, in signal order.
pub fn default_hard_thresholds() -> Vec<EvictionThreshold> {
    let parsed: BTreeMap<EvictionSignal, ThresholdValue> = DEFAULT_EVICTION_HARD
        .iter()
        .filter_map(|(signal, value)| parse_threshold(signal, value).ok().flatten())
        .collect();
    hard_thresholds(&parsed, &BTreeMap::new())
}

pub fn parse_signal(name: &str) -> Result<EvictionSignal, String> {
    EvictionSignal::from_name(name).ok_or_else(|| {
        let all: Vec<&str> = EvictionSignal::ALL.iter().map(|s| s.name()).collect();
        format!("{name:?} is not an eviction signal (one of {})", all.join(", "))
    })
}

/// A percentage `0%..=100%` as a fraction.
fn parse_percent(raw: &str) -> Option<f64> {
    let v: f64 = raw.strip_suffix('%')?.parse().ok()?;
    (v.is_finite() && (0.0..=100.0).contains(&v)).then_some(v / 100.0)
}

/// One threshold statement `signal: value`. `Ok(None)` for `0%` and
/// `100%`, which the kubelet ignores (the documented way to have no
/// threshold while still replacing the defaults).
pub fn parse_threshold(signal: &str, raw: &str) -> Result<Option<(EvictionSignal, ThresholdValue)>, String> {
    let s = parse_signal(signal)?;
    if raw.ends_with('%') {
        if raw == "0%" || raw == "100%" {
            return Ok(None);
        }
        let p =
            parse_percent(raw).ok_or_else(|| format!("{signal:?}: {raw:?} is not a percentage between 0% and 100%"))?;
        return Ok(Some((s, ThresholdValue::Percentage(p))));
    }
    let q: Quantity = raw.parse().map_err(|e| format!("{signal:?}: {}", quantity_problem(raw, &e)))?;
    if q.is_negative() || q == Quantity::ZERO {
        return Err(format!("{signal:?}: {raw:?} must be positive"));
    }
    Ok(Some((s, ThresholdValue::Quantity(q))))
}

/// A minimum reclaim: a non-negative quantity or a percentage above 0%.
pub fn parse_min_reclaim(signal: &str, raw: &str) -> Result<(EvictionSignal, ThresholdValue), String> {
    let s = parse_signal(signal)?;
    if raw.ends_with('%') {
        return match parse_percent(raw) {
            Some(p) if p > 0.0 => Ok((s, ThresholdValue::Percentage(p))),
            _ => Err(format!("{signal:?}: {raw:?} is not a percentage above 0% and at most 100%")),
        };
    }
    let q: Quantity = raw.parse().map_err(|e| format!("{signal:?}: {}", quantity_problem(raw, &e)))?;
    if q.is_negative() {
        return Err(format!("{signal:?}: {raw:?} must not be negative"));
    }
    Ok((s, ThresholdValue::Quantity(q)))
}

/// A soft threshold's grace period; it must be above zero (a soft
/// threshold with no grace would be a hard one).
pub fn parse_grace_period(signal: &str, raw: &str) -> Result<(EvictionSignal, Duration), String> {
    let s = parse_signal(signal)?;
    let d = duration::parse(raw).map_err(|e| format!("{signal:?}: {}", super::values::duration_problem(raw, e)))?;
    if d.is_zero() {
        return Err(format!("{signal:?}: grace period {raw:?} must be above zero"));
    }
    Ok((s, d))
}

/// Hard thresholds from their statements, with minimum reclaims.
pub fn hard_thresholds(
    hard: &BTreeMap<EvictionSignal, ThresholdValue>,
    reclaim: &BTreeMap<EvictionSignal, ThresholdValue>,
) -> Vec<EvictionThreshold> {
    hard.iter()
        .map(|(s, v)| EvictionThreshold {
            signal: *s,
            value: *v,
            grace_period: Duration::ZERO,
            min_reclaim: reclaim.get(s).copied(),
        })
        .collect()
}

/// Soft thresholds; every one needs a grace period. Err names the signal
/// that has none.
pub fn soft_thresholds(
    soft: &BTreeMap<EvictionSignal, ThresholdValue>,
    grace: &BTreeMap<EvictionSignal, Duration>,
    reclaim: &BTreeMap<EvictionSignal, ThresholdValue>,
) -> Result<Vec<EvictionThreshold>, EvictionSignal> {
    soft.iter()
        .map(|(s, v)| {
            let grace_period = *grace.get(s).ok_or(*s)?;
            Ok(EvictionThreshold { signal: *s, value: *v, grace_period, min_reclaim: reclaim.get(s).copied() })
        })
        .collect()
}

/// With pods' allocatable enforced, every hard memory.available threshold
/// gets an allocatableMemory.available twin (the kubelet's
/// addAllocatableThresholds).
pub fn with_allocatable_thresholds(thresholds: Vec<EvictionThreshold>) -> Vec<EvictionThreshold> {
    let twins: Vec<EvictionThreshold> = thresholds
        .iter()
        .filter(|t| t.signal == EvictionSignal::MemoryAvailable && t.is_hard())
        .map(|t| EvictionThreshold { signal: EvictionSignal::AllocatableMemoryAvailable, ..t.clone() })
        .collect();
    thresholds.into_iter().chain(twins).collect()
}

/// How a threshold value is written in a config file.
pub fn format_value(v: &ThresholdValue) -> String {
    match v {
        ThresholdValue::Quantity(q) => super::kubelet::format_quantity(q),
        ThresholdValue::Percentage(p) => {
            let pct = p * 100.0;
            // Print 10% as "10%" and 12.5% as "12.5%", avoiding float noise.
            let rounded = (pct * 1e6).round() / 1e6;
            // "0%" and "100%" as written mean no threshold; a threshold
            // of exactly 0 or 100 percent (written "0.0%", "1e2%") must
            // read back as itself.
            // A percentage too small for the rounding (`5e-30%`) is printed
            // in full, so a positive one never reads back as zero.
            if rounded == 0.0 && pct != 0.0 {
                format!("{pct}%")
            } else if rounded == 0.0 || rounded == 100.0 {
                format!("{rounded:.1}%")
            } else {
                format!("{rounded}%")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> ThresholdValue {
        ThresholdValue::Quantity(s.parse().unwrap())
    }

    #[test]
    fn the_default_table_parses_whole() {
        let q = |v: &str| ThresholdValue::Quantity(v.parse().unwrap());
        let hard = |signal, value| EvictionThreshold { signal, value, grace_period: Duration::ZERO, min_reclaim: None };
        assert_eq!(
            default_hard_thresholds(),
            [
                hard(EvictionSignal::MemoryAvailable, q("100Mi")),
                hard(EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(0.10)),
                hard(EvictionSignal::NodeFsInodesFree, ThresholdValue::Percentage(0.05)),
                hard(EvictionSignal::ImageFsAvailable, ThresholdValue::Percentage(0.15)),
            ]
        );
    }

    #[test]
    fn threshold_statements() {
        use EvictionSignal::*;
        type Case = (&'static str, &'static str, Option<(EvictionSignal, ThresholdValue)>);
        let ok: &[Case] = &[
            ("memory.available", "500Mi", Some((MemoryAvailable, q("500Mi")))),
            ("memory.available", "1.5Gi", Some((MemoryAvailable, q("1.5Gi")))),
            ("nodefs.available", "10%", Some((NodeFsAvailable, ThresholdValue::Percentage(0.10)))),
            ("nodefs.inodesFree", "5.5%", Some((NodeFsInodesFree, ThresholdValue::Percentage(0.055)))),
            ("imagefs.available", "15%", Some((ImageFsAvailable, ThresholdValue::Percentage(0.15)))),
            ("imagefs.inodesFree", "1k", Some((ImageFsInodesFree, q("1k")))),
            ("pid.available", "1000", Some((PidAvailable, q("1000")))),
            ("allocatableMemory.available", "1Gi", Some((AllocatableMemoryAvailable, q("1Gi")))),
            ("memory.available", "0%", None),
            ("memory.available", "100%", None),
        ];
        for (s, v, want) in ok {
            assert_eq!(parse_threshold(s, v).as_ref(), Ok(want), "{s}<{v}");
        }
        let bad: &[(&str, &str, &str)] = &[
            (
                "memory.available",
                "abc",
                "\"memory.available\": \"abc\" is not a quantity: expected a number with an optional suffix \
                 (Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E)",
            ),
            (
                "foo.available",
                "1Gi",
                "\"foo.available\" is not an eviction signal (one of memory.available, allocatableMemory.available, \
                 nodefs.available, nodefs.inodesFree, imagefs.available, imagefs.inodesFree, pid.available)",
            ),
            ("memory.available", "101%", "\"memory.available\": \"101%\" is not a percentage between 0% and 100%"),
            ("memory.available", "-5%", "\"memory.available\": \"-5%\" is not a percentage between 0% and 100%"),
            ("memory.available", "x%", "\"memory.available\": \"x%\" is not a percentage between 0% and 100%"),
            ("memory.available", "0", "\"memory.available\": \"0\" must be positive"),
            ("memory.available", "-1Gi", "\"memory.available\": \"-1Gi\" must be positive"),
            ("memory.available", "", "\"memory.available\": the quantity is empty"),
        ];
        for (s, v, want) in bad {
            assert_eq!(parse_threshold(s, v).unwrap_err(), *want, "{s}<{v}");
        }
    }

    #[test]
    fn reclaims_and_grace_periods() {
        assert_eq!(parse_min_reclaim("memory.available", "0"), Ok((EvictionSignal::MemoryAvailable, q("0"))));
        assert_eq!(
            parse_min_reclaim("nodefs.available", "5%"),
            Ok((EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(0.05)))
        );
        assert_eq!(
            parse_min_reclaim("nodefs.available", "0%").unwrap_err(),
            "\"nodefs.available\": \"0%\" is not a percentage above 0% and at most 100%"
        );
        assert_eq!(
            parse_min_reclaim("memory.available", "-1").unwrap_err(),
            "\"memory.available\": \"-1\" must not be negative"
        );
        assert_eq!(
            parse_grace_period("memory.available", "1m30s"),
            Ok((EvictionSignal::MemoryAvailable, Duration::from_secs(90)))
        );
        assert_eq!(
            parse_grace_period("memory.available", "90").unwrap_err(),
            "\"memory.available\": \"90\" is not a duration (examples: 10s, 1m30s, 2h, 500ms)"
        );
        assert_eq!(
            parse_grace_period("memory.available", "-1s").unwrap_err(),
            "\"memory.available\": \"-1s\" is negative"
        );
        assert_eq!(
            parse_grace_period("memory.available", "0s").unwrap_err(),
            "\"memory.available\": grace period \"0s\" must be above zero"
        );
    }

    #[test]
    fn soft_thresholds_need_grace_periods() {
        let soft =
            BTreeMap::from([(EvictionSignal::MemoryAvailable, q("1Gi")), (EvictionSignal::PidAvailable, q("100"))]);
        let grace = BTreeMap::from([(EvictionSignal::MemoryAvailable, Duration::from_secs(30))]);
        assert_eq!(soft_thresholds(&soft, &grace, &BTreeMap::new()), Err(EvictionSignal::PidAvailable));
        let grace = BTreeMap::from([
            (EvictionSignal::MemoryAvailable, Duration::from_secs(30)),
            (EvictionSignal::PidAvailable, Duration::from_secs(5)),
        ]);
        let reclaim = BTreeMap::from([(EvictionSignal::MemoryAvailable, q("100Mi"))]);
        let got = soft_thresholds(&soft, &grace, &reclaim).unwrap();
        assert_eq!(got[0].grace_period, Duration::from_secs(30));
        assert_eq!(got[0].min_reclaim, Some(q("100Mi")));
        assert!(!got[0].is_hard());
        assert_eq!(got[1].min_reclaim, None);
    }

    #[test]
    fn allocatable_twins_for_hard_memory_thresholds_only() {
        let hard = hard_thresholds(
            &BTreeMap::from([(EvictionSignal::MemoryAvailable, q("500Mi")), (EvictionSignal::PidAvailable, q("10"))]),
            &BTreeMap::from([(EvictionSignal::MemoryAvailable, q("1Gi"))]),
        );
        let soft = EvictionThreshold {
            signal: EvictionSignal::MemoryAvailable,
            value: q("1Gi"),
            grace_period: Duration::from_secs(10),
            min_reclaim: None,
        };
        let all = with_allocatable_thresholds(hard.into_iter().chain([soft]).collect());
        let twins: Vec<_> = all.iter().filter(|t| t.signal == EvictionSignal::AllocatableMemoryAvailable).collect();
        assert_eq!(twins.len(), 1);
        assert_eq!(twins[0].value, q("500Mi"));
        assert_eq!(twins[0].min_reclaim, Some(q("1Gi")));
        assert!(twins[0].is_hard());
    }

    #[test]
    fn a_tiny_percentage_reads_back_positive() {
        let (_, v) = parse_min_reclaim("memory.available", "5e-30%").unwrap();
        let written = format_value(&v);
        let (_, back) = parse_min_reclaim("memory.available", &written).unwrap_or_else(|e| panic!("{written}: {e}"));
        assert_eq!(format_value(&back), written);
    }

    #[test]
    fn formats_values() {
        assert_eq!(format_value(&q("100Mi")), "100Mi");
        assert_eq!(format_value(&ThresholdValue::Percentage(0.10)), "10%");
        assert_eq!(format_value(&ThresholdValue::Percentage(0.055)), "5.5%");
        assert_eq!(format_value(&ThresholdValue::Percentage(1.0)), "100.0%");
        assert_eq!(
            parse_threshold("nodefs.available", "100.0%").unwrap(),
            Some((EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(1.0)))
        );
    }
}
