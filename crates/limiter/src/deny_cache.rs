//! The over-limit cache: a key the store denied is answered in-process for as long as the store would answer it
//! the same (projected to the moment asked), so a flood on one key costs Redis nothing.
//!
//! Exact on this instance. A denied request consumes nothing, so until its `retry_after` only time changes a
//! denied key, and a denial says how: its waits shrink one for one, and its `remaining` stays what it is until
//! the next unit comes back, a moment [`Denial::exact_for`] bounds from the decision and the algorithm (for
//! `sliding_*` only when the next unit is the one that admits). What else changes a key forgets or passes over
//! its entry: an admission on it (a request of another cost, asked of the store), a settlement (a refund or a
//! debt: [`settled`](DenyCache::settled)), a reset, and new parameters (a reload, a plan change or an override
//! that raises the limit: a denial belongs to the parameters it was computed with). A request is answered only
//! when every one of its limits has a denial holding: the store is asked for any other (a denied request
//! consumes nothing, so asking is always right), and no limit's state is made up. Another instance's cache
//! errs on the side of refusing until a denial's `retry_after`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::store::LimitCheck;
use super::{Algorithm, Decision, Limit, Outcome};

/// Entries kept at most; beyond it expired entries are dropped, then the cache is cleared (it is only an
/// optimisation: an empty cache asks Redis, which is always right).
const MAX_ENTRIES: usize = 100_000;

/// Denied keys, with what the store said and until when it stays so. Times are milliseconds of the caller's
/// clock, one clock per cache (the limiter's monotonic one; a test's own).
#[derive(Debug, Default)]
pub struct DenyCache {
    entries: Mutex<HashMap<Box<str>, Denial>>,
    /// Whether `entries` may hold any, kept beside it under its lock: asked for every request, an empty cache is
    /// told without taking the lock. Read without it, it can only be as late as a lock taken a moment earlier.
    held: AtomicBool,
}

#[derive(Debug, Clone, Copy)]
struct Denial {
    decision: Decision,
    at_ms: i64,
    /// Until when (exclusive) the decision, projected, is what the store would say.
    until_ms: i64,
    /// The parameters the store decided with: the same key under other parameters is not denied by this.
    params: Params,
}

/// What a limit's decision depends on besides its state. Kept whole rather than hashed: compared only on a hit,
/// and no two parameter sets can be taken for one another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Params {
    algorithm: Algorithm,
    cost: u64,
}

impl DenyCache {
    /// The answer to `checks` at `now_ms` when every one of them has a denial still holding, each projected to
    /// `now_ms`; `None` otherwise (the store is to be asked). Asked for every request: one lock for all the keys,
    /// no hashing while nothing is denied, and nothing allocated on a miss.
    pub fn answer(&self, checks: &[LimitCheck<'_>], now_ms: i64) -> Option<Outcome> {
        if !self.held.load(Ordering::Acquire) {
            return None;
        }
        let entries = self.entries.lock();
        if entries.is_empty() || checks.is_empty() {
            return None;
        }
        let mut decisions = Vec::new();
        for check in checks {
            let denial = entries.get(check.key)?;
            if denial.params != Params::of(check.limit) {
                return None;
            }
            decisions.push(denial.as_of(now_ms)?);
        }
        Some(Outcome {
            allowed: false,
            decisions,
            batch: 0,
        })
    }

    /// Learns from the store's `outcome` for `checks`, decided at `at_ms`: each limit that denied is remembered
    /// for as long as its denial stays exact, and an admission forgets its keys' denials (it consumed: a denial
    /// of another cost no longer tells the key's state). A limit that admitted a request another denied took
    /// nothing, and what is remembered of it stands.
    pub fn learn(&self, checks: &[LimitCheck<'_>], outcome: &Outcome, at_ms: i64) {
        if outcome.allowed {
            if !self.held.load(Ordering::Acquire) {
                return;
            }
            let mut entries = self.entries.lock();
            if !entries.is_empty() {
                for check in checks {
                    entries.remove(check.key);
                }
            }
            self.held.store(!entries.is_empty(), Ordering::Release);
            return;
        }
        let mut entries = None;
        for (check, decision) in checks.iter().zip(&outcome.decisions) {
            let Some(denial) = Denial::of(check.limit, *decision, at_ms) else {
                continue;
            };
            let entries = entries.get_or_insert_with(|| self.entries.lock());
            if entries.len() >= MAX_ENTRIES {
                entries.retain(|_, d| d.until_ms > at_ms);
                if entries.len() >= MAX_ENTRIES {
                    entries.clear();
                }
            }
            entries.insert(check.key.into(), denial);
            self.held.store(true, Ordering::Release);
        }
    }

    /// A settlement (a refund or a debt) landed on `key`: its state moved other than by time, and what this
    /// instance remembers of it no longer holds.
    pub fn settled(&self, key: &str) {
        self.forget(key);
    }

    /// Forgets the denial of `key`, if any (after an admin reset, here or on another instance).
    pub fn forget(&self, key: &str) {
        if !self.held.load(Ordering::Acquire) {
            return;
        }
        let mut entries = self.entries.lock();
        if !entries.is_empty() {
            entries.remove(key);
        }
        self.held.store(!entries.is_empty(), Ordering::Release);
    }

    /// Forgets every denial (when resets elsewhere may have gone unheard: the cache only spares Redis work, and
    /// an empty one asks Redis, which is always right).
    pub fn clear(&self) {
        let mut entries = self.entries.lock();
        entries.clear();
        self.held.store(false, Ordering::Release);
    }
}

impl Params {
    fn of(limit: &Limit) -> Self {
        Self {
            algorithm: *limit.algorithm(),
            cost: limit.cost(),
        }
    }
}

impl Denial {
    /// What is remembered of `decision`, `limit`'s at `at_ms`; `None` when it is not to be: an admission, a
    /// shadow limit's denial (never enforced, so never answered from the cache), a slot's (one may come back at
    /// any moment, not at a time a decision can tell), a cost above the capacity (no wait admits it), or a
    /// denial exact for no time at all.
    fn of(limit: &Limit, decision: Decision, at_ms: i64) -> Option<Self> {
        let algorithm = limit.algorithm();
        if decision.allowed
            || decision.retry_after_ms == 0
            || limit.is_shadow()
            || algorithm.holds_slots()
            || limit.cost() > algorithm.capacity()
        {
            return None;
        }
        let exact_ms = Self::exact_for(algorithm, limit.cost(), &decision);
        if exact_ms == 0 {
            return None;
        }
        Some(Self {
            decision,
            at_ms,
            until_ms: at_ms.saturating_add(i64::try_from(exact_ms).unwrap_or(i64::MAX)),
            params: Params::of(limit),
        })
    }

    /// How long `decision`, a denial of `cost` under `algorithm`, stays what the store would say once its waits
    /// are shortened by the time gone by: until its `retry_after` at most, and no longer than its `remaining`
    /// stays the same. The request is admitted once `remaining` reaches `cost`; the units below that come back
    /// first, at moments the decision does not tell, so the bound leaves them room. A fixed window's count only
    /// falls when the window ends, when it admits; a bucket's level rises at its rate, so `short` units come back
    /// within `short` units' refill time of the admission at the latest; a sliding window's estimate and a log's
    /// entries fall at moments only the state knows, so they are exact to the admission only with no unit short.
    fn exact_for(algorithm: &Algorithm, cost: u64, decision: &Decision) -> u64 {
        let retry = decision.retry_after_ms;
        // The units besides the one whose return admits the request.
        let short = cost.saturating_sub(decision.remaining.saturating_add(1));
        match *algorithm {
            Algorithm::FixedWindow { .. } | Algorithm::CalendarWindow { .. } => retry,
            Algorithm::SlidingWindow { .. } | Algorithm::SlidingLog { .. } => {
                if short == 0 {
                    retry
                } else {
                    0
                }
            }
            Algorithm::TokenBucket { rate, .. } | Algorithm::Gcra { rate, .. } => {
                retry.saturating_sub(refill_ms(short, rate.period_ms(), rate.count()))
            }
            // In delay mode a request is admitted `max_delay` before the meter has room: the units come back
            // relative to the room, that much later than the admission.
            Algorithm::LeakyBucket { rate, mode, .. } => {
                let max_delay = mode.max_delay_ms();
                retry.min(retry.saturating_add(max_delay).saturating_sub(refill_ms(
                    short,
                    rate.period_ms(),
                    rate.count(),
                )))
            }
            Algorithm::Concurrency { .. } => 0,
        }
    }

    /// The decision as the store would give it at `now_ms`, while the denial holds exactly.
    fn as_of(&self, now_ms: i64) -> Option<Decision> {
        // A clock that went back (a test's) finds the store deciding on older time: asked, not answered.
        if now_ms < self.at_ms || now_ms >= self.until_ms {
            return None;
        }
        let elapsed = u64::try_from(now_ms - self.at_ms).unwrap_or(0);
        let d = self.decision;
        Some(Decision {
            retry_after_ms: d.retry_after_ms.saturating_sub(elapsed).max(1),
            reset_after_ms: d.reset_after_ms.saturating_sub(elapsed),
            // What a key owes pays off as time passes, by its algorithm: only the store knows it now (the admin API
            // reads it there), and no answer to a request shows it.
            owed: 0,
            ..d
        })
    }
}

/// Milliseconds for `units` to come back at `count` per `period_ms`, rounded up.
fn refill_ms(units: u64, period_ms: u64, count: u64) -> u64 {
    let ms = (u128::from(units) * u128::from(period_ms)).div_ceil(u128::from(count.max(1)));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rate;

    fn denied(remaining: u64, retry_after_ms: u64) -> Decision {
        Decision {
            allowed: false,
            limit: 5,
            remaining,
            retry_after_ms,
            reset_after_ms: retry_after_ms + 1_000,
            delay_ms: 0,
            owed: 0,
        }
    }

    fn log_limit(limit: u64) -> Limit {
        let algorithm = Algorithm::SlidingLog {
            limit,
            period_ms: 60_000,
        };
        Limit::new("per-ip", algorithm, 1).expect("limit")
    }

    fn refused(decisions: Vec<Decision>) -> Outcome {
        Outcome {
            allowed: false,
            decisions,
            batch: 0,
        }
    }

    #[test]
    fn a_denial_is_answered_projected_until_its_retry_after() {
        let cache = DenyCache::default();
        let limit = log_limit(5);
        let k = [LimitCheck {
            key: "k",
            limit: &limit,
        }];
        assert_eq!(cache.answer(&k, 0), None);
        cache.learn(&k, &refused(vec![denied(0, 2_000)]), 0);
        let held = cache.answer(&k, 500).expect("still denied");
        let d = held.decisions[0];
        assert_eq!((d.retry_after_ms, d.reset_after_ms), (1_500, 2_500));
        assert_eq!(cache.answer(&k, 2_000), None, "admitted from then on");
        assert_eq!(
            cache.answer(&k, -1),
            None,
            "a clock gone back asks the store"
        );
    }

    #[test]
    fn a_request_is_answered_only_when_every_limit_is_known() {
        let cache = DenyCache::default();
        let (a, b) = (log_limit(5), log_limit(9));
        let both = [
            LimitCheck {
                key: "a",
                limit: &a,
            },
            LimitCheck {
                key: "b",
                limit: &b,
            },
        ];
        let admitting = Decision {
            allowed: true,
            remaining: 4,
            retry_after_ms: 0,
            ..denied(4, 0)
        };
        cache.learn(&both, &refused(vec![denied(0, 2_000), admitting]), 0);
        assert_eq!(cache.answer(&both, 1), None, "b's state is not known here");
        assert!(cache.answer(&both[..1], 1).is_some());
        // An admission on the key consumed: what was remembered of it no longer tells its state.
        let admitted = Outcome {
            allowed: true,
            decisions: vec![admitting],
            batch: 0,
        };
        cache.learn(&both[..1], &admitted, 2);
        assert_eq!(cache.answer(&both[..1], 3), None);
    }

    #[test]
    fn a_denial_does_not_hold_under_other_parameters_or_once_settled() {
        let cache = DenyCache::default();
        let (old, raised) = (log_limit(5), log_limit(8));
        let check = |limit| [LimitCheck { key: "k", limit }];
        cache.learn(&check(&old), &refused(vec![denied(0, 60_000)]), 0);
        assert_eq!(cache.answer(&check(&raised), 0), None);
        let costlier = Limit::new("per-ip", *old.algorithm(), 2).expect("limit");
        assert_eq!(cache.answer(&check(&costlier), 0), None);
        // Back to the parameters it was computed with, it holds again.
        assert!(cache.answer(&check(&old), 0).is_some());
        cache.settled("k");
        assert_eq!(cache.answer(&check(&old), 0), None);
    }

    #[test]
    fn a_bucket_denial_holds_while_its_remaining_cannot_have_changed() {
        // 1 token a second, 0 left of the 6 a request takes, admitted in 5,500 ms: the five tokens before the last
        // take 5,000 ms of that, so the first may be back after 500 ms, and the denial is exact until then.
        let algorithm = Algorithm::TokenBucket {
            rate: Rate::new(1, 1_000).expect("rate"),
            burst: 10,
        };
        let limit = Limit::new("t", algorithm, 6).expect("limit");
        let k = [LimitCheck {
            key: "k",
            limit: &limit,
        }];
        cache_for(&k, denied(0, 5_500), |cache| {
            assert!(cache.answer(&k, 499).is_some());
            assert_eq!(cache.answer(&k, 500), None);
        });
        // A sliding log short of more than the unit that admits is not remembered: its entries leave at moments
        // only the log knows.
        let log = Limit::new("l", *log_limit(5).algorithm(), 3).expect("limit");
        let k = [LimitCheck {
            key: "k",
            limit: &log,
        }];
        cache_for(&k, denied(1, 5_000), |cache| {
            assert_eq!(cache.answer(&k, 0), None);
        });
        cache_for(&k, denied(2, 5_000), |cache| {
            assert!(cache.answer(&k, 4_999).is_some());
        });
    }

    fn cache_for(checks: &[LimitCheck<'_>], decision: Decision, then: impl FnOnce(&DenyCache)) {
        let cache = DenyCache::default();
        cache.learn(checks, &refused(vec![decision]), 0);
        then(&cache);
    }
}
