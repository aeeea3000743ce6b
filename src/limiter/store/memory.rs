//! The in-process store: the same algorithms over a sharded, bounded map, for one instance or as the fallback
//! when Redis fails.

use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::Arc;

use indexmap::{Equivalent, IndexMap};
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use super::{LimitCheck, INLINE_LIMITS};
use crate::limiter::algorithms::{self, Evaluation, State};
use crate::limiter::{Clock, Decision, Outcome};

/// The shards are numbered by this many bits of a key's hash.
const SHARD_BITS: u32 = 6;
const SHARDS: usize = 1 << SHARD_BITS;
/// Entries looked at when a full shard must make room, as Redis samples keys for its approximated LRU.
const EVICTION_SAMPLE: usize = 16;

/// A bounded in-memory store of limit state, safe to share between threads.
///
/// Keys expire exactly as they would in Redis; when `max_keys` is reached, a new key first displaces an expired
/// one and otherwise the sampled key closest to expiry, so a flood of distinct clients cannot exhaust memory.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    max_per_shard: usize,
    clock: Arc<dyn Clock>,
}

/// A locked shard and its index.
type Guard<'s> = (usize, MutexGuard<'s, Shard>);

#[derive(Debug, Default)]
struct Shard {
    /// Hashed by the hash stored with each key (see [`StoredKey`]).
    entries: IndexMap<StoredKey, Entry, StoredHash>,
}

/// A key held by a shard, with the hash it was stored under.
///
/// A key is hashed once per request (SipHash, keyed per process: clients choose the keys, so the hash must not be
/// predictable), and that one hash picks the shard, finds the entry and stores it; with a hash per step it was
/// three SipHashes a key, more than the decision itself.
#[derive(Debug, PartialEq, Eq)]
struct StoredKey {
    hash: u64,
    text: Box<str>,
}

/// A key as a request names it, hashed.
#[derive(Debug, Clone, Copy)]
struct KeyRef<'k> {
    hash: u64,
    text: &'k str,
}

/// One check's key, hashed, its shard, and where the shard held it when the request looked.
#[derive(Debug)]
struct HashedCheck<'k> {
    key: KeyRef<'k>,
    shard: usize,
    found: Option<usize>,
}

/// The map's hashing: the hash a key carries, as it is.
#[derive(Debug, Clone, Copy, Default)]
struct StoredHash;

/// What [`StoredHash`] builds: it is only ever given the one `u64` of a [`StoredKey`] or a [`KeyRef`].
#[derive(Debug, Default)]
struct StoredHasher(u64);

#[derive(Debug)]
struct Entry {
    state: State,
    expires_at_ms: i64,
}

// === impl MemoryStore ===

impl MemoryStore {
    /// A store holding at most about `max_keys` keys, reading time from `clock`.
    pub fn new(max_keys: usize, clock: Arc<dyn Clock>) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        Self {
            shards,
            hasher: RandomState::new(),
            max_per_shard: max_keys.div_ceil(SHARDS).max(1),
            clock,
        }
    }

    /// Checks every limit of one request at the clock's current time; consumes only if all admit.
    pub fn check(&self, checks: &[LimitCheck<'_>]) -> Outcome {
        self.check_at(self.clock.now_ms(), checks)
    }

    /// Checks every limit of one request at `now_ms`; consumes only if all admit.
    pub fn check_at(&self, now_ms: i64, checks: &[LimitCheck<'_>]) -> Outcome {
        // Each key is hashed once, for its shard, the lookup and the commit.
        let mut keys: SmallVec<[HashedCheck<'_>; INLINE_LIMITS]> = checks
            .iter()
            .map(|c| {
                let key = self.key_ref(c.key);
                HashedCheck {
                    key,
                    shard: key.shard(),
                    found: None,
                }
            })
            .collect();
        let mut guards = self.lock_shards(keys.iter().map(|k| k.shard));
        let evaluations: Vec<Evaluation<State>> = checks
            .iter()
            .zip(keys.iter_mut())
            .map(|(check, hashed)| {
                let shard = guard_for(&mut guards, hashed.shard);
                let held = shard.entries.get_full(&hashed.key);
                hashed.found = held.map(|(index, _, _)| index);
                let state = held
                    .map(|(_, _, entry)| entry)
                    .filter(|e| e.expires_at_ms > now_ms)
                    .map(|e| &e.state);
                algorithms::evaluate(check.limit.algorithm(), state, now_ms, check.limit.cost())
            })
            .collect();

        algorithms::settle(
            evaluations,
            |i| checks[i].limit.is_shadow(),
            |i, state, ttl_ms| {
                let entry = Entry {
                    state,
                    expires_at_ms: now_ms + ttl_ms as i64,
                };
                let hashed = &keys[i];
                let shard = guard_for(&mut guards, hashed.shard);
                shard.store(hashed.key, hashed.found, entry, now_ms, self.max_per_shard);
            },
        )
    }

    /// The state of one limit for one key as it stands at the clock's time, consuming nothing.
    pub fn peek(&self, check: LimitCheck<'_>) -> Decision {
        let now_ms = self.clock.now_ms();
        let key = self.key_ref(check.key);
        let shard = self.shards[key.shard()].lock();
        let state = shard
            .entries
            .get(&key)
            .filter(|e| e.expires_at_ms > now_ms)
            .map(|e| &e.state);
        algorithms::evaluate(check.limit.algorithm(), state, now_ms, check.limit.cost()).standing
    }

    /// Forgets `key`; true if it was held (and not expired).
    pub fn reset(&self, key: &str) -> bool {
        let now_ms = self.clock.now_ms();
        let key = self.key_ref(key);
        let mut shard = self.shards[key.shard()].lock();
        shard
            .entries
            .swap_remove(&key)
            .is_some_and(|e| e.expires_at_ms > now_ms)
    }

    /// Number of keys held, expired ones included until they are purged.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().entries.len()).sum()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired key; returns how many were dropped. Called periodically so memory follows traffic.
    pub fn purge_expired(&self) -> usize {
        let now_ms = self.clock.now_ms();
        self.shards
            .iter()
            .map(|shard| {
                let mut shard = shard.lock();
                let before = shard.entries.len();
                shard.entries.retain(|_, e| e.expires_at_ms > now_ms);
                before - shard.entries.len()
            })
            .sum()
    }

    fn key_ref<'k>(&self, text: &'k str) -> KeyRef<'k> {
        KeyRef {
            hash: self.hasher.hash_one(text),
            text,
        }
    }

    /// Locks the shards of all keys in ascending order (the same order for every caller, so no deadlock).
    fn lock_shards(
        &self,
        shards: impl Iterator<Item = usize>,
    ) -> SmallVec<[Guard<'_>; INLINE_LIMITS]> {
        let mut indices: SmallVec<[usize; INLINE_LIMITS]> = shards.collect();
        indices.sort_unstable();
        indices.dedup();
        indices
            .into_iter()
            .map(|i| (i, self.shards[i].lock()))
            .collect()
    }
}

fn guard_for<'g, 's>(guards: &'g mut [Guard<'s>], index: usize) -> &'g mut Shard {
    let position = guards
        .iter()
        .position(|(i, _)| *i == index)
        .expect("lock_shards locked the shard of every key");
    &mut guards[position].1
}

// === impl Shard ===

impl Shard {
    /// Stores `entry` for `key`, which the same request found at `found` (unless another of its keys made room
    /// since, which may have moved it).
    fn store(
        &mut self,
        key: KeyRef<'_>,
        found: Option<usize>,
        entry: Entry,
        now_ms: i64,
        max_entries: usize,
    ) {
        let at = found
            .filter(|&index| {
                self.entries
                    .get_index(index)
                    .is_some_and(|(held, _)| key.equivalent(held))
            })
            .or_else(|| self.entries.get_index_of(&key));
        if let Some(index) = at {
            self.entries[index] = entry;
            return;
        }
        if self.entries.len() >= max_entries {
            self.make_room(now_ms);
        }
        let key = StoredKey {
            hash: key.hash,
            text: key.text.into(),
        };
        self.entries.insert(key, entry);
    }

    /// Removes the expired entries among a random sample, or else the sampled entry closest to expiry.
    fn make_room(&mut self, now_ms: i64) {
        let len = self.entries.len();
        let mut victim: Option<(usize, i64)> = None;
        let mut expired = Vec::new();
        for _ in 0..EVICTION_SAMPLE.min(len) {
            let index = fastrand::usize(..len);
            let expires = self.entries[index].expires_at_ms;
            if expires <= now_ms {
                expired.push(index);
            } else if victim.is_none_or(|(_, e)| expires < e) {
                victim = Some((index, expires));
            }
        }
        if expired.is_empty() {
            if let Some((index, _)) = victim {
                self.entries.swap_remove_index(index);
            }
            return;
        }
        // Highest index first, so earlier swap_removes do not move the later ones.
        expired.sort_unstable_by(|a, b| b.cmp(a));
        expired.dedup();
        for index in expired {
            self.entries.swap_remove_index(index);
        }
    }
}

// === impl KeyRef, StoredKey ===

impl KeyRef<'_> {
    /// The key's shard: the top bits of its hash mixed by a multiplication (Fibonacci hashing), so that the keys
    /// of one shard still differ in every bit the map itself uses.
    fn shard(&self) -> usize {
        (self.hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (u64::BITS - SHARD_BITS)) as usize
    }
}

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl Hash for StoredKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl Equivalent<StoredKey> for KeyRef<'_> {
    fn equivalent(&self, key: &StoredKey) -> bool {
        self.hash == key.hash && self.text == &*key.text
    }
}

// === impl StoredHash ===

impl BuildHasher for StoredHash {
    type Hasher = StoredHasher;

    fn build_hasher(&self) -> StoredHasher {
        StoredHasher::default()
    }
}

impl Hasher for StoredHasher {
    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    /// Never called (keys hash as one `u64`); folds the bytes in, so that it would still be a hash.
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(0x100_0000_01B3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, Limit, ManualClock};

    fn log_limit(name: &str, limit: u64) -> Limit {
        Limit::new(
            name,
            Algorithm::SlidingLog {
                limit,
                period_ms: 60_000,
            },
            1,
        )
        .unwrap()
    }

    #[test]
    fn denied_request_consumes_from_no_limit() {
        let store = MemoryStore::new(1000, Arc::new(ManualClock::new(0)));
        let wide = log_limit("wide", 10);
        let narrow = log_limit("narrow", 2);
        let checks = [
            LimitCheck {
                key: "w",
                limit: &wide,
            },
            LimitCheck {
                key: "n",
                limit: &narrow,
            },
        ];
        let admitted = (0..5).filter(|_| store.check(&checks).allowed).count();
        assert_eq!(admitted, 2);
        let only_wide = [LimitCheck {
            key: "w",
            limit: &wide,
        }];
        let outcome = store.check(&only_wide);
        assert_eq!(
            outcome.decisions[0].remaining, 7,
            "3 denied requests took nothing from 'wide'"
        );
    }

    #[test]
    fn a_key_moved_by_another_key_making_room_is_stored_under_its_own_name() {
        // Two keys a shard: `a` stored first (so it expires first), then `c`; a request on `b` and `a`, all
        // three in one shard, makes room for `b` by evicting `a`, which moves `c` to where `a` was found.
        let clock = Arc::new(ManualClock::new(0));
        let store = MemoryStore::new(2 * SHARDS, clock.clone());
        let mut same_shard = (0..).map(|i| format!("k{i}"));
        let first = same_shard.next().expect("a key");
        let shard = store.key_ref(&first).shard();
        let mut keys = vec![first];
        keys.extend(
            same_shard
                .filter(|k| store.key_ref(k).shard() == shard)
                .take(2),
        );
        let (a, c, b) = (&keys[0], &keys[1], &keys[2]);
        let limit = log_limit("l", 10);
        fn on<'a>(key: &'a str, limit: &'a Limit) -> LimitCheck<'a> {
            LimitCheck { key, limit }
        }
        let check = |key| on(key, &limit);
        for _ in 0..3 {
            assert!(store.check(&[check(a)]).allowed);
        }
        clock.advance(1);
        assert!(store.check(&[check(c)]).allowed);
        clock.advance(1);

        assert!(store.check(&[check(b), check(a)]).allowed);

        assert_eq!(
            store.peek(check(a)).remaining,
            6,
            "a keeps its own count: 4 taken"
        );
        // Which of b and c made room for a depends on the eviction's random sample; neither may hold a's count.
        for (name, key) in [("b", b), ("c", c)] {
            let remaining = store.peek(check(key)).remaining;
            assert!(
                remaining == 9 || remaining == 10,
                "{name} holds its own count or nothing, not a's: {remaining}"
            );
        }
    }

    #[test]
    fn keys_expire_and_the_store_stays_bounded() {
        let clock = Arc::new(ManualClock::new(0));
        let store = MemoryStore::new(640, clock.clone());
        let limit = log_limit("l", 1);
        for i in 0..10_000 {
            let key = format!("k{i}");
            store.check(&[LimitCheck {
                key: &key,
                limit: &limit,
            }]);
        }
        assert!(store.len() <= 640, "{} keys", store.len());
        clock.advance(60_000);
        store.purge_expired();
        assert!(store.is_empty());
    }
}
