//! Token buckets: client-go's `flowcontrol.NewTokenBucketRateLimiter`
//! (kubeAPIQPS/kubeAPIBurst for every API call, eventRecordQPS/eventBurst
//! for event writes) and the event correlator's per-object spam filter.
//!
//! The bucket itself is pure (time is passed in); [`RateLimiter`] waits on
//! tokio time, and [`RateLimitLayer`] puts it in front of kube's client.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

/// `qps` tokens per second, at most `burst` stored; starts full. A
/// non-positive `qps` means unlimited (the kubelet's 0 = no limit).
#[derive(Clone, Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(qps: f64, burst: u32, now: Instant) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket { qps, burst, tokens: burst, last: now }
    }

    pub fn unlimited(&self) -> bool {
        self.qps <= 0.0
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = self.last.max(now);
    }

    /// Takes a token if one is there.
    pub fn try_take(&mut self, now: Instant) -> bool {
        if self.unlimited() {
            return true;
        }
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Reserves a token and says how long to wait before using it (zero
    /// when one is there now). Tokens may go negative: waiters queue up.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        if self.unlimited() {
            return Duration::ZERO;
        }
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.qps) }
    }
}

/// A shared bucket that callers wait on.
#[derive(Debug)]
pub struct RateLimiter {
    bucket: Mutex<TokenBucket>,
}

impl RateLimiter {
    pub fn new(qps: f64, burst: u32) -> RateLimiter {
        RateLimiter { bucket: Mutex::new(TokenBucket::new(qps, burst, Self::now())) }
    }

    /// tokio's clock (which tests can pause), as a std Instant.
    fn now() -> Instant {
        tokio::time::Instant::now().into_std()
    }

    /// How long the caller must wait for its token (the token is taken).
    pub fn reserve(&self) -> Duration {
        self.bucket.lock().unwrap_or_else(|p| p.into_inner()).reserve(Self::now())
    }

    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// A tower layer that makes every request wait for a token.
#[derive(Clone, Debug)]
pub struct RateLimitLayer(pub Arc<RateLimiter>);

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited { inner, limiter: self.0.clone(), sleep: None, permitted: false }
    }
}

pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<RateLimiter>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    permitted: bool,
}

impl<S, R> tower::Service<R> for RateLimited<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if !self.permitted {
            if self.sleep.is_none() {
                let wait = self.limiter.reserve();
                if !wait.is_zero() {
                    self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
            if let Some(s) = self.sleep.as_mut() {
                if s.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            self.permitted = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.permitted = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_starts_full_then_refills_at_qps() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(2.0, 3, t0);
        assert!((0..3).all(|_| b.try_take(t0)));
        assert!(!b.try_take(t0));
        assert!(!b.try_take(t0 + Duration::from_millis(400)));
        assert!(b.try_take(t0 + Duration::from_millis(500)));
        // Refill never exceeds the burst.
        let later = t0 + Duration::from_secs(100);
        assert_eq!((0..10).filter(|_| b.try_take(later)).count(), 3);
    }

    #[test]
    fn reserve_queues_waiters() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 1, t0);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        let w1 = b.reserve(t0);
        let w2 = b.reserve(t0);
        assert!((w1.as_secs_f64() - 0.1).abs() < 1e-9, "{w1:?}");
        assert!((w2.as_secs_f64() - 0.2).abs() < 1e-9, "{w2:?}");
    }

    #[test]
    fn zero_qps_is_unlimited() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(0.0, 1, t0);
        assert!((0..1000).all(|_| b.try_take(t0)));
        assert_eq!(b.reserve(t0), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn limiter_waits() {
        let l = RateLimiter::new(5.0, 1);
        let start = tokio::time::Instant::now();
        for _ in 0..3 {
            l.acquire().await;
        }
        // One token at once, two more at 5/s.
        assert!(start.elapsed() >= Duration::from_millis(399), "{:?}", start.elapsed());
    }
}
