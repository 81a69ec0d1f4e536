//! The webhooks' caches.
//!
//! [`TokenCache`]: TokenReview verdicts by a keyed SHA-256 of the token (a
//! random key per process, so no token is held in memory and keys cannot
//! be precomputed), in two least-recently-used maps: authenticated tokens
//! and refused ones. A flood of random tokens only turns over the refused
//! map; the positive entries stay until their TTL (the apiserver's token
//! cache also keys by a hash; the kubelet caches both verdicts for
//! `authentication.webhook.cacheTTL`).
//!
//! [`TtlCache`]: SubjectAccessReview verdicts, least recently used out.

use std::{
    hash::Hash,
    num::NonZeroUsize,
    time::{Duration, Instant},
};

use lru::LruCache;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::auth::UserInfo;

/// Entries kept per map.
pub const CACHE_CAPACITY: usize = 4096;

/// A least-recently-used map whose entries expire.
pub struct TtlCache<K: Hash + Eq, V> {
    entries: Mutex<LruCache<K, (Instant, V)>>,
}

impl<K: Hash + Eq, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: usize) -> TtlCache<K, V> {
        let cap = NonZeroUsize::new(capacity.max(1)).unwrap_or(NonZeroUsize::MIN);
        TtlCache { entries: Mutex::new(LruCache::new(cap)) }
    }

    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let mut map = self.entries.lock();
        match map.get(key) {
            Some((until, v)) if now < *until => Some(v.clone()),
            Some(_) => {
                map.pop(key);
                None
            }
            None => None,
        }
    }

    pub fn insert(&self, key: K, value: V, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        self.entries.lock().put(key, (now + ttl, value));
    }

    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Hash + Eq, V: Clone> Default for TtlCache<K, V> {
    fn default() -> Self {
        TtlCache::new(CACHE_CAPACITY)
    }
}

/// A token's cache key.
pub type TokenKey = [u8; 32];

/// TokenReview verdicts: authenticated users and refused tokens apart.
pub struct TokenCache {
    salt: [u8; 32],
    positive: TtlCache<TokenKey, UserInfo>,
    negative: TtlCache<TokenKey, ()>,
}

impl TokenCache {
    pub fn new(salt: [u8; 32], capacity: usize) -> TokenCache {
        TokenCache { salt, positive: TtlCache::new(capacity), negative: TtlCache::new(capacity) }
    }

    /// A cache with a random key.
    pub fn random(capacity: usize) -> TokenCache {
        let mut salt = [0u8; 32];
        // The process-wide crypto provider's randomness (ring's).
        let _ = rustls::crypto::ring::default_provider().secure_random.fill(&mut salt);
        TokenCache::new(salt, capacity)
    }

    pub fn key(&self, token: &str) -> TokenKey {
        let mut h = Sha256::new();
        h.update(self.salt);
        h.update(token.as_bytes());
        h.finalize().into()
    }

    /// Some(verdict) when cached: Some(user) authenticated, None refused.
    pub fn get(&self, key: &TokenKey, now: Instant) -> Option<Option<UserInfo>> {
        if let Some(u) = self.positive.get(key, now) {
            return Some(Some(u));
        }
        self.negative.get(key, now).map(|()| None)
    }

    pub fn insert(&self, key: TokenKey, verdict: Option<UserInfo>, ttl: Duration, now: Instant) {
        match verdict {
            Some(u) => self.positive.insert(key, u, ttl, now),
            None => self.negative.insert(key, (), ttl, now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_cache_expires_and_drops_the_least_recently_used() {
        let c: TtlCache<&str, u32> = TtlCache::new(2);
        let t0 = Instant::now();
        c.insert("a", 1, Duration::from_secs(10), t0);
        c.insert("z", 1, Duration::ZERO, t0);
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(9)), Some(1));
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(10)), None);
        assert_eq!(c.get(&"z", t0), None);
        c.insert("a", 1, Duration::from_secs(10), t0);
        c.insert("b", 2, Duration::from_secs(10), t0);
        c.get(&"a", t0);
        c.insert("c", 3, Duration::from_secs(10), t0);
        assert_eq!((c.get(&"a", t0), c.get(&"b", t0), c.get(&"c", t0)), (Some(1), None, Some(3)));
    }

    #[test]
    fn a_flood_of_refused_tokens_leaves_the_authenticated_ones() {
        let c = TokenCache::new([7; 32], 16);
        let t0 = Instant::now();
        let ttl = Duration::from_secs(120);
        let good = c.key("good-token");
        let user = UserInfo { name: "alice".into(), ..Default::default() };
        c.insert(good, Some(user.clone()), ttl, t0);
        for i in 0..10_000 {
            c.insert(c.key(&format!("random-{i}")), None, ttl, t0);
        }
        assert_eq!(c.get(&good, t0), Some(Some(user)));
        assert_eq!(c.get(&c.key("random-9999"), t0), Some(None));
        assert_eq!(c.get(&c.key("random-0"), t0), None, "the oldest refusals went first");
        assert_eq!(c.negative.len(), 16);
        // Keys depend on the salt and never contain the token.
        assert_ne!(TokenCache::new([8; 32], 1).key("good-token"), good);
        assert!(!good.windows(4).any(|w| w == b"good"));
    }
}
