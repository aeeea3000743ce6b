//! The in-process store: the same algorithms over a sharded, bounded map, for one instance or as the fallback
//! when Redis fails.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use indexmap::IndexMap;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use super::{LimitCheck, INLINE_LIMITS};
use crate::limiter::algorithms::{self, Evaluation, State};
use crate::limiter::{Clock, Decision, Outcome};

const SHARDS: usize = 64;
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
    entries: IndexMap<Box<str>, Entry>,
}

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
        // Each key is hashed to its shard once, for the locking, the lookup and the commit.
        let shards: SmallVec<[usize; INLINE_LIMITS]> =
            checks.iter().map(|c| self.shard_of(c.key)).collect();
        let mut guards = self.lock_shards(&shards);
        let evaluations: Vec<Evaluation<State>> = checks
            .iter()
            .zip(&shards)
            .map(|(check, &shard)| {
                let shard = guard_for(&mut guards, shard);
                let state = shard
                    .entries
                    .get(check.key)
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
                let shard = guard_for(&mut guards, shards[i]);
                shard.insert(checks[i].key, entry, now_ms, self.max_per_shard);
            },
        )
    }

    /// The state of one limit for one key as it stands at the clock's time, consuming nothing.
    pub fn peek(&self, check: LimitCheck<'_>) -> Decision {
        let now_ms = self.clock.now_ms();
        let shard = self.shards[self.shard_of(check.key)].lock();
        let state = shard
            .entries
            .get(check.key)
            .filter(|e| e.expires_at_ms > now_ms)
            .map(|e| &e.state);
        algorithms::evaluate(check.limit.algorithm(), state, now_ms, check.limit.cost()).standing
    }

    /// Forgets `key`; true if it was held (and not expired).
    pub fn reset(&self, key: &str) -> bool {
        let now_ms = self.clock.now_ms();
        let mut shard = self.shards[self.shard_of(key)].lock();
        shard
            .entries
            .swap_remove(key)
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

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    /// Locks the shards of all keys in ascending order (the same order for every caller, so no deadlock).
    fn lock_shards(&self, shards: &[usize]) -> SmallVec<[Guard<'_>; INLINE_LIMITS]> {
        let mut indices = SmallVec::<[usize; INLINE_LIMITS]>::from_slice(shards);
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
    fn insert(&mut self, key: &str, entry: Entry, now_ms: i64, max_entries: usize) {
        if let Some(existing) = self.entries.get_mut(key) {
            *existing = entry;
            return;
        }
        if self.entries.len() >= max_entries {
            self.make_room(now_ms);
        }
        self.entries.insert(key.into(), entry);
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
