//! The in-process store: the same algorithms over a sharded, bounded map, for one instance or as the fallback
//! when Redis fails.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
/// Entries a full shard looks at to make room for a new key: the next ones under its clock hand, so that a sweep
/// costs the same whatever the shard's size and, over successive new keys, looks at every entry.
const EVICTION_SAMPLE: usize = 16;

/// A bounded in-memory store of limit state, safe to share between threads.
///
/// Keys expire exactly as they would in Redis (a key expires when it is back to full capacity). When `max_keys` is
/// reached, a new key displaces only a key whose state is back to full (forgetting it changes no decision) or,
/// failing that, the least recently used of the keys looked at that is not over its limit: a flood of distinct
/// clients cannot exhaust memory, nor reset a key that is over its limit by pushing it out. When no key can be
/// displaced, [`WhenFull`] decides the new key's request.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    max_per_shard: usize,
    clock: Arc<dyn Clock>,
    /// [`WhenFull::Allow`]; an atomic so that the gateway can set it on the store its limiter made.
    allow_when_full: AtomicBool,
    /// Keys one limit may hold in each shard (`store.max_keys_per_limit` over the shards); unbounded until set.
    max_per_limit_shard: AtomicUsize,
    /// `tollgate_store_full_total`: requests a new key of which found no room.
    full: metrics::Counter,
}

/// What happens to a request one of whose keys is new when the store is full and holds no key it may displace
/// (`store.when_full`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WhenFull {
    /// Refuse the request (429, `Retry-After` until a held key may be displaced).
    #[default]
    Deny,
    /// Admit it without keeping the new key's state.
    Allow,
}

/// A locked shard and its index.
type Guard<'s> = (usize, MutexGuard<'s, Shard>);

#[derive(Debug, Default)]
struct Shard {
    /// Hashed by the hash stored with each key (see [`StoredKey`]).
    entries: IndexMap<StoredKey, Entry, StoredHash>,
    /// Where the next search for room starts (a clock hand).
    hand: usize,
    /// How many keys each limit holds here, by the key's text before its `{` (`<prefix><route>:<limit>:`).
    per_limit: HashMap<Box<str>, usize>,
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
    /// When the key is back to full capacity: from then on, holding it or not gives the same decisions.
    expires_at_ms: i64,
    /// When a request last looked the key up, for displacing the least recently used.
    used_ms: i64,
    /// The last commit left less than one request's cost: the key refuses requests until its retry time. The
    /// retry time is not kept, so such a key is held until it is back to full, which is never earlier.
    over_limit: bool,
}

/// A full shard found no key it may displace; the earliest time one of the keys it looked at will be.
#[derive(Debug, Clone, Copy)]
struct NoRoom {
    until_ms: i64,
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
            allow_when_full: AtomicBool::new(false),
            max_per_limit_shard: AtomicUsize::new(usize::MAX),
            full: metrics::counter!("tollgate_store_full_total"),
        }
    }

    /// Sets what happens to a new key's request when the store is full and may displace no key.
    pub fn set_when_full(&self, when_full: WhenFull) {
        self.allow_when_full
            .store(when_full == WhenFull::Allow, Ordering::Relaxed);
    }

    /// Bounds the keys one limit may hold at about `max_keys` (each shard holds its share): past it, the limit's
    /// new keys displace only its own keys, on the store's rules, or are decided by [`WhenFull`].
    pub fn set_max_keys_per_limit(&self, max_keys: usize) {
        self.max_per_limit_shard
            .store(max_keys.div_ceil(SHARDS).max(1), Ordering::Relaxed);
    }

    /// What happens to a new key's request when the store is full and may displace no key.
    pub fn when_full(&self) -> WhenFull {
        if self.allow_when_full.load(Ordering::Relaxed) {
            WhenFull::Allow
        } else {
            WhenFull::Deny
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
                let held = shard.entries.get_full_mut(&hashed.key);
                hashed.found = held.as_ref().map(|(index, _, _)| *index);
                let state = held
                    .map(|(_, _, entry)| {
                        entry.used_ms = now_ms;
                        &*entry
                    })
                    .filter(|e| e.expires_at_ms > now_ms)
                    .map(|e| &e.state);
                algorithms::evaluate(check.limit.algorithm(), state, now_ms, check.limit.cost())
            })
            .collect();

        // Room for the new keys is made before anything is committed, so that a request refused for want of it
        // consumes nothing anywhere.
        let mut refused: SmallVec<[(usize, NoRoom); INLINE_LIMITS]> = SmallVec::new();
        let admitted = evaluations
            .iter()
            .enumerate()
            .all(|(i, e)| e.admitted.allowed || checks[i].limit.is_shadow());
        if admitted {
            for i in 0..keys.len() {
                let hashed = &keys[i];
                if hashed.found.is_some() || !evaluations[i].admitted.allowed {
                    continue;
                }
                // Earlier new keys of this request in the same shard, not yet inserted, need their room too.
                let pending = keys[..i]
                    .iter()
                    .enumerate()
                    .filter(|&(j, k)| {
                        k.shard == hashed.shard
                            && k.found.is_none()
                            && evaluations[j].admitted.allowed
                            && !refused.iter().any(|&(r, _)| r == j)
                    })
                    .count();
                // Of those, the ones of the same limit count against its own bound.
                let limit = limit_of(hashed.key.text);
                let pending_in_limit = keys[..i]
                    .iter()
                    .enumerate()
                    .filter(|&(j, k)| {
                        k.shard == hashed.shard
                            && k.found.is_none()
                            && evaluations[j].admitted.allowed
                            && limit_of(k.key.text) == limit
                            && !refused.iter().any(|&(r, _)| r == j)
                    })
                    .count();
                let max_per_limit = self.max_per_limit_shard.load(Ordering::Relaxed);
                let shard = guard_for(&mut guards, hashed.shard);
                let room = shard
                    .make_room_in_limit(limit, pending_in_limit, now_ms, max_per_limit)
                    .and_then(|()| shard.make_room_for(pending, now_ms, self.max_per_shard));
                if let Err(no_room) = room {
                    refused.push((i, no_room));
                }
            }
        }
        if !refused.is_empty() {
            self.full.increment(1);
            let enforced = refused.iter().any(|&(i, _)| !checks[i].limit.is_shadow());
            if enforced && self.when_full() == WhenFull::Deny {
                return refusal(evaluations, &refused, now_ms);
            }
        }
        let over_limit: SmallVec<[bool; INLINE_LIMITS]> = evaluations
            .iter()
            .zip(checks)
            .map(|(e, c)| e.admitted.remaining < c.limit.cost())
            .collect();

        algorithms::settle(
            evaluations,
            |i| checks[i].limit.is_shadow(),
            |i, state, ttl_ms| {
                if refused.iter().any(|&(r, _)| r == i) {
                    return;
                }
                let entry = Entry {
                    state,
                    expires_at_ms: now_ms + ttl_ms as i64,
                    used_ms: now_ms,
                    over_limit: over_limit[i],
                };
                let hashed = &keys[i];
                let shard = guard_for(&mut guards, hashed.shard);
                shard.store(hashed.key, hashed.found, entry, now_ms, self.max_per_shard);
            },
        )
    }

    /// This store's time, in ms: what [`give_back`](Self::give_back) takes an admission's time in.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Gives back, at the clock's time, what `checks` took when they were admitted at `at_ms` (see
    /// [`algorithms::give_back`]).
    pub fn give_back(&self, at_ms: i64, checks: &[LimitCheck<'_>]) {
        self.give_back_at(self.clock.now_ms(), at_ms, checks);
    }

    /// [`give_back`](Self::give_back) at `now_ms`.
    pub fn give_back_at(&self, now_ms: i64, at_ms: i64, checks: &[LimitCheck<'_>]) {
        for check in checks {
            let key = self.key_ref(check.key);
            let mut shard = self.shards[key.shard()].lock();
            let Some(entry) = shard
                .entries
                .get_mut(&key)
                .filter(|e| e.expires_at_ms > now_ms)
            else {
                continue;
            };
            let limit = check.limit;
            let given = algorithms::give_back(
                limit.algorithm(),
                Some(&entry.state),
                now_ms,
                at_ms,
                limit.cost(),
            );
            if let Some((state, ttl_ms)) = given {
                entry.state = state;
                entry.expires_at_ms = now_ms + ttl_ms as i64;
                entry.over_limit = false;
            }
        }
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
        let Some(index) = shard.entries.get_index_of(&key) else {
            return false;
        };
        shard
            .remove_index(index)
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
                let Shard {
                    entries, per_limit, ..
                } = &mut *shard;
                entries.retain(|key, e| {
                    let keep = e.expires_at_ms > now_ms;
                    if !keep {
                        forget_one(per_limit, &key.text);
                    }
                    keep
                });
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

/// Entries looked at for room in one limit's share of a shard: more than [`EVICTION_SAMPLE`], since only the
/// limit's own count (a quarter of the shard, by default, when it is at its bound).
const LIMIT_SAMPLE: usize = 64;

/// The limit a store key belongs to: its text before the `{` of its value (`<prefix><route>:<limit>:`).
fn limit_of(key: &str) -> &str {
    key.find('{').map_or(key, |at| &key[..at])
}

/// Counts one key of `key`'s limit fewer.
fn forget_one(per_limit: &mut HashMap<Box<str>, usize>, key: &str) {
    let limit = limit_of(key);
    if let Some(count) = per_limit.get_mut(limit) {
        *count -= 1;
        if *count == 0 {
            per_limit.remove(limit);
        }
    }
}

/// The answer to a request refused because a new key of it found no room: the refused limits deny until the
/// earliest time a key they could displace frees up; nothing was consumed.
fn refusal(
    evaluations: Vec<Evaluation<State>>,
    refused: &[(usize, NoRoom)],
    now_ms: i64,
) -> Outcome {
    let decisions = evaluations
        .into_iter()
        .enumerate()
        .map(|(i, ev)| match refused.iter().find(|&&(r, _)| r == i) {
            Some((_, no_room)) => {
                let retry_after_ms = (no_room.until_ms - now_ms).max(1) as u64;
                Decision {
                    allowed: false,
                    remaining: 0,
                    retry_after_ms,
                    // Said as of a limit with nothing left: full again no sooner than it admits again (a fresh
                    // key's standing state would say 0 beside a Retry-After of seconds).
                    reset_after_ms: ev.standing.reset_after_ms.max(retry_after_ms),
                    delay_ms: 0,
                    ..ev.standing
                }
            }
            None => ev.standing,
        })
        .collect();
    Outcome {
        allowed: false,
        decisions,
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
        // Room was made before the request committed; only a key of the same request displaced since (and now
        // stored again) may find the shard full, and goes over the bound by one rather than lose its count.
        if self.entries.len() >= max_entries {
            let _ = self.make_room(now_ms);
        }
        let limit = limit_of(key.text);
        match self.per_limit.get_mut(limit) {
            Some(count) => *count += 1,
            None => {
                self.per_limit.insert(limit.into(), 1);
            }
        }
        let key = StoredKey {
            hash: key.hash,
            text: key.text.into(),
        };
        self.entries.insert(key, entry);
    }

    /// Removes the entry at `index`, keeping the count of its limit.
    fn remove_index(&mut self, index: usize) -> Option<Entry> {
        let (key, entry) = self.entries.swap_remove_index(index)?;
        forget_one(&mut self.per_limit, &key.text);
        Some(entry)
    }

    /// Makes room in `limit`'s share of the shard for one new key of it besides `pending` others: displaces its
    /// own keys (back to full first, else the least recently used not over its limit) among the entries under the
    /// clock hand, or says when one of them may next be displaced. Other limits' keys are never touched.
    fn make_room_in_limit(
        &mut self,
        limit: &str,
        pending: usize,
        now_ms: i64,
        max_in_limit: usize,
    ) -> Result<(), NoRoom> {
        while self.per_limit.get(limit).copied().unwrap_or(0) + pending >= max_in_limit {
            let len = self.entries.len();
            let start = self.hand % len.max(1);
            let looked = LIMIT_SAMPLE.min(len);
            let mut sample = Sample::new();
            for step in 0..looked {
                let index = (start + step) % len;
                let (key, entry) = self.entries.get_index(index).expect("index below len");
                if limit_of(&key.text) == limit {
                    sample.consider(index, entry, now_ms);
                }
            }
            self.hand = start + looked;
            let index = sample
                .full
                .first()
                .copied()
                .or(sample.least_recent.map(|(index, _)| index))
                .ok_or(NoRoom {
                    until_ms: if sample.until_ms == i64::MAX {
                        now_ms + 1000
                    } else {
                        sample.until_ms
                    },
                })?;
            self.remove_index(index);
        }
        Ok(())
    }

    /// Makes room for one new key besides `pending` others: displaces keys until the shard holds fewer than
    /// `max_entries` with them, or says when it may next be able to.
    fn make_room_for(
        &mut self,
        pending: usize,
        now_ms: i64,
        max_entries: usize,
    ) -> Result<(), NoRoom> {
        while self.entries.len() + pending >= max_entries {
            self.make_room(now_ms)?;
        }
        Ok(())
    }

    /// Looks at the next [`EVICTION_SAMPLE`] entries under the clock hand and removes those back to full, or
    /// else the least recently used of them that is not over its limit. A key over its limit is never removed
    /// before it is back to full.
    fn make_room(&mut self, now_ms: i64) -> Result<(), NoRoom> {
        let len = self.entries.len();
        if len == 0 {
            return Ok(());
        }
        let mut sample = Sample::new();
        let start = self.hand % len;
        let looked = EVICTION_SAMPLE.min(len);
        for step in 0..looked {
            let index = (start + step) % len;
            sample.consider(index, &self.entries[index], now_ms);
        }
        self.hand = start + looked;
        let Sample {
            mut full,
            least_recent,
            until_ms,
        } = sample;
        if full.is_empty() {
            let (index, _) = least_recent.ok_or(NoRoom { until_ms })?;
            self.remove_index(index);
            return Ok(());
        }
        // Highest index first, so earlier swap_removes do not move the later ones.
        full.sort_unstable_by(|a, b| b.cmp(a));
        for index in full {
            self.remove_index(index);
        }
        Ok(())
    }
}

/// What a look at the entries under the clock hand found, as displacing sees them.
struct Sample {
    /// Entries back to full (forgetting them changes no decision), in the order looked at.
    full: SmallVec<[usize; EVICTION_SAMPLE]>,
    /// The least recently used entry not over its limit, and when it was used.
    least_recent: Option<(usize, i64)>,
    /// The earliest time an entry over its limit is back to full (`i64::MAX`: none seen).
    until_ms: i64,
}

// === impl Sample ===

impl Sample {
    fn new() -> Self {
        Self {
            full: SmallVec::new(),
            least_recent: None,
            until_ms: i64::MAX,
        }
    }

    /// Files the entry at `index`: back to full, a candidate by recency, or over its limit until it expires.
    fn consider(&mut self, index: usize, entry: &Entry, now_ms: i64) {
        if entry.expires_at_ms <= now_ms {
            self.full.push(index);
        } else if !entry.over_limit {
            if self
                .least_recent
                .is_none_or(|(_, used)| entry.used_ms < used)
            {
                self.least_recent = Some((index, entry.used_ms));
            }
        } else {
            self.until_ms = self.until_ms.min(entry.expires_at_ms);
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

    /// `n` keys that all fall in one shard of `store`.
    fn same_shard_keys(store: &MemoryStore, n: usize) -> Vec<String> {
        let mut names = (0..).map(|i| format!("k{i}"));
        let first = names.next().expect("a key");
        let shard = store.key_ref(&first).shard();
        let mut keys = vec![first];
        keys.extend(
            names
                .filter(|k| store.key_ref(k).shard() == shard)
                .take(n - 1),
        );
        keys
    }

    fn on<'a>(key: &'a str, limit: &'a Limit) -> LimitCheck<'a> {
        LimitCheck { key, limit }
    }

    #[test]
    fn a_flood_of_new_keys_never_frees_a_key_over_its_limit() {
        // The attack: a 30 s sliding_log at its limit, then 20,000 new keys through a store of 10,000.
        let clock = Arc::new(ManualClock::new(1_000_000));
        let store = MemoryStore::new(10_000, clock.clone());
        let limit = Limit::new(
            "l",
            Algorithm::SlidingLog {
                limit: 50,
                period_ms: 30_000,
            },
            1,
        )
        .unwrap();
        let admitted = (0..60)
            .filter(|_| store.check(&[on("victim", &limit)]).allowed)
            .count();
        assert_eq!(admitted, 50);
        for i in 0..20_000 {
            let key = format!("flood{i}");
            assert!(store.check(&[on(&key, &limit)]).allowed, "{key}");
            if i % 1000 == 0 {
                clock.advance(1);
            }
        }
        assert!(store.len() <= 10_000 + SHARDS, "{} keys", store.len());
        let after = (0..20)
            .filter(|_| store.check(&[on("victim", &limit)]).allowed)
            .count();
        assert_eq!(after, 0, "the victim key is still at its limit");
        clock.advance(30_000);
        assert!(
            store.check(&[on("victim", &limit)]).allowed,
            "until its retry time"
        );
    }

    #[test]
    fn a_key_back_to_full_is_displaced_before_the_least_recently_used() {
        let clock = Arc::new(ManualClock::new(0));
        let store = MemoryStore::new(2 * SHARDS, clock.clone());
        let keys = same_shard_keys(&store, 3);
        let short = log_limit("short", 10);
        let long = Limit::new(
            "long",
            Algorithm::SlidingLog {
                limit: 10,
                period_ms: 600_000,
            },
            1,
        )
        .unwrap();
        // `old` is the least recently used but still counts; `full` is used later and back to full at 60 s.
        assert!(store.check(&[on(&keys[0], &long)]).allowed);
        clock.advance(1_000);
        assert!(store.check(&[on(&keys[1], &short)]).allowed);
        clock.advance(60_000);

        assert!(store.check(&[on(&keys[2], &short)]).allowed);

        assert_eq!(store.peek(on(&keys[0], &long)).remaining, 9, "kept");
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn the_least_recently_used_key_not_over_its_limit_is_displaced() {
        let clock = Arc::new(ManualClock::new(0));
        let store = MemoryStore::new(2 * SHARDS, clock.clone());
        let keys = same_shard_keys(&store, 3);
        let limit = log_limit("l", 10);
        assert!(store.check(&[on(&keys[0], &limit)]).allowed);
        clock.advance(1);
        assert!(store.check(&[on(&keys[1], &limit)]).allowed);
        clock.advance(1);
        // Used again: now the most recently used.
        assert!(store.check(&[on(&keys[0], &limit)]).allowed);
        clock.advance(1);

        assert!(store.check(&[on(&keys[2], &limit)]).allowed);

        assert_eq!(store.peek(on(&keys[0], &limit)).remaining, 8, "kept");
        assert_eq!(store.peek(on(&keys[1], &limit)).remaining, 10, "displaced");
        assert_eq!(store.peek(on(&keys[2], &limit)).remaining, 9);
    }

    #[test]
    fn with_only_keys_over_their_limit_a_new_key_is_refused_until_one_is_back_to_full() {
        let clock = Arc::new(ManualClock::new(0));
        let store = MemoryStore::new(SHARDS, clock.clone());
        let keys = same_shard_keys(&store, 2);
        let limit = log_limit("l", 1);
        assert!(store.check(&[on(&keys[0], &limit)]).allowed);
        clock.advance(10_000);

        let refused = store.check(&[on(&keys[1], &limit)]);
        assert!(!refused.allowed);
        assert_eq!(refused.decisions[0].remaining, 0);
        assert_eq!(
            refused.decisions[0].retry_after_ms, 50_000,
            "until the held key is back to full"
        );
        assert!(!store.check(&[on(&keys[0], &limit)]).allowed, "still held");

        store.set_when_full(WhenFull::Allow);
        assert!(store.check(&[on(&keys[1], &limit)]).allowed, "admitted");
        assert!(
            store.check(&[on(&keys[1], &limit)]).allowed,
            "but not counted: nowhere to keep it"
        );
        assert!(!store.check(&[on(&keys[0], &limit)]).allowed, "still held");

        store.set_when_full(WhenFull::Deny);
        clock.advance(50_000);
        assert!(store.check(&[on(&keys[1], &limit)]).allowed);
        assert!(!store.check(&[on(&keys[1], &limit)]).allowed, "now counted");
    }

    #[test]
    fn a_request_refused_for_room_consumes_from_no_limit() {
        let clock = Arc::new(ManualClock::new(0));
        let store = MemoryStore::new(SHARDS, clock.clone());
        let keys = same_shard_keys(&store, 2);
        // A key in another shard, which has room: keys hash with a per-process seed, so a fixed name would share
        // the full shard once in SHARDS runs.
        let full_shard = store.key_ref(&keys[0]).shard();
        let elsewhere = (0..)
            .map(|i| format!("elsewhere{i}"))
            .find(|k| store.key_ref(k).shard() != full_shard)
            .expect("a key in another shard");
        let one = log_limit("one", 1);
        let wide = log_limit("wide", 10);
        assert!(store.check(&[on(&keys[0], &one)]).allowed);
        let outcome = store.check(&[on(&elsewhere, &wide), on(&keys[1], &one)]);
        assert!(!outcome.allowed);
        assert!(outcome.decisions[0].allowed);
        assert_eq!(store.peek(on(&elsewhere, &wide)).remaining, 10);
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

    #[test]
    fn one_limit_cannot_take_the_store_from_the_others() {
        let clock = Arc::new(ManualClock::new(0));
        let store = MemoryStore::new(4 * SHARDS, clock.clone());
        store.set_max_keys_per_limit(SHARDS);
        // Keys over their limit after one request: none may be displaced before its minute is up.
        let greedy = log_limit("greedy", 1);
        let mut refused = 0;
        for i in 0..4 * SHARDS {
            let key = format!("t:r:greedy:{{k{i}}}");
            if !store.check(&[on(&key, &greedy)]).allowed {
                refused += 1;
            }
        }
        assert!(refused >= SHARDS, "{refused} greedy keys refused");
        assert!(
            store.len() <= SHARDS,
            "{} keys held by one limit",
            store.len()
        );
        // Every other limit goes on: its new keys find room beside the greedy limit's share.
        let other = log_limit("other", 100);
        for i in 0..8 * SHARDS {
            let key = format!("t:r:other:{{k{i}}}");
            assert!(store.check(&[on(&key, &other)]).allowed, "{key}");
        }
        // Once a greedy key is back to full, the greedy limit's new keys have room again.
        clock.advance(61_000);
        assert!(store.check(&[on("t:r:greedy:{late}", &greedy)]).allowed);
    }
}
