//! The kubelet's restart back-off (flowcontrol.Backoff as the container
//! runtime manager uses it): per container, the first restart is
//! immediate, then waits of 10 s doubling to a 5 min cap; an entry not
//! touched for twice the cap (a container that ran 10 minutes) starts over.
//! The same structure, with its own key, serves image pulls.

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
    fn default() -> Self {
        BackoffPolicy { initial: Duration::from_secs(10), max: Duration::from_secs(300) }
    }
}

#[derive(Clone, Copy, Debug)]
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

    /// An entry last updated long before `event` (the container ran for
    /// twice the cap since its previous failure) no longer counts.
    fn expired(&self, e: &Entry, event: Instant) -> bool {
        event.saturating_duration_since(e.last_update) > self.policy.max * 2
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

    /// Records a restart after the failure at `failed_at`: the wait after
    /// the next failure doubles. Next.
    pub fn next(&mut self, key: &str, failed_at: Instant) {
        let policy = self.policy;
        let expired = self.entries.get(key).is_some_and(|e| self.expired(e, failed_at));
        let e = self.entries.entry(key.to_owned()).or_insert(Entry { delay: policy.initial, last_update: failed_at });
        if expired {
            e.delay = policy.initial;
        } else if e.last_update != failed_at {
            e.delay = (e.delay * 2).min(policy.max);
        }
        e.last_update = failed_at;
    }

    /// The current wait of `key`, for messages ("back-off 20s restarting ...").
    pub fn delay(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.delay)
    }

    /// Forgets entries idle for longer than twice the cap.
    pub fn gc(&mut self, now: Instant) {
        let max = self.policy.max * 2;
        self.entries.retain(|_, e| now.saturating_duration_since(e.last_update) <= max);
    }

    pub fn forget(&mut self, key: &str) {
        self.entries.remove(key);
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
