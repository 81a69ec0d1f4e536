//! The crossing rule both sources apply, so a userspace poller and the
//! kernel report the same crossings for the same values.

use super::{Direction, Threshold};

/// Given whether the value was above the line before, returns the crossing
/// this value makes, if any: up when it reaches the trigger, down when it
/// falls below the re-arm level. Between the two nothing changes, so a value
/// hovering at the line produces one event, not a storm.
pub fn crossing(was_above: bool, value: u64, threshold: Threshold) -> Option<Direction> {
    if threshold.trigger == 0 {
        return None;
    }
    if !was_above && value >= threshold.trigger {
        Some(Direction::Up)
    } else if was_above && value < threshold.rearm {
        Some(Direction::Down)
    } else {
        None
    }
}

/// A threshold with a re-arm level `margin` below the trigger.
pub fn with_margin(trigger: u64, margin: u64) -> Threshold {
    Threshold { trigger, rearm: trigger.saturating_sub(margin) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let t = Threshold { trigger: 100, rearm: 90 };
        let cases = [
            // (was_above, value, expected)
            (false, 99, None),
            (false, 100, Some(Direction::Up)),
            (false, 500, Some(Direction::Up)),
            (true, 100, None),
            (true, 95, None),
            (true, 90, None),
            (true, 89, Some(Direction::Down)),
            (false, 0, None),
        ];
        for (was_above, value, expected) in cases {
            assert_eq!(crossing(was_above, value, t), expected, "was_above={was_above} value={value}");
        }
    }

    #[test]
    fn disabled_threshold_never_crosses() {
        assert_eq!(crossing(false, u64::MAX, Threshold::default()), None);
        assert_eq!(crossing(true, 0, Threshold::default()), None);
    }

    #[test]
    fn margin_saturates() {
        assert_eq!(with_margin(10, 20), Threshold { trigger: 10, rearm: 0 });
        assert_eq!(with_margin(100, 10), Threshold { trigger: 100, rearm: 90 });
    }

    #[test]
    fn a_hovering_value_crosses_once() {
        let t = with_margin(1000, 50);
        let mut above = false;
        let mut events = 0;
        for v in [990, 1001, 999, 1002, 980, 1000, 951, 949, 1000] {
            if let Some(d) = crossing(above, v, t) {
                above = d == Direction::Up;
                events += 1;
            }
        }
        // up at 1001, down at 949, up again at 1000
        assert_eq!(events, 3);
    }
}
