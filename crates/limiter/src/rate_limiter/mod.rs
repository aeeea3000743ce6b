//! The limiter a gateway asks: the configured store, its time budget, what to do when Redis fails, the circuit
//! breaker that stops asking a dead Redis, and the over-limit cache that spares it floods on denied keys.

use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::deny_cache::DenyCache;
use super::giver::Giver;
use super::store::{LimitCheck, MemoryStore, StoreError};
use super::{Clock, Decision, Limit, Outcome, SlotQueues};

// The Redis side of the limiter: its health, the fallback, probing; none of it is built without the store.
#[cfg(feature = "redis")]
mod redis;

#[cfg(feature = "redis")]
use super::store::RedisStore;

/// What to do with a request when Redis fails or exceeds its time budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Admit the request unlimited.
    Allow,
    /// Refuse it with 503.
    Deny,
    /// Decide with the in-process store.
    Local,
}

/// Which store decided a request: where what it took must be given back, if it must.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// The configured store (Redis, or the memory store for `backend: memory`).
    Store,
    /// The in-process fallback (`on_error: local`), while Redis failed.
    Fallback,
    /// No store took anything: no limits, `on_error: allow`, or a denial remembered in-process.
    Nobody,
}

/// The store behind a limiter. Non-exhaustive: `Redis` exists only with the crate's `redis` feature.
#[derive(Debug)]
#[non_exhaustive]
pub enum Backend {
    /// In-process only.
    Memory,
    /// Redis, shared by every instance.
    #[cfg(feature = "redis")]
    Redis(RedisStore),
}

/// Decides requests against the configured store, with a time budget and a fallback policy.
#[derive(Debug)]
pub struct RateLimiter {
    backend: Backend,
    /// Shared with the task that hears resets from other instances (as is `denials`).
    local: Arc<MemoryStore>,
    on_error: OnError,
    denials: Arc<DenyCache>,
    /// What deciding on Redis keeps: its health, the fallback's reports, the store's metrics.
    #[cfg(feature = "redis")]
    shared: redis::Shared,
}

/// What `/readyz` says about the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// A limiter call succeeded, and none failed since.
    pub ready: bool,
    /// When not ready, why: the last failure, in Redis's own words where it gave any.
    pub reason: Option<String>,
    /// What puts limits at risk although calls succeed (a `maxmemory-policy` that evicts tollgate's keys).
    pub warnings: Vec<String>,
}

/// The limiter could not decide and the policy is to refuse.
#[derive(Debug, Error)]
#[error("rate limit store unavailable: {0}")]
pub struct Unavailable(#[source] pub StoreError);

// === impl Backend ===

impl Backend {
    /// The store's name, as the config's `store.backend` spells it: `memory` or `redis`.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            #[cfg(feature = "redis")]
            Backend::Redis(_) => "redis",
        }
    }
}

// === impl OnError ===

impl std::fmt::Display for OnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnError::Allow => "allow",
            OnError::Deny => "deny",
            OnError::Local => "local",
        })
    }
}

// === impl RateLimiter ===

impl RateLimiter {
    /// A limiter over `backend`; `max_keys` bounds the in-process store (the store itself for `Backend::Memory`,
    /// the fallback otherwise); `timeout` and `on_error` apply to Redis calls.
    ///
    /// With Redis, listens for the keys any instance resets (the admin API's `DELETE`) and forgets what it
    /// remembers of them in-process: their over-limit denials and their fallback state. Must then be called
    /// within a tokio runtime, as `RedisStore::connect` is.
    // Without the `redis` feature, nothing asks a store that takes time.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub fn new(
        backend: Backend,
        timeout: Duration,
        on_error: OnError,
        max_keys: usize,
        clock: Arc<dyn Clock>,
    ) -> Self {
        metrics::gauge!("tollgate_store_fallback").set(0.0);
        let local = Arc::new(MemoryStore::new(max_keys, clock));
        let denials = Arc::new(DenyCache::default());
        Self {
            #[cfg(feature = "redis")]
            shared: redis::Shared::new(&backend, &local, &denials, timeout, on_error),
            backend,
            local,
            on_error,
            denials,
        }
    }

    /// Checks every limit of one request; consumes from all of them only if all admit.
    ///
    /// Never waits longer than the store timeout for Redis, and not at all while the circuit breaker holds
    /// Redis out of service. When Redis fails, answers per the `on_error` policy: `Ok` with an empty outcome for
    /// `allow`, `Err(Unavailable)` for `deny`, the in-process decision for `local`.
    pub async fn check(&self, checks: &[LimitCheck<'_>]) -> Result<Outcome, Unavailable> {
        self.check_leased(checks, 0)
            .await
            .map(|(outcome, _)| outcome)
    }

    /// A lease id for a request with `concurrency` limits: what its slots are held under in Redis, renewed and
    /// released by (0 with the memory store, which needs none).
    pub fn new_lease(&self) -> u64 {
        match &self.backend {
            Backend::Memory => 0,
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => redis.new_lease(),
        }
    }

    /// [`check`](Self::check), also saying which store decided (where [`give_back`](Self::give_back) must go), the
    /// slots of the request's `concurrency` limits held under `lease` (from [`new_lease`](Self::new_lease); 0 when
    /// it has none).
    // The memory store holds slots without leases.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub async fn check_leased(
        &self,
        checks: &[LimitCheck<'_>],
        lease: u64,
    ) -> Result<(Outcome, DecidedBy), Unavailable> {
        if checks.is_empty() {
            let outcome = Outcome {
                allowed: true,
                decisions: Vec::new(),
                batch: 0,
            };
            return Ok((outcome, DecidedBy::Nobody));
        }
        match &self.backend {
            Backend::Memory => Ok((self.local.check(checks), DecidedBy::Store)),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => self.check_on_redis(redis, checks, lease).await,
        }
    }

    /// Gives back what an admitted request took, to the store that decided it (`decided` is when the decision
    /// came back): a request held by a `leaky_bucket` in delay mode whose client went away before it was
    /// forwarded. `taken` holds the store key and limit of every limit that consumed. Runs on its own, off any
    /// request; a failure is handled as a settlement's (see [`Giver::settle`]): at worst the place stays taken.
    pub fn give_back(
        &self,
        taken: Vec<(String, Limit)>,
        decided_by: DecidedBy,
        decided: Instant,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let giver = self.giver(decided_by);
        async move { giver.give_back(taken, decided) }
    }

    /// What gives back, later, what a request decided by `decided_by` took: held by work that runs after the
    /// request's answer, which no longer has the limiter at hand.
    pub fn giver(&self, decided_by: DecidedBy) -> Giver {
        match &self.backend {
            Backend::Memory => Giver::local(decided_by, &self.local, &self.denials),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => self.redis_giver(redis, decided_by),
        }
    }

    /// True while requests are answered by the `on_error` policy because Redis failed.
    pub fn fallback_active(&self) -> bool {
        match &self.backend {
            Backend::Memory => false,
            #[cfg(feature = "redis")]
            Backend::Redis(_) => self.shared.fallback_active(),
        }
    }

    /// Whether the store answers limiter calls, and if not why (see [`Readiness`]). The memory store is always
    /// ready.
    pub fn readiness(&self) -> Readiness {
        match &self.backend {
            Backend::Memory => Readiness {
                ready: true,
                reason: None,
                warnings: Vec::new(),
            },
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => self.shared.readiness(redis),
        }
    }

    /// What happens to requests when Redis fails.
    pub fn on_error(&self) -> OnError {
        self.on_error
    }

    /// The configured backend.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The in-process store (the store itself for `Backend::Memory`, else the fallback).
    pub fn local(&self) -> &MemoryStore {
        &self.local
    }

    /// The requests of this instance waiting for a slot of a full `concurrency` key with a queue.
    pub fn slot_queues(&self) -> &Arc<SlotQueues> {
        self.local.slot_queues()
    }

    /// The state of one limit for one key, consuming nothing: from Redis (the shared truth), or from the
    /// in-process store for `backend: memory`.
    pub async fn peek(&self, check: LimitCheck<'_>) -> Result<Decision, StoreError> {
        match &self.backend {
            Backend::Memory => Ok(self.local.peek(check)),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => self.shared.within_budget(redis.peek(check)).await,
        }
    }

    /// This instance's name in the slots it holds (`GET /limits`): its tag in Redis's leases, `local` with the
    /// memory store.
    pub fn instance(&self) -> String {
        match &self.backend {
            Backend::Memory => "local".to_owned(),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => redis.instance(),
        }
    }

    /// How many slots of `key` (a `concurrency` limit's) each instance holds: from Redis's leases, or all this
    /// instance's with the memory store; as many as are held, also past a `max` a reload lowered since.
    pub async fn slot_holders(
        &self,
        key: &str,
    ) -> Result<std::collections::BTreeMap<String, u64>, StoreError> {
        match &self.backend {
            Backend::Memory => {
                let held = self.local.slots_held(key);
                Ok((held > 0)
                    .then(|| (self.instance(), held))
                    .into_iter()
                    .collect())
            }
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => self.shared.within_budget(redis.lease_holders(key)).await,
        }
    }

    /// Forgets the state of `key` everywhere this instance keeps it: the store, the in-process fallback and the
    /// over-limit cache; with Redis, every other instance listening forgets its own. True if the store held state
    /// for it.
    pub async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        // Also done when the reset's announcement comes back, but this instance's own answer should not wait for
        // it (or depend on the subscriber being connected).
        self.denials.forget(key);
        let local = self.local.reset(key);
        match &self.backend {
            Backend::Memory => Ok(local),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => self.shared.within_budget(redis.reset(key)).await,
        }
    }
}
