//! What the in-process fallback admitted during a Redis outage, carried into Redis when it answers again: so that
//! N instances admit at most N × a limit over any window, not that plus a full limit more from Redis.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use parking_lot::Mutex;

use super::last_reported::Report;
use super::store::{LimitCheck, MemoryStore, RedisStore};
use super::Limit;

/// Keys remembered per outage at most; past it, the others' admissions are not carried (the cost of a flood of
/// new keys during an outage stays bounded).
const MAX_KEYS: usize = 100_000;
/// How long one carrying call may wait for Redis.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// Keys carried at once: their calls share script calls in the batcher, as live requests do.
const CONCURRENT_KEYS: usize = 64;

/// The keys the fallback admitted requests on since Redis last answered, with their limits.
#[derive(Debug, Default)]
pub(super) struct FallbackLedger {
    keys: Mutex<HashMap<Box<str>, Limit>>,
    /// What the fallback started keys from (Redis's last report of each): Redis counts it already.
    seeds: Mutex<HashMap<Box<str>, Report>>,
    /// Keys Redis answers for again whose fallback admissions are not carried yet.
    pending: Arc<Pending>,
    /// The fallback store, whose state says how much each key took.
    local: OnceLock<Arc<MemoryStore>>,
}

/// The keys of a carry under way, each carried once, by the carrying task or by the first request that needs it,
/// and before Redis decides anything more on it.
#[derive(Debug, Default)]
struct Pending {
    keys: Mutex<HashMap<Box<str>, Slot>>,
    /// Whether `keys` may hold any: one relaxed load on the request path when no carry is under way.
    any: AtomicBool,
}

/// One key's carry: its limit until it is taken to be carried. The lock is held for the whole carry, so that a
/// request on the key waits for a carry under way rather than running past it.
type Slot = Arc<tokio::sync::Mutex<Option<(Limit, Option<Report>)>>>;

impl Pending {
    /// Carries `key` if nobody has yet, or waits for the carry under way; then forgets it. `Err` when Redis failed.
    async fn carry(
        &self,
        redis: &RedisStore,
        local: &MemoryStore,
        key: &str,
    ) -> Result<Carried, ()> {
        let slot = self.keys.lock().get(key).cloned();
        let Some(slot) = slot else {
            return Ok(Carried::NOTHING);
        };
        let mut limit = slot.lock().await;
        let result = match limit.take() {
            Some((taken, seed)) => carry_key(redis, local, key, &taken, seed).await,
            None => Ok(Carried::NOTHING),
        };
        drop(limit);
        let mut keys = self.keys.lock();
        if keys.get(key).is_some_and(|held| Arc::ptr_eq(held, &slot)) {
            keys.remove(key);
        }
        result
    }
}

impl FallbackLedger {
    /// The fallback store whose admissions this ledger carries.
    pub(super) fn set_local(&self, local: Arc<MemoryStore>) {
        let _ = self.local.set(local);
    }

    /// Remembers what the fallback started `key` from: Redis's last report, which it counts already.
    pub(super) fn seeded(&self, key: &str, report: Report) {
        let mut seeds = self.seeds.lock();
        if seeds.len() < MAX_KEYS || seeds.contains_key(key) {
            seeds.insert(key.into(), report);
        }
    }

    /// Remembers the keys of a request the fallback admitted.
    pub(super) fn record(&self, checks: &[LimitCheck<'_>]) {
        let mut keys = self.keys.lock();
        // Slots held in-process are released in-process: Redis holds no lease of theirs to carry.
        for check in checks
            .iter()
            .filter(|check| !check.limit.is_shadow() && !check.limit.algorithm().holds_slots())
        {
            if let Some(limit) = keys.get_mut(check.key) {
                if limit != check.limit {
                    *limit = check.limit.clone();
                }
            } else if keys.len() < MAX_KEYS {
                keys.insert(check.key.into(), check.limit.clone());
            }
        }
    }

    /// Redis answers again: carries into it, in a task of its own, what the fallback took from each key it
    /// admitted on. Requests on those keys meanwhile carry theirs first (`carry_first`).
    pub(super) fn carry(&self, redis: &RedisStore) {
        let keys = std::mem::take(&mut *self.keys.lock());
        let mut seeds = std::mem::take(&mut *self.seeds.lock());
        let Some(local) = self.local.get() else {
            return;
        };
        if keys.is_empty() {
            return;
        }
        let order: Vec<Box<str>> = {
            let mut pending = self.pending.keys.lock();
            if pending.len() + keys.len() > MAX_KEYS {
                return;
            }
            for (key, limit) in keys {
                // A key an earlier carry left (Redis failed again) keeps its slot.
                let seed = seeds.remove(&key);
                pending
                    .entry(key)
                    .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Some((limit, seed)))));
            }
            self.pending.any.store(true, Ordering::Release);
            // With what an earlier carry left when Redis failed again.
            pending.keys().cloned().collect()
        };
        tokio::spawn(carry_over(
            redis.clone(),
            Arc::clone(local),
            Arc::clone(&self.pending),
            order,
        ));
    }

    /// Whether a carry is under way (or was cut short by Redis failing again): requests then `carry_first`.
    pub(super) fn carrying(&self) -> bool {
        self.pending.any.load(Ordering::Relaxed)
    }

    /// Before Redis decides `checks`, carries what the fallback admitted on their keys, if that is still to do:
    /// so that Redis never admits on a key before it counts what the fallback admitted there. Within `budget` (the
    /// store's timeout): past it, the request goes on and what was left of its keys' carry is dropped.
    pub(super) async fn carry_first(
        &self,
        redis: &RedisStore,
        checks: &[LimitCheck<'_>],
        budget: Duration,
    ) {
        let Some(local) = self.local.get() else {
            return;
        };
        let carry = async {
            for check in checks {
                if self.pending.carry(redis, local, check.key).await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(budget, carry).await;
    }
}

/// For each key, what the fallback's state says was taken and not yet given back by time (the capacity less what
/// remains: a window's count, a bucket's spent tokens), consumed again in Redis: at once when it all fits, else one
/// request's cost at a time until Redis refuses (the key is then at its limit there too). Consumed now rather than
/// when it was admitted, so a key may be held a little longer than it would have been: never more admitted. Keys
/// are carried [`CONCURRENT_KEYS`] at a time, so that live traffic, decided by Redis again, finds what the fallback
/// took already there within a few calls rather than after thousands of them.
async fn carry_over(
    redis: RedisStore,
    local: Arc<MemoryStore>,
    pending: Arc<Pending>,
    order: Vec<Box<str>>,
) {
    let (mut carried, mut full, count) = (0u64, 0usize, order.len());
    let mut carrying = stream::iter(order)
        .map(|key| {
            let (redis, local, pending) = (redis.clone(), Arc::clone(&local), Arc::clone(&pending));
            // A request on the key may have carried it already: then nothing.
            async move { pending.carry(&redis, &local, &key).await }
        })
        .buffer_unordered(CONCURRENT_KEYS);
    while let Some(result) = carrying.next().await {
        match result {
            Ok(Carried { requests, at_limit }) => {
                carried += requests;
                full += usize::from(at_limit);
            }
            // Redis failed again: the next recovery carries what the fallback takes from now on.
            Err(()) => {
                tracing::debug!(
                    carried,
                    "carrying the fallback's admissions into redis stopped: redis failed"
                );
                return;
            }
        }
    }
    {
        let keys = pending.keys.lock();
        if keys.is_empty() {
            pending.any.store(false, Ordering::Relaxed);
        }
    }
    tracing::info!(
        keys = count,
        requests = carried,
        at_limit = full,
        "what the fallback admitted during the outage is counted in redis"
    );
}

/// What carrying one key consumed in Redis.
#[derive(Debug, Clone, Copy)]
struct Carried {
    /// Requests' costs consumed.
    requests: u64,
    /// Redis refused before all was carried: the key is at its limit there.
    at_limit: bool,
}

impl Carried {
    /// Nothing to carry, or carried by someone else.
    const NOTHING: Self = Self {
        requests: 0,
        at_limit: false,
    };
}

async fn carry_key(
    redis: &RedisStore,
    local: &MemoryStore,
    key: &str,
    limit: &Limit,
    seed: Option<Report>,
) -> Result<Carried, ()> {
    let standing = local.peek(LimitCheck { key, limit });
    // What the key was started from is Redis's own count: only what the fallback took on top of it is carried.
    let seeded = seed.map_or(0, |seed| local.seeded_taken(limit, seed.taken, seed.at_ms));
    let taken = standing
        .limit
        .saturating_sub(standing.remaining)
        .saturating_sub(seeded);
    let requests = taken.div_ceil(limit.cost());
    if requests == 0 {
        return Ok(Carried::NOTHING);
    }
    // All of it in one call when it fits (a key Redis holds nothing of, the common case after an outage).
    let whole = Limit::new(
        limit.name(),
        *limit.algorithm(),
        requests.saturating_mul(limit.cost()),
    );
    if let (true, Ok(whole)) = (requests > 1, whole) {
        if consume(redis, key, &whole).await? {
            return Ok(Carried {
                requests,
                at_limit: false,
            });
        }
    }
    for carried in 0..requests {
        if !consume(redis, key, limit).await? {
            return Ok(Carried {
                requests: carried,
                at_limit: true,
            });
        }
    }
    Ok(Carried {
        requests,
        at_limit: false,
    })
}

/// One check of `limit` on `key` in Redis: whether it was admitted, or `Err` when Redis failed.
async fn consume(redis: &RedisStore, key: &str, limit: &Limit) -> Result<bool, ()> {
    let check = [LimitCheck { key, limit }];
    match tokio::time::timeout(CALL_TIMEOUT, redis.check(&check, None)).await {
        Ok(Ok(outcome)) => Ok(outcome.allowed),
        Ok(Err(_)) | Err(_) => Err(()),
    }
}
