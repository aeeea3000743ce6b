//! Verified tokens kept until they expire, so that a token costs one signature check, not one per request.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use parking_lot::RwLock;

use super::rejection::TokenRejection;
use super::verifier::VerifiedToken;

/// Verified tokens by their text, bounded in count and in bytes. A hit is one hash of the token and one
/// comparison: no base64, no JSON.
///
/// The whole token is the key, not a digest of it: a fast hash could be made to collide with a cached token's,
/// and a cryptographic one would cost more than the lookup saves.
#[derive(Debug)]
pub(crate) struct TokenCache {
    capacity: usize,
    max_bytes: usize,
    inner: RwLock<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The key set the entries were verified with; an insert verified with another is dropped.
    generation: u64,
    entries: HashMap<Box<str>, Entry, TailHash>,
    /// What the entries take, by [`cost`].
    bytes: usize,
}

#[derive(Debug)]
struct Entry {
    token: VerifiedToken,
    /// The last second (unix) the token is accepted: `exp` plus the leeway.
    valid_until: u64,
}

/// Hashes a token by its length and its last [`TAIL`] bytes: the end of a JWT is its signature, which nobody
/// without the key can choose, so the tail spreads tokens as well as the whole text would, at a twentieth of the
/// cost (an RS256 token is some 650 bytes). Equality still compares the whole token.
#[derive(Debug, Clone, Default)]
struct TailHash(foldhash::fast::RandomState);

struct TailHasher<'a>(foldhash::fast::FoldHasher<'a>);

/// Bytes of a token's end that its hash reads.
const TAIL: usize = 32;

/// The map's own share of an entry (key and value headers, the `Arc` headers, the table slot), an estimate.
const ENTRY_OVERHEAD: usize = 128;

// === impl TokenCache ===

impl TokenCache {
    /// A cache of at most `capacity` tokens taking at most `max_bytes` (tokens, claims and an estimated overhead).
    pub fn new(capacity: usize, max_bytes: usize) -> Self {
        Self {
            capacity,
            max_bytes,
            inner: RwLock::new(Inner {
                generation: 0,
                entries: HashMap::default(),
                bytes: 0,
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
        let entry = Entry {
            token: verified,
            valid_until,
        };
        let size = cost(token, &entry);
        if self.capacity == 0 || size > self.max_bytes / 8 || valid_until < now {
            return;
        }
        let mut inner = self.inner.write();
        if inner.generation != generation || inner.entries.contains_key(token) {
            return;
        }
        if inner.entries.len() >= self.capacity || inner.bytes + size > self.max_bytes {
            inner.make_room(self.capacity, self.max_bytes, now);
        }
        inner.bytes += size;
        inner.entries.insert(token.into(), entry);
    }

    /// Forgets every token: the key set is now `generation`.
    pub fn reset(&self, generation: u64) {
        let mut inner = self.inner.write();
        inner.generation = generation;
        inner.entries = HashMap::default();
        inner.bytes = 0;
    }

    pub fn len(&self) -> usize {
        self.inner.read().entries.len()
    }
}

// === impl Inner ===

impl Inner {
    /// Drops the expired entries and, if that leaves more than seven eighths of either bound, those expiring
    /// soonest down to seven eighths: the sweep is O(n log n) and runs once per eighth of the cache at worst,
    /// not on each insert.
    fn make_room(&mut self, capacity: usize, max_bytes: usize, now: u64) {
        let Self { entries, bytes, .. } = self;
        entries.retain(|token, entry| {
            let keep = entry.valid_until >= now;
            if !keep {
                *bytes -= cost(token, entry);
            }
            keep
        });
        let (count_target, bytes_target) = (capacity - capacity / 8, max_bytes - max_bytes / 8);
        if entries.len() <= count_target && *bytes <= bytes_target {
            return;
        }
        let mut by_expiry: Vec<(u64, usize)> = entries
            .iter()
            .map(|(token, entry)| (entry.valid_until, cost(token, entry)))
            .collect();
        by_expiry.sort_unstable();
        let (mut count, mut left) = (entries.len(), *bytes);
        let mut threshold = 0;
        for (valid_until, size) in by_expiry {
            if count <= count_target && left <= bytes_target {
                break;
            }
            (count, left, threshold) = (count - 1, left - size, valid_until);
        }
        // Every entry expiring at the threshold goes: ties may drop a few more than needed, never fewer.
        entries.retain(|token, entry| {
            let keep = entry.valid_until > threshold;
            if !keep {
                *bytes -= cost(token, entry);
            }
            keep
        });
    }
}

// === impl TailHash ===

impl BuildHasher for TailHash {
    type Hasher = TailHasher<'static>;

    fn build_hasher(&self) -> Self::Hasher {
        TailHasher(self.0.build_hasher())
    }
}

impl Hasher for TailHasher<'_> {
    fn write(&mut self, bytes: &[u8]) {
        self.0.write_usize(bytes.len());
        self.0.write(&bytes[bytes.len().saturating_sub(TAIL)..]);
    }

    fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// What an entry takes in memory, roughly.
fn cost(token: &str, entry: &Entry) -> usize {
    token.len()
        + entry.token.consumer.len()
        + entry.token.plan.as_deref().map_or(0, str::len)
        + ENTRY_OVERHEAD
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
        let cache = TokenCache::new(8, 1 << 20);
        cache.insert("t", token("acme", 100), 100, 0, 50);
        assert_eq!(cache.get("t", 100), Some(Ok(token("acme", 100))));
        assert_eq!(cache.get("t", 101), Some(Err(TokenRejection::Expired)));
        assert_eq!(cache.get("other", 50), None);
    }

    #[test]
    fn tokens_with_the_same_end_are_told_apart() {
        // Same length, same last 32 bytes: one hash, two tokens.
        let tail = "s".repeat(TAIL);
        let (a, b) = (format!("header-a.{tail}"), format!("header-b.{tail}"));
        let cache = TokenCache::new(8, 1 << 20);
        cache.insert(&a, token("alice", 100), 100, 0, 50);
        assert_eq!(cache.get(&b, 50), None);
        cache.insert(&b, token("bob", 100), 100, 0, 50);
        assert_eq!(cache.get(&a, 50), Some(Ok(token("alice", 100))));
        assert_eq!(cache.get(&b, 50), Some(Ok(token("bob", 100))));
    }

    #[test]
    fn an_insert_verified_with_an_older_key_set_is_dropped() {
        let cache = TokenCache::new(8, 1 << 20);
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
        let cache = TokenCache::new(16, 1 << 20);
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

    #[test]
    fn the_byte_bound_drops_the_soonest_expiring_too() {
        // Room for 8 entries of a 100-byte token (100 + 1 + 128 bytes each) by bytes, 100 by count.
        let cache = TokenCache::new(100, 8 * 229);
        let verified = |until| token("c", until);
        for i in 0..8u64 {
            let token = format!("{i:0>100}");
            cache.insert(&token, verified(1000 + i), 1000 + i, 0, 0);
        }
        assert_eq!(cache.len(), 8);
        cache.insert(&format!("{:x>100}", 9), verified(5000), 5000, 0, 0);
        // Down to 7/8 of the bytes (7 entries) by dropping the soonest, then the new one.
        assert_eq!(cache.len(), 8);
        assert!(cache.get(&format!("{:0>100}", 0), 0).is_none());
        assert!(cache.get(&format!("{:0>100}", 1), 0).is_some());
        // A token taking more than an eighth of the bound is not cached at all.
        cache.insert(&"y".repeat(300), verified(5000), 5000, 0, 0);
        assert!(cache.get(&"y".repeat(300), 0).is_none());
    }
}
