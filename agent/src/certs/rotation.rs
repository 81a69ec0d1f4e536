//! When to renew a certificate, and how to retry (pure).
//!
//! As client-go's certificate manager: the deadline is the certificate's
//! notBefore plus a jittered 70 to 90 % of its lifetime (so a fleet of
//! nodes issued together does not renew together), and now when it is
//! already past. A failed renewal is retried after 2, 4, 8 and 16 s, then
//! every 32 s.

use std::time::{Duration, SystemTime};

/// The renewal deadline of a certificate valid from `not_before` to
/// `not_after`; `jitter` in [0, 1) picks the point in 70..90 %.
pub fn deadline(not_before: SystemTime, not_after: SystemTime, jitter: f64) -> SystemTime {
    let total = not_after.duration_since(not_before).unwrap_or_default();
    let fraction = 0.7 + 0.2 * jitter.clamp(0.0, 0.999_999);
    not_before + total.mul_f64(fraction)
}

/// The wait before renewal attempt `failures + 1` after `failures` failed.
pub fn retry_after(failures: u32) -> Duration {
    match failures {
        0 => Duration::ZERO,
        1..=4 => Duration::from_secs(1 << failures),
        _ => Duration::from_secs(32),
    }
}

/// A uniform number in [0, 1) from the crypto provider's randomness.
pub fn random_jitter() -> f64 {
    let mut b = [0u8; 8];
    let _ = rustls::crypto::ring::default_provider().secure_random.fill(&mut b);
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_fall_between_70_and_90_percent() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let end = t0 + Duration::from_secs(1000);
        assert_eq!(deadline(t0, end, 0.0), t0 + Duration::from_secs(700));
        assert_eq!(deadline(t0, end, 0.5), t0 + Duration::from_secs(800));
        let late = deadline(t0, end, 1.0);
        assert!(late < t0 + Duration::from_secs(900) && late > t0 + Duration::from_millis(899_990));
        // A certificate that ends before it begins renews at once.
        assert_eq!(deadline(end, t0, 0.3), end);
        for _ in 0..100 {
            let j = random_jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
    }

    #[test]
    fn retries_back_off_to_32_seconds() {
        let waits: Vec<u64> = (0..8).map(|f| retry_after(f).as_secs()).collect();
        assert_eq!(waits, vec![0, 2, 4, 8, 16, 32, 32, 32]);
    }
}
