//! Verified tokens kept until they expire, so that a token costs one signature check, not one per request.

use std::collections::HashMap;

use parking_lot::RwLock;

use super::rejection::TokenRejection;
use super::verifier::VerifiedToken;

/// Verified tokens by their text, bounded. A hit is one hash of the token and one comparison: no base64, no JSON.
///
/// The whole token is the key, not a digest of it: a fast hash could be made to collide with a cached token's,
/// and a cryptographic one would cost more than the lookup saves.
#[derive(Debug)]
pub(crate) struct TokenCache {
    capacity: usize,
    inner: RwLock<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The key set the entries were verified with; an insert verified with another is dropped.
    generation: u64,
    entries: HashMap<Box<str>, Entry, foldhash::fast::RandomState>,
}

#[derive(Debug)]
struct Entry {
    token: VerifiedToken,
    /// The last second (unix) the token is accepted: `exp` plus the leeway.
    valid_until: u64,
}

// === impl TokenCache ===

impl TokenCache {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: RwLock::new(Inner {
                generation: 0,
                entries: HashMap::default(),
            }),
        }
    }

    /// The answer for `token` at `now` (unix seconds) if it was verified before: the token, or `Expired` once
    /// past its `exp` (and leeway), exactly as verifying it again would say.
    pub fn get(&self, token: &str, now: u64) -> Option<Result<VerifiedToken, TokenRejection>> {
        let inner = self.inner.read();
        let entry = inner.entries.get(token)?;
        Some(if now <= entry.valid_until {
            Ok(entry.token.clone())
        } else {
            Err(TokenRejection::Expired)
        })
    }

    /// Keeps `token`, verified with the key set `generation`, until `valid_until`. Dropped if the key set has
    /// changed since (its key may be the one removed). When full, expired entries go, then those expiring soonest.
    pub fn insert(
        &self,
        token: &str,
        verified: VerifiedToken,
        valid_until: u64,
        generation: u64,
        now: u64,
    ) {
        if self.capacity == 0 || valid_until < now {
            return;
        }
        let mut inner = self.inner.write();
        if inner.generation != generation {
            return;
        }
        if inner.entries.len() >= self.capacity && !inner.entries.contains_key(token) {
            inner.make_room(self.capacity, now);
        }
        inner.entries.insert(
            token.into(),
            Entry {
                token: verified,
                valid_until,
            },
        );
    }

    /// Forgets every token: the key set is now `generation`.
    pub fn reset(&self, generation: u64) {
        let mut inner = self.inner.write();
        inner.generation = generation;
        inner.entries = HashMap::default();
    }

    pub fn len(&self) -> usize {
        self.inner.read().entries.len()
    }
}

// === impl Inner ===

impl Inner {
    /// Drops the expired entries and, if that frees less than an eighth, those expiring soonest down to seven
    /// eighths: the sweep is O(n) and runs once per `capacity / 8` inserts at worst, not on each.
    fn make_room(&mut self, capacity: usize, now: u64) {
        self.entries.retain(|_, entry| entry.valid_until >= now);
        let target = capacity - capacity / 8;
        if self.entries.len() <= target {
            return;
        }
        let mut expiries: Vec<u64> = self.entries.values().map(|e| e.valid_until).collect();
        let drop = self.entries.len() - target;
        let (_, threshold, _) = expiries.select_nth_unstable(drop - 1);
        let threshold = *threshold;
        // Ties at the threshold may drop a few more than needed, never fewer.
        self.entries
            .retain(|_, entry| entry.valid_until > threshold);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn token(consumer: &str, expires_at: u64) -> VerifiedToken {
        VerifiedToken {
            consumer: Arc::from(consumer),
            plan: None,
            expires_at,
        }
    }

    #[test]
    fn a_hit_is_valid_until_its_expiry_then_expired() {
        let cache = TokenCache::new(8);
        cache.insert("t", token("acme", 100), 100, 0, 50);
        assert_eq!(cache.get("t", 100), Some(Ok(token("acme", 100))));
        assert_eq!(cache.get("t", 101), Some(Err(TokenRejection::Expired)));
        assert_eq!(cache.get("other", 50), None);
    }

    #[test]
    fn an_insert_verified_with_an_older_key_set_is_dropped() {
        let cache = TokenCache::new(8);
        cache.insert("t", token("acme", 100), 100, 0, 50);
        cache.reset(1);
        assert_eq!(cache.get("t", 50), None, "reset forgets");
        cache.insert("t", token("acme", 100), 100, 0, 50);
        assert_eq!(cache.get("t", 50), None, "verified with generation 0");
        cache.insert("t", token("acme", 100), 100, 1, 50);
        assert!(cache.get("t", 50).is_some());
    }

    #[test]
    fn a_full_cache_drops_the_expired_then_the_soonest_expiring() {
        let cache = TokenCache::new(16);
        for i in 0..16u64 {
            // Tokens 0..4 have expired at now = 1000; the others expire at 2000 + i.
            let until = if i < 4 { 999 } else { 2000 + i };
            cache.insert(&format!("t{i}"), token("c", until), until, 0, 900);
        }
        assert_eq!(cache.len(), 16);
        cache.insert("new", token("c", 5000), 5000, 0, 1000);
        assert_eq!(
            cache.len(),
            13,
            "the 4 expired dropped: 12 left, plus the new one"
        );
        assert!(cache.get("t0", 1000).is_none());
        assert!(cache.get("t4", 1000).is_some());
        for i in 0..3 {
            cache.insert(&format!("more{i}"), token("c", 5000), 5000, 0, 1000);
        }
        assert_eq!(cache.len(), 16);
        cache.insert("last", token("c", 5000), 5000, 0, 1000);
        // Full with nothing expired: down to 14 by expiry (t4, t5 go first), then the new one.
        assert_eq!(cache.len(), 15);
        assert!(cache.get("t4", 1000).is_none() && cache.get("t5", 1000).is_none());
        assert!(cache.get("t6", 1000).is_some() && cache.get("last", 1000).is_some());
    }
}
