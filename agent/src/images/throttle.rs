//! registryPullQPS / registryBurst: a token bucket in front of PullImage,
//! as the kubelet's `throttledImageService`. A pull over the limit is not
//! delayed: it fails with "pull QPS exceeded" (ErrImagePull, then back-off).

use std::time::Duration;

use tokio::time::Instant;

#[derive(Clone, Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// None when `qps` is 0 (no limit, as the kubelet).
    pub fn new(qps: u32, burst: u32, now: Instant) -> Option<TokenBucket> {
        if qps == 0 {
            return None;
        }
        let burst = burst.max(1) as f64;
        Some(TokenBucket { qps: qps as f64, burst, tokens: burst, last: now })
    }

    /// Takes a token if one is available at `now`.
    pub fn try_accept(&mut self, now: Instant) -> bool {
        let elapsed: Duration = now.saturating_duration_since(self.last);
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.qps).min(self.burst);
        self.last = now.max(self.last);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        assert!(TokenBucket::new(0, 10, t0).is_none());
        let mut b = TokenBucket::new(5, 10, t0).unwrap();
        // (offset ms, accepted)
        let mut accepted = 0;
        for _ in 0..12 {
            if b.try_accept(t0) {
                accepted += 1;
            }
        }
        assert_eq!(accepted, 10, "the burst");
        assert!(!b.try_accept(t0 + Duration::from_millis(100)), "5 qps: one token per 200 ms");
        assert!(b.try_accept(t0 + Duration::from_millis(200)));
        assert!(!b.try_accept(t0 + Duration::from_millis(250)));
        // A long pause refills only up to the burst.
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..20).filter(|_| b.try_accept(later)).count(), 10);
    }
}
