//! The limiter on Redis: the failure policy, the circuit breaker and the probes that watch Redis, the fallback
//! seeded from Redis's last reports, and carrying what the fallback admitted back into Redis.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::{Backend, DecidedBy, OnError, RateLimiter, Readiness, Unavailable};
use crate::breaker::{CircuitBreaker, Tripped};
use crate::carry_over::FallbackLedger;
use crate::deny_cache::DenyCache;
use crate::giver::Giver;
use crate::last_reported::LastReported;
use crate::store::{Announcement, LimitCheck, MemoryStore, RedisStore, StoreError};
use crate::{Algorithm, Limit, Outcome};

/// How often a probe asks a Redis that failed. Short: the connections reconnect at most 100 ms apart, and
/// limiting is to be shared again within 300 ms of Redis answering; a probe while disconnected fails at once
/// without touching the network.
const PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// How long the first probe waits for the pool's first connection before it asks (and, failing, warns): a
/// gateway starting next to a healthy Redis should not warn that it is not connected yet.
const FIRST_CONNECTION_GRACE: Duration = Duration::from_secs(1);
/// How often a Redis that answers is asked whether it still does, whatever the traffic: readiness and
/// `tollgate_store_fallback` follow the store, so an idle instance reports an outage as a busy one does.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// What a limiter on Redis keeps besides the store: built for every limiter, used only with `Backend::Redis`.
#[derive(Debug)]
pub(super) struct Shared {
    /// The budget of one limiter call.
    timeout: Duration,
    health: Arc<Health>,
    /// Under `on_error: local` with Redis, what Redis last said of each key (the store tells it, see
    /// [`RedisStore::report_to`]), where the fallback starts it from; `None` otherwise, so that no other policy
    /// pays for it.
    reported: Option<Arc<LastReported>>,
    /// The over-limit cache's clock starts here: its times are milliseconds of this process's monotonic clock.
    started: Instant,
    /// `tollgate_store_duration_seconds` and `tollgate_store_errors_total`, registered once.
    store_duration: metrics::Histogram,
    store_errors: metrics::Counter,
    /// `tollgate_settlements_failed_total`: settlements (give-backs and debts) Redis did not confirm.
    settlements_failed: metrics::Counter,
}

/// Whether Redis answers, shared with the probe task.
#[derive(Debug, Default)]
struct Health {
    breaker: CircuitBreaker,
    /// A limiter call (a request's or the probe's) succeeded, and none failed since.
    ready: AtomicBool,
    fallback_active: AtomicBool,
    /// A probe task is running.
    probing: AtomicBool,
    /// The last failure's reason; `None` before any, and once Redis answers again.
    reason: Mutex<Option<String>>,
    /// What `on_error: local` admitted, carried into Redis when it answers again.
    ledger: FallbackLedger,
}

// === impl Shared ===

impl Shared {
    /// With Redis, listens for the keys any instance resets and the slots it frees, and starts the probe that makes
    /// the store ready and the watch that notices it failing.
    pub(super) fn new(
        backend: &Backend,
        local: &Arc<MemoryStore>,
        denials: &Arc<DenyCache>,
        timeout: Duration,
        on_error: OnError,
    ) -> Self {
        let health = Arc::new(Health::default());
        health.ledger.set_local(Arc::clone(local));
        let Backend::Redis(redis) = backend else {
            return Self::with(health, None, timeout);
        };
        listen(redis, local, denials);
        // Readiness needs a first successful call, which should not wait for a first request (an orchestrator
        // waiting for readiness sends none).
        health.probing.store(true, Ordering::Relaxed);
        spawn_probe(
            redis.clone(),
            Arc::downgrade(&health),
            timeout,
            on_error,
            true,
        );
        tokio::spawn(watch(
            redis.clone(),
            Arc::downgrade(&health),
            timeout,
            on_error,
        ));
        let reported = (on_error == OnError::Local).then(|| {
            let reported = Arc::new(LastReported::new(local.clock()));
            redis.report_to(&reported);
            reported
        });
        Self::with(health, reported, timeout)
    }

    fn with(health: Arc<Health>, reported: Option<Arc<LastReported>>, timeout: Duration) -> Self {
        Self {
            timeout,
            health,
            reported,
            started: Instant::now(),
            store_duration: metrics::histogram!("tollgate_store_duration_seconds"),
            store_errors: metrics::counter!("tollgate_store_errors_total"),
            settlements_failed: metrics::counter!("tollgate_settlements_failed_total"),
        }
    }

    /// True while requests are answered by the `on_error` policy because Redis failed.
    pub(super) fn fallback_active(&self) -> bool {
        self.health.fallback_active.load(Ordering::Relaxed)
            && !self.health.ready.load(Ordering::Acquire)
    }

    /// Whether Redis answers limiter calls, and if not why.
    pub(super) fn readiness(&self, redis: &RedisStore) -> Readiness {
        // A Redis that went away while no call was made (no traffic, or only denials answered in-process) is
        // not ready either.
        let disconnected = redis.disconnected();
        let ready = self.health.ready.load(Ordering::Acquire) && disconnected.is_none();
        let reason = (!ready).then(|| {
            let last_failure = self.health.reason().clone();
            last_failure
                .or(disconnected)
                .unwrap_or_else(|| "no limiter call has succeeded yet".to_owned())
        });
        Readiness {
            ready,
            reason,
            warnings: redis.warnings(),
        }
    }

    /// An administrative call to Redis (a peek, a reset), given at least a second however short the request
    /// budget.
    pub(super) async fn within_budget<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), call)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.timeout)))
    }
}

/// Listens for the keys another instance resets (the admin API's `DELETE`) and the slots it frees, and forgets
/// what this one remembers of them in-process: their over-limit denials and their fallback state.
fn listen(redis: &RedisStore, local: &Arc<MemoryStore>, denials: &Arc<DenyCache>) {
    let local_queues = local.slot_queues();
    // Held weakly: the listener ends with the limiter (tests make many; a reload keeps the one).
    let (local, denials) = (Arc::downgrade(local), Arc::downgrade(denials));
    let listening = redis.on_announcement(move |heard| {
        let (Some(local), Some(denials)) = (local.upgrade(), denials.upgrade()) else {
            return false;
        };
        match heard {
            Announcement::Reset(key) => {
                denials.forget(key);
                local.reset(key);
            }
            // The first request of this instance waiting for a slot of the key asks for it.
            Announcement::Released(key) => local.slot_queues().released(key),
            // The fallback's state is a stand-in for Redis's during outages, kept as it is; the cache of
            // denials would go on refusing a key that was reset; and a waiting request would wait for a
            // release already made, until it asks again of itself.
            Announcement::MaybeMissed => {
                denials.clear();
                local.slot_queues().wake_all();
            }
        }
        true
    });
    if let Err(error) = listening {
        tracing::warn!(%error, "cannot listen for other instances' resets and freed slots");
    }
    // Refused during a recovery window after Redis lost its data, waiting requests ask again at its end.
    let queues = Arc::downgrade(local_queues);
    redis.on_recovery_end(move || {
        if let Some(queues) = queues.upgrade() {
            queues.wake_all();
        }
    });
}

// === impl RateLimiter ===

impl RateLimiter {
    /// [`check_leased`](Self::check_leased) on Redis: the over-limit cache, the breaker, the carry after an outage,
    /// then the store, and the `on_error` policy when it fails.
    pub(super) async fn check_on_redis(
        &self,
        redis: &RedisStore,
        checks: &[LimitCheck<'_>],
        lease: u64,
    ) -> Result<(Outcome, DecidedBy), Unavailable> {
        let now = Instant::now();
        let cache_now = self.cache_ms(now);
        if let Some(outcome) = self.denials.answer(checks, cache_now) {
            return Ok((outcome, DecidedBy::Nobody));
        }
        if self.shared.health.breaker.is_open() {
            return self.fall_back(redis, checks, StoreError::CircuitOpen);
        }
        if self.shared.health.ledger.carrying() {
            // Boxed: only the requests after an outage carry anything over, and unboxed its future would add to
            // every request's.
            let carry: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> =
                Box::pin(
                    self.shared
                        .health
                        .ledger
                        .carry_first(redis, checks, self.shared.timeout),
                );
            carry.await;
        }
        // The store keeps to the time budget itself, without a timer per request (see `batcher`).
        let result = redis.check_leased(checks, self.shared.timeout, lease).await;
        self.shared
            .store_duration
            .record(now.elapsed().as_secs_f64());
        let error = match result {
            Ok(outcome) => {
                if !self.shared.health.ready.load(Ordering::Acquire) {
                    self.shared.health.recovered(redis);
                }
                // Stamped with when the call was sent, not when Redis decided: the waits it projects are then
                // never longer than Redis's.
                self.denials.learn(checks, &outcome, cache_now);
                return Ok((outcome, DecidedBy::Store));
            }
            Err(error) => error,
        };
        self.failed(redis, &error);
        self.fall_back(redis, checks, error)
    }

    /// [`giver`](Self::giver) with Redis: the store that decided, or the fallback while Redis was away.
    pub(super) fn redis_giver(&self, redis: &RedisStore, decided_by: DecidedBy) -> Giver {
        let decided_by_redis = decided_by == DecidedBy::Store;
        let local = (decided_by == DecidedBy::Fallback).then(|| Arc::clone(&self.local));
        Giver {
            redis: decided_by_redis.then(|| redis.clone()),
            local,
            fallback: (decided_by_redis && self.on_error == OnError::Local)
                .then(|| Arc::clone(&self.local)),
            failed: self.shared.settlements_failed.clone(),
            denials: Arc::clone(&self.denials),
            outage: (decided_by == DecidedBy::Fallback).then(|| redis.clone()),
        }
    }

    /// Records a failed call: the breaker counts it, readiness says why, and a probe runs until Redis answers.
    #[cold]
    fn failed(&self, redis: &RedisStore, error: &StoreError) {
        self.shared.store_errors.increment(1);
        if self.shared.health.breaker.record_failure() == Tripped::Opened {
            tracing::debug!(%error, "redis keeps failing: circuit open, probing every {PROBE_INTERVAL:?}");
        }
        self.shared
            .health
            .failed(redis.describe(error), redis, self.on_error);
        // Probing starts with the first failure, not only when the circuit opens: the fallback flag (and
        // /readyz) must clear even if no request comes to prove Redis healthy again.
        if !self.shared.health.probing.swap(true, Ordering::AcqRel) {
            let health = Arc::downgrade(&self.shared.health);
            spawn_probe(
                redis.clone(),
                health,
                self.shared.timeout,
                self.on_error,
                false,
            );
        }
    }

    /// `instant` on the over-limit cache's clock.
    fn cache_ms(&self, instant: Instant) -> i64 {
        i64::try_from(
            instant
                .saturating_duration_since(self.shared.started)
                .as_millis(),
        )
        .unwrap_or(i64::MAX)
    }

    /// Starts the keys of `checks` in the fallback from what Redis last said of them, once per outage: so that N
    /// instances admit at most N × a limit in any window, what Redis admitted in it before the outage included.
    /// The ledger learns what each key was started from, which Redis counts already and must not be carried.
    #[cold]
    fn seed(&self, reported: &LastReported, checks: &[LimitCheck<'_>]) {
        let now_ms = self.local.now_ms();
        for check in checks {
            if let Some(report) = reported.take(check.key, now_ms) {
                self.local.seed(*check, report.taken, report.at_ms);
                self.shared.health.ledger.seeded(check.key, report);
            }
        }
    }

    fn fall_back(
        &self,
        redis: &RedisStore,
        checks: &[LimitCheck<'_>],
        error: StoreError,
    ) -> Result<(Outcome, DecidedBy), Unavailable> {
        // Logged by `failed`, once per outage and reason, never per request.
        if !self
            .shared
            .health
            .fallback_active
            .swap(true, Ordering::Relaxed)
        {
            metrics::gauge!("tollgate_store_fallback").set(1.0);
        }
        match self.on_error {
            OnError::Allow => {
                let outcome = Outcome {
                    allowed: true,
                    decisions: Vec::new(),
                    batch: 0,
                };
                Ok((outcome, DecidedBy::Nobody))
            }
            OnError::Deny => Err(Unavailable(error)),
            OnError::Local => {
                if let Some(reported) = &self.shared.reported {
                    self.seed(reported, checks);
                }
                let outcome = self.fallback_check(redis, checks);
                if outcome.allowed {
                    self.shared.health.ledger.record(checks);
                }
                Ok((outcome, DecidedBy::Fallback))
            }
        }
    }

    /// The fallback's decision: a `concurrency` limit counts, besides the slots the fallback gave, those this
    /// instance's requests hold through Redis (still in flight, whatever became of Redis), so that one instance
    /// never has more than `max` in flight; the decision tells the configured `max`.
    fn fallback_check(&self, redis: &RedisStore, checks: &[LimitCheck<'_>]) -> Outcome {
        let held: Vec<u64> = checks
            .iter()
            .map(|c| match c.limit.algorithm().holds_slots() {
                true => redis.slots_held(c.key),
                false => 0,
            })
            .collect();
        if held.iter().all(|&h| h == 0) {
            return self.local.check(checks);
        }
        let narrowed: Vec<Limit> = checks
            .iter()
            .zip(&held)
            .map(|(c, &h)| without_held(c.limit, h))
            .collect();
        let narrowed_checks: Vec<LimitCheck<'_>> = checks
            .iter()
            .zip(&narrowed)
            .map(|(c, limit)| LimitCheck { key: c.key, limit })
            .collect();
        let mut outcome = self.local.check(&narrowed_checks);
        for ((decision, check), &h) in outcome.decisions.iter_mut().zip(checks).zip(&held) {
            let max = check.limit.algorithm().capacity();
            if h > 0 {
                decision.limit = max;
                decision.remaining = decision.remaining.min(max.saturating_sub(h));
            }
        }
        outcome
    }
}

/// A `concurrency` limit with `held` of its slots taken already: the same limit with as many fewer, or one that
/// admits nothing (a cost past its `max`) when none is left.
fn without_held(limit: &Limit, held: u64) -> Limit {
    let Algorithm::Concurrency {
        max,
        lease_ms,
        queue,
    } = *limit.algorithm()
    else {
        return limit.clone();
    };
    let fewer = Algorithm::Concurrency {
        max: max.saturating_sub(held),
        lease_ms,
        queue,
    };
    match Limit::new(limit.name(), fewer, limit.cost()) {
        Ok(fewer) if held > 0 => fewer.with_shadow(limit.is_shadow()),
        _ if held > 0 => limit.clone().with_cost(max + 1),
        _ => limit.clone(),
    }
}

// === impl Health ===

impl Health {
    /// A call succeeded.
    fn recovered(&self, redis: &RedisStore) {
        // First: from here on requests go to Redis again, and each must find its key's carry pending.
        self.ledger.carry(redis);
        // The slots the fallback gave requests still in flight count in Redis from now on.
        redis.adopt_leases();
        self.breaker.record_success();
        if self.fallback_active.swap(false, Ordering::Relaxed) {
            metrics::gauge!("tollgate_store_fallback").set(0.0);
        }
        self.ready.store(true, Ordering::Release);
        *self.reason() = None;
        redis.log_recovery();
    }

    /// A call failed for `reason` (`None`: nothing new, e.g. the circuit is open), logged once per outage.
    fn failed(&self, reason: Option<String>, redis: &RedisStore, on_error: OnError) {
        self.ready.store(false, Ordering::Release);
        // Requests are answered by `on_error` from now on, whether one came to find out or a probe did.
        if !self.fallback_active.swap(true, Ordering::Relaxed) {
            metrics::gauge!("tollgate_store_fallback").set(1.0);
        }
        let Some(reason) = reason else {
            return;
        };
        let consequence =
            format!("requests are decided by store.on_error ({on_error}) until it answers");
        redis.log_failure(&reason, &consequence);
        *self.reason() = Some(reason);
    }

    fn reason(&self) -> MutexGuard<'_, Option<String>> {
        // Plain data, consistent after any panic.
        self.reason.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Starts `probe` in a task of its own. Out of line: a task is built on the stack before it is boxed, and inlined
/// into the request path it would reserve its size in the stack frame of every request's poll.
#[inline(never)]
#[cold]
fn spawn_probe(
    redis: RedisStore,
    health: Weak<Health>,
    timeout: Duration,
    on_error: OnError,
    first: bool,
) {
    tokio::spawn(probe(redis, health, timeout, on_error, first));
}

/// Asks Redis with a real limiter call (see [`RedisStore::probe`]) until one succeeds, then closes the circuit and
/// clears the fallback; ends early when the limiter is gone. The `first` probe, at start, waits a little for the
/// first connection.
async fn probe(
    redis: RedisStore,
    health: Weak<Health>,
    timeout: Duration,
    on_error: OnError,
    first: bool,
) {
    // The probe may wait longer than a request would: it delays nobody.
    let budget = timeout.max(Duration::from_millis(250));
    if first {
        redis.wait_connected(FIRST_CONNECTION_GRACE).await;
    }
    loop {
        let result = redis.probe(budget).await;
        let Some(health) = health.upgrade() else {
            return;
        };
        match result {
            Ok(()) => {
                health.recovered(&redis);
                health.probing.store(false, Ordering::Release);
                // A call that failed between these two lines found a probe running: the probing is this one's.
                if health.ready.load(Ordering::Acquire)
                    || health.probing.swap(true, Ordering::AcqRel)
                {
                    return;
                }
            }
            Err(error) => health.failed(redis.describe(&error), &redis, on_error),
        }
        drop(health);
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

/// Asks a Redis that answered whether it still does, every [`WATCH_INTERVAL`], with the probe's real limiter call,
/// and then how many keys it evicted (see [`RedisStore::read_evictions`]); a failure counts as a request's would (the breaker, readiness, the fallback) and starts the probing that
/// notices the return. Quiet while a probe runs or Redis is already known to fail. Ends with the limiter.
async fn watch(redis: RedisStore, health: Weak<Health>, timeout: Duration, on_error: OnError) {
    let budget = timeout.max(Duration::from_millis(250));
    loop {
        tokio::time::sleep(WATCH_INTERVAL).await;
        let Some(watched) = health.upgrade() else {
            return;
        };
        if !watched.ready.load(Ordering::Acquire) || watched.probing.load(Ordering::Acquire) {
            continue;
        }
        drop(watched);
        let result = redis.probe(budget).await;
        if result.is_ok() {
            redis.read_evictions(budget).await;
        }
        let (Err(error), Some(watched)) = (result, health.upgrade()) else {
            continue;
        };
        watched.breaker.record_failure();
        watched.failed(redis.describe(&error), &redis, on_error);
        if !watched.probing.swap(true, Ordering::AcqRel) {
            spawn_probe(redis.clone(), health.clone(), timeout, on_error, false);
        }
    }
}
