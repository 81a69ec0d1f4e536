//! client-go's `flowcontrol.Backoff`, which the kubelet uses for image
//! pulls and container restarts (CrashLoopBackOff): per key, the first
//! failure waits `initial`, each further failure doubles the wait up to
//! `max`, and a key left alone for twice `max` starts afresh. Pure: the
//! caller passes the time.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffPolicy {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for BackoffPolicy {
    /// The kubelet's container restart back-off: 10 s doubling to 5 min.
    fn default() -> Self {
        BackoffPolicy { initial: Duration::from_secs(10), max: Duration::from_secs(300) }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    delay: Duration,
    last_update: Instant,
}

#[derive(Clone, Debug, Default)]
pub struct Backoff {
    policy: BackoffPolicy,
    entries: HashMap<String, Entry>,
}

impl Backoff {
    pub fn new(policy: BackoffPolicy) -> Backoff {
        Backoff { policy, entries: HashMap::new() }
    }

    /// An entry last updated more than twice the cap before `event` no
    /// longer counts (a container that ran ten minutes, a pull retried
    /// after a long pause).
    fn expired(&self, e: &Entry, event: Instant) -> bool {
        event.saturating_duration_since(e.last_update) > self.policy.max * 2
    }

    /// Records a failure of `key` at `at`: the wait doubles. A second call
    /// for the same failure time counts once (the worker may report the
    /// same exit twice). Next.
    pub fn next(&mut self, key: &str, at: Instant) {
        let policy = self.policy;
        let expired = self.entries.get(key).is_some_and(|e| self.expired(e, at));
        let e = self.entries.entry(key.to_owned()).or_insert(Entry { delay: policy.initial, last_update: at });
        if expired {
            e.delay = policy.initial;
        } else if e.last_update != at {
            e.delay = (e.delay * 2).min(policy.max);
        }
        e.last_update = at;
    }

    /// How long `key` must still wait after a failure at `failed_at`
    /// (None: it may start now). IsInBackOffSince.
    pub fn remaining(&self, key: &str, failed_at: Instant, now: Instant) -> Option<Duration> {
        let e = self.entries.get(key)?;
        if self.expired(e, failed_at) {
            return None;
        }
        let until = failed_at + e.delay;
        (now < until).then(|| until - now)
    }

    /// Whether `key` is still waiting after its last recorded failure.
    /// IsInBackOffSinceUpdate.
    pub fn in_backoff(&self, key: &str, now: Instant) -> bool {
        self.retry_at(key, now).is_some()
    }

    /// When `key` may be tried again, if it is backing off.
    pub fn retry_at(&self, key: &str, now: Instant) -> Option<Instant> {
        let e = self.entries.get(key)?;
        let until = e.last_update + e.delay;
        (!self.expired(e, now) && now < until).then_some(until)
    }

    /// The current wait of `key`, for messages ("back-off 20s restarting ...").
    pub fn delay(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.delay)
    }

    /// Forgets `key` (a success).
    pub fn forget(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Forgets entries idle for longer than twice the cap.
    pub fn gc(&mut self, now: Instant) {
        let max = self.policy.max * 2;
        self.entries.retain(|_, e| now.saturating_duration_since(e.last_update) <= max);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn crash_loop_timeline() {
        let mut b = Backoff::new(BackoffPolicy::default());
        let t0 = Instant::now();
        // First exit: not in back-off, restarted at once.
        assert_eq!(b.remaining("c", t0, t0), None);
        b.next("c", t0);
        // Second exit 1 s later: wait 10 s from that exit.
        let exit2 = t0 + S;
        assert_eq!(b.remaining("c", exit2, exit2), Some(10 * S));
        assert_eq!(b.remaining("c", exit2, exit2 + 9 * S), Some(S));
        assert_eq!(b.remaining("c", exit2, exit2 + 10 * S), None);
        b.next("c", exit2);
        assert_eq!(b.delay("c"), Some(20 * S));
        // The same exit reported again counts once.
        b.next("c", exit2);
        assert_eq!(b.delay("c"), Some(20 * S));
        // Doubling up to the cap, one failure a second.
        let mut t = exit2;
        for want in [40, 80, 160, 300, 300] {
            t += S;
            b.next("c", t);
            assert_eq!(b.delay("c"), Some(want * S));
        }
        // A failure after ten minutes of running (twice the cap since the
        // last one) starts over.
        let later = t + 601 * S;
        assert_eq!(b.remaining("c", later, later), None);
        b.next("c", later);
        assert_eq!(b.delay("c"), Some(10 * S));
    }

    #[test]
    fn pull_timeline_doubles_to_the_cap_and_expires() {
        let t0 = Instant::now();
        let mut b = Backoff::new(BackoffPolicy { initial: 10 * S, max: 300 * S });
        assert!(!b.in_backoff("k", t0));
        // failure at, expected delay after it
        let steps = [(0, 10), (10, 20), (30, 40), (70, 80), (150, 160), (310, 300), (610, 300)];
        for (at, want) in steps {
            b.next("k", t0 + at * S);
            assert_eq!(b.delay("k"), Some(want * S), "failure at {at}s");
            assert!(b.in_backoff("k", t0 + (at + want) * S - Duration::from_millis(1)));
            assert!(!b.in_backoff("k", t0 + (at + want) * S));
        }
        // Quiet for more than twice the cap: starts afresh.
        b.next("k", t0 + (610 + 601) * S);
        assert_eq!(b.delay("k"), Some(10 * S));
        assert!(!b.in_backoff("other", t0 + 1211 * S));
        b.gc(t0 + (1211 + 601) * S);
        assert!(b.is_empty());
    }

    #[test]
    fn retry_at_and_forget() {
        let t0 = Instant::now();
        let mut b = Backoff::new(BackoffPolicy { initial: 10 * S, max: 300 * S });
        b.next("k", t0);
        assert_eq!(b.retry_at("k", t0 + 3 * S), Some(t0 + 10 * S));
        assert_eq!(b.retry_at("k", t0 + 10 * S), None);
        b.forget("k");
        assert!(!b.in_backoff("k", t0));
    }

    #[test]
    fn keys_are_independent_and_gc_forgets_idle_ones() {
        let mut b = Backoff::new(BackoffPolicy { initial: S, max: 4 * S });
        let t0 = Instant::now();
        b.next("a", t0);
        b.next("a", t0 + S);
        b.next("b", t0 + S);
        assert_eq!((b.delay("a"), b.delay("b")), (Some(2 * S), Some(S)));
        b.gc(t0 + 10 * S);
        assert_eq!((b.delay("a"), b.delay("b")), (None, None));
    }
}
