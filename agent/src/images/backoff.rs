//! Per-key exponential back-off, as client-go's `flowcontrol.Backoff`
//! that the kubelet uses for image pulls (and crash loops): the first
//! failure waits `initial`, each further failure doubles it up to `max`,
//! and a key left alone for twice `max` starts afresh. Pure: the caller
//! passes the time.

use std::{collections::HashMap, time::Duration};

use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    backoff: Duration,
    last_update: Instant,
}

#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max, entries: HashMap::new() }
    }

    fn expired(&self, e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.last_update) > self.max * 2
    }

    /// Records a failure of `key` at `now`.
    pub fn next(&mut self, key: &str, now: Instant) {
        let backoff = match self.entries.get(key) {
            Some(e) if !self.expired(e, now) => (e.backoff * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(key.to_owned(), Entry { backoff, last_update: now });
    }

    /// Whether `key` is still waiting after its last failure.
    pub fn in_backoff(&self, key: &str, now: Instant) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| !self.expired(e, now) && now.saturating_duration_since(e.last_update) < e.backoff)
    }

    /// The current delay of `key` (zero when it has none).
    pub fn get(&self, key: &str) -> Duration {
        self.entries.get(key).map(|e| e.backoff).unwrap_or_default()
    }

    /// When `key` may be tried again, if it is backing off.
    pub fn retry_at(&self, key: &str, now: Instant) -> Option<Instant> {
        self.entries.get(key).filter(|_| self.in_backoff(key, now)).map(|e| e.last_update + e.backoff)
    }

    pub fn reset(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Forgets keys that have expired.
    pub fn gc(&mut self, now: Instant) {
        let max2 = self.max * 2;
        self.entries.retain(|_, e| now.saturating_duration_since(e.last_update) <= max2);
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

    #[test]
    fn doubles_to_the_cap_and_expires() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut b = Backoff::new(s(10), s(300));
        assert!(!b.in_backoff("k", t0));
        // failure at, expected delay after it
        let steps = [(0, 10), (10, 20), (30, 40), (70, 80), (150, 160), (310, 300), (610, 300)];
        for (at, want) in steps {
            b.next("k", t0 + s(at));
            assert_eq!(b.get("k"), s(want), "failure at {at}s");
            assert!(b.in_backoff("k", t0 + s(at) + s(want) - Duration::from_millis(1)));
            assert!(!b.in_backoff("k", t0 + s(at) + s(want)));
        }
        // Quiet for more than twice the cap: starts afresh.
        b.next("k", t0 + s(610 + 601));
        assert_eq!(b.get("k"), s(10));
        // Keys are independent.
        assert!(!b.in_backoff("other", t0 + s(1211)));
        b.gc(t0 + s(1211 + 601));
        assert!(b.is_empty());
    }

    #[test]
    fn retry_at_and_reset() {
        let t0 = Instant::now();
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        b.next("k", t0);
        assert_eq!(b.retry_at("k", t0 + Duration::from_secs(3)), Some(t0 + Duration::from_secs(10)));
        assert_eq!(b.retry_at("k", t0 + Duration::from_secs(10)), None);
        b.reset("k");
        assert!(!b.in_backoff("k", t0));
    }
}
