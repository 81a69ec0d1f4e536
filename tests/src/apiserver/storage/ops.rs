//! The operations in flight (a driver call and what follows from it), one
//! at a time per key, and the exponential back-off after a failure, as the
//! sidecars' work queues retry.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
    time::{Duration, Instant},
};

const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Inner {
    running: HashSet<String>,
    /// key → (not before, the next delay)
    backoff: HashMap<String, (Instant, Duration)>,
}

#[derive(Default)]
pub struct Ops {
    inner: Mutex<Inner>,
}

impl Ops {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims `key` when it is neither running nor backing off.
    pub fn try_start(&self, key: &str) -> bool {
        let mut i = self.lock();
        if i.running.contains(key) || i.backoff.get(key).is_some_and(|(at, _)| Instant::now() < *at) {
            return false;
        }
        i.running.insert(key.to_owned())
    }

    pub fn running(&self, key: &str) -> bool {
        self.lock().running.contains(key)
    }

    /// Ends `key`: success clears its back-off, failure doubles it.
    pub fn finish(&self, key: &str, ok: bool) {
        let mut i = self.lock();
        i.running.remove(key);
        if ok {
            i.backoff.remove(key);
        } else {
            let delay = i.backoff.get(key).map_or(BACKOFF_START, |(_, d)| *d);
            i.backoff.insert(key.to_owned(), (Instant::now() + delay, (delay * 2).min(BACKOFF_MAX)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_at_a_time_and_back_off_after_failure() {
        let ops = Ops::default();
        assert!(ops.try_start("a"));
        assert!(!ops.try_start("a"));
        assert!(ops.try_start("b"));
        ops.finish("a", false);
        assert!(!ops.try_start("a"), "backing off");
        ops.finish("b", true);
        assert!(ops.try_start("b"));
        std::thread::sleep(BACKOFF_START + Duration::from_millis(50));
        assert!(ops.try_start("a"));
    }
}
