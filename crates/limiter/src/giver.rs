//! What runs after a request's answer on the store that decided it: giving back what it took, and settling what it
//! reserved (a refund or a debt), off the client's path.

use std::sync::Arc;
use std::time::Instant;

use super::deny_cache::DenyCache;
use super::store::{LimitCheck, MemoryStore};
#[cfg(feature = "redis")]
use super::store::{RedisStore, StoreError};
use super::{DecidedBy, Limit};

/// Gives back to the store that decided a request what it took, or settles what it reserved (see
/// [`RateLimiter::giver`](super::RateLimiter::giver)).
#[derive(Debug, Clone)]
pub struct Giver {
    /// The in-process store, when it decided the request (the memory store, or the fallback while Redis failed).
    pub(super) local: Option<Arc<MemoryStore>>,
    /// This instance's over-limit cache: a key given back to may admit before a denial it remembers ends.
    pub(super) denials: Arc<DenyCache>,
    /// Redis, when it decided the request.
    #[cfg(feature = "redis")]
    pub(super) redis: Option<RedisStore>,
    /// Where a settlement Redis could not take goes under `on_error: local`: the fallback, which then counts it.
    #[cfg(feature = "redis")]
    pub(super) fallback: Option<Arc<MemoryStore>>,
    /// `tollgate_settlements_failed_total`.
    #[cfg(feature = "redis")]
    pub(super) failed: metrics::Counter,
    /// Redis, for a request the fallback decided while it was away: the slots it holds are adopted by Redis when it
    /// answers again, and released there too.
    #[cfg(feature = "redis")]
    pub(super) outage: Option<RedisStore>,
}

/// What one admitted request's reservation on one limit turned out to cost, once its answer is known: see
/// [`Giver::settle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// The limit's store key, as checked.
    pub key: String,
    /// The limit as checked: its cost is what the request reserved (see [`Limit::with_cost`]).
    pub limit: Limit,
    /// What the request turned out to cost.
    pub actual: u64,
}

/// What a settlement does on each of its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owed {
    /// Gives the limit's cost back.
    Refund,
    /// Adds the limit's cost as a debt.
    Debt,
}

// === impl Giver ===

impl Giver {
    /// The giver of a limiter on the memory store: the store itself, unless nothing was taken.
    pub(super) fn local(
        decided_by: DecidedBy,
        local: &Arc<MemoryStore>,
        denials: &Arc<DenyCache>,
    ) -> Self {
        Self {
            local: (decided_by != DecidedBy::Nobody).then(|| Arc::clone(local)),
            denials: Arc::clone(denials),
            #[cfg(feature = "redis")]
            redis: None,
            #[cfg(feature = "redis")]
            fallback: None,
            // Nothing to count: the memory store never fails a settlement.
            #[cfg(feature = "redis")]
            failed: metrics::Counter::noop(),
            #[cfg(feature = "redis")]
            outage: None,
        }
    }

    /// Settles what admitted requests reserved, once their answers are known: on each limit, an `actual` below
    /// the reservation gives the difference back, one above it adds the difference as a debt (past the limit's
    /// maximum if need be: later requests wait until it is paid), both on the key and the window the decision at
    /// `decided` landed in; an equal one costs no store call. Only limits that took the reservation are settled (a
    /// shadow limit that denied took nothing, and has nothing to give back).
    ///
    /// Never waits, and starts no task: with Redis the settlement is queued for the next script call with the other
    /// requests' checks and settlements (one call per hash slot on Cluster), and is applied at most once: a call
    /// that fails or times out is not sent again (it may have run). A settlement Redis did not confirm is counted
    /// in `tollgate_settlements_failed_total` and, under `on_error: local`, applied to the in-process fallback
    /// instead; under `allow` or `deny` it is dropped. In this process it is applied at once.
    pub fn settle(self, settlements: Vec<Settlement>, decided: Instant) {
        let mut refunds = Vec::new();
        let mut debts = Vec::new();
        for Settlement { key, limit, actual } in settlements {
            let reserved = limit.cost();
            if actual < reserved {
                refunds.push((key, limit.with_cost(reserved - actual)));
            } else if actual > reserved {
                debts.push((key, limit.with_cost(actual - reserved)));
            }
        }
        if !debts.is_empty() {
            self.clone().apply(debts, Owed::Debt, decided);
        }
        self.apply(refunds, Owed::Refund, decided);
    }

    /// Gives back `taken` (store key and limit of every limit that consumed), on the windows the decision at
    /// `decided` landed in (or a moment before it: a sliding_log then gives back its oldest entries from then on).
    /// Never waits: with Redis it is queued for the next script call, and a failure is handled as a settlement's
    /// (see [`settle`](Self::settle)).
    pub fn give_back(self, taken: Vec<(String, Limit)>, decided: Instant) {
        self.apply(taken, Owed::Refund, decided);
    }

    /// Applies `owed` on each of `limits` (a store key and the limit with the amount as its cost) to the store
    /// that decided the request (queued for Redis), or on a Redis failure to the fallback under `on_error: local`.
    fn apply(self, limits: Vec<(String, Limit)>, owed: Owed, decided: Instant) {
        if limits.is_empty() {
            return;
        }
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis.clone() {
            return self.apply_on_redis(redis, limits, owed, decided);
        }
        if let Some(local) = &self.local {
            apply_in(local, &limits, owed, decided);
            self.forget_denials(&limits);
        }
    }

    /// [`apply`](Self::apply) on Redis: queued for its next script call; on a failure, to the fallback under
    /// `on_error: local`.
    #[cfg(feature = "redis")]
    fn apply_on_redis(
        self,
        redis: RedisStore,
        limits: Vec<(String, Limit)>,
        owed: Owed,
        decided: Instant,
    ) {
        let at_ms = redis.redis_time_of(decided.into());
        let landed = move |limits: Vec<(String, Limit)>, result: Result<(), StoreError>| {
            if let Err(error) = result {
                self.failed.increment(1);
                tracing::debug!(%error, ?owed, "a request's settlement did not reach redis");
                let Some(fallback) = &self.fallback else {
                    return;
                };
                apply_in(fallback, &limits, owed, decided);
            }
            self.forget_denials(&limits);
        };
        match owed {
            Owed::Refund => redis.give_back_queued(limits, at_ms, landed),
            Owed::Debt => redis.add_debts_queued(limits, at_ms, landed),
        }
    }

    /// Once settled (given back or owed): a denial this instance remembered for `limits`' keys no longer says
    /// what the store would, sooner (a refund) or later (a debt).
    fn forget_denials(&self, limits: &[(String, Limit)]) {
        for (key, _) in limits {
            self.denials.settled(key);
        }
    }

    /// Releases the slots of `concurrency` limits that an admitted request held (store key and limit of each):
    /// in this process at once, in Redis off the caller's path (it must be called within a tokio runtime then).
    /// A limit with a queue wakes the first request waiting for its key: in this process here, and on every
    /// instance through Redis when it was full there (the release script announces it).
    // The memory store holds slots without leases.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub fn release_slots(self, held: Vec<(String, Limit)>, lease: u64) {
        #[cfg(feature = "redis")]
        if let Some(redis) = &self.redis {
            return redis.release(lease, held);
        }
        if let Some(local) = &self.local {
            let checks: Vec<LimitCheck<'_>> = held
                .iter()
                .map(|(key, limit)| LimitCheck { key, limit })
                .collect();
            local.give_back(local.now_ms(), &checks);
            for (key, limit) in &held {
                if limit.algorithm().slot_queue().is_some() {
                    local.slot_queues().released(key);
                }
            }
            #[cfg(feature = "redis")]
            if let Some(redis) = &self.outage {
                redis.release_outside(lease, held);
            }
        }
    }

    /// Keeps the slots of an admitted request (`held`, under `lease`) in Redis until
    /// [`release_slots`](Self::release_slots): renewed while the request lives. Nothing to do in this process,
    /// but for a request the fallback admitted while Redis was away: Redis adopts its slots once it answers.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub fn hold_slots(&self, held: &[(String, Limit)], lease: u64) {
        #[cfg(feature = "redis")]
        if let Some(redis) = &self.redis {
            redis.hold(lease, held.to_vec());
        } else if let Some(redis) = &self.outage {
            redis.hold_outside(lease, held.to_vec());
        }
    }
}

/// Applies `owed` on each of `limits` in the in-process store `local`, on the windows the decision at `decided`
/// landed in.
fn apply_in(local: &MemoryStore, limits: &[(String, Limit)], owed: Owed, decided: Instant) {
    let checks: Vec<LimitCheck<'_>> = limits
        .iter()
        .map(|(key, limit)| LimitCheck { key, limit })
        .collect();
    // Rounded so as never to be later than `decided`'s millisecond.
    let elapsed_ms = decided.elapsed().as_micros().div_ceil(1000) as i64;
    let at_ms = local.now_ms() - elapsed_ms;
    match owed {
        Owed::Refund => local.give_back(at_ms, &checks),
        Owed::Debt => local.add_debts(at_ms, &checks),
    }
}
