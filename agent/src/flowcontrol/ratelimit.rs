//! Token buckets over `governor`'s GCRA, which is the same bucket as
//! client-go's (`qps` tokens a second, `burst` stored, starts full) stated
//! as arrival times.
//!
//! Time is tokio's, so tests with a paused clock drive the buckets, and
//! the keyed bucket takes the time from its caller (the event correlator
//! is pure). A non-positive qps is no limit, as the kubelet's 0.

use std::{
    hash::Hash,
    num::NonZeroU32,
    sync::Arc,
    time::{Duration, Instant},
};

use governor::{
    Quota, RateLimiter,
    clock::Clock,
    state::{InMemoryState, NotKeyed, keyed::HashMapStateStore},
};
use parking_lot::Mutex;

/// tokio's clock (which tests can pause), as a std Instant.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    type Instant = Instant;

    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }
}

/// A clock that reads the time its owner last passed in.
#[derive(Clone, Debug)]
struct PassedClock(Arc<Mutex<Instant>>);

impl Clock for PassedClock {
    type Instant = Instant;

    fn now(&self) -> Instant {
        *self.0.lock()
    }
}

/// The quota of `qps` a second with `burst` (at least 1); None for no limit.
fn quota(qps: f64, burst: u32) -> Option<Quota> {
    if !qps.is_finite() || qps <= 0.0 {
        return None;
    }
    let period = Duration::try_from_secs_f64(1.0 / qps).ok()?.max(Duration::from_nanos(1));
    let burst = NonZeroU32::new(burst.max(1))?;
    Some(Quota::with_period(period)?.allow_burst(burst))
}

/// One shared bucket (kubeAPIQPS, registryPullQPS, token reviews).
#[derive(Debug)]
pub struct TokenBucket {
    limiter: Option<RateLimiter<NotKeyed, InMemoryState, TokioClock>>,
}

impl TokenBucket {
    pub fn new(qps: f64, burst: u32) -> TokenBucket {
        TokenBucket { limiter: quota(qps, burst).map(|q| RateLimiter::direct_with_clock(q, TokioClock)) }
    }

    pub fn unlimited(&self) -> bool {
        self.limiter.is_none()
    }

    /// Takes a token if one is there now.
    pub fn try_accept(&self) -> bool {
        self.limiter.as_ref().is_none_or(|l| l.check().is_ok())
    }

    /// None when a token was taken; else how long until one may be.
    pub fn try_acquire(&self) -> Option<Duration> {
        let l = self.limiter.as_ref()?;
        match l.check() {
            Ok(()) => None,
            // At least a nanosecond: a zero wait would spin.
            Err(not_until) => Some(not_until.wait_time_from(TokioClock.now()).max(Duration::from_nanos(1))),
        }
    }

    /// Waits for a token and takes it.
    pub async fn acquire(&self) {
        while let Some(wait) = self.try_acquire() {
            tokio::time::sleep(wait).await;
        }
    }
}

type KeyedLimiter<K> = RateLimiter<K, HashMapStateStore<K>, PassedClock>;

/// A bucket per key, with the time passed in (the event correlator's spam
/// filter). Keys whose bucket has refilled are forgotten once there are
/// more than `max_keys`: a full bucket and a new one are the same.
#[derive(Debug)]
pub struct KeyedBucket<K: Hash + Eq + Clone> {
    quota: Option<Quota>,
    max_keys: usize,
    /// Built at the first call, so that its start is the first time
    /// passed in (governor measures from its start).
    limiter: Option<(KeyedLimiter<K>, PassedClock)>,
}

impl<K: Hash + Eq + Clone> KeyedBucket<K> {
    pub fn new(qps: f64, burst: u32, max_keys: usize) -> KeyedBucket<K> {
        KeyedBucket { quota: quota(qps, burst), max_keys, limiter: None }
    }

    /// Takes a token from `key`'s bucket at `now`, if one is there.
    pub fn try_accept(&mut self, key: &K, now: Instant) -> bool {
        let Some(quota) = self.quota else { return true };
        let (limiter, clock) = self.limiter.get_or_insert_with(|| {
            let clock = PassedClock(Arc::new(Mutex::new(now)));
            (RateLimiter::hashmap_with_clock(quota, clock.clone()), clock)
        });
        {
            // Time never runs backwards for the buckets.
            let mut t = clock.0.lock();
            *t = (*t).max(now);
        }
        if limiter.len() >= self.max_keys {
            limiter.retain_recent();
        }
        limiter.check_key(key).is_ok()
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.limiter.as_ref().map_or(0, |(l, _)| l.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bucket_starts_full_then_refills_at_qps() {
        let b = TokenBucket::new(2.0, 3);
        assert!((0..3).all(|_| b.try_accept()));
        assert!(!b.try_accept());
        tokio::time::advance(Duration::from_millis(400)).await;
        assert!(!b.try_accept());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(b.try_accept());
        // Refill never exceeds the burst.
        tokio::time::advance(Duration::from_secs(100)).await;
        assert_eq!((0..10).filter(|_| b.try_accept()).count(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn burst_then_rate() {
        let b = TokenBucket::new(5.0, 10);
        assert_eq!((0..12).filter(|_| b.try_accept()).count(), 10, "the burst");
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(!b.try_accept(), "5 qps: one token per 200 ms");
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(b.try_accept());
        tokio::time::advance(Duration::from_millis(50)).await;
        assert!(!b.try_accept());
    }

    #[tokio::test(start_paused = true)]
    async fn zero_qps_is_unlimited() {
        for qps in [0.0, -1.0, f64::NAN] {
            let b = TokenBucket::new(qps, 1);
            assert!(b.unlimited());
            assert!((0..1000).all(|_| b.try_accept()));
            assert_eq!(b.try_acquire(), None);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_at_the_rate() {
        let b = TokenBucket::new(5.0, 1);
        let start = tokio::time::Instant::now();
        for _ in 0..3 {
            b.acquire().await;
        }
        // One token at once, two more at 5/s.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(399) && took < Duration::from_millis(600), "{took:?}");
    }

    #[test]
    fn keyed_buckets_are_independent_and_forgotten_when_full() {
        let t0 = Instant::now();
        let mut b = KeyedBucket::new(1.0, 2, 2);
        assert!(b.try_accept(&"a", t0));
        assert!(b.try_accept(&"a", t0));
        assert!(!b.try_accept(&"a", t0), "a's burst is spent");
        assert!(b.try_accept(&"b", t0), "b has its own bucket");
        assert!(!b.try_accept(&"a", t0 + Duration::from_millis(900)));
        assert!(b.try_accept(&"a", t0 + Duration::from_secs(1)));
        // Time passed in does not run backwards.
        assert!(!b.try_accept(&"a", t0));
        // Over max_keys, buckets that refilled are dropped.
        let later = t0 + Duration::from_secs(60);
        assert!(b.try_accept(&"c", later));
        assert!(b.len() <= 2, "{}", b.len());
    }
}
