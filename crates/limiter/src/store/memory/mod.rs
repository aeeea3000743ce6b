//! The in-process store: the same algorithms over a sharded, bounded map, for one instance or as the fallback
//! when Redis fails.

pub(crate) mod keys;
mod shard;
#[cfg(test)]
mod tests;

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use self::keys::KeyRef;
use self::shard::{forget_one, limit_of, Entry, NoRoom, Shard};
use super::{LimitCheck, INLINE_LIMITS};
use crate::algorithms::{self, Settlement, State, Transition};
use crate::{Clock, Decision, Outcome, SlotQueues};

/// The shards are numbered by this many bits of a key's hash.
const SHARD_BITS: u32 = 6;
pub(crate) const SHARDS: usize = 1 << SHARD_BITS;

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
    /// The requests of this instance waiting for a slot of a full `concurrency` key, woken by its releases (and,
    /// with Redis, by those every instance announces).
    slot_queues: Arc<SlotQueues>,
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

/// One check's key, hashed, its shard, and where the shard held it when the request looked.
#[derive(Debug)]
struct HashedCheck<'k> {
    key: KeyRef<'k>,
    shard: usize,
    found: Option<usize>,
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
            slot_queues: Arc::default(),
        }
    }

    /// The requests of this instance waiting for a slot (see [`SlotQueues`]).
    pub fn slot_queues(&self) -> &Arc<SlotQueues> {
        &self.slot_queues
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
        let transitions: SmallVec<[Transition<State>; INLINE_LIMITS]> = checks
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

        let admitted = transitions
            .iter()
            .enumerate()
            .all(|(i, e)| e.admitted.allowed || checks[i].limit.is_shadow());
        let refused = if admitted {
            self.make_room_for_new_keys(&mut guards, &keys, &transitions, now_ms)
        } else {
            SmallVec::new()
        };
        if !refused.is_empty() {
            self.full.increment(1);
            let enforced = refused.iter().any(|&(i, _)| !checks[i].limit.is_shadow());
            if enforced && self.when_full() == WhenFull::Deny {
                return refusal(&transitions, &refused, now_ms);
            }
        }
        let over_limit: SmallVec<[bool; INLINE_LIMITS]> = transitions
            .iter()
            .zip(checks)
            // A key holding slots is never displaced either: forgetting it would free slots still held.
            .map(|(e, c)| {
                e.admitted.remaining < c.limit.cost() || c.limit.algorithm().holds_slots()
            })
            .collect();

        algorithms::combine(
            &transitions,
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

    /// Makes room in their shards for the keys that a request `transitions` admit adds (none held yet) before
    /// anything is committed, so that a request refused for want of it consumes nothing anywhere: the keys refused
    /// room, by index, and why.
    fn make_room_for_new_keys(
        &self,
        guards: &mut [Guard<'_>],
        keys: &[HashedCheck<'_>],
        transitions: &[Transition<State>],
        now_ms: i64,
    ) -> SmallVec<[(usize, NoRoom); INLINE_LIMITS]> {
        let mut refused: SmallVec<[(usize, NoRoom); INLINE_LIMITS]> = SmallVec::new();
        for (i, hashed) in keys.iter().enumerate() {
            if hashed.found.is_some() || !transitions[i].admitted.allowed {
                continue;
            }
            // Earlier new keys of this request in the same shard, not yet inserted, need their room too; of those,
            // the ones of the same limit count against its own bound.
            let limit = limit_of(hashed.key.text);
            let (pending, pending_in_limit) = keys[..i]
                .iter()
                .enumerate()
                .filter(|&(j, k)| {
                    k.shard == hashed.shard
                        && k.found.is_none()
                        && transitions[j].admitted.allowed
                        && !refused.iter().any(|&(r, _)| r == j)
                })
                .fold((0, 0), |(all, same), (_, k)| {
                    (all + 1, same + usize::from(limit_of(k.key.text) == limit))
                });
            let max_per_limit = self.max_per_limit_shard.load(Ordering::Relaxed);
            let shard = guard_for(guards, hashed.shard);
            let room = shard
                .make_room_in_limit(limit, pending_in_limit, now_ms, max_per_limit)
                .and_then(|()| shard.make_room_for(pending, now_ms, self.max_per_shard));
            if let Err(no_room) = room {
                refused.push((i, no_room));
            }
        }
        refused
    }

    /// This store's time, in ms: what [`give_back`](Self::give_back) takes an admission's time in.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// This store's clock.
    #[cfg(feature = "redis")]
    pub(crate) fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    /// Gives back, at the clock's time, what `checks` took when they were admitted at `at_ms` (see
    /// [`algorithms::settle`]).
    pub fn give_back(&self, at_ms: i64, checks: &[LimitCheck<'_>]) {
        self.give_back_at(self.clock.now_ms(), at_ms, checks);
    }

    /// [`give_back`](Self::give_back) at `now_ms`.
    pub fn give_back_at(&self, now_ms: i64, at_ms: i64, checks: &[LimitCheck<'_>]) {
        self.settle_at(now_ms, at_ms, checks, Settlement::GiveBack);
    }

    /// Adds, at the clock's time, a debt on each of `checks` (its limit's cost is the amount owed) for a request
    /// admitted at `at_ms` that settled for more than it reserved (see [`algorithms::settle`]).
    pub fn add_debts(&self, at_ms: i64, checks: &[LimitCheck<'_>]) {
        self.add_debts_at(self.clock.now_ms(), at_ms, checks);
    }

    /// [`add_debts`](Self::add_debts) at `now_ms`. A key forgotten since the admission (it expired once back to
    /// full) is held again if the store has room for it; without room the debt is dropped.
    pub fn add_debts_at(&self, now_ms: i64, at_ms: i64, checks: &[LimitCheck<'_>]) {
        self.settle_at(now_ms, at_ms, checks, Settlement::Debt);
    }

    /// Settles on each of `checks` its limit's cost (`settlement` of it) for a request admitted at `at_ms`.
    fn settle_at(
        &self,
        now_ms: i64,
        at_ms: i64,
        checks: &[LimitCheck<'_>],
        settlement: fn(u64) -> Settlement,
    ) {
        for check in checks {
            let key = self.key_ref(check.key);
            let mut shard = self.shards[key.shard()].lock();
            let found = shard.entries.get_index_of(&key);
            let held = found
                .and_then(|index| shard.entries.get_index(index))
                .map(|(_, entry)| entry)
                .filter(|e| e.expires_at_ms > now_ms);
            let used_ms = held.map_or(now_ms, |e| e.used_ms);
            let limit = check.limit;
            let settlement = settlement(limit.cost());
            let state = held.map(|e| &e.state);
            let Some((state, ttl_ms)) =
                algorithms::settle(limit.algorithm(), state, now_ms, at_ms, settlement)
            else {
                continue;
            };
            // Only a debt finds no key: a give-back has nothing to give back to.
            if found.is_none() && shard.make_room_for(0, now_ms, self.max_per_shard).is_err() {
                self.full.increment(1);
                continue;
            }
            let (used_ms, over_limit) = match settlement {
                Settlement::GiveBack(_) => {
                    (used_ms, matches!(state, State::Slots(s) if s.held > 0))
                }
                // In debt: never displaced before it is paid.
                Settlement::Debt(_) => (now_ms, true),
            };
            let entry = Entry {
                state,
                expires_at_ms: now_ms + ttl_ms as i64,
                used_ms,
                over_limit,
            };
            match found {
                // Found under this lock: the entry is still there.
                Some(index) => shard.entries[index] = entry,
                None => shard.store(key, None, entry, now_ms, self.max_per_shard),
            }
        }
    }

    /// Starts `check`'s key from what another store reported of it (Redis, before an outage): `taken` of its
    /// capacity, taken at `at_ms`, in place of what this store held. Built as a debt on a fresh key at that time
    /// (see [`algorithms::settle`]): a window's count in the window of `at_ms`, a log's entries all at `at_ms`
    /// (never earlier than they were taken, so they leave no sooner), a bucket short of `taken` then. Nothing when
    /// that is back to full by now, or when the store has no room for the key.
    pub fn seed(&self, check: LimitCheck<'_>, taken: u64, at_ms: i64) {
        let now_ms = self.clock.now_ms();
        let limit = check.limit;
        let Some((state, ttl_ms)) = algorithms::settle(
            limit.algorithm(),
            None,
            at_ms,
            at_ms,
            Settlement::Debt(taken),
        ) else {
            return;
        };
        let expires_at_ms = at_ms.saturating_add(ttl_ms as i64);
        if expires_at_ms <= now_ms {
            return;
        }
        let key = self.key_ref(check.key);
        let mut shard = self.shards[key.shard()].lock();
        let found = shard.entries.get_index_of(&key);
        if found.is_none() && shard.make_room_for(0, now_ms, self.max_per_shard).is_err() {
            self.full.increment(1);
            return;
        }
        let entry = Entry {
            state,
            expires_at_ms,
            used_ms: now_ms,
            over_limit: taken.saturating_add(limit.cost()) > limit.algorithm().capacity(),
        };
        shard.store(key, found, entry, now_ms, self.max_per_shard);
    }

    /// How much of `limit`'s capacity a key [seeded](Self::seed) with `taken` at `at_ms` holds taken at the clock's
    /// time from the seed alone: what of the key's state Redis counts already.
    pub fn seeded_taken(&self, limit: &crate::Limit, taken: u64, at_ms: i64) -> u64 {
        let now_ms = self.clock.now_ms();
        let state = algorithms::settle(
            limit.algorithm(),
            None,
            at_ms,
            at_ms,
            Settlement::Debt(taken),
        )
        .filter(|(_, ttl_ms)| at_ms.saturating_add(*ttl_ms as i64) > now_ms)
        .map(|(state, _)| state);
        let standing =
            algorithms::evaluate(limit.algorithm(), state.as_ref(), now_ms, limit.cost()).standing;
        standing.limit.saturating_sub(standing.remaining)
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

    /// The slots of the `concurrency` key `key` its requests in flight hold, however many its limit allows now (a
    /// reload may have lowered `max` below them).
    pub fn slots_held(&self, key: &str) -> u64 {
        let now_ms = self.clock.now_ms();
        let key = self.key_ref(key);
        let shard = self.shards[key.shard()].lock();
        match shard.entries.get(&key).filter(|e| e.expires_at_ms > now_ms) {
            Some(Entry {
                state: State::Slots(slots),
                ..
            }) => slots.held,
            _ => 0,
        }
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

/// The answer to a request refused because a new key of it found no room: the refused limits deny until the
/// earliest time a key they could displace frees up; nothing was consumed.
fn refusal(transitions: &[Transition<State>], refused: &[(usize, NoRoom)], now_ms: i64) -> Outcome {
    let decisions = transitions
        .iter()
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
        batch: 0,
    }
}

fn guard_for<'g, 's>(guards: &'g mut [Guard<'s>], index: usize) -> &'g mut Shard {
    let position = guards
        .iter()
        .position(|(i, _)| *i == index)
        .expect("lock_shards locked the shard of every key");
    &mut guards[position].1
}
